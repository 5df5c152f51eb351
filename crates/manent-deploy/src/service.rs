//! Deploys as the API and CLI see them: submission (parse, resolve, route,
//! enqueue), and the status, list, logs and activity views of PRODUCT §11.

use manent_config::Config;
use manent_engine::{
    Client, EngineError, EnqueueRequest, StepRecord, WorkflowFilter, WorkflowRecord,
    WorkflowStatus, now_ms,
};
use manent_model::{
    EffectiveDescriptor, ModelError, Route, load_environment, parse_descriptor, route,
};
use serde::{Deserialize, Serialize};

use crate::{
    schedules,
    targets::TargetOutcome,
    views::rfc3339,
    workflow::{DEPLOY_WORKFLOW, DeployRequest, Runtime},
};

/// Why a submission was refused.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The descriptor is malformed; names the field and line.
    #[error("{message}")]
    Invalid {
        field: Option<String>,
        message: String,
    },
    /// The application or environment has no environment file.
    #[error("{0}")]
    UnknownEnvironment(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// `{"id", "status", "queue"}` of a submission.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Submitted {
    pub id: String,
    pub status: String,
    pub queue: String,
}

/// Parses, resolves, routes and enqueues a deploy. The route is decided
/// here, once, and recorded in the request.
pub async fn submit(
    client: &Client,
    config: &Config,
    text: &str,
    file_name: &str,
    force_dry_run: bool,
    submitted_by: &str,
) -> Result<Submitted, SubmitError> {
    let mut descriptor = parse_descriptor(text, file_name).map_err(invalid)?;
    if force_dry_run {
        descriptor.dry_run = true;
    }
    let source = config.environments_source();
    let env = load_environment(&source, &descriptor.application, &descriptor.environment);
    if let Err(e) = &env {
        let path = manent_model::environment_path(
            &source,
            &descriptor.application,
            &descriptor.environment,
        );
        if e.is_environment_unavailable() && !path.exists() {
            return Err(SubmitError::UnknownEnvironment(format!(
                "unknown application or environment `{}` / `{}`: no environment file at {}",
                descriptor.application,
                descriptor.environment,
                path.display()
            )));
        }
        if !e.is_environment_unavailable() {
            return Err(invalid(e.clone()));
        }
    }
    let route: Route = route(config, &descriptor, env.as_ref());
    let effective = match &env {
        Ok(env) => Some(EffectiveDescriptor::build(&descriptor, env).map_err(invalid)?),
        Err(_) => None,
    };
    let schedule = descriptor.schedule.clone().unwrap_or_default();
    if let Some(cron) = &schedule.cron {
        let timezone = schedule.timezone.as_deref().unwrap_or("UTC");
        if let Err(message) = schedules::parse_cron(cron) {
            return Err(SubmitError::Invalid {
                field: Some("schedule.cron".into()),
                message: format!("schedule.cron: `{cron}` {message}"),
            });
        }
        if let Err(message) = schedules::parse_timezone(timezone) {
            return Err(SubmitError::Invalid {
                field: Some("schedule.timezone".into()),
                message: format!("schedule.timezone: {message}"),
            });
        }
        let record = schedules::create(
            client,
            descriptor,
            effective,
            route,
            cron,
            timezone,
            schedule.missed_policy(),
            submitted_by,
        )
        .await?;
        return Ok(Submitted {
            id: record.id,
            status: "SCHEDULED".into(),
            queue: record.route.queue,
        });
    }
    let not_before = match &schedule.at {
        Some(at) => Some(parse_at(at).map_err(|message| SubmitError::Invalid {
            field: Some("schedule.at".into()),
            message: format!("schedule.at: `{at}` {message}"),
        })?),
        None => None,
    };
    let partition = manent_model::partition_key(&descriptor.application, &descriptor.environment);
    let request = DeployRequest {
        descriptor,
        effective,
        route: route.clone(),
        submitted_by: submitted_by.to_string(),
        submitted_at_ms: now_ms(),
    };
    let mut enqueue =
        EnqueueRequest::new(DEPLOY_WORKFLOW, &route.queue, &request).partition(partition);
    if let Some(at_ms) = not_before {
        // ENQUEUED (phase `scheduled`) until then, then started through the same queue and limits.
        enqueue = enqueue.not_before(at_ms);
    }
    let record = client.enqueue(enqueue).await?;
    Ok(Submitted {
        id: record.id,
        status: record.status.to_string(),
        queue: record.queue,
    })
}

/// `schedule.at` (RFC 3339, already validated by the model) in unix milliseconds.
fn parse_at(at: &str) -> Result<i64, String> {
    let normalised = at.replacen(['t', ' '], "T", 1);
    chrono::DateTime::parse_from_rfc3339(&normalised)
        .map(|t| t.timestamp_millis())
        .map_err(|e| format!("is not a date-time ({e}); write e.g. 2025-03-01T02:00:00Z"))
}

fn invalid(e: ModelError) -> SubmitError {
    let field = e
        .issues()
        .first()
        .map(|i| i.field.clone())
        .filter(|f| !f.is_empty());
    SubmitError::Invalid {
        field,
        message: e.to_string(),
    }
}

/// One step of a deploy, as status shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepView {
    pub name: String,
    pub status: String,
    pub attempts: i64,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub executor_id: String,
    pub error: Option<String>,
}

/// One target of a deploy, as status shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetView {
    pub name: String,
    pub status: String,
    pub detail: Option<String>,
}

/// A deploy's status (PRODUCT §11).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeployStatus {
    pub id: String,
    pub application: String,
    pub environment: String,
    pub version: String,
    pub status: String,
    /// scheduled, queued, running (or the workflow's own phase), done.
    pub phase: String,
    pub queue: String,
    pub route_kind: String,
    pub executor_id: Option<String>,
    pub dry_run: bool,
    pub targets: Vec<TargetView>,
    pub steps: Vec<StepView>,
    pub error: Option<String>,
    pub submitted_by: String,
    pub created_at: String,
    pub updated_at: String,
}

fn request_of(record: &WorkflowRecord) -> Option<DeployRequest> {
    serde_json::from_str(&record.input).ok()
}

fn summary(record: &WorkflowRecord, phase_event: Option<String>) -> Option<DeployStatus> {
    let request = request_of(record)?;
    let d = &request.descriptor;
    let phase = match record.status {
        WorkflowStatus::Enqueued if record.not_before_ms > now_ms() => "scheduled".to_string(),
        WorkflowStatus::Enqueued => "queued".to_string(),
        WorkflowStatus::Pending => phase_event.unwrap_or_else(|| "running".into()),
        _ => "done".to_string(),
    };
    Some(DeployStatus {
        id: record.id.clone(),
        application: d.application.clone(),
        environment: d.environment.clone(),
        version: d
            .artifacts
            .first()
            .map(|a| a.version.clone())
            .unwrap_or_default(),
        status: record.status.to_string(),
        phase,
        queue: record.queue.clone(),
        route_kind: request.route.kind.as_str().to_string(),
        executor_id: record.executor_id.clone(),
        dry_run: request.effective.as_ref().map_or(d.dry_run, |e| e.dry_run),
        targets: request
            .effective
            .as_ref()
            .map(|e| {
                e.targets
                    .iter()
                    .map(|t| TargetView {
                        name: t.name.clone(),
                        status: "pending".into(),
                        detail: None,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        steps: Vec::new(),
        error: record.error.clone(),
        submitted_by: request.submitted_by.clone(),
        created_at: rfc3339(record.created_at_ms),
        updated_at: rfc3339(record.updated_at_ms),
    })
}

fn step_view(s: StepRecord) -> StepView {
    StepView {
        name: s.name,
        status: s.status.to_string(),
        attempts: s.attempts,
        started_at: rfc3339(s.started_at_ms),
        finished_at: s.finished_at_ms.map(rfc3339),
        executor_id: s.executor_id,
        error: s.error,
    }
}

/// The full status of one deploy, or `None` if there is no such deploy.
pub async fn status(client: &Client, id: &str) -> Result<Option<DeployStatus>, EngineError> {
    let Some(record) = client.get(id).await? else {
        return Ok(None);
    };
    if record.name != DEPLOY_WORKFLOW {
        return Ok(None);
    }
    let events = client.events(id).await?;
    let phase = events
        .iter()
        .find(|e| e.key == "phase")
        .and_then(|e| serde_json::from_str(&e.value).ok());
    let Some(mut view) = summary(&record, phase) else {
        return Ok(None);
    };
    for e in events.iter().filter(|e| e.key.starts_with("target:")) {
        if let Ok(outcome) = serde_json::from_str::<TargetOutcome>(&e.value) {
            match view.targets.iter_mut().find(|t| t.name == outcome.name) {
                Some(t) => {
                    t.status = outcome.status;
                    t.detail = outcome.detail;
                }
                None => view.targets.push(TargetView {
                    name: outcome.name,
                    status: outcome.status,
                    detail: outcome.detail,
                }),
            }
        }
    }
    // The engine's own bookkeeping (events, sleeps) is not a step of the deploy.
    view.steps = client
        .steps(id)
        .await?
        .into_iter()
        .filter(|s| !s.name.starts_with("manent."))
        .map(step_view)
        .collect();
    Ok(Some(view))
}

/// Filters of the deploy list.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ListFilter {
    pub application: Option<String>,
    pub environment: Option<String>,
    pub status: Option<String>,
    pub limit: Option<i64>,
}

pub async fn list(client: &Client, filter: &ListFilter) -> Result<Vec<DeployStatus>, EngineError> {
    let status = match filter.status.as_deref() {
        Some(s) => Some(s.to_ascii_uppercase().parse().map_err(|_| {
            EngineError::InvalidInput(format!(
                "unknown status `{s}`: use ENQUEUED, PENDING, SUCCESS, ERROR or CANCELLED"
            ))
        })?),
        None => None,
    };
    let limit = filter.limit.unwrap_or(50).clamp(1, 1000);
    // Application filters apply to the request; read more rows than asked to fill the page.
    let records = client
        .list(&WorkflowFilter {
            status,
            name: Some(DEPLOY_WORKFLOW.into()),
            limit: Some(limit * 10),
            ..Default::default()
        })
        .await?;
    Ok(records
        .iter()
        .filter_map(|r| summary(r, None))
        .filter(|d| {
            filter
                .application
                .as_ref()
                .is_none_or(|a| &d.application == a)
        })
        .filter(|d| {
            filter
                .environment
                .as_ref()
                .is_none_or(|e| &d.environment == e)
        })
        .take(usize::try_from(limit).unwrap_or(50))
        .collect())
}

/// Log lines of a deploy: its steps in order, with their outcomes.
pub async fn logs(client: &Client, id: &str) -> Result<Option<Vec<String>>, EngineError> {
    let Some(view) = status(client, id).await? else {
        return Ok(None);
    };
    let mut lines: Vec<String> = vec![format!(
        "{} submitted by {} to queue {}",
        view.created_at, view.submitted_by, view.queue
    )];
    for s in &view.steps {
        let when = s.finished_at.as_deref().unwrap_or(&s.started_at);
        let error = s
            .error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        lines.push(format!(
            "{when} [{}] {} {} (attempts {}){error}",
            s.executor_id, s.name, s.status, s.attempts
        ));
    }
    for t in &view.targets {
        lines.push(format!(
            "target {}: {}{}",
            t.name,
            t.status,
            t.detail
                .as_deref()
                .map(|d| format!(" — {d}"))
                .unwrap_or_default()
        ));
    }
    lines.push(format!(
        "{} {} phase {}",
        view.updated_at, view.status, view.phase
    ));
    Ok(Some(lines))
}

/// Which worker runs each active deploy, then the most recent ones.
pub async fn activity(client: &Client) -> Result<Vec<DeployStatus>, EngineError> {
    let mut out = Vec::new();
    for status in [WorkflowStatus::Pending, WorkflowStatus::Enqueued] {
        let records = client
            .list(&WorkflowFilter {
                status: Some(status),
                name: Some(DEPLOY_WORKFLOW.into()),
                limit: Some(200),
                ..Default::default()
            })
            .await?;
        for r in &records {
            let phase = client.event::<String>(&r.id, "phase").await.ok().flatten();
            out.extend(summary(r, phase));
        }
    }
    let recent = client
        .list(&WorkflowFilter {
            name: Some(DEPLOY_WORKFLOW.into()),
            limit: Some(20),
            ..Default::default()
        })
        .await?;
    for r in recent.iter().filter(|r| r.status.is_terminal()) {
        out.extend(summary(r, None));
    }
    Ok(out)
}

/// The effective descriptor of the last successful (not dry-run) deploy of
/// the same application and environment, other than `deploy_id`.
pub async fn previous_success(
    rt: &Runtime,
    eff: &EffectiveDescriptor,
    deploy_id: &str,
) -> Result<Option<EffectiveDescriptor>, String> {
    let records = rt
        .client
        .list(&WorkflowFilter {
            status: Some(WorkflowStatus::Success),
            name: Some(DEPLOY_WORKFLOW.into()),
            limit: Some(500),
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    Ok(records
        .iter()
        .filter(|r| r.id != deploy_id)
        .filter_map(request_of)
        .filter_map(|r| r.effective)
        .find(|p| {
            p.application == eff.application && p.environment == eff.environment && !p.dry_run
        }))
}

#[cfg(test)]
mod tests {
    use super::parse_at;

    #[test]
    fn schedule_at_is_read_with_its_offset() {
        assert_eq!(parse_at("2030-01-01T00:00:00Z"), Ok(1_893_456_000_000));
        assert_eq!(parse_at("2030-01-01T01:00:00+01:00"), Ok(1_893_456_000_000));
        assert_eq!(
            parse_at("2030-01-01 01:00:00.250+01:00"),
            Ok(1_893_456_000_250)
        );
        assert_eq!(parse_at("2030-01-01t00:00:00z"), Ok(1_893_456_000_000));
        assert!(parse_at("tomorrow").is_err());
    }
}
