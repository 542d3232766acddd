//! Crash durability of the candidate server under SIGKILL.
//!
//! A three-member cluster runs while several clients write unique keys, each
//! client through its own member. In each of a bounded number of rounds, the
//! test SIGKILLs either one random member or all members at once, waits a
//! random time, restarts the killed members with their original flags and
//! waits until the cluster is healthy and writes are being acknowledged
//! again. The fault schedule comes from a seeded RNG; the seed is printed (set
//! `DURABILITY_SEED` to replay a schedule).
//!
//! The members build a snapshot every [`SNAPSHOT_COUNT`] entries and purge
//! the log behind it, so kills also land while a snapshot is taken, members
//! restart from a snapshot, and a member that was down catches up by one.
//!
//! Every acknowledged put is recorded with the revision of its response
//! header. At the end every acknowledged key must be present, through a
//! linearizable read and through a serializable read on every member, with
//! exactly that mod revision and its value. Writes that failed or timed out may
//! or may not have been applied; they are not checked.
//!
//! Run: `STORE_BIN=/opt/etcd-3.5/etcd cargo test -p integration-tests --test integration durability::`

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Result};
use etcd_client::GetResponse;
use integration_tests::client::connect_with_timeout;
use integration_tests::wait::retry_until;
use integration_tests::{Binary, Cluster, ClusterConfig};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::time::{sleep, Instant};

/// Members of the cluster.
const MEMBERS: usize = 3;
/// `--snapshot-count` of every member: a snapshot every few dozen writes
/// (the writers make about one entry each).
const SNAPSHOT_COUNT: u64 = 50;
/// Fault rounds.
const ROUNDS: usize = 5;
/// Concurrent writing clients.
const WRITERS: usize = 4;
/// Per-request timeout of the writers: a write not answered by then counts
/// as unacknowledged.
const WRITE_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause of a writer after a failed write.
const WRITE_BACKOFF: Duration = Duration::from_millis(50);
/// Writers stop by themselves after this long, whatever happens to the test.
const WRITER_LIFETIME: Duration = Duration::from_secs(900);
/// Acknowledged writes required after each recovery (and before each fault),
/// so every round runs under real write load.
const ACKS_PER_ROUND: usize = 20;
/// Deadline for those acknowledged writes to happen.
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(90);
/// Deadline for each member's serializable reads to show every write.
const CONVERGENCE_TIMEOUT: Duration = Duration::from_secs(90);
/// Extra write load before a fault, in milliseconds (drawn uniformly).
const LOAD_MILLIS: std::ops::RangeInclusive<u64> = 200..=1500;
/// Time the killed members stay down, in milliseconds (drawn uniformly).
const DOWNTIME_MILLIS: std::ops::RangeInclusive<u64> = 100..=1500;
/// Environment variable that fixes the RNG seed.
const SEED_ENV: &str = "DURABILITY_SEED";
/// Key prefix of all writes.
const PREFIX: &str = "dur/";

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// SIGKILL one member (leader or follower, as drawn).
    KillOne(usize),
    /// SIGKILL every member at once.
    KillAll,
}

/// One acknowledged put.
#[derive(Clone, Debug)]
struct Ack {
    key: String,
    value: String,
    revision: i64,
}

/// What the writers did, shared with the test.
#[derive(Default)]
struct Ledger {
    acked: Mutex<Vec<Ack>>,
    failed: AtomicUsize,
    stop: AtomicBool,
}

impl Ledger {
    fn acked_count(&self) -> usize {
        self.acked.lock().expect("ledger lock").len()
    }
}

fn seed() -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{SEED_ENV}={text:?} is not a u64")),
        Err(_) => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| elapsed.as_nanos() as u64)
            .unwrap_or_default(),
    }
}

/// As many single-member kills as whole-cluster kills (one more of a random
/// kind if `ROUNDS` is odd), in random order, with random victims.
fn fault_schedule(rng: &mut StdRng) -> Vec<Fault> {
    let mut kill_all: Vec<bool> = (0..ROUNDS).map(|round| round % 2 == 1).collect();
    if ROUNDS % 2 == 1 {
        kill_all[ROUNDS - 1] = rng.gen_bool(0.5);
    }
    kill_all.shuffle(rng);
    kill_all
        .into_iter()
        .map(|all| {
            if all {
                Fault::KillAll
            } else {
                Fault::KillOne(rng.gen_range(0..MEMBERS))
            }
        })
        .collect()
}

/// Writes unique keys through `endpoint` until told to stop.
async fn writer(id: usize, endpoint: String, ledger: Arc<Ledger>) {
    let deadline = Instant::now() + WRITER_LIFETIME;
    let mut sequence = 0u64;
    let mut client = None;
    while !ledger.stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        if client.is_none() {
            client = connect_with_timeout(std::slice::from_ref(&endpoint), WRITE_TIMEOUT)
                .await
                .ok();
        }
        let Some(connected) = client.as_mut() else {
            sleep(WRITE_BACKOFF).await;
            continue;
        };
        sequence += 1;
        let key = format!("{PREFIX}w{id}/{sequence:08}");
        let value = format!("writer {id} write {sequence}");
        match connected.put(key.as_str(), value.as_str(), None).await {
            Ok(response) => {
                let revision = response.header().map_or(0, |header| header.revision());
                ledger.acked.lock().expect("ledger lock").push(Ack {
                    key,
                    value,
                    revision,
                });
            }
            Err(_) => {
                ledger.failed.fetch_add(1, Ordering::Relaxed);
                sleep(WRITE_BACKOFF).await;
            }
        }
    }
}

/// Waits until `ACKS_PER_ROUND` more writes have been acknowledged.
async fn wait_for_progress(ledger: &Ledger, what: &str) {
    let target = ledger.acked_count() + ACKS_PER_ROUND;
    retry_until(what, PROGRESS_TIMEOUT, || async {
        let count = ledger.acked_count();
        ensure!(count >= target, "{count} of {target} writes acknowledged");
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

fn inject(cluster: &Cluster, fault: Fault) {
    match fault {
        Fault::KillOne(i) => cluster.kill(i).expect("kill -9 one member"),
        Fault::KillAll => cluster.kill_all().expect("kill -9 every member"),
    }
}

async fn recover(cluster: &Cluster) {
    for i in 0..cluster.size() {
        if !cluster.is_running(i) {
            cluster.restart(i).expect("restart");
        }
    }
    cluster
        .wait_healthy()
        .await
        .unwrap_or_else(|e| panic!("recovery: {e:#}"));
}

/// Checks that `response` holds every acknowledged write exactly.
fn check_acked(response: &GetResponse, acked: &[Ack]) -> Result<()> {
    let served: BTreeMap<&[u8], (&[u8], i64)> = response
        .kvs()
        .iter()
        .map(|kv| (kv.key(), (kv.value(), kv.mod_revision())))
        .collect();
    let wrong: Vec<String> = acked
        .iter()
        .filter(|ack| served.get(ack.key.as_bytes()) != Some(&(ack.value.as_bytes(), ack.revision)))
        .map(|ack| {
            let found = served.get(ack.key.as_bytes()).map(|(value, revision)| {
                format!("{:?} at {revision}", String::from_utf8_lossy(value))
            });
            format!(
                "{} acknowledged at {} is {}",
                ack.key,
                ack.revision,
                found.unwrap_or("missing".into())
            )
        })
        .collect();
    ensure!(
        wrong.is_empty(),
        "{} of {} acknowledged writes lost or changed, e.g. {:?}",
        wrong.len(),
        acked.len(),
        &wrong[..wrong.len().min(10)]
    );
    Ok(())
}

#[tokio::test]
async fn acknowledged_writes_survive_sigkill() {
    let seed = seed();
    println!("durability seed: {seed} (replay with {SEED_ENV}={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let schedule = fault_schedule(&mut rng);
    println!("fault schedule: {schedule:?}");

    let binary = Binary::candidate().expect("candidate server binary");
    let config = ClusterConfig::new(MEMBERS).with_snapshot_count(SNAPSHOT_COUNT);
    let cluster = Cluster::start(binary, config).await.expect("cluster");
    let ledger = Arc::new(Ledger::default());
    let writers: Vec<_> = (0..WRITERS)
        .map(|id| tokio::spawn(writer(id, cluster.endpoint(id % MEMBERS), ledger.clone())))
        .collect();

    for (round, fault) in schedule.iter().enumerate() {
        wait_for_progress(&ledger, &format!("writes before fault {round}")).await;
        sleep(Duration::from_millis(rng.gen_range(LOAD_MILLIS))).await;
        println!(
            "round {round}: {fault:?} after {} acknowledged writes",
            ledger.acked_count()
        );
        inject(&cluster, *fault);
        sleep(Duration::from_millis(rng.gen_range(DOWNTIME_MILLIS))).await;
        recover(&cluster).await;
    }
    wait_for_progress(&ledger, "writes after the last recovery").await;
    ledger.stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.expect("writer task");
    }

    let acked = ledger.acked.lock().expect("ledger lock").clone();
    println!(
        "{} writes acknowledged, {} failed",
        acked.len(),
        ledger.failed.load(Ordering::Relaxed)
    );
    assert!(acked.len() >= (ROUNDS + 1) * ACKS_PER_ROUND);
    let revisions: HashSet<i64> = acked.iter().map(|ack| ack.revision).collect();
    assert_eq!(
        revisions.len(),
        acked.len(),
        "two acknowledged puts share a revision"
    );
    assert!(
        !revisions.contains(&0),
        "an acknowledged put had no header revision"
    );

    let linearizable = cluster
        .get_prefix(0, PREFIX, false)
        .await
        .expect("linearizable read");
    check_acked(&linearizable, &acked).unwrap_or_else(|e| panic!("linearizable read: {e:#}"));
    for i in 0..MEMBERS {
        retry_until(
            &format!("member {i} to serve every acknowledged write"),
            CONVERGENCE_TIMEOUT,
            || async { check_acked(&cluster.get_prefix(i, PREFIX, true).await?, &acked) },
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    }
}
