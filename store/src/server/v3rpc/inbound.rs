//! A streaming call's requests, read ahead while the service works.
//!
//! h2 closes a whole connection (GOAWAY `ENHANCE_YOUR_CALM`,
//! `too_many_data_frames`) when it holds too many small DATA frames the
//! application has not read yet: each frame under 256 bytes costs 256 minus
//! its size from a budget of half the connection window (512 KiB with
//! hyper's 1 MiB). A gRPC client that sends small requests on one stream
//! faster than the service answers them crosses that line: 10,000 watch
//! creates of 20-40 bytes, each in a DATA frame of its own, failed the
//! connection, every stream on it, after ~2,300 unread frames while the
//! session was still answering the first ones (with hyper's windows; the
//! client connections' own windows, `transport::conn`, raise the budget).
//! etcd (grpc-go) has no such budget; flow control alone bounds what a
//! client sends ahead, and
//! `clientv3` multiplexes all of a client's watchers onto one stream and
//! sends the renewals of all its leases on one stream in a burst.
//!
//! [`Inbound`] reads a stream's requests ahead while the service works on
//! one: [`Inbound::while_reading`] runs the service's work (an answer that
//! waits for room in the output queue, a renewal forwarded to the leader)
//! and meanwhile takes the requests that arrive off the connection into a
//! queue bounded in request bytes ([`INBOUND_QUEUE_BYTES`]). A service that
//! falls further behind stops reading ahead; from then on the HTTP/2 flow
//! control window bounds what the client can send, as it bounds an etcd
//! client. [`Inbound::message`] takes the queue's requests first, then
//! reads the stream directly: an idle service reads as it did without the
//! queue (a reading task of its own cost each lease renewal a task switch:
//! 10% fewer renewals/s at 64 clients).
//!
//! Worked example, one watch stream, 10,000 creates of 20 bytes sent in a
//! burst while the client reads nothing: the session answers the first
//! ones until its output queue is full; while it waits, `while_reading`
//! takes the rest of the burst (200 KB, within the 256 KiB queue) off the
//! connection; the client reads, and the session answers the queued creates
//! in order.

use std::collections::VecDeque;
use std::future::Future;

use prost::Message;
use tonic::{Status, Streaming};

/// Request bytes (encoded messages) read ahead of the service per stream,
/// at most: the client stream's HTTP/2 window
/// (`transport::conn::CLIENT_STREAM_WINDOW_BYTES`), so a stream holds at
/// most twice that (this queue and h2's window) however the client frames
/// its requests. A request is read ahead while the queue holds less, so one
/// larger than the queue still passes.
pub const INBOUND_QUEUE_BYTES: usize = 256 * 1024;

/// The requests of a streaming call, read ahead while the service works
/// (see the module docs).
pub struct Inbound<T> {
    requests: Streaming<T>,
    /// Requests read ahead, oldest first, each with its encoded size.
    ahead: VecDeque<(T, usize)>,
    /// Encoded bytes of `ahead`.
    ahead_bytes: usize,
    /// How the stream ended while reading ahead: given out once `ahead` is
    /// empty (an end for good, an error once).
    ended: Option<Result<(), Status>>,
}

impl<T: Message + Default + 'static> Inbound<T> {
    /// The requests of `requests`, none read yet.
    pub fn new(requests: Streaming<T>) -> Self {
        Self {
            requests,
            ahead: VecDeque::new(),
            ahead_bytes: 0,
            ended: None,
        }
    }

    /// The next request; `None` once the client has ended its side.
    /// Cancel-safe: a request is taken only when it is returned.
    pub async fn message(&mut self) -> Result<Option<T>, Status> {
        if let Some((request, bytes)) = self.ahead.pop_front() {
            self.ahead_bytes -= bytes;
            return Ok(Some(request));
        }
        match self.ended.take() {
            None => self.requests.message().await,
            Some(Ok(())) => {
                self.ended = Some(Ok(()));
                Ok(None)
            }
            Some(Err(status)) => Err(status),
        }
    }

    /// Runs `work` to its end, reading requests ahead meanwhile while the
    /// queue has room.
    pub async fn while_reading<F: Future>(&mut self, work: F) -> F::Output {
        tokio::pin!(work);
        loop {
            let room = self.ended.is_none() && self.ahead_bytes < INBOUND_QUEUE_BYTES;
            tokio::select! {
                biased;
                out = &mut work => return out,
                next = self.requests.message(), if room => match next {
                    Ok(Some(request)) => {
                        let bytes = request.encoded_len();
                        self.ahead_bytes += bytes;
                        self.ahead.push_back((request, bytes));
                    }
                    Ok(None) => self.ended = Some(Ok(())),
                    Err(status) => self.ended = Some(Err(status)),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use etcd_proto::codec::EtcdCodec;
    use etcd_proto::etcdserverpb::LeaseKeepAliveRequest;
    use http_body_util::{BodyExt, StreamBody};
    use tokio::sync::mpsc;
    use tokio_stream::StreamExt as _;

    /// Long enough for the work of these tests: every request is already
    /// there when it starts, so reading ahead never waits for one.
    const WORK: Duration = Duration::from_millis(20);

    type Sender = mpsc::UnboundedSender<Result<LeaseKeepAliveRequest, Status>>;

    /// A stream fed by the test: each item sent is one gRPC message.
    fn stream() -> (Sender, Inbound<LeaseKeepAliveRequest>) {
        let (tx, rx) = mpsc::unbounded_channel::<Result<LeaseKeepAliveRequest, Status>>();
        let frames = tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(|item| {
            item.map(|request| {
                let mut frame = vec![0];
                frame.extend_from_slice(&(request.encoded_len() as u32).to_be_bytes());
                request.encode(&mut frame).expect("encodes into a Vec");
                http_body::Frame::data(bytes::Bytes::from(frame))
            })
        });
        let body = StreamBody::new(frames).boxed_unsync();
        let decoder = tonic::codec::Codec::decoder(&mut EtcdCodec::<
            LeaseKeepAliveRequest,
            LeaseKeepAliveRequest,
        >::default());
        let requests = Streaming::new_request(decoder, body, None, None);
        (tx, Inbound::new(requests))
    }

    /// Requests that arrive while the work waits are read ahead and come
    /// out in order, then the stream's end, for good.
    #[tokio::test]
    async fn requests_are_read_ahead_while_the_work_waits() {
        let (tx, mut inbound) = stream();
        for id in 1..=3 {
            tx.send(Ok(LeaseKeepAliveRequest { id })).unwrap();
        }
        drop(tx);
        inbound.while_reading(tokio::time::sleep(WORK)).await;
        assert_eq!(inbound.ahead.len(), 3, "read ahead while the work ran");
        assert!(matches!(inbound.ended, Some(Ok(()))));
        for id in 1..=3 {
            assert_eq!(inbound.message().await.unwrap().unwrap().id, id);
        }
        assert_eq!(inbound.ahead_bytes, 0);
        assert!(inbound.message().await.unwrap().is_none());
        assert!(inbound.message().await.unwrap().is_none(), "ended for good");
    }

    /// Reading ahead stops once the queue holds its bytes; the rest is
    /// read when asked for.
    #[tokio::test]
    async fn reading_ahead_stops_at_the_queue_bound() {
        let (tx, mut inbound) = stream();
        let request = LeaseKeepAliveRequest { id: i64::MAX };
        let fit = INBOUND_QUEUE_BYTES.div_ceil(request.encoded_len());
        for _ in 0..fit + 10 {
            tx.send(Ok(request)).unwrap();
        }
        inbound.while_reading(tokio::time::sleep(WORK)).await;
        assert_eq!(inbound.ahead.len(), fit, "stopped at the bound");
        assert!(inbound.ahead_bytes >= INBOUND_QUEUE_BYTES);
        drop(tx);
        let mut read = 0;
        while inbound.message().await.unwrap().is_some() {
            read += 1;
        }
        assert_eq!(read, fit + 10);
    }

    /// An error met while reading ahead comes after the requests before it.
    #[tokio::test]
    async fn an_error_read_ahead_comes_last() {
        let (tx, mut inbound) = stream();
        tx.send(Ok(LeaseKeepAliveRequest { id: 1 })).unwrap();
        tx.send(Err(Status::internal("cut"))).unwrap();
        inbound.while_reading(tokio::time::sleep(WORK)).await;
        assert_eq!(inbound.message().await.unwrap().unwrap().id, 1);
        assert!(inbound.message().await.is_err());
    }
}
