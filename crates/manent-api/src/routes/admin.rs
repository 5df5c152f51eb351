//! Administration over `/api/v1` (admin role only): API tokens (`GET`/`POST /tokens`,
//! `DELETE /tokens/{name}`) and the audit trail (`GET /audit`); and `/whoami`, which any
//! token may ask.

use axum::{
    Extension, Json,
    extract::{Path, Query, State},
    http::StatusCode,
};
use manent_contract::{
    AuditEntry, AuditQuery, CreateTokenBody, CreatedToken, ErrorBody, TokenRevoked, WhoAmI,
};
use manent_engine::{AuditFilter, AuditRecord, now_ms};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::require;
use crate::{
    AppError, AppState,
    auth::{self, Action, Caller, NewToken, Role, TokenError, TokenView},
};

/// The tokens', the audit trail's and `/whoami`'s routes, relative to `/api/v1`.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(list_tokens, create_token))
        .routes(routes!(revoke_token))
        .routes(routes!(list_audit))
        .routes(routes!(whoami))
}

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

/// List the API tokens.
///
/// Every token, never a secret or its hash. Admin role only.
#[utoipa::path(get, path = "/tokens", tag = "admin", operation_id = "listTokens",
    responses(
        (status = 200, description = "Every token.", body = Vec<TokenView>),
        (status = 403, description = "Not an admin.", body = ErrorBody),
    ))]
pub async fn list_tokens(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<TokenView>>, AppError> {
    require(&caller, Action::Administer, None)?;
    Ok(Json(auth::list(&state.client.records()).await?))
}

/// Create an API token.
///
/// Admin role only; 409 if the name is taken. The answer holds the secret, shown this once.
#[utoipa::path(post, path = "/tokens", tag = "admin", operation_id = "createToken",
    request_body(content = CreateTokenBody, content_type = "application/json"),
    responses(
        (status = 201, description = "The token as listed, and its secret.", body = CreatedToken),
        (status = 400, description = "A bad body, name, role, pattern or expiry; `field` names it.", body = ErrorBody),
        (status = 403, description = "Not an admin.", body = ErrorBody),
        (status = 409, description = "A token of that name exists.", body = ErrorBody),
    ))]
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
    let role: Role =
        crate::wire::role(&body.role).map_err(|m: String| AppError::bad_request("role", m))?;
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
    let (record, secret) = auth::create(&state.client.records(), &new).await?;
    tracing::info!(token = %record.name, id = %record.id, by = %caller.token.name, "token created");
    let token = auth::list(&state.client.records())
        .await?
        .into_iter()
        .find(|t| t.id == record.id)
        .ok_or_else(|| AppError::Internal(format!("token `{}` vanished", record.name)))?;
    Ok((StatusCode::CREATED, Json(CreatedToken { token, secret })))
}

/// Revoke an API token.
///
/// From then on it answers 401. Admin role only.
#[utoipa::path(delete, path = "/tokens/{name}", tag = "admin", operation_id = "revokeToken",
    params(("name" = String, Path, description = "The token's name.")),
    responses(
        (status = 200, description = "Revoked.", body = TokenRevoked),
        (status = 403, description = "Not an admin.", body = ErrorBody),
        (status = 404, description = "No token of that name.", body = ErrorBody),
    ))]
pub async fn revoke_token(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<TokenRevoked>, AppError> {
    require(&caller, Action::Administer, None)?;
    let revoked = auth::revoke(&state.client.records(), &name).await?;
    tracing::info!(token = %revoked.name, id = %revoked.id, by = %caller.token.name, "token revoked");
    Ok(Json(TokenRevoked {
        name: revoked.name,
        id: revoked.id,
        revoked: true,
    }))
}

/// The audit trail, newest first, filtered by time, actor and action, paged with `before`
/// (docs/api.md, "Audit trail").
///
/// Admin role only. The next page: the same query with `before` set to the `seq` of the
/// last entry answered; an empty answer is the end.
#[utoipa::path(get, path = "/audit", tag = "admin", operation_id = "listAudit",
    params(AuditQuery),
    responses(
        (status = 200, description = "The newest entries the filters admit.", body = Vec<AuditEntry>),
        (status = 400, description = "A limit out of range, a time that cannot be read, or a query string that cannot be read.", body = ErrorBody),
        (status = 403, description = "Not an admin.", body = ErrorBody),
    ))]
pub async fn list_audit(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<AuditQuery>,
) -> Result<Json<Vec<AuditEntry>>, AppError> {
    require(&caller, Action::Administer, None)?;
    let filter = audit_filter(&query, now_ms())?;
    let entries = crate::audit::list(&state.client.records(), &filter).await?;
    Ok(Json(entries.into_iter().map(audit_entry).collect()))
}

/// The store's filter of an audit query, each field checked (a 400 names the field).
fn audit_filter(query: &AuditQuery, now_ms: i64) -> Result<AuditFilter, AppError> {
    let limit = query.limit.unwrap_or(100);
    if !(1..=10_000).contains(&limit) {
        return Err(AppError::bad_request(
            "limit",
            format!("limit {limit}: ask for 1 to 10000 entries"),
        ));
    }
    if let Some(before) = query.before
        && before < 1
    {
        return Err(AppError::bad_request(
            "before",
            format!("before {before}: give the seq of the last entry of the previous page"),
        ));
    }
    // An empty filter (`?since=&actor=`, as a form sends it) is no filter.
    let time = |field: &'static str, text: &Option<String>| -> Result<Option<i64>, AppError> {
        text.as_deref()
            .filter(|text| !text.is_empty())
            .map(|text| {
                audit_time(text, now_ms).ok_or_else(|| {
                    AppError::bad_request(
                        field,
                        format!(
                            "{field} `{text}` is neither an RFC 3339 time \
                             (`2026-12-01T00:00:00Z`) nor a duration ago (a number and one of \
                             ms, s, m, h, d, w: `1h`, `7d`)"
                        ),
                    )
                })
            })
            .transpose()
    };
    let nonempty = |text: &Option<String>| text.clone().filter(|t| !t.is_empty());
    Ok(AuditFilter {
        since_ms: time("since", &query.since)?,
        until_ms: time("until", &query.until)?,
        actor: nonempty(&query.actor),
        action: nonempty(&query.action),
        before_seq: query.before,
        limit,
    })
}

/// An RFC 3339 time, or a duration before `now_ms` (`1h`: an hour ago), in milliseconds.
fn audit_time(text: &str, now_ms: i64) -> Option<i64> {
    if let Ok(at) = chrono::DateTime::parse_from_rfc3339(text) {
        return Some(at.timestamp_millis());
    }
    Some(now_ms.saturating_sub(duration_ago_ms(text)?))
}

/// A duration ago as the OpenAPI document states it (`DURATION_AGO_PATTERN`): a whole
/// number of at most 9 digits and one unit, in milliseconds.
fn duration_ago_ms(text: &str) -> Option<i64> {
    let digits = text.find(|c: char| !c.is_ascii_digit())?;
    if !(1..=9).contains(&digits) {
        return None;
    }
    let number: i64 = text[..digits].parse().ok()?;
    let unit_ms: i64 = match &text[digits..] {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "w" => 604_800_000,
        _ => return None,
    };
    number.checked_mul(unit_ms)
}

/// One audit entry as the API shows it.
fn audit_entry(r: AuditRecord) -> AuditEntry {
    AuditEntry {
        seq: r.seq,
        at: manent_deploy::views::platform::rfc3339(r.at_ms),
        token: r.actor,
        token_id: r.actor_id,
        action: r.action,
        target: r.target,
        outcome: r.outcome,
        detail: r.detail,
    }
}

/// The asking token.
#[utoipa::path(get, path = "/whoami", tag = "tokens", operation_id = "whoami",
    responses((status = 200, description = "The token's name, role and scope.", body = WhoAmI)))]
async fn whoami(axum::Extension(caller): axum::Extension<Caller>) -> Json<WhoAmI> {
    Json(WhoAmI {
        name: caller.token.name.clone(),
        role: caller.token.role.into(),
        scope: caller.token.on.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::audit_time;

    /// `text` read as an audit time at a fixed now, in milliseconds before now.
    fn check(text: &str, expected_ago_ms: Option<i64>) {
        let now = 10_000_000_000_000;
        assert_eq!(
            audit_time(text, now).map(|at| now - at),
            expected_ago_ms,
            "`{text}` must be read as the OpenAPI document states (DURATION_AGO_PATTERN)"
        );
    }

    #[test]
    fn audit_times_are_exactly_what_the_document_states() {
        check("90s", Some(90_000));
        check("1h", Some(3_600_000));
        check("7d", Some(7 * 86_400_000));
        check("2w", Some(2 * 604_800_000));
        check("250ms", Some(250));
        check("999999999w", Some(999_999_999 * 604_800_000));
        // Outside the pattern: refused, never guessed.
        check("1000000000s", None);
        check(" 1h", None);
        check("1 h", None);
        check("1h30m", None);
        check("h", None);
        check("1y", None);
        check("yesterday", None);
        assert_eq!(
            audit_time("2026-12-01T00:00:00Z", 0),
            Some(1_796_083_200_000),
            "an RFC 3339 time is that instant"
        );
    }
}
