//! The lease client of a run, and the check that no lease expires early.
//!
//! [`LEASE_CLIENTS`] clients, connected to every member, each run leases
//! one after another through the faults: it grants a lease of [`LEASE_TTL_SECONDS`], puts a
//! key of its own attached to it, keeps it alive [`KEEPALIVES`] times (a
//! drawn number, every [`KEEPALIVE_EVERY`]; each on a fresh keep-alive
//! stream, so a broken stream costs one round), then lets it expire, and
//! reads the key linearizably after every step until it is gone (at most
//! [`EXPIRY_WAIT`] past the lease's end).
//!
//! The guarantee (etcd's: a lease never expires before its TTL, counted
//! from the grant or the last acknowledged keep-alive; leader changes only
//! extend it): the lease lives at least until `alive_until`, the latest of
//! `grant invoked + granted TTL` and `keep-alive invoked + answered TTL`
//! (the server counts from a moment after the invoke). So a linearizable
//! read that *completed* before `alive_until` must see the key, and a
//! keep-alive answered before it must not say the lease is gone (TTL 0).
//! Failed requests decide nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, PutOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::history::Clock;
use super::workload::{ERROR_BACKOFF, OP_TIMEOUT};
use crate::client::connect_with_timeout;

/// Lease clients of a run.
pub const LEASE_CLIENTS: usize = 3;
/// TTL of every lease, in seconds (above etcd's minimum of 1.5 election
/// timeouts, so no server raises it).
pub const LEASE_TTL_SECONDS: i64 = 3;
/// Keep-alives per lease, drawn uniformly.
pub const KEEPALIVES: std::ops::RangeInclusive<u32> = 0..=6;
/// Pause between two keep-alives (and reads) of a lease.
pub const KEEPALIVE_EVERY: Duration = Duration::from_millis(500);
/// Pause between two reads while a lease should be expiring.
pub const EXPIRY_READ_EVERY: Duration = Duration::from_millis(250);
/// How long past its end a lease's key is watched for before the next lease.
pub const EXPIRY_WAIT: Duration = Duration::from_secs(5);
/// Prefix of the leased keys (outside the linearizability workload's keys).
pub const LEASE_KEY_PREFIX: &str = "robustness-lease/";

/// What the lease client did and found.
#[derive(Debug, Default)]
pub struct LeaseLog {
    /// Leases granted with their key written.
    pub leases: usize,
    /// Reads and keep-alives that were checked.
    pub checked: usize,
    /// Leases whose key was seen gone (expired).
    pub expired: usize,
    pub problems: Vec<String>,
}

impl LeaseLog {
    /// The logs of several clients as one.
    pub fn merge(logs: Vec<LeaseLog>) -> LeaseLog {
        let mut all = LeaseLog::default();
        for log in logs {
            all.leases += log.leases;
            all.checked += log.checked;
            all.expired += log.expired;
            all.problems.extend(log.problems);
        }
        all
    }
}

/// Lease client `id` runs leases on `endpoints` until `stop` (see the
/// module docs).
pub async fn run_lease_client(
    id: usize,
    endpoints: Vec<String>,
    seed: u64,
    clock: Clock,
    stop: Arc<AtomicBool>,
) -> LeaseLog {
    let mut rng = StdRng::seed_from_u64(seed ^ (0x1ea5e + id as u64));
    let mut log = LeaseLog::default();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Ok(client) = connect_with_timeout(&endpoints, OP_TIMEOUT).await else {
            tokio::time::sleep(ERROR_BACKOFF).await;
            continue;
        };
        n += 1;
        let mut lease = Lease {
            client,
            clock,
            key: format!("{LEASE_KEY_PREFIX}{id}-{n}"),
            id: 0,
            alive_until: 0,
        };
        if lease.start().await.is_err() {
            tokio::time::sleep(ERROR_BACKOFF).await;
            continue;
        }
        log.leases += 1;
        let keepalives = rng.gen_range(KEEPALIVES);
        for _ in 0..keepalives {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            tokio::time::sleep(KEEPALIVE_EVERY).await;
            lease.keep_alive(&mut log).await;
            lease.read(&mut log).await;
        }
        let give_up = tokio::time::Instant::now()
            + Duration::from_nanos(lease.alive_until.saturating_sub(clock.now()))
            + EXPIRY_WAIT;
        while !stop.load(Ordering::Relaxed) && tokio::time::Instant::now() < give_up {
            tokio::time::sleep(EXPIRY_READ_EVERY).await;
            if lease.read(&mut log).await == Some(false) {
                log.expired += 1;
                break;
            }
        }
    }
    log
}

/// One lease and its key.
struct Lease {
    client: Client,
    clock: Clock,
    key: String,
    id: i64,
    /// Run-clock nanoseconds until which the lease must live.
    alive_until: u64,
}

impl Lease {
    /// Grants the lease and writes its key.
    async fn start(&mut self) -> Result<(), ()> {
        let invoke = self.clock.now();
        let granted = bounded(self.client.lease_grant(LEASE_TTL_SECONDS, None)).await?;
        self.id = granted.id();
        self.extend(invoke, granted.ttl());
        let options = PutOptions::new().with_lease(self.id);
        bounded(self.client.put(self.key.as_str(), "leased", Some(options))).await?;
        Ok(())
    }

    fn extend(&mut self, invoke: u64, ttl: i64) {
        let ttl = Duration::from_secs(u64::try_from(ttl).unwrap_or(0));
        let until = invoke.saturating_add(u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX));
        self.alive_until = self.alive_until.max(until);
    }

    /// One keep-alive on a fresh stream.
    async fn keep_alive(&mut self, log: &mut LeaseLog) {
        let invoke = self.clock.now();
        let Ok((_keeper, mut stream)) = bounded(self.client.lease_keep_alive(self.id)).await else {
            return;
        };
        let Ok(Some(answer)) = bounded(stream.message()).await else {
            return;
        };
        let complete = self.clock.now();
        log.checked += 1;
        if answer.ttl() > 0 {
            self.extend(invoke, answer.ttl());
        } else if complete < self.alive_until {
            log.problems.push(format!(
                "lease {:x} ({}): keep-alive answered at {:.3} ms that it is gone; it must live until {:.3} ms",
                self.id,
                self.key,
                millis(complete),
                millis(self.alive_until)
            ));
        }
    }

    /// A linearizable read of the key: whether it exists (`None` on error).
    async fn read(&mut self, log: &mut LeaseLog) -> Option<bool> {
        let response = bounded(self.client.get(self.key.as_str(), None))
            .await
            .ok()?;
        let complete = self.clock.now();
        let present = !response.kvs().is_empty();
        log.checked += 1;
        if !present && complete < self.alive_until {
            log.problems.push(format!(
                "lease {:x} ({}): the key was gone in a read completed at {:.3} ms; the lease must live until {:.3} ms",
                self.id,
                self.key,
                millis(complete),
                millis(self.alive_until)
            ));
        }
        Some(present)
    }
}

/// `call` within [`OP_TIMEOUT`]; any failure is `Err(())`.
async fn bounded<T, E>(call: impl std::future::Future<Output = Result<T, E>>) -> Result<T, ()> {
    match tokio::time::timeout(OP_TIMEOUT, call).await {
        Ok(Ok(value)) => Ok(value),
        _ => Err(()),
    }
}

fn millis(nanos: u64) -> f64 {
    nanos as f64 / 1e6
}
