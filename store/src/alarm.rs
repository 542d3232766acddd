//! Alarms (etcd's `v3alarm`): which member raised which alarm, kept in the
//! `meta` table as one key per (member, alarm type) and changed only by
//! applying `Alarm` commands, so every member sees the same set.
//!
//! NOSPACE is raised when a write would pass `--quota-backend-bytes`; while
//! it is raised, writes that grow the database are refused (before
//! proposing, and again when applied). CORRUPT is raised by the leader's
//! corruption check; while it is raised, every write, compaction and lease
//! grant or revoke is refused when applied, as etcd's corrupt applier does
//! (reads still answer, so operators can inspect the data).

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};

use etcd_proto::etcdserverpb::alarm_request::AlarmAction;
use etcd_proto::etcdserverpb::{AlarmMember, AlarmRequest, AlarmResponse, AlarmType};

use crate::engine::{EngineError, EngineRead, Table, WriteBatch};

/// Prefix of the alarm keys in the `meta` table.
pub const ALARM_PREFIX: &[u8] = b"alarm/";

/// Length of an alarm key after the prefix: member id (8 bytes) and alarm
/// type (4 bytes), big-endian.
const ALARM_KEY_SUFFIX_BYTES: usize = 12;

/// The raised alarm types in memory, for the check every write makes
/// before it is proposed (etcd keeps its alarms in memory too). Reading
/// them from the engine cost a RocksDB iterator per request, ~2% of a
/// member's CPU per put at 1,000 concurrent writers.
///
/// The state machine, the only writer of the alarm table, refreshes it
/// after every engine write that can change the table (an applied Alarm
/// proposal, an installed snapshot), so an answered Alarm request is seen
/// by the next write. It serves both checks: the one before proposing,
/// which spares a proposal that would be refused anyway, and the one at
/// apply time, which decides (the copy is current whenever a group of
/// proposals starts to apply, see the state machine's `raised_alarms`).
#[derive(Debug, Default)]
pub struct RaisedCache {
    nospace: AtomicBool,
    corrupt: AtomicBool,
}

impl RaisedCache {
    /// The alarms raised in `engine` now.
    pub fn load(engine: &dyn EngineRead) -> Result<Self, EngineError> {
        let cache = Self::default();
        cache.refresh(engine)?;
        Ok(cache)
    }

    /// Reads the alarms again after the alarm table changed.
    pub fn refresh(&self, engine: &dyn EngineRead) -> Result<(), EngineError> {
        let now = raised(engine)?;
        self.nospace.store(now.nospace, Ordering::Release);
        self.corrupt.store(now.corrupt, Ordering::Release);
        Ok(())
    }

    /// The alarm types raised as of the last refresh.
    pub fn get(&self) -> Raised {
        Raised {
            nospace: self.nospace.load(Ordering::Acquire),
            corrupt: self.corrupt.load(Ordering::Acquire),
        }
    }
}

/// Which alarm types are raised, by any member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Raised {
    /// NOSPACE: writes that grow the database are refused.
    pub nospace: bool,
    /// CORRUPT: every write is refused (`etcdserver: corrupt cluster`).
    pub corrupt: bool,
}

/// The alarm types raised now.
pub fn raised(engine: &dyn EngineRead) -> Result<Raised, EngineError> {
    let mut out = Raised::default();
    for a in alarms(engine)? {
        out.nospace |= a.alarm == AlarmType::Nospace as i32;
        out.corrupt |= a.alarm == AlarmType::Corrupt as i32;
    }
    Ok(out)
}

/// Meta key of one raised alarm: prefix, member id, alarm type.
fn alarm_key(member_id: u64, alarm: i32) -> Vec<u8> {
    let mut k = ALARM_PREFIX.to_vec();
    k.extend_from_slice(&member_id.to_be_bytes());
    k.extend_from_slice(&alarm.to_be_bytes());
    k
}

/// Every raised alarm, in (member, type) order.
pub fn alarms(engine: &dyn EngineRead) -> Result<Vec<AlarmMember>, EngineError> {
    let mut out = Vec::new();
    let mut end = ALARM_PREFIX.to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    engine.scan(Table::Meta, ALARM_PREFIX, Some(&end), &mut |k, _| {
        let rest = &k[ALARM_PREFIX.len()..];
        if rest.len() == ALARM_KEY_SUFFIX_BYTES {
            let member_id = u64::from_be_bytes(rest[..8].try_into().expect("8 bytes"));
            let alarm = i32::from_be_bytes(rest[8..].try_into().expect("4 bytes"));
            out.push(AlarmMember { member_id, alarm });
        }
        ControlFlow::Continue(())
    })?;
    Ok(out)
}

/// etcd's alarm apply: ACTIVATE answers the alarm if it was newly raised,
/// DEACTIVATE the alarm if it was raised; NONE alarms are ignored.
pub fn apply_alarm(
    engine: &dyn EngineRead,
    r: &AlarmRequest,
    extra: &mut WriteBatch,
) -> Result<AlarmResponse, EngineError> {
    let key = alarm_key(r.member_id, r.alarm);
    let raised = engine.get(Table::Meta, &key)?.is_some();
    let member = AlarmMember {
        member_id: r.member_id,
        alarm: r.alarm,
    };
    let mut resp = AlarmResponse {
        header: None,
        alarms: Vec::new(),
    };
    if r.alarm == AlarmType::None as i32 {
        return Ok(resp);
    }
    match AlarmAction::try_from(r.action) {
        Ok(AlarmAction::Activate) if !raised => {
            extra.put(Table::Meta, key, Vec::new());
            resp.alarms.push(member);
        }
        Ok(AlarmAction::Deactivate) if raised => {
            extra.delete(Table::Meta, key);
            resp.alarms.push(member);
        }
        _ => {}
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::memory::MemoryEngine;
    use crate::engine::Engine;

    /// Applies an Alarm request to `engine` as the state machine does
    /// (answer, then the batch written).
    fn apply(engine: &MemoryEngine, action: AlarmAction, member_id: u64, alarm: AlarmType) {
        let r = AlarmRequest {
            action: action as i32,
            member_id,
            alarm: alarm as i32,
        };
        let mut batch = WriteBatch::new();
        apply_alarm(engine, &r, &mut batch).expect("apply");
        engine.write(batch, false).expect("write");
    }

    #[test]
    fn cache_follows_the_alarm_table_when_refreshed() {
        let engine = MemoryEngine::new();
        let cache = RaisedCache::load(&engine).expect("load");
        assert_eq!(cache.get(), Raised::default());

        // Raised by another member: the cache sees it after a refresh only.
        apply(&engine, AlarmAction::Activate, 7, AlarmType::Nospace);
        assert!(!cache.get().nospace, "not refreshed yet");
        cache.refresh(&engine).expect("refresh");
        assert_eq!(
            cache.get(),
            Raised {
                nospace: true,
                corrupt: false
            }
        );

        // A second member's NOSPACE and a CORRUPT; one NOSPACE disarmed
        // leaves the other raised.
        apply(&engine, AlarmAction::Activate, 9, AlarmType::Nospace);
        apply(&engine, AlarmAction::Activate, 9, AlarmType::Corrupt);
        apply(&engine, AlarmAction::Deactivate, 7, AlarmType::Nospace);
        cache.refresh(&engine).expect("refresh");
        assert_eq!(
            cache.get(),
            Raised {
                nospace: true,
                corrupt: true
            }
        );

        apply(&engine, AlarmAction::Deactivate, 9, AlarmType::Nospace);
        apply(&engine, AlarmAction::Deactivate, 9, AlarmType::Corrupt);
        cache.refresh(&engine).expect("refresh");
        assert_eq!(cache.get(), Raised::default());
        // A reload from the engine agrees with the refreshed cache.
        assert_eq!(RaisedCache::load(&engine).expect("load").get(), cache.get());
    }
}
