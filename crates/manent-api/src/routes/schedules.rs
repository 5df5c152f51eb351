//! `/schedules`: the recurring schedules, listed, read, paused, resumed and deleted.

use axum::{
    Json,
    extract::{Path, State},
};
use manent_contract::{ErrorBody, ScheduleDeleted, ScheduleView};
use manent_deploy::background::schedules;
use manent_engine::EngineError;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::require;
use crate::{
    AppError, AppState,
    auth::{Action, Caller},
    wire::ToWire,
};

/// This resource's routes, relative to `/api/v1`.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(list_schedules))
        .routes(routes!(schedule_status, delete_schedule))
        .routes(routes!(pause_schedule))
        .routes(routes!(resume_schedule))
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
    deployable_schedule(caller, id, schedules::get(&state.client, id).await?)
}

/// `record` (the schedule `id`, if it exists), once `caller` may deploy its application.
/// One the caller may not read answers 404 like one that does not exist.
fn deployable_schedule(
    caller: &Caller,
    id: &str,
    record: Option<schedules::ScheduleRecord>,
) -> Result<schedules::ScheduleRecord, AppError> {
    let record = record
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
    match schedules::get(&state.client, &id).await {
        Ok(record) => {
            deployable_schedule(&caller, &id, record)?;
        }
        // A record that cannot be read names no application: only an unscoped admin may
        // remove it (the error said to fix or delete it). Any other failure (the database
        // unreachable) refuses, as it does everywhere else.
        Err(EngineError::Unreadable { error, .. }) if caller.may(Action::Administer, None) => {
            tracing::warn!(schedule = %id, by = %caller.token.name, %error, "deleting a schedule that cannot be read");
        }
        Err(e) => return Err(e.into()),
    }
    let deleted = schedules::delete(&state.client, &id).await?;
    tracing::info!(schedule = %id, by = %caller.token.name, "schedule deleted");
    Ok(Json(ScheduleDeleted { id, deleted }))
}

/// `{id}` of a schedule's routes.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
struct ScheduleId {
    /// The schedule's id, as answered by the submission of its descriptor.
    id: String,
}
