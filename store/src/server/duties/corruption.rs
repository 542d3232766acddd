//! Data corruption checks between members (etcd's
//! `--experimental-initial-corrupt-check`, `--experimental-corrupt-check-time`
//! and `--experimental-compact-hash-check-enabled`/`-time`).
//!
//! Every member can hash its key space at a revision ([`Core::own_hash`], etcd's
//! HashKV), and answers the same question from a peer over the peer
//! protocol ([`LeaderRequest::HashKv`]). Members that applied the same log
//! have equal hashes at every revision neither has compacted, so a
//! difference at the same compaction revision is corruption.
//!
//! - Initial check ([`initial_check`]): before serving clients, a member
//!   hashes its current revision and asks every peer for the hash at that
//!   revision. A peer with another hash and the same compaction revision is
//!   a mismatch; peers that cannot answer (unreachable, behind, compacted)
//!   are skipped with a warning. Any mismatch and the member refuses to
//!   start: `<id> found data inconsistency with peers`, etcd's error.
//! - Periodic check ([`spawn_periodic_check`]): every period, the leader
//!   hashes its current revision and asks each follower for the hash there.
//!   A follower with the same compaction revision and another hash gets the
//!   CORRUPT alarm (raised through Raft, so `etcdctl alarm list` shows it
//!   on every member), as etcd's leader does. With
//!   `--experimental-compact-hash-check-enabled` the same check runs every
//!   `--experimental-compact-hash-check-time` (etcd compares hashes it
//!   recorded at each compaction; the revision compared differs, the
//!   verdict on diverged members does not).

use openraft::async_runtime::WatchReceiver as _;
use std::sync::Arc;
use std::time::Duration;

use etcd_proto::etcdserverpb::alarm_request::AlarmAction;
use etcd_proto::etcdserverpb::{AlarmRequest, AlarmType};
use tokio::sync::watch;

use crate::limits::{MEMBERSHIP_LOAD_WAIT_MS, PEER_RPC_TIMEOUT_MS};
use crate::raft::NodeId;
use crate::server::core::Core;
use crate::server::to_leader::forward::{
    decode_reply, encode_request, LeaderReply, LeaderRequest, PeerHash,
};

/// Why the initial check refuses to start the member.
#[derive(Debug, thiserror::Error)]
pub enum CorruptionError {
    /// A peer hashed the same revision, at the same compaction, differently.
    #[error("{0:x} found data inconsistency with peers")]
    Inconsistent(NodeId),
    /// The local key space cannot be hashed.
    #[error("cannot hash the local key space: {0}")]
    Local(String),
}

/// Every voter and learner this member knows of. Right after a restart
/// openraft's metrics still hold their initial, empty membership until its
/// core reports the one it loaded from the log, so this waits up to
/// [`MEMBERSHIP_LOAD_WAIT_MS`] for a non-empty one (a member that has none
/// yet, before the cluster is initialized, has no peers to ask).
async fn known_members(core: &Core) -> Vec<NodeId> {
    let loaded = core
        .raft
        .wait(Some(Duration::from_millis(MEMBERSHIP_LOAD_WAIT_MS)))
        .metrics(
            |m| m.membership_config.membership().nodes().next().is_some(),
            "membership loaded",
        )
        .await;
    let metrics = match loaded {
        Ok(m) => m,
        Err(_) => core.raft.metrics().borrow_watched().clone(),
    };
    metrics
        .membership_config
        .membership()
        .nodes()
        .map(|(id, _)| *id)
        .collect()
}

/// Every other voter's and learner's hash at `rev` (None where the peer
/// did not answer one).
async fn peer_hashes(core: &Core, rev: i64) -> Vec<(NodeId, Option<PeerHash>)> {
    let me = core.config.member_id;
    let ids = known_members(core).await;
    let mut out = Vec::new();
    for id in ids.into_iter().filter(|id| *id != me) {
        out.push((id, ask_hash(core, id, rev).await));
    }
    out
}

async fn ask_hash(core: &Core, id: NodeId, rev: i64) -> Option<PeerHash> {
    let mut client = core.peer(id).ok()?;
    let mut req = tonic::Request::new(encode_request(&LeaderRequest::HashKv(rev)));
    req.set_timeout(Duration::from_millis(PEER_RPC_TIMEOUT_MS));
    let reply = client.forward(req).await.ok()?;
    match decode_reply(&reply.into_inner().payload) {
        Ok(LeaderReply::HashKv(hash)) => hash,
        _ => None,
    }
}

/// The initial check (module docs).
pub async fn initial_check(core: &Core) -> Result<(), CorruptionError> {
    let me = core.config.member_id;
    let (hash, compact_revision, revision) = core
        .mvcc
        .hash_kv(0)
        .map_err(|e| CorruptionError::Local(e.to_string()))?;
    let mut mismatches = 0;
    let answers = peer_hashes(core, revision).await;
    let peers = answers.len();
    for (peer, answer) in answers {
        let peer = format!("{peer:x}");
        match answer {
            None => tracing::warn!(
                local_member_id = format_args!("{me:x}"),
                remote_peer_id = %peer,
                revision,
                "cannot fetch hash from remote peer"
            ),
            Some(p) if p.hash == hash => {}
            Some(p) if p.compact_revision == compact_revision => {
                mismatches += 1;
                tracing::warn!(
                    local_member_id = format_args!("{me:x}"),
                    remote_peer_id = %peer,
                    local_member_hash = hash,
                    remote_peer_hash = p.hash,
                    revision,
                    compact_revision,
                    "found different hash values from remote peer"
                );
            }
            Some(p) => tracing::warn!(
                local_member_id = format_args!("{me:x}"),
                remote_peer_id = %peer,
                local_member_compact_revision = compact_revision,
                remote_peer_compact_revision = p.compact_revision,
                "found different compact revision values from remote peer"
            ),
        }
    }
    if mismatches > 0 {
        return Err(CorruptionError::Inconsistent(me));
    }
    tracing::info!(
        local_member_id = format_args!("{me:x}"),
        revision,
        hash,
        peers,
        "initial corruption checking passed; no corruption"
    );
    Ok(())
}

/// Followers whose hash at the leader's current revision differs, at the
/// same compaction revision.
async fn diverged_followers(core: &Core) -> Vec<NodeId> {
    let Some(own) = core.own_hash(0) else {
        return Vec::new();
    };
    peer_hashes(core, own.revision)
        .await
        .into_iter()
        .filter_map(|(id, answer)| answer.map(|p| (id, p)))
        .filter(|(_, p)| p.compact_revision == own.compact_revision && p.hash != own.hash)
        .map(|(id, _)| id)
        .collect()
}

/// Runs the leader's check every `every` until `stop` (module docs).
pub fn spawn_periodic_check(core: Arc<Core>, every: Duration, mut stop: watch::Receiver<bool>) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            if core.leader() != Some(core.config.member_id) {
                continue;
            }
            for id in diverged_followers(&core).await {
                raise_corrupt(&core, id).await;
            }
        }
    });
}

async fn raise_corrupt(core: &Core, id: NodeId) {
    tracing::error!(
        remote_peer_id = format_args!("{id:x}"),
        "found data inconsistency with a follower; raising the CORRUPT alarm"
    );
    let raise = AlarmRequest {
        action: AlarmAction::Activate as i32,
        member_id: id,
        alarm: AlarmType::Corrupt as i32,
    };
    if let Err(e) = core.alarm(raise).await {
        tracing::warn!(error = %e, "raising the CORRUPT alarm");
    }
}
