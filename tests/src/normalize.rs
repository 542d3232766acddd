//! Output normalization for differential comparison.
//!
//! Two correct servers given the same operations in the same order produce
//! the same revisions, keys, values, versions and errors, but necessarily
//! differ in values that identify the instance or depend on its timing:
//!
//! - cluster and member ids, raft terms and indexes, the leader id, database
//!   sizes (JSON fields of `etcdctl -w json`, `-w fields` lines, fields of etcd-client `Debug`
//!   output, and the columns of `etcdctl endpoint status` / `member list`);
//! - the latency reported by `etcdctl endpoint health`;
//! - the patch level of the server version (`3.5.1` becomes `3.5.<PATCH>`, so
//!   a 3.4 server still differs from a 3.5 one), and etcd 3.5 and 3.6 as
//!   one (`3.<5|6>.<PATCH>`: the reference is etcd 3.5.1, the store presents
//!   etcd 3.6.14, whose API is 3.5's plus additions compared elsewhere);
//! - in etcdctl's client-side log lines: timestamps, Go pointers, resolver
//!   UUIDs and the per-test loopback addresses.
//!
//! [`normalize`] replaces exactly those with placeholders. Zero values are kept
//! as they are: a server that leaves a header field unset must still differ
//! from one that fills it in.

use std::sync::LazyLock;

use regex::Regex;

/// One replacement: every match of `pattern` becomes `replacement`
/// (with `$name` / `${n}` capture references).
struct Rule {
    pattern: Regex,
    replacement: &'static str,
}

fn rule(pattern: &str, replacement: &'static str) -> Rule {
    Rule {
        pattern: Regex::new(pattern).expect("normalizer patterns are valid"),
        replacement,
    }
}

static RULES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    vec![
        // `etcdctl endpoint status` (simple): endpoint, id, version, db size,
        // is leader, is learner, raft term, raft index, raft applied index, errors.
        rule(
            r"(?m)^\S+, [0-9a-f]{1,16}, (\d+\.\d+)\.\d+, [^,]+, (true|false), (true|false), \d+, \d+, \d+, ",
            "<ENDPOINT>, <MEMBER_ID>, ${1}.<PATCH>, <DB_SIZE>, ${2}, ${3}, <RAFT_TERM>, <RAFT_INDEX>, <RAFT_APPLIED_INDEX>, ",
        ),
        // `etcdctl member list` (simple): id, status, name, peer urls, client urls, learner.
        rule(
            r"(?m)^[0-9a-f]{1,16}, (started|unstarted), ",
            "<MEMBER_ID>, ${1}, ",
        ),
        // JSON (etcdctl -w json): instance-specific numeric fields.
        rule(
            r#""(cluster_id|member_id|raft_term|leader|raftIndex|raftTerm|raftAppliedIndex|dbSize|dbSizeInUse|ID|memberID)":[1-9][0-9]*"#,
            r#""${1}":"<${1}>""#,
        ),
        // `etcdctl -w fields`: the same fields, Go-named.
        rule(
            r#""(ClusterID|MemberID|RaftTerm|Leader|RaftIndex|RaftAppliedIndex|DBSize|DBSizeInUse|ID)" : [1-9][0-9]*"#,
            r#""${1}" : <${1}>"#,
        ),
        rule(
            r#""Version" : "(\d+\.\d+)\.\d+""#,
            r#""Version" : "${1}.<PATCH>""#,
        ),
        rule(
            r#""version":"(\d+\.\d+)\.\d+""#,
            r#""version":"${1}.<PATCH>""#,
        ),
        // Rust Debug (etcd-client responses), compact or pretty.
        rule(
            r"\b(cluster_id|member_id|raft_term|leader|raft_index|raft_applied_index|db_size|db_size_in_use|raft_used_db_size): [1-9][0-9]*",
            "${1}: <${1}>",
        ),
        rule(r#"\bversion: "(\d+\.\d+)\.\d+""#, r#"version: "${1}.<PATCH>""#),
        // etcd 3.5 and 3.6 (module docs).
        rule(r"\b3\.[56]\.<PATCH>", "3.<5|6>.<PATCH>"),
        // `etcdctl endpoint health`: the measured latency.
        rule(r"took = [0-9.]+[a-zµ]+", "took = <DURATION>"),
        rule(r#""took":"[^"]*""#, r#""took":"<DURATION>""#),
        // etcdctl's client-side log lines on stderr.
        rule(r#""ts":"[^"]*""#, r#""ts":"<TS>""#),
        rule(r"0x[0-9a-f]+", "0x<PTR>"),
        rule(
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "<UUID>",
        ),
        rule(r"\b127\.\d{1,3}\.\d{1,3}\.\d{1,3}\b", "<LOOPBACK>"),
    ]
});

/// `text` with every instance-specific value replaced by a placeholder.
pub fn normalize(text: &str) -> String {
    RULES.iter().fold(text.to_string(), |current, rule| {
        rule.pattern
            .replace_all(&current, rule.replacement)
            .into_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_headers_from_two_instances_match() {
        let a = r#"{"header":{"cluster_id":11274693654865067530,"member_id":9642004104400422984,"revision":2,"raft_term":2}}"#;
        let b = r#"{"header":{"cluster_id":14841639068965178418,"member_id":10276657743932975437,"revision":2,"raft_term":5}}"#;
        assert_eq!(normalize(a), normalize(b));
        let c = r#"{"header":{"cluster_id":14841639068965178418,"member_id":10276657743932975437,"revision":3,"raft_term":5}}"#;
        assert_ne!(normalize(a), normalize(c), "revisions must stay visible");
    }

    #[test]
    fn endpoint_status_json_is_normalized() {
        let a = r#"[{"Endpoint":"http://127.33.1.7:2379","Status":{"header":{"cluster_id":11274693654865067530,"member_id":9642004104400422984,"revision":2,"raft_term":2},"version":"3.5.1","dbSize":20480,"leader":9642004104400422984,"raftIndex":5,"raftTerm":2,"raftAppliedIndex":5,"dbSizeInUse":16384}}]"#;
        let b = r#"[{"Endpoint":"http://127.9.4.1:2379","Status":{"header":{"cluster_id":1,"member_id":2,"revision":2,"raft_term":3},"version":"3.5.9","dbSize":4096,"leader":2,"raftIndex":9,"raftTerm":3,"raftAppliedIndex":9,"dbSizeInUse":4096}}]"#;
        assert_eq!(normalize(a), normalize(b));
        let v34 = b.replace("3.5.9", "3.4.23");
        assert_ne!(
            normalize(a),
            normalize(&v34),
            "minor versions must stay visible"
        );
    }

    #[test]
    fn endpoint_status_simple_is_normalized() {
        let a = "http://127.33.1.7:2379, 85cf47a5bda54848, 3.5.1, 20 kB, true, false, 2, 5, 5, \n";
        let b = "http://127.1.2.3:2379, 1, 3.5.0, 4.1 MB, true, false, 7, 1234, 1234, \n";
        assert_eq!(normalize(a), normalize(b));
        let follower = b.replace("true, false", "false, false");
        assert_ne!(normalize(a), normalize(&follower));
    }

    #[test]
    fn fields_output_is_normalized() {
        let a = "\"ClusterID\" : 11274693654865067530\n\"MemberID\" : 9642004104400422984\n\"Revision\" : 6\n\"RaftTerm\" : 2\n\"Version\" : \"3.5.1\"\n\"DBSize\" : 20480\n\"Leader\" : 9642004104400422984\n\"RaftIndex\" : 13\n";
        let b = "\"ClusterID\" : 1\n\"MemberID\" : 2\n\"Revision\" : 6\n\"RaftTerm\" : 3\n\"Version\" : \"3.5.7\"\n\"DBSize\" : 4096\n\"Leader\" : 2\n\"RaftIndex\" : 99\n";
        assert_eq!(normalize(a), normalize(b));
        assert_ne!(
            normalize(a),
            normalize(&b.replace("\"Revision\" : 6", "\"Revision\" : 7"))
        );
    }

    #[test]
    fn member_list_simple_is_normalized() {
        let a = "85cf47a5bda54848, started, m0, http://127.33.1.7:2380, http://127.33.1.7:2379, false\n";
        let b = "1a2b, started, m0, http://127.4.5.6:2380, http://127.4.5.6:2379, false\n";
        assert_eq!(normalize(a), normalize(b));
    }

    #[test]
    fn etcdctl_log_lines_are_normalized() {
        let a = r#"{"level":"warn","ts":"2026-11-22T01:58:25.891Z","logger":"etcd-client","caller":"v3/retry_interceptor.go:62","msg":"retrying of unary invoker failed","target":"etcd-endpoints://0xc000428380/127.33.1.7:2379","attempt":0,"error":"rpc error: code = InvalidArgument desc = etcdserver: key is not provided"}"#;
        let b = r#"{"level":"warn","ts":"2026-11-22T02:00:01.001Z","logger":"etcd-client","caller":"v3/retry_interceptor.go:62","msg":"retrying of unary invoker failed","target":"etcd-endpoints://0xc0001b6000/127.2.2.2:2379","attempt":0,"error":"rpc error: code = InvalidArgument desc = etcdserver: key is not provided"}"#;
        assert_eq!(normalize(a), normalize(b));
        let c = r#"{"target":"endpoint://client-b6d7abd6-4cb9-4a69-8a27-84e4f0af28b5/127.33.1.7:2379"}"#;
        let d =
            r#"{"target":"endpoint://client-00000000-1111-2222-3333-444444444444/127.1.1.1:2379"}"#;
        assert_eq!(normalize(c), normalize(d));
    }

    #[test]
    fn endpoint_health_latency_is_normalized() {
        let a = "http://127.3.3.7:2379 is healthy: successfully committed proposal: took = 3.654906ms\n";
        let b =
            "http://127.1.1.1:2379 is healthy: successfully committed proposal: took = 912.1µs\n";
        assert_eq!(normalize(a), normalize(b));
        let c = r#"[{"endpoint":"http://127.3.3.7:2379","health":true,"took":"3.127108ms"}]"#;
        let d = r#"[{"endpoint":"http://127.1.1.1:2379","health":true,"took":"1.1s"}]"#;
        assert_eq!(normalize(c), normalize(d));
    }

    #[test]
    fn debug_output_keeps_zero_ids_visible() {
        let a = "ResponseHeader { cluster_id: 5, member_id: 6, revision: 3, raft_term: 2 }";
        let b = "ResponseHeader { cluster_id: 7, member_id: 8, revision: 3, raft_term: 9 }";
        let unset = "ResponseHeader { cluster_id: 0, member_id: 0, revision: 3, raft_term: 0 }";
        assert_eq!(normalize(a), normalize(b));
        assert_ne!(normalize(a), normalize(unset));
    }

    #[test]
    fn keys_and_values_are_untouched() {
        let text = "foo\nbar 12 version: 3\n";
        assert_eq!(normalize(text), text);
    }
}
