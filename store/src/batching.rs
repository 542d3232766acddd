//! The batching loop shared by the leader's proposal batcher
//! (`raft::batcher`) and the followers' forward batcher
//! (`server::forward_batch`): at most `in_flight` batches are out at a
//! time; once one returns, everything queued meanwhile forms the next
//! batch, within its bounds. Nothing waits for a timer, so a lone request
//! goes out at once, and under load batches grow with the number of
//! waiting requests.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, Semaphore};

/// What one batch may hold.
pub struct Bounds<T> {
    /// Items per batch, at most.
    pub items: usize,
    /// Summed `size` of a batch's items, at most (a batch always holds its
    /// first item, whatever its size).
    pub bytes: usize,
    /// An item's size in bytes.
    pub size: fn(&T) -> usize,
    /// Whether an item may join a batch that starts with the given one.
    pub joins: fn(&T, &T) -> bool,
}

/// Runs until the queue closes: takes batches within `bounds` and hands
/// each to `send` in a task of its own, at most `in_flight` at a time.
pub async fn drive<T, Fut>(
    mut rx: mpsc::Receiver<T>,
    in_flight: usize,
    bounds: Bounds<T>,
    send: impl Fn(Vec<T>) -> Fut,
) where
    Fut: Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(in_flight));
    let mut carry: Option<T> = None;
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let first = match carry.take() {
            Some(item) => item,
            None => match rx.recv().await {
                Some(item) => item,
                None => return,
            },
        };
        let sending = send(take(first, &mut rx, &mut carry, &bounds));
        tokio::spawn(async move {
            sending.await;
            drop(permit);
        });
    }
}

/// `first` and whatever else is queued, within `bounds`; the first item
/// that does not fit waits in `carry` for the next batch.
fn take<T>(
    first: T,
    rx: &mut mpsc::Receiver<T>,
    carry: &mut Option<T>,
    bounds: &Bounds<T>,
) -> Vec<T> {
    let mut bytes = (bounds.size)(&first);
    let mut batch = vec![first];
    while batch.len() < bounds.items {
        let Ok(next) = rx.try_recv() else { break };
        let size = (bounds.size)(&next);
        if !(bounds.joins)(&batch[0], &next) || bytes + size > bounds.bytes {
            *carry = Some(next);
            break;
        }
        bytes += size;
        batch.push(next);
    }
    batch
}
