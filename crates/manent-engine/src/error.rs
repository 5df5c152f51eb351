//! Error types of the engine: storage failures, start-up refusals and workflow outcomes.

use std::time::Duration;

/// A failure of the storage layer. It names no driver type so that callers
/// never depend on which database is behind a [`crate::Database`].
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached or refused the operation; retrying
    /// later may succeed (connection lost, database restarting, lock timeout).
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The database answered but the operation failed for good.
    #[error("database error: {0}")]
    Database(String),
    /// The database URL is malformed or names an unsupported backend.
    #[error("invalid database url `{url}`: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// A stored value could not be decoded (a corrupted or foreign row).
    #[error("corrupt stored value in {what}: {reason}")]
    Corrupt { what: String, reason: String },
    /// An applied migration's statements differ from this build's: a released migration was
    /// edited, so the schema this database has is not the one this build expects.
    #[error(
        "migration {version} (`{name}`) was applied with checksum {recorded}, but this build's \
         migration {version} has checksum {expected}: a released migration was edited. \
         Run the manent release that applied it, or restore the migration (a change to the \
         schema is a new migration, never an edit)"
    )]
    MigrationEdited {
        version: i64,
        name: String,
        recorded: String,
        expected: String,
    },
    /// The database was migrated by a newer release, with a migration this build may not
    /// run on (not declared compatible with this build's schema).
    #[error(
        "the database's schema is at version {database}, newer than this build's {known}: \
         migration {version} (`{name}`) {}; run a manent release that knows schema {database} \
         (or newer) here, or finish the upgrade before starting this one again",
        compatible_from.map_or_else(
            || "was not declared compatible with older releases".to_string(),
            |from| format!("is compatible with releases of schema {from} or newer only"),
        )
    )]
    SchemaTooNew {
        database: i64,
        known: i64,
        version: i64,
        name: String,
        compatible_from: Option<i64>,
    },
    /// A copy between databases that would lose or mix data: said with what to do.
    #[error("{0}")]
    CopyRefused(String),
}

/// A stored status this build does not know: damage, never a default.
impl From<manent_enum::UnknownValue> for StoreError {
    fn from(e: manent_enum::UnknownValue) -> Self {
        StoreError::Corrupt {
            what: e.what.into(),
            reason: format!("unknown value `{}`", e.value),
        }
    }
}

impl StoreError {
    /// Whether waiting and retrying may help.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// Why the engine refused to start or to carry out a client call.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another live process holds this executor id (docs/scaling-and-recovery.md, Duplicate ids).
    #[error(
        "executor id `{executor_id}` is already in use by a running worker on host `{host}` (pid {pid}, last heartbeat {age_secs}s ago); \
         give this worker its own stable id (dbos.executor_id or DBOS__VMID), or stop the other one"
    )]
    DuplicateExecutor {
        executor_id: String,
        host: String,
        pid: i64,
        age_secs: u64,
    },
    /// `recover` of an id no executor ever had and that holds nothing.
    #[error("unknown executor `{0}`: no worker ever ran with this id; see `manent workers`")]
    UnknownExecutor(String),
    /// `recover` of an executor whose lease is live, without `--force`.
    #[error(
        "executor `{executor_id}` is alive: it holds a live lease (host `{host}`, pid {pid}, renewed {renewed_secs_ago}s ago), \
         so its workflows may be running right now; stop it first, or pass --force to revoke its lease (it stops at its next renewal; its workflows move at the lease's deadline)"
    )]
    ExecutorAlive {
        executor_id: String,
        host: String,
        pid: i64,
        renewed_secs_ago: u64,
    },
    /// This process's lease on its executor id was taken by another process.
    #[error(
        "executor id `{executor_id}` was taken over while this process was not renewing its lease ({detail}); this process stops"
    )]
    LeaseLost { executor_id: String, detail: String },
    #[error("workflow `{0}` is not registered on this engine")]
    UnknownWorkflow(String),
    #[error("workflow `{0}` does not exist")]
    NotFound(String),
    #[error("workflow `{id}` already exists with name `{existing}`, not `{requested}`")]
    IdConflict {
        id: String,
        existing: String,
        requested: String,
    },
    #[error(
        "an active workflow `{existing_id}` already holds deduplication key `{dedup_key}` on queue `{queue}`"
    )]
    Deduplicated {
        queue: String,
        dedup_key: String,
        existing_id: String,
    },
    #[error("workflow `{id}` did not finish within {timeout:?}")]
    WaitTimeout { id: String, timeout: Duration },
    #[error("workflow `{id}` cannot be {action}: it is {status}")]
    InvalidState {
        id: String,
        action: &'static str,
        status: String,
    },
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A stored record that does not decode. It is kept as it is: never taken as
    /// absent, never deleted.
    #[error(
        "the stored {kind} `{id}` cannot be read ({error}); it is kept unchanged: fix or delete the record, \
         or run the manent version that wrote it"
    )]
    Unreadable {
        kind: &'static str,
        id: String,
        error: String,
    },
    #[error("the engine is already launched")]
    AlreadyLaunched,
}

/// The outcome of a workflow function that did not succeed.
///
/// `Failed`, `Step` and `NonDeterminism` end the workflow in ERROR. `Fenced`,
/// `Cancelled` and `Moved` stop this run without touching the workflow's record: the
/// workflow belongs to another runner now, was cancelled, or waits on another queue. `Store` means a
/// checkpoint could not be written; the engine replays the workflow later.
#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    #[error("{0}")]
    Failed(String),
    #[error("step `{name}` failed: {message}")]
    Step { name: String, message: String },
    #[error(
        "non-determinism at step {position}: the record says `{recorded}` but the code now runs `{requested}`; \
         the workflow code changed under a running workflow, refusing to guess"
    )]
    NonDeterminism {
        position: i64,
        recorded: String,
        requested: String,
    },
    #[error("this run was fenced: the workflow was recovered by another executor")]
    Fenced,
    #[error("the workflow was cancelled")]
    Cancelled,
    #[error("the workflow moved to queue `{queue}`; a worker of that queue goes on with it")]
    Moved { queue: String },
    #[error("child workflow `{id}` ended in {status}: {message}")]
    Child {
        id: String,
        status: String,
        message: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl WorkflowError {
    /// A plain failure with a message, for workflow code.
    pub fn failed(message: impl std::fmt::Display) -> Self {
        WorkflowError::Failed(message.to_string())
    }

    /// Whether this run stops without recording an outcome.
    pub(crate) fn stops_silently(&self) -> bool {
        matches!(
            self,
            WorkflowError::Fenced | WorkflowError::Cancelled | WorkflowError::Moved { .. }
        )
    }
}

impl From<serde_json::Error> for WorkflowError {
    fn from(e: serde_json::Error) -> Self {
        WorkflowError::Failed(format!("serialisation: {e}"))
    }
}
