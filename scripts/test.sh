#!/usr/bin/env bash
# The whole test suite: installs what it needs (see setup.sh), builds every
# crate once in the release profile, then runs unit tests, the engine and
# openraft conformance suites, the differential tests against a real etcd
# 3.5, the multi-process cluster and crash tests, the gateway tests against
# real nginx, and the benchmark smoke tests.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$here/.."
source "$here/env.sh"
bash "$here/setup.sh"
cd "$root"
echo "== build (release profile, target dir $CARGO_TARGET_DIR)"
build_workspace
echo "== clippy"
cargo clippy --release --workspace --all-targets -- -D warnings
echo "== tests"
export STORE_BIN="${STORE_BIN:-$CARGO_TARGET_DIR/release/store}"
export GATEWAY_BIN="${GATEWAY_BIN:-$CARGO_TARGET_DIR/release/gateway}"
# Four tests at a time on two cores: most tests wait (elections, timeouts,
# processes starting), so two at a time left the machine ~55% idle; the
# integration binary took 495 s with two and 334 s with four.
cargo test --release --workspace --no-fail-fast -- --test-threads="${TEST_THREADS:-4}"
echo "== the run command's build after the test command's compiles nothing"
built="$(build_workspace --message-format=json 2>/dev/null)"
if grep -q '"fresh":false' <<<"$built"; then
  echo "the run command's build compiled something after the test command's" >&2
  exit 1
fi
