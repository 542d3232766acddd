//! A rolling upgrade and the downgrade back, under the robustness suite's
//! clients, watchers and lease clients, as an operator runs them with
//! kubeadm: one member at a time stopped gracefully (SIGTERM, as the
//! kubelet stops a static pod) and started on the other release.
//!
//! The next release is this build started with the test-only
//! `ETCDRS_TEST_NEXT_RELEASE=1`: it presents 3.7.0, writes storage format
//! 3 and speaks peer protocol 3, but only once the cluster version allows
//! them; this release reads neither (it refuses the format at start and
//! the protocol per request), so using either too early fails the run.
//!
//! 1. Three members of this release (3.6.14; cluster version 3.6.0,
//!    format 2, protocol 2).
//! 2. Each member in turn replaced by the next release. While any member
//!    runs 3.6 the cluster version stays 3.6.0, so the format stays 2 and
//!    the protocol 2; once all run 3.7 the leader raises it to 3.7.0, every
//!    member migrates its directory to format 3 and sends protocol 3.
//! 3. etcd 3.6's downgrade: `Downgrade VALIDATE 3.6`, `ENABLE 3.6`; the
//!    leader lowers the cluster version to 3.6.0, every member migrates
//!    back to format 2 and sends protocol 2 again (the operator checks
//!    each member's storage version before replacing any).
//! 4. Each member in turn replaced by this release; once all run 3.6 the
//!    leader ends the downgrade.
//!
//! The second test rolls between two builds of this release: the
//! previous build (`ETCDRS_TEST_PREVIOUS_BUILD=1`: peer protocol 1 only,
//! announcing none, as builds before protocol 2) and this one. The cluster
//! version cannot tell them apart (both present 3.6.14), so each member
//! learns what the others speak from their answers: every member is
//! rolled back to the previous build, then upgraded again; at the end each
//! member has learned protocol 2 from every other.
//!
//! Checked: every member's versions and format after each phase, and the
//! protocol each member learned from every other; the robustness checks
//! (linearizable history, no lost acknowledged write, the members' HashKV
//! agree, watch guarantees, no lease expired early); and no failed request
//! to a member that was up (one in flight on, or sent to, the member being
//! replaced is excused until it serves again).
//!
//! Run: `cargo test --release -p integration-tests --test integration upgrade::`

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use etcd_proto::etcdserverpb::DowngradeInfo;
use integration_tests::cluster::{Cluster, ClusterConfig};
use integration_tests::robustness::history::Clock;
use integration_tests::robustness::nemesis::{Fault, FaultKind, Injected};
use integration_tests::robustness::{self, Disturbing, MEMBERS};
use integration_tests::wait::retry_until;
use integration_tests::Server;

use crate::versions::{downgrade, enabled, wait_versions, ENABLE, VALIDATE};

/// The test-only switch that makes a member the next release.
const NEXT_RELEASE_ENV: &str = "ETCDRS_TEST_NEXT_RELEASE";
/// The test-only switch that makes a member the previous build of this
/// release.
const PREVIOUS_BUILD_ENV: &str = "ETCDRS_TEST_PREVIOUS_BUILD";
/// The log message of a member that learned another's peer protocol.
const LEARNED: &str = "learned a member's peer protocol";
/// The log message of a member whose cluster version allows another
/// peer protocol.
const CHANGED: &str = "changed the peer protocol";
/// The seed of the clients' choices.
const SEED: u64 = 1;

/// A release as the test sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Release {
    /// Its server version.
    server: &'static str,
    /// The cluster and storage version when every member runs it.
    cluster: &'static str,
    /// `member/store-format` once the cluster runs it.
    format: &'static str,
    /// The newest peer protocol it speaks and announces.
    protocol: u64,
    /// The test-only switch that starts it, if any.
    switch: Option<&'static str>,
}

const THIS: Release = Release {
    server: "3.6.14",
    cluster: "3.6.0",
    format: "2",
    protocol: 2,
    switch: None,
};
const NEXT: Release = Release {
    server: "3.7.0",
    cluster: "3.7.0",
    format: "3",
    protocol: 3,
    switch: Some(NEXT_RELEASE_ENV),
};
const PREVIOUS: Release = Release {
    server: "3.6.14",
    cluster: "3.6.0",
    format: "2",
    protocol: 1,
    switch: Some(PREVIOUS_BUILD_ENV),
};

/// Load between two steps.
const STEP_LOAD: Duration = Duration::from_secs(1);
/// How long a graceful stop may take (a leader hands its leadership over
/// first).
const STOP_DEADLINE: Duration = Duration::from_secs(30);
/// How long the members' `member/store-format` may take to follow the
/// versions once they report them (each member migrates when it applies
/// the change).
const VERSIONS_SETTLE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_and_downgrade_fail_no_request() {
    replace_every_member_twice(roll).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_to_the_previous_build_and_back_fail_no_request() {
    replace_every_member_twice(roll_builds).await;
}

/// Runs `steps`, which replace every member twice, under the robustness
/// load, and checks the run (module docs).
async fn replace_every_member_twice(
    steps: impl for<'a> FnOnce(&'a Cluster, Clock) -> Disturbing<'a>,
) {
    let config = ClusterConfig::new(MEMBERS);
    let report = robustness::run_with(Server::Candidate, SEED, config, steps)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("{report}");
    assert_eq!(report.failure(), None);
    let failed = report.failed_on_up_members();
    assert!(
        failed.is_empty(),
        "{} requests failed on members that were up:\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert_eq!(
        report.faults.len(),
        2 * MEMBERS,
        "every member replaced twice"
    );
}

/// The upgrade and the downgrade (module docs); the member replacements.
fn roll(cluster: &Cluster, clock: Clock) -> Disturbing<'_> {
    Box::pin(async move {
        let mut steps = Vec::new();
        let mut running = [THIS; MEMBERS];
        settle(cluster, &running, THIS, None).await?;
        for i in 0..MEMBERS {
            tokio::time::sleep(STEP_LOAD).await;
            steps.push(replace(cluster, clock, i, running[i], NEXT).await?);
            running[i] = NEXT;
            let cluster_release = if i + 1 < MEMBERS { THIS } else { NEXT };
            settle(cluster, &running, cluster_release, None).await?;
        }
        learned(cluster, NEXT.protocol).await?;
        for i in 0..MEMBERS {
            let log = cluster.log(i);
            ensure!(
                last_said(&log, CHANGED).values().last() == Some(&NEXT.protocol)
                    && log.contains("migrated the storage format"),
                "member {i} did not move to the next protocol and format:\n{}",
                cluster.log_tail(i)
            );
        }
        tokio::time::sleep(STEP_LOAD).await;
        let to_this = |action| downgrade(cluster, 0, action, "3.6");
        ensure!(to_this(VALIDATE).await? == Ok("3.7".to_string()));
        ensure!(to_this(ENABLE).await? == Ok("3.7".to_string()));
        let enabled = enabled(THIS.cluster);
        settle(cluster, &running, THIS, Some(&enabled)).await?;
        for i in 0..MEMBERS {
            tokio::time::sleep(STEP_LOAD).await;
            steps.push(replace(cluster, clock, i, running[i], THIS).await?);
            running[i] = THIS;
            let downgrading = (i + 1 < MEMBERS).then_some(&enabled);
            settle(cluster, &running, THIS, downgrading).await?;
        }
        learned(cluster, THIS.protocol).await?;
        tokio::time::sleep(STEP_LOAD).await;
        Ok(steps)
    })
}

/// The rollback to the previous build and the upgrade back (module docs).
fn roll_builds(cluster: &Cluster, clock: Clock) -> Disturbing<'_> {
    Box::pin(async move {
        let mut steps = Vec::new();
        let mut running = [THIS; MEMBERS];
        settle(cluster, &running, THIS, None).await?;
        learned(cluster, THIS.protocol).await?;
        for release in [PREVIOUS, THIS] {
            for i in 0..MEMBERS {
                tokio::time::sleep(STEP_LOAD).await;
                steps.push(replace(cluster, clock, i, running[i], release).await?);
                running[i] = release;
                settle(cluster, &running, THIS, None).await?;
            }
        }
        learned(cluster, THIS.protocol).await?;
        tokio::time::sleep(STEP_LOAD).await;
        Ok(steps)
    })
}

/// Waits until the leader has last learned peer protocol `protocol` from
/// every follower and every follower from the leader (from their logs).
/// Members learn from the answers to what they send, and followers send
/// nothing to each other, so only these pairs are sure to have talked.
async fn learned(cluster: &Cluster, protocol: u64) -> Result<()> {
    let mut ids = Vec::with_capacity(MEMBERS);
    for i in 0..MEMBERS {
        ids.push(format!("{:x}", cluster.member_id(i).await?));
    }
    retry_until(
        &format!("the leader and its followers learned peer protocol {protocol} of each other"),
        VERSIONS_SETTLE,
        || async {
            let leader = cluster.leader().await?;
            let pairs = (0..MEMBERS)
                .filter(|&i| i != leader)
                .flat_map(|i| [(leader, i), (i, leader)]);
            for (i, j) in pairs {
                let learned = last_said(&cluster.log(i), LEARNED);
                let of_j = learned.get(ids[j].as_str());
                ensure!(
                    of_j == Some(&protocol),
                    "member {i} last learned {of_j:?} of member {j}"
                );
            }
            Ok(())
        },
    )
    .await
    .with_context(|| cluster.log_tails())
}

/// The last `to` of each member (`member`, "" if the line names none) in
/// the JSON log lines whose message is `message`.
fn last_said(log: &str, message: &str) -> std::collections::BTreeMap<String, u64> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["msg"] == message)
        .filter_map(|line| {
            let member = line["member"].as_str().unwrap_or_default().to_string();
            Some((member, line["to"].as_u64()?))
        })
        .collect()
}

/// Stops member `i` gracefully and starts it as `release` (it ran `from`);
/// the step, from the SIGTERM until every member serves again.
async fn replace(
    cluster: &Cluster,
    clock: Clock,
    i: usize,
    from: Release,
    release: Release,
) -> Result<Injected> {
    let at = clock.now();
    let exit = cluster.terminate(i, STOP_DEADLINE).await?;
    ensure!(exit.success(), "member {i} stopped with {exit}");
    match release.switch {
        Some(switch) => cluster.restart_under(i, &["env".to_string(), format!("{switch}=1")])?,
        None => cluster.restart(i)?,
    }
    cluster.wait_member_ready(i).await?;
    cluster.wait_healthy().await?;
    let kind = if release.protocol > from.protocol {
        FaultKind::UpgradeMember
    } else {
        FaultKind::DowngradeMember
    };
    Ok(Injected {
        fault: Fault {
            kind,
            load: STEP_LOAD,
            downtime: Duration::ZERO,
            seed: 0,
        },
        victims: vec![i],
        at,
        recovery: Duration::from_nanos(clock.now().saturating_sub(at)),
    })
}

/// Waits until each member runs `running[i]`'s server version and reports
/// `at`'s cluster and storage version and `downgrade` (none: not enabled),
/// then until its `member/store-format` holds `at`'s format.
async fn settle(
    cluster: &Cluster,
    running: &[Release; MEMBERS],
    at: Release,
    downgrade: Option<&DowngradeInfo>,
) -> Result<()> {
    let servers: Vec<&str> = running.iter().map(|release| release.server).collect();
    let downgrade = downgrade.cloned().unwrap_or_default();
    wait_versions(cluster, &servers, at.cluster, downgrade).await;
    retry_until(
        &format!("every member's storage format {}", at.format),
        VERSIONS_SETTLE,
        || async {
            for i in 0..MEMBERS {
                let file = cluster.data_dir(i).join("member/store-format");
                let format = std::fs::read_to_string(&file).context("the format file")?;
                ensure!(format.trim() == at.format, "member {i}: format {format:?}");
            }
            Ok(())
        },
    )
    .await
    .with_context(|| cluster.log_tails())
}
