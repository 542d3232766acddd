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

use std::cmp::Ordering;

use etcd_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use etcd_proto::etcdserverpb::{RangeRequest, RangeResponse, ResponseHeader};
use etcd_proto::mvccpb::KeyValue;

use super::{KvError, ReadView};
use crate::mvcc::{KeyRange, RangeOptions};

/// Executes `req` against `view`. The header carries only the revision;
/// the server fills in cluster, member and term.
pub fn range(view: &dyn ReadView, req: &RangeRequest) -> Result<RangeResponse, KvError> {
    crate::metrics::global().mvcc.range.inc();
    let order = SortOrder::try_from(req.sort_order).unwrap_or(SortOrder::None);
    let target = SortTarget::try_from(req.sort_target).unwrap_or(SortTarget::Key);
    let filtered = req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
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
