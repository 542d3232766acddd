//! Raft replication with openraft 0.9.
//!
//! - [`types`]: the openraft type configuration, the replicated
//!   [`Command`]s and their [`CommandResponse`]s, and member identities.
//! - [`log_store`]: the Raft log and vote in the engine, with group commit.
//! - [`state_machine`]: applies committed commands to the MVCC store, builds
//!   and installs snapshots.
//! - [`network`]: the client side of the peer protocol.
//! - [`peer_service`]: the server side of the peer protocol.
//! - [`codec`]: how openraft values are encoded on the wire and on disk.

// openraft's storage traits fix `StorageError` (a large enum) as the error
// type; our helpers return the same type rather than boxing and unboxing it.
#![allow(clippy::result_large_err)]

pub mod codec;
pub mod log_store;
pub mod network;
pub mod peer_service;
pub mod state_machine;
pub mod types;

pub use types::{Command, CommandResponse, MemberInfo, NodeId, Proposal, TypeConfig};

/// openraft's handle for our configuration.
pub type Raft = openraft::Raft<TypeConfig>;
