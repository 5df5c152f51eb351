//! Administration and identity: API tokens, the audit trail, and who is asking.

use serde::{Deserialize, Serialize};

use manent_enum::string_enum;

string_enum!(
    /// What a token may do; each role includes the ones before it.
    Role, listed: true, "viewer, deployer, approver or admin." {
        Viewer = "viewer",
        Deployer = "deployer",
        Approver = "approver",
        Admin = "admin",
    }
);

/// A token as listed: everything but its secret and hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenView {
    /// Stable id, never reused (`tok_…`).
    pub id: String,
    pub name: String,
    pub role: Role,
    /// Application pattern (`ml/*`); null = every application.
    pub on: Option<String>,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub created_at: String,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub expires_at: Option<String>,
    /// Noted at most once a minute.
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub last_used_at: Option<String>,
    pub expired: bool,
}

/// The answer to a token's creation: the token as listed, and its secret, shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedToken {
    #[serde(flatten)]
    pub token: TokenView,
    /// The token, shown this once: send it as `Authorization: Bearer <secret>`.
    pub secret: String,
}

/// Body of `POST /api/v1/tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateTokenBody {
    /// Unique; 1 to 64 of letters, digits, `.`, `_`, `-`, `@`.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9._@-]{1,64}$"))]
    pub name: String,
    pub role: Role,
    /// Application pattern qualified with the tenant (`shop/*`); absent = every
    /// application.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub on: Option<String>,
    /// A duration from now (`30d`) or an RFC 3339 time; absent = never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub expires: Option<String>,
}

/// What revoking a token answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenRevoked {
    pub name: String,
    pub id: String,
    pub revoked: bool,
}

/// One entry of the audit trail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditEntry {
    pub seq: i64,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub at: String,
    /// The token's name; `-` without a valid token; `manent-server admin` for the command
    /// line.
    pub token: String,
    pub token_id: String,
    /// `deploy.submit`, `deploy.cancel`, `deploy.approve`, `deploy.reject`,
    /// `deploy.redeploy`, `app.rollback`, `executor.recover`, `schedule.pause`,
    /// `schedule.resume`, `schedule.delete`, `token.create`, `token.revoke`; a refused read
    /// is `GET <route>`; `auth.failures` sums up one source's failed authentications
    /// over a window (docs/security.md, "Failed authentications").
    pub action: String,
    /// The deploy, schedule, executor or token; for a rollback, `tenant/app/environment`.
    pub target: String,
    /// The HTTP status the request ended with.
    pub outcome: i64,
    /// The error message of a failure.
    pub detail: String,
}

/// The query of `GET /api/v1/audit`: filters, all optional, and the cursor of the next page
/// (`before`: the `seq` of the last entry of the previous answer).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct AuditQuery {
    /// How many entries, newest first (1 to 10000, default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 10000))]
    pub limit: Option<i64>,
    /// Entries at or after this time: RFC 3339 (`2026-12-01T00:00:00Z`) or a duration ago
    /// (`1h`, `7d`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(schema_with = time_or_ago))]
    pub since: Option<String>,
    /// Entries before this time: RFC 3339 or a duration ago.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(schema_with = time_or_ago))]
    pub until: Option<String>,
    /// The token name (`-`: requests without a valid token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// The action exactly (`deploy.submit`, `auth.failures`, `GET /api/v1/deploys`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// Entries older than the one with this `seq`: the next page after an answer whose
    /// last entry had it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(minimum = 1))]
    pub before: Option<i64>,
}

/// A duration ago as the audit query takes it: a whole number (at most 9 digits) and one
/// unit, `ms`, `s`, `m`, `h`, `d` or `w` (`90s`, `1h`, `7d`).
#[cfg(feature = "openapi")]
pub const DURATION_AGO_PATTERN: &str = "^[0-9]{1,9}(ms|s|m|h|d|w)$";

/// The schema of `since` and `until`: an RFC 3339 time, or a duration ago.
#[cfg(feature = "openapi")]
fn time_or_ago() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, OneOfBuilder, SchemaFormat, Type};
    OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime))),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(DURATION_AGO_PATTERN)),
        )
        // Empty, as a form sends an unused field: no filter.
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .max_length(Some(0)),
        )
        .description(Some(
            "An RFC 3339 time (`2026-12-01T00:00:00Z`), a duration ago (`1h`, `7d`), or \
             empty (no filter).",
        ))
        .build()
        .into()
}

/// The asking token (`GET /api/v1/whoami`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WhoAmI {
    pub name: String,
    pub role: Role,
    /// Its application pattern; null = every application.
    pub scope: Option<String>,
}
