//! The JSON shapes operators see (docs/cli.md), built from engine records:
//! workers and queues. Field names are a stable interface: add, never rename.

use std::time::{Duration, UNIX_EPOCH};

use manent_config::Config;
use manent_engine::{Client, EngineError, ExecutorState, now_ms};
use serde::{Deserialize, Serialize};

use crate::queues::{QueueKind, declared_queues};

/// RFC 3339 (UTC, milliseconds) of a millisecond timestamp.
pub fn rfc3339(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(t).to_string()
}

/// One worker (executor), as `manent workers` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerView {
    pub executor_id: String,
    pub host: String,
    pub region: Option<String>,
    /// running, draining or stopped, as the worker last recorded it.
    pub state: String,
    pub heartbeat_at: String,
    /// Workflows it holds (PENDING under its id).
    pub running: i64,
    pub pid: i64,
    pub started_at: String,
    pub queues: Vec<String>,
    /// Seconds since the last heartbeat.
    pub heartbeat_age_secs: i64,
    /// Not stopped, but silent for longer than `recovery.stale_after`:
    /// its deploys wait for it to come back or for recovery.
    pub stale: bool,
    pub version: String,
}

/// One queue, as `manent queues` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueView {
    pub name: String,
    pub kind: QueueKind,
    pub concurrency: u32,
    pub environment_concurrency: u32,
    pub global_concurrency: u32,
    pub enqueued: i64,
    pub running: i64,
    /// Executor ids of the live workers that dequeue it.
    pub workers: Vec<String>,
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
                state: e.state.to_string(),
                heartbeat_at: rfc3339(e.heartbeat_at_ms),
                running: e.running,
                pid: e.pid,
                started_at: rfc3339(e.started_at_ms),
                queues: e.queues,
                heartbeat_age_secs: age / 1000,
                version: e.version,
            }
        })
        .collect())
}

/// Declared queues (routed ones show while empty and without workers), plus
/// any queue a worker registered (region queues), with depths and servers.
pub async fn queues(client: &Client, config: &Config) -> Result<Vec<QueueView>, EngineError> {
    let depths = client.queue_depths().await?;
    let live: Vec<_> = workers(client, config)
        .await?
        .into_iter()
        .filter(|w| w.state != "stopped" && !w.stale)
        .collect();
    let mut views: Vec<QueueView> = declared_queues(config)
        .into_iter()
        .map(|q| QueueView {
            name: q.name,
            kind: q.kind,
            concurrency: q.concurrency,
            environment_concurrency: q.environment_concurrency,
            global_concurrency: q.global_concurrency,
            enqueued: 0,
            running: 0,
            workers: Vec::new(),
        })
        .collect();
    for registered in client.queues().await? {
        if views.iter().any(|v| v.name == registered.name) {
            continue;
        }
        let limit = |v: Option<i64>| v.and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
        views.push(QueueView {
            kind: serde_json::from_value(serde_json::Value::String(registered.kind.clone()))
                .unwrap_or(QueueKind::Default),
            concurrency: limit(registered.worker_concurrency),
            environment_concurrency: limit(registered.partition_concurrency),
            global_concurrency: u32::try_from(registered.global_concurrency).unwrap_or(0),
            name: registered.name,
            enqueued: 0,
            running: 0,
            workers: Vec::new(),
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

/// One application, as `manent apps` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApplicationView {
    /// `tenant/app`.
    pub application: String,
    pub tenant: String,
    pub environments: Vec<String>,
}

/// One tenant, as `manent tenants` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantView {
    pub name: String,
    /// Its dedicated queue (`tenants[].queue`), if any.
    pub queue: Option<String>,
    /// Whether `manent.yml` declares it (else it only has environment files).
    pub declared: bool,
    pub applications: Vec<String>,
}

/// The applications of the environments source, with their environments.
pub fn applications(config: &Config) -> Vec<ApplicationView> {
    manent_model::list_applications(&config.environments_source())
        .into_iter()
        .map(|(application, environments)| ApplicationView {
            tenant: application
                .split_once('/')
                .map_or("", |(t, _)| t)
                .to_string(),
            application,
            environments,
        })
        .collect()
}

/// The tenants of `manent.yml` and of the environments source, with their applications.
pub fn tenants(config: &Config) -> Vec<TenantView> {
    let apps = applications(config);
    let mut names: Vec<String> = config.tenants.iter().map(|t| t.name.clone()).collect();
    names.extend(apps.iter().map(|a| a.tenant.clone()));
    names.sort();
    names.dedup();
    names
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
        .collect()
}
