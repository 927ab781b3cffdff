#!/usr/bin/env bash
# Runs a step of `make test` and appends its wall time to a log that
# scripts/test.sh prints at the end (README, "Tests").
#   scripts/timed.sh LOG NAME COMMAND [ARGS...]
set -uo pipefail
log=$1 name=$2
shift 2
start=$(date +%s.%N)
"$@"
rc=$?
mkdir -p "$(dirname "$log")"
awk -v n="$name" -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%s %.0f\n", n, b - a }' >>"$log"
exit $rc
