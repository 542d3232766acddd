#!/usr/bin/env bash
# CPU seconds per 10,000 acknowledged puts, summed over the three members,
# for our store and etcd 3.5 side by side (3 members each on loopback, the
# same `bench put` load against every member's endpoint). Members are
# started and stopped by this script, by pid.
#
#   bench/scripts/cpu-per-write.sh [clients] [total]     (default 256 20000)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../../scripts/env.sh"
clients=${1:-256}
total=${2:-20000}
bin="$CARGO_TARGET_DIR/release"
store="${STORE_BIN:-$bin/store}"
etcd="$ETCD35_DIR/etcd"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

ticks=$(getconf CLK_TCK)
cpu_seconds() { # pid...: utime+stime of each, summed, in seconds
  local sum=0
  for p in "$@"; do
    read -r -a f <"/proc/$p/stat"
    sum=$((sum + f[13] + f[14]))
  done
  echo "scale=3; $sum / $ticks" | bc
}

run() { # name binary subnet
  local name=$1 binary=$2 subnet=$3 cluster="" endpoints="" members=()
  for i in 1 2 3; do
    cluster+="${cluster:+,}m$i=http://$subnet.$i:2380"
    endpoints+="${endpoints:+,}http://$subnet.$i:2379"
  done
  for i in 1 2 3; do
    "$binary" --name "m$i" --data-dir "$work/$name-m$i" \
      --listen-client-urls "http://$subnet.$i:2379" --advertise-client-urls "http://$subnet.$i:2379" \
      --listen-peer-urls "http://$subnet.$i:2380" --initial-advertise-peer-urls "http://$subnet.$i:2380" \
      --initial-cluster "$cluster" --initial-cluster-state new >"$work/$name-m$i.log" 2>&1 &
    members+=($!)
    pids+=($!)
  done
  # Ready once a put through every member succeeds.
  for _ in $(seq 100); do
    if "$bin/bench" put --endpoints "$endpoints" --total 3 --clients 3 --no-progress >/dev/null 2>&1; then break; fi
    sleep 0.2
  done
  local before after result
  before=$(cpu_seconds "${members[@]}")
  result=$("$bin/bench" put --endpoints "$endpoints" --conns 16 --clients "$clients" --total "$total" \
    --key-size 32 --val-size 256 --key-space-size 100000 --no-progress --output json)
  after=$(cpu_seconds "${members[@]}")
  local ok rate
  ok=$(jq -r '.ops[0].ok' <<<"$result")
  rate=$(jq -r '.ops[0].throughput_ops_s | floor' <<<"$result")
  echo "$name: $ok puts acknowledged, $rate ops/s, members' CPU $(echo "$after - $before" | bc) s, $(echo "scale=2; ($after - $before) * 10000 / $ok" | bc) CPU s per 10,000 puts"
  for p in "${members[@]}"; do kill -9 "$p" 2>/dev/null || true; done
}

run store "$store" 127.0.61
run etcd "$etcd" 127.0.62
