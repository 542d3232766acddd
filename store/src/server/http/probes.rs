//! `/livez` and `/readyz` (etcd 3.5.13+), what kubelet probes on the
//! metrics port since kubeadm 1.31.
//!
//! Each endpoint runs a list of named checks:
//! - `/livez`: `serializable_read` (a local read: the process serves);
//! - `/readyz`: `data_corruption` (no CORRUPT alarm), `serializable_read`,
//!   `linearizable_read` (a read through the leader: the cluster has a
//!   quorum; without a leader it fails at once), `non_learner`.
//!
//! `GET /livez` or `/readyz` runs all of the endpoint's checks but those
//! named by `?exclude=` (repeatable; unknown names are ignored); a subpath
//! (`/readyz/linearizable_read`) runs that one check. Every check passing:
//! 200 `ok\n`, with `?verbose` preceded by one `[+]<check> ok` line per
//! check. Any failing: 503 with one line per check, `[-]<check> failed:
//! <error>` for the failures (etcd always gives the reason), then a blank
//! line (Go's `http.Error` adds a newline). Checks run in the order above
//! (etcd's order is that of a Go map, i.e. arbitrary). Each run updates
//! `etcd_server_healthcheck` and `etcd_server_healthchecks_total`.

use axum::extract::{OriginalUri, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use etcd_proto::etcdserverpb::AlarmType;

use super::health::{alarm_raised, read};
use super::{go_http_error, method_not_allowed, query_has, query_values, HttpState, TEXT_PLAIN};
use crate::metrics;

/// One named check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// No CORRUPT alarm.
    DataCorruption,
    /// A local read.
    SerializableRead,
    /// A read through the leader.
    LinearizableRead,
    /// This member votes.
    NonLearner,
}

impl Check {
    /// The check's name in URLs and output.
    pub fn name(self) -> &'static str {
        match self {
            Check::DataCorruption => "data_corruption",
            Check::SerializableRead => "serializable_read",
            Check::LinearizableRead => "linearizable_read",
            Check::NonLearner => "non_learner",
        }
    }

    async fn run(self, s: &HttpState) -> Result<(), String> {
        match self {
            Check::DataCorruption => match alarm_raised(s, AlarmType::Corrupt)? {
                true => Err("alarm activated: CORRUPT".to_string()),
                false => Ok(()),
            },
            Check::SerializableRead => read(s, true).await,
            Check::LinearizableRead => read(s, false).await,
            Check::NonLearner => match s.leadership.is_learner() {
                true => Err("not supported for learner".to_string()),
                false => Ok(()),
            },
        }
    }
}

/// `/livez`'s checks.
pub const LIVEZ: &[Check] = &[Check::SerializableRead];

/// `/readyz`'s checks.
pub const READYZ: &[Check] = &[
    Check::DataCorruption,
    Check::SerializableRead,
    Check::LinearizableRead,
    Check::NonLearner,
];

/// Routes for both endpoints and their subpaths.
pub fn routes() -> Router<HttpState> {
    let mut router = Router::new()
        .route("/livez", any(livez))
        .route("/readyz", any(readyz));
    for (kind, checks) in [("livez", LIVEZ), ("readyz", READYZ)] {
        for check in checks {
            let check = *check;
            router = router.route(
                &format!("/{kind}/{}", check.name()),
                any(
                    move |state: State<HttpState>, method: Method, uri: OriginalUri| {
                        one(state, method, uri, kind, check)
                    },
                ),
            );
        }
    }
    router
}

async fn livez(state: State<HttpState>, method: Method, uri: OriginalUri) -> Response {
    all(state, method, uri, "livez", LIVEZ).await
}

async fn readyz(state: State<HttpState>, method: Method, uri: OriginalUri) -> Response {
    all(state, method, uri, "readyz", READYZ).await
}

async fn all(
    State(s): State<HttpState>,
    method: Method,
    uri: OriginalUri,
    kind: &'static str,
    checks: &[Check],
) -> Response {
    if method != Method::GET {
        return method_not_allowed();
    }
    let excluded = query_values(uri.query(), "exclude");
    let chosen: Vec<Check> = checks
        .iter()
        .copied()
        .filter(|c| !excluded.iter().any(|e| e == c.name()))
        .collect();
    let verbose = query_has(uri.query(), "verbose");
    answer(run(&s, kind, &chosen).await, verbose)
}

async fn one(
    State(s): State<HttpState>,
    method: Method,
    uri: OriginalUri,
    kind: &'static str,
    check: Check,
) -> Response {
    if method != Method::GET {
        return method_not_allowed();
    }
    let verbose = query_has(uri.query(), "verbose");
    answer(run(&s, kind, &[check]).await, verbose)
}

/// The checks' output lines, and whether all passed.
async fn run(s: &HttpState, kind: &'static str, checks: &[Check]) -> (String, bool) {
    let mut out = String::new();
    let mut passed = true;
    for check in checks {
        let result = check.run(s).await;
        record(kind, check.name(), result.is_ok());
        match result {
            Ok(()) => out.push_str(&format!("[+]{} ok\n", check.name())),
            Err(e) => {
                passed = false;
                out.push_str(&format!("[-]{} failed: {e}\n", check.name()));
            }
        }
    }
    (out, passed)
}

fn record(kind: &'static str, name: &'static str, ok: bool) {
    let server = &metrics::global().server;
    let labels = vec![("type", kind.to_string()), ("name", name.to_string())];
    server.healthcheck.get_or_create(&labels).set(i64::from(ok));
    let mut counted = labels;
    counted.push(("status", if ok { "success" } else { "error" }.to_string()));
    server.healthchecks.get_or_create(&counted).inc();
}

fn answer((lines, passed): (String, bool), verbose: bool) -> Response {
    if !passed {
        return go_http_error(StatusCode::SERVICE_UNAVAILABLE, &lines);
    }
    let body = if verbose {
        format!("{lines}ok\n")
    } else {
        "ok\n".to_string()
    };
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(TEXT_PLAIN));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}
