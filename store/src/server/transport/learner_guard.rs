//! What a learner serves: etcd's gRPC interceptors refuse every call to a
//! member that is a learner with `etcdserver: rpc not supported for
//! learner` (UNAVAILABLE), except Status, a serializable Range
//! (`isRPCSupportedForLearner`) and the Snapshot stream. The refusal comes
//! before anything else looks at the call, so a refused call is not
//! counted in the `grpc_server_*` metrics either.
//!
//! Here the path decides ([`refused_for_learner`]), before the call's body
//! is read; Range's `serializable` flag is in its body, so the KV service
//! checks it ([`crate::server::v3rpc::kv`]).
//!
//! Example: on a learner, `/etcdserverpb.KV/Put`, `/etcdserverpb.Watch/Watch`
//! and `/etcdserverpb.Cluster/MemberList` are refused here;
//! `/etcdserverpb.Maintenance/Status` and `/etcdserverpb.Maintenance/Snapshot`
//! pass, and so does `/etcdserverpb.KV/Range`, which the KV service refuses
//! unless serializable.

use axum::body::Body;
use axum::http::Response;

use crate::errors::EtcdError;

/// The methods a learner serves whatever their request (Range: see the
/// module docs).
const SERVED_BY_A_LEARNER: [&str; 3] = [
    "/etcdserverpb.Maintenance/Status",
    "/etcdserverpb.Maintenance/Snapshot",
    "/etcdserverpb.KV/Range",
];

/// True if a learner refuses the call at `path` whatever its request.
pub fn refused_for_learner(path: &str) -> bool {
    !SERVED_BY_A_LEARNER.contains(&path)
}

/// A learner's refusal, as a gRPC answer with no message.
pub fn refusal() -> Response<Body> {
    let (parts, ()) = tonic::Status::from(EtcdError::NotSupportedForLearner)
        .into_http::<()>()
        .into_parts();
    Response::from_parts(parts, Body::empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_learner_serves_status_snapshot_and_range_only() {
        for served in SERVED_BY_A_LEARNER {
            assert!(!refused_for_learner(served), "{served}");
        }
        for refused in [
            "/etcdserverpb.KV/Put",
            "/etcdserverpb.KV/Txn",
            "/etcdserverpb.KV/RangeStream",
            "/etcdserverpb.Watch/Watch",
            "/etcdserverpb.Lease/LeaseKeepAlive",
            "/etcdserverpb.Cluster/MemberList",
            "/etcdserverpb.Maintenance/HashKV",
            "/v3lockpb.Lock/Lock",
            "/grpc.health.v1.Health/Check",
        ] {
            assert!(refused_for_learner(refused), "{refused}");
        }
        let answer = refusal();
        let status = tonic::Status::from_header_map(answer.headers()).expect("a status");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(
            status.message(),
            "etcdserver: rpc not supported for learner"
        );
    }
}
