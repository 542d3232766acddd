//! The clients of a run: concurrent single-key operations on a small key
//! set, each recorded as an [`Event`].
//!
//! [`CLIENTS`] clients run at once, client `c` connected to member
//! `c % members` only, so every member serves traffic and a fault of one
//! member shows as errors of its clients. Each picks a key among [`KEYS`]
//! and an operation: a linearizable get, a put of a value unique in the run,
//! a compare-and-swap expecting the mod revision the client last saw on that
//! key (0 when it saw it absent; stale expectations make some swaps fail), or
//! a delete. Puts, swaps and deletes ask for `prev_kv`, so every completed
//! operation also reads the state it acted on.
//!
//! An RPC error or a timeout after [`OP_TIMEOUT`] makes the operation
//! indeterminate; the client then reconnects after [`ERROR_BACKOFF`]. A
//! request whose TCP connection was refused never reached a server and is
//! not recorded. A client stops at the stop signal or after
//! [`MAX_OPS_PER_CLIENT`] recorded operations; it pauses [`THINK_TIME`]
//! between operations.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::history::{Clock, Event, Observed, Op, Outcome};
use crate::client::{connect_with_timeout, describe_error};

/// Concurrent clients.
pub const CLIENTS: usize = 4;
/// Keys the clients share.
pub const KEYS: usize = 3;
/// Prefix of every key of a run.
pub const KEY_PREFIX: &str = "robustness/";
/// Recorded operations per client, at most: a run's bound on memory and
/// checking time, well above what a client records before the nemesis is
/// done. The longest runs, the upgrade tests' six graceful replacements
/// (~7.5 s each, ~65 s in all), record ~3,000 per client at the think time
/// below; a bound of 3,000 ended their clients before the last replacement
/// had completed, and the check that operations completed after every fault
/// failed.
pub const MAX_OPS_PER_CLIENT: usize = 10_000;
/// Pause of a client between two operations, so the load spans the whole
/// fault schedule instead of exhausting the bound first.
pub const THINK_TIME: Duration = Duration::from_millis(10);
/// Per-request timeout of a client: an answer not there by then makes the
/// operation indeterminate.
pub const OP_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause of a client after an error, before it reconnects.
pub const ERROR_BACKOFF: Duration = Duration::from_millis(100);
/// Operation mix, in percent: gets, puts, compare-and-swaps (deletes take
/// the rest).
pub const GET_PERCENT: u32 = 40;
pub const PUT_PERCENT: u32 = 25;
pub const CAS_PERCENT: u32 = 25;

/// Error text of a TCP connect that was refused: the request was never sent.
const CONNECT_REFUSED: &str = "Connection refused";

/// The `i`th key.
pub fn key(i: usize) -> String {
    format!("{KEY_PREFIX}k{i}")
}

/// What one client did.
#[derive(Debug, Default)]
pub struct ClientLog {
    pub events: Vec<Event>,
    /// Requests refused at connect (never sent, not recorded).
    pub not_sent: usize,
    /// Answers that do not have the shape the request asks for.
    pub malformed: Vec<String>,
}

/// Why an operation has no outcome to check.
enum Failure {
    NotSent,
    Lost(String),
    Malformed(String),
}

/// Runs client `id` against `endpoint` until `stop` (or its operation bound).
pub async fn run_client(
    id: usize,
    endpoint: String,
    seed: u64,
    clock: Clock,
    stop: Arc<AtomicBool>,
) -> ClientLog {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(id as u64));
    let mut log = ClientLog::default();
    let mut seen: HashMap<String, i64> = HashMap::new();
    let mut client: Option<Client> = None;
    let mut written = 0usize;
    while !stop.load(Ordering::Relaxed) && log.events.len() < MAX_OPS_PER_CLIENT {
        let Some(connected) = client.as_mut() else {
            match connect_with_timeout(std::slice::from_ref(&endpoint), OP_TIMEOUT).await {
                Ok(fresh) => client = Some(fresh),
                Err(_) => tokio::time::sleep(ERROR_BACKOFF).await,
            }
            continue;
        };
        let key = key(rng.gen_range(0..KEYS));
        let op = choose(&mut rng, id, &mut written, seen.get(&key).copied());
        let invoke = clock.now();
        let result = tokio::time::timeout(OP_TIMEOUT, execute(connected, &key, &op)).await;
        let complete = clock.now();
        let outcome = match result {
            Ok(Ok(outcome)) => Some(outcome),
            Ok(Err(Failure::NotSent)) => {
                log.not_sent += 1;
                None
            }
            Ok(Err(Failure::Lost(error))) => Some(Outcome::Indeterminate(error)),
            Ok(Err(Failure::Malformed(error))) => {
                log.malformed.push(format!("{key} {op:?}: {error}"));
                Some(Outcome::Indeterminate(error))
            }
            Err(_) => Some(Outcome::Indeterminate(format!(
                "no answer within {OP_TIMEOUT:?}"
            ))),
        };
        if matches!(&outcome, Some(answer) if !matches!(answer, Outcome::Indeterminate(_))) {
            tokio::time::sleep(THINK_TIME).await;
        } else {
            client = None;
            tokio::time::sleep(ERROR_BACKOFF).await;
        }
        let Some(outcome) = outcome else {
            continue;
        };
        remember(&mut seen, &key, &outcome);
        let complete = (!matches!(outcome, Outcome::Indeterminate(_))).then_some(complete);
        log.events.push(Event {
            client: id,
            key,
            op,
            invoke,
            complete,
            outcome,
        });
    }
    log
}

/// A random operation; written values are `c<client>-<n>`, unique in the run.
fn choose(rng: &mut StdRng, id: usize, written: &mut usize, seen: Option<i64>) -> Op {
    let roll = rng.gen_range(0..100);
    let mut value = || {
        *written += 1;
        format!("c{id}-{written}")
    };
    if roll < GET_PERCENT {
        Op::Get
    } else if roll < GET_PERCENT + PUT_PERCENT {
        Op::Put { value: value() }
    } else if roll < GET_PERCENT + PUT_PERCENT + CAS_PERCENT {
        Op::Cas {
            expect: seen.unwrap_or(0),
            value: value(),
        }
    } else {
        Op::Delete
    }
}

/// Remembers the mod revision a completed operation showed for `key`.
fn remember(seen: &mut HashMap<String, i64>, key: &str, outcome: &Outcome) {
    let revision = match outcome {
        Outcome::Read(observed) | Outcome::CasFailed(observed) => {
            observed.as_ref().map_or(0, |(_, revision)| *revision)
        }
        Outcome::Wrote { revision, .. } => *revision,
        Outcome::Deleted(_) => 0,
        Outcome::Indeterminate(_) => return,
    };
    seen.insert(key.to_string(), revision);
}

/// Sends `op` on `key` and translates the answer.
async fn execute(client: &mut Client, key: &str, op: &Op) -> Result<Outcome, Failure> {
    match op {
        Op::Get => {
            let response = client.get(key, None).await.map_err(failure)?;
            Ok(Outcome::Read(first(response.kvs())))
        }
        Op::Put { value } => {
            let options = PutOptions::new().with_prev_key();
            let response = client
                .put(key, value.as_str(), Some(options))
                .await
                .map_err(failure)?;
            let revision = response.header().map(|header| header.revision());
            Ok(Outcome::Wrote {
                revision: revision.ok_or(Failure::Malformed("put without header".into()))?,
                prev: response.prev_key().and_then(observed),
            })
        }
        Op::Cas { expect, value } => compare_and_swap(client, key, *expect, value).await,
        Op::Delete => {
            let options = DeleteOptions::new().with_prev_key();
            let response = client.delete(key, Some(options)).await.map_err(failure)?;
            Ok(Outcome::Deleted(first(response.prev_kvs())))
        }
    }
}

/// If `key`'s mod revision is `expect` put `value` (with `prev_kv`), else
/// read `key`.
async fn compare_and_swap(
    client: &mut Client,
    key: &str,
    expect: i64,
    value: &str,
) -> Result<Outcome, Failure> {
    let txn = Txn::new()
        .when([Compare::mod_revision(key, CompareOp::Equal, expect)])
        .and_then([TxnOp::put(
            key,
            value,
            Some(PutOptions::new().with_prev_key()),
        )])
        .or_else([TxnOp::get(key, None)]);
    let response = client.txn(txn).await.map_err(failure)?;
    let revision = response.header().map(|header| header.revision());
    match (response.succeeded(), response.op_responses().as_slice()) {
        (true, [TxnOpResponse::Put(put)]) => Ok(Outcome::Wrote {
            revision: revision.ok_or(Failure::Malformed("txn without header".into()))?,
            prev: put.prev_key().and_then(observed),
        }),
        (false, [TxnOpResponse::Get(get)]) => Ok(Outcome::CasFailed(first(get.kvs()))),
        (succeeded, responses) => Err(Failure::Malformed(format!(
            "txn succeeded={succeeded} with {} responses of other kinds",
            responses.len()
        ))),
    }
}

fn first(kvs: &[KeyValue]) -> Observed {
    kvs.first().and_then(observed)
}

/// A key-value as the model sees it (an empty key is etcd's "no prev_kv").
fn observed(kv: &KeyValue) -> Observed {
    (!kv.key().is_empty()).then(|| {
        (
            String::from_utf8_lossy(kv.value()).into_owned(),
            kv.mod_revision(),
        )
    })
}

fn failure(error: etcd_client::Error) -> Failure {
    let text = describe_error(&error);
    if format!("{error:?}").contains(CONNECT_REFUSED) {
        Failure::NotSent
    } else {
        Failure::Lost(text)
    }
}
