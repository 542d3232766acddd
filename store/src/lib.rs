//! A Raft-replicated key-value store that speaks the etcd v3 API.
//!
//! The crate is a library first: [`Member::start`] runs a member in-process
//! and returns a handle; the `store` binary is a thin wrapper that parses
//! etcd's flags into a [`Config`]. See `docs/architecture.md` for how the
//! pieces fit: [`engine`] (storage trait, RocksDB and in-memory engines),
//! [`mvcc`] (revisions, key index, compaction), [`kv`] (etcd's request
//! semantics), [`raft`] (openraft log, state machine, peer network),
//! [`wal`] (the Raft log's segment files), [`server`] (gRPC services),
//! [`errors`] (etcd's wire errors) and [`limits`] (every bound).

#![deny(missing_docs)]

pub mod alarm;
pub mod auth;
pub mod batching;
pub mod cluster_version;
pub mod codec;
pub mod config;
pub mod config_file;
pub mod data_dir;
pub mod direct_io;
pub mod duration;
pub mod engine;
pub mod errors;
pub mod etcd_flags;
pub mod features;
pub mod identity;
pub mod kv;
pub mod lease;
pub mod limits;
pub mod logging;
pub mod member;
pub mod metrics;
pub mod mvcc;
pub mod raft;
pub mod removal;
pub mod server;
pub mod snapshot;
pub mod tls;
pub mod version;
pub mod wal;
pub mod watch;

pub use config::Config;
pub use member::{Member, MemberFuture};
