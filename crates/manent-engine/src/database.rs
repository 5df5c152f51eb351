//! The engine's database as the crates above it hold it: an opaque handle, opened,
//! copied and checked here, and handed to [`Client::new`](crate::Client::new) and
//! [`Engine::new`](crate::Engine::new). What a caller may do to the engine's tables is
//! `Client`'s and `Records`' methods; the storage trait behind the handle stays in the
//! engine (its own tests reach it through the `testing` feature).

use std::sync::Arc;

use crate::{
    error::StoreError,
    store::{self, Connections, CopyReport, Store},
};

/// One manent database, SQLite or PostgreSQL: what `Client` and `Engine` work on. Cheap
/// to clone; clones share the connections.
#[derive(Clone)]
pub struct Database(Arc<dyn Store>);

impl Database {
    /// Opens the database named by `url` (`sqlite://path`, `sqlite::memory:`,
    /// `postgres://…`) with the connections a process of this kind needs, and brings its
    /// schema up to date, retrying with an increasing wait while the database is
    /// unreachable or another process is creating the schema at the same time.
    pub async fn open(url: &str, connections: &Connections) -> Result<Database, StoreError> {
        Ok(Database(store::open_with(url, connections).await?))
    }

    /// Copies the whole manent database at `from` (history, schedules, tokens, audit,
    /// output, executors) into the empty one at `to`, either backend to either
    /// (`manent-server admin copy`; docs/scaling-and-recovery.md, "From one machine to
    /// many"). Refused, naming what to do, when `to` holds anything or a process still
    /// holds an executor lease on `from`; a copy that fails leaves `to` empty.
    pub async fn copy(from: &str, to: &str, now_ms: i64) -> Result<CopyReport, StoreError> {
        store::copy(from, to, now_ms).await
    }

    /// The schema version this build migrates to (`/readyz` compares the database's,
    /// [`Client::schema_version`](crate::Client::schema_version), with it).
    pub fn expected_schema_version() -> i64 {
        store::expected_schema_version()
    }

    /// The storage behind the handle, for the engine itself.
    pub(crate) fn into_store(self) -> Arc<dyn Store> {
        self.0
    }

    /// The storage behind the handle: for tests, which check what the engine wrote.
    #[cfg(feature = "testing")]
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.0
    }
}

/// A handle on a store a test opened itself (`store::open`, or a `SqlStore` it set up).
#[cfg(feature = "testing")]
impl From<Arc<dyn Store>> for Database {
    fn from(store: Arc<dyn Store>) -> Self {
        Database(store)
    }
}
