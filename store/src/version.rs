//! The etcd release this build presents, in one place: what `Status`,
//! `/version`, `store --version`, `etcd_server_version` and the Snapshot
//! stream report.
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

/// The storage version this build writes (`SnapshotResponse.version`, the
/// snapshot file's `meta/storageVersion`, and the ceiling of the storage
/// version Status and `/version` report).
pub const STORAGE_VERSION: &str = "3.6.0";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_storage_version_is_the_server_versions_minor() {
        let major_minor = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
        assert_eq!(
            format!("{}.0", major_minor(SERVER_VERSION)),
            STORAGE_VERSION
        );
    }
}
