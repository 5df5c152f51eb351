//! `/deploys`: submitting (one or a batch), listing, one deploy's status, logs and output,
//! cancelling, approving or rejecting, redeploying, and the activity feed.

use axum::{
    Json,
    extract::{Path, Query, State},
    http::StatusCode,
};
use manent_contract::{
    DecisionBody, DeployAction, DeployLogs, DeployOutput, DeployStatus, Descriptor, ErrorBody,
    RedeployBody, Resubmitted, SubmitBatch, Submitted, WorkflowStatus,
};
use manent_deploy::{
    history::OriginKind,
    submission::approvals::{self, Approver, DecideError},
    submission::{self, ResubmitError, SubmitError},
    views::deploy_views::{self, ListFilter},
};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{optional_body, require};
use crate::{
    AppError, AppState,
    auth::{Action, Caller},
    wire::ToWire,
};

/// This resource's routes, relative to `/api/v1`.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(submit_deploy, list_deploys))
        .routes(routes!(submit_deploys))
        .routes(routes!(deploy_status))
        .routes(routes!(deploy_logs))
        .routes(routes!(deploy_output))
        .routes(routes!(cancel_deploy))
        .routes(routes!(approve_deploy))
        .routes(routes!(reject_deploy))
        .routes(routes!(redeploy_deploy))
        .routes(routes!(activity))
}

#[derive(serde::Deserialize)]
struct SubmitQuery {
    #[serde(default)]
    dry_run: bool,
    /// The descriptor's file name, for messages.
    file: Option<String>,
}

/// Submit a deploy.
///
/// The body is the descriptor, in YAML or JSON (read as text whatever its `Content-Type`).
/// It is parsed, validated, resolved against its environment file, routed to a queue and
/// enqueued (held until `schedule.at`, if given); with `schedule.cron` a recurring schedule
/// is created instead, each tick a deploy. Needs the deployer role (or above) on the
/// descriptor's application.
// It is parsed first (off the async threads, storing nothing), then the caller is
// authorised on the parsed `application`, then it is submitted: no text is trusted
// before it is parsed.
#[utoipa::path(post, path = "/deploys", tag = "deploys", operation_id = "submitDeploy",
    params(
        ("dry_run" = Option<bool>, Query, description = "`true` forces a dry run (plan instead of act) whatever the descriptor says."),
        ("file" = Option<String>, Query, description = "The descriptor's file name, used in error messages.", example = "deploy.yml"),
    ),
    request_body(description = "The descriptor.", content(
        (Descriptor = "application/yaml"),
        (Descriptor = "application/json"),
    )),
    responses(
        (status = 201, description = "Enqueued (or scheduled): the deploy's id, status and queue.", body = Submitted),
        (status = 400, description = "The descriptor is malformed or invalid: `field` names the first bad field (e.g. `environment`, `artifacts[0].sha256`) and `message` lists every problem with its file and line.", body = ErrorBody),
        (status = 403, description = "The token may not deploy this application.", body = ErrorBody),
        (status = 404, description = "The application or environment is unknown.", body = ErrorBody),
        (status = 409, description = "Conflicts with another deploy (the same id).", body = ErrorBody),
    ))]
async fn submit_deploy(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Query(query): Query<SubmitQuery>,
    body: String,
) -> Result<(StatusCode, Json<Submitted>), AppError> {
    let file = query.file.unwrap_or_else(|| "descriptor".to_owned());
    let descriptor = submission::parse(body, file).await.map_err(submit_error)?;
    require(&caller, Action::Deploy, Some(&descriptor.application))?;
    let submitted = submission::submit(
        &state.client,
        &state.config,
        descriptor,
        query.dry_run,
        &manent_deploy::Submitter::new(&caller.token.name, &caller.token.id),
    )
    .await
    .map_err(submit_error)?;
    Ok((StatusCode::CREATED, Json(submitted.to_wire())))
}

/// Submit many deploys at once (a bulk submission).
///
/// The body is `{"deploys": [{"descriptor": "<YAML or JSON text>", "file": "a.yml"?}, …]}`:
/// at least one, at most 1,000. Every descriptor is parsed, the caller is authorised on
/// each one's application, and each is checked and routed as `POST /deploys` does; if
/// any is refused, none is enqueued and the error names it (`deploys[N]`, then its
/// field). Then all are enqueued in one transaction. A recurring schedule
/// (`schedule.cron`) is refused here: submit it alone.
#[utoipa::path(post, path = "/deploys/batch", tag = "deploys", operation_id = "submitDeploys",
    params(
        ("dry_run" = Option<bool>, Query, description = "`true` forces every deploy of the batch to be a dry run."),
    ),
    request_body(content = SubmitBatch, content_type = "application/json"),
    responses(
        (status = 201, description = "All enqueued: each deploy's id, status and queue, in the order given.", body = Vec<Submitted>),
        (status = 400, description = "The body is not a batch, it holds no deploy or more than 1,000, or a descriptor is malformed or invalid: `field` names it (e.g. `deploys[3].artifacts[0].sha256`). Nothing was enqueued.", body = ErrorBody),
        (status = 403, description = "The token may not deploy one of the applications (the message names which deploy). Nothing was enqueued.", body = ErrorBody),
    ))]
async fn submit_deploys(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Query(query): Query<SubmitQuery>,
    body: String,
) -> Result<(StatusCode, Json<Vec<Submitted>>), AppError> {
    let batch: SubmitBatch = serde_json::from_str(&body).map_err(|e| {
        AppError::bad_request(
            "deploys",
            format!(
                "deploys: the body is not a batch ({e}); send {{\"deploys\": [{{\"descriptor\": \"<YAML or JSON text>\", \"file\": \"a.yml\"?}}, …]}}"
            ),
        )
    })?;
    let entries = batch
        .deploys
        .into_iter()
        .enumerate()
        .map(|(i, entry)| {
            let file = entry.file.unwrap_or_else(|| format!("deploys[{i}]"));
            (entry.descriptor, file)
        })
        .collect();
    let descriptors = submission::parse_many(entries)
        .await
        .map_err(submit_error)?;
    // Parsed, then authorised: every application before anything is stored.
    for (i, descriptor) in descriptors.iter().enumerate() {
        if !caller.may(Action::Deploy, Some(&descriptor.application)) {
            return Err(AppError::Forbidden {
                token: caller.token.name.clone(),
                action: format!("deploy {} (deploys[{i}])", descriptor.application),
            });
        }
    }
    let submitted = submission::submit_many(
        &state.client,
        &state.config,
        descriptors,
        query.dry_run,
        &manent_deploy::Submitter::new(&caller.token.name, &caller.token.id),
    )
    .await
    .map_err(submit_error)?;
    Ok((StatusCode::CREATED, Json(submitted.to_wire())))
}

fn submit_error(e: SubmitError) -> AppError {
    match e {
        SubmitError::Invalid { field, message } => AppError::BadRequest { field, message },
        SubmitError::UnknownEnvironment(m) => AppError::NotFound(m),
        SubmitError::Engine(e) => e.into(),
        SubmitError::Internal(m) => AppError::Internal(m),
    }
}

/// A page's cursor (`before`): a deploy the caller may see. Unknown and another tenant's
/// answer alike: 404, naming the field.
pub(super) async fn check_cursor(
    state: &AppState,
    caller: &Caller,
    before: &str,
) -> Result<(), AppError> {
    match visible_deploy(state, caller, before).await {
        Ok(_) => Ok(()),
        Err(AppError::NotFound(_)) => Err(AppError::NotFound(format!(
            "before: no deploy `{before}`: give the whole id of the last deploy of the \
             previous page"
        ))),
        Err(other) => Err(other),
    }
}

/// An empty `before=` is no cursor.
pub(super) fn cursor(before: &Option<String>) -> Option<&str> {
    before.as_deref().filter(|b| !b.is_empty())
}

/// The deploy `id` if the caller may see it. Another tenant's deploy answers 404 like a
/// deploy that does not exist: a scoped token learns nothing of what it may not read.
pub(super) async fn visible_deploy(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<DeployStatus, AppError> {
    deploy_views::status(&state.client, id)
        .await?
        .filter(|deploy| caller.may(Action::Read, Some(&deploy.application)))
        .map(|deploy| for_caller(caller, deploy))
        .ok_or_else(|| AppError::NotFound(format!("no deploy `{id}`")))
}

/// A deploy's status as `caller` reads it: what it waits for names `manent recover` only
/// to a caller who may run it (an unscoped admin), never as a way out to one it would
/// answer 403.
pub(super) fn for_caller(caller: &Caller, mut deploy: deploy_views::DeployStatus) -> DeployStatus {
    if let Some(to_recoverers) = deploy.waiting_for_recoverers.take()
        && caller.may(Action::Administer, None)
    {
        deploy.waiting_for = Some(to_recoverers);
    }
    deploy.to_wire()
}

/// List deploys, newest first.
#[utoipa::path(get, path = "/deploys", tag = "deploys", operation_id = "listDeploys",
    params(
        ("application" = Option<String>, Query, description = "Only this application (`tenant/app`).", example = "ml/trainer"),
        ("environment" = Option<String>, Query, description = "Only this environment.", example = "prod"),
        ("status" = Option<manent_contract::StatusFilter>, Query, description = "Only this status: ENQUEUED, PENDING, SUCCESS, ERROR or CANCELLED (any case). Another value is a 400."),
        ("limit" = Option<i64>, Query, description = "At most this many deploys; clamped to 1..1000."),
        ("before" = Option<String>, Query, description = "Only deploys submitted before this one (the last of the previous page): the next page."),
    ),
    responses(
        (status = 200, description = "The deploys the token may see (steps empty).", body = Vec<DeployStatus>),
        (status = 400, description = "An unknown status, or a query string that cannot be read.", body = ErrorBody),
        (status = 404, description = "`before` names no deploy the token may see.", body = ErrorBody),
    ))]
async fn list_deploys(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Query(filter): Query<ListFilter>,
) -> Result<Json<Vec<DeployStatus>>, AppError> {
    let visible = |application: &str| caller.may(Action::Read, Some(application));
    let filter = ListFilter {
        before: cursor(&filter.before).map(str::to_string),
        ..filter
    };
    if let Some(before) = &filter.before {
        check_cursor(&state, &caller, before).await?;
    }
    let mut deploys = deploy_views::list(&state.client, &filter, &visible)
        .await?
        .to_wire();
    deploys.iter_mut().for_each(|d| fill_actions(&caller, d));
    Ok(Json(deploys))
}

/// `?wait_ms=N` of `/deploys/{id}`.
#[derive(Debug, serde::Deserialize)]
struct StatusQuery {
    #[serde(default)]
    wait_ms: u64,
}

/// The longest `wait_ms` a status request may hold its answer.
const MAX_STATUS_WAIT_MS: u64 = 10_000;

/// The status of one deploy. With `wait_ms`, the answer to a deploy that has not ended is
/// held until it ends or `wait_ms` passes, whichever is first: a follower (`deploy --wait`)
/// sees the end as it happens instead of at its next poll.
#[utoipa::path(get, path = "/deploys/{id}", tag = "deploys", operation_id = "getDeploy",
    params(
        DeployId,
        ("wait_ms" = Option<u64>, Query, minimum = 0, maximum = 10000, description = "Hold the answer up to this many milliseconds while the deploy has not ended; it is given as soon as the deploy ends (default 0: at once; at most 10,000)."),
    ),
    responses(
        (status = 200, description = "The deploy, with its targets and steps.", body = DeployStatus),
        (status = 400, description = "The query string cannot be read, or `wait_ms` is over 10,000.", body = ErrorBody),
        (status = 404, description = "No such deploy (or one the token may not see).", body = ErrorBody),
    ))]
async fn deploy_status(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(DeployId { id }): Path<DeployId>,
    Query(query): Query<StatusQuery>,
) -> Result<Json<DeployStatus>, AppError> {
    if query.wait_ms > MAX_STATUS_WAIT_MS {
        return Err(AppError::bad_request(
            "wait_ms",
            format!(
                "wait_ms is {}: give at most {MAX_STATUS_WAIT_MS} (milliseconds)",
                query.wait_ms
            ),
        ));
    }
    let mut deploy = visible_deploy(&state, &caller, &id).await?;
    if query.wait_ms > 0 && !deploy.status.is_terminal() {
        // Seen by the caller first (404 for another tenant's), then waited for.
        match state
            .client
            .wait(&id, std::time::Duration::from_millis(query.wait_ms))
            .await
        {
            Ok(_) | Err(manent_engine::EngineError::WaitTimeout { .. }) => {}
            Err(other) => return Err(other.into()),
        }
        deploy = visible_deploy(&state, &caller, &id).await?;
    }
    fill_actions(&caller, &mut deploy);
    Ok(Json(deploy))
}

/// What `caller` may do to the deploy now, for the page's buttons (the routes check
/// again: this only spares a viewer buttons that would answer 403).
fn fill_actions(caller: &Caller, deploy: &mut DeployStatus) {
    let application = Some(deploy.application.as_str());
    let mut actions = Vec::new();
    if deploy.phase == manent_contract::Phase::WaitingApproval
        && caller.may(Action::Approve, application)
    {
        actions.extend([DeployAction::Approve, DeployAction::Reject]);
    }
    if super::analysis::may_decide(caller, deploy) {
        actions.extend([DeployAction::Promote, DeployAction::Abort]);
    }
    let may_deploy = caller.may(Action::Deploy, application);
    if matches!(
        deploy.status,
        WorkflowStatus::Enqueued | WorkflowStatus::Pending
    ) && may_deploy
    {
        actions.push(DeployAction::Cancel);
    }
    if deploy.status.is_terminal() && may_deploy {
        actions.push(DeployAction::Redeploy);
    }
    deploy.actions = actions;
}

/// `?output=false` of `/deploys/{id}/logs`.
#[derive(Debug, serde::Deserialize)]
struct LogsQuery {
    #[serde(default = "yes")]
    output: bool,
}

fn yes() -> bool {
    true
}

/// The log lines of one deploy.
#[utoipa::path(get, path = "/deploys/{id}/logs", tag = "deploys", operation_id = "getDeployLogs",
    params(
        DeployId,
        ("output" = Option<bool>, Query, description = "false: without what its commands printed (a follower pages `/output` itself); default true."),
    ),
    responses(
        (status = 200, description = "Its submission, steps, output, recoveries and targets, in time order.", body = DeployLogs),
        (status = 400, description = "The query string cannot be read.", body = ErrorBody),
        (status = 404, description = "No such deploy (or one the token may not see).", body = ErrorBody),
    ))]
async fn deploy_logs(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(DeployId { id }): Path<DeployId>,
    Query(query): Query<LogsQuery>,
) -> Result<Json<DeployLogs>, AppError> {
    visible_deploy(&state, &caller, &id).await?;
    deploy_views::logs(&state.client, &id, query.output)
        .await?
        .map(|logs| Json(logs.to_wire()))
        .ok_or_else(|| AppError::NotFound(format!("no deploy `{id}`")))
}

/// `?after=SEQ&limit=N` of `/deploys/{id}/output`.
#[derive(Debug, serde::Deserialize)]
struct OutputQuery {
    #[serde(default)]
    after: i64,
    #[serde(default = "default_output_limit")]
    limit: i64,
}

fn default_output_limit() -> i64 {
    1_000
}

/// What one deploy's commands printed, line by line.
#[utoipa::path(get, path = "/deploys/{id}/output", tag = "deploys", operation_id = "getDeployOutput",
    params(
        DeployId,
        ("after" = Option<i64>, Query, minimum = 0, description = "Only lines with a greater `seq` (default 0: from the start)."),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 5000, description = "At most this many lines (default 1,000, at most 5,000)."),
    ),
    responses(
        (status = 200, description = "A page of its output.", body = DeployOutput),
        (status = 400, description = "The query string cannot be read.", body = ErrorBody),
        (status = 404, description = "No such deploy (or one the token may not see).", body = ErrorBody),
    ))]
async fn deploy_output(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(DeployId { id }): Path<DeployId>,
    Query(query): Query<OutputQuery>,
) -> Result<Json<DeployOutput>, AppError> {
    visible_deploy(&state, &caller, &id).await?;
    let lines = deploy_views::output(&state.client, &id, query.after, query.limit)
        .await?
        .to_wire();
    Ok(Json(DeployOutput { id, lines }))
}

/// Cancel a deploy.
#[utoipa::path(post, path = "/deploys/{id}/cancel", tag = "deploys", operation_id = "cancelDeploy",
    params(DeployId),
    responses(
        (status = 200, description = "Cancelled: the deploy's id, status and queue.", body = Submitted),
        (status = 403, description = "The token may not deploy this application.", body = ErrorBody),
        (status = 404, description = "No such deploy (or one the token may not see).", body = ErrorBody),
        (status = 409, description = "The deploy has already ended.", body = ErrorBody),
    ))]
async fn cancel_deploy(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(DeployId { id }): Path<DeployId>,
) -> Result<Json<Submitted>, AppError> {
    let deploy = visible_deploy(&state, &caller, &id).await?;
    require(&caller, Action::Deploy, Some(&deploy.application))?;
    let status = state.client.cancel(&id).await?;
    tracing::info!(deploy = %id, by = %caller.token.name, "deploy cancelled");
    if !deploy.dry_run {
        let facts = manent_deploy::notifications::Facts {
            deploy_id: id.clone(),
            application: deploy.application.clone(),
            environment: deploy.environment.clone(),
            version: deploy.version.clone(),
            submitted_by: deploy.submitted_by.clone(),
            error: None,
        };
        let event = manent_config::NotificationEvent::Cancelled;
        manent_deploy::notifications::record(&state.client, &state.config, event, &facts).await;
    }
    Ok(Json(Submitted {
        id,
        status: status.to_wire().into(),
        queue: deploy.queue,
    }))
}

/// `POST /deploys/{id}/approve` and `/reject`: an approver's decision on a
/// deploy waiting for approval. 403 if the caller is not one of the policy's
/// approvers (or approves their own deploy), 409 if it does not wait.
async fn decide_deploy(
    state: AppState,
    caller: Caller,
    id: String,
    body: String,
    approve: bool,
) -> Result<Json<DeployStatus>, AppError> {
    let approver = Approver {
        name: caller.token.name.clone(),
        token_id: caller.token.id.clone(),
        role: caller.token.role.to_string(),
    };
    super::analysis::decision(&state, &caller, &id, &body, async |reason| {
        approvals::decide(&state.client, &id, &approver, approve, reason)
            .await
            .map_err(|e| match e {
                DecideError::NotFound(m) => AppError::NotFound(format!("no deploy `{m}`")),
                DecideError::NotWaiting(m) => AppError::Conflict(m),
                DecideError::Forbidden(m) => AppError::Forbidden {
                    token: caller.token.name.clone(),
                    action: m,
                },
                DecideError::Engine(e) => e.into(),
            })?;
        tracing::info!(deploy = %id, by = %caller.token.name, approve, "approval decision");
        Ok(())
    })
    .await
}

/// Approve a deploy waiting for approval.
#[utoipa::path(post, path = "/deploys/{id}/approve", tag = "deploys", operation_id = "approveDeploy",
    params(DeployId),
    request_body(content = Option<DecisionBody>, content_type = "application/json",
        description = "Optional: `{\"reason\": \"…\"}`, or nothing."),
    responses(
        (status = 200, description = "The deploy after the decision.", body = DeployStatus),
        (status = 400, description = "The body is not `{\"reason\": \"…\"}`.", body = ErrorBody),
        (status = 403, description = "Not one of the policy's approvers, or its own deploy.", body = ErrorBody),
        (status = 404, description = "No such deploy (or one the token may not see).", body = ErrorBody),
        (status = 409, description = "The deploy does not wait for approval.", body = ErrorBody),
    ))]
async fn approve_deploy(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(DeployId { id }): Path<DeployId>,
    body: String,
) -> Result<Json<DeployStatus>, AppError> {
    decide_deploy(state, caller, id, body, true).await
}

/// Reject a deploy waiting for approval.
#[utoipa::path(post, path = "/deploys/{id}/reject", tag = "deploys", operation_id = "rejectDeploy",
    params(DeployId),
    request_body(content = Option<DecisionBody>, content_type = "application/json",
        description = "Optional: `{\"reason\": \"…\"}`, or nothing."),
    responses(
        (status = 200, description = "The deploy after the decision.", body = DeployStatus),
        (status = 400, description = "The body is not `{\"reason\": \"…\"}`.", body = ErrorBody),
        (status = 403, description = "Not one of the policy's approvers.", body = ErrorBody),
        (status = 404, description = "No such deploy (or one the token may not see).", body = ErrorBody),
        (status = 409, description = "The deploy does not wait for approval.", body = ErrorBody),
    ))]
async fn reject_deploy(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(DeployId { id }): Path<DeployId>,
    body: String,
) -> Result<Json<DeployStatus>, AppError> {
    decide_deploy(state, caller, id, body, false).await
}

/// What runs now, and the latest finished deploys.
#[utoipa::path(get, path = "/activity", tag = "deploys", operation_id = "activity",
    responses((status = 200, description = "Running and queued deploys, then the latest finished ones.", body = Vec<DeployStatus>)))]
async fn activity(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Result<Json<Vec<DeployStatus>>, AppError> {
    let mut deploys = deploy_views::activity(&state.client).await?.to_wire();
    deploys.retain(|d| caller.may(Action::Read, Some(&d.application)));
    deploys.iter_mut().for_each(|d| fill_actions(&caller, d));
    Ok(Json(deploys))
}

pub(crate) fn resubmit_error(e: ResubmitError) -> AppError {
    match e {
        ResubmitError::NotFound(m) => AppError::NotFound(m),
        ResubmitError::Nothing(m) => AppError::Conflict(m),
        ResubmitError::PastIrreversible { message, .. } => AppError::Conflict(message),
        ResubmitError::Submit(e) => submit_error(e),
    }
}

/// Submits `request` (recorded by deploy `source`) again for `caller`, once the caller may
/// deploy its recorded application; one forced past an irreversible deploy is audited.
pub(super) async fn resubmit(
    state: &AppState,
    caller: &Caller,
    source: &str,
    request: manent_deploy::DeployRequest,
    how: submission::Resubmit,
) -> Result<(StatusCode, Json<Resubmitted>), AppError> {
    let kind = how.kind;
    require(
        caller,
        Action::Deploy,
        Some(&request.descriptor.application),
    )?;
    let version = request
        .descriptor
        .artifacts
        .first()
        .map(|a| a.version.clone())
        .unwrap_or_default();
    let application = request.descriptor.application.clone();
    let resubmission = submission::resubmit(
        &state.client,
        &state.config,
        source,
        request,
        how,
        &manent_deploy::Submitter::new(&caller.token.name, &caller.token.id),
    )
    .await
    .map_err(resubmit_error)?;
    let submitted = resubmission.submitted;
    if let Some(passed) = &resubmission.forced_past {
        let what = format!("{} of deploy {source} (version {version})", kind.as_str());
        crate::audit::record_forced(state, caller, (&submitted.id, &application), &what, passed)
            .await;
    }
    tracing::info!(deploy = %submitted.id, of = %source, kind = kind.as_str(), by = %caller.token.name, "deploy submitted again");
    Ok((
        StatusCode::CREATED,
        Json(Resubmitted {
            submitted: submitted.to_wire(),
            redeploy_of: source.to_string(),
            redeploy_kind: kind.to_wire(),
            version,
        }),
    ))
}

/// Submit a past deploy's descriptor again.
///
/// The deploy's recorded descriptor, submitted again as it is by the caller, who must be
/// allowed to deploy its recorded application (another tenant's deploy is a 404). A
/// redeploy of a version from before the environment's newest irreversible deploy is
/// refused (409) unless `force` (docs/environments.md, "The rollback guard").
#[utoipa::path(post, path = "/deploys/{id}/redeploy", tag = "deploys", operation_id = "redeployDeploy",
    params(DeployId),
    request_body(content = Option<RedeployBody>, content_type = "application/json",
        description = "Optional: `{\"force\": true}`, or nothing."),
    responses(
        (status = 201, description = "The new deploy, and what it submitted again.", body = Resubmitted),
        (status = 400, description = "The body is not `{\"force\": true}`, or the recorded descriptor is refused today (the environment file or manent.yml changed).", body = ErrorBody),
        (status = 403, description = "The token may not deploy this application.", body = ErrorBody),
        (status = 404, description = "No such deploy (or one the token may not see).", body = ErrorBody),
        (status = 409, description = "It would go back past an irreversible deploy: the message names it, its version and reason, and `force`.", body = ErrorBody),
    ))]
async fn redeploy_deploy(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(DeployId { id }): Path<DeployId>,
    body: String,
) -> Result<(StatusCode, Json<Resubmitted>), AppError> {
    let body: RedeployBody = optional_body(&body, "force", r#"{"force": true}"#)?;
    let deploy = visible_deploy(&state, &caller, &id).await?;
    require(&caller, Action::Deploy, Some(&deploy.application))?;
    let request = submission::recorded_request(&state.client, &id)
        .await
        .map_err(resubmit_error)?;
    let how = submission::Resubmit {
        kind: OriginKind::Redeploy,
        fast: false,
        force: body.force,
    };
    resubmit(&state, &caller, &id, request, how).await
}

/// `{id}` of a deploy's routes.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(super) struct DeployId {
    /// The deploy's id, as answered by the submission.
    pub(super) id: String,
}
