//! Helpers for the Auth tests (`tests/auth.rs`).
//!
//! - [`as_user`]: an etcdctl command line with `--user=name:password`
//!   (etcdctl authenticates per invocation).
//! - [`UserClients`]: one etcd-client per side that authenticated as the same
//!   user at connect time (`ConnectOptions::with_user`), and
//!   [`UserClients::rpc`] to run one operation on both and compare.
//! - [`auth_revision`]: the `AuthRevision` printed by `etcdctl auth status`.
//! - [`jwt_parts`]: the header and payload of a JWT (base64url JSON), decoded
//!   without verifying the signature.
//!
//! Both sides are compared with the harness's oracle
//! ([`crate::differential`]).

use std::fmt::Debug;
use std::future::Future;

use anyhow::{bail, ensure, Context, Result};
use etcd_client::{Client, ConnectOptions};

use crate::binary::Binary;
use crate::client::{describe, get_op, CONNECT_TIMEOUT, REQUEST_TIMEOUT};
use crate::differential::{same_text, Differential};
use crate::etcdctl::CtlOutput;

/// `--user=<user>` followed by `args` (`user` is `name:password`). The flag
/// comes first so that it never ends up after a `--` (as in `etcdctl lock
/// name -- command`).
pub fn as_user(user: &str, args: &[&str]) -> Vec<String> {
    std::iter::once(format!("--user={user}"))
        .chain(args.iter().map(|arg| arg.to_string()))
        .collect()
}

/// Borrowed view of owned arguments, for APIs taking `&[&str]`.
pub fn arg_refs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Connects etcd-client to `endpoints` as `user` with `password`: the client
/// authenticates while connecting, so a refused login is the error here.
pub async fn connect_as(
    endpoints: &[String],
    user: &str,
    password: &str,
) -> Result<Client, etcd_client::Error> {
    connect_as_with(endpoints, user, password, false).await
}

/// [`connect_as`], optionally with etcd-client's automatic token refresh
/// (`with_auto_token_refresh`: a request refused with `Unauthenticated` is
/// retried once after authenticating again).
pub async fn connect_as_with(
    endpoints: &[String],
    user: &str,
    password: &str,
    auto_refresh: bool,
) -> Result<Client, etcd_client::Error> {
    let options = ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT)
        .with_user(user, password)
        .with_auto_token_refresh(auto_refresh);
    Client::connect(endpoints, Some(options)).await
}

/// An authenticated etcd-client on each side (see [`connect_as`]), and the
/// candidate's binary for mismatch reports.
pub struct UserClients {
    pub oracle: Client,
    pub candidate: Client,
    pub candidate_binary: Binary,
}

impl UserClients {
    /// Connects as `user` on both sides of `d`. Panics if the oracle refuses;
    /// the candidate must accept the login too.
    pub async fn connect(d: &Differential, user: &str, password: &str) -> UserClients {
        Self::connect_with(d, user, password, false).await
    }

    /// [`Self::connect`], optionally with automatic token refresh
    /// (see [`connect_as_with`]).
    pub async fn connect_with(
        d: &Differential,
        user: &str,
        password: &str,
        auto_refresh: bool,
    ) -> UserClients {
        let (oracle, candidate) = (
            d.oracle.cluster.endpoints(),
            d.candidate.cluster.endpoints(),
        );
        let (oracle, candidate) = tokio::join!(
            connect_as_with(&oracle, user, password, auto_refresh),
            connect_as_with(&candidate, user, password, auto_refresh),
        );
        let candidate_binary = d.candidate.cluster.binary();
        let oracle = oracle
            .unwrap_or_else(|e| panic!("the oracle refused etcd-client login as {user:?}: {e}"));
        let candidate = candidate.unwrap_or_else(|error| {
            let what = format!("etcd-client connect as {user:?}");
            same_text(candidate_binary, &what, "Ok", &describe::<()>(&Err(error)));
            unreachable!("{what}: an error cannot describe as Ok")
        });
        UserClients {
            oracle,
            candidate,
            candidate_binary: candidate_binary.clone(),
        }
    }

    /// A `get` of `key` on both sides (see [`Self::rpc`]).
    pub async fn get(
        &self,
        what: &str,
        key: &str,
    ) -> Result<etcd_client::GetResponse, etcd_client::Error> {
        self.rpc(what, get_op(key)).await
    }

    /// Runs `op` with the oracle's client, then with the candidate's, and
    /// compares the normalized results ([`describe`]). Returns the oracle's.
    pub async fn rpc<T, F, Fut>(&self, what: &str, op: F) -> Result<T, etcd_client::Error>
    where
        T: Debug,
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let expected = op(self.oracle.clone()).await;
        let actual = op(self.candidate.clone()).await;
        same_text(
            &self.candidate_binary,
            &format!("etcd-client {what}"),
            &describe(&expected),
            &describe(&actual),
        );
        expected
    }
}

/// The `AuthRevision: N` of `etcdctl auth status` output.
pub fn auth_revision(output: &CtlOutput) -> Result<u64> {
    let line = output
        .stdout
        .lines()
        .find_map(|line| line.strip_prefix("AuthRevision: "))
        .with_context(|| format!("no AuthRevision line in:\n{output}"))?;
    line.trim()
        .parse()
        .with_context(|| format!("AuthRevision {line:?} is not a number"))
}

/// The header and payload of a compact JWT (`header.payload.signature`, each
/// base64url without padding), parsed as JSON. The signature is not checked.
pub fn jwt_parts(token: &str) -> Result<(serde_json::Value, serde_json::Value)> {
    let parts: Vec<&str> = token.split('.').collect();
    ensure!(
        parts.len() == 3 && parts.iter().all(|part| !part.is_empty()),
        "{token:?} is not three non-empty dot-separated parts"
    );
    let json = |part: &str| -> Result<serde_json::Value> {
        let bytes = base64url_decode(part)?;
        serde_json::from_slice(&bytes)
            .with_context(|| format!("JWT part {part:?} is not JSON: {bytes:?}"))
    };
    Ok((json(parts[0])?, json(parts[1])?))
}

/// Decodes unpadded (or padded) base64url.
pub fn base64url_decode(text: &str) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut buffer = 0u32;
    let mut bits = 0u32;
    for byte in text.trim_end_matches('=').bytes() {
        let value = match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            other => bail!("{:?} is not a base64url character", other as char),
        };
        buffer = (buffer << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    ensure!(bits < 6, "truncated base64url {text:?}");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_round_trips_known_values() {
        assert_eq!(base64url_decode("eyJhIjoxfQ").unwrap(), br#"{"a":1}"#);
        assert_eq!(base64url_decode("_-8").unwrap(), [0xff, 0xef]);
        assert_eq!(base64url_decode("YQ==").unwrap(), b"a");
        assert!(base64url_decode("a").is_err());
        assert!(base64url_decode("a+b").is_err());
    }

    #[test]
    fn jwt_parts_need_three_json_parts() {
        let (header, payload) = jwt_parts("eyJhbGciOiJSUzI1NiJ9.eyJhIjoxfQ.c2ln").unwrap();
        assert_eq!(header["alg"], "RS256");
        assert_eq!(payload["a"], 1);
        assert!(jwt_parts("abc.def").is_err());
        assert!(jwt_parts("simpletoken.12").is_err());
    }

    #[test]
    fn auth_revision_is_read_from_status() {
        let output = CtlOutput {
            stdout: "Authentication Status: false\nAuthRevision: 7\n".to_string(),
            stderr: String::new(),
            code: Some(0),
        };
        assert_eq!(auth_revision(&output).unwrap(), 7);
    }
}
