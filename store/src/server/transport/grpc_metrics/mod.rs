//! A tower layer counting gRPC calls as etcd's go-grpc-prometheus
//! interceptors do: `grpc_server_started_total` when a call arrives,
//! `grpc_server_handled_total` with its status code when it ends (labels
//! `grpc_type`, `grpc_service`, `grpc_method`, `grpc_code`), the messages
//! received and sent (`grpc_server_msg_received_total`,
//! `grpc_server_msg_sent_total`), and the bytes of gRPC frames received and
//! sent (`etcd_network_client_grpc_*`).
//!
//! A call's code is the `grpc-status` of a trailers-only answer (errors
//! tonic answers at once) or of the trailers that end the response body;
//! a body dropped before its end (the client went away) counts as
//! `Canceled`. The counters of every method etcd serves are created up
//! front, with every code (go-grpc-prometheus does the same, so the
//! families show zeros before any call), and looked up without locks.
//! Requests that are not gRPC, or name a method etcd does not serve, pass
//! through uncounted.

mod body;
pub(in crate::server) mod methods;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{Request, Response};
use tower::{Layer, Service};

use crate::server::http::is_grpc;
use body::{CountedRequest, ObservedResponse};
pub use methods::{code_name, preregister, MethodCounters, GRPC_CODES};

/// The layer (see the module docs).
#[derive(Clone, Copy, Default)]
pub struct GrpcMetricsLayer;

impl<S> Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetrics { inner }
    }
}

/// The service the layer wraps around the gRPC routes.
#[derive(Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
}

impl<S> Service<Request<Body>> for GrpcMetrics<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let counters = match is_grpc(req.headers()) {
            true => methods::lookup(req.uri().path()),
            false => None,
        };
        let Some(counters) = counters else {
            return Box::pin(self.inner.call(req));
        };
        counters.started.inc();
        let req = req.map(|b| Body::new(CountedRequest::new(b, counters)));
        let future = self.inner.call(req);
        Box::pin(async move {
            let response = future.await?;
            Ok(ObservedResponse::wrap(response, counters))
        })
    }
}
