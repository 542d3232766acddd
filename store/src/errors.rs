//! etcd's wire errors: the one table of gRPC code + byte-exact message.
//!
//! etcd clients match errors by their message text (clientv3's
//! `rpctypes.Error` compares `ErrorDesc(err)`), so every message here is
//! exactly etcd 3.5's `api/v3rpc/rpctypes` string. Everything inside the store
//! returns typed errors; conversion to [`tonic::Status`] happens only at the
//! gRPC edge, through [`EtcdError::to_status`].
//!
//! The enum is serializable because apply-time errors (for example
//! `LeaseNotFound` found while applying a Put) are decided on the leader's
//! state machine and travel back to a follower that forwarded the write.

use serde::{Deserialize, Serialize};
use tonic::Code;

/// Every error etcd returns to clients, by etcd's own name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[allow(missing_docs)]
pub enum EtcdError {
    // Request validation.
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    #[error("etcdserver: key not found")]
    KeyNotFound,
    #[error("etcdserver: value is provided")]
    ValueProvided,
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    #[error("etcdserver: invalid sort option")]
    InvalidSortOption,
    #[error("etcdserver: request is too large")]
    RequestTooLarge,
    #[error("etcdserver: too many requests")]
    TooManyRequests,

    // MVCC.
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted,
    #[error("etcdserver: mvcc: required revision is a future revision")]
    FutureRev,
    #[error("etcdserver: mvcc: database space exceeded")]
    NoSpace,

    // Lease.
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    #[error("etcdserver: lease already exists")]
    LeaseExist,
    #[error("etcdserver: too large lease TTL")]
    LeaseTtlTooLarge,

    // Watch.
    #[error("etcdserver: watch canceled")]
    WatchCanceled,

    // Cluster membership.
    #[error("etcdserver: member ID already exist")]
    MemberExist,
    #[error("etcdserver: Peer URLs already exists")]
    PeerUrlExist,
    #[error("etcdserver: re-configuration failed due to not enough started members")]
    MemberNotEnoughStarted,
    #[error("etcdserver: given member URLs are invalid")]
    MemberBadUrls,
    #[error("etcdserver: member not found")]
    MemberNotFound,
    #[error("etcdserver: can only promote a learner member")]
    MemberNotLearner,
    #[error("etcdserver: can only promote a learner member which is in sync with leader")]
    LearnerNotReady,
    #[error("etcdserver: too many learner members in cluster")]
    TooManyLearners,

    // Auth.
    #[error("etcdserver: root user does not exist")]
    RootUserNotExist,
    #[error("etcdserver: root user does not have root role")]
    RootRoleNotExist,
    #[error("etcdserver: user name already exists")]
    UserAlreadyExist,
    #[error("etcdserver: user name is empty")]
    UserEmpty,
    #[error("etcdserver: user name not found")]
    UserNotFound,
    #[error("etcdserver: role name already exists")]
    RoleAlreadyExist,
    #[error("etcdserver: role name not found")]
    RoleNotFound,
    #[error("etcdserver: role name is empty")]
    RoleEmpty,
    #[error("etcdserver: authentication failed, invalid user ID or password")]
    AuthFailed,
    #[error("etcdserver: permission denied")]
    PermissionDenied,
    #[error("etcdserver: role is not granted to the user")]
    RoleNotGranted,
    #[error("etcdserver: permission is not granted to the role")]
    PermissionNotGranted,
    #[error("etcdserver: authentication is not enabled")]
    AuthNotEnabled,
    #[error("etcdserver: invalid auth token")]
    InvalidAuthToken,
    #[error("etcdserver: invalid auth management")]
    InvalidAuthMgmt,
    #[error("etcdserver: permission not given")]
    PermissionNotGiven,
    /// etcd 3.5.1 does not convert this auth error to its gRPC form
    /// (`etcdserver: revision of auth store is old`): clients get the raw
    /// text with code Unknown.
    #[error("auth: revision in header is old")]
    AuthOldRevision,

    // etcd's auth package errors that reach clients unconverted (code
    // Unknown): the maintenance server's admin check returns them as they
    // are, and Authenticate does for a user without password.
    #[error("auth: user name is empty")]
    RawUserEmpty,
    #[error("auth: user not found")]
    RawUserNotFound,
    #[error("auth: permission denied")]
    RawPermissionDenied,
    #[error("auth: invalid auth token")]
    RawInvalidAuthToken,
    #[error("auth: authentication failed, password was given for no password user")]
    NoPasswordUser,

    // Server state.
    #[error("etcdserver: no leader")]
    NoLeader,
    #[error("etcdserver: not leader")]
    NotLeader,
    #[error("etcdserver: leader changed")]
    LeaderChanged,
    #[error("etcdserver: not capable")]
    NotCapable,
    #[error("etcdserver: server stopped")]
    Stopped,
    #[error("etcdserver: request timed out")]
    Timeout,
    #[error("etcdserver: request timed out, possibly due to previous leader failure")]
    TimeoutDueToLeaderFail,
    #[error("etcdserver: request timed out, possibly due to connection lost")]
    TimeoutDueToConnectionLost,
    #[error("etcdserver: unhealthy cluster")]
    Unhealthy,
    #[error("etcdserver: corrupt cluster")]
    Corrupt,
    #[error("etcdserver: rpc not supported for learner")]
    NotSupportedForLearner,
    #[error("etcdserver: bad leader transferee")]
    BadLeaderTransferee,
    #[error("etcdserver: request timed out, leader transfer took too long")]
    LeaderTransferTimeout,

    // Downgrade.
    #[error("etcdserver: invalid downgrade target version")]
    InvalidDowngradeTargetVersion,
    #[error("etcdserver: wrong downgrade target version format")]
    WrongDowngradeVersionFormat,
    #[error("etcdserver: no inflight downgrade job")]
    NoInflightDowngrade,
    #[error("etcdserver: cluster has a downgrade job in progress")]
    DowngradeInProcess,
    #[error("etcdserver: cluster version not found during downgrade")]
    ClusterVersionUnavailable,
    #[error("etcdserver: unknown method")]
    UnknownMethod,

    // The Lock and Election services' own errors (etcd's `concurrency`
    // package and election server), sent as plain errors: code Unknown.
    #[error("election: not leader")]
    ElectionNotLeader,
    #[error("election: no leader")]
    ElectionNoLeader,
    #[error("\"leader\" field must be provided")]
    MissingLeaderKey,
    #[error("mutex: session is expired")]
    SessionExpired,
    #[error("lost watcher waiting for delete")]
    LostWatcher,

    // RangeStream (etcd 3.7; plain gRPC statuses, not rpctypes errors).
    #[error("RangeStream does not support custom sort orders")]
    RangeStreamSortOrder,
    #[error("RangeStream does not support revision filters")]
    RangeStreamRevisionFilters,
}

impl EtcdError {
    /// The gRPC status code etcd 3.5 sends with this error.
    pub fn code(self) -> Code {
        use EtcdError::*;
        match self {
            EmptyKey
            | KeyNotFound
            | ValueProvided
            | LeaseProvided
            | TooManyOps
            | DuplicateKey
            | InvalidSortOption
            | RequestTooLarge
            | MemberBadUrls
            | UserEmpty
            | RoleEmpty
            | AuthFailed
            | InvalidAuthMgmt
            | PermissionNotGiven
            | InvalidDowngradeTargetVersion
            | WrongDowngradeVersionFormat => Code::InvalidArgument,
            RawUserEmpty | RawUserNotFound | RawPermissionDenied | RawInvalidAuthToken
            | NoPasswordUser | UnknownMethod | AuthOldRevision => Code::Unknown,
            ElectionNotLeader | ElectionNoLeader | MissingLeaderKey | SessionExpired
            | LostWatcher => Code::Unknown,
            NoInflightDowngrade | DowngradeInProcess | ClusterVersionUnavailable => {
                Code::FailedPrecondition
            }
            // etcd maps ErrTooManyRequests to a client-side error value rather
            // than a gRPC status, so grpc-go sends it with code Unknown.
            TooManyRequests => Code::Unknown,
            Compacted | FutureRev | LeaseTtlTooLarge => Code::OutOfRange,
            NoSpace => Code::ResourceExhausted,
            LeaseNotFound | MemberNotFound => Code::NotFound,
            LeaseExist
            | MemberExist
            | PeerUrlExist
            | MemberNotEnoughStarted
            | MemberNotLearner
            | LearnerNotReady
            | TooManyLearners
            | RootUserNotExist
            | RootRoleNotExist
            | UserAlreadyExist
            | UserNotFound
            | RoleAlreadyExist
            | RoleNotFound
            | RoleNotGranted
            | PermissionNotGranted
            | AuthNotEnabled
            | NotLeader
            | BadLeaderTransferee => Code::FailedPrecondition,
            WatchCanceled => Code::Cancelled,
            PermissionDenied => Code::PermissionDenied,
            InvalidAuthToken => Code::Unauthenticated,
            NoLeader
            | LeaderChanged
            | NotCapable
            | Stopped
            | Timeout
            | TimeoutDueToLeaderFail
            | TimeoutDueToConnectionLost
            | Unhealthy
            | NotSupportedForLearner
            | LeaderTransferTimeout => Code::Unavailable,
            Corrupt => Code::DataLoss,
            RangeStreamSortOrder | RangeStreamRevisionFilters => Code::Unimplemented,
        }
    }

    /// The unconverted `auth:` error etcd's maintenance server returns for
    /// a failed admin check (other errors are returned as they are).
    pub fn raw_auth(self) -> Self {
        use EtcdError::*;
        match self {
            UserEmpty => RawUserEmpty,
            UserNotFound => RawUserNotFound,
            PermissionDenied => RawPermissionDenied,
            InvalidAuthToken => RawInvalidAuthToken,
            other => other,
        }
    }

    /// grpc-go's `status.Error(...).Error()` text for this error, as etcd
    /// puts it in a refused watch's `cancel_reason`.
    pub fn grpc_error_text(self) -> String {
        format!("rpc error: code = {:?} desc = {self}", self.code())
    }

    /// The status sent on the wire: etcd's code and byte-exact message.
    pub fn to_status(self) -> tonic::Status {
        tonic::Status::new(self.code(), self.to_string())
    }
}

impl From<EtcdError> for tonic::Status {
    fn from(e: EtcdError) -> Self {
        e.to_status()
    }
}

/// etcd's watch cancel reasons that are mvcc's own texts rather than gRPC
/// errors, byte for byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WatchCancelReason {
    /// A client-chosen watch id already in use on the stream.
    #[error("mvcc: duplicate watch ID provided on the WatchStream")]
    DuplicateId,
    /// `range_end` at or before `key`.
    #[error("mvcc: watcher range is empty")]
    EmptyRange,
}

/// grpc-go's text for a message over the server's receive limit. etcd sets
/// that limit to `--max-request-bytes` + [`crate::limits::GRPC_OVERHEAD_BYTES`];
/// clients see this exact text with code `ResourceExhausted`.
pub fn grpc_message_too_large(found_bytes: usize, limit_bytes: usize) -> tonic::Status {
    tonic::Status::new(
        Code::ResourceExhausted,
        format!("grpc: received message larger than max ({found_bytes} vs. {limit_bytes})"),
    )
}

/// grpc-go's text for an answer over the server's send limit, which etcd
/// sets to `math.MaxInt32` ([`crate::limits::MAX_SEND_BYTES`]); clients
/// see this exact text with code `ResourceExhausted`.
pub fn grpc_answer_too_large(found_bytes: usize, limit_bytes: usize) -> tonic::Status {
    tonic::Status::new(
        Code::ResourceExhausted,
        format!("grpc: trying to send message larger than max ({found_bytes} vs. {limit_bytes})"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancel_reasons_read_like_grpc_go_errors() {
        assert_eq!(
            EtcdError::PermissionDenied.grpc_error_text(),
            "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
        );
        assert_eq!(
            EtcdError::InvalidAuthToken.grpc_error_text(),
            "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"
        );
    }

    #[test]
    fn messages_and_codes_match_etcd() {
        let cases = [
            (
                EtcdError::Compacted,
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            (
                EtcdError::FutureRev,
                Code::OutOfRange,
                "etcdserver: mvcc: required revision is a future revision",
            ),
            (
                EtcdError::NoLeader,
                Code::Unavailable,
                "etcdserver: no leader",
            ),
            (
                EtcdError::TooManyOps,
                Code::InvalidArgument,
                "etcdserver: too many operations in txn request",
            ),
            (
                EtcdError::LeaseNotFound,
                Code::NotFound,
                "etcdserver: requested lease not found",
            ),
            (
                EtcdError::NoSpace,
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            (
                EtcdError::AuthOldRevision,
                Code::Unknown,
                "auth: revision in header is old",
            ),
            (
                EtcdError::PermissionDenied.raw_auth(),
                Code::Unknown,
                "auth: permission denied",
            ),
            (
                EtcdError::PermissionDenied,
                Code::PermissionDenied,
                "etcdserver: permission denied",
            ),
            (
                EtcdError::BadLeaderTransferee,
                Code::FailedPrecondition,
                "etcdserver: bad leader transferee",
            ),
            (
                EtcdError::LeaderTransferTimeout,
                Code::Unavailable,
                "etcdserver: request timed out, leader transfer took too long",
            ),
            (
                EtcdError::TooManyRequests,
                Code::Unknown,
                "etcdserver: too many requests",
            ),
            (
                EtcdError::MissingLeaderKey,
                Code::Unknown,
                "\"leader\" field must be provided",
            ),
            (
                EtcdError::SessionExpired,
                Code::Unknown,
                "mutex: session is expired",
            ),
        ];
        for (err, code, msg) in cases {
            let status = err.to_status();
            assert_eq!(status.code(), code, "{err:?}");
            assert_eq!(status.message(), msg, "{err:?}");
        }
    }
}
