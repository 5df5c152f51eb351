//! What operators see of the fleet (docs/cli.md), built from engine records: workers,
//! queues, tenants and applications (with their live versions), as this crate's types
//! (`manent-api` turns them into the contract's).

use std::collections::BTreeMap;

use manent_config::Config;
use manent_engine::{Client, EngineError, ExecutorState, RunningCount, now_ms};

pub use crate::history::LiveVersion;
use crate::{
    history::live_version,
    queues::{DEPLOY_LIMIT_GROUP, DeclaredQueue, QueueKind, declared_queues},
};

pub use crate::request::rfc3339;

/// What a worker is, as shown: the state it last recorded, or dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerState {
    Running,
    Draining,
    Stopped,
    /// Its lease still looks live, but it stopped answering: its liveness lock is free (its
    /// PostgreSQL session gone, its OS file lock on SQLite free) or its pid on this host is
    /// gone. Killed, most likely; dead once `recovery.stale_after` passes.
    Suspect,
    /// Silent for longer than `recovery.stale_after` without a recorded stop: killed,
    /// frozen or cut off. What it recorded last (running, draining) is not true any more.
    Dead,
}

impl WorkerState {
    /// `recorded`, or dead for a worker silent past `stale_after` that did not stop, or
    /// suspect for one that stopped answering before.
    pub fn of(
        recorded: ExecutorState,
        silent_past_stale_after: bool,
        suspect: bool,
    ) -> WorkerState {
        match recorded {
            ExecutorState::Stopped => WorkerState::Stopped,
            _ if silent_past_stale_after => WorkerState::Dead,
            _ if suspect => WorkerState::Suspect,
            ExecutorState::Running => WorkerState::Running,
            ExecutorState::Draining => WorkerState::Draining,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Running => "running",
            WorkerState::Draining => "draining",
            WorkerState::Stopped => "stopped",
            WorkerState::Suspect => "suspect",
            WorkerState::Dead => "dead",
        }
    }

    /// Running or draining: it may still take or finish work.
    pub fn is_live(self) -> bool {
        matches!(self, WorkerState::Running | WorkerState::Draining)
    }
}

/// One worker (executor), as `manent workers` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerView {
    pub executor_id: String,
    pub host: String,
    pub region: Option<String>,
    /// The state it last recorded for itself, or dead.
    pub state: WorkerState,
    pub heartbeat_at: String,
    /// Workflows it holds.
    pub running: i64,
    pub pid: i64,
    pub started_at: String,
    /// The queues it dequeues (internal ones left out).
    pub queues: Vec<String>,
    pub heartbeat_age_secs: i64,
    /// Not stopped, but silent for longer than `recovery.stale_after`.
    pub stale: bool,
    /// The worker's manent version.
    pub version: String,
}

/// A queue's kind as shown: one this build knows, or the text a worker of another
/// version registered, kept as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShownKind {
    Known(QueueKind),
    Other(String),
}

impl ShownKind {
    pub fn as_str(&self) -> &str {
        match self {
            ShownKind::Known(kind) => kind.as_str(),
            ShownKind::Other(text) => text,
        }
    }
}

/// One queue, as `manent queues` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueView {
    pub name: String,
    pub kind: ShownKind,
    /// The most deploys of this queue one worker runs at once.
    pub concurrency: u32,
    /// Per `<application>/<environment>`, across workers.
    pub environment_concurrency: u32,
    /// The most deploys of this queue running at once in total; 0 = no limit.
    pub global_concurrency: u32,
    pub enqueued: i64,
    pub running: i64,
    /// Executor ids of the live workers that dequeue it.
    pub workers: Vec<String>,
    /// A routed queue's own `concurrency`; `None` for other queues.
    pub queue_concurrency: Option<u32>,
    /// Every limit a claim from this queue checks, with its current use.
    pub limits: Vec<LimitUse>,
}

/// One limit and how much of it is used now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitUse {
    /// The configuration key that sets it.
    pub key: String,
    /// What it counts, in words.
    pub counts: String,
    /// The limit; `None` = none.
    pub limit: Option<u32>,
    /// The current count: the busiest worker or environment, or the total.
    pub in_use: i64,
    /// Current counts per worker or per `<application>/<environment>`; empty for totals.
    pub by: BTreeMap<String, i64>,
}

/// One tenant, as `manent tenants` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantView {
    pub name: String,
    /// Its dedicated queue (`tenants[].queue`), if any.
    pub queue: Option<String>,
    /// Whether `manent.yml` declares it (else it only has environment files).
    pub declared: bool,
    pub applications: Vec<String>,
}

/// One application, as `manent apps` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplicationView {
    /// `tenant/app`.
    pub application: String,
    pub tenant: String,
    pub environments: Vec<String>,
    /// By environment, the version live there; environments without one are absent.
    pub live: BTreeMap<String, LiveVersion>,
}

/// A queue operators never see: the engine's and manent's own (the gate queue).
fn is_internal_queue(name: &str) -> bool {
    name.starts_with("manent.")
}

/// The workers, but those stopped or dead for longer than `recovery.forget_after` that
/// hold nothing (one that still holds deploys stays listed: someone must recover them).
pub async fn workers(client: &Client, config: &Config) -> Result<Vec<WorkerView>, EngineError> {
    let now = now_ms();
    let millis = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let stale_ms = millis(config.recovery.stale_after);
    let forget_ms = millis(config.recovery.forget_after);
    let mut shown = Vec::new();
    for e in client.executors().await? {
        let age = (now - e.heartbeat_at_ms).max(0);
        let stale = e.state != ExecutorState::Stopped && age > stale_ms;
        // One look at the lease (and its lock) per worker that says it runs.
        let suspect = if e.state != ExecutorState::Stopped && !stale {
            match client.executor_lease(&e.id).await? {
                Some(lease) => client.executor_suspect(&lease).await?,
                None => false,
            }
        } else {
            false
        };
        let state = WorkerState::of(e.state, stale, suspect);
        // A stopped worker's last heartbeat is its stop.
        let gone_for = (now - e.stopped_at_ms.unwrap_or(e.heartbeat_at_ms)).max(0);
        if !state.is_live()
            && state != WorkerState::Suspect
            && gone_for > forget_ms
            && e.running == 0
        {
            continue;
        }
        shown.push(WorkerView {
            stale,
            executor_id: e.id,
            host: e.host,
            region: e.region,
            state,
            heartbeat_at: rfc3339(e.heartbeat_at_ms),
            running: e.running,
            pid: e.pid,
            started_at: rfc3339(e.started_at_ms),
            queues: e
                .queues
                .into_iter()
                .filter(|q| !is_internal_queue(q))
                .collect(),
            heartbeat_age_secs: age / 1000,
            version: e.version,
        });
    }
    Ok(shown)
}

/// Declared queues (routed ones show while empty and without workers), plus
/// any queue a worker registered (region queues), with depths, servers and
/// the use of their limits. Internal queues (the gate) are left out.
pub async fn queues(client: &Client, config: &Config) -> Result<Vec<QueueView>, EngineError> {
    let depths = client.queue_depths().await?;
    let running = client.running_counts().await?;
    let live: Vec<_> = workers(client, config)
        .await?
        .into_iter()
        .filter(|w| w.state.is_live())
        .collect();
    let mut views: Vec<QueueView> = declared_queues(config)
        .into_iter()
        .map(|q| QueueView {
            name: q.name.clone(),
            kind: ShownKind::Known(q.kind),
            concurrency: q.worker_cap(),
            environment_concurrency: q.environment_concurrency,
            global_concurrency: q.total_cap(),
            enqueued: 0,
            running: 0,
            workers: Vec::new(),
            queue_concurrency: q.queue_concurrency,
            limits: limit_uses(&q, &running),
        })
        .collect();
    for registered in client.queues().await? {
        if is_internal_queue(&registered.name) || views.iter().any(|v| v.name == registered.name) {
            continue;
        }
        let limit = |v: Option<i64>| v.and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
        // A kind this build does not know (a newer worker's) is shown as registered; its
        // limits are counted as a default queue's.
        let known: Option<QueueKind> =
            serde_json::from_value(serde_json::Value::String(registered.kind.clone())).ok();
        let shown_kind = known.map_or_else(
            || ShownKind::Other(registered.kind.clone()),
            ShownKind::Known,
        );
        let declared = DeclaredQueue {
            name: registered.name.clone(),
            kind: known.unwrap_or(QueueKind::Default),
            concurrency: limit(registered.worker_concurrency),
            environment_concurrency: limit(registered.partition_concurrency),
            global_concurrency: u32::try_from(registered.global_concurrency).unwrap_or(0),
            queue_concurrency: None,
        };
        views.push(QueueView {
            kind: shown_kind,
            concurrency: declared.concurrency,
            environment_concurrency: declared.environment_concurrency,
            global_concurrency: declared.global_concurrency,
            name: registered.name,
            enqueued: 0,
            running: 0,
            workers: Vec::new(),
            queue_concurrency: None,
            limits: limit_uses(&declared, &running),
        });
    }
    for view in &mut views {
        if let Some(d) = depths.iter().find(|d| d.queue == view.name) {
            view.enqueued = d.enqueued;
            view.running = d.running;
        }
        view.workers = live
            .iter()
            .filter(|w| w.queues.contains(&view.name))
            .map(|w| w.executor_id.clone())
            .collect();
    }
    Ok(views)
}

/// The limits a claim from `queue` checks and their use now: the deploy
/// limits counted over every deploy queue (or, for a region queue, over
/// itself), and a routed queue's own cap.
fn limit_uses(queue: &DeclaredQueue, running: &[RunningCount]) -> Vec<LimitUse> {
    let (scope, over): (Vec<&RunningCount>, &str) = if queue.in_deploy_group() {
        (
            running
                .iter()
                .filter(|r| r.group.as_deref() == Some(DEPLOY_LIMIT_GROUP))
                .collect(),
            "over all deploy queues",
        )
    } else {
        (
            running.iter().filter(|r| r.queue == queue.name).collect(),
            "on this queue",
        )
    };
    let per_worker = |rows: &[&RunningCount]| {
        let mut by = BTreeMap::new();
        for r in rows {
            *by.entry(r.executor_id.clone().unwrap_or_default())
                .or_insert(0) += r.running;
        }
        by
    };
    let busiest = |by: &BTreeMap<String, i64>| by.values().copied().max().unwrap_or(0);
    let total = |rows: &[&RunningCount]| rows.iter().map(|r| r.running).sum::<i64>();
    let by_worker = per_worker(&scope);
    let mut by_environment = BTreeMap::new();
    for r in &scope {
        *by_environment.entry(r.partition_key.clone()).or_insert(0) += r.running;
    }
    let mut uses = vec![
        LimitUse {
            key: "dbos.concurrency".into(),
            counts: format!("deploys running on each worker, {over}"),
            limit: Some(queue.concurrency),
            in_use: busiest(&by_worker),
            by: by_worker,
        },
        LimitUse {
            key: "dbos.environment_concurrency".into(),
            counts: format!("deploys of each <application>/<environment> at once, {over}"),
            limit: Some(queue.environment_concurrency),
            in_use: busiest(&by_environment),
            by: by_environment,
        },
        LimitUse {
            key: "dbos.global_concurrency".into(),
            counts: format!("deploys running in total, {over}"),
            limit: (queue.global_concurrency > 0).then_some(queue.global_concurrency),
            in_use: total(&scope),
            by: BTreeMap::new(),
        },
    ];
    if let Some(cap) = queue.queue_concurrency {
        let own: Vec<&RunningCount> = running.iter().filter(|r| r.queue == queue.name).collect();
        uses.push(LimitUse {
            key: "queues[].concurrency".into(),
            counts: "deploys of this queue running in total (and on each worker)".into(),
            limit: Some(cap),
            in_use: total(&own),
            by: per_worker(&own),
        });
    }
    uses
}

/// Why the applications or tenants (`manent apps`, `manent tenants`) cannot be shown.
#[derive(Debug, thiserror::Error)]
pub enum ApplicationsError {
    /// The environments source cannot be listed: its applications are unknown, not none.
    #[error(transparent)]
    Source(#[from] manent_model::EnvironmentsSourceUnreadable),
    /// The engine's records (the live versions) cannot be read.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// The applications of the environments source, with their environments.
pub fn applications(config: &Config) -> Result<Vec<ApplicationView>, ApplicationsError> {
    Ok(
        manent_model::list_applications(&config.environments_source())?
            .into_iter()
            .map(|(application, environments)| ApplicationView {
                tenant: application
                    .split_once('/')
                    .map_or("", |(t, _)| t)
                    .to_string(),
                application,
                environments,
                live: BTreeMap::new(),
            })
            .collect(),
    )
}

/// The applications `visible` admits, with the version live in each of their environments
/// (`manent apps`).
pub async fn applications_live(
    client: &Client,
    config: &Config,
    visible: &(dyn Fn(&str) -> bool + Sync),
) -> Result<Vec<ApplicationView>, ApplicationsError> {
    // The environments source is a directory tree: read off the async threads.
    let owned = config.clone();
    let mut apps = tokio::task::spawn_blocking(move || applications(&owned))
        .await
        .map_err(|e| {
            EngineError::InvalidInput(format!("reading the environments source: {e}"))
        })??;
    apps.retain(|a| visible(&a.application));
    for app in &mut apps {
        for environment in &app.environments {
            if let Some(live) = live_version(client, &app.application, environment).await? {
                app.live.insert(environment.clone(), live);
            }
        }
    }
    Ok(apps)
}

/// The tenants of `manent.yml` and of the environments source, with their applications.
pub fn tenants(config: &Config) -> Result<Vec<TenantView>, ApplicationsError> {
    let apps = applications(config)?;
    let mut names: Vec<String> = config.tenants.iter().map(|t| t.name.clone()).collect();
    names.extend(apps.iter().map(|a| a.tenant.clone()));
    names.sort();
    names.dedup();
    Ok(names
        .into_iter()
        .map(|name| {
            let declared = config.tenants.iter().find(|t| t.name == name);
            TenantView {
                queue: declared.and_then(|t| t.queue.clone()),
                declared: declared.is_some(),
                applications: apps
                    .iter()
                    .filter(|a| a.tenant == name)
                    .map(|a| a.application.clone())
                    .collect(),
                name,
            }
        })
        .collect())
}
