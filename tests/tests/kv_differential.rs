//! Differential KV test: the candidate server against real etcd 3.5.
//!
//! Every test starts a fresh single-member reference etcd 3.5 (the oracle) and
//! a fresh single-member candidate (`STORE_BIN`, default: our release `store`),
//! then runs one long sequence of KV operations against both through
//! etcdctl 3.5 (plain and `-w json` output), etcdctl 3.4 and the etcd-client
//! crate. After normalizing instance-specific ids the outputs must be
//! identical: the oracle's output is the only expectation. Both servers start
//! empty and see the same operations in the same order, so revisions line up.
//!
//! Besides the comparison, each test checks a few facts on the oracle's
//! output (an error really happened, a revision really did not move) so that
//! a sequence that stopped exercising its target would fail instead of
//! passing vacuously.
//!
//! Run: `STORE_BIN=/opt/etcd-3.5/etcd cargo test -p integration-tests --test integration kv_differential::`

use etcd_client::{
    CompactionOptions, Compare, CompareOp, DeleteOptions, Error, GetOptions, GetResponse,
    LeaseGrantOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnResponse,
};
use integration_tests::differential::{
    assert_fails, assert_grpc_error, assert_ok, assert_stdout, differential,
};
use integration_tests::etcdctl::txn_script;
use integration_tests::process::status_bytes;
use integration_tests::Differential;

/// Fixed lease id (etcdctl prints it as hex `1234`), so both servers agree on it.
const LEASE_ID: i64 = 0x1234;
/// The same lease id as etcdctl spells it.
const LEASE_HEX: &str = "1234";
/// A lease id that is never granted.
const MISSING_LEASE_HEX: &str = "abcdef";
/// TTL of the test lease, in seconds: far longer than any test runs.
const LEASE_TTL_SECONDS: i64 = 3600;
/// A value just over etcd's default `--max-request-bytes` (1.5 MiB) but under
/// its gRPC receive limit (max-request-bytes + 512 KiB), so the server itself,
/// not the transport, must reject it.
const OVERSIZED_VALUE_BYTES: usize = 1_600_000;
/// A value that fits under the default request limit.
const LARGE_VALUE_BYTES: usize = 1_400_000;
/// etcd's default `--max-txn-ops`.
const MAX_TXN_OPS: usize = 128;

/// Sort targets and orders as etcdctl spells them.
const SORT_TARGETS: [&str; 5] = ["KEY", "CREATE", "MODIFY", "VERSION", "VALUE"];
const SORT_ORDERS: [&str; 2] = ["ASCEND", "DESCEND"];

/// The store's current revision, read (and compared) through etcdctl.
async fn revision(d: &mut Differential) -> i64 {
    let out = d.ctl(&["get", "revision-probe", "-w", "json"]).await;
    out.header_revision().expect("revision of a get")
}

/// Puts `pairs` in order through etcdctl, comparing every response.
async fn put_all(d: &mut Differential, pairs: &[(&str, &str)]) {
    for (key, value) in pairs {
        assert_ok(&d.ctl(&["put", key, value, "-w", "json"]).await);
    }
}

async fn client_get(
    d: &mut Differential,
    what: &str,
    key: &str,
    options: GetOptions,
) -> Result<GetResponse, Error> {
    let key = key.to_string();
    d.rpc(what, move |mut client| {
        let (key, options) = (key.clone(), options.clone());
        async move { client.get(key, Some(options)).await }
    })
    .await
}

async fn client_txn(d: &mut Differential, what: &str, txn: Txn) -> Result<TxnResponse, Error> {
    d.rpc(what, move |mut client| {
        let txn = txn.clone();
        async move { client.txn(txn).await }
    })
    .await
}

async fn grant_test_lease(d: &mut Differential) {
    d.rpc("lease grant with a fixed id", |mut client| async move {
        let options = LeaseGrantOptions::new().with_id(LEASE_ID);
        client.lease_grant(LEASE_TTL_SECONDS, Some(options)).await
    })
    .await
    .expect("granting the test lease");
}

#[tokio::test]
async fn put_variants() {
    let mut d = differential().await;
    assert_stdout(&d.ctl(&["put", "p/a", "1"]).await, "OK");
    assert_stdout(&d.ctl(&["put", "p/a", "2", "--prev-kv"]).await, "p/a\n1");
    assert_ok(&d.ctl(&["put", "p/a", "3", "--prev-kv", "-w", "json"]).await);
    assert_ok(&d.ctl(&["put", "p/b", "b1", "-w", "json"]).await);
    assert_ok(&d.ctl(&["put", "p/a", "--ignore-value"]).await);
    assert_ok(
        &d.ctl(&["put", "p/a", "--ignore-value", "--prev-kv", "-w", "json"])
            .await,
    );
    assert_fails(
        &d.ctl(&["put", "p/missing", "--ignore-value"]).await,
        "key not found",
    );
    assert_ok(&d.ctl(&["put", "p/a", "4", "--ignore-lease"]).await);
    assert_fails(
        &d.ctl(&["put", "p/missing", "v", "--ignore-lease"]).await,
        "key not found",
    );
    let lease = format!("--lease={MISSING_LEASE_HEX}");
    assert_fails(
        &d.ctl(&["put", "p/c", "v", &lease]).await,
        "requested lease not found",
    );
    assert_fails(&d.ctl(&["put", "", "v"]).await, "key is not provided");
    assert_ok(&d.ctl(&["get", "--prefix", "p/", "-w", "json"]).await);

    grant_test_lease(&mut d).await;
    let lease = format!("--lease={LEASE_HEX}");
    assert_ok(&d.ctl(&["put", "p/l", "l1", &lease, "-w", "json"]).await);
    assert_ok(
        &d.ctl(&[
            "put",
            "p/l",
            "l2",
            "--ignore-lease",
            "--prev-kv",
            "-w",
            "json",
        ])
        .await,
    );
    let leased = d.ctl(&["get", "p/l", "-w", "json"]).await;
    assert_stdout(&leased, &format!("\"lease\":{LEASE_ID}"));
    assert_ok(
        &d.ctl(&[
            "put",
            "p/l",
            "--ignore-value",
            "--ignore-lease",
            "-w",
            "json",
        ])
        .await,
    );
    assert_ok(&d.ctl(&["put", "p/l", "l3"]).await);
    let detached = d.ctl(&["get", "p/l", "-w", "json"]).await;
    assert!(!detached.stdout.contains("\"lease\""), "{detached}");
    assert_ok(&d.ctl(&["put", "p/l2", "x", &lease]).await);
    assert_ok(&d.ctl(&["put", "p/l3", "y", &lease]).await);
    let before_revoke = revision(&mut d).await;
    assert_stdout(&d.ctl(&["lease", "revoke", LEASE_HEX]).await, "revoked");
    assert_eq!(
        revision(&mut d).await,
        before_revoke + 1,
        "revoking deletes both keys in one revision"
    );
    assert_fails(
        &d.ctl(&["lease", "revoke", LEASE_HEX]).await,
        "requested lease not found",
    );
    assert_ok(&d.ctl(&["get", "--prefix", "p/l", "-w", "json"]).await);

    let prev = d
        .rpc("put with prev_kv", |mut client| async move {
            client
                .put("p/a", "5", Some(PutOptions::new().with_prev_key()))
                .await
        })
        .await
        .expect("put with prev_kv");
    assert!(prev.prev_key().is_some());
    let missing = d
        .rpc(
            "put ignore_value on a missing key",
            |mut client| async move {
                client
                    .put("p/none", "", Some(PutOptions::new().with_ignore_value()))
                    .await
            },
        )
        .await;
    assert_grpc_error(&missing, tonic::Code::InvalidArgument, "key not found");
    let empty = d
        .rpc("put with an empty key", |mut client| async move {
            client.put("", "v", None).await
        })
        .await;
    assert_grpc_error(&empty, tonic::Code::InvalidArgument, "key is not provided");
    d.rpc("put binary key and value", |mut client| async move {
        client
            .put(vec![b'p', b'/', 0, 0xff], vec![0u8, 1, 0xfe, 0xff], None)
            .await
    })
    .await
    .expect("binary put");
    assert_ok(&d.ctl(&["get", "--prefix", "p/", "--hex"]).await);
    assert_ok(&d.ctl(&["get", "--prefix", "p/", "-w", "json"]).await);
    assert_stdout(&d.ctl(&["endpoint", "status"]).await, "true, false");
    assert_ok(&d.ctl(&["endpoint", "status", "-w", "json"]).await);
    assert_stdout(&d.ctl(&["endpoint", "health"]).await, "is healthy");
    assert_ok(&d.ctl(&["endpoint", "health", "-w", "json"]).await);
}

/// Keys of the range/sort data set in a creation order unlike key order,
/// with distinct final values (not in key order) and distinct versions
/// (s/a 3, s/b 1, s/c 2, s/d 4, s/e 5), so every sort has a unique answer.
const SORT_DATA: [(&str, &str); 16] = [
    ("s/c", "c1"),
    ("s/e", "e1"),
    ("s/a", "a1"),
    ("s/d", "d1"),
    ("s/a", "a2"),
    ("s/b", "apple"),
    ("s/d", "d2"),
    ("s/e", "e2"),
    ("s/a", "mango"),
    ("s/d", "d3"),
    ("s/e", "e3"),
    ("s/c", "zebra"),
    ("s/d", "kiwi"),
    ("s/e", "e4"),
    ("s/e", "banana"),
    ("t/outside", "x"),
];

#[tokio::test]
async fn get_ranges_limits_and_revisions() {
    let mut d = differential().await;
    put_all(&mut d, &SORT_DATA).await;
    assert_stdout(&d.ctl(&["get", "s/a"]).await, "s/a\nmango");
    assert_ok(&d.ctl(&["get", "s/a", "-w", "json"]).await);
    assert_ok(&d.ctl(&["get", "s/zzz"]).await);
    assert_ok(&d.ctl(&["get", "s/zzz", "-w", "json"]).await);
    assert_ok(&d.ctl(&["get", "--prefix", "s/"]).await);
    assert_ok(&d.ctl(&["get", "--prefix", "s/", "-w", "json"]).await);
    assert_stdout(&d.ctl(&["get", "s/b", "s/d"]).await, "s/c");
    assert_ok(&d.ctl(&["get", "s/b", "s/d", "-w", "json"]).await);
    assert_ok(&d.ctl(&["get", "s/d", "s/b", "-w", "json"]).await);
    assert_stdout(&d.ctl(&["get", "--from-key", "s/c"]).await, "t/outside");
    assert_ok(&d.ctl(&["get", "--from-key", "", "-w", "json"]).await);
    assert_ok(&d.ctl(&["get", "--prefix", "", "--keys-only"]).await);
    let limited = d
        .ctl(&["get", "--prefix", "s/", "--limit", "2", "-w", "json"])
        .await;
    assert_stdout(&limited, "\"more\":true");
    assert_stdout(&limited, "\"count\":5");
    assert_ok(&d.ctl(&["get", "--prefix", "s/", "--limit", "2"]).await);
    assert_ok(
        &d.ctl(&["get", "--prefix", "s/", "--limit", "10", "-w", "json"])
            .await,
    );
    assert_ok(&d.ctl(&["get", "--prefix", "s/", "--keys-only"]).await);
    assert_ok(
        &d.ctl(&["get", "--prefix", "s/", "--keys-only", "-w", "json"])
            .await,
    );
    assert_stdout(
        &d.ctl(&["get", "--prefix", "s/", "--count-only", "-w", "fields"])
            .await,
        "\"Count\" : 5",
    );
    assert_fails(
        &d.ctl(&["get", "--prefix", "s/", "--count-only"]).await,
        "--count-only is only for",
    );
    assert_ok(
        &d.ctl(&["get", "--prefix", "s/", "--limit", "3", "-w", "fields"])
            .await,
    );
    assert_ok(
        &d.ctl(&["get", "--prefix", "s/", "--print-value-only"])
            .await,
    );
    assert_ok(&d.ctl(&["get", "--prefix", "s/", "--consistency=s"]).await);
    assert_ok(
        &d.ctl(&["get", "--prefix", "s/", "--consistency=s", "-w", "json"])
            .await,
    );
    assert_fails(&d.ctl(&["get", ""]).await, "key is not provided");

    // Historical reads: revision 2 is the first put, 6 the second put of s/a.
    for rev in ["1", "2", "4", "6", "9", "17"] {
        assert_ok(
            &d.ctl(&["get", "--prefix", "s/", "--rev", rev, "-w", "json"])
                .await,
        );
        assert_ok(&d.ctl(&["get", "s/a", "--rev", rev]).await);
    }
    assert_stdout(&d.ctl(&["get", "s/a", "--rev", "6"]).await, "a2");
    assert_ok(
        &d.ctl(&[
            "get", "--prefix", "s/", "--rev", "9", "--limit", "2", "-w", "json",
        ])
        .await,
    );
    assert_fails(
        &d.ctl(&["get", "s/a", "--rev", "1000"]).await,
        "required revision is a future revision",
    );
}

#[tokio::test]
async fn get_sorting() {
    let mut d = differential().await;
    put_all(&mut d, &SORT_DATA).await;
    for target in SORT_TARGETS {
        let sort = format!("--sort-by={target}");
        for order in SORT_ORDERS {
            let order = format!("--order={order}");
            assert_ok(&d.ctl(&["get", "--prefix", "s/", &sort, &order]).await);
            assert_ok(
                &d.ctl(&[
                    "get", "--prefix", "s/", &sort, &order, "--limit", "3", "-w", "json",
                ])
                .await,
            );
            assert_ok(
                &d.ctl(&[
                    "get",
                    "--prefix",
                    "s/",
                    &sort,
                    &order,
                    "--keys-only",
                    "--rev",
                    "16",
                ])
                .await,
            );
        }
        assert_ok(&d.ctl(&["get", "--prefix", "s/", &sort]).await);
    }
    assert_stdout(
        &d.ctl(&[
            "get",
            "--prefix",
            "s/",
            "--sort-by=VALUE",
            "--order=ASCEND",
            "--print-value-only",
        ])
        .await,
        "apple\nbanana\nkiwi\nmango\nzebra",
    );
    assert_ok(&d.ctl(&["get", "--prefix", "s/", "--order=DESCEND"]).await);
    assert_ok(
        &d.ctl(&[
            "get",
            "--from-key",
            "s/b",
            "--sort-by=CREATE",
            "--order=DESCEND",
            "--limit",
            "4",
        ])
        .await,
    );
}

#[tokio::test]
async fn client_range_filters() {
    let mut d = differential().await;
    put_all(&mut d, &SORT_DATA).await;
    let prefix = || GetOptions::new().with_prefix();
    let cases = [
        ("min_mod_revision", prefix().with_min_mod_revision(10)),
        ("max_mod_revision", prefix().with_max_mod_revision(13)),
        (
            "min and max mod_revision",
            prefix().with_min_mod_revision(8).with_max_mod_revision(14),
        ),
        ("min_create_revision", prefix().with_min_create_revision(4)),
        ("max_create_revision", prefix().with_max_create_revision(4)),
        (
            "create window",
            prefix()
                .with_min_create_revision(3)
                .with_max_create_revision(5),
        ),
        (
            "filters with limit",
            prefix().with_min_mod_revision(10).with_limit(2),
        ),
        (
            "filters with count_only",
            prefix().with_min_create_revision(4).with_count_only(),
        ),
        (
            "filters with keys_only",
            prefix().with_max_mod_revision(13).with_keys_only(),
        ),
        (
            "filters at a past revision",
            prefix().with_min_mod_revision(5).with_revision(11),
        ),
        (
            "filters with sort",
            prefix()
                .with_min_mod_revision(8)
                .with_sort(SortTarget::Mod, SortOrder::Descend),
        ),
        (
            "sort by version, limited",
            prefix()
                .with_sort(SortTarget::Version, SortOrder::Ascend)
                .with_limit(3),
        ),
        (
            "sort by value descending",
            prefix().with_sort(SortTarget::Value, SortOrder::Descend),
        ),
        (
            "sort target without order",
            prefix().with_sort(SortTarget::Create, SortOrder::None),
        ),
        (
            "sort target without order, limited",
            prefix()
                .with_sort(SortTarget::Value, SortOrder::None)
                .with_limit(2),
        ),
        (
            "key descending, limited",
            prefix()
                .with_sort(SortTarget::Key, SortOrder::Descend)
                .with_limit(2),
        ),
        (
            "range ending below every key",
            GetOptions::new().with_range("s/a"),
        ),
        ("serializable", prefix().with_serializable()),
        ("count_only", prefix().with_count_only()),
        ("explicit range", GetOptions::new().with_range("s/d")),
        ("from_key", GetOptions::new().with_from_key()),
        (
            "all keys",
            GetOptions::new().with_all_keys().with_keys_only(),
        ),
    ];
    for (what, options) in cases {
        let response = client_get(&mut d, what, "s/", options).await.expect(what);
        assert!(response.header().is_some(), "{what}: {response:?}");
    }
    let filtered = client_get(
        &mut d,
        "min_mod_revision count",
        "s/",
        prefix().with_min_mod_revision(14),
    )
    .await
    .expect("filtered get");
    assert_eq!(
        filtered.kvs().len(),
        2,
        "s/d and s/e were modified at or after 14: {filtered:?}"
    );
    let compacted_future = client_get(
        &mut d,
        "future revision",
        "s/a",
        GetOptions::new().with_revision(1000),
    )
    .await;
    assert_grpc_error(
        &compacted_future,
        tonic::Code::OutOfRange,
        "future revision",
    );
}

#[tokio::test]
async fn deletes() {
    let mut d = differential().await;
    let keys = [
        "d/a", "d/b", "d/c", "d/d", "d/e", "d/f", "e/1", "e/2", "f/1", "g/1",
    ];
    for key in keys {
        assert_ok(&d.ctl(&["put", key, &format!("v-{key}")]).await);
    }
    assert_stdout(&d.ctl(&["del", "d/a"]).await, "1");
    assert_stdout(&d.ctl(&["del", "d/a"]).await, "0");
    assert_ok(&d.ctl(&["del", "d/a", "-w", "json"]).await);
    assert_stdout(&d.ctl(&["del", "d/b", "--prev-kv"]).await, "v-d/b");
    assert_ok(&d.ctl(&["del", "d/c", "--prev-kv", "-w", "json"]).await);
    assert_stdout(&d.ctl(&["del", "d/d", "d/f", "--prev-kv"]).await, "2\nd/d");
    assert_ok(&d.ctl(&["del", "--prefix", "e/", "-w", "json"]).await);
    assert_ok(
        &d.ctl(&["del", "--from-key", "f/", "--prev-kv", "-w", "json"])
            .await,
    );
    assert_fails(&d.ctl(&["del", ""]).await, "key is not provided");
    assert_ok(&d.ctl(&["get", "--from-key", "", "-w", "json"]).await);
    assert_ok(
        &d.ctl(&["get", "--prefix", "d/", "--rev", "5", "-w", "json"])
            .await,
    );
    assert_ok(&d.ctl(&["put", "d/a", "again", "-w", "json"]).await);
    assert_ok(&d.ctl(&["get", "d/a", "-w", "json"]).await);

    for key in ["h/1", "h/2", "h/3", "i/1"] {
        assert_ok(&d.ctl(&["put", key, "h"]).await);
    }
    let deleted = d
        .rpc("delete range with prev_kv", |mut client| async move {
            let options = DeleteOptions::new().with_range("h/3").with_prev_key();
            client.delete("h/1", Some(options)).await
        })
        .await
        .expect("range delete");
    assert_eq!(deleted.deleted(), 2);
    d.rpc("delete a missing key", |mut client| async move {
        client.delete("nothing", None).await
    })
    .await
    .expect("missing delete");
    let empty = d
        .rpc("delete with an empty key", |mut client| async move {
            client.delete("", None).await
        })
        .await;
    assert_grpc_error(&empty, tonic::Code::InvalidArgument, "key is not provided");
    d.rpc("delete all keys", |mut client| async move {
        client
            .delete(
                "",
                Some(DeleteOptions::new().with_all_keys().with_prev_key()),
            )
            .await
    })
    .await
    .expect("delete all");
    assert_stdout(
        &d.ctl(&["get", "--from-key", "", "--count-only", "-w", "fields"])
            .await,
        "\"Count\" : 0",
    );
}

#[tokio::test]
async fn etcdctl_txn() {
    let mut d = differential().await;
    put_all(&mut d, &[("t/a", "1"), ("t/b", "2"), ("t/gone", "x")]).await;
    grant_test_lease(&mut d).await;
    assert_ok(
        &d.ctl(&["put", "t/l", "leased", &format!("--lease={LEASE_HEX}")])
            .await,
    );
    // etcdctl 3.5.1 cannot parse lease("key") compares (it panics on its own
    // parsing), so lease compares are covered through etcd-client below.
    let all_true = [
        r#"val("t/a") = "1""#,
        r#"ver("t/b") = "1""#,
        r#"c("t/a") > "0""#,
        r#"m("t/b") < "1000""#,
        r#"ver("t/missing") = "0""#,
        r#"val("t/b") != "3""#,
    ];
    let success = [
        "put t/a 11",
        "get t/b",
        "del t/gone",
        "get t/ --prefix --keys-only",
    ];
    let out = d
        .ctl_stdin(&["txn"], &txn_script(&all_true, &success, &["put t/f 1"]))
        .await;
    assert_stdout(&out, "SUCCESS");
    let out = d
        .ctl_stdin(
            &["txn", "-w", "json"],
            &txn_script(&all_true[1..], &["put t/c 3"], &["put t/f 1"]),
        )
        .await;
    assert_stdout(&out, "\"succeeded\":true");

    let failing = [r#"val("t/a") = "nope""#, r#"ver("t/b") = "1""#];
    let out = d
        .ctl_stdin(
            &["txn"],
            &txn_script(&failing, &["put t/x 1"], &["put t/f 1", "get t/a"]),
        )
        .await;
    assert_stdout(&out, "FAILURE");
    let out = d
        .ctl_stdin(
            &["txn", "-w", "json"],
            &txn_script(&[r#"m("t/a") < "2""#], &[], &["get t/a", "get t/f"]),
        )
        .await;
    assert_ok(&out);
    assert_ok(
        &d.ctl_stdin(&["txn"], &txn_script(&[], &["put t/e 1", "get t/e"], &[]))
            .await,
    );
    assert_ok(
        &d.ctl_stdin(
            &["txn", "-w", "json"],
            &txn_script(&[r#"c("t/e") > "0""#], &["del t/ --prefix --prev-kv"], &[]),
        )
        .await,
    );

    // Read-only and failed transactions do not create a revision.
    put_all(&mut d, &[("t/r", "1")]).await;
    let before = revision(&mut d).await;
    let read_only = d
        .ctl_stdin(
            &["txn", "-w", "json"],
            &txn_script(
                &[r#"ver("t/r") = "1""#],
                &["get t/r", "get t/ --prefix"],
                &[],
            ),
        )
        .await;
    assert_eq!(read_only.header_revision().unwrap(), before, "{read_only}");
    let failed = d
        .ctl_stdin(
            &["txn", "-w", "json"],
            &txn_script(&[r#"ver("t/r") = "9""#], &["put t/r 2"], &[]),
        )
        .await;
    assert_eq!(failed.header_revision().unwrap(), before, "{failed}");
    let failed_get = d
        .ctl_stdin(
            &["txn", "-w", "json"],
            &txn_script(&[r#"ver("t/r") = "9""#], &["put t/r 2"], &["get t/r"]),
        )
        .await;
    assert_eq!(
        failed_get.header_revision().unwrap(),
        before,
        "{failed_get}"
    );
    assert_eq!(revision(&mut d).await, before);
    let multi = d
        .ctl_stdin(
            &["txn", "-w", "json"],
            &txn_script(&[], &["put t/m1 1", "put t/m2 2", "del t/r"], &[]),
        )
        .await;
    assert_eq!(
        multi.header_revision().unwrap(),
        before + 1,
        "one revision per txn: {multi}"
    );
    assert_ok(&d.ctl(&["get", "--prefix", "t/m", "-w", "json"]).await);

    // Limits: at most 128 operations, no key written twice.
    let max_ops: Vec<String> = (0..MAX_TXN_OPS)
        .map(|i| format!("put t/op{i:03} v"))
        .collect();
    let max_ops: Vec<&str> = max_ops.iter().map(String::as_str).collect();
    assert_stdout(
        &d.ctl_stdin(&["txn"], &txn_script(&[], &max_ops, &[])).await,
        "SUCCESS",
    );
    let too_many: Vec<String> = (0..=MAX_TXN_OPS)
        .map(|i| format!("put t/op{i:03} w"))
        .collect();
    let too_many: Vec<&str> = too_many.iter().map(String::as_str).collect();
    let out = d
        .ctl_stdin(&["txn"], &txn_script(&[], &too_many, &[]))
        .await;
    assert_fails(&out, "too many operations in txn request");
    let out = d
        .ctl_stdin(
            &["txn"],
            &txn_script(&[], &["put t/dup 1", "put t/dup 2"], &[]),
        )
        .await;
    assert_fails(&out, "duplicate key given in txn request");
    let out = d
        .ctl_stdin(
            &["txn"],
            &txn_script(&[], &["put t/op001 1", "del t/op --prefix"], &[]),
        )
        .await;
    assert_fails(&out, "duplicate key given in txn request");
    let out = d
        .ctl_stdin(
            &["txn"],
            &txn_script(&[], &["put t/dup 1"], &["put t/dup 1", "put t/dup 2"]),
        )
        .await;
    assert_fails(&out, "duplicate key given in txn request");
    let out = d
        .ctl_stdin(
            &["txn"],
            &txn_script(&[], &["put t/dup 1", "get t/dup", "get t/dup"], &[]),
        )
        .await;
    assert_stdout(&out, "SUCCESS");
    assert_fails(
        &d.ctl_stdin(&["txn"], &txn_script(&[], &["put \"\" 1"], &[]))
            .await,
        "key is not provided",
    );
}

#[tokio::test]
async fn client_txn_compares_and_nesting() {
    let mut d = differential().await;
    put_all(&mut d, &[("n/a", "1"), ("n/b", "2"), ("n/c", "3")]).await;
    grant_test_lease(&mut d).await;
    d.rpc("put with lease", |mut client| async move {
        client
            .put(
                "n/l",
                "leased",
                Some(PutOptions::new().with_lease(LEASE_ID)),
            )
            .await
    })
    .await
    .expect("leased put");

    let compares = [
        ("value equal", Compare::value("n/a", CompareOp::Equal, "1")),
        (
            "value greater",
            Compare::value("n/a", CompareOp::Greater, "0"),
        ),
        ("value less", Compare::value("n/a", CompareOp::Less, "0")),
        (
            "value not equal",
            Compare::value("n/a", CompareOp::NotEqual, "1"),
        ),
        (
            "version greater",
            Compare::version("n/b", CompareOp::Greater, 0),
        ),
        (
            "version of missing key",
            Compare::version("n/none", CompareOp::Equal, 0),
        ),
        (
            "create revision less",
            Compare::create_revision("n/c", CompareOp::Less, 4),
        ),
        (
            "create revision not equal",
            Compare::create_revision("n/c", CompareOp::NotEqual, 4),
        ),
        (
            "mod revision equal",
            Compare::mod_revision("n/b", CompareOp::Equal, 3),
        ),
        (
            "mod revision greater",
            Compare::mod_revision("n/b", CompareOp::Greater, 3),
        ),
        (
            "lease equal",
            Compare::lease("n/l", CompareOp::Equal, LEASE_ID),
        ),
        (
            "lease of unleased key",
            Compare::lease("n/a", CompareOp::Equal, 0),
        ),
        (
            "value of missing key",
            Compare::value("n/none", CompareOp::Equal, ""),
        ),
        (
            "range compare",
            Compare::version("n/", CompareOp::Greater, 0).with_prefix(),
        ),
        (
            "range compare failing",
            Compare::value("n/", CompareOp::Equal, "1").with_prefix(),
        ),
        (
            "range compare with end",
            Compare::create_revision("n/a", CompareOp::Less, 5).with_range("n/c"),
        ),
    ];
    for (what, compare) in compares {
        let before = revision(&mut d).await;
        let txn = Txn::new()
            .when([compare])
            .and_then([TxnOp::get("n/a", None)])
            .or_else([TxnOp::get("n/b", None)]);
        let response = client_txn(&mut d, what, txn).await.expect(what);
        let header = response.header().expect("txn header");
        assert_eq!(
            header.revision(),
            before,
            "{what}: a read-only txn must not bump the revision"
        );
    }

    let inner = Txn::new()
        .when([Compare::value("n/a", CompareOp::Equal, "1")])
        .and_then([
            TxnOp::put("n/inner", "yes", None),
            TxnOp::get("n/", Some(GetOptions::new().with_prefix().with_keys_only())),
        ])
        .or_else([TxnOp::put("n/inner", "no", None)]);
    let failing_inner = Txn::new()
        .when([Compare::version("n/b", CompareOp::Equal, 7)])
        .and_then([TxnOp::delete("n/b", None)])
        .or_else([
            TxnOp::get("n/b", None),
            TxnOp::delete("n/c", Some(DeleteOptions::new().with_prev_key())),
        ]);
    let outer = Txn::new()
        .when([Compare::version("n/a", CompareOp::Greater, 0)])
        .and_then([
            TxnOp::txn(inner.clone()),
            TxnOp::txn(failing_inner),
            TxnOp::put("n/outer", "1", Some(PutOptions::new().with_prev_key())),
        ])
        .or_else([TxnOp::put("n/never", "1", None)]);
    let before = revision(&mut d).await;
    let nested = client_txn(&mut d, "nested txn", outer)
        .await
        .expect("nested txn");
    assert!(nested.succeeded());
    assert_eq!(nested.header().expect("header").revision(), before + 1);
    let duplicate_nested =
        Txn::new().and_then([TxnOp::put("n/inner", "x", None), TxnOp::txn(inner)]);
    let out = client_txn(&mut d, "duplicate key across nesting", duplicate_nested).await;
    assert_grpc_error(
        &out,
        tonic::Code::InvalidArgument,
        "duplicate key given in txn request",
    );
    let too_many = Txn::new().and_then(
        (0..=MAX_TXN_OPS)
            .map(|i| TxnOp::put(format!("n/op{i}"), "v", None))
            .collect::<Vec<_>>(),
    );
    let out = client_txn(&mut d, "129 operations", too_many).await;
    assert_grpc_error(
        &out,
        tonic::Code::InvalidArgument,
        "too many operations in txn request",
    );
    let out = client_txn(
        &mut d,
        "get at a future revision in txn",
        Txn::new().and_then([TxnOp::get(
            "n/a",
            Some(GetOptions::new().with_revision(1000)),
        )]),
    )
    .await;
    assert_grpc_error(&out, tonic::Code::OutOfRange, "future revision");
    client_txn(&mut d, "empty txn", Txn::new())
        .await
        .expect("empty txn");
    assert_ok(&d.ctl(&["get", "--prefix", "n/", "-w", "json"]).await);
}

#[tokio::test]
async fn compaction() {
    let mut d = differential().await;
    for i in 0..10 {
        assert_ok(&d.ctl(&["put", "c/k", &format!("v{i}")]).await);
        assert_ok(&d.ctl(&["put", &format!("c/{i}"), "x"]).await);
    }
    // Revisions 2..=21: c/k gets the even ones.
    assert_stdout(&d.ctl(&["compact", "6"]).await, "compacted revision 6");
    assert_fails(
        &d.ctl(&["get", "c/k", "--rev", "5"]).await,
        "required revision has been compacted",
    );
    assert_ok(&d.ctl(&["get", "c/k", "--rev", "6", "-w", "json"]).await);
    assert_ok(
        &d.ctl(&["get", "--prefix", "c/", "--rev", "7", "-w", "json"])
            .await,
    );
    assert_fails(
        &d.ctl(&["get", "c/k", "--rev", "100"]).await,
        "required revision is a future revision",
    );
    assert_fails(
        &d.ctl(&["compact", "6"]).await,
        "required revision has been compacted",
    );
    assert_fails(
        &d.ctl(&["compact", "3"]).await,
        "required revision has been compacted",
    );
    assert_fails(
        &d.ctl(&["compact", "100"]).await,
        "required revision is a future revision",
    );
    assert_stdout(
        &d.ctl(&["compact", "10", "--physical"]).await,
        "compacted revision 10",
    );
    assert_fails(
        &d.ctl(&["get", "--prefix", "c/", "--rev", "9", "-w", "json"])
            .await,
        "has been compacted",
    );
    assert_ok(
        &d.ctl(&["get", "--prefix", "c/", "--rev", "10", "-w", "json"])
            .await,
    );
    assert_ok(&d.ctl(&["get", "--prefix", "c/", "-w", "json"]).await);
    assert_ok(&d.ctl(&["put", "c/k", "after", "-w", "json"]).await);

    let compacted = client_get(
        &mut d,
        "get at a compacted revision",
        "c/k",
        GetOptions::new().with_revision(4),
    )
    .await;
    assert_grpc_error(
        &compacted,
        tonic::Code::OutOfRange,
        "required revision has been compacted",
    );
    let txn = Txn::new().and_then([TxnOp::get("c/k", Some(GetOptions::new().with_revision(4)))]);
    let out = client_txn(&mut d, "txn get at a compacted revision", txn).await;
    assert_grpc_error(
        &out,
        tonic::Code::OutOfRange,
        "required revision has been compacted",
    );
    d.rpc("physical compaction", |mut client| async move {
        client
            .compact(15, Some(CompactionOptions::new().with_physical()))
            .await
    })
    .await
    .expect("compact 15");
    let again = d
        .rpc(
            "compaction at the compacted revision",
            |mut client| async move { client.compact(15, None).await },
        )
        .await;
    assert_grpc_error(
        &again,
        tonic::Code::OutOfRange,
        "required revision has been compacted",
    );
    let future = d
        .rpc("compaction at a future revision", |mut client| async move {
            client.compact(1000, None).await
        })
        .await;
    assert_grpc_error(
        &future,
        tonic::Code::OutOfRange,
        "required revision is a future revision",
    );
    assert_ok(
        &d.ctl(&[
            "get",
            "--prefix",
            "c/",
            "--rev",
            "15",
            "--sort-by=MODIFY",
            "-w",
            "json",
        ])
        .await,
    );
}

#[tokio::test]
async fn request_size_limit() {
    let mut d = differential().await;
    let oversized = vec![b'x'; OVERSIZED_VALUE_BYTES];
    let out = d.ctl_stdin(&["put", "big/over"], &oversized).await;
    assert_fails(&out, "request is too large");
    let result = d
        .rpc("oversized put", |mut client| {
            let value = oversized.clone();
            async move { client.put("big/over", value, None).await }
        })
        .await;
    assert_grpc_error(
        &result,
        tonic::Code::InvalidArgument,
        "etcdserver: request is too large",
    );
    let txn = Txn::new().and_then([TxnOp::put("big/txn", oversized.clone(), None)]);
    let out = client_txn(&mut d, "oversized txn", txn).await;
    assert_grpc_error(
        &out,
        tonic::Code::InvalidArgument,
        "etcdserver: request is too large",
    );

    let large = vec![b'y'; LARGE_VALUE_BYTES];
    assert_ok(
        &d.ctl_stdin(&["put", "big/fits", "-w", "json"], &large)
            .await,
    );
    assert_stdout(
        &d.ctl(&["get", "big/", "--prefix", "--keys-only"]).await,
        "big/fits",
    );
    let fetched = client_get(&mut d, "large value", "big/fits", GetOptions::new())
        .await
        .expect("get large");
    assert_eq!(fetched.kvs()[0].value().len(), LARGE_VALUE_BYTES);
}

#[tokio::test]
async fn etcdctl34_subset() {
    let mut d = differential().await;
    assert_stdout(&d.ctl34(&["put", "v34/a", "1"]).await, "OK");
    assert_ok(
        &d.ctl34(&["put", "v34/a", "2", "--prev-kv", "-w", "json"])
            .await,
    );
    assert_ok(&d.ctl34(&["put", "v34/b", "3"]).await);
    assert_ok(&d.ctl34(&["put", "v34/c", "0"]).await);
    assert_fails(&d.ctl34(&["put", "", "1"]).await, "key is not provided");
    assert_ok(&d.ctl34(&["get", "v34/a", "-w", "json"]).await);
    assert_ok(
        &d.ctl34(&[
            "get",
            "--prefix",
            "v34/",
            "--sort-by=VALUE",
            "--order=DESCEND",
        ])
        .await,
    );
    assert_ok(
        &d.ctl34(&["get", "--prefix", "v34/", "--limit", "1", "-w", "json"])
            .await,
    );
    assert_ok(&d.ctl34(&["get", "v34/a", "--rev", "2"]).await);
    assert_ok(
        &d.ctl34(&["get", "--from-key", "v34/b", "--keys-only"])
            .await,
    );
    let script = txn_script(
        &[r#"val("v34/a") = "2""#],
        &["put v34/t 1", "get v34/a"],
        &["put v34/f 1"],
    );
    assert_stdout(&d.ctl34_stdin(&["txn"], &script).await, "SUCCESS");
    assert_stdout(
        &d.ctl34_stdin(&["txn", "-w", "json"], &script).await,
        "\"succeeded\":true",
    );
    let script = txn_script(&[], &["put v34/d 1", "put v34/d 2"], &[]);
    assert_fails(&d.ctl34_stdin(&["txn"], &script).await, "duplicate key");
    assert_stdout(&d.ctl34(&["del", "v34/b", "--prev-kv"]).await, "v34/b");
    assert_ok(&d.ctl34(&["del", "--prefix", "v34/", "-w", "json"]).await);
    assert_stdout(&d.ctl34(&["compact", "3"]).await, "compacted revision 3");
    assert_fails(
        &d.ctl34(&["get", "v34/a", "--rev", "2"]).await,
        "required revision has been compacted",
    );
    assert_ok(&d.ctl34(&["get", "--from-key", "", "-w", "json"]).await);
}

/// A value over etcd's gRPC receive limit (`--max-request-bytes` 1.5 MiB +
/// 512 KiB): refused by the transport, as grpc-go refuses it.
const OVER_TRANSPORT_LIMIT_BYTES: usize = 3 * 1024 * 1024;
/// Messages far over the limit sent at once to the candidate.
const HUGE_VALUE_BYTES: usize = 48 * 1024 * 1024;
const HUGE_CONCURRENT_PUTS: usize = 16;
/// How much the candidate's peak memory may grow while refusing them (they
/// add up to 768 MiB; refused on their headers, none is buffered).
const HUGE_PUTS_MAX_GROWTH_BYTES: u64 = 256 * 1024 * 1024;

/// Messages over the transport limit get grpc-go's `ResourceExhausted`
/// text from both; the candidate refuses them on their length prefix, so
/// many concurrent huge puts do not grow its memory by their size, and
/// writes still flow afterwards.
#[tokio::test]
async fn transport_limit_refuses_before_buffering() {
    let mut d = differential().await;
    let over = vec![b'x'; OVER_TRANSPORT_LIMIT_BYTES];
    let result = d
        .rpc("put over the transport limit", |mut client| {
            let value = over.clone();
            async move { client.put("big/huge", value, None).await }
        })
        .await;
    let err = result.expect_err("refused");
    assert!(
        integration_tests::client::describe_error(&err)
            .contains("grpc: received message larger than max ("),
        "{err}"
    );
    let pid = d.candidate.cluster.pid(0).expect("candidate pid");
    let before = status_bytes(pid, "VmHWM:").expect("VmHWM");
    let huge = std::sync::Arc::new(vec![b'h'; HUGE_VALUE_BYTES]);
    let mut puts = tokio::task::JoinSet::new();
    for i in 0..HUGE_CONCURRENT_PUTS {
        let mut client = d.candidate.client.clone();
        let value = huge.clone();
        puts.spawn(async move { client.put(format!("big/h{i}"), value.to_vec(), None).await });
    }
    for r in puts.join_all().await {
        assert_eq!(
            r.as_ref()
                .err()
                .and_then(integration_tests::client::grpc_code),
            Some(tonic::Code::ResourceExhausted),
            "{r:?}"
        );
    }
    let grown = status_bytes(pid, "VmHWM:")
        .expect("VmHWM")
        .saturating_sub(before);
    assert!(
        grown < HUGE_PUTS_MAX_GROWTH_BYTES,
        "peak memory grew by {grown} bytes refusing {HUGE_CONCURRENT_PUTS} puts of {HUGE_VALUE_BYTES} bytes"
    );
    d.rpc("put after", |mut client| async move {
        client.put("big/after", "v", None).await.map(|_| ())
    })
    .await
    .expect("writes flow after the refusals");
}
