#!/usr/bin/env bash
# chaos.sh: fault-injection benchmark.  For each strategy, one fault-free run
# (the baseline), then trials of (fault x role x moment), each a small MNIST run:
#
#   kill    SIGKILL the task, under `downpour launch`
#   freeze  SIGSTOP the task for heartbeat timeout + 2 s, then SIGCONT, under launch
#   drain   SIGTERM the task, under launch: it finishes its step and leaves
#           in order (docs/faults.md, "Draining"); the run goes on without it
#   join    the run has a spare worker slot (train --spare-workers 1, launch
#           --workers 3); SIGUSR1 to launch starts its task, which joins the
#           running job (docs/cluster.md, "Spare slots")
#   cut     its network link down for heartbeat timeout + 2 s, then up again:
#           the tasks are started by hand, one per network namespace
#           (scripts/netns.sh, root only; `downpour launch` puts every task
#           on 127.0.0.1, where one task's link cannot be cut)
#
# A trial passes when the run exits 0 and its test accuracy is within
# --tolerance of the baseline of the same strategy.  One line per trial, then a
# summary against the targets: every trial completes, accuracy within the
# tolerance, the loss detected within the heartbeat timeout.
#
# The faulted worker is worker 1, which is also the straggler (--straggler
# 1:MS): the runs last a few seconds at little CPU, and worker 1 is alive at
# every moment.  Moments are fractions of the strategy's baseline wall time
# (early 0.2, mid 0.5, late 0.8).  Detection time: from the fault to the first
# output line "lost <task>" (any task's), stamped as it arrives.
#
# usage: bench/chaos.sh [options]
#   --trials N            trials per cell (default 1)
#   --strategies LIST     comma-separated (default ps-async,ps-ssp,ps-dssp,ps-sync,model-avg,
#                         allreduce,lbfgs,pipeline,model-parallel)
#   --roles LIST          worker,ps,chief (default all; a strategy without the role skips it;
#                         chief is the task that evaluates: worker:0 in allreduce, pipeline
#                         and model-parallel, which run without a chief)
#   --faults LIST         kill,freeze,cut,drain,join (default all; cut is skipped when not
#                         root; drain is for workers; join is the worker role's, in the
#                         strategies that re-deal their data)
#   --moments LIST        early,mid,late for kill (default all); the others at --fault-moment
#   --fault-moment M      moment of the freeze, cut and drain trials (default mid)
#   --max-restarts N      passed to `downpour launch`; in cut trials a failed task is
#                         restarted by this script up to N times while the run goes on
#   --train-size N        training records (default 6000); --epochs N (default 2)
#   --ps N                ps tasks in the parameter-server runs (default 1)
#   --train-args "ARGS"   more train options for every run (e.g. "--ps-replicas 2")
#   --checkpoint-every N  steps between checkpoints, each run its own directory
#                         (default 10; a restarted ps reloads its shard from one)
#   --straggler-ms MS     worker 1's sleep per step (default 100)
#   --heartbeat S         --heartbeat-timeout of every task (default 2)
#   --tolerance X         accuracy difference allowed, absolute (default 0.005)
#   --timeout S           per-trial wall-clock limit (default 90)
#   --bin PATH            the downpour program (default $DOWNPOUR_BIN, build/downpour)
#   --out DIR             logs and results.tsv (default a fresh directory from mktemp -d)
# Needs DOWNPOUR_DATA (or ./data) with MNIST.  Exit status: 0 when every
# target is met, 1 when any is missed, 2 on a usage or setup error.
set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
NETNS="$root/scripts/netns.sh"

TRIALS=1
STRATEGIES=ps-async,ps-ssp,ps-dssp,ps-sync,model-avg,allreduce,lbfgs,pipeline,model-parallel
ROLES=worker,ps,chief
FAULTS=kill,freeze,cut,drain,join
MOMENTS=early,mid,late
FAULT_MOMENT=mid
MAX_RESTARTS=
TRAIN=6000
EPOCHS=2
NPS=1
CKPT_EVERY=10
EXTRA=
STRAG_MS=100
HB=2
TOL=0.005
TIMEOUT=90
BIN=${DOWNPOUR_BIN:-}
OUT=

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit "${1:-2}"; }
die() { echo "chaos.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case "$1" in
    --trials) TRIALS=$2; shift 2 ;;
    --strategies) STRATEGIES=$2; shift 2 ;;
    --roles) ROLES=$2; shift 2 ;;
    --faults) FAULTS=$2; shift 2 ;;
    --moments) MOMENTS=$2; shift 2 ;;
    --fault-moment) FAULT_MOMENT=$2; shift 2 ;;
    --max-restarts) MAX_RESTARTS=$2; shift 2 ;;
    --train-size) TRAIN=$2; shift 2 ;;
    --epochs) EPOCHS=$2; shift 2 ;;
    --ps) NPS=$2; shift 2 ;;
    --checkpoint-every) CKPT_EVERY=$2; shift 2 ;;
    --train-args) EXTRA=$2; shift 2 ;;
    --straggler-ms) STRAG_MS=$2; shift 2 ;;
    --heartbeat) HB=$2; shift 2 ;;
    --tolerance) TOL=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "chaos.sh: unknown option '$1'" >&2; usage 2 ;;
    esac
done

int_ok() { [[ "$1" =~ ^[0-9]+$ ]]; }
num_ok() { [[ "$1" =~ ^[0-9]+(\.[0-9]+)?$ ]]; }
int_ok "$TRIALS" && [ "$TRIALS" -ge 1 ] || die "--trials: a positive integer"
int_ok "$TRAIN" && int_ok "$EPOCHS" && int_ok "$STRAG_MS" && int_ok "$NPS" && int_ok "$CKPT_EVERY" ||
    die "--train-size, --epochs, --straggler-ms, --ps, --checkpoint-every: integers"
num_ok "$HB" && num_ok "$TOL" && num_ok "$TIMEOUT" || die "--heartbeat, --tolerance, --timeout: numbers"
[ -z "$MAX_RESTARTS" ] || int_ok "$MAX_RESTARTS" || die "--max-restarts: an integer"
case "$FAULT_MOMENT" in early|mid|late) ;; *) die "--fault-moment: early, mid or late" ;; esac

if [ -z "$BIN" ]; then
    for b in "$root/build/downpour" "$(command -v downpour 2>/dev/null)"; do
        [ -n "$b" ] && [ -x "$b" ] && { BIN=$b; break; }
    done
fi
[ -n "$BIN" ] && [ -x "$BIN" ] || die "no downpour program (build it, or pass --bin PATH / set DOWNPOUR_BIN)"
export DOWNPOUR_DATA=${DOWNPOUR_DATA:-$root/data}
[ -e "$DOWNPOUR_DATA/mnist/train-images-idx3-ubyte" ] || [ -e "$DOWNPOUR_DATA/mnist/train-images-idx3-ubyte.gz" ] ||
    die "MNIST not found under $DOWNPOUR_DATA (scripts/fetch-data.sh)"
if [ -n "$MAX_RESTARTS" ]; then
    "$BIN" launch --help 2>&1 | grep -q -- '--max-restarts' ||
        die "this downpour launch has no --max-restarts"
fi
export OPENBLAS_NUM_THREADS=1

if [ -z "$OUT" ]; then
    OUT=$(mktemp -d) || die "cannot make a scratch directory"
else
    mkdir -p "$OUT" || die "cannot make $OUT"
fi
RESULTS=$OUT/results.tsv

can_cut=1
cut_why=
if [[ ",$FAULTS," == *,cut,* ]]; then
    if [ "$(id -u)" != 0 ]; then can_cut=0; cut_why="not root"
    elif ! command -v ip >/dev/null 2>&1; then can_cut=0; cut_why="no 'ip'"
    elif [ ! -x "$NETNS" ]; then can_cut=0; cut_why="no $NETNS"
    fi
fi
PREFIX="dc$(( $$ % 10000000 ))"

# ---- processes: everything started here is tracked and ended on every path ----

PIDS=()          # pids to end when a trial (or the script) ends
NETNS_UP=0

kill_all() {
    local p
    for p in "${PIDS[@]}"; do
        kill -TERM "$p" 2>/dev/null
    done
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        local alive=0
        for p in "${PIDS[@]}"; do
            kill -0 "$p" 2>/dev/null && alive=1
        done
        [ $alive = 0 ] && break
        sleep 0.2
    done
    for p in "${PIDS[@]}"; do
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    PIDS=()
}

cleanup() {
    kill_all
    if [ "$NETNS_UP" = 1 ]; then
        "$NETNS" down "$PREFIX" 2>/dev/null
        NETNS_UP=0
    fi
}
trap cleanup EXIT
trap 'echo "chaos.sh: interrupted" >&2; exit 130' INT TERM HUP

now() { echo "$EPOCHREALTIME"; }
fsub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a - b }'; }
fle() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }

# Stamps every line read with the wall time it arrived and an optional tag.
stamp() {
    local tag=${1:-} line
    while IFS= read -r line; do
        printf '%s %s%s\n' "$EPOCHREALTIME" "$tag" "$line"
    done
}

# ---- the runs ----

# Strategies whose tasks are all workers: worker:0 evaluates (replica 0,
# or stage / slice 0 of replica 0).
chiefless() { case "$1" in allreduce|pipeline|model-parallel) return 0 ;; esac; return 1; }

has_role() {  # strategy role fault
    if [ "$3" = join ]; then  # a worker joins, where the data is re-dealt
        [ "$2" = worker ] && case "$1" in lbfgs|pipeline|model-parallel) return 1 ;; esac
        return
    fi
    case "$2" in
    worker) return 0 ;;
    chief) [ "$3" != drain ] || chiefless "$1" ;;  # a chief is not drained; replica 0 may be
    ps) [ "$3" != drain ] && ! chiefless "$1" ;;  # a drain is a worker's
    esac
}

target_name() {  # role [strategy] -> task name
    case "$1" in
    worker) echo worker:1 ;;
    ps) echo ps:0 ;;
    chief) if chiefless "${2:-}"; then echo worker:0; else echo chief:0; fi ;;
    esac
}

train_args() {  # strategy tag [fault]
    local a=(train --strategy "$1" --dataset mnist --train-size "$TRAIN" --val-size 1000
             --epochs "$EPOCHS" --batch 128 --seed 1 --log-every 8 --no-progress
             --heartbeat-timeout "$HB" --startup-timeout 30 --straggler "1:$STRAG_MS")
    [ "$CKPT_EVERY" -gt 0 ] && a+=(--checkpoint-every "$CKPT_EVERY" --checkpoint-dir "$OUT/$2.ck")
    case "$1" in
    allreduce|model-parallel) a+=(--collective-timeout 20) ;;
    lbfgs) a+=(--batch 1000 --portion 500) ;;  # a full batch of portions (overrides --batch 128)
    esac
    [ "${3:-}" = join ] && a+=(--spare-workers 1)
    local extra=()
    [ -n "$EXTRA" ] && read -r -a extra <<<"$EXTRA"
    printf '%s\n' "${a[@]}" "${extra[@]}"
}

launch_opts() {  # strategy [fault]
    local w=2
    case "${2:-}" in join|wide) w=3 ;; esac  # join: the third a spare slot
    if chiefless "$1"; then printf '%s\n' --workers "$w"; else printf '%s\n' --chief --workers "$w" --ps "$NPS"; fi
    [ -z "$MAX_RESTARTS" ] || printf '%s\n' --max-restarts "$MAX_RESTARTS"
}

# Pid of the launcher's child running task NAME (its DOWNPOUR_TASK), or nothing.
task_pid() {  # launcher_pid name
    local c
    for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
        if tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -qx "DOWNPOUR_TASK=$2"; then
            echo "$c"
            return 0
        fi
    done
    return 1
}

# Sleeps until T (epoch seconds) or until pid P has ended; 0 if P still runs.
sleep_until() {  # t pid
    while fle "$(now)" "$1"; do
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.05
    done
    kill -0 "$2" 2>/dev/null
}

# Waits for pid P until the deadline; sets RC (124 at the deadline).
wait_deadline() {  # pid deadline
    while kill -0 "$1" 2>/dev/null; do
        if ! fle "$(now)" "$2"; then
            RC=124
            return
        fi
        sleep 0.1
    done
    wait "$1" 2>/dev/null
    RC=$?
}

# A run under `downpour launch`, with an optional fault.  Sets RC, LOG, T0,
# T_FAULT (empty when no fault was made) and NOTE.
run_launch() {  # strategy fault role at_seconds tag
    local s=$1 fault=$2 role=$3 at=$4 tag=$5
    LOG=$OUT/$tag.log
    NOTE=
    T_FAULT=
    local fifo=$OUT/$tag.fifo opts args
    rm -f "$fifo"
    mkfifo "$fifo" || die "mkfifo $fifo"
    mapfile -t opts < <(launch_opts "$s" "$fault")
    mapfile -t args < <(train_args "$s" "$tag" "$fault")
    stamp <"$fifo" >"$LOG" &
    local spid=$!
    PIDS+=("$spid")
    T0=$(now)
    "$BIN" launch "${opts[@]}" -- "${args[@]}" >"$fifo" 2>&1 &
    local lpid=$!
    PIDS+=("$lpid")
    local deadline
    deadline=$(awk -v a="$T0" -v b="$TIMEOUT" 'BEGIN { printf "%.3f", a + b }')
    if [ "$fault" = wide ]; then
        :  # the fault-free run of 3 workers, join's baseline
    elif [ "$fault" = join ]; then
        if sleep_until "$(awk -v a="$T0" -v b="$at" 'BEGIN { printf "%.3f", a + b }')" "$lpid"; then
            T_FAULT=$(now)
            kill -USR1 "$lpid" 2>/dev/null
        else
            NOTE="the run ended before the join ($at s)"
        fi
    elif [ "$fault" != none ]; then
        local name tp
        name=$(target_name "$role" "$s")
        if sleep_until "$(awk -v a="$T0" -v b="$at" 'BEGIN { printf "%.3f", a + b }')" "$lpid"; then
            if tp=$(task_pid "$lpid" "$name"); then
                case "$fault" in
                kill)
                    T_FAULT=$(now)
                    kill -KILL "$tp" 2>/dev/null
                    ;;
                freeze)
                    T_FAULT=$(now)
                    kill -STOP "$tp" 2>/dev/null
                    sleep "$(awk -v h="$HB" 'BEGIN { print h + 2 }')"
                    kill -CONT "$tp" 2>/dev/null
                    ;;
                drain)
                    T_FAULT=$(now)
                    kill -TERM "$tp" 2>/dev/null
                    ;;
                esac
            else
                NOTE="$name had already ended at $(fsub "$(now)" "$T0") s: no fault made"
            fi
        else
            NOTE="the run ended before the fault ($at s)"
        fi
    fi
    wait_deadline "$lpid" "$deadline"
    local rc=$RC
    [ "$rc" = 124 ] && NOTE="timed out after $TIMEOUT s${NOTE:+; $NOTE}"
    [ "$rc" = 124 ] && kill -KILL "$lpid" 2>/dev/null
    # The stamper ends at the launcher's EOF: let it write the last lines.
    wait_deadline "$spid" "$(awk -v a="$(now)" 'BEGIN { printf "%.3f", a + 3 }')"
    RC=$rc
    kill_all
    rm -f "$fifo"
}

# A run of hand-started tasks, one per network namespace, with its link cut
# for HB + 2 s at AT.  The run's exit is the first non-zero exit of a task
# the run cannot do without (0 when they all exit 0), as the launcher reports
# it: a failed worker other than the evaluating one is left out; no task is
# stopped because another failed.  With --max-restarts N, a task that fails while the
# evaluating task still runs is started again (at most N times in all).
run_cut() {  # strategy role at_seconds tag
    local s=$1 role=$2 at=$3 tag=$4
    LOG=$OUT/$tag.log
    NOTE=
    T_FAULT=
    local names=() i
    if chiefless "$s"; then
        names=(worker:0 worker:1)
    else
        names=(chief:0)
        for i in $(seq 0 $((NPS - 1))); do names+=("ps:$i"); done
        names+=(worker:0 worker:1)
    fi
    local n=${#names[@]}
    if ! "$NETNS" up "$PREFIX" "$n" >/dev/null; then
        RC=125
        NOTE="netns.sh up failed"
        return
    fi
    NETNS_UP=1
    local addrs=()
    for i in $(seq 1 "$n"); do
        addrs+=("$("$NETNS" addr "$PREFIX" "$i")")
    done
    local spec=$OUT/$tag.cluster.json
    if chiefless "$s"; then
        printf '{"cluster": {"worker": ["%s:2222", "%s:2222"]}}\n' "${addrs[0]}" "${addrs[1]}" >"$spec"
    else
        local pss
        pss=$(printf '"%s:2222", ' "${addrs[@]:1:$NPS}")
        printf '{"cluster": {"chief": ["%s:2222"], "ps": [%s], "worker": ["%s:2222", "%s:2222"]}}\n' \
            "${addrs[0]}" "${pss%, }" "${addrs[$((NPS + 1))]}" "${addrs[$((NPS + 2))]}" >"$spec"
    fi
    DOWNPOUR_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
    export DOWNPOUR_SECRET
    # What the launcher tells its tasks: a lost one may come back (the chief waits for it).
    if [ -n "$MAX_RESTARTS" ]; then export DOWNPOUR_RESTARTS=$MAX_RESTARTS; else unset DOWNPOUR_RESTARTS; fi
    local args
    mapfile -t args < <(train_args "$s" "$tag")
    local tpid=() st=() tlog=()
    start_one() {  # index
        local k=$1 name=${names[$1]}
        local f=$OUT/$tag.${name/:/-}.fifo
        rm -f "$f"
        mkfifo "$f"
        local pre="[${name%%:*} ${name##*:}] "
        [ "$name" = chief:0 ] && pre="[chief] "
        stamp "$pre" <"$f" >>"${tlog[$k]}" &
        PIDS+=("$!")
        "$NETNS" exec "$PREFIX" "$((k + 1))" "$BIN" run --cluster "$spec" --task "$name" -- \
            "${args[@]}" >"$f" 2>&1 &
        tpid[$k]=$!
        PIDS+=("${tpid[$k]}")
        st[$k]=
    }
    T0=$(now)
    for i in $(seq 0 $((n - 1))); do
        tlog[$i]=$OUT/$tag.${names[$i]/:/-}.log
        : >"${tlog[$i]}"
        start_one "$i"
    done
    local name target=-1
    name=$(target_name "$role" "$s")
    for i in $(seq 0 $((n - 1))); do
        [ "${names[$i]}" = "$name" ] && target=$i
    done
    local eval_i=0    # chief:0, or worker:0 in allreduce: the task that reports accuracy
    local deadline restarts=0 first_fail=
    deadline=$(awk -v a="$T0" -v b="$TIMEOUT" 'BEGIN { printf "%.3f", a + b }')
    local t_at t_restore=
    t_at=$(awk -v a="$T0" -v b="$at" 'BEGIN { printf "%.3f", a + b }')
    RC=
    while :; do
        local left=0
        for i in $(seq 0 $((n - 1))); do
            [ -n "${st[$i]}" ] && continue
            if kill -0 "${tpid[$i]}" 2>/dev/null; then
                left=1
                continue
            fi
            wait "${tpid[$i]}" 2>/dev/null
            st[$i]=$?
            if [ "${st[$i]}" != 0 ]; then
                # Restarted as the launcher would: a task while the evaluating
                # one runs; the chief itself where the strategy survives it.
                if [ -n "$MAX_RESTARTS" ] && [ "$restarts" -lt "$MAX_RESTARTS" ] &&
                   { { [ "$i" != "$eval_i" ] && [ -z "${st[$eval_i]}" ]; } ||
                     { [ "$i" = "$eval_i" ] && ! chiefless "$s"; }; }; then
                    restarts=$((restarts + 1))
                    echo "$(now) [chaos] ${names[$i]} exited ${st[$i]}; restart $restarts of $MAX_RESTARTS" >>"$LOG.events"
                    start_one "$i"
                    left=1
                    continue
                fi
                # As the launcher does: a worker the run survives losing
                # (any but the evaluating one) fails alone, not the run.
                if [ "${names[$i]%%:*}" = worker ] && [ "$i" != "$eval_i" ]; then
                    NOTE="${NOTE:+$NOTE; }${names[$i]} exited ${st[$i]}, left out"
                    continue
                fi
                [ -z "$first_fail" ] && first_fail="${names[$i]} exited ${st[$i]}" && RC=${st[$i]}
            fi
        done
        [ $left = 0 ] && break
        local t
        t=$(now)
        if [ -z "$T_FAULT" ] && ! fle "$t" "$t_at" && [ -z "$t_restore" ]; then
            if [ -n "${st[$target]}" ]; then
                NOTE="$name had already ended: no fault made"
                t_restore=over
            else
                "$NETNS" cut "$PREFIX" "$((target + 1))"
                T_FAULT=$(now)
                t_restore=$(awk -v a="$T_FAULT" -v h="$HB" 'BEGIN { printf "%.3f", a + h + 2 }')
                echo "$T_FAULT [chaos] cut $name" >>"$LOG.events"
            fi
        fi
        if [ -n "$T_FAULT" ] && [ "$t_restore" != over ] && ! fle "$t" "$t_restore"; then
            "$NETNS" restore "$PREFIX" "$((target + 1))"
            echo "$(now) [chaos] restored $name" >>"$LOG.events"
            t_restore=over
        fi
        if ! fle "$t" "$deadline"; then
            RC=124
            NOTE="timed out after $TIMEOUT s${NOTE:+; $NOTE}"
            break
        fi
        sleep 0.05
    done
    [ -z "$RC" ] && RC=0
    # Every task has ended (or is killed now): let the stampers write the last lines.
    [ "$RC" = 124 ] && for i in $(seq 0 $((n - 1))); do kill -KILL "${tpid[$i]}" 2>/dev/null; done
    local rc=$RC p
    for p in "${PIDS[@]}"; do
        wait_deadline "$p" "$(awk -v a="$(now)" 'BEGIN { printf "%.3f", a + 3 }')"
    done
    RC=$rc
    kill_all
    "$NETNS" down "$PREFIX" 2>/dev/null
    NETNS_UP=0
    sort -n "${tlog[@]}" "$LOG.events" 2>/dev/null >"$LOG"
    rm -f "${tlog[@]}" "$LOG.events" "$OUT/$tag".*.fifo
    [ -n "$first_fail" ] && NOTE="${NOTE:+$NOTE; }$first_fail"
    [ "$restarts" -gt 0 ] && NOTE="${NOTE:+$NOTE; }$restarts restart(s)"
    unset -f start_one
}

# Test accuracy of a run's log: the evaluating task's (the chief's, or
# worker 0's, or the replica that took over from it).
accuracy() {  # log
    grep -E '\[(chief|worker [0-9]+)\] Test accuracy: ' "$1" 2>/dev/null | tail -n 1 |
        sed -E 's/.*Test accuracy: ([0-9.]+).*/\1/'
}

# Seconds from the fault to the first "lost <name>" line after it.
detection() {  # log t_fault name
    [ -n "$2" ] || return
    awk -v t="$2" -v pat="lost (the chief )?$3" '$1 >= t && $0 ~ pat { printf "%.2f", $1 - t; exit }' "$1"
}

# Why a run failed, from its log: the launcher's verdict or a task's error.
reason() {  # log
    local r t
    r=$(grep -E 'launcher: (task|got signal|[0-9]+ task)' "$1" | head -n 1 | cut -d' ' -f2- |
        sed -E 's/^error: //; s/; stopping the other.*//')
    t=$(grep -E 'downpour (train|run): ' "$1" | head -n 1 | cut -d' ' -f2- | cut -c1-220)
    echo "${r}${r:+${t:+; }}${t}"
}

# ---- the benchmark ----

printf 'strategy\tfault\ttarget\tmoment\ttrial\texit\taccuracy\tdelta\tdetect_s\tverdict\treason\n' >"$RESULTS"
echo "chaos: $BIN, MNIST --train-size $TRAIN --epochs $EPOCHS, worker 1 straggles ${STRAG_MS} ms/step," \
     "heartbeat timeout $HB s, tolerance $TOL${MAX_RESTARTS:+, --max-restarts $MAX_RESTARTS}; logs in $OUT"
[ "$can_cut" = 0 ] && echo "chaos: cut trials skipped ($cut_why)"
printf '%-10s %-7s %-9s %-6s %5s %9s %8s %8s  %-7s %s\n' strategy fault target moment exit accuracy delta detect verdict reason

declare -A BASE_ACC
TOTAL=0 PASSED=0 COMPLETED=0 LOSSES=0  # COMPLETED: exit 0 with a test accuracy; LOSSES: kill, freeze, cut trials
DELTAS=() DETECTS=() SILENT=()  # SILENT: detection times of freezes and cuts

frac() { case "$1" in early) echo 0.2 ;; mid) echo 0.5 ;; late) echo 0.8 ;; esac; }

report() {  # strategy fault target moment trial
    local s=$1 fault=$2 target=$3 moment=$4 trial=$5 acc delta det verdict why base=$1
    case "$fault" in join|wide) base="$1.wide" ;; esac  # against the fault-free run of 3 workers
    acc=$(accuracy "$LOG")
    delta=-
    if [ -n "$acc" ] && [ -n "${BASE_ACC[$base]:-}" ]; then
        delta=$(awk -v a="$acc" -v b="${BASE_ACC[$base]}" 'BEGIN { printf "%+.4f", a - b }')
    fi
    det=$(detection "$LOG" "$T_FAULT" "$target")
    verdict=PASS
    why=$NOTE
    if [ -z "$T_FAULT" ] && [ "$fault" != none ] && [ "$fault" != wide ]; then
        verdict=NOFAULT
    elif [ "$RC" != 0 ]; then
        verdict=FAIL
        local r
        r=$(reason "$LOG")
        why="${r:-exit $RC}${why:+; $why}"
    elif [ -z "$acc" ]; then
        verdict=FAIL
        why="no test accuracy in the log${why:+; $why}"
    elif [ "$delta" != - ] && ! awk -v d="$delta" -v t="$TOL" 'BEGIN { exit !(d >= -t && d <= t) }'; then
        verdict=FAIL
        why="accuracy off by $delta${why:+; $why}"
    fi
    if [ "$fault" != none ] && [ "$fault" != wide ] && [ "$verdict" != NOFAULT ]; then
        TOTAL=$((TOTAL + 1))
        [ "$verdict" = PASS ] && PASSED=$((PASSED + 1))
        [ "$RC" = 0 ] && [ -n "$acc" ] && COMPLETED=$((COMPLETED + 1))
        [ "$delta" != - ] && DELTAS+=("${delta#[+-]}")
        [ -n "$det" ] && DETECTS+=("$det")
        case "$fault" in kill|freeze|cut) LOSSES=$((LOSSES + 1)) ;; esac
        case "$fault" in freeze|cut) [ -n "$det" ] && SILENT+=("$det") ;; esac
    fi
    printf '%-10s %-7s %-9s %-6s %5s %9s %8s %8s  %-7s %s\n' "$s" "$fault" "$target" "$moment" "$RC" \
        "${acc:--}" "$delta" "${det:--}" "$verdict" "$why"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$s" "$fault" "$target" "$moment" "$trial" "$RC" \
        "${acc:--}" "$delta" "${det:--}" "$verdict" "$why" >>"$RESULTS"
}

IFS=, read -r -a S_LIST <<<"$STRATEGIES"
IFS=, read -r -a R_LIST <<<"$ROLES"
IFS=, read -r -a F_LIST <<<"$FAULTS"
IFS=, read -r -a M_LIST <<<"$MOMENTS"

for s in "${S_LIST[@]}"; do
    case "$s" in
    ps-async|ps-ssp|ps-dssp|ps-sync|model-avg|allreduce|lbfgs|pipeline|model-parallel) ;;
    *) echo "chaos.sh: unknown strategy '$s' (skipped)" >&2; continue ;;
    esac
    run_launch "$s" none - 0 "$s.baseline"
    t_base=$(fsub "$(now)" "$T0")
    acc=$(accuracy "$LOG")
    if [ "$RC" != 0 ] || [ -z "$acc" ]; then
        report "$s" none - - 0
        echo "chaos: $s: the fault-free run failed (exit $RC; $LOG); its trials are skipped"
        continue
    fi
    BASE_ACC[$s]=$acc
    report "$s" none - - 0
    for f in "${F_LIST[@]}"; do
        case "$f" in
        kill) moments=("${M_LIST[@]}") ;;
        freeze|drain) moments=("$FAULT_MOMENT") ;;
        join)  # early: a later epoch must be left to join
            moments=(early)
            has_role "$s" worker join && [[ ",$ROLES," == *,worker,* ]] || continue
            if [ -z "${BASE_ACC[$s.wide]:-}" ]; then
                run_launch "$s" wide - 0 "$s.baseline3"
                acc=$(accuracy "$LOG")
                [ "$RC" = 0 ] && [ -n "$acc" ] && BASE_ACC[$s.wide]=$acc
                report "$s" wide - - 0
            fi ;;
        cut) [ "$can_cut" = 1 ] || continue; moments=("$FAULT_MOMENT") ;;
        *) echo "chaos.sh: unknown fault '$f' (skipped)" >&2; continue ;;
        esac
        for r in "${R_LIST[@]}"; do
            case "$r" in worker|ps|chief) ;; *) echo "chaos.sh: unknown role '$r' (skipped)" >&2; continue ;; esac
            has_role "$s" "$r" "$f" || continue
            for m in "${moments[@]}"; do
                at=$(awk -v t="$t_base" -v f="$(frac "$m")" 'BEGIN { printf "%.2f", t * f }')
                for k in $(seq 1 "$TRIALS"); do
                    tag="$s.$f.$r.$m.$k"
                    if [ "$f" = cut ]; then
                        run_cut "$s" "$r" "$at" "$tag"
                    else
                        run_launch "$s" "$f" "$r" "$at" "$tag"
                    fi
                    tn=$(target_name "$r" "$s")
                    [ "$f" = join ] && tn=worker:2
                    report "$s" "$f" "$tn" "$m" "$k"
                done
            done
        done
    done
done

# ---- summary against the targets ----

echo
if [ "$TOTAL" = 0 ]; then
    echo "summary: no fault trial ran"
    exit 1
fi
rate=$(awk -v p="$COMPLETED" -v t="$TOTAL" 'BEGIN { printf "%.1f", 100 * p / t }')
within=$(printf '%s\n' "${DELTAS[@]:-}" | awk -v t="$TOL" 'NF { n++; w += ($1 <= t) } END { if (n) printf "%.1f", 100 * w / n; else print "-" }')
maxd=$(printf '%s\n' "${DELTAS[@]:-}" | awk 'NF { if ($1 > m) m = $1; n++ } END { if (n) printf "%.4f", m; else print "-" }')
median() {
    printf '%s\n' "$@" | awk 'NF' | sort -g |
        awk '{ v[NR] = $1 } END { if (!NR) print "-"; else if (NR % 2) printf "%.2f", v[(NR + 1) / 2];
              else printf "%.2f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
medd=$(median "${DETECTS[@]:-}")
meds=$(median "${SILENT[@]:-}")
met=1
line() {  # name value target ok
    printf '  %-28s %-10s target %-12s %s\n' "$1" "$2" "$3" "$([ "$4" = 1 ] && echo met || echo MISSED)"
    [ "$4" = 1 ] || met=0
}
echo "summary: $PASSED of $TOTAL fault trials passed (results in $RESULTS)"
line "trials completed (exit 0)" "$rate %" "100 %" "$([ "$COMPLETED" = "$TOTAL" ] && echo 1 || echo 0)"
line "accuracy within tolerance" "$within %" "100 %" "$([ "$within" = 100.0 ] && echo 1 || echo 0)"
if [ "$maxd" = - ]; then
    line "max accuracy difference" "-" "<= $TOL" 0
else
    line "max accuracy difference" "$maxd" "<= $TOL" "$(fle "$maxd" "$TOL" && echo 1 || echo 0)"
fi
if [ "$LOSSES" = 0 ]; then
    echo "  median detection time        -          (no kill, freeze or cut trial)"
elif [ "$medd" = - ]; then
    line "median detection time" "-" "<= $HB s" 0
else
    line "median detection time" "$medd s" "<= $HB s" "$(fle "$medd" "$HB" && echo 1 || echo 0)"
fi
# Kills are seen at once (EOF); freezes and cuts only by the heartbeat timeout.
[ "$meds" = - ] || line "  of freezes and cuts" "$meds s" "<= $HB s" "$(fle "$meds" "$HB" && echo 1 || echo 0)"
[ "$met" = 1 ] && exit 0 || exit 1
