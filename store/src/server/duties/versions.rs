//! The cluster version monitor and Maintenance.Downgrade, as etcd 3.6 has
//! them (the decisions themselves are in [`crate::cluster_version`]).
//!
//! The leader asks every member for its server version (a
//! [`LeaderRequest::ServerVersion`] over the peer protocol; its own it
//! knows) when it takes over and then every
//! [`cluster_version::MONITOR_INTERVAL`], proposes the cluster version
//! [`cluster_version::decide`] gives, and every `--downgrade-check-time`
//! ends a downgrade that every member has finished.
//!
//! Downgrade, on whichever member the client reached (etcd does not
//! forward it; here the proposal goes to the leader as every write does):
//!
//! ```text
//! VALIDATE 3.5   linearizable read; target must be the cluster version's
//!                minor - 1 and no downgrade enabled; answers "3.6"
//! ENABLE 3.5     the same checks, then DowngradeInfoSet{enabled, 3.5.0};
//!                answers "3.6" (the leader lowers it within 4 s)
//! CANCEL         DowngradeInfoSet{disabled} if one is enabled; never fails
//!                (etcd only logs why it could not cancel)
//! ```
//!
//! What follows the versions ([`spawn_gates`], on every member, as etcd
//! 3.6's `UpdateStorageVersionIfNeeded`): each time the replicated versions
//! change, the member sends the peer protocol the cluster version allows
//! (to each member no newer than it announced, see
//! [`crate::raft::peer_protocol`]) and migrates its data directory to the
//! format the storage version allows ([`crate::version`]'s table). An upgrade's new formats and
//! protocols are used only once every member runs the new release; a
//! downgrade takes them back before any member runs the old one.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::cluster_version::{self, ClusterState, DowngradeInfo, Version, MONITOR_INTERVAL};
use crate::errors::EtcdError;
use crate::limits::PEER_RPC_TIMEOUT_MS;
use crate::raft::types::{Command, NodeId};
use crate::server::core::Core;
use crate::server::to_leader::forward::{decode_reply, encode_request, LeaderReply, LeaderRequest};

/// Starts the leader's monitor (module docs); `downgrade_check` zero turns
/// the end-of-downgrade check off, as in etcd.
pub fn spawn_monitor(core: Arc<Core>, downgrade_check: Duration, mut stop: watch::Receiver<bool>) {
    tokio::spawn(async move {
        let me = core.config.member_id;
        let mut last_downgrade_check = tokio::time::Instant::now();
        loop {
            if core.leader() == Some(me) {
                let versions = member_versions(&core).await;
                update_cluster_version(&core, &versions).await;
                let due = last_downgrade_check.elapsed() >= downgrade_check;
                if !downgrade_check.is_zero() && due {
                    last_downgrade_check = tokio::time::Instant::now();
                    finish_downgrade(&core, &versions).await;
                }
            }
            let wait = if core.leader() == Some(me) && !downgrade_check.is_zero() {
                MONITOR_INTERVAL.min(downgrade_check)
            } else {
                MONITOR_INTERVAL
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                // A new leader decides at once (etcd: on its first commit).
                _ = core.leader_watch.leads(me), if core.leader() != Some(me) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    });
}

/// The peer protocol the cluster version in `state` allows.
pub fn peer_protocol(state: &ClusterState) -> u32 {
    crate::version::peer_protocol_for(state.cluster_version.map(|v| [v.major, v.minor]))
}

/// Starts following the replicated versions (module docs): the member's
/// data directory is in format `recorded` now.
pub fn spawn_gates(
    core: Arc<Core>,
    data_dir: PathBuf,
    mut recorded: u32,
    mut stop: watch::Receiver<bool>,
) {
    let mut changes = core.cluster.subscribe();
    tokio::spawn(async move {
        loop {
            let state = changes.borrow_and_update().clone();
            follow_versions(&core, &data_dir, &mut recorded, &state).await;
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    });
}

/// Sends the protocol `state` allows and migrates the data directory to
/// the format it allows (a failed migration is logged and retried at the
/// next change; the directory stays in the format recorded).
async fn follow_versions(core: &Core, data_dir: &Path, recorded: &mut u32, state: &ClusterState) {
    let protocol = peer_protocol(state);
    let before = core.set_peer_protocol(protocol);
    if before != protocol {
        tracing::info!(from = before, to = protocol, cluster_version = %state.cluster_text(), "changed the peer protocol");
    }
    let Some(storage) = state.storage_version() else {
        return;
    };
    let want = crate::version::format_for([storage.major, storage.minor]);
    if want == *recorded {
        return;
    }
    let (dir, from) = (data_dir.to_path_buf(), *recorded);
    let migrated =
        tokio::task::spawn_blocking(move || crate::data_dir::migrate(&dir, from, want)).await;
    match migrated {
        Ok(Ok(())) => {
            tracing::info!(from, to = want, storage_version = %storage, "migrated the storage format");
            *recorded = want;
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, from, to = want, "failed to migrate the storage format")
        }
        Err(e) => tracing::error!(error = %e, "the storage format migration panicked"),
    }
}

/// Every member's server version (None where a member did not answer).
async fn member_versions(core: &Core) -> Vec<Option<Version>> {
    let me = core.config.member_id;
    let ids = core.member_ids();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        out.push(if id == me {
            Some(cluster_version::server_version())
        } else {
            ask_version(core, id).await
        });
    }
    out
}

async fn ask_version(core: &Core, id: NodeId) -> Option<Version> {
    let mut client = core.peer(id).ok()?;
    let mut req = tonic::Request::new(encode_request(&LeaderRequest::ServerVersion));
    req.set_timeout(Duration::from_millis(PEER_RPC_TIMEOUT_MS));
    let reply = client.forward(req).await.ok()?;
    match decode_reply(&reply.into_inner().payload) {
        Ok(LeaderReply::ServerVersion(v)) => Version::parse(&v),
        _ => None,
    }
}

/// Proposes the cluster version [`cluster_version::decide`] gives.
async fn update_cluster_version(core: &Core, versions: &[Option<Version>]) {
    let state = core.cluster.get();
    let lowest = cluster_version::lowest(versions);
    match cluster_version::decide(state.cluster_version, lowest, &state.downgrade) {
        Ok(Some(next)) if Some(next) != state.cluster_version => {
            tracing::info!(
                from = %state.cluster_text(),
                to = %next,
                "updating cluster version using v3 API"
            );
            let set = Command::ClusterVersionSet(next.to_string());
            if let Err(e) = core.propose_own::<()>(set).await {
                tracing::warn!(error = %e, "failed to update cluster version");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "Failed to monitor cluster version"),
    }
}

/// Ends an enabled downgrade once every member runs its target.
async fn finish_downgrade(core: &Core, versions: &[Option<Version>]) {
    let state = core.cluster.get();
    if !cluster_version::downgrade_finished(&state.downgrade, versions) {
        return;
    }
    tracing::info!(
        cluster_version = %state.cluster_text(),
        "the cluster has been downgraded"
    );
    let cancel = Command::DowngradeInfoSet(DowngradeInfo::default());
    if let Err(e) = core.propose_own::<()>(cancel).await {
        tracing::warn!(error = %e, "failed to end the finished downgrade");
    }
}

/// The cluster version as Downgrade answers it (major.minor).
fn answer_version(core: &Core) -> String {
    core.cluster
        .get()
        .cluster_version
        .map(Version::api)
        .unwrap_or_default()
}

/// VALIDATE's checks, shared with ENABLE: the target, one minor below the
/// cluster version, and no downgrade in progress (after a linearizable
/// read, so the state checked is current).
async fn check_target(core: &Core, target: &str) -> Result<Version, EtcdError> {
    let target =
        cluster_version::downgrade_target(target).ok_or(EtcdError::WrongDowngradeVersionFormat)?;
    core.read_barrier().await?;
    let state = core.cluster.get();
    let cv = state
        .cluster_version
        .ok_or(EtcdError::ClusterVersionUnavailable)?;
    if cv.major_minor().previous_minor() != Some(target) {
        return Err(EtcdError::InvalidDowngradeTargetVersion);
    }
    if state.downgrade.enabled {
        return Err(EtcdError::DowngradeInProcess);
    }
    Ok(target)
}

/// Downgrade VALIDATE: the cluster version, if `target` may be enabled.
pub async fn validate(core: &Core, target: &str) -> Result<String, EtcdError> {
    check_target(core, target).await?;
    Ok(answer_version(core))
}

/// Downgrade ENABLE: records the target; the leader lowers the cluster
/// version next. Answers the cluster version before the change.
pub async fn enable(core: &Core, target: &str) -> Result<String, EtcdError> {
    let target = check_target(core, target).await?;
    let before = answer_version(core);
    let info = DowngradeInfo {
        target_version: target.to_string(),
        enabled: true,
    };
    core.propose_own::<()>(Command::DowngradeInfoSet(info))
        .await?;
    Ok(before)
}

/// Downgrade CANCEL: ends an enabled downgrade. etcd never fails it: a
/// missing downgrade or a failed proposal is only logged.
pub async fn cancel(core: &Core) -> String {
    let outcome = async {
        core.read_barrier().await?;
        if !core.cluster.get().downgrade.enabled {
            return Err(EtcdError::NoInflightDowngrade);
        }
        let cancel = Command::DowngradeInfoSet(DowngradeInfo::default());
        core.propose_own::<()>(cancel).await
    };
    if let Err(e) = outcome.await {
        tracing::warn!(error = %e, "failed to cancel downgrade");
    }
    answer_version(core)
}
