//! `store-util`: offline tools for a store data directory, like `etcdutl`.
//!
//! ```text
//! store-util snapshot restore backup.db --name m1 --data-dir /var/lib/m1 \
//!     --initial-cluster m1=http://10.0.0.1:2380,... --initial-advertise-peer-urls http://10.0.0.1:2380
//! store-util snapshot status backup.db -w table
//! ```
//!
//! Backups are etcd 3.5 snapshot files (bbolt + SHA-256): those of
//! `etcdctl snapshot save` against a store member or against etcd 3.5.
//!
//! After a restore, start every member with the same `--initial-cluster`
//! and `--initial-cluster-state new`; each must be restored from the same
//! file.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "store-util",
    version,
    about = "Offline tools for store data directories and backups"
)]
struct Cli {
    #[command(subcommand)]
    command: Top,
}

#[derive(Subcommand)]
enum Top {
    /// Backup files made by `etcdctl snapshot save` against a store member.
    Snapshot {
        #[command(subcommand)]
        command: SnapshotCommand,
    },
}

#[derive(Subcommand)]
enum SnapshotCommand {
    /// Restores a backup (this store's or etcd 3.5's) into a new data directory.
    Restore {
        /// The backup file.
        file: PathBuf,
        /// Name of the member being restored.
        #[arg(long, default_value = "default")]
        name: String,
        /// Data directory to create (default "<name>.etcd").
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// The new cluster (`name=peer-url,...`); give the same value to the member.
        #[arg(long)]
        initial_cluster: Option<String>,
        /// Give the same value to the member.
        #[arg(long)]
        initial_cluster_token: Option<String>,
        /// This member's peer URLs; give the same value to the member.
        #[arg(long)]
        initial_advertise_peer_urls: Option<String>,
        /// Accept a file without SHA-256 trailer (a copied `member/snap/db`).
        #[arg(long)]
        skip_hash_check: bool,
    },
    /// Checks a backup and prints etcdutl's status: hash, revision, total keys, total size.
    Status {
        /// The backup file.
        file: PathBuf,
        /// Output format: simple, table or json (as etcdutl).
        #[arg(short = 'w', long = "write-out", default_value = "simple")]
        write_out: String,
    },
}

/// etcdutl's `--initial-cluster` check: `name` must be listed, with
/// `peers` (if given) among its URLs.
fn check_membership(name: &str, cluster: Option<&str>, peers: Option<&str>) -> Result<(), String> {
    let Some(cluster) = cluster else {
        return Ok(());
    };
    let mine: Vec<&str> = cluster
        .split(',')
        .filter_map(|m| m.split_once('='))
        .filter(|(n, _)| n.trim() == name)
        .map(|(_, u)| u.trim())
        .collect();
    if mine.is_empty() {
        return Err(format!(
            "couldn't find local name \"{name}\" in the initial cluster configuration"
        ));
    }
    if let Some(peers) = peers {
        for p in peers.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if !mine.contains(&p) {
                return Err(format!(
                    "--initial-advertise-peer-urls {p} does not match --initial-cluster for {name}"
                ));
            }
        }
    }
    Ok(())
}

/// Go's `humanize.Bytes` (SI units), as etcdutl prints sizes.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    if n < 10 {
        return format!("{n} B");
    }
    let e = ((n as f64).ln() / 1000f64.ln()).floor() as usize;
    let val = (n as f64 / 1000f64.powi(e as i32) * 10.0 + 0.5).floor() / 10.0;
    if val < 10.0 {
        format!("{val:.1} {}", UNITS[e])
    } else {
        format!("{val:.0} {}", UNITS[e])
    }
}

fn run(cli: Cli) -> Result<String, String> {
    let Top::Snapshot { command } = cli.command;
    match command {
        SnapshotCommand::Restore {
            file,
            name,
            data_dir,
            initial_cluster,
            initial_advertise_peer_urls,
            skip_hash_check,
            ..
        } => {
            check_membership(
                &name,
                initial_cluster.as_deref(),
                initial_advertise_peer_urls.as_deref(),
            )?;
            let bytes =
                std::fs::read(&file).map_err(|e| format!("read {}: {e}", file.display()))?;
            let dir = data_dir.unwrap_or_else(|| PathBuf::from(format!("{name}.etcd")));
            let started = std::time::Instant::now();
            let mut progress = |pairs: u64, written: u64| {
                eprintln!(
                    "restoring: {pairs} entries, {} written, {:.1}s",
                    human_bytes(written),
                    started.elapsed().as_secs_f64()
                );
            };
            let r = store::snapshot::restore(&bytes, &dir, skip_hash_check, &mut progress)
                .map_err(|e| format!("restore of {}: {e}", file.display()))?;
            Ok(format!(
                "restored snapshot {} into {}: revision {}, compacted at {}, {} revisions, {} leases, {} users, {} roles ({:.1}s)",
                file.display(),
                dir.display(),
                r.revision,
                r.compact_revision,
                r.revisions,
                r.leases,
                r.users,
                r.roles,
                started.elapsed().as_secs_f64()
            ))
        }
        SnapshotCommand::Status { file, write_out } => {
            let bytes =
                std::fs::read(&file).map_err(|e| format!("read {}: {e}", file.display()))?;
            let st = store::snapshot::status(&bytes).map_err(|e| e.to_string())?;
            match write_out.as_str() {
                "json" => Ok(serde_json::to_string(&st).expect("status JSON")),
                "simple" => Ok(format!(
                    "{:x}, {}, {}, {}",
                    st.hash,
                    st.revision,
                    st.total_key,
                    human_bytes(st.total_size)
                )),
                "table" => {
                    let cells = [
                        format!("{:x}", st.hash),
                        st.revision.to_string(),
                        st.total_key.to_string(),
                        human_bytes(st.total_size),
                    ];
                    let heads = ["HASH", "REVISION", "TOTAL KEYS", "TOTAL SIZE"];
                    let widths: Vec<usize> = heads
                        .iter()
                        .zip(&cells)
                        .map(|(h, c)| h.len().max(c.len()) + 2)
                        .collect();
                    let line: String = widths
                        .iter()
                        .map(|w| format!("+{}", "-".repeat(*w)))
                        .collect::<String>()
                        + "+";
                    let center = |s: &str, w: usize| {
                        let pad = w - s.len();
                        format!(
                            "{}{}{}",
                            " ".repeat(pad / 2 + pad % 2),
                            s,
                            " ".repeat(pad / 2)
                        )
                    };
                    let head: String = heads
                        .iter()
                        .zip(&widths)
                        .map(|(h, w)| format!("|{}", center(h, *w)))
                        .collect::<String>()
                        + "|";
                    let row: String = cells
                        .iter()
                        .zip(&widths)
                        .map(|(c, w)| format!("|{:>width$} ", c, width = w - 1))
                        .collect::<String>()
                        + "|";
                    Ok(format!("{line}\n{head}\n{line}\n{row}\n{line}"))
                }
                other => Err(format!(
                    "unknown output format {other:?} (simple, table, json)"
                )),
            }
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(msg) => {
            println!("{msg}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::FAILURE
        }
    }
}
