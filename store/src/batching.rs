//! The batching loop shared by the leader's proposal batcher
//! (`raft::batcher`) and the followers' forward batcher
//! (`server::forward_batch`): at most `in_flight` batches are out at a
//! time; once one returns, everything queued meanwhile forms the next
//! batch. Nothing waits for a timer, so a lone request goes out at once,
//! and under load batches grow with the number of waiting requests.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, Semaphore};

/// Takes `first` and whatever else fits from the queue into one batch;
/// an item that does not fit goes back through `carry`.
pub trait TakeBatch<T, B>: FnMut(T, &mut mpsc::Receiver<T>, &mut Option<T>) -> B {}
impl<T, B, F: FnMut(T, &mut mpsc::Receiver<T>, &mut Option<T>) -> B> TakeBatch<T, B> for F {}

/// Runs until the queue closes: takes batches with `take` and hands each
/// to `send` in a task of its own, at most `in_flight` at a time.
pub async fn drive<T, B, Fut>(
    mut rx: mpsc::Receiver<T>,
    in_flight: usize,
    mut take: impl TakeBatch<T, B>,
    send: impl Fn(B) -> Fut,
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
        let sending = send(take(first, &mut rx, &mut carry));
        tokio::spawn(async move {
            sending.await;
            drop(permit);
        });
    }
}
