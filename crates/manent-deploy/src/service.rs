//! Deploys as the API and CLI see them: submission (parse, resolve, route,
//! enqueue), and the status, list, logs and activity views of PRODUCT §11.

use manent_config::Config;
use manent_engine::{
    Client, EngineError, EventRecord, StepRecord, WorkflowFilter, WorkflowRecord, WorkflowStatus,
    now_ms,
};
use manent_model::{
    EffectiveDescriptor, ModelError, Route, load_environment, parse_descriptor, route,
};
use serde::{Deserialize, Serialize};

use crate::{
    gate::{self, Decision},
    schedules,
    targets::TargetOutcome,
    views::rfc3339,
    workflow::{DEPLOY_WORKFLOW, DeployRequest, Runtime, Submitter, same_token},
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
    submitted_by: &Submitter,
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
    if let Some(eff) = &effective {
        refuse_dependency_cycle(config, eff)?;
    }
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
    let request = DeployRequest::new(descriptor, effective, route, submitted_by, now_ms());
    let mut enqueue = request.enqueue();
    if let Some(at_ms) = not_before {
        // ENQUEUED (phase `scheduled`) until then, then started through the same queue and limits.
        enqueue = enqueue.not_before(at_ms);
    }
    let record = client.enqueue(enqueue).await?;
    Ok(Submitted {
        id: record.id,
        status: record.status.to_string(),
        queue: request.route.queue,
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
    /// Why the deploy waits, while it waits (approval, dependency); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// Approvals (and a rejection) received, in order: who, when, why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<ApprovalView>,
}

/// One approval or rejection, as status and activity show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalView {
    pub by: String,
    /// `approved` or `rejected`.
    pub decision: String,
    pub reason: Option<String>,
    pub at: String,
}

impl From<Decision> for ApprovalView {
    fn from(d: Decision) -> Self {
        ApprovalView {
            by: d.by,
            decision: if d.approve { "approved" } else { "rejected" }.into(),
            reason: d.reason,
            at: rfc3339(d.at_ms),
        }
    }
}

fn event<T: serde::de::DeserializeOwned>(events: &[EventRecord], key: &str) -> Option<T> {
    events
        .iter()
        .find(|e| e.key == key)
        .and_then(|e| serde_json::from_str(&e.value).ok())
}

fn request_of(record: &WorkflowRecord) -> Option<DeployRequest> {
    serde_json::from_str(&record.input).ok()
}

fn summary(record: &WorkflowRecord, events: &[EventRecord]) -> Option<DeployStatus> {
    let request = request_of(record)?;
    let d = &request.descriptor;
    let phase_event: Option<String> = event(events, "phase");
    let waiting_for = match record.status {
        WorkflowStatus::Enqueued if record.not_before_ms > now_ms() => {
            Some(format!("its start time, {}", rfc3339(record.not_before_ms)))
        }
        WorkflowStatus::Enqueued => Some(format!(
            "a free slot on queue {} (its limits, or no worker serving it)",
            request.route.queue
        )),
        WorkflowStatus::Pending => {
            event::<String>(events, gate::EVENT_WAITING).filter(|w| !w.is_empty())
        }
        _ => None,
    };
    let approvals: Vec<ApprovalView> = event::<Vec<Decision>>(events, gate::EVENT_APPROVALS)
        .unwrap_or_default()
        .into_iter()
        .map(ApprovalView::from)
        .collect();
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
        // The route's queue, also while the deploy waits on the gate queue.
        queue: request.route.queue.clone(),
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
        waiting_for,
        approvals,
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
    let Some(mut view) = summary(&record, &events) else {
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
    let mut views = Vec::new();
    for r in &records {
        // A running deploy's phase (waiting for approval, a wave) lives in its events.
        let events = if r.status == WorkflowStatus::Pending {
            client.events(&r.id).await.unwrap_or_default()
        } else {
            Vec::new()
        };
        views.extend(summary(r, &events));
    }
    Ok(views
        .into_iter()
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
            let events = client.events(&r.id).await.unwrap_or_default();
            out.extend(summary(r, &events));
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
        // Who approved a finished deploy stays part of its activity.
        let events = client.events(&r.id).await.unwrap_or_default();
        out.extend(summary(r, &events));
    }
    Ok(out)
}

/// Who asks to approve or reject a deploy: the API token's name, stable id and role.
#[derive(Debug, Clone)]
pub struct Approver {
    pub name: String,
    /// The token's stable id: the self-approval check and the count of distinct
    /// approvers compare it (empty when unknown: names are compared).
    pub token_id: String,
    pub role: String,
}

/// Why an approval or rejection was refused.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("no deploy `{0}`")]
    NotFound(String),
    /// The deploy does not wait for approval (any more).
    #[error("{0}")]
    NotWaiting(String),
    /// This approver may not decide on this deploy; says what it may not do.
    #[error("may not {0}")]
    Forbidden(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Approves (`approve`) or rejects a deploy waiting for approval: checks that it
/// waits, that `approver` is one of the policy's approvers (by name or role)
/// and not its submitter (unless the policy allows it), then sends the decision.
pub async fn decide(
    client: &Client,
    id: &str,
    approver: &Approver,
    approve: bool,
    reason: Option<String>,
) -> Result<(), DecideError> {
    let Some(record) = client.get(id).await?.filter(|r| r.name == DEPLOY_WORKFLOW) else {
        return Err(DecideError::NotFound(id.to_string()));
    };
    let request = request_of(&record).ok_or_else(|| DecideError::NotFound(id.to_string()))?;
    let events = client.events(id).await?;
    let phase: Option<String> = event(&events, "phase");
    let policy: Option<manent_model::Approval> = event(&events, gate::EVENT_APPROVAL_POLICY);
    let (WorkflowStatus::Pending, Some("waiting_approval"), Some(policy)) =
        (record.status, phase.as_deref(), policy)
    else {
        return Err(DecideError::NotWaiting(format!(
            "deploy {id} is not waiting for approval (status {}, phase {}); nothing to {}",
            record.status,
            phase.as_deref().unwrap_or("none"),
            if approve { "approve" } else { "reject" }
        )));
    };
    if !policy.approvers.is_empty()
        && !policy
            .approvers
            .iter()
            .any(|a| a == &approver.name || a == &approver.role)
    {
        return Err(DecideError::Forbidden(format!(
            "decide on deploys of {}/{}: its approval policy names {} (by token name or role)",
            request.descriptor.application,
            request.descriptor.environment,
            policy.approvers.join(", ")
        )));
    }
    let own_deploy = same_token(
        (&approver.name, &approver.token_id),
        (&request.submitted_by, &request.submitted_by_id),
    );
    if approve && own_deploy && !policy.allow_self_approval {
        return Err(DecideError::Forbidden(format!(
            "approve deploy {id}, which it submitted (the policy's allow_self_approval is false); ask another approver"
        )));
    }
    let decision = Decision {
        by: approver.name.clone(),
        by_id: approver.token_id.clone(),
        approve,
        reason,
        at_ms: now_ms(),
    };
    client.send(id, gate::APPROVAL_TOPIC, &decision).await?;
    Ok(())
}

/// `(application, environment)`.
type AppEnv = (String, String);

/// Refuses a deploy whose dependencies lead back to its own application and
/// environment, following the environment files of the dependencies.
fn refuse_dependency_cycle(config: &Config, eff: &EffectiveDescriptor) -> Result<(), SubmitError> {
    let source = config.environments_source();
    let start = (eff.application.clone(), eff.environment.clone());
    // Depth-first over (application, environment), keeping the path for the message.
    let mut stack: Vec<(Vec<AppEnv>, AppEnv)> = eff
        .depends_on
        .iter()
        .map(|d| {
            (
                vec![start.clone()],
                (d.application.clone(), d.environment.clone()),
            )
        })
        .collect();
    let mut seen = std::collections::HashSet::new();
    while let Some((path, node)) = stack.pop() {
        if node == start {
            let mut names: Vec<String> = path.iter().map(|(a, e)| format!("{a}/{e}")).collect();
            names.push(format!("{}/{}", node.0, node.1));
            return Err(SubmitError::Invalid {
                field: Some("depends_on".into()),
                message: format!(
                    "depends_on: dependency cycle {}; a deploy would wait for itself. Remove one of these dependencies",
                    names.join(" -> ")
                ),
            });
        }
        if !seen.insert(node.clone()) {
            continue;
        }
        // A dependency whose environment cannot be read has no known dependencies.
        if let Ok(env) = load_environment(&source, &node.0, &node.1) {
            for d in &env.depends_on {
                let mut next_path = path.clone();
                next_path.push(node.clone());
                stack.push((next_path, (d.application.clone(), d.environment.clone())));
            }
        }
    }
    Ok(())
}

/// The requests of the latest successful deploys, newest first, with their ids.
pub(crate) async fn successful_requests(
    client: &Client,
) -> Result<Vec<(String, DeployRequest)>, String> {
    let records = client
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
        .filter_map(|r| Some((r.id.clone(), request_of(r)?)))
        .collect())
}

/// The effective descriptor of the last successful (not dry-run) deploy of
/// the same application and environment, other than `deploy_id`.
pub async fn previous_success(
    rt: &Runtime,
    eff: &EffectiveDescriptor,
    deploy_id: &str,
) -> Result<Option<EffectiveDescriptor>, String> {
    Ok(successful_requests(&rt.client)
        .await?
        .into_iter()
        .filter(|(id, _)| id != deploy_id)
        .filter_map(|(_, r)| r.effective)
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
