//! `/metrics`: the process's registry in the Prometheus text format, after
//! setting the gauges that describe state rather than count events from
//! that state (leadership, Raft indexes, database size, live keys).

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use openraft::async_runtime::WatchReceiver as _;

use super::HttpState;
use crate::metrics::{self, exposition};

/// `/metrics` (any method, as promhttp).
pub async fn metrics(State(s): State<HttpState>) -> Response {
    refresh(&s);
    let body = exposition::encode(metrics::global().registry());
    let mut r = (StatusCode::OK, body).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(exposition::CONTENT_TYPE),
    );
    r
}

/// Sets the state gauges from this member.
pub fn refresh(s: &HttpState) {
    let m = metrics::global();
    m.server
        .has_leader
        .set(i64::from(s.leadership.has_leader()));
    m.server.is_leader.set(i64::from(s.leadership.is_leader()));
    m.server
        .is_learner
        .set(i64::from(s.leadership.is_learner()));
    let (committed, applied) = raft_indexes(s);
    m.server.proposals_committed.set(committed as i64);
    m.server.proposals_applied.set(applied as i64);
    let engine = s.core.mvcc.engine();
    m.mvcc.db_total_size.set(engine.size_bytes() as i64);
    m.mvcc
        .db_total_size_in_use
        .set(engine.size_in_use_bytes() as i64);
    // Kept by the index: counting a million keys took ~100 ms under the
    // store's read lock at every scrape.
    m.mvcc.keys.set(s.core.mvcc.live_keys() as i64);
    refresh_membership_and_alarms(s);
}

/// etcd 3.6's `etcd_network_known_peers` (this member and every member it
/// knows, hex ids) and `etcd_debugging_server_alarms` (each raised alarm).
fn refresh_membership_and_alarms(s: &HttpState) {
    let m = metrics::global();
    let me = format!("{:x}", s.core.config.member_id);
    m.network.known_peers.clear();
    for id in s.core.member_ids() {
        let labels = vec![("Local", me.clone()), ("Remote", format!("{id:x}"))];
        m.network.known_peers.get_or_create(&labels).set(1);
    }
    m.server.alarms.clear();
    for a in crate::alarm::alarms(s.core.mvcc.engine().as_ref()).unwrap_or_default() {
        let kind = etcd_proto::etcdserverpb::AlarmType::try_from(a.alarm)
            .map(|t| t.as_str_name().to_string())
            .unwrap_or_else(|_| a.alarm.to_string());
        let labels = vec![
            ("server_id", format!("{:x}", a.member_id)),
            ("alarm_type", kind),
        ];
        m.server.alarms.get_or_create(&labels).set(1);
    }
}

/// Raft's (commit, applied) indexes as this member knows them: openraft's
/// local commit index (what this member knows to be committed and may
/// apply) and its applied index.
fn raft_indexes(s: &HttpState) -> (u64, u64) {
    let m = s.core.raft.metrics().borrow_watched().clone();
    let applied = m.last_applied.map_or(0, |l| l.index);
    let committed = m.local_committed.map_or(0, |l| l.index);
    (committed.max(applied), applied)
}
