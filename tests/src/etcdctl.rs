//! Running etcdctl (3.5 or 3.4) against a set of endpoints.
//!
//! Each invocation runs `etcdctl --endpoints=... <args>` with a clean
//! environment (only `ETCDCTL_API=3`, so no `ETCDCTL_*` variable of the
//! developer's shell leaks in), optional bytes on standard input, and a hard
//! wall-clock bound after which the process is killed. The result keeps
//! stdout, stderr and the exit code; [`CtlOutput::normalized`] prepares it for
//! byte-for-byte comparison with another server's output.

use std::fmt;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::binary::Binary;
use crate::normalize::normalize;

/// etcdctl's own `--command-timeout` for every invocation.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);
/// etcdctl's own `--dial-timeout` for every invocation.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Wall-clock bound for one etcdctl process, after which it is killed.
pub const PROCESS_TIMEOUT: Duration = Duration::from_secs(60);

/// An etcdctl binary bound to a set of endpoints.
#[derive(Clone, Debug)]
pub struct Etcdctl {
    binary: Binary,
    endpoints: Vec<String>,
}

/// What one etcdctl invocation printed and how it exited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtlOutput {
    pub stdout: String,
    pub stderr: String,
    /// The exit code, `None` if the process was killed by a signal.
    pub code: Option<i32>,
}

impl CtlOutput {
    /// Whether etcdctl exited with status 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// stdout parsed as JSON (for `-w json` invocations).
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_str(&self.stdout)
            .with_context(|| format!("etcdctl output is not JSON:\n{self}"))
    }

    /// `header.revision` of a `-w json` response.
    pub fn header_revision(&self) -> Result<i64> {
        self.json()?["header"]["revision"]
            .as_i64()
            .with_context(|| format!("no header.revision in etcdctl output:\n{self}"))
    }

    /// The same output with instance-specific values replaced by placeholders.
    pub fn normalized(&self) -> CtlOutput {
        CtlOutput {
            stdout: normalize(&self.stdout),
            stderr: normalize(&self.stderr),
            code: self.code,
        }
    }
}

impl fmt::Display for CtlOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "exit code: {:?}", self.code)?;
        writeln!(f, "--- stdout ---\n{}", self.stdout)?;
        write!(f, "--- stderr ---\n{}", self.stderr)
    }
}

/// Input for non-interactive `etcdctl txn`: compares, success ops, failure
/// ops, each section terminated by an empty line.
pub fn txn_script(compares: &[&str], success: &[&str], failure: &[&str]) -> Vec<u8> {
    [compares, success, failure]
        .iter()
        .map(|lines| {
            lines
                .iter()
                .map(|line| format!("{line}\n"))
                .collect::<String>()
                + "\n"
        })
        .collect::<String>()
        .into_bytes()
}

impl Etcdctl {
    pub fn new(binary: Binary, endpoints: Vec<String>) -> Self {
        Self { binary, endpoints }
    }

    /// The etcdctl binary this runner uses.
    pub fn binary(&self) -> &Binary {
        &self.binary
    }

    /// Runs `etcdctl <args>` with empty standard input.
    pub async fn run(&self, args: &[&str]) -> Result<CtlOutput> {
        self.run_with_stdin(args, &[]).await
    }

    /// Runs `etcdctl <args>` feeding `stdin` to its standard input.
    pub async fn run_with_stdin(&self, args: &[&str], stdin: &[u8]) -> Result<CtlOutput> {
        let mut child = self
            .command(args)
            .spawn()
            .with_context(|| format!("spawning {}", self.binary.path.display()))?;
        let mut input = child.stdin.take().context("etcdctl stdin is piped")?;
        let stdin = stdin.to_vec();
        // Write concurrently with reading the output, so a large input cannot
        // deadlock against a full output pipe. A broken pipe (etcdctl exited
        // without reading everything) is not an error of the harness.
        let writer = tokio::spawn(async move {
            let _ = input.write_all(&stdin).await;
        });
        let output = tokio::time::timeout(PROCESS_TIMEOUT, child.wait_with_output())
            .await
            .with_context(|| format!("etcdctl {args:?} did not finish within {PROCESS_TIMEOUT:?}"))?
            .with_context(|| format!("waiting for etcdctl {args:?}"))?;
        writer.await.context("etcdctl stdin writer")?;
        Ok(CtlOutput {
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            code: output.status.code(),
        })
    }

    /// `etcdctl --endpoints=... --command-timeout=... --dial-timeout=... <args>`
    /// with a clean environment (only `ETCDCTL_API=3`), piped standard
    /// streams, killed if dropped.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.binary.path);
        command
            .env_clear()
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoints.join(",")))
            .arg(format!("--command-timeout={}s", COMMAND_TIMEOUT.as_secs()))
            .arg(format!("--dial-timeout={}s", DIAL_TIMEOUT.as_secs()))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }
}
