//! Deploys as the API and the CLI show them (docs/cli.md): status, list, logs, output,
//! activity and an environment's history, read in a constant number of queries. The
//! views are this crate's types; `manent-api` turns them into the contract's.

use std::collections::{BTreeMap, BTreeSet};

use manent_engine::{
    Client, EngineError, EventRecord, ExecutorState, StepRecord, WorkflowFilter, WorkflowRecord,
    WorkflowStatus, now_ms,
};

use manent_model::{Artifact, QueueKind};
use serde::Deserialize;

use crate::{
    history::{OriginKind, last_success, origin_of, read_request, request_of},
    request::{DEPLOY_WORKFLOW, Decision, DeployRequest, EventKey, Phase, event, rfc3339},
    run::targets::{TargetOutcome, TargetState},
    views::timeline::{self, PassView, WaveView},
};

/// A deploy as status shows it (docs/cli.md, docs/api.md).
#[derive(Debug, Clone, PartialEq)]
pub struct DeployStatus {
    pub id: String,
    /// `tenant/app`.
    pub application: String,
    pub environment: String,
    /// The version of the first artifact (empty if none).
    pub version: String,
    pub status: WorkflowStatus,
    pub phase: Phase,
    /// The queue it was routed to.
    pub queue: String,
    /// The kind of that queue.
    pub route_kind: QueueKind,
    /// The worker that holds (or last held) it.
    pub executor_id: Option<String>,
    pub dry_run: bool,
    pub targets: Vec<TargetView>,
    /// Empty in lists and in activity.
    pub steps: Vec<StepView>,
    /// Why it failed.
    pub error: Option<String>,
    /// The name of the token that submitted it.
    pub submitted_by: String,
    pub created_at: String,
    pub updated_at: String,
    /// While it waits: why.
    pub waiting_for: Option<String>,
    /// While it waits for a gone worker, `waiting_for` as said to a caller who may recover
    /// it (an admin): with the `manent recover` command (status only). The API chooses.
    pub waiting_for_recoverers: Option<String>,
    /// Approvals and a rejection received, in order.
    pub approvals: Vec<ApprovalView>,
    /// The artifacts as submitted: what an approver approves.
    pub artifacts: Vec<Artifact>,
    /// The `deploy:` fields the descriptor set over its environment file, with their values.
    pub overrides: serde_json::Map<String, serde_json::Value>,
    /// The effective descriptor (status only; absent when the environment could not be
    /// read at submission).
    pub effective: Option<serde_json::Value>,
    /// The version deployed in this environment now, while the deploy waits for approval.
    pub deployed_now: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub duration_ms: Option<i64>,
    /// The deploy whose recorded descriptor this one submitted again, and how.
    pub redeploy_of: Option<String>,
    pub redeploy_kind: Option<OriginKind>,
    /// Its descriptor's `irreversible` reason: a rollback past it is refused unless forced
    /// (docs/environments.md, "The rollback guard").
    pub irreversible: Option<String>,
    /// The rollout's waves (status only).
    pub waves: Vec<WaveView>,
    /// The region passes of a region-routed deploy (status only).
    pub passes: Vec<PassView>,
    /// Workers lost under it and the recoveries that moved it on (status only).
    pub interruptions: Vec<timeline::InterruptionView>,
    /// Every measurement of `rollout.analysis` so far (docs/analysis.md).
    pub measurements: Vec<crate::analysis::Measurement>,
    /// While it waits for approval: what it would change (docs/plan-and-drift.md).
    pub plan: Option<crate::plan::approval::ApprovalPlan>,
}

/// One target of a deploy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetView {
    pub name: String,
    pub status: TargetState,
    pub detail: Option<String>,
    /// Its roles in the environment file (docs/environments.md, "Tasks and roles").
    pub roles: Vec<String>,
    /// Under the `container` plugin, what it runs behind its proxy (docs/containers.md).
    pub container: Option<manent_model::RunningContainer>,
}

/// One step of a deploy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepView {
    pub name: String,
    pub status: StepState,
    pub attempts: i64,
    pub started_at: String,
    pub finished_at: Option<String>,
    /// The worker that ran it.
    pub executor_id: String,
    pub error: Option<String>,
}

/// A step as shown: the engine's status, `Stopped` for one still running in a deploy
/// that has ended (cancelled, or failed elsewhere): it will never finish; and
/// `Interrupted` for one whose worker is gone (its lease expired: killed, frozen, cut off),
/// which runs again, from its start, wherever the deploy resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepState {
    Running,
    Success,
    Error,
    Stopped,
    Interrupted,
}

impl StepState {
    pub fn as_str(self) -> &'static str {
        match self {
            StepState::Running => "RUNNING",
            StepState::Success => "SUCCESS",
            StepState::Error => "ERROR",
            StepState::Stopped => "STOPPED",
            StepState::Interrupted => "INTERRUPTED",
        }
    }
}

impl std::fmt::Display for StepState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One approval or rejection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalView {
    /// The approver's token name.
    pub by: String,
    /// Approved (else rejected).
    pub approve: bool,
    pub reason: Option<String>,
    pub at: String,
}

impl From<Decision> for ApprovalView {
    fn from(d: Decision) -> Self {
        ApprovalView {
            by: d.by,
            approve: d.approve,
            reason: d.reason,
            at: rfc3339(d.at_ms),
        }
    }
}

/// A deploy's log lines, and where its output goes on from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeployLogs {
    pub id: String,
    pub lines: Vec<String>,
    /// The `seq` of the last output line in `lines` (0 if none).
    pub output_seq: i64,
}

/// One line a deploy's step printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputLine {
    pub seq: i64,
    pub at: String,
    /// The run of the deploy that printed it.
    pub attempt: i64,
    /// The step that printed it.
    pub source: String,
    /// `stdout`, `stderr` or `progress`, as the engine recorded it.
    pub stream: String,
    pub line: String,
}

/// The summary of deploy `record`, which recorded `request` (no steps, waves or passes);
/// an error when one of its events cannot be read.
fn summary(
    record: &WorkflowRecord,
    request: &DeployRequest,
    events: &[EventRecord],
) -> Result<DeployStatus, EngineError> {
    let id = &record.id;
    let d = &request.descriptor;
    let phase_event: Option<Phase> = event(id, events, &EventKey::Phase)?;
    let waiting_for = match record.status {
        WorkflowStatus::Enqueued if record.not_before_ms > now_ms() => {
            Some(format!("its start time, {}", rfc3339(record.not_before_ms)))
        }
        WorkflowStatus::Enqueued => Some(format!(
            "a free slot on queue {} (its limits, or no worker serving it)",
            request.route.queue
        )),
        WorkflowStatus::Pending => {
            event::<String>(id, events, &EventKey::Waiting)?.filter(|w| !w.is_empty())
        }
        _ => None,
    };
    // No approvals event: none received yet.
    let approvals: Vec<ApprovalView> = event::<Vec<Decision>>(id, events, &EventKey::Approvals)?
        .unwrap_or_default()
        .into_iter()
        .map(ApprovalView::from)
        .collect();
    let finished_ms = record
        .finished_at_ms
        .filter(|_| record.status.is_terminal());
    let origin = origin_of(record);
    let phase = match record.status {
        WorkflowStatus::Enqueued if record.not_before_ms > now_ms() => Phase::Scheduled,
        WorkflowStatus::Enqueued => Phase::Queued,
        WorkflowStatus::Pending => phase_event.unwrap_or(Phase::Running),
        // A scheduled deploy refused when its time came says so once it has ended.
        _ if phase_event == Some(Phase::Refused) => Phase::Refused,
        _ => Phase::Done,
    };
    // Every view of a deploy, lists included, tells its targets as their events recorded
    // them: a finished deploy's targets are never shown `pending`.
    let mut targets: Vec<TargetView> = request
        .effective
        .as_ref()
        .map(|e| {
            e.targets
                .iter()
                .map(|t| TargetView {
                    name: t.name.clone(),
                    status: TargetState::Pending,
                    detail: None,
                    roles: t.roles.clone(),
                    container: None,
                })
                .collect()
        })
        .unwrap_or_default();
    apply_target_events(id, record.status, &mut targets, events);
    Ok(DeployStatus {
        id: record.id.clone(),
        application: d.application.clone(),
        environment: d.environment.clone(),
        version: d.version().to_string(),
        status: record.status,
        phase,
        // The route's queue, also while the deploy waits on the gate queue.
        queue: request.route.queue.clone(),
        route_kind: request.route.kind,
        executor_id: record.executor_id.clone(),
        dry_run: request.effective.as_ref().map_or(d.dry_run, |e| e.dry_run),
        targets,
        steps: Vec::new(),
        error: record.error.clone(),
        submitted_by: request.submitted_by.clone(),
        created_at: rfc3339(record.created_at_ms),
        // The last thing that happened to it: a phase or a target's progress is an event.
        updated_at: rfc3339(
            events
                .iter()
                .map(|e| e.updated_at_ms)
                .fold(record.updated_at_ms, i64::max),
        ),
        waiting_for,
        waiting_for_recoverers: None,
        approvals,
        artifacts: d.artifacts.clone(),
        overrides: d
            .deploy
            .as_ref()
            .and_then(|o| serde_json::to_value(o).ok())
            .and_then(|v| match v {
                serde_json::Value::Object(map) => Some(map),
                _ => None,
            })
            .unwrap_or_default(),
        effective: None,
        deployed_now: None,
        plan: None,
        started_at: record.started_at_ms.map(rfc3339),
        finished_at: finished_ms.map(rfc3339),
        duration_ms: record
            .started_at_ms
            .zip(finished_ms)
            .map(|(started, finished)| (finished - started).max(0)),
        redeploy_of: origin.as_ref().map(|o| o.deploy_id.clone()),
        redeploy_kind: origin.map(|o| o.kind),
        irreversible: d.irreversible.clone(),
        waves: Vec::new(),
        passes: Vec::new(),
        interruptions: Vec::new(),
        // No measurements event: none taken yet.
        measurements: event(id, events, &EventKey::Measurements)?.unwrap_or_default(),
    })
}

/// Sets each target's state and detail from its recorded `target:<name>` events, in order (a
/// later event wins); a target an event names that the request does not is added. A cancelled
/// deploy stopped its commands: what had not finished never will.
fn apply_target_events<'e>(
    id: &str,
    status: WorkflowStatus,
    targets: &mut Vec<TargetView>,
    events: impl IntoIterator<Item = &'e EventRecord>,
) {
    for e in events {
        let Some(EventKey::Target(name)) = EventKey::parse(&e.key) else {
            continue;
        };
        let outcome = recorded_target(id, &name, &e.value);
        match targets.iter_mut().find(|t| t.name == outcome.name) {
            Some(t) => {
                t.status = outcome.status;
                t.detail = outcome.detail;
                t.container = outcome.container;
            }
            None => targets.push(TargetView {
                name: outcome.name,
                status: outcome.status,
                detail: outcome.detail,
                roles: Vec::new(),
                container: outcome.container,
            }),
        }
    }
    if status == WorkflowStatus::Cancelled {
        for t in targets.iter_mut() {
            if matches!(t.status, TargetState::Pending | TargetState::Deploying) {
                t.status = TargetState::Cancelled;
            }
        }
    }
}

/// The summaries of the deploys among `records` whose request can be read (one that
/// cannot is logged by `request_of` and left out: a list cannot tell whose it is), with
/// the events read for them.
fn summaries<'r>(
    records: impl IntoIterator<Item = &'r WorkflowRecord>,
    events: &mut std::collections::HashMap<String, Vec<EventRecord>>,
) -> Result<Vec<DeployStatus>, EngineError> {
    let mut views = Vec::new();
    for record in records {
        if let Some(request) = request_of(record) {
            let events = events.remove(&record.id).unwrap_or_default();
            views.push(summary(record, &request, &events)?);
        }
    }
    Ok(views)
}

/// A step's status as shown: one still RUNNING in a deploy that has ended was stopped
/// with it (a cancel, or a failure elsewhere) and will never finish.
fn shown_step_status(s: &StepRecord, deploy_ended: bool) -> StepState {
    match s.status {
        manent_engine::StepStatus::Running if deploy_ended => StepState::Stopped,
        manent_engine::StepStatus::Running => StepState::Running,
        manent_engine::StepStatus::Success => StepState::Success,
        manent_engine::StepStatus::Error => StepState::Error,
    }
}

/// `ended_at`: when the deploy ended, `None` while it runs; a step it stopped ends then.
/// `interrupted_at`: for a step still running in a deploy that runs, the last heartbeat of
/// its worker if that worker is gone; the step is interrupted then.
fn step_view(s: StepRecord, ended_at: Option<i64>, interrupted_at: Option<i64>) -> StepView {
    let mut status = shown_step_status(&s, ended_at.is_some());
    let mut finished_at = s.finished_at_ms.or(ended_at);
    if status == StepState::Running
        && let Some(at) = interrupted_at
    {
        status = StepState::Interrupted;
        finished_at = Some(at);
    }
    StepView {
        status,
        finished_at: finished_at.map(rfc3339),
        name: s.name,
        attempts: s.attempts,
        started_at: rfc3339(s.started_at_ms),
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
    // A deploy whose input cannot be read exists: say so, never "not found".
    let request = read_request(&record)?;
    let events = client.events(id).await?;
    let mut view = summary(&record, &request, &events)?;
    if let Some(waiting) = waiting_reason(client, &record).await? {
        view.waiting_for = Some(waiting.reason);
        view.waiting_for_recoverers = waiting.to_recoverers;
    }
    let passes = timeline::passes(client, id, &view.queue).await?;
    // A pass's own events first: the deploy republishes its targets' outcomes when the
    // pass ends, and those win (`summary` applied the deploy's; applied again after).
    apply_target_events(
        id,
        record.status,
        &mut view.targets,
        passes.events.iter().chain(&events),
    );
    view.effective = match &request.effective {
        Some(effective) => {
            Some(
                serde_json::to_value(effective).map_err(|e| EngineError::Unreadable {
                    kind: "deploy",
                    id: id.to_string(),
                    error: format!("its effective descriptor cannot be written: {e}"),
                })?,
            )
        }
        None => None,
    };
    let analysis = request
        .effective
        .as_ref()
        .and_then(|e| e.rollout.analysis.as_ref());
    crate::analysis::threshold::fill(analysis, &mut view.measurements);
    if view.phase == Phase::WaitingApproval {
        // What the approver would replace: a database error is an error, not "nothing".
        view.deployed_now = last_success(client, &view.application, &view.environment, None)
            .await?
            .and_then(|(_, r)| r.effective)
            .map(|p| p.version);
    }
    let steps = client.steps(id).await?;
    if view.phase == Phase::WaitingApproval {
        view.plan =
            crate::plan::approval::from_steps(id, &steps).map_err(|e| EngineError::Unreadable {
                kind: "deploy",
                id: id.to_string(),
                error: e.to_string(),
            })?;
    }
    // The last thing that happened to it, a step started or ended included (docs/api.md).
    let last_ms = steps
        .iter()
        .chain(&passes.steps)
        .map(|s| s.finished_at_ms.unwrap_or(s.started_at_ms))
        .chain(events.iter().chain(&passes.events).map(|e| e.updated_at_ms))
        .fold(record.updated_at_ms, i64::max);
    view.updated_at = rfc3339(last_ms);
    let steps: Vec<StepRecord> = crate::workflow::gate::dependency_waits_as_one(
        steps
            .into_iter()
            .chain(passes.steps)
            .filter(|s| !is_internal_step(&s.name))
            .collect(),
    );
    view.interruptions = timeline::interruptions(events.iter().chain(&passes.events), &steps);
    let ended_at = record
        .finished_at_ms
        .filter(|_| record.status.is_terminal());
    view.steps = shown_steps(client, steps, ended_at).await?;
    // A container deploy's prunes, after its steps: each ends with its own workflow, which
    // may run once the deploy has ended (docs/containers.md, "Pruning").
    for (prune, steps) in passes.prunes {
        let ended_at = prune.finished_at_ms.filter(|_| prune.status.is_terminal());
        view.steps
            .extend(shown_steps(client, steps, ended_at).await?);
    }
    view.waves = request
        .effective
        .as_ref()
        .map(timeline::waves)
        .unwrap_or_default();
    view.passes = passes.views;
    Ok(Some(view))
}

/// `steps` of one workflow as shown, `ended_at` when that workflow ended: while it runs,
/// a step whose worker is gone is interrupted.
async fn shown_steps(
    client: &Client,
    steps: Vec<StepRecord>,
    ended_at: Option<i64>,
) -> Result<Vec<StepView>, EngineError> {
    let gone = if ended_at.is_none() {
        gone_workers(client, &steps).await?
    } else {
        BTreeMap::new()
    };
    Ok(steps
        .into_iter()
        .map(|s| {
            let interrupted_at = gone.get(&s.executor_id).copied();
            step_view(s, ended_at, interrupted_at)
        })
        .collect())
}

/// The workers of `steps` still running whose lease is not live (killed, frozen, cut off,
/// or stopped under the step), with their last heartbeat: those steps are interrupted.
async fn gone_workers(
    client: &Client,
    steps: &[StepRecord],
) -> Result<BTreeMap<String, i64>, EngineError> {
    let now = now_ms();
    let mut gone = BTreeMap::new();
    let running: BTreeSet<&str> = steps
        .iter()
        .filter(|s| s.status == manent_engine::StepStatus::Running)
        .map(|s| s.executor_id.as_str())
        .collect();
    for executor in running {
        if client
            .executor_lease(executor)
            .await?
            .is_some_and(|l| l.is_live(now))
        {
            continue;
        }
        let last_heard = client
            .executor(executor)
            .await?
            .map_or(now, |e| e.heartbeat_at_ms);
        gone.insert(executor.to_string(), last_heard);
    }
    Ok(gone)
}

/// Steps that are bookkeeping, not work on the deploy: the engine's own (events,
/// sleeps) and the deploy workflow's deadlines, watches and wake-ups. Status and logs
/// leave them out.
fn is_internal_step(name: &str) -> bool {
    name.starts_with("manent.")
        || name == "approval deadline"
        || name == "wake dependents"
        || name.starts_with("dependency deadline ")
        || name.starts_with("watch ")
        || name.starts_with("unwatch ")
}

/// What the deploy's steps printed after line `after`, at most `limit` lines (the
/// caller has checked the deploy exists and may be read).
pub async fn output(
    client: &Client,
    id: &str,
    after: i64,
    limit: i64,
) -> Result<Vec<OutputLine>, EngineError> {
    Ok(
        timeline::output(client, id, after.max(0), limit.clamp(1, 5_000))
            .await?
            .into_iter()
            .map(|l| OutputLine {
                seq: l.seq,
                at: rfc3339(l.at_ms),
                attempt: l.generation,
                source: l.source,
                stream: l.stream,
                line: l.line,
            })
            .collect(),
    )
}

/// Filters of the deploy list.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ListFilter {
    pub application: Option<String>,
    pub environment: Option<String>,
    pub status: Option<String>,
    pub limit: Option<i64>,
    /// Only deploys submitted before this one (the last of the previous page).
    pub before: Option<String>,
}

/// The newest deploys matching `filter` whose application `visible` admits (a scoped
/// caller's tenants).
pub async fn list(
    client: &Client,
    filter: &ListFilter,
    visible: &(dyn Fn(&str) -> bool + Sync),
) -> Result<Vec<DeployStatus>, EngineError> {
    let status = match filter.status.as_deref() {
        Some(s) => Some(s.to_ascii_uppercase().parse().map_err(|_| {
            EngineError::InvalidInput(format!(
                "unknown status `{s}`: use ENQUEUED, PENDING, SUCCESS, ERROR or CANCELLED"
            ))
        })?),
        None => None,
    };
    let limit = filter.limit.unwrap_or(50).clamp(1, 1000);
    let wanted = usize::try_from(limit).unwrap_or(50);
    // The application (and with it the environment) is a condition on the partition index:
    // an application's deploys are found however many others are newer. What the store
    // cannot answer (an environment alone, the token's scope) is filtered here, page after
    // page of the newest, until the page is full or the deploys run out.
    let (partition_key, partition_prefix) = match (&filter.application, &filter.environment) {
        (Some(application), Some(environment)) => (
            Some(manent_model::partition_key(application, environment)),
            None,
        ),
        (Some(application), None) => (None, Some(format!("{application}/"))),
        (None, _) => (None, None),
    };
    let page = limit * 10;
    let mut chosen: Vec<WorkflowRecord> = Vec::new();
    for n in 0..MAX_LIST_PAGES {
        let records = client
            .list(&WorkflowFilter {
                status,
                name: Some(DEPLOY_WORKFLOW.into()),
                partition_key: partition_key.clone(),
                partition_prefix: partition_prefix.clone(),
                before_id: filter.before.clone(),
                limit: Some(page),
                offset: Some(n * page),
                ..Default::default()
            })
            .await?;
        let exhausted = i64::try_from(records.len()).unwrap_or(i64::MAX) < page;
        chosen.extend(records.into_iter().filter(|r| {
            request_of(r).is_some_and(|req| {
                visible(&req.descriptor.application)
                    && filter
                        .application
                        .as_ref()
                        .is_none_or(|a| &req.descriptor.application == a)
                    && filter
                        .environment
                        .as_ref()
                        .is_none_or(|e| &req.descriptor.environment == e)
            })
        }));
        if exhausted || chosen.len() >= wanted {
            break;
        }
    }
    chosen.truncate(wanted);
    let records: Vec<&WorkflowRecord> = chosen.iter().collect();
    // A running deploy's phase (waiting for approval, a wave) and every deploy's targets
    // live in their events: read for all of them at once (one round trip per 500).
    let ids: Vec<String> = records.iter().map(|r| r.id.clone()).collect();
    let mut events = client.events_of(&ids).await?;
    summaries(records, &mut events)
}

/// The most pages of `limit × 10` deploys a filtered list reads before it answers with what
/// it found (a filter the store cannot answer, matching almost nothing in a long history).
const MAX_LIST_PAGES: i64 = 20;

/// How many output lines `logs` shows; the output endpoint pages through all of them.
const LOG_OUTPUT_LINES: i64 = 5_000;

/// Log lines of a deploy, in time order: its submission, each step's outcome, what its
/// commands printed (`source | line`, `!` for stderr, `·` for a plugin's progress; left
/// out without `with_output`, for a follower that pages the output itself), recoveries;
/// then each target's outcome and where the deploy stands.
pub async fn logs(
    client: &Client,
    id: &str,
    with_output: bool,
) -> Result<Option<DeployLogs>, EngineError> {
    let Some(view) = status(client, id).await? else {
        return Ok(None);
    };
    let created_ms = client.get(id).await?.map_or(0, |r| r.created_at_ms);
    // (when, order among equal times, text)
    let mut timed: Vec<(i64, u8, String)> = vec![(
        created_ms,
        0,
        format!(
            "{} submitted by {} to queue {}",
            view.created_at, view.submitted_by, view.queue
        ),
    )];
    let passes = timeline::passes(client, id, &view.queue).await?;
    let deploy_ended = view.finished_at.is_some();
    let steps = crate::workflow::gate::dependency_waits_as_one(
        client
            .steps(id)
            .await?
            .into_iter()
            .chain(passes.steps)
            .filter(|s| !is_internal_step(&s.name))
            .collect(),
    );
    // A prune's steps end with their own workflow, which may outlive the deploy.
    let prunes = passes.prunes.into_iter().flat_map(|(prune, steps)| {
        let ended = prune.status.is_terminal();
        steps.into_iter().map(move |s| (s, ended))
    });
    for (s, ended) in steps.into_iter().map(|s| (s, deploy_ended)).chain(prunes) {
        let when = s.finished_at_ms.unwrap_or(s.started_at_ms);
        let error = s
            .error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        let shown = shown_step_status(&s, ended);
        // A running step has made no attempt yet that could be counted.
        let attempts = if shown == StepState::Running {
            String::new()
        } else {
            format!(" (attempts {})", s.attempts)
        };
        timed.push((
            when,
            2,
            format!(
                "{} [{}] {} {}{attempts}{error}",
                rfc3339(when),
                s.executor_id,
                s.name,
                shown.as_str(),
            ),
        ));
    }
    let mut output_seq = 0;
    let output = if with_output {
        timeline::output(client, id, 0, LOG_OUTPUT_LINES).await?
    } else {
        Vec::new()
    };
    for line in output {
        output_seq = line.seq;
        let mark = match line.stream.as_str() {
            "stderr" => "!",
            "progress" => "·",
            _ => "|",
        };
        timed.push((
            line.at_ms,
            1,
            format!(
                "{} {} {mark} {}",
                rfc3339(line.at_ms),
                line.source,
                line.line
            ),
        ));
    }
    // The interruptions: when the lost worker was last heard from, the recovery, and who
    // resumed the deploy.
    for i in &view.interruptions {
        if let (Some(at), Some(what)) = (i.interrupted_at, &i.interruption) {
            timed.push((at, 1, format!("{} {what}", rfc3339(at))));
        }
        timed.push((
            i.recovered_at,
            1,
            format!("{} {}", rfc3339(i.recovered_at), i.recovery),
        ));
        if let (Some(at), Some(by)) = (i.resumed_at, &i.resumed_by) {
            timed.push((at, 1, format!("{} resumed by worker {by}", rfc3339(at))));
        }
    }
    // Stable: equal times keep the order they were read in (output in print order).
    timed.sort_by_key(|(at, order, _)| (*at, *order));
    let mut lines: Vec<String> = timed.into_iter().map(|(_, _, text)| text).collect();
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
    if let Some(waiting) = &view.waiting_for {
        lines.push(format!("waiting for {waiting}"));
    }
    Ok(Some(DeployLogs {
        id: id.to_string(),
        lines,
        output_seq,
    }))
}

/// Which worker runs each active deploy, then the most recent ones.
pub async fn activity(client: &Client) -> Result<Vec<DeployStatus>, EngineError> {
    // Four queries whatever the number of deploys: three lists, and their events at once
    // (crates/manent-deploy/tests/view_queries.rs counts them).
    let mut records = Vec::new();
    for status in [WorkflowStatus::Pending, WorkflowStatus::Enqueued] {
        records.extend(
            client
                .list(&WorkflowFilter {
                    status: Some(status),
                    name: Some(DEPLOY_WORKFLOW.into()),
                    limit: Some(200),
                    ..Default::default()
                })
                .await?,
        );
    }
    let recent = client
        .list(&WorkflowFilter {
            name: Some(DEPLOY_WORKFLOW.into()),
            limit: Some(20),
            ..Default::default()
        })
        .await?;
    // Who approved a finished deploy stays part of its activity.
    records.extend(recent.into_iter().filter(|r| r.status.is_terminal()));
    let ids: Vec<String> = records.iter().map(|r| r.id.clone()).collect();
    let mut events = client.events_of(&ids).await?;
    summaries(&records, &mut events)
}

/// One environment's deploys, newest first (all statuses, dry runs included): what
/// `manent history APP ENV` shows. Read from that partition's history, so other
/// applications' deploys cost nothing.
pub async fn history(
    client: &Client,
    application: &str,
    environment: &str,
    limit: Option<i64>,
    before: Option<&str>,
) -> Result<Vec<DeployStatus>, EngineError> {
    let records = client
        .list(&WorkflowFilter {
            name: Some(DEPLOY_WORKFLOW.into()),
            partition_key: Some(manent_model::partition_key(application, environment)),
            before_id: before.map(str::to_string),
            limit: Some(limit.unwrap_or(50).clamp(1, 1000)),
            ..Default::default()
        })
        .await?;
    // A running deploy's phase (waiting for approval, a wave) and every deploy's targets
    // live in their events: read for all of them at once.
    let ids: Vec<String> = records.iter().map(|r| r.id.clone()).collect();
    let mut events = client.events_of(&ids).await?;
    summaries(&records, &mut events)
}

/// Target `name`'s recorded outcome (event `target:<name>` of deploy `id`). One that
/// cannot be read is logged and shown as `unreadable` with the reason, never left out.
fn recorded_target(id: &str, name: &str, value: &str) -> TargetOutcome {
    serde_json::from_str(value).unwrap_or_else(|e| {
        tracing::error!(deploy_id = %id, target = name, error = %e, "a target's recorded outcome cannot be read; shown as unreadable");
        TargetOutcome::new(
            name,
            TargetState::Other("unreadable".into()),
            Some(format!("its recorded outcome cannot be read: {e}")),
        )
    })
}

mod waiting;

use waiting::waiting_reason;

#[cfg(test)]
mod tests;
