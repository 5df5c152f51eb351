//! What only PostgreSQL does: LISTEN/NOTIFY wake-ups, the session advisory
//! lock that proves an executor is alive, and the grouped writes of running
//! workflows (step checkpoints and outcomes, many per statement).

use std::{collections::HashMap, str::FromStr, sync::Mutex, time::Duration};

use sqlx::{
    Connection,
    postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions},
};
use tokio::{
    sync::{broadcast, mpsc},
    task::JoinHandle,
};

use super::{
    Lease, Liveness, StepRecord, Wakeup, WorkflowStatus,
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

pub(crate) async fn connect(url: &str) -> Result<(PgPool, PgConnectOptions), sqlx::Error> {
    let options = PgConnectOptions::from_str(url)?.application_name("manent");
    let set_timeout = !options
        .get_options()
        .is_some_and(|o| o.contains("idle_in_transaction_session_timeout"));
    let pool = PgPoolOptions::new()
        .max_connections(24)
        .acquire_timeout(Duration::from_secs(30))
        .after_connect(move |conn, _meta| {
            Box::pin(async move {
                if set_timeout {
                    sqlx::query(&format!(
                        "SET idle_in_transaction_session_timeout = {}",
                        IDLE_IN_TRANSACTION_TIMEOUT.as_millis()
                    ))
                    .execute(conn)
                    .await?;
                }
                Ok(())
            })
        })
        .connect_with(options.clone())
        .await?;
    Ok((pool, options))
}

/// Wake-up payloads: `q:<queue>` or `w:<workflow id>`.
pub(crate) fn encode(wakeup: &Wakeup) -> String {
    match wakeup {
        Wakeup::Queue(q) => format!("q:{q}"),
        Wakeup::Workflow(w) => format!("w:{w}"),
    }
}

fn decode(payload: &str) -> Option<Wakeup> {
    let (kind, rest) = payload.split_once(':')?;
    match kind {
        "q" => Some(Wakeup::Queue(rest.to_string())),
        "w" => Some(Wakeup::Workflow(rest.to_string())),
        _ => None,
    }
}

/// Forwards notifications to the in-process bus until aborted. A dropped
/// connection is re-established by the listener; what was missed meanwhile
/// is caught by the fallback poll.
pub(crate) async fn spawn_listener(
    pool: &PgPool,
    bus: broadcast::Sender<Wakeup>,
) -> Result<JoinHandle<()>, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(tokio::spawn(async move {
        loop {
            match listener.recv().await {
                Ok(notification) => {
                    if let Some(wakeup) = decode(notification.payload()) {
                        let _ = bus.send(wakeup);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "notification listener lost its connection; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }))
}

/// A session advisory lock on the executor id, on a connection of its own
/// held for the executor's life: the server releases it when the process dies.
pub(crate) async fn acquire_liveness(
    options: &PgConnectOptions,
    executor_id: &str,
) -> Result<Liveness, StoreError> {
    let mut conn = PgConnection::connect_with(options)
        .await
        .map_err(super::sql::map_err)?;
    let acquired: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, hashtext($2))")
        .bind(LOCK_NAMESPACE_EXECUTOR)
        .bind(executor_id)
        .fetch_one(&mut conn)
        .await
        .map_err(super::sql::map_err)?;
    if acquired {
        Ok(Liveness::Acquired(Box::new(Mutex::new(conn))))
    } else {
        let _ = conn.close().await;
        Ok(Liveness::HeldElsewhere)
    }
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
