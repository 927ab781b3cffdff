#!/usr/bin/env bash
# bench_compress.sh: Model 1 (mlp-300-100, MNIST, batch 128) on a virtual
# cluster of H hosts with one task each, links capped at B Mbit/s, trained
# with each --compress kind side by side: samples/s, the speed-up over
# uncompressed measured in the same round, and the final test accuracy
# beside uncompressed's (docs/strategies.md, "allreduce: compression";
# issue 33's target: --compress auto >= 3x uncompressed's samples/s on 4
# hosts at 100 Mbit/s, test accuracy within 0.3 points).
#
# usage: bench/bench_compress.sh [--hosts 4] [--link-mbit 100] [--epochs 3]
#            [--rounds 1] [--train-size 54000] [--strategy allreduce|ps-async]
#            [--kinds "none auto bf16 powersgd:4 topk:0.01"] [--bin PATH]
#   (ps-async: a kind PUSH@REPLY also passes --ps-reply REPLY, e.g.
#   topk:0.01@bf16 or topk:0.1@topk:0.1; auto chooses both itself)
# Needs root (network namespaces) and MNIST under $DOWNPOUR_DATA.  allreduce
# runs H workers (worker 0 evaluates); ps-async a chief, H - 2 workers and a
# ps, each on its own host.  The kinds alternate within a round, and each
# figure is the median over the rounds.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
H=4 MBIT=100 EPOCHS=3 ROUNDS=1 TRAIN=54000 STRATEGY=allreduce BIN=${DOWNPOUR_BIN:-$here/../build/downpour}
KINDS="none auto bf16 powersgd:4 topk:0.01"
while [ $# -gt 0 ]; do
    case "$1" in
    --hosts) H=$2; shift 2 ;;
    --link-mbit) MBIT=$2; shift 2 ;;
    --epochs) EPOCHS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --train-size) TRAIN=$2; shift 2 ;;
    --strategy) STRATEGY=$2; shift 2 ;;
    --kinds) KINDS=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    *) sed -n '10,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "bench_compress: skipped: needs root (network namespaces)"; exit 0; }
case "$STRATEGY" in
allreduce) cluster=(--hosts "$H" --workers "$H"); who='worker 0' ;;
ps-async) cluster=(--hosts "$H" --chief --ps 1 --workers $((H - 2))); who=chief ;;
*) echo "bench_compress: --strategy: allreduce or ps-async" >&2; exit 2 ;;
esac
read -r -a kinds <<<"$KINDS"
declare -A sps acc
for ((r = 1; r <= ROUNDS; r++)); do
    for k in "${kinds[@]}"; do
        reply=()
        case "$k" in *@*) reply=(--ps-reply "${k#*@}") ;; esac
        out=$("$here/../scripts/vcluster.sh" "${cluster[@]}" --link-mbit "$MBIT" --bin "$BIN" -- \
            train --strategy "$STRATEGY" --compress "${k%@*}" "${reply[@]}" \
            --train-size "$TRAIN" --epochs "$EPOCHS" \
            --batch 128 --threads 1 --no-progress --log-every 0 --verbose 2>&1 || true)
        line=$(printf '%s\n' "$out" | grep -E "^\[$who\] Test accuracy" | tail -1 || true)
        s=$(printf '%s\n' "$line" | sed -n 's/.*(\([0-9.]*\) samples\/s).*/\1/p')
        a=$(printf '%s\n' "$line" | sed -n 's/.*Test accuracy: \([0-9.]*\).*/\1/p')
        if [ -z "$s" ]; then
            echo "bench_compress: --compress $k failed:" >&2
            printf '%s\n' "$out" | grep -iE 'error|fault|refus' | head -5 >&2
            continue
        fi
        # allreduce: replica 0's all-reduce line; ps-async: worker 0's choice
        why=$(printf '%s\n' "$out" | grep -E "^\[($who|worker 0)\] (debug: all-reduce:|Worker 0: compress auto:)" |
            tail -1 | sed -n 's/.*compress auto: //p' | cut -c1-160 || true)
        sps[$k]="${sps[$k]:-} $s"
        acc[$k]="${acc[$k]:-} $a"
        printf 'round %d %-12s %8.0f samples/s  test accuracy %s%s\n' "$r" "$k" "$s" "$a" \
            "${why:+  (auto: $why)}"
    done
done
median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
base=$(printf '%s' "${sps[none]:-}" | median)
base_acc=$(printf '%s' "${acc[none]:-}" | median)
echo
printf '%-12s %10s %8s %10s %8s\n' compress samples/s speedup accuracy points
for k in "${kinds[@]}"; do
    [ -n "${sps[$k]:-}" ] || continue
    m=$(printf '%s' "${sps[$k]}" | median)
    a=$(printf '%s' "${acc[$k]}" | median)
    printf '%-12s %10.0f %8s %10s %8s\n' "$k" "$m" \
        "$([ -n "$base" ] && awk -v a="$m" -v b="$base" 'BEGIN{printf "%.2fx", a / b}' || echo -)" "$a" \
        "$([ -n "$base_acc" ] && awk -v a="$a" -v b="$base_acc" 'BEGIN{printf "%+.2f", 100 * (a - b)}' || echo -)"
done
echo "target: auto >= 3.00x uncompressed's samples/s, accuracy within 0.30 points ($H hosts, $MBIT Mbit/s)"
