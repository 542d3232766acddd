//! Disaster recovery: `--force-new-cluster` (etcd's "restart as a
//! one-member cluster"), applied to the stored log before Raft starts.
//!
//! When a quorum is lost for good, the surviving member's data is still the
//! cluster's, but no membership change can commit without the lost voters.
//! etcd's answer, reproduced here: keep the data and append a
//! configuration in which this member is the only voter. Concretely:
//!
//! 1. find this member's entry in the last membership (the log's last
//!    membership entry, or the state machine's if the log was purged);
//! 2. append, after the last log entry and one term above every term seen
//!    so far, a membership entry with this member alone, and vote for
//!    ourselves in that term.
//!
//! Unlike etcd, entries past this member's commit index are kept (and so
//! become committed): a follower learns the commit index a heartbeat late
//! and stores it unsynced, so entries past it may have been acknowledged
//! to clients; dropping them could lose acknowledged writes, keeping them
//! can only commit a write whose client saw a timeout, which Raft allows.
//!
//! openraft then starts with a one-voter membership: the member elects
//! itself, commits the new membership with its first entry, applies it (so
//! `member list` shows one member) and accepts writes. The cluster id, the
//! member id, the key space, leases and auth are kept. Other members must
//! not be restarted with their old data afterwards; they rejoin with
//! `member add` and an empty data directory, as in etcd.

use std::collections::{BTreeMap, BTreeSet};

use openraft::storage::{RaftLogReader, RaftLogStorage};
use openraft::EntryPayload;

use super::log_store::LogStore;
use super::state_machine::{read_meta, KEY_MEMBERSHIP};
use super::{Entry, LeaderId, LogId, MemberInfo, Membership, NodeId, StoredMembership, Vote};
use crate::engine::EngineRead;

/// Log entries read per step while looking backwards for the last
/// membership entry.
const MEMBERSHIP_SCAN_STEP_ENTRIES: u64 = 256;

/// Why the stored data cannot be turned into a one-member cluster.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// Reading or writing the log or state failed.
    #[error("force-new-cluster: storage: {0}")]
    Storage(#[from] std::io::Error),
    /// No membership is stored (a fresh data directory never forms one).
    #[error("force-new-cluster: the data directory holds no cluster membership")]
    NoMembership,
    /// This member is not in the stored membership.
    #[error("force-new-cluster: member {0:x} is not in the stored membership")]
    NotAMember(NodeId),
}

/// What the forced restart changed, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forced {
    /// Members removed from the configuration.
    pub removed: Vec<NodeId>,
    /// Index of the new one-member configuration entry.
    pub index: u64,
}

/// Rewrites the stored log so that `me` is the only voter (module docs).
pub async fn force_new_cluster(
    log: &mut LogStore,
    meta: &dyn EngineRead,
    me: NodeId,
) -> Result<Forced, RecoveryError> {
    let state = log.get_log_state().await?;
    let last = state.last_log_id;
    let (members, info) = last_membership(log, meta, last, state.last_purged_log_id).await?;
    let info = info
        .get(&me)
        .cloned()
        .ok_or(RecoveryError::NotAMember(me))?;
    let vote = log.read_vote().await?;
    let term = [
        vote.map(|v| v.leader_id().term),
        last.map(|l| l.leader_id.term),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(0)
        + 1;
    let index = last.map_or(0, |l| l.index + 1);
    let membership = Membership::new(vec![BTreeSet::from([me])], BTreeMap::from([(me, info)]))
        .expect("the one voter is among the nodes");
    let entry = Entry {
        log_id: LogId::new(LeaderId { term, node_id: me }, index),
        payload: EntryPayload::Membership(membership),
    };
    log.append_synced(&[entry])?;
    log.save_vote(&Vote::new(term, me)).await?;
    Ok(Forced {
        removed: members.into_iter().filter(|id| *id != me).collect(),
        index,
    })
}

/// The member ids and member information of the last membership at or
/// before `upto`: the log's last membership entry, else the state
/// machine's.
async fn last_membership(
    log: &mut LogStore,
    meta: &dyn EngineRead,
    upto: Option<LogId>,
    purged: Option<LogId>,
) -> Result<(BTreeSet<NodeId>, BTreeMap<NodeId, MemberInfo>), RecoveryError> {
    let floor = purged.map_or(0, |p| p.index + 1);
    let mut end = upto.map_or(0, |u| u.index + 1);
    while end > floor {
        let start = end.saturating_sub(MEMBERSHIP_SCAN_STEP_ENTRIES).max(floor);
        let entries = log.try_get_log_entries(start..end).await?;
        if let Some(m) = entries.iter().rev().find_map(|e| match &e.payload {
            EntryPayload::Membership(m) => Some(m.clone()),
            _ => None,
        }) {
            return Ok(split(&m));
        }
        end = start;
    }
    let stored: Option<StoredMembership> = read_meta(meta, KEY_MEMBERSHIP)?;
    match stored {
        Some(s) if s.log_id().is_some() => Ok(split(s.membership())),
        _ => Err(RecoveryError::NoMembership),
    }
}

fn split(m: &Membership) -> (BTreeSet<NodeId>, BTreeMap<NodeId, MemberInfo>) {
    let ids = m.nodes().map(|(id, _)| *id).collect();
    let info = m.nodes().map(|(id, n)| (*id, n.clone())).collect();
    (ids, info)
}
