//! Messages and events: what workflows send each other and publish, written under their lease.

use super::SqlStore;
use super::steps::RECORD_STEP;
use super::steps::bind_step;
use crate::error::StoreError;
use crate::store::Checkpoint;
use crate::store::Consumed;
use crate::store::EventRecord;
use crate::store::Lease;
use crate::store::StepRecord;
use crate::store::Wakeup;

pub(super) const LEASE_HOLDS: &str = "SELECT id FROM manent_workflows WHERE id = $1 AND executor_id = $2 AND generation = $3 \
     AND status = 'PENDING' {LOCK}";

impl SqlStore {
    pub(super) async fn send_message(
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
        )?;
        self.wake(&[Wakeup::Workflow(workflow_id.to_string())])
            .await;
        Ok(())
    }

    pub(super) async fn consume_message(
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
                .await?;
            if holds.is_none() {
                Consumed::Fenced
            } else {
                let message: Option<(i64, String)> = sqlx::query_as(
                    "SELECT id, payload FROM manent_messages WHERE workflow_id = $1 AND topic = $2 ORDER BY id LIMIT 1")
                    .bind(&lease.workflow_id)
                    .bind(topic)
                    .fetch_optional(&mut *tx)
                    .await?;
                match message {
                    None => Consumed::Empty,
                    Some((id, payload)) => {
                        sqlx::query("DELETE FROM manent_messages WHERE id = $1")
                            .bind(id)
                            .execute(&mut *tx)
                            .await?;
                        let mut recorded = step.clone();
                        recorded.output = Some(payload.clone());
                        bind_step(sqlx::query(&step_sql), &recorded, lease)
                            .execute(&mut *tx)
                            .await?;
                        Consumed::Message(payload)
                    }
                }
            }
        });
        Ok(outcome)
    }

    pub(super) async fn set_event(
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
                .await?
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
                    .await?;
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

    pub(super) async fn list_events(
        &self,
        workflow_id: &str,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let rows: Vec<(String, String, i64)> = with_pool!(self, pool => sqlx::query_as(
        "SELECT event_key, value, updated_at FROM manent_events WHERE workflow_id = $1 ORDER BY event_key")
        .bind(workflow_id)
        .fetch_all(pool)
        .await
        )?;
        Ok(rows
            .into_iter()
            .map(|(key, value, updated_at_ms)| EventRecord {
                key,
                value,
                updated_at_ms,
            })
            .collect())
    }

    pub(super) async fn list_events_of(
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
                let mut query = sqlx::query_as(&sql).persistent(super::ONE_OFF);
                for id in chunk {
                    query = query.bind(id);
                }
                query.fetch_all(pool).await
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
}
