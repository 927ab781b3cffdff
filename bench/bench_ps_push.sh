#!/usr/bin/env bash
# bench_ps_push.sh: ps-sync on a virtual cluster (scripts/vcluster.sh): one
# ps on a host of its own, and H hosts of K workers each (the chief beside
# them), links capped at B Mbit/s: pushes by worker against pushes by host
# and auto (docs/strategies.md, "ps-sync: one push per host"), each figure
# beside the ps link's bound.
#
# usage: bench/bench_ps_push.sh [--hosts 2] [--workers-per-host 2]
#            [--link-mbit 100] [--rounds 3] [--train-size 10240] [--bin PATH]
# Needs root (network namespaces) and MNIST under $DOWNPOUR_DATA.
#
# The bound: a step's pushes come into the ps's link, and only once the
# round has them all do its answers go out (ps-sync), each at the link's
# rate: by worker H K gradients G (mlp-300-100: 266,610 floats, 4 bytes
# each) in and as many out, by host H each way.  samples/s <= H K x batch /
# (2 x pushes x G / rate).  The configurations alternate, --rounds times,
# and each figure is the median.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
H=2 K=2 MBIT=100 ROUNDS=3 TRAIN=10240 BIN=${DOWNPOUR_BIN:-$here/../build/downpour} BATCH=128
while [ $# -gt 0 ]; do
    case "$1" in
    --hosts) H=$2; shift 2 ;;
    --workers-per-host) K=$2; shift 2 ;;
    --link-mbit) MBIT=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --train-size) TRAIN=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    *) sed -n '8,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "bench_ps_push: skipped: needs root (network namespaces)"; exit 0; }
W=$((H * K))
G=$((266610 * 4))
# vcluster places the ps on host 1, then the chief and the workers
# round-robin over hosts 2..H+1: K workers on each (the chief beside them)
names=(worker host auto)
declare -A got
for ((r = 1; r <= ROUNDS; r++)); do
    for i in "${!names[@]}"; do
        out=$("$here/../scripts/vcluster.sh" --hosts $((H + 1)) --ps 1 --chief --workers "$W" \
            --link-mbit "$MBIT" --bin "$BIN" -- train --strategy ps-sync \
            --ps-push "${names[i]}" --train-size "$TRAIN" --val-size 500 --test-size 500 \
            --epochs 1 --batch "$BATCH" --threads 1 --no-progress --log-every 0 2>&1 || true)
        sps=$(printf '%s\n' "$out" | grep -E '^\[chief\] Test accuracy' |
            sed -n 's/.*(\([0-9.]*\) samples\/s).*/\1/p' | tail -1)
        [ -n "$sps" ] || { echo "bench_ps_push: ${names[i]} failed" >&2;
            printf '%s\n' "$out" | grep -iE 'error|fault' | head -5 >&2; exit 1; }
        got[$i]="${got[$i]:-} $sps"
        why=$(printf '%s\n' "$out" | grep -E '^\[worker 0\] Worker 0: ps pushes by' |
            sed -n 's/.*Worker 0: //p' | cut -c1-200 || true)
        printf 'round %d %-7s %8.0f samples/s  (%s)\n' "$r" "${names[i]}" "$sps" "$why"
    done
done
median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
bound() { # pushes into the ps link a step, then as many answers out
    awk -v w="$W" -v b="$BATCH" -v p="$1" -v g="$G" -v m="$MBIT" \
        'BEGIN{printf "%.0f", w * b / (2 * p * g / (m * 1e6 / 8))}'
}
echo
echo "$H hosts x $K workers + a ps host, $MBIT Mbit/s, batch $BATCH, mlp-300-100 (median of $ROUNDS):"
printf '  %-7s %10s %12s %9s\n' push samples/s link_bound fraction
declare -a med
for i in "${!names[@]}"; do
    m=$(echo "${got[$i]}" | median)
    b=$(bound "$([ "${names[i]}" = worker ] && echo "$W" || echo "$H")")
    printf '  %-7s %10.0f %12s %9.2f\n' "${names[i]}" "$m" "$b" "$(awk -v a="$m" -v b="$b" 'BEGIN{print a / b}')"
    med[$i]=$m
done
awk -v h="${med[1]}" -v f="${med[0]}" 'BEGIN{printf "  by host / by worker: %.2fx\n", h / f}'
