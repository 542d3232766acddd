//! A follower whose disk fails, on both systems:
//!
//! - its disk fills up (a small tmpfs under its data directory, filled by a
//!   file): it stops with a non-zero exit status as etcd does (`failed to
//!   commit tx: no space left on device`), so that its supervisor restarts
//!   it, rather than running on without a Raft core;
//! - its `fdatasync` calls start failing with `EIO`
//!   ([`integration_tests::disk::failing_fdatasync`]): it must stop too
//!   (etcd: `failed to save Raft hard state and entries`), never count an
//!   append whose sync failed as stored, and never go on as if it had.
//!
//! Meanwhile the other two keep acknowledging writes; once the fault is
//! gone the member restarts, catches up and serves every acknowledged write.
//!
//! Run: `cargo test --release -p integration-tests --test integration disk_faults::`

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use etcd_client::GetOptions;
use integration_tests::client::describe_error;
use integration_tests::disk::{
    exited_with_failure, failing_fdatasync, SmallDisk, FULL_DISK_FREE_BYTES, GROWN_DISK_BYTES,
    SMALL_DISK_BYTES,
};
use integration_tests::writer::{served, KeyValues, Writes};
use integration_tests::{against_both, ClusterConfig, Server};

/// Size of each value written: the free space lasts a few hundred puts.
const VALUE_BYTES: usize = 4096;
/// Puts acknowledged after the failing member stopped, to show writes flow.
const PUTS_AFTER_STOP: usize = 50;
/// At most this many puts: a member still running after them never noticed
/// its full disk (80 MiB of values against 1 MiB free).
const MAX_PUTS: usize = 20_000;
/// How long the scenario may take to see the member stop.
const STOP_DEADLINE: Duration = Duration::from_secs(120);
/// How long a restarted member may take to serve every acknowledged write.
const CATCH_UP_DEADLINE: Duration = Duration::from_secs(60);
/// The failing member's first `fdatasync` that fails: past its start-up
/// and catch-up (a few dozen), so it fails while following the writes.
const FIRST_FAILING_SYNC: u32 = 200;

const PREFIX: &str = "disk/";

/// The fault put on one follower's disk.
#[derive(Clone, Copy, Debug)]
enum DiskFault {
    Full,
    SyncFails,
}

async fn full_disk_stops_one_member_and_loses_no_write(server: Server) {
    scenario(server, DiskFault::Full)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
}

async fn failing_fsync_stops_one_member_and_loses_no_write(server: Server) {
    scenario(server, DiskFault::SyncFails)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
}

async fn scenario(server: Server, fault: DiskFault) -> Result<()> {
    let cluster = server.start(ClusterConfig::new(3)).await;
    let victim = cluster.follower().await?;
    cluster.terminate(victim, Duration::from_secs(30)).await?;
    let disk = match fault {
        DiskFault::Full => {
            let disk = SmallDisk::mount_over(&cluster.data_dir(victim), SMALL_DISK_BYTES)?;
            cluster.restart_and_wait(victim).await?;
            disk.fill(FULL_DISK_FREE_BYTES)?;
            Some(disk)
        }
        DiskFault::SyncFails => {
            cluster.restart_under(victim, &failing_fdatasync(FIRST_FAILING_SYNC))?;
            cluster.wait_member_ready(victim).await?;
            None
        }
    };

    let writer = (0..cluster.size())
        .find(|&i| i != victim)
        .expect("3 members");
    let mut client = cluster.client(writer).await?;
    let mut writes = Writes::default();
    let started = Instant::now();
    let mut after_stop = 0;
    for n in 0..MAX_PUTS {
        let key = format!("{PREFIX}{n:05}");
        let value = format!("{n:05}").repeat(VALUE_BYTES / 5);
        writes.attempted.insert(key.clone());
        // Quorum stays (two members of three): every put is acknowledged,
        // a leader change excepted, after which it is sent again.
        let revision = loop {
            match client.put(key.as_str(), value.as_str(), None).await {
                Ok(r) => break r.header().context("put without header")?.revision(),
                Err(e) if started.elapsed() < STOP_DEADLINE => {
                    writes.errors.push(describe_error(&e));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => bail!("put {key}: {}", describe_error(&e)),
            }
        };
        writes.acknowledged.insert(key, (value, revision));
        if let Some(status) = cluster.exit_status(victim)? {
            if after_stop == 0 {
                assert!(
                    exited_with_failure(&status),
                    "a member that cannot write exits with a failure status: {status}"
                );
                eprintln!(
                    "{server:?} {fault:?}: member {victim} stopped ({status}) after {n} puts"
                );
            }
            after_stop += 1;
            if after_stop == PUTS_AFTER_STOP {
                break;
            }
        } else if started.elapsed() > STOP_DEADLINE {
            bail!(
                "member {victim} still runs on its failing disk ({fault:?}) after {n} puts:\n{}",
                cluster.log_tail(victim)
            );
        }
    }
    assert_eq!(
        after_stop, PUTS_AFTER_STOP,
        "member {victim} never stopped on its failing disk ({fault:?})"
    );
    eprintln!(
        "{server:?} {fault:?}: {} puts retried: {:?}",
        writes.errors.len(),
        writes.errors.first()
    );

    if let Some(disk) = disk {
        // The member wrote until its disk was full: a Raft log segment's
        // worth (64 MiB, preallocated) and the engine's WAL of the same
        // values. Catching up needs a new segment, so the operator frees
        // the filler and grows the volume, as the robustness nemesis does.
        disk.free()?;
        eprintln!(
            "{server:?} {fault:?}: {} bytes free on the healed disk before it grows",
            disk.available()?
        );
        disk.grow(GROWN_DISK_BYTES)?;
        // Unmounted after the members are killed, before the cluster's
        // directory is removed.
        cluster.keep_disk(disk);
    }
    cluster.restart_and_wait(victim).await?;
    for i in 0..cluster.size() {
        // A restarted member serves (serializable) reads while it still
        // applies what it missed: wait until it serves every acknowledged
        // write, and report the first one still missing if it never does.
        integration_tests::wait::retry_until(
            "every acknowledged write",
            CATCH_UP_DEADLINE,
            || async {
                let served = read_all(&cluster, i).await?;
                writes.check_served(&format!("member {i}"), &served)
            },
        )
        .await?;
    }
    let mut again = cluster.client(victim).await?;
    again.put("after-disk-fault", "ok", None).await?;
    Ok(())
}

/// Member `i`'s serializable view of the prefix, in pages of
/// [`PAGE_KEYS`] keys (all of it at once is more than a gRPC message).
async fn read_all(cluster: &integration_tests::Cluster, i: usize) -> Result<KeyValues> {
    let mut client = cluster.client(i).await?;
    let mut all = KeyValues::new();
    let end = format!("{PREFIX}\u{ff}");
    let mut from = PREFIX.to_string();
    loop {
        let options = GetOptions::new()
            .with_range(end.as_str())
            .with_limit(PAGE_KEYS)
            .with_serializable();
        let page = client.get(from.as_str(), Some(options)).await?;
        let more = page.more();
        let kvs = served(&page);
        let Some(last) = kvs.keys().last().cloned() else {
            break;
        };
        all.extend(kvs);
        if !more {
            break;
        }
        from = format!("{last}\0");
    }
    Ok(all)
}

/// Keys per page of [`read_all`]: 200 values of 4 KiB.
const PAGE_KEYS: i64 = 200;

against_both!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    full_disk_stops_one_member_and_loses_no_write,
    failing_fsync_stops_one_member_and_loses_no_write
);
