//! API tokens: created by `admin token create`, stored hashed (sha256) as
//! engine records, checked on every `/api/v1` request. Roles are granted on
//! application patterns qualified with the tenant (`ml/*`).

use std::{fmt, str::FromStr, sync::Arc};

use manent_engine::{Store, StoreError, now_ms};
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
    pub name: String,
    pub role: Role,
    /// Application pattern the role is granted on (`ml/*`); `None` = all.
    pub on: Option<String>,
    pub created_at_ms: i64,
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

fn hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Creates a token and returns its secret, shown once.
pub async fn create_token(
    store: &Arc<dyn Store>,
    name: &str,
    role: Role,
    on: Option<&str>,
) -> Result<String, StoreError> {
    let secret = format!("mnt_{}", hex::encode(rand::random::<[u8; 24]>()));
    let record = TokenRecord {
        name: name.to_string(),
        role,
        on: on.map(str::to_string),
        created_at_ms: now_ms(),
    };
    let json = serde_json::to_string(&record).map_err(|e| StoreError::Database(e.to_string()))?;
    store
        .put_record(KIND, &hash(&secret), &json, now_ms())
        .await?;
    Ok(secret)
}

/// The token for `secret`, if it exists.
pub async fn authenticate(
    store: &Arc<dyn Store>,
    secret: &str,
) -> Result<Option<Caller>, StoreError> {
    let Some(json) = store.get_record(KIND, &hash(secret)).await? else {
        return Ok(None);
    };
    let token: TokenRecord = serde_json::from_str(&json).map_err(|e| StoreError::Corrupt {
        what: "api token".into(),
        reason: e.to_string(),
    })?;
    Ok(Some(Caller { token }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(role: Role, on: Option<&str>) -> Caller {
        Caller {
            token: TokenRecord {
                name: "t".into(),
                role,
                on: on.map(Into::into),
                created_at_ms: 0,
            },
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
