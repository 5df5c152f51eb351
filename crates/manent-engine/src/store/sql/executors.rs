//! Executors: their registration, heartbeats and leases, and the recovery of their workflows.

use super::Pool;
use super::SqlStore;
use super::rows::ExecutorRow;
use super::rows::LeaseRow;
use super::rows::WorkflowRow;
use super::rows::workflows;
use crate::error::StoreError;
use crate::store::ExecutorLease;
use crate::store::ExecutorRecord;
use crate::store::ExecutorState;
use crate::store::LeaseGrant;
use crate::store::Liveness;
use crate::store::Renewal;
use crate::store::Wakeup;
use crate::store::WorkflowRecord;
use crate::store::postgres;
use crate::store::sqlite;

pub(super) const EXECUTOR_SELECT: &str = "SELECT e.id, e.host, e.pid, e.region, e.queues, e.state, e.started_at, e.heartbeat_at, \
     e.stopped_at, e.version, e.workflow_min, e.workflow_max, (SELECT COUNT(*) FROM manent_workflows w WHERE w.executor_id = e.id AND w.status = 'PENDING') AS running \
     FROM manent_executors e";

/// Keeps a note of a recovery in each workflow of `$ids` (its events, `recovery:<ms>`,
/// which its log shows), in the transaction `$tx` that moves them. A macro, not a function:
/// the transaction's type is each backend's own.
macro_rules! note_recovery {
    ($tx:ident, $ids:expr, $note:expr, $now_ms:expr) => {
        for id in $ids {
            sqlx::query(
                "INSERT INTO manent_events (workflow_id, event_key, value, updated_at) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (workflow_id, event_key) \
                 DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            )
            .bind(id)
            .bind(format!("recovery:{}", $now_ms))
            .bind($note)
            .bind($now_ms)
            .execute(&mut *$tx)
            .await?;
        }
    };
}

/// Keeps, beside a recovery's note, when the run it moved was interrupted: an event
/// `interrupted:<ms of the recovery>` dated at the last heartbeat `$executor` wrote (the
/// last moment it was heard from), so a deploy's log and timeline show the gap as the
/// interruption it was. Nothing is written for an executor that never registered.
macro_rules! note_interruption {
    ($tx:ident, $ids:expr, $executor:expr, $now_ms:expr) => {
        let note = serde_json::Value::String(format!(
            "worker {} stopped answering (last heard from then): the run it held was interrupted",
            $executor
        ))
        .to_string();
        for id in $ids {
            sqlx::query(
                "INSERT INTO manent_events (workflow_id, event_key, value, updated_at) \
                 SELECT $1, $2, $3, e.heartbeat_at FROM manent_executors e WHERE e.id = $4 \
                 ON CONFLICT (workflow_id, event_key) \
                 DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            )
            .bind(id)
            .bind(format!("interrupted:{}", $now_ms))
            .bind(&note)
            .bind($executor)
            .execute(&mut *$tx)
            .await?;
        }
    };
}

impl SqlStore {
    pub(super) async fn upsert_executor(&self, e: &ExecutorRecord) -> Result<(), StoreError> {
        let queues = serde_json::to_string(&e.queues)
            .map_err(|err| StoreError::Database(err.to_string()))?;
        with_writer!(self, pool => sqlx::query(
        "INSERT INTO manent_executors (id, host, pid, region, queues, state, started_at, heartbeat_at, stopped_at, version, \
         workflow_min, workflow_max) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT (id) DO UPDATE SET host = excluded.host, \
         pid = excluded.pid, region = excluded.region, queues = excluded.queues, state = excluded.state, \
         started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at, stopped_at = excluded.stopped_at, \
         version = excluded.version, workflow_min = excluded.workflow_min, workflow_max = excluded.workflow_max")
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
        .bind(i64::from(e.workflow_versions.min))
        .bind(i64::from(e.workflow_versions.max))
        .execute(pool)
        .await
        .map(|r| r.rows_affected())
        )?;
        Ok(())
    }

    pub(super) async fn get_executor(
        &self,
        id: &str,
    ) -> Result<Option<ExecutorRecord>, StoreError> {
        let sql = format!("{EXECUTOR_SELECT} WHERE e.id = $1");
        let row: Option<ExecutorRow> = with_pool!(self, pool => sqlx::query_as(&sql)
        .bind(id)
        .fetch_optional(pool)
        .await
        )?;
        row.map(ExecutorRecord::try_from).transpose()
    }

    pub(super) async fn heartbeat(
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
        )?;
        Ok(())
    }

    pub(super) async fn list_executors(&self) -> Result<Vec<ExecutorRecord>, StoreError> {
        let sql = format!("{EXECUTOR_SELECT} ORDER BY e.id");
        let rows: Vec<ExecutorRow> = with_pool!(self, pool => sqlx::query_as(&sql)
        .fetch_all(pool)
        .await
        )?;
        rows.into_iter().map(ExecutorRecord::try_from).collect()
    }

    pub(super) async fn acquire_liveness(&self, executor_id: &str) -> Result<Liveness, StoreError> {
        match (&self.pool, &self.pg_session, &self.pg_options) {
            (Pool::Postgres(_), Some(session), _) => session.lock(executor_id).await,
            (Pool::Postgres(_), None, Some(options)) => {
                postgres::acquire_liveness(options, executor_id).await
            }
            _ => sqlite::acquire_liveness(self.sqlite_path.as_deref(), executor_id),
        }
    }

    /// Whether the liveness lock of `executor_id` is free now; `None` when this backend
    /// cannot tell (an in-memory database).
    pub(super) async fn liveness_free(
        &self,
        executor_id: &str,
    ) -> Result<Option<bool>, StoreError> {
        match &self.pool {
            Pool::Postgres(main) => {
                let held = postgres::liveness_held(self.pg_pool(main), executor_id).await?;
                Ok(Some(!held))
            }
            Pool::Sqlite { .. } => sqlite::liveness_free(self.sqlite_path.as_deref(), executor_id),
        }
    }

    pub(super) async fn acquire_executor_lease(
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
        )?;
        if granted == 1 {
            return Ok(LeaseGrant::Granted);
        }
        match self.get_executor_lease(&lease.executor_id).await? {
            Some(current) => Ok(LeaseGrant::Held(current)),
            // Ended between the two statements: ask again.
            None => Box::pin(self.acquire_executor_lease(lease, override_live)).await,
        }
    }

    pub(super) async fn renew_executor_lease(
        &self,
        executor_id: &str,
        holder: &str,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<Renewal, StoreError> {
        let renewed = if let Some(session) = &self.pg_session {
            session
                .renew(executor_id, holder, now_ms, expires_at_ms)
                .await?
        } else {
            with_writer!(self, pool => sqlx::query(postgres::RENEW_LEASE)
            .bind(executor_id)
            .bind(holder)
            .bind(now_ms)
            .bind(expires_at_ms)
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
            )?
        };
        if renewed == 1 {
            Ok(Renewal::Renewed)
        } else {
            Ok(Renewal::Lost(self.get_executor_lease(executor_id).await?))
        }
    }

    pub(super) async fn live_executor_ids(&self, now_ms: i64) -> Result<Vec<String>, StoreError> {
        let ids: Vec<String> = with_pool!(self, pool => sqlx::query_scalar(
        "SELECT executor_id FROM manent_executor_leases WHERE expires_at > $1 ORDER BY executor_id")
        .bind(now_ms)
        .fetch_all(pool)
        .await
        )?;
        Ok(ids)
    }

    pub(super) async fn get_executor_lease(
        &self,
        executor_id: &str,
    ) -> Result<Option<ExecutorLease>, StoreError> {
        let row: Option<LeaseRow> = with_pool!(self, pool => sqlx::query_as(
        "SELECT executor_id, holder, host, pid, acquired_at, renewed_at, expires_at \
         FROM manent_executor_leases WHERE executor_id = $1")
        .bind(executor_id)
        .fetch_optional(pool)
        .await
        )?;
        Ok(row.map(ExecutorLease::from))
    }

    pub(super) async fn end_executor_lease(
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
        )?;
        Ok(ended > 0)
    }

    pub(super) async fn revoke_executor_lease(
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
        )?;
        Ok(revoked > 0)
    }

    pub(super) async fn take_over_own(
        &self,
        executor_id: &str,
        now_ms: i64,
    ) -> Result<Vec<WorkflowRecord>, StoreError> {
        let note = serde_json::Value::String(format!(
            "resumed by executor {executor_id}, started again after it stopped while running it"
        ))
        .to_string();
        let rows: Vec<WorkflowRow> = write_tx!(self, tx => {
            let rows: Vec<WorkflowRow> = sqlx::query_as(concat!(
            "UPDATE manent_workflows SET generation = generation + 1, attempts = attempts + 1, updated_at = $2 \
             WHERE executor_id = $1 AND status = 'PENDING' RETURNING ", wf_cols!()))
            .bind(executor_id)
            .bind(now_ms)
            .fetch_all(&mut *tx)
            .await?;
            // In each resumed workflow's log (`manent logs`), with the takeover.
            note_recovery!(tx, rows.iter().map(|r| &r.id), &note, now_ms);
            rows
        });
        workflows(rows)
    }

    pub(super) async fn recover_executor(
        &self,
        executor_id: &str,
        note: &str,
        now_ms: i64,
    ) -> Result<Vec<String>, StoreError> {
        let rows: Vec<(String, String)> = write_tx!(self, tx => {
            let rows: Vec<(String, String)> = sqlx::query_as(
                "UPDATE manent_workflows SET status = 'ENQUEUED', executor_id = NULL, generation = generation + 1, \
                 updated_at = $2 WHERE executor_id = $1 AND status = 'PENDING' RETURNING id, queue_name")
                .bind(executor_id)
                .bind(now_ms)
                .fetch_all(&mut *tx)
                .await?;
            // Each moved workflow keeps a note of the recovery, in the same transaction.
            note_recovery!(tx, rows.iter().map(|(id, _)| id), note, now_ms);
            note_interruption!(tx, rows.iter().map(|(id, _)| id), executor_id, now_ms);
            rows
        });
        let mut queues: Vec<String> = rows.iter().map(|(_, q)| q.clone()).collect();
        queues.sort();
        queues.dedup();
        self.wake(&queues.into_iter().map(Wakeup::Queue).collect::<Vec<_>>())
            .await;
        Ok(rows.into_iter().map(|(id, _)| id).collect())
    }

    pub(super) async fn recover_stale(
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
        )?;
        let mut recovered = Vec::new();
        let stale_secs = (now_ms - stale_before_ms) / 1000;
        for executor in stale {
            // Each moved workflow keeps a note of the recovery in its log (`manent logs`),
            // written in the same transaction as the move.
            let note = serde_json::Value::String(format!(
                "recovered automatically by executor {except}: executor {executor} had not \
                 renewed its heartbeat or its lease for more than {stale_secs}s"
            ))
            .to_string();
            // A row another session holds for long is left for the next round: this runs on
            // the worker's one background connection, which its claims need too.
            let begin = format!(
                "BEGIN; SET LOCAL lock_timeout = {}",
                postgres::RECOVERY_LOCK_TIMEOUT.as_millis()
            );
            let rows: Vec<(String, String)> = write_tx!(self, pg_begin = begin, tx => {
                // Re-checked in the UPDATE: an executor that came back since is left alone.
                let rows: Vec<(String, String)> = sqlx::query_as(
                "UPDATE manent_workflows SET status = 'ENQUEUED', executor_id = NULL, generation = generation + 1, \
                 updated_at = $3 WHERE executor_id = $1 AND status = 'PENDING' AND NOT EXISTS ( \
                   SELECT 1 FROM manent_executors e WHERE e.id = $1 AND e.heartbeat_at >= $2) \
                 AND NOT EXISTS (SELECT 1 FROM manent_executor_leases l WHERE l.executor_id = $1 AND l.expires_at > $3) \
                 RETURNING id, queue_name")
                .bind(&executor)
                .bind(stale_before_ms)
                .bind(now_ms)
                .fetch_all(&mut *tx)
                .await?;
                note_recovery!(tx, rows.iter().map(|(id, _)| id), &note, now_ms);
                note_interruption!(tx, rows.iter().map(|(id, _)| id), &executor, now_ms);
                rows
            });
            let wakeups: Vec<Wakeup> = rows.iter().map(|(_, q)| Wakeup::Queue(q.clone())).collect();
            self.wake(&wakeups).await;
            recovered.extend(rows.into_iter().map(|(id, _)| (executor.clone(), id)));
        }
        Ok(recovered)
    }
}
