//! `manent reconcile` (docs/plan-and-drift.md, "Reconcile"): the live deploy's recorded
//! descriptor submitted again to the targets the last drift check found drifted, as a
//! deploy like any other (parsed and checked again, routed, gated, limited, audited by the
//! caller), recorded as a redeploy of the live deploy.

use std::sync::Arc;

use manent_config::Config;
use manent_engine::Client;

use crate::history::OriginKind;
use crate::request::Submitter;
use crate::submission::{self, Resubmission, ResubmitError};

/// Submits the reconcile of `application`'s `environment`; refused (`Nothing`) when no
/// check ran yet or the last found no drifted target.
pub async fn submit(
    client: &Client,
    config: &Arc<Config>,
    (application, environment): (&str, &str),
    submitted_by: &Submitter,
) -> Result<Reconciled, ResubmitError> {
    let here = format!("{application} {environment}");
    let report = super::last(client, application, environment)
        .await
        .map_err(|e| ResubmitError::Submit(submission::SubmitError::Internal(e.to_string())))?
        .ok_or_else(|| {
            ResubmitError::Nothing(format!(
                "nothing to reconcile: no drift check of {here} yet; run `manent drift {here}`"
            ))
        })?;
    let drifted = report.drifted();
    let remove_added = report.added_files();
    if drifted.is_empty() {
        return Err(ResubmitError::Nothing(format!(
            "nothing to reconcile: the last drift check of {here} ({}) found no drifted target",
            report.check_id
        )));
    }
    let (source, request) = crate::history::last_success(client, application, environment, None)
        .await?
        .ok_or_else(|| {
            ResubmitError::Nothing(format!(
                "nothing to reconcile: {here} has no successful deploy"
            ))
        })?;
    let version = request.descriptor.version().to_string();
    let how = submission::Resubmit {
        kind: OriginKind::Redeploy,
        fast: false,
        force: false,
    };
    let resubmission = submission::resubmit_to(
        client,
        config,
        (&source, request),
        how,
        submitted_by,
        (drifted.clone(), remove_added),
    )
    .await?;
    Ok(Reconciled {
        source,
        version,
        targets: drifted,
        resubmission,
    })
}

/// A reconcile just submitted.
#[derive(Debug)]
pub struct Reconciled {
    /// The live deploy submitted again.
    pub source: String,
    pub version: String,
    /// The drifted targets it deploys.
    pub targets: Vec<String>,
    pub resubmission: Resubmission,
}
