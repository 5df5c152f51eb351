//! API tokens: created by `admin token create` or `POST /api/v1/tokens`, stored hashed
//! (sha256) as engine records, checked on every `/api/v1` request; unique names, a stable
//! id, an optional expiry, revocation, the last use. Roles are granted on application
//! patterns qualified with the tenant (`ml/*`).

use std::{fmt, str::FromStr};

use manent_deploy::{
    Submitter,
    authority::{Authority, Verdict},
};
use manent_engine::{RecordEntry, Records, StoreError, now_ms};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

const KIND: &str = "api_token";

/// What a token may do. Each role includes the ones before it, except that
/// approving is its own right (held by approver and admin).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Deployer,
    Approver,
    Admin,
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "viewer" => Ok(Role::Viewer),
            "deployer" => Ok(Role::Deployer),
            "approver" => Ok(Role::Approver),
            "admin" => Ok(Role::Admin),
            other => Err(format!(
                "unknown role `{other}`: use viewer, deployer, approver or admin"
            )),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Viewer => "viewer",
            Role::Deployer => "deployer",
            Role::Approver => "approver",
            Role::Admin => "admin",
        })
    }
}

/// An action a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Read,
    Deploy,
    Approve,
    Administer,
}

/// A stored token (its secret is never stored, only its hash).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Stable identity, recorded at creation and never reused: approvals and the audit
    /// trail compare it, so a revoked name created again is another token. Tokens made
    /// before ids existed get one derived from their hash when read.
    #[serde(default)]
    pub id: String,
    pub name: String,
    pub role: Role,
    /// Application pattern the role is granted on (`ml/*`); `None` = all.
    pub on: Option<String>,
    pub created_at_ms: i64,
    /// After this instant the token answers 401.
    #[serde(default)]
    pub expires_at_ms: Option<i64>,
}

impl TokenRecord {
    pub fn is_expired(&self, now_ms: i64) -> bool {
        self.expires_at_ms.is_some_and(|at| now_ms >= at)
    }
}

/// The caller of a request, once authenticated.
#[derive(Debug, Clone, PartialEq)]
pub struct Caller {
    pub token: TokenRecord,
}

impl Caller {
    /// Whether the caller may do `action` on `application` (`tenant/app`);
    /// `None` for actions not about one application.
    pub fn may(&self, action: Action, application: Option<&str>) -> bool {
        let role = self.token.role;
        let role_ok = match action {
            Action::Read => true,
            Action::Deploy => matches!(role, Role::Deployer | Role::Admin),
            Action::Approve => matches!(role, Role::Approver | Role::Admin),
            Action::Administer => role == Role::Admin,
        };
        let scope_ok = match (&self.token.on, application) {
            (None, _) => true,
            // A scoped token reaches only its applications; platform-wide
            // views stay readable, administration does not.
            (Some(_), None) => action == Action::Read,
            (Some(pattern), Some(app)) => manent_config::glob_match(pattern, app),
        };
        role_ok && scope_ok
    }

    /// Whether the caller sees tenant `tenant` in platform views: an unscoped token sees
    /// every tenant, a scoped one the tenants its pattern names.
    pub fn may_see_tenant(&self, tenant: &str) -> bool {
        match &self.token.on {
            None => true,
            Some(pattern) => {
                let tenant_pattern = pattern.split_once('/').map_or(pattern.as_str(), |p| p.0);
                manent_config::glob_match(tenant_pattern, tenant)
            }
        }
    }
}

/// Why a token could not be created, revoked or read.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Bad input: names the field (`name`, `role`, `on`, `expires`) and what to write.
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error(
        "a token named `{0}` already exists: token names are unique; pick another name or \
         revoke it first (`admin token revoke --name {0}`)"
    )]
    Duplicate(String),
    #[error("no token named `{0}`")]
    NotFound(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What `create` needs.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub name: String,
    pub role: Role,
    pub on: Option<String>,
    pub expires_at_ms: Option<i64>,
}

pub use manent_contract::TokenView;

/// Record kind: token name → hash of its secret (makes names unique).
const NAME_KIND: &str = "api_token_name";
/// Record kind: token id → last use (milliseconds), kept apart from the token so that
/// noting a use can never bring back a token revoked meanwhile.
const USED_KIND: &str = "api_token_used";
/// A use is noted at most this often per token (a write per request would cost more).
const USED_RESOLUTION_MS: i64 = 60_000;

fn hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

fn corrupt(e: serde_json::Error) -> StoreError {
    StoreError::Corrupt {
        what: "api token".into(),
        reason: e.to_string(),
    }
}

/// Reads a stored token; one made before ids existed gets an id derived from its hash.
fn decode(hash: &str, json: &str) -> Result<TokenRecord, StoreError> {
    let mut token: TokenRecord = serde_json::from_str(json).map_err(corrupt)?;
    if token.id.is_empty() {
        token.id = format!("tok_{}", &hash[..16.min(hash.len())]);
    }
    Ok(token)
}

/// Checks a token name: 1 to 64 of `A-Z a-z 0-9 . _ - @`.
pub fn check_name(name: &str) -> Result<(), TokenError> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'));
    if valid {
        Ok(())
    } else {
        Err(TokenError::Invalid {
            field: "name",
            message: format!(
                "`{name}` is not a token name: use 1 to 64 letters, digits, `.`, `_`, `-` or `@`"
            ),
        })
    }
}

/// Checks a scope: an application pattern qualified with its tenant (`shop/*`).
pub fn check_scope(pattern: &str) -> Result<(), TokenError> {
    manent_config::check_application_pattern(pattern).map_err(|message| TokenError::Invalid {
        field: "on",
        message,
    })
}

/// Reads `--expires`: a duration from now (`30d`, `12h`) or an RFC 3339 instant
/// (`2027-01-31T00:00:00Z`); returns the instant in milliseconds, which must be later
/// than `now_ms`.
pub fn parse_expiry(text: &str, now_ms: i64) -> Result<i64, TokenError> {
    let invalid = |message: String| TokenError::Invalid {
        field: "expires",
        message,
    };
    let text = text.trim();
    let at_ms = if let Ok(duration) = humantime::parse_duration(text) {
        now_ms.saturating_add(i64::try_from(duration.as_millis()).unwrap_or(i64::MAX))
    } else if let Ok(at) = chrono::DateTime::parse_from_rfc3339(text) {
        at.timestamp_millis()
    } else {
        return Err(invalid(format!(
            "`{text}` is neither a duration (`30d`, `12h`) nor an RFC 3339 time \
             (`2027-01-31T00:00:00Z`)"
        )));
    };
    if at_ms <= now_ms {
        return Err(invalid(format!(
            "`{text}` is in the past: a token must expire later than now"
        )));
    }
    Ok(at_ms)
}

/// Creates a token and returns its record and its secret (shown once). Refuses a name
/// already taken, an invalid name and an unqualified scope.
pub async fn create(
    records: &Records,
    new: &NewToken,
) -> Result<(TokenRecord, String), TokenError> {
    check_name(&new.name)?;
    if let Some(on) = &new.on {
        check_scope(on)?;
    }
    // Tokens made before names were unique have no name record: look at them too.
    if list_records(records)
        .await?
        .iter()
        .any(|(_, t)| t.name == new.name)
    {
        return Err(TokenError::Duplicate(new.name.clone()));
    }
    let secret = format!("mnt_{}", hex::encode(rand::random::<[u8; 24]>()));
    let hashed = hash(&secret);
    let now = now_ms();
    let record = TokenRecord {
        id: format!("tok_{}", hex::encode(rand::random::<[u8; 8]>())),
        name: new.name.clone(),
        role: new.role,
        on: new.on.clone(),
        created_at_ms: now,
        expires_at_ms: new.expires_at_ms,
    };
    let json = serde_json::to_string(&record).map_err(corrupt)?;
    // The name and the token are written together or not at all: of two concurrent
    // creations of one name exactly one gets it, and a crash between the two writes
    // cannot leave a name held by no token.
    let written = records
        .insert_all(
            &[
                RecordEntry {
                    kind: NAME_KIND,
                    key: &new.name,
                    value: &hashed,
                },
                RecordEntry {
                    kind: KIND,
                    key: &hashed,
                    value: &json,
                },
            ],
            now,
        )
        .await?;
    if !written {
        return Err(TokenError::Duplicate(new.name.clone()));
    }
    Ok((record, secret))
}

/// Creates a token that never expires and returns its secret, shown once.
pub async fn create_token(
    records: &Records,
    name: &str,
    role: Role,
    on: Option<&str>,
) -> Result<String, TokenError> {
    let new = NewToken {
        name: name.to_string(),
        role,
        on: on.map(str::to_string),
        expires_at_ms: None,
    };
    Ok(create(records, &new).await?.1)
}

/// Every stored token with the hash it is kept under.
async fn list_records(records: &Records) -> Result<Vec<(String, TokenRecord)>, StoreError> {
    records
        .list(KIND)
        .await?
        .into_iter()
        .map(|(hash, json)| Ok((hash.clone(), decode(&hash, &json)?)))
        .collect()
}

/// Every token, by name, without secrets or hashes.
pub async fn list(records: &Records) -> Result<Vec<TokenView>, TokenError> {
    let used: std::collections::HashMap<String, i64> = records
        .list(USED_KIND)
        .await?
        .into_iter()
        .filter_map(|(id, at)| Some((id, at.parse().ok()?)))
        .collect();
    let now = now_ms();
    let mut views: Vec<TokenView> = list_records(records)
        .await?
        .into_iter()
        .map(|(_, t)| TokenView {
            expired: t.is_expired(now),
            last_used_at: used.get(&t.id).map(|&ms| rfc3339(ms)),
            created_at: rfc3339(t.created_at_ms),
            expires_at: t.expires_at_ms.map(rfc3339),
            id: t.id,
            name: t.name,
            role: t.role.into(),
            on: t.on,
        })
        .collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(views)
}

/// Revokes the token named `name`: from then on its secret answers 401. Returns the
/// revoked record (its id stays in the audit trail and in past approvals).
pub async fn revoke(records: &Records, name: &str) -> Result<TokenRecord, TokenError> {
    let tokens: Vec<(String, TokenRecord)> = list_records(records)
        .await?
        .into_iter()
        .filter(|(_, token)| token.name == name)
        .collect();
    // Every key of the name goes in one transaction: a crash leaves the token whole or gone.
    let mut keys: Vec<(&str, &str)> = vec![(NAME_KIND, name)];
    for (hashed, token) in &tokens {
        keys.push((KIND, hashed));
        keys.push((USED_KIND, &token.id));
    }
    records.delete_all(&keys).await?;
    tokens
        .into_iter()
        .map(|(_, token)| token)
        .next_back()
        .ok_or_else(|| TokenError::NotFound(name.to_string()))
}

/// The live token for `secret`, if it exists and has not expired. Notes its use.
pub async fn authenticate(records: &Records, secret: &str) -> Result<Option<Caller>, StoreError> {
    let hashed = hash(secret);
    let Some(json) = records.get(KIND, &hashed).await? else {
        return Ok(None);
    };
    let token = decode(&hashed, &json)?;
    let now = now_ms();
    if token.is_expired(now) {
        return Ok(None);
    }
    let last_used: Option<i64> = records
        .get(USED_KIND, &token.id)
        .await?
        .and_then(|v| v.parse().ok());
    if last_used.is_none_or(|at| now - at >= USED_RESOLUTION_MS) {
        records
            .put(USED_KIND, &token.id, &now.to_string(), now)
            .await?;
    }
    Ok(Some(Caller { token }))
}

fn rfc3339(ms: i64) -> String {
    manent_deploy::views::platform::rfc3339(ms)
}

/// The token store as manent-deploy's [`Authority`]: whether the token that created a
/// schedule (or submitted a `schedule.at` deploy) may still deploy, asked as it fires
/// (docs/security.md, "Schedules are authorised at every tick"). The token is found by its
/// stable id, so a name revoked and created again is another token and does not inherit
/// the schedules of the first; records made before ids existed name it only by name. The
/// rule is [`Caller::may`]'s, the one every request meets.
pub struct TokenAuthority {
    records: Records,
}

impl TokenAuthority {
    pub fn new(records: Records) -> Self {
        TokenAuthority { records }
    }
}

#[async_trait::async_trait]
impl Authority for TokenAuthority {
    async fn may_deploy(
        &self,
        submitter: &Submitter,
        application: &str,
    ) -> Result<Verdict, manent_engine::EngineError> {
        let tokens = list_records(&self.records).await?;
        let found = tokens.into_iter().map(|(_, token)| token).find(|token| {
            if submitter.token_id.is_empty() {
                token.name == submitter.name
            } else {
                token.id == submitter.token_id
            }
        });
        let who = if submitter.token_id.is_empty() {
            format!("token `{}`", submitter.name)
        } else {
            format!("token `{}` ({})", submitter.name, submitter.token_id)
        };
        let Some(token) = found else {
            return Ok(Verdict::Refused(format!(
                "{who} no longer exists (revoked); a deployer with a valid token must submit it again"
            )));
        };
        if token.is_expired(now_ms()) {
            return Ok(Verdict::Refused(format!(
                "{who} expired at {}; a deployer with a valid token must submit it again",
                token.expires_at_ms.map(rfc3339).unwrap_or_default()
            )));
        }
        let caller = Caller { token };
        if !caller.may(Action::Deploy, Some(application)) {
            return Ok(Verdict::Refused(format!(
                "{who} ({} on {}) may no longer deploy {application}",
                caller.token.role,
                caller.token.on.as_deref().unwrap_or("every application")
            )));
        }
        Ok(Verdict::Allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(role: Role, on: Option<&str>) -> Caller {
        Caller {
            token: TokenRecord {
                id: "tok_t".into(),
                name: "t".into(),
                role,
                on: on.map(Into::into),
                created_at_ms: 0,
                expires_at_ms: None,
            },
        }
    }

    #[test]
    fn an_expiry_is_a_duration_from_now_or_an_rfc3339_instant_in_the_future() {
        let now = 1_800_000_000_000;
        assert_eq!(
            parse_expiry("1h", now).unwrap(),
            now + 3_600_000,
            "a duration counts from now"
        );
        assert_eq!(
            parse_expiry("2027-01-31T00:00:00Z", now).unwrap(),
            1_801_353_600_000,
            "an RFC 3339 time is taken as it is"
        );
        for bad in ["soon", "2020-01-01T00:00:00Z"] {
            let error = parse_expiry(bad, now).unwrap_err().to_string();
            assert!(
                error.starts_with("expires:"),
                "`{bad}` is refused naming the field: {error}"
            );
        }
    }

    #[test]
    fn a_token_name_is_short_and_plain() {
        for ok in ["ci", "release-bot", "alice@example.com", "a_b.c"] {
            assert!(check_name(ok).is_ok(), "`{ok}` is a valid name");
        }
        for bad in ["", "two words", "x\u{1b}[31m", &"a".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?} is refused");
        }
    }

    #[test]
    fn roles_and_scopes_decide_together() {
        let cases = [
            (Role::Viewer, None, Action::Read, Some("ml/a"), true),
            (Role::Viewer, None, Action::Deploy, Some("ml/a"), false),
            (
                Role::Deployer,
                Some("ml/*"),
                Action::Deploy,
                Some("ml/a"),
                true,
            ),
            (
                Role::Deployer,
                Some("ml/*"),
                Action::Deploy,
                Some("web/a"),
                false,
            ),
            (Role::Deployer, None, Action::Approve, Some("ml/a"), false),
            (Role::Approver, None, Action::Approve, Some("ml/a"), true),
            (Role::Admin, None, Action::Administer, None, true),
            (Role::Admin, Some("ml/*"), Action::Administer, None, false),
            (Role::Deployer, Some("ml/*"), Action::Read, None, true),
        ];
        for (role, on, action, app, expected) in cases {
            assert_eq!(
                caller(role, on).may(action, app),
                expected,
                "{role} on {on:?} doing {action:?} on {app:?}"
            );
        }
    }
}
