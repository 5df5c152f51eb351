//! The rows the SQL reads, and their decoding into the engine's records.

use crate::error::StoreError;
use crate::store::ExecutorLease;
use crate::store::ExecutorRecord;
use crate::store::WorkflowRecord;
use crate::store::WorkflowVersions;
use sqlx::FromRow;

#[derive(FromRow)]
pub(super) struct WorkflowRow {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) status: String,
    pub(super) queue_name: String,
    pub(super) partition_key: String,
    pub(super) priority: i64,
    pub(super) not_before: i64,
    pub(super) dedup_key: Option<String>,
    pub(super) executor_id: Option<String>,
    pub(super) input: String,
    pub(super) output: Option<String>,
    pub(super) error: Option<String>,
    pub(super) parent_id: Option<String>,
    pub(super) attempts: i64,
    pub(super) generation: i64,
    pub(super) created_at: i64,
    pub(super) updated_at: i64,
    pub(super) started_at: Option<i64>,
    pub(super) finished_at: Option<i64>,
    pub(super) workflow_version: i64,
}

impl TryFrom<WorkflowRow> for WorkflowRecord {
    type Error = StoreError;
    fn try_from(r: WorkflowRow) -> Result<Self, StoreError> {
        let workflow_version =
            u32::try_from(r.workflow_version).map_err(|_| StoreError::Corrupt {
                what: format!("workflow {}", r.id),
                reason: format!("workflow version {} is out of range", r.workflow_version),
            })?;
        Ok(WorkflowRecord {
            workflow_version,
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

pub(super) fn workflows(rows: Vec<WorkflowRow>) -> Result<Vec<WorkflowRecord>, StoreError> {
    rows.into_iter().map(WorkflowRecord::try_from).collect()
}

#[derive(FromRow)]
pub(super) struct StepRow {
    pub(super) workflow_id: String,
    pub(super) step_index: i64,
    pub(super) name: String,
    pub(super) status: String,
    pub(super) output: Option<String>,
    pub(super) error: Option<String>,
    pub(super) attempts: i64,
    pub(super) started_at: i64,
    pub(super) finished_at: Option<i64>,
    pub(super) executor_id: String,
}

#[derive(FromRow)]
pub(super) struct ExecutorRow {
    pub(super) id: String,
    pub(super) host: String,
    pub(super) pid: i64,
    pub(super) region: Option<String>,
    pub(super) queues: String,
    pub(super) state: String,
    pub(super) started_at: i64,
    pub(super) heartbeat_at: i64,
    pub(super) stopped_at: Option<i64>,
    pub(super) version: String,
    pub(super) workflow_min: Option<i64>,
    pub(super) workflow_max: Option<i64>,
    pub(super) running: i64,
}

impl TryFrom<ExecutorRow> for ExecutorRecord {
    type Error = StoreError;
    fn try_from(r: ExecutorRow) -> Result<Self, StoreError> {
        Ok(ExecutorRecord {
            queues: serde_json::from_str(&r.queues).map_err(|e| StoreError::Corrupt {
                what: format!("queues of executor {}", r.id),
                reason: e.to_string(),
            })?,
            // NULL: a binary before workflow versions, which runs version 1 only.
            workflow_versions: match (r.workflow_min, r.workflow_max) {
                (None, None) => WorkflowVersions::FIRST,
                (min, max) => min
                    .zip(max)
                    .and_then(|(min, max)| {
                        WorkflowVersions::new(u32::try_from(min).ok()?, u32::try_from(max).ok()?)
                    })
                    .ok_or_else(|| StoreError::Corrupt {
                        what: format!("workflow versions of executor {}", r.id),
                        reason: format!("{min:?} to {max:?} is not a range of versions"),
                    })?,
            },
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
pub(super) struct LeaseRow {
    pub(super) executor_id: String,
    pub(super) holder: String,
    pub(super) host: String,
    pub(super) pid: i64,
    pub(super) acquired_at: i64,
    pub(super) renewed_at: i64,
    pub(super) expires_at: i64,
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
