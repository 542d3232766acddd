//! Which server a scenario runs against, and [`against_both!`](crate::against_both):
//! one test per scenario and server.
//!
//! Property tests (as opposed to the [`crate::differential`] comparison)
//! check the same assertions on real etcd 3.5 and on the candidate, so that
//! a property that etcd itself does not have is caught as a wrong test, not
//! as a bug of the store. A scenario is an `async fn(Server)`;
//! `against_both!(a, b)` makes the tests `etcd35::a`, `etcd35::b`,
//! `candidate::a` and `candidate::b`.

use crate::binary::Binary;
use crate::cluster::{Cluster, ClusterConfig};

/// An etcd release: (major, minor, patch).
pub type Release = (u64, u64, u64);

/// The release a version string names ("3.5.1" is (3, 5, 1)); a part
/// that is missing or not a number counts as 0.
pub fn release_of(version: &str) -> Release {
    let mut parts = version
        .split('.')
        .map(|part| part.parse::<u64>().unwrap_or(0));
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next())
}

/// Which server a test runs against.
#[derive(Clone, Copy, Debug)]
pub enum Server {
    /// Real etcd 3.5 ([`Binary::etcd35`]).
    Reference,
    /// The server under test ([`Binary::candidate`]).
    Candidate,
}

impl Server {
    /// The binary; panics (with how to provide it) if it is missing.
    pub fn binary(self) -> Binary {
        match self {
            Server::Reference => Binary::etcd35().expect("reference etcd 3.5"),
            Server::Candidate => Binary::candidate().expect("candidate server binary"),
        }
    }

    /// Whether the binary is the reference etcd release itself (also when
    /// `STORE_BIN` points at it): only then may a known bug of that release
    /// be excused. The candidate's reported version is never trusted for that.
    pub fn is_reference_etcd(self) -> bool {
        let reference = Binary::etcd35().expect("reference etcd 3.5").path;
        let canonical = |path: &std::path::Path| std::fs::canonicalize(path).ok();
        canonical(&self.binary().path) == canonical(&reference)
    }

    /// Whether a violation is the known bug of the reference etcd `version`
    /// (as its Status reports it, "3.5.1") that etcd fixed in release
    /// `fixed_in`: only when this binary is the reference itself and its
    /// release is older. Such a violation is reported, not failed.
    pub fn has_known_bug(self, version: &str, fixed_in: Release) -> bool {
        self.is_reference_etcd() && release_of(version) < fixed_in
    }

    /// A cluster of this server; panics if it does not start.
    pub async fn start(self, config: ClusterConfig) -> Cluster {
        let size = config.size;
        Cluster::start(self.binary(), config)
            .await
            .unwrap_or_else(|e| panic!("starting {size} member(s) of {self:?}: {e:#}"))
    }
}

/// One test per scenario and server: `etcd35::<scenario>` and
/// `candidate::<scenario>`, each calling `<scenario>(Server::…)` of the
/// enclosing module. The test attribute is `#[tokio::test]` unless one is
/// given first, e.g.
/// `against_both!(#[tokio::test(flavor = "multi_thread")] scenario_a, scenario_b)`.
#[macro_export]
macro_rules! against_both {
    (#[$test:meta] $($scenario:ident),* $(,)?) => {
        mod etcd35 {
            $(
                #[$test]
                async fn $scenario() {
                    super::$scenario($crate::Server::Reference).await;
                }
            )*
        }
        mod candidate {
            $(
                #[$test]
                async fn $scenario() {
                    super::$scenario($crate::Server::Candidate).await;
                }
            )*
        }
    };
    ($($scenario:ident),* $(,)?) => {
        $crate::against_both!(#[tokio::test] $($scenario),*);
    };
}
