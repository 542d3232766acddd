//! Differential Auth test: users, roles, permissions and tokens on the
//! candidate server against real etcd 3.5.
//!
//! Every test starts a fresh single-member reference etcd 3.5 (the oracle)
//! and a fresh single-member candidate, then runs the same commands on both
//! through etcdctl 3.5 (plain and `-w json`), etcdctl 3.4 and the etcd-client
//! crate, and compares the normalized outputs: the oracle's output is the
//! only expectation. etcdctl authenticates per invocation with
//! `--user=name:password`; etcd-client authenticates when it connects.
//!
//! - `user_and_role_management`: user and role commands with authentication
//!   disabled (errors included) and the AuthRevision after every change.
//! - `enabling_authentication_and_logging_in`: `auth enable` adding the root
//!   role itself, refused logins, root's powers, what a non-root user may do
//!   with users and roles, the protected root user and role, disable and
//!   re-enable.
//! - `key_permissions_of_a_non_root_user`: read/write/readwrite permissions
//!   on keys, prefixes and `--from-key` ranges for get, put, del (with and
//!   without `--prev-kv`), txn (both branches), watch, lease, lock, elect,
//!   and the cluster and maintenance commands (`compaction` has no auth
//!   check; defrag, hashkv and snapshot return the raw auth errors).
//! - `etcd_client_tokens`: simple tokens through etcd-client: login,
//!   permitted and denied requests, Authenticate; a simple token survives an
//!   auth change, dies with a password change or `auth disable` ("invalid
//!   auth token", also while disabled), and etcd-client's automatic refresh
//!   recovers from that.
//! - `jwt_tokens`: both servers with `--auth-token jwt,...` (a per-run RSA key
//!   pair): the token is an RS256 JWT naming the user and the auth revision;
//!   requests carrying it work until the auth revision moves (etcd 3.5.1:
//!   Unknown "auth: revision in header is old", which etcd-client does not
//!   refresh on), and work again after `refresh_token`.
//! - `client_certificate_common_name_is_the_user`: https servers with
//!   `--client-cert-auth`: without `--user`, the client certificate's CN is
//!   the user (including a user without password); a token wins over it.
//!
//! Besides the comparison, the tests check facts on the oracle's output (an
//! error really happened, a revision really moved or did not) so a sequence
//! that stopped exercising its target fails instead of passing vacuously.
//!
//! Run: `cargo test --release -p integration-tests --test integration auth:: -- --test-threads=1`
//! (`STORE_BIN=/opt/etcd-3.5/etcd` runs it against etcd on both sides).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use etcd_client::{
    Client, Error, GetOptions, LeaseGrantOptions, LeaseTimeToLiveOptions, Permission, PutOptions,
    Txn, TxnOp,
};
use integration_tests::auth::{arg_refs, as_user, auth_revision, jwt_parts, UserClients};
use integration_tests::client::{check_serving, connect_tls, describe, describe_error};
use integration_tests::differential::Expect::{self, Fails, FailsAnywhere, Prints, Succeeds};
use integration_tests::differential::{
    assert_fails, assert_grpc_error, assert_ok, assert_stdout, differential, same_text, CtlPair,
    Mask,
};
use integration_tests::etcdctl::txn_script;
use integration_tests::net::{allocate_ip, https_client_url, peer_url};
use integration_tests::pki::{self, Ca, CertFiles};
use integration_tests::wait::retry_until;
use integration_tests::watchlease::{simple_watch_events, CtlProcess, FlaggedBinary};
use integration_tests::{
    normalize, Binary, ClusterConfig, CtlOutput, Differential, Etcdctl, MemberFlags, Process,
};

/// etcdctl credentials of the users the tests create.
const ROOT: &str = "root:rootpw";
const ALICE: &str = "alice:alicepw";
/// Fixed lease ids (etcdctl spells them in hex), so both servers agree.
const ROOT_LEASE: i64 = 0x1234;
const ROOT_LEASE_HEX: &str = "1234";
const ALICE_LEASE: i64 = 0x5678;
const ALICE_LEASE_HEX: &str = "5678";
/// TTL of the fixed leases: far longer than any test runs.
const LEASE_TTL_SECONDS: i64 = 3600;
/// Bound for a bounded etcdctl watch to print its events.
const WATCH_EVENTS_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound for one watch response through etcd-client.
const WATCH_RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline for the https servers of the certificate test to serve.
const TLS_STARTUP_TIMEOUT: Duration = Duration::from_secs(90);

/// etcdctl 3.5 as `user` (`name:password`) on both sides.
async fn ctl_as(d: &mut Differential, user: &str, args: &[&str]) -> CtlOutput {
    d.ctl(&arg_refs(&as_user(user, args))).await
}

/// etcdctl 3.4 as `user` on both sides.
async fn ctl34_as(d: &mut Differential, user: &str, args: &[&str]) -> CtlOutput {
    d.ctl34(&arg_refs(&as_user(user, args))).await
}

/// `etcdctl auth status` as root (which works whether authentication is
/// enabled or not), compared; the oracle's AuthRevision.
async fn current_auth_revision(d: &mut Differential) -> u64 {
    let out = ctl_as(d, ROOT, &["auth", "status"]).await;
    auth_revision(&out).expect("auth status as root")
}

/// Checks (on both sides, through `auth status`) that the AuthRevision moved
/// by exactly `by` since `revision`, and advances `revision`.
async fn expect_bump(d: &mut Differential, revision: &mut u64, by: u64, what: &str) {
    let now = current_auth_revision(d).await;
    assert_eq!(
        now,
        *revision + by,
        "the oracle's AuthRevision after {what} (was {revision})"
    );
    *revision = now;
}

/// The store revision, read as root and compared.
async fn store_revision(d: &mut Differential) -> i64 {
    ctl_as(d, ROOT, &["get", "revision-probe", "-w", "json"])
        .await
        .header_revision()
        .expect("revision of a get")
}

/// One `etcdctl txn` step: compares, success ops, failure ops, and what
/// the oracle's output must show.
type TxnStep<'a> = (&'a [&'a str], &'a [&'a str], &'a [&'a str], Expect<'a>);

/// Runs `etcdctl txn` as `user` with `script` on both sides.
async fn txn_as(d: &mut Differential, user: &str, script: &[u8]) -> CtlOutput {
    d.ctl_stdin(&arg_refs(&as_user(user, &["txn"])), script)
        .await
}

/// One row of an Auth table: an etcdctl step, run on both sides and
/// compared, with what the oracle's output must show; or a check of the
/// AuthRevision.
enum Case<'a> {
    /// etcdctl 3.5 without a user.
    Ctl(&'a [&'a str], Expect<'a>),
    /// etcdctl 3.4 without a user.
    Ctl34(&'a [&'a str], Expect<'a>),
    /// etcdctl 3.5 without a user, with this on stdin.
    Stdin(&'a [&'a str], &'a [u8], Expect<'a>),
    /// etcdctl 3.5 as this user (`name:password`).
    As(&'a str, &'a [&'a str], Expect<'a>),
    /// etcdctl 3.4 as this user.
    As34(&'a str, &'a [&'a str], Expect<'a>),
    /// The AuthRevision moved by exactly this much since the last check
    /// (see [`expect_bump`]), after this change.
    Bump(u64, &'a str),
}
use Case::{As, As34, Bump, Ctl, Ctl34, Stdin};

/// Runs the rows of a table in order. `rev` is the AuthRevision that
/// [`Case::Bump`] rows check and advance (a table without them passes `None`).
async fn cases(d: &mut Differential, mut rev: Option<&mut u64>, rows: &[Case<'_>]) {
    for row in rows {
        let (out, expect) = match row {
            Ctl(args, expect) => (d.ctl(args).await, expect),
            Ctl34(args, expect) => (d.ctl34(args).await, expect),
            Stdin(args, stdin, expect) => (d.ctl_stdin(args, stdin).await, expect),
            As(user, args, expect) => (ctl_as(d, user, args).await, expect),
            As34(user, args, expect) => (ctl34_as(d, user, args).await, expect),
            Bump(by, what) => {
                let rev = rev
                    .as_deref_mut()
                    .expect("a table with Bump rows gets the AuthRevision");
                expect_bump(d, rev, *by, what).await;
                continue;
            }
        };
        expect.check(&out);
    }
}

// ---------------------------------------------------------------------------
// User and role management.
// ---------------------------------------------------------------------------

/// User and role management with authentication disabled: every user and
/// role command (plain, `-w json`, etcdctl 3.4, etcd-client) with its errors,
/// and the AuthRevision after each change: every successful change bumps it
/// (a repeated permission grant too), a repeated role grant to a user does
/// not, nor do failures or `auth disable` while disabled.
#[tokio::test]
async fn user_and_role_management() {
    let mut d = differential().await;
    let status = d.ctl(&["auth", "status"]).await;
    assert_stdout(&status, "Authentication Status: false");
    let mut rev = auth_revision(&status).expect("auth status");
    cases(
        &mut d,
        Some(&mut rev),
        &[
            Ctl(&["auth", "status", "-w", "json"], Succeeds),
            Ctl(&["auth", "enable"], Fails("root user does not exist")),
            Bump(0, "a refused auth enable"),
            Ctl(&["auth", "disable"], Prints("Authentication Disabled")),
            Bump(0, "auth disable while disabled"),
        ],
    )
    .await;
    d.rpc("authenticate while disabled", |client| async move {
        client
            .auth_client()
            .authenticate("root".to_string(), "rootpw".to_string())
            .await
    })
    .await
    .map(|_| ())
    .expect_err("authenticate while disabled");

    // Users.
    cases(
        &mut d,
        Some(&mut rev),
        &[
            Ctl(&["user", "add", ROOT], Prints("User root created")),
            Bump(1, "user add root"),
            Ctl(
                &["user", "add", "root:other"],
                Fails("user name already exists"),
            ),
            Ctl(
                &[
                    "user",
                    "add",
                    "",
                    "--new-user-password=pw",
                    "--interactive=false",
                ],
                Fails("user name is empty"),
            ),
            // etcdctl's own check of the name:password form.
            Ctl(
                &["user", "add", ":pw"],
                Fails("empty user name is not allowed"),
            ),
            Bump(0, "refused user adds"),
            Ctl(&["user", "add", ALICE], Prints("User alice created")),
            Ctl(
                &["user", "add", "bob", "--no-password"],
                Prints("User bob created"),
            ),
            Stdin(
                &["user", "add", "carol", "--interactive=false"],
                b"carolpw\n",
                Prints("User carol created"),
            ),
            Ctl(
                &["user", "add", "dave", "--new-user-password=davepw"],
                Prints("User dave created"),
            ),
            Bump(4, "four user adds"),
            Ctl(&["user", "list"], Prints("alice\nbob\ncarol\ndave\nroot")),
            Ctl(&["user", "list", "-w", "json"], Succeeds),
            Ctl34(&["user", "list"], Succeeds),
            Ctl(&["user", "get", "nobody"], Fails("user name not found")),
            Ctl(&["user", "get", "alice"], Prints("User: alice")),
            Ctl(&["user", "get", "alice", "-w", "json"], Succeeds),
            // Roles.
            Ctl(&["role", "add", ""], Fails("role name is empty")),
            Ctl(&["role", "add", "r1"], Prints("Role r1 created")),
            Ctl(&["role", "add", "r1"], Fails("role name already exists")),
            Bump(1, "one successful role add"),
            Ctl(&["role", "add", "r2"], Succeeds),
            Ctl(&["role", "add", "r3"], Succeeds),
            Bump(2, "two role adds"),
            Ctl(&["role", "get", "root"], Fails("role name not found")),
            Ctl(&["role", "list"], Prints("r1\nr2\nr3")),
            Ctl(&["role", "list", "-w", "json"], Succeeds),
        ],
    )
    .await;

    // Permissions, granted out of key order.
    let grants: [&[&str]; 6] = [
        &["r1", "write", "a", "z"],
        &["r1", "read", "--from-key", "m"],
        &["r1", "readwrite", "--prefix", "dir/"],
        &["r1", "read", "key"],
        &["r1", "read", "key"],
        &["r1", "write", "key"],
    ];
    for grant in grants {
        let mut args = vec!["role", "grant-permission"];
        args.extend_from_slice(grant);
        assert_stdout(&d.ctl(&args).await, "Role r1 updated");
        expect_bump(&mut d, &mut rev, 1, &format!("grant-permission {grant:?}")).await;
    }
    cases(
        &mut d,
        Some(&mut rev),
        &[
            Ctl(
                &["role", "grant-permission", "nor", "read", "k"],
                Fails("role name not found"),
            ),
            Ctl(
                &[
                    "role",
                    "grant-permission",
                    "r2",
                    "readwrite",
                    "",
                    "--prefix",
                ],
                Succeeds,
            ),
            Ctl(
                &["role", "grant-permission", "r3", "read", "b", "c"],
                Succeeds,
            ),
            Bump(2, "grants to r2 and r3"),
            Ctl(&["role", "get", "r1"], Prints("Role r1")),
            Ctl(&["role", "get", "r1", "-w", "json"], Succeeds),
            Ctl(&["role", "get", "r2"], Succeeds),
            Ctl34(&["role", "get", "r1"], Succeeds),
            Ctl34(&["role", "get", "r2", "-w", "json"], Succeeds),
            // Revoking permissions.
            Ctl(
                &["role", "revoke-permission", "r1", "nothere"],
                Fails("permission is not granted to the role"),
            ),
            Ctl(
                &["role", "revoke-permission", "nor", "key"],
                Fails("role name not found"),
            ),
            Bump(0, "refused revokes"),
            Ctl(
                &["role", "revoke-permission", "r1", "key"],
                Prints("Permission of key key is revoked from role r1"),
            ),
            Ctl(
                &["role", "revoke-permission", "r1", "--prefix", "dir/"],
                Succeeds,
            ),
            Bump(2, "two revokes"),
            Ctl(&["role", "get", "r1"], Succeeds),
            // Roles of users.
            Ctl(
                &["user", "grant-role", "alice", "r1"],
                Prints("Role r1 is granted to user alice"),
            ),
            Bump(1, "grant-role"),
            Ctl(
                &["user", "grant-role", "alice", "r1"],
                Prints("Role r1 is granted to user alice"),
            ),
            Bump(0, "a repeated grant-role"),
            Ctl(
                &["user", "grant-role", "alice", "nor"],
                Fails("role name not found"),
            ),
            Ctl(
                &["user", "grant-role", "nobody", "r1"],
                Fails("user name not found"),
            ),
            Bump(0, "refused grant-roles"),
            Ctl(&["user", "grant-role", "alice", "r2"], Succeeds),
            Ctl(&["user", "grant-role", "alice", "r3"], Succeeds),
            Ctl(&["user", "grant-role", "bob", "r3"], Succeeds),
            Bump(3, "three grant-roles"),
            Ctl(&["user", "get", "alice"], Prints("Roles: r1 r2 r3")),
            Ctl(&["user", "get", "alice", "--detail"], Succeeds),
            Ctl(
                &["user", "get", "alice", "--detail", "-w", "json"],
                Succeeds,
            ),
            Ctl34(&["user", "get", "alice", "--detail"], Succeeds),
            Ctl(
                &["user", "revoke-role", "carol", "r3"],
                Fails("role is not granted to the user"),
            ),
            Ctl(
                &["user", "revoke-role", "nobody", "r1"],
                Fails("user name not found"),
            ),
            Bump(0, "refused revoke-roles"),
            Ctl(
                &["user", "revoke-role", "alice", "r2"],
                Prints("Role r2 is revoked from user alice"),
            ),
            Bump(1, "revoke-role"),
            // Passwords.
            Stdin(
                &["user", "passwd", "alice", "--interactive=false"],
                b"alicepw2\n",
                Prints("Password updated"),
            ),
            Bump(1, "user passwd"),
            Stdin(
                &["user", "passwd", "nobody", "--interactive=false"],
                b"pw\n",
                Fails("user name not found"),
            ),
            Bump(0, "a refused user passwd"),
            // Deleting roles and users.
            Ctl(&["role", "delete", "r3"], Prints("Role r3 deleted")),
            Bump(1, "role delete"),
            Ctl(&["user", "get", "alice"], Succeeds),
            Ctl(&["user", "get", "bob", "-w", "json"], Succeeds),
            Ctl(&["role", "delete", "r3"], Fails("role name not found")),
            Ctl(&["user", "delete", "dave"], Prints("User dave deleted")),
            Bump(1, "user delete"),
            Ctl(&["user", "delete", "dave"], Fails("user name not found")),
            Bump(0, "refused deletes"),
            Ctl(&["user", "list"], Succeeds),
            Ctl(&["role", "list", "-w", "json"], Succeeds),
            Ctl(&["auth", "status", "-w", "json"], Succeeds),
        ],
    )
    .await;

    // The same through etcd-client.
    d.rpc(
        "user list",
        |mut client| async move { client.user_list().await },
    )
    .await
    .expect("user list");
    d.rpc(
        "role list",
        |mut client| async move { client.role_list().await },
    )
    .await
    .expect("role list");
    d.rpc("user get alice", |mut client| async move {
        client.user_get("alice").await
    })
    .await
    .expect("user get");
    d.rpc("role get r1", |mut client| async move {
        client.role_get("r1").await
    })
    .await
    .expect("role get");
    let missing = d
        .rpc("role get of a missing role", |mut client| async move {
            client.role_get("nor").await
        })
        .await;
    assert_grpc_error(
        &missing,
        tonic::Code::FailedPrecondition,
        "role name not found",
    );
    d.rpc("user add erin", |mut client| async move {
        client.user_add("erin", "erinpw", None).await
    })
    .await
    .expect("user add");
    d.rpc("grant a prefix permission", |mut client| async move {
        let permission = Permission::read_write("p/").with_prefix();
        client.role_grant_permission("r1", permission).await
    })
    .await
    .expect("grant permission");
    d.rpc("grant an all-keys read", |mut client| async move {
        let permission = Permission::read("").with_all_keys();
        client.role_grant_permission("r2", permission).await
    })
    .await
    .expect("grant permission");
    d.rpc("role get r2", |mut client| async move {
        client.role_get("r2").await
    })
    .await
    .expect("role get");
    d.rpc("user grant-role", |mut client| async move {
        client.user_grant_role("erin", "r1").await
    })
    .await
    .expect("grant role");
    let duplicate = d
        .rpc("add an existing user", |mut client| async move {
            client.user_add("erin", "x", None).await
        })
        .await;
    assert_grpc_error(
        &duplicate,
        tonic::Code::FailedPrecondition,
        "user name already exists",
    );
    cases(
        &mut d,
        Some(&mut rev),
        &[
            Bump(4, "four changes through etcd-client"),
            Ctl(&["role", "get", "r1", "-w", "json"], Succeeds),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------
// Enabling authentication and logging in.
// ---------------------------------------------------------------------------

/// `auth enable` when the root user lacks the root role (etcdctl adds the
/// role and grants it: two revisions, the enable itself none), requests
/// without or with wrong credentials, root's powers, what a non-root user
/// may do with users and roles (itself and its own roles only), the
/// protected root user and role, `auth disable` and re-enabling.
#[tokio::test]
async fn enabling_authentication_and_logging_in() {
    let mut d = differential().await;
    cases(
        &mut d,
        None,
        &[
            Ctl(&["user", "add", ROOT], Succeeds),
            Ctl(&["user", "add", ALICE], Succeeds),
            Ctl(&["user", "add", "bob", "--no-password"], Succeeds),
            Ctl(&["role", "add", "r1"], Succeeds),
            Ctl(
                &["role", "grant-permission", "r1", "readwrite", "k"],
                Succeeds,
            ),
            Ctl(&["user", "grant-role", "alice", "r1"], Succeeds),
            Ctl(&["put", "k", "v0"], Succeeds),
            Ctl(&["role", "get", "root"], Fails("role name not found")),
        ],
    )
    .await;
    let mut rev = current_auth_revision(&mut d).await;

    cases(
        &mut d,
        Some(&mut rev),
        &[
            Ctl(&["auth", "enable"], Prints("Authentication Enabled")),
            Bump(2, "auth enable (role root added and granted)"),
            As(
                ROOT,
                &["auth", "status"],
                Prints("Authentication Status: true"),
            ),
            As(ROOT, &["auth", "status", "-w", "json"], Succeeds),
            As(ROOT, &["role", "get", "root"], Prints("Role root")),
            As(ROOT, &["user", "get", "root"], Prints("Roles: root")),
            As(ROOT, &["role", "get", "root", "-w", "json"], Succeeds),
            // No user, wrong passwords, unknown users, a user without password.
            Ctl(&["put", "k", "v1"], Fails("user name is empty")),
            Ctl(&["get", "k"], Fails("user name is empty")),
            Ctl(&["auth", "status"], Fails("user name is empty")),
            Ctl(&["user", "list"], Fails("user name is empty")),
            Ctl(&["auth", "enable"], Fails("user name is empty")),
            Ctl(&["auth", "disable"], Fails("user name is empty")),
            Ctl34(&["get", "k"], Fails("user name is empty")),
        ],
    )
    .await;
    let invalid = "authentication failed, invalid user ID or password";
    cases(
        &mut d,
        None,
        &[
            As("root:wrong", &["get", "k"], Fails(invalid)),
            As("alice:wrong", &["get", "k"], Fails(invalid)),
            As("nobody:x", &["get", "k"], Fails(invalid)),
            As34("nobody:x", &["get", "k"], Fails(invalid)),
            As(
                "bob:x",
                &["get", "k"],
                Fails("password was given for no password user"),
            ),
        ],
    )
    .await;
    let refused = d
        .rpc("authenticate with a wrong password", |client| async move {
            client
                .auth_client()
                .authenticate("alice".to_string(), "wrong".to_string())
                .await
        })
        .await;
    assert_grpc_error(&refused, tonic::Code::InvalidArgument, invalid);
    let unauthenticated = d.get("get without a token", "k").await;
    assert_grpc_error(
        &unauthenticated,
        tonic::Code::InvalidArgument,
        "user name is empty",
    );

    // Root may do everything.
    cases(
        &mut d,
        Some(&mut rev),
        &[
            As(ROOT, &["put", "k", "v1"], Prints("OK")),
            As(ROOT, &["get", "k"], Prints("v1")),
            As34(ROOT, &["get", "k", "-w", "json"], Prints("\"kvs\"")),
            As(ROOT, &["put", "other", "o"], Succeeds),
            As(ROOT, &["user", "add", "carol:carolpw"], Succeeds),
            As(ROOT, &["role", "add", "r2"], Succeeds),
            As(
                ROOT,
                &["role", "grant-permission", "r2", "read", "other"],
                Succeeds,
            ),
            As(ROOT, &["user", "grant-role", "carol", "r2"], Succeeds),
            As(ROOT, &["user", "list"], Succeeds),
            As(ROOT, &["role", "list"], Succeeds),
            As(ROOT, &["user", "get", "alice", "--detail"], Succeeds),
            Bump(4, "root's four changes"),
            // A non-root user: its own data only.
            As(ALICE, &["get", "k"], Prints("v1")),
            As(ALICE, &["put", "k", "v2"], Prints("OK")),
        ],
    )
    .await;
    let denied = "etcdserver: permission denied";
    cases(
        &mut d,
        None,
        &[
            As(ALICE, &["get", "other"], Fails(denied)),
            As(ALICE, &["user", "get", "alice"], Prints("Roles: r1")),
            As(ALICE, &["user", "get", "alice", "--detail"], Succeeds),
            As(ALICE, &["role", "get", "r1"], Prints("Role r1")),
            As(ALICE, &["user", "get", "root"], Fails(denied)),
            As(ALICE, &["user", "get", "carol"], Fails(denied)),
            As(ALICE, &["role", "get", "r2"], Fails(denied)),
            As(ALICE, &["role", "get", "root"], Fails(denied)),
            As(ALICE, &["user", "list"], Fails(denied)),
            As(ALICE, &["role", "list"], Fails(denied)),
            As(ALICE, &["user", "add", "x:y"], Fails(denied)),
            As(ALICE, &["role", "add", "rx"], Fails(denied)),
            As(
                ALICE,
                &["role", "grant-permission", "r1", "readwrite", "other"],
                Fails(denied),
            ),
            As(ALICE, &["user", "grant-role", "alice", "r2"], Fails(denied)),
            As(
                ALICE,
                &["user", "revoke-role", "alice", "r1"],
                Fails(denied),
            ),
            As(ALICE, &["user", "delete", "carol"], Fails(denied)),
            As(ALICE, &["role", "delete", "r2"], Fails(denied)),
        ],
    )
    .await;
    assert_fails(
        &d.ctl_stdin(
            &arg_refs(&as_user(
                ALICE,
                &["user", "passwd", "alice", "--interactive=false"],
            )),
            b"new\n",
        )
        .await,
        denied,
    );
    cases(
        &mut d,
        Some(&mut rev),
        &[
            As(ALICE, &["auth", "status"], Fails(denied)),
            As(ALICE, &["auth", "disable"], Fails(denied)),
            As(ALICE, &["auth", "enable"], Fails(denied)),
            As34(ALICE, &["user", "list"], Fails(denied)),
            Bump(0, "alice's refused changes"),
        ],
    )
    .await;

    // Root itself is protected.
    let invalid_management = "etcdserver: invalid auth management";
    cases(
        &mut d,
        Some(&mut rev),
        &[
            As(ROOT, &["user", "delete", "root"], Fails(invalid_management)),
            As(
                ROOT,
                &["user", "revoke-role", "root", "root"],
                Fails(invalid_management),
            ),
            As(ROOT, &["role", "delete", "root"], Fails(invalid_management)),
            Bump(0, "refused changes of root"),
        ],
    )
    .await;

    // A changed password.
    assert_ok(
        &d.ctl_stdin(
            &arg_refs(&as_user(
                ROOT,
                &["user", "passwd", "alice", "--interactive=false"],
            )),
            b"alicepw2\n",
        )
        .await,
    );
    cases(
        &mut d,
        Some(&mut rev),
        &[
            As(ALICE, &["get", "k"], Fails(invalid)),
            As("alice:alicepw2", &["get", "k"], Prints("v2")),
            Bump(1, "user passwd"),
            // Disable: everything works without a user again.
            As(
                ROOT,
                &["auth", "disable"],
                Prints("Authentication Disabled"),
            ),
            Bump(1, "auth disable while enabled"),
            Ctl(&["auth", "status"], Prints("Authentication Status: false")),
            Ctl(&["get", "other"], Prints("o")),
            Ctl(&["put", "other", "o2"], Prints("OK")),
            Ctl(&["user", "list"], Succeeds),
            // etcdctl ignores "authentication is not enabled" when logging in, so
            // any credentials work while disabled.
            As("alice:wrong", &["get", "other"], Prints("o2")),
            Ctl(&["auth", "disable"], Prints("Authentication Disabled")),
            Bump(0, "auth disable while disabled"),
            // Re-enable: root already has the root role, so nothing is added.
            Ctl(&["auth", "enable"], Prints("Authentication Enabled")),
            Bump(0, "auth enable"),
            Ctl(&["get", "other"], Fails("user name is empty")),
            As("alice:alicepw2", &["get", "k"], Prints("v2")),
            As("alice:alicepw2", &["get", "other"], Fails(denied)),
            As(ROOT, &["get", "other"], Prints("o2")),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------
// Key permissions.
// ---------------------------------------------------------------------------

/// Masks for lease output: server-chosen lease ids (long hex; the fixed test
/// ids are short and stay visible) and the remaining TTL.
fn lease_masks() -> Vec<Mask> {
    vec![
        Mask::new(r"\b[0-9a-f]{12,16}\b", "<LEASE_ID>"),
        Mask::new(r"remaining\(-?\d+s\)", "remaining(<TTL>)"),
        Mask::new(r#""ttl":-?\d+"#, r#""ttl":<TTL>"#),
    ]
}

/// etcdctl's log lines of some commands carry numeric (epoch) timestamps.
fn numeric_timestamps() -> Mask {
    Mask::new(r#""ts":[0-9.]+"#, r#""ts":"<TS>""#)
}

/// Masks for `etcdctl snapshot save`: its info log lines (numeric timestamps
/// and local paths) are dropped, and each side's file name is masked.
fn snapshot_masks() -> Vec<Mask> {
    vec![
        Mask::new(r#"(?m)^\{"level":"info".*\n"#, ""),
        Mask::new(r"\S*/(oracle|candidate)\.db", "<SNAPSHOT_FILE>"),
        numeric_timestamps(),
    ]
}

/// Sets up roles for alice (authentication still disabled), seeds keys,
/// and enables authentication:
/// - `reader`: read `key1`, read prefix `ro/`;
/// - `writer`: write `wkey`, write prefix `wo/`;
/// - `rw`: readwrite prefix `dir/`, readwrite prefix `lk/` (a lock), and
///   readwrite from key `x` (every key from `x` on).
async fn key_permission_setup(d: &mut Differential) {
    for args in [
        &["user", "add", ROOT][..],
        &["user", "add", ALICE],
        &["role", "add", "reader"],
        &["role", "add", "writer"],
        &["role", "add", "rw"],
        &["role", "grant-permission", "reader", "read", "key1"],
        &[
            "role",
            "grant-permission",
            "reader",
            "read",
            "--prefix",
            "ro/",
        ],
        &["role", "grant-permission", "writer", "write", "wkey"],
        &[
            "role",
            "grant-permission",
            "writer",
            "write",
            "--prefix",
            "wo/",
        ],
        &[
            "role",
            "grant-permission",
            "rw",
            "readwrite",
            "--prefix",
            "dir/",
        ],
        &[
            "role",
            "grant-permission",
            "rw",
            "readwrite",
            "--prefix",
            "lk/",
        ],
        &[
            "role",
            "grant-permission",
            "rw",
            "readwrite",
            "--from-key",
            "x",
        ],
        &["user", "grant-role", "alice", "reader"],
    ] {
        assert_ok(&d.ctl(args).await);
    }
    cases(
        d,
        None,
        &[
            Ctl(&["user", "grant-role", "alice", "writer"], Succeeds),
            Ctl(&["user", "grant-role", "alice", "rw"], Succeeds),
        ],
    )
    .await;
    for (key, value) in [
        ("key1", "v1"),
        ("key2", "v2"),
        ("ro/a", "ra"),
        ("ro/b", "rb"),
        ("rp", "outside"),
        ("wkey", "w0"),
        ("wo/a", "wa"),
        ("wo/b", "wb"),
        ("dir/a", "da"),
        ("dir/b", "db"),
        ("x1", "x"),
        ("y1", "y"),
    ] {
        assert_ok(&d.ctl(&["put", key, value]).await);
    }
    cases(
        d,
        None,
        &[
            Ctl(&["user", "get", "alice", "--detail"], Succeeds),
            Ctl(&["auth", "enable"], Prints("Authentication Enabled")),
        ],
    )
    .await;
}

/// What a non-root user may do with keys, leases, watches, locks and
/// elections given read, write and readwrite permissions on single keys,
/// prefixes and `--from-key` ranges; and which cluster and maintenance
/// commands need root (or no user at all, as `compaction`).
#[tokio::test]
async fn key_permissions_of_a_non_root_user() {
    let mut d = differential().await;
    key_permission_setup(&mut d).await;
    let denied = "etcdserver: permission denied";

    // Reads.
    cases(
        &mut d,
        None,
        &[
            As(ALICE, &["get", "key1"], Prints("v1")),
            As(ALICE, &["get", "key2"], Fails(denied)),
            As(ALICE, &["get", "wkey"], Fails(denied)),
            As(ALICE, &["get", "ro/", "--prefix"], Prints("rb")),
            As(ALICE, &["get", "ro/", "--prefix", "-w", "json"], Succeeds),
            As(ALICE, &["get", "ro", "--prefix"], Fails(denied)),
            As(ALICE, &["get", "ro/a", "ro/c"], Prints("ra")),
            As(ALICE, &["get", "ro/a", "rp"], Fails(denied)),
            As(ALICE, &["get", "dir/", "--prefix"], Prints("db")),
            As(ALICE, &["get", "dir", "--prefix"], Fails(denied)),
            As(ALICE, &["get", "--from-key", "x"], Prints("y1")),
            As(ALICE, &["get", "x1", "z"], Prints("y1")),
            As(ALICE, &["get", "--from-key", "w"], Fails(denied)),
            As(ALICE, &["get", "", "--prefix"], Fails(denied)),
            As(
                ALICE,
                &["get", "key1", "--count-only", "-w", "fields"],
                Succeeds,
            ),
            As34(ALICE, &["get", "key1"], Prints("v1")),
            As34(ALICE, &["get", "key2"], Fails(denied)),
            // Writes.
            As(ALICE, &["put", "wkey", "w1"], Prints("OK")),
            As(ALICE, &["put", "wo/c", "wc"], Prints("OK")),
            As(ALICE, &["put", "dir/c", "dc"], Prints("OK")),
            As(ALICE, &["put", "x2", "x"], Prints("OK")),
            As(ALICE, &["put", "dir/d", "dd", "-w", "json"], Succeeds),
            As(ALICE, &["put", "key1", "no"], Fails(denied)),
            As(ALICE, &["put", "ro/a", "no"], Fails(denied)),
            As(ALICE, &["put", "w", "no"], Fails(denied)),
            // --prev-kv also reads the key.
            As(ALICE, &["put", "wkey", "w2", "--prev-kv"], Fails(denied)),
            As(ALICE, &["put", "dir/a", "da2", "--prev-kv"], Prints("da")),
            As34(ALICE, &["put", "key2", "no"], Fails(denied)),
            // Deletes: write permission; --prev-kv needs read too.
            As(ALICE, &["del", "wo/a"], Prints("1")),
            As(ALICE, &["del", "wo/b", "--prev-kv"], Fails(denied)),
            As(ALICE, &["del", "dir/b", "--prev-kv"], Prints("db")),
            As(ALICE, &["del", "ro/a"], Fails(denied)),
            As(ALICE, &["del", "key1"], Fails(denied)),
            As(ALICE, &["del", "dir", "--prefix"], Fails(denied)),
            As(ALICE, &["del", "wo/", "--prefix"], Prints("2")),
            As(ALICE, &["del", "dir/c", "-w", "json"], Succeeds),
            As(ROOT, &["get", "", "--prefix", "-w", "json"], Succeeds),
        ],
    )
    .await;

    // Transactions: compares need read; the operations of both branches need
    // their permission, even those of the branch not taken.
    let txns: [TxnStep; 8] = [
        (
            &[r#"value("key1") = "v1""#],
            &["put dir/t1 t"],
            &["put wkey w3"],
            Prints("SUCCESS"),
        ),
        (
            &[r#"value("wkey") = "w1""#],
            &["put dir/t2 t"],
            &[],
            Fails(denied),
        ),
        (
            &[r#"value("key1") = "v1""#],
            &["put dir/t3 t"],
            &["put key1 no"],
            Fails(denied),
        ),
        (
            &[r#"value("key1") = "v1""#],
            &["put dir/t4 t"],
            &["get key2"],
            Fails(denied),
        ),
        (
            &[r#"value("key1") = "nope""#],
            &["get key2"],
            &["put dir/t5 t"],
            Fails(denied),
        ),
        (
            &[r#"value("key1") = "nope""#],
            &[],
            &["get dir/t1", "del wkey"],
            Prints("FAILURE"),
        ),
        (
            &[],
            &["del dir/t1 --prev-kv", "del wo/x --prev-kv"],
            &[],
            Fails(denied),
        ),
        (&[], &["del dir/t1 --prev-kv"], &[], Prints("SUCCESS")),
    ];
    for (compares, success, failure, expect) in txns {
        expect.check(&txn_as(&mut d, ALICE, &txn_script(compares, success, failure)).await);
    }
    assert_ok(
        &d.ctl_stdin(
            &arg_refs(&as_user(ALICE, &["txn", "-w", "json"])),
            &txn_script(&[r#"mod("dir/a") > "0""#], &["get dir/ --prefix"], &[]),
        )
        .await,
    );
    // Through etcd-client.
    let alice = UserClients::connect(&d, "alice", "alicepw").await;
    alice
        .rpc(
            "txn with permitted compares and ops",
            |mut client| async move {
                let txn = Txn::new()
                    .when([etcd_client::Compare::value(
                        "key1",
                        etcd_client::CompareOp::Equal,
                        "v1",
                    )])
                    .and_then([TxnOp::put("dir/t6", "t", None), TxnOp::get("x1", None)])
                    .or_else([TxnOp::delete("wkey", None)]);
                client.txn(txn).await
            },
        )
        .await
        .expect("permitted txn");
    let out = alice
        .rpc(
            "txn with a denied op in the branch not taken",
            |mut client| async move {
                let txn = Txn::new()
                    .when([etcd_client::Compare::version(
                        "dir/a",
                        etcd_client::CompareOp::Greater,
                        0,
                    )])
                    .and_then([TxnOp::put("dir/t7", "t", None)])
                    .or_else([TxnOp::put("ro/a", "no", None)]);
                client.txn(txn).await
            },
        )
        .await;
    assert_grpc_error(&out, tonic::Code::PermissionDenied, denied);
    // Nested transactions with permitted operations (etcd 3.5.1 does not
    // check the operations of nested transactions at all, so a nested read
    // of a denied key is not compared here).
    alice
        .rpc("txn with a nested txn", |mut client| async move {
            let inner = Txn::new()
                .when([etcd_client::Compare::value(
                    "dir/a",
                    etcd_client::CompareOp::Equal,
                    "da2",
                )])
                .and_then([TxnOp::get("key1", None), TxnOp::put("dir/n", "n", None)]);
            let txn = Txn::new().and_then([TxnOp::put("dir/t8", "t", None), TxnOp::txn(inner)]);
            client.txn(txn).await
        })
        .await
        .expect("nested txn");
    alice
        .rpc(
            "put with prev_kv on a readwrite key",
            |mut client| async move {
                client
                    .put("dir/a", "da3", Some(PutOptions::new().with_prev_key()))
                    .await
            },
        )
        .await
        .expect("put with prev_kv");
    let out = alice.get("get of a write-only key", "wkey").await;
    assert_grpc_error(&out, tonic::Code::PermissionDenied, denied);
    alice
        .rpc(
            "get of a permitted prefix, keys only",
            |mut client| async move {
                client
                    .get(
                        "ro/",
                        Some(GetOptions::new().with_prefix().with_keys_only()),
                    )
                    .await
            },
        )
        .await
        .expect("get prefix");

    // Watches: a permitted prefix delivers events; an unpermitted key is
    // canceled by the server.
    let from = (store_revision(&mut d).await + 1).to_string();
    let watch = as_user(ALICE, &["watch", "--prefix", "dir/", "--rev", &from]);
    let mut watchers = Vec::new();
    for side in [&d.oracle, &d.candidate] {
        let args = arg_refs(&watch);
        watchers.push(
            CtlProcess::spawn(side.ctl35.binary(), &side.cluster.endpoints(), &args)
                .expect("spawning etcdctl watch"),
        );
    }
    cases(
        &mut d,
        None,
        &[
            As(ROOT, &["put", "dir/w1", "1"], Succeeds),
            As(ALICE, &["put", "dir/w2", "2"], Succeeds),
            As(ROOT, &["put", "ro/ignored", "x"], Succeeds),
            As(ALICE, &["del", "dir/w1"], Succeeds),
        ],
    )
    .await;
    let mut transcripts = Vec::new();
    for (side, mut watcher) in ["oracle", "candidate"].into_iter().zip(watchers) {
        let waited = watcher
            .wait_stdout("3 events", WATCH_EVENTS_TIMEOUT, |stdout| {
                simple_watch_events(stdout) >= 3
            })
            .await;
        let output = watcher.kill().await.expect("stopping etcdctl watch");
        if side == "oracle" {
            waited.expect("the oracle's watch events");
        }
        transcripts.push(output.normalized().stdout);
    }
    same_text(
        d.candidate.cluster.binary(),
        "etcdctl watch --prefix dir/ as alice",
        &transcripts[0],
        &transcripts[1],
    );
    cases(&mut d, None, &[
        As(ALICE, &["watch", "key2"], FailsAnywhere("watch was canceled (rpc error: code = PermissionDenied desc = etcdserver: permission denied)")),
        As(ALICE, &["watch", "ro", "--prefix"], FailsAnywhere("permission denied")),
    ]).await;
    let canceled = alice
        .rpc("watch of an unpermitted key", |mut client| async move {
            let mut stream = client.watch("key2", None).await?;
            match tokio::time::timeout(WATCH_RESPONSE_TIMEOUT, stream.message()).await {
                Ok(response) => {
                    response?.ok_or_else(|| Error::WatchError("the watch stream ended".to_string()))
                }
                Err(_) => Err(Error::WatchError("no watch response in time".to_string())),
            }
        })
        .await
        .expect("a watch response");
    assert!(canceled.canceled(), "{canceled:?}");

    // Leases: any authenticated user may grant, list, inspect and keep
    // alive; revoking deletes the attached keys, which needs write on them.
    let pair = CtlPair::of(&d);
    let masks = lease_masks();
    let granted = pair
        .run(
            &arg_refs(&as_user(ALICE, &["lease", "grant", "600"])),
            &masks,
        )
        .await;
    assert_stdout(&granted, "granted with TTL(600s)");
    assert_stdout(
        &pair
            .run(&arg_refs(&as_user(ALICE, &["lease", "list"])), &masks)
            .await,
        "found 1 leases",
    );
    // Granting and listing leases are not checked at all (no user needed).
    assert_stdout(
        &pair.run(&["lease", "grant", "600"], &masks).await,
        "granted with TTL(600s)",
    );
    assert_stdout(
        &pair.run(&["lease", "list"], &masks).await,
        "found 2 leases",
    );
    let root = UserClients::connect(&d, "root", "rootpw").await;
    root.rpc("lease grant with a fixed id", |mut client| async move {
        let options = LeaseGrantOptions::new().with_id(ROOT_LEASE);
        client.lease_grant(LEASE_TTL_SECONDS, Some(options)).await
    })
    .await
    .expect("lease grant");
    let lease = format!("--lease={ROOT_LEASE_HEX}");
    assert_ok(&ctl_as(&mut d, ROOT, &["put", "ro/leased", "l", &lease]).await);
    alice
        .rpc(
            "lease grant as alice with a fixed id",
            |mut client| async move {
                let options = LeaseGrantOptions::new().with_id(ALICE_LEASE);
                client.lease_grant(LEASE_TTL_SECONDS, Some(options)).await
            },
        )
        .await
        .expect("lease grant as alice");
    let lease = format!("--lease={ALICE_LEASE_HEX}");
    assert_ok(&ctl_as(&mut d, ALICE, &["put", "dir/leased", "l", &lease]).await);
    let ttl = as_user(ALICE, &["lease", "timetolive", ROOT_LEASE_HEX, "--keys"]);
    assert_stdout(
        &pair.run(&arg_refs(&ttl), &masks).await,
        "attached keys([ro/leased])",
    );
    let ttl = as_user(
        ALICE,
        &[
            "lease",
            "timetolive",
            ROOT_LEASE_HEX,
            "--keys",
            "-w",
            "json",
        ],
    );
    assert_ok(&pair.run(&arg_refs(&ttl), &masks).await);
    let timetolive = alice
        .rpc("lease time-to-live as alice", |mut client| async move {
            let options = LeaseTimeToLiveOptions::new().with_keys();
            let response = client.lease_time_to_live(ROOT_LEASE, Some(options)).await?;
            // The remaining TTL may differ by a second between the two.
            Ok(format!(
                "id={} granted={} keys={:?} ttl_positive={}",
                response.id(),
                response.granted_ttl(),
                response.keys(),
                response.ttl() > 0
            ))
        })
        .await;
    timetolive.expect("time-to-live");
    cases(
        &mut d,
        None,
        &[
            As(
                ALICE,
                &["lease", "keep-alive", "--once", ROOT_LEASE_HEX],
                Prints("keepalived with TTL(3600)"),
            ),
            As(
                ALICE,
                &["lease", "revoke", ROOT_LEASE_HEX],
                Fails("failed to revoke lease (etcdserver: permission denied)"),
            ),
            Ctl(
                &["lease", "revoke", ROOT_LEASE_HEX],
                Fails("failed to revoke lease (etcdserver: user name is empty)"),
            ),
            As(
                ALICE,
                &["lease", "revoke", ALICE_LEASE_HEX],
                Prints("lease 0000000000005678 revoked"),
            ),
            As(ROOT, &["get", "", "--prefix", "--keys-only"], Succeeds),
        ],
    )
    .await;

    // Locks and elections.
    let lock = ctl_as(
        &mut d,
        ALICE,
        &["lock", "lk", "--", "/bin/sh", "-c", "echo locked"],
    )
    .await;
    assert_stdout(&lock, "locked");
    cases(
        &mut d,
        None,
        &[
            As(ALICE, &["lock", "other"], Fails(denied)),
            As(ALICE, &["elect", "el", "p1"], Fails(denied)),
            // Cluster commands: reading is open to any user, changes need root.
            As(ALICE, &["member", "list"], Succeeds),
            As(ALICE, &["member", "list", "-w", "json"], Succeeds),
            As(ALICE, &["endpoint", "status"], Succeeds),
            As(ALICE, &["alarm", "list"], Succeeds),
        ],
    )
    .await;
    // `endpoint health` counts "permission denied" for its probe read as
    // healthy, but not "user name is empty"; its log lines carry numeric
    // timestamps.
    let health_masks = [numeric_timestamps()];
    let health = as_user(ALICE, &["endpoint", "health"]);
    assert_stdout(
        &pair.run(&arg_refs(&health), &health_masks).await,
        "is healthy",
    );
    assert_fails(
        &pair.run(&["endpoint", "health"], &health_masks).await,
        "is unhealthy: failed to commit proposal: etcdserver: user name is empty",
    );
    let peer = peer_url(Ipv4Addr::new(127, 254, 254, 254));
    let peer_flag = format!("--peer-urls={peer}");
    for user in [Some(ALICE), None] {
        let needle = match user {
            Some(_) => denied,
            None => "etcdserver: user name is empty",
        };
        for args in [
            &["member", "add", "newbie", &peer_flag][..],
            &["member", "remove", "1234"],
            &["member", "update", "1234", &peer_flag],
        ] {
            let out = match user {
                Some(user) => ctl_as(&mut d, user, args).await,
                None => d.ctl(args).await,
            };
            assert_fails(&out, needle);
        }
    }
    assert_ok(&ctl_as(&mut d, ROOT, &["member", "list"]).await);

    // Maintenance: defrag, hashkv and snapshot need root and answer with the
    // raw auth errors; status and alarms are open to any user.
    let raw_denied = "rpc error: code = Unknown desc = auth: permission denied";
    let raw_empty = "rpc error: code = Unknown desc = auth: user name is empty";
    cases(
        &mut d,
        None,
        &[
            As(ALICE, &["defrag"], FailsAnywhere(raw_denied)),
            Ctl(&["defrag"], FailsAnywhere(raw_empty)),
            As(ALICE, &["endpoint", "hashkv"], FailsAnywhere(raw_denied)),
            Ctl(&["endpoint", "hashkv"], FailsAnywhere(raw_empty)),
        ],
    )
    .await;
    let snapshots = tempfile::tempdir().expect("a directory for snapshots");
    let masks = snapshot_masks();
    for (user, needle) in [(Some(ALICE), raw_denied), (None, raw_empty)] {
        let oracle_file = snapshots.path().join("oracle.db");
        let candidate_file = snapshots.path().join("candidate.db");
        let args = |file: &Path| {
            let base = ["snapshot", "save", file.to_str().expect("UTF-8 path")];
            match user {
                Some(user) => as_user(user, &base),
                None => base.iter().map(|arg| arg.to_string()).collect(),
            }
        };
        let (oracle_args, candidate_args) = (args(&oracle_file), args(&candidate_file));
        let out = pair
            .run_each(
                &arg_refs(&oracle_args),
                &arg_refs(&candidate_args),
                b"",
                &masks,
            )
            .await;
        assert_fails(&out, needle);
        assert!(!oracle_file.exists(), "a refused snapshot was written");
    }
    // The history holds keys named after server-chosen lease ids (the lock),
    // so the hashes themselves differ.
    let hash_masks = [Mask::new(r"(?m), \d+$", ", <HASH>")];
    let hashkv = as_user(ROOT, &["endpoint", "hashkv"]);
    assert_ok(&pair.run(&arg_refs(&hashkv), &hash_masks).await);
    assert_ok(&ctl_as(&mut d, ROOT, &["defrag"]).await);

    // Compaction has no auth check at all.
    let rev = store_revision(&mut d).await;
    let out = d.ctl(&["compaction", &(rev - 5).to_string()]).await;
    assert_stdout(&out, "compacted revision");
    let out = ctl_as(&mut d, ALICE, &["compaction", &(rev - 2).to_string()]).await;
    assert_stdout(&out, "compacted revision");

    // Disabled: everything works without a user; enabled again: denied.
    cases(
        &mut d,
        None,
        &[
            As(ROOT, &["auth", "disable"], Succeeds),
            Ctl(&["get", "key2"], Prints("v2")),
            Ctl(&["put", "ro/a", "yes"], Prints("OK")),
            As(ALICE, &["get", "key2"], Prints("v2")),
        ],
    )
    .await;
    assert_ok(&pair.run(&["endpoint", "hashkv"], &hash_masks).await);
    cases(
        &mut d,
        None,
        &[
            Ctl(&["auth", "enable"], Succeeds),
            As(ALICE, &["get", "key2"], Fails(denied)),
            Ctl(&["get", "key1"], Fails("user name is empty")),
            As(ALICE, &["get", "ro/a"], Prints("yes")),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------
// Tokens through etcd-client.
// ---------------------------------------------------------------------------

/// Roles for the token tests: alice reads `key1` and reads and writes the
/// prefix `dir/`; keys `key1` and `key2` exist. Authentication is enabled.
async fn token_setup(d: &mut Differential) {
    for args in [
        &["user", "add", ROOT][..],
        &["user", "add", ALICE],
        &["role", "add", "r"],
        &["role", "grant-permission", "r", "read", "key1"],
        &[
            "role",
            "grant-permission",
            "r",
            "readwrite",
            "--prefix",
            "dir/",
        ],
        &["user", "grant-role", "alice", "r"],
        &["put", "key1", "v1"],
        &["put", "key2", "v2"],
        &["auth", "enable"],
    ] {
        assert_ok(&d.ctl(args).await);
    }
}

/// Authenticate on both sides; compares the headers (the tokens themselves
/// differ) and returns both tokens.
async fn authenticate_both(d: &Differential, user: &str, password: &str) -> (String, String) {
    let run = |client: Client| {
        let (user, password) = (user.to_string(), password.to_string());
        async move { client.auth_client().authenticate(user, password).await }
    };
    let oracle = run(d.oracle.client.clone())
        .await
        .expect("authenticate on the oracle");
    let candidate = run(d.candidate.client.clone()).await;
    let header = |result: &Result<etcd_client::AuthenticateResponse, Error>| match result {
        Ok(response) => normalize(&format!("{:#?}", response.header())),
        Err(error) => describe_error(error),
    };
    same_text(
        d.candidate.cluster.binary(),
        "authenticate (header)",
        &header(&Ok(oracle.clone())),
        &header(&candidate),
    );
    let candidate = candidate.expect("authenticate on the candidate");
    (oracle.token().to_string(), candidate.token().to_string())
}

/// Simple tokens through etcd-client: Authenticate before and after enabling,
/// a connection with `ConnectOptions::with_user` doing permitted and denied
/// requests (maintenance calls with the raw auth errors), a refused login, a
/// token that survives an auth change and sees the new permissions, tokens
/// dropped by a password change and by `auth disable`, and automatic refresh.
#[tokio::test]
async fn etcd_client_tokens() {
    let mut d = differential().await;
    let disabled = d
        .rpc("authenticate while disabled", |client| async move {
            client
                .auth_client()
                .authenticate("root".to_string(), "x".to_string())
                .await
        })
        .await;
    assert_grpc_error(
        &disabled,
        tonic::Code::FailedPrecondition,
        "etcdserver: authentication is not enabled",
    );
    token_setup(&mut d).await;

    let (oracle_token, candidate_token) = authenticate_both(&d, "alice", "alicepw").await;
    assert!(!oracle_token.is_empty());
    assert!(
        !candidate_token.is_empty(),
        "the candidate's token is empty"
    );

    let alice = UserClients::connect(&d, "alice", "alicepw").await;
    alice
        .get("permitted get", "key1")
        .await
        .expect("permitted get");
    let out = alice.get("denied get", "key2").await;
    assert_grpc_error(
        &out,
        tonic::Code::PermissionDenied,
        "etcdserver: permission denied",
    );
    alice
        .rpc("permitted put", |mut client| async move {
            client.put("dir/a", "1", None).await
        })
        .await
        .expect("permitted put");
    let out = alice
        .rpc("denied put", |mut client| async move {
            client.put("key1", "no", None).await
        })
        .await;
    assert_grpc_error(
        &out,
        tonic::Code::PermissionDenied,
        "etcdserver: permission denied",
    );
    let out = alice
        .rpc("user list as non-root", |mut client| async move {
            client.user_list().await
        })
        .await;
    assert_grpc_error(
        &out,
        tonic::Code::PermissionDenied,
        "etcdserver: permission denied",
    );
    alice
        .rpc("user get of oneself", |mut client| async move {
            client.user_get("alice").await
        })
        .await
        .expect("user get of oneself");
    alice
        .rpc("status as non-root", |mut client| async move {
            client
                .status()
                .await
                .map(|status| format!("{:?}", status.header()))
        })
        .await
        .expect("status");
    let out = alice
        .rpc("defragment as non-root", |mut client| async move {
            client.defragment().await
        })
        .await;
    assert_grpc_error(&out, tonic::Code::Unknown, "auth: permission denied");
    let out = alice
        .rpc("hash_kv as non-root", |mut client| async move {
            client.hash_kv(0).await
        })
        .await;
    assert_grpc_error(&out, tonic::Code::Unknown, "auth: permission denied");
    let out = d
        .rpc("defragment without a token", |mut client| async move {
            client.defragment().await
        })
        .await;
    assert_grpc_error(&out, tonic::Code::Unknown, "auth: user name is empty");
    let out = d
        .rpc("member list without a token", |mut client| async move {
            client.member_list().await.map(|list| list.members().len())
        })
        .await;
    out.expect("member list needs no token");

    // A refused login.
    let (oracle_endpoints, candidate_endpoints) = (
        d.oracle.cluster.endpoints(),
        d.candidate.cluster.endpoints(),
    );
    let (oracle, candidate) = tokio::join!(
        integration_tests::auth::connect_as(&oracle_endpoints, "alice", "wrong"),
        integration_tests::auth::connect_as(&candidate_endpoints, "alice", "wrong"),
    );
    let (oracle, candidate) = (oracle.map(|_| ()), candidate.map(|_| ()));
    same_text(
        d.candidate.cluster.binary(),
        "etcd-client connect with a wrong password",
        &describe(&oracle),
        &describe(&candidate),
    );
    assert_grpc_error(
        &oracle,
        tonic::Code::InvalidArgument,
        "authentication failed, invalid user ID or password",
    );

    // A simple token outlives auth changes: the server keeps its user only
    // and checks permissions as they are now.
    let root = UserClients::connect(&d, "root", "rootpw").await;
    let refreshing = UserClients::connect_with(&d, "root", "rootpw", true).await;
    root.rpc("grant alice key2", |mut client| async move {
        client
            .role_grant_permission("r", Permission::read("key2"))
            .await
    })
    .await
    .expect("grant");
    alice
        .get("get with a token from before an auth change", "key2")
        .await
        .expect("get with an older token");
    alice
        .rpc(
            "put with a token from before an auth change",
            |mut client| async move { client.put("dir/b", "2", None).await },
        )
        .await
        .expect("put with an older token");
    alice
        .rpc("refresh the token", |client| async move {
            client.refresh_token().await
        })
        .await
        .expect("refresh token");
    alice
        .get("get with a fresh token", "key2")
        .await
        .expect("get with a fresh token");

    // A changed password invalidates the user's token.
    root.rpc("change alice's password", |mut client| async move {
        client.user_change_password("alice", "alicepw2").await
    })
    .await
    .expect("passwd");
    let out = alice
        .get("get with the token of a changed password", "key1")
        .await;
    assert_grpc_error(
        &out,
        tonic::Code::Unauthenticated,
        "etcdserver: invalid auth token",
    );
    let fresh = UserClients::connect(&d, "alice", "alicepw2").await;
    fresh
        .get("get after logging in again", "key1")
        .await
        .expect("get after logging in again");

    // Disabling drops every simple token: a client still sending one is
    // refused (also while authentication is disabled); Authenticate is
    // refused; requests without a token work.
    root.rpc("auth disable", |mut client| async move {
        client.auth_disable().await
    })
    .await
    .expect("auth disable");
    let out = d
        .rpc("authenticate after disabling", |client| async move {
            client
                .auth_client()
                .authenticate("alice".to_string(), "alicepw2".to_string())
                .await
        })
        .await;
    assert_grpc_error(
        &out,
        tonic::Code::FailedPrecondition,
        "etcdserver: authentication is not enabled",
    );
    d.get("get without a token after disabling", "key2")
        .await
        .expect("get");
    let out = root
        .get("get with a token from before disabling", "key2")
        .await;
    assert_grpc_error(
        &out,
        tonic::Code::Unauthenticated,
        "etcdserver: invalid auth token",
    );
    d.rpc("auth enable without a token", |mut client| async move {
        client.auth_enable().await
    })
    .await
    .expect("auth enable");
    let out = d.get("get without a token after enabling", "key2").await;
    assert_grpc_error(&out, tonic::Code::InvalidArgument, "user name is empty");
    // etcd-client's automatic refresh logs in again after "invalid auth token".
    refreshing
        .get("get with automatic token refresh after re-enabling", "key2")
        .await
        .expect("automatic refresh");
    let out = root
        .get("get with a dropped token after re-enabling", "key2")
        .await;
    assert_grpc_error(
        &out,
        tonic::Code::Unauthenticated,
        "etcdserver: invalid auth token",
    );
    root.rpc("refresh the token", |client| async move {
        client.refresh_token().await
    })
    .await
    .expect("refresh");
    root.get("get after logging in again", "key2")
        .await
        .expect("get after logging in again");
}

// ---------------------------------------------------------------------------
// JWT tokens.
// ---------------------------------------------------------------------------

/// Writes an RSA key pair (PEM) for the JWT token provider into `dir`.
fn rsa_key_pair(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let private = dir.join("jwt.key");
    let public = dir.join("jwt.pub");
    let run = |args: &[&str]| -> Result<()> {
        let output = std::process::Command::new("openssl")
            .args(args)
            .output()
            .with_context(|| format!("running openssl {args:?}"))?;
        ensure!(
            output.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    };
    let private_text = private.to_str().context("UTF-8 path")?;
    let public_text = public.to_str().context("UTF-8 path")?;
    run(&["genrsa", "-out", private_text, "2048"])?;
    run(&["rsa", "-in", private_text, "-pubout", "-out", public_text])?;
    Ok((private, public))
}

/// Both servers with `--auth-token jwt,...` (one RSA key pair per run):
/// Authenticate returns a three-part JWT (RS256) whose payload names the user
/// and the auth revision; requests with it work through etcdctl and
/// etcd-client; after an auth change (or `auth disable`) the token is stale
/// for KV requests, also with automatic refresh, and a new one works.
#[tokio::test]
async fn jwt_tokens() {
    let keys = tempfile::tempdir().expect("a directory for the JWT keys");
    let (private, public) = rsa_key_pair(keys.path()).expect("an RSA key pair");
    let flag = format!(
        "--auth-token=jwt,pub-key={},priv-key={},sign-method=RS256,ttl=10m",
        public.display(),
        private.display()
    );
    let oracle = FlaggedBinary::new(&Binary::etcd35().expect("reference etcd"), &[&flag])
        .expect("oracle wrapper");
    let candidate = FlaggedBinary::new(&Binary::candidate().expect("candidate"), &[&flag])
        .expect("candidate wrapper");
    let mut d =
        Differential::start_with(oracle.binary(), candidate.binary(), ClusterConfig::new(1))
            .await
            .expect("starting both servers with JWT tokens");
    token_setup(&mut d).await;
    let revision = current_auth_revision(&mut d).await;

    let (oracle_token, candidate_token) = authenticate_both(&d, "alice", "alicepw").await;
    for (side, token) in [("oracle", &oracle_token), ("candidate", &candidate_token)] {
        let (header, payload) =
            jwt_parts(token).unwrap_or_else(|e| panic!("the {side}'s token {token:?}: {e:#}"));
        assert_eq!(header["alg"], "RS256", "the {side}'s JWT header: {header}");
        assert_eq!(
            payload["username"], "alice",
            "the {side}'s JWT payload: {payload}"
        );
        assert_eq!(
            payload["revision"].as_u64(),
            Some(revision),
            "the {side}'s JWT payload: {payload}"
        );
        assert!(
            payload["exp"].as_i64().is_some(),
            "the {side}'s JWT payload has no exp: {payload}"
        );
    }

    cases(
        &mut d,
        None,
        &[
            As(ALICE, &["get", "key1"], Prints("v1")),
            As(
                ALICE,
                &["get", "key2"],
                Fails("etcdserver: permission denied"),
            ),
            As(ALICE, &["put", "dir/j", "1"], Prints("OK")),
            As(ROOT, &["user", "list"], Succeeds),
            As(
                "alice:wrong",
                &["get", "key1"],
                Fails("invalid user ID or password"),
            ),
        ],
    )
    .await;

    let alice = UserClients::connect(&d, "alice", "alicepw").await;
    let refreshing = UserClients::connect_with(&d, "alice", "alicepw", true).await;
    alice
        .get("get with a JWT", "key1")
        .await
        .expect("get with a JWT");
    let out = alice.get("denied get with a JWT", "key2").await;
    assert_grpc_error(
        &out,
        tonic::Code::PermissionDenied,
        "etcdserver: permission denied",
    );

    // An auth change: the JWT names an older revision.
    assert_ok(
        &ctl_as(
            &mut d,
            ROOT,
            &["role", "grant-permission", "r", "read", "key2"],
        )
        .await,
    );
    // etcd 3.5.1 answers Unknown "auth: revision in header is old" (not the
    // InvalidArgument "etcdserver: revision of auth store is old" of its
    // rpctypes), which etcd-client does not take as a reason to log in
    // again, not even with automatic token refresh.
    let old_revision = "auth: revision in header is old";
    let stale = alice
        .get("get with a JWT of an older auth revision", "key2")
        .await;
    assert_grpc_error(&stale, tonic::Code::Unknown, old_revision);
    let stale = alice
        .rpc(
            "put with a JWT of an older auth revision",
            |mut client| async move { client.put("dir/k", "2", None).await },
        )
        .await;
    assert_grpc_error(&stale, tonic::Code::Unknown, old_revision);
    let stale = alice
        .rpc(
            "txn with a JWT of an older auth revision",
            |mut client| async move {
                client
                    .txn(Txn::new().and_then([TxnOp::get("key1", None)]))
                    .await
            },
        )
        .await;
    assert_grpc_error(&stale, tonic::Code::Unknown, old_revision);
    let stale = refreshing
        .get(
            "get with a JWT of an older auth revision, automatic refresh",
            "key1",
        )
        .await;
    assert_grpc_error(&stale, tonic::Code::Unknown, old_revision);
    alice
        .rpc(
            "lease grant (no permission check) with an older JWT",
            |mut client| async move {
                let options = LeaseGrantOptions::new().with_id(ALICE_LEASE);
                client.lease_grant(LEASE_TTL_SECONDS, Some(options)).await
            },
        )
        .await
        .expect("lease grant");
    alice
        .rpc("refresh the JWT", |client| async move {
            client.refresh_token().await
        })
        .await
        .expect("refresh");
    alice
        .get("get with a new JWT", "key2")
        .await
        .expect("get with a new JWT");
    let (oracle_token, candidate_token) = authenticate_both(&d, "alice", "alicepw").await;
    for token in [&oracle_token, &candidate_token] {
        let (_, payload) = jwt_parts(token).expect("a JWT");
        assert_eq!(
            payload["revision"].as_u64(),
            Some(revision + 1),
            "{payload}"
        );
    }
    cases(
        &mut d,
        None,
        &[
            As(ALICE, &["get", "key2"], Prints("v2")),
            // A JWT is checked by its signature: disabling authentication does not
            // invalidate it, and the new auth revision does.
            As(ROOT, &["auth", "disable"], Succeeds),
        ],
    )
    .await;
    let out = alice.get("get with a JWT after disabling", "key2").await;
    assert_grpc_error(&out, tonic::Code::Unknown, old_revision);
    cases(
        &mut d,
        None,
        &[
            Ctl(&["get", "key2"], Prints("v2")),
            Ctl(&["auth", "enable"], Succeeds),
        ],
    )
    .await;
    alice
        .rpc("refresh the JWT after re-enabling", |client| async move {
            client.refresh_token().await
        })
        .await
        .expect("refresh");
    alice
        .get("get with a JWT after re-enabling", "key2")
        .await
        .expect("get");
}

// ---------------------------------------------------------------------------
// Client certificates.
// ---------------------------------------------------------------------------

/// One https member with `--client-cert-auth`.
struct TlsMember {
    ip: Ipv4Addr,
    process: Process,
}

impl TlsMember {
    fn endpoint(&self) -> String {
        https_client_url(self.ip)
    }
}

/// The certificate test's files and servers.
struct CertSetup {
    dir: tempfile::TempDir,
    ca_file: PathBuf,
    oracle: TlsMember,
    candidate: TlsMember,
    candidate_binary: Binary,
}

impl CertSetup {
    /// A CA, a server certificate for both members' addresses, client
    /// certificates with the CNs `clients`, and the two members.
    async fn start(clients: &[&str]) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("etcd-it-auth-").tempdir()?;
        let ips = [allocate_ip()?, allocate_ip()?];
        let ca = Ca::new("etcd-it-auth-ca")?;
        let ca_file = ca.write_ca(dir.path(), "ca")?;
        let server = ca.peer(
            dir.path(),
            "server",
            &[
                ips[0].to_string(),
                ips[1].to_string(),
                "localhost".to_string(),
            ],
        )?;
        for cn in clients {
            ca.client(dir.path(), cn, cn)?;
        }
        let candidate_binary = Binary::candidate()?;
        let start = |binary: &Binary, name: &str, ip: Ipv4Addr| -> Result<TlsMember> {
            let peer = peer_url(ip);
            let token = format!("it-auth-{name}-{}", std::process::id());
            let mut flags = MemberFlags::new("m0", ip, dir.path(), &format!("m0={peer}"), &token);
            flags.data_dir = dir.path().join(format!("{name}.etcd"));
            flags.client_url = https_client_url(ip);
            let mut args = flags.args(&ClusterConfig::new(1));
            args.extend([
                format!("--cert-file={}", server.cert.display()),
                format!("--key-file={}", server.key.display()),
                format!("--trusted-ca-file={}", ca_file.display()),
                "--client-cert-auth".to_string(),
            ]);
            let log = dir.path().join(format!("{name}.log"));
            Ok(TlsMember {
                ip,
                process: Process::start(binary, name, &log, &args)?,
            })
        };
        let oracle = start(&Binary::etcd35()?, "oracle", ips[0])?;
        let candidate = start(&candidate_binary, "candidate", ips[1])?;
        let setup = Self {
            dir,
            ca_file,
            oracle,
            candidate,
            candidate_binary,
        };
        for member in [&setup.oracle, &setup.candidate] {
            setup.wait_ready(member).await?;
        }
        Ok(setup)
    }

    /// The certificate files of the client `cn`.
    fn identity(&self, cn: &str) -> CertFiles {
        CertFiles {
            cert: self.dir.path().join(format!("{cn}.crt")),
            key: self.dir.path().join(format!("{cn}.key")),
        }
    }

    /// An etcd-client to `member` presenting the certificate of `cn`.
    async fn client(&self, member: &TlsMember, cn: &str) -> Result<Client> {
        let tls = pki::tls_options(&self.ca_file, Some(&self.identity(cn)))?;
        connect_tls(&[member.endpoint()], tls).await
    }

    async fn wait_ready(&self, member: &TlsMember) -> Result<()> {
        retry_until("the https member to serve", TLS_STARTUP_TIMEOUT, || async {
            member.process.ensure_running()?;
            let mut client = self.client(member, "root").await?;
            check_serving(&mut client).await?;
            Ok(())
        })
        .await
        .with_context(|| member.process.log_tail())
    }

    /// etcdctl on both members presenting the certificate of `cn`.
    fn ctl(&self, cn: &str) -> CertCtl {
        let ctl = |member: &TlsMember| {
            Etcdctl::new(
                Binary::etcdctl35().expect("etcdctl 3.5"),
                vec![member.endpoint()],
            )
        };
        CertCtl {
            pair: CtlPair {
                oracle: ctl(&self.oracle),
                candidate: ctl(&self.candidate),
                candidate_binary: self.candidate_binary.clone(),
            },
            flags: pki::etcdctl_flags(&self.ca_file, Some(&self.identity(cn))),
        }
    }

    /// etcd-clients on both members presenting the certificate of `cn`.
    async fn clients(&self, cn: &str) -> UserClients {
        UserClients {
            oracle: self.client(&self.oracle, cn).await.expect("oracle client"),
            candidate: self
                .client(&self.candidate, cn)
                .await
                .expect("candidate client"),
            candidate_binary: self.candidate_binary.clone(),
        }
    }
}

/// etcdctl with one client certificate on both members.
struct CertCtl {
    pair: CtlPair,
    flags: Vec<String>,
}

impl CertCtl {
    async fn run(&self, args: &[&str]) -> CtlOutput {
        let mut all = arg_refs(&self.flags);
        all.extend_from_slice(args);
        self.pair.run(&all, &[]).await
    }
}

/// Servers with `--client-cert-auth`: a request without `--user` runs as
/// the user named by the client certificate's CN (alice: her permissions;
/// bob, a user without password: his; an unknown CN: nothing; root: user
/// management), and a token from `--user` wins over the certificate.
#[tokio::test]
async fn client_certificate_common_name_is_the_user() {
    let setup = CertSetup::start(&["root", "alice", "bob", "nobody"])
        .await
        .expect("starting the https servers");
    let root = setup.ctl("root");
    for args in [
        &["user", "add", ROOT][..],
        &["user", "add", ALICE],
        &["user", "add", "bob", "--no-password"],
        &["role", "add", "r"],
        &["role", "grant-permission", "r", "read", "key1"],
        &[
            "role",
            "grant-permission",
            "r",
            "readwrite",
            "--prefix",
            "dir/",
        ],
        &["user", "grant-role", "alice", "r"],
        &["user", "grant-role", "bob", "r"],
        &["put", "key1", "v1"],
        &["put", "key2", "v2"],
        &["auth", "enable"],
    ] {
        assert_ok(&root.run(args).await);
    }
    let denied = "etcdserver: permission denied";

    let alice = setup.ctl("alice");
    assert_stdout(&alice.run(&["get", "key1"]).await, "v1");
    assert_fails(&alice.run(&["get", "key2"]).await, denied);
    assert_stdout(&alice.run(&["put", "dir/a", "1"]).await, "OK");
    assert_fails(&alice.run(&["put", "key1", "no"]).await, denied);
    assert_stdout(&alice.run(&["user", "get", "alice"]).await, "Roles: r");
    assert_fails(&alice.run(&["user", "list"]).await, denied);
    assert_fails(&alice.run(&["user", "add", "x:y"]).await, denied);
    assert_fails(&alice.run(&["auth", "status"]).await, denied);
    // A token wins over the certificate.
    assert_stdout(
        &alice.run(&["get", "key2", &format!("--user={ROOT}")]).await,
        "v2",
    );

    let bob = setup.ctl("bob");
    assert_stdout(&bob.run(&["get", "key1"]).await, "v1");
    assert_fails(&bob.run(&["get", "key2"]).await, denied);

    let nobody = setup.ctl("nobody");
    let out = nobody.run(&["get", "key1"]).await;
    assert!(!out.success(), "an unknown CN may read:\n{out}");

    assert_stdout(&root.run(&["get", "key2"]).await, "v2");
    assert_stdout(
        &root.run(&["user", "add", "carol:carolpw"]).await,
        "User carol created",
    );
    assert_ok(&root.run(&["user", "list"]).await);
    assert_stdout(
        &root.run(&["auth", "status"]).await,
        "Authentication Status: true",
    );
    assert_fails(
        &root.run(&["get", "key2", &format!("--user={ALICE}")]).await,
        denied,
    );

    let clients = setup.clients("alice").await;
    clients
        .get("get as the certificate's user", "key1")
        .await
        .expect("get");
    let out = clients
        .get("denied get as the certificate's user", "key2")
        .await;
    assert_grpc_error(&out, tonic::Code::PermissionDenied, denied);
    let clients = setup.clients("root").await;
    clients
        .rpc(
            "user list as the root certificate",
            |mut client| async move { client.user_list().await },
        )
        .await
        .expect("user list");

    assert_ok(&root.run(&["auth", "disable"]).await);
    assert_stdout(&setup.ctl("nobody").run(&["get", "key2"]).await, "v2");
}
