#!/usr/bin/env bash
# bench_hier.sh: all-reduce training on a virtual cluster of H hosts with K
# tasks each (scripts/vcluster.sh --tasks-per-host, ranks K to a host), links
# capped at B Mbit/s: the flat ring against the hierarchy, auto, and bf16
# compression, each figure beside its link bound (docs/strategies.md,
# "allreduce: all-reduce algorithms").
#
# usage: bench/bench_hier.sh [--hosts 2] [--tasks-per-host 2] [--link-mbit 100]
#                            [--rounds 3] [--train-size 10240] [--bin PATH]
# Needs root (network namespaces) and MNIST under $DOWNPOUR_DATA.
#
# The bound: a step moves at least the busiest host link's bytes one way at
# the link's rate.  With ranks K to a host, a ring in rank order crosses
# between hosts once per host, so that link carries a rank's 2(n-1)/n of the
# gradient G (mlp-300-100: 266,610 floats, 4 bytes each); the hierarchy's
# leaders carry 2(H-1)/H of it; bf16 halves either.  samples/s <= n x batch /
# (bytes / rate).  The configurations alternate, --rounds times, and each
# figure is the median, so a load that comes and goes falls on all alike.
# Target (issue 33): hierarchical >= 1.3x the flat ring at 2 x 2, 100 Mbit/s.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
H=2 K=2 MBIT=100 ROUNDS=3 TRAIN=10240 BIN=${DOWNPOUR_BIN:-$here/../build/downpour} BATCH=128
while [ $# -gt 0 ]; do
    case "$1" in
    --hosts) H=$2; shift 2 ;;
    --tasks-per-host) K=$2; shift 2 ;;
    --link-mbit) MBIT=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --train-size) TRAIN=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    *) sed -n '8,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "bench_hier: skipped: needs root (network namespaces)"; exit 0; }
N=$((H * K))
G=$((266610 * 4))
names=(ring hier auto "hier+bf16" "auto+auto")
flags=("--allreduce-algo ring" "--allreduce-algo hier" "--allreduce-algo auto"
       "--allreduce-algo hier --compress bf16" "--allreduce-algo auto --compress auto")
declare -A got
for ((r = 1; r <= ROUNDS; r++)); do
    for i in "${!names[@]}"; do
        # shellcheck disable=SC2086
        line=$("$here/../scripts/vcluster.sh" --hosts "$H" --tasks-per-host "$K" --link-mbit "$MBIT" \
            --bin "$BIN" -- train --strategy allreduce ${flags[i]} --train-size "$TRAIN" \
            --val-size 500 --test-size 500 --epochs 1 --batch "$BATCH" --threads 1 \
            --no-progress --log-every 0 --verbose 2>&1 |
            grep -E '^\[worker 0\] (Test accuracy|debug: all-reduce:)' || true)
        sps=$(printf '%s\n' "$line" | sed -n 's/.*(\([0-9.]*\) samples\/s).*/\1/p')
        [ -n "$sps" ] || { echo "bench_hier: ${names[i]} failed" >&2; exit 1; }
        got[$i]="${got[$i]:-} $sps"
        why=$(printf '%s\n' "$line" | sed -n 's/.*debug: all-reduce: //p')
        printf 'round %d %-10s %8.0f samples/s  (%s)\n' "$r" "${names[i]}" "$sps" "$why"
    done
done
median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
rate=$(awk -v m="$MBIT" 'BEGIN{print m * 1e6 / 8}')
bound() { # bytes on the busiest link per step
    awk -v n="$N" -v b="$BATCH" -v bytes="$1" -v rate="$rate" 'BEGIN{printf "%.0f", n * b / (bytes / rate)}'
}
flat=$(awk -v n="$N" -v g="$G" 'BEGIN{print 2 * (n - 1) / n * g}')
hier=$(awk -v h="$H" -v g="$G" 'BEGIN{print 2 * (h - 1) / h * g}')
echo
echo "$H hosts x $K tasks, $MBIT Mbit/s, batch $BATCH, mlp-300-100 (median of $ROUNDS):"
printf '  %-10s %10s %12s %9s\n' config samples/s link_bound fraction
for i in "${!names[@]}"; do
    m=$(echo "${got[$i]}" | median)
    case "${names[i]}" in
    ring) b=$(bound "$flat") ;;
    hier|auto) b=$(bound "$hier") ;;
    *) b=$(bound "$(awk -v x="$hier" 'BEGIN{print x / 2}')") ;;
    esac
    printf '  %-10s %10.0f %12s %9.2f\n' "${names[i]}" "$m" "$b" "$(awk -v a="$m" -v b="$b" 'BEGIN{print a / b}')"
    med[$i]=$m
done
awk -v h="${med[1]}" -v f="${med[0]}" 'BEGIN{printf "  hierarchical / flat ring: %.2fx (target >= 1.3)\n", h / f}'
