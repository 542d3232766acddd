# Sourced by the scripts: one cargo target dir outside the clone, shared by
# every build (the bundled RocksDB takes ~20 minutes to compile per profile,
# so everything uses the release profile, once).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/etcd-rs/target}"
export ETCD35_DIR="${ETCD35_DIR:-/opt/etcd-3.5}"
if [[ -f "$HOME/.cargo/env" ]]; then
  # shellcheck disable=SC1091
  source "$HOME/.cargo/env"
fi

# The one build both README commands run: every crate and target of the
# workspace in the release profile. The run command builds exactly what the
# test command builds (a narrower `cargo build --bin store` resolves the
# dependencies' features differently and compiles RocksDB's C++ a second
# time), so either command after the other compiles nothing.
build_workspace() {
  cargo build --release --workspace --all-targets --manifest-path "$(dirname "${BASH_SOURCE[0]}")/../Cargo.toml" "$@"
}
