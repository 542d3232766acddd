//! The plain-HTTP endpoints etcd serves beside gRPC, answered as etcd 3.5
//! answers them (status codes, `Content-Type`, bodies byte for byte):
//!
//! - [`health`]: `/health` (`?exclude=<ALARM>`, `?serializable=true`),
//!   what load balancers, `etcdctl endpoint health` and older kubeadm
//!   probes ask;
//! - [`probes`]: `/livez` and `/readyz` with their per-check subpaths
//!   (etcd 3.5.13+), what kubelet probes since kubeadm 1.31;
//! - [`metrics`]: `/metrics` in the Prometheus text format;
//! - `/version` (client port only, as etcd).
//!
//! [`client_routes`] (with the JSON gateway) answers the plain HTTP
//! requests of every `--listen-client-urls` URL (gRPC requests go to the
//! gRPC services, `conn::ClientApp`); [`metrics_routes`] is the whole of every
//! `--listen-metrics-urls` listener. As on etcd's client port, plain HTTP
//! answers there carry the CORS headers of etcd's default `--cors=*`
//! ([`cors`]) and a path no router serves is answered Go's `404 page not
//! found` ([`not_found`]; a gRPC call of a service no member serves is
//! answered UNIMPLEMENTED by `grpc_dispatch`).

pub mod health;
pub mod json_gateway;
pub mod metrics;
pub mod probes;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use tokio::net::TcpListener;

use crate::raft::leadership::Leadership;
use crate::server::core::Core;
use crate::tls::TlsListener;

/// Go's `http.Error` and content sniffing give plain text this type.
const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

/// What the HTTP endpoints read.
#[derive(Clone)]
pub struct HttpState {
    /// The member.
    pub core: Arc<Core>,
    /// Who leads, as the health checks count it.
    pub leadership: Leadership,
}

impl HttpState {
    /// Starts following leadership for `core` (see
    /// [`Leadership`](crate::raft::leadership::Leadership)) and records the
    /// member's identity and quota in the metrics (the gRPC methods' rows
    /// are made by the member, which wires the gRPC services).
    pub fn start(core: Arc<Core>, election_timeout: Duration, quota_bytes: u64) -> Self {
        let leadership = Leadership::spawn(
            core.raft.clone(),
            core.leader_contact.clone(),
            election_timeout,
        );
        crate::metrics::global().set_member(core.config.member_id, quota_bytes);
        HttpState { core, leadership }
    }
}

/// Serves [`metrics_routes`] on one `--listen-metrics-urls` listener
/// (TLS with the client certificate for `https://`) until `shutdown`.
pub async fn serve_metrics(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    state: HttpState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let app = metrics_routes(state);
    let result = match tls {
        Some(config) => match TlsListener::new(listener, config) {
            Ok(l) => axum::serve(l, app).with_graceful_shutdown(shutdown).await,
            Err(e) => Err(e),
        },
        None => {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        }
    };
    if let Err(e) = result {
        tracing::error!(error = %e, "metrics server failed");
    }
}

/// The plain HTTP endpoints of the client port.
pub fn client_routes(state: HttpState) -> Router {
    probe_routes()
        .route("/version", any(version))
        .with_state(state)
}

/// A `--listen-metrics-urls` listener: `/metrics` and the health
/// endpoints, nothing else (etcd's metrics mux).
pub fn metrics_routes(state: HttpState) -> Router {
    probe_routes().fallback(not_found).with_state(state)
}

fn probe_routes() -> Router<HttpState> {
    Router::new()
        .route("/metrics", any(metrics::metrics))
        .route("/health", any(health::health))
        .merge(probes::routes())
}

/// `/version`: `{"etcdserver": ..., "etcdcluster": ..., "storage": ...}`
/// (etcd 3.6's fields, in its order), GET only.
async fn version(State(s): State<HttpState>, method: Method) -> Response {
    if method != Method::GET {
        return method_not_allowed();
    }
    let body = crate::cluster_version::versions(&s.core.cluster.get());
    let mut r = serde_json::to_string(&body)
        .unwrap_or_default()
        .into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Go's `http.Error`: the message and a newline, as plain text with
/// `X-Content-Type-Options: nosniff`.
pub fn go_http_error(status: StatusCode, message: &str) -> Response {
    let mut r = (status, format!("{message}\n")).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(TEXT_PLAIN));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// 405 for anything but GET on the health and version endpoints.
pub fn method_not_allowed() -> Response {
    let mut r = go_http_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET"));
    r
}

/// Go's `http.NotFound`.
pub async fn not_found() -> Response {
    go_http_error(StatusCode::NOT_FOUND, "404 page not found")
}

/// True for a gRPC request's headers (`Content-Type:
/// application/grpc[+proto]`): the one test of the client port's gRPC/HTTP
/// split (`conn::ClientApp`), the receive limit and the gRPC metrics.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// etcd's CORS handler with the default `--cors=*`, around every plain
/// HTTP answer of the client port: the three `Access-Control-Allow-*`
/// headers, and `OPTIONS` (a preflight) answered 200 with no body. gRPC
/// requests never reach it: `conn::ClientApp` sends them to the gRPC router
/// (etcd serves them apart, before its HTTP mux).
pub async fn cors(req: Request, next: Next) -> Response {
    let mut r = if req.method() == Method::OPTIONS {
        StatusCode::OK.into_response()
    } else {
        next.run(req).await
    };
    let h = r.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("accept, content-type, authorization"),
    );
    r
}

/// Reads a query string's values for `name` (repeated keys allowed).
pub fn query_values(query: Option<&str>, name: &str) -> Vec<String> {
    url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .collect()
}

/// True if the query string has `name` at all (`?verbose`).
pub fn query_has(query: Option<&str>, name: &str) -> bool {
    url::form_urlencoded::parse(query.unwrap_or("").as_bytes()).any(|(k, _)| k == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_query_values() {
        let q = Some("exclude=NOSPACE&serializable=true&exclude=CORRUPT&exclude=");
        assert_eq!(query_values(q, "exclude"), vec!["NOSPACE", "CORRUPT", ""]);
        assert!(query_has(Some("verbose"), "verbose"));
        assert!(!query_has(Some("verbosee=1"), "verbose"));
    }
}
