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

/// Test-only: the server version this process presents instead of
/// [`SERVER_VERSION`], so a test can run members of two releases (a
/// rolling upgrade or downgrade) with one build.
pub const TEST_SERVER_VERSION_ENV: &str = "ETCDRS_TEST_SERVER_VERSION";

/// The server version this process presents (Status, `/version`,
/// `etcd_server_version`): [`SERVER_VERSION`], or a `major.minor.patch`
/// given in [`TEST_SERVER_VERSION_ENV`]. Read once.
pub fn presented_server_version() -> &'static str {
    static PRESENTED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        std::env::var(TEST_SERVER_VERSION_ENV)
            .ok()
            .filter(|v| parse_release(v).is_some())
            .unwrap_or_else(|| SERVER_VERSION.to_string())
    });
    &PRESENTED
}

/// The `major.minor.patch` numbers of `3.6.14`, `3.6.0-rc.1` or
/// `3.6.1+build` (pre-release and build parts dropped), as go-semver reads
/// a version; `None` for anything else (what `cluster_version::Version`
/// parses too).
pub fn parse_release(text: &str) -> Option<[u64; 3]> {
    let core = text.split(['-', '+']).next()?;
    let mut parts = core.split('.');
    let mut next = || -> Option<u64> {
        let p = parts.next()?;
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        p.parse().ok()
    };
    let numbers = [next()?, next()?, next()?];
    parts.next().is_none().then_some(numbers)
}

/// The version of the member-to-member protocol this build speaks: the
/// layout of every `storepeer` message (openraft's messages, forwarded
/// requests and their answers, snapshot chunks). Members announce it in
/// their peer connections' `user-agent` ([`peer_user_agent`]); a member
/// refuses requests of a version it does not speak rather than misread
/// them. Builds before it was announced spoke version 1.
pub const PEER_PROTOCOL_VERSION: u32 = 1;

/// The oldest peer protocol this build speaks.
pub const OLDEST_PEER_PROTOCOL: u32 = 1;

/// The peer protocol of a request that does not announce one.
const UNANNOUNCED_PEER_PROTOCOL: u32 = 1;

/// The `user-agent` token that announces the peer protocol.
const PEER_PROTOCOL_TOKEN: &str = "peer-protocol/";

/// The `user-agent` of this build's peer connections.
pub fn peer_user_agent() -> String {
    format!("etcd-rs-store/{SERVER_VERSION} {PEER_PROTOCOL_TOKEN}{PEER_PROTOCOL_VERSION}")
}

/// The peer protocol a `user-agent` announces (version 1 if it names none,
/// `None` if the number does not parse).
pub fn peer_protocol_of(user_agent: Option<&str>) -> Option<u32> {
    let Some(token) = user_agent
        .into_iter()
        .flat_map(str::split_whitespace)
        .find_map(|t| t.strip_prefix(PEER_PROTOCOL_TOKEN))
    else {
        return Some(UNANNOUNCED_PEER_PROTOCOL);
    };
    token.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_are_three_numbers() {
        assert_eq!(parse_release("3.6.14"), Some([3, 6, 14]));
        assert_eq!(parse_release("3.7.0-rc.1"), Some([3, 7, 0]));
        for bad in [
            "3.5",
            "3.5.x",
            "v3.5.1",
            "3.+5.1",
            "3.5.1.2",
            "3.5.99999999999999999999",
        ] {
            assert_eq!(parse_release(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_peer_protocol_is_read_from_the_user_agent() {
        let ours = peer_user_agent();
        assert_eq!(peer_protocol_of(Some(&ours)), Some(PEER_PROTOCOL_VERSION));
        // tonic appends its own token.
        let sent = format!("{ours} tonic/0.14.2");
        assert_eq!(peer_protocol_of(Some(&sent)), Some(PEER_PROTOCOL_VERSION));
        assert_eq!(peer_protocol_of(Some("tonic/0.14.2")), Some(1));
        assert_eq!(peer_protocol_of(None), Some(1));
        assert_eq!(peer_protocol_of(Some("x peer-protocol/7")), Some(7));
        assert_eq!(peer_protocol_of(Some("peer-protocol/seven")), None);
    }

    #[test]
    fn the_storage_version_is_the_server_versions_minor() {
        let major_minor = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
        assert_eq!(
            format!("{}.0", major_minor(SERVER_VERSION)),
            STORAGE_VERSION
        );
    }
}
