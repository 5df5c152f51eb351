//! What only PostgreSQL does: its pools (one for requests and runs, one connection for
//! the background loops), the encoding of LISTEN/NOTIFY wake-ups (the session that listens
//! is `session.rs`), the advisory lock of a store that does not listen, and the grouped
//! writes of running workflows (step checkpoints and outcomes, many per statement).

use std::{collections::HashMap, str::FromStr, sync::Mutex, time::Duration};

use sqlx::{
    Connection, Postgres, Transaction,
    pool::PoolConnection,
    postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions},
};
use tokio::sync::mpsc;

use super::{
    Connections, Lease, Liveness, StepRecord, Wakeup, WorkflowStatus,
    grouped::{Grouped, Pending, answer_alone, answer_together, take_queued, writes},
};
use crate::error::StoreError;

/// The notification channel every store listens on.
pub(crate) const CHANNEL: &str = "manent_wakeup";
/// Notifications carry wake-ups; this poll only catches what a lost
/// connection made us miss.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(1000);
/// First key of the two-key advisory locks, so ours never collide with an application's.
pub(crate) const LOCK_NAMESPACE_EXECUTOR: i32 = 0x4d4e_0001;
pub(crate) const LOCK_NAMESPACE_QUEUE: i32 = 0x4d4e_0002;
pub(crate) const LOCK_MIGRATIONS: i64 = 0x4d4e_0000_0003;

/// Extends a lease (`$3` renewed at, `$4` expires at) while `$2` holds it: on the session,
/// or on the pool of a store without one (`sql/executors.rs`).
pub(crate) const RENEW_LEASE: &str = "UPDATE manent_executor_leases SET renewed_at = $3, \
     expires_at = $4 WHERE executor_id = $1 AND holder = $2";

/// How long an automatic recovery waits for a workflow row another session holds before it
/// gives up until its next round (a transient error, logged). A checkpoint or a claim holds
/// a row for milliseconds; a row held longer belongs to a transaction that is stuck, and the
/// recovery runs on the worker's one background connection, which its claims, heartbeat and
/// ticker need too (docs/scaling-and-recovery.md, "Connections").
pub(crate) const RECOVERY_LOCK_TIMEOUT: Duration = Duration::from_millis(500);

/// How long a session of ours may sit inside a transaction waiting for us
/// before the server ends it. Our transactions never wait on anything but the
/// database between their statements, so a session idle in one belongs to a
/// process that is cut off or frozen; the server keeps such a session, and
/// every lock it holds (a claim's queue lock, rows a recovery must update),
/// until TCP tells it the client is gone, which takes hours: every other
/// worker would wait that long. Ended, its transaction rolls back (a claim
/// never half-done) and the process, if alive, meets a lost connection:
/// a transient error it retries. A URL that sets it in `options` wins.
pub(crate) const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the session and the background loops wait for their one connection (for it to
/// be free, or opened again) before the call fails as transient and the loop tries again.
/// Shorter than the pool's: while the server is unreachable sqlx waits between attempts to
/// connect up to a fifth of this, and a connection of one is not opened again, once the
/// server is back, before that wait ends.
pub(crate) const ONE_CONNECTION_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest a statement of the session may run (`statement_timeout`): its statements
/// never wait on anything but a lease row another session updates for a moment.
pub(crate) const SESSION_STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The pools of a PostgreSQL store: `main` for requests and runs, `background` (one
/// connection at most) for the loops that run while the process is idle, and the options
/// each connection is opened with (docs/scaling-and-recovery.md, "Connections").
pub(crate) struct Pools {
    pub(crate) main: PgPool,
    pub(crate) background: PgPool,
    pub(crate) options: PgConnectOptions,
}

pub(crate) async fn connect(url: &str, connections: &Connections) -> Result<Pools, sqlx::Error> {
    let options = PgConnectOptions::from_str(url)?.application_name(&connections.application_name);
    let idle = Some(connections.idle_timeout);
    let main = pool_options(&options, connections.max.max(1), idle, None)
        .connect_with(options.clone())
        .await?;
    // Opened on first use: a process that runs no background loop (the API) never opens it.
    let background = pool_options(&options, 1, idle, None)
        .acquire_timeout(ONE_CONNECTION_ACQUIRE_TIMEOUT)
        .connect_lazy_with(options.clone());
    Ok(Pools {
        main,
        background,
        options,
    })
}

/// What every connection of ours is opened with. No `min_connections`: a pool keeps only
/// what was used within `idle_timeout` (`None`: keeps its connections). `statement_timeout`,
/// if given, bounds each statement on the connection.
pub(crate) fn pool_options(
    options: &PgConnectOptions,
    max: u32,
    idle_timeout: Option<Duration>,
    statement_timeout: Option<Duration>,
) -> PgPoolOptions {
    let set_timeout = !options
        .get_options()
        .is_some_and(|o| o.contains("idle_in_transaction_session_timeout"));
    PgPoolOptions::new()
        .max_connections(max)
        .min_connections(0)
        .idle_timeout(idle_timeout)
        .acquire_timeout(Duration::from_secs(30))
        .after_connect(move |conn, _meta| {
            Box::pin(async move {
                if set_timeout {
                    sqlx::query(&format!(
                        "SET idle_in_transaction_session_timeout = {}",
                        IDLE_IN_TRANSACTION_TIMEOUT.as_millis()
                    ))
                    .execute(&mut *conn)
                    .await?;
                }
                if let Some(timeout) = statement_timeout {
                    sqlx::query(&format!("SET statement_timeout = {}", timeout.as_millis()))
                        .execute(&mut *conn)
                        .await?;
                }
                Ok(())
            })
        })
        // A connection keeps the largest buffers any statement needed (a bulk enqueue of
        // 1,000 deploys writes megabytes) until it closes, and a busy pool's connections
        // each meet such a statement in turn: an API's memory grew by a megabyte a
        // connection over a long run (bench/README.md, the soak). Back to the default
        // 8 KiB when the connection returns to the pool (for one that never grew, at most a
        // reallocation of a few KiB: nothing beside the round trip it follows).
        .after_release(|conn, _meta| {
            Box::pin(async move {
                conn.shrink_buffers();
                Ok(true)
            })
        })
}

/// A pooled connection whose transaction is begun so that no caller dropped
/// mid-`BEGIN` can hand the pool a session still inside a transaction.
///
/// sqlx (0.8.6 and 0.9.0, transact-rs/sqlx#4393) counts a transaction only once
/// `BEGIN`'s answer is read, and its drop guards roll back only what it
/// counted. A future dropped while that answer is in flight (a run aborted by a
/// cancel or a fence, a claim waiting on its queue's advisory lock) leaves the
/// server inside a transaction that sqlx does not know of; the pool's release
/// check does not look. The next borrower's statements then run inside it,
/// their "committed" writes invisible to every other session and rolled back
/// when `idle_in_transaction_session_timeout` ends it: an acknowledged
/// enqueue or resume lost. A begin that fails in its own statements (the
/// claim's lock query) leaves an aborted block the same way. So until `begin`
/// has returned a transaction, dropping this closes the connection instead;
/// the server ends the session and rolls back whatever it held.
pub(crate) struct BeginGuard {
    conn: Option<PoolConnection<Postgres>>,
    begun: bool,
}

impl BeginGuard {
    pub(crate) async fn acquire(pool: &PgPool) -> Result<Self, sqlx::Error> {
        Ok(Self {
            conn: Some(pool.acquire().await?),
            begun: false,
        })
    }

    /// Runs `statement` (a `BEGIN`, possibly followed by statements of the
    /// transaction) and returns the transaction; sqlx's own guards cover it
    /// from here on (a dropped `Transaction` queues its `ROLLBACK`).
    pub(crate) async fn begin(
        &mut self,
        statement: String,
    ) -> Result<Transaction<'_, Postgres>, sqlx::Error> {
        let conn = self
            .conn
            .as_mut()
            .expect("a guard holds its connection until it is dropped");
        let tx = conn.begin_with(statement).await?;
        self.begun = true;
        Ok(tx)
    }
}

impl Drop for BeginGuard {
    fn drop(&mut self) {
        if !self.begun
            && let Some(mut conn) = self.conn.take()
        {
            conn.close_on_drop();
        }
    }
}

/// Wake-up payloads: `q:<queue>`, `w:<workflow id>`, or `e:` (another process wrote; a
/// PostgreSQL store never sends it, its writes say what they changed).
pub(crate) fn encode(wakeup: &Wakeup) -> String {
    match wakeup {
        Wakeup::Queue(q) => format!("q:{q}"),
        Wakeup::Workflow(w) => format!("w:{w}"),
        Wakeup::Elsewhere => "e:".to_string(),
    }
}

pub(crate) fn decode(payload: &str) -> Option<Wakeup> {
    let (kind, rest) = payload.split_once(':')?;
    match kind {
        "q" => Some(Wakeup::Queue(rest.to_string())),
        "w" => Some(Wakeup::Workflow(rest.to_string())),
        "e" => Some(Wakeup::Elsewhere),
        _ => None,
    }
}

/// A session advisory lock on the executor id, on a connection of its own held for the
/// executor's life: for a store that does not listen (and so has no session).
pub(crate) async fn acquire_liveness(
    options: &PgConnectOptions,
    executor_id: &str,
) -> Result<Liveness, StoreError> {
    let mut conn = PgConnection::connect_with(options).await?;
    let acquired: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, hashtext($2))")
        .bind(LOCK_NAMESPACE_EXECUTOR)
        .bind(executor_id)
        .fetch_one(&mut conn)
        .await?;
    if acquired {
        Ok(Liveness::Acquired(Box::new(Mutex::new(conn))))
    } else {
        let _ = conn.close().await;
        Ok(Liveness::HeldElsewhere)
    }
}

/// Whether any session holds the advisory lock of `executor_id` in this database: read
/// from `pg_locks`, never taken, so a worker taking its id is never in its way.
pub(crate) async fn liveness_held(pool: &PgPool, executor_id: &str) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND classid::text::bigint = $1 AND objid::text::bigint = (hashtext($2)::bigint & 4294967295) \
         AND objsubid = 2)",
    )
    .bind(i64::from(LOCK_NAMESPACE_EXECUTOR))
    .bind(executor_id)
    .fetch_one(pool)
    .await?)
}

/// A write of a running workflow, fenced by its lease.
pub(crate) enum GroupedWrite {
    Step {
        lease: Lease,
        step: StepRecord,
    },
    Finish {
        lease: Lease,
        status: WorkflowStatus,
        output: Option<String>,
        error: Option<String>,
        now_ms: i64,
    },
}

/// What a grouped write did: `Some` if its lease held (for an outcome, with
/// the workflow's queue), `None` if it was fenced.
pub(crate) type Applied = Option<String>;

type Request = Pending<GroupedWrite, Applied>;

/// Most writes of one kind in one statement.
const MAX_GROUP: usize = 256;

/// Step checkpoints, and outcomes with their notifications, of many runs in one
/// statement each (`unnest` of arrays), every row fenced by its own lease as
/// [`super::sql`]'s single-row forms are. A run waits for its write anyway;
/// writing what queued while the last statement ran as one statement, one
/// commit, costs one round trip where each run would pay its own (and wait for
/// a pooled connection to pay it). Each caller is answered after the commit.
pub(crate) type GroupWrites = Grouped<GroupedWrite, Applied>;

pub(crate) fn spawn_group_writes(pool: PgPool) -> GroupWrites {
    Grouped::spawn("PostgreSQL writer", move |queued| group_loop(pool, queued))
}

async fn group_loop(pool: PgPool, mut queued: mpsc::UnboundedReceiver<Request>) {
    while let Some(first) = queued.recv().await {
        let (steps, outcomes): (Vec<Request>, Vec<Request>) =
            take_queued(first, &mut queued, MAX_GROUP)
                .into_iter()
                .partition(|r| matches!(r.write, GroupedWrite::Step { .. }));
        // The two statements touch different rows of different runs: side by side.
        tokio::join!(apply_group(&pool, steps), apply_group(&pool, outcomes));
    }
}

/// Applies `group` (all of one kind) in one statement, or each alone if that fails.
async fn apply_group(pool: &PgPool, group: Vec<Request>) {
    if group.is_empty() {
        return;
    }
    let together = apply(pool, &writes(&group)).await;
    for pending in answer_together(group, together) {
        let alone = apply(pool, &[&pending.write]).await;
        answer_alone(pending, alone);
    }
}

/// The step rows, each written only while its lease holds (the workflow row locked
/// `FOR SHARE`, so a recovery waits for it), a finished step never overwritten.
const WRITE_STEPS: &str = "INSERT INTO manent_steps (workflow_id, step_index, name, status, output, error, \
     attempts, started_at, finished_at, executor_id) \
     SELECT v.workflow_id, v.step_index, v.name, v.status, v.output, v.error, v.attempts, v.started_at, \
       v.finished_at, v.executor_id \
     FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[], \
       $8::bigint[], $9::bigint[], $10::text[], $11::bigint[]) \
       AS v(workflow_id, step_index, name, status, output, error, attempts, started_at, finished_at, executor_id, generation) \
     WHERE EXISTS (SELECT 1 FROM manent_workflows w WHERE w.id = v.workflow_id AND w.executor_id = v.executor_id \
       AND w.generation = v.generation AND w.status = 'PENDING' FOR SHARE) \
     ON CONFLICT (workflow_id, step_index) DO UPDATE SET name = excluded.name, status = excluded.status, \
       output = excluded.output, error = excluded.error, attempts = excluded.attempts, \
       started_at = excluded.started_at, finished_at = excluded.finished_at, executor_id = excluded.executor_id \
     WHERE manent_steps.status = 'RUNNING' \
     RETURNING workflow_id, step_index";

/// The outcomes, each recorded only while its lease holds, and the wake-ups they
/// cause (`q:<queue>`, `w:<id>`) sent in the same transaction: delivered at its commit.
const WRITE_OUTCOMES: &str = "WITH done AS ( \
       UPDATE manent_workflows w SET status = v.status, output = v.output, error = v.error, \
         finished_at = v.now_ms, updated_at = v.now_ms \
       FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::bigint[]) \
         AS v(id, executor_id, generation, status, output, error, now_ms) \
       WHERE w.id = v.id AND w.executor_id = v.executor_id AND w.generation = v.generation \
         AND w.status = 'PENDING' \
       RETURNING w.id, w.queue_name), \
     notified AS ( \
       SELECT pg_notify($8, payload) FROM ( \
         SELECT DISTINCT 'q:' || queue_name AS payload FROM done UNION ALL SELECT 'w:' || id FROM done) AS p) \
     SELECT id, queue_name FROM done WHERE (SELECT count(*) FROM notified) >= 0";

/// Runs one statement for `writes` (all of one kind) and says, in their order, which were applied.
async fn apply(pool: &PgPool, writes: &[&GroupedWrite]) -> Result<Vec<Applied>, sqlx::Error> {
    let Some(first) = writes.first() else {
        return Ok(Vec::new());
    };
    match first {
        GroupedWrite::Step { .. } => {
            let mut columns = StepColumns::default();
            for write in writes {
                if let GroupedWrite::Step { lease, step } = write {
                    columns.push(lease, step);
                }
            }
            let written: Vec<(String, i64)> = sqlx::query_as(WRITE_STEPS)
                .bind(&columns.workflow_id)
                .bind(&columns.step_index)
                .bind(&columns.name)
                .bind(&columns.status)
                .bind(&columns.output)
                .bind(&columns.error)
                .bind(&columns.attempts)
                .bind(&columns.started_at)
                .bind(&columns.finished_at)
                .bind(&columns.executor_id)
                .bind(&columns.generation)
                .fetch_all(pool)
                .await?;
            let written: std::collections::HashSet<(String, i64)> = written.into_iter().collect();
            Ok(writes
                .iter()
                .map(|write| match write {
                    GroupedWrite::Step { step, .. } => written
                        .contains(&(step.workflow_id.clone(), step.index))
                        .then(String::new),
                    GroupedWrite::Finish { .. } => None,
                })
                .collect())
        }
        GroupedWrite::Finish { .. } => {
            let mut id = Vec::new();
            let mut executor_id = Vec::new();
            let mut generation = Vec::new();
            let mut status = Vec::new();
            let mut output = Vec::new();
            let mut error = Vec::new();
            let mut now = Vec::new();
            for write in writes {
                if let GroupedWrite::Finish {
                    lease,
                    status: s,
                    output: o,
                    error: e,
                    now_ms,
                } = write
                {
                    id.push(lease.workflow_id.clone());
                    executor_id.push(lease.executor_id.clone());
                    generation.push(lease.generation);
                    status.push(s.as_str().to_string());
                    output.push(o.clone());
                    error.push(e.clone());
                    now.push(*now_ms);
                }
            }
            let done: Vec<(String, String)> = sqlx::query_as(WRITE_OUTCOMES)
                .bind(&id)
                .bind(&executor_id)
                .bind(&generation)
                .bind(&status)
                .bind(&output)
                .bind(&error)
                .bind(&now)
                .bind(CHANNEL)
                .fetch_all(pool)
                .await?;
            let done: HashMap<String, String> = done.into_iter().collect();
            Ok(writes
                .iter()
                .map(|write| match write {
                    GroupedWrite::Finish { lease, .. } => done.get(&lease.workflow_id).cloned(),
                    GroupedWrite::Step { .. } => None,
                })
                .collect())
        }
    }
}

/// The step rows of a group as one array per column.
#[derive(Default)]
struct StepColumns {
    workflow_id: Vec<String>,
    step_index: Vec<i64>,
    name: Vec<String>,
    status: Vec<String>,
    output: Vec<Option<String>>,
    error: Vec<Option<String>>,
    attempts: Vec<i64>,
    started_at: Vec<i64>,
    finished_at: Vec<Option<i64>>,
    executor_id: Vec<String>,
    generation: Vec<i64>,
}

impl StepColumns {
    fn push(&mut self, lease: &Lease, step: &StepRecord) {
        self.workflow_id.push(step.workflow_id.clone());
        self.step_index.push(step.index);
        self.name.push(step.name.clone());
        self.status.push(step.status.as_str().to_string());
        self.output.push(step.output.clone());
        self.error.push(step.error.clone());
        self.attempts.push(step.attempts);
        self.started_at.push(step.started_at_ms);
        self.finished_at.push(step.finished_at_ms);
        self.executor_id.push(step.executor_id.clone());
        self.generation.push(lease.generation);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use manent_testkit::{Db, TestDb};

    const WAIT: Duration = Duration::from_secs(30);

    /// A pool of one connection, so the connection a guarded begin used is the
    /// one the next query gets unless the guard closed it; and an observer pool
    /// for other sessions.
    async fn pool_of_one_and_observer(test: &TestDb) -> (PgPool, PgPool) {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&test.url)
            .await
            .expect("connect the pool");
        let observer = PgPool::connect(&test.url)
            .await
            .expect("connect an observer");
        (pool, observer)
    }

    /// Writes a row through `pool` and reads it back from `observer`, another
    /// session: `Ok(true)` when the write committed as it returned.
    async fn a_write_commits(pool: &PgPool, observer: &PgPool) -> Result<bool, sqlx::Error> {
        sqlx::query("CREATE TABLE IF NOT EXISTS probe (n int)")
            .execute(observer)
            .await?;
        sqlx::query("INSERT INTO probe VALUES (1)")
            .execute(pool)
            .await?;
        let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM probe")
            .fetch_one(observer)
            .await?;
        Ok(seen == 1)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_dropped_while_its_begin_waits_leaves_no_transaction_on_the_pool() {
        let test = TestDb::new(Db::Postgres).await;
        let (pool, observer) = pool_of_one_and_observer(&test).await;
        let mut holder = PgConnection::connect(&test.url).await.expect("connect");
        sqlx::query("SELECT pg_advisory_lock(1, 42)")
            .execute(&mut holder)
            .await
            .expect("hold the lock");
        // The begin's own statement waits for that lock, after its BEGIN ran on the
        // server: the window a cancelled run or claim can be dropped in, held open.
        let begin_pool = pool.clone();
        let write = tokio::spawn(async move {
            let mut guard = BeginGuard::acquire(&begin_pool).await?;
            let tx = guard
                .begin("BEGIN; SELECT pg_advisory_xact_lock(1, 42)".into())
                .await?;
            tx.rollback().await
        });
        manent_testkit::eventually("the begin waits for the lock", WAIT, || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock' AND query LIKE '%pg_advisory_xact_lock(1, 42)%'",
            )
            .fetch_one(&observer)
            .await
            .expect("read pg_stat_activity");
            (waiting > 0).then_some(())
        })
        .await;
        write.abort();
        assert!(
            write.await.is_err_and(|e| e.is_cancelled()),
            "the write was dropped mid-begin"
        );
        sqlx::query("SELECT pg_advisory_unlock(1, 42)")
            .execute(&mut holder)
            .await
            .expect("release the lock");
        assert!(
            a_write_commits(&pool, &observer)
                .await
                .expect("the pool's next write runs"),
            "the next borrower must not run inside the dropped write's transaction: \
             its write would return and never commit"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_begin_whose_own_statement_fails_leaves_no_aborted_transaction_on_the_pool() {
        let test = TestDb::new(Db::Postgres).await;
        let (pool, observer) = pool_of_one_and_observer(&test).await;
        let mut guard = BeginGuard::acquire(&pool).await.expect("acquire");
        let failed = guard.begin("BEGIN; SELECT 1 / 0".into()).await;
        assert!(failed.is_err(), "division by zero fails the begin");
        drop(failed);
        drop(guard);
        assert!(
            a_write_commits(&pool, &observer)
                .await
                .expect("the pool's next write runs, not refused as inside an aborted block"),
            "the next borrower's write commits"
        );
    }

    #[test]
    fn wakeup_payloads_round_trip() {
        for w in [
            Wakeup::Queue("deploys".into()),
            Wakeup::Workflow("a:b".into()),
        ] {
            assert_eq!(
                decode(&encode(&w)),
                Some(w.clone()),
                "payload of {w:?} must decode to itself"
            );
        }
        assert_eq!(
            decode("x:1"),
            None,
            "an unknown kind is ignored, not misread"
        );
    }
}
