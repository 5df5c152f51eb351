//! manent's HTTP API: `/api/v1` (JSON, bearer tokens), `/healthz`, `/readyz`, and the
//! Platform page at `/` (`platform`).
//! The only crate that knows HTTP. `app(state)` builds the router, so tests
//! drive it with `oneshot` and no socket.

mod admin;
pub mod audit;
pub mod auth;
mod error;
mod platform;
mod refusals;

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::{MatchedPath, Path, Query, Request, State},
    http::{StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{delete, get, post},
};
use manent_config::Config;
use manent_deploy::{
    schedules::{self, ScheduleView},
    service::{
        self, Approver, DecideError, DeployStatus, ListFilter, OriginKind, ResubmitError,
        SubmitError, Submitted,
    },
    views::{self, ApplicationView, QueueView, TenantView, WorkerView},
};
use manent_engine::{Client, store};
use serde_json::json;

pub use auth::{Action, Caller, Role};
pub use error::AppError;

/// What every handler shares. Stateless across requests: any number of API
/// instances can serve the same database.
#[derive(Clone)]
pub struct AppState {
    pub client: Client,
    pub config: Arc<Config>,
}

pub fn app(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/deploys", post(submit_deploy).get(list_deploys))
        .route("/deploys/{id}", get(deploy_status))
        .route("/deploys/{id}/logs", get(deploy_logs))
        .route("/deploys/{id}/output", get(deploy_output))
        .route("/deploys/{id}/cancel", post(cancel_deploy))
        .route("/deploys/{id}/approve", post(approve_deploy))
        .route("/deploys/{id}/reject", post(reject_deploy))
        .route("/deploys/{id}/redeploy", post(redeploy_deploy))
        .route(
            "/apps/{tenant}/{app}/environments/{environment}/history",
            get(environment_history),
        )
        .route(
            "/apps/{tenant}/{app}/environments/{environment}/rollback",
            post(rollback_environment),
        )
        .route("/schedules", get(list_schedules))
        .route(
            "/schedules/{id}",
            get(schedule_status).delete(delete_schedule),
        )
        .route("/schedules/{id}/pause", post(pause_schedule))
        .route("/schedules/{id}/resume", post(resume_schedule))
        .route("/activity", get(activity))
        .route("/tenants", get(list_tenants))
        .route("/apps", get(list_applications))
        .route("/workers", get(list_workers))
        .route("/queues", get(list_queues))
        .route("/executors/{id}/recover", post(recover_executor))
        .route("/tokens", get(admin::list_tokens).post(admin::create_token))
        .route("/tokens/{name}", delete(admin::revoke_token))
        .route("/audit", get(admin::list_audit))
        .route("/whoami", get(whoami))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .fallback(|| async {
            AppError::NotFound("no such API route: see /api/v1/openapi.json".into())
        })
        .layer(middleware::map_response(error::json_error_body));
    Router::new()
        .route("/", get(platform::page))
        .route("/platform", get(platform::page))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/api/v1/openapi.json", get(openapi))
        .nest("/api/v1", v1)
        .with_state(state)
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
    let store = state.client.store();
    let caller = match bearer_secret(&request) {
        Some(secret) => match auth::authenticate(store, secret).await {
            Ok(caller) => caller,
            Err(e) => return AppError::from(e).into_response(),
        },
        None => None,
    };
    let Some(caller) = caller else {
        let refused = AppError::Unauthorized.into_response();
        return audit::after_response(store, None, &method, &template, &path, refused).await;
    };
    request.extensions_mut().insert(caller.clone());
    let response = next.run(request).await;
    audit::after_response(store, Some(caller), &method, &template, &path, response).await
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

/// `/metrics`: Prometheus text, without a token (docs/security.md: health and metrics only).
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

async fn list_workers(State(state): State<AppState>) -> Result<Json<Vec<WorkerView>>, AppError> {
    Ok(Json(views::workers(&state.client, &state.config).await?))
}

async fn list_tenants(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Result<Json<Vec<TenantView>>, AppError> {
    // The environments source is a directory tree: read off the async threads.
    let config = state.config.clone();
    let mut tenants = tokio::task::spawn_blocking(move || views::tenants(&config))
        .await
        .map_err(|e| AppError::Internal(format!("reading the environments source: {e}")))?;
    tenants.retain(|t| caller.may_see_tenant(&t.name));
    for tenant in &mut tenants {
        tenant
            .applications
            .retain(|app| caller.may(Action::Read, Some(app)));
    }
    Ok(Json(tenants))
}

async fn list_applications(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Result<Json<Vec<ApplicationView>>, AppError> {
    let visible = |application: &str| caller.may(Action::Read, Some(application));
    Ok(Json(
        views::applications_live(&state.client, &state.config, &visible).await?,
    ))
}

async fn list_queues(State(state): State<AppState>) -> Result<Json<Vec<QueueView>>, AppError> {
    Ok(Json(views::queues(&state.client, &state.config).await?))
}

#[derive(serde::Deserialize)]
struct RecoverQuery {
    /// Recover even an executor whose lease is live (its process is stopped at its next renewal).
    #[serde(default)]
    force: bool,
}

async fn recover_executor(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
    Query(query): Query<RecoverQuery>,
) -> Result<Json<serde_json::Value>, AppError> {
    require(&caller, Action::Administer, None)?;
    let by = format!("token {}", caller.token.name);
    let recovered = state.client.recover_executor(&id, query.force, &by).await?;
    tracing::warn!(executor_id = %id, by = %caller.token.name, force = query.force, count = recovered.len(), "manual recovery");
    Ok(Json(json!({ "executor_id": id, "recovered": recovered })))
}

async fn openapi() -> Result<Json<serde_json::Value>, AppError> {
    // Checked by the openapi tests; a broken document is an error, never `{}`.
    serde_json::from_str(include_str!("openapi.json"))
        .map(Json)
        .map_err(|e| {
            AppError::Internal(format!("the built-in OpenAPI document does not parse: {e}"))
        })
}

#[derive(serde::Deserialize)]
struct SubmitQuery {
    #[serde(default)]
    dry_run: bool,
    /// The descriptor's file name, for messages.
    file: Option<String>,
}

/// `POST /api/v1/deploys`: the body is the descriptor, YAML or JSON. It is parsed first
/// (off the async threads, storing nothing), then the caller is authorised on the parsed
/// `application`, then it is submitted: no text is trusted before it is parsed.
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
    Ok((StatusCode::CREATED, Json(submitted)))
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
        .ok_or_else(|| AppError::NotFound(format!("no deploy `{id}`")))
}

async fn list_deploys(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Query(filter): Query<ListFilter>,
) -> Result<Json<Vec<DeployStatus>>, AppError> {
    let visible = |application: &str| caller.may(Action::Read, Some(application));
    let mut deploys = service::list(&state.client, &filter, &visible).await?;
    deploys.iter_mut().for_each(|d| fill_actions(&caller, d));
    Ok(Json(deploys))
}

async fn deploy_status(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
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
    if deploy.phase == "waiting_approval" && caller.may(Action::Approve, application) {
        actions.extend(["approve".to_string(), "reject".to_string()]);
    }
    if matches!(deploy.status.as_str(), "ENQUEUED" | "PENDING")
        && caller.may(Action::Deploy, application)
    {
        actions.push("cancel".to_string());
    }
    deploy.actions = actions;
}

/// `GET /whoami`: the asking token's name, role and scope.
async fn whoami(axum::Extension(caller): axum::Extension<Caller>) -> Json<serde_json::Value> {
    Json(json!({
        "name": caller.token.name,
        "role": caller.token.role,
        "scope": caller.token.on,
    }))
}

async fn deploy_logs(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, AppError> {
    visible_deploy(&state, &caller, &id).await?;
    let logs = service::logs(&state.client, &id)
        .await?
        .ok_or_else(|| AppError::NotFound(format!("no deploy `{id}`")))?;
    Ok(Json(
        serde_json::to_value(logs).map_err(|e| AppError::Internal(e.to_string()))?,
    ))
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

async fn deploy_output(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
    Query(query): Query<OutputQuery>,
) -> Result<Json<serde_json::Value>, AppError> {
    visible_deploy(&state, &caller, &id).await?;
    let lines = service::output(&state.client, &id, query.after, query.limit).await?;
    Ok(Json(json!({ "id": id, "lines": lines })))
}

async fn cancel_deploy(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Submitted>, AppError> {
    let deploy = visible_deploy(&state, &caller, &id).await?;
    require(&caller, Action::Deploy, Some(&deploy.application))?;
    let status = state.client.cancel(&id).await?;
    tracing::info!(deploy = %id, by = %caller.token.name, "deploy cancelled");
    Ok(Json(Submitted {
        id,
        status: status.to_string(),
        queue: deploy.queue,
    }))
}

/// Body of approve / reject (optional): `{"reason": "…"}`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    reason: Option<String>,
}

/// An optional JSON body: empty is `T::default()`; one that does not parse is a 400 naming
/// `field`, showing the `shape` to send.
fn optional_body<T: Default + serde::de::DeserializeOwned>(
    body: &str,
    field: &str,
    shape: &str,
) -> Result<T, AppError> {
    if body.trim().is_empty() {
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
        .map(Json)
        .ok_or_else(|| AppError::NotFound(format!("no deploy `{id}`")))
}

async fn approve_deploy(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
    body: String,
) -> Result<Json<DeployStatus>, AppError> {
    decide_deploy(state, caller, id, body, true).await
}

async fn reject_deploy(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
    body: String,
) -> Result<Json<DeployStatus>, AppError> {
    decide_deploy(state, caller, id, body, false).await
}

async fn activity(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Result<Json<Vec<DeployStatus>>, AppError> {
    let mut deploys = service::activity(&state.client).await?;
    deploys.retain(|d| caller.may(Action::Read, Some(&d.application)));
    deploys.iter_mut().for_each(|d| fill_actions(&caller, d));
    Ok(Json(deploys))
}

async fn list_schedules(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Result<Json<Vec<ScheduleView>>, AppError> {
    let mut views = schedules::list(&state.client).await?;
    views.retain(|v| caller.may(Action::Read, Some(&v.application)));
    Ok(Json(views))
}

async fn schedule_status(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<ScheduleView>, AppError> {
    schedules::show(&state.client, &id)
        .await?
        .filter(|v| caller.may(Action::Read, Some(&v.application)))
        .map(Json)
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
    Ok(Json(view))
}

async fn pause_schedule(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<ScheduleView>, AppError> {
    set_schedule_paused(state, caller, id, true).await
}

async fn resume_schedule(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<ScheduleView>, AppError> {
    set_schedule_paused(state, caller, id, false).await
}

async fn delete_schedule(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, AppError> {
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
    Ok(Json(json!({ "id": id, "deleted": deleted })))
}

/// What a rollback or redeploy answers: the new deploy, and what it resubmitted.
#[derive(serde::Serialize)]
struct Resubmitted {
    #[serde(flatten)]
    submitted: Submitted,
    /// The deploy whose recorded descriptor was submitted again.
    redeploy_of: String,
    /// `rollback` or `redeploy`.
    redeploy_kind: &'static str,
    /// The version deployed (the first artifact's).
    version: String,
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
            submitted,
            redeploy_of: source.to_string(),
            redeploy_kind: kind.as_str(),
            version,
        }),
    ))
}

/// `POST /deploys/{id}/redeploy`: the deploy's recorded descriptor, submitted again as it
/// is by the caller, who must be allowed to deploy its recorded application (another
/// tenant's deploy is a 404).
async fn redeploy_deploy(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Resubmitted>), AppError> {
    let deploy = visible_deploy(&state, &caller, &id).await?;
    require(&caller, Action::Deploy, Some(&deploy.application))?;
    let request = service::recorded_request(&state.client, &id)
        .await
        .map_err(resubmit_error)?;
    resubmit(&state, &caller, &id, request, OriginKind::Redeploy).await
}

/// `{tenant}/{app}` and `{environment}` of an environment's route, once the caller may read
/// that application: another tenant's environment answers 404, whatever it holds.
fn visible_environment(
    caller: &Caller,
    (tenant, app, environment): (String, String, String),
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

/// `GET /apps/{tenant}/{app}/environments/{environment}/history`: that environment's
/// deploys, newest first.
async fn environment_history(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(path): Path<(String, String, String)>,
    Query(query): Query<HistoryQuery>,
) -> Result<Json<Vec<DeployStatus>>, AppError> {
    let (application, environment) = visible_environment(&caller, path)?;
    Ok(Json(
        service::history(&state.client, &application, &environment, query.limit).await?,
    ))
}

/// Body of a rollback (optional): `{"to": "1.0"}`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RollbackBody {
    to: Option<String>,
}

/// `POST /apps/{tenant}/{app}/environments/{environment}/rollback`: submits again the
/// recorded descriptor of an earlier successful version (`to`, or the one before the live
/// version), as a deploy by the caller. 409 when there is nothing to roll back to.
async fn rollback_environment(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(path): Path<(String, String, String)>,
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
