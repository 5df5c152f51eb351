//! What a deploy records and sends, shared by submission, the workflow, the gate and the
//! views: the request (with its route, decided once), who submitted it, the approvers'
//! decisions and the gate's names. A leaf: it depends on no other module of this crate.

use std::time::{Duration, UNIX_EPOCH};

use manent_engine::EnqueueRequest;
use manent_model::{Approval, Descriptor, EffectiveDescriptor, Route};
use serde::{Deserialize, Serialize};

/// The workflow's registered name.
pub const DEPLOY_WORKFLOW: &str = "manent.deploy";

/// Who submits a deploy or creates a schedule: the API token's name and stable id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitter {
    pub name: String,
    /// Empty when there is no token (tests, tools): then names are compared.
    pub token_id: String,
}

impl Submitter {
    pub fn new(name: impl Into<String>, token_id: impl Into<String>) -> Self {
        Submitter {
            name: name.into(),
            token_id: token_id.into(),
        }
    }

    /// A submitter known only by name.
    pub fn named(name: impl Into<String>) -> Self {
        Submitter::new(name, "")
    }
}

/// Whether two (name, token id) pairs are the same token: by id when both have one (a name
/// revoked and created again is another token), else by name (records made before ids).
pub fn same_token(a: (&str, &str), b: (&str, &str)) -> bool {
    if a.1.is_empty() || b.1.is_empty() {
        a.0 == b.0
    } else {
        a.1 == b.1
    }
}

/// What a submission records: the request, with its route decided once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeployRequest {
    pub descriptor: Descriptor,
    /// Built at submission; `None` when the environment configuration could
    /// not be read then (it is built by the worker's first step).
    pub effective: Option<EffectiveDescriptor>,
    pub route: Route,
    pub submitted_by: String,
    /// The submitting token's stable id (empty in requests recorded before ids existed):
    /// the self-approval check compares it, not the name.
    #[serde(default)]
    pub submitted_by_id: String,
    pub submitted_at_ms: i64,
    /// Whether the deploy first waits on the gate queue (approval, dependencies),
    /// holding no deploy slot, before it moves to `route.queue`. Decided at submission.
    #[serde(default)]
    pub gated: bool,
}

impl DeployRequest {
    pub fn new(
        descriptor: Descriptor,
        effective: Option<EffectiveDescriptor>,
        route: Route,
        submitted_by: &Submitter,
        submitted_at_ms: i64,
    ) -> Self {
        DeployRequest {
            gated: needs_gate(effective.as_ref()),
            descriptor,
            effective,
            route,
            submitted_by: submitted_by.name.clone(),
            submitted_by_id: submitted_by.token_id.clone(),
            submitted_at_ms,
        }
    }

    /// How this deploy is enqueued: on the gate queue when it must wait first,
    /// else on its route's queue; partitioned by `<application>/<environment>`.
    pub fn enqueue(&self) -> EnqueueRequest {
        let queue = if self.gated {
            GATE_QUEUE
        } else {
            self.route.queue.as_str()
        };
        let partition =
            manent_model::partition_key(&self.descriptor.application, &self.descriptor.environment);
        EnqueueRequest::new(DEPLOY_WORKFLOW, queue, self).partition(partition)
    }
}

/// The queue deploys wait on. Not one of the configuration's queues: it has no
/// limits and never appears in `manent queues`.
pub const GATE_QUEUE: &str = "manent.gate";

/// Message topic of approvals and rejections.
pub const APPROVAL_TOPIC: &str = "approval";
/// Event keys published by the gate.
pub const EVENT_APPROVAL_POLICY: &str = "approval_policy";
pub const EVENT_APPROVALS: &str = "approvals";
pub const EVENT_WAITING: &str = "waiting";

/// One approver's decision, as sent to the deploy and recorded in its events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// The approver (the API token's name).
    pub by: String,
    /// The approver's token id (empty in decisions recorded before ids existed).
    #[serde(default)]
    pub by_id: String,
    pub approve: bool,
    /// The comment of an approval or the reason of a rejection.
    #[serde(default)]
    pub reason: Option<String>,
    pub at_ms: i64,
}

/// Whether a deploy must wait on the gate queue before taking a slot.
/// Decided at submission and recorded with the request.
pub fn needs_gate(effective: Option<&EffectiveDescriptor>) -> bool {
    match effective {
        // The environment could not be read at submission: its approval policy and
        // dependencies are known only once a worker reads it, so the deploy waits to know.
        None => true,
        Some(eff) => approval_required(eff).is_some() || !eff.depends_on.is_empty(),
    }
}

/// The approval policy that applies, if approval is required. A dry-run changes
/// nothing and needs no approval.
pub(crate) fn approval_required(eff: &EffectiveDescriptor) -> Option<&Approval> {
    eff.approval
        .as_ref()
        .filter(|a| a.required && a.count > 0 && !eff.dry_run)
}

/// RFC 3339 (UTC, milliseconds) of a millisecond timestamp.
pub fn rfc3339(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(t).to_string()
}
