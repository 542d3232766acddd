//! The layout guard: every value the store keeps on disk with this codec
//! (Raft log records, the state machine's meta keys, the snapshot files'
//! metadata) and every message members send each other (openraft's
//! messages, forwarded requests and their answers, snapshot headers,
//! leadership transfers) has a serde layout, which bincode follows field by
//! field. The test traces those layouts (`serde-reflection`) and compares
//! them with the ones recorded for the current storage format
//! (`layouts/storage-format-<n>.json`) and peer protocol
//! (`layouts/peer-protocol-<n>.json`).
//!
//! A change of any of them (a field added, an enum variant inserted, a
//! newer openraft whose messages changed) would make this build misread
//! what an earlier one wrote, or what a member still running it sends. So
//! the test fails until the change comes with a new version: bump
//! `data_dir::FORMAT_VERSION` (and give `data_dir::migrate` the step) or
//! `version::PEER_PROTOCOL_VERSION` (and gate it in `version`'s table),
//! then record the new version's layout with
//! `STORE_RECORD_LAYOUTS=1 cargo test -p store --lib codec::layout`. A
//! recorded layout is never rewritten: earlier versions' files stay, as
//! the record of what every format and protocol was.
#![cfg(test)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use openraft::EntryPayload;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_reflection::{Format, Registry, Samples, Tracer, TracerConfig};

use crate::auth::state::AuthState;
use crate::auth::{AuthCommand, AuthReply};
use crate::errors::EtcdError;
use crate::raft::network::{SnapshotHeader, SnapshotOpening};
use crate::raft::peer_protocol::RaftFailure;
use crate::raft::state_machine::snapshot_file::SavedMeta;
use crate::raft::state_machine::Partial;
use crate::raft::types::MemberAttributes;
use crate::raft::{
    Batch, Command, CommandResponse, Entry, LogId, MemberInfo, Membership, NodeId,
    StoredMembership, TypeConfig, Vote,
};
use crate::server::peer::transfer::{TransferMessage, TransferRefusal};
use crate::server::to_leader::forward::{ForwardError, LeaderReply, LeaderRequest};

/// Environment variable: record the layouts of versions that have none.
const RECORD_ENV: &str = "STORE_RECORD_LAYOUTS";

/// Where the recorded layouts are: under cargo's `CARGO_MANIFEST_DIR` when
/// it runs the tests (a build shared by two checkouts carries the path of
/// the one that compiled it), else the compiled one.
fn layouts_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("layouts")
}

/// The layouts of named values: each root's format, and every named type
/// reachable from them.
///
/// serde-reflection learns a type by deserializing made-up values; an enum
/// nested in another is only learned whole when traced on its own first
/// ([`Self::enumeration`], innermost first), and a value that cannot be
/// made up (a membership must name its voters) from a sample
/// ([`Self::sample`]). [`Self::text`] fails on an enum left incomplete.
/// `Result`s are left out as roots (serde names every one `Result`): their
/// two sides are traced instead; bincode writes a `Result` as the variant
/// index (0 `Ok`, 1 `Err`) and the side.
struct Layouts {
    tracer: Tracer,
    samples: Samples,
    roots: BTreeMap<&'static str, Format>,
}

impl Layouts {
    fn new() -> Self {
        Self {
            tracer: Tracer::new(TracerConfig::default()),
            samples: Samples::new(),
            roots: BTreeMap::new(),
        }
    }

    fn fail(what: &str, e: serde_reflection::Error) -> ! {
        panic!("tracing {what}: {e}")
    }

    /// Learns `T` from `value`, and keeps it as `T`'s sample.
    fn sample<T: Serialize>(mut self, value: &T) -> Self {
        let what = std::any::type_name::<T>();
        self.tracer
            .trace_value(&mut self.samples, value)
            .unwrap_or_else(|e| Self::fail(what, e));
        self
    }

    /// Learns every variant of the enum `T`.
    fn enumeration<T: DeserializeOwned>(mut self) -> Self {
        let what = std::any::type_name::<T>();
        self.tracer
            .trace_type::<T>(&self.samples)
            .unwrap_or_else(|e| Self::fail(what, e));
        self
    }

    /// Traces `T` as the root `name`.
    fn root<T: DeserializeOwned>(mut self, name: &'static str) -> Self {
        let (format, _) = self
            .tracer
            .trace_type::<T>(&self.samples)
            .unwrap_or_else(|e| Self::fail(name, e));
        self.roots.insert(name, format);
        self
    }

    /// The layouts as the recorded files hold them (pretty JSON).
    fn text(self) -> String {
        let types: Registry = self
            .tracer
            .registry()
            .unwrap_or_else(|e| Self::fail("the registry", e));
        let all = serde_json::json!({ "roots": self.roots, "types": types });
        serde_json::to_string_pretty(&all).expect("layouts encode") + "\n"
    }
}

/// A membership of one voter.
fn membership() -> Membership {
    let node = MemberInfo {
        name: "m1".to_string(),
        peer_urls: vec!["http://127.0.0.1:2380".to_string()],
        client_urls: vec!["http://127.0.0.1:2379".to_string()],
    };
    Membership::new(vec![BTreeSet::from([1])], BTreeMap::from([(1, node)]))
        .expect("the voter is a node")
}

/// The enums entries hold, innermost first.
fn entry_enums(layouts: Layouts) -> Layouts {
    layouts
        .sample(&membership())
        .enumeration::<AuthCommand>()
        .enumeration::<Command>()
        .enumeration::<EntryPayload<Batch, NodeId, MemberInfo>>()
}

/// What the data directory holds in this codec.
fn storage_layouts() -> String {
    entry_enums(Layouts::new())
        .root::<Entry>("raft log: entry")
        .root::<Vote>("raft log: vote")
        .root::<Option<LogId>>("raft log: committed, purged; sm/applied")
        .root::<LogId>("raft log: truncated")
        .root::<StoredMembership>("sm/membership")
        .root::<Partial>("sm/applied_part")
        .root::<MemberAttributes>("members: attributes")
        .root::<AuthState>("auth state")
        .root::<SavedMeta>("snapshot.meta")
        .text()
}

/// What members send each other in peer protocol `protocol` (payloads of
/// `storepeer.RaftPeer`; an answer is a `Result` of the two sides named).
fn peer_layouts(protocol: u32) -> String {
    use openraft::raft::{
        AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendError,
        TransferLeaderError, TransferLeaderRequest, VoteRequest, VoteResponse,
    };
    use openraft::ChangeMembers;
    let layouts = entry_enums(Layouts::new())
        .enumeration::<AuthReply>()
        .enumeration::<EtcdError>()
        .enumeration::<CommandResponse>()
        .enumeration::<ForwardError>()
        .enumeration::<ChangeMembers<NodeId, MemberInfo>>()
        .enumeration::<LeaderRequest>()
        .enumeration::<Result<CommandResponse, ForwardError>>()
        .enumeration::<LeaderReply>()
        .enumeration::<AppendEntriesResponse<TypeConfig>>()
        .enumeration::<StreamAppendError<TypeConfig>>()
        .enumeration::<TransferRefusal>()
        .enumeration::<TransferMessage>();
    let layouts = if protocol == 1 {
        // Protocol 1's names of the two transfer methods are each other's.
        layouts
            .root::<String>(
                "AppendEntries, Vote, PreVote, InstallSnapshot, StreamAppend: answer, Err",
            )
            .root::<TransferLeaderRequest<TypeConfig>>("LeaderTransfer: request")
            .root::<TransferMessage>("TransferLeader: request")
            .root::<()>("TransferLeader: answer, Ok")
            .root::<TransferRefusal>("TransferLeader: answer, Err")
            .root::<SnapshotHeader>("InstallSnapshot: header")
    } else {
        layouts
            .enumeration::<RaftFailure>()
            .root::<RaftFailure>(
                "AppendEntries, Vote, PreVote, InstallSnapshot, StreamAppend, TransferLeader: \
                 answer, Err",
            )
            .root::<TransferMessage>("LeaderTransfer: request")
            .root::<()>("LeaderTransfer: answer, Ok")
            .root::<TransferRefusal>("LeaderTransfer: answer, Err")
            .enumeration::<TransferLeaderError<TypeConfig>>()
            .root::<TransferLeaderRequest<TypeConfig>>("TransferLeader: request")
            .root::<()>("TransferLeader: answer, Ok (itself a Result), Ok")
            .root::<TransferLeaderError<TypeConfig>>(
                "TransferLeader: answer, Ok (itself a Result), Err",
            )
            .root::<SnapshotOpening>(
                "InstallSnapshot: header (the chunks follow, then an empty message)",
            )
    };
    layouts
        .root::<AppendEntriesRequest<TypeConfig>>("AppendEntries, StreamAppend: request")
        .root::<AppendEntriesResponse<TypeConfig>>("AppendEntries: answer, Ok")
        .root::<Option<LogId>>("StreamAppend: answer, Ok")
        .root::<StreamAppendError<TypeConfig>>("StreamAppend: answer, Err")
        .root::<VoteRequest<TypeConfig>>("Vote, PreVote: request")
        .root::<VoteResponse<TypeConfig>>("Vote, PreVote: answer, Ok")
        .root::<SnapshotResponse<TypeConfig>>("InstallSnapshot: answer, Ok")
        .root::<LeaderRequest>("Forward: request")
        .root::<LeaderReply>("Forward, ForwardStream: answer, Ok")
        .root::<ForwardError>("Forward, ForwardStream, ReadIndex: answer, Err")
        .root::<(u64, LeaderRequest)>("ForwardStream: request")
        .root::<u64>("ForwardStream: answer's id (before the Result); ReadIndex: answer, Ok")
        .root::<Vote>("ConfirmLeader: request")
        .root::<bool>("ConfirmLeader: answer")
        .text()
}

/// Compares `traced` with the recorded layout `name`, or records it (see
/// the module docs).
fn check(name: &str, bump: &str, traced: &str) {
    let path = layouts_dir().join(format!("{name}.json"));
    match std::fs::read_to_string(&path) {
        Ok(recorded) if recorded == traced => {}
        Ok(recorded) => panic!(
            "the layout of {name} changed: a build reading it would misread what earlier builds \
             wrote or send. Bump {bump}, add the migration or gate, and record the new layout \
             with {RECORD_ENV}=1 ({}). First difference:\n{}",
            path.display(),
            first_difference(&recorded, traced)
        ),
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && std::env::var_os(RECORD_ENV).is_some() =>
        {
            std::fs::create_dir_all(layouts_dir()).expect("layouts directory");
            std::fs::write(&path, traced).expect("recording the layout");
        }
        Err(e) => panic!(
            "no recorded layout for {name} ({}: {e}); a new version records its layout with \
             {RECORD_ENV}=1 cargo test -p store --lib codec::layout",
            path.display()
        ),
    }
}

/// The first line where `a` and `b` differ, with its neighbours.
fn first_difference(a: &str, b: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let at = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let around = |lines: &[&str]| lines[at.saturating_sub(3)..(at + 3).min(lines.len())].join("\n");
    format!(
        "line {}:\n--- recorded\n{}\n+++ traced\n{}",
        at + 1,
        around(&a),
        around(&b)
    )
}

#[test]
fn stored_layouts_are_those_of_the_storage_format() {
    let format = crate::data_dir::FORMAT_VERSION;
    check(
        &format!("storage-format-{format}"),
        "data_dir::FORMAT_VERSION",
        &storage_layouts(),
    );
}

/// Every protocol this build speaks, the oldest included: a member of an
/// earlier build may still send it.
#[test]
fn peer_messages_are_those_of_the_peer_protocols() {
    use crate::version::{OLDEST_PEER_PROTOCOL, PEER_PROTOCOL_VERSION};
    for protocol in OLDEST_PEER_PROTOCOL..=PEER_PROTOCOL_VERSION {
        check(
            &format!("peer-protocol-{protocol}"),
            "version::PEER_PROTOCOL_VERSION",
            &peer_layouts(protocol),
        );
    }
}

#[test]
fn a_changed_layout_shows_where() {
    let diff = first_difference("a\nb\nc\n", "a\nb\nx\n");
    assert!(diff.starts_with("line 3:"), "{diff}");
    assert!(diff.contains("+++ traced\na\nb\nx"), "{diff}");
}
