//! Streaming calls: request bodies read as a sequence of JSON requests, and
//! response streams written as chunks, one `{"result":...}` line per
//! message, the way the gateway serves `Watch`, `LeaseKeepAlive` and
//! `Snapshot`.
//!
//! The gateway waits for a call's first message before it answers, so a
//! stream that fails at once gets the error's HTTP status; a failure later
//! ends the stream with an error chunk after the `200` already sent.
//!
//! A watch outlives its request body as in etcd (the gateway half-closes
//! the gRPC stream, and etcd keeps watching): the request side stays open
//! until the HTTP client goes away, which [`Hold`] notices by its response
//! body being dropped.

use axum::body::{Body, BodyDataStream, Bytes};
use axum::response::Response;
use futures::stream::{self, StreamExt};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::sync::oneshot;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::json::{self, DecodeError, Next, Request};
use super::reply;

/// Reads JSON requests one by one from a streaming body.
pub struct RequestReader {
    body: BodyDataStream,
    buf: Vec<u8>,
    /// The most one request may take, in bytes of JSON.
    max_message_bytes: usize,
    done: bool,
}

impl RequestReader {
    pub fn new(body: Body, max_message_bytes: usize) -> Self {
        Self {
            body: body.into_data_stream(),
            buf: Vec::new(),
            max_message_bytes,
            done: false,
        }
    }

    /// The next request; `None` at the end of the body.
    pub async fn next<T: Request>(&mut self) -> Result<Option<T>, DecodeError> {
        loop {
            if let Next::Message(msg, used) = json::next::<T>(&self.buf)? {
                self.buf.drain(..used);
                return Ok(Some(msg));
            }
            if self.done {
                return self.at_end();
            }
            if self.buf.len() > self.max_message_bytes {
                return Err(DecodeError::Invalid(format!(
                    "request larger than max ({} bytes)",
                    self.max_message_bytes
                )));
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => return Err(DecodeError::Invalid(e.to_string())),
                None => self.done = true,
            }
        }
    }

    fn at_end<T>(&self) -> Result<Option<T>, DecodeError> {
        if self.buf.iter().all(u8::is_ascii_whitespace) {
            Ok(None)
        } else {
            Err(DecodeError::UnexpectedEof)
        }
    }
}

/// How many decoded requests may wait for the gRPC call to take them.
pub const REQUEST_QUEUE: usize = 16;

/// The requests of a streaming body as a stream: `first`, then what
/// `reader` decodes, until the body ends or a request does not decode (the
/// gateway stops sending then). With `hold`, the stream stays open after
/// that until the paired [`Hold`] is dropped.
pub fn requests<T>(
    first: Option<T>,
    mut reader: RequestReader,
    hold: Option<oneshot::Receiver<()>>,
) -> ReceiverStream<T>
where
    T: Request + Send + 'static,
{
    let (tx, rx) = mpsc::channel(REQUEST_QUEUE);
    tokio::spawn(async move {
        let mut next = first;
        while let Some(msg) = next {
            if tx.send(msg).await.is_err() {
                return;
            }
            next = match reader.next::<T>().await {
                Ok(msg) => msg,
                Err(e) => {
                    tracing::debug!(error = %e, "json gateway: stream request not decoded");
                    None
                }
            };
        }
        if let Some(gone) = hold {
            tokio::select! {
                _ = gone => {}
                _ = tx.closed() => {}
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Keeps a request stream open until the response body it is paired with
/// is dropped (the HTTP client went away or the call ended).
pub struct Hold {
    _gone: oneshot::Sender<()>,
}

impl Hold {
    /// The guard, and what tells [`requests`] it was dropped.
    pub fn new() -> (Self, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel::<()>();
        (Self { _gone: tx }, rx)
    }
}

/// Answers with a call's response stream: waits for its first message
/// (or error), then streams the rest; `hold` lives as long as the body.
pub async fn respond<T>(
    call: Result<tonic::Response<Streaming<T>>, Status>,
    hold: Option<Hold>,
) -> Response
where
    T: Serialize + Send + 'static,
{
    let mut messages = match call {
        Ok(resp) => resp.into_inner(),
        Err(status) => return reply::stream_failed(&status),
    };
    let first = match messages.next().await {
        Some(Ok(msg)) => json::encode_chunk(&msg),
        Some(Err(status)) => return reply::stream_failed(&status),
        None => return reply::stream(Body::empty()),
    };
    let rest = stream::unfold(Some((messages, hold)), |state| async move {
        let (mut messages, hold) = state?;
        match messages.next().await {
            Some(Ok(msg)) => Some((json::encode_chunk(&msg), Some((messages, hold)))),
            Some(Err(status)) => Some((reply::stream_error_chunk(&status), None)),
            None => None,
        }
    });
    let chunks = stream::once(async move { first })
        .chain(rest)
        .map(|chunk| Ok::<_, std::convert::Infallible>(Bytes::from(chunk)));
    reply::stream(Body::from_stream(chunks))
}
