//! Integration-test harness for any server that speaks the etcd v3 gRPC API and
//! accepts etcd's own command-line flags: the one harness every test file (and
//! `bench`, and the gateway's tests) shares.
//!
//! The harness never assumes which implementation it drives: the reference
//! etcd 3.5 and the candidate under test (our `store`, or any binary named by
//! `STORE_BIN`) are started the same way, as real child processes with etcd
//! flags. The parts:
//!
//! - [`binary`]: where the reference etcd, the two etcdctl versions and the
//!   candidate live; a missing binary is an error that says how to provide it.
//! - [`process`]: the one process type: a child with its output in a log
//!   file, the log's tail for failures, SIGKILL and reaping on drop.
//! - [`net`]: a unique loopback address per member (ports 2379 client / 2380
//!   peer on it), so clusters of parallel tests and processes never collide.
//! - [`netns`]: a network namespace per member on one bridge, for network
//!   faults: links between members cut and healed with blackhole routes
//!   while the test's clients reach every member.
//! - [`relay`]: the peer traffic of namespaced members passes through the
//!   test process, which can delay each link (slow networks without netem).
//! - [`cluster`]: 1, 3 or 5 member clusters in a temporary directory, with
//!   health waiting, SIGKILL, restart with the original flags, leader lookup,
//!   log capture and cleanup on drop (also during a panic); [`MemberFlags`]
//!   is the etcd command line of one member, also for members the tests
//!   start themselves (TLS, a member joining a running cluster).
//! - [`pki`]: per-run certificates: a CA, server, peer and client
//!   certificates, their files, etcdctl flags and etcd-client TLS options.
//! - [`client`]: etcd-client connections (plain or TLS) with bounded timeouts
//!   and an implementation-neutral description of responses and gRPC errors.
//! - [`etcdctl`]: runs etcdctl 3.5 or 3.4 (`ETCDCTL_API=3`) and captures stdout,
//!   stderr and the exit code.
//! - [`http`]: a minimal HTTP/1.1 client for `/health`, `/livez`,
//!   `/readyz`, `/version` and `/metrics`.
//! - [`disk`]: a small tmpfs over one member's data directory and a filler
//!   file, for full-disk faults.
//! - [`differential`]: the oracle: runs the same step (etcdctl or
//!   etcd-client) against reference etcd 3.5 and the candidate, and fails on
//!   any difference after normalization (and optional masks); checks of the
//!   oracle's own output, so a step really exercised what it meant to.
//! - [`server`]: property tests on both servers: [`Server`] and
//!   [`against_both!`] (one test per scenario and server).
//! - [`normalize`]: replaces instance-specific values (cluster and member ids,
//!   raft terms and indexes, addresses, timestamps, ...) with placeholders so
//!   outputs from two different servers can be compared byte for byte.
//! - [`wait`]: deadline-bounded polling used by everything that waits.
//! - [`auth`]: helpers of the Auth tests (credentials, per-user clients,
//!   AuthRevision, JWT decoding).
//! - [`watchlease`]: helpers of the Watch and Lease tests (servers with extra
//!   flags, long-running etcdctl, watch transcripts).
//! - [`writer`]: a background writer of unique keys and the check that a
//!   member serves exactly the acknowledged writes (no write lost).

pub mod auth;
pub mod binary;
pub mod client;
pub mod cluster;
pub mod differential;
pub mod disk;
pub mod etcdctl;
pub mod http;
pub mod net;
pub mod netns;
pub mod normalize;
pub mod pki;
pub mod process;
pub mod relay;
pub mod robustness;
pub mod server;
pub mod wait;
pub mod watchlease;
pub mod writer;

pub use binary::Binary;
pub use client::{connect, describe, describe_error};
pub use cluster::{Cluster, ClusterConfig, MemberFlags};
pub use differential::Differential;
pub use etcdctl::{CtlOutput, Etcdctl};
pub use normalize::normalize;
pub use process::Process;
pub use server::Server;
