//! The storage contract of the engine: records, the [`Store`] trait, and how to open one.
//!
//! Every method speaks in engine terms (workflows, steps, leases, executors);
//! none names a driver type, so the engine and its callers never know whether
//! SQLite or PostgreSQL is behind it. `sql.rs` holds the one implementation of
//! the shared SQL; `sqlite.rs` and `postgres.rs` hold what differs.
//!
//! Private to the engine: the crates above hold a [`Database`](crate::Database) and
//! work through `Client` and `Records`. The `testing` feature makes this module public
//! for tests and benchmarks.

mod claim;
mod driver;
mod grouped;
mod migrations;
mod postgres;
mod session;
mod sql;
mod sqlite;

use std::{fmt, sync::Arc, time::Duration};

use async_trait::async_trait;
use manent_enum::string_enum;
use tokio::sync::broadcast;

pub use sql::SqlStore;

/// The schema version this build expects (`/readyz` compares it to the database's).
pub fn expected_schema_version() -> i64 {
    migrations::latest_version()
}

use crate::error::StoreError;

/// Which database a store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        })
    }
}

/// Opens the store named by `url` (`sqlite://path`, `sqlite::memory:`,
/// `postgres://…`) and brings its schema up to date, retrying with an
/// increasing wait while the database is unreachable or another process is
/// creating the schema at the same time. Tests only, with the default connections;
/// everything else opens a [`Database`](crate::Database).
#[cfg(any(test, feature = "testing"))]
pub async fn open(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    open_with(url, &Connections::default()).await
}

/// `open` with the connections a process of this kind needs.
pub async fn open_with(url: &str, connections: &Connections) -> Result<Arc<dyn Store>, StoreError> {
    let store = SqlStore::connect_with(url, connections).await?;
    store.migrate().await?;
    Ok(Arc::new(store))
}

pub use sql::copy::CopyReport;

/// Copies the whole manent database at `from` (history, schedules, tokens, audit, output,
/// executors) into the empty one at `to`, either backend to either (`manent-server admin
/// copy`; docs/scaling-and-recovery.md, "From one machine to many"). Both are first brought
/// to this build's schema, as starting this release on them would. Refused, naming what to
/// do, when `to` holds anything, or when a process still holds an executor lease on
/// `from` (stop every worker and server first: what they write after the copy would be
/// lost). The rows go in in one transaction: a copy that fails leaves `to` empty.
pub async fn copy(from: &str, to: &str, now_ms: i64) -> Result<CopyReport, StoreError> {
    let connections = Connections {
        max: 2,
        listen: false,
        application_name: "manent admin copy".into(),
        ..Connections::default()
    };
    // Errors name the databases without their passwords.
    let (from_url, to_url) = (from, to);
    let (from, to) = (sql::redact(from), sql::redact(to));
    let source = SqlStore::connect_with(from_url, &connections).await?;
    source.migrate().await?;
    let tables = source.schema_tables().await?;
    let mut known: Vec<String> = sql::copy::TABLES.iter().map(|t| t.to_string()).collect();
    known.sort();
    if tables != known {
        let extra: Vec<&String> = tables.iter().filter(|t| !known.contains(t)).collect();
        return Err(StoreError::CopyRefused(format!(
            "the source {from} has tables this release does not copy ({}): copy it with the \
             manent release that created them",
            extra
                .iter()
                .map(|t| t.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    if source.non_empty_tables().await?.is_empty() {
        return Err(StoreError::CopyRefused(format!(
            "the source {from} holds nothing: check its URL (a SQLite path that does not \
             exist is opened as a new, empty file)"
        )));
    }
    let live = source.live_holders(now_ms).await?;
    if !live.is_empty() {
        return Err(StoreError::CopyRefused(format!(
            "the source {from} is in use: executor {} holds a live lease. Stop every worker \
             and server on it (`systemctl stop manent-worker manent-api`, or end `manent-server \
             serve`) and copy again; a worker killed without a stop is free once its lease \
             runs out (recovery.stale_after)",
            live.join(", executor ")
        )));
    }
    let dest = SqlStore::connect_with(to_url, &connections).await?;
    dest.migrate().await?;
    let taken = dest.non_empty_tables().await?;
    if !taken.is_empty() {
        return Err(StoreError::CopyRefused(format!(
            "the destination {to} is not empty ({} hold rows): copy into a new, empty \
             database (`createdb` on PostgreSQL, a new file on SQLite); nothing was copied",
            taken.join(", ")
        )));
    }
    source.copy_into(&dest).await
}

/// The PostgreSQL connections a store may hold (docs/scaling-and-recovery.md,
/// "Connections"): a pool for requests and runs, one connection for the loops marked
/// [`background`], and, when it listens, one session (LISTEN, the executor's lock, its
/// lease's renewals). A pooled connection idle for `idle_timeout` is closed. SQLite ignores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connections {
    /// The most connections of the pool for requests and runs.
    pub max: u32,
    /// How long a pooled connection may stay unused before it is closed.
    pub idle_timeout: Duration,
    /// Whether to hear other processes' wake-ups (and hold a session for the executor).
    pub listen: bool,
    /// What `pg_stat_activity` shows for each connection (`application_name`).
    pub application_name: String,
}

/// What `open` holds (tests, benchmarks): a pool of 24, as before pools were sized by
/// role; `manent-server` sizes each role's (docs/scaling-and-recovery.md, "Connections").
impl Default for Connections {
    fn default() -> Self {
        Connections {
            max: 24,
            idle_timeout: Duration::from_secs(30),
            listen: true,
            application_name: "manent".into(),
        }
    }
}

tokio::task_local! {
    static BACKGROUND: ();
}

/// Runs `task` as one of the loops a process runs even when idle (claims, heartbeats,
/// recovery, schedule ticks, notifications): on PostgreSQL its statements share the store's
/// one background connection instead of the pool, so an idle process holds that one and its
/// session, and the pool closes what it opened for work (docs/scaling-and-recovery.md,
/// "Connections"). Tasks it spawns are not marked: a run claimed here uses the pool.
pub async fn background<F: Future>(task: F) -> F::Output {
    BACKGROUND.scope((), task).await
}

/// Whether the running task was started through [`background`].
pub(crate) fn in_background() -> bool {
    BACKGROUND.try_with(|_| ()).is_ok()
}

string_enum!(
    /// The life of a workflow, with DBOS's names.
    WorkflowStatus, closed {
        Enqueued = "ENQUEUED",
        Pending = "PENDING",
        Success = "SUCCESS",
        Error = "ERROR",
        Cancelled = "CANCELLED",
    }
);

impl WorkflowStatus {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            WorkflowStatus::Success | WorkflowStatus::Error | WorkflowStatus::Cancelled
        )
    }
}

string_enum!(
    /// A recorded step: `RUNNING` rows mark a started step (and hold a durable
    /// deadline for sleeps and receives); they are rerun on replay.
    StepStatus, closed {
        Running = "RUNNING",
        Success = "SUCCESS",
        Error = "ERROR",
    }
);

string_enum!(
    /// The state an executor reports for itself.
    ExecutorState, closed {
        Running = "running",
        Draining = "draining",
        Stopped = "stopped",
    }
);

/// A workflow to put on a queue.
#[derive(Debug, Clone)]
pub struct NewWorkflow {
    pub id: String,
    pub name: String,
    pub queue: String,
    /// Partition key; `""` for queues without partitions.
    pub partition_key: String,
    /// Lower runs first.
    pub priority: i64,
    /// Not claimed before this time (ms since the epoch).
    pub not_before_ms: i64,
    pub dedup_key: Option<String>,
    /// JSON text.
    pub input: String,
    pub parent_id: Option<String>,
    pub now_ms: i64,
    /// The version of the workflow's code it starts under (ARCHITECTURE.md, "Workflow
    /// versions"): only executors that run this version claim or resume it.
    pub workflow_version: u32,
}

/// One record to write: its kind, its key within the kind, and its value (JSON text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordEntry<'a> {
    pub kind: &'a str,
    pub key: &'a str,
    pub value: &'a str,
}

/// What happened to an enqueue.
#[derive(Debug, Clone)]
pub enum EnqueueOutcome {
    Created,
    /// A workflow with this id exists already (the start is idempotent).
    Exists(Box<WorkflowRecord>),
    /// An active workflow on the queue holds the deduplication key.
    Deduplicated {
        existing_id: String,
    },
}

/// A stored workflow.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowRecord {
    pub id: String,
    pub name: String,
    pub status: WorkflowStatus,
    pub queue: String,
    pub partition_key: String,
    pub priority: i64,
    pub not_before_ms: i64,
    pub dedup_key: Option<String>,
    pub executor_id: Option<String>,
    pub input: String,
    pub output: Option<String>,
    pub error: Option<String>,
    pub parent_id: Option<String>,
    /// How many times the workflow was claimed or taken over.
    pub attempts: i64,
    /// Fencing token: bumped at every claim, take-over and recovery.
    pub generation: i64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    /// The version of the workflow's code it started under (1 for every workflow recorded
    /// before versions were).
    pub workflow_version: u32,
}

impl WorkflowRecord {
    pub fn lease(&self) -> Option<Lease> {
        Some(Lease {
            workflow_id: self.id.clone(),
            executor_id: self.executor_id.clone()?,
            generation: self.generation,
        })
    }
}

/// The right of one executor to write checkpoints for one workflow. Every
/// write checks it, so a runner whose workflow was recovered away is fenced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub workflow_id: String,
    pub executor_id: String,
    pub generation: i64,
}

/// The limits a claim must respect; all are counted inside the claiming transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimLimits {
    /// Running workflows of the queue on this executor.
    pub worker: u32,
    /// Running workflows of the queue per partition key across all executors; `None` = no limit.
    pub partition: Option<u32>,
    /// Running workflows of the queue across all executors; 0 = no limit.
    pub global: u32,
    /// Limits the queue shares with every other queue of the same group,
    /// counted over all of them; `None` = the queue's own limits only.
    pub group: Option<LimitGroup>,
}

/// Limits shared by several queues: a workflow claimed from any queue of the
/// group holds one slot of each until its final status (or until it leaves
/// for another queue). Every queue of a group must be served with the same
/// group limits by every executor (the per-executor limit may differ).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitGroup {
    pub name: String,
    /// Running workflows of the group on one executor; `None` = no limit.
    pub worker: Option<u32>,
    /// Running workflows of the group per partition key, across executors; `None` = no limit.
    pub partition: Option<u32>,
    /// Running workflows of the group across executors; `None` = no limit.
    pub global: Option<u32>,
}

impl LimitGroup {
    pub fn new(name: impl Into<String>) -> Self {
        LimitGroup {
            name: name.into(),
            worker: None,
            partition: None,
            global: None,
        }
    }
}

/// How many workflows run now under one (queue, group, executor, partition) combination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningCount {
    pub queue: String,
    /// The limit group the workflows were claimed under.
    pub group: Option<String>,
    pub executor_id: Option<String>,
    pub partition_key: String,
    pub running: i64,
}

/// A stored step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    pub workflow_id: String,
    pub index: i64,
    pub name: String,
    pub status: StepStatus,
    pub output: Option<String>,
    pub error: Option<String>,
    pub attempts: i64,
    pub started_at_ms: i64,
    pub finished_at_ms: Option<i64>,
    pub executor_id: String,
}

/// Outcome of a fenced write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checkpoint {
    Written,
    /// The lease no longer holds: the workflow was recovered, cancelled or finished elsewhere.
    Fenced,
}

/// Outcome of consuming a message inside a workflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Consumed {
    Message(String),
    Empty,
    Fenced,
}

/// A stored queue with its kind and limits (for display; claims take limits from the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueRecord {
    pub name: String,
    pub kind: String,
    pub worker_concurrency: Option<i64>,
    pub partition_concurrency: Option<i64>,
    pub global_concurrency: i64,
    pub updated_at_ms: i64,
}

/// Counts of a queue's workflows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueueDepth {
    pub queue: String,
    pub enqueued: i64,
    pub running: i64,
}

/// An executor's row.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutorRecord {
    pub id: String,
    pub host: String,
    pub pid: i64,
    pub region: Option<String>,
    pub queues: Vec<String>,
    pub state: ExecutorState,
    pub started_at_ms: i64,
    pub heartbeat_at_ms: i64,
    pub stopped_at_ms: Option<i64>,
    pub version: String,
    /// The workflow versions this executor runs.
    pub workflow_versions: WorkflowVersions,
    /// PENDING workflows held by this executor (filled by listings).
    pub running: i64,
}

/// The versions of workflow code an executor can run, `min..=max` (ARCHITECTURE.md,
/// "Workflow versions"). A workflow is claimed, resumed and replayed only by an executor
/// whose range holds the version it started under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkflowVersions {
    pub min: u32,
    pub max: u32,
}

impl WorkflowVersions {
    /// Version 1 only: what every executor before workflow versions ran.
    pub const FIRST: WorkflowVersions = WorkflowVersions { min: 1, max: 1 };

    /// `min..=max`; `None` when the range is empty or starts at 0.
    pub fn new(min: u32, max: u32) -> Option<WorkflowVersions> {
        (min >= 1 && min <= max).then_some(WorkflowVersions { min, max })
    }

    pub fn contains(&self, version: u32) -> bool {
        (self.min..=self.max).contains(&version)
    }
}

impl std::fmt::Display for WorkflowVersions {
    /// `1` or `1-2`, as `manent-server --version` and `manent workers` show it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}-{}", self.min, self.max)
        }
    }
}

/// The lease that makes one process the live holder of an executor id. It is
/// renewed by the holder's heartbeat; nobody else takes the id before it
/// expires (or the holder is proven dead, or an operator forces a recovery).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorLease {
    pub executor_id: String,
    /// Unique to one process incarnation (host, pid and a random part).
    pub holder: String,
    pub host: String,
    pub pid: i64,
    pub acquired_at_ms: i64,
    pub renewed_at_ms: i64,
    /// The holder's own clock's promise: it stops acting on the id before then.
    pub expires_at_ms: i64,
}

impl ExecutorLease {
    /// Whether its holder may still be acting on the id at `now_ms`.
    pub fn is_live(&self, now_ms: i64) -> bool {
        self.expires_at_ms > now_ms
    }
}

/// The answer to a request for an executor id's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseGrant {
    Granted,
    /// Another holder's lease is live (and was not overridden).
    Held(ExecutorLease),
}

/// The answer to a lease renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    Renewed,
    /// The lease is no longer ours: taken by the holder shown, or revoked
    /// (`None`) by a forced recovery.
    Lost(Option<ExecutorLease>),
}

/// A stored event (key/value progress published by a workflow).
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord {
    pub key: String,
    pub value: String,
    pub updated_at_ms: i64,
}

/// One line a workflow's step printed (a command's stdout or stderr, a plugin's
/// progress), kept apart from checkpoints: written as it is printed, never replayed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OutputLine {
    /// Assigned by the store, increasing: where a reader that follows goes on from.
    pub seq: i64,
    pub at_ms: i64,
    /// The run (claim or recovery) that printed it: a step run again prints again.
    pub generation: i64,
    /// Who printed it, e.g. `web-1: command 1`.
    pub source: String,
    /// `stdout`, `stderr` or `progress`.
    pub stream: String,
    pub line: String,
}

/// Filters for listing workflows.
#[derive(Debug, Clone, Default)]
pub struct WorkflowFilter {
    pub status: Option<WorkflowStatus>,
    pub queue: Option<String>,
    pub name: Option<String>,
    pub executor_id: Option<String>,
    pub parent_id: Option<String>,
    /// `<application>/<environment>` for deploys: one partition's history.
    pub partition_key: Option<String>,
    /// Partitions whose key starts with this (`<application>/`: every environment of one
    /// application), read as a range of the partition index.
    pub partition_prefix: Option<String>,
    /// Only workflows enqueued before the one with this id (the next page after it); none
    /// when no workflow has that id.
    pub before_id: Option<String>,
    pub limit: Option<i64>,
    /// How many of the newest matches to pass over (paging).
    pub offset: Option<i64>,
}

/// One entry of the audit trail: who did what, when, with which outcome.
/// Appended, never changed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AuditRecord {
    /// Assigned by the store (increasing); ignored when appending.
    pub seq: i64,
    pub at_ms: i64,
    /// The acting API token's name (`-` when the request carried no known token).
    pub actor: String,
    /// The acting token's stable id (empty when unknown).
    pub actor_id: String,
    /// What was attempted (`deploy.submit`, `token.revoke`, `GET /api/v1/…` for a refusal).
    pub action: String,
    /// What it was about: a deploy, schedule, executor or token id, or an application.
    pub target: String,
    /// The HTTP status it ended with (201, 403, …).
    pub outcome: i64,
    /// The error message of a failure, or a note.
    pub detail: String,
}

/// Which entries of the audit trail to read, newest first (docs/api.md, "Audit trail").
/// Every filter is optional; `before` pages back from a previous answer's last `seq`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// Entries at or after this time (ms since the epoch).
    pub since_ms: Option<i64>,
    /// Entries strictly before this time (ms since the epoch).
    pub until_ms: Option<i64>,
    /// The token name (`-` for requests without a valid token).
    pub actor: Option<String>,
    /// The action exactly (`deploy.submit`, `auth.failures`, `GET /api/v1/deploys`).
    pub action: Option<String>,
    /// Entries whose `seq` is below this one: the next page after an answer ending at it.
    pub before_seq: Option<i64>,
    /// At most this many entries.
    pub limit: i64,
}

impl AuditFilter {
    /// The newest `limit` entries, whatever they are.
    pub fn newest(limit: i64) -> Self {
        AuditFilter {
            limit,
            ..Default::default()
        }
    }
}

/// Which finished workflows retention may remove, oldest end first (docs/configuration.md,
/// `retention`). Only top-level workflows are chosen: their children go with them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneQuery {
    /// The workflows' name.
    pub name: String,
    /// Only those that ended before this (ms since the epoch).
    pub finished_before_ms: i64,
    /// The newest this many successful workflows of each partition are never chosen,
    /// however old.
    pub keep_successful: i64,
    /// At most this many.
    pub limit: i64,
}

/// What [`Client::delete_workflows`](crate::Client::delete_workflows) removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Deleted {
    /// The workflows asked for.
    pub workflows: u64,
    /// Their children (a deploy's region passes).
    pub children: u64,
    /// The step records of both.
    pub steps: u64,
    /// Their output lines.
    pub output_lines: u64,
}

/// A change other parties may be waiting for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wakeup {
    /// Work may be claimable on this queue (enqueued, or a slot freed).
    Queue(String),
    /// This workflow changed (finished, got a message, published an event).
    Workflow(String),
    /// Another process wrote to the database, what is not known (SQLite, which has no
    /// notifications: `sqlite::ExternalWrites`). Whoever waits on the database looks again.
    Elsewhere,
}

/// Proof of whether the previous holder of an executor id is still alive.
pub enum Liveness {
    /// We hold the id's liveness lock now: any previous holder is dead.
    /// Dropping the guard releases it.
    Acquired(Box<dyn Send + Sync>),
    /// A live process holds the lock.
    HeldElsewhere,
    /// This backend cannot prove it (for example an in-memory database).
    Unprovable,
}

impl fmt::Debug for Liveness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Liveness::Acquired(_) => "Acquired",
            Liveness::HeldElsewhere => "HeldElsewhere",
            Liveness::Unprovable => "Unprovable",
        })
    }
}

/// Durable storage for the engine.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    fn backend(&self) -> Backend;
    /// Brings the schema up to date; safe to call from many processes at once.
    async fn migrate(&self) -> Result<(), StoreError>;
    /// The schema version this store is at.
    async fn schema_version(&self) -> Result<i64, StoreError>;

    // --- queues ---
    async fn upsert_queue(&self, queue: &QueueRecord) -> Result<(), StoreError>;
    async fn list_queues(&self) -> Result<Vec<QueueRecord>, StoreError>;
    async fn queue_depths(&self) -> Result<Vec<QueueDepth>, StoreError>;
    /// The running (PENDING) workflows, counted per queue, group, executor and partition.
    async fn running_counts(&self) -> Result<Vec<RunningCount>, StoreError>;

    // --- workflows ---
    async fn enqueue(&self, workflow: &NewWorkflow) -> Result<EnqueueOutcome, StoreError>;
    /// Enqueues many workflows in one transaction (a bulk submission); the
    /// outcomes are in the order of `workflows`. All or none are written.
    async fn enqueue_many(
        &self,
        workflows: &[NewWorkflow],
    ) -> Result<Vec<EnqueueOutcome>, StoreError>;
    /// Atomically moves up to `max` claimable workflows of `queue` to PENDING
    /// under `executor_id`, never exceeding `limits` (the queue's own and its
    /// group's). Each partition's next workflows are found through an index,
    /// so the cost follows the running work, not the backlog. Only workflows whose
    /// version is in `versions` are taken; a partition whose next workflow is of another
    /// version is left for an executor that runs it.
    async fn claim(
        &self,
        queue: &str,
        executor_id: &str,
        versions: WorkflowVersions,
        limits: ClaimLimits,
        now_ms: i64,
        max: u32,
    ) -> Result<Vec<WorkflowRecord>, StoreError>;
    /// The earliest not-before time of an ENQUEUED workflow of `queue` later than `now_ms`.
    async fn next_not_before(&self, queue: &str, now_ms: i64) -> Result<Option<i64>, StoreError>;
    async fn get_workflow(&self, id: &str) -> Result<Option<WorkflowRecord>, StoreError>;
    async fn list_workflows(
        &self,
        filter: &WorkflowFilter,
    ) -> Result<Vec<WorkflowRecord>, StoreError>;
    /// Takes over the PENDING workflows left under `executor_id` by its previous
    /// process: bumps their generation (fencing any straggler) and returns them.
    async fn take_over_own(
        &self,
        executor_id: &str,
        now_ms: i64,
    ) -> Result<Vec<WorkflowRecord>, StoreError>;
    /// Records the final outcome if the lease still holds.
    async fn finish(
        &self,
        lease: &Lease,
        status: WorkflowStatus,
        output: Option<&str>,
        error: Option<&str>,
        now_ms: i64,
    ) -> Result<Checkpoint, StoreError>;
    /// ENQUEUED or PENDING → CANCELLED. Returns the status after the call.
    async fn cancel(&self, id: &str, now_ms: i64) -> Result<Option<WorkflowStatus>, StoreError>;
    /// CANCELLED → ENQUEUED (resumes from its checkpoints). Returns the status after the call.
    async fn resume(&self, id: &str, now_ms: i64) -> Result<Option<WorkflowStatus>, StoreError>;
    /// Hands the PENDING workflows of `executor_id` back to their queues and
    /// records `note` as a `recovery:<now_ms>` event of each one moved.
    async fn recover_executor(
        &self,
        executor_id: &str,
        note: &str,
        now_ms: i64,
    ) -> Result<Vec<String>, StoreError>;
    /// Hands back the PENDING workflows of every executor whose heartbeat is
    /// older than `stale_before_ms` and whose lease is not live at `now_ms`,
    /// except `except`. Returns (executor, workflow) pairs.
    async fn recover_stale(
        &self,
        stale_before_ms: i64,
        except: &str,
        now_ms: i64,
    ) -> Result<Vec<(String, String)>, StoreError>;

    // --- steps ---
    async fn load_steps(&self, workflow_id: &str) -> Result<Vec<StepRecord>, StoreError>;
    /// Writes (or overwrites a RUNNING) step record if the lease holds.
    async fn record_step(&self, lease: &Lease, step: &StepRecord)
    -> Result<Checkpoint, StoreError>;

    /// Moves the lease's workflow to `queue` (and partition): records `step`, then
    /// makes the workflow ENQUEUED there with a new generation, in one
    /// transaction, if the lease holds. The next claim on `queue` replays it.
    async fn move_to_queue(
        &self,
        lease: &Lease,
        step: &StepRecord,
        queue: &str,
        partition_key: &str,
        now_ms: i64,
    ) -> Result<Checkpoint, StoreError>;
    /// Hands the lease's workflow back to its queue (ENQUEUED, new generation)
    /// if the lease holds: a draining executor gives up its durable waits.
    async fn release(&self, lease: &Lease, now_ms: i64) -> Result<Checkpoint, StoreError>;

    // --- metrics ---
    /// How many workflows named `name` are in each status.
    async fn count_by_status(&self, name: &str) -> Result<Vec<(WorkflowStatus, i64)>, StoreError>;
    /// How many workflows named `name` are queued (ENQUEUED), per workflow version.
    async fn count_enqueued_by_version(&self, name: &str) -> Result<Vec<(u32, i64)>, StoreError>;
    /// The steps that finished in `(after_ms, until_ms]`, oldest first, at most `limit`:
    /// `(finished_at, duration)` in ms (the engine's own bookkeeping — `manent.*` — left
    /// out). Read from an index, so a scrape costs what it reads.
    async fn steps_finished_between(
        &self,
        window: TimeWindow,
    ) -> Result<Vec<(i64, i64)>, StoreError>;
    /// The workflows first claimed in `(after_ms, until_ms]`, oldest first, at most
    /// `limit`: `(started_at, latency)` in ms, the latency from ready (created, or its
    /// not-before time) to that claim.
    async fn workflows_started_between(
        &self,
        window: TimeWindow,
    ) -> Result<Vec<(i64, i64)>, StoreError>;
    /// The workflows named `name` that ended in `(after_ms, until_ms]`, oldest first, at
    /// most `limit`: `(finished_at, status)`.
    async fn workflows_finished_between(
        &self,
        name: &str,
        window: TimeWindow,
    ) -> Result<Vec<(i64, WorkflowStatus)>, StoreError>;

    // --- messages and events ---
    async fn send_message(
        &self,
        workflow_id: &str,
        topic: &str,
        payload: &str,
        now_ms: i64,
    ) -> Result<(), StoreError>;
    /// Atomically takes the oldest message on `topic` for the lease's workflow
    /// and records it as `step` (its output set to the payload).
    async fn consume_message(
        &self,
        lease: &Lease,
        topic: &str,
        step: &StepRecord,
    ) -> Result<Consumed, StoreError>;
    /// Publishes an event and records `step` in one transaction, if the lease holds.
    async fn set_event(
        &self,
        lease: &Lease,
        key: &str,
        value: &str,
        step: &StepRecord,
    ) -> Result<Checkpoint, StoreError>;
    async fn list_events(&self, workflow_id: &str) -> Result<Vec<EventRecord>, StoreError>;
    /// The events of many workflows at once, as `(workflow_id, event)`: a view of many
    /// deploys costs a constant number of queries, not one per deploy.
    async fn list_events_of(
        &self,
        workflow_ids: &[String],
    ) -> Result<Vec<(String, EventRecord)>, StoreError>;

    // --- executors ---
    async fn upsert_executor(&self, executor: &ExecutorRecord) -> Result<(), StoreError>;
    async fn get_executor(&self, id: &str) -> Result<Option<ExecutorRecord>, StoreError>;
    async fn heartbeat(
        &self,
        id: &str,
        state: ExecutorState,
        now_ms: i64,
    ) -> Result<(), StoreError>;
    async fn list_executors(&self) -> Result<Vec<ExecutorRecord>, StoreError>;
    /// Tries to take the liveness lock of an executor id, held for the life of the guard.
    async fn acquire_liveness(&self, executor_id: &str) -> Result<Liveness, StoreError>;
    /// Whether the liveness lock of an executor id is free now (looked at, not kept);
    /// `None` when the backend cannot tell. A free lock under a live lease makes its holder
    /// suspect, not dead: a cut PostgreSQL connection frees it too.
    async fn liveness_free(&self, executor_id: &str) -> Result<Option<bool>, StoreError>;
    /// Takes the lease of `lease.executor_id` for `lease.holder` if it is free,
    /// expired or already this holder's; `override_live` takes it even from a
    /// live holder (only with a proof that the holder is dead). Atomic: of
    /// concurrent requests for a free id, one is granted.
    async fn acquire_executor_lease(
        &self,
        lease: &ExecutorLease,
        override_live: bool,
    ) -> Result<LeaseGrant, StoreError>;
    /// Extends the lease to `expires_at_ms` if `holder` still holds it (live or expired).
    async fn renew_executor_lease(
        &self,
        executor_id: &str,
        holder: &str,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<Renewal, StoreError>;
    async fn get_executor_lease(
        &self,
        executor_id: &str,
    ) -> Result<Option<ExecutorLease>, StoreError>;
    /// The executor ids whose lease has not expired at `now_ms`.
    async fn live_executor_ids(&self, now_ms: i64) -> Result<Vec<String>, StoreError>;
    /// Ends the lease: `holder`'s own (a clean stop), or whoever holds it
    /// (`None`). Returns whether a lease was ended.
    async fn end_executor_lease(
        &self,
        executor_id: &str,
        holder: Option<&str>,
    ) -> Result<bool, StoreError>;
    /// Takes the lease from `holder` but keeps its deadline: the holder's next
    /// renewal fails and it stops, and no newcomer is admitted before the
    /// deadline by which a holder that cannot renew has stopped its commands.
    /// Returns whether `holder` held it.
    async fn revoke_executor_lease(
        &self,
        executor_id: &str,
        holder: &str,
    ) -> Result<bool, StoreError>;

    // --- records: small JSON documents of the engine's users (tokens, schedules, …) ---
    /// Inserts or replaces the record `(kind, key)`.
    async fn put_record(
        &self,
        kind: &str,
        key: &str,
        value: &str,
        now_ms: i64,
    ) -> Result<(), StoreError>;
    /// Inserts the record only if `(kind, key)` is free; returns whether it was inserted.
    async fn insert_record(
        &self,
        kind: &str,
        key: &str,
        value: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError>;
    /// Inserts every record of `records`, all or none, in one transaction: if any
    /// `(kind, key)` is taken, nothing is written and `false` is returned. For a value
    /// kept under several keys (a token under its name and its hash), so that a crash
    /// between two writes cannot leave one key held with nothing behind it.
    async fn insert_records(
        &self,
        records: &[RecordEntry<'_>],
        now_ms: i64,
    ) -> Result<bool, StoreError>;
    async fn get_record(&self, kind: &str, key: &str) -> Result<Option<String>, StoreError>;
    async fn list_records(&self, kind: &str) -> Result<Vec<(String, String)>, StoreError>;
    async fn delete_record(&self, kind: &str, key: &str) -> Result<bool, StoreError>;
    /// Deletes every `(kind, key)` of `keys` in one transaction; returns how many existed.
    async fn delete_records(&self, keys: &[(&str, &str)]) -> Result<u64, StoreError>;

    // --- output (append-only, outside the checkpoints) ---
    /// Appends lines of one workflow; their `seq` is assigned by the store.
    async fn append_output(
        &self,
        workflow_id: &str,
        lines: &[OutputLine],
    ) -> Result<(), StoreError>;
    /// A workflow's lines with `seq` above `after`, oldest first, at most `limit`.
    async fn list_output(
        &self,
        workflow_id: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<OutputLine>, StoreError>;

    // --- audit trail (append-only) ---
    /// Appends one entry; its `seq` is assigned by the store.
    async fn append_audit(&self, entry: &AuditRecord) -> Result<(), StoreError>;
    /// The newest entries `filter` admits, newest first (by `seq`).
    async fn list_audit(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>, StoreError>;

    // --- retention ---
    /// The ids of finished workflows `query` lets go.
    async fn prunable_workflows(&self, query: &PruneQuery) -> Result<Vec<String>, StoreError>;
    /// Removes finished workflows `ids`, their children, and everything recorded under
    /// them (steps, events, messages, output), in one transaction. A workflow that is not
    /// finished is left alone.
    async fn delete_workflows(&self, ids: &[String]) -> Result<Deleted, StoreError>;
    /// What [`Store::delete_workflows`] would remove of `ids` now, counted by the same walk
    /// (nothing removed), and how many of those output lines are from before
    /// `old_output_before` and of finished workflows ([`Store::prune_output`] counts them
    /// too): a dry run's figures are the real run's.
    async fn count_workflows_removal(
        &self,
        ids: &[String],
        old_output_before: Option<i64>,
    ) -> Result<(Deleted, u64), StoreError>;
    /// Output lines written before `before_ms` by finished workflows: removes at most
    /// `limit` of them, oldest first (or only counts them, `dry_run`).
    async fn prune_output(
        &self,
        before_ms: i64,
        limit: i64,
        dry_run: bool,
    ) -> Result<u64, StoreError>;
    /// Audit entries from before `before_ms`: removes at most `limit`, oldest first (or
    /// only counts them, `dry_run`).
    async fn prune_audit(
        &self,
        before_ms: i64,
        limit: i64,
        dry_run: bool,
    ) -> Result<u64, StoreError>;
    /// Gives the space freed by removals back to the file system where the backend does
    /// it on request: SQLite's incremental vacuum, or with `full` a `VACUUM` that rewrites
    /// the file (and makes a file created before incremental vacuum use it from then on).
    /// PostgreSQL: a plain `VACUUM (SKIP_LOCKED)` of the tables deploys churn, which makes
    /// their dead rows' space reusable even where autovacuum is off or behind.
    async fn reclaim_space(&self, full: bool) -> Result<(), StoreError>;

    // --- wake-ups ---
    /// Changes made by this process and, where the backend can tell, by others.
    fn subscribe(&self) -> broadcast::Receiver<Wakeup>;
    /// How often to look for work nobody told us about (the fallback poll).
    fn poll_interval(&self) -> Duration;
}

/// Rows by a time column in `(after_ms, until_ms]`, oldest first, at most `limit` (the
/// metrics' incremental reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeWindow {
    pub after_ms: i64,
    pub until_ms: i64,
    pub limit: i64,
}
