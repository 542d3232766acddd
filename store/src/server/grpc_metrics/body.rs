//! Body wrappers: request frames counted as received bytes; response
//! frames counted as sent bytes, and the call's status taken from the
//! trailers (or the drop of an unfinished body).

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{HeaderMap, Response};
use bytes::Bytes;
use http_body::{Frame, SizeHint};

use super::methods::{MethodCounters, CANCELED, UNKNOWN};
use crate::metrics;

/// A request body counting the bytes it yields.
pub struct CountedRequest {
    inner: Body,
}

impl CountedRequest {
    /// Wraps `inner`.
    pub fn new(inner: Body) -> Self {
        CountedRequest { inner }
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

/// A response body that counts sent bytes and the call's end.
pub struct ObservedResponse {
    inner: Body,
    counters: &'static MethodCounters,
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
