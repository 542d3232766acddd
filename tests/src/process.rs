//! One child process with a log file: the process type of every test (and of
//! `bench`).
//!
//! [`Process::spawn`] starts a [`Command`] with standard input closed and
//! standard output and error appended to a log file, after a header line
//! `==== harness: start #<n> of <name>: <command line>` (so several starts
//! of one member share one log, in order). [`Process::log_tail`] is the last
//! [`LOG_TAIL_LINES`] lines of that log, with a title, for error messages.
//!
//! Dropping a `Process` SIGKILLs it (by its own pid, never by name) and
//! waits for it, so no server outlives its test; while a test panics, the
//! log tail of a process that was still running is printed first. [`Process::kill`] does the same on demand,
//! like a crash.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::binary::Binary;
use crate::wait::{permanent, POLL_INTERVAL};

/// Lines of a process's log printed when a test fails.
pub const LOG_TAIL_LINES: usize = 40;

/// A running (or exited) child process. See the module documentation.
pub struct Process {
    name: String,
    log_path: PathBuf,
    child: Mutex<Option<Child>>,
}

impl Process {
    /// Starts `command`, named `name` in messages, with its output appended
    /// to `log_path` after a header line.
    pub fn spawn(name: &str, command: Command, log_path: &Path) -> Result<Process> {
        Self::spawn_numbered(name, 1, command, log_path)
    }

    /// [`Self::spawn`] for the `start`th start of `name` sharing one log
    /// (the header says which).
    pub fn spawn_numbered(
        name: &str,
        start: u32,
        mut command: Command,
        log_path: &Path,
    ) -> Result<Process> {
        let mut log = File::options()
            .create(true)
            .append(true)
            .open(log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let program = command.get_program().to_string_lossy().into_owned();
        let args: Vec<String> = command
            .get_args()
            .map(|arg| arg.to_string_lossy().into_owned())
            .collect();
        writeln!(
            log,
            "==== harness: start #{start} of {name}: {program} {}",
            args.join(" ")
        )?;
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawning {program} for {name}"))?;
        Ok(Process {
            name: name.to_string(),
            log_path: log_path.to_path_buf(),
            child: Mutex::new(Some(child)),
        })
    }

    /// Starts `binary` with `args` (see [`Self::spawn`]).
    pub fn start(binary: &Binary, name: &str, log_path: &Path, args: &[String]) -> Result<Process> {
        let mut command = Command::new(&binary.path);
        command.args(args);
        Self::spawn(name, command, log_path)
    }

    /// The name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Everything the process (and earlier starts sharing its log) printed.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The last [`LOG_TAIL_LINES`] lines of the log, with a title.
    pub fn log_tail(&self) -> String {
        self.log_tail_lines(LOG_TAIL_LINES)
    }

    /// The last `lines` lines of the log, with a title.
    pub fn log_tail_lines(&self, lines: usize) -> String {
        format!(
            "==== last {lines} lines of {} ({}) ====\n{}\n",
            self.name,
            self.log_path.display(),
            tail(&self.log(), lines)
        )
    }

    /// The process id while the process has not been killed or reaped.
    pub fn pid(&self) -> Option<u32> {
        self.lock().as_ref().map(Child::id)
    }

    /// The exit status if the process has exited (`None` while it runs);
    /// an error once it was killed through [`Self::kill`].
    pub fn try_wait(&self) -> Result<Option<ExitStatus>> {
        let mut child = self.lock();
        let child = child
            .as_mut()
            .with_context(|| format!("{} was killed", self.name))?;
        Ok(child.try_wait()?)
    }

    /// Whether the process is alive (started, not exited, not killed).
    pub fn is_running(&self) -> bool {
        matches!(self.try_wait(), Ok(None))
    }

    /// A [`permanent`] error (with the log tail) once the process has exited:
    /// waiting longer cannot make it healthy.
    pub fn ensure_running(&self) -> Result<()> {
        match self.try_wait() {
            Ok(None) => Ok(()),
            other => Err(permanent(format!(
                "{} is not running ({other:?})\n{}",
                self.name,
                self.log_tail()
            ))),
        }
    }

    /// Waits up to `deadline` for the process to exit by itself.
    pub async fn wait_exit(&self, deadline: Duration) -> Result<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            if start.elapsed() >= deadline {
                bail!(
                    "{} did not exit within {deadline:?}\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// SIGKILLs the process (if it still runs) and reaps it. Killing a
    /// process twice is an error.
    pub fn kill(&self) -> Result<()> {
        let child = self.lock().take();
        let mut child = child.with_context(|| format!("{} is not running", self.name))?;
        kill_and_reap(&mut child).with_context(|| format!("killing {}", self.name))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.child
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Process {
    /// Kills and reaps a process not killed yet; during a panic its log tail
    /// is printed first (an owner that killed it reports on its own).
    fn drop(&mut self) {
        let child = self.lock().take();
        if let Some(mut child) = child {
            if std::thread::panicking() {
                eprintln!("{}", self.log_tail());
            }
            let _ = kill_and_reap(&mut child);
        }
    }
}

/// SIGKILL (std's `Child::kill`, by pid) and wait, so the process is gone
/// and reaped.
fn kill_and_reap(child: &mut Child) -> Result<()> {
    if child.try_wait()?.is_none() {
        child.kill()?;
    }
    child.wait()?;
    Ok(())
}

/// Runs `program` with `args` to completion (a tool such as `ip` or
/// `mount`): its output, or an error with its exit status and standard
/// error unless it succeeded.
pub fn run_checked(program: &str, args: &[&str]) -> Result<std::process::Output> {
    let output = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program} {}", args.join(" ")))?;
    if !output.status.success() {
        bail!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(output)
}

/// Resident memory of process `pid` in bytes, from a `/proc/<pid>/status`
/// field given in kB: `"VmRSS:"` (now) or `"VmHWM:"` (the peak).
pub fn status_bytes(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .with_context(|| format!("no {field} line"))?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .with_context(|| format!("empty {field} line"))?
        .parse()
        .with_context(|| format!("{field} is not a number"))?;
    Ok(kib * 1024)
}

/// Resets process `pid`'s peak resident memory (`VmHWM`) to its current one.
pub fn reset_peak_rss(pid: u32) -> Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .with_context(|| format!("resetting the peak memory of {pid}"))
}

/// Sends signal `name` (`TERM`, `STOP`, `CONT`, ...) to process `pid`
/// (`kill -s`): only ever a pid this harness started.
pub fn signal(pid: u32, name: &str) -> Result<()> {
    let status = Command::new("kill")
        .args(["-s", name, &pid.to_string()])
        .status()
        .with_context(|| format!("running kill -s {name} {pid}"))?;
    anyhow::ensure!(status.success(), "kill -s {name} {pid} failed: {status}");
    Ok(())
}

/// Longest wait for a SIGSTOPped process's threads to stop: a hang guard
/// (a process that exits meanwhile also ends the wait), not a timing
/// assertion.
pub const STOP_SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Poll interval while waiting for a process's threads to stop.
const STOP_SETTLE_POLL: Duration = Duration::from_millis(1);

/// SIGSTOPs process `pid` and returns once every one of its threads is
/// stopped (state `T` in `/proc/PID/task/*/stat`).
///
/// `kill` returns once the signal is queued, not once the process stands
/// still: the group stop begins only when the thread the kernel picked to
/// take the signal next runs, and until then the process's other threads
/// go on. On a loaded two-core machine that took milliseconds: a follower
/// "stopped" this way still answered a leader's `ConfirmLeader` 3 ms after
/// the test had sent a read (docs/robustness.md, 2026-11-28).
pub fn stop_process(pid: u32) -> Result<()> {
    signal(pid, "STOP")?;
    let started = Instant::now();
    while !all_threads_stopped(pid)? {
        anyhow::ensure!(
            started.elapsed() < STOP_SETTLE_TIMEOUT,
            "process {pid} did not stop within {STOP_SETTLE_TIMEOUT:?} of SIGSTOP"
        );
        std::thread::sleep(STOP_SETTLE_POLL);
    }
    Ok(())
}

/// Whether every thread of `pid` is stopped; true for a process that is
/// gone (nothing of it runs).
fn all_threads_stopped(pid: u32) -> Result<bool> {
    let tasks = match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(tasks) => tasks,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(e).with_context(|| format!("listing the threads of {pid}")),
    };
    for task in tasks {
        let stat = match std::fs::read_to_string(task?.path().join("stat")) {
            Ok(stat) => stat,
            // A thread that exited meanwhile runs no more.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("reading a thread of {pid}")),
        };
        // `pid (comm) S ...`: the state follows the last `)` (comm may hold one).
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("");
        if !matches!(state, "T" | "t" | "Z" | "X") {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawn_log_and_kill() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sleep.log");
        let mut command = Command::new("sleep");
        command.arg("30");
        let process = Process::spawn("sleeper", command, &log).unwrap();
        assert!(process.is_running());
        assert!(process.ensure_running().is_ok());
        assert!(process
            .log()
            .contains("==== harness: start #1 of sleeper: sleep 30"));
        process.kill().unwrap();
        assert!(!process.is_running());
        assert!(process.ensure_running().is_err());
        assert!(process.kill().is_err());
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
    }
}
