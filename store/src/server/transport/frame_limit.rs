//! The gRPC receive limit, enforced on each message's length prefix before
//! its bytes are buffered.
//!
//! etcd's grpc-go server refuses a message longer than
//! `--max-request-bytes` + 512 KiB with `ResourceExhausted` "grpc: received
//! message larger than max (N vs. M)" as soon as it reads the message's
//! 5-byte header (1 byte compressed flag, 4 bytes big-endian length). tonic
//! checks its limit only once the whole message is buffered, so a client
//! could make the member hold a 64 MiB message per stream. This body
//! wrapper reads the headers as the request body streams through and fails
//! the body with that status when a header announces too much; tonic
//! answers the call with the status (for unary calls and every message of
//! a stream alike), and the rest of the oversized message is never read.
//!
//! Worked example, limit 2 MiB: a Put of 3 MiB arrives as the header
//! `00 00 30 00 0c` then its bytes; the header alone fails the body with
//! "grpc: received message larger than max (3145740 vs. 2097152)".
//!
//! **A call's single request message.** For the methods whose request is
//! one message (etcd's unary and server-streaming ones), the body also ends
//! at the first message boundary after that message, without waiting for
//! the client's end of stream. tonic's unary handler reads the message and
//! then awaits the request's end (its trailers) before it runs the call;
//! tonic and hyper clients (the Rust `etcd-client`, a follower forwarding
//! to its leader) send the message in one DATA frame and the end of stream
//! in a second, empty one, after another turn of their connection task,
//! so every such call waited for that frame (`strace`: the leader's
//! `recvfrom` of the empty frame came 0.1-0.4 ms after the message, and the
//! call ran only then). grpc-go's server, etcd's, runs a unary call as soon
//! as its message is read. A client that sends the end with its message
//! (grpc-go, h2load) ends the body at the same point either way.
//!
//! **The client's end of stream, still read.** The rest of such a body (the
//! client's end of stream, usually an empty DATA frame) is read to its end
//! by a task of its own once tonic lets the body go ([`FrameLimited`]'s
//! drop), for at most [`REQUEST_END_WAIT`]. Dropping it unread made h2
//! reset every stream whose answer was complete before that frame arrived
//! (`NO_ERROR`, as RFC 9113 section 8.1 prescribes), and it remembers only
//! 50 reset streams a second: the frame of a forgotten stream is a
//! protocol error of the client's in h2's books, and after 1,024 of them a
//! connection is closed with `ENHANCE_YOUR_CALM`. One Rust client
//! connection of 64 streams putting 20,000 keys a second lost its
//! connection, and 42,929 of 200,000 puts failed with "channel closed";
//! with the end read, none. grpc-go's server (etcd's) ignores frames of
//! streams it has closed.

use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request};
use bytes::Bytes;
use http_body::{Frame, SizeHint};

use crate::errors::grpc_message_too_large;

/// A gRPC message header: compressed flag and 4-byte length.
const HEADER_BYTES: usize = 5;

/// How long the rest of a one-message request body is read after the call
/// took its message (module docs): h2's own memory of a reset stream.
pub const REQUEST_END_WAIT: Duration = Duration::from_secs(1);

/// Wraps the body of a gRPC request in a [`FrameLimited`] body that ends
/// after one message if `one_message` (the method's request is a single
/// message; module docs); other requests pass unchanged.
pub fn limit_grpc_request(
    req: Request<Body>,
    limit_bytes: usize,
    one_message: bool,
) -> Request<Body> {
    let grpc = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if !grpc {
        return req;
    }
    req.map(|b| Body::new(FrameLimited::new(b, limit_bytes, one_message)))
}

/// Where the scan is in the stream of messages.
#[derive(Debug, Default)]
struct Scan {
    header: [u8; HEADER_BYTES],
    /// Header bytes seen of the current header.
    have: usize,
    /// Bytes of the current message still to pass.
    remaining: usize,
    /// Whole messages passed.
    messages: usize,
}

impl Scan {
    /// Follows `data` through headers and messages; the announced length
    /// of the first message over `limit`, if any.
    fn feed(&mut self, mut data: &[u8], limit: usize) -> Option<usize> {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(data.len());
                self.remaining -= n;
                data = &data[n..];
                if self.remaining == 0 {
                    self.messages += 1;
                }
                continue;
            }
            let n = (HEADER_BYTES - self.have).min(data.len());
            self.header[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have == HEADER_BYTES {
                self.have = 0;
                let len = u32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]) as usize;
                if len > limit {
                    return Some(len);
                }
                self.remaining = len;
                if len == 0 {
                    self.messages += 1;
                }
                continue;
            }
        }
        None
    }

    /// True between messages (no header or message partly passed).
    fn at_boundary(&self) -> bool {
        self.have == 0 && self.remaining == 0
    }
}

/// A request body that fails once a message header announces more than
/// the limit, and may end after its first message (module docs).
pub struct FrameLimited<B>
where
    B: http_body::Body + Send + Unpin + 'static,
{
    /// The client's body (taken only by the drop).
    inner: Option<B>,
    limit: usize,
    scan: Scan,
    /// End the body after its first message (module docs).
    one_message: bool,
    /// Failed, or ended after its one message: nothing more is read.
    done: bool,
    /// Ended after its one message, not failed: the drop reads the rest.
    ended_early: bool,
}

impl<B> FrameLimited<B>
where
    B: http_body::Body + Send + Unpin + 'static,
{
    /// Wraps `inner`, refusing messages over `limit_bytes`, ending after
    /// the first message if `one_message`.
    pub fn new(inner: B, limit_bytes: usize, one_message: bool) -> Self {
        Self {
            inner: Some(inner),
            limit: limit_bytes,
            scan: Scan::default(),
            one_message,
            done: false,
            ended_early: false,
        }
    }
}

impl<B> http_body::Body for FrameLimited<B>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = match ready!(Pin::new(inner).poll_frame(cx)) {
            None => return Poll::Ready(None),
            Some(Err(e)) => return Poll::Ready(Some(Err(axum::Error::new(e)))),
            Some(Ok(frame)) => frame,
        };
        if let Some(data) = frame.data_ref() {
            let limit = self.limit;
            if let Some(len) = self.scan.feed(data, limit) {
                self.done = true;
                let status = grpc_message_too_large(len, limit);
                return Poll::Ready(Some(Err(axum::Error::new(status))));
            }
            if self.one_message && self.scan.messages > 0 && self.scan.at_boundary() {
                self.done = true;
                self.ended_early = true;
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some(inner) if !self.done => inner.size_hint(),
            _ => SizeHint::with_exact(0),
        }
    }
}

/// Reads the rest of a body that ended after its one message (module
/// docs); a body that failed is dropped unread.
impl<B> Drop for FrameLimited<B>
where
    B: http_body::Body + Send + Unpin + 'static,
{
    fn drop(&mut self) {
        let Some(rest) = self.inner.take() else {
            return;
        };
        if !self.ended_early || rest.is_end_stream() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(read_to_end(rest));
        }
    }
}

/// Polls `body` until it ends, fails or [`REQUEST_END_WAIT`] passes,
/// dropping what it gives.
async fn read_to_end<B: http_body::Body + Unpin>(mut body: B) {
    let frames = async {
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            if frame.is_err() {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(REQUEST_END_WAIT, frames).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;

    fn header(len: u32) -> Vec<u8> {
        let mut h = vec![0];
        h.extend_from_slice(&len.to_be_bytes());
        h
    }

    #[test]
    fn worked_example() {
        let mut s = Scan::default();
        assert_eq!(s.feed(&header(3_145_740), 2_097_152), Some(3_145_740));
    }

    /// A request body whose client sent `chunks` and has not ended its
    /// stream: after the chunks, every poll is pending.
    struct Open {
        chunks: std::collections::VecDeque<Bytes>,
    }

    impl http_body::Body for Open {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            match self.chunks.pop_front() {
                Some(chunk) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
                None => Poll::Pending,
            }
        }
    }

    /// Polls `body` until it ends or pends; the data chunks it gave and
    /// whether it ended.
    fn drain(body: &mut FrameLimited<Open>) -> (usize, bool) {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut chunks = 0;
        loop {
            match Pin::new(&mut *body).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(_))) => chunks += 1,
                Poll::Ready(Some(Err(e))) => panic!("unexpected error {e}"),
                Poll::Ready(None) => return (chunks, true),
                Poll::Pending => return (chunks, false),
            }
        }
    }

    fn open(stream: &[u8], split: usize) -> Open {
        let chunks = stream.chunks(split).map(Bytes::copy_from_slice).collect();
        Open { chunks }
    }

    #[test]
    fn a_one_message_request_ends_after_its_message_without_the_end_of_stream() {
        let mut stream = header(3);
        stream.extend_from_slice(b"abc");
        for split in 1..=stream.len() {
            let chunks = stream.len().div_ceil(split);
            let mut body = FrameLimited::new(open(&stream, split), 1024, true);
            assert_eq!(drain(&mut body), (chunks, true), "split {split}");
            assert!(body.is_end_stream());
            let mut body = FrameLimited::new(open(&stream, split), 1024, false);
            assert_eq!(
                drain(&mut body),
                (chunks, false),
                "split {split}: a stream waits"
            );
        }
        let mut empty = FrameLimited::new(open(&header(0), 5), 1024, true);
        assert_eq!(
            drain(&mut empty),
            (1, true),
            "an empty message is a message"
        );
    }

    #[test]
    fn a_one_message_request_ends_only_between_messages() {
        // A client that sends a second message in the first one's frame is
        // read to the end of that message, so no message is cut.
        let mut first = header(3);
        first.extend_from_slice(b"abc");
        first.extend(header(2));
        first.push(b'x');
        let chunks = [Bytes::from(first), Bytes::from_static(b"y")];
        let open = Open {
            chunks: chunks.into_iter().collect(),
        };
        let mut body = FrameLimited::new(open, 1024, true);
        assert_eq!(drain(&mut body), (2, true));
    }

    /// A request body that gives `chunks`, then ends, noting that its end
    /// was read.
    struct Ending {
        chunks: std::collections::VecDeque<Bytes>,
        end_read: std::sync::Arc<std::sync::atomic::AtomicBool>,
    }

    impl http_body::Body for Ending {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            match self.chunks.pop_front() {
                Some(chunk) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
                None => {
                    self.end_read
                        .store(true, std::sync::atomic::Ordering::SeqCst);
                    Poll::Ready(None)
                }
            }
        }
    }

    /// Whether the end of a body holding `stream` then an empty frame is
    /// read once the body, polled until it ends, is dropped.
    async fn end_read_after_drop(stream: Vec<u8>, limit: usize) -> bool {
        let end_read = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let chunks = [Bytes::from(stream), Bytes::new()];
        let mut body = FrameLimited::new(
            Ending {
                chunks: chunks.into_iter().collect(),
                end_read: end_read.clone(),
            },
            limit,
            true,
        );
        let mut cx = Context::from_waker(std::task::Waker::noop());
        while let Poll::Ready(Some(_)) = Pin::new(&mut body).poll_frame(&mut cx) {}
        assert!(!end_read.load(std::sync::atomic::Ordering::SeqCst));
        drop(body);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        end_read.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test]
    async fn the_rest_of_a_one_message_request_is_read_after_the_call_lets_it_go() {
        let mut stream = header(3);
        stream.extend_from_slice(b"abc");
        assert!(end_read_after_drop(stream, 1024).await);
        let too_large = header(2048);
        assert!(
            !end_read_after_drop(too_large, 1024).await,
            "a refused message is not read further"
        );
    }

    #[test]
    fn messages_within_the_limit_pass_however_the_bytes_are_split() {
        let mut stream = header(3);
        stream.extend_from_slice(b"abc");
        stream.extend(header(0));
        stream.extend(header(4));
        stream.extend_from_slice(b"defg");
        stream.extend(header(5));
        for split in 1..stream.len() {
            let mut s = Scan::default();
            let found: Vec<Option<usize>> = stream.chunks(split).map(|c| s.feed(c, 4)).collect();
            assert_eq!(
                found.iter().flatten().next(),
                Some(&5),
                "split {split}: only the last message is over"
            );
        }
    }
}
