//! Tenants, applications and environments: `/tenants`, `/apps`, one environment's history,
//! its rollback and its variables.

use axum::{
    Json,
    extract::{Path, Query, State},
    http::StatusCode,
};
use manent_contract::{
    ApplicationView, DeployStatus, ErrorBody, Resubmitted, RollbackBody, TenantView, VariableView,
};
use manent_deploy::{
    history::OriginKind,
    submission::{self},
    vars::listing,
    views::deploy_views::{self},
    views::platform,
};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{
    deploys::{resubmit, resubmit_error},
    optional_body, require,
};
use crate::{
    AppError, AppState,
    auth::{Action, Caller},
    wire::ToWire,
};

/// This resource's routes, relative to `/api/v1`.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(environment_history))
        .routes(routes!(rollback_environment))
        .routes(routes!(environment_variables))
        .routes(routes!(list_tenants))
        .routes(routes!(list_applications))
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
    let mut tenants = tokio::task::spawn_blocking(move || platform::tenants(&config))
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
    let mut apps = platform::applications_live(&state.client, &state.config, &visible)
        .await?
        .to_wire();
    for app in &mut apps {
        app.can_deploy = caller.may(Action::Deploy, Some(&app.application));
        // Each environment's last drift check (docs/plan-and-drift.md).
        for environment in &app.environments {
            let last = manent_deploy::drift::last(&state.client, &app.application, environment)
                .await
                .map_err(|e| AppError::Internal(e.to_string()))?;
            if let Some(report) = last {
                app.drift
                    .insert(environment.clone(), report.state().as_str().into());
                let check = crate::routes::drift::check_summary(&report);
                app.drift_checks.insert(environment.clone(), check);
            }
        }
    }
    Ok(Json(apps))
}

/// `{tenant}/{app}/environments/{environment}` of an environment's routes.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct EnvironmentPath {
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
pub(crate) fn visible_environment(
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
    before: Option<String>,
}

/// One environment's deploys, newest first.
#[utoipa::path(get, path = "/apps/{tenant}/{app}/environments/{environment}/history",
    tag = "deploys", operation_id = "environmentHistory",
    params(
        EnvironmentPath,
        ("limit" = Option<i64>, Query, description = "At most this many deploys; clamped to 1..1000."),
        ("before" = Option<String>, Query, description = "Only deploys submitted before this one (the last of the previous page): the next page."),
    ),
    responses(
        (status = 200, description = "Its deploys, all statuses, dry runs included.", body = Vec<DeployStatus>),
        (status = 400, description = "The query string cannot be read.", body = ErrorBody),
        (status = 404, description = "An application the token may not see, or a `before` that names no deploy it may see.", body = ErrorBody),
    ))]
async fn environment_history(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(path): Path<EnvironmentPath>,
    Query(query): Query<HistoryQuery>,
) -> Result<Json<Vec<DeployStatus>>, AppError> {
    let (application, environment) = visible_environment(&caller, path)?;
    let before = super::deploys::cursor(&query.before);
    if let Some(before) = before {
        super::deploys::check_cursor(&state, &caller, before).await?;
    }
    Ok(Json(
        deploy_views::history(
            &state.client,
            &application,
            &environment,
            query.limit,
            before,
        )
        .await?
        .to_wire(),
    ))
}

/// Deploy an earlier successful version again.
///
/// Submits again the recorded descriptor of an earlier successful version (`to`, or the
/// one before the live version), as a deploy by the caller. 409 when there is nothing to
/// roll back to, or when it would go back past the environment's newest irreversible
/// deploy without `force` (docs/environments.md, "The rollback guard").
#[utoipa::path(post, path = "/apps/{tenant}/{app}/environments/{environment}/rollback",
    tag = "deploys", operation_id = "rollbackEnvironment",
    params(
        EnvironmentPath,
    ),
    request_body(content = Option<RollbackBody>, content_type = "application/json",
        description = "Optional: `{\"to\": \"<version>\", \"fast\": true, \"force\": true}` (any of the keys), or nothing."),
    responses(
        (status = 201, description = "The new deploy, and what it submitted again.", body = Resubmitted),
        (status = 400, description = "The body is not `{\"to\": \"…\"}`, or the recorded descriptor is refused today.", body = ErrorBody),
        (status = 403, description = "The token may not deploy this application.", body = ErrorBody),
        (status = 404, description = "An application the token may not see.", body = ErrorBody),
        (status = 409, description = "Nothing to roll back to (the message says what there is), or it would go back past an irreversible deploy (the message names it, its version and reason, and `force`).", body = ErrorBody),
    ))]
async fn rollback_environment(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(path): Path<EnvironmentPath>,
    body: String,
) -> Result<(StatusCode, Json<Resubmitted>), AppError> {
    let body: RollbackBody = optional_body(
        &body,
        "to",
        r#"{"to": "<version>", "fast": true, "force": true} (any of the keys)"#,
    )?;
    let (application, environment) = visible_environment(&caller, path)?;
    require(&caller, Action::Deploy, Some(&application))?;
    let (source, request) = submission::rollback_source(
        &state.client,
        &application,
        &environment,
        body.to.as_deref(),
    )
    .await
    .map_err(resubmit_error)?;
    let how = submission::Resubmit {
        kind: OriginKind::Rollback,
        fast: body.fast,
        force: body.force,
    };
    resubmit(&state, &caller, &source, request, how).await
}

#[derive(serde::Deserialize)]
struct VariablesQuery {
    target: Option<String>,
}

/// One environment's variables per target.
///
/// Each variable's effective value for each target of the environment file as it is now,
/// and where it came from (docs/environments.md, "Variables"); each secret as `***` with
/// its provider. Nothing is read from a secret provider. For tokens that may deploy the
/// application.
#[utoipa::path(get, path = "/apps/{tenant}/{app}/environments/{environment}/vars",
    tag = "platform", operation_id = "environmentVariables",
    params(
        EnvironmentPath,
        ("target" = Option<String>, Query, description = "Only this target's variables."),
    ),
    responses(
        (status = 200, description = "By target in the file's order, then by name.", body = Vec<VariableView>),
        (status = 400, description = "The target is not one of the environment's.", body = ErrorBody),
        (status = 403, description = "The token may not deploy this application.", body = ErrorBody),
        (status = 404, description = "An application the token may not see, or no such environment file.", body = ErrorBody),
        (status = 409, description = "The environment file is invalid now; the message says where.", body = ErrorBody),
    ))]
async fn environment_variables(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(path): Path<EnvironmentPath>,
    Query(query): Query<VariablesQuery>,
) -> Result<Json<Vec<VariableView>>, AppError> {
    let (application, environment) = visible_environment(&caller, path)?;
    require(&caller, Action::Deploy, Some(&application))?;
    // An environment file and its templates read from disk: off the async threads.
    let config = state.config.clone();
    let rows = tokio::task::spawn_blocking(move || {
        // `?target=`, as a form sends an unused field: every target.
        let target = query.target.as_deref().filter(|t| !t.is_empty());
        listing::variables(&config, &application, &environment, target)
    })
    .await
    .map_err(|e| AppError::Internal(format!("reading the environment file: {e}")))?
    .map_err(|e| match e {
        listing::ListingError::UnknownTarget { .. } => {
            AppError::bad_request("target", e.to_string())
        }
        listing::ListingError::Environment(model) => match model {
            manent_model::ModelError::EnvironmentUnavailable { .. } => {
                AppError::NotFound(model.to_string())
            }
            // A name no application can have has no environment file, as for every other
            // route under /apps (its history is a 404 too).
            manent_model::ModelError::InvalidName { .. } => AppError::NotFound(model.to_string()),
            other => AppError::Conflict(other.to_string()),
        },
    })?;
    Ok(Json(rows.to_wire()))
}
