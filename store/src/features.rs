//! etcd 3.6's server feature gates (`--feature-gates`, the config file's
//! `feature-gates` key, `ETCD_FEATURE_GATES`).
//!
//! The value is etcd's (Kubernetes') syntax, `Name=bool,Name=bool`, with
//! Go's booleans (`true`, `1`, `T`, ...). `AllAlpha` and `AllBeta` set every
//! gate of that stage that the same value does not name; a gate named
//! explicitly wins whatever the order. An unknown name, a missing `=` or a
//! value that is not a boolean is refused with etcd's message:
//!
//! ```text
//! --feature-gates=InitialCorruptCheck=true,CompactHashCheck=1   both on
//! --feature-gates=AllAlpha=true,SetMemberLocalAddr=false        every alpha gate but one
//! --feature-gates=Nope=true       unrecognized feature gate: Nope
//! ```
//!
//! Each gate's effect in the store is documented at [`GATES`]; the
//! metric `etcd_server_feature_enabled{name,stage}` reports them all.

use crate::etcd_flags::parse_go_bool;

/// A gate's maturity, as etcd labels it (`stage` in the metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Off by default, may change.
    Alpha,
    /// On by default.
    Beta,
}

impl Stage {
    /// etcd's label value.
    pub fn label(self) -> &'static str {
        match self {
            Stage::Alpha => "ALPHA",
            Stage::Beta => "BETA",
        }
    }
}

/// One gate of etcd 3.6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    /// The name.
    pub name: &'static str,
    /// Its stage.
    pub stage: Stage,
    /// Its default.
    pub default: bool,
    /// What it does in this store.
    pub effect: &'static str,
}

/// `AllAlpha`: every alpha gate not named otherwise.
pub const ALL_ALPHA: &str = "AllAlpha";
/// `AllBeta`: every beta gate not named otherwise.
pub const ALL_BETA: &str = "AllBeta";

/// etcd 3.6.14's server gates (`server/features`), plus `AllAlpha` and
/// `AllBeta`, in the order `etcd --help` lists them.
pub const GATES: &[Gate] = &[
    Gate {
        name: ALL_ALPHA,
        stage: Stage::Alpha,
        default: false,
        effect: "sets every alpha gate not named in the same value",
    },
    Gate {
        name: ALL_BETA,
        stage: Stage::Beta,
        default: false,
        effect: "sets every beta gate not named in the same value",
    },
    Gate {
        name: "CompactHashCheck",
        stage: Stage::Alpha,
        default: false,
        effect: "served: the leader compares the followers' compaction hashes every \
                 --compact-hash-check-time and raises CORRUPT on a mismatch",
    },
    Gate {
        name: "InitialCorruptCheck",
        stage: Stage::Alpha,
        default: false,
        effect: "served: a restarting member compares its hash with its peers' before serving",
    },
    Gate {
        name: "LeaseCheckpoint",
        stage: Stage::Alpha,
        default: false,
        effect: "accepted: lease TTLs restart on a leader change (etcd's behaviour without \
                 checkpoints)",
    },
    Gate {
        name: "LeaseCheckpointPersist",
        stage: Stage::Alpha,
        default: false,
        effect: "accepted, with etcd's rule that it requires LeaseCheckpoint",
    },
    Gate {
        name: "SetMemberLocalAddr",
        stage: Stage::Alpha,
        default: false,
        effect: "accepted: peer connections leave from the address the kernel picks",
    },
    Gate {
        name: "StopGRPCServiceOnDefrag",
        stage: Stage::Alpha,
        default: false,
        effect: "accepted: defragmentation does not block requests here (RocksDB compacts \
                 in the background), so the gRPC health service stays SERVING",
    },
    Gate {
        name: "TxnModeWriteWithSharedBuffer",
        stage: Stage::Beta,
        default: true,
        effect: "accepted: a bbolt read-buffer choice of etcd's; transactions read the \
                 engine directly",
    },
];

/// Why a `--feature-gates` value is refused (etcd's words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// `Name` without `=value`.
    #[error("missing bool value for {0}")]
    MissingValue(String),
    /// A value that is not a Go boolean.
    #[error("invalid value of {name}={value}, err: strconv.ParseBool: parsing {value:?}: invalid syntax")]
    BadValue {
        /// The gate.
        name: String,
        /// The value.
        value: String,
    },
    /// A name etcd 3.6 does not have.
    #[error("unrecognized feature gate: {0}")]
    Unknown(String),
    /// `LeaseCheckpointPersist` without `LeaseCheckpoint`.
    #[error("enabling feature gate LeaseCheckpointPersist requires enabling feature gate LeaseCheckpoint")]
    PersistWithoutCheckpoint,
}

/// The gates in force: each named gate's value, the rest at their defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FeatureGates {
    /// Gates set explicitly (or through `AllAlpha`/`AllBeta`), by name.
    set: Vec<(&'static str, bool)>,
}

impl FeatureGates {
    /// Parses `--feature-gates`'s value (empty: every gate at its default).
    pub fn parse(value: &str) -> Result<Self, GateError> {
        let mut named = Vec::new();
        for item in value.split(',').filter(|s| !s.is_empty()) {
            let Some((name, v)) = item.split_once('=') else {
                return Err(GateError::MissingValue(item.trim().to_string()));
            };
            let (name, v) = (name.trim(), v.trim());
            let on = parse_go_bool(v).ok_or_else(|| GateError::BadValue {
                name: name.to_string(),
                value: v.to_string(),
            })?;
            named.push((name.to_string(), on));
        }
        let mut gates = FeatureGates::default();
        gates.set_from(&named)?;
        Ok(gates)
    }

    /// etcd's `SetFromMap`: named gates first, then `AllAlpha`/`AllBeta`
    /// fill the gates of their stage that are still unset.
    pub fn set_from(&mut self, named: &[(String, bool)]) -> Result<(), GateError> {
        for (name, on) in named {
            let gate = GATES
                .iter()
                .find(|g| g.name == name)
                .ok_or_else(|| GateError::Unknown(name.clone()))?;
            self.put(gate.name, *on);
        }
        for (name, on) in named {
            let stage = match name.as_str() {
                ALL_ALPHA => Stage::Alpha,
                ALL_BETA => Stage::Beta,
                _ => continue,
            };
            for gate in GATES.iter().filter(|g| g.stage == stage) {
                if !self.set.iter().any(|(n, _)| *n == gate.name) {
                    self.set.push((gate.name, *on));
                }
            }
        }
        Ok(())
    }

    fn put(&mut self, name: &'static str, on: bool) {
        match self.set.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = on,
            None => self.set.push((name, on)),
        }
    }

    /// Whether `name` is on. Panics on a name that is not a gate (a bug).
    pub fn enabled(&self, name: &str) -> bool {
        if let Some((_, on)) = self.set.iter().find(|(n, _)| *n == name) {
            return *on;
        }
        GATES
            .iter()
            .find(|g| g.name == name)
            .unwrap_or_else(|| panic!("feature {name:?} is not a gate"))
            .default
    }

    /// etcd's start-up check of the gates' combination.
    pub fn validate(&self) -> Result<(), GateError> {
        if self.enabled("LeaseCheckpointPersist") && !self.enabled("LeaseCheckpoint") {
            return Err(GateError::PersistWithoutCheckpoint);
        }
        Ok(())
    }

    /// `InitialCorruptCheck`.
    pub fn initial_corrupt_check(&self) -> bool {
        self.enabled("InitialCorruptCheck")
    }

    /// `CompactHashCheck`.
    pub fn compact_hash_check(&self) -> bool {
        self.enabled("CompactHashCheck")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_explicit_values() {
        let g = FeatureGates::parse("").unwrap();
        assert!(!g.initial_corrupt_check());
        assert!(g.enabled("TxnModeWriteWithSharedBuffer"));
        let g = FeatureGates::parse("InitialCorruptCheck=true,CompactHashCheck=1").unwrap();
        assert!(g.initial_corrupt_check() && g.compact_hash_check());
        assert!(!g.enabled("LeaseCheckpoint"));
    }

    #[test]
    fn all_alpha_fills_only_unnamed_gates_in_either_order() {
        for v in [
            "AllAlpha=true,SetMemberLocalAddr=false",
            "SetMemberLocalAddr=false,AllAlpha=true",
        ] {
            let g = FeatureGates::parse(v).unwrap();
            assert!(g.initial_corrupt_check(), "{v}");
            assert!(!g.enabled("SetMemberLocalAddr"), "{v}");
            assert!(g.enabled("TxnModeWriteWithSharedBuffer"), "{v}");
        }
        let g = FeatureGates::parse("AllBeta=false").unwrap();
        assert!(!g.enabled("TxnModeWriteWithSharedBuffer"));
    }

    #[test]
    fn bad_values_get_etcds_messages() {
        let msg = |v| FeatureGates::parse(v).unwrap_err().to_string();
        assert_eq!(msg("Nope=true"), "unrecognized feature gate: Nope");
        assert_eq!(
            msg("InitialCorruptCheck"),
            "missing bool value for InitialCorruptCheck"
        );
        assert_eq!(
            msg("InitialCorruptCheck=yes"),
            "invalid value of InitialCorruptCheck=yes, err: strconv.ParseBool: parsing \"yes\": invalid syntax"
        );
        let g = FeatureGates::parse("LeaseCheckpointPersist=true").unwrap();
        assert_eq!(g.validate(), Err(GateError::PersistWithoutCheckpoint));
        let g = FeatureGates::parse("LeaseCheckpointPersist=true,LeaseCheckpoint=true").unwrap();
        assert_eq!(g.validate(), Ok(()));
    }
}
