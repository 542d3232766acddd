//! `store-util`: offline tools for a store data directory, like `etcdutl`.
//!
//! ```text
//! store-util snapshot restore backup.db --name m1 --data-dir /var/lib/m1 \
//!     --initial-cluster m1=http://10.0.0.1:2380,... --initial-advertise-peer-urls http://10.0.0.1:2380
//! store-util snapshot status backup.db
//! ```
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
    /// Restores a backup into a new data directory.
    Restore {
        /// The backup file.
        file: PathBuf,
        /// Name of the member being restored.
        #[arg(long, default_value = "default")]
        name: String,
        /// Data directory to create (default "<name>.etcd").
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Accepted for etcdutl compatibility: give the same value to the member.
        #[arg(long)]
        initial_cluster: Option<String>,
        /// Accepted for etcdutl compatibility: give the same value to the member.
        #[arg(long)]
        initial_cluster_token: Option<String>,
        /// Accepted for etcdutl compatibility: give the same value to the member.
        #[arg(long)]
        initial_advertise_peer_urls: Option<String>,
    },
    /// Checks a backup and prints its size and checksum state.
    Status {
        /// The backup file.
        file: PathBuf,
    },
}

fn run(cli: Cli) -> Result<String, String> {
    let Top::Snapshot { command } = cli.command;
    match command {
        SnapshotCommand::Restore {
            file,
            name,
            data_dir,
            ..
        } => {
            let bytes =
                std::fs::read(&file).map_err(|e| format!("read {}: {e}", file.display()))?;
            let dir = data_dir.unwrap_or_else(|| PathBuf::from(format!("{name}.etcd")));
            let n = store::snapshot::restore(&bytes, &dir).map_err(|e| e.to_string())?;
            Ok(format!(
                "restored {n} records from {} into {}",
                file.display(),
                dir.display()
            ))
        }
        SnapshotCommand::Status { file } => {
            let bytes =
                std::fs::read(&file).map_err(|e| format!("read {}: {e}", file.display()))?;
            let records = store::snapshot::verify(&bytes).map_err(|e| e.to_string())?;
            Ok(format!(
                "{}: valid, {} bytes, {} bytes of records",
                file.display(),
                bytes.len(),
                records.len()
            ))
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
