//! The robustness suite: concurrent clients on a real 3-member cluster
//! under seeded process faults, and a linearizability check of everything
//! they saw (issue 14, first slice).
//!
//! One run ([`run`]) of one seed against one server (the candidate, or
//! etcd 3.5 as the control):
//!
//! 1. starts a 3-member cluster ([`crate::Cluster`]);
//! 2. runs the [`workload`]'s clients, spread over the members, recording
//!    every operation with its invoke and complete instants ([`history`]);
//! 3. meanwhile the [`nemesis`] injects and heals its seeded faults (kill -9
//!    of the leader, of a follower, of all members; SIGSTOP of the leader;
//!    the leader or a follower cut off from the other members by a network
//!    partition; links between members flapping; links between members
//!    delayed: the members run in network namespaces, [`crate::netns`],
//!    and their peer traffic passes through [`crate::relay`]; leadership
//!    moved to a follower with `MoveLeader`; a follower's disk filled up);
//! 4. stops the clients, waits until the cluster serves, and reads every
//!    key linearizably: those final reads join the history, so an
//!    acknowledged write that is missing from the final state (and not
//!    overwritten by an operation ordered after it) is an anomaly;
//! 5. waits until every member has applied the final revision and compares
//!    their `HashKV` at it: members that applied the same log must hold
//!    the same keys ([`member_hashes`]; a member that never gets there, or
//!    hashes differently, has diverged);
//! 6. checks each key's history for linearizability ([`checker`]), and
//!    the events of one watcher per member, watching every key from
//!    revision 1 through all faults, against etcd's watch guarantees
//!    ([`watch`]), and that no lease of the lease clients, which run leases
//!    one after another through the faults, expired before its TTL
//!    ([`lease`]).
//!
//! The seed fixes the fault schedule and the clients' choices of keys and
//! operations (timing still varies between runs). Every failure message
//! names the seed and how to rerun it: `ROBUSTNESS_SEED=<seed>`.
//! [`seeds`] is [`CI_SEEDS`] by default, `1..=n` with `ROBUSTNESS_SEEDS=n`,
//! and 1, 2, ... for `s` seconds with `ROBUSTNESS_SECONDS=s`; a batch ends
//! with [`summary_table`].

pub mod checker;
pub mod history;
pub mod lease;
pub mod nemesis;
pub mod watch;
pub mod workload;

use std::collections::BTreeMap;
use std::fmt::{self, Write};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::client::{connect_with_timeout, hash_kv_when_applied};
use crate::cluster::{Cluster, ClusterConfig};
use crate::server::{Release, Server};
use crate::wait::retry_until;
use history::{Clock, Event, Op, Outcome};
use nemesis::{FaultKind, Injected};
use workload::{ClientLog, CLIENTS, KEYS, OP_TIMEOUT};

/// Members of the cluster.
pub const MEMBERS: usize = 3;
/// Seeds run when no environment variable says otherwise (CI).
pub const CI_SEEDS: [u64; 2] = [1, 2];
/// Environment variable: run this one seed.
pub const SEED_ENV: &str = "ROBUSTNESS_SEED";
/// Environment variable: run seeds `1..=n`.
pub const SEEDS_ENV: &str = "ROBUSTNESS_SEEDS";
/// Environment variable: run seeds 1, 2, ... for this many seconds (the
/// long mode; it ends with [`summary_table`]).
pub const SECONDS_ENV: &str = "ROBUSTNESS_SECONDS";
/// Deadline for the final reads of every key.
pub const FINAL_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Completed operations a run needs, so that a run in which (nearly)
/// nothing succeeded cannot pass.
pub const MIN_COMPLETED_OPS: usize = 100;
/// Client id of the final reads in the history.
pub const FINAL_READER: usize = CLIENTS;
/// How long each member gets to apply the final revision and answer
/// `HashKV` at it before it counts as diverged.
pub const AGREEMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// The first etcd release without etcd-io/etcd#13766 (fixed by #13908):
/// 3.5.0-3.5.2 could persist a consistent index ahead of the writes it
/// covers, so a member killed under load skipped those writes when it
/// restarted and diverged from the others. On the reference 3.5.1 a run with
/// a kill -9 whose members then hash differently is that bug: reported, not
/// failed ([`RunReport::known_reference_bug`]).
pub const CRASH_CONSISTENCY_FIXED_IN: Release = (3, 5, 3);

/// The member workload client `client` talks to (see [`workload`]).
pub fn member_of(client: usize) -> usize {
    client % MEMBERS
}

/// The seeds to run (see the module documentation); with
/// [`SECONDS_ENV`], seeds 1, 2, ... as long as the time lasts (a run that
/// starts before the deadline finishes).
pub fn seeds() -> Result<Box<dyn Iterator<Item = u64>>> {
    if let Ok(text) = std::env::var(SECONDS_ENV) {
        let seconds: u64 = text
            .parse()
            .with_context(|| format!("{SECONDS_ENV}={text:?} is not a whole number of seconds"))?;
        let deadline = std::time::Instant::now() + Duration::from_secs(seconds);
        return Ok(Box::new(
            (1..).take_while(move |_| std::time::Instant::now() < deadline),
        ));
    }
    Ok(Box::new(seed_list()?.into_iter()))
}

/// The seeds named by [`SEED_ENV`] or [`SEEDS_ENV`], else [`CI_SEEDS`].
fn seed_list() -> Result<Vec<u64>> {
    if let Ok(text) = std::env::var(SEED_ENV) {
        let seed = text
            .parse()
            .with_context(|| format!("{SEED_ENV}={text:?} is not a u64"))?;
        return Ok(vec![seed]);
    }
    if let Ok(text) = std::env::var(SEEDS_ENV) {
        let count: u64 = text
            .parse()
            .with_context(|| format!("{SEEDS_ENV}={text:?} is not a u64"))?;
        return Ok((1..=count).collect());
    }
    Ok(CI_SEEDS.to_vec())
}

/// What one run did and found.
#[derive(Debug)]
pub struct RunReport {
    pub server: Server,
    pub seed: u64,
    pub events: Vec<Event>,
    /// Requests refused at connect (never sent, not in the history).
    pub not_sent: usize,
    /// Answers of the wrong shape (each fails the run).
    pub malformed: Vec<String>,
    pub faults: Vec<Injected>,
    pub check: checker::Report,
    /// Violated watch guarantees (see [`watch::check`]).
    pub watch_problems: Vec<String>,
    /// Events each watcher received, and the streams it needed.
    pub watched: Vec<(usize, usize)>,
    /// What the lease clients did and found (merged).
    pub leases: lease::LeaseLog,
    /// Bytes the members sent each other through the relay (none means the
    /// slow-network fault could not have slowed anything).
    pub relayed_bytes: u64,
    /// The revision of the final reads.
    pub final_revision: i64,
    /// Each member's `HashKV` at `final_revision`, or why there was none
    /// within [`AGREEMENT_TIMEOUT`].
    pub hashes: Vec<std::result::Result<u32, String>>,
    /// The version the members report in Status ("3.5.1").
    pub version: String,
}

impl RunReport {
    /// Operations that completed (final reads included).
    pub fn completed(&self) -> usize {
        self.events.iter().filter(|e| e.complete.is_some()).count()
    }

    /// Operations with an error or timeout.
    pub fn indeterminate(&self) -> usize {
        self.events.len() - self.completed()
    }

    /// For each fault: from the moment it was in place until the first
    /// operation invoked after that completed: the unavailability the
    /// clients saw (a client blocked on a stopped member only invokes again
    /// after its [`OP_TIMEOUT`]; operations in flight at the fault do not count).
    pub fn unavailability(&self) -> Vec<(FaultKind, Option<Duration>)> {
        self.faults
            .iter()
            .map(|fault| {
                let first = self
                    .events
                    .iter()
                    .filter(|e| e.client != FINAL_READER && e.invoke >= fault.at)
                    .filter_map(|e| e.complete)
                    .min();
                let gap = first.map(|at| Duration::from_nanos(at - fault.at));
                (fault.fault.kind, gap)
            })
            .collect()
    }

    /// The workload's operations that failed (an error or no answer) on a
    /// member that was up: neither in flight at, nor sent during, a
    /// disturbance that had the client's member among its victims (from
    /// the disturbance's instant until every member served again). A
    /// rolling upgrade must fail none; faults fail some by design.
    pub fn failed_on_up_members(&self) -> Vec<String> {
        let timeout = OP_TIMEOUT.as_nanos() as u64;
        let excused = |event: &Event| {
            let member = member_of(event.client);
            self.faults.iter().any(|fault| {
                let healed = fault.at + fault.recovery.as_nanos() as u64;
                fault.victims.contains(&member)
                    && event.invoke <= healed
                    && event.invoke + timeout >= fault.at
            })
        };
        self.events
            .iter()
            .filter(|event| event.client != FINAL_READER)
            .filter(|event| matches!(event.outcome, Outcome::Indeterminate(_)))
            .filter(|event| !excused(event))
            .map(|event| {
                format!(
                    "client {} (member {}) at {:.3} s: {} {:?}: {:?}",
                    event.client,
                    member_of(event.client),
                    event.invoke as f64 / 1e9,
                    event.key,
                    event.op,
                    event.outcome
                )
            })
            .collect()
    }

    /// How often each error made an operation indeterminate.
    pub fn errors(&self) -> BTreeMap<&str, usize> {
        let mut errors = BTreeMap::new();
        for event in &self.events {
            if let Outcome::Indeterminate(error) = &event.outcome {
                *errors.entry(error.as_str()).or_insert(0) += 1;
            }
        }
        errors
    }

    /// How the members disagree at the final revision, if they do: one
    /// without a hash, or two different hashes.
    pub fn divergence(&self) -> Option<String> {
        let first = self.hashes.first()?;
        let agree = first.is_ok() && self.hashes.iter().all(|hash| hash == first);
        (!agree).then(|| {
            let members: Vec<String> = self
                .hashes
                .iter()
                .enumerate()
                .map(|(member, hash)| match hash {
                    Ok(hash) => format!("member {member}: {hash:#010x}"),
                    Err(error) => format!("member {member}: {error}"),
                })
                .collect();
            format!(
                "members diverged: HashKV at the final revision {}: {}",
                self.final_revision,
                members.join("; ")
            )
        })
    }

    /// The reference etcd's crash inconsistency ([`CRASH_CONSISTENCY_FIXED_IN`]),
    /// when this run shows it: the binary is that release, a kill -9 hit a
    /// member, and the members diverged. Everything that depends on the
    /// members' state (linearizability, watches, leases) then follows from
    /// the bug and is not failed; the message says what was excused.
    pub fn known_reference_bug(&self) -> Option<String> {
        let killed = self.faults.iter().any(|fault| {
            matches!(
                fault.fault.kind,
                FaultKind::KillLeader | FaultKind::KillFollower | FaultKind::KillAll
            )
        });
        let divergence = self.divergence()?;
        if !killed
            || !self
                .server
                .has_known_bug(&self.version, CRASH_CONSISTENCY_FIXED_IN)
        {
            return None;
        }
        Some(format!(
            "KNOWN BUG of the reference etcd {} (etcd-io/etcd#13766, fixed in {CRASH_CONSISTENCY_FIXED_IN:?}), \
             seed {}, not failed: {divergence}; excused with it: {} anomalies, {} watch problems, {} lease problems",
            self.version,
            self.seed,
            self.check.anomalies.len(),
            self.watch_problems.len(),
            self.leases.problems.len()
        ))
    }

    /// Why the run failed, if it did; always names the seed.
    pub fn failure(&self) -> Option<String> {
        let mut problems = String::new();
        if self.known_reference_bug().is_none() {
            self.state_problems(&mut problems);
        }
        for malformed in &self.malformed {
            let _ = writeln!(problems, "malformed answer: {malformed}");
        }
        for (kind, gap) in self.unavailability() {
            if gap.is_none() {
                let _ = writeln!(
                    problems,
                    "no operation invoked after the fault {kind} completed (the clients stopped or never recovered)"
                );
            }
        }
        let slowed = self
            .faults
            .iter()
            .any(|fault| fault.fault.kind == FaultKind::SlowNetwork);
        if slowed && self.relayed_bytes == 0 {
            let _ = writeln!(
                problems,
                "no peer traffic went through the relay: the slow-network fault delayed nothing"
            );
        }
        if self.completed() < MIN_COMPLETED_OPS {
            let _ = writeln!(
                problems,
                "only {} operations completed (at least {MIN_COMPLETED_OPS} required)",
                self.completed()
            );
        }
        (!problems.is_empty()).then(|| {
            format!(
                "{:?} seed {} failed (rerun: {SEED_ENV}={} cargo test --release -p integration-tests --test integration robustness::):\n{problems}",
                self.server, self.seed, self.seed
            )
        })
    }

    /// What the members' state broke: divergence, anomalies, watch
    /// guarantees, leases.
    fn state_problems(&self, problems: &mut String) {
        if let Some(divergence) = self.divergence() {
            let _ = writeln!(problems, "{divergence}");
        }
        for anomaly in &self.check.anomalies {
            let _ = writeln!(problems, "{anomaly}");
        }
        for watch in &self.watch_problems {
            let _ = writeln!(problems, "watch: {watch}");
        }
        for lease in &self.leases.problems {
            let _ = writeln!(problems, "lease: {lease}");
        }
    }
}

impl fmt::Display for RunReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} seed {}: {} ops ({} completed, {} indeterminate, {} refused at connect), {} search states, {} anomalies; faults:",
            self.server,
            self.seed,
            self.events.len(),
            self.completed(),
            self.indeterminate(),
            self.not_sent,
            self.check.states,
            self.check.anomalies.len()
        )?;
        for (fault, (kind, gap)) in self.faults.iter().zip(self.unavailability()) {
            write!(
                f,
                " [{kind} {:?}, down {:?}: unavailable {:?}, all members back after {:?}]",
                fault.victims, fault.fault.downtime, gap, fault.recovery
            )?;
        }
        write!(
            f,
            "; watchers (events, streams): {:?}, {} watch problems; leases: {} granted, {} expired, {} checks, {} problems; {} KiB relayed between members; {}; errors: {:?}",
            self.watched,
            self.watch_problems.len(),
            self.leases.leases,
            self.leases.expired,
            self.leases.checked,
            self.leases.problems.len(),
            self.relayed_bytes / 1024,
            self.divergence()
                .unwrap_or_else(|| format!("members agree at revision {}", self.final_revision)),
            self.errors()
        )
    }
}

/// One run of `seed` against `server` (see the module documentation).
pub async fn run(server: Server, seed: u64) -> Result<RunReport> {
    let plan = nemesis::schedule(&mut StdRng::seed_from_u64(seed));
    let config = ClusterConfig {
        namespaces: true,
        ..ClusterConfig::new(MEMBERS)
    };
    run_with(server, seed, config, move |cluster, clock| {
        Box::pin(async move { nemesis::run(cluster, clock, &plan).await })
    })
    .await
}

/// What disturbs a run's cluster while the clients work (the nemesis, or
/// a rolling upgrade, `tests/upgrade.rs`): it answers the disturbances it made.
pub type Disturbing<'a> = Pin<Box<dyn Future<Output = Result<Vec<Injected>>> + 'a>>;

/// One run of `seed` against `server` on a cluster of `config`, disturbed
/// by `drive` (steps 2 to 6 of the module documentation).
pub async fn run_with(
    server: Server,
    seed: u64,
    config: ClusterConfig,
    drive: impl for<'a> FnOnce(&'a Cluster, Clock) -> Disturbing<'a>,
) -> Result<RunReport> {
    let context = || format!("{server:?} seed {seed} ({SEED_ENV}={seed} reruns it)");
    let cluster = Cluster::start(server.binary(), config)
        .await
        .with_context(context)?;
    let clock = Clock::start();
    let stop = Arc::new(AtomicBool::new(false));
    let target = watch::Target::default();
    let watchers: Vec<_> = (0..MEMBERS)
        .map(|member| {
            let endpoint = cluster.endpoint(member);
            tokio::spawn(watch::run_watcher(member, endpoint, target.clone()))
        })
        .collect();
    let leases: Vec<_> = (0..lease::LEASE_CLIENTS)
        .map(|id| {
            tokio::spawn(lease::run_lease_client(
                id,
                cluster.endpoints(),
                seed,
                clock,
                stop.clone(),
            ))
        })
        .collect();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let endpoint = cluster.endpoint(member_of(id));
            tokio::spawn(workload::run_client(
                id,
                endpoint,
                seed,
                clock,
                stop.clone(),
            ))
        })
        .collect();
    let faults = drive(&cluster, clock).await;
    stop.store(true, Ordering::Relaxed);
    let mut logs = Vec::with_capacity(CLIENTS);
    for client in clients {
        logs.push(client.await.context("client task")?);
    }
    let mut lease_logs = Vec::with_capacity(leases.len());
    for client in leases {
        lease_logs.push(client.await.context("lease client task")?);
    }
    let leases = lease::LeaseLog::merge(lease_logs);
    let faults = faults.with_context(context)?;
    let mut events: Vec<Event> = logs.iter().flat_map(|log| log.events.clone()).collect();
    events.extend(final_reads(&cluster, clock).await.with_context(context)?);
    let final_revision = final_revision(&cluster).await.with_context(context)?;
    target.store(final_revision, Ordering::SeqCst);
    let mut watch_logs = Vec::with_capacity(MEMBERS);
    for watcher in watchers {
        watch_logs.push(watcher.await.context("watcher task")?);
    }
    let hashes = member_hashes(&cluster, final_revision).await;
    let version = cluster
        .status(0)
        .await
        .with_context(context)?
        .version()
        .to_string();
    let watch_problems = watch::check(&watch_logs, &events);
    let check = checker::check(&events);
    Ok(RunReport {
        server,
        seed,
        not_sent: logs.iter().map(|log| log.not_sent).sum(),
        malformed: logs.iter().flat_map(malformed_of).collect(),
        events,
        faults,
        check,
        watch_problems,
        watched: watch_logs
            .iter()
            .map(|l| (l.events.len(), l.streams))
            .collect(),
        leases,
        relayed_bytes: cluster.relay().map_or(0, |relay| relay.relayed_bytes()),
        final_revision,
        hashes,
        version,
    })
}

/// Each member's `HashKV` at `revision` once it has applied it
/// ([`hash_kv_when_applied`], at most [`AGREEMENT_TIMEOUT`] each), or the
/// error of a member that never answered.
async fn member_hashes(cluster: &Cluster, revision: i64) -> Vec<std::result::Result<u32, String>> {
    let mut hashes = Vec::with_capacity(cluster.size());
    for member in 0..cluster.size() {
        let hash = hash_kv_when_applied(&cluster.endpoint(member), revision, AGREEMENT_TIMEOUT)
            .await
            .map(|(hash, _, _)| hash);
        hashes.push(hash.map_err(|error| format!("{error:#}")));
    }
    hashes
}

/// The cluster's revision once the clients have stopped (at least 1, so
/// the watchers always have a target).
async fn final_revision(cluster: &Cluster) -> Result<i64> {
    retry_until("the final revision", FINAL_READ_TIMEOUT, || async {
        let mut client = connect_with_timeout(&cluster.endpoints(), OP_TIMEOUT).await?;
        let response = client.get(workload::KEY_PREFIX, None).await?;
        let header = response.header().context("a range without header")?;
        Ok(header.revision().max(1))
    })
    .await
}

fn malformed_of(log: &ClientLog) -> Vec<String> {
    log.malformed.clone()
}

/// A linearizable read of every key once the cluster serves, as events.
async fn final_reads(cluster: &Cluster, clock: Clock) -> Result<Vec<Event>> {
    cluster.wait_healthy().await?;
    let mut events = Vec::with_capacity(KEYS);
    for i in 0..KEYS {
        let key = workload::key(i);
        let event = retry_until(
            &format!("a final read of {key}"),
            FINAL_READ_TIMEOUT,
            || read(cluster, clock, key.clone()),
        )
        .await?;
        events.push(event);
    }
    Ok(events)
}

/// One linearizable get of `key` through all members, as an event.
async fn read(cluster: &Cluster, clock: Clock, key: String) -> Result<Event> {
    let mut client = connect_with_timeout(&cluster.endpoints(), OP_TIMEOUT).await?;
    let invoke = clock.now();
    let response = client.get(key.as_str(), None).await?;
    let complete = clock.now();
    let observed = response.kvs().first().map(|kv| {
        (
            String::from_utf8_lossy(kv.value()).into_owned(),
            kv.mod_revision(),
        )
    });
    Ok(Event {
        client: FINAL_READER,
        key,
        op: Op::Get,
        invoke,
        complete: Some(complete),
        outcome: Outcome::Read(observed),
    })
}

/// A Markdown table of a batch of runs: totals, then per fault kind the
/// median and longest unavailability the clients saw.
pub fn summary_table(reports: &[RunReport]) -> String {
    let sum = |f: fn(&RunReport) -> usize| reports.iter().map(f).sum::<usize>();
    let mut table = String::from("| | total |\n| --- | --- |\n");
    let rows: [(&str, usize); 8] = [
        ("runs", reports.len()),
        ("operations recorded", sum(|r| r.events.len())),
        ("completed", sum(RunReport::completed)),
        ("indeterminate", sum(RunReport::indeterminate)),
        (
            "linearizability anomalies",
            sum(|r| r.check.anomalies.len()),
        ),
        (
            "watch guarantee violations",
            sum(|r| r.watch_problems.len()),
        ),
        ("lease problems", sum(|r| r.leases.problems.len())),
        (
            "runs whose members diverged",
            sum(|r| usize::from(r.divergence().is_some())),
        ),
    ];
    for (name, value) in rows {
        let _ = writeln!(table, "| {name} | {value} |");
    }
    table.push_str("\n| fault | runs | unavailability, median / longest |\n| --- | --- | --- |\n");
    for (kind, gaps) in unavailability_by_kind(reports) {
        let median = gaps[gaps.len() / 2];
        let longest = gaps[gaps.len() - 1];
        let _ = writeln!(
            table,
            "| {kind} | {} | {:.2} s / {:.2} s |",
            gaps.len(),
            median.as_secs_f64(),
            longest.as_secs_f64()
        );
    }
    table
}

/// Unavailability per fault kind over `reports`, each kind's gaps sorted
/// (faults never followed by a completed operation fail their run and are
/// left out).
fn unavailability_by_kind(reports: &[RunReport]) -> BTreeMap<FaultKind, Vec<Duration>> {
    let mut gaps: BTreeMap<FaultKind, Vec<Duration>> = BTreeMap::new();
    for (kind, gap) in reports.iter().flat_map(RunReport::unavailability) {
        if let Some(gap) = gap {
            gaps.entry(kind).or_default().push(gap);
        }
    }
    for kind_gaps in gaps.values_mut() {
        kind_gaps.sort();
    }
    gaps
}

/// Unavailability per fault kind: the longest over `reports`.
pub fn longest_unavailability(reports: &[RunReport]) -> BTreeMap<FaultKind, Duration> {
    unavailability_by_kind(reports)
        .into_iter()
        .map(|(kind, gaps)| (kind, gaps[gaps.len() - 1]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(events: Vec<Event>) -> RunReport {
        let check = checker::check(&events);
        RunReport {
            server: Server::Candidate,
            seed: 7,
            events,
            not_sent: 0,
            malformed: Vec::new(),
            faults: Vec::new(),
            check,
            watch_problems: Vec::new(),
            watched: Vec::new(),
            leases: lease::LeaseLog::default(),
            relayed_bytes: 1,
            final_revision: 1,
            hashes: vec![Ok(7); MEMBERS],
            version: "0.0.0".to_string(),
        }
    }

    fn get(client: usize, invoke: u64, observed: history::Observed) -> Event {
        Event {
            client,
            key: workload::key(0),
            op: Op::Get,
            invoke,
            complete: Some(invoke + 1),
            outcome: Outcome::Read(observed),
        }
    }

    #[test]
    fn failures_name_the_seed_and_the_failing_history() {
        let mut events: Vec<Event> = (0..MIN_COMPLETED_OPS as u64)
            .map(|i| get(0, 10 * i, None))
            .collect();
        events.push(get(1, 5_000, Some(("never-written".to_string(), 3))));
        let failure = report(events).failure().expect("a failing run");
        assert!(failure.contains("seed 7"), "{failure}");
        assert!(failure.contains("ROBUSTNESS_SEED=7"), "{failure}");
        assert!(failure.contains("never-written"), "{failure}");
    }

    fn fault(kind: FaultKind, at: u64) -> Injected {
        Injected {
            fault: nemesis::Fault {
                kind,
                load: Duration::ZERO,
                downtime: Duration::ZERO,
                seed: 0,
            },
            victims: vec![0],
            at,
            recovery: Duration::ZERO,
        }
    }

    /// A run with enough completed operations, one anomaly, a kill -9 and
    /// members 0 and 1 hashing differently at the final revision.
    fn diverged(server: Server, version: &str) -> RunReport {
        let mut events: Vec<Event> = (0..MIN_COMPLETED_OPS as u64)
            .map(|i| get(0, 10 * i, None))
            .collect();
        events.push(get(1, 5_000, Some(("never-written".to_string(), 3))));
        let mut run = report(events);
        run.server = server;
        run.version = version.to_string();
        run.faults = vec![fault(FaultKind::KillAll, 1)];
        run.hashes = vec![Ok(1), Ok(2), Ok(1)];
        run
    }

    #[test]
    fn members_that_do_not_hash_alike_fail_the_run() {
        let mut run = report(
            (0..MIN_COMPLETED_OPS as u64)
                .map(|i| get(0, 10 * i, None))
                .collect(),
        );
        assert_eq!(run.failure(), None);
        run.hashes = vec![Ok(1), Ok(1), Err("timed out".to_string())];
        let failure = run.failure().expect("a member without a hash");
        assert!(failure.contains("member 2: timed out"), "{failure}");
        let failure = diverged(Server::Candidate, "3.5.1")
            .failure()
            .expect("diverged members");
        assert!(failure.contains("members diverged"), "{failure}");
        assert!(failure.contains("never-written"), "{failure}");
    }

    #[test]
    fn the_reference_crash_inconsistency_is_reported_not_failed() {
        let run = diverged(Server::Reference, "3.5.1");
        let known = run.known_reference_bug().expect("the known bug");
        assert!(known.contains("etcd-io/etcd#13766"), "{known}");
        assert!(known.contains("1 anomalies"), "{known}");
        assert_eq!(run.failure(), None);
        let fixed = diverged(Server::Reference, "3.5.3");
        assert!(
            fixed.failure().is_some(),
            "a release with the fix is held to it"
        );
        let mut not_killed = diverged(Server::Reference, "3.5.1");
        not_killed.faults = vec![fault(FaultKind::PauseLeader, 1)];
        assert!(not_killed.failure().is_some(), "only a kill -9 excuses it");
    }

    #[test]
    fn the_summary_table_counts_runs_and_takes_medians() {
        let with_gap = |gap_nanos: u64| {
            let mut r = report(vec![get(0, 1_000 + gap_nanos - 1, None)]);
            r.faults = vec![fault(FaultKind::KillLeader, 1_000)];
            r
        };
        let table = summary_table(&[
            with_gap(1_000_000_000),
            with_gap(3_000_000_000),
            with_gap(2_000_000_000),
        ]);
        assert!(table.contains("| runs | 3 |"), "{table}");
        assert!(table.contains("| operations recorded | 3 |"), "{table}");
        assert!(
            table.contains("| kill -9 leader | 3 | 2.00 s / 3.00 s |"),
            "{table}"
        );
    }

    /// A failed operation counts against a rolling upgrade unless its
    /// member was being replaced while it was in flight.
    #[test]
    fn failures_on_a_replaced_member_are_excused_others_are_not() {
        let second = 1_000_000_000;
        let failed = |client: usize, invoke: u64| Event {
            client,
            key: workload::key(0),
            op: Op::Get,
            invoke,
            complete: None,
            outcome: Outcome::Indeterminate("transport error".to_string()),
        };
        let mut run = report(vec![
            // Member 0, in flight when its replacement began.
            failed(0, 10 * second - OP_TIMEOUT.as_nanos() as u64 + 1),
            // Member 0, sent while it was down.
            failed(MEMBERS, 12 * second),
            // Member 1, up all along.
            failed(1, 12 * second),
            // Member 0, after it served again.
            failed(0, 16 * second),
        ]);
        let mut replaced = fault(FaultKind::UpgradeMember, 10 * second);
        replaced.recovery = Duration::from_secs(5);
        run.faults = vec![replaced];
        let found = run.failed_on_up_members();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("client 1 (member 1) at 12.000 s"),
            "{found:?}"
        );
        assert!(
            found[1].starts_with("client 0 (member 0) at 16.000 s"),
            "{found:?}"
        );
    }

    #[test]
    fn a_run_that_did_too_little_fails() {
        let failure = report(vec![get(0, 0, None)])
            .failure()
            .expect("a failing run");
        assert!(failure.contains("operations completed"), "{failure}");
    }

    #[test]
    fn the_schedule_is_fixed_by_the_seed_and_has_every_fault_once() {
        let plan = |seed| nemesis::schedule(&mut StdRng::seed_from_u64(seed));
        let kinds = |seed| {
            let mut kinds: Vec<FaultKind> = plan(seed).iter().map(|f| f.kind).collect();
            kinds.sort();
            kinds
        };
        assert_eq!(format!("{:?}", plan(3)), format!("{:?}", plan(3)));
        assert_eq!(
            kinds(3),
            [
                FaultKind::KillLeader,
                FaultKind::KillFollower,
                FaultKind::KillAll,
                FaultKind::PauseLeader,
                FaultKind::PartitionLeader,
                FaultKind::PartitionFollower,
                FaultKind::LossyNetwork,
                FaultKind::SlowNetwork,
                FaultKind::TransferLeader,
                FaultKind::FullDisk,
            ]
        );
        for fault in plan(3) {
            let millis = fault.downtime.as_millis() as u64;
            let range = match fault.kind {
                FaultKind::PauseLeader => nemesis::PAUSE_MILLIS,
                FaultKind::PartitionLeader
                | FaultKind::PartitionFollower
                | FaultKind::LossyNetwork
                | FaultKind::SlowNetwork => nemesis::PARTITION_MILLIS,
                FaultKind::TransferLeader => 0..=0,
                _ => nemesis::DOWNTIME_MILLIS,
            };
            assert!(range.contains(&millis), "{fault:?}");
        }
    }
}
