//! What a running workflow sees: checkpointed steps, durable sleep, messages,
//! events and child workflows, each at a deterministic position so that a
//! replay meets its records in the same order.

use std::{
    collections::HashMap,
    fmt::Display,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use serde::{Serialize, de::DeserializeOwned};

use crate::{
    client::{EnqueueRequest, wait_for_workflow},
    engine::Shared,
    error::WorkflowError,
    now_ms,
    policy::StepPolicy,
    store::{Checkpoint, Consumed, Lease, StepRecord, StepStatus, WorkflowRecord, WorkflowStatus},
};

/// Step positions of branch `b` created at position `p` start at
/// `(p + 1) * BRANCH_BLOCK + b * BRANCH_SPAN`: 10,000 branches of 100,000 steps each.
const BRANCH_SPAN: i64 = 100_000;
const BRANCH_BLOCK: i64 = 1_000_000_000;

/// The longest a waiting `recv` goes without looking for its message.
const RECV_POLL_MAX: Duration = Duration::from_secs(1);

/// Handle of a running workflow. Clones share the position counter, so
/// steps may run in parallel (positions are taken when a step is created,
/// not when it is polled: `join!(ctx.step("a", ..), ctx.step("b", ..))` is deterministic).
#[derive(Clone)]
pub struct WorkflowContext {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    lease: Lease,
    name: String,
    queue: String,
    partition_key: String,
    workflow_version: u32,
    recorded: Arc<HashMap<i64, StepRecord>>,
    next_index: AtomicI64,
    /// Durable waits in progress in this run (all branches).
    waits: Arc<AtomicUsize>,
    /// Set just before this run hands its workflow on by itself (an outcome, a move to
    /// another queue): from then on the record stops naming this run's lease, and the run
    /// watcher must not take that for a recovery elsewhere (engine/watcher.rs, `check_run`).
    ending: Arc<AtomicBool>,
    /// What this run's output may still take (`EngineConfig::output_per_run`).
    output_budget: Arc<crate::output::OutputBudget>,
}

/// Counts a durable wait for as long as it lasts and tells a draining engine
/// that this run now only waits.
struct WaitGuard<'a>(&'a Inner);

impl<'a> WaitGuard<'a> {
    fn enter(inner: &'a Inner) -> Self {
        inner.waits.fetch_add(1, Ordering::SeqCst);
        inner.shared.run_finished.notify_waiters();
        WaitGuard(inner)
    }
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.0.waits.fetch_sub(1, Ordering::SeqCst);
    }
}

impl WorkflowContext {
    pub(crate) fn new(
        shared: Arc<Shared>,
        lease: Lease,
        record: &WorkflowRecord,
        steps: Vec<StepRecord>,
        waits: Arc<AtomicUsize>,
        ending: Arc<AtomicBool>,
    ) -> Self {
        let output_budget = Arc::new(crate::output::OutputBudget::new(
            shared.config.output_per_run,
        ));
        WorkflowContext {
            inner: Arc::new(Inner {
                shared,
                lease,
                name: record.name.clone(),
                queue: record.queue.clone(),
                partition_key: record.partition_key.clone(),
                workflow_version: record.workflow_version,
                recorded: Arc::new(steps.into_iter().map(|s| (s.index, s)).collect()),
                next_index: AtomicI64::new(0),
                waits,
                ending,
                output_budget,
            }),
        }
    }

    pub fn workflow_id(&self) -> &str {
        &self.inner.lease.workflow_id
    }
    pub fn queue(&self) -> &str {
        &self.inner.queue
    }
    pub fn partition_key(&self) -> &str {
        &self.inner.partition_key
    }
    pub fn executor_id(&self) -> &str {
        &self.inner.lease.executor_id
    }
    /// The version of the workflow's code this workflow started under: a workflow whose
    /// steps changed between versions branches on it, so a replay meets its records in the
    /// order they were written (ARCHITECTURE.md, "Workflow versions").
    pub fn workflow_version(&self) -> u32 {
        self.inner.workflow_version
    }
    /// This executor's lease, for the processes the run starts: they must not outlive the
    /// window in which this worker may act (a dead-man's switch, `manent_guard`).
    pub fn lease_window(&self) -> crate::LeaseWindow {
        crate::engine::lease_window(&self.inner.shared)
    }
    /// Incremented at every claim and recovery: tells runs of one workflow apart.
    pub fn generation(&self) -> i64 {
        self.inner.lease.generation
    }

    /// Where a step's body writes what it prints, line by line (`source` says who:
    /// `web-1: command 1`). Outside the checkpoints: usable inside a step, never
    /// replayed; readers follow it through [`crate::Client::output`].
    pub fn output(&self, source: impl Into<String>) -> crate::OutputWriter {
        crate::OutputWriter::new(
            self.inner.shared.store.clone(),
            self.workflow_id().to_string(),
            self.generation(),
            source.into(),
            self.inner.output_budget.clone(),
        )
    }

    fn take_index(&self) -> i64 {
        self.inner.next_index.fetch_add(1, Ordering::SeqCst)
    }

    /// Splits the workflow into `count` branches that may run concurrently
    /// and complete in any order: each branch numbers its steps in a range of
    /// its own, derived from this call's position, so a replay finds every
    /// branch's records whatever order the branches ran in the first time.
    /// (Plain `join!` of steps needs no branches: positions are taken when a
    /// step is created. Branches are for work whose steps are created as
    /// other work completes, such as targets deployed `max_parallel` at a time.)
    pub fn branches(&self, count: usize) -> Vec<WorkflowContext> {
        let at = self.take_index();
        (0..count)
            .map(|b| {
                let base = (at + 1).saturating_mul(BRANCH_BLOCK)
                    + i64::try_from(b).unwrap_or(0) * BRANCH_SPAN;
                WorkflowContext {
                    inner: Arc::new(Inner {
                        shared: self.inner.shared.clone(),
                        lease: self.inner.lease.clone(),
                        name: self.inner.name.clone(),
                        queue: self.inner.queue.clone(),
                        partition_key: self.inner.partition_key.clone(),
                        workflow_version: self.inner.workflow_version,
                        recorded: self.inner.recorded.clone(),
                        next_index: AtomicI64::new(base),
                        waits: self.inner.waits.clone(),
                        ending: self.inner.ending.clone(),
                        output_budget: self.inner.output_budget.clone(),
                    }),
                }
            })
            .collect()
    }

    /// The record at `index`, after checking it is the step the code asks for.
    fn recorded(&self, index: i64, name: &str) -> Result<Option<&StepRecord>, WorkflowError> {
        match self.inner.recorded.get(&index) {
            Some(r) if r.name != name => Err(WorkflowError::NonDeterminism {
                position: index,
                recorded: r.name.clone(),
                requested: name.to_string(),
            }),
            other => Ok(other),
        }
    }

    fn record(
        &self,
        index: i64,
        name: &str,
        status: StepStatus,
        attempts: i64,
        started_at_ms: i64,
    ) -> StepRecord {
        StepRecord {
            workflow_id: self.inner.lease.workflow_id.clone(),
            index,
            name: name.to_string(),
            status,
            output: None,
            error: None,
            attempts,
            started_at_ms,
            finished_at_ms: (status != StepStatus::Running).then(now_ms),
            executor_id: self.inner.lease.executor_id.clone(),
        }
    }

    /// Writes a step record. A database that is briefly unreachable (a cut
    /// connection, a failover) is waited for as long as the executor lease
    /// lets this process act: a blip must not make a finished step run again.
    async fn write(&self, step: &StepRecord) -> Result<(), WorkflowError> {
        let shared = &self.inner.shared;
        let mut wait = Duration::from_millis(50);
        loop {
            match shared.store.record_step(&self.inner.lease, step).await {
                Ok(Checkpoint::Written) => return Ok(()),
                Ok(Checkpoint::Fenced) => return Err(self.why_fenced().await),
                Err(e) if e.is_transient() && shared.lease_live() && !shared.is_stopping() => {
                    tracing::warn!(workflow_id = %self.workflow_id(), step = %step.name, error = %e, retry_in = ?wait, "cannot record the step; retrying while the executor lease holds");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(1));
                }
                Err(e) if e.is_transient() && !shared.lease_live() => {
                    return Err(WorkflowError::Fenced);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Fails with [`WorkflowError::Fenced`] when this process may not act on
    /// its executor id any more (its lease ran out or was taken). Checked
    /// before every step; workflow code calls it before starting anything
    /// outside the process (a command, an upload) in the middle of a step.
    pub fn ensure_live(&self) -> Result<(), WorkflowError> {
        if self.inner.shared.lease_live() {
            Ok(())
        } else {
            Err(WorkflowError::Fenced)
        }
    }

    /// Tells a cancellation from a recovery by another executor.
    async fn why_fenced(&self) -> WorkflowError {
        match self
            .inner
            .shared
            .store
            .get_workflow(self.workflow_id())
            .await
        {
            Ok(Some(w)) if w.status == WorkflowStatus::Cancelled => WorkflowError::Cancelled,
            _ => WorkflowError::Fenced,
        }
    }

    /// Runs `body` once, durably: its result is recorded before the workflow
    /// moves on and returned from the record on replay.
    pub fn step<'a, T, E, F, Fut>(
        &'a self,
        name: &str,
        body: F,
    ) -> impl Future<Output = Result<T, WorkflowError>> + Send + 'a
    where
        T: Serialize + DeserializeOwned + Send + 'a,
        E: Display + Send + 'a,
        F: FnMut() -> Fut + Send + 'a,
        Fut: Future<Output = Result<T, E>> + Send + 'a,
    {
        self.step_with(name, StepPolicy::default(), body)
    }

    /// [`WorkflowContext::step`] with a retry policy.
    pub fn step_with<'a, T, E, F, Fut>(
        &'a self,
        name: &str,
        policy: StepPolicy,
        body: F,
    ) -> impl Future<Output = Result<T, WorkflowError>> + Send + 'a
    where
        T: Serialize + DeserializeOwned + Send + 'a,
        E: Display + Send + 'a,
        F: FnMut() -> Fut + Send + 'a,
        Fut: Future<Output = Result<T, E>> + Send + 'a,
    {
        self.step_retrying_if(name, policy, |_: &E| true, body)
    }

    /// [`WorkflowContext::step_with`] where only the errors `retry_if` accepts are retried;
    /// any other error fails the step at once (a wrong checksum does not change by trying
    /// again).
    pub fn step_retrying_if<'a, T, E, R, F, Fut>(
        &'a self,
        name: &str,
        policy: StepPolicy,
        retry_if: R,
        mut body: F,
    ) -> impl Future<Output = Result<T, WorkflowError>> + Send + 'a
    where
        T: Serialize + DeserializeOwned + Send + 'a,
        E: Display + Send + 'a,
        R: Fn(&E) -> bool + Send + 'a,
        F: FnMut() -> Fut + Send + 'a,
        Fut: Future<Output = Result<T, E>> + Send + 'a,
    {
        let index = self.take_index();
        let name = name.to_string();
        async move {
            // The attempts earlier runs made: each run of a step is an attempt, also one a
            // crash or a recovery cut short (counted when its start was recorded).
            let mut before = 0;
            if let Some(r) = self.recorded(index, &name)? {
                match r.status {
                    StepStatus::Success => {
                        return Ok(serde_json::from_str(r.output.as_deref().unwrap_or("null"))?);
                    }
                    StepStatus::Error => {
                        return Err(WorkflowError::Step {
                            name,
                            message: r.error.clone().unwrap_or_default(),
                        });
                    }
                    // Started but never finished: the interrupted step runs again.
                    StepStatus::Running => before = r.attempts.max(1),
                }
            }
            self.ensure_live()?;
            let started = now_ms();
            if policy.record_start {
                // This run's attempt, counted while it runs.
                let running = self.record(index, &name, StepStatus::Running, before + 1, started);
                self.write(&running).await?;
            }
            let mut attempt = 0u32;
            loop {
                attempt += 1;
                match body().await {
                    Ok(value) => {
                        let mut rec = self.record(
                            index,
                            &name,
                            StepStatus::Success,
                            before + i64::from(attempt),
                            started,
                        );
                        rec.output = Some(serde_json::to_string(&value)?);
                        self.write(&rec).await?;
                        return Ok(value);
                    }
                    Err(e) if attempt < policy.max_attempts && retry_if(&e) => {
                        let wait = policy.backoff(attempt);
                        // Escaped: a step's error may quote what a target printed, which must
                        // not forge a line of the server's log.
                        tracing::info!(workflow_id = %self.workflow_id(), step = %name, attempt, error = %e.to_string().escape_debug(), retry_in = ?wait, "step failed; retrying");
                        if policy.record_start {
                            // The failed attempt's error on the running step, for status and
                            // logs to show while it is tried again (not only the worker's log).
                            let mut running = self.record(
                                index,
                                &name,
                                StepStatus::Running,
                                before + i64::from(attempt) + 1,
                                started,
                            );
                            running.error = Some(format!(
                                "attempt {} failed, trying again in {}s: {e}",
                                before + i64::from(attempt),
                                wait.as_secs_f64()
                            ));
                            self.write(&running).await?;
                        }
                        tokio::time::sleep(wait).await;
                        self.ensure_live()?;
                    }
                    Err(e) => {
                        let message = e.to_string();
                        let mut rec = self.record(
                            index,
                            &name,
                            StepStatus::Error,
                            before + i64::from(attempt),
                            started,
                        );
                        rec.error = Some(message.clone());
                        self.write(&rec).await?;
                        return Err(WorkflowError::Step { name, message });
                    }
                }
            }
        }
    }

    /// Sleeps durably: the wake-up time is recorded, so a restart sleeps only what is left.
    pub fn sleep(
        &self,
        duration: Duration,
    ) -> impl Future<Output = Result<(), WorkflowError>> + Send + '_ {
        let index = self.take_index();
        async move {
            const NAME: &str = "manent.sleep";
            let deadline = match self.recorded(index, NAME)? {
                Some(r) if r.status != StepStatus::Running => return Ok(()),
                // Every build since the first records the deadline: one that cannot be read
                // is damage someone must see, never a sleep ended early (STYLE.md, "Nothing fails
                // silently").
                Some(r) => match r.output.as_deref().map(str::parse::<i64>) {
                    Some(Ok(deadline)) => deadline,
                    _ => {
                        return Err(WorkflowError::failed(format!(
                            "the durable sleep at step {index} has no readable deadline \
                             (recorded {:?}); the workflow stops rather than end the sleep early",
                            r.output
                        )));
                    }
                },
                None => {
                    let started = now_ms();
                    let deadline =
                        started + i64::try_from(duration.as_millis()).unwrap_or(i64::MAX / 2);
                    let mut rec = self.record(index, NAME, StepStatus::Running, 1, started);
                    rec.output = Some(deadline.to_string());
                    self.write(&rec).await?;
                    deadline
                }
            };
            let left = u64::try_from((deadline - now_ms()).max(0)).unwrap_or(0);
            {
                let _waiting = WaitGuard::enter(&self.inner);
                tokio::time::sleep(Duration::from_millis(left)).await;
            }
            let mut rec = self.record(index, NAME, StepStatus::Success, 1, now_ms());
            rec.output = Some(deadline.to_string());
            self.write(&rec).await
        }
    }

    /// Waits for a message on `topic` sent to this workflow, up to `timeout`
    /// (durable: a restart waits only what is left). `None` on timeout.
    pub fn recv<'a, T: DeserializeOwned + Send + 'a>(
        &'a self,
        topic: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<T>, WorkflowError>> + Send + 'a {
        let index = self.take_index();
        let name = format!("manent.recv:{topic}");
        let topic = topic.to_string();
        async move {
            let started_at = match self.recorded(index, &name)? {
                Some(r) if r.status != StepStatus::Running => {
                    return r
                        .output
                        .as_deref()
                        .map(serde_json::from_str)
                        .transpose()
                        .map_err(WorkflowError::from);
                }
                Some(r) => r.started_at_ms,
                None => {
                    let started = now_ms();
                    self.write(&self.record(index, &name, StepStatus::Running, 1, started))
                        .await?;
                    started
                }
            };
            let deadline = started_at + i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX / 2);
            let store = &self.inner.shared.store;
            let mut wakeups = store.subscribe();
            let done = self.record(index, &name, StepStatus::Success, 1, started_at);
            let _waiting = WaitGuard::enter(&self.inner);
            let base_poll = self.inner.shared.poll_interval();
            let mut idle_poll = base_poll;
            loop {
                match store
                    .consume_message(&self.inner.lease, &topic, &done)
                    .await?
                {
                    Consumed::Message(payload) => return Ok(Some(serde_json::from_str(&payload)?)),
                    Consumed::Fenced => return Err(self.why_fenced().await),
                    Consumed::Empty => {}
                }
                let now = now_ms();
                if now >= deadline {
                    // Timed out: recorded with no output, so a replay times out too.
                    self.write(&self.record(index, &name, StepStatus::Success, 1, started_at))
                        .await?;
                    return Ok(None);
                }
                let left = Duration::from_millis(u64::try_from(deadline - now).unwrap_or(0));
                let until = tokio::time::Instant::now() + left.min(idle_poll);
                wait_for_workflow(&mut wakeups, self.workflow_id(), until).await;
                // A long wait (an approval) polls less and less often: a message sent in
                // this process wakes it at once; one from another process on SQLite (no
                // cross-process wake-up) is seen within RECV_POLL_MAX.
                idle_poll = (idle_poll * 2).min(RECV_POLL_MAX.max(base_poll));
            }
        }
    }

    /// Moves this workflow to `queue` (partitioned by `partition_key`): the move is
    /// recorded and the workflow becomes ENQUEUED there in one transaction, and this run
    /// stops with [`WorkflowError::Moved`] (return it with `?`). A worker serving `queue`
    /// claims it under that queue's limits and replays it: this call then returns `Ok`.
    /// What ran before the move held no slot of `queue` (approval and dependency waits).
    pub fn move_to_queue<'a>(
        &'a self,
        queue: &str,
        partition_key: &str,
    ) -> impl Future<Output = Result<(), WorkflowError>> + Send + 'a {
        let index = self.take_index();
        let name = format!("manent.move:{queue}");
        let queue = queue.to_string();
        let partition_key = partition_key.to_string();
        async move {
            if let Some(r) = self.recorded(index, &name)?
                && r.status == StepStatus::Success
            {
                return Ok(());
            }
            let rec = self.record(index, &name, StepStatus::Success, 1, now_ms());
            self.inner.ending.store(true, Ordering::SeqCst);
            match self
                .inner
                .shared
                .store
                .move_to_queue(&self.inner.lease, &rec, &queue, &partition_key, now_ms())
                .await?
            {
                Checkpoint::Written => Err(WorkflowError::Moved { queue }),
                Checkpoint::Fenced => Err(self.why_fenced().await),
            }
        }
    }

    /// Publishes `value` under `key` for clients to read (progress, results so far).
    pub fn set_event<'a, T: Serialize + Sync>(
        &'a self,
        key: &str,
        value: &'a T,
    ) -> impl Future<Output = Result<(), WorkflowError>> + Send + 'a {
        let index = self.take_index();
        let name = format!("manent.event:{key}");
        let key = key.to_string();
        async move {
            if self
                .recorded(index, &name)?
                .is_some_and(|r| r.status != StepStatus::Running)
            {
                return Ok(());
            }
            let json = serde_json::to_string(value)?;
            let mut rec = self.record(index, &name, StepStatus::Success, 1, now_ms());
            rec.output = Some(json.clone());
            match self
                .inner
                .shared
                .store
                .set_event(&self.inner.lease, &key, &json, &rec)
                .await?
            {
                Checkpoint::Written => Ok(()),
                Checkpoint::Fenced => Err(self.why_fenced().await),
            }
        }
    }

    /// Starts a child workflow on any queue; returns its id. Its id derives
    /// from this workflow's id and the position, so a replay finds the same child.
    pub fn start_child<'a, I: Serialize + Send + 'a>(
        &'a self,
        workflow: &str,
        queue: &str,
        partition_key: Option<&str>,
        input: I,
    ) -> impl Future<Output = Result<String, WorkflowError>> + Send + 'a {
        let index = self.take_index();
        let name = format!("manent.start:{workflow}");
        let workflow = workflow.to_string();
        let queue = queue.to_string();
        let partition_key = partition_key.map(str::to_string);
        async move {
            let child_id = format!("{}.{index}", self.workflow_id());
            if let Some(r) = self.recorded(index, &name)?
                && r.status == StepStatus::Success
            {
                return Ok(child_id);
            }
            // A child runs under its parent's version: the two are one deploy's code.
            let mut request = EnqueueRequest::new(workflow, queue, input)
                .id(child_id.clone())
                .parent(self.workflow_id())
                .version(self.workflow_version());
            if let Some(key) = partition_key {
                request = request.partition(key);
            }
            crate::client::Client::on(self.inner.shared.store.clone())
                .enqueue(request)
                .await
                .map_err(|e| match e {
                    crate::EngineError::Store(s) => WorkflowError::Store(s),
                    other => WorkflowError::Failed(format!("cannot start child workflow: {other}")),
                })?;
            let mut rec = self.record(index, &name, StepStatus::Success, 1, now_ms());
            rec.output = Some(serde_json::to_string(&child_id)?);
            self.write(&rec).await?;
            Ok(child_id)
        }
    }

    /// Waits for a workflow (usually a child) to end and returns its output;
    /// its failure or cancellation is an error. The outcome is recorded.
    pub fn await_workflow<'a, T: DeserializeOwned + Send + 'a>(
        &'a self,
        id: &str,
    ) -> impl Future<Output = Result<T, WorkflowError>> + Send + 'a {
        let index = self.take_index();
        let name = format!("manent.await:{id}");
        let id = id.to_string();
        async move {
            if let Some(r) = self.recorded(index, &name)? {
                match r.status {
                    StepStatus::Success => {
                        return Ok(serde_json::from_str(r.output.as_deref().unwrap_or("null"))?);
                    }
                    StepStatus::Error => {
                        let (status, message) = r
                            .error
                            .as_deref()
                            .unwrap_or("ERROR:")
                            .split_once(':')
                            .unwrap_or(("ERROR", ""));
                        return Err(WorkflowError::Child {
                            id,
                            status: status.into(),
                            message: message.trim().into(),
                        });
                    }
                    StepStatus::Running => {}
                }
            }
            let store = &self.inner.shared.store;
            let mut wakeups = store.subscribe();
            let started = now_ms();
            loop {
                let child = store.get_workflow(&id).await?;
                match child {
                    None => {
                        return Err(WorkflowError::Failed(format!(
                            "workflow `{id}` does not exist"
                        )));
                    }
                    Some(c) if c.status == WorkflowStatus::Success => {
                        let output = c.output.unwrap_or_else(|| "null".into());
                        let mut rec = self.record(index, &name, StepStatus::Success, 1, started);
                        rec.output = Some(output.clone());
                        self.write(&rec).await?;
                        return Ok(serde_json::from_str(&output)?);
                    }
                    Some(c) if c.status.is_terminal() => {
                        let message = c.error.unwrap_or_else(|| "cancelled".into());
                        let mut rec = self.record(index, &name, StepStatus::Error, 1, started);
                        rec.error = Some(format!("{}: {message}", c.status));
                        self.write(&rec).await?;
                        return Err(WorkflowError::Child {
                            id,
                            status: c.status.to_string(),
                            message,
                        });
                    }
                    Some(_) => {
                        let until = tokio::time::Instant::now() + self.inner.shared.poll_interval();
                        wait_for_workflow(&mut wakeups, &id, until).await;
                    }
                }
            }
        }
    }
}
