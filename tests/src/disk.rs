//! Disk faults for one member.
//!
//! A small disk: a tmpfs of a fixed size mounted over its data directory,
//! and a filler file that leaves only a few bytes free, so the member's next
//! writes fail with `ENOSPC` as on a full disk.
//!
//! A failing sync ([`failing_fdatasync`]): the member runs under `strace`,
//! which makes its `fdatasync` calls from the n-th on fail with `EIO`
//! without running them, as a disk that reports write errors (this
//! machine's kernel has no device-mapper `error` or `flakey` target). The
//! seccomp filter stops the process only at `fdatasync`, so everything else
//! runs at full speed. Both etcd (Go's raw syscalls, not libc) and the store
//! are caught, since strace works at the system-call level.
//!
//! Mounting needs root (as the network namespaces do). The mount is the
//! test's own: [`SmallDisk`] unmounts it when dropped (lazily only if a
//! member still holds files open in it).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context, Result};

/// The fault injector [`failing_fdatasync`] runs members under.
pub const STRACE: &str = "strace";

/// The wrapper (for `Cluster::restart_under`) that runs a member under
/// strace with every `fdatasync` from the `from_call`-th on (counted over
/// all threads, from 1) failing with `EIO`.
pub fn failing_fdatasync(from_call: u32) -> Vec<String> {
    [
        STRACE,
        "--follow-forks",
        "--seccomp-bpf",
        "--quiet=all",
        "--output=/dev/null",
        "--trace=fdatasync",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        format!("--inject=fdatasync:error=EIO:when={from_call}+"),
        "--".to_string(),
    ])
    .collect()
}

/// Size of a small disk that holds one member: room for etcd's two
/// preallocated 64 MiB WAL segments and its database, and for the store's
/// files.
pub const SMALL_DISK_BYTES: u64 = 192 * 1024 * 1024;
/// Size a full small disk is grown to once its fault heals, so that the
/// writes the member missed meanwhile fit.
pub const GROWN_DISK_BYTES: u64 = 1024 * 1024 * 1024;
/// Free bytes [`SmallDisk::fill`] leaves to make a disk full.
pub const FULL_DISK_FREE_BYTES: u64 = 1024 * 1024;

/// Whether a member that stopped on a disk fault ended as etcd does: with
/// a failure exit status (etcd: 1), not killed by a signal such as an
/// abort in the middle of its exit.
pub fn exited_with_failure(status: &std::process::ExitStatus) -> bool {
    !status.success() && status.code().is_some()
}

/// Measure-and-allocate rounds of [`SmallDisk::fill`] before it gives up.
const FILL_ATTEMPTS: usize = 5;

/// Name of the filler file, at the top of the mounted directory.
const FILLER: &str = "disk-filler";

/// A tmpfs mounted over a directory.
pub struct SmallDisk {
    dir: PathBuf,
}

fn run(program: &str, args: &[&str]) -> Result<()> {
    crate::process::run_checked(program, args).map(drop)
}

impl SmallDisk {
    /// Moves `dir`'s contents onto a new tmpfs of `bytes` mounted at `dir`
    /// (the owner of `dir` must not be running).
    pub fn mount_over(dir: &Path, bytes: u64) -> Result<SmallDisk> {
        let aside = dir.with_extension("before-small-disk");
        std::fs::rename(dir, &aside).with_context(|| format!("moving {} aside", dir.display()))?;
        std::fs::create_dir(dir)?;
        let path = dir.to_str().context("non-UTF-8 data directory")?;
        run(
            "mount",
            &["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs", path],
        )?;
        let disk = SmallDisk {
            dir: dir.to_path_buf(),
        };
        let from = format!("{}/.", aside.display());
        run("cp", &["-a", &from, path])?;
        std::fs::remove_dir_all(&aside)?;
        Ok(disk)
    }

    /// Bytes still free on the disk.
    pub fn available(&self) -> Result<u64> {
        let output = Command::new("df")
            .args(["-B1", "--output=avail"])
            .arg(&self.dir)
            .output()
            .context("running df")?;
        ensure!(output.status.success(), "df {} failed", self.dir.display());
        let text = String::from_utf8_lossy(&output.stdout);
        text.lines()
            .nth(1)
            .and_then(|line| line.trim().parse().ok())
            .with_context(|| format!("parsing df's output {text:?}"))
    }

    /// Allocates a filler file so that at most `leave` bytes stay free.
    ///
    /// The member on the disk may allocate between the measurement and the
    /// allocation (etcd preallocates its next 64 MB WAL segment in the
    /// background), so a failed allocation is measured again and retried, at
    /// most [`FILL_ATTEMPTS`] times; a disk the member filled itself is full.
    pub fn fill(&self, leave: u64) -> Result<()> {
        let filler = self.dir.join(FILLER);
        let filler = filler.to_str().context("path")?;
        let mut last_error = None;
        for _ in 0..FILL_ATTEMPTS {
            let size = self.available()?.saturating_sub(leave);
            if size == 0 {
                return Ok(());
            }
            match run("fallocate", &["-l", &size.to_string(), filler]) {
                Ok(()) => return Ok(()),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.expect("at least one attempt"))
    }

    /// Resizes the disk to `bytes` (tmpfs resizes in place, keeping its
    /// files), as an operator grows a full volume.
    pub fn grow(&self, bytes: u64) -> Result<()> {
        let path = self.dir.to_str().context("non-UTF-8 data directory")?;
        run("mount", &["-o", &format!("remount,size={bytes}"), path])
    }

    /// Deletes the filler file: the disk has room again.
    pub fn free(&self) -> Result<()> {
        std::fs::remove_file(self.dir.join(FILLER)).context("removing the filler file")
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        if let Some(path) = self.dir.to_str() {
            // Lazily only if a process still uses it: a lazy unmount may
            // still hold the mount point when the caller removes it.
            if run("umount", &[path]).is_err() {
                let _ = run("umount", &["-l", path]);
            }
        }
    }
}
