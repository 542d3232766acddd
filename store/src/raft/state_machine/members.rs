//! Member attributes (etcd's "publish"): each member announces its name
//! and client URLs through the log after it starts, so MemberList shows
//! every member as started. Kept in the `meta` table, one key per member.

use std::ops::ControlFlow;

use crate::codec;
use crate::engine::{EngineError, EngineRead, Table};
use crate::raft::types::{MemberAttributes, NodeId};

/// Prefix of the member attribute keys in the `meta` table.
pub const MEMBER_ATTRIBUTES_PREFIX: &[u8] = b"members/attr/";

/// Meta key of a member's published attributes.
pub fn member_attributes_key(id: NodeId) -> Vec<u8> {
    let mut k = MEMBER_ATTRIBUTES_PREFIX.to_vec();
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// Every member's published attributes.
pub fn published_members(engine: &dyn EngineRead) -> Result<Vec<MemberAttributes>, EngineError> {
    let mut out = Vec::new();
    let mut end = MEMBER_ATTRIBUTES_PREFIX.to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    engine.scan(
        Table::Meta,
        MEMBER_ATTRIBUTES_PREFIX,
        Some(&end),
        &mut |_, v| {
            if let Ok(a) = codec::decode::<MemberAttributes>(v) {
                out.push(a);
            }
            ControlFlow::Continue(())
        },
    )?;
    Ok(out)
}
