#!/usr/bin/env bash
# netns.sh: separate "hosts" on one machine, for fault tests.  Each host is a
# network namespace with one address on a private bridge; a host's link can be
# cut (the others see silence, no RST), restored, or slowed (tc tbf).
#
#   netns.sh up PREFIX N          bridge PREFIX-br (10.77.X.1/24) and namespaces
#                                 PREFIX-1..PREFIX-N, host I at 10.77.X.(I+1)
#   netns.sh addr PREFIX I        prints host I's address (10.77.X.(I+1))
#   netns.sh exec PREFIX I CMD..  runs CMD inside host I (exec: CMD keeps the pid)
#   netns.sh cut PREFIX I         host I's link down: its packets go nowhere
#   netns.sh restore PREFIX I     link up again, rate limit removed
#   netns.sh slow PREFIX I RATE [BURST]
#                                 rate-limit host I both ways (RATE as tc: 1mbit;
#                                 BURST the bucket, as tc: 16kb, the default)
#   netns.sh down PREFIX          kill what runs inside, remove namespaces,
#                                 bridge and links; idempotent
#   netns.sh gc                   down every prefix whose owner process is gone
#   netns.sh list                 prefixes set up, with subnet and owner
#
# PREFIX: 1-9 characters of [A-Za-z0-9] (interface names are at most 15
# bytes); give each caller its own (tests use one with their pid in it).  The
# subnet X is the lowest one free among live prefixes and the machine's
# addresses, chosen under a lock, so parallel callers do not collide.  `up`
# first cleans what an earlier run with the same PREFIX left, and the state of
# prefixes whose owner (NETNS_OWNER, default the caller's pid) is dead.
# Needs root and iproute2 (ip, tc).  Exit status: 0 done, 1 failed, 2 usage.
set -u

STATE=${NETNS_STATE:-/run/downpour-netns}
LOCK=$STATE/.lock

die() { echo "netns.sh: $*" >&2; exit 1; }
usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

need_root() {
    [ "$(id -u)" = 0 ] || die "must run as root (network namespaces need CAP_NET_ADMIN)"
    command -v ip >/dev/null 2>&1 || die "'ip' not found (install iproute2)"
}

check_prefix() {
    [[ "$1" =~ ^[A-Za-z0-9]{1,9}$ ]] ||
        { echo "netns.sh: bad PREFIX '$1': 1-9 letters or digits" >&2; exit 2; }
}

check_index() {
    [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ "$1" -le 250 ] ||
        { echo "netns.sh: bad host index '$1': 1..250" >&2; exit 2; }
}

ns() { echo "$1-$2"; }       # namespace of host I
hostif() { echo "$1-h$2"; }  # host side of host I's veth, a port of the bridge

# The namespace must exist (set up by `up`).
need_ns() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -qx -- "$(ns "$1" "$2")" ||
        die "no namespace $(ns "$1" "$2") (run: netns.sh up $1 N)"
}

# Removes one prefix: processes inside its namespaces (SIGKILL), the
# namespaces, the host-side veths, the bridge, its state file.
do_down() {
    local p=$1 n pid
    for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E -- "^$p-[0-9]+\$"); do
        for pid in $(ip netns pids "$n" 2>/dev/null); do
            kill -9 "$pid" 2>/dev/null
        done
        ip netns del "$n" 2>/dev/null
    done
    for n in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
               grep -E -- "^$p-(h[0-9]+|br)\$"); do
        ip link del "$n" 2>/dev/null
    done
    rm -f "$STATE/$p"
}

# `gc`: prefixes whose owner process no longer exists.
do_gc() {
    local f p owner
    for f in "$STATE"/*; do
        [ -f "$f" ] || continue
        p=$(basename "$f")
        owner=$(awk '/^owner=/{sub("owner=","");print}' "$f")
        if [ -n "$owner" ] && ! kill -0 "$owner" 2>/dev/null; then
            echo "netns.sh: removing $p (owner $owner is gone)" >&2
            do_down "$p"
        fi
    done
}

# The lowest X in 1..254 with 10.77.X.0/24 neither in a state file nor on any
# interface of the root namespace.
free_subnet() {
    local used x
    used=$( { cat "$STATE"/* 2>/dev/null | awk -F= '/^subnet=/{print $2}'
              ip -4 -o addr show 2>/dev/null | grep -oE '10\.77\.[0-9]+\.' | cut -d. -f3; } |
            sort -un)
    for x in $(seq 1 254); do
        echo "$used" | grep -qx "$x" || { echo "$x"; return 0; }
    done
    return 1
}

do_up() {
    local p=$1 count=$2 x i n h
    mkdir -p "$STATE" || die "cannot make $STATE"
    exec 9>"$LOCK"
    command -v flock >/dev/null 2>&1 && flock -w 30 9
    do_gc
    do_down "$p"
    x=$(free_subnet) || die "no free 10.77.X.0/24 subnet"
    printf 'subnet=%s\nhosts=%s\nowner=%s\n' "$x" "$count" "${NETNS_OWNER:-$PPID}" >"$STATE/$p"
    fail() { do_down "$p"; die "$*"; }
    # No bridge netfilter on this bridge, whatever br_netfilter and the
    # firewall say: the hosts' traffic must only be what this script does to it.
    ip link add "$p-br" type bridge nf_call_iptables 0 nf_call_ip6tables 0 nf_call_arptables 0 \
        2>/dev/null || ip link add "$p-br" type bridge || fail "cannot create bridge $p-br"
    ip addr add "10.77.$x.1/24" dev "$p-br" || fail "cannot address $p-br"
    ip link set "$p-br" up || fail "cannot bring up $p-br"
    for i in $(seq 1 "$count"); do
        n=$(ns "$p" "$i")
        h=$(hostif "$p" "$i")
        ip netns add "$n" || fail "cannot create namespace $n"
        ip link add "$h" type veth peer name eth0 netns "$n" || fail "cannot create veth $h"
        ip link set "$h" master "$p-br" || fail "cannot attach $h to $p-br"
        ip link set "$h" up || fail "cannot bring up $h"
        ip -n "$n" link set lo up || fail "cannot bring up lo in $n"
        ip -n "$n" addr add "10.77.$x.$((i + 1))/24" dev eth0 || fail "cannot address $n"
        ip -n "$n" link set eth0 up || fail "cannot bring up eth0 in $n"
    done
    # The ports need a moment to forward (no STP: at once, but carrier takes a tick).
    for i in $(seq 1 50); do
        ip -o link show "$p-br" | grep -q 'state UP' && break
        sleep 0.1
    done
    echo "10.77.$x.0/24"
}

do_addr() {
    local p=$1 i=$2 a
    need_ns "$p" "$i"
    a=$(ip -n "$(ns "$p" "$i")" -4 -o addr show dev eth0 2>/dev/null | awk '{print $4}' | cut -d/ -f1)
    [ -n "$a" ] || die "no address in $(ns "$p" "$i")"
    echo "$a"
}

# Rate limit with tbf on both ends of host I's veth: the host side's egress is
# what host I receives, eth0's egress inside the namespace what it sends.
# A fast link needs a bigger bucket than 16kb (about 2 ms of its rate), or
# tbf cannot refill it often enough to reach the rate.
do_slow() {
    local p=$1 i=$2 rate=$3 burst=${4:-16kb}
    command -v tc >/dev/null 2>&1 || die "'tc' not found (install iproute2)"
    need_ns "$p" "$i"
    tc qdisc replace dev "$(hostif "$p" "$i")" root tbf rate "$rate" burst "$burst" latency 400ms ||
        die "tc tbf on $(hostif "$p" "$i") failed"
    ip netns exec "$(ns "$p" "$i")" tc qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" \
        latency 400ms || die "tc tbf in $(ns "$p" "$i") failed"
}

do_restore() {
    local p=$1 i=$2
    need_ns "$p" "$i"
    if command -v tc >/dev/null 2>&1; then
        tc qdisc del dev "$(hostif "$p" "$i")" root 2>/dev/null
        ip netns exec "$(ns "$p" "$i")" tc qdisc del dev eth0 root 2>/dev/null
    fi
    ip link set "$(hostif "$p" "$i")" up || die "cannot bring up $(hostif "$p" "$i")"
}

[ $# -ge 1 ] || usage
cmd=$1
shift
case "$cmd" in
-h|--help|help) usage ;;
up)
    [ $# -eq 2 ] || usage
    check_prefix "$1"
    [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ] && [ "$2" -le 250 ] ||
        { echo "netns.sh: bad host count '$2': 1..250" >&2; exit 2; }
    need_root
    do_up "$1" "$2"
    ;;
addr)
    [ $# -eq 2 ] || usage
    check_prefix "$1"; check_index "$2"; need_root
    do_addr "$1" "$2"
    ;;
exec)
    [ $# -ge 3 ] || usage
    check_prefix "$1"; check_index "$2"; need_root
    need_ns "$1" "$2"
    n=$(ns "$1" "$2")
    shift 2
    exec ip netns exec "$n" "$@"
    ;;
cut)
    [ $# -eq 2 ] || usage
    check_prefix "$1"; check_index "$2"; need_root
    need_ns "$1" "$2"
    ip link set "$(hostif "$1" "$2")" down || die "cannot take down $(hostif "$1" "$2")"
    ;;
restore)
    [ $# -eq 2 ] || usage
    check_prefix "$1"; check_index "$2"; need_root
    do_restore "$1" "$2"
    ;;
slow)
    [ $# -eq 3 ] || [ $# -eq 4 ] || usage
    check_prefix "$1"; check_index "$2"; need_root
    do_slow "$@"
    ;;
down)
    [ $# -eq 1 ] || usage
    check_prefix "$1"; need_root
    do_down "$1"
    ;;
gc)
    [ $# -eq 0 ] || usage
    need_root
    do_gc
    ;;
list)
    [ $# -eq 0 ] || usage
    for f in "$STATE"/*; do
        [ -f "$f" ] || continue
        echo "$(basename "$f") $(tr '\n' ' ' <"$f")"
    done
    ;;
*)
    echo "netns.sh: unknown command '$cmd'" >&2
    usage
    ;;
esac
