#!/usr/bin/env bash
# Compares the CPU per put of two store builds by loading two 3-member clusters
# AT THE SAME TIME, one per build.
#
# On this project's shared two-core machines the same build needs anywhere from
# 80 to 150 us of member CPU per put from one run to the next (the machine's speed
# moves, not the store), so runs one after the other cannot show a change of a few
# percent. Loaded side by side, both clusters see the same slow or fast minute: in
# A/A runs the two CPU-per-put figures agreed within 3%.
#
# usage: scripts/ab-cpu.sh STORE_A STORE_B [CLIENTS] [ROUNDS]
#   CLIENTS  load clients per cluster, spread over its members (default 128)
#   ROUNDS   fresh cluster pairs (default 3)
# Environment: BENCH (the bench binary), RUN_SECONDS (default 10),
#   SUBNET_A / SUBNET_B (default 127.0.64 / 127.0.65), WORK_DIR (default a new
#   temporary directory, removed at the end), STORE_FLAGS (more flags for every
#   member of both clusters, e.g. "--snapshot-count 5000").
# Prints, per round, puts/s, members' CPU us per put and p99 / p99.9 ms of each
# build, and B/A.
# Stops only the processes it started, by pid.
set -euo pipefail

die() { echo "ab-cpu: $*" >&2; exit 1; }
(($# >= 2)) || die "usage: $0 STORE_A STORE_B [CLIENTS] [ROUNDS]"
STORE_A=$1 STORE_B=$2 CLIENTS=${3:-128} ROUNDS=${4:-3}
for bin in "$STORE_A" "$STORE_B"; do [[ -x $bin ]] || die "$bin is not an executable"; done
BENCH=${BENCH:-${CARGO_TARGET_DIR:-$HOME/.cache/etcd-rs/target}/release/bench}
[[ -x $BENCH ]] || die "$BENCH is missing (cargo build --release -p bench)"
RUN_SECONDS=${RUN_SECONDS:-10}
read -r -a EXTRA_FLAGS <<<"${STORE_FLAGS:-}"
SUBNET_A=${SUBNET_A:-127.0.64} SUBNET_B=${SUBNET_B:-127.0.65}
OWN_DIR=false
if [[ -z ${WORK_DIR:-} ]]; then WORK_DIR=$(mktemp -d) && OWN_DIR=true; fi
LOAD=(--key-size 32 --val-size 256 --key-space-size 100000 --conns 16 --clients "$CLIENTS")
CLK_TCK=$(getconf CLK_TCK)

pids=()
stop_all() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; done
  pids=()
}
cleanup() { stop_all; if $OWN_DIR; then rm -rf "$WORK_DIR"; fi; }
trap cleanup EXIT

# start_cluster BIN SUBNET LABEL: three members; their pids go to $WORK_DIR/LABEL.pids.
start_cluster() {
  local bin=$1 net=$2 label=$3 i
  local cluster="m1=http://$net.1:2380,m2=http://$net.2:2380,m3=http://$net.3:2380"
  : >"$WORK_DIR/$label.pids"
  for i in 1 2 3; do
    "$bin" --name "m$i" --data-dir "$WORK_DIR/$label-m$i.data" \
      --listen-client-urls "http://$net.$i:2379" --advertise-client-urls "http://$net.$i:2379" \
      --listen-peer-urls "http://$net.$i:2380" --initial-advertise-peer-urls "http://$net.$i:2380" \
      --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "$label" \
      ${EXTRA_FLAGS[@]+"${EXTRA_FLAGS[@]}"} >"$WORK_DIR/$label-m$i.log" 2>&1 &
    pids+=($!)
    echo $! >>"$WORK_DIR/$label.pids"
  done
}

endpoints() { echo "http://$1.1:2379,http://$1.2:2379,http://$1.3:2379"; }

# cpu_ticks LABEL: utime + stime of the cluster's members, in clock ticks.
cpu_ticks() {
  local total=0 p
  for p in $(cat "$WORK_DIR/$1.pids"); do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$total"
}

# load SECONDS OUT: both clusters at once; bench's output to OUT.A / OUT.B.
load() {
  local a b
  "$BENCH" put --no-progress --endpoints "$(endpoints "$SUBNET_A")" --duration "$1s" "${LOAD[@]}" >"$2.A" 2>&1 &
  a=$!
  "$BENCH" put --no-progress --endpoints "$(endpoints "$SUBNET_B")" --duration "$1s" "${LOAD[@]}" >"$2.B" 2>&1 &
  b=$!
  # One wait per run: `wait A B` reports only B's status.
  local failed=false
  wait "$a" || failed=true
  wait "$b" || failed=true
  ! $failed || die "a load run failed: $(tail -n 3 "$2.A" "$2.B")"
}

ops() { grep -o 'ok=[0-9]*' "$1" | head -1 | cut -d= -f2; }
# tail_ms OUT: the run's p99 and p99.9 latency, ms.
tail_ms() { grep -o 'p99=[0-9.]*\|p99\.9=[0-9.]*' "$1" | head -2 | cut -d= -f2 | paste -sd/; }

for ((round = 1; round <= ROUNDS; round++)); do
  rm -rf "$WORK_DIR"/*.data
  start_cluster "$STORE_A" "$SUBNET_A" A
  start_cluster "$STORE_B" "$SUBNET_B" B
  sleep 3
  load 2 "$WORK_DIR/warm"
  a0=$(cpu_ticks A) b0=$(cpu_ticks B)
  load "$RUN_SECONDS" "$WORK_DIR/run"
  a1=$(cpu_ticks A) b1=$(cpu_ticks B)
  stop_all
  python3 - "$round" "$(ops "$WORK_DIR/run.A")" "$(ops "$WORK_DIR/run.B")" \
    "$((a1 - a0))" "$((b1 - b0))" "$CLK_TCK" "$RUN_SECONDS" \
    "$(tail_ms "$WORK_DIR/run.A")" "$(tail_ms "$WORK_DIR/run.B")" <<'PY'
import sys
r, oa, ob, ta, tb, hz, secs, la, lb = sys.argv[1:]
oa, ob, ta, tb, hz, secs = int(oa), int(ob), int(ta), int(tb), int(hz), float(secs)
ua, ub = ta / hz / oa * 1e6, tb / hz / ob * 1e6
print(f"round {r}: A {oa / secs:,.0f} puts/s {ua:.1f} us/put p99/p99.9 {la} ms | "
      f"B {ob / secs:,.0f} puts/s {ub:.1f} us/put p99/p99.9 {lb} ms | "
      f"B/A CPU per put {ub / ua:.3f}, puts/s {ob / oa:.3f}")
PY
done
