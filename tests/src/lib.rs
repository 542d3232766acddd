//! Integration-test harness for any server that speaks the etcd v3 gRPC API and
//! accepts etcd's own command-line flags.
//!
//! The harness never assumes which implementation it drives: the reference
//! etcd 3.5 and the candidate under test (our `store`, or any binary named by
//! `STORE_BIN`) are started the same way, as real child processes with etcd
//! flags. The parts:
//!
//! - [`binary`]: where the reference etcd, the two etcdctl versions and the
//!   candidate live; a missing binary is an error that says how to provide it.
//! - [`net`]: a unique loopback address per member (ports 2379 client / 2380
//!   peer on it), so clusters of parallel tests and processes never collide.
//! - [`cluster`]: 1, 3 or 5 member clusters in a temporary directory, with
//!   health waiting, SIGKILL, restart with the original flags, leader lookup,
//!   log capture and cleanup on drop (also during a panic).
//! - [`client`]: etcd-client connections with bounded timeouts and an
//!   implementation-neutral description of responses and gRPC errors.
//! - [`etcdctl`]: runs etcdctl 3.5 or 3.4 (`ETCDCTL_API=3`) and captures stdout,
//!   stderr and the exit code.
//! - [`differential`]: runs the same step against reference etcd 3.5 (the
//!   oracle) and the candidate, and fails on any difference after
//!   normalization.
//! - [`normalize`]: replaces instance-specific values (cluster and member ids,
//!   raft terms and indexes, addresses, timestamps, ...) with placeholders so
//!   outputs from two different servers can be compared byte for byte.
//! - [`wait`]: deadline-bounded polling used by everything that waits.
//! - [`auth`]: helpers of the Auth tests (credentials, per-user clients,
//!   masked comparisons, JWT decoding, server processes with any flags).

pub mod auth;
pub mod binary;
pub mod client;
pub mod cluster;
pub mod differential;
pub mod etcdctl;
pub mod net;
pub mod normalize;
pub mod wait;
pub mod watchlease;

pub use binary::Binary;
pub use client::{connect, describe, describe_error};
pub use cluster::{Cluster, ClusterConfig};
pub use differential::Differential;
pub use etcdctl::{CtlOutput, Etcdctl};
pub use normalize::normalize;
