//! The nemesis: process and network faults on a seeded schedule, each
//! healed before the next.
//!
//! A run injects each of the ten [`Fault`] kinds once, in an order drawn
//! from the run's seed: SIGKILL of the leader, SIGKILL of a follower (both
//! restarted after a drawn downtime with their original flags and data),
//! SIGKILL of every member at once (all restarted), SIGSTOP of the leader
//! for a drawn [`PAUSE_MILLIS`] then SIGCONT, and a network partition that
//! isolates the leader, or a follower, from the other members for a drawn
//! [`PARTITION_MILLIS`] (the isolated member still serves its clients:
//! the cluster runs in network namespaces, [`crate::netns`], and the cut
//! links drop packets silently, as a real partition), and a lossy network:
//! for a drawn [`PARTITION_MILLIS`], one link between two members after
//! another is cut or healed every [`FLAP_MILLIS`] (drawn), so messages are
//! lost in bursts in both directions while every member stays up, and a
//! slow network: for a drawn [`PARTITION_MILLIS`], every [`SLOW_CHANGE_MILLIS`]
//! (drawn) one link gets a new delay drawn from [`LINK_DELAY_MILLIS`] (the
//! peer traffic passes through [`crate::relay`]), so messages arrive late
//! but in order, some later than the election timeout; and a leadership
//! transfer (etcd's `MoveLeader`, asked of the leader) to a follower drawn
//! from the fault's seed, under load; and a full disk: a follower is
//! killed (SIGKILL), its data directory moved onto a small tmpfs
//! ([`crate::disk::SmallDisk`]) and the member restarted there, the disk
//! filled to [`FULL_DISK_FREE_BYTES`] free, and the nemesis writes
//! [`FILL_VALUE_BYTES`] values outside the checked keys through another
//! member until the victim exits by itself with a failure status (as etcd
//! does on `ENOSPC`); the filler is removed and the disk grown to
//! [`GROWN_DISK_BYTES`] (the writes the member missed must fit), and after
//! a drawn [`DOWNTIME_MILLIS`] the member restarts on it. Before each fault the
//! workload runs undisturbed for a drawn [`LOAD_MILLIS`]; after healing, the
//! nemesis waits until every member serves a linearizable read again.
//! Signals go to the member's own pid (`kill -s STOP|CONT <pid>`).

use std::fmt;
use std::ops::RangeInclusive;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use rand::SeedableRng;

use super::history::Clock;
use crate::client::describe_error;
use crate::cluster::Cluster;
use crate::disk::{
    exited_with_failure, SmallDisk, FULL_DISK_FREE_BYTES, GROWN_DISK_BYTES, SMALL_DISK_BYTES,
};
use crate::process::{signal, stop_process};

/// Undisturbed load before each fault, in milliseconds (drawn uniformly).
pub const LOAD_MILLIS: RangeInclusive<u64> = 500..=1500;
/// Time killed members stay down, in milliseconds (drawn uniformly).
pub const DOWNTIME_MILLIS: RangeInclusive<u64> = 200..=1500;
/// Time the leader stays stopped, in milliseconds (drawn uniformly).
pub const PAUSE_MILLIS: RangeInclusive<u64> = 1000..=5000;
/// Time a member stays cut off from the others, in milliseconds (drawn
/// uniformly): from below to several times the election timeout (1 s), so
/// some partitions heal before an election and some after.
pub const PARTITION_MILLIS: RangeInclusive<u64> = 500..=4000;
/// During a lossy-network fault, time between two link changes, in
/// milliseconds (drawn uniformly for each change): around the heartbeat
/// interval (100 ms), so heartbeats, appends and votes are lost in bursts.
pub const FLAP_MILLIS: RangeInclusive<u64> = 20..=300;
/// During a slow-network fault, time between two delay changes, in
/// milliseconds (drawn uniformly for each change).
pub const SLOW_CHANGE_MILLIS: RangeInclusive<u64> = 100..=500;
/// A slow link's delay each way, in milliseconds (drawn uniformly): from
/// none to past the election timeout (1 s), so some delays only slow the
/// commits and some let a follower's election timer fire.
pub const LINK_DELAY_MILLIS: RangeInclusive<u64> = 0..=1500;
/// Size of each value the full-disk fault writes to fill the victim's
/// disk: the store's WAL is preallocated at its memtable's size, so it
/// needs tens of MiB of writes before a write finds the disk full.
pub const FILL_VALUE_BYTES: usize = 128 * 1024;
/// Bytes of values the full-disk fault writes at most: a victim still
/// running after them never noticed its full disk (the run fails).
pub const MAX_FILL_BYTES: usize = 160 * 1024 * 1024;
/// Prefix of the full-disk fault's keys: outside the watchers' prefix, so
/// the watchers neither receive nor keep the large values.
pub const FILL_PREFIX: &str = "nemesis-fill/";
/// Deadline of one fill put.
pub const FILL_PUT_TIMEOUT: Duration = Duration::from_secs(10);
/// Load after the last fault has healed, before the clients stop.
pub const FINAL_LOAD: Duration = Duration::from_secs(1);

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    KillLeader,
    KillFollower,
    KillAll,
    PauseLeader,
    PartitionLeader,
    PartitionFollower,
    LossyNetwork,
    SlowNetwork,
    TransferLeader,
    FullDisk,
    /// A step of a rolling upgrade (`tests/upgrade.rs`), not a fault: a
    /// member stopped gracefully and started as the next release.
    UpgradeMember,
    /// A step of the downgrade back: a member of the next release stopped
    /// gracefully and started as this release.
    DowngradeMember,
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FaultKind::KillLeader => "kill -9 leader",
            FaultKind::KillFollower => "kill -9 follower",
            FaultKind::KillAll => "kill -9 all members",
            FaultKind::PauseLeader => "SIGSTOP leader",
            FaultKind::PartitionLeader => "partition: leader isolated",
            FaultKind::PartitionFollower => "partition: follower isolated",
            FaultKind::LossyNetwork => "lossy network: links flapping",
            FaultKind::SlowNetwork => "slow network: links delayed",
            FaultKind::TransferLeader => "MoveLeader to a follower",
            FaultKind::FullDisk => "full disk on a follower",
            FaultKind::UpgradeMember => "member replaced by a newer build",
            FaultKind::DowngradeMember => "member replaced by an older build",
        })
    }
}

/// One planned fault.
#[derive(Clone, Copy, Debug)]
pub struct Fault {
    pub kind: FaultKind,
    /// Undisturbed load before it.
    pub load: Duration,
    /// How long the victims stay killed or stopped.
    pub downtime: Duration,
    /// Seed of the fault's own random choices (which links flap, when).
    pub seed: u64,
}

/// What happened to one fault.
#[derive(Clone, Debug)]
pub struct Injected {
    pub fault: Fault,
    /// Members hit.
    pub victims: Vec<usize>,
    /// Run-clock nanoseconds once the fault was in place (the last victim
    /// killed or stopped).
    pub at: u64,
    /// From the injection until every member served again.
    pub recovery: Duration,
}

/// The ten fault kinds in a seeded order, with drawn loads and downtimes
/// (none for a leadership transfer).
pub fn schedule(rng: &mut StdRng) -> Vec<Fault> {
    let mut kinds = vec![
        FaultKind::KillLeader,
        FaultKind::KillFollower,
        FaultKind::KillAll,
        FaultKind::PauseLeader,
        FaultKind::PartitionLeader,
        FaultKind::PartitionFollower,
        FaultKind::LossyNetwork,
        FaultKind::SlowNetwork,
        FaultKind::TransferLeader,
        FaultKind::FullDisk,
    ];
    kinds.shuffle(rng);
    kinds
        .into_iter()
        .map(|kind| {
            let downtime = match kind {
                FaultKind::PauseLeader => rng.gen_range(PAUSE_MILLIS),
                FaultKind::PartitionLeader
                | FaultKind::PartitionFollower
                | FaultKind::LossyNetwork
                | FaultKind::SlowNetwork => rng.gen_range(PARTITION_MILLIS),
                FaultKind::TransferLeader => 0,
                _ => rng.gen_range(DOWNTIME_MILLIS),
            };
            Fault {
                kind,
                load: Duration::from_millis(rng.gen_range(LOAD_MILLIS)),
                downtime: Duration::from_millis(downtime),
                seed: rng.gen(),
            }
        })
        .collect()
}

/// Injects and heals every fault of `plan` in order.
pub async fn run(cluster: &Cluster, clock: Clock, plan: &[Fault]) -> Result<Vec<Injected>> {
    let mut injected = Vec::with_capacity(plan.len());
    for fault in plan {
        tokio::time::sleep(fault.load).await;
        let done = inject(cluster, clock, *fault)
            .await
            .with_context(|| format!("fault {}", fault.kind))?;
        injected.push(done);
    }
    tokio::time::sleep(FINAL_LOAD).await;
    Ok(injected)
}

/// Injects one fault, heals it and waits until every member serves.
async fn inject(cluster: &Cluster, clock: Clock, fault: Fault) -> Result<Injected> {
    let victims = match fault.kind {
        FaultKind::KillLeader | FaultKind::PauseLeader | FaultKind::PartitionLeader => {
            vec![cluster.leader().await?]
        }
        FaultKind::KillFollower | FaultKind::PartitionFollower | FaultKind::FullDisk => {
            vec![cluster.follower().await?]
        }
        FaultKind::TransferLeader => {
            let leader = cluster.leader().await?;
            let followers: Vec<usize> = (0..cluster.size()).filter(|&i| i != leader).collect();
            let target = followers[StdRng::seed_from_u64(fault.seed).gen_range(0..followers.len())];
            vec![leader, target]
        }
        FaultKind::KillAll | FaultKind::LossyNetwork | FaultKind::SlowNetwork => cluster.running(),
        FaultKind::UpgradeMember | FaultKind::DowngradeMember => Vec::new(),
    };
    let at = match fault.kind {
        FaultKind::PauseLeader => pause(cluster, clock, victims[0], fault.downtime).await?,
        FaultKind::PartitionLeader | FaultKind::PartitionFollower => {
            isolate(cluster, clock, victims[0], fault.downtime).await?
        }
        FaultKind::LossyNetwork => flap(cluster, clock, fault).await?,
        FaultKind::SlowNetwork => slow(cluster, clock, fault).await?,
        FaultKind::TransferLeader => transfer(cluster, clock, victims[0], victims[1]).await?,
        FaultKind::FullDisk => fill_disk(cluster, clock, victims[0], fault.downtime).await?,
        FaultKind::UpgradeMember | FaultKind::DowngradeMember => {
            bail!("{} is a step of a rolling upgrade, not a fault", fault.kind)
        }
        FaultKind::KillLeader | FaultKind::KillFollower | FaultKind::KillAll => {
            for &member in &victims {
                cluster.kill(member)?;
            }
            let at = clock.now();
            tokio::time::sleep(fault.downtime).await;
            for &member in &victims {
                cluster.restart(member)?;
            }
            at
        }
    };
    cluster.wait_healthy().await?;
    let recovery = Duration::from_nanos(clock.now().saturating_sub(at));
    Ok(Injected {
        fault,
        victims,
        at,
        recovery,
    })
}

/// SIGSTOPs member `i` for `duration`, then SIGCONTs it; the run-clock
/// instant at which it was stopped.
async fn pause(cluster: &Cluster, clock: Clock, i: usize, duration: Duration) -> Result<u64> {
    let pid = cluster
        .pid(i)
        .with_context(|| format!("member {i} has no process"))?;
    stop_process(pid)?;
    let at = clock.now();
    tokio::time::sleep(duration).await;
    signal(pid, "CONT")?;
    Ok(at)
}

/// Cuts member `i` off from every other member for `duration`, then heals
/// the links; the run-clock instant at which it was cut off.
async fn isolate(cluster: &Cluster, clock: Clock, i: usize, duration: Duration) -> Result<u64> {
    let network = cluster.network()?;
    network.isolate(i)?;
    let at = clock.now();
    tokio::time::sleep(duration).await;
    network.heal_all()?;
    Ok(at)
}

/// For `fault.downtime`, cuts or heals one link between two members after
/// another, every [`FLAP_MILLIS`] (links and pauses drawn from
/// `fault.seed`), then heals every link; the run-clock instant of the first
/// change.
async fn flap(cluster: &Cluster, clock: Clock, fault: Fault) -> Result<u64> {
    let network = cluster.network()?;
    let at = clock.now();
    on_drawn_links(cluster.size(), fault, FLAP_MILLIS, |a, b, _| {
        network.toggle(a, b)
    })
    .await?;
    network.heal_all()?;
    Ok(at)
}

/// For `fault.downtime`, gives one link between two members after another
/// a new delay from [`LINK_DELAY_MILLIS`], every [`SLOW_CHANGE_MILLIS`]
/// (links, delays and pauses drawn from `fault.seed`), then takes every
/// delay away (bytes already held keep theirs); the run-clock instant of
/// the first change.
async fn slow(cluster: &Cluster, clock: Clock, fault: Fault) -> Result<u64> {
    let relay = cluster.relay()?;
    let at = clock.now();
    on_drawn_links(cluster.size(), fault, SLOW_CHANGE_MILLIS, |a, b, rng| {
        let delay = Duration::from_millis(rng.gen_range(LINK_DELAY_MILLIS));
        relay.set_delay(a, b, delay)
    })
    .await?;
    relay.clear_delays();
    Ok(at)
}

/// Until `fault.downtime` has passed: draws a link `a <-> b` between two of
/// `members`, calls `change(a, b, rng)`, sleeps a pause drawn from `pause`
/// (milliseconds); every draw from `fault.seed`.
async fn on_drawn_links(
    members: usize,
    fault: Fault,
    pause: RangeInclusive<u64>,
    mut change: impl FnMut(usize, usize, &mut StdRng) -> Result<()>,
) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(fault.seed);
    let end = tokio::time::Instant::now() + fault.downtime;
    while tokio::time::Instant::now() < end {
        let a = rng.gen_range(0..members);
        let b = (a + rng.gen_range(1..members)) % members;
        change(a, b, &mut rng)?;
        tokio::time::sleep(Duration::from_millis(rng.gen_range(pause.clone()))).await;
    }
    Ok(())
}

/// Asks leader `from` to hand leadership to `to` (etcd's `MoveLeader`,
/// which waits until `to` leads or fails); the run-clock instant of the
/// request. A refusal fails the run: with every member up, etcd grants it.
async fn transfer(cluster: &Cluster, clock: Clock, from: usize, to: usize) -> Result<u64> {
    let target = cluster.member_id(to).await?;
    let mut client = cluster.client(from).await?;
    let at = clock.now();
    client
        .move_leader(target)
        .await
        .with_context(|| format!("MoveLeader from member {from} to member {to}"))?;
    Ok(at)
}

/// Moves member `i` onto a small disk, fills the disk and writes through
/// another member until `i` exits by itself (with a failure status); after
/// `downtime` frees the disk and restarts `i` on it. The disk stays mounted
/// until the cluster is dropped. The run-clock instant the disk was full.
async fn fill_disk(cluster: &Cluster, clock: Clock, i: usize, downtime: Duration) -> Result<u64> {
    cluster.kill(i)?;
    let disk = SmallDisk::mount_over(&cluster.data_dir(i), SMALL_DISK_BYTES)?;
    let at = fill_until_exit(cluster, clock, i, &disk).await;
    let healed = disk.free().and_then(|()| disk.grow(GROWN_DISK_BYTES));
    cluster.keep_disk(disk);
    let at = at?;
    healed?;
    tokio::time::sleep(downtime).await;
    cluster.restart(i)?;
    Ok(at)
}

/// Restarts member `i` on `disk`, fills the disk, then puts
/// [`FILL_VALUE_BYTES`] values through another member until `i` has exited;
/// the run-clock instant the disk was full.
async fn fill_until_exit(
    cluster: &Cluster,
    clock: Clock,
    i: usize,
    disk: &SmallDisk,
) -> Result<u64> {
    cluster.restart_and_wait(i).await?;
    disk.fill(FULL_DISK_FREE_BYTES)?;
    let at = clock.now();
    let writer = (i + 1) % cluster.size();
    let mut client = cluster.client(writer).await?;
    let value = "f".repeat(FILL_VALUE_BYTES);
    for n in 0..MAX_FILL_BYTES / FILL_VALUE_BYTES {
        if let Some(status) = cluster.exit_status(i)? {
            ensure!(
                exited_with_failure(&status),
                "member {i} ended on its full disk with {status}: etcd exits with a failure status"
            );
            let after = Duration::from_nanos(clock.now().saturating_sub(at));
            eprintln!(
                "full disk: member {i} exited ({status}) {after:?} and {} KiB of puts after its disk was full",
                n * FILL_VALUE_BYTES / 1024
            );
            return Ok(at);
        }
        let key = format!("{FILL_PREFIX}{}", n % FILL_KEYS);
        // Quorum stays (the other two members): a failed put is the
        // clients' business (a leader change), not the fault's.
        let put = tokio::time::timeout(FILL_PUT_TIMEOUT, client.put(key, value.as_str(), None));
        let failure = match put.await {
            Ok(Ok(_)) => continue,
            Ok(Err(e)) => describe_error(&e),
            Err(_) => format!("no answer within {FILL_PUT_TIMEOUT:?}"),
        };
        eprintln!("full disk: a fill put failed: {failure}");
        tokio::time::sleep(FILL_RETRY).await;
    }
    bail!(
        "member {i} still runs on its full disk after {MAX_FILL_BYTES} bytes of puts:\n{}",
        cluster.log_tail(i)
    )
}

/// Keys the full-disk fault overwrites in turn (history keeps every value).
const FILL_KEYS: usize = 16;
/// Pause after a failed fill put.
const FILL_RETRY: Duration = Duration::from_millis(100);
