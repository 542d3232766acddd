//! Malformed protobuf, differentially (issue 14): seeded mutations of valid
//! KV requests (truncated, bytes overwritten, tags and unknown fields
//! inserted, lengths made huge or negative) sent as raw gRPC to etcd 3.5.1
//! and to the candidate (one member each, the same requests in the same
//! order). Each answer's gRPC code and message must be the same: a request
//! that does not parse gets gogo/protobuf's words through grpc-go's
//! `grpc: error unmarshalling request: ...`, one that parses gets the same
//! verdict. The bodies of successful answers are compared by
//! `fuzz_differential.rs` (same semantics); here only the verdict.
//!
//! One deliberate difference: a range (alone or in a Txn) whose
//! `sort_order` or `sort_target` is not a value of its enum. etcd 3.5.1
//! sorts by an unknown order as if unsorted and **crashes** on an unknown
//! target (a nil sorter, `sort.Sort(nil)` in `applierV3backend.Range`: one
//! request stops the member); later etcd releases refuse both with
//! `etcdserver: invalid sort option`, as the candidate does. Such requests
//! go to the candidate only, which must refuse them so.

use bytes::{Buf, BufMut};
use etcd_proto::etcdserverpb::{
    compare, range_request, request_op, Compare, DeleteRangeRequest, PutRequest, RangeRequest,
    RequestOp, TxnRequest,
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

/// A valid request: its method path and encoding.
fn valid_request(rng: &mut StdRng) -> (&'static str, Vec<u8>) {
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

/// Whether `body` parses as the request of `path` and holds a range with
/// an unknown sort order or target (see the module docs).
fn unknown_sort_option(path: &str, body: &[u8]) -> bool {
    match path {
        "/etcdserverpb.KV/Range" => RangeRequest::decode(body).is_ok_and(|r| bad_sort(&r)),
        "/etcdserverpb.KV/Txn" => TxnRequest::decode(body).is_ok_and(|t| txn_has_bad_sort(&t)),
        _ => false,
    }
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
        if unknown_sort_option(path, &body) {
            let refused = (Code::InvalidArgument, INVALID_SORT_OPTION.to_string());
            let actual = call(&candidate, path, body.clone()).await;
            assert_eq!(
                actual, refused,
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
