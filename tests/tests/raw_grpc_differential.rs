//! Malformed protobuf, differentially (issue 14): seeded mutations of valid
//! requests of the KV, Lease, Maintenance (Status, Alarm, HashKV) and
//! Cluster (MemberList) services (truncated, bytes overwritten, tags and
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
//! two later requests and not yet on the other). Auth requests are left
//! out: their names and passwords are `string` fields, which gogo accepts
//! when they are not UTF-8 and prost refuses (an open difference).

use bytes::{Buf, BufMut};
use etcd_proto::etcdserverpb::{
    alarm_request, compare, range_request, request_op, AlarmRequest, Compare, DeleteRangeRequest,
    HashKvRequest, LeaseGrantRequest, LeaseLeasesRequest, LeaseRevokeRequest,
    LeaseTimeToLiveRequest, MemberListRequest, PutRequest, RangeRequest, RequestOp, StatusRequest,
    TxnRequest,
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

/// A valid request: its method path and encoding. Two in three are KV
/// requests.
fn valid_request(rng: &mut StdRng) -> (&'static str, Vec<u8>) {
    match rng.gen_range(0..6) {
        0 => lease_request(rng),
        1 => other_request(rng),
        _ => kv_request(rng),
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
    let oracle = Channel::from_shared(pair.oracle.cluster.endpoints()[0].clone())
        .expect("oracle url")
        .connect()
        .await
        .expect("connect to etcd");
    let candidate = Channel::from_shared(pair.candidate.cluster.endpoints()[0].clone())
        .expect("candidate url")
        .connect()
        .await
        .expect("connect to the candidate");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut refused = 0;
    for step in 0..REQUESTS_PER_SEED {
        let (path, mut body) = valid_request(&mut rng);
        for _ in 0..rng.gen_range(1..=MAX_MUTATIONS) {
            mutate(&mut rng, &mut body);
        }
        if expires_during_the_run(path, &body) {
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

#[tokio::test]
async fn malformed_requests_are_refused_as_etcd_refuses_them() {
    for seed in integration_tests::differential::fuzz_seeds(&CI_SEEDS) {
        run_seed(seed).await;
    }
}
