//! The recorded history of a run: every operation a client invoked, with its
//! invoke and complete instants and what it returned.
//!
//! Instants are nanoseconds of one monotonic clock ([`Clock`]) started with
//! the run, so operations of different clients compare. An operation whose
//! RPC failed or timed out is *indeterminate*: it may have taken effect at
//! any point after its invoke, or never; it has no complete instant. An
//! operation whose request provably never left the client (the TCP connect
//! was refused) is not recorded at all.
//!
//! Every result is recorded in the form the checker's register model needs:
//! a key's value and mod revision as the server showed them (`prev_kv` of a
//! put or delete, the compare-and-swap's previous or current value, a get).

use std::fmt;

use tokio::time::Instant;

/// A key's value and mod revision as a server showed it; `None` is "absent".
pub type Observed = Option<(String, i64)>;

/// What a client asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Linearizable single-key range.
    Get,
    /// Put of a value unique in the run, with `prev_kv`.
    Put { value: String },
    /// Txn: if `mod_revision(key) == expect` then put `value` (with
    /// `prev_kv`) else get the key.
    Cas { expect: i64, value: String },
    /// Delete of the key, with `prev_kv`.
    Delete,
}

/// What the server answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A get's answer.
    Read(Observed),
    /// An acknowledged put or successful compare-and-swap: the revision of
    /// the new value and the value it replaced.
    Wrote { revision: i64, prev: Observed },
    /// A compare-and-swap whose compare failed: the key as its else branch
    /// read it.
    CasFailed(Observed),
    /// An acknowledged delete: the deleted value, if there was one.
    Deleted(Observed),
    /// Error or timeout: applied or not, unknown.
    Indeterminate(String),
}

/// One operation on one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Which client issued it (for reports).
    pub client: usize,
    pub key: String,
    pub op: Op,
    /// Nanoseconds since the run's start when the request was sent.
    pub invoke: u64,
    /// Nanoseconds since the run's start when the answer arrived; `None`
    /// for an indeterminate operation.
    pub complete: Option<u64>,
    pub outcome: Outcome,
}

impl Event {
    /// Whether the operation's effect is unknown.
    pub fn is_indeterminate(&self) -> bool {
        matches!(self.outcome, Outcome::Indeterminate(_))
    }

    /// The value this operation writes, if it writes one.
    pub fn written_value(&self) -> Option<&str> {
        match &self.op {
            Op::Put { value } | Op::Cas { value, .. } => Some(value),
            Op::Get | Op::Delete => None,
        }
    }

    /// The key's state this operation saw, if it completed.
    pub fn observed(&self) -> Option<&Observed> {
        match &self.outcome {
            Outcome::Read(seen)
            | Outcome::CasFailed(seen)
            | Outcome::Deleted(seen)
            | Outcome::Wrote { prev: seen, .. } => Some(seen),
            Outcome::Indeterminate(_) => None,
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = |nanos: u64| nanos as f64 / 1e6;
        let complete = match self.complete {
            Some(at) => format!("{:>10.3}", millis(at)),
            None => format!("{:>10}", "-"),
        };
        write!(
            f,
            "[{:>10.3} .. {complete} ms] client {} {} {:?} -> {:?}",
            millis(self.invoke),
            self.client,
            self.key,
            self.op,
            self.outcome
        )
    }
}

/// The run's monotonic clock.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    /// A clock reading 0 now.
    pub fn start() -> Self {
        Self {
            start: Instant::now(),
        }
    }

    /// Nanoseconds since the start.
    pub fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}
