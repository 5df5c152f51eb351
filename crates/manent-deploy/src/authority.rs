//! Who may still deploy: the question a scheduled deploy asks again each time it fires
//! (a cron tick, a `schedule.at` start), answered by whoever keeps the tokens.
//!
//! manent-deploy knows nothing of tokens (they are manent-api's: `auth.rs`, records of
//! kind `api_token`), and must not depend on manent-api, which depends on it. So the
//! question is a trait, implemented by manent-api (`auth::TokenAuthority`) and handed to
//! the worker by manent-server: the tokens keep one reader, and the rule "which role and
//! scope may deploy what" keeps one place (`Caller::may`).

use manent_engine::EngineError;

use crate::request::Submitter;

/// The answer about one token and one application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The token exists, has not expired and may deploy the application.
    Allowed,
    /// It may not (any more): why, in words that name the token (never its secret).
    Refused(String),
}

/// Answers whether the token that created a schedule (or submitted a `schedule.at` deploy)
/// may still deploy its application, now.
#[async_trait::async_trait]
pub trait Authority: Send + Sync {
    /// Whether `submitter` (a token's name and stable id) may deploy `application`
    /// (`tenant/app`) now. An error is a store that could not be read: the caller tries
    /// again later; it is never read as "allowed".
    async fn may_deploy(
        &self,
        submitter: &Submitter,
        application: &str,
    ) -> Result<Verdict, EngineError>;
}

/// The authority of a process that keeps no tokens (tools and tests that start a worker
/// without the API's token store): every scheduled deploy is refused when it fires. Fails
/// closed: a schedule is never run on an authorisation nobody checked.
pub struct NoTokens;

#[async_trait::async_trait]
impl Authority for NoTokens {
    async fn may_deploy(
        &self,
        submitter: &Submitter,
        _application: &str,
    ) -> Result<Verdict, EngineError> {
        Ok(Verdict::Refused(format!(
            "this worker has no token store to check token `{}` against",
            submitter.name
        )))
    }
}
