//! # gateway: an L4 load balancer for kube-apiservers and store members
//!
//! The gateway replaces the HAProxy of kubeadm's highly-available control plane guide. It
//! relays TCP connections without terminating TLS (kube-apiserver authenticates clients by
//! their certificate, so TLS must stay end to end) and adds what HAProxy users miss in that
//! role: connections fail fast when no backend is healthy, reload happens in-process (no
//! pile-up of old processes), and long-lived watch connections are balanced on the number of
//! open connections.
//!
//! ## Architecture
//!
//! Every accepted client connection is one request to a [`tower::Service`]:
//!
//! ```text
//! accept loop ──► LoadShed ─► ConcurrencyLimit ─► ProxyService ──(connect stage)──► relay
//!                 (frontend max_connections)           │
//!                                                      ▼
//!          Retry (redispatch) ─► SharedBalancer ─► FailFast ─► Balance (p2c | round robin)
//!                                                                 │  fed by tower Discover
//!                                                                 ▼
//!                                                   Endpoint per backend (connect + timeout)
//! ```
//!
//! * [`endpoint`]: one service per backend; ready only while the backend is eligible
//!   (healthy, enabled, under its connection limit); its call opens the TCP connection.
//! * [`balance`]: power of two choices over [`load`] metrics, or smooth weighted round robin.
//! * [`failfast`]: turns "no eligible backend" into an immediate error instead of tower's
//!   forever-pending balancer.
//! * [`proxy`]: the per-connection service; redispatches a failed connect to another backend
//!   before any byte is relayed, then copies both directions with half-close and an idle timeout.
//! * [`health`]: active checks (TCP, HTTP, HTTPS, etcd `/health`) with HAProxy's fall/rise
//!   state machine; passive detection of failed connects feeds the same machine.
//! * [`frontend`] and [`supervisor`]: listeners, hot reload and graceful shutdown.
//! * [`relays`]: the threads that accept and relay connections (`--threads`), pinned one per
//!   CPU by [`affinity`] (`--cpu-affinity`).
//! * [`admin`]: axum API for drain/disable/enable/weight, Prometheus metrics and a status page.
//! * [`vip`]: the virtual IP (keepalived's role): gateways elect a holder through the store's
//!   etcd API; the holder adds the VIP to its interface and announces it with gratuitous ARP,
//!   fenced by its lease so two gateways never hold it at once.
#![deny(missing_docs)]

pub mod admin;
pub mod affinity;
pub mod backend;
pub mod balance;
pub mod cli;
pub mod config;
pub mod endpoint;
pub mod failfast;
pub mod frontend;
pub mod health;
pub mod load;
pub mod metrics;
pub mod net;
pub mod proxy;
pub mod relays;
pub mod supervisor;
pub mod vip;

/// The error type that crosses tower middleware boundaries (tower's `BoxError`).
pub type BoxError = tower::BoxError;
