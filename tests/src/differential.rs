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
//! which keeps a sequence from silently testing nothing.

use std::fmt::Debug;
use std::future::Future;

use anyhow::{Context, Result};
use etcd_client::Client;

use crate::binary::Binary;
use crate::client::{connect, describe};
use crate::cluster::{Cluster, ClusterConfig};
use crate::etcdctl::{CtlOutput, Etcdctl};

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
            panic!(
                "step {step}: {what} differs (stdin {} bytes)\n\
                 ===== oracle (reference etcd) =====\n{expected}\n\
                 ===== candidate ({}) =====\n{actual}",
                stdin.len(),
                self.candidate.cluster.binary().path.display()
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
            panic!(
                "step {step}: etcd-client {what} differs\n\
                 ===== oracle (reference etcd) =====\n{expected_text}\n\
                 ===== candidate ({}) =====\n{actual_text}",
                self.candidate.cluster.binary().path.display()
            );
        }
        expected
    }
}
