//! The compactor: runs physical compactions (deleting the revisions a
//! Compact made unreachable) in the background, one after another, so
//! applying a Compact costs only its logical step.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::{CompactionJob, MvccError, MvccStore};

/// Runs compaction jobs one after another in the background.
pub fn spawn_compactor(
    mvcc: Arc<MvccStore>,
    pending: Option<CompactionJob>,
) -> mpsc::Sender<CompactionJob> {
    /// Scheduled compactions waiting for the compactor; Compact requests are
    /// rare (kube-apiserver: one per 5 minutes), more is a client bug.
    const COMPACTOR_QUEUE: usize = 64;
    let (tx, mut rx) = mpsc::channel::<CompactionJob>(COMPACTOR_QUEUE);
    tokio::spawn(async move {
        if let Some(job) = pending {
            run_job(&mvcc, job).await;
        }
        while let Some(job) = rx.recv().await {
            run_job(&mvcc, job).await;
        }
    });
    tx
}

async fn run_job(mvcc: &MvccStore, job: CompactionJob) {
    let rev = job.rev;
    match mvcc.run_physical_compaction(job).await {
        Ok(()) => tracing::info!(revision = rev, "finished physical compaction"),
        Err(MvccError::Engine(e)) => {
            tracing::error!(revision = rev, error = %e, "physical compaction failed")
        }
        Err(e) => tracing::error!(revision = rev, error = %e, "physical compaction refused"),
    }
}
