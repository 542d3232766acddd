#!/usr/bin/env bash
# Runs one store member. With no arguments: etcd's defaults (name "default",
# clients on http://localhost:2379, peers on :2380, data in ./default.etcd).
# Any etcd flag may be passed, e.g. scripts/run.sh --name m1 --data-dir /tmp/m1
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/env.sh"
bash "$here/setup.sh" --build-only
build_workspace
exec "$CARGO_TARGET_DIR/release/store" "$@"
