//! Drift: `/apps/{tenant}/{app}/environments/{environment}/drift` (the last result, or a
//! check run now) and `…/reconcile` (docs/plan-and-drift.md). Reading the last result is
//! for whoever may read the application; running a check (it reaches every target) and
//! reconciling (a deploy) are for those who may deploy it.

use std::time::Duration;

use axum::{
    Json,
    extract::{Path, State},
    http::StatusCode,
};
use manent_contract::{DifferenceView, DriftView, ErrorBody, Resubmitted, TargetDriftView};
use manent_deploy::drift::{self, DriftError, DriftReport};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{
    deploys::resubmit_error,
    environments::{EnvironmentPath, visible_environment},
    require,
};
use crate::{
    AppError, AppState,
    auth::{Action, Caller},
    wire::ToWire,
};

/// How long a check run by the API is waited for.
const CHECK_TIMEOUT: Duration = Duration::from_secs(120);

/// This resource's routes, relative to `/api/v1`.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(last_drift, check_drift))
        .routes(routes!(reconcile))
}

/// An environment's last drift result.
///
/// What the last check (`manent drift`, or `drift: {every}`) found; 404 before the first.
/// For tokens that may read the application.
#[utoipa::path(get, path = "/apps/{tenant}/{app}/environments/{environment}/drift",
    tag = "platform", operation_id = "lastDrift",
    params(EnvironmentPath),
    responses(
        (status = 200, description = "The last result, target by target.", body = DriftView),
        (status = 404, description = "No check ran yet, or an application the token may not see.", body = ErrorBody),
    ))]
async fn last_drift(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(path): Path<EnvironmentPath>,
) -> Result<Json<DriftView>, AppError> {
    let (application, environment) = visible_environment(&caller, path)?;
    let report = drift::last(&state.client, &application, &environment)
        .await
        .map_err(drift_error)?
        .ok_or_else(|| {
            AppError::NotFound(format!(
                "no drift check of {application} {environment} yet: run `manent drift {application} {environment}`"
            ))
        })?;
    Ok(Json(view(report)))
}

/// Check an environment's drift now.
///
/// Compares each target with the release manent recorded there, on a worker of the
/// environment's queue, and answers once it is done (at most 120 s). For tokens that may
/// deploy the application: the check reaches every target.
#[utoipa::path(post, path = "/apps/{tenant}/{app}/environments/{environment}/drift",
    tag = "platform", operation_id = "checkDrift",
    params(EnvironmentPath),
    responses(
        (status = 200, description = "The result, target by target.", body = DriftView),
        (status = 403, description = "The token may not deploy this application.", body = ErrorBody),
        (status = 404, description = "An application the token may not see, or no such environment file.", body = ErrorBody),
        (status = 409, description = "The check failed or did not end in time; the message says which and why.", body = ErrorBody),
    ))]
async fn check_drift(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(path): Path<EnvironmentPath>,
) -> Result<Json<DriftView>, AppError> {
    let (application, environment) = visible_environment(&caller, path)?;
    require(&caller, Action::Deploy, Some(&application))?;
    let report = drift::check_now(
        &state.client,
        &state.config,
        &application,
        &environment,
        CHECK_TIMEOUT,
    )
    .await
    .map_err(drift_error)?;
    Ok(Json(view(report)))
}

/// Deploy the live version again to the drifted targets.
///
/// Submits the live deploy's recorded descriptor again, by the caller, to the targets the
/// last drift check found drifted only: a deploy like any other (approvals, limits,
/// routing, audit), shown as a redeploy of the live deploy. 409 when no check ran yet or
/// the last found nothing drifted.
#[utoipa::path(post, path = "/apps/{tenant}/{app}/environments/{environment}/reconcile",
    tag = "deploys", operation_id = "reconcileEnvironment",
    params(EnvironmentPath),
    responses(
        (status = 201, description = "The new deploy, and the live deploy it submitted again.", body = Resubmitted),
        (status = 400, description = "The recorded descriptor is refused today.", body = ErrorBody),
        (status = 403, description = "The token may not deploy this application.", body = ErrorBody),
        (status = 404, description = "An application the token may not see.", body = ErrorBody),
        (status = 409, description = "Nothing to reconcile; the message says why.", body = ErrorBody),
    ))]
async fn reconcile(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(path): Path<EnvironmentPath>,
) -> Result<(StatusCode, Json<Resubmitted>), AppError> {
    let (application, environment) = visible_environment(&caller, path)?;
    require(&caller, Action::Deploy, Some(&application))?;
    let by = manent_deploy::Submitter::new(&caller.token.name, &caller.token.id);
    let reconciled = drift::reconcile::submit(
        &state.client,
        &state.config,
        (&application, &environment),
        &by,
    )
    .await
    .map_err(resubmit_error)?;
    let submitted = reconciled.resubmission.submitted;
    tracing::info!(deploy = %submitted.id, of = %reconciled.source, targets = ?reconciled.targets, by = %caller.token.name, "reconcile submitted");
    Ok((
        StatusCode::CREATED,
        Json(Resubmitted {
            version: reconciled.version,
            submitted: submitted.to_wire(),
            redeploy_of: reconciled.source,
            redeploy_kind: manent_deploy::history::OriginKind::Redeploy.to_wire(),
        }),
    ))
}

fn drift_error(e: DriftError) -> AppError {
    match e {
        DriftError::Environment(message) => AppError::NotFound(message),
        DriftError::Engine(manent_engine::EngineError::WaitTimeout { id, timeout }) => {
            AppError::Conflict(format!(
                "the drift check {id} did not end within {}s: is a worker serving the \
                 environment's queue? `manent drift` shows its result once it ends",
                timeout.as_secs()
            ))
        }
        DriftError::Engine(other) => AppError::from(other),
        failed @ DriftError::Failed { .. } => AppError::Conflict(failed.to_string()),
        unreadable @ DriftError::Unreadable { .. } => AppError::Internal(unreadable.to_string()),
    }
}

/// The wire form of a drift result.
pub(crate) fn view(report: DriftReport) -> DriftView {
    DriftView {
        state: report.state().as_str().into(),
        application: report.application,
        environment: report.environment,
        check_id: report.check_id,
        checked_at: manent_deploy::request::rfc3339(report.checked_at_ms),
        targets: report
            .targets
            .into_iter()
            .map(|t| TargetDriftView {
                name: t.name,
                state: t.state.as_str().into(),
                differences: t
                    .differences
                    .into_iter()
                    .map(|d| DifferenceView {
                        path: d.path,
                        expected: d.expected,
                        found: d.found,
                    })
                    .collect(),
                detail: t.detail,
                version: t.version,
            })
            .collect(),
    }
}

/// An environment's last check as `manent apps` shows it: its state, how many targets
/// drifted, when.
pub(crate) fn check_summary(report: &DriftReport) -> manent_contract::DriftCheckView {
    manent_contract::DriftCheckView {
        state: report.state().as_str().into(),
        drifted_targets: report.drifted().len() as u64,
        targets: report.targets.len() as u64,
        checked_at: manent_deploy::request::rfc3339(report.checked_at_ms),
        check_id: report.check_id.clone(),
    }
}
