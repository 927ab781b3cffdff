#!/usr/bin/env bash
# The GPU check, run on a machine with an NVIDIA GPU from the repo root, with
# no internet and no Debian packages to install: builds downpour with the CUDA
# backend against the .deb files carried in .debs/ (scripts/device-debs.sh
# fetched them), runs test_device, bench_gpu when it was built, and PyTorch's
# figures for the same models (bench/torch_mlp_gpu.py).
#   scripts/device-check.sh [BUILD_DIR]      (default build-gpu)
# Logs and a summary go to $OUT when it is set, else to BUILD_DIR.  The exit
# status is 0 when every step that ran passed.
#
# Debian's .pc files say prefix=/usr.  Unpacked under .debs/root, each is
# copied to .debs/root/pkgconfig with every /usr rewritten to the unpacked
# path, and PKG_CONFIG_LIBDIR names only that folder, so pkg-config gives
# -I/-L flags into .debs/root and never mixes in the machine's own .pc files
# (PKG_CONFIG_SYSROOT_DIR would also prefix the machine's own, and breaks
# when a .pc file is found both ways).  MPI is left out: the GPU check needs
# none, and its .pc file would be the machine's.  Runtime libraries the machine lacks
# are linked into .debs/root/ldpath, the only folder put on LD_LIBRARY_PATH,
# so the machine's own libssl, libz and friends stay the ones its programs
# (python3, torch) load.
set -uo pipefail
[ -f CMakeLists.txt ] && [ -d src/cuda ] || { echo "device-check: run from the repo root" >&2; exit 2; }
top=$(pwd)
build=${1:-build-gpu}
out=${OUT:-$build}
mkdir -p "$out" "$build"
summary="$out/device-check.txt"
: >"$summary"
status=0
note() { echo "device-check: $*" | tee -a "$summary"; }
step() { # name command...: runs it, logs to $out/name.log, notes the verdict
  local name=$1 rc
  shift
  echo "== $name: $*"
  "$@" 2>&1 | tee "$out/$name.log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ]; then note "$name: passed"; else note "$name: FAILED (exit $rc, $out/$name.log)"; status=1; fi
  return "$rc"
}

note "$(date -u +%FT%TZ) on $(hostname), $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi -L 2>&1 | tee -a "$summary"
  nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | sed 's/^/driver: /' | tee -a "$summary"
else
  note "no nvidia-smi on PATH"
fi

# ---- the carried packages ----
cmake_args=()
if compgen -G ".debs/*.deb" >/dev/null; then
  prefix=$top/.debs/root
  rm -rf "$prefix"
  mkdir -p "$prefix/pkgconfig" "$prefix/ldpath" "$prefix/bin"
  for f in .debs/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$prefix"
    else # ar and tar alone: a .deb is an ar archive holding data.tar.*
      t=$(mktemp -d)
      (cd "$t" && ar x "$top/$f" && tar -xf data.tar.* -C "$prefix")
      rm -rf "$t"
    fi || { note "cannot unpack $f"; exit 1; }
  done
  # Rewritten in place too: CMake's FindPkgConfig adds CMAKE_PREFIX_PATH's
  # pkgconfig folders to the search, and an original there would say /usr.
  while IFS= read -r pc; do
    sed -i -e "s|=/usr|=$prefix/usr|g" -e "s| -I/usr| -I$prefix/usr|g" -e "s| -L/usr| -L$prefix/usr|g" "$pc"
    cp "$pc" "$prefix/pkgconfig/"
  done < <(find "$prefix/usr" -path '*pkgconfig*' -name '*.pc')
  export PKG_CONFIG_LIBDIR=$prefix/pkgconfig
  unset PKG_CONFIG_PATH
  ldcache=$( (ldconfig -p || /sbin/ldconfig -p) 2>/dev/null)
  while IFS= read -r so; do
    name=$(basename "$so")
    grep -q "^[[:space:]]$name " <<<"$ldcache" || ln -sf "$so" "$prefix/ldpath/$name"
  done < <(find "$prefix/usr/lib" -regextype posix-extended -regex '.*/lib[^/]*\.so\.[0-9]+')
  export LD_LIBRARY_PATH=$prefix/ldpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # opensslconf.h and friends sit in the multiarch folder, which the
  # compiler searches under /usr only.
  export C_INCLUDE_PATH=$prefix/usr/include/x86_64-linux-gnu${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}
  cmake_args+=("-DZLIB_ROOT=$prefix/usr") # find_package(ZLIB) reads no .pc file
  if ! command -v pkg-config >/dev/null; then
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s/usr/bin/pkgconf "$@"\n' \
      "$prefix" "$prefix" >"$prefix/bin/pkg-config"
    chmod +x "$prefix/bin/pkg-config"
    cmake_args+=("-DPKG_CONFIG_EXECUTABLE=$prefix/bin/pkg-config")
  fi
  note "unpacked $(ls .debs/*.deb | wc -l) packages into $prefix; $(ls "$prefix/ldpath" | wc -l) libraries the machine lacks on LD_LIBRARY_PATH"
else
  note "no .debs/*.deb: using the machine's own packages (scripts/device-debs.sh fetches them)"
fi

# NCCL: the toolkit's, else a pip wheel's (PyTorch brings nvidia-nccl).
if ! ls /usr/local/cuda/include/nccl.h >/dev/null 2>&1; then
  nccl=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
  if [ -n "$nccl" ] && [ -f "$nccl/include/nccl.h" ]; then
    cmake_args+=("-DNCCL_ROOT=$nccl")
    note "NCCL from $nccl"
  fi
fi

# ---- build and test ----
export DOWNPOUR_DATA=${DOWNPOUR_DATA:-$top/data}
jobs=$(nproc 2>/dev/null || echo 4)
step configure cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDOWNPOUR_CUDA=ON -DDOWNPOUR_MPI=OFF "${cmake_args[@]}" || exit 1
grep -h "downpour:" "$out/configure.log" >>"$summary"
# Every test ctest -R test_device runs (test_device_train repeats its runs
# on cuda; the others check the device code on sim, the host's copy of it).
targets=(downpour downpour_cuda)
for t in tests/test_device*.c; do targets+=("$(basename "$t" .c)"); done
have_bench=0
# (grep -q would stop reading early, and under pipefail cmake's SIGPIPE
# would read as "no bench_gpu")
if grep -qw bench_gpu <<<"$(cmake --build "$build" --target help 2>/dev/null)"; then
  targets+=(bench_gpu)
  have_bench=1
fi
step build cmake --build "$build" -j "$jobs" --target "${targets[@]}" || exit 1
step test_device bash -c "cd '$build' && ctest -R test_device --output-on-failure -V"
grep -h -E "^[0-9]+: (device|skipped)" "$out/test_device.log" | sed 's/^[0-9]*: /test_device: /' >>"$summary"
# Again with a wait after every call (DOWNPOUR_CUDA_SYNC=1), which puts
# each error on the call that made it, and must leave the sums unwaited.
step test_device_sync bash -c "cd '$build' && DOWNPOUR_CUDA_SYNC=1 ctest -R '^test_device\$' --output-on-failure"
if [ -n "${DEVICE_CHECK_TESTS_ONLY:-}" ]; then # the tests alone, no figures
  note "done (tests only): $([ $status = 0 ] && echo passed || echo FAILED)"
  exit $status
fi
if [ "$have_bench" = 1 ]; then
  bench=$(find "$build" -name bench_gpu -type f -perm -u+x | head -1)
  step bench_gpu "$bench"
else
  note "bench_gpu: not built (no bench/bench_gpu.c in this tree)"
fi

# ---- the layer kinds of docs/models.md on the GPU ----
# Each preset trained a few epochs on the GPU (bench_gpu: test accuracy
# evaluated on the host, so a fast run that learns nothing shows), and
# PyTorch's twin (bench/torch_cnn.py) timed on the same GPU.  Bounded by
# timeout: a slow kind shows as a timeout here, not a lost check.
if [ "$have_bench" = 1 ]; then
  for spec in mlp-bn:3 cnn-mnist:3 resnet-fashion:1 vit-mnist:3; do
    model=${spec%%:*}
    step "gpu_$model" timeout 90 "$bench" --model "$model" --epochs "${spec##*:}" &&
      grep -h "^train:" "$out/gpu_$model.log" | sed "s/^/bench_gpu $model: /" >>"$summary"
  done
fi
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  for model in cnn-mnist resnet-fashion vit-mnist; do
    step "torch_cnn_$model" timeout 90 python3 bench/torch_cnn.py --device cuda --model "$model" --steps 200 &&
      echo "torch $model on cuda: $(tail -1 "$out/torch_cnn_$model.log") samples/s" >>"$summary"
  done
fi
# compute-sanitizer's memcheck over the GPU unit checks, where it runs
if command -v compute-sanitizer >/dev/null; then
  # (--report-api-errors no: NCCL probes its kernels with calls that fail by
  # design on a GPU it has no image for; memory errors are still reported)
  step sanitizer timeout 150 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 "$build/tests/test_device"
fi

# ---- PyTorch on the same GPU ----
# (5 epochs: a samples/s figure, which 25 would only repeat)
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  for model in mlp cnn-mnist; do
    step "torch_$model" python3 bench/torch_mlp_gpu.py --model "$model" --epochs 5 &&
      grep -h "^torch_mlp_gpu:" "$out/torch_$model.log" >>"$summary"
  done
else
  note "torch_mlp_gpu: skipped (python3 has no torch, or torch sees no GPU)"
fi

note "done: $([ $status = 0 ] && echo passed || echo FAILED)"
echo "==== summary"; cat "$summary"
exit $status
