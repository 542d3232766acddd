//! Body wrappers: request frames counted as received bytes and messages;
//! response frames counted as sent bytes and messages, and the call's
//! status taken from the trailers (or the drop of an unfinished body).
//!
//! Messages are counted on gRPC's framing: each message is a 5-byte prefix
//! (a compression flag, then the length as a big-endian `u32`) and that
//! many bytes, cut into HTTP/2 data frames anywhere. [`Messages`] follows
//! the prefixes across frames and counts a message when its prefix is
//! whole. Example: frames `[0,0,0,0,3,a,b]` and `[c,0,0,0,0,0]` hold two
//! messages (`abc`, then an empty one).

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{HeaderMap, Response};
use bytes::Bytes;
use http_body::{Frame, SizeHint};

use super::methods::{MethodCounters, CANCELED, UNKNOWN};
use crate::metrics;

/// Bytes of a gRPC message's prefix: the compression flag and the length.
const MESSAGE_PREFIX_BYTES: usize = 5;

/// Where a byte stream is in gRPC's framing (see the module docs).
#[derive(Default)]
struct Messages {
    /// The prefix read so far.
    prefix: [u8; MESSAGE_PREFIX_BYTES],
    /// Bytes of `prefix` read.
    have: usize,
    /// Bytes of the current message's body still to come.
    body_left: u64,
}

impl Messages {
    /// Reads `data`; answers the messages whose prefix ended in it.
    fn feed(&mut self, mut data: &[u8]) -> u64 {
        let mut started = 0;
        while !data.is_empty() {
            if self.body_left > 0 {
                let skip = data
                    .len()
                    .min(usize::try_from(self.body_left).unwrap_or(usize::MAX));
                self.body_left -= skip as u64;
                data = &data[skip..];
                continue;
            }
            let take = (MESSAGE_PREFIX_BYTES - self.have).min(data.len());
            self.prefix[self.have..self.have + take].copy_from_slice(&data[..take]);
            self.have += take;
            data = &data[take..];
            if self.have == MESSAGE_PREFIX_BYTES {
                let len = [
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ];
                self.body_left = u64::from(u32::from_be_bytes(len));
                self.have = 0;
                started += 1;
            }
        }
        started
    }
}

/// A request body counting the bytes and messages it yields.
pub struct CountedRequest {
    inner: Body,
    counters: &'static MethodCounters,
    messages: Messages,
}

impl CountedRequest {
    /// Wraps `inner`, counting its messages in `counters`.
    pub fn new(inner: Body, counters: &'static MethodCounters) -> Self {
        CountedRequest {
            inner,
            counters,
            messages: Messages::default(),
        }
    }
}

impl http_body::Body for CountedRequest {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                metrics::global()
                    .network
                    .client_grpc_received
                    .inc_by(data.len() as u64);
                let started = self.messages.feed(data);
                if started > 0 {
                    self.counters.received(started);
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The code number in `grpc-status`, if present.
fn status_of(headers: &HeaderMap) -> Option<usize> {
    headers.get("grpc-status")?.to_str().ok()?.parse().ok()
}

/// A response body that counts sent bytes and messages, and the call's end.
pub struct ObservedResponse {
    inner: Body,
    counters: &'static MethodCounters,
    messages: Messages,
    done: bool,
}

impl ObservedResponse {
    /// Counts a trailers-only answer now; otherwise wraps the body to
    /// count the call when its trailers (or its drop) come.
    pub fn wrap(response: Response<Body>, counters: &'static MethodCounters) -> Response<Body> {
        if let Some(code) = status_of(response.headers()) {
            counters.handled(code);
            return response;
        }
        response.map(|inner| {
            Body::new(ObservedResponse {
                inner,
                counters,
                messages: Messages::default(),
                done: false,
            })
        })
    }

    fn finish(&mut self, code: usize) {
        if !self.done {
            self.done = true;
            self.counters.handled(code);
        }
    }
}

impl http_body::Body for ObservedResponse {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    metrics::global()
                        .network
                        .client_grpc_sent
                        .inc_by(data.len() as u64);
                    let started = self.messages.feed(data);
                    if started > 0 {
                        self.counters.sent(started);
                    }
                } else if let Some(trailers) = frame.trailers_ref() {
                    let code = status_of(trailers).unwrap_or(UNKNOWN);
                    self.finish(code);
                }
            }
            Poll::Ready(Some(Err(_))) | Poll::Ready(None) => self.finish(UNKNOWN),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for ObservedResponse {
    fn drop(&mut self) {
        self.finish(CANCELED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_counted_across_frames() {
        let mut m = Messages::default();
        assert_eq!(m.feed(&[0, 0, 0, 0, 3, b'a', b'b']), 1);
        assert_eq!(m.feed(&[b'c', 0, 0, 0]), 0);
        assert_eq!(m.feed(&[0, 0]), 1);
        // Two whole messages in one frame, then a prefix cut in two.
        assert_eq!(m.feed(&[0, 0, 0, 0, 1, b'x', 0, 0, 0, 0, 0, 0]), 2);
        assert_eq!(m.feed(&[0, 0, 0, 2]), 1);
        assert_eq!(m.feed(b"y"), 0);
        assert_eq!(m.feed(&[b'z', 0, 0, 0, 0, 0]), 1);
        assert_eq!(m.feed(&[]), 0);
    }
}
