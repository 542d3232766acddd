//! Watch's domain part: the [`hub::WatchHub`] to which the state machine
//! publishes each applied revision's events, a ring bounded in revisions and
//! bytes, shared by all Watch streams. The streams themselves (sessions, catch-up from
//! storage, progress answers) are served by `crate::server::v3rpc::watch`.

pub mod hub;

pub use hub::WatchHub;
