#!/usr/bin/env bash
# A local stacked topology in one command: three store members and a gateway
# in front of them, on their own loopback addresses.
#
#   scripts/stack.sh up       # start (builds store and gateway if missing)
#   scripts/stack.sh status   # which processes run, endpoint status table
#   scripts/stack.sh down     # stop exactly the recorded processes, remove the state
#
# Members listen on ${STACK_BASE_IP}.1-3 (clients :2379, peers :2380), the
# gateway on ${STACK_BASE_IP}.4:2379, relaying TCP to the members' client
# ports and checking each member's /health (gateway --check etcd-http).
# Environment:
#   STACK_BASE_IP     first three octets (default 127.0.10)
#   STACK_MEMBER_IPS  three addresses instead ("127.1.2.3 127.1.2.4 127.1.2.5")
#   STACK_GATEWAY_IP  the gateway's address instead
#   STACK_DIR         state: data, logs, pids (default ~/.local/state/etcd-rs-stack)
#   STORE_BIN, GATEWAY_BIN, ETCDCTL   binaries (default: the release builds, etcdctl 3.5)
#   KUBE_APISERVER    path to a kube-apiserver binary: also start one apiserver
#                     per member (https on the member's address :6443, its
#                     --etcd-servers the local member, as kubeadm's stacked
#                     topology) and a second gateway in apiserver mode on the
#                     gateway address :6443 (TLS passthrough, checks https /readyz)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/env.sh"

base="${STACK_BASE_IP:-127.0.10}"
read -r -a member_ips <<<"${STACK_MEMBER_IPS:-$base.1 $base.2 $base.3}"
gateway_ip="${STACK_GATEWAY_IP:-$base.4}"
state="${STACK_DIR:-$HOME/.local/state/etcd-rs-stack}"
store_bin="${STORE_BIN:-$CARGO_TARGET_DIR/release/store}"
gateway_bin="${GATEWAY_BIN:-$CARGO_TARGET_DIR/release/gateway}"
etcdctl="${ETCDCTL:-$ETCD35_DIR/etcdctl}"
pids="$state/pids"
kube_apiserver="${KUBE_APISERVER:-}"
# kube-apiserver's secure port (kubeadm's default) and its service network.
apiserver_port=6443
service_cidr=10.96.0.0/12
names=(m1 m2 m3 gateway)
[[ -n $kube_apiserver ]] && names+=(api1 api2 api3 gateway-api)
# Seconds to wait for the members and the gateway to serve.
ready_timeout=60
# Seconds a stopped process gets between SIGTERM and SIGKILL.
stop_grace=10

die() { echo "stack: $*" >&2; exit 1; }

[[ ${#member_ips[@]} -eq 3 ]] || die "STACK_MEMBER_IPS must hold three addresses"
command -v "$etcdctl" >/dev/null || etcdctl=etcdctl

member_endpoints() {
  local out=() ip
  for ip in "${member_ips[@]}"; do out+=("http://$ip:2379"); done
  (IFS=,; echo "${out[*]}")
}

gateway_endpoint() { echo "http://$gateway_ip:2379"; }

# The recorded pid of NAME if that process still runs the recorded binary.
live_pid() {
  local name=$1 pid exe
  [[ -f $pids ]] || return 1
  pid=$(awk -v n="$name" '$1 == n { print $2 }' "$pids")
  [[ -n $pid ]] || return 1
  exe=$(awk -v n="$name" '$1 == n { print $3 }' "$pids")
  [[ -r /proc/$pid/cmdline ]] || return 1
  # The binary is the first word, or the second for a script run by its
  # interpreter (#!/usr/bin/env python3 ...).
  tr '\0' '\n' <"/proc/$pid/cmdline" | head -n2 | grep -qxF "$exe" || return 1
  echo "$pid"
}

build_if_missing() {
  if [[ ! -x $store_bin || ! -x $gateway_bin ]]; then
    echo "building store and gateway into $CARGO_TARGET_DIR"
    cargo build --release -p store -p gateway --manifest-path "$here/../Cargo.toml"
  fi
}

# start NAME LOGFILE BINARY ARGS...: runs in its own session, records the pid.
start() {
  local name=$1 log=$2 bin=$3
  shift 3
  setsid "$bin" "$@" >>"$log" 2>&1 </dev/null &
  echo "$name $! $bin" >>"$pids"
}

wait_https_ready() {
  local deadline=$((SECONDS + ready_timeout))
  until curl -sfk --max-time 2 "$1/readyz" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "$1/readyz did not answer ok in ${ready_timeout}s (logs in $state)"
    sleep 0.5
  done
}

# One kube-apiserver per member, each writing to its local member, and a
# gateway in apiserver mode in front of them.
up_apiservers() {
  local i ip name backends=()
  [[ -x $kube_apiserver ]] || die "KUBE_APISERVER=$kube_apiserver is not an executable"
  openssl genrsa -out "$state/sa.key" 2048 2>/dev/null
  openssl rsa -in "$state/sa.key" -pubout -out "$state/sa.pub" 2>/dev/null
  for i in 0 1 2; do
    name="api$((i + 1))"
    ip=${member_ips[$i]}
    start "$name" "$state/$name.log" "$kube_apiserver" \
      --etcd-servers="http://$ip:2379" --bind-address="$ip" --advertise-address="$ip" \
      --secure-port="$apiserver_port" --cert-dir="$state/$name-certs" \
      --service-account-issuer=https://kubernetes.default.svc.cluster.local \
      --service-account-key-file="$state/sa.pub" \
      --service-account-signing-key-file="$state/sa.key" \
      --service-cluster-ip-range="$service_cidr"
    backends+=(--backend "$ip:$apiserver_port")
  done
  start gateway-api "$state/gateway-api.log" "$gateway_bin" \
    --listen "$gateway_ip:$apiserver_port" "${backends[@]}" --check https:/readyz \
    --check-interval 1s --rise 1 --admin "$gateway_ip:9101"
  for ip in "${member_ips[@]}"; do wait_https_ready "https://$ip:$apiserver_port"; done
  wait_https_ready "https://$gateway_ip:$apiserver_port"
}

wait_serving() {
  local deadline=$((SECONDS + ready_timeout))
  until "$etcdctl" --endpoints="$1" --dial-timeout=1s --command-timeout=2s \
      endpoint health >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "$1 did not become healthy in ${ready_timeout}s (logs in $state)"
    sleep 0.5
  done
}

up() {
  local name i cluster="" ip
  for name in "${names[@]}"; do
    if live_pid "$name" >/dev/null; then die "already up (scripts/stack.sh down first)"; fi
  done
  build_if_missing
  rm -rf "$state"
  mkdir -p "$state"
  for i in 0 1 2; do cluster+="${cluster:+,}m$((i + 1))=http://${member_ips[$i]}:2380"; done
  for i in 0 1 2; do
    name="m$((i + 1))"
    ip=${member_ips[$i]}
    start "$name" "$state/$name.log" "$store_bin" \
      --name="$name" --data-dir="$state/$name.etcd" \
      --listen-client-urls="http://$ip:2379" --advertise-client-urls="http://$ip:2379" \
      --listen-peer-urls="http://$ip:2380" --initial-advertise-peer-urls="http://$ip:2380" \
      --initial-cluster="$cluster" --initial-cluster-token=etcd-rs-stack \
      --initial-cluster-state=new --log-outputs=stderr
  done
  local backends=()
  for ip in "${member_ips[@]}"; do backends+=(--backend "$ip:2379"); done
  start gateway "$state/gateway.log" "$gateway_bin" \
    --listen "$gateway_ip:2379" "${backends[@]}" --check etcd-http \
    --check-interval 1s --rise 1 --admin "$gateway_ip:9100"
  wait_serving "$(member_endpoints)"
  wait_serving "$(gateway_endpoint)"
  [[ -n $kube_apiserver ]] && up_apiservers
  echo "members:  $(member_endpoints)"
  echo "gateway:  $(gateway_endpoint)   (admin http://$gateway_ip:9100/)"
  if [[ -n $kube_apiserver ]]; then
    echo "apiservers: https://${member_ips[0]}:$apiserver_port, https://${member_ips[1]}:$apiserver_port, https://${member_ips[2]}:$apiserver_port"
    echo "control-plane endpoint: https://$gateway_ip:$apiserver_port   (admin http://$gateway_ip:9101/)"
  fi
  echo "state:    $state"
  "$etcdctl" --endpoints="$(member_endpoints)" endpoint status -w table
  echo "try: $etcdctl --endpoints=$(gateway_endpoint) put foo bar"
}

status() {
  local name pid any=0 recorded=("${names[@]}")
  [[ -f $pids ]] && mapfile -t recorded < <(awk '{ print $1 }' "$pids")
  for name in "${recorded[@]}"; do
    if pid=$(live_pid "$name"); then
      echo "$name running (pid $pid)"
      any=1
    else
      echo "$name stopped"
    fi
  done
  if ((any)); then
    "$etcdctl" --endpoints="$(member_endpoints)" --dial-timeout=2s \
      endpoint status -w table || true
  fi
}

down() {
  local name pid deadline
  # Everything recorded, clients of the members first.
  for name in gateway-api api1 api2 api3 gateway m1 m2 m3; do
    pid=$(live_pid "$name") || continue
    kill -TERM "$pid"
    deadline=$((SECONDS + stop_grace))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi
    echo "stopped $name (pid $pid)"
  done
  rm -rf "$state"
}

case "${1:-}" in
  up) up ;;
  status) status ;;
  down) down ;;
  *) die "usage: scripts/stack.sh up|status|down" ;;
esac
