//! Drift (docs/plan-and-drift.md): each target of an environment compared with the
//! release manent recorded there (`manifests`), by a durable workflow `manent.drift` that
//! the workers of the environment's queue run (only they reach its targets), `max_parallel`
//! targets at a time; its result kept per environment (one record each, the newest), and
//! `drift_detected` told once per difference not reported before.
//!
//! - `compare`: a manifest against what a target holds now.
//! - `check`: the workflow, one step per target, and recording its result.
//! - `reconcile`: the live version deployed again to the drifted targets only.
//! - `schedule`: `drift: {every}`, checks started on a schedule by every worker, each slot
//!   once whichever worker starts it.
//!
//! It depends on `manifests`, `containers` (a container's manifest), `run`, `history`,
//! `notifications`, `request`, `submission`
//! and `workflow`
//! (how a worker reaches targets); the API and the workers call it.

pub mod check;
pub mod compare;
pub mod reconcile;
pub mod schedule;

use std::time::Duration;

use manent_engine::{Client, EngineError, EnqueueRequest, WorkflowStatus};
use serde::{Deserialize, Serialize};

pub use check::register;
pub use compare::Difference;

pub use crate::request::DRIFT_WORKFLOW;

/// The kind of the records holding each environment's last drift result, keyed
/// `<application>/<environment>`.
pub const DRIFT_KIND: &str = "manent.drift";

/// Where a target stands against its recorded release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DriftState {
    InSync,
    Drifted,
    Unreachable,
    /// No manifest recorded yet (no deploy under workflow version 6 reached it), or one
    /// too large to compare.
    Unknown,
}

impl DriftState {
    pub fn as_str(self) -> &'static str {
        match self {
            DriftState::InSync => "in_sync",
            DriftState::Drifted => "drifted",
            DriftState::Unreachable => "unreachable",
            DriftState::Unknown => "unknown",
        }
    }
}

/// One target's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetDrift {
    pub name: String,
    pub state: DriftState,
    #[serde(default)]
    pub differences: Vec<Difference>,
    /// Why `unreachable` or `unknown`; the version recorded otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The version the recorded release holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// One environment's drift, as a check found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriftReport {
    pub application: String,
    pub environment: String,
    /// The check that found it (its workflow id; empty when nothing was deployed).
    pub check_id: String,
    pub checked_at_ms: i64,
    pub targets: Vec<TargetDrift>,
}

impl DriftReport {
    /// The environment's state: `in_sync` when every target is, else the first of
    /// `drifted`, `unreachable`, `unknown` any target is in.
    pub fn state(&self) -> DriftState {
        [
            DriftState::Drifted,
            DriftState::Unreachable,
            DriftState::Unknown,
        ]
        .into_iter()
        .find(|s| self.targets.iter().any(|t| t.state == *s))
        .unwrap_or(DriftState::InSync)
    }

    /// Per drifted target, the files and links found in its release that its manifest does
    /// not hold: what a reconcile removes (a redeploy alone would leave them, and record them).
    pub fn added_files(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        self.targets
            .iter()
            .filter(|t| t.state == DriftState::Drifted)
            .map(|t| {
                let added = t.differences.iter().filter(|d| {
                    d.expected.is_none()
                        && d.found
                            .as_deref()
                            .is_some_and(|f| f.starts_with("sha256:") || f.starts_with("-> "))
                });
                (
                    t.name.clone(),
                    added.map(|d| d.path.clone()).collect::<Vec<_>>(),
                )
            })
            .filter(|(_, added)| !added.is_empty())
            .collect()
    }

    /// The names of the drifted targets.
    pub fn drifted(&self) -> Vec<String> {
        self.targets
            .iter()
            .filter(|t| t.state == DriftState::Drifted)
            .map(|t| t.name.clone())
            .collect()
    }
}

/// What a drift check runs on: the application and environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriftRequest {
    pub application: String,
    pub environment: String,
    /// The queue of the environment's live deploy, where the check runs: under region
    /// routing a region's targets are checked by a pass on `<queue>.<region>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub queue: String,
    /// A region's pass of a check: only these targets, compared and returned to the check
    /// that started it, which records the result.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub only_targets: Vec<String>,
}

/// Why a check could not be started or read.
#[derive(Debug, thiserror::Error)]
pub enum DriftError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("{0}")]
    Environment(String),
    #[error("the drift check {id} ended {status}: {error}")]
    Failed {
        id: String,
        status: String,
        error: String,
    },
    #[error("the recorded drift of {key} cannot be read: {error}")]
    Unreadable { key: String, error: String },
}

/// The key of `application`'s `environment` in [`DRIFT_KIND`].
pub fn key(application: &str, environment: &str) -> String {
    format!("{application}/{environment}")
}

/// The last drift result of `application`'s `environment`, if a check ran.
pub async fn last(
    client: &Client,
    application: &str,
    environment: &str,
) -> Result<Option<DriftReport>, DriftError> {
    let key = key(application, environment);
    let Some(text) = client
        .records()
        .get(DRIFT_KIND, &key)
        .await
        .map_err(EngineError::from)?
    else {
        return Ok(None);
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| DriftError::Unreadable {
            key,
            error: e.to_string(),
        })
}

/// Starts a drift check of `application`'s `environment` on the queue of its live deploy,
/// with id `id` when given (a scheduled slot: started once whichever worker asks). `None`
/// when nothing was deployed there yet: there is nothing to compare with.
pub async fn start(
    client: &Client,
    application: &str,
    environment: &str,
    id: Option<String>,
) -> Result<Option<String>, DriftError> {
    let Some((_, live)) =
        crate::history::last_success(client, application, environment, None).await?
    else {
        return Ok(None);
    };
    let request = DriftRequest {
        application: application.to_string(),
        environment: environment.to_string(),
        queue: live.route.queue.clone(),
        only_targets: Vec::new(),
    };
    let mut enqueue = EnqueueRequest::new(DRIFT_WORKFLOW, live.route.queue.as_str(), &request)
        .partition(format!(
            "drift:{}",
            manent_model::partition_key(application, environment)
        ))
        // Only a worker with this code claims it.
        .version(crate::request::MANIFEST_VERSION);
    if let Some(id) = id {
        enqueue = enqueue.id(id);
    }
    Ok(Some(client.enqueue(enqueue).await?.id))
}

/// Runs a drift check now and waits up to `timeout` for its result. With nothing deployed
/// yet, every target of the environment file is `unknown` and no check runs.
pub async fn check_now(
    client: &Client,
    config: &manent_config::Config,
    application: &str,
    environment: &str,
    timeout: Duration,
) -> Result<DriftReport, DriftError> {
    let Some(id) = start(client, application, environment, None).await? else {
        return nothing_deployed(config, application, environment).await;
    };
    let record = client.wait(&id, timeout).await?;
    if record.status != WorkflowStatus::Success {
        return Err(DriftError::Failed {
            id,
            status: record.status.as_str().to_string(),
            error: record.error.unwrap_or_default(),
        });
    }
    let output = record.output.unwrap_or_default();
    serde_json::from_str(&output).map_err(|e| DriftError::Unreadable {
        key: id,
        error: e.to_string(),
    })
}

/// Every target of the environment file `unknown`: nothing was deployed there yet.
async fn nothing_deployed(
    config: &manent_config::Config,
    application: &str,
    environment: &str,
) -> Result<DriftReport, DriftError> {
    let source = config.environments_source();
    let (app, env) = (application.to_string(), environment.to_string());
    let file =
        tokio::task::spawn_blocking(move || manent_model::load_environment(&source, &app, &env))
            .await
            .map_err(|e| DriftError::Environment(e.to_string()))?
            .map_err(|e| DriftError::Environment(e.to_string()))?;
    Ok(DriftReport {
        application: application.to_string(),
        environment: environment.to_string(),
        check_id: String::new(),
        checked_at_ms: check::now_ms(),
        targets: file
            .targets
            .iter()
            .map(|t| TargetDrift {
                name: t.name.clone(),
                state: DriftState::Unknown,
                differences: Vec::new(),
                detail: Some(format!(
                    "nothing deployed to {application} {environment} yet"
                )),
                version: None,
            })
            .collect(),
    })
}
