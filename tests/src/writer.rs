//! A background writer of unique keys, and the check that a member serves
//! exactly what it acknowledged: the "no acknowledged write is lost" half
//! of the cluster tests (membership changes, leadership transfers, ...).
//!
//! [`write_until_stopped`] puts `<prefix><n:08>` = `value-<n>` one after the
//! other through a client of the given endpoints until told to stop,
//! reconnecting after any error. It records every acknowledged put with its
//! revision, and every key it *tried* (a put that failed or timed out may
//! or may not have been applied). [`Writes::check`] then holds a member's
//! (serializable) read of the prefix to both: every acknowledged write is
//! served with its exact value and mod revision, and nothing is served that
//! was never tried.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use etcd_client::{Client, GetResponse};

use crate::client::{connect, describe_error};
use crate::wait::POLL_INTERVAL;

/// key -> (value, mod revision), as written or as served.
pub type KeyValues = BTreeMap<String, (String, i64)>;

/// What the writer did.
#[derive(Default)]
pub struct Writes {
    /// key -> (value, mod revision) of every acknowledged put.
    pub acknowledged: KeyValues,
    /// Every key a put was sent for.
    pub attempted: BTreeSet<String>,
    /// Connect and put errors, in order.
    pub errors: Vec<String>,
}

impl Writes {
    /// Checks `response` (a read of the writer's prefix through `who`):
    /// every acknowledged write is served exactly and nothing unattempted
    /// is. Returns the number of keys served.
    pub fn check(&self, who: &str, response: &GetResponse) -> Result<usize> {
        self.check_served(who, &served(response))
    }

    /// [`Writes::check`] of what `who` serves, read already (in pages, say).
    pub fn check_served(&self, who: &str, actual: &KeyValues) -> Result<usize> {
        for (key, value) in &self.acknowledged {
            match actual.get(key) {
                Some(served) if served == value => {}
                other => bail!(
                    "{who}: acknowledged write {key} = {value:?} (value, mod revision) is served as {other:?}"
                ),
            }
        }
        if let Some(key) = actual.keys().find(|key| !self.attempted.contains(*key)) {
            bail!("{who} serves {key}, which was never written");
        }
        Ok(actual.len())
    }
}

/// The keys of `response` with their values and mod revisions.
pub fn served(response: &GetResponse) -> KeyValues {
    response
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                (
                    String::from_utf8_lossy(kv.value()).into_owned(),
                    kv.mod_revision(),
                ),
            )
        })
        .collect()
}

/// Writes unique keys under `prefix` through `endpoints`, pausing `pause`
/// after each acknowledged put (and [`POLL_INTERVAL`] after an error), until
/// `stop` is set; counts acknowledged puts in `acknowledged`.
pub async fn write_until_stopped(
    endpoints: Vec<String>,
    prefix: &'static str,
    pause: Duration,
    stop: Arc<AtomicBool>,
    acknowledged: Arc<AtomicUsize>,
) -> Writes {
    let mut writes = Writes::default();
    let mut client: Option<Client> = None;
    let mut next = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Some(connected) = client.as_mut() else {
            match connect(&endpoints).await {
                Ok(connected) => client = Some(connected),
                Err(error) => {
                    writes.errors.push(format!("connect: {error:#}"));
                    tokio::time::sleep(POLL_INTERVAL).await;
                }
            }
            continue;
        };
        let key = format!("{prefix}{next:08}");
        let value = format!("value-{next}");
        next += 1;
        writes.attempted.insert(key.clone());
        match connected.put(key.as_str(), value.as_str(), None).await {
            Ok(response) => match response.header() {
                Some(header) => {
                    writes.acknowledged.insert(key, (value, header.revision()));
                    acknowledged.fetch_add(1, Ordering::Relaxed);
                }
                None => writes
                    .errors
                    .push(format!("put {key}: response without header")),
            },
            Err(error) => {
                writes
                    .errors
                    .push(format!("put {key}: {}", describe_error(&error)));
                client = None;
                tokio::time::sleep(POLL_INTERVAL).await;
                continue;
            }
        }
        tokio::time::sleep(pause).await;
    }
    writes
}
