//! Differential testing against the reference etcd.
//!
//! A [`Differential`] owns two single-member clusters started from the same
//! (empty) state: the *oracle*, real etcd 3.5, and the *candidate* under test.
//! Each step runs the same operation against both, normalizes both results
//! ([`crate::normalize`]) and panics with a step-numbered report if they
//! differ. Expected outputs are never written by hand: the oracle's output is
//! the expectation. Because both servers see the same operations in the same
//! order, their revisions line up and can be compared too.
//!
//! Operations go through etcdctl 3.5 ([`Differential::ctl`]), etcdctl 3.4
//! ([`Differential::ctl34`]) or the etcd-client crate ([`Differential::rpc`]).
//! Every step returns the oracle's normalized result so a test can also check
//! that the step exercised what it meant to (e.g. that an error occurred),
//! which keeps a sequence from silently testing nothing: [`assert_ok`],
//! [`assert_fails`], [`assert_stdout`], [`assert_fails_anywhere`] and
//! [`assert_grpc_error`] are those checks.
//!
//! [`CtlPair`] is the same comparison for any two etcdctl runners (servers a
//! test started itself, e.g. with https URLs, or side-specific arguments),
//! after normalization plus per-step [`Mask`]s for values that legitimately
//! differ between two servers (server-chosen lease ids, the remaining TTL of
//! a lease, etcdctl's log lines with local paths).

use std::fmt::Debug;
use std::future::Future;

use anyhow::{Context, Result};
use etcd_client::Client;
use regex::Regex;

use crate::binary::Binary;
use crate::client::{connect, describe, get_op, grpc_code};
use crate::cluster::{Cluster, ClusterConfig};
use crate::etcdctl::{CtlOutput, Etcdctl};
use crate::watchlease::{assert_same, ctl_lines};

/// One server of the pair, with every way the tests talk to it.
pub struct Side {
    pub cluster: Cluster,
    pub client: Client,
    pub ctl35: Etcdctl,
    pub ctl34: Etcdctl,
}

impl Side {
    async fn start(binary: Binary, config: ClusterConfig) -> Result<Side> {
        let cluster = Cluster::start(binary, config).await?;
        let endpoints = cluster.endpoints();
        Ok(Side {
            client: connect(&endpoints).await?,
            ctl35: Etcdctl::new(Binary::etcdctl35()?, endpoints.clone()),
            ctl34: Etcdctl::new(Binary::etcdctl34()?, endpoints),
            cluster,
        })
    }
}

/// Which etcdctl a step uses.
#[derive(Clone, Copy, Debug)]
enum CtlVersion {
    V35,
    V34,
}

/// The oracle/candidate pair. See the module documentation.
pub struct Differential {
    pub oracle: Side,
    pub candidate: Side,
    steps: usize,
}

impl Differential {
    /// Starts a single-member reference etcd 3.5 and a single-member
    /// candidate ([`Binary::candidate`]) concurrently.
    pub async fn start() -> Result<Differential> {
        Self::start_with(
            Binary::etcd35()?,
            Binary::candidate()?,
            ClusterConfig::new(1),
        )
        .await
    }

    /// Starts `oracle` and `candidate` with the same configuration.
    pub async fn start_with(
        oracle: Binary,
        candidate: Binary,
        config: ClusterConfig,
    ) -> Result<Differential> {
        let (oracle, candidate) = tokio::try_join!(
            async {
                Side::start(oracle, config.clone())
                    .await
                    .context("starting the oracle")
            },
            async {
                Side::start(candidate, config.clone())
                    .await
                    .context("starting the candidate")
            },
        )?;
        Ok(Differential {
            oracle,
            candidate,
            steps: 0,
        })
    }

    /// Runs `scenario` on the oracle and the candidate concurrently (each
    /// side runs the same operations on its own server, so scenarios may
    /// wait on their own server's events) and returns both results. Panics
    /// naming the side whose scenario failed.
    pub async fn each<'a, T, F, Fut>(&'a self, scenario: F) -> (T, T)
    where
        F: Fn(&'a Side) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let (oracle, candidate) = tokio::join!(scenario(&self.oracle), scenario(&self.candidate));
        let oracle = oracle.unwrap_or_else(|e| panic!("on the oracle (reference etcd): {e:#}"));
        let candidate = candidate.unwrap_or_else(|e| {
            panic!(
                "on the candidate ({}): {e:#}",
                self.candidate.cluster.binary().path.display()
            )
        });
        (oracle, candidate)
    }

    /// Number of steps compared so far.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Runs `etcdctl` 3.5 with `args` on both servers; returns the oracle's
    /// normalized output. Panics if the normalized outputs differ.
    pub async fn ctl(&mut self, args: &[&str]) -> CtlOutput {
        self.ctl_step(CtlVersion::V35, args, b"").await
    }

    /// Like [`Self::ctl`], feeding `stdin` to etcdctl.
    pub async fn ctl_stdin(&mut self, args: &[&str], stdin: &[u8]) -> CtlOutput {
        self.ctl_step(CtlVersion::V35, args, stdin).await
    }

    /// Runs `etcdctl` 3.4 with `args` on both servers (see [`Self::ctl`]).
    pub async fn ctl34(&mut self, args: &[&str]) -> CtlOutput {
        self.ctl_step(CtlVersion::V34, args, b"").await
    }

    /// Like [`Self::ctl34`], feeding `stdin` to etcdctl.
    pub async fn ctl34_stdin(&mut self, args: &[&str], stdin: &[u8]) -> CtlOutput {
        self.ctl_step(CtlVersion::V34, args, stdin).await
    }

    async fn ctl_step(&mut self, version: CtlVersion, args: &[&str], stdin: &[u8]) -> CtlOutput {
        self.steps += 1;
        let step = self.steps;
        let (oracle, candidate) = match version {
            CtlVersion::V35 => (&self.oracle.ctl35, &self.candidate.ctl35),
            CtlVersion::V34 => (&self.oracle.ctl34, &self.candidate.ctl34),
        };
        let run = |ctl: &Etcdctl| {
            let ctl = ctl.clone();
            async move { ctl.run_with_stdin(args, stdin).await }
        };
        let (expected, actual) = tokio::join!(run(oracle), run(candidate));
        let what = format!("etcdctl {version:?} {args:?}");
        let expected =
            expected.unwrap_or_else(|e| panic!("step {step}: {what} on the oracle: {e:#}"));
        let actual =
            actual.unwrap_or_else(|e| panic!("step {step}: {what} on the candidate: {e:#}"));
        let (expected, actual) = (expected.normalized(), actual.normalized());
        if expected != actual {
            self.report(
                step,
                &format!("{what} (stdin {} bytes)", stdin.len()),
                &expected.to_string(),
                &actual.to_string(),
            );
        }
        expected
    }

    /// Runs `op` through etcd-client on both servers, sequentially (oracle
    /// first), and compares the normalized `Debug` rendering of the responses
    /// (or the gRPC code and message of the errors). Returns the oracle's result.
    pub async fn rpc<T, F, Fut>(&mut self, what: &str, op: F) -> Result<T, etcd_client::Error>
    where
        T: Debug,
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.steps += 1;
        let step = self.steps;
        let expected = op(self.oracle.client.clone()).await;
        let actual = op(self.candidate.client.clone()).await;
        let (expected_text, actual_text) = (describe(&expected), describe(&actual));
        if expected_text != actual_text {
            self.report(
                step,
                &format!("etcd-client {what}"),
                &expected_text,
                &actual_text,
            );
        }
        expected
    }

    /// A `get` of `key` through etcd-client on both servers (see [`Self::rpc`]).
    pub async fn get(
        &mut self,
        what: &str,
        key: &str,
    ) -> Result<etcd_client::GetResponse, etcd_client::Error> {
        self.rpc(what, get_op(key)).await
    }

    /// Panics with the first differing line and (bounded) excerpts of both results.
    fn report(&self, step: usize, what: &str, expected: &str, actual: &str) -> ! {
        panic!(
            "step {step}: {what} differs\n{}\n\
             ===== oracle (reference etcd) =====\n{}\n\
             ===== candidate ({}) =====\n{}",
            first_difference(expected, actual),
            excerpt(expected),
            self.candidate.cluster.binary().path.display(),
            excerpt(actual),
        )
    }
}

/// What the oracle's output of a step must show (besides being the same on
/// both sides), so that a table of steps cannot pass vacuously (the rows of
/// `tests/auth.rs` carry one each).
#[derive(Clone, Copy, Debug)]
pub enum Expect<'a> {
    /// Success ([`assert_ok`]).
    Succeeds,
    /// Success with this on stdout ([`assert_stdout`]).
    Prints(&'a str),
    /// Failure with this on stderr ([`assert_fails`]).
    Fails(&'a str),
    /// Failure with this on stdout or stderr ([`assert_fails_anywhere`]).
    FailsAnywhere(&'a str),
}

impl Expect<'_> {
    /// Panics unless `out` (the oracle's output) shows what is expected.
    pub fn check(&self, out: &CtlOutput) {
        match *self {
            Expect::Succeeds => assert_ok(out),
            Expect::Prints(needle) => assert_stdout(out, needle),
            Expect::Fails(needle) => assert_fails(out, needle),
            Expect::FailsAnywhere(needle) => assert_fails_anywhere(out, needle),
        }
    }
}

/// A started [`Differential`] (single members, reference etcd 3.5 and the
/// candidate); panics if either does not start.
pub async fn differential() -> Differential {
    Differential::start()
        .await
        .expect("starting the reference etcd and the candidate")
}

/// The oracle's step succeeded.
pub fn assert_ok(out: &CtlOutput) {
    assert!(out.success(), "oracle step failed unexpectedly:\n{out}");
}

/// The oracle's step failed with `needle` on stderr.
pub fn assert_fails(out: &CtlOutput, needle: &str) {
    assert!(
        !out.success() && out.stderr.contains(needle),
        "oracle step should fail with {needle:?}:\n{out}"
    );
}

/// The oracle's step succeeded with `needle` on stdout.
pub fn assert_stdout(out: &CtlOutput, needle: &str) {
    assert!(
        out.success() && out.stdout.contains(needle),
        "oracle stdout should contain {needle:?}:\n{out}"
    );
}

/// Some failures print on stdout (etcdctl's per-endpoint report, a
/// canceled watch): a non-zero exit with `needle` in stdout or stderr.
pub fn assert_fails_anywhere(out: &CtlOutput, needle: &str) {
    assert!(
        !out.success() && (out.stdout.contains(needle) || out.stderr.contains(needle)),
        "oracle step should fail with {needle:?}:\n{out}"
    );
}

/// The oracle's etcd-client step failed with the gRPC `code` and a message
/// containing `needle`.
pub fn assert_grpc_error<T: Debug>(
    result: &Result<T, etcd_client::Error>,
    code: tonic::Code,
    needle: &str,
) {
    match result {
        Err(error) => {
            assert_eq!(grpc_code(error), Some(code), "{error}");
            assert!(error.to_string().contains(needle), "{error}");
        }
        Ok(response) => panic!("expected {code:?} {needle:?}, got {response:?}"),
    }
}

/// Panics (with [`assert_same`]'s report) unless the two texts are equal.
pub fn same_text(candidate_binary: &Binary, what: &str, oracle: &str, candidate: &str) {
    let lines = |text: &str| text.lines().map(str::to_string).collect::<Vec<_>>();
    assert_same(what, &lines(oracle), &lines(candidate), candidate_binary);
}

/// A replacement applied to both outputs of a [`CtlPair`] step (after
/// the standard normalization): every match of `pattern` becomes
/// `replacement` (with `${n}` capture references).
pub struct Mask {
    pattern: Regex,
    replacement: &'static str,
}

impl Mask {
    pub fn new(pattern: &str, replacement: &'static str) -> Mask {
        Mask {
            pattern: Regex::new(pattern).expect("mask patterns are valid"),
            replacement,
        }
    }

    fn apply(&self, text: &str) -> String {
        self.pattern
            .replace_all(text, self.replacement)
            .into_owned()
    }
}

/// `output` normalized, then masked.
pub fn masked(output: &CtlOutput, masks: &[Mask]) -> CtlOutput {
    let output = output.normalized();
    let apply = |text: &str| {
        masks
            .iter()
            .fold(text.to_string(), |t, mask| mask.apply(&t))
    };
    CtlOutput {
        stdout: apply(&output.stdout),
        stderr: apply(&output.stderr),
        code: output.code,
    }
}

/// An etcdctl runner per side, and the candidate's binary for reports.
/// Steps run on both sides concurrently and compare the normalized and
/// masked outputs (exit code, stdout, stderr).
pub struct CtlPair {
    pub oracle: Etcdctl,
    pub candidate: Etcdctl,
    pub candidate_binary: Binary,
}

impl CtlPair {
    /// The etcdctl 3.5 runners of `d`.
    pub fn of(d: &Differential) -> CtlPair {
        CtlPair {
            oracle: d.oracle.ctl35.clone(),
            candidate: d.candidate.ctl35.clone(),
            candidate_binary: d.candidate.cluster.binary().clone(),
        }
    }

    /// The same `args` on both sides; returns the oracle's masked output.
    pub async fn run(&self, args: &[&str], masks: &[Mask]) -> CtlOutput {
        self.run_each(args, args, b"", masks).await
    }

    /// Side-specific arguments (e.g. a file each side writes), the same
    /// `stdin`; returns the oracle's masked output.
    pub async fn run_each(
        &self,
        oracle_args: &[&str],
        candidate_args: &[&str],
        stdin: &[u8],
        masks: &[Mask],
    ) -> CtlOutput {
        let (expected, actual) = tokio::join!(
            self.oracle.run_with_stdin(oracle_args, stdin),
            self.candidate.run_with_stdin(candidate_args, stdin)
        );
        let what = format!("etcdctl {oracle_args:?}");
        let expected = expected.unwrap_or_else(|e| panic!("{what} on the oracle: {e:#}"));
        let actual = actual.unwrap_or_else(|e| panic!("{what} on the candidate: {e:#}"));
        let (expected, actual) = (masked(&expected, masks), masked(&actual, masks));
        assert_same(
            &what,
            &ctl_lines("etcdctl", &expected),
            &ctl_lines("etcdctl", &actual),
            &self.candidate_binary,
        );
        expected
    }
}

/// Characters of each result shown in a mismatch report.
const REPORT_EXCERPT_CHARS: usize = 8_000;

/// The first line where `expected` and `actual` differ, for a mismatch report.
fn first_difference(expected: &str, actual: &str) -> String {
    let mut expected_lines = expected.lines();
    let mut actual_lines = actual.lines();
    for line in 1.. {
        match (expected_lines.next(), actual_lines.next()) {
            (None, None) => break,
            (left, right) if left != right => {
                return format!(
                "first difference at line {line}:\n  oracle:    {left:?}\n  candidate: {right:?}"
            )
            }
            _ => {}
        }
    }
    "the results differ only in line endings".to_string()
}

fn excerpt(text: &str) -> String {
    match text.char_indices().nth(REPORT_EXCERPT_CHARS) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}\n[... {} more bytes]", &text[..cut], text.len() - cut),
    }
}

/// The seeds a fuzzing test runs: `FUZZ_SEED=n` runs seed `n` alone,
/// `FUZZ_SEEDS=n` seeds 1 to `n` (long runs by hand), otherwise `ci`.
pub fn fuzz_seeds(ci: &[u64]) -> Vec<u64> {
    if let Ok(seed) = std::env::var("FUZZ_SEED") {
        return vec![seed.parse().expect("FUZZ_SEED is a u64")];
    }
    if let Ok(count) = std::env::var("FUZZ_SEEDS") {
        let count: u64 = count.parse().expect("FUZZ_SEEDS is a u64");
        return (1..=count).collect();
    }
    ci.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_difference_names_the_line() {
        let report = first_difference("a\nb\nc", "a\nx\nc");
        assert!(report.contains("line 2"), "{report}");
        assert!(
            report.contains("\"b\"") && report.contains("\"x\""),
            "{report}"
        );
        let report = first_difference("a\nb", "a");
        assert!(
            report.contains("line 2") && report.contains("None"),
            "{report}"
        );
    }

    #[test]
    fn excerpts_are_bounded() {
        let long = "x".repeat(REPORT_EXCERPT_CHARS * 2);
        let shown = excerpt(&long);
        assert!(shown.len() < REPORT_EXCERPT_CHARS + 100);
        assert!(shown.ends_with(&format!("[... {REPORT_EXCERPT_CHARS} more bytes]")));
        assert_eq!(excerpt("short"), "short");
    }

    #[test]
    fn masks_apply_after_normalization() {
        let output = CtlOutput {
            stdout: "lease 694d7f3e9a1c2b0a granted with TTL(60s), remaining(59s)\n".to_string(),
            stderr: String::new(),
            code: Some(0),
        };
        let masks = [Mask::new(r"remaining\(\d+s\)", "remaining(<TTL>)")];
        assert_eq!(
            masked(&output, &masks).stdout,
            "lease 694d7f3e9a1c2b0a granted with TTL(60s), remaining(<TTL>)\n"
        );
    }
}
