//! A streaming call's requests, read from the connection as they arrive.
//!
//! h2 closes a whole connection (GOAWAY `ENHANCE_YOUR_CALM`,
//! `too_many_data_frames`) when it holds too many small DATA frames the
//! application has not read yet: each frame under 256 bytes costs 256 minus
//! its size from a budget of half the connection window (512 KiB with
//! hyper's 1 MiB). A gRPC client that sends small requests on one stream
//! faster than the service answers them crosses that line: 10,000 watch
//! creates of ~40 bytes, each in a DATA frame of its own, failed the
//! connection, every stream on it, after ~2,300 unread frames while the
//! session was still answering the first ones (with hyper's windows; the
//! client connections' own windows, `transport::conn`, raise the budget). etcd (grpc-go) has no such
//! budget; flow control alone bounds what a client sends ahead, and
//! `clientv3` multiplexes all of a client's watchers onto one stream and
//! sends the renewals of all its leases on one stream in a burst.
//!
//! [`Inbound::spawn`] reads the stream in a task of its own, so h2 hands
//! each frame over as soon as it arrives, into a queue bounded in request
//! bytes ([`INBOUND_QUEUE_BYTES`]). A service that falls further behind
//! stops the reader; from then on the HTTP/2 flow control window bounds what
//! the client can send, as it bounds an etcd client. The reader ends with
//! the stream, with a receive error (passed on last), or when the service
//! drops its [`Inbound`].
//!
//! Worked example, one watch stream, 10,000 creates of 40 bytes sent in a
//! burst: the reader takes them off the connection as they come (400 KB,
//! the queue's 256 KiB first; the rest waits in h2, within the stream's
//! window, until the session has taken some), the session answers them at
//! its own pace.

use std::sync::Arc;

use prost::Message;
use tokio::sync::{mpsc, Semaphore};
use tonic::{Status, Streaming};

/// Request bytes (encoded messages) read ahead of the service per stream,
/// at most: the client stream's HTTP/2 window
/// (`transport::conn::CLIENT_STREAM_WINDOW_BYTES`), so a stream holds at
/// most twice that (this queue and h2's window) however the client frames
/// its requests. A larger request is let through alone.
pub const INBOUND_QUEUE_BYTES: usize = 256 * 1024;

/// One request read ahead, with the queue bytes it holds.
type Item<T> = (Result<T, Status>, u32);

/// The requests of a streaming call, read ahead by a task (see the module
/// docs).
pub struct Inbound<T> {
    queue: mpsc::UnboundedReceiver<Item<T>>,
    room: Arc<Semaphore>,
}

impl<T: Message + Default + Send + 'static> Inbound<T> {
    /// Starts reading `requests` ahead.
    pub fn spawn(requests: Streaming<T>) -> Self {
        let (tx, queue) = mpsc::unbounded_channel();
        let room = Arc::new(Semaphore::new(INBOUND_QUEUE_BYTES));
        tokio::spawn(read_ahead(requests, tx, room.clone()));
        Self { queue, room }
    }

    /// The next request; `None` once the client has ended its side.
    /// Cancel-safe: a request is taken only when it is returned.
    pub async fn message(&mut self) -> Result<Option<T>, Status> {
        match self.queue.recv().await {
            Some((request, bytes)) => {
                self.room.add_permits(bytes as usize);
                request.map(Some)
            }
            None => Ok(None),
        }
    }
}

/// The reader task: moves requests into the queue while it has room.
async fn read_ahead<T: Message + Default + Send + 'static>(
    mut requests: Streaming<T>,
    tx: mpsc::UnboundedSender<Item<T>>,
    room: Arc<Semaphore>,
) {
    loop {
        let next = tokio::select! {
            next = requests.message() => next,
            _ = tx.closed() => return,
        };
        let request = match next {
            Ok(Some(request)) => request,
            Ok(None) => return,
            Err(status) => {
                let _ = tx.send((Err(status), 0));
                return;
            }
        };
        let bytes = queue_bytes(&request);
        let permit = tokio::select! {
            permit = room.acquire_many(bytes) => permit,
            _ = tx.closed() => return,
        };
        let Ok(permit) = permit else { return };
        // Given back by `Inbound::message` when the request is taken.
        permit.forget();
        if tx.send((Ok(request), bytes)).is_err() {
            return;
        }
    }
}

/// The queue bytes a request holds: its encoded size, at least 1 and at
/// most the whole queue.
fn queue_bytes<T: Message>(request: &T) -> u32 {
    let bytes = request.encoded_len().clamp(1, INBOUND_QUEUE_BYTES);
    u32::try_from(bytes).expect("INBOUND_QUEUE_BYTES fits in u32")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_holds_its_size_within_the_queue() {
        let small = etcd_proto::etcdserverpb::LeaseKeepAliveRequest { id: 7 };
        assert_eq!(queue_bytes(&small) as usize, small.encoded_len());
        let empty = etcd_proto::etcdserverpb::LeaseKeepAliveRequest { id: 0 };
        assert_eq!(queue_bytes(&empty), 1, "an empty message holds a byte");
        let huge = etcd_proto::etcdserverpb::PutRequest {
            value: vec![0; INBOUND_QUEUE_BYTES * 2],
            ..Default::default()
        };
        assert_eq!(
            queue_bytes(&huge) as usize,
            INBOUND_QUEUE_BYTES,
            "a request larger than the queue passes alone"
        );
    }
}
