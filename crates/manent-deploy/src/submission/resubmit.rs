//! A recorded request submitted again: `manent rollback` (which deploy it goes back to),
//! `manent redeploy` and `manent reconcile`, through the rollback guard and then the whole
//! submission path, as any descriptor.

use std::sync::Arc;

use manent_config::Config;
use manent_engine::{Client, EngineError};

use super::{SubmitError, Submitted, parse, submit_recording};
use crate::{
    history::{Origin, OriginKind, find_success, request_of, version_of},
    irreversible::{self, IrreversibleDeploy},
    request::{DEPLOY_WORKFLOW, DeployRequest, Submitter},
};

/// Why a rollback or redeploy was refused.
#[derive(Debug, thiserror::Error)]
pub enum ResubmitError {
    /// No such deploy (or no readable one).
    #[error("{0}")]
    NotFound(String),
    /// Nothing to roll back to: says what there is.
    #[error("{0}")]
    Nothing(String),
    /// It would go back past an irreversible deploy, and was not forced: the message names
    /// it, its version and reason, and `--force` (docs/environments.md, "The rollback
    /// guard").
    #[error("{message}")]
    PastIrreversible {
        message: String,
        irreversible: IrreversibleDeploy,
    },
    /// The submission of the recorded descriptor was refused (the environment file or
    /// manent.yml changed since), or the engine failed.
    #[error(transparent)]
    Submit(#[from] SubmitError),
}

/// How a recorded request is submitted again ([`resubmit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resubmit {
    pub kind: OriginKind,
    /// A fast rollback ([`DeployRequest::fast`]).
    pub fast: bool,
    /// Through the rollback guard: going back past an irreversible deploy, audited.
    pub force: bool,
}

/// A rollback or redeploy just submitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resubmission {
    pub submitted: Submitted,
    /// The irreversible deploy it went back past, forced: what the caller audits.
    pub forced_past: Option<IrreversibleDeploy>,
}

impl From<EngineError> for ResubmitError {
    fn from(e: EngineError) -> Self {
        ResubmitError::Submit(SubmitError::Engine(e))
    }
}

/// The deploy a rollback of `application/environment` would resubmit: without `to`, the
/// newest successful (not dry-run) deploy at a version other than the live one; with `to`,
/// the newest successful deploy at version `to`, unless it is the live version.
pub async fn rollback_source(
    client: &Client,
    application: &str,
    environment: &str,
    to: Option<&str>,
) -> Result<(String, DeployRequest), ResubmitError> {
    let here = format!("{application} {environment}");
    let Some((live_id, live)) = find_success(client, application, environment, |_, _| true).await?
    else {
        return Err(ResubmitError::Nothing(format!(
            "nothing to roll back to: {here} has no successful deploy yet"
        )));
    };
    let live_version = version_of(&live).to_string();
    if to == Some(live_version.as_str()) {
        return Err(ResubmitError::Nothing(format!(
            "nothing to roll back to: {live_version} is live in {here} now (deploy {live_id}); \
             `manent redeploy {live_id}` deploys it again"
        )));
    }
    let found = find_success(client, application, environment, |_, r| match to {
        Some(to) => version_of(r) == to,
        None => version_of(r) != live_version,
    })
    .await?;
    found.ok_or_else(|| {
        ResubmitError::Nothing(match to {
            Some(to) => format!(
                "nothing to roll back to: {here} has no successful deploy of version {to} \
                 (`manent history {here}` lists its deploys)"
            ),
            None => format!(
                "nothing to roll back to: {live_version}, live now (deploy {live_id}), is the \
                 only version {here} ever ran successfully"
            ),
        })
    })
}

/// The readable request of deploy `id`.
pub async fn recorded_request(client: &Client, id: &str) -> Result<DeployRequest, ResubmitError> {
    let record = client
        .get(id)
        .await?
        .filter(|r| r.name == DEPLOY_WORKFLOW)
        .ok_or_else(|| ResubmitError::NotFound(format!("no deploy `{id}`")))?;
    request_of(&record).ok_or_else(|| {
        ResubmitError::Submit(SubmitError::Internal(format!(
            "deploy {id}'s recorded request cannot be read; it cannot be deployed again"
        )))
    })
}

/// Submits again the recorded descriptor of deploy `source` (its artifacts with their
/// recorded URLs and sha256, its `deploy:` overrides, dry run and dependencies), through
/// the whole submission path: parsed and checked again, resolved against the environment
/// file as it is now, routed, gated (approvals, dependencies) and limited like any deploy,
/// submitted by `submitted_by`. It runs now: a recorded `schedule` is left out. `fast`: a
/// fast rollback ([`DeployRequest::fast`]), refused for a plugin other than remote-copy.
/// First of all, once the caller authorised it, the rollback guard: going back past an
/// irreversible deploy is refused unless `force` ([`crate::irreversible`]).
pub async fn resubmit(
    client: &Client,
    config: &Arc<Config>,
    source: &str,
    request: DeployRequest,
    how: Resubmit,
    submitted_by: &Submitter,
) -> Result<Resubmission, ResubmitError> {
    resubmit_to(
        client,
        config,
        (source, request),
        how,
        submitted_by,
        Default::default(),
    )
    .await
}

/// [`resubmit`] to `targets` only (all when empty), removing the files `remove_added` names
/// on each: `manent reconcile` (docs/plan-and-drift.md).
pub async fn resubmit_to(
    client: &Client,
    config: &Arc<Config>,
    (source, request): (&str, DeployRequest),
    Resubmit { kind, fast, force }: Resubmit,
    submitted_by: &Submitter,
    (targets, remove_added): (Vec<String>, std::collections::BTreeMap<String, Vec<String>>),
) -> Result<Resubmission, ResubmitError> {
    let forced_past = match irreversible::passed_by(client, &request).await? {
        Some(passed) if !force => {
            let version = request.descriptor.version();
            return Err(ResubmitError::PastIrreversible {
                message: irreversible::refusal(kind, source, version, &passed),
                irreversible: passed,
            });
        }
        passed => passed,
    };
    let mut descriptor = request.descriptor;
    descriptor.schedule = None;
    // Today's rules apply to the recorded text as to any other descriptor.
    let text = serde_json::to_string(&descriptor).map_err(|e| {
        SubmitError::Internal(format!(
            "deploy {source}'s descriptor cannot be written: {e}"
        ))
    })?;
    let descriptor = parse(text, format!("deploy {source}")).await?;
    let origin = Origin {
        kind,
        deploy_id: source.to_string(),
        fast,
        forced_past: forced_past.as_ref().map(|p| p.deploy_id.clone()),
        targets,
        remove_added,
    };
    let submitted = submit_recording(
        client,
        config,
        descriptor,
        false,
        submitted_by,
        Some(&origin),
    )
    .await?;
    Ok(Resubmission {
        submitted,
        forced_past,
    })
}
