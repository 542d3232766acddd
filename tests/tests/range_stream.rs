//! RangeStream (etcd 3.7's `KV.RangeStream`) through the Rust `etcd-client`
//! crate's `get_stream`, against the candidate only: etcd 3.5 has no such
//! method, and no 3.7 binary can be installed here, so the expectations are
//! the 3.7 API's: the chunks merge into the Range answer at one revision,
//! only the last one carries the header, `more` and `count`, other orders
//! and revision filters are refused as Unimplemented, and a compaction past
//! the stream's revision ends it with the compaction error.
//!
//! Run: `cargo test --release -p integration-tests --test integration range_stream::`

use etcd_client::{Client, Error, GetOptions, GetResponse, KeyValue, SortOrder, SortTarget};
use integration_tests::{Binary, Cluster, ClusterConfig};

/// Keys the tests write, `k000`...
const KEYS: usize = 300;
/// Bytes of each value: the keys make about 20 MB, a dozen chunks of the
/// default 1.5 MiB request size.
const VALUE_BYTES: usize = 64 * 1024;

/// The limit of the client reading the whole range in one answer.
const WHOLE_ANSWER_LIMIT_BYTES: usize = 64 * 1024 * 1024;

async fn one_member_with_keys() -> (Cluster, Client) {
    let cluster = Cluster::start(
        Binary::candidate().expect("candidate server binary"),
        ClusterConfig::new(1),
    )
    .await
    .expect("one member");
    let mut client = cluster.client(0).await.expect("client");
    for i in 0..KEYS {
        let value = vec![b'a' + (i % 26) as u8; VALUE_BYTES];
        client
            .put(format!("k{i:03}"), value, None)
            .await
            .expect("put");
    }
    (cluster, client)
}

/// A key-value's key, value, create and mod revisions, version and lease.
type Fields = (Vec<u8>, Vec<u8>, i64, i64, i64, i64);

/// Each key-value's fields, comparable.
fn fields(kvs: &[KeyValue]) -> Vec<Fields> {
    kvs.iter()
        .map(|kv| {
            (
                kv.key().to_vec(),
                kv.value().to_vec(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
                kv.lease(),
            )
        })
        .collect()
}

/// Every message of a stream, or the error that ended it.
async fn chunks(client: &mut Client, options: GetOptions) -> Result<Vec<GetResponse>, Error> {
    let mut stream = client.kv_client().get_stream("k", Some(options)).await?;
    let mut out = Vec::new();
    while let Some(chunk) = stream.message().await? {
        out.push(chunk);
    }
    Ok(out)
}

#[tokio::test]
async fn the_chunks_merge_into_the_range_answer() {
    let (_cluster, mut client) = one_member_with_keys().await;
    for limit in [0, 7, 120, KEYS as i64, 1000] {
        let options = GetOptions::new().with_prefix().with_limit(limit);
        // One answer of 20 MB is over a client's default 4 MiB limit,
        // which the chunks are not.
        let whole = client
            .kv_client()
            .max_decoding_message_size(WHOLE_ANSWER_LIMIT_BYTES)
            .get("k", Some(options.clone()))
            .await
            .expect("get");
        let streamed = chunks(&mut client, options).await.expect("stream");
        let (last, earlier) = streamed.split_last().expect("at least one chunk");
        if limit == 0 {
            assert!(earlier.len() >= 5, "{} chunks for 20 MB", streamed.len());
        }
        for c in earlier {
            assert!(
                c.header().is_none(),
                "limit {limit}: a header before the last chunk"
            );
            assert_eq!((c.count(), c.more()), (0, false), "limit {limit}");
        }
        let merged: Vec<_> = streamed.iter().flat_map(|c| fields(c.kvs())).collect();
        assert!(
            merged == fields(whole.kvs()),
            "limit {limit}: the chunks differ from the range"
        );
        assert_eq!(
            (last.count(), last.more()),
            (whole.count(), whole.more()),
            "limit {limit}"
        );
        assert_eq!(
            last.header().map(|h| h.revision()),
            whole.header().map(|h| h.revision()),
            "limit {limit}"
        );
    }
    let counted = chunks(
        &mut client,
        GetOptions::new().with_prefix().with_count_only(),
    )
    .await
    .expect("count");
    assert_eq!(counted.len(), 1, "a count is one message");
    assert_eq!(
        (counted[0].count(), counted[0].kvs().len()),
        (KEYS as i64, 0)
    );
}

#[tokio::test]
async fn orders_and_revision_filters_are_unimplemented() {
    let (_cluster, mut client) = one_member_with_keys().await;
    let refused = [
        (
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Mod, SortOrder::Descend),
            "RangeStream does not support custom sort orders",
        ),
        (
            GetOptions::new().with_prefix().with_min_create_revision(2),
            "RangeStream does not support revision filters",
        ),
    ];
    for (options, message) in refused {
        match chunks(&mut client, options).await {
            Err(Error::GRpcStatus(status)) => {
                assert_eq!(status.code(), tonic::Code::Unimplemented, "{message}");
                assert_eq!(status.message(), message);
            }
            other => panic!(
                "expected Unimplemented ({message}), got {:?}",
                other.map(|c| c.len())
            ),
        }
    }
}

#[tokio::test]
async fn a_compaction_past_the_streams_revision_ends_it() {
    let (_cluster, mut client) = one_member_with_keys().await;
    let mut stream = client
        .kv_client()
        .get_stream("k", Some(GetOptions::new().with_prefix()))
        .await
        .expect("stream");
    let first = stream.message().await.expect("first chunk");
    assert!(first.is_some_and(|c| !c.kvs().is_empty()));
    let written = client.put("k000", "later", None).await.expect("put");
    let revision = written.header().expect("header").revision();
    client.compact(revision, None).await.expect("compact");
    let mut received = 1;
    let ended = loop {
        match stream.message().await {
            Ok(Some(_)) => received += 1,
            Ok(None) => break None,
            Err(e) => break Some(e),
        }
    };
    match ended {
        Some(Error::GRpcStatus(status)) => {
            assert_eq!(status.code(), tonic::Code::OutOfRange);
            assert_eq!(
                status.message(),
                "etcdserver: mvcc: required revision has been compacted"
            );
        }
        other => panic!("after {received} chunks the stream ended with {other:?}"),
    }
}
