//! The plain-HTTP endpoints etcd serves next to gRPC on its client port:
//! `/health` (what load balancers and `etcdctl endpoint health --cluster`
//! probe) and `/version`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::core::Core;
use super::maintenance::ETCD_COMPATIBLE_VERSION;

/// The etcd cluster version reported by `/version`.
const CLUSTER_VERSION: &str = "3.5.0";

/// Routes for the HTTP endpoints.
pub fn routes(core: Arc<Core>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/version", get(version))
        .with_state(core)
}

/// etcd's `/health`: healthy when a linearizable read succeeds (there is a
/// leader, and a quorum confirms it). Body as etcd 3.5.
async fn health(State(core): State<Arc<Core>>) -> (StatusCode, Json<serde_json::Value>) {
    match core.read_barrier().await {
        Ok(()) => (
            StatusCode::OK,
            Json(json!({"health": "true", "reason": ""})),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"health": "false", "reason": e.to_string()})),
        ),
    }
}

async fn version() -> Json<serde_json::Value> {
    Json(json!({"etcdserver": ETCD_COMPATIBLE_VERSION, "etcdcluster": CLUSTER_VERSION}))
}
