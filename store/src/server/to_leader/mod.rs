//! What a follower sends its leader, and how: [`forward`] (the requests
//! and answers, and how a failed forward is classified), batched on the
//! way ([`forward_batch`] for writes, [`read_index_batch`] for ReadIndex,
//! [`keepalive_batch`] for lease renewals), each batcher queueing on one
//! [`leader_lane`] per leader, whose batches go as messages of one
//! long-lived stream ([`forward_stream`]).

#[cfg(test)]
mod fake_leader;
pub mod forward;
pub mod forward_batch;
pub mod forward_stream;
pub mod keepalive_batch;
pub mod leader_lane;
pub mod read_index_batch;
