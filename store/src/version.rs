//! The etcd versions this member presents, in one place: what `Status`,
//! `/version`, `store --version`, the Snapshot stream and the
//! `etcd_server_version` / `etcd_cluster_version` metrics report.
//!
//! etcd has three: the server version (the binary's release, "3.6.14"),
//! the cluster version (the lowest server version among the members, cut
//! to major.minor: "3.6.0"; what the cluster as a whole may use) and the
//! storage version (the data format on disk, major.minor: "3.6.0"). The
//! store implements etcd 3.6's API and presents itself as its latest patch
//! release; [`crate::cluster_version`] decides the cluster version and
//! tracks a downgrade.

/// The etcd release whose flags, API and behaviour the store presents.
pub const SERVER_VERSION: &str = "3.6.14";

/// The cluster version (`/version`'s `etcdcluster`).
pub const CLUSTER_VERSION: &str = "3.6.0";

/// The cluster version as etcd's API and metric label spell it
/// (major.minor).
pub const CLUSTER_API_VERSION: &str = "3.6";

/// The storage version (`Status.storageVersion`, `/version`'s `storage`,
/// `SnapshotResponse.version`).
pub const STORAGE_VERSION: &str = "3.6.0";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_agree() {
        let major_minor = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
        assert_eq!(major_minor(SERVER_VERSION), CLUSTER_API_VERSION);
        assert_eq!(format!("{CLUSTER_API_VERSION}.0"), CLUSTER_VERSION);
        assert_eq!(STORAGE_VERSION, CLUSTER_VERSION);
    }
}
