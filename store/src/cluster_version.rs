//! etcd 3.6's cluster version and downgrade state.
//!
//! Three versions describe a member (see [`crate::version`]): its server
//! version (the release it presents, [`server_version`]), the cluster
//! version (what the whole cluster may use: the lowest server version of
//! its members, cut to major.minor) and the storage version (the data
//! format, which follows the cluster version). The cluster version and the
//! downgrade state are replicated: the leader decides them and proposes
//! them through Raft ([`crate::raft::types::Command::ClusterVersionSet`],
//! [`crate::raft::types::Command::DowngradeInfoSet`]); every member applies
//! them into its `Meta` table and keeps a copy here ([`ClusterStateCache`]),
//! which Status, `/version` and the metrics read.
//!
//! The leader's decision, every [`MONITOR_INTERVAL`] ([`decide`], etcd's
//! `decideClusterVersion`), given the lowest server version among the
//! members (unknown if one did not answer):
//!
//! ```text
//! lowest member version unknown     -> no change (a member did not answer)
//! no cluster version yet            -> the lowest member version
//! downgrade enabled, target 3.5     -> 3.5.0 while cv is 3.6 and the lowest is 3.6
//! cv 3.5, every member 3.6          -> 3.6.0 (an upgrade finished)
//! otherwise                         -> no change (never down but by a downgrade)
//! ```
//!
//! A downgrade (Maintenance.Downgrade, [`crate::server`]'s maintenance
//! service) goes one minor version down: VALIDATE checks the target, ENABLE
//! records it, the leader then lowers the cluster version, operators
//! replace each member's binary by the older release, and once every
//! member reports the target version the leader ends the downgrade
//! ([`downgrade_finished`], every `--downgrade-check-time`). CANCEL ends it
//! early; the cluster version then goes back up.

use std::sync::LazyLock;
use std::time::Duration;

use crate::engine::{EngineError, EngineRead, Table};

/// How often the leader decides the cluster version: etcd's
/// `monitorVersionInterval` (its peer write timeout, 5 s, less 1 s).
pub const MONITOR_INTERVAL: Duration = Duration::from_secs(4);

/// `Meta` key of the cluster version (`major.minor.0` text).
pub const KEY_CLUSTER_VERSION: &[u8] = b"cluster_version";

/// `Meta` key of the downgrade state (etcd's JSON,
/// `{"target-version":"3.5.0","enabled":true}`).
pub const KEY_DOWNGRADE: &[u8] = b"downgrade";

/// The lowest cluster version any build of the store reads (etcd's
/// `MinClusterVersion`).
pub const MIN_CLUSTER_VERSION: Version = Version::new(3, 0, 0);

/// A release number (semver without pre-release or build parts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major.
    pub major: u64,
    /// Minor.
    pub minor: u64,
    /// Patch.
    pub patch: u64,
}

impl Version {
    /// `major.minor.patch`.
    pub const fn new(major: u64, minor: u64, patch: u64) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// Parses `3.6.14`, `3.6.0-rc.1` or `3.6.1+build` (pre-release and
    /// build parts dropped), as go-semver reads a version.
    pub fn parse(text: &str) -> Option<Self> {
        let [major, minor, patch] = crate::version::parse_release(text)?;
        Some(Self::new(major, minor, patch))
    }

    /// The same major.minor with patch 0 (etcd keeps cluster and storage
    /// versions that way).
    pub fn major_minor(self) -> Self {
        Self::new(self.major, self.minor, 0)
    }

    /// `major.minor`, as the API and the metric label spell a cluster
    /// version.
    pub fn api(self) -> String {
        format!("{}.{}", self.major, self.minor)
    }

    /// One minor version down (None below x.0).
    pub fn previous_minor(self) -> Option<Self> {
        Some(Self::new(self.major, self.minor.checked_sub(1)?, 0))
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// etcd's `convertToClusterVersion`: a downgrade target given as `3.5`
/// or `3.5.7`, as the cluster version it names (`3.5.0`). None: etcd's
/// "wrong downgrade target version format".
pub fn downgrade_target(text: &str) -> Option<Version> {
    Version::parse(text)
        .or_else(|| Version::parse(&format!("{text}.0")))
        .map(Version::major_minor)
}

/// The server version this process presents, parsed
/// ([`crate::version::presented_server_version`], which only presents one
/// that parses).
static PRESENTED: LazyLock<Version> = LazyLock::new(|| {
    Version::parse(crate::version::presented_server_version())
        .expect("the presented server version parses")
});

/// The server version this process presents.
pub fn server_version() -> Version {
    *PRESENTED
}

/// The server version as text (Status, `/version`, the metric).
pub fn server_version_text() -> &'static str {
    crate::version::presented_server_version()
}

/// `/version`'s body (etcd 3.6's fields, in its order).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Versions {
    /// The server version.
    pub etcdserver: String,
    /// The cluster version, or `not_decided`.
    pub etcdcluster: String,
    /// The storage version, or `unknown`.
    pub storage: String,
}

/// What `/version` answers given the replicated state.
pub fn versions(state: &ClusterState) -> Versions {
    Versions {
        etcdserver: server_version_text().to_string(),
        etcdcluster: state.cluster_text(),
        storage: state
            .storage_version()
            .map_or_else(|| "unknown".to_string(), |v| v.to_string()),
    }
}

/// Whether a downgrade is under way, and to what.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DowngradeInfo {
    /// The target cluster version (`3.5.0`), empty when not enabled.
    #[serde(rename = "target-version")]
    pub target_version: String,
    /// Whether the downgrade is enabled.
    pub enabled: bool,
}

impl DowngradeInfo {
    /// The target, when enabled.
    pub fn target(&self) -> Option<Version> {
        if self.enabled {
            Version::parse(&self.target_version)
        } else {
            None
        }
    }
}

/// The replicated cluster-wide versions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterState {
    /// The cluster version, once decided.
    pub cluster_version: Option<Version>,
    /// The downgrade state.
    pub downgrade: DowngradeInfo,
}

impl ClusterState {
    /// Reads the state from the `Meta` table.
    pub fn load(engine: &dyn EngineRead) -> Result<Self, EngineError> {
        let cluster_version = engine
            .get(Table::Meta, KEY_CLUSTER_VERSION)?
            .and_then(|b| Version::parse(std::str::from_utf8(&b).ok()?));
        let downgrade = match engine.get(Table::Meta, KEY_DOWNGRADE)? {
            Some(b) => serde_json::from_slice(&b)
                .map_err(|e| EngineError::corrupt(format!("downgrade state: {e}")))?,
            None => DowngradeInfo::default(),
        };
        Ok(Self {
            cluster_version,
            downgrade,
        })
    }

    /// `/version`'s `etcdcluster`: the cluster version, or etcd's
    /// `not_decided`.
    pub fn cluster_text(&self) -> String {
        self.cluster_version
            .map_or_else(|| "not_decided".to_string(), |v| v.to_string())
    }

    /// The storage version: the data format follows the cluster version
    /// (etcd migrates its schema to it), never above this release's.
    pub fn storage_version(&self) -> Option<Version> {
        let own = Version::parse(&crate::version::release().storage_version)
            .expect("the release's storage version parses");
        self.cluster_version.map(|cv| cv.major_minor().min(own))
    }
}

/// The member's copy of the replicated [`ClusterState`], refreshed by the
/// state machine after it applies a change or installs a snapshot; what
/// follows the versions (the storage format, the peer protocol) waits for
/// its changes ([`Self::subscribe`]).
#[derive(Debug)]
pub struct ClusterStateCache {
    state: tokio::sync::watch::Sender<ClusterState>,
}

impl Default for ClusterStateCache {
    fn default() -> Self {
        Self {
            state: tokio::sync::watch::Sender::new(ClusterState::default()),
        }
    }
}

impl ClusterStateCache {
    /// The state in `engine` now.
    pub fn load(engine: &dyn EngineRead) -> Result<Self, EngineError> {
        let cache = Self::default();
        cache.refresh(engine)?;
        Ok(cache)
    }

    /// Reads the state again after it changed.
    pub fn refresh(&self, engine: &dyn EngineRead) -> Result<(), EngineError> {
        let now = ClusterState::load(engine)?;
        crate::metrics::global().set_cluster_version(now.cluster_version.map(Version::api));
        self.state.send_if_modified(|state| {
            let changed = *state != now;
            *state = now;
            changed
        });
        Ok(())
    }

    /// The current state.
    pub fn get(&self) -> ClusterState {
        self.state.borrow().clone()
    }

    /// A receiver told of every change of the state.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<ClusterState> {
        self.state.subscribe()
    }
}

/// Why the leader cannot decide a cluster version (logged, retried).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    /// The enabled downgrade's target is not one minor version below both
    /// the cluster version and the lowest member version.
    #[error("invalid downgrade target")]
    InvalidTarget,
}

/// etcd's `decideClusterVersion` (module docs): the cluster version to
/// propose, None to leave it as it is.
pub fn decide(
    current: Option<Version>,
    lowest_member: Option<Version>,
    downgrade: &DowngradeInfo,
) -> Result<Option<Version>, DecideError> {
    // Unlike etcd, which sets 3.0.0 when it cannot reach a member, the
    // store waits until every member answered: a member of an earlier
    // build answers nothing, and could not apply the proposal either.
    let Some(lowest) = lowest_member else {
        return Ok(None);
    };
    let Some(current) = current else {
        return Ok(Some(lowest.major_minor().max(MIN_CLUSTER_VERSION)));
    };
    if let Some(target) = downgrade.target() {
        if target == current {
            return Ok(None);
        }
        let one_below = |v: Version| v.major_minor().previous_minor() == Some(target);
        if !one_below(current) || !one_below(lowest) {
            return Err(DecideError::InvalidTarget);
        }
        return Ok(Some(target));
    }
    let lowest = lowest.major_minor();
    if current < lowest && current.major == lowest.major {
        return Ok(Some(lowest));
    }
    Ok(None)
}

/// The lowest of the members' server versions; None if any is unknown.
pub fn lowest(versions: &[Option<Version>]) -> Option<Version> {
    versions
        .iter()
        .copied()
        .collect::<Option<Vec<_>>>()?
        .into_iter()
        .min()
}

/// Whether an enabled downgrade has finished: every member runs the
/// target's major.minor (etcd's `isMatchedVersions`).
pub fn downgrade_finished(downgrade: &DowngradeInfo, versions: &[Option<Version>]) -> bool {
    let Some(target) = downgrade.target() else {
        return false;
    };
    !versions.is_empty()
        && versions
            .iter()
            .all(|v| v.is_some_and(|v| v.major_minor() == target.major_minor()))
}

/// etcd's `MustDetectDowngrade` at start-up: a binary older than the
/// cluster version may not serve it.
pub fn check_binary_allowed(state: &ClusterState) -> Result<(), String> {
    let own = server_version();
    match state.cluster_version {
        Some(cv) if own.major_minor() < cv.major_minor() => Err(format!(
            "invalid downgrade; server version is lower than determined cluster version \
             (current-server-version {own}, determined-cluster-version {})",
            cv.api()
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).expect("version")
    }

    fn enabled(target: &str) -> DowngradeInfo {
        DowngradeInfo {
            target_version: target.to_string(),
            enabled: true,
        }
    }

    #[test]
    fn versions_parse_as_go_semver() {
        assert_eq!(v("3.6.14"), Version::new(3, 6, 14));
        assert_eq!(v("3.5.0-rc.1"), Version::new(3, 5, 0));
        assert_eq!(Version::parse("3.5"), None);
        assert_eq!(Version::parse("v3.5.0"), None);
        assert_eq!(downgrade_target("3.5"), Some(v("3.5.0")));
        assert_eq!(downgrade_target("3.5.7"), Some(v("3.5.0")));
        assert_eq!(downgrade_target("3.4.0-rc.1"), Some(v("3.4.0")));
        for bad in ["", "3", "x.y", "3.5.x", "v3.5", "3..5", "3.4.0.1"] {
            assert_eq!(downgrade_target(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn cluster_version_is_decided_as_etcd_decides_it() {
        let none = DowngradeInfo::default();
        // First decision: the lowest member, or 3.0.0 when unknown.
        assert_eq!(decide(None, Some(v("3.6.14")), &none), Ok(Some(v("3.6.0"))));
        assert_eq!(decide(None, None, &none), Ok(None));
        // Unknown lowest: no change.
        assert_eq!(decide(Some(v("3.5.0")), None, &none), Ok(None));
        // An upgrade finished; never down without a downgrade.
        assert_eq!(
            decide(Some(v("3.5.0")), Some(v("3.6.2")), &none),
            Ok(Some(v("3.6.0")))
        );
        assert_eq!(decide(Some(v("3.6.0")), Some(v("3.5.9")), &none), Ok(None));
        assert_eq!(decide(Some(v("3.6.0")), Some(v("4.0.0")), &none), Ok(None));
        // A downgrade lowers it one minor, then holds.
        let down = enabled("3.5.0");
        assert_eq!(
            decide(Some(v("3.6.0")), Some(v("3.6.14")), &down),
            Ok(Some(v("3.5.0")))
        );
        assert_eq!(decide(Some(v("3.5.0")), Some(v("3.6.14")), &down), Ok(None));
        assert_eq!(
            decide(Some(v("3.6.0")), Some(v("3.5.0")), &down),
            Err(DecideError::InvalidTarget)
        );
        assert_eq!(
            decide(Some(v("3.6.0")), Some(v("3.6.0")), &enabled("3.4.0")),
            Err(DecideError::InvalidTarget)
        );
    }

    #[test]
    fn a_downgrade_finishes_when_every_member_runs_the_target() {
        let down = enabled("3.5.0");
        let all = [Some(v("3.5.1")), Some(v("3.5.0"))];
        assert!(downgrade_finished(&down, &all));
        assert!(!downgrade_finished(
            &down,
            &[Some(v("3.5.1")), Some(v("3.6.14"))]
        ));
        assert!(!downgrade_finished(&down, &[Some(v("3.5.1")), None]));
        assert!(!downgrade_finished(&DowngradeInfo::default(), &all));
        assert_eq!(lowest(&all), Some(v("3.5.0")));
        assert_eq!(lowest(&[Some(v("3.5.1")), None]), None);
    }

    #[test]
    fn downgrade_state_is_etcds_json() {
        let json = serde_json::to_string(&enabled("3.5.0")).unwrap();
        assert_eq!(json, r#"{"target-version":"3.5.0","enabled":true}"#);
        let state = ClusterState {
            cluster_version: Some(v("3.5.0")),
            downgrade: enabled("3.5.0"),
        };
        assert_eq!(state.storage_version(), Some(v("3.5.0")));
        assert_eq!(state.cluster_text(), "3.5.0");
        assert_eq!(ClusterState::default().cluster_text(), "not_decided");
        assert_eq!(
            serde_json::to_string(&versions(&state)).unwrap(),
            r#"{"etcdserver":"3.6.14","etcdcluster":"3.5.0","storage":"3.5.0"}"#
        );
        let newer = ClusterState {
            cluster_version: Some(v("3.7.0")),
            ..ClusterState::default()
        };
        assert_eq!(newer.storage_version(), Some(v("3.6.0")));
        assert!(check_binary_allowed(&newer).is_err());
        assert!(check_binary_allowed(&state).is_ok());
    }
}
