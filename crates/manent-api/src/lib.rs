//! manent's HTTP API: `/api/v1` (JSON, bearer tokens), `/healthz`, `/readyz`, and the
//! Platform page at `/` (`platform`).
//! The only crate that knows HTTP. `app(state)` builds the router, so tests
//! drive it with `oneshot` and no socket. Every route is added through utoipa-axum with
//! its `#[utoipa::path]`, so the OpenAPI document (`openapi`) is generated from the same
//! calls that build the router; the bodies are `manent-contract`'s types.

mod admin;
pub mod audit;
pub mod auth;
mod error;
pub mod openapi;
mod platform;
mod refusals;
mod wire;

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::{MatchedPath, Path, Query, Request, State},
    http::{StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use manent_config::Config;
use manent_contract::{
    ApplicationView, DecisionBody, DeployAction, DeployLogs, DeployOutput, DeployStatus,
    Descriptor, ErrorBody, QueueView, Recovered, Resubmitted, RollbackBody, ScheduleDeleted,
    ScheduleView, SubmitBatch, Submitted, TenantView, WhoAmI, WorkerView, WorkflowStatus,
};
use manent_deploy::{
    schedules,
    service::{self, Approver, DecideError, ListFilter, OriginKind, ResubmitError, SubmitError},
    views,
};
use manent_engine::{Client, store};
use utoipa_axum::{router::OpenApiRouter, routes};
use wire::ToWire;

pub use auth::{Action, Caller, Role};
pub use error::AppError;

/// What every handler shares. Stateless across requests: any number of API
/// instances can serve the same database.
#[derive(Clone)]
pub struct AppState {
    pub client: Client,
    pub config: Arc<Config>,
}

/// The API's router: the routes of [`routes`], with the token, the audit trail and the
/// JSON error body on `/api/v1`.
pub fn app(state: AppState) -> Router {
    let v1 = v1_routes()
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .fallback(|| async {
            AppError::NotFound("no such API route: see /api/v1/openapi.json".into())
        })
        .layer(middleware::map_response(error::json_error_body));
    let (router, _) = top_routes().nest("/api/v1", v1).split_for_parts();
    router.with_state(state)
}

/// Every route with its documentation: what [`app`] serves and what the OpenAPI document
/// describes (`openapi::document`), built by the same calls.
pub fn routes() -> OpenApiRouter<AppState> {
    top_routes().nest("/api/v1", v1_routes())
}

/// The routes outside the token: the page, health, readiness, metrics and the document.
fn top_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(<openapi::Base as utoipa::OpenApi>::openapi())
        .routes(routes!(platform_page))
        .routes(routes!(platform_page_alias))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(openapi::serve))
}

/// The `/api/v1` routes, relative to it; all behind the token (`require_token`).
fn v1_routes() -> OpenApiRouter<AppState> {
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
        .routes(routes!(environment_history))
        .routes(routes!(rollback_environment))
        .routes(routes!(list_schedules))
        .routes(routes!(schedule_status, delete_schedule))
        .routes(routes!(pause_schedule))
        .routes(routes!(resume_schedule))
        .routes(routes!(activity))
        .routes(routes!(list_tenants))
        .routes(routes!(list_applications))
        .routes(routes!(list_workers))
        .routes(routes!(list_queues))
        .routes(routes!(recover_executor))
        .routes(routes!(admin::list_tokens, admin::create_token))
        .routes(routes!(admin::revoke_token))
        .routes(routes!(admin::list_audit))
        .routes(routes!(whoami))
}

/// The Platform page (docs/api.md).
#[utoipa::path(get, path = "/", tag = "meta", operation_id = "platform_page",
    responses((status = 200, description = "The page: one HTML document that reads \
        everything from `/api/v1` with a token.", content_type = "text/html", body = String)))]
async fn platform_page() -> Response {
    platform::page().await
}

/// The Platform page, also at /platform.
#[utoipa::path(get, path = "/platform", tag = "meta", operation_id = "platform_page_alias",
    responses((status = 200, description = "The page.", content_type = "text/html", body = String)))]
async fn platform_page_alias() -> Response {
    platform::page().await
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "meta", operation_id = "healthz",
    responses((status = 200, description = "`ok`", content_type = "text/plain", body = String)))]
async fn healthz() -> &'static str {
    "ok"
}

/// Every `/api/v1` route needs a known, unexpired bearer token (the scheme in any case:
/// `bearer x` works). Refusals and changes are recorded in the audit trail (`audit`).
async fn require_token(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let template = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| path.clone(), |p| p.as_str().to_string());
    let store = state.client.store().clone();
    let caller = match bearer_secret(&request) {
        Some(secret) => match auth::authenticate(&store, secret).await {
            Ok(caller) => caller,
            Err(e) => return AppError::from(e).into_response(),
        },
        None => None,
    };
    // From here on the request runs to its end and is audited even if its client goes
    // away: hyper drops a request's future when the connection closes, which would stop
    // a handler between two of its writes, or lose the audit entry of a change or a
    // refusal that already happened (a prober closing at once would leave no trace).
    to_completion(async move {
        let Some(caller) = caller else {
            let refused = AppError::Unauthorized.into_response();
            return audit::after_response(&store, None, &method, &template, &path, refused).await;
        };
        request.extensions_mut().insert(caller.clone());
        let response = next.run(request).await;
        audit::after_response(&store, Some(caller), &method, &template, &path, response).await
    })
    .await
}

/// Runs `request` (a handler and its audit entry) on a task of its own and returns its
/// response. Dropping the returned future (the client went away) does not stop it: a
/// change either does not start or runs to its end with its entry written. A panic in
/// the handler is passed on as before; a runtime shutting down answers 500.
async fn to_completion<F>(request: F) -> Response
where
    F: Future<Output = Response> + Send + 'static,
{
    match tokio::spawn(request).await {
        Ok(response) => response,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => AppError::Internal(
            "the server shut down while the request ran: it may or may not have been applied"
                .into(),
        )
        .into_response(),
    }
}

/// The secret of an `Authorization: Bearer <secret>` header; the scheme is
/// case-insensitive (RFC 9110 §11.1).
fn bearer_secret(request: &Request) -> Option<&str> {
    let value = request
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, secret) = value.trim().split_once(' ')?;
    let secret = secret.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !secret.is_empty()).then_some(secret)
}

fn require(caller: &Caller, action: Action, application: Option<&str>) -> Result<(), AppError> {
    if caller.may(action, application) {
        Ok(())
    } else {
        let what = match (action, application) {
            (Action::Read, _) => "read".to_string(),
            (Action::Deploy, Some(app)) => format!("deploy {app}"),
            (Action::Approve, Some(app)) => format!("approve deploys of {app}"),
            (Action::Administer, _) => "administer manent".to_string(),
            (a, None) => format!("{a:?}").to_lowercase(),
        };
        Err(AppError::Forbidden {
            token: caller.token.name.clone(),
            action: what,
        })
    }
}

/// The database is reachable and its schema current.
#[utoipa::path(get, path = "/readyz", tag = "meta", operation_id = "readyz",
    responses(
        (status = 200, description = "`ready`", content_type = "text/plain", body = String),
        (status = 503, description = "The database is unreachable or its schema is behind; \
            the text says which and what to run.", content_type = "text/plain", body = String),
    ))]
async fn readyz(State(state): State<AppState>) -> Response {
    match state.client.store().schema_version().await {
        Ok(v) if v >= store::expected_schema_version() => (StatusCode::OK, "ready").into_response(),
        Ok(v) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "schema version {v}, expected {}: run `manent-server admin migrate`",
                store::expected_schema_version()
            ),
        )
            .into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("database unreachable: {e}"),
        )
            .into_response(),
    }
}

/// Prometheus metrics.
///
/// Prometheus text, without a token (docs/security.md: health and metrics only).
#[utoipa::path(get, path = "/metrics", tag = "meta", operation_id = "metrics",
    responses(
        (status = 200, description = "Prometheus text format 0.0.4.", content_type = "text/plain", body = String),
        (status = 500, description = "An internal error.", body = ErrorBody),
        (status = 503, description = "The database is unavailable.", body = ErrorBody),
    ))]
async fn metrics(State(state): State<AppState>) -> Result<Response, AppError> {
    let mut text = manent_deploy::metrics::render(&state.client, &state.config).await?;
    text.push_str(&refusals::metrics_text());
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// The workers (executors).
#[utoipa::path(get, path = "/workers", tag = "platform", operation_id = "listWorkers",
    responses((status = 200, description = "Every worker that registered, as `manent workers` shows them.", body = Vec<WorkerView>)))]
async fn list_workers(State(state): State<AppState>) -> Result<Json<Vec<WorkerView>>, AppError> {
    Ok(Json(
        views::workers(&state.client, &state.config)
            .await?
            .to_wire(),
    ))
}

/// Tenants.
#[utoipa::path(get, path = "/tenants", tag = "platform", operation_id = "listTenants",
    responses((status = 200, description = "The tenants the token may see, with their applications.", body = Vec<TenantView>)))]
async fn list_tenants(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Result<Json<Vec<TenantView>>, AppError> {
    // The environments source is a directory tree: read off the async threads.
    let config = state.config.clone();
    let mut tenants = tokio::task::spawn_blocking(move || views::tenants(&config))
        .await
        .map_err(|e| AppError::Internal(format!("reading the environments source: {e}")))??;
    tenants.retain(|t| caller.may_see_tenant(&t.name));
    for tenant in &mut tenants {
        tenant
            .applications
            .retain(|app| caller.may(Action::Read, Some(app)));
    }
    Ok(Json(tenants.to_wire()))
}

/// Applications.
#[utoipa::path(get, path = "/apps", tag = "platform", operation_id = "listApplications",
    responses((status = 200, description = "The applications the token may see, with their environments and live versions.", body = Vec<ApplicationView>)))]
async fn list_applications(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Result<Json<Vec<ApplicationView>>, AppError> {
    let visible = |application: &str| caller.may(Action::Read, Some(application));
    Ok(Json(
        views::applications_live(&state.client, &state.config, &visible)
            .await?
            .to_wire(),
    ))
}

/// The queues, with their kinds, limits, depths and workers.
#[utoipa::path(get, path = "/queues", tag = "platform", operation_id = "listQueues",
    responses((status = 200, description = "Every queue, as `manent queues` shows them.", body = Vec<QueueView>)))]
async fn list_queues(State(state): State<AppState>) -> Result<Json<Vec<QueueView>>, AppError> {
    Ok(Json(
        views::queues(&state.client, &state.config).await?.to_wire(),
    ))
}

#[derive(serde::Deserialize)]
struct RecoverQuery {
    /// Recover even an executor whose lease is live (its process is stopped at its next renewal).
    #[serde(default)]
    force: bool,
}

/// Put a lost worker's deploys back on their queues.
///
/// Admin role only. Refused while the executor's lease is live, unless `force`.
#[utoipa::path(post, path = "/executors/{id}/recover", tag = "platform", operation_id = "recoverExecutor",
    params(
        ("id" = String, Path, description = "The executor id (`dbos.executor_id` of the worker)."),
        ("force" = Option<bool>, Query, description = "Recover even an executor whose lease is live (revokes the lease)."),
    ),
    responses(
        (status = 200, description = "The deploys put back on their queues.", body = Recovered),
        (status = 400, description = "The query string cannot be read.", body = ErrorBody),
        (status = 403, description = "Not an admin.", body = ErrorBody),
        (status = 404, description = "No such executor.", body = ErrorBody),
        (status = 409, description = "Its lease is live (send `force=true`).", body = ErrorBody),
    ))]
async fn recover_executor(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
    Query(query): Query<RecoverQuery>,
) -> Result<Json<Recovered>, AppError> {
    require(&caller, Action::Administer, None)?;
    let by = format!("token {}", caller.token.name);
    let recovered = state.client.recover_executor(&id, query.force, &by).await?;
    tracing::warn!(executor_id = %id, by = %caller.token.name, force = query.force, count = recovered.len(), "manual recovery");
    Ok(Json(Recovered {
        executor_id: id,
        recovered,
    }))
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
    let descriptor = service::parse(body, file).await.map_err(submit_error)?;
    require(&caller, Action::Deploy, Some(&descriptor.application))?;
    let submitted = service::submit(
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
    let descriptors = service::parse_many(entries).await.map_err(submit_error)?;
    // Parsed, then authorised: every application before anything is stored.
    for (i, descriptor) in descriptors.iter().enumerate() {
        if !caller.may(Action::Deploy, Some(&descriptor.application)) {
            return Err(AppError::Forbidden {
                token: caller.token.name.clone(),
                action: format!("deploy {} (deploys[{i}])", descriptor.application),
            });
        }
    }
    let submitted = service::submit_many(
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

/// The deploy `id` if the caller may see it. Another tenant's deploy answers 404 like a
/// deploy that does not exist: a scoped token learns nothing of what it may not read.
async fn visible_deploy(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<DeployStatus, AppError> {
    service::status(&state.client, id)
        .await?
        .filter(|deploy| caller.may(Action::Read, Some(&deploy.application)))
        .map(ToWire::to_wire)
        .ok_or_else(|| AppError::NotFound(format!("no deploy `{id}`")))
}

/// List deploys, newest first.
#[utoipa::path(get, path = "/deploys", tag = "deploys", operation_id = "listDeploys",
    params(
        ("application" = Option<String>, Query, description = "Only this application (`tenant/app`).", example = "ml/trainer"),
        ("environment" = Option<String>, Query, description = "Only this environment.", example = "prod"),
        ("status" = Option<manent_contract::StatusFilter>, Query, description = "Only this status: ENQUEUED, PENDING, SUCCESS, ERROR or CANCELLED (any case). Another value is a 400."),
        ("limit" = Option<i64>, Query, description = "At most this many deploys; clamped to 1..1000."),
    ),
    responses(
        (status = 200, description = "The deploys the token may see (steps empty).", body = Vec<DeployStatus>),
        (status = 400, description = "An unknown status, or a query string that cannot be read.", body = ErrorBody),
    ))]
async fn list_deploys(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Query(filter): Query<ListFilter>,
) -> Result<Json<Vec<DeployStatus>>, AppError> {
    let visible = |application: &str| caller.may(Action::Read, Some(application));
    let mut deploys = service::list(&state.client, &filter, &visible)
        .await?
        .to_wire();
    deploys.iter_mut().for_each(|d| fill_actions(&caller, d));
    Ok(Json(deploys))
}

/// The status of one deploy.
#[utoipa::path(get, path = "/deploys/{id}", tag = "deploys", operation_id = "getDeploy",
    params(DeployId),
    responses(
        (status = 200, description = "The deploy, with its targets and steps.", body = DeployStatus),
        (status = 404, description = "No such deploy (or one the token may not see).", body = ErrorBody),
    ))]
async fn deploy_status(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(DeployId { id }): Path<DeployId>,
) -> Result<Json<DeployStatus>, AppError> {
    let mut deploy = visible_deploy(&state, &caller, &id).await?;
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
    if matches!(
        deploy.status,
        WorkflowStatus::Enqueued | WorkflowStatus::Pending
    ) && caller.may(Action::Deploy, application)
    {
        actions.push(DeployAction::Cancel);
    }
    deploy.actions = actions;
}

/// The asking token.
#[utoipa::path(get, path = "/whoami", tag = "tokens", operation_id = "whoami",
    responses((status = 200, description = "The token's name, role and scope.", body = WhoAmI)))]
async fn whoami(axum::Extension(caller): axum::Extension<Caller>) -> Json<WhoAmI> {
    Json(WhoAmI {
        name: caller.token.name.clone(),
        role: caller.token.role.into(),
        scope: caller.token.on.clone(),
    })
}

/// The log lines of one deploy.
#[utoipa::path(get, path = "/deploys/{id}/logs", tag = "deploys", operation_id = "getDeployLogs",
    params(DeployId),
    responses(
        (status = 200, description = "Its submission, steps, output, recoveries and targets, in time order.", body = DeployLogs),
        (status = 404, description = "No such deploy (or one the token may not see).", body = ErrorBody),
    ))]
async fn deploy_logs(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(DeployId { id }): Path<DeployId>,
) -> Result<Json<DeployLogs>, AppError> {
    visible_deploy(&state, &caller, &id).await?;
    service::logs(&state.client, &id)
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
    let lines = service::output(&state.client, &id, query.after, query.limit)
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
    Ok(Json(Submitted {
        id,
        status: status.to_wire().into(),
        queue: deploy.queue,
    }))
}

/// An optional JSON body: empty (or JSON `null`) is `T::default()`; one that does not parse
/// is a 400 naming `field`, showing the `shape` to send.
fn optional_body<T: Default + serde::de::DeserializeOwned>(
    body: &str,
    field: &str,
    shape: &str,
) -> Result<T, AppError> {
    if matches!(body.trim(), "" | "null") {
        return Ok(T::default());
    }
    serde_json::from_str(body)
        .map_err(|e| AppError::bad_request(field, format!("body: {e}; send {shape} or nothing")))
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
    let body: DecisionBody = optional_body(&body, "reason", r#"{"reason": "…"}"#)?;
    let deploy = visible_deploy(&state, &caller, &id).await?;
    require(&caller, Action::Approve, Some(&deploy.application))?;
    let approver = Approver {
        name: caller.token.name.clone(),
        token_id: caller.token.id.clone(),
        role: caller.token.role.to_string(),
    };
    match service::decide(&state.client, &id, &approver, approve, body.reason).await {
        Ok(()) => {}
        Err(DecideError::NotFound(m)) => {
            return Err(AppError::NotFound(format!("no deploy `{m}`")));
        }
        Err(DecideError::NotWaiting(m)) => return Err(AppError::Conflict(m)),
        Err(DecideError::Forbidden(m)) => {
            return Err(AppError::Forbidden {
                token: caller.token.name.clone(),
                action: m,
            });
        }
        Err(DecideError::Engine(e)) => return Err(e.into()),
    }
    tracing::info!(deploy = %id, by = %caller.token.name, approve, "approval decision");
    service::status(&state.client, &id)
        .await?
        .map(|deploy| Json(deploy.to_wire()))
        .ok_or_else(|| AppError::NotFound(format!("no deploy `{id}`")))
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
    let mut deploys = service::activity(&state.client).await?.to_wire();
    deploys.retain(|d| caller.may(Action::Read, Some(&d.application)));
    deploys.iter_mut().for_each(|d| fill_actions(&caller, d));
    Ok(Json(deploys))
}

/// The recurring schedules.
#[utoipa::path(get, path = "/schedules", tag = "schedules", operation_id = "listSchedules",
    responses((status = 200, description = "The schedules the token may see.", body = Vec<ScheduleView>)))]
async fn list_schedules(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Result<Json<Vec<ScheduleView>>, AppError> {
    let mut views = schedules::list(&state.client).await?.to_wire();
    views.retain(|v| caller.may(Action::Read, Some(&v.application)));
    Ok(Json(views))
}

/// One schedule.
#[utoipa::path(get, path = "/schedules/{id}", tag = "schedules", operation_id = "getSchedule",
    params(ScheduleId),
    responses(
        (status = 200, description = "The schedule.", body = ScheduleView),
        (status = 404, description = "No such schedule (or one the token may not see).", body = ErrorBody),
    ))]
async fn schedule_status(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(ScheduleId { id }): Path<ScheduleId>,
) -> Result<Json<ScheduleView>, AppError> {
    schedules::show(&state.client, &id)
        .await?
        .filter(|v| caller.may(Action::Read, Some(&v.application)))
        .map(|view| Json(view.to_wire()))
        .ok_or_else(|| AppError::NotFound(format!("no schedule `{id}`")))
}

/// The schedule, once the caller may deploy its application.
async fn schedule_for_deployer(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<schedules::ScheduleRecord, AppError> {
    let record = schedules::get(&state.client, id)
        .await?
        .filter(|r| caller.may(Action::Read, Some(&r.descriptor.application)))
        .ok_or_else(|| AppError::NotFound(format!("no schedule `{id}`")))?;
    require(caller, Action::Deploy, Some(&record.descriptor.application))?;
    Ok(record)
}

async fn set_schedule_paused(
    state: AppState,
    caller: Caller,
    id: String,
    paused: bool,
) -> Result<Json<ScheduleView>, AppError> {
    schedule_for_deployer(&state, &caller, &id).await?;
    let view = schedules::set_paused(&state.client, &id, paused)
        .await?
        .ok_or_else(|| AppError::NotFound(format!("no schedule `{id}`")))?;
    tracing::info!(schedule = %id, paused, by = %caller.token.name, "schedule paused or resumed");
    Ok(Json(view.to_wire()))
}

/// Pause a schedule.
#[utoipa::path(post, path = "/schedules/{id}/pause", tag = "schedules", operation_id = "pauseSchedule",
    params(ScheduleId),
    responses(
        (status = 200, description = "The schedule, paused.", body = ScheduleView),
        (status = 403, description = "The token may not deploy its application.", body = ErrorBody),
        (status = 404, description = "No such schedule (or one the token may not see).", body = ErrorBody),
    ))]
async fn pause_schedule(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(ScheduleId { id }): Path<ScheduleId>,
) -> Result<Json<ScheduleView>, AppError> {
    set_schedule_paused(state, caller, id, true).await
}

/// Resume a paused schedule.
#[utoipa::path(post, path = "/schedules/{id}/resume", tag = "schedules", operation_id = "resumeSchedule",
    params(ScheduleId),
    responses(
        (status = 200, description = "The schedule, resumed.", body = ScheduleView),
        (status = 403, description = "The token may not deploy its application.", body = ErrorBody),
        (status = 404, description = "No such schedule (or one the token may not see).", body = ErrorBody),
    ))]
async fn resume_schedule(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(ScheduleId { id }): Path<ScheduleId>,
) -> Result<Json<ScheduleView>, AppError> {
    set_schedule_paused(state, caller, id, false).await
}

/// Delete a schedule.
#[utoipa::path(delete, path = "/schedules/{id}", tag = "schedules", operation_id = "deleteSchedule",
    params(ScheduleId),
    responses(
        (status = 200, description = "Deleted.", body = ScheduleDeleted),
        (status = 403, description = "The token may not deploy its application.", body = ErrorBody),
        (status = 404, description = "No such schedule (or one the token may not see).", body = ErrorBody),
    ))]
async fn delete_schedule(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(ScheduleId { id }): Path<ScheduleId>,
) -> Result<Json<ScheduleDeleted>, AppError> {
    match schedule_for_deployer(&state, &caller, &id).await {
        Ok(_) => {}
        // A record that cannot be read names no application: only an unscoped
        // admin may remove it (the error said to fix or delete it).
        Err(AppError::Internal(_)) if caller.may(Action::Administer, None) => {
            tracing::warn!(schedule = %id, by = %caller.token.name, "deleting a schedule that cannot be read");
        }
        Err(e) => return Err(e),
    }
    let deleted = schedules::delete(&state.client, &id).await?;
    tracing::info!(schedule = %id, by = %caller.token.name, "schedule deleted");
    Ok(Json(ScheduleDeleted { id, deleted }))
}

fn resubmit_error(e: ResubmitError) -> AppError {
    match e {
        ResubmitError::NotFound(m) => AppError::NotFound(m),
        ResubmitError::Nothing(m) => AppError::Conflict(m),
        ResubmitError::Submit(e) => submit_error(e),
    }
}

/// Submits `request` (recorded by deploy `source`) again for `caller`, once the caller may
/// deploy its recorded application.
async fn resubmit(
    state: &AppState,
    caller: &Caller,
    source: &str,
    request: manent_deploy::DeployRequest,
    kind: OriginKind,
) -> Result<(StatusCode, Json<Resubmitted>), AppError> {
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
    let submitted = service::resubmit(
        &state.client,
        &state.config,
        source,
        request,
        kind,
        &manent_deploy::Submitter::new(&caller.token.name, &caller.token.id),
    )
    .await
    .map_err(resubmit_error)?;
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
/// allowed to deploy its recorded application (another tenant's deploy is a 404).
#[utoipa::path(post, path = "/deploys/{id}/redeploy", tag = "deploys", operation_id = "redeployDeploy",
    params(DeployId),
    responses(
        (status = 201, description = "The new deploy, and what it submitted again.", body = Resubmitted),
        (status = 400, description = "The recorded descriptor is refused today (the environment file or manent.yml changed).", body = ErrorBody),
        (status = 403, description = "The token may not deploy this application.", body = ErrorBody),
        (status = 404, description = "No such deploy (or one the token may not see).", body = ErrorBody),
    ))]
async fn redeploy_deploy(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(DeployId { id }): Path<DeployId>,
) -> Result<(StatusCode, Json<Resubmitted>), AppError> {
    let deploy = visible_deploy(&state, &caller, &id).await?;
    require(&caller, Action::Deploy, Some(&deploy.application))?;
    let request = service::recorded_request(&state.client, &id)
        .await
        .map_err(resubmit_error)?;
    resubmit(&state, &caller, &id, request, OriginKind::Redeploy).await
}

/// `{id}` of a deploy's routes.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
struct DeployId {
    /// The deploy's id, as answered by the submission.
    id: String,
}

/// `{id}` of a schedule's routes.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
struct ScheduleId {
    /// The schedule's id, as answered by the submission of its descriptor.
    id: String,
}

/// `{tenant}/{app}/environments/{environment}` of an environment's routes.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
struct EnvironmentPath {
    /// The application's tenant (`acme` of `acme/web`).
    #[param(example = "acme")]
    tenant: String,
    /// The application's name within its tenant (`web` of `acme/web`).
    #[param(example = "web")]
    app: String,
    /// The environment.
    #[param(example = "prod")]
    environment: String,
}

/// `tenant/app` and the environment of an environment's route, once the caller may read
/// that application: another tenant's environment answers 404, whatever it holds.
fn visible_environment(
    caller: &Caller,
    EnvironmentPath {
        tenant,
        app,
        environment,
    }: EnvironmentPath,
) -> Result<(String, String), AppError> {
    let application = format!("{tenant}/{app}");
    if caller.may(Action::Read, Some(&application)) {
        Ok((application, environment))
    } else {
        Err(AppError::NotFound(format!(
            "no deploys of {application} {environment}"
        )))
    }
}

#[derive(serde::Deserialize)]
struct HistoryQuery {
    limit: Option<i64>,
}

/// One environment's deploys, newest first.
#[utoipa::path(get, path = "/apps/{tenant}/{app}/environments/{environment}/history",
    tag = "deploys", operation_id = "environmentHistory",
    params(
        EnvironmentPath,
        ("limit" = Option<i64>, Query, description = "At most this many deploys; clamped to 1..1000."),
    ),
    responses(
        (status = 200, description = "Its deploys, all statuses, dry runs included.", body = Vec<DeployStatus>),
        (status = 400, description = "The query string cannot be read.", body = ErrorBody),
        (status = 404, description = "An application the token may not see.", body = ErrorBody),
    ))]
async fn environment_history(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(path): Path<EnvironmentPath>,
    Query(query): Query<HistoryQuery>,
) -> Result<Json<Vec<DeployStatus>>, AppError> {
    let (application, environment) = visible_environment(&caller, path)?;
    Ok(Json(
        service::history(&state.client, &application, &environment, query.limit)
            .await?
            .to_wire(),
    ))
}

/// Deploy an earlier successful version again.
///
/// Submits again the recorded descriptor of an earlier successful version (`to`, or the
/// one before the live version), as a deploy by the caller. 409 when there is nothing to
/// roll back to.
#[utoipa::path(post, path = "/apps/{tenant}/{app}/environments/{environment}/rollback",
    tag = "deploys", operation_id = "rollbackEnvironment",
    params(
        EnvironmentPath,
    ),
    request_body(content = Option<RollbackBody>, content_type = "application/json",
        description = "Optional: `{\"to\": \"<version>\"}`, or nothing."),
    responses(
        (status = 201, description = "The new deploy, and what it submitted again.", body = Resubmitted),
        (status = 400, description = "The body is not `{\"to\": \"…\"}`, or the recorded descriptor is refused today.", body = ErrorBody),
        (status = 403, description = "The token may not deploy this application.", body = ErrorBody),
        (status = 404, description = "An application the token may not see.", body = ErrorBody),
        (status = 409, description = "Nothing to roll back to; the message says what there is.", body = ErrorBody),
    ))]
async fn rollback_environment(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(path): Path<EnvironmentPath>,
    body: String,
) -> Result<(StatusCode, Json<Resubmitted>), AppError> {
    let body: RollbackBody = optional_body(&body, "to", r#"{"to": "<version>"}"#)?;
    let (application, environment) = visible_environment(&caller, path)?;
    require(&caller, Action::Deploy, Some(&application))?;
    let (source, request) = service::rollback_source(
        &state.client,
        &application,
        &environment,
        body.to.as_deref(),
    )
    .await
    .map_err(resubmit_error)?;
    resubmit(&state, &caller, &source, request, OriginKind::Rollback).await
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::{body::Body, http::Request as HttpRequest};
    use manent_engine::now_ms;
    use manent_testkit::{Db, TestDb};
    use tokio::sync::Notify;
    use tower::ServiceExt;

    use super::*;

    const WAIT: Duration = Duration::from_secs(60);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_change_whose_client_goes_away_mid_request_still_completes_and_is_audited() {
        let db = TestDb::new(Db::Sqlite).await;
        let store = store::open(&db.url).await.expect("open the test database");
        let config = Config::from_yaml_str(
            &format!(
                "database: {{url: {}}}\n",
                serde_json::to_string(&db.url).unwrap()
            ),
            "manent.yml",
            std::iter::empty(),
        )
        .expect("a valid configuration");
        let state = AppState {
            client: Client::new(store.clone()),
            config: Arc::new(config),
        };
        let token = auth::create_token(&store, "ops", Role::Admin, None)
            .await
            .expect("create a token");
        // A change in two halves with the client's departure between them: the handler
        // says it started, then waits for the test before it writes.
        let (started, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let (s, g, handler_store) = (started.clone(), gate.clone(), store.clone());
        // The handler answers every path (a fallback, not a route of the API).
        let router = Router::new()
            .fallback(move || async move {
                s.notify_one();
                g.notified().await;
                handler_store
                    .put_record("probe", "change", "done", now_ms())
                    .await
                    .expect("the change's write");
                "done"
            })
            .layer(middleware::from_fn_with_state(state, require_token));
        let request = HttpRequest::post("/changes")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap();
        let call = tokio::spawn(router.oneshot(request));
        started.notified().await;
        // What hyper does when the connection closes: the request's future is dropped.
        call.abort();
        assert!(
            call.await.is_err_and(|e| e.is_cancelled()),
            "the request's own future is gone"
        );
        gate.notify_one();
        let entry = manent_testkit::eventually("the change's audit entry", WAIT, || async {
            audit::list(&store, 10)
                .await
                .expect("read the audit trail")
                .into_iter()
                .find(|e| e.action == "change.create")
        })
        .await;
        assert_eq!(
            (entry.actor.as_str(), entry.outcome),
            ("ops", 200),
            "the entry names who made the change and that it succeeded"
        );
        assert_eq!(
            store
                .get_record("probe", "change")
                .await
                .expect("read the probe")
                .as_deref(),
            Some("done"),
            "the change ran to its end although nobody waited for it"
        );
    }
}
