//! gRPC calls to their service by the path's service name, without axum's
//! router.
//!
//! A gRPC path is `/<package.Service>/<Method>`; each tonic server matches
//! the method itself. axum's router (what `tonic::service::Routes` builds)
//! found the service by a route-tree lookup, then stored the matched path
//! and the wildcard's value in the request's extensions and wrapped the
//! call in three layers of boxed route futures: about 6% of a leader's CPU
//! at 1,000 concurrent puts. [`GrpcDispatch`] compares the path's first
//! segment with the few service names (seven) and calls that service; a
//! name it does not serve is answered UNIMPLEMENTED with no message, as
//! etcd's grpc-go server and the router's fallback answer it.
//!
//! [`GrpcServices`] is the whole stack every caller reaches: gRPC clients
//! on a client listener (`conn::ClientApp`) and the JSON gateway, which
//! calls the services in-process: what a learner refuses
//! (`server::learner_guard`), grpc-go's receive limit and a
//! single-message request's early end (`server::frame_limit`), the gRPC
//! metrics (`server::grpc_metrics`), then the dispatcher.
//!
//! Example: `/etcdserverpb.KV/Put` goes to the service named
//! `etcdserverpb.KV`, which answers `Put`; `/etcdserverpb.KV/Nope` to the
//! same service, which answers UNIMPLEMENTED; `/nope.Svc/Put` and `/` are
//! answered UNIMPLEMENTED here.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{Request, Response};
use futures::future::BoxFuture;
use futures::FutureExt;
use tonic::server::NamedService;
use tower::{Layer, Service};

use crate::server::transport::frame_limit::limit_grpc_request;
use crate::server::transport::grpc_metrics::{methods, GrpcMetrics, GrpcMetricsLayer};
use crate::server::transport::learner_guard;

/// The answer to a call, in axum's body.
type Answer = BoxFuture<'static, Result<Response<Body>, Infallible>>;

/// A service behind the dispatcher: calls a clone of it (tonic's servers
/// clone an `Arc`), so a call allocates only its future.
type Route = Box<dyn Fn(Request<Body>) -> Answer + Send + Sync>;

/// The gRPC services of a listener, by name (see the module docs).
#[derive(Clone, Default)]
pub struct GrpcDispatch {
    routes: Arc<Vec<(&'static str, Route)>>,
}

impl GrpcDispatch {
    /// Adds the tonic server `svc` under its service name.
    pub fn with_service<S>(mut self, svc: S) -> Self
    where
        S: Service<
                Request<tonic::body::Body>,
                Response = Response<tonic::body::Body>,
                Error = Infallible,
            > + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        let route = move |req: Request<Body>| -> Answer {
            let call = svc.clone().call(req.map(tonic::body::Body::new));
            call.map(|res| res.map(|res| res.map(Body::new))).boxed()
        };
        assert!(
            self.route(S::NAME).is_none(),
            "gRPC service {} added twice",
            S::NAME
        );
        let routes = Arc::get_mut(&mut self.routes);
        let routes = routes.expect("services are added before the dispatcher is cloned");
        routes.push((S::NAME, Box::new(route)));
        self
    }

    fn route(&self, service: &str) -> Option<&Route> {
        self.routes
            .iter()
            .find(|(name, _)| *name == service)
            .map(|(_, route)| route)
    }
}

/// The service name of a gRPC path (`/<service>/<method>`).
fn service_name(path: &str) -> Option<&str> {
    let (service, _method) = path.strip_prefix('/')?.split_once('/')?;
    Some(service)
}

/// The answer to a call of a service this listener does not serve.
fn unimplemented() -> Response<Body> {
    let (parts, ()) = tonic::Status::unimplemented("")
        .into_http::<()>()
        .into_parts();
    Response::from_parts(parts, Body::empty())
}

/// The gRPC services behind grpc-go's receive limit and the gRPC metrics
/// (see the module docs).
#[derive(Clone)]
pub struct GrpcServices {
    services: GrpcMetrics<GrpcDispatch>,
    /// Whether this member is a learner now
    /// ([`crate::server::transport::learner_guard`]).
    is_learner: Arc<dyn Fn() -> bool + Send + Sync>,
    /// grpc-go's receive limit as etcd sets it (`--max-request-bytes` plus
    /// `GRPC_OVERHEAD_BYTES`), checked on each message's header before the
    /// message is buffered.
    frame_limit_bytes: usize,
}

impl GrpcServices {
    /// `dispatch` behind the layers, with the receive limit
    /// `frame_limit_bytes`, refusing what a learner refuses while
    /// `is_learner`.
    pub fn new(
        dispatch: GrpcDispatch,
        frame_limit_bytes: usize,
        is_learner: Arc<dyn Fn() -> bool + Send + Sync>,
    ) -> Self {
        Self {
            services: GrpcMetricsLayer.layer(dispatch),
            is_learner,
            frame_limit_bytes,
        }
    }
}

impl<B> Service<Request<B>> for GrpcServices
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The dispatcher is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if learner_guard::refused_for_learner(req.uri().path()) && (self.is_learner)() {
            return futures::future::ready(Ok(learner_guard::refusal())).boxed();
        }
        let one_message = methods::one_request_message(req.uri().path());
        let req = limit_grpc_request(req.map(Body::new), self.frame_limit_bytes, one_message);
        self.services.call(req)
    }
}

/// Any body: the listener's (axum's, taken as it is) or a tonic client's
/// (the Lock and Election services call the others through a dispatcher).
impl<B> Service<Request<B>> for GrpcDispatch
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // tonic's servers are always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let req = req.map(Body::new);
        let route = service_name(req.uri().path()).and_then(|name| self.route(name));
        match route {
            Some(route) => route(req),
            None => futures::future::ready(Ok(unimplemented())).boxed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_of_paths() {
        assert_eq!(
            service_name("/etcdserverpb.KV/Put"),
            Some("etcdserverpb.KV")
        );
        assert_eq!(service_name("/etcdserverpb.KV/"), Some("etcdserverpb.KV"));
        assert_eq!(service_name("/etcdserverpb.KV"), None);
        assert_eq!(service_name("etcdserverpb.KV/Put"), None);
        assert_eq!(service_name("/"), None);
        assert_eq!(service_name(""), None);
    }
}
