//! `/deploys/{id}/promote` and `/deploys/{id}/abort`: a decision on a deploy's analysis
//! (docs/analysis.md), under the permission of approve and reject.

use axum::{
    Json,
    extract::{Path, State},
};
use manent_contract::{DecisionBody, DeployStatus, ErrorBody};
use manent_deploy::{
    analysis::decide::{self, AnalysisDecideError, Decider},
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

/// A promote or an abort: the caller must see the deploy and may approve its deploys.
async fn decide_analysis(
    state: AppState,
    caller: Caller,
    id: String,
    body: String,
    promote: bool,
) -> Result<Json<DeployStatus>, AppError> {
    let body: DecisionBody = optional_body(&body, "reason", r#"{"reason": "…"}"#)?;
    let deploy = visible_deploy(&state, &caller, &id).await?;
    require(&caller, Action::Approve, Some(&deploy.application))?;
    let by = Decider {
        name: caller.token.name.clone(),
        token_id: caller.token.id.clone(),
    };
    match decide::decide(&state.client, &id, &by, promote, body.reason).await {
        Ok(()) => {}
        Err(AnalysisDecideError::NotFound(m)) => {
            return Err(AppError::NotFound(format!("no deploy `{m}`")));
        }
        Err(AnalysisDecideError::NotDeciding(m)) => return Err(AppError::Conflict(m)),
        Err(AnalysisDecideError::Engine(e)) => return Err(e.into()),
    }
    tracing::info!(deploy = %id, by = %caller.token.name, promote, "analysis decision");
    deploy_views::status(&state.client, &id)
        .await?
        .map(|deploy| Json(for_caller(&caller, deploy)))
        .ok_or_else(|| AppError::NotFound(format!("no deploy `{id}`")))
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
