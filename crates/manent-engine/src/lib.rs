//! manent-engine: a durable workflow engine on SQLite and PostgreSQL.
//!
//! A workflow is a registered async function whose steps are checkpointed in
//! the database before it moves on; after a crash it is replayed, recorded
//! steps return their records and only the interrupted step runs again.
//! Workflows wait on queues stored in the database, partitioned by a key and
//! bounded by per-partition, per-worker and global limits, of the queue and
//! of a limit group several queues share, that every claim enforces atomically. Executors register themselves, heartbeat, resume
//! their own pending work at start, and can have it recovered by others;
//! every checkpoint is fenced so a workflow never has two live runners.
//!
//! The engine knows nothing of deploys: manent's deploy model is built on it.
//!
//! Callers hold the database as a [`Database`] handle and work on it through [`Client`],
//! [`Records`] and [`Engine`]; the storage trait and its SQL (`store/`) are private.
//! The `testing` feature makes `store` public, for tests and benchmarks that check or
//! set up what the engine wrote: enable it only under `[dev-dependencies]`.

mod client;
mod context;
mod database;
mod engine;
mod error;
mod output;
mod policy;
mod records;
#[cfg(feature = "testing")]
pub mod store;
#[cfg(not(feature = "testing"))]
mod store;

pub use client::{Client, EnqueueRequest};
pub use context::WorkflowContext;
pub use database::Database;
pub use engine::{Engine, EngineConfig, LeaseWindow, QueueSpec, ShutdownReport};
pub use error::{EngineError, StoreError, WorkflowError};
pub use output::{DEFAULT_OUTPUT_PER_RUN, MAX_LINE_BYTES, OutputWriter};
pub use policy::StepPolicy;
pub use records::Records;
/// Marks a loop a process runs even when idle (schedule ticks, sweeps): on PostgreSQL it
/// shares the database's one background connection instead of the pool.
pub use store::background;
pub use store::{
    AuditFilter, AuditRecord, Backend, Deleted, EventRecord, ExecutorRecord, ExecutorState,
    LimitGroup, OutputLine, PruneQuery, QueueDepth, QueueRecord, RecordEntry, RunningCount,
    StepRecord, StepStatus, TimeWindow, WorkflowFilter, WorkflowRecord, WorkflowStatus,
    WorkflowVersions,
};
/// Settings of [`Database::open`], and the copy's report: plain data.
pub use store::{Connections, CopyReport};

/// Milliseconds since the Unix epoch: the one clock of the engine's records.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
