//! manent's HTTP API: `/api/v1` (JSON, bearer tokens), `/healthz`, `/readyz`, and the
//! Platform page at `/` (`platform`).
//! The only crate that knows HTTP. `app(state)` builds the router, so tests
//! drive it with `oneshot` and no socket. Every route is added through utoipa-axum with
//! its `#[utoipa::path]`, so the OpenAPI document (`openapi`) is generated from the same
//! calls that build the router; the bodies are `manent-contract`'s types. One router per
//! resource lives in `routes/`; the token, the audit trail and panics in `middleware`.

pub mod audit;
pub mod auth;
mod error;
mod middleware;
pub mod openapi;
mod platform;
mod refusals;
mod routes;
pub mod throttle;
mod wire;

use std::sync::Arc;

use axum::{Router, middleware as layers};
use manent_config::Config;
use manent_engine::Client;
use utoipa_axum::{router::OpenApiRouter, routes};

pub use auth::{Action, Caller, Role};
pub use error::AppError;

/// What every handler shares. Stateless across requests but for the throttle of failed
/// authentications: any number of API instances can serve the same database.
#[derive(Clone)]
pub struct AppState {
    pub client: Client,
    pub config: Arc<Config>,
    /// This process's count of failed authentications per source, the one state an API
    /// process keeps across requests (docs/security.md, "Failed authentications").
    pub throttle: Arc<throttle::AuthThrottle>,
    /// This process's cumulative metrics (`/metrics`), counted since it started.
    pub metrics: Arc<manent_deploy::views::metrics::Metrics>,
}

impl AppState {
    /// The state of an API process serving `client`'s database under `config`.
    pub fn new(client: Client, config: Arc<Config>) -> Self {
        let throttle = Arc::new(throttle::AuthThrottle::new(
            config.api.auth_throttle.clone(),
        ));
        AppState {
            client,
            config,
            throttle,
            metrics: Arc::new(manent_deploy::views::metrics::Metrics::new()),
        }
    }
}

/// The API's router: the routes of [`routes`], with the token, the audit trail and the
/// JSON error body on `/api/v1`.
pub fn app(state: AppState) -> Router {
    let v1 = v1_routes()
        .route_layer(layers::from_fn_with_state(
            state.clone(),
            middleware::require_token,
        ))
        .fallback(|| async {
            AppError::NotFound("no such API route: see /api/v1/openapi.json".into())
        })
        .layer(layers::map_response(error::json_error_body));
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
        .merge(routes::meta::router())
        .routes(routes!(openapi::serve))
}

/// The `/api/v1` routes, relative to it; all behind the token (`require_token`).
fn v1_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .merge(routes::deploys::router())
        .merge(routes::analysis::router())
        .merge(routes::environments::router())
        .merge(routes::plans::router())
        .merge(routes::drift::router())
        .merge(routes::schedules::router())
        .merge(routes::workers::router())
        .merge(routes::admin::router())
}
