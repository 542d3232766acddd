//! The one conversion of the store's internal errors to gRPC statuses.
//!
//! etcd's own errors convert through their table in [`crate::errors`]
//! (code and byte-exact message). Everything else that can fail inside a
//! member (the storage engine, a backup, a background task) is not an etcd
//! error: it reaches the client here, as code `Internal` with the error's
//! text, the way etcd's gRPC layer passes unknown errors through. Services
//! use `?` and never build these statuses themselves.

use tonic::Status;

use crate::engine::EngineError;
use crate::kv::KvError;
use crate::mvcc::MvccError;
use crate::snapshot::BackupError;

fn internal(error: &dyn std::error::Error) -> Status {
    Status::internal(error.to_string())
}

impl From<EngineError> for Status {
    fn from(e: EngineError) -> Self {
        internal(&e)
    }
}

impl From<MvccError> for Status {
    fn from(e: MvccError) -> Self {
        match e.to_etcd() {
            Some(etcd) => etcd.into(),
            None => internal(&e),
        }
    }
}

impl From<KvError> for Status {
    fn from(e: KvError) -> Self {
        match e {
            KvError::Etcd(e) => e.into(),
            KvError::Storage(e) => e.into(),
        }
    }
}

impl From<BackupError> for Status {
    fn from(e: BackupError) -> Self {
        internal(&e)
    }
}

/// A password hash that could not be computed.
pub fn hash_failed(e: bcrypt::BcryptError) -> Status {
    internal(&e)
}

/// A blocking task of a request (a hash, a snapshot) that panicked or was
/// cancelled.
pub fn task_failed(e: tokio::task::JoinError) -> Status {
    internal(&e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::EtcdError;

    #[test]
    fn etcd_errors_keep_their_wire_form_through_every_wrapper() {
        let direct = Status::from(EtcdError::Compacted);
        for status in [
            Status::from(MvccError::Compacted),
            Status::from(KvError::Etcd(EtcdError::Compacted)),
        ] {
            assert_eq!(status.code(), direct.code());
            assert_eq!(status.message(), direct.message());
        }
        let storage = Status::from(EngineError::corrupt("a key"));
        assert_eq!(storage.code(), tonic::Code::Internal);
        assert_eq!(storage.message(), "storage engine: corrupt data: a key");
    }
}
