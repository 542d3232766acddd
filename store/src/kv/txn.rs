//! Put, DeleteRange and Txn applied inside one MVCC write transaction.
//!
//! A Txn runs in two phases, as etcd's `applierV3backend.Txn`:
//! 1. Decide the path: evaluate the compares of the outer txn, then of every
//!    nested txn on the chosen branch, all against the state *before* any
//!    write. Then check every request on that path (leases exist, ignore_*
//!    keys exist, read revisions are valid) so that no error can happen
//!    half-way through.
//! 2. Execute the path; reads see the writes made before them.
//!
//! A key that does not exist compares as a zero `KeyValue`, except that a
//! VALUE compare on a missing key is always false.

use std::cmp::Ordering;

use etcd_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use etcd_proto::etcdserverpb::request_op::Request;
use etcd_proto::etcdserverpb::response_op::Response;
use etcd_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, RangeRequest,
    RequestOp, ResponseHeader, ResponseOp, TxnRequest, TxnResponse,
};
use etcd_proto::mvccpb::KeyValue;

use super::{range::range, KvError, LeaseLookup, ReadView};
use crate::errors::EtcdError;
use crate::mvcc::{KeyRange, MvccError, MvccStore, Prev, RangeOptions, RangeResult, WriteTxn};

fn header(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        revision,
        ..Default::default()
    })
}

/// Applies a top-level Put.
pub fn put(
    txn: &mut WriteTxn<'_>,
    leases: &dyn LeaseLookup,
    req: &PutRequest,
) -> Result<PutResponse, KvError> {
    if txn.is_loading() {
        txn.load(&KeyRange::Single(req.key.clone()))?;
    }
    check_put(txn, leases, req)?;
    exec_put(txn, req)
}

/// Applies a top-level DeleteRange.
pub fn delete_range(
    txn: &mut WriteTxn<'_>,
    req: &DeleteRangeRequest,
) -> Result<DeleteRangeResponse, KvError> {
    exec_delete(txn, req)
}

/// Applies a Txn.
pub fn txn(
    txn: &mut WriteTxn<'_>,
    leases: &dyn LeaseLookup,
    req: &TxnRequest,
) -> Result<TxnResponse, KvError> {
    if txn.is_loading() {
        load_named(txn, req)?;
    }
    let path = choose_path(txn, req)?;
    check_path(txn, leases, req, &path)?;
    let mut cursor = path.iter();
    let mut resp = exec_txn(txn, req, &mut cursor)?;
    resp.header = header(current_rev(txn));
    if operations(&resp) > 1 {
        crate::metrics::global().mvcc.txn.inc();
    }
    Ok(resp)
}

/// Loads every key `req` names (compares and operations of both branches,
/// nested txns too) into a partly loaded index: the reads that decide and
/// check the path run inside the write transaction, which cannot load.
fn load_named(txn: &mut WriteTxn<'_>, req: &TxnRequest) -> Result<(), KvError> {
    for c in &req.compare {
        txn.load(&KeyRange::new(&c.key, &c.range_end))?;
    }
    for op in req.success.iter().chain(&req.failure) {
        match &op.request {
            Some(Request::RequestRange(r)) => txn.load(&KeyRange::new(&r.key, &r.range_end))?,
            Some(Request::RequestPut(p)) => txn.load(&KeyRange::Single(p.key.clone()))?,
            Some(Request::RequestDeleteRange(d)) => {
                txn.load(&KeyRange::new(&d.key, &d.range_end))?
            }
            Some(Request::RequestTxn(t)) => load_named(txn, t)?,
            None => {}
        }
    }
    Ok(())
}

/// The store as of one revision: a read-only Txn's view. Reads take the
/// state lock one at a time (never the write lock, so apply goes on), and
/// all see the revision the Txn started at.
pub struct AtRevision<'a> {
    mvcc: &'a MvccStore,
    rev: i64,
}

impl<'a> AtRevision<'a> {
    /// `mvcc` as of its current revision.
    pub fn now(mvcc: &'a MvccStore) -> Self {
        Self {
            rev: mvcc.current_revision(),
            mvcc,
        }
    }
}

impl ReadView for AtRevision<'_> {
    fn range(&self, range: &KeyRange, mut opts: RangeOptions) -> Result<RangeResult, MvccError> {
        if opts.rev > self.rev {
            return Err(MvccError::FutureRev);
        }
        if opts.rev <= 0 {
            opts.rev = self.rev;
        }
        let mut result = self.mvcc.range(range, opts)?;
        result.rev = self.rev;
        Ok(result)
    }
}

/// Serves a Txn none of whose paths writes (the caller checked) from
/// `view`, as etcd serves read-only txns without Raft.
pub fn read_only(view: &AtRevision<'_>, req: &TxnRequest) -> Result<TxnResponse, KvError> {
    let path = choose_path(view, req)?;
    let mut cursor = path.iter();
    check_read_path(view, req, &mut cursor)?;
    let mut cursor = path.iter();
    let mut resp = exec_read_only(view, req, &mut cursor)?;
    resp.header = header(view.rev);
    if operations(&resp) > 1 {
        crate::metrics::global().mvcc.txn.inc();
    }
    Ok(resp)
}

fn check_read_path(
    view: &dyn ReadView,
    req: &TxnRequest,
    cursor: &mut std::slice::Iter<'_, bool>,
) -> Result<(), KvError> {
    let succeeded = *cursor.next().expect("path has an entry per txn");
    for op in branch(req, succeeded) {
        match &op.request {
            Some(Request::RequestRange(r)) => check_range_revision(view, r)?,
            Some(Request::RequestTxn(t)) => check_read_path(view, t, cursor)?,
            Some(Request::RequestPut(_)) | Some(Request::RequestDeleteRange(_)) => {
                unreachable!("a read-only txn has no writes")
            }
            None => {}
        }
    }
    Ok(())
}

fn exec_read_only(
    view: &dyn ReadView,
    req: &TxnRequest,
    cursor: &mut std::slice::Iter<'_, bool>,
) -> Result<TxnResponse, KvError> {
    let succeeded = *cursor.next().expect("path has an entry per txn");
    let ops = branch(req, succeeded);
    let mut responses = Vec::with_capacity(ops.len());
    for op in ops {
        let response = match &op.request {
            Some(Request::RequestRange(r)) => Some(Response::ResponseRange(range(view, r)?)),
            Some(Request::RequestTxn(t)) => {
                let mut nested = exec_read_only(view, t, cursor)?;
                nested.header = Some(ResponseHeader::default());
                Some(Response::ResponseTxn(nested))
            }
            Some(Request::RequestPut(_)) | Some(Request::RequestDeleteRange(_)) => {
                unreachable!("a read-only txn has no writes")
            }
            None => None,
        };
        responses.push(ResponseOp { response });
    }
    Ok(TxnResponse {
        header: None,
        succeeded,
        responses,
    })
}

/// Operations a Txn executed (those of nested Txns included): etcd counts
/// a Txn in `etcd_mvcc_txn_total` only when it ran more than one.
fn operations(resp: &TxnResponse) -> usize {
    resp.responses
        .iter()
        .map(|op| match &op.response {
            Some(Response::ResponseTxn(nested)) => operations(nested),
            Some(_) => 1,
            None => 0,
        })
        .sum()
}

fn current_rev(txn: &WriteTxn<'_>) -> i64 {
    if txn.has_changes() {
        txn.write_rev()
    } else {
        txn.write_rev() - 1
    }
}

/// The branch taken by the outer txn and by each nested txn on the path,
/// in execution (pre-order) order.
fn choose_path(txn: &dyn ReadView, req: &TxnRequest) -> Result<Vec<bool>, KvError> {
    let mut path = Vec::new();
    push_path(txn, req, &mut path)?;
    Ok(path)
}

fn push_path(txn: &dyn ReadView, req: &TxnRequest, path: &mut Vec<bool>) -> Result<(), KvError> {
    let mut succeeded = true;
    for c in &req.compare {
        if !compare(txn, c)? {
            succeeded = false;
            break;
        }
    }
    path.push(succeeded);
    for op in branch(req, succeeded) {
        if let Some(Request::RequestTxn(nested)) = &op.request {
            push_path(txn, nested, path)?;
        }
    }
    Ok(())
}

fn branch(req: &TxnRequest, succeeded: bool) -> &[RequestOp] {
    if succeeded {
        &req.success
    } else {
        &req.failure
    }
}

/// Walks the chosen path checking each request before anything is written.
fn check_path(
    txn: &WriteTxn<'_>,
    leases: &dyn LeaseLookup,
    req: &TxnRequest,
    path: &[bool],
) -> Result<(), KvError> {
    let mut cursor = path.iter();
    check_txn_path(txn, leases, req, &mut cursor)
}

fn check_txn_path(
    txn: &WriteTxn<'_>,
    leases: &dyn LeaseLookup,
    req: &TxnRequest,
    cursor: &mut std::slice::Iter<'_, bool>,
) -> Result<(), KvError> {
    let succeeded = *cursor.next().expect("path has an entry per txn");
    for op in branch(req, succeeded) {
        match &op.request {
            Some(Request::RequestPut(p)) => check_put(txn, leases, p)?,
            Some(Request::RequestRange(r)) => check_range_revision(txn, r)?,
            Some(Request::RequestTxn(t)) => check_txn_path(txn, leases, t, cursor)?,
            Some(Request::RequestDeleteRange(_)) | None => {}
        }
    }
    Ok(())
}

fn check_put(
    txn: &WriteTxn<'_>,
    leases: &dyn LeaseLookup,
    req: &PutRequest,
) -> Result<(), KvError> {
    if req.lease != 0 && !leases.lease_exists(req.lease) {
        return Err(EtcdError::LeaseNotFound.into());
    }
    if (req.ignore_value || req.ignore_lease) && txn.get(&req.key)?.is_none() {
        return Err(EtcdError::KeyNotFound.into());
    }
    Ok(())
}

fn check_range_revision(txn: &dyn ReadView, req: &RangeRequest) -> Result<(), KvError> {
    let opts = RangeOptions {
        rev: req.revision,
        count_only: true,
        ..Default::default()
    };
    txn.range(&KeyRange::new(&req.key, &req.range_end), opts)?;
    Ok(())
}

fn exec_txn(
    txn: &mut WriteTxn<'_>,
    req: &TxnRequest,
    cursor: &mut std::slice::Iter<'_, bool>,
) -> Result<TxnResponse, KvError> {
    let succeeded = *cursor.next().expect("path has an entry per txn");
    let ops = branch(req, succeeded);
    let mut responses = Vec::with_capacity(ops.len());
    for op in ops {
        let response = match &op.request {
            Some(Request::RequestRange(r)) => Some(Response::ResponseRange(range(txn, r)?)),
            Some(Request::RequestPut(p)) => Some(Response::ResponsePut(exec_put(txn, p)?)),
            Some(Request::RequestDeleteRange(d)) => {
                Some(Response::ResponseDeleteRange(exec_delete(txn, d)?))
            }
            Some(Request::RequestTxn(t)) => {
                let mut nested = exec_txn(txn, t, cursor)?;
                // etcd leaves a nested txn's header empty (newTxnResp).
                nested.header = Some(ResponseHeader::default());
                Some(Response::ResponseTxn(nested))
            }
            None => None,
        };
        responses.push(ResponseOp { response });
    }
    Ok(TxnResponse {
        header: None,
        succeeded,
        responses,
    })
}

fn exec_put(txn: &mut WriteTxn<'_>, req: &PutRequest) -> Result<PutResponse, KvError> {
    crate::metrics::global().mvcc.put.inc();
    // etcd reads the old value only for these; a put learns the key's
    // create revision and version from the index.
    let prev = if req.prev_kv || req.ignore_value || req.ignore_lease {
        Prev::Read(txn.get(&req.key)?)
    } else {
        Prev::Unread
    };
    let old = match &prev {
        Prev::Read(p) => p.as_ref(),
        Prev::Unread => None,
    };
    let value = match (old, req.ignore_value) {
        (Some(p), true) => p.value.clone(),
        _ => req.value.clone(),
    };
    let lease = match (old, req.ignore_lease) {
        (Some(p), true) => p.lease,
        _ => req.lease,
    };
    let prev_kv = match (&prev, req.prev_kv) {
        (Prev::Read(p), true) => p.clone(),
        _ => None,
    };
    txn.put(&req.key, value, lease, prev)?;
    Ok(PutResponse {
        header: header(txn.write_rev()),
        prev_kv,
    })
}

fn exec_delete(
    txn: &mut WriteTxn<'_>,
    req: &DeleteRangeRequest,
) -> Result<DeleteRangeResponse, KvError> {
    crate::metrics::global().mvcc.delete.inc();
    let (deleted, prev_kvs) =
        txn.delete_range(&KeyRange::new(&req.key, &req.range_end), req.prev_kv)?;
    let rev = current_rev(txn);
    Ok(DeleteRangeResponse {
        header: header(rev),
        deleted: deleted as i64,
        prev_kvs,
    })
}

/// etcd's `applyCompare`: true if every key in the compare's range passes.
fn compare(txn: &dyn ReadView, c: &Compare) -> Result<bool, KvError> {
    let result = txn.range(
        &KeyRange::new(&c.key, &c.range_end),
        RangeOptions::default(),
    );
    let kvs = match result {
        Ok(r) => r.kvs,
        // etcd treats a failed read as a failed compare.
        Err(crate::mvcc::MvccError::Engine(e)) => return Err(KvError::Storage(e)),
        Err(_) => return Ok(false),
    };
    let target = CompareTarget::try_from(c.target).unwrap_or(CompareTarget::Version);
    if kvs.is_empty() {
        if target == CompareTarget::Value {
            return Ok(false);
        }
        return Ok(compare_kv(c, target, &KeyValue::default()));
    }
    Ok(kvs.iter().all(|kv| compare_kv(c, target, kv)))
}

fn compare_kv(c: &Compare, target: CompareTarget, kv: &KeyValue) -> bool {
    let int = |want: Option<i64>, have: i64| have.cmp(&want.unwrap_or(0));
    let ord = match target {
        CompareTarget::Value => {
            let want: &[u8] = match &c.target_union {
                Some(TargetUnion::Value(v)) => v,
                _ => &[],
            };
            kv.value.as_slice().cmp(want)
        }
        CompareTarget::Create => int(target_int(c, CompareTarget::Create), kv.create_revision),
        CompareTarget::Mod => int(target_int(c, CompareTarget::Mod), kv.mod_revision),
        CompareTarget::Version => int(target_int(c, CompareTarget::Version), kv.version),
        CompareTarget::Lease => int(target_int(c, CompareTarget::Lease), kv.lease),
    };
    match CompareResult::try_from(c.result) {
        Ok(CompareResult::Equal) => ord == Ordering::Equal,
        Ok(CompareResult::NotEqual) => ord != Ordering::Equal,
        Ok(CompareResult::Greater) => ord == Ordering::Greater,
        Ok(CompareResult::Less) => ord == Ordering::Less,
        Err(_) => true,
    }
}

/// The integer operand of a compare, only if the union holds the member
/// that matches `target` (etcd reads 0 otherwise).
fn target_int(c: &Compare, target: CompareTarget) -> Option<i64> {
    match (&c.target_union, target) {
        (Some(TargetUnion::CreateRevision(v)), CompareTarget::Create) => Some(*v),
        (Some(TargetUnion::ModRevision(v)), CompareTarget::Mod) => Some(*v),
        (Some(TargetUnion::Version(v)), CompareTarget::Version) => Some(*v),
        (Some(TargetUnion::Lease(v)), CompareTarget::Lease) => Some(*v),
        _ => None,
    }
}
