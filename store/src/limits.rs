//! The store's bounds, with their units and why they have their values.
//!
//! Defaults that clients can observe are etcd 3.5's; internal bounds keep
//! memory and work per step finite (nothing in the store is unbounded).
//!
//! This file holds the etcd defaults behind flags and the bounds more than
//! one module uses. A bound that belongs to one module is a named constant
//! in that module, next to the code it bounds, documented the same way:
//!
//! | module | bounds |
//! | --- | --- |
//! | `lease` | `MAX_LEASE_TTL_SECONDS` |
//! | `watch::hub` | `WATCH_RING_REVISIONS`, `WATCH_RING_BYTES` |
//! | `mvcc::compactor` | `COMPACTOR_QUEUE` |
//! | `mvcc::key_history` | `HISTORY_CHUNK_ENTRIES`, `HISTORY_SLICE_ENTRIES`, `HISTORY_SLICES_PER_CHUNK`, `TAIL_FOLD_ENTRIES` |
//! | `engine::rocks` | `WRITE_BUFFER_BYTES`, `MAX_TOTAL_WAL_BYTES`, `BYTES_PER_SYNC`, `BACKGROUND_WRITE_BYTES_PER_SEC`, `RATE_LIMIT_REFILL_US`, `META_LEVEL_BASE_BYTES`, `META_TARGET_FILE_BYTES`, `BULK_FILE_BYTES`, `CHECKPOINT_OPEN_FILES`, `ENGINE_OPEN_FILES` |
//! | `raft::network` | `MAX_PEER_MESSAGE_BYTES` |
//! | `raft::log_bound` | `LOG_BYTES_PER_SNAPSHOT`, `CATCH_UP_LOG_BYTES`, `CHECK_INTERVAL` |
//! | `raft::snapshot_holds` | `HELD_LOG_BYTES`, `HOLD_MAX_AGE` |
//! | `raft::state_machine::snapshot_file` | `FILE_BUFFER_BYTES` |
//! | `removal` | `REMOVE_STEP_BYTES`, `REMOVE_STEP_PAUSE` |
//! | `direct_io` | `DIRECT_BUFFER_BYTES`, `DIRECT_ALIGN_BYTES` |
//! | `raft::elections` | `CAMPAIGN_RETRY_HEARTBEATS` |
//! | `auth::token` | `SIMPLE_TOKEN_PREFIX_LEN`, `DEFAULT_SIMPLE_TOKEN_TTL`, `DEFAULT_JWT_TTL`, `SIMPLE_TOKEN_SWEEP_AT` |
//! | `tls` | `HANDSHAKE_TIMEOUT`, `ACCEPT_QUEUE` |
//! | `member` | `JOIN_CLUSTER_ID_WAIT`, `JOIN_RETRY_PAUSE`, `PUBLISH_RETRY_MS` |
//! | `server::core` | `LEARNER_READY_PERCENT`, `NEW_MEMBER_SNAPSHOT_WAIT`, `LEADER_RETRY_PAUSE_MS` |
//! | `raft::read_index` | `READ_INDEX_QUEUE` |
//! | `server::kv` | `KV_OVERHEAD_BYTES` |
//! | `server::quota` | `QUOTA_SIZE_REFRESH` |
//! | `server::lease` | `EXPIRY_CHECK_INTERVAL`, `MAX_REVOKES_PER_CHECK`, `KEEPALIVE_OUTPUT_QUEUE`, `LEASE_OVERHEAD_BYTES` |
//! | `server::watch` | `STREAM_OUTPUT_QUEUE`, `DEFAULT_PROGRESS_NOTIFY_INTERVAL`, `CATCH_UP_EVENTS_PER_STEP`, `NO_LEADER_ELECTION_TIMEOUTS` |
//! | `server::inbound` | `INBOUND_QUEUE_BYTES` (requests of a Watch or LeaseKeepAlive stream read ahead) |
//! | `server::auth` | `AUTHENTICATE_ATTEMPTS` |
//! | `server::maintenance` | `SNAPSHOT_STREAM_CHUNK_BYTES` |
//! | `server::json_gateway` | `JSON_SLACK_BYTES` (with `max_body_bytes`), `stream::REQUEST_QUEUE` |
//! | `server::transfer` | `TRANSFER_TIMEOUT_ELECTION_TIMEOUTS`, `HOLD_MARGIN_ELECTION_TIMEOUTS`, `MAX_PEER_REQUEST_ELECTION_TIMEOUTS` |

/// Default `--max-learners`: etcd's `DefaultMaxLearners`, learner members
/// MemberAdd accepts at once ("etcdserver: too many learner members in
/// cluster" past it).
pub const DEFAULT_MAX_LEARNERS: i64 = 1;

/// Default `--max-request-bytes`: etcd's `DefaultMaxRequestBytes` (1.5 MiB).
/// Writes larger than this are refused with "etcdserver: request is too large".
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1536 * 1024;

/// etcd lets gRPC accept this much more than `--max-request-bytes`, so that a
/// request slightly over the limit gets etcd's own error instead of grpc's.
pub const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

/// Largest message tonic decodes: a backstop only. etcd's receive limit
/// (`--max-request-bytes` + [`GRPC_OVERHEAD_BYTES`]) is enforced on each
/// message's length prefix before it is buffered, with grpc-go's exact
/// error text (`server::frame_limit`).
pub const TRANSPORT_MAX_DECODE_BYTES: usize = 64 * 1024 * 1024;

/// Largest message we send to a client: grpc-go's default `math.MaxInt32`
/// in etcd; we bound it to 2 GiB - 1 as well.
pub const MAX_SEND_BYTES: usize = i32::MAX as usize;

/// Default `--max-txn-ops`: the maximum of len(compare), len(success),
/// len(failure) in one Txn (not their sum), as etcd.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;

/// Default `--quota-backend-bytes` (the flag at 0 or absent): 16 GiB,
/// where etcd's is 2 GiB. etcd's quota bounds its bbolt file, which it maps
/// into memory whole, hence its low default and its suggested maximum of
/// 8 GiB (`MaxQuotaBytes`); the store's table files are read through a
/// bounded block cache, so the quota bounds only the disk. With etcd's
/// default a Kubernetes cluster hits NOSPACE at a quarter of etcd's
/// suggested maximum; this one holds 8 GiB of live data (tables a little
/// larger than the values they hold) with as much again for the history
/// that kube-apiserver's compaction (every 5 minutes) has not removed yet.
/// An explicit `--quota-backend-bytes` works as in etcd.
pub const DEFAULT_QUOTA_BACKEND_BYTES: u64 = 16 * 1024 * 1024 * 1024;

/// Default `--snapshot-count`: etcd 3.6's 10,000 applied entries between
/// snapshots and log purges (3.5's was 100,000; kubeadm passes 10,000).
pub const DEFAULT_SNAPSHOT_COUNT: u64 = 10_000;

/// Entries kept in the log behind a snapshot so a briefly lagging follower
/// catches up from the log rather than a full snapshot: etcd's
/// `SnapshotCatchUpEntries`.
pub const SNAPSHOT_CATCH_UP_ENTRIES: u64 = 5_000;

/// Default `--heartbeat-interval` in milliseconds (etcd: 100 ms).
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 100;

/// Default `--election-timeout` in milliseconds (etcd: 1000 ms).
pub const DEFAULT_ELECTION_TIMEOUT_MS: u64 = 1000;

/// etcd refuses proposals while this many committed entries wait to be
/// applied ("etcdserver: too many requests").
pub const MAX_GAP_BETWEEN_APPLY_AND_COMMIT_ENTRIES: u64 = 5_000;

/// How long a client request may wait for Raft before "request timed out":
/// etcd's `ReqTimeout` = 5 s + 2 x election timeout; we use the 5 s base plus
/// twice the configured election timeout at runtime.
pub const REQUEST_TIMEOUT_BASE_MS: u64 = 5_000;

/// Revisions physically deleted per write batch by the background compactor
/// (etcd: `compactionBatchLimit`), so compaction never holds the engine long.
pub const COMPACTION_BATCH_REVISIONS: usize = 1_000;

/// Stored revisions per batch passed from the scanning thread to the
/// index-building thread of a start-up rebuild (`mvcc::store`), unless its
/// keys reach [`REBUILD_BATCH_KEY_BYTES`] first.
pub const REBUILD_BATCH_REVISIONS: usize = 4_096;

/// Bytes of keys that end a rebuild batch (a batch holds at least one key).
pub const REBUILD_BATCH_KEY_BYTES: usize = 1024 * 1024;

/// Batches in flight between the two threads of a rebuild: with the batch
/// bounds above, at most a few megabytes in memory.
pub const REBUILD_BATCHES_IN_FLIGHT: usize = 4;

/// Keys a step of the thread that loads the key index at start-up loads
/// under the store's write lock (`mvcc::loading`; about a millisecond,
/// which writes wait at most).
pub const LOAD_STEP_KEYS: usize = 1_000;

/// Keys of the index compacted per step of the background compactor, each
/// step under the store's write lock (about a millisecond at this size).
pub const COMPACTION_BATCH_KEYS: usize = 1_000;

/// Pause between compaction batches (etcd: 10 ms `compactionSleepInterval`),
/// letting foreground writes through.
pub const COMPACTION_BATCH_PAUSE_MS: u64 = 10;

/// Largest snapshot chunk in one message of the InstallSnapshot stream.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 1024 * 1024;

/// Snapshot chunks a sender produces ahead of the stream (4 MiB): the
/// producer reads the checkpoint while the stream sends.
pub const SNAPSHOT_SEND_CHUNKS_IN_FLIGHT: usize = 4;

/// Received snapshot chunks queued for each thread that prepares the
/// install while the snapshot arrives (its table files, its key index):
/// with 1 MiB chunks, at most 8 MiB per thread in memory; a slower thread
/// slows the stream instead of queueing more.
pub const SNAPSHOT_PREPARE_CHUNKS_IN_FLIGHT: usize = 8;

/// Largest Raft snapshot a member receives (64 GiB): bounds the disk a
/// runaway sender can fill. Eight times etcd's largest suggested
/// `--quota-backend-bytes` (8 GiB); snapshots live in files, so memory does
/// not grow with it.
pub const MAX_SNAPSHOT_BYTES: u64 = 64 * 1024 * 1024 * 1024;

/// Largest batch of log entries sent in one AppendEntries RPC.
pub const MAX_APPEND_ENTRIES_PER_RPC: u64 = 512;

/// Encoded entry bytes per AppendEntries message, at most (etcd's
/// `MaxSizePerMsg`, 1 MiB): the leader stops adding entries once a message
/// reaches it (a message holds at least one entry). Without it, 512 entries
/// of 1 MiB each made one 512 MiB message, held whole by the leader and the
/// follower.
pub const MAX_APPEND_ENTRIES_BYTES: usize = 1024 * 1024;

/// Encoded entry bytes the state machine reads from the log at a time while
/// it applies (at least one entry): what it holds of a committed range it
/// has not applied yet, however long that range is.
pub const MAX_APPLY_READ_BYTES: usize = 1024 * 1024;

/// Encoded bytes of the newest log entries each member keeps in memory as
/// they are appended ([`crate::raft::log_store`]'s tail cache): replication
/// and the state machine read them from there instead of reading and
/// decoding the copy in the segment files. Under load the entries between
/// an append and its apply are the leader's entries in flight, at most
/// [`crate::raft::batcher::MAX_ENTRIES_IN_FLIGHT`] (4) of at most
/// [`crate::raft::batcher::MAX_ENTRY_BYTES`] (1 MiB) each; older entries (a
/// lagging follower's) are read from the segment files.
pub const LOG_TAIL_CACHE_BYTES: usize = 4 * 1024 * 1024;

/// Bytes allocated for each Raft log segment file when it is created
/// ([`crate::wal`]): etcd's WAL segment size. A sync then writes data only,
/// never the file's size; a batch of records larger than this gets a
/// segment of its own that grows past it.
pub const WAL_SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

/// Read buffer while a member replays its Raft log segments at start.
pub const WAL_READ_BUFFER_BYTES: usize = 1024 * 1024;

/// Deadline for one peer RPC (append, vote); snapshots get a longer one.
pub const PEER_RPC_TIMEOUT_MS: u64 = 3_000;

/// Longest wait for openraft's metrics to show the membership loaded from
/// the log after a start (the corruption checks ask every known member).
pub const MEMBERSHIP_LOAD_WAIT_MS: u64 = 5_000;

/// openraft's `install_snapshot_timeout`: sending and installing a snapshot.
pub const PEER_SNAPSHOT_CHUNK_TIMEOUT_MS: u64 = 30_000;

/// How long the bootstrapping member waits for every member of
/// `--initial-cluster` to answer before initializing Raft anyway (etcd
/// waits for peers too; a majority is enough to elect).
pub const BOOTSTRAP_PEER_WAIT_MS: u64 = 2_000;

/// Most log entries the group-commit flusher acknowledges with one fsync;
/// bounds the callbacks held in memory while a sync is in flight.
pub const GROUP_COMMIT_MAX_PENDING: usize = 4_096;
