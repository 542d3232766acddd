//! The gateway's process tests, one module per scenario file, in one test binary.
//!
//! As seven binaries each linked the harness, tokio, rustls and etcd-client anew and ran one
//! after another, so the 55 s silence of `streaming` and the namespace takeovers of `vip` ran
//! alone on an otherwise idle machine; as modules of one binary they compile once and run
//! next to the other tests.
//!
//! Run one file's tests with its module name as the filter:
//! `cargo test --release -p gateway --test integration vip::`.

mod admin;
mod balancing;
mod common;
mod deploy_manifest;
mod failover;
mod reload;
mod speaks_first;
mod streaming;
mod vip;
