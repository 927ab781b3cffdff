#!/usr/bin/env bash
# Runs every suite make test asks for and closes with one line counting them
# all: the plain build, the ASan+UBSan build, and the fuzz targets.
#   scripts/test.sh BUILD ASAN_BUILD FUZZ_BUILD JOBS
set -uo pipefail
build=$1 asan=$2 fuzz=$3 jobs=$4
passed=0 failed=0 status=0

suite() { # name dir [ctest args...]
  local name=$1 dir=$2; shift 2
  echo "== $name"
  local log
  log=$(mktemp)
  (cd "$dir" && ctest --output-on-failure -j "$jobs" "$@") 2>&1 | tee "$log"
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

suite "tests" "$build"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 suite "tests under ASan+UBSan" "$asan"
[ -d "$fuzz" ] && suite "fuzz targets" "$fuzz" -L fuzz
echo "test: $passed passed, $failed failed"
exit $status
