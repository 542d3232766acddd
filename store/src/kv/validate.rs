//! Request checks done before anything reaches Raft, as etcd's
//! `api/v3rpc/key.go`: empty keys, sort options, ignore_* conflicts, the
//! txn operation limit and put/delete overlaps inside one txn branch.

use std::collections::HashSet;

use etcd_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use etcd_proto::etcdserverpb::request_op::Request;
use etcd_proto::etcdserverpb::{
    DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};

use super::intervals::KeyIntervals;
use crate::errors::EtcdError;

/// etcd's `checkRangeRequest`.
pub fn check_range(r: &RangeRequest) -> Result<(), EtcdError> {
    if r.key.is_empty() {
        return Err(EtcdError::EmptyKey);
    }
    if SortOrder::try_from(r.sort_order).is_err() || SortTarget::try_from(r.sort_target).is_err() {
        return Err(EtcdError::InvalidSortOption);
    }
    Ok(())
}

/// etcd's `checkPutRequest`.
pub fn check_put(r: &PutRequest) -> Result<(), EtcdError> {
    if r.key.is_empty() {
        return Err(EtcdError::EmptyKey);
    }
    if r.ignore_value && !r.value.is_empty() {
        return Err(EtcdError::ValueProvided);
    }
    if r.ignore_lease && r.lease != 0 {
        return Err(EtcdError::LeaseProvided);
    }
    Ok(())
}

/// etcd's `checkDeleteRequest`.
pub fn check_delete(r: &DeleteRangeRequest) -> Result<(), EtcdError> {
    if r.key.is_empty() {
        return Err(EtcdError::EmptyKey);
    }
    Ok(())
}

/// etcd's `checkTxnRequest` followed by the overlap check of both branches.
pub fn check_txn(r: &TxnRequest, max_txn_ops: usize) -> Result<(), EtcdError> {
    check_txn_shape(r, max_txn_ops)?;
    check_overlaps(&r.success)?;
    check_overlaps(&r.failure)?;
    Ok(())
}

fn check_txn_shape(r: &TxnRequest, max_txn_ops: usize) -> Result<(), EtcdError> {
    let ops = r.compare.len().max(r.success.len()).max(r.failure.len());
    if ops > max_txn_ops {
        return Err(EtcdError::TooManyOps);
    }
    if r.compare.iter().any(|c| c.key.is_empty()) {
        return Err(EtcdError::EmptyKey);
    }
    for op in r.success.iter().chain(&r.failure) {
        check_op(op, max_txn_ops)?;
    }
    Ok(())
}

fn check_op(op: &RequestOp, max_txn_ops: usize) -> Result<(), EtcdError> {
    match &op.request {
        Some(Request::RequestRange(r)) => check_range(r),
        Some(Request::RequestPut(r)) => check_put(r),
        Some(Request::RequestDeleteRange(r)) => check_delete(r),
        Some(Request::RequestTxn(r)) => check_txn_shape(r, max_txn_ops),
        // An operation with no request: etcd's `checkRequestOp` answers
        // "key not found" (found by tests/raw_grpc_differential.rs).
        None => Err(EtcdError::KeyNotFound),
    }
}

/// etcd's `checkIntervals`: within one branch (and the nested txns it holds),
/// no key may be put twice, and no put may fall inside a deleted range.
/// Deleted ranges are kept in a [`KeyIntervals`], so the check costs
/// `O(n log n)` in the number of operations, not puts times deletes.
/// The two branches of a nested txn may put the same key (only one runs).
fn check_overlaps(ops: &[RequestOp]) -> Result<(), EtcdError> {
    overlaps(ops).map(|_| ())
}

fn overlaps(ops: &[RequestOp]) -> Result<(HashSet<Vec<u8>>, KeyIntervals), EtcdError> {
    let mut dels = KeyIntervals::new();
    for op in ops {
        if let Some(Request::RequestDeleteRange(d)) = &op.request {
            if d.range_end.is_empty() {
                dels.insert_key(&d.key);
            } else {
                dels.insert(d.key.clone(), d.range_end.clone());
            }
        }
    }
    let mut puts: HashSet<Vec<u8>> = HashSet::new();
    for op in ops {
        let Some(Request::RequestTxn(t)) = &op.request else {
            continue;
        };
        let (puts_then, dels_then) = overlaps(&t.success)?;
        let (puts_else, dels_else) = overlaps(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || dels.covers(k) {
                return Err(EtcdError::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        for k in &puts_else {
            if (puts.contains(k) && !puts_then.contains(k)) || dels.covers(k) {
                return Err(EtcdError::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in ops {
        let Some(Request::RequestPut(p)) = &op.request else {
            continue;
        };
        if puts.contains(&p.key) || dels.covers(&p.key) {
            return Err(EtcdError::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_proto::etcdserverpb::Compare;

    fn put(k: &str) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: k.into(),
                ..Default::default()
            })),
        }
    }

    fn del(k: &str, end: &str) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
                key: k.into(),
                range_end: end.into(),
                ..Default::default()
            })),
        }
    }

    fn txn(success: Vec<RequestOp>, failure: Vec<RequestOp>) -> TxnRequest {
        TxnRequest {
            compare: vec![],
            success,
            failure,
        }
    }

    #[test]
    fn op_limit_is_the_largest_list_not_the_sum() {
        let ops: Vec<RequestOp> = (0..128).map(|i| put(&format!("k{i}"))).collect();
        let mut t = txn(ops.clone(), ops);
        t.compare = vec![
            Compare {
                key: b"a".to_vec(),
                ..Default::default()
            };
            128
        ];
        assert_eq!(check_txn(&t, 128), Ok(()));
        t.success.push(put("one-more"));
        assert_eq!(check_txn(&t, 128), Err(EtcdError::TooManyOps));
    }

    #[test]
    fn duplicate_puts_and_put_inside_delete_are_refused() {
        assert_eq!(
            check_txn(&txn(vec![put("a"), put("a")], vec![]), 128),
            Err(EtcdError::DuplicateKey)
        );
        assert_eq!(
            check_txn(&txn(vec![del("a", "c"), put("b")], vec![]), 128),
            Err(EtcdError::DuplicateKey)
        );
        assert_eq!(
            check_txn(&txn(vec![put("a")], vec![put("a")]), 128),
            Ok(()),
            "branches are exclusive"
        );
        let nested = RequestOp {
            request: Some(Request::RequestTxn(txn(vec![put("x")], vec![put("x")]))),
        };
        assert_eq!(check_txn(&txn(vec![nested.clone()], vec![]), 128), Ok(()));
        assert_eq!(
            check_txn(&txn(vec![nested, put("x")], vec![]), 128),
            Err(EtcdError::DuplicateKey)
        );
    }

    #[test]
    fn empty_keys_are_refused_everywhere() {
        assert_eq!(
            check_txn(&txn(vec![put("")], vec![]), 128),
            Err(EtcdError::EmptyKey)
        );
        let mut t = txn(vec![], vec![]);
        t.compare.push(Compare::default());
        assert_eq!(check_txn(&t, 128), Err(EtcdError::EmptyKey));
        assert_eq!(
            check_range(&RangeRequest::default()),
            Err(EtcdError::EmptyKey)
        );
    }

    #[test]
    fn an_operation_without_a_request_is_key_not_found() {
        let empty = RequestOp { request: None };
        assert_eq!(
            check_txn(&txn(vec![], vec![put("a"), empty]), 128),
            Err(EtcdError::KeyNotFound)
        );
    }

    /// A txn of 20,000 deletes and 20,000 puts (`--max-txn-ops` raised):
    /// disjoint keys pass, one put inside a deleted range does not.
    #[test]
    fn large_txns_are_checked_by_range_lookup() {
        const OPS: usize = 20_000;
        let mut ops: Vec<RequestOp> = (0..OPS).map(|i| del(&format!("d/{i:06}"), "")).collect();
        ops.extend((0..OPS).map(|i| put(&format!("p/{i:06}"))));
        let mut t = txn(ops, vec![]);
        assert_eq!(check_txn(&t, 2 * OPS + 1), Ok(()));
        t.success.push(del("p/000100", "p/000101"));
        assert_eq!(check_txn(&t, 2 * OPS + 1), Err(EtcdError::DuplicateKey));
    }
}
