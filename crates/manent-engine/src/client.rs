//! The client side of the engine: start, inspect, signal, cancel, resume and
//! recover workflows. Needs only a [`Database`], so API processes use it without
//! running workflows.

use std::{sync::Arc, time::Duration};

use serde::Serialize;
use tokio::sync::broadcast::error::RecvError;

use crate::{
    database::Database,
    error::EngineError,
    now_ms,
    records::Records,
    store::{
        EnqueueOutcome, EventRecord, ExecutorLease, ExecutorRecord, Liveness, NewWorkflow,
        QueueDepth, QueueRecord, RunningCount, StepRecord, Store, TimeWindow, Wakeup,
        WorkflowFilter, WorkflowRecord, WorkflowStatus, WorkflowVersions,
    },
};

/// A workflow to start on a queue.
#[derive(Debug, Clone)]
pub struct EnqueueRequest {
    pub workflow: String,
    pub queue: String,
    pub input: serde_json::Value,
    /// Caller-chosen id: starting the same id twice returns the first.
    pub id: Option<String>,
    pub partition_key: Option<String>,
    pub priority: i64,
    pub not_before_ms: Option<i64>,
    pub dedup_key: Option<String>,
    pub parent_id: Option<String>,
    /// The version of the workflow's code it starts under (default 1; see
    /// [`Client::startable_version`]).
    pub workflow_version: u32,
    /// Why `input` could not be serialised: the enqueue is refused with it, rather
    /// than storing `null` as the workflow's input.
    input_error: Option<String>,
}

impl EnqueueRequest {
    pub fn new(
        workflow: impl Into<String>,
        queue: impl Into<String>,
        input: impl Serialize,
    ) -> Self {
        let (input, input_error) = match serde_json::to_value(input) {
            Ok(value) => (value, None),
            Err(e) => (serde_json::Value::Null, Some(e.to_string())),
        };
        EnqueueRequest {
            workflow: workflow.into(),
            queue: queue.into(),
            input,
            id: None,
            partition_key: None,
            priority: 0,
            not_before_ms: None,
            dedup_key: None,
            parent_id: None,
            workflow_version: 1,
            input_error,
        }
    }
    /// Starts the workflow under version `version` of its code.
    pub fn version(mut self, version: u32) -> Self {
        self.workflow_version = version;
        self
    }
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }
    pub fn partition(mut self, key: impl Into<String>) -> Self {
        self.partition_key = Some(key.into());
        self
    }
    pub fn priority(mut self, priority: i64) -> Self {
        self.priority = priority;
        self
    }
    pub fn not_before(mut self, at_ms: i64) -> Self {
        self.not_before_ms = Some(at_ms);
        self
    }
    pub fn dedup(mut self, key: impl Into<String>) -> Self {
        self.dedup_key = Some(key.into());
        self
    }
    pub(crate) fn parent(mut self, parent: impl Into<String>) -> Self {
        self.parent_id = Some(parent.into());
        self
    }
}

/// Starts and inspects workflows in a database.
#[derive(Clone)]
pub struct Client {
    store: Arc<dyn Store>,
}

impl Client {
    pub fn new(database: Database) -> Self {
        Client::on(database.into_store())
    }

    /// A client on the engine's own store (an executor's, a workflow's context).
    pub(crate) fn on(store: Arc<dyn Store>) -> Self {
        Client { store }
    }

    /// The records and the audit trail kept beside the workflows (`records.rs`).
    pub fn records(&self) -> Records {
        Records::new(self.store.clone())
    }

    /// The schema version of the database (`readyz` compares it with this build's).
    pub async fn schema_version(&self) -> Result<i64, EngineError> {
        Ok(self.store.schema_version().await?)
    }

    /// The newest workflow version at most `newest` that every live executor can run:
    /// what a new workflow starts under, so that during a rolling upgrade an old worker
    /// can still replay what a new API submits (docs/upgrading.md). With no live executor,
    /// `newest`. An executor is live while its lease has not expired.
    pub async fn startable_version(&self, newest: u32) -> Result<u32, EngineError> {
        Ok(self
            .live_workflow_versions()
            .await?
            .iter()
            .map(|v| v.max)
            .fold(newest, u32::min)
            .max(1))
    }

    /// Puts a workflow on its queue. Idempotent on the id: the existing
    /// workflow is returned if it has the same name.
    pub async fn enqueue(&self, req: EnqueueRequest) -> Result<WorkflowRecord, EngineError> {
        let new = new_workflow(&req)?;
        let outcome = self.store.enqueue(&new).await?;
        outcome_record(req, new, outcome)
    }

    /// Puts many workflows on their queues in one transaction (a bulk
    /// submission: one commit and one wake-up per queue instead of one per
    /// workflow). Each request gets the answer [`Client::enqueue`] would give
    /// it, in order; a request refused before storage (no name or queue)
    /// refuses the whole batch and nothing is written.
    pub async fn enqueue_many(
        &self,
        requests: Vec<EnqueueRequest>,
    ) -> Result<Vec<Result<WorkflowRecord, EngineError>>, EngineError> {
        let news = requests
            .iter()
            .map(new_workflow)
            .collect::<Result<Vec<_>, _>>()?;
        let outcomes = self.store.enqueue_many(&news).await?;
        Ok(requests
            .into_iter()
            .zip(news)
            .zip(outcomes)
            .map(|((req, new), outcome)| outcome_record(req, new, outcome))
            .collect())
    }

    /// The ids of finished workflows retention may remove ([`crate::PruneQuery`]).
    pub async fn prunable_workflows(
        &self,
        query: &crate::PruneQuery,
    ) -> Result<Vec<String>, EngineError> {
        Ok(self.store.prunable_workflows(query).await?)
    }

    /// Removes finished workflows with their children and all recorded under them.
    pub async fn delete_workflows(&self, ids: &[String]) -> Result<crate::Deleted, EngineError> {
        Ok(self.store.delete_workflows(ids).await?)
    }

    /// What [`Client::delete_workflows`] would remove of `ids` now, and how many of those
    /// output lines are from before `old_output_before` and of finished workflows.
    pub async fn count_workflows_removal(
        &self,
        ids: &[String],
        old_output_before: Option<i64>,
    ) -> Result<(crate::Deleted, u64), EngineError> {
        Ok(self
            .store
            .count_workflows_removal(ids, old_output_before)
            .await?)
    }

    /// Removes (or counts) at most `limit` output lines of finished workflows from before
    /// `before_ms`.
    pub async fn prune_output(
        &self,
        before_ms: i64,
        limit: i64,
        dry_run: bool,
    ) -> Result<u64, EngineError> {
        Ok(self.store.prune_output(before_ms, limit, dry_run).await?)
    }

    /// Removes (or counts) at most `limit` audit entries from before `before_ms`.
    pub async fn prune_audit(
        &self,
        before_ms: i64,
        limit: i64,
        dry_run: bool,
    ) -> Result<u64, EngineError> {
        Ok(self.store.prune_audit(before_ms, limit, dry_run).await?)
    }

    /// Gives freed space back to the file system where the backend needs asking.
    pub async fn reclaim_space(&self, full: bool) -> Result<(), EngineError> {
        Ok(self.store.reclaim_space(full).await?)
    }

    pub async fn get(&self, id: &str) -> Result<Option<WorkflowRecord>, EngineError> {
        Ok(self.store.get_workflow(id).await?)
    }

    pub async fn list(&self, filter: &WorkflowFilter) -> Result<Vec<WorkflowRecord>, EngineError> {
        Ok(self.store.list_workflows(filter).await?)
    }

    pub async fn steps(&self, id: &str) -> Result<Vec<StepRecord>, EngineError> {
        Ok(self.store.load_steps(id).await?)
    }

    pub async fn events(&self, id: &str) -> Result<Vec<EventRecord>, EngineError> {
        Ok(self.store.list_events(id).await?)
    }

    /// The events of several workflows, by workflow id, in one round trip per 500.
    pub async fn events_of(
        &self,
        ids: &[String],
    ) -> Result<std::collections::HashMap<String, Vec<EventRecord>>, EngineError> {
        let mut by_id: std::collections::HashMap<String, Vec<EventRecord>> =
            std::collections::HashMap::new();
        for (id, event) in self.store.list_events_of(ids).await? {
            by_id.entry(id).or_default().push(event);
        }
        Ok(by_id)
    }

    /// What the workflow's steps printed, after line `after` (0: from the start), oldest
    /// first, at most `limit` lines.
    pub async fn output(
        &self,
        id: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<crate::OutputLine>, EngineError> {
        Ok(self.store.list_output(id, after, limit).await?)
    }

    /// The value of one event, decoded.
    pub async fn event<T: serde::de::DeserializeOwned>(
        &self,
        id: &str,
        key: &str,
    ) -> Result<Option<T>, EngineError> {
        let events = self.store.list_events(id).await?;
        events
            .into_iter()
            .find(|e| e.key == key)
            .map(|e| {
                serde_json::from_str(&e.value)
                    .map_err(|err| EngineError::InvalidInput(err.to_string()))
            })
            .transpose()
    }

    /// Waits until the workflow is SUCCESS, ERROR or CANCELLED.
    pub async fn wait(&self, id: &str, timeout: Duration) -> Result<WorkflowRecord, EngineError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut wakeups = self.store.subscribe();
        loop {
            let record = self
                .store
                .get_workflow(id)
                .await?
                .ok_or_else(|| EngineError::NotFound(id.to_string()))?;
            if record.status.is_terminal() {
                return Ok(record);
            }
            let poll = tokio::time::Instant::now() + self.store.poll_interval();
            if tokio::time::Instant::now() >= deadline {
                return Err(EngineError::WaitTimeout {
                    id: id.to_string(),
                    timeout,
                });
            }
            wait_for_workflow(&mut wakeups, id, poll.min(deadline)).await;
        }
    }

    pub async fn cancel(&self, id: &str) -> Result<WorkflowStatus, EngineError> {
        let status = self
            .store
            .cancel(id, now_ms())
            .await?
            .ok_or_else(|| EngineError::NotFound(id.to_string()))?;
        match status {
            WorkflowStatus::Cancelled => Ok(status),
            other => Err(EngineError::InvalidState {
                id: id.to_string(),
                action: "cancelled",
                status: other.to_string(),
            }),
        }
    }

    /// Puts a cancelled workflow back on its queue; it resumes from its checkpoints.
    pub async fn resume(&self, id: &str) -> Result<WorkflowStatus, EngineError> {
        let status = self
            .store
            .resume(id, now_ms())
            .await?
            .ok_or_else(|| EngineError::NotFound(id.to_string()))?;
        match status {
            WorkflowStatus::Enqueued | WorkflowStatus::Pending => Ok(status),
            other => Err(EngineError::InvalidState {
                id: id.to_string(),
                action: "resumed",
                status: other.to_string(),
            }),
        }
    }

    /// Sends a message to a workflow, for its `recv` on `topic`.
    pub async fn send(
        &self,
        id: &str,
        topic: &str,
        payload: impl Serialize,
    ) -> Result<(), EngineError> {
        if self.store.get_workflow(id).await?.is_none() {
            return Err(EngineError::NotFound(id.to_string()));
        }
        let payload = serde_json::to_string(&payload)
            .map_err(|e| EngineError::InvalidInput(e.to_string()))?;
        Ok(self
            .store
            .send_message(id, topic, &payload, now_ms())
            .await?)
    }

    /// Hands the PENDING workflows of `executor_id` back to their queues, for
    /// any worker to resume. An executor whose lease is live is refused unless
    /// `force`: forcing revokes its lease too, so the live process stops (and
    /// kills its commands) at its next renewal instead of running on. A live
    /// lease whose holder is proven dead (this host, its pid gone, its liveness
    /// lock free) is no refusal: right after a `kill -9` the work moves at once.
    /// `by` names who asked; the recovery is noted in every workflow it moved.
    pub async fn recover_executor(
        &self,
        executor_id: &str,
        force: bool,
        by: &str,
    ) -> Result<Vec<String>, EngineError> {
        let executor = self.store.get_executor(executor_id).await?;
        let lease = self.store.get_executor_lease(executor_id).await?;
        let holds_work = !self
            .store
            .list_workflows(&WorkflowFilter {
                executor_id: Some(executor_id.to_string()),
                status: Some(WorkflowStatus::Pending),
                limit: Some(1),
                ..Default::default()
            })
            .await?
            .is_empty();
        if executor.is_none() && lease.is_none() && !holds_work {
            return Err(EngineError::UnknownExecutor(executor_id.to_string()));
        }
        let now = now_ms();
        let live = lease.filter(|l| l.is_live(now));
        // The fast proof of death (ARCHITECTURE.md, invariant 5): a live lease whose holder
        // ran on this host under a pid that is gone, its liveness lock free. Its work moves
        // at once, as a restart under its id would take it; the guard is held meanwhile.
        let mut proof = None;
        if let Some(lease) = &live
            && !force
            && lease.host == crate::engine::this_host()
            && !crate::engine::process_alive(lease.pid)
            && let Liveness::Acquired(guard) = self.store.acquire_liveness(executor_id).await?
        {
            self.store
                .revoke_executor_lease(executor_id, &lease.holder)
                .await?;
            proof = Some((guard, lease.pid, lease.host.clone()));
        }
        if let Some(lease) = live.as_ref().filter(|_| proof.is_none()) {
            if !force {
                return Err(EngineError::ExecutorAlive {
                    executor_id: executor_id.to_string(),
                    host: lease.host.clone(),
                    pid: lease.pid,
                    renewed_secs_ago: u64::try_from((now - lease.renewed_at_ms).max(0) / 1000)
                        .unwrap_or(0),
                });
            }
            // The holder learns of it at its next renewal and stops; one that cannot
            // renew (paused, cut off) has stopped its commands by the lease's deadline.
            // Until then the work stays with it: moved earlier, a step could run twice
            // at once, here and on whoever claims it (docs/scaling-and-recovery.md).
            self.store
                .revoke_executor_lease(executor_id, &lease.holder)
                .await?;
            let wait = lease.expires_at_ms - now_ms();
            if wait > 0 {
                tracing::warn!(
                    executor_id,
                    wait_ms = wait,
                    "forced recovery: lease revoked; moving its work at the lease's deadline"
                );
                tokio::time::sleep(Duration::from_millis(wait.unsigned_abs() + 1)).await;
            }
        }
        let note = match (&live, &proof) {
            (_, Some((_, pid, host))) => format!(
                "recovered from executor {executor_id} by {by} (its process, pid {pid} on \
                 host {host}, is gone)"
            ),
            (Some(l), None) => format!(
                "recovered from executor {executor_id} by {by} with --force (its lease was live: host {}, pid {}; revoked)",
                l.host, l.pid
            ),
            (None, None) => format!("recovered from executor {executor_id} by {by}"),
        };
        // Events hold JSON.
        let note = serde_json::Value::String(note).to_string();
        Ok(self
            .store
            .recover_executor(executor_id, &note, now_ms())
            .await?)
    }

    pub async fn executors(&self) -> Result<Vec<ExecutorRecord>, EngineError> {
        Ok(self.store.list_executors().await?)
    }

    /// One executor, if it ever ran.
    pub async fn executor(&self, id: &str) -> Result<Option<ExecutorRecord>, EngineError> {
        Ok(self.store.get_executor(id).await?)
    }

    /// The lease on executor id `id`: who holds it and until when, if anyone ever did.
    pub async fn executor_lease(&self, id: &str) -> Result<Option<ExecutorLease>, EngineError> {
        Ok(self.store.get_executor_lease(id).await?)
    }

    /// Whether the holder of `lease` stopped answering while its lease still looks live:
    /// the liveness lock of its id is free (its PostgreSQL session gone, or its OS file
    /// lock on SQLite free), or it ran on this host under a pid that is gone. Suspect, not
    /// dead: a cut connection frees the lock while the process lives on, so nothing moves
    /// its work before the lease runs out (ARCHITECTURE.md, invariant 5). False for an
    /// expired lease (its holder is dead, not suspect) and where the backend cannot tell.
    pub async fn executor_suspect(&self, lease: &ExecutorLease) -> Result<bool, EngineError> {
        if !lease.is_live(now_ms()) {
            return Ok(false);
        }
        if lease.host == crate::engine::this_host() {
            // Its pid says it here (a restart under the id writes a new one), and no lock
            // is tried, so a worker taking its id never meets this look.
            return Ok(!crate::engine::process_alive(lease.pid));
        }
        Ok(self.store.liveness_free(&lease.executor_id).await? == Some(true))
    }

    /// How many workflows named `name` are queued, per workflow version.
    pub async fn count_enqueued_by_version(
        &self,
        name: &str,
    ) -> Result<Vec<(u32, i64)>, EngineError> {
        Ok(self.store.count_enqueued_by_version(name).await?)
    }

    /// The workflow versions each live executor runs (an executor is live while its
    /// lease has not expired).
    pub async fn live_workflow_versions(&self) -> Result<Vec<WorkflowVersions>, EngineError> {
        let live = self.store.live_executor_ids(now_ms()).await?;
        let executors = self.store.list_executors().await?;
        Ok(executors
            .into_iter()
            .filter(|e| live.contains(&e.id))
            .map(|e| e.workflow_versions)
            .collect())
    }

    /// How many workflows named `name` there are, per status.
    pub async fn count_by_status(
        &self,
        name: &str,
    ) -> Result<Vec<(WorkflowStatus, i64)>, EngineError> {
        Ok(self.store.count_by_status(name).await?)
    }

    /// Durations (ms) of the `limit` most recently finished steps (`manent.*` left out).
    /// Steps that finished in the window: `(finished_at, duration)` in ms
    /// (`Store::steps_finished_between`).
    pub async fn steps_finished_between(
        &self,
        window: TimeWindow,
    ) -> Result<Vec<(i64, i64)>, EngineError> {
        Ok(self.store.steps_finished_between(window).await?)
    }

    /// Workflows first claimed in the window: `(started_at, latency)` in ms.
    pub async fn workflows_started_between(
        &self,
        window: TimeWindow,
    ) -> Result<Vec<(i64, i64)>, EngineError> {
        Ok(self.store.workflows_started_between(window).await?)
    }

    /// Workflows named `name` that ended in the window: `(finished_at, status)`.
    pub async fn workflows_finished_between(
        &self,
        name: &str,
        window: TimeWindow,
    ) -> Result<Vec<(i64, WorkflowStatus)>, EngineError> {
        Ok(self.store.workflows_finished_between(name, window).await?)
    }

    pub async fn queues(&self) -> Result<Vec<QueueRecord>, EngineError> {
        Ok(self.store.list_queues().await?)
    }

    pub async fn queue_depths(&self) -> Result<Vec<QueueDepth>, EngineError> {
        Ok(self.store.queue_depths().await?)
    }

    /// The running workflows, counted per queue, limit group, executor and partition.
    pub async fn running_counts(&self) -> Result<Vec<RunningCount>, EngineError> {
        Ok(self.store.running_counts().await?)
    }
}

/// Returns when a wake-up for `id` arrives or at `until`, whichever comes first.
pub(crate) async fn wait_for_workflow(
    wakeups: &mut tokio::sync::broadcast::Receiver<Wakeup>,
    id: &str,
    until: tokio::time::Instant,
) {
    let _ = tokio::time::timeout_at(until, async {
        loop {
            match wakeups.recv().await {
                Ok(Wakeup::Workflow(w)) if w == id => return,
                // Another process wrote (SQLite): it may have been this workflow.
                Ok(Wakeup::Elsewhere) => return,
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => return,
                // Nobody will tell us anything more: rely on the poll.
                Err(RecvError::Closed) => std::future::pending::<()>().await,
            }
        }
    })
    .await;
}

/// The stored form of a request (its id drawn here when the caller gave none).
fn new_workflow(req: &EnqueueRequest) -> Result<NewWorkflow, EngineError> {
    if req.workflow.is_empty() || req.queue.is_empty() {
        return Err(EngineError::InvalidInput(
            "a workflow needs a name and a queue".into(),
        ));
    }
    if let Some(error) = &req.input_error {
        return Err(EngineError::InvalidInput(format!(
            "the input of workflow `{}` cannot be serialised: {error}",
            req.workflow
        )));
    }
    Ok(NewWorkflow {
        id: req
            .id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        name: req.workflow.clone(),
        queue: req.queue.clone(),
        partition_key: req.partition_key.clone().unwrap_or_default(),
        priority: req.priority,
        not_before_ms: req.not_before_ms.unwrap_or(0),
        dedup_key: req.dedup_key.clone(),
        input: req.input.to_string(),
        parent_id: req.parent_id.clone(),
        now_ms: now_ms(),
        workflow_version: req.workflow_version,
    })
}

/// What the caller of an enqueue learns from the store's outcome.
fn outcome_record(
    req: EnqueueRequest,
    new: NewWorkflow,
    outcome: EnqueueOutcome,
) -> Result<WorkflowRecord, EngineError> {
    match outcome {
        // The record as written, without reading it back.
        EnqueueOutcome::Created => Ok(WorkflowRecord {
            id: new.id,
            name: new.name,
            status: WorkflowStatus::Enqueued,
            queue: new.queue,
            partition_key: new.partition_key,
            priority: new.priority,
            not_before_ms: new.not_before_ms,
            dedup_key: new.dedup_key,
            executor_id: None,
            input: new.input,
            output: None,
            error: None,
            parent_id: new.parent_id,
            attempts: 0,
            generation: 0,
            created_at_ms: new.now_ms,
            updated_at_ms: new.now_ms,
            started_at_ms: None,
            finished_at_ms: None,
            workflow_version: new.workflow_version,
        }),
        EnqueueOutcome::Exists(existing) if existing.name == req.workflow => Ok(*existing),
        EnqueueOutcome::Exists(existing) => Err(EngineError::IdConflict {
            id: new.id,
            existing: existing.name,
            requested: req.workflow,
        }),
        EnqueueOutcome::Deduplicated { existing_id } => Err(EngineError::Deduplicated {
            queue: req.queue,
            dedup_key: req.dedup_key.unwrap_or_default(),
            existing_id,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_that_cannot_be_serialised_refuses_the_enqueue_instead_of_storing_null() {
        // JSON object keys must be strings: a map keyed by pairs does not serialise.
        let input: std::collections::HashMap<(i32, i32), i32> = [((1, 2), 3)].into();
        let request = EnqueueRequest::new("w", "q", input);
        let refused = new_workflow(&request).expect_err("the enqueue is refused");
        assert!(
            refused.to_string().contains("cannot be serialised"),
            "the error says why: {refused}"
        );
        assert!(
            new_workflow(&EnqueueRequest::new("w", "q", 1)).is_ok(),
            "a plain input is accepted"
        );
    }
}
