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

/// Test-only: with this set to `1` the process is the *next* release
/// ([`release`]): it presents the next minor version, writes the next
/// storage format and speaks the next peer protocol once the cluster
/// version allows them. A rolling upgrade to it and the downgrade back
/// (tests/tests/upgrade.rs) then need one build only.
pub const TEST_NEXT_RELEASE_ENV: &str = "ETCDRS_TEST_NEXT_RELEASE";

/// Test-only: with this set to `1` the process is the *previous build* of
/// this release: the same version and storage format, but peer protocol 1
/// only, and it announces no protocol in its answers, as builds before
/// peer protocol 2 did. A rolling upgrade from it (tests/tests/upgrade.rs)
/// then needs one build only.
pub const TEST_PREVIOUS_BUILD_ENV: &str = "ETCDRS_TEST_PREVIOUS_BUILD";

/// A release's storage formats and peer protocols, each with the cluster
/// (or storage) version, `[major, minor]`, from which it may be used:
/// a member writes the newest format its storage version allows and
/// sends the newest protocol its cluster version allows, never past its
/// own release's, so that every member of the cluster can read them.
/// A protocol is also sent to a member only once that member has
/// announced it speaks it ([`crate::raft::peer_protocol`]): builds of one
/// release may differ in their protocols, and the cluster version cannot
/// tell them apart.
///
/// | format | from | what |
/// | --- | --- | --- |
/// | 2 | 3.6 | this release ([`crate::data_dir`]'s formats) |
/// | 3 | 3.7 | the test-only next release: format 2's layout under a new number, so the upgrade test exercises the gates, the migration and the refusals |
///
/// | protocol | from | what |
/// | --- | --- | --- |
/// | 1 | 3.6 | `storepeer`'s messages; a Raft failure answered as its text |
/// | 2 | 3.6 | a Raft failure answered typed ([`crate::raft::peer_protocol::RaftFailure`]); a snapshot streamed without its length first, its end marked ([`crate::raft::network::SnapshotOpening`]) |
/// | 3 | 3.7 | the test-only next release: protocol 2's layout under a new number |
const FORMATS: [(u32, [u64; 2]); 2] = [(2, [3, 6]), (3, [3, 7])];
const PEER_PROTOCOLS: [(u32, [u64; 2]); 3] = [(1, [3, 6]), (2, [3, 6]), (3, [3, 7])];

/// What one release presents, writes and speaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// The server version it presents.
    pub server_version: String,
    /// The highest storage version it writes (`major.minor.0`).
    pub storage_version: String,
    /// The newest storage format it writes and reads.
    pub newest_format: u32,
    /// The newest peer protocol it speaks.
    pub newest_peer_protocol: u32,
    /// Whether its peer answers announce the newest protocol it speaks
    /// ([`PEER_PROTOCOL_HEADER`]); builds before protocol 2 did not.
    pub announces_peer_protocol: bool,
}

/// Which build a test runs this one as ([`TEST_NEXT_RELEASE_ENV`],
/// [`TEST_PREVIOUS_BUILD_ENV`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Build {
    /// This build.
    This,
    /// The next release.
    Next,
    /// The previous build of this release.
    Previous,
}

/// The release this process is: this one, the test-only next one or
/// previous build, or this one presenting the server version given in
/// [`TEST_SERVER_VERSION_ENV`]. Read once.
pub fn release() -> &'static Release {
    static RELEASE: std::sync::LazyLock<Release> = std::sync::LazyLock::new(|| {
        let on = |name| std::env::var(name).is_ok_and(|v| v == "1");
        let build = if on(TEST_NEXT_RELEASE_ENV) {
            Build::Next
        } else if on(TEST_PREVIOUS_BUILD_ENV) {
            Build::Previous
        } else {
            Build::This
        };
        release_of(build, std::env::var(TEST_SERVER_VERSION_ENV).ok())
    });
    &RELEASE
}

/// The release [`release`] describes, given the test-only switches.
fn release_of(build: Build, presented: Option<String>) -> Release {
    let [major, minor, _] = parse_release(SERVER_VERSION).expect("SERVER_VERSION parses");
    if build == Build::Next {
        let version = format!("{major}.{}.0", minor + 1);
        return Release {
            server_version: version.clone(),
            storage_version: version,
            newest_format: crate::data_dir::FORMAT_VERSION + 1,
            newest_peer_protocol: PEER_PROTOCOL_VERSION + 1,
            announces_peer_protocol: true,
        };
    }
    let previous = build == Build::Previous;
    Release {
        server_version: presented
            .filter(|v| parse_release(v).is_some())
            .unwrap_or_else(|| SERVER_VERSION.to_string()),
        storage_version: STORAGE_VERSION.to_string(),
        newest_format: crate::data_dir::FORMAT_VERSION,
        newest_peer_protocol: if previous {
            OLDEST_PEER_PROTOCOL
        } else {
            PEER_PROTOCOL_VERSION
        },
        announces_peer_protocol: !previous,
    }
}

/// The server version this process presents (Status, `/version`,
/// `etcd_server_version`).
pub fn presented_server_version() -> &'static str {
    &release().server_version
}

/// The newest of `table`'s entries usable at `version` (`[major, minor]`)
/// and no newer than `ceiling`; the oldest when none is.
fn newest_usable(table: &[(u32, [u64; 2])], version: Option<[u64; 2]>, ceiling: u32) -> u32 {
    let oldest = table[0].0;
    let Some(version) = version else {
        return oldest;
    };
    table
        .iter()
        .filter(|(n, since)| *since <= version && *n <= ceiling)
        .map(|(n, _)| *n)
        .max()
        .unwrap_or(oldest)
}

/// The storage format this release writes at storage version
/// `storage` (`[major, minor]`).
pub fn format_for(storage: [u64; 2]) -> u32 {
    newest_usable(&FORMATS, Some(storage), release().newest_format)
}

/// The peer protocol this release sends at cluster version `cluster`
/// (`[major, minor]`; None before one is decided: the oldest, which every
/// member speaks).
pub fn peer_protocol_for(cluster: Option<[u64; 2]>) -> u32 {
    newest_usable(&PEER_PROTOCOLS, cluster, release().newest_peer_protocol)
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
/// refuses requests of a version it does not speak ([`speaks_peer_protocol`])
/// rather than misread them, and sends the newest one the cluster version
/// allows ([`peer_protocol_for`]) and the receiver announced
/// ([`PEER_PROTOCOL_HEADER`]). Builds before it was announced spoke
/// version 1.
pub const PEER_PROTOCOL_VERSION: u32 = 2;

/// The oldest peer protocol this build speaks.
pub const OLDEST_PEER_PROTOCOL: u32 = 1;

/// Whether this release reads requests in peer protocol `protocol`.
pub fn speaks_peer_protocol(protocol: u32) -> bool {
    (OLDEST_PEER_PROTOCOL..=release().newest_peer_protocol).contains(&protocol)
}

/// The peer protocol of a request that does not announce one.
const UNANNOUNCED_PEER_PROTOCOL: u32 = 1;

/// The `user-agent` token that announces the peer protocol.
const PEER_PROTOCOL_TOKEN: &str = "peer-protocol/";

/// The header of every peer answer that announces the newest peer protocol
/// the answering member speaks (a number); an answer without it comes from
/// a build that speaks protocol 1 only. etcd's members learn each other's
/// stream formats from their answers' `X-Server-Version` the same way.
pub const PEER_PROTOCOL_HEADER: &str = "peer-protocol";

/// The newest peer protocol a peer answer's headers announce (1 when they
/// announce none; `None` when the number does not parse).
pub fn announced_peer_protocol(headers: &http::HeaderMap) -> Option<u32> {
    match headers.get(PEER_PROTOCOL_HEADER) {
        None => Some(UNANNOUNCED_PEER_PROTOCOL),
        Some(value) => value.to_str().ok()?.parse().ok(),
    }
}

/// The `user-agent` of this member's peer connections that send
/// `protocol` (see [`peer_protocol_for`]).
pub fn peer_user_agent(protocol: u32) -> String {
    format!(
        "etcd-rs-store/{} {PEER_PROTOCOL_TOKEN}{protocol}",
        presented_server_version()
    )
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
        let ours = peer_user_agent(PEER_PROTOCOL_VERSION);
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
    fn the_next_release_is_one_minor_up_with_the_next_format_and_protocol() {
        let this = release_of(Build::This, None);
        assert_eq!(this.server_version, SERVER_VERSION);
        assert_eq!(this.storage_version, STORAGE_VERSION);
        assert!(this.announces_peer_protocol);
        assert_eq!(
            release_of(Build::This, Some("3.5.21".into())).server_version,
            "3.5.21"
        );
        assert_eq!(
            release_of(Build::This, Some("three".into())).server_version,
            SERVER_VERSION
        );
        let next = release_of(Build::Next, Some("3.5.21".into()));
        assert_eq!(next.server_version, "3.7.0");
        assert_eq!(next.storage_version, "3.7.0");
        assert_eq!(next.newest_format, this.newest_format + 1);
        assert_eq!(next.newest_peer_protocol, this.newest_peer_protocol + 1);
    }

    /// The previous build is this release speaking protocol 1 only,
    /// announcing none.
    #[test]
    fn the_previous_build_speaks_protocol_1_and_announces_nothing() {
        let (this, previous) = (
            release_of(Build::This, None),
            release_of(Build::Previous, None),
        );
        assert_eq!(previous.server_version, this.server_version);
        assert_eq!(previous.newest_format, this.newest_format);
        assert_eq!(previous.newest_peer_protocol, 1);
        assert!(!previous.announces_peer_protocol);
    }

    #[test]
    fn the_announced_protocol_is_read_from_the_answer() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(announced_peer_protocol(&headers), Some(1));
        headers.insert(PEER_PROTOCOL_HEADER, http::HeaderValue::from_static("2"));
        assert_eq!(announced_peer_protocol(&headers), Some(2));
        headers.insert(PEER_PROTOCOL_HEADER, http::HeaderValue::from_static("two"));
        assert_eq!(announced_peer_protocol(&headers), None);
    }

    /// Formats and protocols follow the storage and cluster versions,
    /// capped at the release's own.
    #[test]
    fn formats_and_protocols_are_gated_by_the_versions() {
        let (this, next) = (release_of(Build::This, None), release_of(Build::Next, None));
        let format = |v, r: &Release| newest_usable(&FORMATS, v, r.newest_format);
        let protocol = |v, r: &Release| newest_usable(&PEER_PROTOCOLS, v, r.newest_peer_protocol);
        assert_eq!(format(None, &next), 2);
        assert_eq!(
            format(Some([3, 5]), &next),
            2,
            "below every entry: the oldest"
        );
        assert_eq!(format(Some([3, 6]), &next), 2);
        assert_eq!(format(Some([3, 7]), &next), 3);
        assert_eq!(
            format(Some([3, 7]), &this),
            2,
            "never past the release's own"
        );
        assert_eq!(format(Some([4, 0]), &next), 3);
        assert_eq!(protocol(None, &next), 1);
        assert_eq!(protocol(Some([3, 5]), &next), 1);
        assert_eq!(protocol(Some([3, 6]), &next), 2);
        assert_eq!(protocol(Some([3, 7]), &next), 3);
        assert_eq!(protocol(Some([3, 7]), &this), 2);
        assert_eq!(format(Some([3, 6]), &this), crate::data_dir::FORMAT_VERSION);
        assert_eq!(protocol(Some([3, 6]), &this), PEER_PROTOCOL_VERSION);
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
