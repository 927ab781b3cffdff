#!/usr/bin/env bash
# Fetches, here (Debian with apt and the internet), the .deb files that
# scripts/device-check.sh unpacks on a GPU machine that can install nothing:
# exactly what CMakeLists.txt's pkg_check_modules and find_package(ZLIB) need
# (OpenBLAS, cJSON, libsodium, libcrypto, libpng, zlib: headers, .pc files and their
# runtime libraries) and pkg-config itself.  Into .debs/, which git ignores.
#   scripts/device-debs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(
  libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread libgfortran5 libquadmath0
  libcjson-dev libcjson1
  libsodium-dev libsodium23
  libssl-dev libssl3
  zlib1g-dev zlib1g
  libpng-dev libpng16-16
  pkgconf pkgconf-bin libpkgconf3
)
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.debs/' "$exclude" 2>/dev/null || echo '/.debs/' >>"$exclude"
mkdir -p .debs
rm -rf .debs/*.deb .debs/root # root/: a device-check.sh unpacking, not to be carried
if ! (cd .debs && apt-get download "${PKGS[@]}"); then
  echo "device-debs: apt-get download failed; run apt-get update first (as root) and try again" >&2
  exit 1
fi
echo "device-debs: $(ls .debs/*.deb | wc -l) packages, $(du -ch .debs/*.deb | tail -1 | cut -f1), in .debs/ (carry it: .debs)"
