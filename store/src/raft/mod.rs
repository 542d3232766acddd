//! Raft replication with openraft 0.10.
//!
//! - [`TypeConfig`] (here): openraft's type configuration over
//!   [`types`]: the replicated [`Command`]s and their [`CommandResponse`]s,
//!   and member identities.
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
pub mod peer_protocol;
pub mod read_index;
pub mod recovery;
pub mod snapshot_holds;
pub mod state_machine;
pub mod types;

pub use types::{Batch, Command, CommandResponse, MemberInfo, NodeId, Proposal};

/// The store's openraft configuration: etcd's 64-bit member ids, terms as
/// u64, and openraft's default ("advanced") leader id, a `(term, node id)`
/// pair, laid out on disk as under openraft 0.9. Written out instead of
/// `declare_raft_types!` because the responder of directly submitted
/// entries is ours ([`super::batcher::EntryResponder`]), a generic type
/// the macro cannot take.
#[derive(Debug, Clone, Copy, Default, Eq, PartialEq, Ord, PartialOrd)]
pub struct TypeConfig {}

impl openraft::RaftTypeConfig for TypeConfig {
    type D = Batch;
    type R = Vec<CommandResponse>;
    type NodeId = NodeId;
    type Node = MemberInfo;
    type Term = u64;
    type LeaderId = openraft::impls::leader_id_adv::LeaderId<Self::Term, Self::NodeId>;
    type Vote = openraft::impls::Vote<Self::LeaderId>;
    type Payload = openraft::EntryPayload<Self::D, Self::NodeId, Self::Node>;
    type Entry =
        openraft::Entry<<Self::LeaderId as openraft::vote::RaftLeaderId>::Committed, Self::Payload>;
    type Responder<T>
        = batcher::EntryResponder<T>
    where
        T: openraft::OptionalSend + 'static;
    type Batch<T>
        = openraft::impls::InlineBatch<T>
    where
        T: openraft::OptionalSend + 'static;
    type AsyncRuntime = openraft::TokioRuntime;
    type ErrorSource = openraft::impls::BoxedErrorSource;
}

/// A leader id: `(term, member id)`.
pub type LeaderId = openraft::alias::LeaderIdOf<TypeConfig>;
/// A log entry's position: its leader id and index.
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
/// A vote: a leader id and whether a quorum granted it.
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
/// A log entry.
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
/// A membership config and the log id it was stored at.
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
/// A membership config.
pub type Membership = openraft::Membership<NodeId, MemberInfo>;
/// What a snapshot covers.
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
/// A snapshot's data: an engine checkpoint, or the state machine's
/// records in a file.
pub type SnapshotData = state_machine::snapshot_file::SnapshotData;
/// A snapshot with its metadata.
pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotData>;
/// openraft's metrics.
pub type RaftMetrics = openraft::RaftMetrics<TypeConfig>;

/// openraft's handle for our configuration and state machine.
pub type Raft = openraft::Raft<TypeConfig, state_machine::StateMachine>;
