//! openraft's own storage conformance suite, run against our log store and
//! state machine on both engines.

use std::sync::Arc;

use openraft::testing::log::{StoreBuilder, Suite};
use openraft::{ErrorSubject, ErrorVerb, StorageError};
use store::engine::memory::MemoryEngine;
use store::engine::rocks::RocksEngine;
use store::engine::Engine;
use store::mvcc::compactor::spawn_compactor;
use store::mvcc::MvccStore;
use store::raft::log_store::LogStore;
use store::raft::state_machine::StateMachine;
use store::raft::TypeConfig;

struct Builder {
    rocks: bool,
}

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine: Arc<dyn Engine> = if self.rocks {
            Arc::new(RocksEngine::open(&dir.path().join("db")).expect("open rocksdb"))
        } else {
            Arc::new(MemoryEngine::new())
        };
        let mvcc = Arc::new(MvccStore::open(engine.clone()).expect("open mvcc"));
        let compactor = spawn_compactor(mvcc.clone(), None);
        let lessor = Arc::new(store::lease::Lessor::new(std::time::Duration::from_secs(1)));
        let sm = StateMachine::new(
            mvcc,
            dir.path().join("snap"),
            compactor,
            store::watch::WatchHub::new(),
            lessor,
            Arc::new(store::auth::AuthStore::new(
                store::auth::TokenProvider::Simple(store::auth::token::SimpleTokens::new(
                    store::auth::token::DEFAULT_SIMPLE_TOKEN_TTL,
                )),
                store::auth::DEFAULT_BCRYPT_COST,
            )),
        );
        let log = LogStore::open(engine, &dir.path().join("log"))
            .map_err(|e| StorageError::from_io_error(ErrorSubject::Logs, ErrorVerb::Write, e))?;
        Ok((dir, log, sm))
    }
}

#[tokio::test]
async fn openraft_suite_memory_engine() {
    Suite::test_all(Builder { rocks: false })
        .await
        .expect("openraft storage suite (memory)");
}

#[tokio::test]
async fn openraft_suite_rocks_engine() {
    Suite::test_all(Builder { rocks: true })
        .await
        .expect("openraft storage suite (rocksdb)");
}
