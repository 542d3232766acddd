//! Linearizability checker of per-key histories against a register model
//! with mod revisions.
//!
//! Every operation of the workload touches one key, so a history is
//! linearizable iff each key's sub-history is (linearizability is local);
//! [`check`] splits by key and checks each alone.
//!
//! **Model.** A key is absent or holds `(value, mod_revision)`. A completed
//! operation both checks and changes the state: a get must read it exactly;
//! a put's `prev_kv` must equal it and the new revision must be higher; a
//! compare-and-swap that succeeded must have replaced a value whose mod
//! revision (0 when absent) equals its expectation, one that failed must
//! have read a state whose mod revision differs; a delete's `prev_kv` must
//! equal it. An indeterminate write (error or timeout) applies without a
//! check, its new value's revision unknown until a later operation reads
//! it. An indeterminate compare-and-swap applies only where its compare
//! could hold.
//!
//! **Search** (Wing & Gong, with Lowe's/Porcupine's memoization): a
//! depth-first search builds a linearization one operation at a time. An
//! operation may come next iff it is not linearized yet and was invoked
//! before every other pending completed operation returned. Completed
//! operations must all be placed; indeterminate ones may be placed (at any
//! point after their invoke) or never. A (set of linearized operations,
//! state) pair already explored is never explored again. More than
//! [`MAX_SEARCH_STATES`] explored pairs is a failure of the check
//! ([`Anomaly::SearchLimit`]), never a pass.
//!
//! Before the search, reads that failed are dropped (no effect), and so are
//! indeterminate writes whose unique value no completed operation ever saw:
//! every completed operation reads the key's state, so such a write can only
//! have been overwritten unseen, which is the same as never applied (the
//! workload's compare-and-swap expects only revisions a client saw, so it
//! never matches an unseen write's revision).
//!
//! **Reports.** For a key that is not linearizable, [`shortest_failing_prefix`]
//! cuts the history at the completion of its k-th completed operation (what
//! had completed by then stays completed, what was invoked and still pending
//! becomes indeterminate) and bisects k for the shortest cut that still
//! fails: the anomaly is at its end.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use super::history::{Event, Observed, Op, Outcome};

/// Bound on (linearized set, state) pairs explored for one key.
pub const MAX_SEARCH_STATES: usize = 1_000_000;
/// Events of a failing key history printed in a report (the last ones of
/// its shortest failing prefix).
pub const REPORT_EVENTS: usize = 40;

/// A register's mod revision: seen by a client, or not yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Revision {
    Known(i64),
    Unknown,
}

/// The model's state of one key: absent, or a value with its mod revision.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Register(Option<(String, Revision)>);

impl Register {
    fn holding(value: &str, revision: Revision) -> Self {
        Register(Some((value.to_string(), revision)))
    }

    /// The mod revision a compare sees (0 when absent), if known.
    fn mod_revision(&self) -> Option<i64> {
        match &self.0 {
            None => Some(0),
            Some((_, Revision::Known(revision))) => Some(*revision),
            Some((_, Revision::Unknown)) => None,
        }
    }

    /// The state refined by a read of it, if the read is consistent with it.
    fn observe(&self, seen: &Observed) -> Option<Register> {
        match (&self.0, seen) {
            (None, None) => Some(Register(None)),
            (Some((value, revision)), Some((seen_value, seen_revision))) if value == seen_value => {
                match revision {
                    Revision::Known(known) if known != seen_revision => None,
                    _ => Some(Register::holding(value, Revision::Known(*seen_revision))),
                }
            }
            _ => None,
        }
    }
}

/// The state after `event`, or `None` if `event` cannot come next in `state`.
fn step(state: &Register, event: &Event) -> Option<Register> {
    match (&event.op, &event.outcome) {
        (op, Outcome::Indeterminate(_)) => apply_unacknowledged(state, op),
        (Op::Get, Outcome::Read(seen)) => state.observe(seen),
        (Op::Put { value }, Outcome::Wrote { revision, prev }) => {
            write_over(state, prev, value, *revision)
        }
        (Op::Cas { expect, value }, Outcome::Wrote { revision, prev }) => {
            let before = state.observe(prev)?;
            (before.mod_revision() == Some(*expect)).then_some(())?;
            write_over(&before, prev, value, *revision)
        }
        (Op::Cas { expect, .. }, Outcome::CasFailed(seen)) => {
            let now = state.observe(seen)?;
            (now.mod_revision() != Some(*expect)).then_some(now)
        }
        (Op::Delete, Outcome::Deleted(prev)) => {
            state.observe(prev)?;
            Some(Register(None))
        }
        _ => None,
    }
}

/// A write acknowledged at `revision` that replaced `prev`.
fn write_over(state: &Register, prev: &Observed, value: &str, revision: i64) -> Option<Register> {
    let before = state.observe(prev)?;
    let newer = before.mod_revision().is_none_or(|old| revision > old);
    newer.then(|| Register::holding(value, Revision::Known(revision)))
}

/// The state after an operation whose answer was lost, applied.
fn apply_unacknowledged(state: &Register, op: &Op) -> Option<Register> {
    match op {
        Op::Get => Some(state.clone()),
        Op::Put { value } => Some(Register::holding(value, Revision::Unknown)),
        Op::Cas { expect, value } => match state.mod_revision() {
            Some(current) if current != *expect => None,
            _ => Some(Register::holding(value, Revision::Unknown)),
        },
        Op::Delete => Some(Register(None)),
    }
}

/// Why a key's history failed the check.
#[derive(Clone, Debug)]
pub enum Anomaly {
    /// No linearization exists.
    NotLinearizable {
        key: String,
        /// Events in the key's history.
        events: usize,
        /// The shortest failing prefix (see the module documentation).
        prefix: Vec<Event>,
    },
    /// The search gave up: unknown, reported as a failure.
    SearchLimit { key: String, events: usize },
    /// An operation with an answer of another operation's kind.
    Malformed { event: Box<Event> },
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Anomaly::NotLinearizable {
                key,
                events,
                prefix,
            } => {
                writeln!(
                    f,
                    "key {key:?}: not linearizable ({events} events); shortest failing prefix has {} events, the last {} of them:",
                    prefix.len(),
                    prefix.len().min(REPORT_EVENTS)
                )?;
                for event in &prefix[prefix.len().saturating_sub(REPORT_EVENTS)..] {
                    writeln!(f, "  {event}")?;
                }
                Ok(())
            }
            Anomaly::SearchLimit { key, events } => write!(
                f,
                "key {key:?}: the linearizability search of {events} events explored more than {MAX_SEARCH_STATES} states (result unknown, counted as a failure)"
            ),
            Anomaly::Malformed { event } => write!(f, "malformed event: {event}"),
        }
    }
}

/// Result of checking a whole history.
#[derive(Debug, Default)]
pub struct Report {
    /// Keys checked.
    pub keys: usize,
    /// Search states explored, over all keys.
    pub states: usize,
    pub anomalies: Vec<Anomaly>,
}

/// Checks every key's history.
pub fn check(events: &[Event]) -> Report {
    let mut by_key: BTreeMap<&str, Vec<Event>> = BTreeMap::new();
    for event in events {
        by_key.entry(&event.key).or_default().push(event.clone());
    }
    let mut report = Report::default();
    for (key, history) in by_key {
        report.keys += 1;
        match check_key(key, &history, MAX_SEARCH_STATES) {
            Ok(states) => report.states += states,
            Err(anomaly) => report.anomalies.push(anomaly),
        }
    }
    report
}

/// Checks one key's history with at most `limit` search states; the number
/// of states explored if it is linearizable.
pub fn check_key(key: &str, history: &[Event], limit: usize) -> Result<usize, Anomaly> {
    if let Some(event) = history.iter().find(|event| !well_formed(event)) {
        return Err(Anomaly::Malformed {
            event: Box::new(event.clone()),
        });
    }
    match search(&prepare(history), limit) {
        Outcome3::Linearizable(states) => Ok(states),
        Outcome3::Limit => Err(Anomaly::SearchLimit {
            key: key.to_string(),
            events: history.len(),
        }),
        Outcome3::NotLinearizable => Err(Anomaly::NotLinearizable {
            key: key.to_string(),
            events: history.len(),
            prefix: shortest_failing_prefix(history, limit),
        }),
    }
}

/// Whether the outcome is one the operation can have.
fn well_formed(event: &Event) -> bool {
    let timed = event.complete.is_some() != event.is_indeterminate();
    let kinds = matches!(
        (&event.op, &event.outcome),
        (_, Outcome::Indeterminate(_))
            | (Op::Get, Outcome::Read(_))
            | (Op::Put { .. }, Outcome::Wrote { .. })
            | (
                Op::Cas { .. },
                Outcome::Wrote { .. } | Outcome::CasFailed(_)
            )
            | (Op::Delete, Outcome::Deleted(_))
    );
    timed && kinds
}

/// The events the search needs, sorted by invoke (see the module docs).
fn prepare(history: &[Event]) -> Vec<Event> {
    let seen: HashSet<&str> = history
        .iter()
        .filter_map(Event::observed)
        .filter_map(|observed| observed.as_ref().map(|(value, _)| value.as_str()))
        .collect();
    let mut events: Vec<Event> = history
        .iter()
        .filter(|event| match (&event.op, event.is_indeterminate()) {
            (Op::Get, true) => false,
            (_, true) => event
                .written_value()
                .is_none_or(|value| seen.contains(value)),
            (_, false) => true,
        })
        .cloned()
        .collect();
    events.sort_by_key(|event| event.invoke);
    events
}

enum Outcome3 {
    Linearizable(usize),
    NotLinearizable,
    Limit,
}

/// One level of the depth-first search: the state reached, the operations
/// that may come next (those invoked before `horizon`), where to continue
/// trying, and the operation currently placed at this level.
struct Frame {
    state: Register,
    horizon: u64,
    cursor: usize,
    placed: Option<usize>,
}

/// The linearized set as a bitset.
struct Placed {
    bits: Vec<u64>,
    pending_completed: usize,
}

impl Placed {
    fn contains(&self, i: usize) -> bool {
        self.bits[i / 64] & (1 << (i % 64)) != 0
    }

    fn flip(&mut self, i: usize, event: &Event) {
        self.bits[i / 64] ^= 1 << (i % 64);
        if event.complete.is_some() {
            if self.contains(i) {
                self.pending_completed -= 1;
            } else {
                self.pending_completed += 1;
            }
        }
    }

    /// The earliest completion of a completed operation not placed yet.
    fn horizon(&self, events: &[Event]) -> u64 {
        (0..events.len())
            .filter(|&i| !self.contains(i))
            .filter_map(|i| events[i].complete)
            .min()
            .unwrap_or(u64::MAX)
    }
}

/// The Wing-Gong search over `events` (sorted by invoke).
fn search(events: &[Event], limit: usize) -> Outcome3 {
    let mut placed = Placed {
        bits: vec![0; events.len().div_ceil(64)],
        pending_completed: events.iter().filter(|e| e.complete.is_some()).count(),
    };
    if placed.pending_completed == 0 {
        return Outcome3::Linearizable(0);
    }
    let mut explored: HashSet<(Vec<u64>, Register)> = HashSet::new();
    let mut stack = vec![Frame {
        state: Register::default(),
        horizon: placed.horizon(events),
        cursor: 0,
        placed: None,
    }];
    while let Some(frame) = stack.last_mut() {
        if let Some(i) = frame.placed.take() {
            placed.flip(i, &events[i]);
        }
        let Some((i, next)) = next_candidate(events, &placed, frame) else {
            stack.pop();
            continue;
        };
        frame.cursor = i + 1;
        frame.placed = Some(i);
        placed.flip(i, &events[i]);
        if placed.pending_completed == 0 {
            return Outcome3::Linearizable(explored.len());
        }
        if explored.insert((placed.bits.clone(), next.clone())) {
            if explored.len() > limit {
                return Outcome3::Limit;
            }
            let horizon = placed.horizon(events);
            stack.push(Frame {
                state: next,
                horizon,
                cursor: 0,
                placed: None,
            });
        }
    }
    Outcome3::NotLinearizable
}

/// The first operation at or after the frame's cursor that may come next
/// and is consistent with its state, with the state after it.
fn next_candidate(events: &[Event], placed: &Placed, frame: &Frame) -> Option<(usize, Register)> {
    (frame.cursor..events.len())
        .take_while(|&i| events[i].invoke < frame.horizon)
        .filter(|&i| !placed.contains(i))
        .find_map(|i| step(&frame.state, &events[i]).map(|next| (i, next)))
}

/// The history as it stood when its `k`th completed operation returned.
fn cut(history: &[Event], completions: &[u64], k: usize) -> Vec<Event> {
    let at = completions[k - 1];
    history
        .iter()
        .filter(|event| event.invoke < at)
        .map(|event| match event.complete {
            Some(complete) if complete <= at => event.clone(),
            _ => Event {
                complete: None,
                outcome: Outcome::Indeterminate("pending at the cut".to_string()),
                ..event.clone()
            },
        })
        .collect()
}

/// The shortest cut of a failing `history` that still fails (bisection
/// over cuts; the whole history is the answer if no shorter cut fails).
pub fn shortest_failing_prefix(history: &[Event], limit: usize) -> Vec<Event> {
    let mut completions: Vec<u64> = history.iter().filter_map(|event| event.complete).collect();
    completions.sort_unstable();
    let fails = |k: usize| {
        matches!(
            search(&prepare(&cut(history, &completions, k)), limit),
            Outcome3::NotLinearizable
        )
    };
    let (mut passing, mut failing) = (0, completions.len());
    while failing - passing > 1 {
        let middle = (passing + failing) / 2;
        if fails(middle) {
            failing = middle;
        } else {
            passing = middle;
        }
    }
    let mut prefix = if failing == 0 {
        history.to_vec()
    } else {
        cut(history, &completions, failing)
    };
    prefix.sort_by_key(|event| event.invoke);
    prefix
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "k";

    fn seen(value: &str, revision: i64) -> Observed {
        Some((value.to_string(), revision))
    }

    fn event(op: Op, invoke: u64, complete: Option<u64>, outcome: Outcome) -> Event {
        Event {
            client: 0,
            key: KEY.to_string(),
            op,
            invoke,
            complete,
            outcome,
        }
    }

    fn get(invoke: u64, complete: u64, observed: Observed) -> Event {
        event(Op::Get, invoke, Some(complete), Outcome::Read(observed))
    }

    fn put(invoke: u64, complete: u64, value: &str, revision: i64, prev: Observed) -> Event {
        let op = Op::Put {
            value: value.to_string(),
        };
        event(
            op,
            invoke,
            Some(complete),
            Outcome::Wrote { revision, prev },
        )
    }

    fn lost(op: Op, invoke: u64) -> Event {
        event(op, invoke, None, Outcome::Indeterminate("timeout".into()))
    }

    fn put_op(value: &str) -> Op {
        Op::Put {
            value: value.to_string(),
        }
    }

    fn cas(expect: i64, value: &str) -> Op {
        Op::Cas {
            expect,
            value: value.to_string(),
        }
    }

    fn verdict(history: &[Event]) -> Result<usize, Anomaly> {
        check_key(KEY, history, MAX_SEARCH_STATES)
    }

    fn assert_linearizable(history: &[Event]) {
        if let Err(anomaly) = verdict(history) {
            panic!("expected linearizable, got {anomaly}");
        }
    }

    fn assert_not_linearizable(history: &[Event]) -> Vec<Event> {
        match verdict(history) {
            Err(Anomaly::NotLinearizable { prefix, .. }) => prefix,
            other => panic!("expected not linearizable, got {other:?}"),
        }
    }

    #[test]
    fn sequential_history_is_linearizable() {
        assert_linearizable(&[
            get(0, 10, None),
            put(20, 30, "a", 2, None),
            get(40, 50, seen("a", 2)),
            put(60, 70, "b", 3, seen("a", 2)),
            event(Op::Delete, 80, Some(90), Outcome::Deleted(seen("b", 3))),
            get(100, 110, None),
        ]);
    }

    #[test]
    fn concurrent_writes_may_take_either_order() {
        // Two overlapping puts; reads after both see the one ordered last,
        // and b's prev_kv says a came first.
        assert_linearizable(&[
            put(0, 50, "a", 2, None),
            put(10, 40, "b", 3, seen("a", 2)),
            get(60, 70, seen("b", 3)),
        ]);
        // A read concurrent with a put may see the old or the new value.
        assert_linearizable(&[
            put(0, 10, "a", 2, None),
            put(20, 60, "b", 3, seen("a", 2)),
            get(30, 40, seen("a", 2)),
            get(45, 55, seen("b", 3)),
        ]);
    }

    #[test]
    fn stale_read_after_a_completed_write_is_caught() {
        assert_not_linearizable(&[
            put(0, 10, "a", 2, None),
            put(20, 30, "b", 3, seen("a", 2)),
            get(40, 50, seen("a", 2)),
        ]);
    }

    #[test]
    fn read_going_back_in_time_is_caught() {
        // Once a read saw b, a later read may not see a again.
        assert_not_linearizable(&[
            put(0, 10, "a", 2, None),
            put(20, 100, "b", 3, seen("a", 2)),
            get(30, 40, seen("b", 3)),
            get(50, 60, seen("a", 2)),
        ]);
    }

    #[test]
    fn lost_acknowledged_write_is_caught() {
        // The final read does not show the acknowledged put.
        assert_not_linearizable(&[put(0, 10, "a", 2, None), get(20, 30, None)]);
        // A later put's prev_kv skips the acknowledged one.
        assert_not_linearizable(&[put(0, 10, "a", 2, None), put(20, 30, "b", 3, None)]);
    }

    #[test]
    fn read_of_a_value_never_written_is_caught() {
        assert_not_linearizable(&[put(0, 10, "a", 2, None), get(20, 30, seen("ghost", 3))]);
    }

    #[test]
    fn wrong_mod_revision_is_caught() {
        assert_not_linearizable(&[put(0, 10, "a", 2, None), get(20, 30, seen("a", 5))]);
        // Revisions of a key only grow.
        assert_not_linearizable(&[put(0, 10, "a", 5, None), put(20, 30, "b", 4, seen("a", 5))]);
    }

    #[test]
    fn indeterminate_write_that_took_effect_is_linearizable() {
        assert_linearizable(&[
            put(0, 10, "a", 2, None),
            lost(put_op("x"), 20),
            get(100, 110, seen("x", 3)),
            get(120, 130, seen("x", 3)),
        ]);
    }

    #[test]
    fn indeterminate_write_that_did_not_take_effect_is_linearizable() {
        assert_linearizable(&[
            put(0, 10, "a", 2, None),
            lost(put_op("x"), 20),
            get(100, 110, seen("a", 2)),
        ]);
    }

    #[test]
    fn indeterminate_write_seen_before_its_invoke_is_caught() {
        assert_not_linearizable(&[get(0, 10, seen("x", 2)), lost(put_op("x"), 20)]);
    }

    #[test]
    fn indeterminate_write_cannot_take_effect_twice() {
        // x applied, then overwritten by b, then seen again: impossible.
        assert_not_linearizable(&[
            lost(put_op("x"), 0),
            get(10, 20, seen("x", 2)),
            put(30, 40, "b", 3, seen("x", 2)),
            get(50, 60, seen("x", 2)),
        ]);
    }

    #[test]
    fn compare_and_swap_follows_the_mod_revision() {
        let swap = |invoke, complete, expect, value: &str, revision, prev| {
            event(
                cas(expect, value),
                invoke,
                Some(complete),
                Outcome::Wrote { revision, prev },
            )
        };
        let refuse = |invoke, complete, expect, current| {
            event(
                cas(expect, "never"),
                invoke,
                Some(complete),
                Outcome::CasFailed(current),
            )
        };
        assert_linearizable(&[
            put(0, 10, "a", 2, None),
            swap(20, 30, 2, "b", 3, seen("a", 2)),
            refuse(40, 50, 2, seen("b", 3)),
        ]);
        // Succeeded although the revision had moved on.
        assert_not_linearizable(&[
            put(0, 10, "a", 2, None),
            put(20, 30, "b", 3, seen("a", 2)),
            swap(40, 50, 2, "c", 4, seen("b", 3)),
        ]);
        // Failed although the revision matched.
        assert_not_linearizable(&[put(0, 10, "a", 2, None), refuse(20, 30, 2, seen("a", 2))]);
        // Creation: expecting 0 on an absent key.
        assert_linearizable(&[swap(0, 10, 0, "a", 2, None)]);
    }

    #[test]
    fn indeterminate_compare_and_swap_applies_only_where_its_compare_holds() {
        assert_linearizable(&[
            put(0, 10, "a", 2, None),
            lost(cas(2, "c"), 20),
            get(100, 110, seen("c", 3)),
        ]);
        assert_not_linearizable(&[
            put(0, 10, "a", 2, None),
            put(15, 18, "b", 3, seen("a", 2)),
            lost(cas(2, "c"), 20),
            get(100, 110, seen("c", 4)),
        ]);
    }

    #[test]
    fn exceeding_the_search_limit_fails() {
        // Eight concurrent lost puts, each seen later, then a read of a
        // value never written: refuting it takes more than three states.
        let mut history: Vec<Event> = (0..8).map(|i| lost(put_op(&format!("v{i}")), i)).collect();
        history.extend((0..8).map(|i| {
            let at = 100 + 20 * i;
            get(at, at + 10, seen(&format!("v{i}"), 10 + i as i64))
        }));
        history.push(get(500, 510, seen("ghost", 40)));
        match check_key(KEY, &history, 3) {
            Err(Anomaly::SearchLimit { events, .. }) => assert_eq!(events, history.len()),
            other => panic!("expected the search limit, got {other:?}"),
        }
        assert_not_linearizable(&history);
    }

    #[test]
    fn malformed_events_are_rejected() {
        let history = [event(Op::Get, 0, Some(1), Outcome::Deleted(None))];
        assert!(matches!(verdict(&history), Err(Anomaly::Malformed { .. })));
    }

    #[test]
    fn report_is_the_shortest_failing_prefix() {
        let mut history = vec![put(0, 10, "a", 2, None), get(20, 30, seen("stale", 1))];
        for i in 0..20u64 {
            history.push(get(100 + 20 * i, 110 + 20 * i, seen("a", 2)));
        }
        let prefix = assert_not_linearizable(&history);
        assert_eq!(prefix.len(), 2, "{prefix:?}");
        assert_eq!(prefix[1], history[1]);
        let report = check(&history);
        assert_eq!(report.keys, 1);
        let text = report.anomalies[0].to_string();
        assert!(
            text.contains("shortest failing prefix has 2 events"),
            "{text}"
        );
        assert!(text.contains("stale"), "{text}");
    }
}
