#!/usr/bin/env bash
# Runs every suite make test asks for and closes with one line counting them
# all: the plain build, the ASan+UBSan build, and the fuzz targets.
# Ends with the wall time of each step of make test (the builds' from
# PHASE_LOG, written by scripts/timed.sh; the suites' measured here).
# BESIDE, when given, is a command (make's fuzz-build) run at the lowest
# priority beside the builds (FIRST) and the plain and ASan suites: the fuzz
# suite waits for it.
# FIRST, when given, is the command that builds the suites (make's build,
# asan and data): it runs once BESIDE has started, so the fuzz build also
# takes the CPU the builds leave idle (their configure and link steps).
#   scripts/test.sh BUILD ASAN_BUILD FUZZ_BUILD JOBS [PHASE_LOG [BESIDE [FIRST]]]
set -uo pipefail
build=$1 asan=$2 fuzz=$3 jobs=$4 phases=${5:-$(mktemp)} beside=${6:-} first=${7:-}
passed=0 failed=0 status=0

suite() { # name dir extra_jobs [ctest args...]
  local name=$1 dir=$2 extra=$3; shift 3
  echo "== $name"
  local log
  log=$(mktemp)
  # extra_jobs more than cores: the cluster tests spend much of their time
  # waiting on sockets, heartbeats, their peers and their paced steps
  # (docs/faults.md, "Testing: paced runs"), and the extra jobs fill those
  # gaps (ASan suite on 2 cores: 317 s with -j2, 254 s with -j3 before the
  # pacing; 191 s with -j3 and 182 s with -j4 after it).  The ASan suite is
  # at its CPU bound with two extra (129 s; 130 s with -j6).  Alone, the
  # plain suite took 150 s with -j4 and 130 s with -j6; in make test,
  # beside the fuzz build, -j6 saved 12 s of the whole but loaded each test
  # more (a restarted task's timing in test_launch_faults went another way
  # once, since accepted), so it takes three extra.
  (cd "$dir" && ctest --output-on-failure -j "$((jobs + extra))" "$@") 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local line
  line=$(grep -E '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -1)
  if [ -n "$line" ]; then
    local f t
    f=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")
    t=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\2/' <<<"$line")
    passed=$((passed + t - f)); failed=$((failed + f))
  fi
  [ "$rc" -eq 0 ] || status=1
  rm -f "$log"
}

# The installed library: downpour.pc names the prefix installed to, and the
# README's static-link recipe gives a program that needs no libdownpour.so.
install_check() { # build
  echo "== install and static link"
  local tmp ok=1
  tmp=$(mktemp -d)
  cmake --install "$1" --prefix "$tmp/prefix" >/dev/null || ok=0
  local pc
  pc=$(ls "$tmp"/prefix/lib*/pkgconfig/downpour.pc 2>/dev/null | head -1)
  if [ $ok = 1 ] && [ -n "$pc" ] && grep -qx "prefix=$tmp/prefix" "$pc"; then
    # dp_tcp_open pulls in the transport and so every library it needs (libcrypto, libsodium)
    printf '#include "downpour/crc32c.h"\n#include "downpour/tcp.h"\n#include <stdio.h>\nint (*volatile tcp)(const dp_tcp_config *, dp_transport **, dp_err *) = dp_tcp_open;\nint main(void) { printf("%%08x\\n", dp_crc32c(0, "123456789", 9) ^ (tcp == 0)); return 0; }\n' >"$tmp/prog.c"
    export PKG_CONFIG_PATH="$(dirname "$pc")"
    # the README's recipe, as written there
    cc -o "$tmp/prog" "$tmp/prog.c" $(pkg-config --cflags downpour) -Wl,--as-needed \
       -Wl,-Bstatic -ldownpour -Wl,-Bdynamic $(pkg-config --static --libs downpour) || ok=0
    unset PKG_CONFIG_PATH
    [ $ok = 1 ] && readelf -d "$tmp/prog" | grep -q 'libdownpour\.so' && { echo "linked libdownpour.so"; ok=0; }
    [ $ok = 1 ] && [ "$("$tmp/prog")" = "e3069283" ] || ok=0
  else
    echo "no downpour.pc with prefix=$tmp/prefix (found: ${pc:-none})"; ok=0
  fi
  rm -rf "$tmp"
  if [ $ok = 1 ]; then echo "install and static link: passed"; passed=$((passed + 1));
  else echo "install and static link: FAILED"; failed=$((failed + 1)); status=1; fi
}

timed() { # name command...
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "$name $((SECONDS - start))" >>"$phases"
}

beside_pid='' beside_log=$(mktemp)
if [ -n "$beside" ]; then
  nice -n 19 bash -c "$beside" >"$beside_log" 2>&1 &
  beside_pid=$!
fi
if [ -n "$first" ] && ! bash -c "$first"; then
  echo "== FAILED: $first"
  [ -n "$beside_pid" ] && kill -- "$beside_pid" 2>/dev/null
  exit 1
fi
timed tests suite "tests" "$build" 3
timed install-check install_check "$build"
# The ASan suite leaves out the tests labelled long there (tests/CMakeLists.txt):
# make test-long runs them.
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 timed asan-tests suite "tests under ASan+UBSan" "$asan" 2 -LE long
if [ -n "$beside_pid" ]; then
  start=$SECONDS
  if wait "$beside_pid"; then
    echo "== built beside the builds and suites: $beside"
  else
    echo "== FAILED beside the builds and suites: $beside"; cat "$beside_log"
    failed=$((failed + 1)); status=1
  fi
  echo "fuzz-build-wait $((SECONDS - start))" >>"$phases"
fi
rm -f "$beside_log"
[ -d "$fuzz" ] && timed fuzz-tests suite "fuzz targets" "$fuzz" 2 -L fuzz
echo "== time per step (s)"
awk '{ printf "  %-16s %5d\n", $1, $2; t += $2 } END { printf "  %-16s %5d\n", "total", t }' "$phases"
[ -f "$phases.beside" ] && awk '{ printf "  (%s %d s, beside the builds and suites)\n", $1, $2 }' "$phases.beside"
echo "test: $passed passed, $failed failed"
exit $status
