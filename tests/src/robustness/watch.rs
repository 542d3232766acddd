//! Watchers of a run and etcd's watch guarantees.
//!
//! One watcher per member watches every key of the run ([`WATCH_PREFIX`]:
//! the clients' keys and the lease client's) from revision 1, through
//! every fault: when its stream breaks (its member killed,
//! stopped or cut off), it reconnects and resumes from the revision after
//! the last event it received, as clients are told they may. Once the run's
//! final revision is known, each watcher reads until it has received it.
//! No compaction runs, so every watcher must see the whole history.
//!
//! The guarantees checked ([`check`]), after etcd's robustness suite:
//! - **ordered**: every watcher's events have strictly increasing revisions
//!   (every operation of the workload changes one key, so one event per
//!   revision): no event is delivered twice, none out of order, also
//!   across reconnects;
//! - **no gaps, same history everywhere**: the three watchers, served by
//!   three different members, deliver exactly the same events (revision,
//!   key, kind, value), so a member that skipped, invented or reordered an
//!   event differs from the others;
//! - **complete**: every acknowledged put or successful compare-and-swap
//!   appears as a put event of its key, value and revision;
//! - **valid**: every put event on a client's key carries a value some
//!   client wrote on that key.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, WatchOptions};

use super::history::{Event, Outcome};
use super::workload::{ERROR_BACKOFF, KEY_PREFIX};

/// The prefix the watchers watch: every key a run writes (the clients'
/// [`KEY_PREFIX`] and the lease client's), so that every revision of the
/// run is an event and a watcher can tell it has reached the final one.
pub const WATCH_PREFIX: &str = "robustness";
use crate::client::connect_with_timeout;

/// Request timeout of a watcher's connection: bounds one watch stream (it
/// reconnects and resumes after it).
pub const WATCH_STREAM_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound of one read of a stream before the watcher re-checks whether it is done.
pub const READ_POLL: Duration = Duration::from_millis(200);
/// Once the final revision is known, how long a watcher may take to reach it.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);
/// Events one watcher keeps, at most (a run writes far fewer).
pub const MAX_EVENTS: usize = 100_000;

/// Revision the watchers must reach; 0 while the run goes on.
pub type Target = Arc<AtomicI64>;

/// One event as a watcher received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub revision: i64,
    pub key: String,
    /// `None` for a delete.
    pub value: Option<String>,
}

/// What one watcher received, and what it found wrong on the way.
#[derive(Debug, Default)]
pub struct WatchLog {
    pub member: usize,
    pub events: Vec<Seen>,
    pub problems: Vec<String>,
    /// Streams opened (1 plus the reconnects).
    pub streams: usize,
}

/// Watches the run's prefix on `endpoint` (member `member`) from revision 1
/// until it has received `target`'s revision (see the module docs).
pub async fn run_watcher(member: usize, endpoint: String, target: Target) -> WatchLog {
    let mut log = WatchLog {
        member,
        ..WatchLog::default()
    };
    let mut next = 1i64;
    let mut catch_up_deadline = None;
    loop {
        let goal = target.load(Ordering::SeqCst);
        if goal > 0 {
            if next > goal {
                // Writes after the final revision (a lease expiring once
                // the clients stopped) are not part of the checked history.
                log.events.retain(|seen| seen.revision <= goal);
                return log;
            }
            let deadline = *catch_up_deadline
                .get_or_insert_with(|| tokio::time::Instant::now() + CATCH_UP_TIMEOUT);
            if tokio::time::Instant::now() >= deadline {
                log.problems.push(format!(
                    "the watcher on member {member} received revisions up to {} only, the run ended at {goal}",
                    next - 1
                ));
                return log;
            }
        }
        if log.events.len() >= MAX_EVENTS {
            log.problems
                .push(format!("more than {MAX_EVENTS} events on member {member}"));
            return log;
        }
        if let Err(()) = follow(&mut log, &endpoint, &mut next, &target).await {
            tokio::time::sleep(ERROR_BACKOFF).await;
        }
    }
}

/// One stream from `next` on: records its events until it breaks (`Err`)
/// or the watcher has reached the target (`Ok`).
async fn follow(
    log: &mut WatchLog,
    endpoint: &str,
    next: &mut i64,
    target: &Target,
) -> Result<(), ()> {
    let client = connect_with_timeout(&[endpoint.to_string()], WATCH_STREAM_TIMEOUT)
        .await
        .map_err(|_| ())?;
    let options = WatchOptions::new().with_prefix().with_start_revision(*next);
    let (_sender, mut stream) = client
        .watch_client()
        .watch(WATCH_PREFIX, Some(options))
        .await
        .map_err(|_| ())?
        .split();
    log.streams += 1;
    loop {
        let goal = target.load(Ordering::SeqCst);
        if goal > 0 && *next > goal {
            return Ok(());
        }
        let response = match tokio::time::timeout(READ_POLL, stream.message()).await {
            Err(_) if goal > 0 => return Err(()),
            Err(_) => continue,
            Ok(Ok(Some(response))) => response,
            Ok(_) => return Err(()),
        };
        if response.compact_revision() > 0 {
            log.problems.push(format!(
                "member {}: watch from revision {next} answered compacted at {} (nothing compacts in this run)",
                log.member,
                response.compact_revision()
            ));
        }
        if response.canceled() {
            return Err(());
        }
        for event in response.events() {
            let Some(kv) = event.kv() else {
                log.problems
                    .push(format!("member {}: an event without a key", log.member));
                continue;
            };
            let seen = Seen {
                revision: kv.mod_revision(),
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                value: (event.event_type() == EventType::Put)
                    .then(|| String::from_utf8_lossy(kv.value()).into_owned()),
            };
            if seen.revision < *next {
                log.problems.push(format!(
                    "member {}: event {seen:?} after revision {} was delivered (duplicate or out of order)",
                    log.member,
                    *next - 1
                ));
                continue;
            }
            *next = seen.revision + 1;
            log.events.push(seen);
        }
        if log.events.len() >= MAX_EVENTS {
            // The caller reports it and stops.
            return Err(());
        }
    }
}

/// The watch guarantees over every watcher's log and the clients' history;
/// one line per violation (empty: all hold).
pub fn check(logs: &[WatchLog], history: &[Event]) -> Vec<String> {
    let mut problems: Vec<String> = logs.iter().flat_map(|l| l.problems.clone()).collect();
    if let Some(first) = logs.first() {
        for other in &logs[1..] {
            if let Some(difference) = first_difference(&first.events, &other.events) {
                problems.push(format!(
                    "the watchers on members {} and {} differ: {difference}",
                    first.member, other.member
                ));
            }
        }
    }
    let written: HashSet<(&str, &str)> = history
        .iter()
        .filter_map(|e| e.written_value().map(|v| (e.key.as_str(), v)))
        .collect();
    for log in logs {
        let by_revision: BTreeMap<i64, &Seen> =
            log.events.iter().map(|s| (s.revision, s)).collect();
        for seen in log.events.iter().filter(|s| s.key.starts_with(KEY_PREFIX)) {
            if let Some(value) = &seen.value {
                if !written.contains(&(seen.key.as_str(), value.as_str())) {
                    problems.push(format!(
                        "member {}: put event {seen:?} of a value no client wrote on that key",
                        log.member
                    ));
                }
            }
        }
        for event in history {
            let (Outcome::Wrote { revision, .. }, Some(value)) =
                (&event.outcome, event.written_value())
            else {
                continue;
            };
            let expected = Seen {
                revision: *revision,
                key: event.key.clone(),
                value: Some(value.to_string()),
            };
            if by_revision.get(revision) != Some(&&expected) {
                problems.push(format!(
                    "member {}: the acknowledged write {expected:?} is not among the watched events (at its revision: {:?})",
                    log.member,
                    by_revision.get(revision)
                ));
            }
        }
    }
    problems
}

/// Where two watchers' event lists first differ, if they do.
fn first_difference(a: &[Seen], b: &[Seen]) -> Option<String> {
    let at = a.iter().zip(b).position(|(x, y)| x != y);
    match at {
        Some(i) => Some(format!("event {i}: {:?} vs {:?}", a[i], b[i])),
        None if a.len() != b.len() => {
            Some(format!("{} vs {} events (same prefix)", a.len(), b.len()))
        }
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::robustness::history::Op;

    const K: &str = "robustness/k";

    fn seen(revision: i64, key: &str, value: Option<&str>) -> Seen {
        Seen {
            revision,
            key: key.to_string(),
            value: value.map(str::to_string),
        }
    }

    fn log(member: usize, events: Vec<Seen>) -> WatchLog {
        WatchLog {
            member,
            events,
            ..WatchLog::default()
        }
    }

    fn put(key: &str, value: &str, revision: i64) -> Event {
        Event {
            client: 0,
            key: key.to_string(),
            op: Op::Put {
                value: value.to_string(),
            },
            invoke: 0,
            complete: Some(1),
            outcome: Outcome::Wrote {
                revision,
                prev: None,
            },
        }
    }

    #[test]
    fn identical_complete_watchers_pass() {
        let events = vec![seen(2, K, Some("a")), seen(3, K, None)];
        let logs = [log(0, events.clone()), log(1, events)];
        assert_eq!(check(&logs, &[put(K, "a", 2)]), Vec::<String>::new());
    }

    #[test]
    fn a_missing_acknowledged_write_a_gap_and_an_invented_value_fail() {
        let full = vec![seen(2, K, Some("a")), seen(3, K, Some("b"))];
        let gap = vec![seen(2, K, Some("a"))];
        let history = [put(K, "a", 2), put(K, "b", 3)];
        let problems = check(&[log(0, full.clone()), log(1, gap)], &history);
        assert!(
            problems.iter().any(|p| p.contains("differ")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("not among")),
            "{problems:?}"
        );
        let invented = vec![seen(2, K, Some("a")), seen(3, K, Some("zzz"))];
        let problems = check(&[log(0, invented)], &history[..1]);
        assert!(
            problems.iter().any(|p| p.contains("no client wrote")),
            "{problems:?}"
        );
    }
}
