//! What is served outside `/api/v1` and its token: the Platform page, `/healthz`, `/readyz`
//! and `/metrics`.

use axum::{
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use manent_contract::ErrorBody;
use manent_engine::Database;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::{AppError, AppState, platform, refusals};

/// The routes outside `/api/v1` and its token: the page, health, readiness and metrics.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(platform_page))
        .routes(routes!(platform_page_alias))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
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

/// The database is reachable and its schema current.
#[utoipa::path(get, path = "/readyz", tag = "meta", operation_id = "readyz",
    responses(
        (status = 200, description = "`ready`", content_type = "text/plain", body = String),
        (status = 503, description = "The database is unreachable or its schema is behind; \
            the text says which and what to run.", content_type = "text/plain", body = String),
    ))]
async fn readyz(State(state): State<AppState>) -> Response {
    match state.client.schema_version().await {
        Ok(v) if v >= Database::expected_schema_version() => {
            (StatusCode::OK, "ready").into_response()
        }
        Ok(v) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "schema version {v}, expected {}: run `manent-server admin migrate`",
                Database::expected_schema_version()
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
        (status = 200, description = "OpenMetrics text 1.0.0 (which Prometheus reads).", content_type = "application/openmetrics-text", body = String),
        (status = 500, description = "An internal error.", body = ErrorBody),
        (status = 503, description = "The database is unavailable.", body = ErrorBody),
    ))]
async fn metrics(State(state): State<AppState>) -> Result<Response, AppError> {
    let text = state
        .metrics
        .render(&state.client, &state.config, refusals::register_metrics)
        .await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}
