//! etcd's HTTP/JSON gateway (`POST /v3/...`), differential: every request
//! goes to etcd 3.5.1 and to the candidate through curl, and the status
//! line, content type and JSON body must be the same after masking what
//! differs per server (ids, terms, raft indexes, sizes, tokens, addresses).
//! Then the Python client etcd3gw runs its own operations against both.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use integration_tests::differential::Differential;
use integration_tests::wait::retry_until;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Values that differ between two servers in every answer.
const ALWAYS_MASKED: [&str; 3] = ["cluster_id", "member_id", "raft_term"];
/// How long one curl request may take.
const CURL_TIMEOUT_S: &str = "10";
/// How long a watch stream may take to show a line.
const LINE_TIMEOUT: Duration = Duration::from_secs(10);
/// Where setup.sh installs etcd3gw's virtualenv (`ETCD3GW_VENV` there and
/// here overrides it).
const ETCD3GW_VENV: &str = "/opt/etcd3gw-venv";
/// Separates curl's body from the status and content type it appends.
const TRAILER: &str = "\n@@curl@@";

/// What one HTTP request got back.
#[derive(Debug, PartialEq)]
struct Answer {
    status: u16,
    content_type: String,
    /// The body as JSON with masked values, or as text when not JSON.
    body: String,
}

/// One request: method, path, body, and the token to send (a side's own).
struct Call<'a> {
    method: &'a str,
    path: &'a str,
    body: &'a str,
    token: Option<&'a str>,
}

fn post<'a>(path: &'a str, body: &'a str) -> Call<'a> {
    Call {
        method: "POST",
        path,
        body,
        token: None,
    }
}

async fn curl(endpoint: &str, call: &Call<'_>, masks: &[&str]) -> Result<Answer> {
    // Large bodies go through a file (one argument may not exceed 128 KiB).
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), call.body)?;
    let data = format!("@{}", file.path().display());
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-S", "--max-time", CURL_TIMEOUT_S, "-X", call.method])
        .args(["--data-binary", &data])
        .args(["-w", &format!("{TRAILER}%{{http_code}} %{{content_type}}")]);
    if let Some(token) = call.token {
        cmd.args(["-H", &format!("Authorization: {token}")]);
    }
    let out = cmd
        .arg(format!("{endpoint}{}", call.path))
        .output()
        .await
        .context("running curl")?;
    let text = String::from_utf8(out.stdout)?;
    let (body, trailer) = text.rsplit_once(TRAILER).context("curl trailer")?;
    let (status, content_type) = trailer.split_once(' ').context("curl status")?;
    Ok(Answer {
        status: status.parse()?,
        content_type: content_type.to_string(),
        body: masked(body, masks),
    })
}

/// `body` with the values of `masks` (and [`ALWAYS_MASKED`]) replaced, when
/// it is JSON.
fn masked(body: &str, masks: &[&str]) -> String {
    if let Ok(mut value) = serde_json::from_str::<Value>(body) {
        mask(&mut value, masks);
        return value.to_string();
    }
    // A stream: one JSON value per line.
    let lines: Option<Vec<String>> = body
        .lines()
        .map(|line| {
            let mut value = serde_json::from_str::<Value>(line).ok()?;
            mask(&mut value, masks);
            Some(value.to_string())
        })
        .collect();
    match lines {
        Some(lines) if !lines.is_empty() => lines.join("\n"),
        _ => body.to_string(),
    }
}

fn mask(value: &mut Value, masks: &[&str]) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if ALWAYS_MASKED.contains(&key.as_str()) || masks.contains(&key.as_str()) {
                    *v = Value::String(format!("<{key}>"));
                } else {
                    mask(v, masks);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| mask(v, masks)),
        _ => {}
    }
}

/// The two servers' client URLs.
struct Pair {
    oracle: String,
    candidate: String,
    steps: usize,
}

impl Pair {
    fn new(d: &Differential) -> Self {
        Pair {
            oracle: d.oracle.cluster.endpoint(0),
            candidate: d.candidate.cluster.endpoint(0),
            steps: 0,
        }
    }

    /// Sends `call` to both; panics unless the answers are the same.
    /// Returns the oracle's.
    async fn same(&mut self, call: Call<'_>, masks: &[&str]) -> Answer {
        self.same_tokens(call, None, masks).await
    }

    /// Like [`Self::same`], with each side's own token.
    async fn same_tokens(
        &mut self,
        call: Call<'_>,
        tokens: Option<(&str, &str)>,
        masks: &[&str],
    ) -> Answer {
        self.steps += 1;
        let oracle_call = Call {
            token: tokens.map(|t| t.0),
            ..call
        };
        let expected = curl(&self.oracle, &oracle_call, masks).await.unwrap();
        let candidate_call = Call {
            token: tokens.map(|t| t.1),
            ..oracle_call
        };
        let actual = curl(&self.candidate, &candidate_call, masks).await.unwrap();
        assert_eq!(
            expected, actual,
            "step {}: {} {} {}",
            self.steps, candidate_call.method, candidate_call.path, candidate_call.body
        );
        expected
    }

    /// A token of `user` on each side.
    async fn tokens(&mut self, user: &str, password: &str) -> (String, String) {
        let body = format!(r#"{{"name":"{user}","password":"{password}"}}"#);
        let call = post("/v3/auth/authenticate", &body);
        let one = |endpoint: String| {
            let call = Call {
                ..post(call.path, call.body)
            };
            async move {
                let answer = curl(&endpoint, &call, &[]).await.unwrap();
                let v: Value = serde_json::from_str(&answer.body).unwrap();
                v["token"].as_str().expect("a token").to_string()
            }
        };
        (
            one(self.oracle.clone()).await,
            one(self.candidate.clone()).await,
        )
    }
}

fn status(answer: &Answer) -> u16 {
    answer.status
}

#[tokio::test]
async fn kv_methods_and_errors() -> Result<()> {
    let d = Differential::start().await?;
    let mut p = Pair::new(&d);
    let put = p
        .same(post("/v3/kv/put", r#"{"key":"Zm9v","value":"YmFy"}"#), &[])
        .await;
    assert_eq!(status(&put), 200);
    p.same(post("/v3/kv/range", r#"{"key":"Zm9v"}"#), &[]).await;
    p.same(post("/v3beta/kv/range", r#"{"key":"Zm9v"}"#), &[])
        .await;
    p.same(
        post(
            "/v3/kv/range",
            r#"{"key":"Zm9v","serializable":true,"zzz":1}"#,
        ),
        &[],
    )
    .await;
    p.same(
        post(
            "/v3/kv/put",
            r#"{"key":"YQ==","value":"MQ==","prev_kv":true}"#,
        ),
        &[],
    )
    .await;
    p.same(
        post(
            "/v3/kv/put",
            r#"{"key":"YQ==","value":"Mg==","prev_kv":true}"#,
        ),
        &[],
    )
    .await;
    let all = r#"{"key":"AA==","range_end":"AA==","sort_order":"DESCEND","sort_target":"MOD"}"#;
    p.same(post("/v3/kv/range", all), &[]).await;
    let keys = r#"{"key":"AA==","range_end":"AA==","keys_only":true,"limit":"1"}"#;
    p.same(post("/v3/kv/range", keys), &[]).await;
    p.same(
        post(
            "/v3/kv/range",
            r#"{"key":"AA==","range_end":"AA==","count_only":true}"#,
        ),
        &[],
    )
    .await;
    let txn = r#"{"compare":[{"key":"Zm9v","target":"VALUE","result":"EQUAL","value":"YmFy"}],
        "success":[{"request_range":{"key":"Zm9v"}},{"request_put":{"key":"Yg==","value":"Yg==","prev_kv":true}}],
        "failure":[{"request_delete_range":{"key":"Zm9v"}}]}"#;
    let t = p.same(post("/v3/kv/txn", txn), &[]).await;
    assert!(t.body.contains(r#""succeeded":true"#), "{t:?}");
    let txn_fail = r#"{"compare":[{"key":"Zm9v","target":"MOD","result":"GREATER","mod_revision":"100"}],
        "failure":[{"request_delete_range":{"key":"Yg==","prev_kv":true}},{"request_txn":{}}]}"#;
    p.same(post("/v3/kv/txn", txn_fail), &[]).await;
    p.same(
        post(
            "/v3/kv/txn",
            r#"{"compare":[{"key":"Zm9v","target":1,"result":0,"version":1}]}"#,
        ),
        &[],
    )
    .await;
    p.same(
        post("/v3/kv/deleterange", r#"{"key":"YQ==","prev_kv":true}"#),
        &[],
    )
    .await;
    p.same(post("/v3/kv/compaction", r#"{"revision":"3"}"#), &[])
        .await;
    let compacted = p
        .same(
            post("/v3/kv/range", r#"{"key":"Zm9v","revision":"2"}"#),
            &[],
        )
        .await;
    assert_eq!(status(&compacted), 400, "{compacted:?}");
    p.same(
        post("/v3/kv/range", r#"{"key":"Zm9v","revision":"100"}"#),
        &[],
    )
    .await;
    let no_lease = p
        .same(post("/v3/kv/put", r#"{"key":"Zm9v","lease":"12345"}"#), &[])
        .await;
    assert_eq!(status(&no_lease), 404);
    p.same(post("/v3/kv/range", ""), &[]).await;
    p.same(post("/v3/kv/range", "null"), &[]).await;
    // Malformed requests, with Go's JSON error wording.
    for bad in [
        "{bad",
        r#"{"key":"Zm9v""#,
        r#"{"key":"Zm9v",}"#,
        r#"{"key" "Zm9v"}"#,
        r#"{"key":"Zm9v" "a":1}"#,
        "[]",
        r#""x""#,
        "42",
    ] {
        let answer = p.same(post("/v3/kv/range", bad), &[]).await;
        assert_eq!(status(&answer), 400, "{bad}: {answer:?}");
    }
    // Fields of the wrong type or form, as jsonpb words them.
    for bad in [
        r#"{"key":"Zm9v","value":"YmFy","lease":1.5}"#,
        r#"{"key":"Zm9v","value":"YmFy","lease":"abc"}"#,
        r#"{"key":"Zm9v","prev_kv":"true"}"#,
        r#"{"key":"Zm9v","value":"YmF-"}"#,
        r#"{"key":"Zm9v","value":"YQ"}"#,
        r#"{"key":"Zm9v","value":"YQ="}"#,
        r#"{"key":"Zm9v","value":"!!!"}"#,
        r#"{"key":7}"#,
    ] {
        let answer = p.same(post("/v3/kv/put", bad), &[]).await;
        assert_eq!(status(&answer), 400, "{bad}: {answer:?}");
    }
    let bogus = r#"{"compare":[{"key":"Zm9v","target":"BOGUS"}]}"#;
    assert_eq!(status(&p.same(post("/v3/kv/txn", bogus), &[]).await), 400);
    // Accepted forms: numbers for int64, enum numbers, line breaks in base64.
    p.same(
        post("/v3/kv/put", r#"{"key":"Zm\n9v","value":"YR==","lease":0}"#),
        &[],
    )
    .await;
    p.same(
        post(
            "/v3/kv/range",
            r#"{"key":"Zm9v","sort_order":2,"limit":"5"}"#,
        ),
        &[],
    )
    .await;
    // Over --max-request-bytes (1.5 MiB by default) and over the gRPC
    // message limit (2 MiB).
    for size in [1_600 * 1024, 2 * 1024 * 1024] {
        let value = "eHh4".repeat(size / 3);
        let body = format!(r#"{{"key":"Yg==","value":"{value}"}}"#);
        let answer = p.same(post("/v3/kv/put", &body), &[]).await;
        assert_ne!(status(&answer), 200, "{size}: {answer:?}");
    }
    // Only the first JSON value of a body counts.
    p.same(post("/v3/kv/put", r#"{"key":"Zm9v"} {"x""#), &[])
        .await;
    // Wrong method, unknown path, CORS preflight.
    let get = Call {
        method: "GET",
        ..post("/v3/kv/range", "")
    };
    assert_eq!(status(&p.same(get, &[]).await), 405);
    p.same(
        Call {
            method: "PUT",
            ..post("/v3/kv/put", "{}")
        },
        &[],
    )
    .await;
    assert_eq!(
        status(&p.same(post("/v3/kv/nothing", "{}"), &[]).await),
        404
    );
    p.same(post("/v3beta/nothing", "{}"), &[]).await;
    p.same(
        Call {
            method: "OPTIONS",
            ..post("/v3/kv/range", "")
        },
        &[],
    )
    .await;
    Ok(())
}

#[tokio::test]
async fn lease_cluster_and_maintenance() -> Result<()> {
    let d = Differential::start().await?;
    let mut p = Pair::new(&d);
    let grant = p
        .same(post("/v3/lease/grant", r#"{"TTL":"60","ID":"77"}"#), &[])
        .await;
    assert!(grant.body.contains(r#""ID":"77""#), "{grant:?}");
    p.same(
        post(
            "/v3/kv/put",
            r#"{"key":"bA==","value":"dg==","lease":"77"}"#,
        ),
        &[],
    )
    .await;
    // The remaining TTL may have ticked on one side only.
    p.same(
        post("/v3/lease/timetolive", r#"{"ID":"77","keys":true}"#),
        &["TTL"],
    )
    .await;
    p.same(post("/v3/kv/lease/timetolive", r#"{"ID":"78"}"#), &[])
        .await;
    p.same(post("/v3/lease/leases", "{}"), &[]).await;
    p.same(post("/v3/kv/lease/leases", "{}"), &[]).await;
    let keep = p
        .same(
            post("/v3/lease/keepalive", r#"{"ID":"77"}{"ID":"77"}"#),
            &[],
        )
        .await;
    assert_eq!(keep.body.matches("result").count(), 2, "{keep:?}");
    p.same(post("/v3/lease/keepalive", r#"{"ID":"78"}"#), &[])
        .await;
    let bad_stream = p.same(post("/v3/lease/keepalive", "{bad"), &[]).await;
    assert_eq!(status(&bad_stream), 500);
    p.same(post("/v3/lease/revoke", r#"{"ID":"77"}"#), &[])
        .await;
    let gone = p
        .same(post("/v3/kv/lease/revoke", r#"{"ID":"77"}"#), &[])
        .await;
    assert_eq!(status(&gone), 404);
    p.same(post("/v3/kv/range", r#"{"key":"bA=="}"#), &[]).await;

    let member_fields = ["ID", "name", "peerURLs", "clientURLs"];
    p.same(post("/v3/cluster/member/list", "{}"), &member_fields)
        .await;
    p.same(post("/v3/cluster/member/remove", r#"{"ID":"1"}"#), &[])
        .await;
    p.same(post("/v3/cluster/member/promote", r#"{"ID":"1"}"#), &[])
        .await;
    p.same(
        post(
            "/v3/cluster/member/update",
            r#"{"ID":"1","peerURLs":["http://127.0.0.9:2380"]}"#,
        ),
        &[],
    )
    .await;

    let status_fields = [
        "version",
        "dbSize",
        "leader",
        "raftIndex",
        "raftTerm",
        "raftAppliedIndex",
        "dbSizeInUse",
    ];
    // etcd 3.6's three new Status fields, which 3.5.1 does not send: the
    // candidate's are checked, then the rest compared with the oracle's.
    let oracle = curl(
        &p.oracle,
        &post("/v3/maintenance/status", "{}"),
        &status_fields,
    )
    .await
    .expect("oracle");
    // The storage version is reported once the cluster version is decided
    // (as in etcd 3.6), which a loaded machine may not have done yet.
    let mut candidate = retry_until("a Status with the storage version", LINE_TIMEOUT, || {
        let endpoint = p.candidate.clone();
        let fields = &status_fields;
        async move {
            let answer = curl(&endpoint, &post("/v3/maintenance/status", "{}"), fields).await?;
            anyhow::ensure!(answer.body.contains("storageVersion"), "{}", answer.body);
            Ok(answer)
        }
    })
    .await
    .expect("candidate");
    let mut json: Value = serde_json::from_str(&candidate.body).expect("json");
    let object = json.as_object_mut().expect("object");
    assert_eq!(object.remove("storageVersion"), Some(Value::from("3.6.0")));
    // The store's default quota is 16 GiB, etcd's 2 GiB (store::limits).
    assert_eq!(
        object.remove("dbSizeQuota"),
        Some(Value::from("17179869184"))
    );
    assert_eq!(object.remove("downgradeInfo"), Some(serde_json::json!({})));
    candidate.body = json.to_string();
    assert_eq!(oracle, candidate, "POST /v3/maintenance/status");
    p.same(post("/v3/maintenance/alarm", r#"{"action":"GET"}"#), &[])
        .await;
    p.same(post("/v3/maintenance/hash", "{}"), &["hash"]).await;
    p.same(
        post("/v3/maintenance/transfer-leadership", r#"{"targetID":"1"}"#),
        &[],
    )
    .await;
    // A snapshot streams as `{"result":{..."blob":...}}` lines; the bytes
    // differ (another database format), the framing may not.
    for endpoint in [&p.oracle, &p.candidate] {
        let snapshot = curl(endpoint, &post("/v3/maintenance/snapshot", "{}"), &[]).await?;
        assert_eq!(
            (snapshot.status, snapshot.content_type.as_str()),
            (200, "application/json")
        );
        for line in snapshot.body.lines() {
            let chunk: Value = serde_json::from_str(line)?;
            assert!(chunk["result"]["blob"].is_string(), "{endpoint}: {line}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn auth_through_the_gateway() -> Result<()> {
    let d = Differential::start().await?;
    let mut p = Pair::new(&d);
    for body in [
        r#"{"name":"root","password":"rootpw"}"#,
        r#"{"name":"bob","password":"bobpw"}"#,
    ] {
        p.same(post("/v3/auth/user/add", body), &[]).await;
    }
    p.same(post("/v3/auth/role/add", r#"{"name":"root"}"#), &[])
        .await;
    p.same(post("/v3/auth/role/add", r#"{"name":"r1"}"#), &[])
        .await;
    p.same(
        post("/v3/auth/user/grant", r#"{"user":"root","role":"root"}"#),
        &[],
    )
    .await;
    let perm = r#"{"name":"r1","perm":{"permType":"READWRITE","key":"Zm9v","range_end":"Zm9w"}}"#;
    p.same(post("/v3/auth/role/grant", perm), &[]).await;
    p.same(
        post("/v3/auth/user/grant", r#"{"user":"bob","role":"r1"}"#),
        &[],
    )
    .await;
    p.same(post("/v3/auth/role/get", r#"{"role":"r1"}"#), &[])
        .await;
    p.same(post("/v3/auth/user/get", r#"{"name":"bob"}"#), &[])
        .await;
    p.same(post("/v3/auth/user/list", "{}"), &[]).await;
    p.same(post("/v3/auth/status", "{}"), &[]).await;
    p.same(post("/v3/auth/enable", "{}"), &[]).await;

    let no_token = p.same(post("/v3/kv/range", r#"{"key":"Zm9v"}"#), &[]).await;
    assert_eq!(status(&no_token), 400, "{no_token:?}");
    let wrong = p
        .same(
            post("/v3/auth/authenticate", r#"{"name":"bob","password":"x"}"#),
            &[],
        )
        .await;
    assert_eq!(status(&wrong), 400);
    let bob = p.tokens("bob", "bobpw").await;
    let bob = (bob.0.as_str(), bob.1.as_str());
    let put = post("/v3/kv/put", r#"{"key":"Zm9v","value":"eA=="}"#);
    assert_eq!(status(&p.same_tokens(put, Some(bob), &[]).await), 200);
    let read = post("/v3/kv/range", r#"{"key":"Zm9v"}"#);
    p.same_tokens(read, Some(bob), &[]).await;
    let denied = post("/v3/kv/put", r#"{"key":"YQ==","value":"eA=="}"#);
    assert_eq!(status(&p.same_tokens(denied, Some(bob), &[]).await), 403);
    let admin = post("/v3/auth/user/list", "{}");
    p.same_tokens(admin, Some(bob), &[]).await;
    let invalid = post("/v3/kv/range", r#"{"key":"Zm9v"}"#);
    let invalid = p
        .same_tokens(invalid, Some(("garbage", "garbage")), &[])
        .await;
    assert_eq!(status(&invalid), 401);
    let root = p.tokens("root", "rootpw").await;
    let root = (root.0.as_str(), root.1.as_str());
    p.same_tokens(post("/v3/auth/user/list", "{}"), Some(root), &[])
        .await;
    p.same_tokens(post("/v3/auth/disable", "{}"), Some(root), &[])
        .await;
    p.same(post("/v3/kv/range", r#"{"key":"Zm9v"}"#), &[]).await;
    Ok(())
}

/// A `curl -N` stream (a watch, an election's observer).
struct WatchStream {
    child: Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl WatchStream {
    fn start(endpoint: &str, body: &str) -> Result<Self> {
        Self::start_at(endpoint, "/v3/watch", body)
    }

    fn start_at(endpoint: &str, path: &str, body: &str) -> Result<Self> {
        let mut child = Command::new("curl")
            .args(["-s", "-N", "-X", "POST", "--data-binary", body])
            .arg(format!("{endpoint}{path}"))
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().context("curl stdout")?;
        Ok(WatchStream {
            child,
            lines: BufReader::new(stdout).lines(),
        })
    }

    async fn line(&mut self) -> Result<String> {
        let line = tokio::time::timeout(LINE_TIMEOUT, self.lines.next_line())
            .await
            .context("no watch line in time")??;
        Ok(masked(&line.context("watch stream ended")?, &[]))
    }
}

#[tokio::test]
async fn watch_stream() -> Result<()> {
    let d = Differential::start().await?;
    let mut p = Pair::new(&d);
    p.same(post("/v3/kv/put", r#"{"key":"d2s=","value":"MA=="}"#), &[])
        .await;
    let create = r#"{"create_request":{"key":"d2s=","prev_kv":true}}"#;
    // (No progress request here: etcd answers it before or after the
    // history, depending on its goroutines' timing.)
    let history = r#"{"create_request":{"key":"d2s=","start_revision":"1","watch_id":"5"}}"#;
    let mut streams = Vec::new();
    for body in [create, history] {
        streams.push((
            WatchStream::start(&p.oracle, body)?,
            WatchStream::start(&p.candidate, body)?,
        ));
    }
    // Created (and, for the second, the history).
    for (i, expected_lines) in [(0, 1), (1, 2)] {
        let (o, c) = &mut streams[i];
        for _ in 0..expected_lines {
            assert_eq!(o.line().await?, c.line().await?, "stream {i}");
        }
    }
    p.same(post("/v3/kv/put", r#"{"key":"d2s=","value":"MQ=="}"#), &[])
        .await;
    p.same(post("/v3/kv/deleterange", r#"{"key":"d2s="}"#), &[])
        .await;
    for (i, (o, c)) in streams.iter_mut().enumerate() {
        for _ in 0..2 {
            let line = o.line().await?;
            assert!(line.contains("events"), "{line}");
            assert_eq!(line, c.line().await?, "stream {i}");
        }
    }
    for (o, c) in &mut streams {
        o.child.start_kill()?;
        c.child.start_kill()?;
    }
    let bad = p.same(post("/v3/watch", "{bad"), &[]).await;
    assert_eq!(status(&bad), 500);
    Ok(())
}

/// `/v3/lock/...` and `/v3/election/...`: answers, errors (code Unknown,
/// HTTP 500) and an observer's stream, with a lease of id 0x1000 (4096).
#[tokio::test]
async fn lock_and_election_routes() -> Result<()> {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let d = Differential::start().await?;
    let mut p = Pair::new(&d);
    p.same(post("/v3/lease/grant", r#"{"TTL":600,"ID":4096}"#), &[])
        .await;
    let lock = format!(r#"{{"name":"{}","lease":4096}}"#, b64("mylock"));
    let locked = p.same(post("/v3/lock/lock", &lock), &[]).await;
    assert!(locked.body.contains(&b64("mylock/1000")), "{}", locked.body);
    // Again with the lease as a string: the same key, nothing written.
    let again = format!(r#"{{"name":"{}","lease":"4096"}}"#, b64("mylock"));
    p.same(post("/v3/lock/lock", &again), &[]).await;
    let unlock = format!(r#"{{"key":"{}"}}"#, b64("mylock/1000"));
    p.same(post("/v3/lock/unlock", &unlock), &[]).await;
    p.same(post("/v3/lock/unlock", &unlock), &[]).await;
    let no_lease = format!(r#"{{"name":"{}","lease":12345}}"#, b64("mylock"));
    let refused = p.same(post("/v3/lock/lock", &no_lease), &[]).await;
    assert_eq!(status(&refused), 500);

    let name = format!(r#"{{"name":"{}"}}"#, b64("el"));
    let none = p.same(post("/v3/election/leader", &name), &[]).await;
    assert_eq!(status(&none), 500);
    let (mut o, mut c) = (
        WatchStream::start_at(&p.oracle, "/v3/election/observe", &name)?,
        WatchStream::start_at(&p.candidate, "/v3/election/observe", &name)?,
    );
    let campaign = format!(
        r#"{{"name":"{}","lease":4096,"value":"{}"}}"#,
        b64("el"),
        b64("v1")
    );
    let won = p.same(post("/v3/election/campaign", &campaign), &[]).await;
    assert_eq!(status(&won), 200);
    let first = o.line().await?;
    assert!(first.contains(&b64("v1")), "{first}");
    assert_eq!(first, c.line().await?);
    p.same(post("/v3/election/leader", &name), &[]).await;
    let won: Value = serde_json::from_str(&won.body)?;
    let leader = won["leader"].to_string();
    let proclaim = format!(r#"{{"leader":{leader},"value":"{}"}}"#, b64("v2"));
    p.same(post("/v3/election/proclaim", &proclaim), &[]).await;
    let second = o.line().await?;
    assert!(second.contains(&b64("v2")), "{second}");
    assert_eq!(second, c.line().await?);
    let mut stale = won["leader"].clone();
    stale["rev"] = Value::String("1".into());
    let stale = format!(r#"{{"leader":{stale},"value":"{}"}}"#, b64("v3"));
    let not_leader = p.same(post("/v3/election/proclaim", &stale), &[]).await;
    assert!(
        not_leader.body.contains("election: not leader"),
        "{}",
        not_leader.body
    );
    for body in [r#"{"value":"djM="}"#, r#"{"leader":{}}"#] {
        let refused = p.same(post("/v3/election/proclaim", body), &[]).await;
        assert_eq!(status(&refused), 500);
    }
    p.same(
        post("/v3/election/resign", &format!(r#"{{"leader":{leader}}}"#)),
        &[],
    )
    .await;
    p.same(post("/v3/election/leader", &name), &[]).await;
    let get = p
        .same(
            Call {
                method: "GET",
                ..post("/v3/lock/lock", "")
            },
            &[],
        )
        .await;
    assert_eq!(status(&get), 405);
    o.child.start_kill()?;
    c.child.start_kill()?;
    Ok(())
}

async fn etcd3gw_run(endpoint: &str) -> Result<Value> {
    let script = integration_tests::binary::manifest_dir().join("scripts/etcd3gw_check.py");
    let venv = std::env::var("ETCD3GW_VENV").unwrap_or_else(|_| ETCD3GW_VENV.to_string());
    let python = format!("{venv}/bin/python");
    let out = Command::new(&python)
        .arg(&script)
        .arg(endpoint)
        .output()
        .await
        .with_context(|| format!("running {python} (scripts/setup.sh installs it)"))?;
    anyhow::ensure!(
        out.status.success(),
        "etcd3gw_check.py against {endpoint}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

#[tokio::test]
async fn etcd3gw_client() -> Result<()> {
    let d = Differential::start().await?;
    let p = Pair::new(&d);
    let (expected, actual) = tokio::join!(etcd3gw_run(&p.oracle), etcd3gw_run(&p.candidate));
    let (expected, actual) = (expected?, actual?);
    assert_eq!(
        expected["watch"].as_array().map(Vec::len),
        Some(3),
        "{expected}"
    );
    assert_eq!(expected, actual);
    Ok(())
}
