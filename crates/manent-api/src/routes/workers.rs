//! The workers and their queues: `/workers`, `/queues`, and recovering a lost worker.

use axum::{
    Json,
    extract::{Path, Query, State},
};
use manent_contract::{ErrorBody, QueueView, Recovered, WorkerView};
use manent_deploy::views::platform;
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
        .routes(routes!(list_workers))
        .routes(routes!(list_queues))
        .routes(routes!(recover_executor))
}

/// The workers (executors).
#[utoipa::path(get, path = "/workers", tag = "platform", operation_id = "listWorkers",
    responses((status = 200, description = "Every worker that registered, as `manent workers` shows them.", body = Vec<WorkerView>)))]
async fn list_workers(State(state): State<AppState>) -> Result<Json<Vec<WorkerView>>, AppError> {
    Ok(Json(
        platform::workers(&state.client, &state.config)
            .await?
            .to_wire(),
    ))
}

/// The queues, with their kinds, limits, depths and workers.
#[utoipa::path(get, path = "/queues", tag = "platform", operation_id = "listQueues",
    responses((status = 200, description = "Every queue, as `manent queues` shows them.", body = Vec<QueueView>)))]
async fn list_queues(State(state): State<AppState>) -> Result<Json<Vec<QueueView>>, AppError> {
    Ok(Json(
        platform::queues(&state.client, &state.config)
            .await?
            .to_wire(),
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
