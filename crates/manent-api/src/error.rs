//! The one error type of the API and how it becomes an HTTP response: the contract's
//! `ErrorBody`, `{"error": {"code", "message", "field"?}}`, with the status docs/api.md
//! lists.

use axum::{
    Json,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use manent_contract::{ErrorBody, ErrorCode};
use manent_engine::{EngineError, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("{message}")]
    BadRequest {
        field: Option<String>,
        message: String,
    },
    #[error(
        "missing or unknown API token: send `Authorization: Bearer <token>` (create one with `manent-server admin token create`)"
    )]
    Unauthorized,
    #[error("token `{token}` may not {action}")]
    Forbidden { token: String, action: String },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error(
        "too many failed authentications from {client}: retry in {retry_after_secs}s, or send a \
         valid token (`Authorization: Bearer <token>`), which is never throttled"
    )]
    TooManyFailures {
        client: String,
        retry_after_secs: u64,
    },
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// A connection beyond the listener's caps (docs/security.md, "The listener").
    #[error("{0}")]
    Overloaded(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl AppError {
    pub fn bad_request(field: impl Into<String>, message: impl Into<String>) -> Self {
        AppError::BadRequest {
            field: Some(field.into()),
            message: message.into(),
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            AppError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            AppError::Unauthorized => StatusCode::UNAUTHORIZED,
            AppError::Forbidden { .. } => StatusCode::FORBIDDEN,
            AppError::NotFound(_) => StatusCode::NOT_FOUND,
            AppError::Conflict(_) => StatusCode::CONFLICT,
            AppError::TooManyFailures { .. } => StatusCode::TOO_MANY_REQUESTS,
            AppError::Unavailable(_) | AppError::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            AppError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<StoreError> for AppError {
    fn from(e: StoreError) -> Self {
        if e.is_transient() {
            AppError::Unavailable(e.to_string())
        } else {
            AppError::Internal(e.to_string())
        }
    }
}

impl From<EngineError> for AppError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Store(s) => s.into(),
            EngineError::NotFound(_) | EngineError::UnknownExecutor(_) => {
                AppError::NotFound(e.to_string())
            }
            EngineError::InvalidState { .. }
            | EngineError::ExecutorAlive { .. }
            | EngineError::Deduplicated { .. }
            | EngineError::IdConflict { .. } => AppError::Conflict(e.to_string()),
            EngineError::InvalidInput(m) => AppError::BadRequest {
                field: None,
                message: m,
            },
            other => AppError::Internal(other.to_string()),
        }
    }
}

impl From<manent_deploy::views::platform::ApplicationsError> for AppError {
    fn from(e: manent_deploy::views::platform::ApplicationsError) -> Self {
        use manent_deploy::views::platform::ApplicationsError;
        match e {
            ApplicationsError::Engine(e) => e.into(),
            // The server's own directory: nothing the client can change.
            ApplicationsError::Source(e) => AppError::Internal(e.to_string()),
        }
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = self.status();
        // An overloaded listener's refusals are counted by the listener, not logged each.
        if status.is_server_error() && !matches!(self, AppError::Overloaded(_)) {
            tracing::error!(error = %self, "request failed");
        }
        let field = match &self {
            AppError::BadRequest { field, .. } => field.clone(),
            _ => None,
        };
        let body = ErrorBody::new(
            ErrorCode::for_status(status.as_u16()),
            self.to_string(),
            field,
        );
        let mut response = (status, Json(body)).into_response();
        if let AppError::TooManyFailures {
            retry_after_secs, ..
        } = &self
        {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                header::HeaderValue::from(*retry_after_secs),
            );
        }
        response
    }
}

/// Makes every error of `/api/v1` the documented JSON body. Axum answers some
/// requests itself, before any handler, in plain text or with no body at all: a body
/// that is not UTF-8 or not JSON, one over the size limit, an unknown route or method.
/// Their status and headers (`Allow`) are kept; the text becomes the message.
pub async fn json_error_body(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    // Rejection texts are short; a longer body is cut, not streamed through.
    let text = axum::body::to_bytes(body, 16 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    let mut out = (
        status,
        Json(ErrorBody::new(
            ErrorCode::for_status(status.as_u16()),
            message,
            None,
        )),
    )
        .into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}
