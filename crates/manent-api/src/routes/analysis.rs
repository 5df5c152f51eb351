//! `/deploys/{id}/promote` and `/deploys/{id}/abort`: a decision on a deploy's analysis
//! (docs/analysis.md), under the permission of approve and reject.

use axum::{
    Json,
    extract::{Path, State},
};
use manent_contract::{
    DecisionBody, DeployStatus, ErrorBody, PlannedBakeView, PlannedMetricView, PlannedQueryView,
};
use manent_deploy::{
    analysis::{
        decide::{self, AnalysisDecideError, Decider},
        plan,
    },
    request::Phase,
    views::deploy_views,
};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::deploys::{DeployId, for_caller, visible_deploy};
use super::{optional_body, require};
use crate::{
    AppError, AppState,
    auth::{Action, Caller},
};

/// This resource's routes, relative to `/api/v1`.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(promote_deploy))
        .routes(routes!(abort_deploy))
}

/// Whether `caller` may promote or abort `deploy` now, for the page's buttons: it bakes a
/// wave or waits for a decision, and the caller may approve its application's deploys (the
/// route checks again).
pub(super) fn may_decide(caller: &Caller, deploy: &DeployStatus) -> bool {
    let deciding = matches!(
        Phase::parse_text(deploy.phase.as_str()),
        Phase::WaitingDecision | Phase::BakeAfterWave(_)
    );
    deciding
        && !deploy.status.is_terminal()
        && caller.may(Action::Approve, Some(&deploy.application))
}

/// A decision on a deploy (approve or reject, promote or abort): the optional body
/// `{"reason": "…"}`, a deploy the caller sees, approve's permission on its application,
/// then `decide` with the reason; answers the deploy after it.
pub(super) async fn decision(
    state: &AppState,
    caller: &Caller,
    id: &str,
    body: &str,
    decide: impl AsyncFnOnce(Option<String>) -> Result<(), AppError>,
) -> Result<Json<DeployStatus>, AppError> {
    let body: DecisionBody = optional_body(body, "reason", r#"{"reason": "…"}"#)?;
    let deploy = visible_deploy(state, caller, id).await?;
    require(caller, Action::Approve, Some(&deploy.application))?;
    decide(body.reason).await?;
    deploy_views::status(&state.client, id)
        .await?
        .map(|deploy| Json(for_caller(caller, deploy)))
        .ok_or_else(|| AppError::NotFound(format!("no deploy `{id}`")))
}

/// A promote or an abort, under approve's permission.
async fn decide_analysis(
    state: AppState,
    caller: Caller,
    id: String,
    body: String,
    promote: bool,
) -> Result<Json<DeployStatus>, AppError> {
    let by = Decider {
        name: caller.token.name.clone(),
        token_id: caller.token.id.clone(),
    };
    decision(&state, &caller, &id, &body, async |reason| {
        decide::decide(&state.client, &id, &by, promote, reason)
            .await
            .map_err(|e| match e {
                AnalysisDecideError::NotFound(m) => AppError::NotFound(format!("no deploy `{m}`")),
                AnalysisDecideError::NotDeciding(m) => AppError::Conflict(m),
                AnalysisDecideError::Engine(e) => e.into(),
            })?;
        tracing::info!(deploy = %id, by = %caller.token.name, promote, "analysis decision");
        Ok(())
    })
    .await
}

/// Promote a deploy's analysis: skip the rest of a bake, or pass one waiting for a
/// decision; the next wave starts.
#[utoipa::path(post, path = "/deploys/{id}/promote", tag = "deploys", operation_id = "promoteDeploy",
    params(DeployId),
    request_body(content = Option<DecisionBody>, content_type = "application/json",
        description = "Optional: `{\"reason\": \"…\"}`, or nothing."),
    responses(
        (status = 200, description = "The deploy after the decision.", body = DeployStatus),
        (status = 400, description = "The body is not `{\"reason\": \"…\"}`.", body = ErrorBody),
        (status = 403, description = "The token may not approve deploys of this application.", body = ErrorBody),
        (status = 404, description = "No such deploy (or one the token may not see).", body = ErrorBody),
        (status = 409, description = "The deploy neither bakes nor waits for a decision.", body = ErrorBody),
    ))]
async fn promote_deploy(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(DeployId { id }): Path<DeployId>,
    body: String,
) -> Result<Json<DeployStatus>, AppError> {
    decide_analysis(state, caller, id, body, true).await
}

/// Abort a deploy's analysis: the deploy fails, and `rollback.on_failure` applies.
#[utoipa::path(post, path = "/deploys/{id}/abort", tag = "deploys", operation_id = "abortDeploy",
    params(DeployId),
    request_body(content = Option<DecisionBody>, content_type = "application/json",
        description = "Optional: `{\"reason\": \"…\"}`, or nothing."),
    responses(
        (status = 200, description = "The deploy after the decision.", body = DeployStatus),
        (status = 400, description = "The body is not `{\"reason\": \"…\"}`.", body = ErrorBody),
        (status = 403, description = "The token may not approve deploys of this application.", body = ErrorBody),
        (status = 404, description = "No such deploy (or one the token may not see).", body = ErrorBody),
        (status = 409, description = "The deploy neither bakes nor waits for a decision.", body = ErrorBody),
    ))]
async fn abort_deploy(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(DeployId { id }): Path<DeployId>,
    body: String,
) -> Result<Json<DeployStatus>, AppError> {
    decide_analysis(state, caller, id, body, false).await
}

/// The bakes a deploy would run (its plan's `analysis`), from the effective descriptor its
/// status carries; none without one.
pub(super) fn planned(
    effective: Option<&serde_json::Value>,
) -> Result<Vec<PlannedBakeView>, AppError> {
    let Some(effective) = effective else {
        return Ok(Vec::new());
    };
    let eff: manent_model::EffectiveDescriptor = serde_json::from_value(effective.clone())
        .map_err(|e| {
            AppError::Internal(format!(
                "the deploy's effective descriptor cannot be read: {e}"
            ))
        })?;
    let duration = |d: std::time::Duration| humantime::format_duration(d).to_string();
    Ok(plan::planned(&eff)
        .into_iter()
        .map(|b| PlannedBakeView {
            after_wave: u32::try_from(b.after_wave).unwrap_or(u32::MAX),
            wave: b.wave,
            targets: b.targets,
            baseline: b.baseline,
            bake: duration(b.bake),
            interval: duration(b.interval),
            measurements: b.measurements,
            timeout: b.timeout.map(duration),
            metrics: b
                .metrics
                .into_iter()
                .map(|m| PlannedMetricView {
                    name: m.name,
                    provider: m.provider.to_string(),
                    success: m.success,
                    failure_limit: m.failure_limit,
                    inconclusive_limit: m.inconclusive_limit,
                    asks: m
                        .asks
                        .into_iter()
                        .map(|q| PlannedQueryView {
                            target: q.target,
                            source: q.source,
                            query: q.query,
                            baseline_query: q.baseline_query,
                        })
                        .collect(),
                })
                .collect(),
        })
        .collect())
}
