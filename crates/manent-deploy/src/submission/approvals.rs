//! Approvals: who may approve or reject a deploy waiting for approval, and the decision
//! sent to it (docs/environments.md, approvals).

use manent_engine::{Client, EngineError, WorkflowStatus, now_ms};

use crate::request::event;
use crate::{
    history::read_request,
    request::{DEPLOY_WORKFLOW, Decision, EventKey, Phase, same_token},
};

/// Who asks to approve or reject a deploy: the API token's name, stable id and role.
#[derive(Debug, Clone)]
pub struct Approver {
    pub name: String,
    /// The token's stable id: the self-approval check and the count of distinct
    /// approvers compare it (empty when unknown: names are compared).
    pub token_id: String,
    pub role: String,
}

/// Why an approval or rejection was refused.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("no deploy `{0}`")]
    NotFound(String),
    /// The deploy does not wait for approval (any more).
    #[error("{0}")]
    NotWaiting(String),
    /// This approver may not decide on this deploy; says what it may not do.
    #[error("may not {0}")]
    Forbidden(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Approves (`approve`) or rejects a deploy waiting for approval: checks that it
/// waits, that `approver` is one of the policy's approvers (by name or role)
/// and not its submitter (unless the policy allows it), then sends the decision.
pub async fn decide(
    client: &Client,
    id: &str,
    approver: &Approver,
    approve: bool,
    reason: Option<String>,
) -> Result<(), DecideError> {
    let Some(record) = client.get(id).await?.filter(|r| r.name == DEPLOY_WORKFLOW) else {
        return Err(DecideError::NotFound(id.to_string()));
    };
    // A deploy that exists but cannot be read is no 404: nobody can decide on it until
    // its record is fixed, and the error says so.
    let request = read_request(&record)?;
    let events = client.events(id).await?;
    let phase: Option<Phase> = event(id, &events, &EventKey::Phase)?;
    let policy: Option<manent_model::Approval> = event(id, &events, &EventKey::ApprovalPolicy)?;
    let verb = if approve { "approve" } else { "reject" };
    let (WorkflowStatus::Pending, Some(Phase::WaitingApproval), Some(policy)) =
        (record.status, &phase, policy)
    else {
        // An ended deploy's last phase may still read `waiting_approval` (a rejection or
        // an expiry ends it there): its status says it all.
        return Err(DecideError::NotWaiting(if record.status.is_terminal() {
            format!(
                "deploy {id} has ended ({}{}); nothing to {verb}",
                record.status,
                record
                    .error
                    .as_deref()
                    .map_or(String::new(), |e| format!(": {e}"))
            )
        } else {
            format!(
                "deploy {id} is not waiting for approval (status {}, phase {}); nothing to {verb}",
                record.status,
                phase.as_ref().map_or("none".into(), Phase::text),
            )
        }));
    };
    // A second decision of one approver counts once: say so rather than succeed silently.
    let decided: Vec<Decision> = event(id, &events, &EventKey::Approvals)?.unwrap_or_default();
    if let Some(earlier) = decided
        .iter()
        .find(|d| same_token((&d.by, &d.by_id), (&approver.name, &approver.token_id)))
    {
        return Err(DecideError::NotWaiting(format!(
            "{} already {} deploy {id}; a decision counts once per approver",
            approver.name,
            if earlier.approve {
                "approved"
            } else {
                "rejected"
            }
        )));
    }
    if !policy.approvers.is_empty()
        && !policy
            .approvers
            .iter()
            .any(|a| a == &approver.name || a == &approver.role)
    {
        return Err(DecideError::Forbidden(format!(
            "decide on deploys of {}/{}: its approval policy names {} (by token name or role)",
            request.descriptor.application,
            request.descriptor.environment,
            policy.approvers.join(", ")
        )));
    }
    let own_deploy = same_token(
        (&approver.name, &approver.token_id),
        (&request.submitted_by, &request.submitted_by_id),
    );
    if approve && own_deploy && !policy.allow_self_approval {
        return Err(DecideError::Forbidden(format!(
            "approve deploy {id}, which it submitted (the policy's allow_self_approval is false); ask another approver"
        )));
    }
    let decision = Decision {
        by: approver.name.clone(),
        by_id: approver.token_id.clone(),
        approve,
        reason,
        at_ms: now_ms(),
    };
    client
        .send(id, crate::request::APPROVAL_TOPIC, &decision)
        .await?;
    Ok(())
}
