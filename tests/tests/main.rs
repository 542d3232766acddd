//! The workspace's integration tests, one module per scenario file, in one test binary.
//!
//! Each of these files used to be a test binary of its own, and each took 20-43 s to
//! compile and link in the release profile (each instantiated tokio's, tonic's and
//! etcd-client's generics anew and linked ~100 MB): ~12 minutes of CPU per rebuild. As
//! modules of one binary they compile once. libtest starts the tests in name order, so the
//! tests of one file still run near each other (the test command runs four at a time).
//!
//! Run one file's tests with its module name as the filter:
//! `cargo test --release -p integration-tests --test integration robustness::`.

mod auth;
mod cluster;
mod config_ops;
mod data_dir;
mod disk_faults;
mod durability;
mod etcd_snapshot;
mod fuzz_differential;
mod harness;
mod json_gateway;
mod kubeadm_manifest;
mod kv_differential;
mod lease_cluster;
mod lock_election;
mod maintenance;
mod membership;
mod metrics_health;
mod module_graph;
mod move_leader;
mod range_stream;
mod raw_grpc_differential;
mod robustness;
mod stream_bursts;
mod tls;
mod upgrade;
mod versions;
mod watch_cache_pattern;
mod watch_lease_differential;
mod watch_scale;
