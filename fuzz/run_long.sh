#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each, one after the other (one core
# each), from its seed corpus plus what earlier long runs found, and prints
# one line per target: "fuzz_x: N execs, 0 crashes".  A crash stops that
# target; its input is kept as BUILD/fuzz/long/<target>/crash-* (and the run
# exits non-zero).  Used by `make fuzz-long` (FUZZ_SECONDS, default 600).
#   fuzz/run_long.sh BUILD SECONDS [target ...]
set -uo pipefail
build=$1 seconds=$2
shift 2
src=$(cd "$(dirname "$0")" && pwd)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$src"/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
fi
status=0
summary=()
for t in "${targets[@]}"; do
  bin=$build/fuzz/$t
  if [ ! -x "$bin" ]; then
    echo "$t: not built ($bin)"; status=1; continue
  fi
  work=$build/fuzz/long/$t
  mkdir -p "$work/corpus"
  seeds=()
  [ -d "$src/corpus/$t" ] && seeds=("$src/corpus/$t")
  log=$work/log
  echo "== $t for ${seconds}s (log: $log)"
  "$bin" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$work/" \
    "$work/corpus" "${seeds[@]}" >"$log" 2>&1
  rc=$?
  execs=$(grep -E '^stat::number_of_executed_units:' "$log" | tail -1 | awk '{print $2}')
  crashes=$(find "$work" -maxdepth 1 -name 'crash-*' -o -maxdepth 1 -name 'leak-*' \
            -o -maxdepth 1 -name 'timeout-*' -o -maxdepth 1 -name 'oom-*' | wc -l)
  [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ] && crashes=1
  line="$t: ${execs:-0} execs, $crashes crashes"
  [ "$crashes" -ne 0 ] && { line="$line (see $work)"; status=1; }
  echo "$line"
  summary+=("$line")
done
echo "== summary"
printf '%s\n' "${summary[@]}"
exit $status
