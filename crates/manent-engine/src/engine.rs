//! The executor: its configuration, its shared state, launch (resuming its own pending
//! workflows) and drain on shutdown. Each background job has its module: `lease` (the
//! executor id, heartbeat and fencing), `claim` (the claim loop), `run` (one run to its
//! outcome), `watcher` (stopping runs no longer ours) and `recovery` (stale executors).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::{FutureExt, future::BoxFuture};
use serde::{Serialize, de::DeserializeOwned};
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
    time::Instant,
};

use crate::{
    client::Client,
    context::WorkflowContext,
    database::Database,
    error::{EngineError, WorkflowError},
    now_ms,
    store::{
        Checkpoint, ClaimLimits, ExecutorRecord, ExecutorState, Lease, LimitGroup, Liveness,
        QueueRecord, Store, WorkflowVersions, background,
    },
};

mod claim;
mod lease;
pub(crate) use lease::{process_alive, this_host};
mod recovery;
mod run;
mod watcher;

use claim::claim_loop;
use lease::{fence_watchdog, heartbeat_loop};
use recovery::recovery_loop;
use run::spawn_run;
use watcher::run_watcher;

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
    /// The workflow versions this executor's code can replay: it claims and resumes only
    /// those (ARCHITECTURE.md, "Workflow versions"). Default: version 1 only.
    pub workflow_versions: WorkflowVersions,
    /// Bytes of output one run of a workflow may keep, all its steps together
    /// (`worker.max_output_per_deploy`); past it, one line says so.
    pub output_per_run: u64,
}

impl EngineConfig {
    pub fn new(executor_id: impl Into<String>) -> Self {
        EngineConfig {
            executor_id: executor_id.into(),
            host: lease::this_host(),
            region: None,
            version: env!("CARGO_PKG_VERSION").to_string(),
            stale_after: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(5),
            automatic_recovery: false,
            poll_interval: None,
            claim_batch: 64,
            workflow_versions: WorkflowVersions::FIRST,
            output_per_run: crate::output::DEFAULT_OUTPUT_PER_RUN,
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
    /// Set when a workflow of this executor was left without a run because the lease was
    /// not live when it came back (from a claim or a take-over); the next live renewal
    /// starts it (`lease::adopt_orphans`).
    orphaned: AtomicBool,
    /// Notified at each renewal (the fence watchdog waits for it).
    renewed: Notify,
    /// Set once the lease was taken by another process (or revoked): why.
    lost: watch::Sender<Option<String>>,
    /// Called with a workflow's id once the run watcher has stopped its run here
    /// ([`Engine::on_run_stopped`]).
    stopped_hooks: RwLock<Vec<RunStoppedHook>>,
    /// The workflow versions this executor runs: `config.workflow_versions`, or what the
    /// code that registered its workflows declared ([`Engine::run_workflow_versions`]).
    workflow_versions: RwLock<WorkflowVersions>,
}

/// This executor's lease as seen by what a run starts (a command, a plugin process): how
/// long it may still act, and how long such a process may outlive the worker's last word
/// (docs/scaling-and-recovery.md, "A frozen worker's commands"). Cheap to clone; outlives
/// the run's context.
#[derive(Clone)]
pub struct LeaseWindow(Arc<Shared>);

impl LeaseWindow {
    /// How long, from now, this executor may still act on its workflows: the last lease
    /// renewal plus the fence window, minus now; zero once fenced or lost.
    pub fn may_act_for(&self) -> Duration {
        self.0.may_act_for()
    }

    /// How long a process a run started may outlive the worker's last proof of life: half
    /// the fence window, so that it is gone before anyone may run its step again, even if
    /// the worker froze right after a renewal.
    pub fn dead_man_timeout(&self) -> Duration {
        self.0.fence_window() / 2
    }
}

impl std::fmt::Debug for LeaseWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseWindow")
            .field("may_act_for", &self.may_act_for())
            .finish()
    }
}

pub(crate) fn lease_window(shared: &Arc<Shared>) -> LeaseWindow {
    LeaseWindow(shared.clone())
}

/// What [`Engine::on_run_stopped`] registers.
type RunStoppedHook = Arc<dyn Fn(&str) + Send + Sync>;

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

    /// How long, from now, this process may still act on its executor id: zero once
    /// fenced or lost; unbounded for an engine that took no id (tests that never launch).
    pub(crate) fn may_act_for(&self) -> Duration {
        if self.lost.borrow().is_some() || self.self_fenced.load(Ordering::SeqCst) {
            return Duration::ZERO;
        }
        match *lock(&self.act_until) {
            Some(until) => until.saturating_duration_since(Instant::now()),
            None if self.launched.load(Ordering::SeqCst) => Duration::ZERO,
            None => Duration::MAX,
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
    /// Stops this executor's run of `workflow_id`; returns its task, which ends once the
    /// run is dropped (awaiting it tells when nothing of the run acts any more).
    fn stop_run(&self, workflow_id: &str) -> Option<JoinHandle<()>> {
        let run = lock(&self.running).remove(workflow_id)?;
        run.handle.abort();
        self.run_finished.notify_waiters();
        Some(run.handle)
    }

    /// The workflow versions this executor claims, resumes and replays.
    pub(crate) fn workflow_versions(&self) -> WorkflowVersions {
        *read(&self.workflow_versions)
    }

    /// Tells the hooks of [`Engine::on_run_stopped`] that `workflow_id`'s run here is over.
    pub(crate) fn run_stopped(&self, workflow_id: &str) {
        let hooks = read(&self.stopped_hooks).clone();
        for hook in hooks {
            hook(workflow_id);
        }
    }
}

/// A durable workflow executor. Cheap to clone; clones share the executor.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
}

impl Engine {
    pub fn new(database: Database, config: EngineConfig) -> Self {
        let store = database.into_store();
        let workflow_versions = config.workflow_versions;
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
                orphaned: AtomicBool::new(false),
                renewed: Notify::new(),
                lost: watch::channel(None).0,
                stopped_hooks: RwLock::default(),
                workflow_versions: RwLock::new(workflow_versions),
            }),
        }
    }

    pub fn executor_id(&self) -> &str {
        &self.shared.config.executor_id
    }

    /// The storage under the executor: for tests, which check what it wrote.
    #[cfg(feature = "testing")]
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.shared.store
    }

    pub fn client(&self) -> Client {
        Client::on(self.shared.store.clone())
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

    /// Declares the workflow versions this executor's registered code runs, replacing
    /// `EngineConfig::workflow_versions`: the code that registers the workflows knows which
    /// versions it can replay. Takes effect at launch (it is recorded with the executor).
    pub fn run_workflow_versions(&self, versions: WorkflowVersions) {
        *write(&self.shared.workflow_versions) = versions;
    }

    /// Calls `hook` with a workflow's id each time this executor stops a run because its
    /// workflow is no longer this executor's (cancelled, recovered by another executor,
    /// finished elsewhere), once the run's task has ended: nothing of that run acts here
    /// any more. Not called for runs that end by themselves, nor at a drain. The hook must
    /// not block (spawn what takes time).
    pub fn on_run_stopped(&self, hook: impl Fn(&str) + Send + Sync + 'static) {
        write(&self.shared.stopped_hooks).push(Arc::new(hook));
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
                workflow_versions: shared.workflow_versions(),
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

        // What runs while the process is idle shares one connection (`store::background`); a
        // run each loop starts uses the pool. The lease's renewals have the session's own.
        let heartbeat = tokio::spawn(background(heartbeat_loop(shared.clone())));
        let watchdog = tokio::spawn(fence_watchdog(shared.clone()));
        let watcher = tokio::spawn(background(run_watcher(shared.clone())));
        let claimer = tokio::spawn(background(claim_loop(shared.clone())));
        lock(&shared.background).extend([heartbeat, watchdog, watcher, claimer]);
        if config.automatic_recovery {
            let recovery = tokio::spawn(background(recovery_loop(shared.clone())));
            lock(&shared.background).push(recovery);
        }
        tracing::info!(executor_id = %config.executor_id, host = %config.host, queues = ?queues.iter().map(|q| &q.name).collect::<Vec<_>>(), "executor started");
        Ok(())
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
