//! The SQL both backends share: one implementation of [`Store`], written once
//! and compiled for each driver by the `with_pool!` / `write_tx!` macros.
//!
//! Dialect differences are few and explicit: write transactions start with
//! `BEGIN IMMEDIATE` on SQLite (one writer at a time) and take a per-queue
//! (or per-limit-group) advisory lock on PostgreSQL when claiming; PostgreSQL also row-locks the
//! workflow (`FOR SHARE`) when a step is checkpointed, so a recovery waits for
//! a checkpoint in flight instead of racing it.

use std::{path::PathBuf, time::Duration};

use async_trait::async_trait;
use sqlx::{PgPool, postgres::PgConnectOptions, sqlite::SqlitePool};
use tokio::sync::broadcast;

use super::{
    AuditFilter, AuditRecord, Backend, Checkpoint, ClaimLimits, Connections, Consumed,
    EnqueueOutcome, EventRecord, ExecutorLease, ExecutorRecord, ExecutorState, Lease, LeaseGrant,
    Liveness, NewWorkflow, OutputLine, QueueDepth, QueueRecord, RecordEntry, Renewal, RunningCount,
    StepRecord, Store, TimeWindow, Wakeup, WorkflowFilter, WorkflowRecord, WorkflowStatus,
    WorkflowVersions, postgres, session, sqlite,
};
use crate::error::StoreError;

enum Pool {
    /// Reads on `read`; every write on `write`, the one writer connection
    /// (`sqlite::Pools`); step checkpoints and outcomes through `group`.
    Sqlite {
        read: SqlitePool,
        write: SqlitePool,
        group: sqlite::GroupCommit,
        unsynced: sqlite::UnsyncedCommit,
    },
    /// Requests and runs; the background loops use [`SqlStore::pg_background`].
    Postgres(PgPool),
}

/// Runs `$body` with `$pool` bound to the driver's pool for reads; the body is
/// compiled once per driver. A write uses [`with_writer!`].
macro_rules! with_pool {
    ($store:expr, $pool:ident => $body:expr) => {
        match &$store.pool {
            $crate::store::sql::Pool::Sqlite { read: $pool, .. } => $body,
            $crate::store::sql::Pool::Postgres(main) => {
                let $pool = $store.pg_pool(main);
                $body
            }
        }
    };
}

/// [`with_pool!`] for a write outside a transaction: on SQLite, the writer connection.
macro_rules! with_writer {
    ($store:expr, $pool:ident => $body:expr) => {
        match &$store.pool {
            $crate::store::sql::Pool::Sqlite { write: $pool, .. } => $body,
            $crate::store::sql::Pool::Postgres(main) => {
                let $pool = $store.pg_pool(main);
                $body
            }
        }
    };
}

/// Runs `$body` inside a write transaction bound to `$tx` and commits it.
/// An early return (`?`) rolls the transaction back. `pg_begin`, when given,
/// opens the transaction on PostgreSQL (a `BEGIN` followed by statements that
/// belong to it, in one round trip). `claim_begin` is the same for a claim,
/// whose commit on SQLite is not synced (`sqlite::UnsyncedCommit`).
macro_rules! write_tx {
    ($store:expr, $tx:ident => $body:expr) => {
        write_tx!(@tx $store, String::from("BEGIN"), false, $tx => $body)
    };
    ($store:expr, pg_begin = $begin:expr, $tx:ident => $body:expr) => {
        write_tx!(@tx $store, $begin, false, $tx => $body)
    };
    ($store:expr, claim_begin = $begin:expr, $tx:ident => $body:expr) => {
        write_tx!(@tx $store, $begin, true, $tx => $body)
    };
    (@tx $store:expr, $pg_begin:expr, $unsynced:expr, $tx:ident => $body:expr) => {
        match &$store.pool {
            $crate::store::sql::Pool::Sqlite { write: pool, unsynced, .. } => {
                let mut conn = pool.acquire().await?;
                let mut $tx = if $unsynced {
                    // Back to FULL as `conn` returns to the pool, before any other
                    // write may take it, and not on the claim's way to its runs.
                    unsynced.begin(&mut conn).await
                } else {
                    sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await
                }?;
                let result = $body;
                $tx.commit().await?;
                result
            }
            $crate::store::sql::Pool::Postgres(main) => {
                // Not `pool.begin_with`: see `postgres::BeginGuard`.
                let pool = $store.pg_pool(main);
                let mut guard = $crate::store::postgres::BeginGuard::acquire(pool).await?;
                let mut $tx = guard.begin($pg_begin).await?;
                let result = $body;
                $tx.commit().await?;
                result
            }
        }
    };
}

/// The workflow columns, in [`WorkflowRow`] order.
macro_rules! wf_cols {
    () => {
        "id, name, status, queue_name, partition_key, priority, not_before, dedup_key, executor_id, input, output, \
         error, parent_id, attempts, generation, created_at, updated_at, started_at, finished_at, \
         COALESCE(workflow_version, 1) AS workflow_version"
    };
}

macro_rules! step_cols {
    () => {
        "workflow_id, step_index, name, status, output, error, attempts, started_at, finished_at, executor_id"
    };
}

/// `persistent(ONE_OFF)` on a statement whose text changes with a count (an `IN` list of
/// a chunk's ids, a multi-row `INSERT`): prepared for the one execution, then closed. Each
/// connection otherwise caches up to 100 prepared statements, and those texts are many (one
/// per chunk length, up to 200 or 500): every connection of a worker's pool slowly filled
/// its cache with large ones, a worker's memory grew by 5 MB over 54,000 deploys
/// (bench/README.md, the soak) and each PostgreSQL backend kept them too.
const ONE_OFF: bool = false;

mod claims;
pub(crate) mod copy;
mod executors;
mod messages;
mod migrate;
mod records;
mod retention;
mod rows;
mod steps;
#[cfg(test)]
mod tests;
mod workflows;

/// The store over SQLite or PostgreSQL.
pub struct SqlStore {
    pool: Pool,
    bus: broadcast::Sender<Wakeup>,
    sqlite_path: Option<PathBuf>,
    pg_options: Option<PgConnectOptions>,
    /// PostgreSQL: step checkpoints and outcomes, grouped into one statement each.
    pg_group: Option<postgres::GroupWrites>,
    /// PostgreSQL: the one connection of the loops marked `store::background`.
    pg_background: Option<PgPool>,
    /// PostgreSQL: LISTEN, the executor's lock and its lease's renewals (none if not listening).
    pg_session: Option<session::Session>,
    /// Workflows a claim of this process left for another workflow version, already
    /// logged once (claims.rs); bounded.
    left_for_other_versions: std::sync::Mutex<std::collections::HashSet<String>>,
    /// SQLite on a file: the task that tells this process of other processes' writes.
    _external_writes: Option<sqlite::ExternalWrites>,
}

impl SqlStore {
    /// Connects to `url`, retrying with an increasing wait while the server is unreachable.
    /// Tests only: the engine opens its stores through [`super::open_with`].
    #[cfg(any(test, feature = "testing"))]
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, &Connections::default()).await
    }

    /// `SqlStore::connect` holding the PostgreSQL connections `connections` allows.
    pub async fn connect_with(url: &str, connections: &Connections) -> Result<Self, StoreError> {
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else {
            return Err(StoreError::InvalidUrl {
                url: url.to_string(),
                reason: "expected sqlite://PATH, sqlite::memory: or postgres://…".into(),
            });
        };
        retry_transient("connect to the database", || async {
            match backend {
                Backend::Sqlite => {
                    let pools = sqlite::connect(url)
                        .await
                        .map_err(|e| connect_err(url, e))?;
                    let bus = sqlite::wakeup_bus(pools.path.as_deref());
                    // In memory, no other connection can write.
                    let external_writes = pools
                        .path
                        .is_some()
                        .then(|| sqlite::ExternalWrites::spawn(pools.write.clone(), bus.clone()));
                    Ok(SqlStore {
                        bus,
                        _external_writes: external_writes,
                        pool: Pool::Sqlite {
                            group: sqlite::spawn_group_commit(pools.write.clone()),
                            read: pools.read,
                            write: pools.write,
                            unsynced: pools.unsynced,
                        },
                        sqlite_path: pools.path,
                        pg_options: None,
                        pg_group: None,
                        pg_background: None,
                        pg_session: None,
                        left_for_other_versions: Default::default(),
                    })
                }
                Backend::Postgres => {
                    let pools = postgres::connect(url, connections)
                        .await
                        .map_err(|e| connect_err(url, e))?;
                    let bus = broadcast::channel(4096).0;
                    let session = if connections.listen {
                        Some(session::Session::start(&pools.options, bus.clone()).await?)
                    } else {
                        None
                    };
                    Ok(SqlStore {
                        bus,
                        pg_group: Some(postgres::spawn_group_writes(pools.main.clone())),
                        pool: Pool::Postgres(pools.main),
                        sqlite_path: None,
                        pg_options: Some(pools.options),
                        pg_background: Some(pools.background),
                        pg_session: session,
                        left_for_other_versions: Default::default(),
                        _external_writes: None,
                    })
                }
            }
        })
        .await
    }

    /// The PostgreSQL pool for the running task: the background connection for the loops
    /// marked `store::background`, `main` for everything else.
    fn pg_pool<'a>(&'a self, main: &'a PgPool) -> &'a PgPool {
        match &self.pg_background {
            Some(background) if super::in_background() => background,
            _ => main,
        }
    }

    fn lock_clause(&self) -> &'static str {
        match self.pool {
            Pool::Sqlite { .. } => "",
            Pool::Postgres(_) => "FOR SHARE",
        }
    }

    /// Publishes wake-ups in this process only: for writes whose NOTIFY went
    /// out with their own transaction.
    fn wake_here(&self, wakeups: &[Wakeup]) {
        for w in wakeups {
            let _ = self.bus.send(w.clone());
        }
    }

    /// Publishes wake-ups after a commit: in-process always, and through
    /// NOTIFY on PostgreSQL so other processes hear of them too.
    async fn wake(&self, wakeups: &[Wakeup]) {
        self.wake_here(wakeups);
        if let Pool::Postgres(main) = &self.pool
            && !wakeups.is_empty()
        {
            let pool = self.pg_pool(main);
            // One round trip for all of them.
            let payloads: Vec<String> = wakeups.iter().map(postgres::encode).collect();
            // A lost notification only delays the other side until its fallback poll.
            if let Err(e) = sqlx::query("SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p")
                .bind(postgres::CHANNEL)
                .bind(&payloads)
                .execute(pool)
                .await
            {
                tracing::debug!(error = %e, "notify failed");
            }
        }
    }
}

/// A PostgreSQL store always has its group writer; this names the bug if not.
fn no_group() -> StoreError {
    StoreError::Database("the PostgreSQL store has no group writer (a bug)".into())
}

fn connect_err(url: &str, e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::Configuration(reason) => StoreError::InvalidUrl {
            url: redact(url),
            reason: reason.to_string(),
        },
        other => StoreError::from(other),
    }
}

/// The URL without its password, for messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{}:***{}", &url[..scheme + 3], user, &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// Retries `op` on transient errors with an increasing wait (100 ms doubling
/// to 2 s, about a minute in all), so workers started together, or before
/// the database is up, all come up without being started one at a time.
pub(crate) async fn retry_transient<T, F, Fut>(what: &str, mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut wait = Duration::from_millis(100);
    let mut waited = Duration::ZERO;
    loop {
        match op().await {
            Err(e) if e.is_transient() && waited < Duration::from_secs(60) => {
                let jitter = Duration::from_millis(rand::random::<u64>() % 50);
                tracing::info!(error = %e, retry_in = ?(wait + jitter), "{what}: retrying");
                tokio::time::sleep(wait + jitter).await;
                waited += wait + jitter;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            other => return other,
        }
    }
}

/// Every method is written beside the others of its concern (`claims.rs`, `steps.rs`…)
/// as an inherent method of the same name: an inherent method wins the lookup of
/// `SqlStore::name`, so each line here calls the one SQL implementation.
#[async_trait]
impl Store for SqlStore {
    fn backend(&self) -> Backend {
        match self.pool {
            Pool::Sqlite { .. } => Backend::Sqlite,
            Pool::Postgres(_) => Backend::Postgres,
        }
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        SqlStore::migrate(self).await
    }

    async fn schema_version(&self) -> Result<i64, StoreError> {
        SqlStore::schema_version(self).await
    }

    async fn upsert_queue(&self, q: &QueueRecord) -> Result<(), StoreError> {
        SqlStore::upsert_queue(self, q).await
    }

    async fn list_queues(&self) -> Result<Vec<QueueRecord>, StoreError> {
        SqlStore::list_queues(self).await
    }

    async fn queue_depths(&self) -> Result<Vec<QueueDepth>, StoreError> {
        SqlStore::queue_depths(self).await
    }

    async fn enqueue(&self, wf: &NewWorkflow) -> Result<EnqueueOutcome, StoreError> {
        SqlStore::enqueue(self, wf).await
    }

    async fn enqueue_many(&self, wfs: &[NewWorkflow]) -> Result<Vec<EnqueueOutcome>, StoreError> {
        SqlStore::enqueue_many(self, wfs).await
    }

    async fn claim(
        &self,
        queue: &str,
        executor_id: &str,
        versions: WorkflowVersions,
        limits: ClaimLimits,
        now_ms: i64,
        max: u32,
    ) -> Result<Vec<WorkflowRecord>, StoreError> {
        SqlStore::claim(self, queue, executor_id, versions, limits, now_ms, max).await
    }

    async fn running_counts(&self) -> Result<Vec<RunningCount>, StoreError> {
        SqlStore::running_counts(self).await
    }

    async fn next_not_before(&self, queue: &str, now_ms: i64) -> Result<Option<i64>, StoreError> {
        SqlStore::next_not_before(self, queue, now_ms).await
    }

    async fn get_workflow(&self, id: &str) -> Result<Option<WorkflowRecord>, StoreError> {
        SqlStore::get_workflow(self, id).await
    }

    async fn list_workflows(&self, f: &WorkflowFilter) -> Result<Vec<WorkflowRecord>, StoreError> {
        SqlStore::list_workflows(self, f).await
    }

    async fn take_over_own(
        &self,
        executor_id: &str,
        now_ms: i64,
    ) -> Result<Vec<WorkflowRecord>, StoreError> {
        SqlStore::take_over_own(self, executor_id, now_ms).await
    }

    async fn finish(
        &self,
        lease: &Lease,
        status: WorkflowStatus,
        output: Option<&str>,
        error: Option<&str>,
        now_ms: i64,
    ) -> Result<Checkpoint, StoreError> {
        SqlStore::finish(self, lease, status, output, error, now_ms).await
    }

    async fn cancel(&self, id: &str, now_ms: i64) -> Result<Option<WorkflowStatus>, StoreError> {
        SqlStore::cancel(self, id, now_ms).await
    }

    async fn resume(&self, id: &str, now_ms: i64) -> Result<Option<WorkflowStatus>, StoreError> {
        SqlStore::resume(self, id, now_ms).await
    }

    async fn recover_executor(
        &self,
        executor_id: &str,
        note: &str,
        now_ms: i64,
    ) -> Result<Vec<String>, StoreError> {
        SqlStore::recover_executor(self, executor_id, note, now_ms).await
    }

    async fn recover_stale(
        &self,
        stale_before_ms: i64,
        except: &str,
        now_ms: i64,
    ) -> Result<Vec<(String, String)>, StoreError> {
        SqlStore::recover_stale(self, stale_before_ms, except, now_ms).await
    }

    async fn load_steps(&self, workflow_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        SqlStore::load_steps(self, workflow_id).await
    }

    async fn record_step(
        &self,
        lease: &Lease,
        step: &StepRecord,
    ) -> Result<Checkpoint, StoreError> {
        SqlStore::record_step(self, lease, step).await
    }

    async fn move_to_queue(
        &self,
        lease: &Lease,
        step: &StepRecord,
        queue: &str,
        partition_key: &str,
        now_ms: i64,
    ) -> Result<Checkpoint, StoreError> {
        SqlStore::move_to_queue(self, lease, step, queue, partition_key, now_ms).await
    }

    async fn release(&self, lease: &Lease, now_ms: i64) -> Result<Checkpoint, StoreError> {
        SqlStore::release(self, lease, now_ms).await
    }

    async fn count_by_status(&self, name: &str) -> Result<Vec<(WorkflowStatus, i64)>, StoreError> {
        SqlStore::count_by_status(self, name).await
    }

    async fn count_enqueued_by_version(&self, name: &str) -> Result<Vec<(u32, i64)>, StoreError> {
        SqlStore::count_enqueued_by_version(self, name).await
    }

    async fn steps_finished_between(
        &self,
        window: TimeWindow,
    ) -> Result<Vec<(i64, i64)>, StoreError> {
        SqlStore::steps_finished_between(self, window).await
    }

    async fn workflows_started_between(
        &self,
        window: TimeWindow,
    ) -> Result<Vec<(i64, i64)>, StoreError> {
        SqlStore::workflows_started_between(self, window).await
    }

    async fn workflows_finished_between(
        &self,
        name: &str,
        window: TimeWindow,
    ) -> Result<Vec<(i64, WorkflowStatus)>, StoreError> {
        SqlStore::workflows_finished_between(self, name, window).await
    }

    async fn send_message(
        &self,
        workflow_id: &str,
        topic: &str,
        payload: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        SqlStore::send_message(self, workflow_id, topic, payload, now_ms).await
    }

    async fn consume_message(
        &self,
        lease: &Lease,
        topic: &str,
        step: &StepRecord,
    ) -> Result<Consumed, StoreError> {
        SqlStore::consume_message(self, lease, topic, step).await
    }

    async fn set_event(
        &self,
        lease: &Lease,
        key: &str,
        value: &str,
        step: &StepRecord,
    ) -> Result<Checkpoint, StoreError> {
        SqlStore::set_event(self, lease, key, value, step).await
    }

    async fn list_events(&self, workflow_id: &str) -> Result<Vec<EventRecord>, StoreError> {
        SqlStore::list_events(self, workflow_id).await
    }

    async fn list_events_of(
        &self,
        workflow_ids: &[String],
    ) -> Result<Vec<(String, EventRecord)>, StoreError> {
        SqlStore::list_events_of(self, workflow_ids).await
    }

    async fn upsert_executor(&self, e: &ExecutorRecord) -> Result<(), StoreError> {
        SqlStore::upsert_executor(self, e).await
    }

    async fn get_executor(&self, id: &str) -> Result<Option<ExecutorRecord>, StoreError> {
        SqlStore::get_executor(self, id).await
    }

    async fn heartbeat(
        &self,
        id: &str,
        state: ExecutorState,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        SqlStore::heartbeat(self, id, state, now_ms).await
    }

    async fn list_executors(&self) -> Result<Vec<ExecutorRecord>, StoreError> {
        SqlStore::list_executors(self).await
    }

    async fn acquire_liveness(&self, executor_id: &str) -> Result<Liveness, StoreError> {
        SqlStore::acquire_liveness(self, executor_id).await
    }

    async fn liveness_free(&self, executor_id: &str) -> Result<Option<bool>, StoreError> {
        SqlStore::liveness_free(self, executor_id).await
    }

    async fn acquire_executor_lease(
        &self,
        lease: &ExecutorLease,
        override_live: bool,
    ) -> Result<LeaseGrant, StoreError> {
        SqlStore::acquire_executor_lease(self, lease, override_live).await
    }

    async fn renew_executor_lease(
        &self,
        executor_id: &str,
        holder: &str,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<Renewal, StoreError> {
        SqlStore::renew_executor_lease(self, executor_id, holder, now_ms, expires_at_ms).await
    }

    async fn get_executor_lease(
        &self,
        executor_id: &str,
    ) -> Result<Option<ExecutorLease>, StoreError> {
        SqlStore::get_executor_lease(self, executor_id).await
    }

    async fn live_executor_ids(&self, now_ms: i64) -> Result<Vec<String>, StoreError> {
        SqlStore::live_executor_ids(self, now_ms).await
    }

    async fn end_executor_lease(
        &self,
        executor_id: &str,
        holder: Option<&str>,
    ) -> Result<bool, StoreError> {
        SqlStore::end_executor_lease(self, executor_id, holder).await
    }

    async fn revoke_executor_lease(
        &self,
        executor_id: &str,
        holder: &str,
    ) -> Result<bool, StoreError> {
        SqlStore::revoke_executor_lease(self, executor_id, holder).await
    }

    async fn put_record(
        &self,
        kind: &str,
        key: &str,
        value: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        SqlStore::put_record(self, kind, key, value, now_ms).await
    }

    async fn insert_record(
        &self,
        kind: &str,
        key: &str,
        value: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        SqlStore::insert_record(self, kind, key, value, now_ms).await
    }

    async fn insert_records(
        &self,
        records: &[RecordEntry<'_>],
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        SqlStore::insert_records(self, records, now_ms).await
    }

    async fn get_record(&self, kind: &str, key: &str) -> Result<Option<String>, StoreError> {
        SqlStore::get_record(self, kind, key).await
    }

    async fn list_records(&self, kind: &str) -> Result<Vec<(String, String)>, StoreError> {
        SqlStore::list_records(self, kind).await
    }

    async fn delete_record(&self, kind: &str, key: &str) -> Result<bool, StoreError> {
        SqlStore::delete_record(self, kind, key).await
    }

    async fn delete_records(&self, keys: &[(&str, &str)]) -> Result<u64, StoreError> {
        SqlStore::delete_records(self, keys).await
    }

    async fn append_output(
        &self,
        workflow_id: &str,
        lines: &[OutputLine],
    ) -> Result<(), StoreError> {
        SqlStore::append_output(self, workflow_id, lines).await
    }

    async fn list_output(
        &self,
        workflow_id: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<OutputLine>, StoreError> {
        SqlStore::list_output(self, workflow_id, after, limit).await
    }

    async fn append_audit(&self, entry: &AuditRecord) -> Result<(), StoreError> {
        SqlStore::append_audit(self, entry).await
    }

    async fn list_audit(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>, StoreError> {
        SqlStore::list_audit(self, filter).await
    }

    async fn prunable_workflows(
        &self,
        query: &crate::store::PruneQuery,
    ) -> Result<Vec<String>, StoreError> {
        SqlStore::prunable_workflows(self, query).await
    }

    async fn delete_workflows(&self, ids: &[String]) -> Result<crate::store::Deleted, StoreError> {
        SqlStore::delete_workflows(self, ids).await
    }

    async fn count_workflows_removal(
        &self,
        ids: &[String],
        old_output_before: Option<i64>,
    ) -> Result<(crate::store::Deleted, u64), StoreError> {
        SqlStore::count_workflows_removal(self, ids, old_output_before).await
    }

    async fn prune_output(
        &self,
        before_ms: i64,
        limit: i64,
        dry_run: bool,
    ) -> Result<u64, StoreError> {
        SqlStore::prune_output(self, before_ms, limit, dry_run).await
    }

    async fn prune_audit(
        &self,
        before_ms: i64,
        limit: i64,
        dry_run: bool,
    ) -> Result<u64, StoreError> {
        SqlStore::prune_audit(self, before_ms, limit, dry_run).await
    }

    async fn reclaim_space(&self, full: bool) -> Result<(), StoreError> {
        SqlStore::reclaim_space(self, full).await
    }

    fn subscribe(&self) -> broadcast::Receiver<Wakeup> {
        self.bus.subscribe()
    }

    fn poll_interval(&self) -> Duration {
        match self.pool {
            Pool::Sqlite { .. } => sqlite::POLL_INTERVAL,
            Pool::Postgres(_) => postgres::POLL_INTERVAL,
        }
    }
}
