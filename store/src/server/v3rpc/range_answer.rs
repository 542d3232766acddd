//! A Range's answer on the wire, encoded as its key-values are read.
//!
//! A `RangeResponse` is fields 1 (header), 2 (each key-value, an
//! `mvccpb.KeyValue`), 3 (`more`) and 4 (`count`). The store keeps each
//! revision's value as that same encoded `KeyValue`, so a list in key
//! order ([`kv::range::answers_as_stored`], what kube-apiserver sends) is
//! answered by copying the stored bytes behind field 2's key and length,
//! one value read at a time from the engine snapshot the read took
//! ([`RangeAnswer::Stored`]). A 1 GiB list is then held once, as the
//! buffer tonic sends, where decoding it first held it twice (the decoded
//! key-values, then their encoding). The buffer is reserved once, at about
//! the answer's size ([`StoredKvs::estimated_field_bytes`]): grown by
//! doubling, each step copied what it held into a new block while the old
//! one was still resident.
//!
//! The bytes equal prost's encoding of the decoded answer: fields in tag
//! order, defaults left out, the stored `KeyValue`s canonical (the store
//! writes them with prost; a restored etcd snapshot's are gogo's, also
//! canonical). Every other Range (sorted, filtered, keys or count only) is
//! [`RangeAnswer::Decoded`] and goes through prost.
//!
//! Worked example: two keys, count 2, revision 9: `0a <len> <header>`,
//! `12 <len a> <stored a>`, `12 <len b> <stored b>`, `20 02` (no `more`).
//!
//! An answer over the send limit ([`MAX_SEND_BYTES`], etcd's
//! `math.MaxInt32`) is refused before it is encoded, with grpc-go's
//! `ResourceExhausted` text and the answer's exact size
//! ([`check_send_limit`]). etcd 3.5 builds the whole answer first (a list
//! of 8M keys of 1 KiB, 8.6 GB); the store measures it by reading each value
//! once more, holding one at a time, when the estimate comes near the limit.
//! Encoding never writes past the limit either (an answer the estimate
//! misjudged fails there, with tonic's encoding error).

use std::time::Instant;

use etcd_proto::codec::{EtcdCodec, EtcdDecoder, EtcdEncoder};
use etcd_proto::etcdserverpb::{RangeRequest, RangeResponse};
use prost::bytes::BufMut;
use prost::encoding::{self, WireType};
use prost::Message;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic::Status;

use crate::errors::grpc_answer_too_large;
use crate::kv::range::StoredRangeResponse;
use crate::limits::MAX_SEND_BYTES;
use crate::mvcc::stored::field_bytes;
#[cfg(doc)]
use crate::mvcc::StoredKvs;

/// A buffer that can make room ahead of writes.
trait ReserveBuf: BufMut {
    /// Makes room for at least `additional` more bytes.
    fn reserve(&mut self, additional: usize);
}

impl ReserveBuf for EncodeBuf<'_> {
    fn reserve(&mut self, additional: usize) {
        EncodeBuf::reserve(self, additional);
    }
}

impl ReserveBuf for Vec<u8> {
    fn reserve(&mut self, additional: usize) {
        Vec::reserve(self, additional);
    }
}

/// The answer to a Range (see the module docs).
pub enum RangeAnswer {
    /// Decoded key-values, encoded by prost.
    Decoded(RangeResponse),
    /// Key-values as stored, read while the answer is encoded; the read
    /// began at `started` (the range duration metric covers the values).
    Stored {
        /// The answer, its header filled.
        resp: StoredRangeResponse,
        /// When the read began.
        started: Instant,
    },
}

/// The codec of the Range method: [`EtcdCodec`]'s decoding of the request,
/// [`RangeAnswerEncoder`] for the answer.
#[derive(Default)]
pub struct RangeAnswerCodec;

impl Codec for RangeAnswerCodec {
    type Encode = RangeAnswer;
    type Decode = RangeRequest;
    type Encoder = RangeAnswerEncoder;
    type Decoder = EtcdDecoder<RangeRequest>;

    fn encoder(&mut self) -> Self::Encoder {
        RangeAnswerEncoder {
            decoded: EtcdCodec::<RangeResponse, RangeRequest>::default().encoder(),
        }
    }

    fn decoder(&mut self) -> Self::Decoder {
        EtcdCodec::<RangeResponse, RangeRequest>::default().decoder()
    }
}

/// Encodes a [`RangeAnswer`] (see the module docs): a decoded one as every
/// other answer is encoded.
pub struct RangeAnswerEncoder {
    decoded: EtcdEncoder<RangeResponse>,
}

impl Encoder for RangeAnswerEncoder {
    type Item = RangeAnswer;
    type Error = Status;

    fn encode(&mut self, item: RangeAnswer, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        match item {
            RangeAnswer::Decoded(resp) => self.decoded.encode(resp, buf),
            RangeAnswer::Stored { resp, started } => {
                let written = encode_stored(resp, buf);
                crate::metrics::global()
                    .txn
                    .observe_range(written.is_ok(), started.elapsed().as_secs_f64());
                written
            }
        }
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.decoded.buffer_settings()
    }
}

/// A stored answer is measured exactly once its estimate (sampled values,
/// [`crate::mvcc::StoredKvs::estimated_field_bytes`]) passes this share of
/// the send limit: below it the estimate would have to be off by half.
const MEASURE_ABOVE_LIMIT_PERCENT: usize = 50;

/// `answer`, unless grpc-go would refuse to send it (over the server's
/// limit): then its error, before anything is encoded (see the module
/// docs). Measuring reads every value, on a blocking thread.
pub async fn check_send_limit(answer: RangeAnswer) -> Result<RangeAnswer, Status> {
    if let Some(decided) = decide_by_estimate(&answer, MAX_SEND_BYTES) {
        return decided.map(|()| answer);
    }
    tokio::task::spawn_blocking(move || measure(&answer, MAX_SEND_BYTES).map(|()| answer))
        .await
        .map_err(|e| Status::internal(format!("measuring a range's answer: {e}")))?
}

/// Whether `answer` fits in `limit`, if that is clear without reading its
/// values: a decoded answer's size is known, a stored one's estimate far
/// below the limit is trusted.
fn decide_by_estimate(answer: &RangeAnswer, limit: usize) -> Option<Result<(), Status>> {
    match answer {
        RangeAnswer::Decoded(resp) => Some(within_send_limit(resp.encoded_len(), limit)),
        RangeAnswer::Stored { resp, .. } => (stored_estimated_len(resp)
            <= limit / 100 * MEASURE_ABOVE_LIMIT_PERCENT)
            .then_some(Ok(())),
    }
}

/// Whether `answer` fits in `limit`, its values read to measure it.
fn measure(answer: &RangeAnswer, limit: usize) -> Result<(), Status> {
    let len = match answer {
        RangeAnswer::Decoded(resp) => resp.encoded_len(),
        RangeAnswer::Stored { resp, .. } => stored_fixed_len(resp) + resp.kvs.field_bytes()?,
    };
    within_send_limit(len, limit)
}

/// grpc-go's send check: an answer of `len` bytes over `limit` is refused
/// with its `ResourceExhausted` text, as etcd's server refuses it (tonic
/// would answer `OutOfRange` with a text of its own). A Txn's answer is
/// built whole, as etcd builds it, and checked here before it is sent.
pub fn within_send_limit(len: usize, limit: usize) -> Result<(), Status> {
    if len > limit {
        return Err(grpc_answer_too_large(len, limit));
    }
    Ok(())
}

/// About how many bytes a stored answer encodes to: its other fields
/// exactly, its key-values estimated from sampled values.
fn stored_estimated_len(resp: &StoredRangeResponse) -> usize {
    stored_fixed_len(resp) + resp.kvs.estimated_field_bytes()
}

/// Bytes of a stored answer's fields but its key-values.
fn stored_fixed_len(resp: &StoredRangeResponse) -> usize {
    let more = if resp.more {
        encoding::bool::encoded_len(3, &resp.more)
    } else {
        0
    };
    let count = if resp.count != 0 {
        encoding::int64::encoded_len(4, &resp.count)
    } else {
        0
    };
    encoding::message::encoded_len(1, &resp.header) + more + count
}

/// Writes `resp` as prost writes a `RangeResponse`, each key-value's
/// stored bytes read and copied in turn; fails if a value cannot be read
/// or the answer would pass [`MAX_SEND_BYTES`].
fn encode_stored(resp: StoredRangeResponse, buf: &mut impl ReserveBuf) -> Result<(), Status> {
    encode_stored_within(resp, buf, MAX_SEND_BYTES)
}

fn encode_stored_within(
    resp: StoredRangeResponse,
    buf: &mut impl ReserveBuf,
    limit: usize,
) -> Result<(), Status> {
    // One buffer of about the answer's size (see the module docs), never
    // more than an answer may be.
    buf.reserve(stored_estimated_len(&resp).min(limit));
    let mut len = stored_fixed_len(&resp);
    let StoredRangeResponse {
        header,
        kvs,
        more,
        count,
    } = resp;
    encoding::message::encode(1, &header, buf);
    for kv in kvs {
        let kv = kv?;
        len += field_bytes(kv.len());
        within_send_limit(len, limit)?;
        encoding::encode_key(2, WireType::LengthDelimited, buf);
        encoding::encode_varint(kv.len() as u64, buf);
        buf.put_slice(&kv);
    }
    if more {
        encoding::bool::encode(3, &more, buf);
    }
    if count != 0 {
        encoding::int64::encode(4, &count, buf);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_proto::etcdserverpb::ResponseHeader;
    use etcd_proto::mvccpb::KeyValue;

    use crate::engine::memory::MemoryEngine;
    use crate::engine::WriteBatch;
    use crate::kv::range::{answers_as_stored, range, range_stored};
    use crate::mvcc::{MvccStore, Prev, RANGE_VALUES_UNDER_LOCK};

    fn store_with(keys: &[(&str, &str)]) -> MvccStore {
        let store = MvccStore::open(std::sync::Arc::new(MemoryEngine::new())).expect("open");
        for (k, v) in keys {
            let mut txn = store.write();
            txn.put(k.as_bytes(), v.as_bytes().to_vec(), 0, Prev::Unread)
                .expect("put");
            txn.commit(WriteBatch::new()).expect("commit");
        }
        store
    }

    /// `header` as a member fills it.
    fn filled(header: ResponseHeader) -> ResponseHeader {
        ResponseHeader {
            cluster_id: 1,
            member_id: 2,
            raft_term: 3,
            ..header
        }
    }

    /// `resp`'s encoding, its header filled.
    fn encoded(mut resp: StoredRangeResponse) -> Vec<u8> {
        resp.header = filled(resp.header);
        let mut buf = Vec::new();
        encode_stored(resp, &mut buf).expect("encode");
        buf
    }

    fn stored_bytes(store: &MvccStore, req: &RangeRequest) -> Vec<u8> {
        assert!(answers_as_stored(req));
        encoded(range_stored(store, req).expect("range"))
    }

    fn decoded_bytes(store: &MvccStore, req: &RangeRequest) -> Vec<u8> {
        let mut resp = range(store, req).expect("range");
        resp.header = Some(filled(resp.header.expect("header")));
        resp.encode_to_vec()
    }

    #[test]
    fn stored_answers_are_prosts_encoding_of_the_decoded_ones() {
        let store = store_with(&[("a", "1"), ("b", ""), ("c", "33"), ("a", "444")]);
        let requests = [
            RangeRequest {
                key: b"a".to_vec(),
                range_end: vec![0],
                ..Default::default()
            },
            RangeRequest {
                key: b"a".to_vec(),
                range_end: vec![0],
                limit: 2,
                ..Default::default()
            },
            RangeRequest {
                key: b"a".to_vec(),
                range_end: vec![0],
                revision: 2,
                sort_order: 1,
                ..Default::default()
            },
            RangeRequest {
                key: b"b".to_vec(),
                ..Default::default()
            },
            RangeRequest {
                key: b"zz".to_vec(),
                ..Default::default()
            },
        ];
        for req in &requests {
            assert_eq!(
                stored_bytes(&store, req),
                decoded_bytes(&store, req),
                "{req:?}"
            );
        }
        let limited = RangeResponse::decode(&stored_bytes(&store, &requests[1])[..]).expect("ok");
        assert!(limited.more);
        assert_eq!(limited.count, 3);
        let keys: Vec<&[u8]> = limited.kvs.iter().map(|kv| &kv.key[..]).collect();
        assert_eq!(keys, [&b"a"[..], b"b"]);
        let first: &KeyValue = &limited.kvs[0];
        assert_eq!((first.value.as_slice(), first.version), (&b"444"[..], 2));
    }

    /// A store of `count` keys (`k0000`, `k0001`, ...) holding `value`, and
    /// a Range of all of them: more than [`RANGE_VALUES_UNDER_LOCK`], so
    /// the answer reads its values from an engine snapshot.
    fn large_range(count: usize, value: &str) -> (MvccStore, RangeRequest) {
        assert!(count > RANGE_VALUES_UNDER_LOCK, "a large range");
        let names: Vec<String> = (0..count).map(|i| format!("k{i:04}")).collect();
        let keys: Vec<(&str, &str)> = names.iter().map(|k| (k.as_str(), value)).collect();
        let req = RangeRequest {
            key: b"k".to_vec(),
            range_end: b"l".to_vec(),
            ..Default::default()
        };
        (store_with(&keys), req)
    }

    #[test]
    fn a_large_stored_answer_reads_from_a_snapshot_that_later_writes_miss() {
        let count = RANGE_VALUES_UNDER_LOCK + 44;
        let (store, req) = large_range(count, "old");
        let expected = decoded_bytes(&store, &req);
        let resp = range_stored(&store, &req).expect("range");
        assert_eq!(resp.kvs.len(), count);
        // Alike values: the estimate covers the answer, within its margin.
        let estimate = resp.kvs.estimated_field_bytes();
        assert!(
            estimate >= expected.len() - 40,
            "{estimate} vs {}",
            expected.len()
        );
        assert!(
            estimate <= expected.len() * 5 / 4,
            "{estimate} vs {}",
            expected.len()
        );
        // Written after the read, before its values are taken.
        let mut txn = store.write();
        txn.put(b"k0000", b"new".to_vec(), 0, Prev::Unread)
            .expect("put");
        txn.commit(WriteBatch::new()).expect("commit");
        assert_eq!(encoded(resp), expected);
    }

    /// `req`'s stored answer with its header filled, and its encoding.
    fn stored_answer(store: &MvccStore, req: &RangeRequest) -> (RangeAnswer, Vec<u8>) {
        let mut resp = range_stored(store, req).expect("range");
        resp.header = filled(resp.header);
        let bytes = stored_bytes(store, req);
        let started = Instant::now();
        (RangeAnswer::Stored { resp, started }, bytes)
    }

    fn refusal(len: usize, limit: usize) -> String {
        format!("grpc: trying to send message larger than max ({len} vs. {limit})")
    }

    #[test]
    fn an_answer_over_the_send_limit_is_refused_with_its_exact_size() {
        let store = store_with(&[("a", "1"), ("b", "22"), ("c", "333")]);
        let req = RangeRequest {
            key: b"a".to_vec(),
            range_end: vec![0],
            ..Default::default()
        };
        let (answer, bytes) = stored_answer(&store, &req);
        let len = bytes.len();
        // Far below the limit: the estimate decides; near it: measured.
        assert!(matches!(decide_by_estimate(&answer, 4 * len), Some(Ok(()))));
        assert!(decide_by_estimate(&answer, len).is_none());
        assert!(measure(&answer, len).is_ok());
        let refused = measure(&answer, len - 1).expect_err("over the limit");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert_eq!(refused.message(), refusal(len, len - 1));
        // A decoded answer's size is known: decided at once.
        let decoded = RangeAnswer::Decoded(RangeResponse::decode(&bytes[..]).expect("decode"));
        let refused = decide_by_estimate(&decoded, len - 1)
            .expect("decided")
            .expect_err("over the limit");
        assert_eq!(refused.message(), refusal(len, len - 1));
        assert!(matches!(decide_by_estimate(&decoded, len), Some(Ok(()))));
    }

    #[test]
    fn a_large_answer_is_measured_from_its_snapshot_and_never_encoded_past_the_limit() {
        let (store, req) = large_range(RANGE_VALUES_UNDER_LOCK + 10, "value");
        let (answer, bytes) = stored_answer(&store, &req);
        let len = bytes.len();
        assert!(measure(&answer, len).is_ok());
        let refused = measure(&answer, len - 1).expect_err("over the limit");
        assert_eq!(refused.message(), refusal(len, len - 1));
        // Encoding stops at the limit instead of buffering the rest.
        let RangeAnswer::Stored { resp, .. } = answer else {
            unreachable!("stored")
        };
        let mut buf = Vec::new();
        let limit = len / 2;
        assert!(encode_stored_within(resp, &mut buf, limit).is_err());
        assert!(buf.len() <= limit, "{} > {limit}", buf.len());
    }

    #[test]
    fn only_key_ordered_unfiltered_reads_with_values_answer_as_stored() {
        let plain = RangeRequest {
            key: b"a".to_vec(),
            ..Default::default()
        };
        assert!(answers_as_stored(&plain));
        let not = [
            RangeRequest {
                keys_only: true,
                ..plain.clone()
            },
            RangeRequest {
                count_only: true,
                ..plain.clone()
            },
            RangeRequest {
                sort_order: 2,
                ..plain.clone()
            },
            RangeRequest {
                sort_target: 3,
                ..plain.clone()
            },
            RangeRequest {
                min_mod_revision: 1,
                ..plain.clone()
            },
        ];
        for req in &not {
            assert!(!answers_as_stored(req), "{req:?}");
        }
    }
}
