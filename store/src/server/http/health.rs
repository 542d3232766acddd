//! `/health` as etcd 3.5 answers it, and the checks it shares with
//! `/livez` and `/readyz` ([`super::probes`]).
//!
//! In order, the first failure wins:
//! 1. an alarm not named by `?exclude=` (repeatable): `ALARM NOSPACE`,
//!    `ALARM CORRUPT`;
//! 2. unless `?serializable=true`: no leader, `RAFT NO LEADER`, answered
//!    at once from this member's view ([`Leadership`](crate::raft::leadership::Leadership));
//! 3. a one-key range, linearizable unless `?serializable=true`:
//!    `RANGE ERROR:<error>`.
//!
//! Healthy: 200 `{"health":"true","reason":""}` as plain text; unhealthy:
//! 503 with the JSON and a newline (Go's `http.Error`). etcd 3.5.1 also
//! required a leader for `serializable=true`; 3.5.13+ (and this store) do
//! not, so a liveness probe does not depend on the cluster.

use axum::extract::{OriginalUri, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use etcd_proto::etcdserverpb::AlarmType;
use serde::Serialize;

use super::{go_http_error, method_not_allowed, query_values, HttpState, TEXT_PLAIN};
use crate::alarm::alarms;
use crate::errors::EtcdError;
use crate::mvcc::{KeyRange, RangeOptions};

/// etcd's `/health` body.
#[derive(Serialize)]
struct Health<'a> {
    health: &'a str,
    reason: &'a str,
}

/// `/health`.
pub async fn health(State(s): State<HttpState>, method: Method, uri: OriginalUri) -> Response {
    if method != Method::GET {
        return method_not_allowed();
    }
    let query = uri.query();
    let excluded = query_values(query, "exclude");
    let serializable = query_values(query, "serializable")
        .first()
        .map(String::as_str)
        == Some("true");
    match check(&s, &excluded, serializable).await {
        Ok(()) => healthy(),
        Err(reason) => unhealthy(&reason),
    }
}

async fn check(s: &HttpState, excluded: &[String], serializable: bool) -> Result<(), String> {
    if let Some(alarm) = raised_alarm(s, excluded)? {
        return Err(format!("ALARM {alarm}"));
    }
    if !serializable && !s.leadership.has_leader() {
        return Err("RAFT NO LEADER".to_string());
    }
    read(s, serializable)
        .await
        .map_err(|e| format!("RANGE ERROR:{e}"))
}

fn body(health: &str, reason: &str) -> String {
    serde_json::to_string(&Health { health, reason }).unwrap_or_default()
}

fn healthy() -> Response {
    let mut r = (StatusCode::OK, body("true", "")).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(TEXT_PLAIN));
    r
}

fn unhealthy(reason: &str) -> Response {
    go_http_error(StatusCode::SERVICE_UNAVAILABLE, &body("false", reason))
}

/// The name etcd's health answer gives the first raised alarm not in
/// `excluded` (`NOSPACE`, `CORRUPT`, `UNKNOWN`).
pub fn raised_alarm(s: &HttpState, excluded: &[String]) -> Result<Option<&'static str>, String> {
    let raised = alarms(s.core.mvcc.engine().as_ref()).map_err(|e| e.to_string())?;
    for a in raised {
        let kind = AlarmType::try_from(a.alarm).unwrap_or(AlarmType::None);
        if excluded.iter().any(|e| e == kind.as_str_name()) {
            continue;
        }
        return Ok(Some(match kind {
            AlarmType::Nospace => "NOSPACE",
            AlarmType::Corrupt => "CORRUPT",
            AlarmType::None => "UNKNOWN",
        }));
    }
    Ok(None)
}

/// True if `alarm` is raised (by any member).
pub fn alarm_raised(s: &HttpState, alarm: AlarmType) -> Result<bool, String> {
    let raised = alarms(s.core.mvcc.engine().as_ref()).map_err(|e| e.to_string())?;
    Ok(raised.iter().any(|a| a.alarm == alarm as i32))
}

/// etcd's health read: a keys-only range of one key, linearizable (after
/// a read barrier, which needs a leader) unless `serializable`.
pub async fn read(s: &HttpState, serializable: bool) -> Result<(), String> {
    if !serializable {
        if !s.leadership.has_leader() {
            return Err(EtcdError::NoLeader.to_string());
        }
        // A leader whose quorum is gone keeps re-sending its ReadIndex until
        // the request timeout (as etcd); the check instead says "no leader"
        // as soon as the leadership lapses, as the leader check above would.
        let barrier = tokio::select! {
            r = s.core.read_barrier() => r,
            () = s.leadership.until_leaderless() => Err(EtcdError::NoLeader),
        };
        if let Err(e) = barrier {
            if !s.leadership.has_leader() {
                return Err(EtcdError::NoLeader.to_string());
            }
            return Err(e.to_string());
        }
    }
    let opts = RangeOptions {
        limit: 1,
        ..Default::default()
    };
    s.core
        .mvcc
        .range(&KeyRange::Single(Vec::new()), opts)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_etcds() {
        assert_eq!(body("true", ""), r#"{"health":"true","reason":""}"#);
        assert_eq!(
            body("false", "RAFT NO LEADER"),
            r#"{"health":"false","reason":"RAFT NO LEADER"}"#
        );
    }
}
