//! Malformed protobuf, differentially (issue 14): seeded mutations of valid
//! requests of the KV, Lease, Auth (users and roles), Maintenance (Status,
//! Alarm, HashKV) and Cluster (MemberList) services (truncated, bytes overwritten, tags and
//! unknown fields inserted, lengths made huge or negative) sent as raw gRPC
//! to etcd 3.5.1 and to the candidate (one member each, the same requests
//! in the same order). Each answer's gRPC code and message must be the same: a request
//! that does not parse gets gogo/protobuf's words through grpc-go's
//! `grpc: error unmarshalling request: ...`, one that parses gets the same
//! verdict. The bodies of successful answers are compared by
//! `fuzz_differential.rs` (same semantics); here only the verdict.
//!
//! Deliberate differences, requests that crash etcd 3.5.1 (one request
//! stops the member); they go to the candidate only, which must answer as
//! shown ([`crashes_etcd`]):
//! - a range (alone or in a Txn) whose `sort_order` or `sort_target` is not
//!   a value of its enum. etcd 3.5.1 sorts by an unknown order as if
//!   unsorted and crashes on an unknown target (a nil sorter,
//!   `sort.Sort(nil)` in `applierV3backend.Range`); later etcd releases
//!   refuse both with `etcdserver: invalid sort option`, as the candidate
//!   does;
//! - an alarm request whose `action` is not GET, ACTIVATE or DEACTIVATE:
//!   etcd's applier answers it with no response and the gRPC handler
//!   dereferences it (`v3rpc/maintenance.go:208`, nil pointer). The
//!   candidate answers it as a GET of nothing: OK with no alarms.
//!
//! Requests that would make the two sides differ by timing, not by
//! semantics, are not sent: a lease grant that parses with a TTL under
//! [`MIN_LEASE_TTL_SECONDS`] (the lease could expire on one side between
//! two later requests and not yet on the other). Nor is an Auth request
//! whose `string` field (a name, a password) is not UTF-8 after mangling:
//! gogo accepts it, prost refuses it (an open difference). Auth requests
//! manage users and roles with auth disabled; enabling it is `auth.rs`'s.
//!
//! The two client-streaming services, Watch and LeaseKeepAlive, get the same
//! treatment message by message ([`run_stream_seed`]): a stream carries a few
//! valid messages, some of them mangled, then a valid sentinel whose answer is
//! known; the answers up to the sentinel's (or the stream's end, with its
//! status) must be the same on both sides. A message that does not parse ends
//! an etcd stream with grpc-go's `grpc: failed to unmarshal the received
//! message` and gogo's error; watches stay on keys nobody writes, so every
//! answer comes from the stream's own requests, in their order. One timing
//! difference is allowed ([`same_stream_outcome`]): etcd may drop answers it
//! had not sent yet when such a message ends the stream; the candidate sends
//! them first.

use bytes::{Buf, BufMut};
use std::time::Duration;

use etcd_proto::authpb::{Permission, UserAddOptions};
use etcd_proto::etcdserverpb::{
    alarm_request, compare, range_request, request_op, watch_request, AlarmRequest,
    AuthRoleAddRequest, AuthRoleDeleteRequest, AuthRoleGetRequest, AuthRoleGrantPermissionRequest,
    AuthRoleListRequest, AuthRoleRevokePermissionRequest, AuthStatusRequest, AuthUserAddRequest,
    AuthUserDeleteRequest, AuthUserGetRequest, AuthUserGrantRoleRequest, AuthUserListRequest,
    AuthUserRevokeRoleRequest, AuthenticateRequest, Compare, DeleteRangeRequest, HashKvRequest,
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseLeasesRequest,
    LeaseRevokeRequest, LeaseTimeToLiveRequest, MemberListRequest, PutRequest, RangeRequest,
    RequestOp, StatusRequest, TxnRequest, WatchCancelRequest, WatchCreateRequest,
    WatchProgressRequest, WatchRequest, WatchResponse,
};
use integration_tests::Differential;
use prost::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Seeds CI runs (`FUZZ_SEED`/`FUZZ_SEEDS` choose others, see
/// `integration_tests::differential::fuzz_seeds`).
const CI_SEEDS: [u64; 2] = [1, 2];
/// Requests per seed.
const REQUESTS_PER_SEED: usize = 300;
/// Mutations applied to one valid request, at most.
const MAX_MUTATIONS: usize = 3;
/// The lease ids valid requests name (a grant with id 0 gets a random one).
const LEASE_IDS: std::ops::RangeInclusive<i64> = 1..=3;
/// The TTLs of valid grants: longer than any run.
const LEASE_TTL_SECONDS: std::ops::Range<i64> = 600..3_600;
/// Grants that parse with a shorter TTL are not sent (see the module docs).
const MIN_LEASE_TTL_SECONDS: i64 = 60;

/// Streams per seed of the stream test (Watch and LeaseKeepAlive alternate).
const STREAMS_PER_SEED: usize = 60;
/// Messages one stream carries before its sentinel, at most.
const MAX_STREAM_MESSAGES: usize = 4;
/// Longest wait for a stream's sentinel answer or its end.
const STREAM_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// The watch id of the create request that ends every watch stream's
/// messages: valid requests use ids 0-3, so its answer is its own.
const SENTINEL_WATCH_ID: i64 = 1_000;
/// The lease every keep-alive stream's last message renews: never granted,
/// so both sides answer it with a TTL of 0.
const SENTINEL_LEASE_ID: i64 = 999_999;
/// TTL of the leases the keep-alive streams renew: longer than any run.
const KEPT_ALIVE_TTL_SECONDS: i64 = 3_600;

/// Sends bytes as they are; answers the bytes received.
#[derive(Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// One raw unary call: the code and message of the answer.
async fn call(channel: &Channel, path: &'static str, body: Vec<u8>) -> (Code, String) {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("channel ready");
    let answer = grpc
        .unary(
            tonic::Request::new(body),
            PathAndQuery::from_static(path),
            RawCodec,
        )
        .await;
    match answer {
        Ok(_) => (Code::Ok, String::new()),
        Err(status) => (status.code(), status.message().to_string()),
    }
}

/// A valid request: its method path and encoding. Four in seven are KV
/// requests.
fn valid_request(rng: &mut StdRng) -> (&'static str, Vec<u8>) {
    match rng.gen_range(0..7) {
        0 => lease_request(rng),
        1 => other_request(rng),
        2 => auth_request(rng),
        _ => kv_request(rng),
    }
}

/// Users and roles of the auth requests, a few names so that requests meet
/// what earlier ones created.
fn auth_name(rng: &mut StdRng, kind: &str) -> String {
    format!("{kind}{}", rng.gen_range(0..3))
}

/// An auth-management request (auth stays disabled: enabling it would
/// change every later answer, and is tested in `auth.rs`). Adding a user
/// hashes its password with bcrypt on both sides, so one in twelve of these
/// is an add.
fn auth_request(rng: &mut StdRng) -> (&'static str, Vec<u8>) {
    let user = |rng: &mut StdRng| auth_name(rng, "u");
    let role = |rng: &mut StdRng| auth_name(rng, "r");
    match rng.gen_range(0..12) {
        0 => (
            "/etcdserverpb.Auth/UserAdd",
            AuthUserAddRequest {
                name: user(rng),
                password: "pw".into(),
                options: Some(UserAddOptions {
                    no_password: rng.gen_bool(0.3),
                }),
                hashed_password: String::new(),
            }
            .encode_to_vec(),
        ),
        1 => (
            "/etcdserverpb.Auth/UserGet",
            AuthUserGetRequest { name: user(rng) }.encode_to_vec(),
        ),
        2 => (
            "/etcdserverpb.Auth/UserDelete",
            AuthUserDeleteRequest { name: user(rng) }.encode_to_vec(),
        ),
        3 => (
            "/etcdserverpb.Auth/UserGrantRole",
            AuthUserGrantRoleRequest {
                user: user(rng),
                role: role(rng),
            }
            .encode_to_vec(),
        ),
        4 => (
            "/etcdserverpb.Auth/UserRevokeRole",
            AuthUserRevokeRoleRequest {
                name: user(rng),
                role: role(rng),
            }
            .encode_to_vec(),
        ),
        5 => (
            "/etcdserverpb.Auth/RoleAdd",
            AuthRoleAddRequest { name: role(rng) }.encode_to_vec(),
        ),
        6 => (
            "/etcdserverpb.Auth/RoleGet",
            AuthRoleGetRequest { role: role(rng) }.encode_to_vec(),
        ),
        7 => (
            "/etcdserverpb.Auth/RoleDelete",
            AuthRoleDeleteRequest { role: role(rng) }.encode_to_vec(),
        ),
        8 => ("/etcdserverpb.Auth/RoleGrantPermission", {
            let name = role(rng);
            let (key, range_end) = permission_range(rng);
            AuthRoleGrantPermissionRequest {
                name,
                perm: Some(Permission {
                    perm_type: rng.gen_range(0..3),
                    key,
                    range_end,
                }),
            }
            .encode_to_vec()
        }),
        9 => ("/etcdserverpb.Auth/RoleRevokePermission", {
            let role = role(rng);
            let (key, range_end) = permission_range(rng);
            AuthRoleRevokePermissionRequest {
                role,
                key,
                range_end,
            }
            .encode_to_vec()
        }),
        10 => (
            "/etcdserverpb.Auth/Authenticate",
            AuthenticateRequest {
                name: user(rng),
                password: "pw".into(),
            }
            .encode_to_vec(),
        ),
        _ => match rng.gen_range(0..3) {
            0 => (
                "/etcdserverpb.Auth/UserList",
                AuthUserListRequest {}.encode_to_vec(),
            ),
            1 => (
                "/etcdserverpb.Auth/RoleList",
                AuthRoleListRequest {}.encode_to_vec(),
            ),
            _ => (
                "/etcdserverpb.Auth/AuthStatus",
                AuthStatusRequest {}.encode_to_vec(),
            ),
        },
    }
}

/// A permission's key and range end: one of the fuzzer's keys, alone or
/// up to `kz`.
fn permission_range(rng: &mut StdRng) -> (Vec<u8>, Vec<u8>) {
    let key = format!("k{}", rng.gen_range(0..4)).into_bytes();
    let range_end = if rng.gen() {
        b"kz".to_vec()
    } else {
        Vec::new()
    };
    (key, range_end)
}

/// Whether `body` is an auth request that gogo parses and prost refuses
/// because a `string` field is not UTF-8 (see the module docs: an open
/// difference, not sent).
fn has_non_utf8_string(path: &str, body: &[u8]) -> bool {
    fn refused<M: Message + Default>(body: &[u8]) -> bool {
        matches!(
            etcd_proto::codec::decode::<M>(bytes::Bytes::copy_from_slice(body)),
            Err(reason) if reason.contains("UTF-8")
        )
    }
    match path {
        "/etcdserverpb.Auth/UserAdd" => refused::<AuthUserAddRequest>(body),
        "/etcdserverpb.Auth/UserGet" => refused::<AuthUserGetRequest>(body),
        "/etcdserverpb.Auth/UserDelete" => refused::<AuthUserDeleteRequest>(body),
        "/etcdserverpb.Auth/UserGrantRole" => refused::<AuthUserGrantRoleRequest>(body),
        "/etcdserverpb.Auth/UserRevokeRole" => refused::<AuthUserRevokeRoleRequest>(body),
        "/etcdserverpb.Auth/RoleAdd" => refused::<AuthRoleAddRequest>(body),
        "/etcdserverpb.Auth/RoleGet" => refused::<AuthRoleGetRequest>(body),
        "/etcdserverpb.Auth/RoleDelete" => refused::<AuthRoleDeleteRequest>(body),
        "/etcdserverpb.Auth/RoleGrantPermission" => refused::<AuthRoleGrantPermissionRequest>(body),
        "/etcdserverpb.Auth/RoleRevokePermission" => {
            refused::<AuthRoleRevokePermissionRequest>(body)
        }
        "/etcdserverpb.Auth/Authenticate" => refused::<AuthenticateRequest>(body),
        _ => false,
    }
}

fn kv_request(rng: &mut StdRng) -> (&'static str, Vec<u8>) {
    let key = |rng: &mut StdRng| format!("k{}", rng.gen_range(0..4)).into_bytes();
    match rng.gen_range(0..4) {
        0 => (
            "/etcdserverpb.KV/Range",
            RangeRequest {
                key: key(rng),
                range_end: if rng.gen() {
                    b"kz".to_vec()
                } else {
                    Vec::new()
                },
                limit: rng.gen_range(0..3),
                sort_order: rng.gen_range(0..3),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        1 => (
            "/etcdserverpb.KV/Put",
            PutRequest {
                key: key(rng),
                value: vec![b'v'; rng.gen_range(0..40)],
                prev_kv: rng.gen(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        2 => (
            "/etcdserverpb.KV/DeleteRange",
            DeleteRangeRequest {
                key: key(rng),
                prev_kv: rng.gen(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        _ => {
            let put = RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: key(rng),
                    value: b"t".to_vec(),
                    ..Default::default()
                })),
            };
            let compare = Compare {
                key: key(rng),
                result: rng.gen_range(0..4),
                target: 0,
                target_union: Some(compare::TargetUnion::Version(rng.gen_range(0..3))),
                ..Default::default()
            };
            (
                "/etcdserverpb.KV/Txn",
                TxnRequest {
                    compare: vec![compare],
                    success: vec![put],
                    failure: Vec::new(),
                }
                .encode_to_vec(),
            )
        }
    }
}

fn lease_request(rng: &mut StdRng) -> (&'static str, Vec<u8>) {
    let id = |rng: &mut StdRng| rng.gen_range(LEASE_IDS);
    match rng.gen_range(0..4) {
        0 => (
            "/etcdserverpb.Lease/LeaseGrant",
            LeaseGrantRequest {
                ttl: rng.gen_range(LEASE_TTL_SECONDS),
                id: if rng.gen_bool(0.2) { 0 } else { id(rng) },
            }
            .encode_to_vec(),
        ),
        1 => (
            "/etcdserverpb.Lease/LeaseRevoke",
            LeaseRevokeRequest { id: id(rng) }.encode_to_vec(),
        ),
        2 => (
            "/etcdserverpb.Lease/LeaseTimeToLive",
            LeaseTimeToLiveRequest {
                id: id(rng),
                keys: rng.gen(),
            }
            .encode_to_vec(),
        ),
        _ => (
            "/etcdserverpb.Lease/LeaseLeases",
            LeaseLeasesRequest {}.encode_to_vec(),
        ),
    }
}

/// Maintenance and Cluster requests that change nothing when valid (an
/// alarm request is a GET until mutated).
fn other_request(rng: &mut StdRng) -> (&'static str, Vec<u8>) {
    match rng.gen_range(0..4) {
        0 => (
            "/etcdserverpb.Maintenance/Status",
            StatusRequest {}.encode_to_vec(),
        ),
        1 => (
            "/etcdserverpb.Maintenance/Alarm",
            AlarmRequest::default().encode_to_vec(),
        ),
        2 => (
            "/etcdserverpb.Maintenance/HashKV",
            HashKvRequest {
                revision: rng.gen_range(0..30),
            }
            .encode_to_vec(),
        ),
        _ => (
            "/etcdserverpb.Cluster/MemberList",
            MemberListRequest {
                linearizable: rng.gen(),
            }
            .encode_to_vec(),
        ),
    }
}

/// `bytes` with one seeded change.
fn mutate(rng: &mut StdRng, bytes: &mut Vec<u8>) {
    let at = rng.gen_range(0..=bytes.len());
    match rng.gen_range(0..5) {
        0 => bytes.truncate(at),
        1 if !bytes.is_empty() => {
            let i = rng.gen_range(0..bytes.len());
            bytes[i] = rng.gen();
        }
        2 => {
            let inserted: Vec<u8> = (0..rng.gen_range(1..4)).map(|_| rng.gen()).collect();
            bytes.splice(at..at, inserted);
        }
        3 => {
            // An unknown field (number 100-199) of any wire type.
            let tag = (rng.gen_range(100u64..200) << 3) | rng.gen_range(0..8);
            let mut field = Vec::new();
            prost::encoding::encode_varint(tag, &mut field);
            field.extend((0..rng.gen_range(0..3)).map(|_| rng.gen::<u8>()));
            bytes.extend(field);
        }
        _ => {
            // A length (or any varint) made huge: ten bytes, the last set
            // so that it is negative as a Go int, or just long.
            let mut huge = vec![0xff; 9];
            huge.push(if rng.gen() { 0x01 } else { 0x7f });
            bytes.splice(at..at, huge);
        }
    }
}

/// Later etcd releases' (and the candidate's) refusal of a sort option
/// that is not a value of its enum.
const INVALID_SORT_OPTION: &str = "etcdserver: invalid sort option";

/// The candidate's answer to a request that crashes etcd 3.5.1 (see the
/// module docs), `None` for the others.
fn crashes_etcd(path: &str, body: &[u8]) -> Option<(Code, String)> {
    let refused = (Code::InvalidArgument, INVALID_SORT_OPTION.to_string());
    match path {
        "/etcdserverpb.KV/Range" if parsed::<RangeRequest>(body).is_some_and(|r| bad_sort(&r)) => {
            Some(refused)
        }
        "/etcdserverpb.KV/Txn"
            if parsed::<TxnRequest>(body).is_some_and(|t| txn_has_bad_sort(&t)) =>
        {
            Some(refused)
        }
        "/etcdserverpb.Maintenance/Alarm"
            if parsed::<AlarmRequest>(body)
                .is_some_and(|a| alarm_request::AlarmAction::try_from(a.action).is_err()) =>
        {
            Some((Code::Ok, String::new()))
        }
        _ => None,
    }
}

/// `body` as the members parse it: prost, or the fields gogo keeps.
fn parsed<M: Message + Default>(body: &[u8]) -> Option<M> {
    etcd_proto::codec::decode(bytes::Bytes::copy_from_slice(body)).ok()
}

/// Whether `body` is a lease grant that parses with a TTL that could run
/// out during the run (see the module docs; etcd raises a shorter or
/// non-positive TTL to its minimum of a few seconds).
fn expires_during_the_run(path: &str, body: &[u8]) -> bool {
    if path != "/etcdserverpb.Lease/LeaseGrant" {
        return false;
    }
    parsed::<LeaseGrantRequest>(body).is_some_and(|g| g.ttl < MIN_LEASE_TTL_SECONDS)
}

/// A range that reaches the sort with an unknown option (without a key,
/// both refuse it first with `etcdserver: key is not provided`).
fn bad_sort(r: &RangeRequest) -> bool {
    !r.key.is_empty()
        && (range_request::SortOrder::try_from(r.sort_order).is_err()
            || range_request::SortTarget::try_from(r.sort_target).is_err())
}

fn txn_has_bad_sort(t: &TxnRequest) -> bool {
    t.success
        .iter()
        .chain(&t.failure)
        .any(|op| match &op.request {
            Some(request_op::Request::RequestRange(r)) => bad_sort(r),
            Some(request_op::Request::RequestTxn(t)) => txn_has_bad_sort(t),
            _ => false,
        })
}

async fn run_seed(seed: u64) {
    let pair = Differential::start()
        .await
        .expect("start etcd and the candidate");
    let oracle = connect(pair.oracle.cluster.endpoints()[0].clone()).await;
    let candidate = connect(pair.candidate.cluster.endpoints()[0].clone()).await;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut refused = 0;
    for step in 0..REQUESTS_PER_SEED {
        let (path, mut body) = valid_request(&mut rng);
        for _ in 0..rng.gen_range(1..=MAX_MUTATIONS) {
            mutate(&mut rng, &mut body);
        }
        if expires_during_the_run(path, &body) || has_non_utf8_string(path, &body) {
            continue;
        }
        if let Some(answer) = crashes_etcd(path, &body) {
            let actual = call(&candidate, path, body.clone()).await;
            assert_eq!(
                actual, answer,
                "seed {seed}, step {step}: {path} {body:02x?}"
            );
            continue;
        }
        let expected = call(&oracle, path, body.clone()).await;
        let actual = call(&candidate, path, body.clone()).await;
        assert_eq!(
            actual, expected,
            "seed {seed}, step {step}: {path} with bytes {body:02x?}: the candidate answered \
             {actual:?}, etcd {expected:?}"
        );
        if expected.0 == Code::Internal {
            refused += 1;
        }
    }
    assert!(
        refused > REQUESTS_PER_SEED / 10,
        "seed {seed}: only {refused} of {REQUESTS_PER_SEED} requests failed to parse"
    );
}

/// A stream method of the stream test.
#[derive(Clone, Copy, Debug)]
enum StreamMethod {
    Watch,
    KeepAlive,
}

impl StreamMethod {
    fn path(self) -> &'static str {
        match self {
            StreamMethod::Watch => "/etcdserverpb.Watch/Watch",
            StreamMethod::KeepAlive => "/etcdserverpb.Lease/LeaseKeepAlive",
        }
    }

    /// A valid message of the stream.
    fn message(self, rng: &mut StdRng) -> Vec<u8> {
        match self {
            StreamMethod::Watch => watch_message(rng).encode_to_vec(),
            StreamMethod::KeepAlive => LeaseKeepAliveRequest {
                id: rng.gen_range(LEASE_IDS),
            }
            .encode_to_vec(),
        }
    }

    /// The stream's last message, whose answer [`Self::is_sentinel`] knows.
    fn sentinel(self) -> Vec<u8> {
        match self {
            StreamMethod::Watch => WatchRequest {
                request_union: Some(watch_request::RequestUnion::CreateRequest(
                    WatchCreateRequest {
                        key: b"sentinel".to_vec(),
                        watch_id: SENTINEL_WATCH_ID,
                        ..Default::default()
                    },
                )),
            }
            .encode_to_vec(),
            StreamMethod::KeepAlive => LeaseKeepAliveRequest {
                id: SENTINEL_LEASE_ID,
            }
            .encode_to_vec(),
        }
    }

    /// An answer, as compared: without the member and cluster ids.
    fn answer(self, bytes: &[u8]) -> StreamAnswer {
        match self {
            StreamMethod::Watch => match WatchResponse::decode(bytes) {
                Ok(w) => StreamAnswer::Watch {
                    revision: w.header.map(|h| h.revision),
                    watch_id: w.watch_id,
                    created: w.created,
                    canceled: w.canceled,
                    cancel_reason: w.cancel_reason,
                    compact_revision: w.compact_revision,
                    events: w.events.len(),
                },
                Err(_) => StreamAnswer::Unparsed(bytes.to_vec()),
            },
            StreamMethod::KeepAlive => match LeaseKeepAliveResponse::decode(bytes) {
                Ok(k) => StreamAnswer::KeepAlive {
                    id: k.id,
                    ttl: k.ttl,
                },
                Err(_) => StreamAnswer::Unparsed(bytes.to_vec()),
            },
        }
    }

    fn is_sentinel(answer: &StreamAnswer) -> bool {
        matches!(answer,
            StreamAnswer::Watch { watch_id, created: true, .. } if *watch_id == SENTINEL_WATCH_ID)
            || matches!(answer, StreamAnswer::KeepAlive { id, .. } if *id == SENTINEL_LEASE_ID)
    }
}

/// A valid watch request on keys nobody writes: creates (ids 0-3 or the
/// member's choice, filters, ranges, past and future revisions), cancels and
/// progress requests.
fn watch_message(rng: &mut StdRng) -> WatchRequest {
    let union = match rng.gen_range(0..4) {
        0 => watch_request::RequestUnion::CancelRequest(WatchCancelRequest {
            watch_id: rng.gen_range(0..4),
        }),
        1 => watch_request::RequestUnion::ProgressRequest(WatchProgressRequest {}),
        _ => watch_request::RequestUnion::CreateRequest(WatchCreateRequest {
            key: format!("w{}", rng.gen_range(0..4)).into_bytes(),
            range_end: match rng.gen_range(0..3) {
                0 => Vec::new(),
                1 => b"wz".to_vec(),
                _ => vec![0],
            },
            start_revision: rng.gen_range(0..4),
            progress_notify: rng.gen(),
            filters: (0..rng.gen_range(0..3))
                .map(|_| rng.gen_range(0..2))
                .collect(),
            prev_kv: rng.gen(),
            watch_id: if rng.gen() { 0 } else { rng.gen_range(1..4) },
            fragment: rng.gen(),
        }),
    };
    WatchRequest {
        request_union: Some(union),
    }
}

/// One answer on a stream, as compared.
#[derive(Debug, PartialEq)]
enum StreamAnswer {
    Watch {
        revision: Option<i64>,
        watch_id: i64,
        created: bool,
        canceled: bool,
        cancel_reason: String,
        compact_revision: i64,
        events: usize,
    },
    KeepAlive {
        id: i64,
        ttl: i64,
    },
    Unparsed(Vec<u8>),
}

/// How a stream's answers ended.
#[derive(Debug, PartialEq)]
enum StreamEnd {
    /// The sentinel was answered (the stream is still open).
    Sentinel,
    /// The stream ended with this code and message (OK: the server closed it).
    Status(Code, String),
    /// Neither within [`STREAM_ANSWER_TIMEOUT`].
    TimedOut,
}

/// Attempts of one stream whose end the client's HTTP/2 layer garbled.
const STREAM_ATTEMPTS: usize = 5;

/// Sends `messages` on one stream of `method` (then half-closes it) and
/// collects the answers until the sentinel's answer or the stream's end.
/// A server that ends a stream while the client still sends on it may
/// reset it after its status (etcd does), and the client's HTTP/2 layer
/// may then report the reset (`h2 protocol error`) instead of the status it
/// had not read yet: such a stream is sent again on a fresh stream, which
/// changes nothing (its watches ended with it; renewing a lease is
/// idempotent).
async fn stream(
    channel: &Channel,
    method: StreamMethod,
    messages: Vec<Vec<u8>>,
) -> (Vec<StreamAnswer>, StreamEnd) {
    let mut outcome = stream_once(channel, method, messages.clone()).await;
    for _ in 1..STREAM_ATTEMPTS {
        let garbled =
            matches!(&outcome.1, StreamEnd::Status(_, m) if m.starts_with("h2 protocol error"));
        if !garbled {
            break;
        }
        outcome = stream_once(channel, method, messages.clone()).await;
    }
    outcome
}

async fn stream_once(
    channel: &Channel,
    method: StreamMethod,
    messages: Vec<Vec<u8>>,
) -> (Vec<StreamAnswer>, StreamEnd) {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("channel ready");
    let request = tonic::Request::new(tonic::codegen::tokio_stream::iter(messages));
    let path = PathAndQuery::from_static(method.path());
    let collect = async {
        let mut answers = Vec::new();
        let mut incoming = match grpc.streaming(request, path, RawCodec).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                return (
                    answers,
                    StreamEnd::Status(status.code(), status.message().to_string()),
                )
            }
        };
        loop {
            match incoming.message().await {
                Ok(Some(bytes)) => {
                    let answer = method.answer(&bytes);
                    let sentinel = StreamMethod::is_sentinel(&answer);
                    answers.push(answer);
                    if sentinel {
                        return (answers, StreamEnd::Sentinel);
                    }
                }
                Ok(None) => return (answers, StreamEnd::Status(Code::Ok, String::new())),
                Err(status) => {
                    return (
                        answers,
                        StreamEnd::Status(status.code(), status.message().to_string()),
                    )
                }
            }
        }
    };
    tokio::time::timeout(STREAM_ANSWER_TIMEOUT, collect)
        .await
        .unwrap_or_else(|_| (Vec::new(), StreamEnd::TimedOut))
}

/// Whether the candidate's stream ended as etcd's: the same end and the same
/// answers, except that a stream that failed may carry more answers from the
/// candidate. etcd's receive loop ends the stream as soon as a message does
/// not parse, while its send loop may still hold answers to the messages
/// before it (a race: they are usually dropped); the candidate sends every
/// answer to what it received before the failure. The answers etcd did send
/// must come first, in order.
fn same_stream_outcome(
    actual: &(Vec<StreamAnswer>, StreamEnd),
    expected: &(Vec<StreamAnswer>, StreamEnd),
) -> bool {
    let failed = matches!(&expected.1, StreamEnd::Status(code, _) if *code != Code::Ok);
    if failed {
        actual.1 == expected.1 && actual.0.starts_with(&expected.0)
    } else {
        actual == expected
    }
}

/// Grants the leases the keep-alive streams renew, on one side.
async fn grant_kept_alive_leases(channel: &Channel) {
    for id in LEASE_IDS {
        let grant = LeaseGrantRequest {
            ttl: KEPT_ALIVE_TTL_SECONDS,
            id,
        };
        let answer = call(
            channel,
            "/etcdserverpb.Lease/LeaseGrant",
            grant.encode_to_vec(),
        )
        .await;
        assert_eq!(answer, (Code::Ok, String::new()), "grant lease {id}");
    }
}

async fn run_stream_seed(seed: u64) {
    let pair = Differential::start()
        .await
        .expect("start etcd and the candidate");
    let oracle = connect(pair.oracle.cluster.endpoints()[0].clone()).await;
    let candidate = connect(pair.candidate.cluster.endpoints()[0].clone()).await;
    grant_kept_alive_leases(&oracle).await;
    grant_kept_alive_leases(&candidate).await;
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut failed, mut sentinels) = (0, 0);
    for step in 0..STREAMS_PER_SEED {
        let method = if step % 2 == 0 {
            StreamMethod::Watch
        } else {
            StreamMethod::KeepAlive
        };
        let mut messages: Vec<Vec<u8>> = (0..rng.gen_range(1..=MAX_STREAM_MESSAGES))
            .map(|_| {
                let mut message = method.message(&mut rng);
                if rng.gen_bool(0.5) {
                    for _ in 0..rng.gen_range(1..=MAX_MUTATIONS) {
                        mutate(&mut rng, &mut message);
                    }
                }
                message
            })
            .collect();
        messages.push(method.sentinel());
        let expected = stream(&oracle, method, messages.clone()).await;
        let actual = stream(&candidate, method, messages.clone()).await;
        assert!(
            same_stream_outcome(&actual, &expected),
            "seed {seed}, stream {step}: {method:?} with messages {messages:02x?}: the candidate \
             answered {actual:?}, etcd {expected:?}"
        );
        match expected.1 {
            StreamEnd::Sentinel => sentinels += 1,
            StreamEnd::Status(Code::Internal, _) => failed += 1,
            _ => {}
        }
    }
    assert!(
        failed > 0 && sentinels > 0,
        "seed {seed}: {failed} streams failed to parse, {sentinels} reached the sentinel"
    );
}

async fn connect(url: String) -> Channel {
    Channel::from_shared(url)
        .expect("endpoint url")
        .connect()
        .await
        .expect("connect")
}

/// How long a unary call may take to be answered while its client keeps the
/// request stream open.
const OPEN_REQUEST_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// A unary call whose client sends its one message and then leaves the
/// request stream open (tonic's clients send the end of stream in a frame of
/// its own, later); the answer's code, or None if there was none in time.
async fn call_with_the_request_open(
    channel: &Channel,
    path: &'static str,
    body: Vec<u8>,
) -> Option<Code> {
    use tonic::codegen::tokio_stream::{self, StreamExt};
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("channel ready");
    let open = tokio_stream::iter([body]).chain(tokio_stream::pending());
    let call = grpc.client_streaming(
        tonic::Request::new(open),
        PathAndQuery::from_static(path),
        RawCodec,
    );
    match tokio::time::timeout(OPEN_REQUEST_ANSWER_TIMEOUT, call).await {
        Err(_) => None,
        Ok(Ok(_)) => Some(Code::Ok),
        Ok(Err(status)) => Some(status.code()),
    }
}

/// grpc-go's server (etcd's) runs a unary call as soon as its message is
/// read, without waiting for the client's end of stream; the candidate too
/// (`store::server::transport::frame_limit`), for writes and reads alike.
#[tokio::test]
async fn unary_calls_are_answered_before_the_request_stream_ends() {
    let pair = Differential::start()
        .await
        .expect("start etcd and the candidate");
    let put = PutRequest {
        key: b"open-request".to_vec(),
        value: b"v".to_vec(),
        ..Default::default()
    };
    let range = RangeRequest {
        key: b"open-request".to_vec(),
        serializable: true,
        ..Default::default()
    };
    let calls = [
        ("/etcdserverpb.KV/Put", put.encode_to_vec()),
        ("/etcdserverpb.KV/Range", range.encode_to_vec()),
    ];
    for (side, cluster) in [
        ("etcd", &pair.oracle.cluster),
        ("the candidate", &pair.candidate.cluster),
    ] {
        let channel = connect(cluster.endpoints()[0].clone()).await;
        for (path, body) in &calls {
            let answer = call_with_the_request_open(&channel, path, body.clone()).await;
            assert_eq!(answer, Some(Code::Ok), "{side}: {path}");
        }
    }
}

#[tokio::test]
async fn malformed_stream_messages_end_streams_as_etcd_ends_them() {
    for seed in integration_tests::differential::fuzz_seeds(&CI_SEEDS) {
        run_stream_seed(seed).await;
    }
}

#[tokio::test]
async fn malformed_requests_are_refused_as_etcd_refuses_them() {
    for seed in integration_tests::differential::fuzz_seeds(&CI_SEEDS) {
        run_seed(seed).await;
    }
}
