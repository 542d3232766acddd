//! The admin API (axum): runtime control, Prometheus metrics and a status page.
//!
//! | method | path | effect |
//! |---|---|---|
//! | GET | `/healthz` | `ok` while the process runs (for keepalived's `vrrp_script`) |
//! | GET | `/metrics` | Prometheus/OpenMetrics text |
//! | GET | `/` or `/status` | HTML table of frontends, backends and their state |
//! | GET | `/api/backends` | the same as JSON |
//! | GET | `/api/vip` | the virtual IP: state, holder or not, since when, acquisitions and releases (404 without a VIP) |
//! | POST | `/api/frontends/{frontend}/backends/{backend}/drain` | no new connections, keep established |
//! | POST | `/api/frontends/{frontend}/backends/{backend}/disable` | no new connections, close established |
//! | POST | `/api/frontends/{frontend}/backends/{backend}/enable` | back to normal |
//! | PUT | `/api/frontends/{frontend}/backends/{backend}/weight` | body `{"weight": N}`, 0..=256 |
//!
//! Operator state is kept across reloads for backends whose address is unchanged. The API has
//! no authentication: keep it on loopback (the default) or a management network.

mod error;
mod handlers;
mod status_page;

use std::sync::Arc;

use axum::routing::{get, post, put};
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use error::AdminError;

use crate::backend::Backend;
use crate::backend::Directory;
use crate::metrics::Metrics;
use crate::vip::VipMonitor;

/// What the handlers need.
#[derive(Clone)]
pub struct AdminContext {
    metrics: Arc<Metrics>,
    directory: Directory,
    vip: Option<Arc<VipMonitor>>,
}

impl AdminContext {
    /// A context over the process metrics and the running backends.
    pub fn new(metrics: Arc<Metrics>, directory: Directory) -> Self {
        AdminContext {
            metrics,
            directory,
            vip: None,
        }
    }

    /// The same context, showing the VIP's status.
    pub fn with_vip(self, vip: Option<Arc<VipMonitor>>) -> Self {
        AdminContext { vip, ..self }
    }

    fn backends(&self) -> Vec<Arc<Backend>> {
        self.directory
            .read()
            .expect("directory lock poisoned")
            .clone()
    }

    fn find(&self, frontend: &str, backend: &str) -> Result<Arc<Backend>, AdminError> {
        self.backends()
            .into_iter()
            .find(|candidate| candidate.frontend() == frontend && candidate.name() == backend)
            .ok_or_else(|| AdminError::UnknownBackend {
                frontend: frontend.to_string(),
                backend: backend.to_string(),
            })
    }
}

/// The admin router.
pub fn router(context: AdminContext) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(handlers::metrics))
        .route("/", get(handlers::status_page))
        .route("/status", get(handlers::status_page))
        .route("/api/backends", get(handlers::list))
        .route("/api/vip", get(handlers::vip))
        .route(
            "/api/frontends/{frontend}/backends/{backend}/weight",
            put(handlers::set_weight),
        )
        .route(
            "/api/frontends/{frontend}/backends/{backend}/{action}",
            post(handlers::act),
        )
        .with_state(context)
}

/// Serves the admin API on `listener` until `stop` is cancelled.
pub async fn serve(listener: TcpListener, context: AdminContext, stop: CancellationToken) {
    let result = axum::serve(listener, router(context))
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await;
    if let Err(error) = result {
        tracing::error!(%error, "admin API stopped");
    }
}
