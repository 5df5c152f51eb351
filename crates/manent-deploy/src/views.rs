//! What operators see of the fleet (docs/cli.md), built from engine records: workers,
//! queues, tenants and applications (with their live versions), as the contract's types.

use std::collections::BTreeMap;

use manent_config::Config;
pub use manent_contract::{
    ApplicationView, LimitUse, LiveVersion, QueueView, TenantView, WorkerState, WorkerView,
};
use manent_engine::{Client, EngineError, ExecutorState, RunningCount, now_ms};

use crate::{
    history::live_version,
    queues::{DEPLOY_LIMIT_GROUP, DeclaredQueue, QueueKind, declared_queues},
};

pub use crate::request::rfc3339;

/// A queue operators never see: the engine's and manent's own (the gate queue).
fn is_internal_queue(name: &str) -> bool {
    name.starts_with("manent.")
}

pub async fn workers(client: &Client, config: &Config) -> Result<Vec<WorkerView>, EngineError> {
    let now = now_ms();
    let stale_ms = i64::try_from(config.recovery.stale_after.as_millis()).unwrap_or(i64::MAX);
    Ok(client
        .executors()
        .await?
        .into_iter()
        .map(|e| {
            let age = (now - e.heartbeat_at_ms).max(0);
            WorkerView {
                stale: e.state != ExecutorState::Stopped && age > stale_ms,
                executor_id: e.id,
                host: e.host,
                region: e.region,
                state: WorkerState::from(e.state.as_str()),
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
            }
        })
        .collect())
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
        .filter(|w| w.state != WorkerState::Stopped && !w.stale)
        .collect();
    let mut views: Vec<QueueView> = declared_queues(config)
        .into_iter()
        .map(|q| QueueView {
            name: q.name.clone(),
            kind: contract_kind(q.kind),
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
        let shown_kind = manent_contract::QueueKind::from(registered.kind.as_str());
        let declared = DeclaredQueue {
            name: registered.name.clone(),
            kind: serde_json::from_value(serde_json::Value::String(registered.kind.clone()))
                .unwrap_or(QueueKind::Default),
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

/// The contract's name of a queue kind.
pub fn contract_kind(kind: QueueKind) -> manent_contract::QueueKind {
    manent_contract::QueueKind::from(kind.as_str())
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
