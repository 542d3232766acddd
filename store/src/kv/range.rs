//! Range: etcd's read with limit, sort and revision filters.
//!
//! Algorithm (etcd 3.5 `applierV3backend.Range`):
//! 1. If sorting or min/max filters are requested, fetch every key in the
//!    range (they change which keys survive); otherwise fetch `limit + 1`
//!    so `more` can be decided.
//! 2. Drop key-values outside the min/max mod/create revision bounds.
//! 3. Sort: a non-KEY target with order NONE sorts ascending; KEY ascending
//!    is already the index order. The sort is stable.
//! 4. Truncate to `limit`, setting `more`. `count` is the number of keys in
//!    the range at the read revision, before filters and limit.
//!
//! A request in key order with no filter and values wanted (what
//! kube-apiserver's lists send) is also answered with the key-values as
//! stored ([`range_stored`]): the answer's encoding carries the stored
//! bytes, so the values are neither decoded nor held twice.
//!
//! RangeStream (etcd 3.7, [`RangeStream`]) answers the same request in
//! chunks, each a Range of the keys after the previous chunk's last at the
//! revision the first chunk read.

use std::cmp::Ordering;

use prost::Message;

use etcd_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use etcd_proto::etcdserverpb::{RangeRequest, RangeResponse, ResponseHeader};
use etcd_proto::mvccpb::KeyValue;

use super::{KvError, ReadView};
use crate::errors::EtcdError;
use crate::mvcc::{KeyRange, MvccStore, RangeOptions, StoredKvs};

/// Executes `req` against `view`. The header carries only the revision;
/// the server fills in cluster, member and term.
pub fn range(view: &dyn ReadView, req: &RangeRequest) -> Result<RangeResponse, KvError> {
    range_counting(view, req, false)
}

/// A Range answer whose key-values are as stored ([`range_stored`]).
pub struct StoredRangeResponse {
    /// The header, with only the revision (as [`range`]'s).
    pub header: ResponseHeader,
    /// The key-values, each an encoded `mvccpb.KeyValue`, read as taken.
    pub kvs: StoredKvs,
    /// True if the limit left keys out.
    pub more: bool,
    /// Keys in the range at the read revision.
    pub count: i64,
}

/// Whether [`range_stored`] answers `req`: key order, no revision filter,
/// the values wanted (a keys-only or count-only read changes or drops
/// them).
pub fn answers_as_stored(req: &RangeRequest) -> bool {
    let order = SortOrder::try_from(req.sort_order).unwrap_or(SortOrder::None);
    let target = SortTarget::try_from(req.sort_target).unwrap_or(SortTarget::Key);
    target == SortTarget::Key
        && matches!(order, SortOrder::None | SortOrder::Ascend)
        && !has_revision_filters(req)
        && !req.keys_only
        && !req.count_only
}

/// [`range`] for a request [`answers_as_stored`], with the key-values as
/// the store holds them: the same keys, `more` and `count`.
pub fn range_stored(mvcc: &MvccStore, req: &RangeRequest) -> Result<StoredRangeResponse, KvError> {
    debug_assert!(answers_as_stored(req));
    crate::metrics::global().mvcc.range.inc();
    let limit = req.limit.max(0) as usize;
    let opts = RangeOptions {
        // One past the limit tells whether there are more.
        limit: if limit > 0 { limit + 1 } else { 0 },
        rev: req.revision,
        ..RangeOptions::default()
    };
    let result = mvcc.range_stored(&KeyRange::new(&req.key, &req.range_end), opts)?;
    let mut kvs = result.kvs;
    let more = limit > 0 && kvs.len() > limit;
    if more {
        kvs.truncate(limit);
    }
    Ok(StoredRangeResponse {
        header: ResponseHeader {
            revision: result.rev,
            ..Default::default()
        },
        kvs,
        more,
        count: result.count as i64,
    })
}

/// [`range`], with a `count` past the limit only when `count_to_limit` is
/// false (with it, `count` is wrong but `more` is right).
fn range_counting(
    view: &dyn ReadView,
    req: &RangeRequest,
    count_to_limit: bool,
) -> Result<RangeResponse, KvError> {
    crate::metrics::global().mvcc.range.inc();
    let order = SortOrder::try_from(req.sort_order).unwrap_or(SortOrder::None);
    let target = SortTarget::try_from(req.sort_target).unwrap_or(SortTarget::Key);
    let filtered = has_revision_filters(req);
    let mut fetch_limit = if order != SortOrder::None || filtered {
        0
    } else {
        req.limit.max(0) as usize
    };
    if fetch_limit > 0 {
        fetch_limit += 1;
    }
    let opts = RangeOptions {
        limit: fetch_limit,
        rev: req.revision,
        count_only: req.count_only,
        // Sorting by value needs the values; they are dropped after it.
        keys_only: req.keys_only && target != SortTarget::Value,
        count_to_limit,
    };
    let result = view.range(&KeyRange::new(&req.key, &req.range_end), opts)?;
    let mut kvs = result.kvs;
    retain_in_bounds(&mut kvs, req);
    sort(&mut kvs, order, target);
    let mut more = false;
    if req.limit > 0 && kvs.len() > req.limit as usize {
        kvs.truncate(req.limit as usize);
        more = true;
    }
    if req.keys_only {
        for kv in &mut kvs {
            kv.value.clear();
        }
    }
    Ok(RangeResponse {
        header: Some(ResponseHeader {
            revision: result.rev,
            ..Default::default()
        }),
        kvs,
        more,
        count: result.count as i64,
    })
}

fn retain_in_bounds(kvs: &mut Vec<KeyValue>, req: &RangeRequest) {
    let within = |v: i64, min: i64, max: i64| (min == 0 || v >= min) && (max == 0 || v <= max);
    kvs.retain(|kv| {
        within(kv.mod_revision, req.min_mod_revision, req.max_mod_revision)
            && within(
                kv.create_revision,
                req.min_create_revision,
                req.max_create_revision,
            )
    });
}

fn sort(kvs: &mut [KeyValue], order: SortOrder, target: SortTarget) {
    let order = match (order, target) {
        (SortOrder::None, SortTarget::Key) => return,
        (SortOrder::None, _) => SortOrder::Ascend,
        (SortOrder::Ascend, SortTarget::Key) => return,
        (o, _) => o,
    };
    let cmp = |a: &KeyValue, b: &KeyValue| -> Ordering {
        match target {
            SortTarget::Key => a.key.cmp(&b.key),
            SortTarget::Version => a.version.cmp(&b.version),
            SortTarget::Create => a.create_revision.cmp(&b.create_revision),
            SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
            SortTarget::Value => a.value.cmp(&b.value),
        }
    };
    if order == SortOrder::Descend {
        kvs.sort_by(|a, b| cmp(b, a));
    } else {
        kvs.sort_by(cmp);
    }
}

/// The number of keys RangeStream's first chunk asks for (etcd's
/// `initialStreamChunkLimit`); later chunks double or halve it toward the
/// byte target ([`next_chunk_limit`]).
pub const STREAM_FIRST_CHUNK_KEYS: i64 = 10;

/// etcd 3.7's checks of a RangeStream request beyond a Range's: the keys
/// come in key order, chunk after chunk, so no other order, and no filter
/// that would make a chunk's keys not the next ones.
pub fn check_stream(req: &RangeRequest) -> Result<(), KvError> {
    let order = SortOrder::try_from(req.sort_order).unwrap_or(SortOrder::None);
    let target = SortTarget::try_from(req.sort_target).unwrap_or(SortTarget::Key);
    let default_order =
        order == SortOrder::None || (target == SortTarget::Key && order == SortOrder::Ascend);
    if !default_order {
        return Err(KvError::Etcd(EtcdError::RangeStreamSortOrder));
    }
    if has_revision_filters(req) {
        return Err(KvError::Etcd(EtcdError::RangeStreamRevisionFilters));
    }
    Ok(())
}

fn has_revision_filters(req: &RangeRequest) -> bool {
    req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0
}

/// etcd's `adjustChunkLimit`: the next chunk's key limit from the last
/// chunk's, doubled if its answer was under half of `target_bytes`,
/// halved if over twice, never below 1 (0 would mean no limit).
pub fn next_chunk_limit(last_limit: i64, last_bytes: usize, target_bytes: usize) -> i64 {
    let limit = if last_bytes < target_bytes / 2 {
        last_limit.saturating_mul(2)
    } else if last_bytes > target_bytes.saturating_mul(2) {
        last_limit / 2
    } else {
        last_limit
    };
    limit.max(1)
}

/// One RangeStream (etcd 3.7's `KV.RangeStream`): the answer to a
/// RangeRequest in chunks, so that neither side holds it whole.
///
/// Each chunk is a Range of the keys after the last one sent, limited to a
/// number of keys that [`next_chunk_limit`] adapts so that a chunk's
/// answer stays near `target_bytes` (the server's request size limit, as
/// in etcd). The first chunk reads at the request's revision, or pins the
/// current one: every later chunk reads there, so writes made meanwhile
/// are not seen, and a compaction past it ends the stream with etcd's
/// compaction error. Only the last chunk carries the header (with the
/// pinned revision), `more` and `count`; a count-only request is one
/// message. Worked example, 25 keys of 100 KiB, `target_bytes` 1 MiB, no
/// limit: chunks of 10 keys (1 MB, kept at 10), 10, then the last 5 with
/// `count` 25 and `more` false.
#[derive(Debug)]
pub struct RangeStream {
    /// The next chunk's request: its key advanced past the keys sent, its
    /// limit the chunk's, its revision pinned after the first chunk.
    next: RangeRequest,
    /// The request's own limit (`i64::MAX` for none).
    total_limit: i64,
    /// Keys sent so far.
    sent: i64,
    /// The revision the last chunk's header carries (0 before the first).
    header_rev: i64,
    target_bytes: usize,
    done: bool,
}

impl RangeStream {
    /// A stream answering `req` (checked by [`check_stream`]) in chunks
    /// of about `target_bytes`.
    pub fn new(req: RangeRequest, target_bytes: usize) -> Self {
        let total_limit = if req.limit == 0 { i64::MAX } else { req.limit };
        let mut next = req;
        // Key order, which the chunks follow (a `NONE` order with another
        // target, the one other order [`check_stream`] lets through, sorts
        // nothing in etcd 3.7).
        next.sort_order = SortOrder::None as i32;
        next.sort_target = SortTarget::Key as i32;
        if !next.count_only {
            next.limit = STREAM_FIRST_CHUNK_KEYS.min(total_limit);
        }
        Self {
            next,
            total_limit,
            sent: 0,
            header_rev: 0,
            target_bytes,
            done: false,
        }
    }

    /// The next message of the stream, None after the last.
    pub fn next_chunk(&mut self, view: &dyn ReadView) -> Result<Option<RangeResponse>, KvError> {
        if self.done {
            return Ok(None);
        }
        if self.next.count_only {
            self.done = true;
            let resp = range(view, &self.next)?;
            return Ok(Some(RangeResponse {
                header: resp.header,
                count: resp.count,
                ..Default::default()
            }));
        }
        let resp = range_counting(view, &self.next, true)?;
        if self.header_rev == 0 {
            self.header_rev = resp.header.as_ref().map_or(0, |h| h.revision);
            if self.next.revision == 0 {
                self.next.revision = self.header_rev;
            }
        }
        let bytes = resp.encoded_len();
        let RangeResponse { kvs, more, .. } = resp;
        self.sent += kvs.len() as i64;
        let after_last = match (more, kvs.last()) {
            (true, Some(last)) => [&last.key[..], b"\0"].concat(),
            _ => return Ok(Some(self.last_chunk(kvs, more, self.sent))),
        };
        if self.sent < self.total_limit {
            self.next.key = after_last;
            self.next.limit = next_chunk_limit(self.next.limit, bytes, self.target_bytes)
                .min(self.total_limit - self.sent);
            return Ok(Some(RangeResponse {
                kvs,
                ..Default::default()
            }));
        }
        // The request's limit ended the stream: count the keys left.
        let rest = RangeRequest {
            key: after_last,
            range_end: self.next.range_end.clone(),
            revision: self.next.revision,
            count_only: true,
            ..Default::default()
        };
        let count = self.sent + range(view, &rest)?.count;
        Ok(Some(self.last_chunk(kvs, more, count)))
    }

    /// The stream's last message: its keys with the header at the pinned
    /// revision, `more` and `count`.
    fn last_chunk(&mut self, kvs: Vec<KeyValue>, more: bool, count: i64) -> RangeResponse {
        self.done = true;
        RangeResponse {
            header: Some(ResponseHeader {
                revision: self.header_rev,
                ..Default::default()
            }),
            kvs,
            more,
            count,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::engine::memory::MemoryEngine;
    use crate::engine::WriteBatch;
    use crate::mvcc::{MvccStore, Prev};

    /// A store holding `keys` keys `k000`.. with values of 1 to 3,000
    /// bytes.
    fn store_with(keys: usize) -> MvccStore {
        let store = MvccStore::open(Arc::new(MemoryEngine::new())).expect("open");
        let mut txn = store.write();
        for i in 0..keys {
            let value = vec![b'v'; 1 + (i * 997) % 3000];
            txn.put(format!("k{i:03}").as_bytes(), value, 0, Prev::Unread)
                .expect("put");
            txn.seal();
        }
        txn.commit(WriteBatch::new()).expect("commit");
        store
    }

    fn put(store: &MvccStore, key: &str, value: &str) {
        let mut txn = store.write();
        txn.put(key.as_bytes(), value.as_bytes().to_vec(), 0, Prev::Unread)
            .expect("put");
        txn.commit(WriteBatch::new()).expect("commit");
    }

    fn all_chunks(view: &dyn ReadView, req: &RangeRequest, target: usize) -> Vec<RangeResponse> {
        let mut stream = RangeStream::new(req.clone(), target);
        let mut chunks = Vec::new();
        while let Some(chunk) = stream.next_chunk(view).expect("chunk") {
            chunks.push(chunk);
            assert!(chunks.len() < 10_000, "the stream ends");
        }
        chunks
    }

    /// Merging a stream's chunks gives the Range answer, for whole and
    /// partial ranges, limits below, at and past the key count, keys
    /// only, one key, no key and a count; only the last chunk carries the
    /// header, `more` and `count`; chunks grow toward the byte target.
    #[test]
    fn the_chunks_merge_into_the_range_answer() {
        const TARGET_BYTES: usize = 16 * 1024;
        let store = store_with(300);
        let req = |key: &str, end: &str, limit: i64| RangeRequest {
            key: key.as_bytes().to_vec(),
            range_end: end.as_bytes().to_vec(),
            limit,
            ..Default::default()
        };
        let mut cases = vec![
            req("k", "l", 0),
            req("\0", "\0", 0),
            req("k", "l", 7),
            req("k", "l", 250),
            req("k", "l", 300),
            req("k", "l", 1000),
            req("k", "l", -1),
            req("k100", "k2", 0),
            req("k150", "", 0),
            req("x", "y", 0),
            RangeRequest {
                keys_only: true,
                ..req("k", "l", 0)
            },
            RangeRequest {
                sort_order: SortOrder::Ascend as i32,
                ..req("k", "l", 40)
            },
        ];
        cases.push(RangeRequest {
            count_only: true,
            ..req("k", "l", 0)
        });
        for r in cases {
            let whole = range(&store, &r).expect("range");
            let chunks = all_chunks(&store, &r, TARGET_BYTES);
            let (last, earlier) = chunks.split_last().expect("at least one chunk");
            for c in earlier {
                assert_eq!((&c.header, c.more, c.count), (&None, false, 0), "{r:?}");
                assert!(!c.kvs.is_empty(), "{r:?}");
                assert!(c.encoded_len() < 3 * TARGET_BYTES, "{r:?}");
            }
            let merged: Vec<_> = chunks.iter().flat_map(|c| c.kvs.clone()).collect();
            assert!(
                merged == whole.kvs,
                "{r:?}: the chunks differ from the range"
            );
            assert_eq!((last.more, last.count), (whole.more, whole.count), "{r:?}");
            assert_eq!(
                last.header.as_ref().map(|h| h.revision),
                Some(store.current_revision()),
                "{r:?}"
            );
            if r.count_only {
                assert_eq!(chunks.len(), 1);
            }
        }
        // 10 keys of ~1.5 KB each: under half of 1 MiB (the next chunk
        // asks for twice as many), over twice 2 KiB (half as many).
        let keys = |target: usize| -> Vec<usize> {
            all_chunks(&store, &req("k", "l", 0), target)
                .iter()
                .take(2)
                .map(|c| c.kvs.len())
                .collect()
        };
        assert_eq!(keys(1024 * 1024), [10, 20]);
        assert_eq!(keys(2 * 1024), [10, 5]);
    }

    /// Every chunk reads at the revision the first one read: later writes
    /// are not seen, and a compaction past that revision ends the stream
    /// with etcd's compaction error.
    #[test]
    fn the_chunks_read_at_the_first_chunks_revision() {
        let store = store_with(100);
        let pinned = store.current_revision();
        let all = RangeRequest {
            key: b"k".to_vec(),
            range_end: b"l".to_vec(),
            ..Default::default()
        };
        let mut stream = RangeStream::new(all.clone(), 1024);
        let first = stream.next_chunk(&store).expect("chunk").expect("first");
        put(&store, "k050", "changed");
        put(&store, "k999", "new");
        let mut merged = first.kvs;
        let mut last = None;
        while let Some(c) = stream.next_chunk(&store).expect("chunk") {
            merged.extend(c.kvs.iter().cloned());
            last = Some(c);
        }
        let at_start = range(
            &store,
            &RangeRequest {
                revision: pinned,
                ..all.clone()
            },
        )
        .expect("range");
        assert!(merged == at_start.kvs, "the chunks saw later writes");
        let last = last.expect("more than one chunk");
        assert_eq!(last.header.expect("header").revision, pinned);
        assert_eq!(last.count, 100);

        let mut stream = RangeStream::new(all, 1024);
        stream.next_chunk(&store).expect("chunk");
        put(&store, "k000", "after the pinned revision");
        let now = store.current_revision();
        let mut txn = store.write();
        txn.compact(now).expect("compact");
        txn.commit(WriteBatch::new()).expect("commit");
        assert!(
            matches!(
                stream.next_chunk(&store),
                Err(KvError::Etcd(EtcdError::Compacted))
            ),
            "the chunk after a compaction past the pinned revision"
        );
    }

    /// etcd 3.7 refuses a RangeStream with another order than by key
    /// ascending or with revision filters, as Unimplemented.
    #[test]
    fn orders_and_filters_are_refused() {
        let ok = RangeRequest {
            key: b"a".to_vec(),
            ..Default::default()
        };
        assert!(check_stream(&ok).is_ok());
        assert!(check_stream(&RangeRequest {
            sort_order: SortOrder::None as i32,
            sort_target: SortTarget::Value as i32,
            ..ok.clone()
        })
        .is_ok());
        let refused = [
            (
                RangeRequest {
                    sort_order: SortOrder::Descend as i32,
                    ..ok.clone()
                },
                "RangeStream does not support custom sort orders",
            ),
            (
                RangeRequest {
                    sort_order: SortOrder::Ascend as i32,
                    sort_target: SortTarget::Mod as i32,
                    ..ok.clone()
                },
                "RangeStream does not support custom sort orders",
            ),
            (
                RangeRequest {
                    min_create_revision: 3,
                    ..ok.clone()
                },
                "RangeStream does not support revision filters",
            ),
        ];
        for (req, message) in refused {
            let Err(KvError::Etcd(e)) = check_stream(&req) else {
                panic!("{req:?} was not refused");
            };
            let status = e.to_status();
            assert_eq!(status.code(), tonic::Code::Unimplemented);
            assert_eq!(status.message(), message);
        }
    }

    #[test]
    fn chunk_limits_double_or_halve_toward_the_target() {
        assert_eq!(next_chunk_limit(10, 100, 1000), 20);
        assert_eq!(next_chunk_limit(10, 500, 1000), 10);
        assert_eq!(next_chunk_limit(10, 2000, 1000), 10);
        assert_eq!(next_chunk_limit(10, 2001, 1000), 5);
        assert_eq!(next_chunk_limit(1, 5000, 1000), 1);
        assert_eq!(next_chunk_limit(i64::MAX, 0, 1000), i64::MAX);
    }
}
