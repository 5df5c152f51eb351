//! Plans: `/deploys/{id}/plan`, what a dry run (or a deploy waiting for approval, once
//! planned) would change on each target (docs/plan-and-drift.md, "Plans").

use axum::{
    Json,
    extract::{Path, State},
};
use manent_contract::{
    ApprovalPlanView, ApprovalTargetView, ChangeView, ErrorBody, PlanView, TargetPlanView,
};
use manent_deploy::{plan, views::deploy_views};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::{
    AppError, AppState,
    auth::{Action, Caller},
};

/// This resource's routes, relative to `/api/v1`.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default().routes(routes!(deploy_plan))
}

/// `{id}` of a deploy's plan.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
struct PlanPath {
    /// The dry run's id, as answered by the submission.
    id: String,
}

/// A dry run's plan.
///
/// What the dry run found each target would change, against the release manent recorded
/// there (docs/plan-and-drift.md): artifacts, files inside a tar artifact, rendered
/// templates (by sha256), variables (secrets as `***`), the commands that would run.
/// Readable by whoever may read the deploy. Empty `targets` until the dry run has planned
/// a target, and for dry runs recorded before workflow version 6.
#[utoipa::path(get, path = "/deploys/{id}/plan", tag = "deploys", operation_id = "deployPlan",
    params(PlanPath),
    responses(
        (status = 200, description = "The plan, target by target.", body = PlanView),
        (status = 404, description = "No such deploy, or one the token may not see.", body = ErrorBody),
        (status = 500, description = "A recorded plan cannot be read; the message names it.", body = ErrorBody),
    ))]
async fn deploy_plan(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(PlanPath { id }): Path<PlanPath>,
) -> Result<Json<PlanView>, AppError> {
    let deploy = deploy_views::status(&state.client, &id)
        .await?
        .filter(|deploy| caller.may(Action::Read, Some(&deploy.application)))
        .ok_or_else(|| AppError::NotFound(format!("no deploy `{id}`")))?;
    let analysis = super::analysis::planned(deploy.effective.as_ref())?;
    let targets = plan::of_deploy(&state.client, &id)
        .await
        .map_err(|e| match e {
            plan::PlanError::Engine(e) => AppError::from(e),
            other => AppError::Internal(other.to_string()),
        })?;
    Ok(Json(PlanView {
        deploy_id: id,
        targets: targets.into_iter().map(target_plan).collect(),
        analysis,
    }))
}

fn target_plan(plan: plan::TargetPlan) -> TargetPlanView {
    TargetPlanView {
        name: plan.name,
        live_version: plan.live_version,
        changes: changes(plan.changes),
    }
}

fn changes(changes: Vec<plan::Change>) -> Vec<ChangeView> {
    changes
        .into_iter()
        .map(|c| ChangeView {
            kind: manent_contract::ChangeKind::from(c.kind.as_str()),
            name: c.name,
            from: c.from,
            to: c.to,
            note: c.note,
        })
        .collect()
}

/// The plan shown to approvers, as the contract says it (a deploy's status).
pub(crate) fn approval_plan(plan: plan::approval::ApprovalPlan) -> ApprovalPlanView {
    ApprovalPlanView {
        targets: plan
            .targets
            .into_iter()
            .map(|t| ApprovalTargetView {
                name: t.name,
                from_version: t.from_version,
                to_version: t.to_version,
                artifacts: changes(t.artifacts),
                files_changed: t.files_changed as u64,
                files: t.files,
                templates: changes(t.templates),
                variables: changes(t.variables),
            })
            .collect(),
        more_targets: plan.more_targets as u64,
        note: plan.note,
    }
}
