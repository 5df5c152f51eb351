//! The executor: claims the executor id, heartbeats, resumes its own pending
//! workflows, claims from the queues it listens to, runs workflows, recovers
//! stale executors when asked to, and drains on shutdown.

use std::{
    collections::{HashMap, HashSet},
    panic::AssertUnwindSafe,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::{FutureExt, future::BoxFuture};
use serde::{Serialize, de::DeserializeOwned};
use tokio::{
    sync::{Notify, broadcast::error::RecvError, watch},
    task::JoinHandle,
    time::Instant,
};

use crate::{
    client::Client,
    context::WorkflowContext,
    error::{EngineError, StoreError, WorkflowError},
    now_ms,
    store::{
        Checkpoint, ClaimLimits, ExecutorLease, ExecutorRecord, ExecutorState, Lease, LeaseGrant,
        LimitGroup, Liveness, QueueRecord, Renewal, Store, Wakeup, WorkflowFilter, WorkflowRecord,
        WorkflowStatus,
    },
};

/// How an executor identifies itself and watches the others.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Unique and stable across restarts (`dbos.executor_id` / `DBOS__VMID`).
    pub executor_id: String,
    pub host: String,
    pub region: Option<String>,
    /// Recorded in the executor row, for operators.
    pub version: String,
    /// An executor whose heartbeat is older than this is stale.
    pub stale_after: Duration,
    pub heartbeat_interval: Duration,
    /// Re-enqueue the pending workflows of stale executors.
    pub automatic_recovery: bool,
    /// Overrides the store's fallback poll.
    pub poll_interval: Option<Duration>,
    /// Most workflows taken in one claim.
    pub claim_batch: u32,
}

impl EngineConfig {
    pub fn new(executor_id: impl Into<String>) -> Self {
        EngineConfig {
            executor_id: executor_id.into(),
            host: hostname::get()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "unknown".into()),
            region: None,
            version: env!("CARGO_PKG_VERSION").to_string(),
            stale_after: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(5),
            automatic_recovery: false,
            poll_interval: None,
            claim_batch: 64,
        }
    }
}

/// A queue this executor serves, with the limits its claims enforce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSpec {
    pub name: String,
    /// Shown to operators (default, tenant, region, plugin, routed, …).
    pub kind: String,
    /// Running workflows of this queue on this executor.
    pub worker_concurrency: u32,
    /// Running workflows per partition key across all executors; `None` = unlimited.
    pub partition_concurrency: Option<u32>,
    /// Running workflows of this queue across all executors; 0 = unlimited.
    pub global_concurrency: u32,
    /// Limits shared with the other queues of a group, on top of this queue's own.
    pub group: Option<LimitGroup>,
}

impl QueueSpec {
    pub fn new(name: impl Into<String>) -> Self {
        QueueSpec {
            name: name.into(),
            kind: "default".into(),
            worker_concurrency: 10,
            partition_concurrency: None,
            global_concurrency: 0,
            group: None,
        }
    }
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = kind.into();
        self
    }
    pub fn worker_concurrency(mut self, n: u32) -> Self {
        self.worker_concurrency = n;
        self
    }
    pub fn partition_concurrency(mut self, n: u32) -> Self {
        self.partition_concurrency = Some(n);
        self
    }
    pub fn global_concurrency(mut self, n: u32) -> Self {
        self.global_concurrency = n;
        self
    }
    /// Counts this queue's claims also against `group`'s limits, shared with its other queues.
    pub fn group(mut self, group: LimitGroup) -> Self {
        self.group = Some(group);
        self
    }
    fn limits(&self) -> ClaimLimits {
        ClaimLimits {
            worker: self.worker_concurrency,
            partition: self.partition_concurrency,
            global: self.global_concurrency,
            group: self.group.clone(),
        }
    }
}

/// What a shutdown left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Workflows that finished while draining.
    pub drained: usize,
    /// Workflows in a durable wait handed back to their queue for another worker.
    pub released: usize,
    /// Workflows stopped at the drain timeout; they stay PENDING for the restart.
    pub left_pending: Vec<String>,
}

pub(crate) type WorkflowFn = Arc<
    dyn Fn(WorkflowContext, String) -> BoxFuture<'static, Result<String, WorkflowError>>
        + Send
        + Sync,
>;

struct Running {
    token: u64,
    handle: JoinHandle<()>,
    lease: Lease,
    /// Durable waits (`recv`, `sleep`) this run is blocked in right now; a
    /// draining executor hands such runs back to their queue at once.
    waits: Arc<AtomicUsize>,
    /// The run is handing its workflow on by itself (outcome, move): not "no longer ours".
    ending: Arc<AtomicBool>,
}

pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) config: EngineConfig,
    registry: RwLock<HashMap<String, WorkflowFn>>,
    queues: RwLock<Vec<QueueSpec>>,
    running: Mutex<HashMap<String, Running>>,
    /// Notified when a run ends or enters a durable wait (drain watches both).
    pub(crate) run_finished: Notify,
    next_token: AtomicU64,
    launched: AtomicBool,
    stopping: watch::Sender<bool>,
    liveness: Mutex<Option<Liveness>>,
    background: Mutex<Vec<JoinHandle<()>>>,
    state: Mutex<ExecutorState>,
    /// This process's name in the executor lease: host, pid and a random part.
    holder: String,
    /// Until when (monotonic) this process may act on its executor id: the
    /// last renewal's send time plus the fence window, safely before the
    /// lease's deadline others act on. `None` before the id is taken.
    act_until: Mutex<Option<Instant>>,
    /// Set while the lease could not be renewed in time: no step starts, no
    /// workflow is claimed, and the runs that were going were stopped.
    self_fenced: AtomicBool,
    /// Notified at each renewal (the fence watchdog waits for it).
    renewed: Notify,
    /// Set once the lease was taken by another process (or revoked): why.
    lost: watch::Sender<Option<String>>,
}

impl Shared {
    pub(crate) fn poll_interval(&self) -> Duration {
        self.config
            .poll_interval
            .unwrap_or_else(|| self.store.poll_interval())
    }

    pub(crate) fn is_stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// Whether this process may start a step or a command now: it holds its
    /// executor id's lease and renewed it recently enough that nobody else
    /// may act on the id yet. A monotonic clock, so a process that was paused
    /// past its deadline learns it before doing anything on waking.
    pub(crate) fn lease_live(&self) -> bool {
        if self.lost.borrow().is_some() || self.self_fenced.load(Ordering::SeqCst) {
            return false;
        }
        match *lock(&self.act_until) {
            Some(until) => Instant::now() < until,
            // Not launched through `launch` (no id taken): nothing to fence.
            None => !self.launched.load(Ordering::SeqCst),
        }
    }

    /// How long after sending a renewal this process may go on acting: a
    /// quarter of `stale_after` short of the deadline it wrote, leaving room
    /// to stop its runs and kill their commands before anyone takes over.
    fn fence_window(&self) -> Duration {
        self.config.stale_after - self.config.stale_after / 4
    }

    fn stale_ms(&self) -> i64 {
        i64::try_from(self.config.stale_after.as_millis()).unwrap_or(i64::MAX)
    }

    /// Stops every run of this executor now: their futures are dropped, which
    /// kills the commands they started. They stay PENDING under this id.
    fn stop_all_runs(&self) -> Vec<String> {
        let runs: Vec<(String, Running)> = lock(&self.running).drain().collect();
        let ids = runs.iter().map(|(id, _)| id.clone()).collect();
        for (_, run) in runs {
            run.handle.abort();
        }
        self.run_finished.notify_waiters();
        ids
    }

    /// Stops one run whose lease no longer holds (cancelled, recovered away).
    fn stop_run(&self, workflow_id: &str) -> bool {
        let run = lock(&self.running).remove(workflow_id);
        match run {
            Some(run) => {
                run.handle.abort();
                self.run_finished.notify_waiters();
                true
            }
            None => false,
        }
    }
}

/// A durable workflow executor. Cheap to clone; clones share the executor.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
}

impl Engine {
    pub fn new(store: Arc<dyn Store>, config: EngineConfig) -> Self {
        let holder = format!(
            "{}/{}/{}",
            config.host,
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        );
        Engine {
            shared: Arc::new(Shared {
                store,
                config,
                registry: RwLock::default(),
                queues: RwLock::default(),
                running: Mutex::default(),
                run_finished: Notify::new(),
                next_token: AtomicU64::new(1),
                launched: AtomicBool::new(false),
                stopping: watch::channel(false).0,
                liveness: Mutex::new(None),
                background: Mutex::default(),
                state: Mutex::new(ExecutorState::Running),
                holder,
                act_until: Mutex::new(None),
                self_fenced: AtomicBool::new(false),
                renewed: Notify::new(),
                lost: watch::channel(None).0,
            }),
        }
    }

    pub fn executor_id(&self) -> &str {
        &self.shared.config.executor_id
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.shared.store
    }

    pub fn client(&self) -> Client {
        Client::new(self.shared.store.clone())
    }

    /// Registers a workflow function under `name`. Its input and output travel as JSON.
    pub fn register<I, O, F, Fut>(&self, name: &str, f: F)
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + Send + 'static,
        F: Fn(WorkflowContext, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, WorkflowError>> + Send + 'static,
    {
        let f = Arc::new(f);
        let erased: WorkflowFn = Arc::new(move |ctx, input: String| {
            let f = f.clone();
            async move {
                let input: I = serde_json::from_str(&input).map_err(|e| {
                    WorkflowError::Failed(format!("cannot decode the workflow input: {e}"))
                })?;
                let output = f(ctx, input).await?;
                Ok(serde_json::to_string(&output)?)
            }
            .boxed()
        });
        write(&self.shared.registry).insert(name.to_string(), erased);
    }

    /// Serves `spec` from launch on; before launch, or at once after it.
    pub fn listen(&self, spec: QueueSpec) {
        let mut queues = write(&self.shared.queues);
        queues.retain(|q| q.name != spec.name);
        queues.push(spec);
    }

    pub fn queues(&self) -> Vec<QueueSpec> {
        read(&self.shared.queues).clone()
    }

    /// Number of workflows running on this executor now.
    pub fn running_count(&self) -> usize {
        lock(&self.shared.running).len()
    }

    /// Starts the executor: takes the executor id (refusing a duplicate, as
    /// docs/scaling-and-recovery.md says), registers it, resumes its own pending
    /// workflows, then heartbeats and claims until [`Engine::shutdown`].
    pub async fn launch(&self) -> Result<(), EngineError> {
        if self.shared.launched.swap(true, Ordering::SeqCst) {
            return Err(EngineError::AlreadyLaunched);
        }
        let shared = &self.shared;
        let config = &shared.config;
        let liveness = self.take_executor_id().await?;
        *lock(&shared.liveness) = Some(liveness);

        let now = now_ms();
        let queues = self.queues();
        shared
            .store
            .upsert_executor(&ExecutorRecord {
                id: config.executor_id.clone(),
                host: config.host.clone(),
                pid: i64::from(std::process::id()),
                region: config.region.clone(),
                queues: queues.iter().map(|q| q.name.clone()).collect(),
                state: ExecutorState::Running,
                started_at_ms: now,
                heartbeat_at_ms: now,
                stopped_at_ms: None,
                version: config.version.clone(),
                running: 0,
            })
            .await?;
        for q in &queues {
            shared
                .store
                .upsert_queue(&QueueRecord {
                    name: q.name.clone(),
                    kind: q.kind.clone(),
                    worker_concurrency: Some(i64::from(q.worker_concurrency)),
                    partition_concurrency: q.partition_concurrency.map(i64::from),
                    global_concurrency: i64::from(q.global_concurrency),
                    updated_at_ms: now,
                })
                .await?;
        }

        let resumed = shared
            .store
            .take_over_own(&config.executor_id, now_ms())
            .await?;
        if !resumed.is_empty() {
            tracing::info!(executor_id = %config.executor_id, count = resumed.len(), "resuming workflows left pending by this executor");
        }
        for record in resumed {
            spawn_run(shared, record);
        }

        let heartbeat = tokio::spawn(heartbeat_loop(shared.clone()));
        let watchdog = tokio::spawn(fence_watchdog(shared.clone()));
        let watcher = tokio::spawn(run_watcher(shared.clone()));
        let claimer = tokio::spawn(claim_loop(shared.clone()));
        lock(&shared.background).extend([heartbeat, watchdog, watcher, claimer]);
        if config.automatic_recovery {
            let recovery = tokio::spawn(recovery_loop(shared.clone()));
            lock(&shared.background).push(recovery);
        }
        tracing::info!(executor_id = %config.executor_id, host = %config.host, queues = ?queues.iter().map(|q| &q.name).collect::<Vec<_>>(), "executor started");
        Ok(())
    }

    /// The duplicate-id rule, on leases. A live lease keeps the id with its
    /// holder: we say at once that we wait, wait up to `stale_after` (a
    /// crashed or paused holder's lease runs out meanwhile) and then refuse,
    /// naming its host. The backend's lock only proves a holder dead at once:
    /// the lock is free *and* the holder ran on this host under a pid that is
    /// gone. A free lock alone proves nothing (a PostgreSQL connection cut
    /// frees it while its process lives on).
    async fn take_executor_id(&self) -> Result<Liveness, EngineError> {
        let shared = &self.shared;
        let config = &shared.config;
        let started = Instant::now();
        let mut announced = false;
        loop {
            let proof = shared.store.acquire_liveness(&config.executor_id).await?;
            let previous = shared.store.get_executor_lease(&config.executor_id).await?;
            let proven_dead = matches!(proof, Liveness::Acquired(_))
                && previous
                    .as_ref()
                    .is_some_and(|l| l.host == config.host && !process_alive(l.pid));
            let sent = Instant::now();
            let now = now_ms();
            let lease = ExecutorLease {
                executor_id: config.executor_id.clone(),
                holder: shared.holder.clone(),
                host: config.host.clone(),
                pid: i64::from(std::process::id()),
                acquired_at_ms: now,
                renewed_at_ms: now,
                expires_at_ms: now.saturating_add(shared.stale_ms()),
            };
            match shared
                .store
                .acquire_executor_lease(&lease, proven_dead)
                .await?
            {
                LeaseGrant::Granted => {
                    if let Some(prev) = previous.filter(|p| p.holder != shared.holder) {
                        let why = if proven_dead {
                            "its process is gone"
                        } else {
                            "its lease ran out"
                        };
                        tracing::info!(executor_id = %config.executor_id, previous_host = %prev.host, previous_pid = prev.pid, "took over the executor id: {why}");
                    }
                    *lock(&shared.act_until) = Some(sent + shared.fence_window());
                    return Ok(proof);
                }
                LeaseGrant::Held(holder) => {
                    let age_secs =
                        u64::try_from((now - holder.renewed_at_ms).max(0) / 1000).unwrap_or(0);
                    // The holder's lease outlives our wait only if it is renewed: it is alive.
                    if started.elapsed() >= config.stale_after + LEASE_POLL {
                        return Err(EngineError::DuplicateExecutor {
                            executor_id: config.executor_id.clone(),
                            host: holder.host,
                            pid: holder.pid,
                            age_secs,
                        });
                    }
                    if !announced {
                        announced = true;
                        tracing::warn!(executor_id = %config.executor_id, holder_host = %holder.host, holder_pid = holder.pid, "executor id held by a live worker (lease renewed {age_secs}s ago); waiting up to stale_after ({:?}) for its lease to run out before refusing", config.stale_after);
                    }
                }
            }
            drop(proof);
            tokio::time::sleep(LEASE_POLL).await;
        }
    }

    /// Resolves when this process lost its executor id to another process
    /// (which took over after its lease ran out, or a forced recovery): the
    /// process must stop at once and exit non-zero. Its runs are already
    /// stopped and their commands killed when this resolves.
    pub async fn lease_lost(&self) -> EngineError {
        let mut lost = self.shared.lost.subscribe();
        loop {
            if let Some(detail) = lost.borrow_and_update().clone() {
                return EngineError::LeaseLost {
                    executor_id: self.shared.config.executor_id.clone(),
                    detail,
                };
            }
            if lost.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Stops claiming, marks the executor draining, waits for running
    /// workflows up to `drain_timeout`, stops the rest (they stay PENDING and
    /// resume at restart), marks the executor stopped and releases its id.
    pub async fn shutdown(&self, drain_timeout: Duration) -> ShutdownReport {
        let shared = &self.shared;
        let _ = shared.stopping.send(true);
        *lock(&shared.state) = ExecutorState::Draining;
        if !shared.launched.load(Ordering::SeqCst) {
            return ShutdownReport {
                drained: 0,
                released: 0,
                left_pending: Vec::new(),
            };
        }
        let id = &shared.config.executor_id;
        // A process that lost its id writes nothing under it any more.
        let lost = shared.lost.borrow().is_some();
        if !lost
            && let Err(e) = shared
                .store
                .heartbeat(id, ExecutorState::Draining, now_ms())
                .await
        {
            tracing::warn!(error = %e, "could not record the draining state");
        }
        let before = lock(&shared.running).len();
        tracing::info!(executor_id = %id, running = before, timeout = ?drain_timeout, "draining");
        let deadline = Instant::now() + drain_timeout;
        loop {
            let notified = shared.run_finished.notified();
            // Runs blocked in a durable wait (an approval, a timer) are not waited for:
            // they are handed back below, so no drain lasts as long as an approval.
            let only_waits = lock(&shared.running)
                .values()
                .all(|run| run.waits.load(Ordering::SeqCst) > 0);
            if only_waits || Instant::now() >= deadline {
                break;
            }
            let _ = tokio::time::timeout_at(deadline, notified).await;
        }
        let left: Vec<(String, Running)> = lock(&shared.running).drain().collect();
        let mut left_pending = Vec::new();
        let mut released = 0;
        for (workflow_id, run) in left {
            // Read before the abort: dropping the aborted run ends its waits.
            let waiting = run.waits.load(Ordering::SeqCst) > 0;
            // Dropping the run's future kills the commands it started.
            run.handle.abort();
            // A run in a durable wait goes back to its queue, so a live worker
            // takes it over now rather than at this executor's restart.
            let handed_back = waiting
                && matches!(
                    shared.store.release(&run.lease, now_ms()).await,
                    Ok(Checkpoint::Written)
                );
            if handed_back {
                tracing::info!(workflow_id = %workflow_id, "released a durable wait to its queue");
                released += 1;
            } else {
                left_pending.push(workflow_id);
            }
        }
        for task in lock(&shared.background).drain(..) {
            task.abort();
        }
        *lock(&shared.state) = ExecutorState::Stopped;
        if !lost {
            if let Err(e) = shared
                .store
                .heartbeat(id, ExecutorState::Stopped, now_ms())
                .await
            {
                tracing::warn!(error = %e, "could not record the stopped state");
            }
            // A clean stop frees the id at once for the next process.
            if let Err(e) = shared
                .store
                .end_executor_lease(id, Some(&shared.holder))
                .await
            {
                tracing::warn!(error = %e, "could not end the executor lease; the next process waits for it to run out");
            }
        }
        lock(&shared.liveness).take();
        if !left_pending.is_empty() {
            tracing::warn!(executor_id = %id, workflows = ?left_pending, "drain timeout: left pending for the restart");
        }
        ShutdownReport {
            drained: before.saturating_sub(left_pending.len() + released),
            released,
            left_pending,
        }
    }
}

/// Runs `record` on this executor unless it already runs here.
fn spawn_run(shared: &Arc<Shared>, record: WorkflowRecord) {
    let Some(lease) = record.lease() else {
        tracing::error!(workflow_id = %record.id, "claimed workflow has no executor; skipping");
        return;
    };
    if !shared.lease_live() {
        // It stays PENDING under this id: resumed when the lease is renewed,
        // or recovered elsewhere.
        tracing::warn!(workflow_id = %record.id, "not started: the executor lease is not live");
        return;
    }
    let token = shared.next_token.fetch_add(1, Ordering::Relaxed);
    let mut running = lock(&shared.running);
    if let Some(old) = running.remove(&record.id) {
        // An older run of the same workflow here was fenced by this new
        // generation; stop it now rather than at its next checkpoint.
        old.handle.abort();
    }
    let id = record.id.clone();
    let waits = Arc::new(AtomicUsize::new(0));
    let ending = Arc::new(AtomicBool::new(false));
    let handle = tokio::spawn(run_workflow(
        shared.clone(),
        record,
        lease.clone(),
        token,
        waits.clone(),
        ending.clone(),
    ));
    running.insert(
        id,
        Running {
            token,
            handle,
            lease,
            waits,
            ending,
        },
    );
}

async fn run_workflow(
    shared: Arc<Shared>,
    record: WorkflowRecord,
    lease: Lease,
    token: u64,
    waits: Arc<AtomicUsize>,
    ending: Arc<AtomicBool>,
) {
    let id = record.id.clone();
    run_to_outcome(&shared, record, lease, waits, ending).await;
    let mut running = lock(&shared.running);
    if running.get(&id).is_some_and(|r| r.token == token) {
        running.remove(&id);
    }
    drop(running);
    shared.run_finished.notify_waiters();
}

async fn run_to_outcome(
    shared: &Arc<Shared>,
    record: WorkflowRecord,
    lease: Lease,
    waits: Arc<AtomicUsize>,
    ending: Arc<AtomicBool>,
) {
    let function = read(&shared.registry).get(&record.name).cloned();
    let Some(function) = function else {
        let message = format!(
            "workflow `{}` is not registered on executor `{}`; it cannot run here",
            record.name, shared.config.executor_id
        );
        tracing::error!(workflow_id = %record.id, "{message}");
        ending.store(true, Ordering::SeqCst);
        finish(shared, &lease, WorkflowStatus::Error, None, Some(&message)).await;
        return;
    };
    let mut wait = Duration::from_millis(100);
    // A workflow's first claim is its first lease: no run before it could write a
    // checkpoint (every step write needs a lease), so there is nothing to load. A
    // replay after a failed checkpoint, or any later claim or take-over, loads them.
    let mut nothing_recorded = record.attempts <= 1;
    loop {
        let loaded = if std::mem::take(&mut nothing_recorded) {
            Ok(Vec::new())
        } else {
            shared.store.load_steps(&record.id).await
        };
        let steps = match loaded {
            Ok(steps) => steps,
            Err(e) if e.is_transient() && !shared.is_stopping() => {
                tracing::warn!(workflow_id = %record.id, error = %e, "cannot load checkpoints; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
                continue;
            }
            Err(e) => {
                tracing::error!(workflow_id = %record.id, error = %e, "cannot load checkpoints");
                return;
            }
        };
        let ctx = WorkflowContext::new(
            shared.clone(),
            lease.clone(),
            &record,
            steps,
            waits.clone(),
            ending.clone(),
        );
        let outcome = AssertUnwindSafe(function(ctx, record.input.clone()))
            .catch_unwind()
            .await;
        // Every arm below but the transient replay ends this run; an outcome it writes
        // makes the record stop naming this lease, which the watcher must not mistake
        // for a recovery elsewhere.
        let replays = matches!(&outcome, Ok(Err(WorkflowError::Store(e))) if e.is_transient());
        if !replays {
            ending.store(true, Ordering::SeqCst);
        }
        match outcome {
            Ok(Ok(output)) => {
                finish(shared, &lease, WorkflowStatus::Success, Some(&output), None).await;
            }
            Ok(Err(e)) if e.stops_silently() => {
                tracing::info!(workflow_id = %record.id, reason = %e, "run stopped");
            }
            Ok(Err(WorkflowError::Store(e))) if e.is_transient() => {
                if shared.is_stopping() {
                    return;
                }
                // The database went away mid-run: replay from the checkpoints once it is back.
                tracing::warn!(workflow_id = %record.id, error = %e, retry_in = ?wait, "checkpoint failed; replaying later");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
                continue;
            }
            Ok(Err(e)) => {
                let message = e.to_string();
                tracing::warn!(workflow_id = %record.id, error = %message, "workflow failed");
                finish(shared, &lease, WorkflowStatus::Error, None, Some(&message)).await;
            }
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                tracing::error!(workflow_id = %record.id, panic = %message, "workflow panicked (a bug)");
                finish(
                    shared,
                    &lease,
                    WorkflowStatus::Error,
                    None,
                    Some(&format!("workflow panicked: {message}")),
                )
                .await;
            }
        }
        return;
    }
}

/// Records the outcome, retrying while the database is unreachable.
async fn finish(
    shared: &Shared,
    lease: &Lease,
    status: WorkflowStatus,
    output: Option<&str>,
    error: Option<&str>,
) {
    let mut wait = Duration::from_millis(100);
    loop {
        match shared
            .store
            .finish(lease, status, output, error, now_ms())
            .await
        {
            Ok(Checkpoint::Written) => return,
            Ok(Checkpoint::Fenced) => {
                tracing::info!(workflow_id = %lease.workflow_id, "outcome not recorded: the workflow is no longer ours");
                return;
            }
            Err(e) if e.is_transient() && !shared.is_stopping() => {
                tracing::warn!(workflow_id = %lease.workflow_id, error = %e, "cannot record the outcome; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                tracing::error!(workflow_id = %lease.workflow_id, error = %e, "cannot record the outcome; it stays PENDING");
                return;
            }
        }
    }
}

/// How often a newcomer looks at a held lease again.
const LEASE_POLL: Duration = Duration::from_millis(200);

/// Renews the lease, then records the heartbeat. Ends when the lease is lost.
/// Each call is bounded, so that nothing keeps the next renewal waiting.
async fn heartbeat_loop(shared: Arc<Shared>) {
    let config = &shared.config;
    let mut ticker = tokio::time::interval(config.heartbeat_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if !renew_lease(&shared).await {
            return;
        }
        let state = *lock(&shared.state);
        let heartbeat = tokio::time::timeout(
            config.heartbeat_interval,
            shared.store.heartbeat(&config.executor_id, state, now_ms()),
        );
        match heartbeat.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "heartbeat failed"),
            Err(_) => tracing::warn!(
                "heartbeat not written within the heartbeat interval; the lease is renewed first next time"
            ),
        }
    }
}

/// Re-enqueues the pending workflows of stale executors, every heartbeat interval.
/// A task of its own, not a step of [`heartbeat_loop`]: a recovery held up (by a row
/// lock another session holds, by a slow database) must not hold up the lease renewal,
/// or this executor would fence itself, stopping its own runs, while it waits to
/// recover another's.
async fn recovery_loop(shared: Arc<Shared>) {
    let config = &shared.config;
    let mut ticker = tokio::time::interval(config.heartbeat_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stale_ms = shared.stale_ms();
    loop {
        ticker.tick().await;
        if *lock(&shared.state) != ExecutorState::Running || !shared.lease_live() {
            continue;
        }
        let now = now_ms();
        match shared
            .store
            .recover_stale(now - stale_ms, &config.executor_id, now)
            .await
        {
            Ok(recovered) if !recovered.is_empty() => {
                tracing::warn!(count = recovered.len(), workflows = ?recovered, "recovered the workflows of stale executors");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "automatic recovery failed"),
        }
    }
}

/// One renewal of the executor lease. Returns `false` once the lease is lost
/// for good (taken by another process, or revoked).
async fn renew_lease(shared: &Arc<Shared>) -> bool {
    let config = &shared.config;
    let sent = Instant::now();
    let now = now_ms();
    // Bounded, so a hung connection cannot hold the loop past the lease.
    let renewal = tokio::time::timeout(
        config.stale_after,
        shared.store.renew_executor_lease(
            &config.executor_id,
            &shared.holder,
            now,
            now.saturating_add(shared.stale_ms()),
        ),
    )
    .await;
    match renewal {
        Ok(Ok(Renewal::Renewed)) => {
            *lock(&shared.act_until) = Some(sent + shared.fence_window());
            shared.renewed.notify_one();
            if shared.self_fenced.load(Ordering::SeqCst) && !shared.is_stopping() {
                // Nobody took the id while we could not renew: go on with
                // whatever was not recovered away meanwhile.
                match shared
                    .store
                    .take_over_own(&config.executor_id, now_ms())
                    .await
                {
                    Ok(records) => {
                        shared.self_fenced.store(false, Ordering::SeqCst);
                        tracing::warn!(executor_id = %config.executor_id, resumed = records.len(), "executor lease renewed again; resuming this executor's pending workflows");
                        for record in records {
                            spawn_run(shared, record);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "lease renewed but the pending workflows cannot be read; trying again at the next renewal");
                    }
                }
            }
            true
        }
        Ok(Ok(Renewal::Lost(current))) => {
            lose_lease(shared, current);
            false
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot renew the executor lease; retrying");
            true
        }
        Err(_) => {
            tracing::warn!(timeout = ?config.stale_after, "renewing the executor lease timed out; retrying");
            true
        }
    }
}

/// Another process holds our id now (or a forced recovery revoked it): stop
/// every run (killing its commands), stop claiming, and tell the binary.
fn lose_lease(shared: &Shared, current: Option<ExecutorLease>) {
    let detail = match current {
        Some(l) => format!("it is now held by host `{}`, pid {}", l.host, l.pid),
        None => "its lease was revoked by a forced recovery".to_string(),
    };
    shared.self_fenced.store(true, Ordering::SeqCst);
    let _ = shared.stopping.send(true);
    let stopped = shared.stop_all_runs();
    tracing::error!(executor_id = %shared.config.executor_id, stopped = ?stopped, "executor lease lost: {detail}; stopped every run and its commands");
    shared.lost.send_replace(Some(detail));
}

/// Fences this process when its lease was not renewed in time: every run is
/// stopped (their commands killed) before the deadline others act on.
async fn fence_watchdog(shared: Arc<Shared>) {
    loop {
        let until = lock(&shared.act_until).unwrap_or_else(Instant::now);
        if Instant::now() < until {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                _ = shared.renewed.notified() => {}
            }
            continue;
        }
        if !shared.self_fenced.swap(true, Ordering::SeqCst) {
            let stopped = shared.stop_all_runs();
            tracing::error!(executor_id = %shared.config.executor_id, stopped = ?stopped, "the executor lease could not be renewed in time: stopped every run and its commands before another worker may take over; they resume here if the lease is renewed, elsewhere after recovery");
        }
        shared.renewed.notified().await;
    }
}

/// Stops the runs whose workflow is no longer ours (cancelled, recovered
/// away, finished elsewhere): at once on a wake-up for the workflow, and at
/// every heartbeat interval for what no wake-up told us (SQLite across processes).
async fn run_watcher(shared: Arc<Shared>) {
    let mut wakeups = shared.store.subscribe();
    let mut ticker = tokio::time::interval(shared.config.heartbeat_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut bus_open = true;
    loop {
        let wakeup = async {
            if bus_open {
                wakeups.recv().await
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            _ = ticker.tick() => check_all_runs(&shared).await,
            wakeup = wakeup => match wakeup {
                Ok(Wakeup::Workflow(id)) => check_run(&shared, &id).await,
                Ok(Wakeup::Queue(_)) => {}
                Err(RecvError::Lagged(_)) => check_all_runs(&shared).await,
                Err(RecvError::Closed) => bus_open = false,
            },
        }
    }
}

/// The lease of this executor's run of `workflow_id`, unless there is none or the run is
/// handing the workflow on by itself (its outcome or move is being written): such a run is
/// ending on its own and is neither stopped nor reported as taken away.
fn run_lease(shared: &Shared, workflow_id: &str) -> Option<Lease> {
    lock(&shared.running)
        .get(workflow_id)
        .filter(|run| !run.ending.load(Ordering::SeqCst))
        .map(|run| run.lease.clone())
}

fn lease_holds(record: &WorkflowRecord, lease: &Lease) -> bool {
    record.status == WorkflowStatus::Pending
        && record.executor_id.as_deref() == Some(lease.executor_id.as_str())
        && record.generation == lease.generation
}

async fn check_run(shared: &Shared, workflow_id: &str) {
    let Some(lease) = run_lease(shared, workflow_id) else {
        return;
    };
    if let Ok(record) = shared.store.get_workflow(workflow_id).await {
        let holds = record.as_ref().is_some_and(|r| lease_holds(r, &lease));
        if !holds && run_lease(shared, workflow_id) == Some(lease) && shared.stop_run(workflow_id) {
            let status = record.as_ref().map(|r| r.status);
            if status == Some(WorkflowStatus::Cancelled) {
                tracing::info!(workflow_id, "stopped the run: the workflow was cancelled");
            } else {
                // Recovered by another worker while this one was silent (paused, cut off):
                // an operator should know that this process had fallen behind.
                tracing::warn!(
                    workflow_id,
                    status = ?status,
                    "stopped the run: the workflow is no longer ours (recovered by another \
                     worker, or gone)"
                );
            }
        }
    }
}

async fn check_all_runs(shared: &Shared) {
    let leases: Vec<Lease> = lock(&shared.running)
        .values()
        .map(|run| run.lease.clone())
        .collect();
    if leases.is_empty() {
        return;
    }
    let Ok(ours) = shared
        .store
        .list_workflows(&WorkflowFilter {
            status: Some(WorkflowStatus::Pending),
            executor_id: Some(shared.config.executor_id.clone()),
            limit: Some(i64::MAX),
            ..Default::default()
        })
        .await
    else {
        return;
    };
    let held: HashSet<(String, i64)> = ours.into_iter().map(|r| (r.id, r.generation)).collect();
    for lease in leases {
        if !held.contains(&(lease.workflow_id.clone(), lease.generation)) {
            check_run(shared, &lease.workflow_id).await;
        }
    }
}

/// Whether a process with this pid exists on this host (a pid we may not
/// signal exists too).
fn process_alive(pid: i64) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    !matches!(
        rustix::process::test_kill_process(pid),
        Err(rustix::io::Errno::SRCH)
    )
}

/// Claims whenever a queue we serve may have work: on a wake-up, on the
/// not-before time of the earliest scheduled workflow, and on the fallback poll.
async fn claim_loop(shared: Arc<Shared>) {
    let mut wakeups = shared.store.subscribe();
    let mut stopping = shared.stopping.subscribe();
    let mut dirty: HashSet<String> = read(&shared.queues)
        .iter()
        .map(|q| q.name.clone())
        .collect();
    let mut failures = 0u32;
    let mut round = 0usize;
    loop {
        if shared.is_stopping() {
            return;
        }
        let queues = read(&shared.queues).clone();
        let mut next_due: Option<i64> = None;
        let mut failed = false;
        // Queues of one limit group compete for its slots: start each round at
        // the next queue, so none is always served last.
        round = round.wrapping_add(1);
        let start = round % queues.len().max(1);
        let in_turn = queues[start..].iter().chain(&queues[..start]);
        for spec in in_turn.filter(|q| dirty.contains(&q.name)) {
            match claim_queue(&shared, spec).await {
                Ok(due) => next_due = min_opt(next_due, due),
                Err(e) => {
                    failed = true;
                    tracing::warn!(queue = %spec.name, error = %e, "claim failed");
                }
            }
        }
        dirty.clear();
        failures = if failed { failures + 1 } else { 0 };
        let poll = if failed {
            Duration::from_millis(100 * 2u64.pow(failures.min(5)))
        } else {
            shared.poll_interval()
        };
        let mut until = Instant::now() + poll;
        if let Some(due) = next_due {
            let in_ms = u64::try_from((due - now_ms()).max(0)).unwrap_or(0);
            until = until.min(Instant::now() + Duration::from_millis(in_ms));
        }
        let all = || {
            queues
                .iter()
                .map(|q| q.name.clone())
                .collect::<HashSet<_>>()
        };
        // Wait for something relevant, then take every wake-up already queued
        // so that a burst of them costs one claim per queue.
        tokio::select! {
            _ = tokio::time::sleep_until(until) => dirty = all(),
            _ = stopping.changed() => return,
            _ = async {
                loop {
                    match wakeups.recv().await {
                        Ok(Wakeup::Queue(q)) if queues.iter().any(|s| s.name == q) => { dirty.extend(sharing_limits(&queues, &q)); return; }
                        Ok(_) => {}
                        Err(RecvError::Lagged(_)) => { dirty = all(); return; }
                        Err(RecvError::Closed) => std::future::pending::<()>().await,
                    }
                }
            } => {}
        }
        loop {
            match wakeups.try_recv() {
                Ok(Wakeup::Queue(q)) if queues.iter().any(|s| s.name == q) => {
                    dirty.extend(sharing_limits(&queues, &q));
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => dirty = all(),
                Err(_) => break,
            }
        }
    }
}

/// Claims from one queue until it yields less than a batch; returns the next
/// not-before time to wake up for, if the queue has scheduled work.
async fn claim_queue(shared: &Arc<Shared>, spec: &QueueSpec) -> Result<Option<i64>, StoreError> {
    let config = &shared.config;
    loop {
        if shared.is_stopping() || !shared.lease_live() {
            return Ok(None);
        }
        let claimed = shared
            .store
            .claim(
                &spec.name,
                &config.executor_id,
                spec.limits(),
                now_ms(),
                config.claim_batch,
            )
            .await?;
        let count = claimed.len() as u32;
        for record in claimed {
            spawn_run(shared, record);
        }
        if count == 0 {
            // Idle or blocked: learn when scheduled work becomes due.
            return shared.store.next_not_before(&spec.name, now_ms()).await;
        }
        if count < config.claim_batch {
            return Ok(None);
        }
    }
}

/// `queue` and the queues of its limit group: a slot freed on one may be taken by any.
fn sharing_limits(queues: &[QueueSpec], queue: &str) -> Vec<String> {
    let group = queues
        .iter()
        .find(|q| q.name == queue)
        .and_then(|q| q.group.as_ref())
        .map(|g| g.name.as_str());
    queues
        .iter()
        .filter(|q| {
            q.name == queue
                || (group.is_some() && q.group.as_ref().map(|g| g.name.as_str()) == group)
        })
        .map(|q| q.name.clone())
        .collect()
}

fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

// A poisoned lock means a panic while holding it; the data is still usable
// for our purposes (maps of handles), so recover rather than cascade.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}
fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|p| p.into_inner())
}
