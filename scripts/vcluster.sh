#!/usr/bin/env bash
# vcluster.sh: a cluster of N hosts on this machine.  Each host is a network
# namespace with its own address on a private bridge (scripts/netns.sh), its
# link optionally capped (tc tbf, both directions); every task runs in its
# host as `downpour run --cluster SPEC --task T -- <command>`, with a spec this
# script writes from the hosts' addresses and one fresh secret.
#
# usage: scripts/vcluster.sh [options] -- train|ping [OPTIONS]
#   --hosts N          namespace hosts (1..250; default: one per task)
#   --workers N        worker tasks (default 2)
#   --tasks-per-host K with --hosts N: N x K tasks (the chief, if any, and
#                      N x K - chief workers; no ps), K to a host in rank order
#                      (ranks 0..K-1 on host 1, ...), so a ring in rank order
#                      crosses between hosts N times
#   --ps P             parameter-server tasks (default 0)
#   --chief            add a chief (rank 0)
#   --link-mbit B      cap every host's link at B Mbit/s each way (0: no cap; default 0)
#   --link-delay-ms D  passed to every task as --link-delay-ms: a one-way latency
#                      per message, added by the sender (the kernel has no netem)
#   --timeout S        wall-clock limit of the run in seconds (default 3600)
#   --grace S          seconds between SIGTERM and SIGKILL when stopping (default 5)
#   --bin PATH         the downpour program (default $DOWNPOUR_BIN, build/downpour, PATH)
#   --dir DIR          spec, secret and task logs (default: a fresh mktemp -d, removed
#                      at the end unless --keep or a task failed)
#   --keep             keep --dir's default directory (its path is printed)
#   --tc-stats FILE    with --link-mbit: at the end, write each capped host's tc
#                      counters to FILE, a line per direction:
#                      "host I in|out sent BYTES overlimits N" (in: toward the
#                      host); overlimits > 0 says the cap held packets back
#
# Placement: ps tasks first, one per host from host 1 on; when there are more
# hosts than ps tasks, the chief and the workers then go round-robin over the
# hosts the ps tasks left free (so a ps's link carries only its own traffic),
# else over all hosts.  Tasks sharing a host get ports 2222, 2223, ...
#
# With --metrics FILE in the train options, task T writes FILE.<type>-<index>
# and FILE gets all of them merged when every task has ended, each line with its
# "task", then a resource_total summary (downpour metrics merge), as under
# `downpour launch`.  Output lines are prefixed with the task ([worker 1] ...).
# When a task fails, the others get SIGTERM (SIGKILL after --grace) and the
# script exits with that task's status, printing the end of its log; else with
# 0.  SIGINT/SIGTERM stop every task (metrics still merged; exit 128 + the
# signal, a second signal SIGKILLs); the namespaces are removed on every way
# out.  Needs root and iproute2 (ip, tc).  Exit status: 0 done, 1 a task or
# the setup failed (or the task's own status), 2 usage, 124 timed out.
# docs/cluster.md, "A virtual cluster on one machine".
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
NETNS="$here/netns.sh"

usage() { sed -n '8,42p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
bad() { echo "vcluster.sh: $*" >&2; exit 2; }
die() { echo "vcluster.sh: $*" >&2; exit 1; }
say() { echo "vcluster: $*" >&2; }

# An integer flag value in [lo, hi], or a usage error naming the flag.
int_arg() { # flag value lo hi
    [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge "$3" ] && [ "$2" -le "$4" ] ||
        bad "$1 '$2': expected an integer in $3..$4"
}
# A non-negative number flag value at most hi.
num_arg() { # flag value hi
    [[ "$2" =~ ^[0-9]+(\.[0-9]+)?$ ]] && awk -v v="$2" -v h="$3" 'BEGIN{exit !(v <= h)}' ||
        bad "$1 '$2': expected a number in 0..$3"
}

HOSTS= TPH= WORKERS_SET=0 WORKERS=2 NPS=0 CHIEF=0 MBIT=0 TC_STATS= DELAY= TIMEOUT=3600 GRACE=5 BIN=${DOWNPOUR_BIN:-} DIR= KEEP=0
while [ $# -gt 0 ]; do
    case "$1" in
    --hosts) [ $# -ge 2 ] || bad "--hosts needs a value"; int_arg --hosts "$2" 1 250; HOSTS=$2; shift 2 ;;
    --workers) [ $# -ge 2 ] || bad "--workers needs a value"; int_arg --workers "$2" 1 256; WORKERS=$2; WORKERS_SET=1; shift 2 ;;
    --tasks-per-host) [ $# -ge 2 ] || bad "--tasks-per-host needs a value"; int_arg --tasks-per-host "$2" 1 64; TPH=$2; shift 2 ;;
    --ps) [ $# -ge 2 ] || bad "--ps needs a value"; int_arg --ps "$2" 0 256; NPS=$2; shift 2 ;;
    --chief) CHIEF=1; shift ;;
    --link-mbit) [ $# -ge 2 ] || bad "--link-mbit needs a value"; int_arg --link-mbit "$2" 0 100000; MBIT=$2; shift 2 ;;
    --tc-stats) [ $# -ge 2 ] || bad "--tc-stats needs a value"; TC_STATS=$2; shift 2 ;;
    --link-delay-ms) [ $# -ge 2 ] || bad "--link-delay-ms needs a value"; num_arg --link-delay-ms "$2" 10000; DELAY=$2; shift 2 ;;
    --timeout) [ $# -ge 2 ] || bad "--timeout needs a value"; int_arg --timeout "$2" 1 864000; TIMEOUT=$2; shift 2 ;;
    --grace) [ $# -ge 2 ] || bad "--grace needs a value"; int_arg --grace "$2" 1 3600; GRACE=$2; shift 2 ;;
    --bin) [ $# -ge 2 ] || bad "--bin needs a value"; BIN=$2; shift 2 ;;
    --dir) [ $# -ge 2 ] || bad "--dir needs a value"; DIR=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    *) bad "unknown option '$1' (the task command follows --; see --help)" ;;
    esac
done
[ $# -ge 1 ] || bad "no task command. Hint: vcluster.sh --hosts 3 --chief --workers 2 --ps 1 -- train --strategy ps-async"
case "$1" in
train|ping) ;;
*) bad "'$1': the tasks run 'train' or 'ping', so the command after -- must start with one of them" ;;
esac
TASK_ARGS=("$@")

if [ -n "$TPH" ]; then
    [ -n "$HOSTS" ] || bad "--tasks-per-host needs --hosts"
    [ "$WORKERS_SET" = 0 ] || bad "--tasks-per-host sets the workers (hosts x tasks - chief): leave out --workers"
    [ "$NPS" = 0 ] || bad "--tasks-per-host places chief and workers only: leave out --ps"
    WORKERS=$((HOSTS * TPH - CHIEF))
    [ "$WORKERS" -ge 1 ] || bad "--hosts $HOSTS --tasks-per-host $TPH leaves no worker beside the chief"
fi
NTASKS=$((CHIEF + WORKERS + NPS))
[ -n "$HOSTS" ] || HOSTS=$NTASKS
[ "$NTASKS" -le 256 ] || bad "$NTASKS tasks: at most 256"

if [ -z "$BIN" ]; then
    if [ -x "$here/../build/downpour" ]; then BIN="$here/../build/downpour"
    else BIN=$(command -v downpour || true); fi
fi
[ -n "$BIN" ] && [ -x "$BIN" ] || bad "--bin: no downpour program (give --bin PATH or set DOWNPOUR_BIN)"
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
[ "$(id -u)" = 0 ] || die "must run as root (network namespaces need CAP_NET_ADMIN)"
command -v ip >/dev/null 2>&1 || die "'ip' not found (install iproute2)"
[ "$MBIT" = 0 ] || command -v tc >/dev/null 2>&1 || die "'tc' not found (install iproute2)"

# --metrics FILE (or --metrics=FILE) in the task options: each task gets its own.
METRICS=
for ((i = 1; i < ${#TASK_ARGS[@]}; i++)); do
    a=${TASK_ARGS[i]}
    if [ "$a" = --metrics ] && [ $((i + 1)) -lt ${#TASK_ARGS[@]} ]; then METRICS=${TASK_ARGS[i + 1]}
    elif [[ "$a" == --metrics=* ]]; then METRICS=${a#--metrics=}; fi
done
[ -z "$METRICS" ] || case "$METRICS" in /*) ;; *) METRICS=$PWD/$METRICS ;; esac

# ---- placement: tasks in rank order, each with a host and a port ----
NAMES=() TYPES=() HOSTOF=() PORTS=()
for ((i = 0; i < CHIEF; i++)); do NAMES+=(chief); TYPES+=(chief); done
for ((i = 0; i < WORKERS; i++)); do NAMES+=("worker:$i"); TYPES+=(worker); done
for ((i = 0; i < NPS; i++)); do NAMES+=("ps:$i"); TYPES+=(ps); done
declare -A used=()
place() { # rank host
    HOSTOF[$1]=$2
    PORTS[$1]=$((2222 + ${used[$2]:-0}))
    used[$2]=$(( ${used[$2]:-0} + 1 ))
}
first_free=1 span=$HOSTS
for ((k = 0; k < NPS; k++)); do place $((CHIEF + WORKERS + k)) $((k % HOSTS + 1)); done
if [ "$HOSTS" -gt "$NPS" ] && [ "$NPS" -gt 0 ]; then first_free=$((NPS + 1)); span=$((HOSTS - NPS)); fi
if [ -n "$TPH" ]; then
    for ((r = 0; r < CHIEF + WORKERS; r++)); do place "$r" $((r / TPH + 1)); done
else
    for ((r = 0; r < CHIEF + WORKERS; r++)); do place "$r" $((first_free + r % span)); done
fi

# ---- cleanup on every way out ----
PREFIX="vc$(( $$ % 10000000 ))"
PIDS=() UP=0 MADE_DIR=0
stop_tasks() { # signal
    local p
    for p in "${PIDS[@]}"; do [ "$p" = 0 ] || kill -"$1" "$p" 2>/dev/null || true; done
}
# "host I in|out sent BYTES overlimits N" for each capped host (--tc-stats)
tc_stats() {
    local h line
    : >"$TC_STATS"
    for ((h = 1; h <= HOSTS; h++)); do
        line=$(tc -s qdisc show dev "$PREFIX-h$h" root 2>/dev/null | tr '\n' ' ')
        echo "host $h in $(sed -E 's/.*Sent ([0-9]+) bytes.*overlimits ([0-9]+).*/sent \1 overlimits \2/' <<<"$line")" >>"$TC_STATS"
        line=$("$NETNS" exec "$PREFIX" "$h" tc -s qdisc show dev eth0 root 2>/dev/null | tr '\n' ' ')
        echo "host $h out $(sed -E 's/.*Sent ([0-9]+) bytes.*overlimits ([0-9]+).*/sent \1 overlimits \2/' <<<"$line")" >>"$TC_STATS"
    done
}
cleanup() {
    trap - EXIT INT TERM HUP
    stop_tasks KILL
    if [ "$UP" != 0 ] && [ -n "$TC_STATS" ] && [ "$MBIT" != 0 ]; then
        tc_stats || echo "vcluster.sh: cannot read the tc counters" >&2
    fi
    [ "$UP" = 0 ] || "$NETNS" down "$PREFIX" || echo "vcluster.sh: netns.sh down $PREFIX failed" >&2
    if [ "$MADE_DIR" = 1 ] && [ "$KEEP" = 0 ]; then rm -rf "$DIR"; fi
}
# Before the tasks run, a signal ends the script at once; while they run,
# they get SIGTERM and the wait loop below collects them within --grace,
# merges their metrics and exits with 128 + the signal.
RUNNING=0 SIGNALLED=0
on_signal() {
    say "stopping on SIG$1"
    if [ "$RUNNING" = 0 ]; then cleanup; exit $((128 + $2)); fi
    [ "$SIGNALLED" = 0 ] || { stop_tasks KILL; return; } # a second signal
    SIGNALLED=$2
    stop_tasks TERM
    deadline=$(( $(date +%s) + GRACE ))
}
trap cleanup EXIT
trap 'on_signal INT 2' INT
trap 'on_signal TERM 15' TERM
trap 'on_signal HUP 1' HUP

if [ -z "$DIR" ]; then DIR=$(mktemp -d "${TMPDIR:-/tmp}/vcluster.XXXXXX"); MADE_DIR=1
else mkdir -p "$DIR" || die "--dir $DIR: cannot make it"; fi
DIR=$(cd "$DIR" && pwd)
[ "$KEEP" = 0 ] || say "files in $DIR"

# ---- hosts ----
export NETNS_OWNER=$$
UP=1
subnet=$("$NETNS" up "$PREFIX" "$HOSTS") || die "netns.sh up $PREFIX $HOSTS failed"
ADDR=()
for ((h = 1; h <= HOSTS; h++)); do
    ADDR[$h]=$("$NETNS" addr "$PREFIX" "$h") || die "no address for host $h"
    if [ "$MBIT" != 0 ]; then
        # a bucket of about 2 ms of the rate, at least 16 KiB (netns.sh's default)
        burst=$(( MBIT * 1000000 / 8 / 500 )); [ "$burst" -ge 16384 ] || burst=16384
        "$NETNS" slow "$PREFIX" "$h" "${MBIT}mbit" "$burst" || die "cannot cap host $h's link"
    fi
done
links=uncapped; [ "$MBIT" = 0 ] || links="capped at $MBIT Mbit/s each way"
say "$HOSTS hosts $PREFIX-1..$HOSTS on $subnet, links $links${DELAY:+, delay $DELAY ms a message}"

# ---- spec and secret ----
json_list() { # type
    local r out= sep=
    for ((r = 0; r < NTASKS; r++)); do
        [ "${TYPES[r]}" = "$1" ] || continue
        out+="$sep\"${ADDR[${HOSTOF[r]}]}:${PORTS[r]}\""; sep=", "
    done
    echo "[$out]"
}
SPEC=$DIR/cluster.json
{
    printf '{"cluster": {'
    sep=
    for t in chief worker ps; do
        l=$(json_list "$t"); [ "$l" = "[]" ] && continue
        printf '%s"%s": %s' "$sep" "$t" "$l"; sep=", "
    done
    printf '}}\n'
} >"$SPEC"
SECRET=$DIR/secret
(umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$SECRET") || die "cannot write $SECRET"

# BLAS threads as under launch: the cores shared out, unless set.
if [ -z "${OPENBLAS_NUM_THREADS:-}" ]; then
    t=$(( $(nproc) / NTASKS )); [ "$t" -ge 1 ] || t=1
    export OPENBLAS_NUM_THREADS=$t
fi

# ---- tasks ----
LOGS=()
T0=$(date +%s.%N)
deadline=$(( $(date +%s) + TIMEOUT ))
for ((r = 0; r < NTASKS; r++)); do
    name=${NAMES[r]} file=${NAMES[r]/:/-}
    [ "$name" != chief ] || file=chief-0
    args=("${TASK_ARGS[@]}")
    if [ -n "$METRICS" ]; then
        for ((i = 1; i < ${#args[@]}; i++)); do
            if [ "${args[i]}" = --metrics ]; then args[i + 1]=$METRICS.$file
            elif [[ "${args[i]}" == --metrics=* ]]; then args[i]=--metrics=$METRICS.$file; fi
        done
    fi
    [ -z "$DELAY" ] || args+=(--link-delay-ms "$DELAY")
    LOGS[r]=$DIR/$file.log
    label="[${name/:/ }]"
    say "$name on host ${HOSTOF[r]} (${ADDR[${HOSTOF[r]}]}:${PORTS[r]})"
    "$NETNS" exec "$PREFIX" "${HOSTOF[r]}" "$BIN" run --cluster "$SPEC" --task "$name" \
        --secret-file "$SECRET" -- "${args[@]}" </dev/null \
        > >(tee "${LOGS[r]}" | sed -u "s/^/$label /") 2>&1 &
    PIDS[r]=$!
    RUNNING=1
done

# ---- wait: every task, or the first failure, or the deadline ----
# A task that ended is gone from /proc or a zombie (kill -0 succeeds on one).
alive() { [ -e "/proc/$1" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
STATUS=() left=$NTASKS failed=-1 rc=0
while [ "$left" -gt 0 ]; do
    for ((r = 0; r < NTASKS; r++)); do
        p=${PIDS[r]}
        [ "$p" != 0 ] && ! alive "$p" || continue
        st=0; wait "$p" || st=$?
        STATUS[r]=$st PIDS[r]=0 left=$((left - 1))
        if [ "$st" != 0 ] && [ "$failed" -lt 0 ] && [ "$SIGNALLED" = 0 ]; then
            failed=$r rc=$st KEEP=1 # the logs tell why
            say "task ${NAMES[r]} exited with status $st; stopping the other $left task(s)"
            stop_tasks TERM
            deadline=$(( $(date +%s) + GRACE ))
        fi
    done
    [ "$left" -gt 0 ] || break
    if [ "$(date +%s)" -ge "$deadline" ]; then
        if [ "$failed" -lt 0 ] && [ "$SIGNALLED" = 0 ]; then say "timed out after $TIMEOUT s; stopping $left task(s)"; rc=124; fi
        stop_tasks KILL
        for ((r = 0; r < NTASKS; r++)); do
            [ "${PIDS[r]}" = 0 ] || { wait "${PIDS[r]}" || true; STATUS[r]=killed; PIDS[r]=0; }
        done
        break
    fi
    sleep 0.1
done
WALL=$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.3f", b - a}')
wait || true # the output filters

if [ "$failed" -ge 0 ]; then
    echo "---- end of ${NAMES[failed]}'s log (${LOGS[failed]}) ----" >&2
    tail -n 20 "${LOGS[failed]}" >&2 || true
    say "logs, spec and secret kept in $DIR"
fi

# ---- merged metrics, in rank order ----
if [ -n "$METRICS" ]; then
    src=()
    for ((r = 0; r < NTASKS; r++)); do
        task=${NAMES[r]} file=${NAMES[r]/:/-}
        [ "$task" != chief ] || { task=chief:0 file=chief-0; } # the tasks' own name for it
        src+=("$task=$METRICS.$file")
    done
    "$BIN" metrics merge --out "$METRICS" --seconds "$WALL" "${src[@]}" ||
        { echo "vcluster.sh: merging the metrics into $METRICS failed" >&2; [ "$rc" != 0 ] || rc=1; }
fi
[ "$SIGNALLED" = 0 ] || rc=$((128 + SIGNALLED))
summary=
for ((r = 0; r < NTASKS; r++)); do summary+=" ${NAMES[r]}=${STATUS[r]:-?}"; done
say "ended after $WALL s:$summary"
exit "$rc"
