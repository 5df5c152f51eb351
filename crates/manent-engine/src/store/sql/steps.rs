//! Steps and outcomes: a run's fenced checkpoints, its outcome, and its hand-back to a queue.

use super::Pool;
use super::SqlStore;
use super::no_group;
use super::rows::StepRow;
use crate::error::StoreError;
use crate::store::Checkpoint;
use crate::store::Lease;
use crate::store::StepRecord;
use crate::store::Wakeup;
use crate::store::WorkflowStatus;
use crate::store::postgres;
use crate::store::sqlite;

/// The fenced step write: the row is written only while the lease holds.
/// `{LOCK}` is `FOR SHARE` on PostgreSQL (see the module comment).
pub(super) const RECORD_STEP: &str = concat!(
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

/// Binds a step and its lease to [`RECORD_STEP`]'s eleven parameters.
pub(super) fn bind_step<'q, DB>(
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

impl SqlStore {
    pub(super) async fn load_steps(
        &self,
        workflow_id: &str,
    ) -> Result<Vec<StepRecord>, StoreError> {
        let rows: Vec<StepRow> = with_pool!(self, pool => sqlx::query_as(concat!(
        "SELECT ", step_cols!(), " FROM manent_steps WHERE workflow_id = $1 ORDER BY step_index"))
        .bind(workflow_id)
        .fetch_all(pool)
        .await
        )?;
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

    pub(super) async fn record_step(
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

    pub(super) async fn finish(
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

    pub(super) async fn move_to_queue(
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
                .await?
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
                    .await?
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

    pub(super) async fn release(
        &self,
        lease: &Lease,
        now_ms: i64,
    ) -> Result<Checkpoint, StoreError> {
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
        )?;
        match queue {
            Some(queue) => {
                self.wake(&[Wakeup::Queue(queue)]).await;
                Ok(Checkpoint::Written)
            }
            None => Ok(Checkpoint::Fenced),
        }
    }
}
