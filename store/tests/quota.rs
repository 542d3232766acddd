//! `--quota-backend-bytes` and the NOSPACE alarm, through the embedding API
//! and the gRPC clients: writes past the quota raise NOSPACE and are refused
//! with etcd's error while reads and deletes still work; after compaction,
//! defragmentation and disarming the alarm, writes work again.

use std::time::Duration;

use etcd_proto::etcdserverpb::alarm_request::AlarmAction;
use etcd_proto::etcdserverpb::kv_client::KvClient;
use etcd_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use etcd_proto::etcdserverpb::{
    AlarmRequest, AlarmType, CompactionRequest, DefragmentRequest, DeleteRangeRequest, PutRequest,
    RangeRequest, StatusRequest,
};
use tonic::transport::Channel;

/// The quota under test: small, so a few hundred puts reach it.
const QUOTA_BYTES: u64 = 64 * 1024;
/// Value size of each put.
const VALUE_BYTES: usize = 1024;
/// Upper bound on puts before the quota must have been hit.
const MAX_PUTS: usize = 2_000;
/// How long the member may take to elect itself.
const LEADER_WAIT: Duration = Duration::from_secs(20);

async fn start(dir: &std::path::Path) -> (store::Member, Channel) {
    let data_dir = dir.join("m.etcd");
    let config = store::Config::from_flags([
        "store",
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--listen-client-urls",
        "http://127.0.0.1:0",
        "--listen-peer-urls",
        "http://127.0.0.1:0",
        "--quota-backend-bytes",
        &QUOTA_BYTES.to_string(),
    ])
    .expect("flags parse");
    let member = store::Member::start(config).await.expect("member starts");
    let endpoint = member.client_endpoints()[0].clone();
    let channel = Channel::from_shared(endpoint)
        .unwrap()
        .connect()
        .await
        .expect("connect");
    let mut maintenance = MaintenanceClient::new(channel.clone());
    let deadline = tokio::time::Instant::now() + LEADER_WAIT;
    loop {
        let status = maintenance
            .status(StatusRequest {})
            .await
            .expect("status")
            .into_inner();
        if status.leader != 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no leader within {LEADER_WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (member, channel)
}

fn put(key: String) -> PutRequest {
    PutRequest {
        key: key.into_bytes(),
        value: vec![b'x'; VALUE_BYTES],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nospace_alarm_refuses_writes_until_disarmed() {
    let dir = tempfile::tempdir().unwrap();
    let (member, channel) = start(dir.path()).await;
    let mut kv = KvClient::new(channel.clone());
    let mut maintenance = MaintenanceClient::new(channel);

    let mut refused = None;
    for i in 0..MAX_PUTS {
        if let Err(status) = kv.put(put(format!("q/{i:05}"))).await {
            refused = Some(status);
            break;
        }
    }
    let status = refused.expect("the quota is reached within MAX_PUTS puts");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        "etcdserver: mvcc: database space exceeded"
    );

    let alarms = maintenance
        .alarm(AlarmRequest {
            action: AlarmAction::Get as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .alarms;
    assert_eq!(alarms.len(), 1);
    assert_eq!(alarms[0].alarm, AlarmType::Nospace as i32);
    assert_eq!(alarms[0].member_id, member.id());

    let read = kv.range(RangeRequest {
        key: b"q/".to_vec(),
        range_end: b"q0".to_vec(),
        count_only: true,
        ..Default::default()
    });
    assert!(
        read.await.unwrap().into_inner().count > 0,
        "reads still work"
    );
    let err = kv.put(put("after".into())).await.unwrap_err();
    assert_eq!(
        err.message(),
        "etcdserver: mvcc: database space exceeded",
        "still refused"
    );

    let deleted = kv
        .delete_range(DeleteRangeRequest {
            key: b"q/".to_vec(),
            range_end: b"q0".to_vec(),
            ..Default::default()
        })
        .await
        .expect("deletes still work")
        .into_inner();
    let revision = deleted.header.unwrap().revision;
    kv.compact(CompactionRequest {
        revision,
        physical: true,
    })
    .await
    .expect("compaction works");
    maintenance
        .defragment(DefragmentRequest {})
        .await
        .expect("defragment");
    let disarm = AlarmRequest {
        action: AlarmAction::Deactivate as i32,
        member_id: member.id(),
        alarm: AlarmType::Nospace as i32,
    };
    let disarmed = maintenance.alarm(disarm).await.unwrap().into_inner().alarms;
    assert_eq!(disarmed.len(), 1, "the disarmed alarm is answered");
    kv.put(put("after".into()))
        .await
        .expect("writes work again after disarm");
    member.shutdown().await;
}
