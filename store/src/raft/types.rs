//! What the log carries: the replicated commands and their answers, and
//! the members' identities. This is an on-disk format (the Raft log's
//! entries) and part of the peer protocol; `codec::layout` holds it to the
//! recorded layouts. openraft's type configuration over it is
//! [`super::TypeConfig`].

use std::fmt;
use std::sync::Arc;

use etcd_proto::etcdserverpb::{
    AlarmRequest, AlarmResponse, CompactionRequest, CompactionResponse, DeleteRangeRequest,
    DeleteRangeResponse, LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest,
    LeaseRevokeResponse, PutRequest, PutResponse, TxnRequest, TxnResponse,
};
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::auth::{AuthCommand, AuthInfo, AuthReply};
use crate::codec::prost_bytes;
use crate::errors::EtcdError;

/// A member id: etcd's 64-bit member ID.
pub type NodeId = u64;

/// What the cluster knows about a member (kept in Raft membership).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MemberInfo {
    /// `--name`; empty until a member added with MemberAdd starts.
    pub name: String,
    /// `--initial-advertise-peer-urls`.
    pub peer_urls: Vec<String>,
    /// `--advertise-client-urls`.
    pub client_urls: Vec<String>,
}

impl fmt::Display for MemberInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.peer_urls.join(","))
    }
}

/// What a log entry carries: a command and, for a client's request, who
/// sent it (checked against the auth state when applied). Commands a
/// member issues on its own (lease expiry, quota alarms, publishing its
/// attributes, Authenticate after the password check) carry `None`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    /// The sender, for permission checks.
    pub by: Option<AuthInfo>,
    /// The command.
    pub cmd: Command,
}

impl fmt::Display for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "batch of {} proposal(s)", self.proposals.len())
    }
}

/// What a log entry carries: the proposals the leader batched into it
/// (see [`super::batcher`]), applied in order, each with its own revision
/// and its own answer (the entry's response holds one per proposal).
///
/// The proposals are shared, so an entry clones without copying them: the
/// log keeps its newest entries in memory and hands out clones to
/// replication and to the state machine (see [`super::log_store`]). They
/// are encoded as a sequence, as a `Vec` is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    /// The proposals, at least one.
    pub proposals: Arc<[Proposal]>,
}

impl Proposal {
    /// The proposal's size in the log, roughly: its request's protobuf
    /// size (what `--max-request-bytes` bounds) plus the sender's name.
    pub fn size_bytes(&self) -> usize {
        let sender = self.by.as_ref().map_or(0, |b| b.username.len());
        let command = match &self.cmd {
            Command::Put(r) => r.encoded_len(),
            Command::DeleteRange(r) => r.encoded_len(),
            Command::Txn(r) => r.encoded_len(),
            Command::Compact(r) => r.encoded_len(),
            Command::LeaseGrant(r) => r.encoded_len(),
            Command::LeaseRevoke(r) => r.encoded_len(),
            Command::Alarm(r) => r.encoded_len(),
            Command::PublishMember(a) => {
                a.name.len() + a.client_urls.iter().map(String::len).sum::<usize>()
            }
            // Rare and small: the exact encoded size.
            Command::Auth(c) => crate::codec::encode(c).len(),
            Command::ClusterVersionSet(v) => v.len(),
            Command::DowngradeInfoSet(d) => d.target_version.len() + 1,
        };
        sender + command
    }
}

/// A replicated state machine command: an etcd write request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// KV.Put.
    Put(#[serde(with = "prost_bytes")] PutRequest),
    /// KV.DeleteRange.
    DeleteRange(#[serde(with = "prost_bytes")] DeleteRangeRequest),
    /// KV.Txn with at least one write (read-only txns do not go through Raft).
    Txn(#[serde(with = "prost_bytes")] TxnRequest),
    /// KV.Compact.
    Compact(#[serde(with = "prost_bytes")] CompactionRequest),
    /// Lease.LeaseGrant, with the id and effective TTL already chosen by
    /// the proposing member (apply must be deterministic).
    LeaseGrant(#[serde(with = "prost_bytes")] LeaseGrantRequest),
    /// Lease.LeaseRevoke, or the leader revoking an expired lease.
    LeaseRevoke(#[serde(with = "prost_bytes")] LeaseRevokeRequest),
    /// A member announcing its name and client URLs after start (etcd's
    /// "publish"), so MemberList shows every member as started.
    PublishMember(MemberAttributes),
    /// Maintenance.Alarm ACTIVATE or DEACTIVATE.
    Alarm(#[serde(with = "prost_bytes")] AlarmRequest),
    /// A change to users, roles or the auth switch, or an Authenticate.
    Auth(AuthCommand),
    /// The leader's decision of the cluster version (`major.minor.0`;
    /// etcd's `ClusterVersionSetRequest`; see [`crate::cluster_version`]).
    ClusterVersionSet(String),
    /// Maintenance.Downgrade ENABLE or CANCEL, or the leader ending a
    /// finished downgrade (etcd's `DowngradeInfoSetRequest`).
    DowngradeInfoSet(crate::cluster_version::DowngradeInfo),
}

/// What a member publishes about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberAttributes {
    /// The member.
    pub id: NodeId,
    /// `--name`.
    pub name: String,
    /// `--advertise-client-urls`.
    pub client_urls: Vec<String>,
}

/// The result of applying a [`Command`]. Headers carry only the revision;
/// the serving member fills in cluster id, member id and term.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CommandResponse {
    /// Applied a Put.
    Put(#[serde(with = "prost_bytes")] PutResponse),
    /// Applied a DeleteRange.
    DeleteRange(#[serde(with = "prost_bytes")] DeleteRangeResponse),
    /// Applied a Txn.
    Txn(#[serde(with = "prost_bytes")] TxnResponse),
    /// Applied a Compact.
    Compact(#[serde(with = "prost_bytes")] CompactionResponse),
    /// Applied a LeaseGrant.
    LeaseGrant(#[serde(with = "prost_bytes")] LeaseGrantResponse),
    /// Applied a LeaseRevoke.
    LeaseRevoke(#[serde(with = "prost_bytes")] LeaseRevokeResponse),
    /// Applied an Alarm change.
    Alarm(#[serde(with = "prost_bytes")] AlarmResponse),
    /// Applied an auth command.
    Auth(AuthReply),
    /// The command was refused by the state machine (for example a Put
    /// naming an unknown lease); nothing changed.
    Error(EtcdError),
    /// Entries that are not commands (blank, membership).
    Empty,
}

/// The typed answer of one command kind (`Put` -> `PutResponse`): what
/// applying a command of that kind yields when it is not refused.
pub trait Answer: Sized {
    /// The answer inside `resp`, or `resp` back if it is of another kind.
    fn from_response(resp: CommandResponse) -> Result<Self, CommandResponse>;
}

macro_rules! answer {
    ($t:ty, $variant:ident) => {
        impl Answer for $t {
            fn from_response(resp: CommandResponse) -> Result<Self, CommandResponse> {
                match resp {
                    CommandResponse::$variant(r) => Ok(r),
                    other => Err(other),
                }
            }
        }
    };
}

answer!(PutResponse, Put);
answer!(DeleteRangeResponse, DeleteRange);
answer!(TxnResponse, Txn);
answer!(CompactionResponse, Compact);
answer!(LeaseGrantResponse, LeaseGrant);
answer!(LeaseRevokeResponse, LeaseRevoke);
answer!(AlarmResponse, Alarm);
answer!(AuthReply, Auth);

/// Commands whose application changes nothing a client reads back
/// (publishing member attributes) answer [`CommandResponse::Empty`].
impl Answer for () {
    fn from_response(resp: CommandResponse) -> Result<Self, CommandResponse> {
        match resp {
            CommandResponse::Empty => Ok(()),
            other => Err(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec;

    #[test]
    fn commands_round_trip_through_bincode() {
        let cmd = Command::Put(PutRequest {
            key: b"k".to_vec(),
            value: vec![0, 1, 2],
            lease: 7,
            ..Default::default()
        });
        let back: Command = codec::decode(&codec::encode(&cmd)).unwrap();
        assert_eq!(back, cmd);
        let resp = CommandResponse::Error(EtcdError::LeaseNotFound);
        let back: CommandResponse = codec::decode(&codec::encode(&resp)).unwrap();
        assert_eq!(back, resp);
    }
}
