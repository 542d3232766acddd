//! Reading openraft's metrics: a member's replication progress, and
//! waiting (with a deadline) until the metrics satisfy a condition.

use crate::raft::RaftMetrics;
use openraft::async_runtime::WatchReceiver as _;
use tokio::time::Instant;

use super::{NodeId, Raft};

/// Why [`wait_until`] gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitError {
    /// The deadline passed first.
    Deadline,
    /// Raft stopped (the metrics channel closed).
    Stopped,
}

/// Waits until `done` holds for the Raft metrics, or `deadline`.
pub async fn wait_until(
    raft: &Raft,
    deadline: Instant,
    mut done: impl FnMut(&RaftMetrics) -> bool,
) -> Result<(), WaitError> {
    let mut rx = raft.metrics();
    loop {
        if done(&rx.borrow_and_update()) {
            return Ok(());
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Err(_) => return Err(WaitError::Deadline),
            Ok(Err(_)) => return Err(WaitError::Stopped),
            Ok(Ok(())) => {}
        }
    }
}

/// A member's matched log index, as the leader's metrics report it (0 if
/// unknown or if this member does not lead).
pub fn matched_index(m: &RaftMetrics, id: NodeId) -> u64 {
    m.replication
        .as_ref()
        .and_then(|r| r.get(&id).cloned().flatten())
        .map_or(0, |l| l.index)
}
