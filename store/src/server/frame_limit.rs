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

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{header, Request};
use bytes::Bytes;
use http_body::{Frame, SizeHint};

use crate::errors::grpc_message_too_large;

/// A gRPC message header: compressed flag and 4-byte length.
const HEADER_BYTES: usize = 5;

/// Wraps the body of a gRPC request in a [`FrameLimited`] body; other
/// requests pass unchanged.
pub fn limit_grpc_request(req: Request<Body>, limit_bytes: usize) -> Request<Body> {
    let grpc = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if !grpc {
        return req;
    }
    req.map(|b| Body::new(FrameLimited::new(b, limit_bytes)))
}

/// Where the scan is in the stream of messages.
#[derive(Debug, Default)]
struct Scan {
    header: [u8; HEADER_BYTES],
    /// Header bytes seen of the current header.
    have: usize,
    /// Bytes of the current message still to pass.
    remaining: usize,
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
            }
        }
        None
    }
}

/// A request body that fails once a message header announces more than
/// the limit (module docs).
pub struct FrameLimited {
    inner: Body,
    limit: usize,
    scan: Scan,
    failed: bool,
}

impl FrameLimited {
    /// Wraps `inner`, refusing messages over `limit_bytes`.
    pub fn new(inner: Body, limit_bytes: usize) -> Self {
        Self {
            inner,
            limit: limit_bytes,
            scan: Scan::default(),
            failed: false,
        }
    }
}

impl http_body::Body for FrameLimited {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if self.failed {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                let limit = self.limit;
                if let Some(len) = self.scan.feed(data, limit) {
                    self.failed = true;
                    let status = grpc_message_too_large(len, limit);
                    return Poll::Ready(Some(Err(axum::Error::new(status))));
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
