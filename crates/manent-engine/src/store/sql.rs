//! The SQL both backends share: one implementation of [`Store`], written once
//! and compiled for each driver by the `with_pool!` / `write_tx!` macros.
//!
//! Dialect differences are few and explicit: write transactions start with
//! `BEGIN IMMEDIATE` on SQLite (one writer at a time) and take a per-queue
//! (or per-limit-group) advisory lock on PostgreSQL when claiming; PostgreSQL also row-locks the
//! workflow (`FOR SHARE`) when a step is checkpointed, so a recovery waits for
//! a checkpoint in flight instead of racing it.

use std::{
    collections::{BTreeMap, HashSet},
    path::PathBuf,
    sync::atomic::{AtomicI64, Ordering},
    time::Duration,
};

use async_trait::async_trait;
use sqlx::{FromRow, postgres::PgConnectOptions, sqlite::SqlitePool};
use tokio::{sync::broadcast, task::JoinHandle};

use super::{
    AuditRecord, Backend, Checkpoint, ClaimLimits, Consumed, EnqueueOutcome, EventRecord,
    ExecutorLease, ExecutorRecord, ExecutorState, Lease, LeaseGrant, Liveness, NewWorkflow,
    OutputLine, QueueDepth, QueueRecord, RecordEntry, Renewal, RunningCount, StepRecord, Store,
    Wakeup, WorkflowFilter, WorkflowRecord, WorkflowStatus, claim, migrations, postgres, sqlite,
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
    Postgres(sqlx::PgPool),
}

/// Runs `$body` with `$pool` bound to the driver's pool for reads; the body is
/// compiled once per driver. A write uses [`with_writer!`].
macro_rules! with_pool {
    ($store:expr, $pool:ident => $body:expr) => {
        match &$store.pool {
            Pool::Sqlite { read: $pool, .. } => $body,
            Pool::Postgres($pool) => $body,
        }
    };
}

/// [`with_pool!`] for a write outside a transaction: on SQLite, the writer connection.
macro_rules! with_writer {
    ($store:expr, $pool:ident => $body:expr) => {
        match &$store.pool {
            Pool::Sqlite { write: $pool, .. } => $body,
            Pool::Postgres($pool) => $body,
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
            Pool::Sqlite { write: pool, unsynced, .. } => {
                let mut conn = pool.acquire().await.map_err(map_err)?;
                let mut $tx = if $unsynced {
                    // Back to FULL as `conn` returns to the pool, before any other
                    // write may take it, and not on the claim's way to its runs.
                    unsynced.begin(&mut conn).await
                } else {
                    sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await
                }
                .map_err(map_err)?;
                let result = $body;
                $tx.commit().await.map_err(map_err)?;
                result
            }
            Pool::Postgres(pool) => {
                // Not `pool.begin_with`: see `postgres::BeginGuard`.
                let mut guard = postgres::BeginGuard::acquire(pool).await.map_err(map_err)?;
                let mut $tx = guard.begin($pg_begin).await.map_err(map_err)?;
                let result = $body;
                $tx.commit().await.map_err(map_err)?;
                result
            }
        }
    };
}

/// The workflow columns, in [`WorkflowRow`] order.
macro_rules! wf_cols {
    () => {
        "id, name, status, queue_name, partition_key, priority, not_before, dedup_key, executor_id, input, output, \
         error, parent_id, attempts, generation, created_at, updated_at, started_at, finished_at"
    };
}

macro_rules! step_cols {
    () => {
        "workflow_id, step_index, name, status, output, error, attempts, started_at, finished_at, executor_id"
    };
}

/// The store over SQLite or PostgreSQL.
pub struct SqlStore {
    pool: Pool,
    bus: broadcast::Sender<Wakeup>,
    sqlite_path: Option<PathBuf>,
    pg_options: Option<PgConnectOptions>,
    /// PostgreSQL: step checkpoints and outcomes, grouped into one statement each.
    pg_group: Option<postgres::GroupWrites>,
    listener: Option<JoinHandle<()>>,
}

impl Drop for SqlStore {
    fn drop(&mut self) {
        if let Some(listener) = self.listener.take() {
            listener.abort();
        }
    }
}

/// Maps a driver error to a [`StoreError`], telling transient failures
/// (connection lost, server restarting, lock contention) from permanent ones.
pub(crate) fn map_err(e: sqlx::Error) -> StoreError {
    use sqlx::Error as E;
    match &e {
        E::Io(_)
        | E::Tls(_)
        | E::PoolTimedOut
        | E::PoolClosed
        | E::WorkerCrashed
        | E::Protocol(_) => StoreError::Unavailable(e.to_string()),
        E::Database(db) => {
            let code = db.code().map(|c| c.to_string()).unwrap_or_default();
            // PostgreSQL: 08xxx connection, 57Pxx shutdown, 40001/40P01 serialization/deadlock,
            // 55P03 lock not available. SQLite: 5 BUSY, 6 LOCKED and their extended codes.
            let transient = code.starts_with("08")
                || code.starts_with("57P")
                || code == "40001"
                || code == "40P01"
                || code == "55P03"
                || code
                    .parse::<i32>()
                    .is_ok_and(|n| n & 0xff == 5 || n & 0xff == 6);
            if transient {
                StoreError::Unavailable(e.to_string())
            } else {
                StoreError::Database(e.to_string())
            }
        }
        _ => StoreError::Database(e.to_string()),
    }
}

fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.is_unique_violation())
}

/// Strictly increasing microsecond stamps for FIFO order within this process.
fn next_seq(now_ms: i64) -> i64 {
    static LAST: AtomicI64 = AtomicI64::new(0);
    let now_us = now_ms.saturating_mul(1000);
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let next = now_us.max(last + 1);
        match LAST.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

#[derive(FromRow)]
struct WorkflowRow {
    id: String,
    name: String,
    status: String,
    queue_name: String,
    partition_key: String,
    priority: i64,
    not_before: i64,
    dedup_key: Option<String>,
    executor_id: Option<String>,
    input: String,
    output: Option<String>,
    error: Option<String>,
    parent_id: Option<String>,
    attempts: i64,
    generation: i64,
    created_at: i64,
    updated_at: i64,
    started_at: Option<i64>,
    finished_at: Option<i64>,
}

impl TryFrom<WorkflowRow> for WorkflowRecord {
    type Error = StoreError;
    fn try_from(r: WorkflowRow) -> Result<Self, StoreError> {
        Ok(WorkflowRecord {
            status: r.status.parse()?,
            id: r.id,
            name: r.name,
            queue: r.queue_name,
            partition_key: r.partition_key,
            priority: r.priority,
            not_before_ms: r.not_before,
            dedup_key: r.dedup_key,
            executor_id: r.executor_id,
            input: r.input,
            output: r.output,
            error: r.error,
            parent_id: r.parent_id,
            attempts: r.attempts,
            generation: r.generation,
            created_at_ms: r.created_at,
            updated_at_ms: r.updated_at,
            started_at_ms: r.started_at,
            finished_at_ms: r.finished_at,
        })
    }
}

fn workflows(rows: Vec<WorkflowRow>) -> Result<Vec<WorkflowRecord>, StoreError> {
    rows.into_iter().map(WorkflowRecord::try_from).collect()
}

#[derive(FromRow)]
struct StepRow {
    workflow_id: String,
    step_index: i64,
    name: String,
    status: String,
    output: Option<String>,
    error: Option<String>,
    attempts: i64,
    started_at: i64,
    finished_at: Option<i64>,
    executor_id: String,
}

#[derive(FromRow)]
struct ExecutorRow {
    id: String,
    host: String,
    pid: i64,
    region: Option<String>,
    queues: String,
    state: String,
    started_at: i64,
    heartbeat_at: i64,
    stopped_at: Option<i64>,
    version: String,
    running: i64,
}

impl TryFrom<ExecutorRow> for ExecutorRecord {
    type Error = StoreError;
    fn try_from(r: ExecutorRow) -> Result<Self, StoreError> {
        Ok(ExecutorRecord {
            queues: serde_json::from_str(&r.queues).map_err(|e| StoreError::Corrupt {
                what: format!("queues of executor {}", r.id),
                reason: e.to_string(),
            })?,
            state: r.state.parse()?,
            id: r.id,
            host: r.host,
            pid: r.pid,
            region: r.region,
            started_at_ms: r.started_at,
            heartbeat_at_ms: r.heartbeat_at,
            stopped_at_ms: r.stopped_at,
            version: r.version,
            running: r.running,
        })
    }
}

#[derive(FromRow)]
struct LeaseRow {
    executor_id: String,
    holder: String,
    host: String,
    pid: i64,
    acquired_at: i64,
    renewed_at: i64,
    expires_at: i64,
}

impl From<LeaseRow> for ExecutorLease {
    fn from(r: LeaseRow) -> Self {
        ExecutorLease {
            executor_id: r.executor_id,
            holder: r.holder,
            host: r.host,
            pid: r.pid,
            acquired_at_ms: r.acquired_at,
            renewed_at_ms: r.renewed_at,
            expires_at_ms: r.expires_at,
        }
    }
}

const EXECUTOR_SELECT: &str = "SELECT e.id, e.host, e.pid, e.region, e.queues, e.state, e.started_at, e.heartbeat_at, \
     e.stopped_at, e.version, (SELECT COUNT(*) FROM manent_workflows w WHERE w.executor_id = e.id AND w.status = 'PENDING') AS running \
     FROM manent_executors e";

/// The fenced step write: the row is written only while the lease holds.
/// `{LOCK}` is `FOR SHARE` on PostgreSQL (see the module comment).
const RECORD_STEP: &str = concat!(
    "INSERT INTO manent_steps (",
    step_cols!(),
    ") SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 \
     WHERE EXISTS (SELECT 1 FROM manent_workflows WHERE id = $1 AND executor_id = $10 AND generation = $11 \
       AND status = 'PENDING' {LOCK}) \
     ON CONFLICT (workflow_id, step_index) DO UPDATE SET name = excluded.name, status = excluded.status, \
       output = excluded.output, error = excluded.error, attempts = excluded.attempts, \
       started_at = excluded.started_at, finished_at = excluded.finished_at, executor_id = excluded.executor_id \
     WHERE manent_steps.status = 'RUNNING'"
);

const LEASE_HOLDS: &str = "SELECT id FROM manent_workflows WHERE id = $1 AND executor_id = $2 AND generation = $3 \
     AND status = 'PENDING' {LOCK}";

impl SqlStore {
    /// Connects to `url`, retrying with an increasing wait while the server is unreachable.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
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
                    Ok(SqlStore {
                        bus: sqlite::wakeup_bus(pools.path.as_deref()),
                        pool: Pool::Sqlite {
                            group: sqlite::spawn_group_commit(pools.write.clone()),
                            read: pools.read,
                            write: pools.write,
                            unsynced: pools.unsynced,
                        },
                        sqlite_path: pools.path,
                        pg_options: None,
                        pg_group: None,
                        listener: None,
                    })
                }
                Backend::Postgres => {
                    let (pool, options) = postgres::connect(url)
                        .await
                        .map_err(|e| connect_err(url, e))?;
                    let bus = broadcast::channel(4096).0;
                    let listener = postgres::spawn_listener(&pool, bus.clone())
                        .await
                        .map_err(map_err)?;
                    Ok(SqlStore {
                        bus,
                        pg_group: Some(postgres::spawn_group_writes(pool.clone())),
                        pool: Pool::Postgres(pool),
                        sqlite_path: None,
                        pg_options: Some(options),
                        listener: Some(listener),
                    })
                }
            }
        })
        .await
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
        if let Pool::Postgres(pool) = &self.pool
            && !wakeups.is_empty()
        {
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

    async fn migrate_once(&self) -> Result<(), StoreError> {
        let backend = self.backend();
        match &self.pool {
            Pool::Sqlite { write: pool, .. } => {
                // BEGIN IMMEDIATE makes concurrent starters queue up on the write lock.
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(map_err)?;
                sqlx::query(CREATE_MIGRATIONS_TABLE)
                    .execute(&mut *tx)
                    .await
                    .map_err(map_err)?;
                let applied: Vec<i64> =
                    sqlx::query_scalar("SELECT version FROM manent_schema_migrations")
                        .fetch_all(&mut *tx)
                        .await
                        .map_err(map_err)?;
                for m in migrations::MIGRATIONS
                    .iter()
                    .filter(|m| !applied.contains(&m.version))
                {
                    for statement in m.statements(backend) {
                        sqlx::query(&statement)
                            .execute(&mut *tx)
                            .await
                            .map_err(map_err)?;
                    }
                    sqlx::query("INSERT INTO manent_schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)")
                        .bind(m.version)
                        .bind(m.name)
                        .bind(crate::now_ms())
                        .execute(&mut *tx)
                        .await
                        .map_err(map_err)?;
                }
                tx.commit().await.map_err(map_err)?;
            }
            Pool::Postgres(pool) => {
                let mut conn = pool.acquire().await.map_err(map_err)?;
                // A session lock serialises migrators across processes; it is
                // released on unlock, or by the server if this process dies.
                sqlx::query("SELECT pg_advisory_lock($1)")
                    .bind(postgres::LOCK_MIGRATIONS)
                    .execute(&mut *conn)
                    .await
                    .map_err(map_err)?;
                let result = async {
                    sqlx::query(CREATE_MIGRATIONS_TABLE).execute(&mut *conn).await.map_err(map_err)?;
                    let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM manent_schema_migrations")
                        .fetch_all(&mut *conn)
                        .await
                        .map_err(map_err)?;
                    for m in migrations::MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
                        let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(map_err)?;
                        for statement in m.statements(backend) {
                            sqlx::query(&statement).execute(&mut *tx).await.map_err(map_err)?;
                        }
                        sqlx::query(
                            "INSERT INTO manent_schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
                        )
                        .bind(m.version)
                        .bind(m.name)
                        .bind(crate::now_ms())
                        .execute(&mut *tx)
                        .await
                        .map_err(map_err)?;
                        tx.commit().await.map_err(map_err)?;
                    }
                    Ok::<_, StoreError>(())
                }
                .await;
                let unlock = sqlx::query("SELECT pg_advisory_unlock($1)")
                    .bind(postgres::LOCK_MIGRATIONS)
                    .execute(&mut *conn)
                    .await;
                if unlock.is_err() {
                    // Never return a connection that may still hold the lock to the pool.
                    conn.detach();
                }
                result?;
            }
        }
        Ok(())
    }

    /// Inserts a record, replacing an existing one only if `replace`;
    /// returns whether a row was written.
    async fn write_record(
        &self,
        kind: &str,
        key: &str,
        value: &str,
        now_ms: i64,
        replace: bool,
    ) -> Result<bool, StoreError> {
        let sql = if replace {
            PUT_RECORD
        } else {
            INSERT_RECORD_IF_FREE
        };
        let written = with_writer!(self, pool => sqlx::query(sql)
            .bind(kind)
            .bind(key)
            .bind(value)
            .bind(now_ms)
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(map_err))?;
        Ok(written == 1)
    }

    async fn lookup_dedup(
        &self,
        queue: &str,
        dedup_key: &str,
    ) -> Result<Option<String>, StoreError> {
        with_pool!(self, pool => sqlx::query_scalar(
            "SELECT id FROM manent_workflows WHERE queue_name = $1 AND dedup_key = $2 AND status IN ('ENQUEUED', 'PENDING')")
            .bind(queue)
            .bind(dedup_key)
            .fetch_optional(pool)
            .await
            .map_err(map_err))
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
        other => map_err(other),
    }
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
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

/// A record's writes, binding kind, key, value and the time (`DELETE_RECORD`: kind, key).
const INSERT_RECORD_IF_FREE: &str = "INSERT INTO manent_records (kind, record_key, value, updated_at) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (kind, record_key) DO NOTHING";
const PUT_RECORD: &str = "INSERT INTO manent_records (kind, record_key, value, updated_at) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (kind, record_key) \
     DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at";
const DELETE_RECORD: &str = "DELETE FROM manent_records WHERE kind = $1 AND record_key = $2";

#[async_trait]
impl Store for SqlStore {
    fn backend(&self) -> Backend {
        match self.pool {
            Pool::Sqlite { .. } => Backend::Sqlite,
            Pool::Postgres(_) => Backend::Postgres,
        }
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        retry_transient("create or update the schema", || self.migrate_once()).await
    }

    async fn schema_version(&self) -> Result<i64, StoreError> {
        with_pool!(self, pool => sqlx::query_scalar::<_, i64>("SELECT COALESCE(MAX(version), 0) FROM manent_schema_migrations")
            .fetch_one(pool)
            .await
            .map_err(map_err))
    }

    async fn upsert_queue(&self, q: &QueueRecord) -> Result<(), StoreError> {
        with_writer!(self, pool => sqlx::query(
            "INSERT INTO manent_queues (name, kind, worker_concurrency, partition_concurrency, global_concurrency, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, \
             worker_concurrency = excluded.worker_concurrency, partition_concurrency = excluded.partition_concurrency, \
             global_concurrency = excluded.global_concurrency, updated_at = excluded.updated_at")
            .bind(&q.name)
            .bind(&q.kind)
            .bind(q.worker_concurrency)
            .bind(q.partition_concurrency)
            .bind(q.global_concurrency)
            .bind(q.updated_at_ms)
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(map_err))?;
        Ok(())
    }

    async fn list_queues(&self) -> Result<Vec<QueueRecord>, StoreError> {
        let rows: Vec<(String, String, Option<i64>, Option<i64>, i64, i64)> = with_pool!(self, pool => sqlx::query_as(
            "SELECT name, kind, worker_concurrency, partition_concurrency, global_concurrency, updated_at \
             FROM manent_queues ORDER BY name")
            .fetch_all(pool)
            .await
            .map_err(map_err))?;
        Ok(rows
            .into_iter()
            .map(
                |(
                    name,
                    kind,
                    worker_concurrency,
                    partition_concurrency,
                    global_concurrency,
                    updated_at_ms,
                )| {
                    QueueRecord {
                        name,
                        kind,
                        worker_concurrency,
                        partition_concurrency,
                        global_concurrency,
                        updated_at_ms,
                    }
                },
            )
            .collect())
    }

    async fn queue_depths(&self) -> Result<Vec<QueueDepth>, StoreError> {
        let rows: Vec<(String, i64, i64)> = with_pool!(self, pool => sqlx::query_as(QUEUE_DEPTHS_SQL)
            .fetch_all(pool)
            .await
            .map_err(map_err))?;
        let mut depths: BTreeMap<String, QueueDepth> = BTreeMap::new();
        for (queue, enqueued, running) in rows {
            let depth = depths.entry(queue.clone()).or_insert(QueueDepth {
                queue,
                enqueued: 0,
                running: 0,
            });
            depth.enqueued += enqueued;
            depth.running += running;
        }
        Ok(depths.into_values().collect())
    }

    async fn enqueue(&self, wf: &NewWorkflow) -> Result<EnqueueOutcome, StoreError> {
        let seq = next_seq(wf.now_ms);
        let inserted = with_writer!(self, pool => sqlx::query(
            "INSERT INTO manent_workflows (id, name, status, queue_name, partition_key, priority, not_before, dedup_key, \
             input, parent_id, attempts, generation, created_at, created_seq, updated_at) \
             VALUES ($1, $2, 'ENQUEUED', $3, $4, $5, $6, $7, $8, $9, 0, 0, $10, $11, $10) ON CONFLICT (id) DO NOTHING")
            .bind(&wf.id)
            .bind(&wf.name)
            .bind(&wf.queue)
            .bind(&wf.partition_key)
            .bind(wf.priority)
            .bind(wf.not_before_ms)
            .bind(&wf.dedup_key)
            .bind(&wf.input)
            .bind(&wf.parent_id)
            .bind(wf.now_ms)
            .bind(seq)
            .execute(pool)
            .await
            .map(|r| r.rows_affected()));
        match inserted {
            Ok(1) => {
                // The NOTIFY goes after the commit, in a statement of its own, not in the
                // insert's: a notifying commit serialises on PostgreSQL's notification
                // queue and measured 2-6 ms against 0.7-2 ms for the insert alone
                // (bench/README.md, "Full run with the peers"), while this process's
                // claimers, woken first, need not wait for the NOTIFY at all.
                self.wake(&[Wakeup::Queue(wf.queue.clone())]).await;
                Ok(EnqueueOutcome::Created)
            }
            Ok(_) => match self.get_workflow(&wf.id).await? {
                Some(existing) => Ok(EnqueueOutcome::Exists(Box::new(existing))),
                None => Err(StoreError::Database(format!(
                    "workflow {} vanished during enqueue",
                    wf.id
                ))),
            },
            Err(e) if is_unique_violation(&e) => {
                let key = wf.dedup_key.as_deref().unwrap_or_default();
                match self.lookup_dedup(&wf.queue, key).await? {
                    Some(existing_id) => Ok(EnqueueOutcome::Deduplicated { existing_id }),
                    None => Err(StoreError::Unavailable(
                        "deduplication conflict vanished; retry".into(),
                    )),
                }
            }
            Err(e) => Err(map_err(e)),
        }
    }

    async fn enqueue_many(&self, wfs: &[NewWorkflow]) -> Result<Vec<EnqueueOutcome>, StoreError> {
        if wfs.is_empty() {
            return Ok(Vec::new());
        }
        let chunk_rows = enqueue_chunk_rows(matches!(self.pool, Pool::Postgres(_)));
        let inserted: HashSet<String> = write_tx!(self, tx => {
            let mut inserted = HashSet::new();
            for chunk in wfs.chunks(chunk_rows) {
                let values: Vec<String> = (0..chunk.len())
                    .map(|i| {
                        let b = i * 11;
                        format!(
                            "(${}, ${}, 'ENQUEUED', ${}, ${}, ${}, ${}, ${}, ${}, ${}, 0, 0, ${}, ${}, ${})",
                            b + 1, b + 2, b + 3, b + 4, b + 5, b + 6, b + 7, b + 8, b + 9, b + 10, b + 11, b + 10
                        )
                    })
                    .collect();
                // No conflict target: a taken id and a held deduplication key
                // both leave the row out; the outcome is sorted out below.
                let sql = format!(
                    "INSERT INTO manent_workflows (id, name, status, queue_name, partition_key, priority, not_before, \
                     dedup_key, input, parent_id, attempts, generation, created_at, created_seq, updated_at) \
                     VALUES {} ON CONFLICT DO NOTHING RETURNING id",
                    values.join(", ")
                );
                let mut query = sqlx::query_scalar::<_, String>(&sql);
                for wf in chunk {
                    query = query
                        .bind(wf.id.clone())
                        .bind(wf.name.clone())
                        .bind(wf.queue.clone())
                        .bind(wf.partition_key.clone())
                        .bind(wf.priority)
                        .bind(wf.not_before_ms)
                        .bind(wf.dedup_key.clone())
                        .bind(wf.input.clone())
                        .bind(wf.parent_id.clone())
                        .bind(wf.now_ms)
                        .bind(next_seq(wf.now_ms));
                }
                inserted.extend(query.fetch_all(&mut *tx).await.map_err(map_err)?);
            }
            inserted
        });
        let mut queues: Vec<String> = wfs
            .iter()
            .filter(|w| inserted.contains(&w.id))
            .map(|w| w.queue.clone())
            .collect();
        queues.sort();
        queues.dedup();
        self.wake(&queues.into_iter().map(Wakeup::Queue).collect::<Vec<_>>())
            .await;
        let mut outcomes = Vec::with_capacity(wfs.len());
        let mut reported: HashSet<&str> = HashSet::new();
        for wf in wfs {
            // A repeated id within the batch is created once; the repeat finds it.
            let first = reported.insert(wf.id.as_str());
            if first && inserted.contains(&wf.id) {
                outcomes.push(EnqueueOutcome::Created);
            } else if let Some(existing) = self.get_workflow(&wf.id).await? {
                outcomes.push(EnqueueOutcome::Exists(Box::new(existing)));
            } else {
                let key = wf.dedup_key.as_deref().unwrap_or_default();
                match self.lookup_dedup(&wf.queue, key).await? {
                    Some(existing_id) => {
                        outcomes.push(EnqueueOutcome::Deduplicated { existing_id })
                    }
                    None => {
                        return Err(StoreError::Unavailable(format!(
                            "workflow {} was neither written nor found; retry",
                            wf.id
                        )));
                    }
                }
            }
        }
        Ok(outcomes)
    }

    async fn claim(
        &self,
        queue: &str,
        executor_id: &str,
        limits: ClaimLimits,
        now_ms: i64,
        max: u32,
    ) -> Result<Vec<WorkflowRecord>, StoreError> {
        let is_pg = self.backend() == Backend::Postgres;
        let group = limits.group.as_ref().map(|g| g.name.clone());
        // Claimers of one queue, or of any queue of one group, take turns, so
        // the counts below stay true until this transaction commits (no write skew).
        let lock_key = match &group {
            Some(g) => format!("group:{g}"),
            None => queue.to_string(),
        };
        // On SQLite the claim's commit is not synced: a power cut that undoes it
        // stops this process too, and the workflow is queued again, its first step
        // never recorded (docs/scaling-and-recovery.md, "What a power cut may undo").
        let claimed: Vec<WorkflowRow> = write_tx!(self, claim_begin = pg_claim_begin(&lock_key), tx => {
            let running: Vec<(i64, Option<String>, String, i64)> = sqlx::query_as(CLAIM_RUNNING_SQL)
                .bind(queue)
                .bind(&group)
                .fetch_all(&mut *tx)
                .await
                .map_err(map_err)?;
            let running: Vec<claim::Running> = running
                .into_iter()
                .map(|(scope, executor_id, partition_key, count)| claim::Running {
                    in_group: scope == 1,
                    executor_id,
                    partition_key,
                    count,
                })
                .collect();
            let mut plan = claim::ClaimPlan::new(&limits, executor_id, max, &running);
            let mut picked: Vec<String> = Vec::new();
            // Read the backlog in claim order through `manent_workflows_claimable`,
            // a page at a time, leaving out the partitions that are full: the
            // rows read follow what can be taken, not how much is queued.
            let mut after: Option<(i64, i64, String)> = None;
            while plan.free > 0 {
                let full: Vec<&str> = plan.full_partitions().collect();
                // Past this many, the partitions are skipped here rather than in SQL.
                let exclude = if full.len() <= 500 { full.as_slice() } else { &[] };
                let page = (plan.free * 2).max(16);
                let sql = claim_page_sql(is_pg, after.is_some());
                let mut query = sqlx::query_as::<_, (String, String, i64, i64)>(sql)
                    .bind(queue)
                    .bind(now_ms)
                    .bind(page)
                    .bind(json_list(exclude));
                if let Some((priority, seq, id)) = &after {
                    query = query.bind(*priority).bind(*seq).bind(id.clone());
                }
                let rows = query.fetch_all(&mut *tx).await.map_err(map_err)?;
                let exhausted = (rows.len() as i64) < page;
                for (id, partition, priority, seq) in rows {
                    if plan.take(&partition) {
                        picked.push(id.clone());
                    }
                    after = Some((priority, seq, id));
                    if plan.free == 0 {
                        break;
                    }
                }
                if exhausted {
                    break;
                }
            }
            if picked.is_empty() {
                Vec::new()
            } else {
                let picked_list = picked.iter().map(String::as_str).collect::<Vec<_>>();
                let mut rows = sqlx::query_as::<_, WorkflowRow>(claim_update_sql(is_pg))
                    .bind(executor_id)
                    .bind(&group)
                    .bind(now_ms)
                    .bind(json_list(&picked_list))
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(map_err)?;
                // In claim order (RETURNING has none).
                rows.sort_by_key(|r| picked.iter().position(|id| *id == r.id));
                rows
            }
        });
        workflows(claimed)
    }

    async fn running_counts(&self) -> Result<Vec<RunningCount>, StoreError> {
        let rows: Vec<(String, Option<String>, Option<String>, String, i64)> = with_pool!(self, pool => sqlx::query_as(
            "SELECT queue_name, limit_group, executor_id, partition_key, COUNT(*) FROM manent_workflows \
             WHERE status = 'PENDING' GROUP BY queue_name, limit_group, executor_id, partition_key \
             ORDER BY queue_name, limit_group, executor_id, partition_key")
            .fetch_all(pool)
            .await
            .map_err(map_err))?;
        Ok(rows
            .into_iter()
            .map(
                |(queue, group, executor_id, partition_key, running)| RunningCount {
                    queue,
                    group,
                    executor_id,
                    partition_key,
                    running,
                },
            )
            .collect())
    }

    async fn next_not_before(&self, queue: &str, now_ms: i64) -> Result<Option<i64>, StoreError> {
        with_pool!(self, pool => sqlx::query_scalar(
            "SELECT MIN(not_before) FROM manent_workflows WHERE queue_name = $1 AND status = 'ENQUEUED' AND not_before > $2")
            .bind(queue)
            .bind(now_ms)
            .fetch_one(pool)
            .await
            .map_err(map_err))
    }

    async fn get_workflow(&self, id: &str) -> Result<Option<WorkflowRecord>, StoreError> {
        let row: Option<WorkflowRow> = with_pool!(self, pool => sqlx::query_as(
            concat!("SELECT ", wf_cols!(), " FROM manent_workflows WHERE id = $1"))
            .bind(id)
            .fetch_optional(pool)
            .await
            .map_err(map_err))?;
        row.map(WorkflowRecord::try_from).transpose()
    }

    async fn list_workflows(&self, f: &WorkflowFilter) -> Result<Vec<WorkflowRecord>, StoreError> {
        let (sql, values) = list_sql(f);
        let rows: Vec<WorkflowRow> = with_pool!(self, pool => {
            let mut query = sqlx::query_as(&sql);
            for value in &values {
                query = query.bind(*value);
            }
            query
                .bind(f.limit.unwrap_or(1000))
                .bind(f.offset.unwrap_or(0))
                .fetch_all(pool)
                .await
                .map_err(map_err)
        })?;
        workflows(rows)
    }

    async fn take_over_own(
        &self,
        executor_id: &str,
        now_ms: i64,
    ) -> Result<Vec<WorkflowRecord>, StoreError> {
        let rows: Vec<WorkflowRow> = with_writer!(self, pool => sqlx::query_as(concat!(
            "UPDATE manent_workflows SET generation = generation + 1, attempts = attempts + 1, updated_at = $2 \
             WHERE executor_id = $1 AND status = 'PENDING' RETURNING ", wf_cols!()))
            .bind(executor_id)
            .bind(now_ms)
            .fetch_all(pool)
            .await
            .map_err(map_err))?;
        workflows(rows)
    }

    async fn finish(
        &self,
        lease: &Lease,
        status: WorkflowStatus,
        output: Option<&str>,
        error: Option<&str>,
        now_ms: i64,
    ) -> Result<Checkpoint, StoreError> {
        // SQLite's form; PostgreSQL's is `postgres::WRITE_OUTCOMES`, many at once.
        const FINISH: &str = "UPDATE manent_workflows SET status = $1, output = $2, error = $3, finished_at = $4, updated_at = $4 \
             WHERE id = $5 AND executor_id = $6 AND generation = $7 AND status = 'PENDING' RETURNING queue_name";
        let queue: Option<String> = match &self.pool {
            Pool::Sqlite { group, .. } => {
                let lease = lease.clone();
                let (output, error) = (output.map(str::to_string), error.map(str::to_string));
                group
                    .write(Box::new(move |conn| {
                        let (lease, output, error) = (lease.clone(), output.clone(), error.clone());
                        Box::pin(async move {
                            let queue: Option<String> = sqlx::query_scalar(FINISH)
                                .bind(status.as_str())
                                .bind(output)
                                .bind(error)
                                .bind(now_ms)
                                .bind(lease.workflow_id)
                                .bind(lease.executor_id)
                                .bind(lease.generation)
                                .fetch_optional(conn)
                                .await?;
                            Ok(sqlite::Written {
                                rows: u64::from(queue.is_some()),
                                returned: queue,
                            })
                        })
                    }))
                    .await?
                    .returned
            }
            Pool::Postgres(_) => {
                let group = self.pg_group.as_ref().ok_or_else(no_group)?;
                group
                    .write(postgres::GroupedWrite::Finish {
                        lease: lease.clone(),
                        status,
                        output: output.map(str::to_string),
                        error: error.map(str::to_string),
                        now_ms,
                    })
                    .await?
            }
        };
        match queue {
            Some(queue) => {
                let wakeups = [
                    Wakeup::Queue(queue),
                    Wakeup::Workflow(lease.workflow_id.clone()),
                ];
                match self.pool {
                    // The NOTIFY went out with the outcome's own transaction.
                    Pool::Postgres(_) => self.wake_here(&wakeups),
                    Pool::Sqlite { .. } => self.wake(&wakeups).await,
                }
                Ok(Checkpoint::Written)
            }
            None => Ok(Checkpoint::Fenced),
        }
    }

    async fn cancel(&self, id: &str, now_ms: i64) -> Result<Option<WorkflowStatus>, StoreError> {
        // The workflow and, level by level, its active descendants (region
        // passes, children), in one transaction: nothing of a cancelled
        // workflow is claimed later.
        let cancelled: Vec<(String, String)> = write_tx!(self, tx => {
            let mut cancelled: Vec<(String, String)> = sqlx::query_as(
                "UPDATE manent_workflows SET status = 'CANCELLED', finished_at = $2, updated_at = $2 \
                 WHERE id = $1 AND status IN ('ENQUEUED', 'PENDING') RETURNING id, queue_name")
                .bind(id)
                .bind(now_ms)
                .fetch_all(&mut *tx)
                .await
                .map_err(map_err)?;
            let mut parents: Vec<String> = if cancelled.is_empty() {
                Vec::new()
            } else {
                vec![id.to_string()]
            };
            while let Some(parent) = parents.pop() {
                let children: Vec<(String, String)> = sqlx::query_as(
                    "UPDATE manent_workflows SET status = 'CANCELLED', finished_at = $2, updated_at = $2 \
                     WHERE parent_id = $1 AND status IN ('ENQUEUED', 'PENDING') RETURNING id, queue_name")
                    .bind(&parent)
                    .bind(now_ms)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(map_err)?;
                parents.extend(children.iter().map(|(child, _)| child.clone()));
                cancelled.extend(children);
            }
            cancelled
        });
        let mut wakeups = Vec::new();
        for (workflow, queue) in cancelled {
            wakeups.push(Wakeup::Queue(queue));
            wakeups.push(Wakeup::Workflow(workflow));
        }
        self.wake(&wakeups).await;
        Ok(self.get_workflow(id).await?.map(|w| w.status))
    }

    async fn resume(&self, id: &str, now_ms: i64) -> Result<Option<WorkflowStatus>, StoreError> {
        let queue: Option<String> = with_writer!(self, pool => sqlx::query_scalar(
            "UPDATE manent_workflows SET status = 'ENQUEUED', executor_id = NULL, generation = generation + 1, \
             finished_at = NULL, updated_at = $2 WHERE id = $1 AND status = 'CANCELLED' RETURNING queue_name")
            .bind(id)
            .bind(now_ms)
            .fetch_optional(pool)
            .await
            .map_err(map_err))?;
        if let Some(queue) = queue {
            self.wake(&[Wakeup::Queue(queue)]).await;
        }
        Ok(self.get_workflow(id).await?.map(|w| w.status))
    }

    async fn recover_executor(
        &self,
        executor_id: &str,
        note: &str,
        now_ms: i64,
    ) -> Result<Vec<String>, StoreError> {
        let event_key = format!("recovery:{now_ms}");
        let rows: Vec<(String, String)> = write_tx!(self, tx => {
            let rows: Vec<(String, String)> = sqlx::query_as(
                "UPDATE manent_workflows SET status = 'ENQUEUED', executor_id = NULL, generation = generation + 1, \
                 updated_at = $2 WHERE executor_id = $1 AND status = 'PENDING' RETURNING id, queue_name")
                .bind(executor_id)
                .bind(now_ms)
                .fetch_all(&mut *tx)
                .await
                .map_err(map_err)?;
            // Each moved workflow keeps a note of the recovery, in the same transaction.
            for (id, _) in &rows {
                sqlx::query(
                    "INSERT INTO manent_events (workflow_id, event_key, value, updated_at) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (workflow_id, event_key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at")
                    .bind(id)
                    .bind(&event_key)
                    .bind(note)
                    .bind(now_ms)
                    .execute(&mut *tx)
                    .await
                    .map_err(map_err)?;
            }
            rows
        });
        let mut queues: Vec<String> = rows.iter().map(|(_, q)| q.clone()).collect();
        queues.sort();
        queues.dedup();
        self.wake(&queues.into_iter().map(Wakeup::Queue).collect::<Vec<_>>())
            .await;
        Ok(rows.into_iter().map(|(id, _)| id).collect())
    }

    async fn recover_stale(
        &self,
        stale_before_ms: i64,
        except: &str,
        now_ms: i64,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let stale: Vec<String> = with_pool!(self, pool => sqlx::query_scalar(
            "SELECT DISTINCT w.executor_id FROM manent_workflows w \
             LEFT JOIN manent_executors e ON e.id = w.executor_id \
             WHERE w.status = 'PENDING' AND w.executor_id <> $1 AND (e.id IS NULL OR e.heartbeat_at < $2) \
             AND NOT EXISTS (SELECT 1 FROM manent_executor_leases l WHERE l.executor_id = w.executor_id AND l.expires_at > $3)")
            .bind(except)
            .bind(stale_before_ms)
            .bind(now_ms)
            .fetch_all(pool)
            .await
            .map_err(map_err))?;
        let mut recovered = Vec::new();
        for executor in stale {
            // Re-checked in the UPDATE: an executor that came back since is left alone.
            let rows: Vec<(String, String)> = with_writer!(self, pool => sqlx::query_as(
                "UPDATE manent_workflows SET status = 'ENQUEUED', executor_id = NULL, generation = generation + 1, \
                 updated_at = $3 WHERE executor_id = $1 AND status = 'PENDING' AND NOT EXISTS ( \
                   SELECT 1 FROM manent_executors e WHERE e.id = $1 AND e.heartbeat_at >= $2) \
                 AND NOT EXISTS (SELECT 1 FROM manent_executor_leases l WHERE l.executor_id = $1 AND l.expires_at > $3) \
                 RETURNING id, queue_name")
                .bind(&executor)
                .bind(stale_before_ms)
                .bind(now_ms)
                .fetch_all(pool)
                .await
                .map_err(map_err))?;
            let wakeups: Vec<Wakeup> = rows.iter().map(|(_, q)| Wakeup::Queue(q.clone())).collect();
            self.wake(&wakeups).await;
            recovered.extend(rows.into_iter().map(|(id, _)| (executor.clone(), id)));
        }
        Ok(recovered)
    }

    async fn load_steps(&self, workflow_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        let rows: Vec<StepRow> = with_pool!(self, pool => sqlx::query_as(concat!(
            "SELECT ", step_cols!(), " FROM manent_steps WHERE workflow_id = $1 ORDER BY step_index"))
            .bind(workflow_id)
            .fetch_all(pool)
            .await
            .map_err(map_err))?;
        rows.into_iter()
            .map(|r| {
                Ok(StepRecord {
                    status: r.status.parse()?,
                    workflow_id: r.workflow_id,
                    index: r.step_index,
                    name: r.name,
                    output: r.output,
                    error: r.error,
                    attempts: r.attempts,
                    started_at_ms: r.started_at,
                    finished_at_ms: r.finished_at,
                    executor_id: r.executor_id,
                })
            })
            .collect()
    }

    async fn record_step(
        &self,
        lease: &Lease,
        step: &StepRecord,
    ) -> Result<Checkpoint, StoreError> {
        let sql = RECORD_STEP.replace("{LOCK}", self.lock_clause());
        let written = match &self.pool {
            Pool::Sqlite { group, .. } => {
                let (step, lease) = (step.clone(), lease.clone());
                group
                    .write(Box::new(move |conn| {
                        let (sql, step, lease) = (sql.clone(), step.clone(), lease.clone());
                        Box::pin(async move {
                            let done = bind_step(sqlx::query(&sql), &step, &lease)
                                .execute(conn)
                                .await?;
                            Ok(sqlite::Written {
                                rows: done.rows_affected(),
                                returned: None,
                            })
                        })
                    }))
                    .await?
                    .rows
            }
            Pool::Postgres(_) => {
                let group = self.pg_group.as_ref().ok_or_else(no_group)?;
                let applied = group
                    .write(postgres::GroupedWrite::Step {
                        lease: lease.clone(),
                        step: step.clone(),
                    })
                    .await?;
                u64::from(applied.is_some())
            }
        };
        Ok(if written == 1 {
            Checkpoint::Written
        } else {
            Checkpoint::Fenced
        })
    }

    async fn move_to_queue(
        &self,
        lease: &Lease,
        step: &StepRecord,
        queue: &str,
        partition_key: &str,
        now_ms: i64,
    ) -> Result<Checkpoint, StoreError> {
        let step_sql = RECORD_STEP.replace("{LOCK}", self.lock_clause());
        let moved = write_tx!(self, tx => {
            let written = bind_step(sqlx::query(&step_sql), step, lease)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?
                .rows_affected();
            if written == 1 {
                sqlx::query(
                    "UPDATE manent_workflows SET status = 'ENQUEUED', queue_name = $1, partition_key = $2, \
                     executor_id = NULL, generation = generation + 1, updated_at = $3 \
                     WHERE id = $4 AND executor_id = $5 AND generation = $6 AND status = 'PENDING'")
                    .bind(queue)
                    .bind(partition_key)
                    .bind(now_ms)
                    .bind(&lease.workflow_id)
                    .bind(&lease.executor_id)
                    .bind(lease.generation)
                    .execute(&mut *tx)
                    .await
                    .map_err(map_err)?
                    .rows_affected()
                    == 1
            } else {
                false
            }
        });
        if !moved {
            return Ok(Checkpoint::Fenced);
        }
        self.wake(&[
            Wakeup::Queue(queue.to_string()),
            Wakeup::Workflow(lease.workflow_id.clone()),
        ])
        .await;
        Ok(Checkpoint::Written)
    }

    async fn release(&self, lease: &Lease, now_ms: i64) -> Result<Checkpoint, StoreError> {
        let queue: Option<String> = with_writer!(self, pool => sqlx::query_scalar(
            "UPDATE manent_workflows SET status = 'ENQUEUED', executor_id = NULL, generation = generation + 1, \
             updated_at = $1 WHERE id = $2 AND executor_id = $3 AND generation = $4 AND status = 'PENDING' \
             RETURNING queue_name")
            .bind(now_ms)
            .bind(&lease.workflow_id)
            .bind(&lease.executor_id)
            .bind(lease.generation)
            .fetch_optional(pool)
            .await
            .map_err(map_err))?;
        match queue {
            Some(queue) => {
                self.wake(&[Wakeup::Queue(queue)]).await;
                Ok(Checkpoint::Written)
            }
            None => Ok(Checkpoint::Fenced),
        }
    }

    async fn count_by_status(&self, name: &str) -> Result<Vec<(WorkflowStatus, i64)>, StoreError> {
        let rows: Vec<(String, i64)> = with_pool!(self, pool => sqlx::query_as(
            "SELECT status, COUNT(*) FROM manent_workflows WHERE name = $1 GROUP BY status ORDER BY status")
            .bind(name)
            .fetch_all(pool)
            .await
            .map_err(map_err))?;
        rows.into_iter()
            .map(|(status, n)| Ok((status.parse()?, n)))
            .collect()
    }

    async fn recent_step_durations(&self, limit: i64) -> Result<Vec<i64>, StoreError> {
        with_pool!(self, pool => sqlx::query_scalar(
            "SELECT finished_at - started_at FROM manent_steps WHERE finished_at IS NOT NULL \
             AND name NOT LIKE 'manent.%' ORDER BY finished_at DESC LIMIT $1")
            .bind(limit)
            .fetch_all(pool)
            .await
            .map_err(map_err))
    }

    async fn recent_claim_latencies(&self, limit: i64) -> Result<Vec<i64>, StoreError> {
        with_pool!(self, pool => sqlx::query_scalar(
            "SELECT started_at - (CASE WHEN COALESCE(not_before, 0) > created_at THEN not_before ELSE created_at END) \
             FROM manent_workflows WHERE started_at IS NOT NULL ORDER BY started_at DESC LIMIT $1")
            .bind(limit)
            .fetch_all(pool)
            .await
            .map_err(map_err))
    }

    async fn send_message(
        &self,
        workflow_id: &str,
        topic: &str,
        payload: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        with_writer!(self, pool => sqlx::query(
            "INSERT INTO manent_messages (workflow_id, topic, payload, created_at) VALUES ($1, $2, $3, $4)")
            .bind(workflow_id)
            .bind(topic)
            .bind(payload)
            .bind(now_ms)
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(map_err))?;
        self.wake(&[Wakeup::Workflow(workflow_id.to_string())])
            .await;
        Ok(())
    }

    async fn consume_message(
        &self,
        lease: &Lease,
        topic: &str,
        step: &StepRecord,
    ) -> Result<Consumed, StoreError> {
        let lease_sql = LEASE_HOLDS.replace("{LOCK}", self.lock_clause());
        let step_sql = RECORD_STEP.replace("{LOCK}", self.lock_clause());
        let outcome = write_tx!(self, tx => {
            let holds: Option<String> = sqlx::query_scalar(&lease_sql)
                .bind(&lease.workflow_id)
                .bind(&lease.executor_id)
                .bind(lease.generation)
                .fetch_optional(&mut *tx)
                .await
                .map_err(map_err)?;
            if holds.is_none() {
                Consumed::Fenced
            } else {
                let message: Option<(i64, String)> = sqlx::query_as(
                    "SELECT id, payload FROM manent_messages WHERE workflow_id = $1 AND topic = $2 ORDER BY id LIMIT 1")
                    .bind(&lease.workflow_id)
                    .bind(topic)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(map_err)?;
                match message {
                    None => Consumed::Empty,
                    Some((id, payload)) => {
                        sqlx::query("DELETE FROM manent_messages WHERE id = $1")
                            .bind(id)
                            .execute(&mut *tx)
                            .await
                            .map_err(map_err)?;
                        let mut recorded = step.clone();
                        recorded.output = Some(payload.clone());
                        bind_step(sqlx::query(&step_sql), &recorded, lease)
                            .execute(&mut *tx)
                            .await
                            .map_err(map_err)?;
                        Consumed::Message(payload)
                    }
                }
            }
        });
        Ok(outcome)
    }

    async fn set_event(
        &self,
        lease: &Lease,
        key: &str,
        value: &str,
        step: &StepRecord,
    ) -> Result<Checkpoint, StoreError> {
        let step_sql = RECORD_STEP.replace("{LOCK}", self.lock_clause());
        let written = write_tx!(self, tx => {
            let written = bind_step(sqlx::query(&step_sql), step, lease)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?
                .rows_affected();
            if written == 1 {
                sqlx::query(
                    "INSERT INTO manent_events (workflow_id, event_key, value, updated_at) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (workflow_id, event_key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at")
                    .bind(&lease.workflow_id)
                    .bind(key)
                    .bind(value)
                    .bind(step.started_at_ms)
                    .execute(&mut *tx)
                    .await
                    .map_err(map_err)?;
            }
            written == 1
        });
        if written {
            self.wake(&[Wakeup::Workflow(lease.workflow_id.clone())])
                .await;
            Ok(Checkpoint::Written)
        } else {
            Ok(Checkpoint::Fenced)
        }
    }

    async fn list_events(&self, workflow_id: &str) -> Result<Vec<EventRecord>, StoreError> {
        let rows: Vec<(String, String, i64)> = with_pool!(self, pool => sqlx::query_as(
            "SELECT event_key, value, updated_at FROM manent_events WHERE workflow_id = $1 ORDER BY event_key")
            .bind(workflow_id)
            .fetch_all(pool)
            .await
            .map_err(map_err))?;
        Ok(rows
            .into_iter()
            .map(|(key, value, updated_at_ms)| EventRecord {
                key,
                value,
                updated_at_ms,
            })
            .collect())
    }

    async fn list_events_of(
        &self,
        workflow_ids: &[String],
    ) -> Result<Vec<(String, EventRecord)>, StoreError> {
        let mut out = Vec::new();
        // Well under both backends' limits on bound parameters.
        for chunk in workflow_ids.chunks(500) {
            let marks: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
            let sql = format!(
                "SELECT workflow_id, event_key, value, updated_at FROM manent_events \
                 WHERE workflow_id IN ({}) ORDER BY workflow_id, event_key",
                marks.join(", ")
            );
            let rows: Vec<(String, String, String, i64)> = with_pool!(self, pool => {
                let mut query = sqlx::query_as(&sql);
                for id in chunk {
                    query = query.bind(id);
                }
                query.fetch_all(pool).await.map_err(map_err)
            })?;
            out.extend(rows.into_iter().map(|(id, key, value, updated_at_ms)| {
                (
                    id,
                    EventRecord {
                        key,
                        value,
                        updated_at_ms,
                    },
                )
            }));
        }
        Ok(out)
    }

    async fn upsert_executor(&self, e: &ExecutorRecord) -> Result<(), StoreError> {
        let queues = serde_json::to_string(&e.queues)
            .map_err(|err| StoreError::Database(err.to_string()))?;
        with_writer!(self, pool => sqlx::query(
            "INSERT INTO manent_executors (id, host, pid, region, queues, state, started_at, heartbeat_at, stopped_at, version) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (id) DO UPDATE SET host = excluded.host, \
             pid = excluded.pid, region = excluded.region, queues = excluded.queues, state = excluded.state, \
             started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at, stopped_at = excluded.stopped_at, \
             version = excluded.version")
            .bind(&e.id)
            .bind(&e.host)
            .bind(e.pid)
            .bind(&e.region)
            .bind(&queues)
            .bind(e.state.as_str())
            .bind(e.started_at_ms)
            .bind(e.heartbeat_at_ms)
            .bind(e.stopped_at_ms)
            .bind(&e.version)
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(map_err))?;
        Ok(())
    }

    async fn get_executor(&self, id: &str) -> Result<Option<ExecutorRecord>, StoreError> {
        let sql = format!("{EXECUTOR_SELECT} WHERE e.id = $1");
        let row: Option<ExecutorRow> = with_pool!(self, pool => sqlx::query_as(&sql)
            .bind(id)
            .fetch_optional(pool)
            .await
            .map_err(map_err))?;
        row.map(ExecutorRecord::try_from).transpose()
    }

    async fn heartbeat(
        &self,
        id: &str,
        state: ExecutorState,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        with_writer!(self, pool => sqlx::query(
            "UPDATE manent_executors SET heartbeat_at = $2, state = $3, \
             stopped_at = CASE WHEN $3 = 'stopped' THEN $2 ELSE NULL END WHERE id = $1")
            .bind(id)
            .bind(now_ms)
            .bind(state.as_str())
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(map_err))?;
        Ok(())
    }

    async fn list_executors(&self) -> Result<Vec<ExecutorRecord>, StoreError> {
        let sql = format!("{EXECUTOR_SELECT} ORDER BY e.id");
        let rows: Vec<ExecutorRow> = with_pool!(self, pool => sqlx::query_as(&sql)
            .fetch_all(pool)
            .await
            .map_err(map_err))?;
        rows.into_iter().map(ExecutorRecord::try_from).collect()
    }

    async fn acquire_liveness(&self, executor_id: &str) -> Result<Liveness, StoreError> {
        match (&self.pool, &self.pg_options) {
            (Pool::Postgres(_), Some(options)) => {
                postgres::acquire_liveness(options, executor_id).await
            }
            _ => sqlite::acquire_liveness(self.sqlite_path.as_deref(), executor_id),
        }
    }

    async fn acquire_executor_lease(
        &self,
        lease: &ExecutorLease,
        override_live: bool,
    ) -> Result<LeaseGrant, StoreError> {
        // One statement: of concurrent newcomers, the first update moves the
        // deadline into the future and the others' WHERE no longer holds.
        let granted = with_writer!(self, pool => sqlx::query(
            "INSERT INTO manent_executor_leases (executor_id, holder, host, pid, acquired_at, renewed_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $5, $6) ON CONFLICT (executor_id) DO UPDATE SET holder = excluded.holder, \
             host = excluded.host, pid = excluded.pid, acquired_at = excluded.acquired_at, \
             renewed_at = excluded.renewed_at, expires_at = excluded.expires_at \
             WHERE manent_executor_leases.expires_at <= $5 OR manent_executor_leases.holder = excluded.holder OR $7")
            .bind(&lease.executor_id)
            .bind(&lease.holder)
            .bind(&lease.host)
            .bind(lease.pid)
            .bind(lease.acquired_at_ms)
            .bind(lease.expires_at_ms)
            .bind(override_live)
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(map_err))?;
        if granted == 1 {
            return Ok(LeaseGrant::Granted);
        }
        match self.get_executor_lease(&lease.executor_id).await? {
            Some(current) => Ok(LeaseGrant::Held(current)),
            // Ended between the two statements: ask again.
            None => Box::pin(self.acquire_executor_lease(lease, override_live)).await,
        }
    }

    async fn renew_executor_lease(
        &self,
        executor_id: &str,
        holder: &str,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<Renewal, StoreError> {
        let renewed = with_writer!(self, pool => sqlx::query(
            "UPDATE manent_executor_leases SET renewed_at = $3, expires_at = $4 WHERE executor_id = $1 AND holder = $2")
            .bind(executor_id)
            .bind(holder)
            .bind(now_ms)
            .bind(expires_at_ms)
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(map_err))?;
        if renewed == 1 {
            Ok(Renewal::Renewed)
        } else {
            Ok(Renewal::Lost(self.get_executor_lease(executor_id).await?))
        }
    }

    async fn get_executor_lease(
        &self,
        executor_id: &str,
    ) -> Result<Option<ExecutorLease>, StoreError> {
        let row: Option<LeaseRow> = with_pool!(self, pool => sqlx::query_as(
            "SELECT executor_id, holder, host, pid, acquired_at, renewed_at, expires_at \
             FROM manent_executor_leases WHERE executor_id = $1")
            .bind(executor_id)
            .fetch_optional(pool)
            .await
            .map_err(map_err))?;
        Ok(row.map(ExecutorLease::from))
    }

    async fn end_executor_lease(
        &self,
        executor_id: &str,
        holder: Option<&str>,
    ) -> Result<bool, StoreError> {
        let ended = with_writer!(self, pool => sqlx::query(
            "DELETE FROM manent_executor_leases WHERE executor_id = $1 AND ($2 IS NULL OR holder = $2)")
            .bind(executor_id)
            .bind(holder)
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(map_err))?;
        Ok(ended > 0)
    }

    async fn revoke_executor_lease(
        &self,
        executor_id: &str,
        holder: &str,
    ) -> Result<bool, StoreError> {
        let revoked = with_writer!(self, pool => sqlx::query(
            "UPDATE manent_executor_leases SET holder = $3 WHERE executor_id = $1 AND holder = $2")
            .bind(executor_id)
            .bind(holder)
            .bind(format!("revoked: {holder}"))
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(map_err))?;
        Ok(revoked > 0)
    }

    async fn put_record(
        &self,
        kind: &str,
        key: &str,
        value: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.write_record(kind, key, value, now_ms, true)
            .await
            .map(|_| ())
    }

    async fn insert_record(
        &self,
        kind: &str,
        key: &str,
        value: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.write_record(kind, key, value, now_ms, false).await
    }

    async fn insert_records(
        &self,
        records: &[RecordEntry<'_>],
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        write_tx!(self, tx => {
            for record in records {
                let inserted = sqlx::query(INSERT_RECORD_IF_FREE)
                    .bind(record.kind)
                    .bind(record.key)
                    .bind(record.value)
                    .bind(now_ms)
                    .execute(&mut *tx)
                    .await
                    .map_err(map_err)?
                    .rows_affected();
                if inserted == 0 {
                    // Dropping the transaction rolls back what this call wrote so far.
                    return Ok(false);
                }
            }
        });
        Ok(true)
    }

    async fn get_record(&self, kind: &str, key: &str) -> Result<Option<String>, StoreError> {
        with_pool!(self, pool => sqlx::query_scalar("SELECT value FROM manent_records WHERE kind = $1 AND record_key = $2")
            .bind(kind)
            .bind(key)
            .fetch_optional(pool)
            .await
            .map_err(map_err))
    }

    async fn list_records(&self, kind: &str) -> Result<Vec<(String, String)>, StoreError> {
        with_pool!(self, pool => sqlx::query_as(
            "SELECT record_key, value FROM manent_records WHERE kind = $1 ORDER BY record_key")
            .bind(kind)
            .fetch_all(pool)
            .await
            .map_err(map_err))
    }

    async fn delete_record(&self, kind: &str, key: &str) -> Result<bool, StoreError> {
        let deleted = with_writer!(self, pool => sqlx::query(DELETE_RECORD)
            .bind(kind)
            .bind(key)
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(map_err))?;
        Ok(deleted == 1)
    }

    async fn delete_records(&self, keys: &[(&str, &str)]) -> Result<u64, StoreError> {
        let deleted = write_tx!(self, tx => {
            let mut deleted = 0;
            for (kind, key) in keys {
                deleted += sqlx::query(DELETE_RECORD)
                    .bind(*kind)
                    .bind(*key)
                    .execute(&mut *tx)
                    .await
                    .map_err(map_err)?
                    .rows_affected();
            }
            deleted
        });
        Ok(deleted)
    }

    async fn append_output(
        &self,
        workflow_id: &str,
        lines: &[OutputLine],
    ) -> Result<(), StoreError> {
        if lines.is_empty() {
            return Ok(());
        }
        // One statement per batch; batches are small (what a step printed in a moment).
        let mut sql = String::from(
            "INSERT INTO manent_output (workflow_id, at, generation, source, stream, line) VALUES ",
        );
        let rows: Vec<String> = (0..lines.len())
            .map(|i| {
                let b = i * 6;
                format!(
                    "(${}, ${}, ${}, ${}, ${}, ${})",
                    b + 1,
                    b + 2,
                    b + 3,
                    b + 4,
                    b + 5,
                    b + 6
                )
            })
            .collect();
        sql.push_str(&rows.join(", "));
        with_writer!(self, pool => {
            let mut query = sqlx::query(&sql);
            for l in lines {
                query = query
                    .bind(workflow_id)
                    .bind(l.at_ms)
                    .bind(l.generation)
                    .bind(&l.source)
                    .bind(&l.stream)
                    .bind(&l.line);
            }
            query.execute(pool).await.map(|_| ()).map_err(map_err)
        })
    }

    async fn list_output(
        &self,
        workflow_id: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<OutputLine>, StoreError> {
        type Row = (i64, i64, i64, String, String, String);
        let rows: Vec<Row> = with_pool!(self, pool => sqlx::query_as(
            "SELECT id, at, generation, source, stream, line FROM manent_output \
             WHERE workflow_id = $1 AND id > $2 ORDER BY id LIMIT $3")
            .bind(workflow_id)
            .bind(after)
            .bind(limit.max(0))
            .fetch_all(pool)
            .await
            .map_err(map_err))?;
        Ok(rows
            .into_iter()
            .map(
                |(seq, at_ms, generation, source, stream, line)| OutputLine {
                    seq,
                    at_ms,
                    generation,
                    source,
                    stream,
                    line,
                },
            )
            .collect())
    }

    async fn append_audit(&self, entry: &AuditRecord) -> Result<(), StoreError> {
        with_writer!(self, pool => sqlx::query(
            "INSERT INTO manent_audit (at, actor, actor_id, action, target, outcome, detail) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)")
            .bind(entry.at_ms)
            .bind(&entry.actor)
            .bind(&entry.actor_id)
            .bind(&entry.action)
            .bind(&entry.target)
            .bind(entry.outcome)
            .bind(&entry.detail)
            .execute(pool)
            .await
            .map(|_| ())
            .map_err(map_err))
    }

    async fn list_audit(&self, limit: i64) -> Result<Vec<AuditRecord>, StoreError> {
        type Row = (i64, i64, String, String, String, String, i64, String);
        let rows: Vec<Row> = with_pool!(self, pool => sqlx::query_as(
            "SELECT id, at, actor, actor_id, action, target, outcome, detail FROM manent_audit \
             ORDER BY id DESC LIMIT $1")
            .bind(limit.max(0))
            .fetch_all(pool)
            .await
            .map_err(map_err))?;
        Ok(rows
            .into_iter()
            .map(
                |(seq, at_ms, actor, actor_id, action, target, outcome, detail)| AuditRecord {
                    seq,
                    at_ms,
                    actor,
                    actor_id,
                    action,
                    target,
                    outcome,
                    detail,
                },
            )
            .collect())
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

/// Binds a step and its lease to [`RECORD_STEP`]'s eleven parameters.
fn bind_step<'q, DB>(
    query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>,
    step: &'q StepRecord,
    lease: &'q Lease,
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>
where
    DB: sqlx::Database,
    String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<String>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<i64>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    query
        .bind(step.workflow_id.clone())
        .bind(step.index)
        .bind(step.name.clone())
        .bind(step.status.as_str())
        .bind(step.output.clone())
        .bind(step.error.clone())
        .bind(step.attempts)
        .bind(step.started_at_ms)
        .bind(step.finished_at_ms)
        .bind(step.executor_id.clone())
        .bind(lease.generation)
}

/// Opens a claim transaction on PostgreSQL, in one round trip (a simple query:
/// `BEGIN` and the statement after it): the queue's (or group's) advisory lock,
/// and `enable_sort = off` for this transaction only.
/// Without statistics (a burst enqueued since the last autovacuum ANALYZE)
/// the planner estimates one ENQUEUED row and reads the page through
/// `manent_workflows_scheduled` (or `manent_workflows_queue`), then sorts:
/// every queued row, on every claim (121 ms per claim at 100,000 queued in
/// bench/README.md, "Claims at any backlog"). With sorting priced out, the
/// only plan left for `ORDER BY priority, created_seq, id` is the ordered
/// scan of `manent_workflows_claimable`, which stops at the page's LIMIT.
/// The claim's other statements have no ORDER BY; their GROUP BY hashes.
///
/// The lock key (a queue or group name) is written as an escaped literal
/// (`E'…'`: backslashes and quotes doubled, whatever
/// `standard_conforming_strings` says): the same `hashtext` lock as a bound
/// parameter gives, so workers of an earlier version still take turns with these.
fn pg_claim_begin(lock_key: &str) -> String {
    let literal = lock_key.replace('\\', "\\\\").replace('\'', "''");
    format!(
        "BEGIN; SELECT pg_advisory_xact_lock({}, hashtext(E'{literal}')), \
         set_config('enable_sort', 'off', true)",
        postgres::LOCK_NAMESPACE_QUEUE
    )
}

/// The record of applied migrations (`migrations.rs`), made by the first migrator.
const CREATE_MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS manent_schema_migrations (
    version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)";

/// What a claim counts before it takes anything: the running workflows of queue `$1`
/// and of limit group `$2`, per executor and partition (`0` and `1` tell which).
/// Each half reads a partial index of running rows (`manent_workflows_running`,
/// `manent_workflows_group_running`), whatever the history holds.
const CLAIM_RUNNING_SQL: &str = "SELECT CAST(0 AS BIGINT), executor_id, partition_key, COUNT(*) FROM manent_workflows \
     WHERE queue_name = $1 AND status = 'PENDING' GROUP BY executor_id, partition_key \
     UNION ALL \
     SELECT CAST(1 AS BIGINT), executor_id, partition_key, COUNT(*) FROM manent_workflows \
     WHERE limit_group = $2 AND status = 'PENDING' GROUP BY executor_id, partition_key";

/// The queued and running workflows of every queue. Each status on its own, so that each
/// count reads the partial index of that status (`manent_workflows_claimable`,
/// `manent_workflows_running`), not the table.
const QUEUE_DEPTHS_SQL: &str = "SELECT queue_name, COUNT(*), CAST(0 AS BIGINT) FROM manent_workflows \
     WHERE status = 'ENQUEUED' GROUP BY queue_name \
     UNION ALL \
     SELECT queue_name, CAST(0 AS BIGINT), COUNT(*) FROM manent_workflows \
     WHERE status = 'PENDING' GROUP BY queue_name";

/// One page of a queue's claimable backlog in claim order: `$1` queue, `$2`
/// now, `$3` the page's size, `$4` the full partitions to leave out (a JSON
/// array), then (`keyset`) `$5..$7` the last row read. One text per shape, so
/// the prepared statement is reused whatever the page holds. On SQLite the
/// index is named: without `ANALYZE` statistics (manent never runs it) SQLite
/// prefers `manent_workflows_scheduled` for its `not_before` range and sorts
/// every queued row in a temporary B-tree.
fn claim_page_sql(is_pg: bool, keyset: bool) -> &'static str {
    macro_rules! page {
        ($from:literal, $excluded:literal, $keyset:literal) => {
            concat!(
                "SELECT id, partition_key, priority, created_seq FROM manent_workflows",
                $from,
                " WHERE queue_name = $1 AND status = 'ENQUEUED' AND not_before <= $2 AND ",
                $excluded,
                $keyset,
                " ORDER BY priority, created_seq, id LIMIT $3"
            )
        };
    }
    match (is_pg, keyset) {
        (true, false) => page!(
            "",
            "partition_key <> ALL (ARRAY(SELECT json_array_elements_text($4::json)))",
            ""
        ),
        (true, true) => page!(
            "",
            "partition_key <> ALL (ARRAY(SELECT json_array_elements_text($4::json)))",
            " AND (priority, created_seq, id) > ($5, $6, $7)"
        ),
        (false, false) => page!(
            " INDEXED BY manent_workflows_claimable",
            "partition_key NOT IN (SELECT value FROM json_each($4))",
            ""
        ),
        (false, true) => page!(
            " INDEXED BY manent_workflows_claimable",
            "partition_key NOT IN (SELECT value FROM json_each($4))",
            " AND (priority, created_seq, id) > ($5, $6, $7)"
        ),
    }
}

/// The claim's update of the workflows it picked (`$4`, a JSON array of ids).
///
/// On PostgreSQL the status is compared as `status || ''`, an expression no index's
/// predicate matches, so the rows are reached through the primary key whatever the
/// table's statistics say. Written as `status = 'ENQUEUED'`, it made the partial indexes
/// (`WHERE status = 'ENQUEUED'`) candidates, and on a table not analyzed since a burst of
/// enqueues the planner read the whole of `manent_workflows_claimable` (its dead entries
/// included) to find the few picked ids, or intersected a bitmap of every queued row:
/// 3 ms instead of 0.2 ms per claim at 10,000 queued, and at a constant backlog of
/// 10,000 that statement was running in 97 of 150 samples of `pg_stat_activity`, at
/// half the throughput of 1,000 or 100,000 (bench/README.md, "Constant backlog").
/// SQLite already reaches them through the primary key.
fn claim_update_sql(is_pg: bool) -> &'static str {
    macro_rules! update {
        ($enqueued:literal, $picked:literal) => {
            concat!(
                "UPDATE manent_workflows SET status = 'PENDING', executor_id = $1, limit_group = $2, \
                 generation = generation + 1, attempts = attempts + 1, started_at = COALESCE(started_at, $3), \
                 updated_at = $3 WHERE ",
                $enqueued,
                " AND id ",
                $picked,
                " RETURNING ",
                wf_cols!()
            )
        };
    }
    if is_pg {
        update!(
            "status || '' = 'ENQUEUED'",
            "= ANY (ARRAY(SELECT json_array_elements_text($4::json)))"
        )
    } else {
        update!(
            "status = 'ENQUEUED'",
            "IN (SELECT value FROM json_each($4))"
        )
    }
}

/// Rows per multi-row INSERT of `enqueue_many` (11 parameters each, well under both
/// backends' caps). SQLite's is small: binding parameter N looks its name up in a list
/// of all the statement's parameters (`sqlite3_bind_parameter_name`, called by sqlx for
/// each), so a statement's binding costs grow with the square of its parameters. At 500
/// rows (5,500 parameters) that lookup was a quarter of the CPU of a 100,000-workflow
/// enqueue, which took 11.9 s against PostgreSQL's 4.6–6.1 s.
fn enqueue_chunk_rows(is_pg: bool) -> usize {
    if is_pg { 500 } else { 50 }
}

/// `items` as a JSON array of strings: one bound parameter for a list of any length.
/// The query of [`Store::list_workflows`] for `f`: only the filters given are in its
/// `WHERE`, so the planner sees which columns are fixed and reads the index that serves
/// them (one partition's history through `manent_workflows_partition`, a workflow's
/// children through `manent_workflows_parent`). Written as `($n IS NULL OR column = $n)`
/// for every filter, SQLite cannot use any of them: it read the whole history newest
/// first to find one application's deploys. Returns the text and the filters' values,
/// bound in order before the limit and the offset.
fn list_sql(f: &WorkflowFilter) -> (String, Vec<&str>) {
    let filters = [
        ("status", f.status.map(WorkflowStatus::as_str)),
        ("queue_name", f.queue.as_deref()),
        ("name", f.name.as_deref()),
        ("executor_id", f.executor_id.as_deref()),
        ("parent_id", f.parent_id.as_deref()),
        ("partition_key", f.partition_key.as_deref()),
    ];
    let mut sql = String::from(concat!("SELECT ", wf_cols!(), " FROM manent_workflows"));
    let mut values = Vec::new();
    for (column, value) in filters {
        if let Some(value) = value {
            values.push(value);
            let keyword = if values.len() == 1 { "WHERE" } else { "AND" };
            sql.push_str(&format!(" {keyword} {column} = ${}", values.len()));
        }
    }
    sql.push_str(&format!(
        " ORDER BY created_seq DESC LIMIT ${} OFFSET ${}",
        values.len() + 1,
        values.len() + 2
    ));
    (sql, values)
}

fn json_list(items: &[&str]) -> String {
    serde_json::Value::from(items).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_the_password_only() {
        assert_eq!(
            redact("postgres://u:secret@h/db"),
            "postgres://u:***@h/db",
            "password must not be shown"
        );
        assert_eq!(
            redact("postgres://u@h/db"),
            "postgres://u@h/db",
            "no password, nothing to hide"
        );
        assert_eq!(redact("sqlite://x.db"), "sqlite://x.db");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_page_scans_the_claimable_index_without_sorting_on_sqlite() {
        claim_page_plans_read_the_claimable_index(manent_testkit::Db::Sqlite).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn grouped_step_writes_on_postgresql_fence_each_row_by_its_own_lease() {
        grouped_writes_fence_each_row(manent_testkit::Db::Postgres).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn grouped_step_writes_on_sqlite_fence_each_row_by_its_own_lease() {
        grouped_writes_fence_each_row(manent_testkit::Db::Sqlite).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_on_sqlite_leaves_the_writer_synced_for_every_later_write() {
        let test = manent_testkit::TestDb::new(manent_testkit::Db::Sqlite).await;
        let store = SqlStore::connect(&test.url).await.expect("connect");
        store.migrate().await.expect("migrate");
        let now = crate::now_ms();
        store
            .enqueue(&queued("w0".into(), String::new(), now))
            .await
            .expect("enqueue");
        let Pool::Sqlite { write, .. } = &store.pool else {
            unreachable!("a SQLite store")
        };
        let limits = ClaimLimits {
            worker: 1,
            partition: None,
            global: 0,
            group: None,
        };
        let claimed = store.claim("q", "e", limits, now, 1).await.expect("claim");
        assert_eq!(claimed.len(), 1, "the queued workflow is claimed");
        let level: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(write)
            .await
            .expect("read the writer's level");
        assert_eq!(
            level, 2,
            "after a claim the writer is back at FULL: every checkpoint is synced"
        );
    }

    /// Workflow `id` of `w` on queue `q`, in `partition`, claimable from `now`.
    fn queued(id: String, partition: String, now: i64) -> NewWorkflow {
        NewWorkflow {
            id,
            name: "w".into(),
            queue: "q".into(),
            partition_key: partition,
            priority: 0,
            not_before_ms: now,
            dedup_key: None,
            input: "null".into(),
            parent_id: None,
            now_ms: now,
        }
    }

    /// Ten runs write a step at once (so the writes share groups); one of them
    /// holds a stale generation. Only that one is fenced; every other is written,
    /// and a finished step is never overwritten by a later write of it.
    async fn grouped_writes_fence_each_row(db: manent_testkit::Db) {
        let test = manent_testkit::TestDb::new(db).await;
        let store = SqlStore::connect(&test.url).await.expect("connect");
        store.migrate().await.expect("migrate");
        let now = crate::now_ms();
        let wfs: Vec<NewWorkflow> = (0..10)
            .map(|i| queued(format!("w{i}"), String::new(), now))
            .collect();
        store.enqueue_many(&wfs).await.expect("enqueue");
        let limits = ClaimLimits {
            worker: 10,
            partition: None,
            global: 0,
            group: None,
        };
        let claimed = store.claim("q", "e", limits, now, 10).await.expect("claim");
        assert_eq!(claimed.len(), 10, "all ten are claimed");
        let writes = claimed.iter().map(|record| {
            let mut lease = record.lease().expect("a claimed workflow has a lease");
            if record.id == "w3" {
                lease.generation -= 1;
            }
            let step = StepRecord {
                workflow_id: record.id.clone(),
                index: 0,
                name: "s".into(),
                status: super::super::StepStatus::Success,
                output: Some(format!("\"{}\"", record.id)),
                error: None,
                attempts: 1,
                started_at_ms: now,
                finished_at_ms: Some(now),
                executor_id: "e".into(),
            };
            let store = &store;
            async move {
                (
                    lease.workflow_id.clone(),
                    store.record_step(&lease, &step).await,
                )
            }
        });
        for (id, written) in futures::future::join_all(writes).await {
            let written = written.unwrap_or_else(|e| panic!("the write of {id} runs: {e}"));
            let expected = if id == "w3" {
                Checkpoint::Fenced
            } else {
                Checkpoint::Written
            };
            assert_eq!(written, expected, "{id}: only the stale lease is fenced");
            let steps = store.load_steps(&id).await.expect("load");
            assert_eq!(
                steps.len(),
                usize::from(id != "w3"),
                "{id}: the step is recorded exactly when its lease held"
            );
        }
        // A second write of a finished step changes nothing.
        let record = claimed.iter().find(|r| r.id == "w1").expect("w1");
        let lease = record.lease().expect("lease");
        let mut again = store.load_steps("w1").await.expect("load").remove(0);
        again.output = Some("\"changed\"".into());
        store
            .record_step(&lease, &again)
            .await
            .expect("write again");
        let kept = store.load_steps("w1").await.expect("load").remove(0);
        assert_eq!(
            kept.output.as_deref(),
            Some("\"w1\""),
            "a recorded step is never overwritten"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_claims_one_round_trip_begin_takes_the_same_queue_lock_as_the_bound_form() {
        let test = manent_testkit::TestDb::new(manent_testkit::Db::Postgres).await;
        let store = SqlStore::connect(&test.url).await.expect("connect");
        let Pool::Postgres(pool) = &store.pool else {
            panic!("a PostgreSQL store")
        };
        for name in ["deploys", "it's", "back\\slash\\'", "group:ü"] {
            let holder = pool
                .begin_with(pg_claim_begin(name))
                .await
                .unwrap_or_else(|e| panic!("the begin for {name:?} runs: {e}"));
            let mut other = pool.acquire().await.expect("a second connection");
            let free: bool =
                sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1, hashtext($2))")
                    .bind(postgres::LOCK_NAMESPACE_QUEUE)
                    .bind(name)
                    .fetch_one(&mut *other)
                    .await
                    .expect("try the bound lock");
            assert!(
                !free,
                "the lock the begin took for {name:?} is the one claimers of that queue take"
            );
            drop(other);
            holder.rollback().await.expect("rollback");
        }
    }

    /// Workflow `i` of [`store_with_unanalyzed_backlog`]: an id as long as the engine's
    /// (UUIDs), so the index that carries them grows, and with it the planner's price
    /// for reading it.
    fn backlog_id(i: usize) -> String {
        format!("0190c0de-0000-7000-8000-{i:012}")
    }

    /// A fresh store with `n` workflows enqueued in one burst over 5,000 partitions and
    /// never analyzed (the state right after a bulk enqueue), and the time they were
    /// enqueued at. The database lives as long as the returned `TestDb`.
    async fn store_with_unanalyzed_backlog(
        db: manent_testkit::Db,
        n: usize,
    ) -> (manent_testkit::TestDb, SqlStore, i64) {
        let test = manent_testkit::TestDb::new(db).await;
        let store = SqlStore::connect(&test.url)
            .await
            .expect("connect the test store");
        store.migrate().await.expect("migrate the test store");
        let now = crate::now_ms();
        let wfs: Vec<NewWorkflow> = (0..n)
            .map(|i| queued(backlog_id(i), format!("p{}", i % 5000), now))
            .collect();
        store.enqueue_many(&wfs).await.expect("enqueue the backlog");
        (test, store, now)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_page_scans_the_claimable_index_without_sorting_on_postgres() {
        claim_page_plans_read_the_claimable_index(manent_testkit::Db::Postgres).await;
    }

    /// A backlog written in one burst and never analyzed (the state right
    /// after a bulk enqueue): each form of the claim's page query must be the
    /// ordered scan of `manent_workflows_claimable`, never a sort of the backlog.
    /// 100,000 rows: with fewer, PostgreSQL's estimates happened to favour the
    /// claimable index even without the fix, and the test proved nothing there.
    async fn claim_page_plans_read_the_claimable_index(db: manent_testkit::Db) {
        let (_test, store, now) = store_with_unanalyzed_backlog(db, 100_000).await;
        // Work running, as when a claim is woken by a finished workflow.
        let limits = ClaimLimits {
            worker: 50,
            partition: Some(1),
            global: 0,
            group: None,
        };
        let claimed = store
            .claim("q", "e", limits, now, 64)
            .await
            .expect("claim the first batch");
        assert_eq!(
            claimed.len(),
            50,
            "the first claim fills the worker's 50 slots"
        );
        let is_pg = db == manent_testkit::Db::Postgres;
        for (keyset, excluded) in [(false, 0), (false, 3), (true, 0), (true, 3)] {
            let sql = claim_page_sql(is_pg, keyset);
            let keys: Vec<String> = (0..excluded).map(|i| format!("p{i}")).collect();
            let keys = json_list(&keys.iter().map(String::as_str).collect::<Vec<_>>());
            let plan = match &store.pool {
                Pool::Postgres(pool) => {
                    // Inside a claim transaction, as the claim runs it, and with the
                    // plan a prepared statement settles on after a few runs.
                    let mut tx = pool.begin_with(pg_claim_begin("q")).await.expect("begin");
                    sqlx::query("SET LOCAL plan_cache_mode = force_generic_plan")
                        .execute(&mut *tx)
                        .await
                        .expect("generic plans");
                    let explain = format!("EXPLAIN {sql}");
                    let mut query = sqlx::query_scalar::<_, String>(&explain)
                        .bind("q")
                        .bind(now)
                        .bind(16_i64)
                        .bind(&keys);
                    if keyset {
                        query = query
                            .bind(0_i64)
                            .bind(5_000_i64)
                            .bind("0190c0de-0000-7000-8000-000000005000");
                    }
                    let lines = query.fetch_all(&mut *tx).await.expect("explain the page");
                    tx.rollback().await.expect("rollback");
                    lines.join("\n")
                }
                Pool::Sqlite { read: pool, .. } => {
                    let explain = format!("EXPLAIN QUERY PLAN {sql}");
                    let mut query = sqlx::query_as::<_, (i64, i64, i64, String)>(&explain)
                        .bind("q")
                        .bind(now)
                        .bind(16_i64)
                        .bind(&keys);
                    if keyset {
                        query = query
                            .bind(0_i64)
                            .bind(5_000_i64)
                            .bind("0190c0de-0000-7000-8000-000000005000");
                    }
                    let rows = query.fetch_all(pool).await.expect("explain the page");
                    rows.into_iter()
                        .map(|(_, _, _, detail)| detail)
                        .collect::<Vec<_>>()
                        .join("\n")
                }
            };
            assert!(
                plan.contains("manent_workflows_claimable"),
                "the page (keyset {keyset}, {excluded} excluded) must read the claimable index, \
                 not scan the backlog; plan:\n{plan}"
            );
            assert!(
                !plan.contains("Sort") && !plan.contains("TEMP B-TREE"),
                "the page (keyset {keyset}, {excluded} excluded) must come in index order, not \
                 from sorting every queued row; plan:\n{plan}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_claims_update_reaches_the_picked_rows_by_primary_key_on_postgres() {
        claim_update_plans_use_the_primary_key(manent_testkit::Db::Postgres).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_claims_update_reaches_the_picked_rows_by_primary_key_on_sqlite() {
        claim_update_plans_use_the_primary_key(manent_testkit::Db::Sqlite).await;
    }

    /// 10,000 queued in one burst and never analyzed, the backlog at which PostgreSQL
    /// read the whole claimable index to find the picked ids: the update must look
    /// them up by primary key, in the plan a fresh statement gets and in the one a
    /// prepared statement settles on.
    async fn claim_update_plans_use_the_primary_key(db: manent_testkit::Db) {
        let (_test, store, now) = store_with_unanalyzed_backlog(db, 10_000).await;
        let picked = [backlog_id(17), backlog_id(4_000), backlog_id(9_999)];
        let picked = json_list(&picked.iter().map(String::as_str).collect::<Vec<_>>());
        let sql = claim_update_sql(db == manent_testkit::Db::Postgres);
        let plans: Vec<(&str, String)> = match &store.pool {
            Pool::Postgres(pool) => {
                let mut plans = Vec::new();
                for mode in ["force_custom_plan", "force_generic_plan"] {
                    let mut tx = pool.begin_with(pg_claim_begin("q")).await.expect("begin");
                    sqlx::query(&format!("SET LOCAL plan_cache_mode = {mode}"))
                        .execute(&mut *tx)
                        .await
                        .expect("set the plan cache mode");
                    let lines = sqlx::query_scalar::<_, String>(&format!("EXPLAIN {sql}"))
                        .bind("e")
                        .bind("q")
                        .bind(now)
                        .bind(&picked)
                        .fetch_all(&mut *tx)
                        .await
                        .expect("explain the update");
                    tx.rollback().await.expect("rollback");
                    plans.push((mode, lines.join("\n")));
                }
                plans
            }
            Pool::Sqlite { read: pool, .. } => {
                let rows = sqlx::query_as::<_, (i64, i64, i64, String)>(&format!(
                    "EXPLAIN QUERY PLAN {sql}"
                ))
                .bind("e")
                .bind("q")
                .bind(now)
                .bind(&picked)
                .fetch_all(pool)
                .await
                .expect("explain the update");
                let plan = rows.into_iter().map(|(_, _, _, d)| d).collect::<Vec<_>>();
                vec![("sqlite", plan.join("\n"))]
            }
        };
        for (mode, plan) in plans {
            assert!(
                !plan.contains("manent_workflows_claimable")
                    && !plan.contains("manent_workflows_scheduled"),
                "the update ({mode}) must not read a backlog index to find a few ids; \
                 plan:\n{plan}"
            );
            assert!(
                plan.contains("manent_workflows_pkey")
                    || plan.contains("sqlite_autoindex_manent_workflows_1"),
                "the update ({mode}) must look the picked ids up by primary key; plan:\n{plan}"
            );
        }
    }

    #[test]
    fn the_list_query_filters_on_what_was_asked_only_with_placeholders_in_order() {
        fn check(f: WorkflowFilter, expected: &str, values: &[&str]) {
            let (sql, bound) = list_sql(&f);
            let rest = sql
                .split_once(" FROM manent_workflows")
                .map(|(_, rest)| rest)
                .expect("the query reads manent_workflows");
            assert_eq!(rest, expected, "the filters of {f:?}");
            assert_eq!(
                bound, values,
                "the values bound before limit and offset for {f:?}"
            );
        }
        check(
            WorkflowFilter::default(),
            " ORDER BY created_seq DESC LIMIT $1 OFFSET $2",
            &[],
        );
        check(
            WorkflowFilter {
                status: Some(WorkflowStatus::Success),
                name: Some("deploy".into()),
                partition_key: Some("shop/prod".into()),
                limit: Some(100),
                ..Default::default()
            },
            " WHERE status = $1 AND name = $2 AND partition_key = $3 \
             ORDER BY created_seq DESC LIMIT $4 OFFSET $5",
            &["SUCCESS", "deploy", "shop/prod"],
        );
        check(
            WorkflowFilter {
                queue: Some("q".into()),
                executor_id: Some("e".into()),
                parent_id: Some("p".into()),
                ..Default::default()
            },
            " WHERE queue_name = $1 AND executor_id = $2 AND parent_id = $3 \
             ORDER BY created_seq DESC LIMIT $4 OFFSET $5",
            &["q", "e", "p"],
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_by_partition_and_of_running_work_use_their_indexes_on_sqlite() {
        status_reads_use_their_indexes(manent_testkit::Db::Sqlite).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_by_partition_and_of_running_work_use_their_indexes_on_postgres() {
        status_reads_use_their_indexes(manent_testkit::Db::Postgres).await;
    }

    /// A query's plan (PostgreSQL: the plan a fresh statement gets and the one a
    /// prepared statement settles on), `texts` then `ints` bound in order.
    async fn plans(
        store: &SqlStore,
        sql: &str,
        texts: &[&str],
        ints: &[i64],
    ) -> Vec<(&'static str, String)> {
        match &store.pool {
            Pool::Postgres(pool) => {
                let mut plans = Vec::new();
                for mode in ["force_custom_plan", "force_generic_plan"] {
                    let mut tx = pool.begin().await.expect("begin");
                    sqlx::query(&format!("SET LOCAL plan_cache_mode = {mode}"))
                        .execute(&mut *tx)
                        .await
                        .expect("plan mode");
                    let explain = format!("EXPLAIN {sql}");
                    let mut query = sqlx::query_scalar::<_, String>(&explain);
                    for text in texts {
                        query = query.bind(*text);
                    }
                    for int in ints {
                        query = query.bind(*int);
                    }
                    let lines = query.fetch_all(&mut *tx).await.expect("explain");
                    tx.rollback().await.expect("rollback");
                    plans.push((mode, lines.join("\n")));
                }
                plans
            }
            Pool::Sqlite { read: pool, .. } => {
                let explain = format!("EXPLAIN QUERY PLAN {sql}");
                let mut query = sqlx::query_as::<_, (i64, i64, i64, String)>(&explain);
                for text in texts {
                    query = query.bind(*text);
                }
                for int in ints {
                    query = query.bind(*int);
                }
                let rows = query.fetch_all(pool).await.expect("explain");
                let plan = rows.into_iter().map(|(_, _, _, d)| d).collect::<Vec<_>>();
                vec![("sqlite", plan.join("\n"))]
            }
        }
    }

    /// Whether `plan` reads every row of manent_workflows rather than an index of it.
    fn reads_the_whole_table(plan: &str) -> bool {
        plan.contains("Seq Scan on manent_workflows")
            || plan
                .lines()
                .any(|l| l.contains("SCAN manent_workflows") && !l.contains("INDEX"))
    }

    /// 100,000 queued in one burst and never analyzed, 50 of them running: one
    /// partition's history (rollback, dependencies, `manent history`), the claim's count
    /// of running work and the queues' depths each read an index made for them, never
    /// the whole history.
    async fn status_reads_use_their_indexes(db: manent_testkit::Db) {
        let (_test, store, now) = store_with_unanalyzed_backlog(db, 100_000).await;
        let limits = ClaimLimits {
            worker: 50,
            partition: Some(1),
            global: 0,
            group: None,
        };
        let claimed = store.claim("q", "e", limits, now, 64).await.expect("claim");
        assert_eq!(claimed.len(), 50, "50 are running while the plans are read");
        let by_partition = [
            WorkflowFilter {
                status: Some(WorkflowStatus::Success),
                name: Some("w".into()),
                partition_key: Some("p7".into()),
                ..Default::default()
            },
            WorkflowFilter {
                name: Some("w".into()),
                partition_key: Some("p7".into()),
                ..Default::default()
            },
            WorkflowFilter {
                status: Some(WorkflowStatus::Pending),
                name: Some("w".into()),
                partition_key: Some("p7".into()),
                ..Default::default()
            },
        ];
        for filter in &by_partition {
            let (sql, values) = list_sql(filter);
            for (mode, plan) in plans(&store, &sql, &values, &[100, 0]).await {
                // Running rows may also come from the (smaller) index of running work.
                assert!(
                    plan.contains("manent_workflows_partition")
                        || plan.contains("manent_workflows_running"),
                    "{filter:?} ({mode}) must read the partition's index; plan:\n{plan}"
                );
                assert!(
                    !reads_the_whole_table(&plan),
                    "{filter:?} ({mode}) must not read the table; plan:\n{plan}"
                );
                // PostgreSQL may sort the partition's few rows it found; SQLite, without
                // statistics, would otherwise sort everything it read.
                assert!(
                    !plan.contains("TEMP B-TREE"),
                    "{filter:?} ({mode}) must come newest first from the index; plan:\n{plan}"
                );
            }
        }
        for (mode, plan) in plans(&store, CLAIM_RUNNING_SQL, &["q", "g"], &[]).await {
            assert!(
                plan.contains("manent_workflows_running")
                    && plan.contains("manent_workflows_group_running"),
                "the claim's count ({mode}) must read the indexes of running rows; \
                 plan:\n{plan}"
            );
            assert!(
                !reads_the_whole_table(&plan),
                "the claim's count ({mode}) must not read the table; plan:\n{plan}"
            );
        }
        for (mode, plan) in plans(&store, QUEUE_DEPTHS_SQL, &[], &[]).await {
            assert!(
                !reads_the_whole_table(&plan),
                "the queues' depths ({mode}) must read the partial indexes of queued and \
                 running rows, not the whole history; plan:\n{plan}"
            );
        }
        let depths = store.queue_depths().await.expect("depths");
        assert_eq!(
            depths,
            vec![QueueDepth {
                queue: "q".into(),
                enqueued: 99_950,
                running: 50,
            }],
            "both counts of the queue, in one entry"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_version_8_database_with_work_in_it_migrates_to_9_on_sqlite() {
        upgrade_from_version_8(manent_testkit::Db::Sqlite).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_version_8_database_with_work_in_it_migrates_to_9_on_postgres() {
        upgrade_from_version_8(manent_testkit::Db::Postgres).await;
    }

    /// The names of manent_workflows' indexes, sorted.
    async fn workflow_indexes(store: &SqlStore) -> Vec<String> {
        let mut names: Vec<String> = match &store.pool {
            Pool::Postgres(pool) => sqlx::query_scalar(
                "SELECT indexname::text FROM pg_indexes WHERE tablename = 'manent_workflows'",
            )
            .fetch_all(pool)
            .await
            .expect("list indexes"),
            Pool::Sqlite { read: pool, .. } => sqlx::query_scalar(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'manent_workflows'",
            )
            .fetch_all(pool)
            .await
            .expect("list indexes"),
        };
        names.sort();
        names
    }

    /// The ids and statuses of both test partitions' histories, newest first.
    async fn partition_histories(store: &SqlStore) -> Vec<(String, String, WorkflowStatus)> {
        let mut seen = Vec::new();
        for partition in ["app/env0", "app/env1"] {
            let rows = store
                .list_workflows(&WorkflowFilter {
                    partition_key: Some(partition.into()),
                    ..Default::default()
                })
                .await
                .expect("list a partition");
            seen.extend(
                rows.into_iter()
                    .map(|r| (partition.to_string(), r.id, r.status)),
            );
        }
        seen
    }

    /// A database that version 8 made and used (queued, running and finished work in two
    /// partitions) takes migration 9 with nothing lost: the same rows listed by partition,
    /// the same depths, the old indexes gone and the new ones there.
    async fn upgrade_from_version_8(db: manent_testkit::Db) {
        let test = manent_testkit::TestDb::new(db).await;
        let store = SqlStore::connect(&test.url).await.expect("connect");
        let backend = store.backend();
        with_writer!(store, pool => {
            sqlx::query(CREATE_MIGRATIONS_TABLE).execute(pool).await.expect("migrations table");
            for m in migrations::MIGRATIONS.iter().filter(|m| m.version <= 8) {
                for statement in m.statements(backend) {
                    sqlx::query(&statement).execute(pool).await.expect("a version 8 statement");
                }
                sqlx::query("INSERT INTO manent_schema_migrations (version, name, applied_at) VALUES ($1, $2, 0)")
                    .bind(m.version)
                    .bind(m.name)
                    .execute(pool)
                    .await
                    .expect("record the version");
            }
        });
        assert!(
            workflow_indexes(&store)
                .await
                .contains(&"manent_workflows_partition_history".to_string()),
            "the database starts as version 8 left it"
        );
        let now = crate::now_ms();
        let wfs: Vec<NewWorkflow> = (0..6)
            .map(|i| queued(format!("w{i}"), format!("app/env{}", i % 2), now))
            .collect();
        store.enqueue_many(&wfs).await.expect("enqueue");
        let limits = ClaimLimits {
            worker: 2,
            partition: Some(1),
            global: 0,
            group: None,
        };
        let claimed = store.claim("q", "e", limits, now, 2).await.expect("claim");
        assert_eq!(claimed.len(), 2, "one running in each partition");
        let lease = claimed[0].lease().expect("a claimed workflow has a lease");
        let finished = store
            .finish(&lease, WorkflowStatus::Success, Some("null"), None, now)
            .await
            .expect("finish one");
        assert_eq!(finished, Checkpoint::Written, "the first claimed finishes");
        let before = partition_histories(&store).await;
        assert_eq!(
            before.len(),
            6,
            "both partitions' histories hold all six: {before:?}"
        );
        let depths_before = store.queue_depths().await.expect("depths");

        store
            .migrate()
            .await
            .expect("migrate to the latest version");

        assert_eq!(
            partition_histories(&store).await,
            before,
            "every partition's history reads the same after the migration"
        );
        assert_eq!(
            store.queue_depths().await.expect("depths"),
            depths_before,
            "the queue's depths read the same after the migration"
        );
        assert_eq!(
            depths_before,
            vec![QueueDepth {
                queue: "q".into(),
                enqueued: 4,
                running: 1,
            }],
            "four queued and one running, counted from the new indexes too"
        );
        let indexes = workflow_indexes(&store).await;
        for gone in [
            "manent_workflows_queue",
            "manent_workflows_partition_history",
        ] {
            assert!(
                !indexes.contains(&gone.to_string()),
                "{gone} is dropped: {indexes:?}"
            );
        }
        for made in ["manent_workflows_running", "manent_workflows_partition"] {
            assert!(
                indexes.contains(&made.to_string()),
                "{made} is made: {indexes:?}"
            );
        }
    }

    #[test]
    fn sequence_is_strictly_increasing_within_a_millisecond() {
        let a = next_seq(1_000);
        let b = next_seq(1_000);
        assert!(
            b > a,
            "two enqueues in one millisecond must keep their order"
        );
    }
}
