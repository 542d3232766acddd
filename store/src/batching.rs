//! The batching loop shared by the leader's proposal batcher
//! (`raft::batcher`) and the followers' forward batcher
//! (`server::forward_batch`): at most `in_flight` batches are out at a
//! time; once one returns, everything queued meanwhile forms the next
//! batch, within its bounds. Nothing waits for a timer, so a lone request
//! goes out at once, and under load batches grow with the number of
//! waiting requests.
//!
//! A [`Lane`] is the queue and the bound together. Its owner may also send
//! a lone request **directly** from the caller's task, as a batch of one,
//! when nothing is queued and no batch is out ([`Lane::direct_permit`]): the
//! request then skips the hand-off to the batching task and from it to the
//! sending task (and the answer the same hops back), which on two shared
//! cores are wake-ups of another runtime thread on a lone writer's path.
//! Direct and queued batches hold permits of one semaphore, so at most
//! `in_flight` batches are out in all.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// A batching queue and its bound on batches in flight.
pub struct Lane<T> {
    queue: mpsc::Sender<T>,
    permits: Arc<Semaphore>,
    in_flight: usize,
}

impl<T: Send + 'static> Lane<T> {
    /// A lane of `queue_len` waiting items whose batching task, spawned
    /// here, sends at most `in_flight` batches at a time through `send`.
    pub fn spawn<Fut>(
        queue_len: usize,
        in_flight: usize,
        bounds: Bounds<T>,
        send: impl Fn(Vec<T>) -> Fut + Send + 'static,
    ) -> Self
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (queue, rx) = mpsc::channel(queue_len);
        let permits = Arc::new(Semaphore::new(in_flight));
        tokio::spawn(drive(rx, permits.clone(), bounds, send));
        Lane {
            queue,
            permits,
            in_flight,
        }
    }

    /// A permit to send one item directly: only when nothing is queued (a
    /// queued item would otherwise be overtaken by a later one) and no
    /// batch is out (the batching task holds one permit while it waits for
    /// items). So the direct path serves a lone request; under load, items
    /// that arrive while batches are out still queue and form the next
    /// batch together, which sending each directly would split into
    /// batches of one. The batch counts as in flight until the permit is
    /// dropped.
    pub fn direct_permit(&self) -> Option<OwnedSemaphorePermit> {
        if self.queue.capacity() != self.queue.max_capacity()
            || self.permits.available_permits() + 1 < self.in_flight
        {
            return None;
        }
        self.permits.clone().try_acquire_owned().ok()
    }

    /// Queues `item` for the next batch, waiting while the queue is full;
    /// gives it back if the batching task has stopped.
    pub async fn enqueue(&self, item: T) -> Result<(), T> {
        self.queue.send(item).await.map_err(|e| e.0)
    }

    /// Sends `item` alone through `send` from the caller's task when
    /// [`Lane::direct_permit`] allows it, else queues it for the next
    /// batch; gives it back if the batching task has stopped.
    pub async fn submit<Fut>(&self, item: T, send: impl FnOnce(Vec<T>) -> Fut) -> Result<(), T>
    where
        Fut: Future<Output = ()>,
    {
        match self.direct_permit() {
            Some(_permit) => {
                send(vec![item]).await;
                Ok(())
            }
            None => self.enqueue(item).await,
        }
    }
}

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
/// each to `send` in a task of its own, each holding one of `permits`
/// until it is done.
async fn drive<T, Fut>(
    mut rx: mpsc::Receiver<T>,
    permits: Arc<Semaphore>,
    bounds: Bounds<T>,
    send: impl Fn(Vec<T>) -> Fut,
) where
    Fut: Future<Output = ()> + Send + 'static,
{
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    fn bounds() -> Bounds<u32> {
        Bounds {
            items: 8,
            bytes: 1024,
            size: |_| 1,
            joins: |_, _| true,
        }
    }

    /// The batches a lane's task sent, in order.
    type Sent = Arc<Mutex<Vec<Vec<u32>>>>;

    /// A lane recording what it sends, and a gate that holds every send until opened.
    fn recording_lane(in_flight: usize) -> (Lane<u32>, Sent, Arc<Semaphore>) {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(Semaphore::new(0));
        let (record, wait) = (sent.clone(), gate.clone());
        let lane = Lane::spawn(64, in_flight, bounds(), move |batch: Vec<u32>| {
            let (record, wait) = (record.clone(), wait.clone());
            async move {
                record.lock().unwrap().push(batch);
                let _open = wait.acquire().await;
            }
        });
        (lane, sent, gate)
    }

    /// On the test's single thread with a paused clock, every sleep lets the spawned tasks
    /// run until they wait, whatever the machine's speed: nothing here depends on timing.
    #[tokio::test(start_paused = true)]
    async fn only_a_lone_item_goes_directly_and_within_the_bound() {
        let (lane, sent, gate) = recording_lane(3);
        // The batching task holds one permit while it waits for items.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let direct = lane
            .direct_permit()
            .expect("nothing is out: a lone item goes directly");
        assert!(
            lane.direct_permit().is_none(),
            "a batch is out: later items queue"
        );
        drop(direct);
        let direct = lane
            .direct_permit()
            .expect("a dropped permit frees its place");
        lane.enqueue(1).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(*sent.lock().unwrap(), vec![vec![1]]);
        // All three places are taken (the direct one, the batch held by the gate, the
        // batching task's next): items queue and go out together once a place frees.
        lane.enqueue(2).await.unwrap();
        lane.enqueue(3).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(*sent.lock().unwrap(), vec![vec![1], vec![2, 3]]);
        lane.enqueue(4).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(sent.lock().unwrap().len(), 2, "no place is free");
        assert!(lane.direct_permit().is_none(), "an item is queued");
        drop(direct);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(*sent.lock().unwrap(), vec![vec![1], vec![2, 3], vec![4]]);
        gate.add_permits(3);
    }
}
