//! Leases, as etcd's lessor.
//!
//! What is replicated (through Raft, applied on every member): granting a
//! lease (id, TTL), revoking it (deleting its keys in one revision), and
//! which keys are attached (a key's `lease` field in MVCC). Leases are kept
//! in the `lease` table, so they survive restarts and travel in snapshots.
//!
//! What is not replicated: expiry deadlines. Only the leader ("primary")
//! tracks them; it renews them on KeepAlive and, when one passes, proposes
//! its revocation, so every member deletes the same keys at the same
//! revision. When a member becomes leader it restarts every lease's clock
//! at its full TTL plus one election timeout (etcd's `Promote`), so no lease
//! expires early because of an election; followers have no deadlines.
//!
//! [`Lessor`] holds the lease table, attachments and deadlines. The gRPC
//! Lease service and the leader's expiry loop are `crate::server::v3rpc::lease`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use etcd_proto::mvccpb::event::EventType;
use etcd_proto::mvccpb::Event;
use tokio::time::Instant;

use crate::engine::{EngineRead, EngineResult, Table, WriteBatch};
use crate::kv::LeaseLookup;
use crate::mvcc::{MvccError, MvccStore};

/// etcd's `MaxLeaseTTL`: 9,000,000,000 seconds.
pub const MAX_LEASE_TTL_SECONDS: i64 = 9_000_000_000;

/// One lease.
#[derive(Debug, Clone)]
pub struct Lease {
    /// Lease id.
    pub id: i64,
    /// TTL in seconds as granted (after the minimum is applied).
    pub ttl: i64,
    /// Keys attached.
    pub keys: BTreeSet<Vec<u8>>,
    /// When it expires; only set on the leader.
    pub expiry: Option<Instant>,
}

#[derive(Default)]
struct State {
    leases: HashMap<i64, Lease>,
    /// The lease of every attached key (etcd's `itemMap`): a put or delete
    /// detaches the key from its old lease without reading the old value.
    attached: HashMap<Vec<u8>, i64>,
    primary: bool,
}

/// The member's leases.
pub struct Lessor {
    state: Mutex<State>,
    /// The smallest TTL granted: ceil(1.5 x election timeout), as etcd.
    pub min_ttl_seconds: i64,
}

/// Attaches each (key, lease) of `live_keys` whose lease exists.
fn attach(
    leases: &mut HashMap<i64, Lease>,
    attached: &mut HashMap<Vec<u8>, i64>,
    live_keys: Vec<(Vec<u8>, i64)>,
) {
    for (key, id) in live_keys {
        if let Some(l) = leases.get_mut(&id) {
            l.keys.insert(key.clone());
            attached.insert(key, id);
        }
    }
}

fn lease_key(id: i64) -> Vec<u8> {
    id.to_be_bytes().to_vec()
}

impl Lessor {
    /// An empty lessor for a member with `election_timeout`.
    pub fn new(election_timeout: Duration) -> Self {
        let min = (election_timeout.as_millis() as u64 * 3).div_ceil(2 * 1000) as i64;
        Self {
            state: Mutex::new(State::default()),
            min_ttl_seconds: min.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("lessor lock poisoned")
    }

    /// Rebuilds the lessor from the lease table and the live keys' leases
    /// (start-up, snapshot install).
    pub fn reload_from_store(&self, mvcc: &MvccStore) -> Result<(), MvccError> {
        let leased = mvcc.take_reloaded_leased_keys();
        self.reload(mvcc.engine().as_ref(), leased)?;
        Ok(())
    }

    /// Reloads every lease from the engine and re-attaches `live_keys`
    /// (key, lease) pairs.
    pub fn reload(
        &self,
        engine: &dyn EngineRead,
        live_keys: Vec<(Vec<u8>, i64)>,
    ) -> EngineResult<()> {
        let mut leases = HashMap::new();
        engine.scan(Table::Lease, &[], None, &mut |k, v| {
            if let (Ok(id), Ok(ttl)) = (
                k.try_into().map(i64::from_be_bytes),
                v.try_into().map(i64::from_be_bytes),
            ) {
                leases.insert(
                    id,
                    Lease {
                        id,
                        ttl,
                        keys: BTreeSet::new(),
                        expiry: None,
                    },
                );
            }
            std::ops::ControlFlow::Continue(())
        })?;
        let mut attached = HashMap::new();
        attach(&mut leases, &mut attached, live_keys);
        let mut state = self.lock();
        let primary = state.primary;
        state.leases = leases;
        state.attached = attached;
        if primary {
            let now = Instant::now();
            for l in state.leases.values_mut() {
                l.expiry = Some(now + Duration::from_secs(l.ttl as u64));
            }
        }
        Ok(())
    }

    /// Attaches the live leased keys (key, lease) that completing a
    /// partial load of the key index found ([`MvccStore::set_lease_sink`]):
    /// keys no applied event has touched since the start, so none is
    /// attached yet.
    pub fn attach_loaded(&self, live_keys: Vec<(Vec<u8>, i64)>) {
        let mut guard = self.lock();
        let state = &mut *guard;
        attach(&mut state.leases, &mut state.attached, live_keys);
    }

    /// The TTL a grant of `ttl` actually gets.
    pub fn effective_ttl(&self, ttl: i64) -> i64 {
        ttl.max(self.min_ttl_seconds)
    }

    /// Applies a grant: records the lease in `batch`; false if it exists.
    pub fn apply_grant(&self, id: i64, ttl: i64, batch: &mut WriteBatch) -> bool {
        let mut state = self.lock();
        if state.leases.contains_key(&id) {
            return false;
        }
        let expiry = state
            .primary
            .then(|| Instant::now() + Duration::from_secs(ttl as u64));
        state.leases.insert(
            id,
            Lease {
                id,
                ttl,
                keys: BTreeSet::new(),
                expiry,
            },
        );
        batch.put(Table::Lease, lease_key(id), ttl.to_be_bytes().to_vec());
        true
    }

    /// The keys of lease `id`, if it exists (for revocation).
    pub fn keys(&self, id: i64) -> Option<Vec<Vec<u8>>> {
        self.lock()
            .leases
            .get(&id)
            .map(|l| l.keys.iter().cloned().collect())
    }

    /// Applies a revocation: forgets the lease and records it in `batch`.
    pub fn apply_revoke(&self, id: i64, batch: &mut WriteBatch) {
        let mut guard = self.lock();
        let state = &mut *guard;
        if let Some(lease) = state.leases.remove(&id) {
            for key in lease.keys {
                if state.attached.get(&key) == Some(&id) {
                    state.attached.remove(&key);
                }
            }
        }
        batch.delete(Table::Lease, lease_key(id));
    }

    /// Updates attachments from applied events: a key leaves the lease it
    /// was attached to and joins the lease of its new value. Events need
    /// not carry `prev_kv`.
    pub fn apply_events(&self, events: &[Event]) {
        let mut guard = self.lock();
        let state = &mut *guard;
        for ev in events {
            let Some(kv) = &ev.kv else { continue };
            let new = if ev.r#type == EventType::Put as i32 {
                kv.lease
            } else {
                0
            };
            let old = state.attached.get(&kv.key).copied().unwrap_or(0);
            if old == new {
                continue;
            }
            if old != 0 {
                state.attached.remove(&kv.key);
                if let Some(l) = state.leases.get_mut(&old) {
                    l.keys.remove(&kv.key);
                }
            }
            if let Some(l) = state.leases.get_mut(&new) {
                l.keys.insert(kv.key.clone());
                state.attached.insert(kv.key.clone(), new);
            }
        }
    }

    /// Leader only: restarts the lease's clock. Returns its TTL, or None if
    /// it does not exist.
    pub fn renew(&self, id: i64) -> Option<i64> {
        let mut state = self.lock();
        let primary = state.primary;
        let l = state.leases.get_mut(&id)?;
        if primary {
            l.expiry = Some(Instant::now() + Duration::from_secs(l.ttl as u64));
        }
        Some(l.ttl)
    }

    /// (granted TTL, remaining seconds, keys) of a lease.
    pub fn time_to_live(&self, id: i64) -> Option<(i64, i64, Vec<Vec<u8>>)> {
        let state = self.lock();
        let l = state.leases.get(&id)?;
        // Whole seconds left, truncated toward zero (etcd's
        // `int64(Remaining().Seconds())`): 599 right after a grant of 600,
        // and below zero for an expired lease not revoked yet.
        let remaining = match l.expiry {
            Some(at) => {
                let now = Instant::now();
                match at.checked_duration_since(now) {
                    Some(left) => left.as_secs() as i64,
                    None => -(now.duration_since(at).as_secs() as i64),
                }
            }
            None => l.ttl,
        };
        Some((l.ttl, remaining, l.keys.iter().cloned().collect()))
    }

    /// Every lease id.
    pub fn ids(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self.lock().leases.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Becomes primary: every lease gets its full TTL plus `extend`.
    pub fn promote(&self, extend: Duration) {
        let mut state = self.lock();
        state.primary = true;
        let now = Instant::now();
        for l in state.leases.values_mut() {
            l.expiry = Some(now + extend + Duration::from_secs(l.ttl as u64));
        }
    }

    /// Stops being primary: no deadlines.
    pub fn demote(&self) {
        let mut state = self.lock();
        state.primary = false;
        for l in state.leases.values_mut() {
            l.expiry = None;
        }
    }

    /// True while this member tracks deadlines.
    pub fn is_primary(&self) -> bool {
        self.lock().primary
    }

    /// Up to `max` leases whose deadline has passed.
    pub fn expired(&self, max: usize) -> Vec<i64> {
        let now = Instant::now();
        let state = self.lock();
        state
            .leases
            .values()
            .filter(|l| l.expiry.is_some_and(|e| e <= now))
            .take(max)
            .map(|l| l.id)
            .collect()
    }
}

impl LeaseLookup for Lessor {
    fn lease_exists(&self, id: i64) -> bool {
        self.lock().leases.contains_key(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_proto::mvccpb::KeyValue;

    #[test]
    fn min_ttl_is_one_and_a_half_election_timeouts() {
        assert_eq!(Lessor::new(Duration::from_millis(1000)).min_ttl_seconds, 2);
        assert_eq!(Lessor::new(Duration::from_millis(100)).min_ttl_seconds, 1);
        assert_eq!(Lessor::new(Duration::from_millis(5000)).effective_ttl(3), 8);
    }

    #[test]
    fn time_to_live_reports_whole_seconds_left() {
        let lessor = Lessor::new(Duration::from_secs(1));
        let mut b = WriteBatch::new();
        assert!(lessor.apply_grant(1, 600, &mut b));
        lessor.promote(Duration::ZERO);
        let (granted, remaining, _) = lessor.time_to_live(1).unwrap();
        assert_eq!((granted, remaining), (600, 599), "truncated, as etcd");
        // Expired 1.5 s ago, not revoked yet: etcd's int64(-1.5) is -1.
        lessor.lock().leases.get_mut(&1).unwrap().expiry =
            Some(Instant::now() - Duration::from_millis(1500));
        assert_eq!(lessor.time_to_live(1).unwrap().1, -1);
    }

    #[test]
    fn events_move_keys_between_leases() {
        let lessor = Lessor::new(Duration::from_secs(1));
        let mut b = WriteBatch::new();
        assert!(lessor.apply_grant(1, 10, &mut b));
        assert!(lessor.apply_grant(2, 10, &mut b));
        assert!(!lessor.apply_grant(1, 10, &mut b), "duplicate id");
        // Events without prev_kv: the lessor knows each key's lease.
        let event = |kind: EventType, key: &[u8], lease: i64| Event {
            r#type: kind as i32,
            kv: Some(KeyValue {
                key: key.to_vec(),
                lease,
                ..Default::default()
            }),
            prev_kv: None,
        };
        let put = |key: &[u8], lease| event(EventType::Put, key, lease);
        let keys = |id| lessor.keys(id).unwrap().len();
        lessor.apply_events(&[put(b"k", 1), put(b"j", 1)]);
        assert_eq!((keys(1), keys(2)), (2, 0));
        lessor.apply_events(&[put(b"k", 2)]);
        assert_eq!((keys(1), keys(2)), (1, 1));
        lessor.apply_events(&[put(b"j", 0)]);
        assert_eq!((keys(1), keys(2)), (0, 1));
        lessor.apply_events(&[event(EventType::Delete, b"k", 0)]);
        assert_eq!((keys(1), keys(2)), (0, 0));
        lessor.apply_events(&[put(b"k", 2)]);
        lessor.apply_revoke(2, &mut b);
        assert!(lessor.lock().attached.is_empty(), "revoked keys detached");
        // A put with an unknown lease (refused before apply) attaches nothing.
        lessor.apply_events(&[put(b"k", 9)]);
        assert!(lessor.lock().attached.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_primary_expires_leases() {
        let lessor = Lessor::new(Duration::from_secs(1));
        let mut b = WriteBatch::new();
        lessor.apply_grant(7, 5, &mut b);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(
            lessor.expired(10).is_empty(),
            "followers never expire leases"
        );
        lessor.promote(Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(
            lessor.expired(10).is_empty(),
            "promotion extends by an election timeout"
        );
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(lessor.expired(10), vec![7]);
        assert_eq!(lessor.renew(7), Some(5));
        assert!(lessor.expired(10).is_empty());
    }
}
