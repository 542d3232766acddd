//! The gRPC methods etcd serves, their stream types, and their counters.

use std::collections::HashMap;
use std::sync::{LazyLock, OnceLock};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::metrics::{self, Labels};

/// gRPC status codes by number, named as grpc-go's `codes.Code.String()`.
pub const GRPC_CODES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// Index of `Canceled` in [`GRPC_CODES`].
pub const CANCELED: usize = 1;
/// Index of `Unknown` in [`GRPC_CODES`].
pub const UNKNOWN: usize = 2;

/// The name of code `n` (`Code(n)` past the known ones, as grpc-go).
pub fn code_name(n: usize) -> String {
    GRPC_CODES
        .get(n)
        .map_or_else(|| format!("Code({n})"), |s| s.to_string())
}

/// `(service, method, grpc_type)` of every method etcd registers.
const METHODS: &[(&str, &str, &str)] = &[
    ("etcdserverpb.KV", "Range", "unary"),
    // etcd 3.7.
    ("etcdserverpb.KV", "RangeStream", "server_stream"),
    ("etcdserverpb.KV", "Put", "unary"),
    ("etcdserverpb.KV", "DeleteRange", "unary"),
    ("etcdserverpb.KV", "Txn", "unary"),
    ("etcdserverpb.KV", "Compact", "unary"),
    ("etcdserverpb.Watch", "Watch", "bidi_stream"),
    ("etcdserverpb.Lease", "LeaseGrant", "unary"),
    ("etcdserverpb.Lease", "LeaseRevoke", "unary"),
    ("etcdserverpb.Lease", "LeaseKeepAlive", "bidi_stream"),
    ("etcdserverpb.Lease", "LeaseTimeToLive", "unary"),
    ("etcdserverpb.Lease", "LeaseLeases", "unary"),
    ("etcdserverpb.Cluster", "MemberAdd", "unary"),
    ("etcdserverpb.Cluster", "MemberRemove", "unary"),
    ("etcdserverpb.Cluster", "MemberUpdate", "unary"),
    ("etcdserverpb.Cluster", "MemberList", "unary"),
    ("etcdserverpb.Cluster", "MemberPromote", "unary"),
    ("etcdserverpb.Maintenance", "Alarm", "unary"),
    ("etcdserverpb.Maintenance", "Status", "unary"),
    ("etcdserverpb.Maintenance", "Defragment", "unary"),
    ("etcdserverpb.Maintenance", "Hash", "unary"),
    ("etcdserverpb.Maintenance", "HashKV", "unary"),
    ("etcdserverpb.Maintenance", "Snapshot", "server_stream"),
    ("etcdserverpb.Maintenance", "MoveLeader", "unary"),
    ("etcdserverpb.Maintenance", "Downgrade", "unary"),
    ("etcdserverpb.Auth", "AuthEnable", "unary"),
    ("etcdserverpb.Auth", "AuthDisable", "unary"),
    ("etcdserverpb.Auth", "AuthStatus", "unary"),
    ("etcdserverpb.Auth", "Authenticate", "unary"),
    ("etcdserverpb.Auth", "UserAdd", "unary"),
    ("etcdserverpb.Auth", "UserGet", "unary"),
    ("etcdserverpb.Auth", "UserList", "unary"),
    ("etcdserverpb.Auth", "UserDelete", "unary"),
    ("etcdserverpb.Auth", "UserChangePassword", "unary"),
    ("etcdserverpb.Auth", "UserGrantRole", "unary"),
    ("etcdserverpb.Auth", "UserRevokeRole", "unary"),
    ("etcdserverpb.Auth", "RoleAdd", "unary"),
    ("etcdserverpb.Auth", "RoleGet", "unary"),
    ("etcdserverpb.Auth", "RoleList", "unary"),
    ("etcdserverpb.Auth", "RoleDelete", "unary"),
    ("etcdserverpb.Auth", "RoleGrantPermission", "unary"),
    ("etcdserverpb.Auth", "RoleRevokePermission", "unary"),
    ("grpc.health.v1.Health", "Check", "unary"),
    ("grpc.health.v1.Health", "Watch", "server_stream"),
];

/// Methods etcd registers after its gRPC metrics are set up (the Lock and
/// Election services): their rows appear at their first call, a code's row
/// at its first answer and the message rows at their first message, as
/// go-grpc-prometheus counts them.
const LATE_METHODS: &[(&str, &str, &str)] = &[
    ("v3lockpb.Lock", "Lock", "unary"),
    ("v3lockpb.Lock", "Unlock", "unary"),
    ("v3electionpb.Election", "Campaign", "unary"),
    ("v3electionpb.Election", "Proclaim", "unary"),
    ("v3electionpb.Election", "Leader", "unary"),
    ("v3electionpb.Election", "Observe", "server_stream"),
    ("v3electionpb.Election", "Resign", "unary"),
];

/// One method's counters.
pub struct MethodCounters {
    /// `grpc_server_started_total` for the method.
    pub started: Counter,
    /// `grpc_server_handled_total` for the method, by code number.
    handled: Vec<Row>,
    /// `grpc_server_msg_received_total` for the method.
    received: Row,
    /// `grpc_server_msg_sent_total` for the method.
    sent: Row,
    /// The method takes one request message (unary, server-streaming).
    pub one_request_message: bool,
}

/// One counter row: made up front (a registered method's, listed at zero)
/// or at its first increment (a late method's, as go-grpc-prometheus makes
/// the rows of methods registered after it).
enum Row {
    Made(Counter),
    Late(Labels),
}

impl Row {
    fn new(family: &Family<Labels, Counter>, labels: Labels, late: bool) -> Self {
        if late {
            Row::Late(labels)
        } else {
            Row::Made(family.get_or_create_owned(&labels))
        }
    }

    fn inc_by(&self, family: &Family<Labels, Counter>, n: u64) {
        match self {
            Row::Made(counter) => {
                counter.inc_by(n);
            }
            Row::Late(labels) => {
                family.get_or_create(labels).inc_by(n);
            }
        }
    }
}

impl MethodCounters {
    /// Counts the end of a call with code number `code`.
    pub fn handled(&self, code: usize) {
        let code = if code < GRPC_CODES.len() {
            code
        } else {
            UNKNOWN
        };
        self.handled[code].inc_by(&metrics::global().grpc.handled, 1);
    }

    /// Counts `n` request messages received.
    pub fn received(&self, n: u64) {
        self.received
            .inc_by(&metrics::global().grpc.msg_received, n);
    }

    /// Counts `n` response messages sent.
    pub fn sent(&self, n: u64) {
        self.sent.inc_by(&metrics::global().grpc.msg_sent, n);
    }
}

fn counters(service: &str, method: &str, kind: &str, late: bool) -> MethodCounters {
    let grpc = &metrics::global().grpc;
    let labels: Labels = vec![
        ("grpc_method", method.to_string()),
        ("grpc_service", service.to_string()),
        ("grpc_type", kind.to_string()),
    ];
    let handled = GRPC_CODES
        .iter()
        .map(|code| {
            let mut l = vec![("grpc_code", code.to_string())];
            l.extend(labels.iter().cloned());
            Row::new(&grpc.handled, l, late)
        })
        .collect();
    MethodCounters {
        started: grpc.started.get_or_create_owned(&labels),
        handled,
        received: Row::new(&grpc.msg_received, labels.clone(), late),
        sent: Row::new(&grpc.msg_sent, labels, late),
        one_request_message: matches!(kind, "unary" | "server_stream"),
    }
}

static TABLE: LazyLock<HashMap<String, &'static MethodCounters>> = LazyLock::new(|| {
    METHODS
        .iter()
        .map(|(service, method, kind)| {
            let c: &'static MethodCounters =
                Box::leak(Box::new(counters(service, method, kind, false)));
            (format!("/{service}/{method}"), c)
        })
        .collect()
});

/// The late methods' counters, each made at its method's first call.
type LateTable = HashMap<
    String,
    (
        &'static (&'static str, &'static str, &'static str),
        OnceLock<MethodCounters>,
    ),
>;

static LATE_TABLE: LazyLock<LateTable> = LazyLock::new(|| {
    LATE_METHODS
        .iter()
        .map(|m| (format!("/{}/{}", m.0, m.1), (m, OnceLock::new())))
        .collect()
});

/// The counters of the method at `path` (`/etcdserverpb.KV/Range`).
pub fn lookup(path: &str) -> Option<&'static MethodCounters> {
    if let Some(c) = TABLE.get(path) {
        return Some(c);
    }
    let ((service, method, kind), counters_of) = LATE_TABLE.get(path)?;
    Some(counters_of.get_or_init(|| counters(service, method, kind, true)))
}

/// True if the method at `path` takes one request message (etcd's unary
/// and server-streaming methods), so its request body may end after it
/// (see `server::frame_limit`).
pub fn one_request_message(path: &str) -> bool {
    lookup(path).is_some_and(|c| c.one_request_message)
}

/// Creates every method's counters now, so the families list them (at
/// zero) before the first call.
pub fn preregister() {
    LazyLock::force(&TABLE);
}
