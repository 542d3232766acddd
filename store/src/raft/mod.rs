//! Raft replication with openraft 0.10.
//!
//! - [`types`]: the openraft type configuration, the replicated
//!   [`Command`]s and their [`CommandResponse`]s, and member identities.
//! - [`log_store`]: the Raft log and vote in segment files, with group
//!   commit.
//! - [`log_bound`]: snapshots and purges by the log's bytes, beside
//!   openraft's entry counts.
//! - [`state_machine`]: applies committed commands to the MVCC store, builds
//!   and installs snapshots.
//! - [`network`]: the client side of the peer protocol (the server side is
//!   `crate::server::peer`).
//! - [`elections`]: a member's control over its own elections, driven by
//!   leadership transfer.
//! - [`metrics`]: replication progress and waiting on openraft's metrics.
//! - [`leadership`]: who leads as etcd's health checks see it (a leader
//!   without a quorum for an election timeout counts as none).
//! - [`read_index`]: ReadIndex rounds on the leader, shared by readers.
//! - [`recovery`]: `--force-new-cluster`, a one-member restart of the
//!   stored log.

pub mod batcher;
pub mod commit_hold;
pub mod elections;
pub mod leadership;
pub mod log_bound;
pub mod log_store;
pub mod metrics;
pub mod network;
pub mod read_index;
pub mod recovery;
pub mod state_machine;
pub mod types;

pub use types::{
    Batch, Command, CommandResponse, Entry, LeaderId, LogId, MemberInfo, Membership, NodeId,
    Proposal, RaftMetrics, Snapshot, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig,
    Vote,
};

/// openraft's handle for our configuration and state machine.
pub type Raft = openraft::Raft<TypeConfig, state_machine::StateMachine>;
