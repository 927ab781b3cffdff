#!/bin/sh
# Installs this build into a fresh prefix and builds examples/ against it as
# a user would: with pkg-config seeing downpour's .pc alone (no dependency's
# -dev .pc), and with CMake's find_package(downpour); then runs both, from
# the prefix, without LD_LIBRARY_PATH.  Usage: test_install.sh BUILD SRC
# (ctest passes them; tests/CMakeLists.txt).
set -eu
build=$1 src=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dp-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
# lib, lib64 or lib/x86_64-linux-gnu: whatever GNUInstallDirs chose
pc=$(find "$prefix" -path '*/pkgconfig/downpour.pc' | head -n 1)
libdir=$(dirname "$(dirname "$pc")")
unset LD_LIBRARY_PATH

# The installed program runs from the prefix, and its data hint names no
# make target or script of the source tree (neither is installed).
"$prefix/bin/downpour" --version
readelf -d "$prefix/bin/downpour" | grep -q 'RUNPATH.*\$ORIGIN/\.\./lib' ||
  { echo "FAIL: the installed program has no \$ORIGIN/../lib run path" >&2; exit 1; }
if DOWNPOUR_DATA=$tmp/nodata "$prefix/bin/downpour" train --dataset mnist --epochs 1 \
    >"$tmp/hint.txt" 2>&1; then
  echo "FAIL: train without data succeeded" >&2; exit 1
fi
if grep -E 'make run|scripts/' "$tmp/hint.txt" >&2; then
  echo "FAIL: the data hint names what is not installed" >&2; exit 1
fi

# pkg-config with only downpour's own .pc on its path: a shared link.
export PKG_CONFIG_LIBDIR=$libdir/pkgconfig
unset PKG_CONFIG_PATH
flags=$(pkg-config --cflags --libs downpour)
echo "pkg-config: $flags"
pkg-config --exact-version="$(pkg-config --modversion downpour)" downpour
for ex in train own_loop; do
  # -rpath: a program built outside CMake says itself where the library is
  ${CC:-cc} -std=c11 -Wall -Wextra -Werror -o "$tmp/pc_$ex" "$src/examples/$ex.c" $flags \
    -Wl,-rpath,"$(pkg-config --variable=libdir downpour)"
done

# find_package against the prefix.
cmake -S "$src/examples" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" >/dev/null
cmake --build "$tmp/cm" >/dev/null

# The Python package (docs/python.md): installed under the prefix, it finds
# the installed libraries and program, not this build's.
if [ -x /usr/bin/python3 ]; then
  PYTHONPATH=$prefix/lib/python3/dist-packages DOWNPOUR_LIB= DOWNPOUR_BIN= DOWNPOUR_BUILD= \
    /usr/bin/python3 -c "
import os, sys, downpour
lib, exe = downpour.library_path(), downpour.program_path()
ok = lib.startswith(sys.argv[1]) and exe.startswith(sys.argv[1]) and os.path.exists(
    os.path.join(os.path.dirname(lib), 'libdownpour_cli.so'))
print('python package:', downpour.__file__, lib, exe)
assert ok, 'the installed package uses ' + lib + ' and ' + exe
assert 'batch' in downpour.options()
" "$prefix" || { echo "FAIL: the installed Python package" >&2; exit 1; }
fi

# Run them: the installed library, found without LD_LIBRARY_PATH; a short
# run each (no data: 77, skipped).
for exe in "$tmp/pc_own_loop" "$tmp/cm/example_own_loop"; do
  ldd "$exe" | grep -q "$libdir/libdownpour.so" || { echo "FAIL: $exe not linked to $libdir" >&2; ldd "$exe" >&2; exit 1; }
done
set +e
"$tmp/pc_own_loop" mnist 30; rc=$?
set -e
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || exit $rc
"$tmp/cm/example_own_loop" mnist 30
"$tmp/cm/example_train" mnist
echo "install test: ok"
