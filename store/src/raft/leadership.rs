//! Who leads, as etcd's health checks and `etcd_server_has_leader` see it.
//!
//! etcd runs Raft with CheckQuorum: a leader that hears from no quorum for
//! an election timeout steps down, so "has a leader" turns false on every
//! member of a cluster that lost its quorum within about one election
//! timeout. openraft keeps such a leader in place, so this module
//! applies etcd's rule on top of it: a member that leads counts as
//! having a leader only while a quorum acknowledged it within the last
//! election timeout. openraft reports the instant of the last quorum
//! acknowledgement in its metrics; it is recorded whenever the leader is
//! asked for and by a watcher task, and its staleness is measured against
//! the clock when asked. A follower counts its leader only while it heard from it within
//! the last election timeout ([`LeaderContact`]): etcd's follower forgets
//! its leader when it starts a pre-vote, while openraft's pre-vote leaves a
//! follower's view unchanged until a real election starts, which without
//! a quorum never happens.
//!
//! Leader changes are counted the way etcd does
//! (`etcd_server_leader_changes_seen_total`: each time a leader is known
//! and differs from the previous one, including after a leaderless spell,
//! so a leader that lost its quorum and got it back counts once more, as
//! etcd's leader steps down and is elected again), by whoever looks: health
//! checks and `/metrics` as well as a watcher task, which wakes on every change
//! of openraft's server metrics (state, leader, vote, membership; not on
//! the replication progress every write changes, which woke it several
//! times per write) and, between them, every
//! [`LEADER_CHECKS_PER_TIMEOUT`]th of an election timeout, since staleness
//! sets in without any report.

use openraft::async_runtime::WatchReceiver as _;
use openraft::Instant as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::ServerState;

use crate::raft::RaftMetrics;
use tokio::time::Instant;

use super::{NodeId, Raft};
use crate::metrics;

/// No quorum acknowledgement recorded yet.
const NEVER: u64 = u64::MAX;

/// How often per election timeout the watcher re-evaluates the leader
/// when openraft reports nothing.
const LEADER_CHECKS_PER_TIMEOUT: u32 = 4;

/// This member's view of leadership (cheap to clone).
#[derive(Clone)]
pub struct Leadership {
    raft: Raft,
    /// Last quorum acknowledgement of this member's leadership.
    quorum_ack: Stamp,
    contact: LeaderContact,
    election_timeout: Duration,
    /// The leader last seen by anyone who asked (the watcher, health
    /// checks, metrics), for `etcd_server_leader_changes_seen_total`.
    last_seen: Arc<Mutex<Option<NodeId>>>,
}

/// An instant, kept as milliseconds since `base` ([`NEVER`]: none yet), and
/// how long after it something counts as fresh. Clones share the instant.
#[derive(Clone)]
struct Stamp {
    base: Instant,
    ms: Arc<AtomicU64>,
    fresh_for: Duration,
}

impl Stamp {
    fn new(fresh_for: Duration) -> Self {
        Self {
            base: Instant::now(),
            ms: Arc::new(AtomicU64::new(NEVER)),
            fresh_for,
        }
    }

    /// Now, on this stamp's clock.
    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    fn get(&self) -> u64 {
        self.ms.load(Ordering::Relaxed)
    }

    fn set(&self, ms: u64) {
        self.ms.store(ms, Ordering::Relaxed);
    }

    /// Time left until the stamp is older than `fresh_for` (`None`: no
    /// stamp, or already stale).
    fn until_stale(&self) -> Option<Duration> {
        let at = self.get();
        if at == NEVER {
            return None;
        }
        let stale_at = at + self.fresh_for.as_millis() as u64 + 1;
        let now = self.now_ms();
        (stale_at > now).then(|| Duration::from_millis(stale_at - now))
    }
}

/// When this member last heard from the leader it follows: an
/// AppendEntries, heartbeat or snapshot that it accepted (the peer service
/// records them). Cheap to clone; clones share the record.
#[derive(Clone)]
pub struct LeaderContact(Stamp);

impl LeaderContact {
    /// A record with no contact yet; contacts count for `election_timeout`.
    pub fn new(election_timeout: Duration) -> Self {
        Self(Stamp::new(election_timeout))
    }

    /// Records a message from the leader, now.
    pub fn record(&self) {
        self.0.set(self.0.now_ms());
    }

    /// Time left until the last contact is too old (`None`: none, or stale).
    pub fn until_stale(&self) -> Option<Duration> {
        self.0.until_stale()
    }

    /// The leader as this member sees it: openraft's, except that a
    /// follower that has not heard from its leader for an election timeout
    /// has none (as etcd's follower once it starts a pre-vote).
    pub fn leader(&self, m: &RaftMetrics) -> Option<NodeId> {
        match m.current_leader {
            Some(id) if id != m.id && self.until_stale().is_none() => None,
            other => other,
        }
    }
}

impl Leadership {
    /// Starts watching `raft`; the watcher ends when Raft stops. `contact`
    /// is the member's record of messages from its leader.
    pub fn spawn(raft: Raft, contact: LeaderContact, election_timeout: Duration) -> Self {
        let leadership = Leadership {
            raft,
            quorum_ack: Stamp::new(election_timeout),
            contact,
            election_timeout,
            last_seen: Arc::default(),
        };
        tokio::spawn(watch(leadership.clone()));
        leadership
    }

    /// The leader, or `None` when there is none: a follower that knows no
    /// leader or has not heard from it for an election timeout, or a leader
    /// that no quorum acknowledged for an election timeout.
    pub fn leader(&self) -> Option<NodeId> {
        let m = self.raft.metrics().borrow_watched().clone();
        record_quorum_ack(&self.quorum_ack, &m);
        let leader = match m.current_leader {
            Some(id) if id == m.id && !self.quorum_fresh(&m) => None,
            _ => self.contact.leader(&m),
        };
        self.observe(leader);
        leader
    }

    /// Counts a leader change when a leader is seen that differs from the
    /// one seen last (none included), whoever looked.
    fn observe(&self, leader: Option<NodeId>) {
        let mut last = self.last_seen.lock().unwrap_or_else(|p| p.into_inner());
        if leader.is_some() && leader != *last {
            metrics::global().server.leader_changes_seen.inc();
        }
        *last = leader;
    }

    /// True when a leader exists (etcd's `etcd_server_has_leader`).
    pub fn has_leader(&self) -> bool {
        self.leader().is_some()
    }

    /// Resolves once this member sees no leader, looking every
    /// [`LEADER_CHECKS_PER_TIMEOUT`]th of an election timeout (for a
    /// health check that must not wait out a read's timeout).
    pub async fn until_leaderless(&self) {
        let pause = self.election_timeout / LEADER_CHECKS_PER_TIMEOUT;
        while self.has_leader() {
            tokio::time::sleep(pause).await;
        }
    }

    /// True when this member leads with a quorum behind it.
    pub fn is_leader(&self) -> bool {
        let m = self.raft.metrics().borrow_watched().clone();
        m.state == ServerState::Leader && self.leader() == Some(m.id)
    }

    /// True when this member is a learner (not a voter).
    pub fn is_learner(&self) -> bool {
        is_learner(&self.raft.metrics().borrow_watched())
    }

    /// A single voter, or a leader with no acknowledgement recorded yet,
    /// counts as acknowledged; otherwise within the last election timeout.
    fn quorum_fresh(&self, m: &RaftMetrics) -> bool {
        m.membership_config.membership().voter_ids().count() <= 1
            || self.quorum_ack.get() == NEVER
            || self.quorum_ack.until_stale().is_some()
    }
}

/// True when `m`'s member is in the membership as a learner only.
pub fn is_learner(m: &RaftMetrics) -> bool {
    let membership = m.membership_config.membership();
    membership.learner_ids().any(|id| id == m.id) && !membership.voter_ids().any(|id| id == m.id)
}

/// Follows openraft's metrics: records quorum acknowledgements and counts
/// leader changes.
async fn watch(leadership: Leadership) {
    let mut rx = leadership.raft.server_metrics();
    let pause = leadership.election_timeout / LEADER_CHECKS_PER_TIMEOUT;
    loop {
        rx.borrow_and_update();
        leadership.leader();
        // Wake when the leadership would turn stale, so a leaderless
        // spell is seen however short it is.
        let wait = [
            leadership.quorum_ack.until_stale(),
            leadership.contact.until_stale(),
        ]
        .into_iter()
        .flatten()
        .fold(pause, Duration::min);
        if let Ok(Err(_)) = tokio::time::timeout(wait, rx.changed()).await {
            return;
        }
    }
}

fn record_quorum_ack(quorum_ack: &Stamp, m: &RaftMetrics) {
    let now = quorum_ack.now_ms();
    let previous = quorum_ack.get();
    let since_ack = m
        .last_quorum_acked
        .as_ref()
        .map(|at| at.elapsed().as_millis() as u64);
    let acked = match (m.state, since_ack) {
        (ServerState::Leader, Some(ms)) => now.saturating_sub(ms),
        // A new leader has not heard back yet: it was acknowledged by the
        // quorum that elected it just now. Later reports without a time
        // say nothing new.
        (ServerState::Leader, None) if previous == NEVER => now,
        (ServerState::Leader, None) => previous,
        _ => NEVER,
    };
    let keep_newer = previous != NEVER && acked != NEVER && previous > acked;
    if !keep_newer {
        quorum_ack.set(acked);
    }
}
