#!/usr/bin/env bash
# Watch the gateway's virtual IP fail over on one machine: three "nodes" as
# network namespaces on a bridge, each running a store member and a gateway
# that competes for the VIP (kubeadm's stacked topology with the gateway in
# keepalived's and HAProxy's place). Needs root and iproute2.
#
#   scripts/vip-stack.sh up        # start (builds store and gateway if missing)
#   scripts/vip-stack.sh status    # who holds the VIP, each gateway's /api/vip
#   scripts/vip-stack.sh watch     # print the holder twice a second (Ctrl-C ends)
#   scripts/vip-stack.sh kill N    # SIGKILL node N's gateway (1-3)
#   scripts/vip-stack.sh stop N    # SIGSTOP node N's gateway; `cont N` resumes it
#   scripts/vip-stack.sh start N   # start node N's gateway again
#   scripts/vip-stack.sh down      # stop exactly the recorded processes, remove the namespaces
#
# Node N has the address $VIP_STACK_NET.N/24 on its eth0; this (root) namespace
# has $VIP_STACK_NET.254 on the bridge, the VIP is $VIP_STACK_NET.100. Each
# gateway listens on VIP:2379 and relays to its own member (checks etcd-http),
# so `etcdctl --endpoints=http://VIP:2379 put k v` goes through the holder.
# Environment:
#   VIP_STACK_NET   first three octets of the subnet (default 10.254.7)
#   VIP_STACK_TTL   the election's lease TTL (default 3s)
#   VIP_STACK_DIR   state: data, logs, pids (default ~/.local/state/etcd-rs-vip-stack)
#   STORE_BIN, GATEWAY_BIN, ETCDCTL   binaries (default: the release builds, etcdctl 3.5)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/env.sh"

net="${VIP_STACK_NET:-10.254.7}"
ttl="${VIP_STACK_TTL:-3s}"
state="${VIP_STACK_DIR:-$HOME/.local/state/etcd-rs-vip-stack}"
store_bin="${STORE_BIN:-$CARGO_TARGET_DIR/release/store}"
gateway_bin="${GATEWAY_BIN:-$CARGO_TARGET_DIR/release/gateway}"
etcdctl="${ETCDCTL:-$ETCD35_DIR/etcdctl}"
pids="$state/pids"
vip="$net.100"
hub=vipstack-hub
root_if=vipstack0
nodes=(1 2 3)
# Seconds to wait for the members and a VIP holder.
ready_timeout=60
# Seconds a stopped process gets between SIGTERM and SIGKILL.
stop_grace=10

die() { echo "vip-stack: $*" >&2; exit 1; }
ns() { echo "vipstack-n$1"; }

[[ $(id -u) == 0 ]] || die "must run as root (it creates network namespaces)"
command -v "$etcdctl" >/dev/null || etcdctl=etcdctl

# The recorded pid of NAME if that process still runs the recorded binary.
live_pid() {
  local name=$1 pid exe
  [[ -f $pids ]] || return 1
  pid=$(awk -v n="$name" '$1 == n { print $2 }' "$pids" | tail -n 1)
  [[ -n $pid ]] || return 1
  exe=$(awk -v n="$name" '$1 == n { print $3 }' "$pids" | tail -n 1)
  [[ -r /proc/$pid/cmdline ]] || return 1
  tr '\0' '\n' <"/proc/$pid/cmdline" | head -n1 | grep -qxF "$exe" || return 1
  echo "$pid"
}

# start NAME NODE BINARY ARGS...: runs BINARY in NODE's namespace, in its own
# session, and records its pid (ip netns exec execs the binary).
start() {
  local name=$1 node=$2 bin=$3
  shift 3
  setsid ip netns exec "$(ns "$node")" "$bin" "$@" >>"$state/$name.log" 2>&1 </dev/null &
  echo "$name $! $bin" >>"$pids"
}

network_up() {
  ip -4 -o addr show | grep -q " $net\." && die "$net.0/24 is in use here: set VIP_STACK_NET"
  ip netns add "$hub"
  ip -n "$hub" link add br0 type bridge
  ip -n "$hub" link set br0 up
  local n
  for n in "${nodes[@]}"; do
    ip netns add "$(ns "$n")"
    ip -n "$(ns "$n")" link set lo up
    ip -n "$hub" link add "n$n" type veth peer name eth0 netns "$(ns "$n")"
    ip -n "$hub" link set "n$n" master br0 up
    ip -n "$(ns "$n")" addr add "$net.$n/24" dev eth0
    ip -n "$(ns "$n")" link set eth0 up
  done
  ip link add "$root_if" type veth peer name c netns "$hub"
  ip -n "$hub" link set c master br0 up
  ip addr add "$net.254/24" dev "$root_if"
  ip link set "$root_if" up
}

network_down() {
  local n
  ip link del "$root_if" 2>/dev/null || true
  for n in "${nodes[@]}"; do ip netns del "$(ns "$n")" 2>/dev/null || true; done
  ip netns del "$hub" 2>/dev/null || true
}

start_gateway() {
  local n=$1 endpoints=""
  for m in "${nodes[@]}"; do endpoints+="${endpoints:+,}$net.$m:2379"; done
  start "gateway$n" "$n" "$gateway_bin" --listen "$vip:2379" --backend "$net.$n:2379" \
    --check etcd-http --check-interval 500ms --rise 1 --admin "$net.$n:9100" \
    --vip "$vip/32" --vip-interface eth0 --vip-election "etcd://$endpoints" \
    --vip-lease-ttl "$ttl" --vip-name "node$n"
}

holder() {
  local n out=""
  for n in "${nodes[@]}"; do
    ip -n "$(ns "$n")" -4 -o addr show dev eth0 2>/dev/null | grep -q " $vip/" && out+="${out:+ }node$n"
  done
  echo "${out:-nobody}"
}

up() {
  [[ -f $pids ]] && die "already up (scripts/vip-stack.sh down first)"
  if [[ ! -x $store_bin || ! -x $gateway_bin ]]; then
    echo "building the workspace into $CARGO_TARGET_DIR"
    cargo build --release --workspace --all-targets --manifest-path "$here/../Cargo.toml"
  fi
  rm -rf "$state"
  mkdir -p "$state"
  network_up
  local n cluster=""
  for n in "${nodes[@]}"; do cluster+="${cluster:+,}m$n=http://$net.$n:2380"; done
  for n in "${nodes[@]}"; do
    start "m$n" "$n" "$store_bin" --name="m$n" --data-dir="$state/m$n.etcd" \
      --listen-client-urls="http://$net.$n:2379" --advertise-client-urls="http://$net.$n:2379" \
      --listen-peer-urls="http://$net.$n:2380" --initial-advertise-peer-urls="http://$net.$n:2380" \
      --initial-cluster="$cluster" --initial-cluster-token=etcd-rs-vip-stack \
      --initial-cluster-state=new --log-outputs=stderr
  done
  for n in "${nodes[@]}"; do start_gateway "$n"; done
  local deadline=$((SECONDS + ready_timeout))
  until "$etcdctl" --endpoints="http://$vip:2379" --dial-timeout=1s --command-timeout=2s \
      endpoint health >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "no VIP holder serving in ${ready_timeout}s (logs in $state)"
    sleep 0.5
  done
  echo "VIP $vip held by $(holder); try:"
  echo "  $etcdctl --endpoints=http://$vip:2379 put foo bar"
  echo "  scripts/vip-stack.sh watch     (in another terminal)"
  echo "  scripts/vip-stack.sh kill N    (N = the holder's node number)"
  echo "state and logs: $state"
}

status() {
  local n
  echo "VIP $vip held by: $(holder)"
  for n in "${nodes[@]}"; do
    printf 'node%s: ' "$n"
    curl -s --max-time 2 "http://$net.$n:9100/api/vip" || printf 'admin API not answering'
    echo
  done
}

watch_holder() {
  while true; do
    printf '%s  VIP %s held by %s\n' "$(date +%T.%N | cut -c1-12)" "$vip" "$(holder)"
    sleep 0.5
  done
}

signal_gateway() {
  local sig=$1 n=${2:-} pid
  [[ $n =~ ^[123]$ ]] || die "give a node number 1-3"
  pid=$(live_pid "gateway$n") || die "gateway$n is not running"
  kill "-$sig" "$pid"
  echo "sent SIG$sig to gateway$n (pid $pid)"
}

down() {
  local name pid deadline
  for name in gateway1 gateway2 gateway3 m1 m2 m3; do
    pid=$(live_pid "$name") || continue
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid"
    deadline=$((SECONDS + stop_grace))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi
    echo "stopped $name (pid $pid)"
  done
  network_down
  rm -rf "$state"
}

case "${1:-}" in
  up) up ;;
  status) status ;;
  watch) watch_holder ;;
  kill) signal_gateway KILL "${2:-}" ;;
  stop) signal_gateway STOP "${2:-}" ;;
  cont) signal_gateway CONT "${2:-}" ;;
  start)
    [[ ${2:-} =~ ^[123]$ ]] || die "give a node number 1-3"
    live_pid "gateway$2" >/dev/null && die "gateway$2 runs"
    start_gateway "$2"
    ;;
  down) down ;;
  *) die "usage: scripts/vip-stack.sh up|status|watch|kill N|stop N|cont N|start N|down" ;;
esac
