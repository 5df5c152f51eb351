//! The `/api/v1` resources, one router per resource (each documented by its handlers'
//! `#[utoipa::path]`), and what their handlers share: the role check and optional bodies.

pub(crate) mod admin;
pub(crate) mod analysis;
pub(crate) mod deploys;
pub(crate) mod drift;
pub(crate) mod environments;
pub(crate) mod meta;
pub(crate) mod plans;
pub(crate) mod schedules;
pub(crate) mod workers;

use crate::{
    AppError,
    auth::{Action, Caller},
};

pub(crate) fn require(
    caller: &Caller,
    action: Action,
    application: Option<&str>,
) -> Result<(), AppError> {
    if caller.may(action, application) {
        Ok(())
    } else {
        let what = match (action, application) {
            (Action::Read, _) => "read".to_string(),
            (Action::Deploy, Some(app)) => format!("deploy {app}"),
            (Action::Approve, Some(app)) => format!("approve deploys of {app}"),
            (Action::Administer, _) => "administer manent".to_string(),
            (a, None) => format!("{a:?}").to_lowercase(),
        };
        Err(AppError::Forbidden {
            token: caller.token.name.clone(),
            action: what,
        })
    }
}

/// An optional JSON body: empty (or JSON `null`) is `T::default()`; one that does not parse
/// is a 400 naming `field`, showing the `shape` to send.
pub(crate) fn optional_body<T: Default + serde::de::DeserializeOwned>(
    body: &str,
    field: &str,
    shape: &str,
) -> Result<T, AppError> {
    if matches!(body.trim(), "" | "null") {
        return Ok(T::default());
    }
    serde_json::from_str(body)
        .map_err(|e| AppError::bad_request(field, format!("body: {e}; send {shape} or nothing")))
}
