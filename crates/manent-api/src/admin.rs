//! Administration over `/api/v1` (admin role only): API tokens (`GET`/`POST /tokens`,
//! `DELETE /tokens/{name}`) and the audit trail (`GET /audit`).

use axum::{
    Extension, Json,
    extract::{Path, Query, State},
    http::StatusCode,
};
use manent_engine::{AuditRecord, now_ms};
use serde::{Deserialize, Serialize};

use crate::{
    AppError, AppState,
    auth::{self, Action, Caller, NewToken, Role, TokenError, TokenView},
    require,
};

impl From<TokenError> for AppError {
    fn from(e: TokenError) -> Self {
        match e {
            TokenError::Invalid { field, .. } => AppError::bad_request(field, e.to_string()),
            TokenError::Duplicate(_) => AppError::Conflict(e.to_string()),
            TokenError::NotFound(_) => AppError::NotFound(e.to_string()),
            TokenError::Store(s) => s.into(),
        }
    }
}

/// `GET /api/v1/tokens`: every token, never a secret or its hash.
pub async fn list_tokens(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<TokenView>>, AppError> {
    require(&caller, Action::Administer, None)?;
    Ok(Json(auth::list(state.client.store()).await?))
}

/// Body of `POST /api/v1/tokens`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTokenBody {
    name: String,
    /// viewer, deployer, approver or admin.
    role: String,
    /// Application pattern qualified with the tenant (`ml/*`); absent = every application.
    #[serde(default)]
    on: Option<String>,
    /// A duration from now (`30d`) or an RFC 3339 time; absent = never.
    #[serde(default)]
    expires: Option<String>,
}

/// The answer to a creation: the token as listed, and its secret, shown this once.
#[derive(Debug, Serialize)]
pub struct CreatedToken {
    #[serde(flatten)]
    pub token: TokenView,
    pub secret: String,
}

/// `POST /api/v1/tokens`: creates a token; 409 if the name is taken.
pub async fn create_token(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: String,
) -> Result<(StatusCode, Json<CreatedToken>), AppError> {
    require(&caller, Action::Administer, None)?;
    let body: CreateTokenBody = serde_json::from_str(&body).map_err(|e| {
        AppError::bad_request(
            "body",
            format!(
                "{e}; send {{\"name\": \"…\", \"role\": \"viewer|deployer|approver|admin\", \
                 \"on\": \"tenant/*\"?, \"expires\": \"30d\"?}}"
            ),
        )
    })?;
    let role: Role = body
        .role
        .parse()
        .map_err(|m: String| AppError::bad_request("role", m))?;
    let expires_at_ms = body
        .expires
        .as_deref()
        .map(|text| auth::parse_expiry(text, now_ms()))
        .transpose()?;
    let new = NewToken {
        name: body.name,
        role,
        on: body.on,
        expires_at_ms,
    };
    let (record, secret) = auth::create(state.client.store(), &new).await?;
    tracing::info!(token = %record.name, id = %record.id, by = %caller.token.name, "token created");
    let token = auth::list(state.client.store())
        .await?
        .into_iter()
        .find(|t| t.id == record.id)
        .ok_or_else(|| AppError::Internal(format!("token `{}` vanished", record.name)))?;
    Ok((StatusCode::CREATED, Json(CreatedToken { token, secret })))
}

/// `DELETE /api/v1/tokens/{name}`: revokes a token; from then on it answers 401.
pub async fn revoke_token(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, AppError> {
    require(&caller, Action::Administer, None)?;
    let revoked = auth::revoke(state.client.store(), &name).await?;
    tracing::info!(token = %revoked.name, id = %revoked.id, by = %caller.token.name, "token revoked");
    Ok(Json(
        serde_json::json!({ "name": revoked.name, "id": revoked.id, "revoked": true }),
    ))
}

#[derive(Debug, Deserialize)]
pub struct AuditQuery {
    /// How many entries, newest first (default 100, at most 10 000).
    limit: Option<i64>,
}

/// `GET /api/v1/audit`: the newest entries of the audit trail, newest first.
pub async fn list_audit(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<AuditQuery>,
) -> Result<Json<Vec<AuditView>>, AppError> {
    require(&caller, Action::Administer, None)?;
    let limit = query.limit.unwrap_or(100);
    if !(1..=10_000).contains(&limit) {
        return Err(AppError::bad_request(
            "limit",
            format!("limit {limit}: ask for 1 to 10000 entries"),
        ));
    }
    let entries = crate::audit::list(state.client.store(), limit).await?;
    Ok(Json(entries.into_iter().map(AuditView::from).collect()))
}

/// One audit entry as the API shows it.
#[derive(Debug, Serialize)]
pub struct AuditView {
    pub seq: i64,
    /// RFC 3339, UTC.
    pub at: String,
    /// The token's name (`-` when the request carried no valid token).
    pub token: String,
    pub token_id: String,
    pub action: String,
    pub target: String,
    /// The HTTP status the request ended with.
    pub outcome: i64,
    pub detail: String,
}

impl From<AuditRecord> for AuditView {
    fn from(r: AuditRecord) -> Self {
        AuditView {
            seq: r.seq,
            at: manent_deploy::views::rfc3339(r.at_ms),
            token: r.actor,
            token_id: r.actor_id,
            action: r.action,
            target: r.target,
            outcome: r.outcome,
            detail: r.detail,
        }
    }
}
