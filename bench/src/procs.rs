//! Child processes (cluster members, nginx, HAProxy, the gateway) and their cleanup.
//!
//! A [`Proc`] is the workspace test harness's process type
//! ([`integration_tests::Process`]: output appended to a log file, the log's
//! tail for errors, SIGKILL and reaping on drop) with what a long benchmark
//! run needs on top: every child runs in its own session/process group, gets
//! SIGKILL if the bench process dies (PR_SET_PDEATHSIG), and is registered
//! globally so a panic, Ctrl-C or SIGTERM kills every group before the
//! process exits. Dropping a [`Proc`] kills its group too.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use anyhow::{Context, Result};
use integration_tests::process::{tail, Process};

/// Exit code after Ctrl-C / SIGTERM (128 + SIGINT).
const INTERRUPTED_EXIT_CODE: i32 = 130;
/// Lines of a child's log shown in error messages.
pub const LOG_TAIL_LINES: usize = 20;

/// Process-group ids of live children.
static CHILDREN: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// A running child process whose group is killed on drop.
pub struct Proc {
    process: Process,
    pid: u32,
    exited: bool,
}

impl Proc {
    /// Spawns `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Proc> {
        // SAFETY: setsid and prctl are async-signal-safe and touch no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let process = Process::spawn(name, cmd, log)?;
        let pid = process.pid().context("a just spawned child has a pid")?;
        let group = i32::try_from(pid).context("pid out of range")?;
        CHILDREN
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(group);
        Ok(Proc {
            process,
            pid,
            exited: false,
        })
    }

    /// The child's pid (also its process-group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Name given at spawn.
    pub fn name(&self) -> &str {
        self.process.name()
    }

    /// True while the child has not exited.
    pub fn is_running(&mut self) -> bool {
        !self.exited && self.process.is_running()
    }

    /// SIGKILLs the child's whole process group and reaps the child.
    pub fn kill9(&mut self) {
        if self.exited {
            return;
        }
        let group = self.pid as i32;
        // SAFETY: plain syscall on a process group we created.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
        let _ = self.process.kill();
        self.exited = true;
        CHILDREN
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|p| *p != group);
    }

    /// The last [`LOG_TAIL_LINES`] lines of the child's output.
    pub fn log_tail(&self) -> String {
        tail(&self.process.log(), LOG_TAIL_LINES)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Kills every registered child group.
pub fn kill_all() {
    let pids = std::mem::take(&mut *CHILDREN.lock().unwrap_or_else(|e| e.into_inner()));
    for pid in pids {
        // SAFETY: plain syscall on process groups we created.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}

/// Kills all children on panic, Ctrl-C and SIGTERM. Call once, inside the runtime.
pub fn install_cleanup_handlers() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        kill_all();
        default_hook(info);
    }));
    tokio::spawn(async {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!("bench: interrupted, stopping all child processes");
        kill_all();
        std::process::exit(INTERRUPTED_EXIT_CODE);
    });
}

/// Raises the open-file limit of this process (and so of later children) to
/// at least `wanted`; returns the new soft limit.
pub fn raise_fd_limit(wanted: u64) -> Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write/read only the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(std::io::Error::last_os_error()).context("getrlimit");
        }
        if lim.rlim_cur >= wanted {
            return Ok(lim.rlim_cur);
        }
        let raised = libc::rlimit {
            rlim_cur: wanted,
            rlim_max: lim.rlim_max.max(wanted),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
            return Ok(wanted);
        }
        let soft_only = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &soft_only) != 0 {
            return Err(std::io::Error::last_os_error()).context("setrlimit");
        }
        Ok(lim.rlim_max)
    }
}

/// Resident set size of process `pid` in KiB (from /proc/PID/status).
pub fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no VmRSS for pid {pid}"))
}

/// Open file descriptors of `pid`.
pub fn open_fds(pid: u32) -> Result<usize> {
    let dir = format!("/proc/{pid}/fd");
    Ok(std::fs::read_dir(&dir)
        .with_context(|| format!("read {dir}"))?
        .count())
}

/// CPU time (user + system, all threads) process `pid` has used so far, in seconds
/// (fields 14 and 15 of /proc/PID/stat, in clock ticks).
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    cpu_seconds_from_stat(&stat, clock_ticks_per_second())
        .with_context(|| format!("unparsable /proc/{pid}/stat"))
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the running system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// utime + stime of a /proc/PID/stat line. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from its closing parenthesis.
fn cpu_seconds_from_stat(stat: &str, ticks_per_second: f64) -> Option<f64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / ticks_per_second)
}

/// First line of `program args` output (stdout or stderr), for version strings.
pub fn version_line(program: &Path, args: &[&str]) -> String {
    match Command::new(program).args(args).output() {
        Ok(out) => {
            let text = if out.stdout.is_empty() {
                out.stderr
            } else {
                out.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        }
        Err(e) => format!("unavailable ({e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawn_and_kill() {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let mut p = Proc::spawn("sleep", cmd, &dir.path().join("log")).unwrap();
        assert!(p.is_running());
        assert!(rss_kib(p.pid()).unwrap() > 0);
        p.kill9();
        assert!(!p.is_running());
    }

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        // A name with a space and a parenthesis; utime 250 and stime 50 ticks.
        let stat = "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 3 0";
        assert_eq!(cpu_seconds_from_stat(stat, 100.0), Some(3.0));
        assert_eq!(cpu_seconds_from_stat("4242 (x) S 1", 100.0), None);
        let own = cpu_seconds(std::process::id()).unwrap();
        assert!(own >= 0.0);
    }
}
