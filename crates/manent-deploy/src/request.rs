//! What a deploy records and sends, shared by submission, the workflow, the gate and the
//! views: the request (with its route, decided once), who submitted it, the approvers'
//! decisions and the gate's names. A leaf: it depends on no other module of this crate.

use std::time::{Duration, UNIX_EPOCH};

use manent_engine::{
    Client, EngineError, EnqueueRequest, EventRecord, WorkflowContext, WorkflowError,
    WorkflowVersions,
};
use manent_model::{Approval, Descriptor, EffectiveDescriptor, Route};
use serde::{Deserialize, Serialize};

/// The workflow's registered name.
pub const DEPLOY_WORKFLOW: &str = "manent.deploy";

/// The versions of the deploy workflow (and of its passes) this build runs and replays. A
/// change that reorders, renames or removes recorded steps makes a new version and keeps
/// the old one's code while deploys recorded under it may still be in flight
/// (ARCHITECTURE.md, "Workflow versions"); each deploy records the version it started
/// under, and only workers that run it claim, resume or recover it.
///
/// - 1: every deploy recorded before version 2, and every deploy not marked
///   [`DeployRequest::authorise_at_start`] since.
/// - 2: a deploy marked [`DeployRequest::authorise_at_start`] (`schedule.at`) records the
///   step [`AUTHORISE_AT_START_STEP`] first. Such a deploy is always started under version
///   2 or later ([`DeployRequest::enqueue`]), so no worker whose code lacks that step
///   claims it and runs it unchecked.
/// - 3: a dry run waits for nothing: instead of waiting for its dependencies it records one
///   step per dependency saying whether it is met and what a real deploy would wait for,
///   and instead of pausing between waves one step saying so
///   ([`DRY_RUNS_DO_NOT_WAIT_VERSION`]). Deploys that are not dry runs record what they did
///   under 2.
/// - 4: an automatic rollback reactivates the switched targets `max_parallel` at a time,
///   each in a branch of its own, and runs the checks after each reactivation; a fast
///   rollback ([`DeployRequest::fast`]) records a `find release` step per target and uploads
///   only where the release is gone ([`FAST_ROLLBACK_VERSION`]). A fast rollback is always
///   started under 4 or later.
/// - 5: a deploy whose environment has `deploy.tasks` records their steps: the `once`
///   tasks run before any target is switched (their target's release put in place first),
///   the others on each target before its `activate` or after it, and a failed
///   irreversible deploy whose `once` task succeeded may record why it was not rolled back
///   ([`TASKS_VERSION`]). A deploy (and a region's pass) with secrets or templates records
///   the step `resolve secrets and templates` before it fetches, and one step `<target>:
///   template <dest>` per template before `activate` (or the first command)
///   ([`VARS_VERSION`]). A deploy with tasks, variables, templates or the `command` and
///   `age` secret providers is always started under 5 or later; one with none of them
///   records what it did under 4.
/// - 6: a deploy with the `container` plugin records its steps (docs/containers.md):
///   always started under 6 or later ([`CONTAINERS_VERSION`]).
///   Also at 6: a deploy whose environment has `rollout.analysis` bakes after each wave but the
///   last: a recorded start, one `manent.recv:analysis` wait and one `wave N: measure
///   K/M` step per measurement, and, when it waits for a decision, a move to the gate
///   queue and back ([`ANALYSIS_VERSION`]). Such a deploy is always started under 6 or
///   later.
///   Also at 6: after a target's checks pass, a step `<target>: manifest` records what its
///   release holds ([`MANIFEST_VERSION`]); a dry run records a step `<target>: changes`
///   per target (its plan, docs/plan-and-drift.md).
/// - 7: a target of a container deploy prunes (`<target>: prune containers`) beside
///   retiring the old containers (`<target>: stop all but …`), the two steps created
///   together, and records its manifest after both; under 6 they ran one after the other,
///   the manifest between them ([`PRUNE_BESIDE_RETIRE_VERSION`]). A container deploy
///   started under 6 replays in that order.
/// - 8: a container deploy prunes after its result: each pass of the `container` plugin
///   ends by starting one workflow [`PRUNE_WORKFLOW`] for the targets it
///   deployed (a child, on the pass's queue and partition, so it runs once the deploy or
///   pass has ended), whose steps are the `<target>: prune containers` a deploy under 7
///   ran itself ([`PRUNE_AFTER_VERSION`]). A container deploy started under 7 prunes as
///   7 did.
pub const DEPLOY_WORKFLOW_VERSIONS: WorkflowVersions = WorkflowVersions { min: 1, max: 8 };

/// The first version whose container deploys prune in a workflow of their own, after the
/// deploy's result.
pub const PRUNE_AFTER_VERSION: u32 = 8;

/// The first version whose container deploys prune beside retiring the old containers.
pub const PRUNE_BESIDE_RETIRE_VERSION: u32 = 7;

/// The first version whose code runs the `container` plugin (docs/containers.md).
pub const CONTAINERS_VERSION: u32 = 6;

/// The first version that bakes a wave under `rollout.analysis` (docs/analysis.md).
pub const ANALYSIS_VERSION: u32 = 6;

/// The registered name of the prune after a container deploy (`containers::prune`); here,
/// a leaf, so that the views find a deploy's prunes without depending on the containers
/// room.
pub const PRUNE_WORKFLOW: &str = "manent.containers.prune";

/// The drift check's registered name (`drift`); here, a leaf, so that retention prunes
/// old checks without depending on the drift room.
pub const DRIFT_WORKFLOW: &str = "manent.drift";

/// The first version that records release manifests and dry runs' changes
/// (docs/plan-and-drift.md).
pub const MANIFEST_VERSION: u32 = 6;

/// The first version whose code runs `deploy.tasks` (docs/environments.md, "Tasks and
/// roles").
pub const TASKS_VERSION: u32 = 5;

/// The first version that resolves a deploy's secrets and templates before anything
/// changes and writes templates (docs/environments.md, "Templates").
pub const VARS_VERSION: u32 = 5;

/// The first version whose automatic rollbacks run in parallel with checks after, and
/// which runs fast rollbacks.
pub const FAST_ROLLBACK_VERSION: u32 = 4;

/// The first version whose dry runs report their dependencies and pauses instead of
/// waiting for them.
pub const DRY_RUNS_DO_NOT_WAIT_VERSION: u32 = 3;

/// The first version whose code records [`AUTHORISE_AT_START_STEP`].
pub const AUTHORISE_AT_START_VERSION: u32 = 2;

/// The step a deploy marked [`DeployRequest::authorise_at_start`] records first: its token
/// and its environment's policy checked again when its time came (`gate::reauthorise`).
pub const AUTHORISE_AT_START_STEP: &str = "authorise at start";

/// The version a new deploy starts under: the newest this build runs that every live
/// worker runs too, so an older worker can replay what a newer API submits during a
/// rolling upgrade (docs/upgrading.md).
pub async fn startable_version(client: &Client) -> Result<u32, EngineError> {
    client.startable_version(DEPLOY_WORKFLOW_VERSIONS.max).await
}

/// What this build is, as `--version`, `manent workers` and `/metrics` show it: the
/// release, the schema version it migrates to and the deploy workflow versions it runs,
/// e.g. `0.1.0 (schema 13, workflows 1-8)`. During a rolling upgrade it tells which
/// workers can run what.
pub fn build_version() -> String {
    format!(
        "{} (schema {}, workflows {DEPLOY_WORKFLOW_VERSIONS})",
        env!("CARGO_PKG_VERSION"),
        manent_engine::Database::expected_schema_version()
    )
}

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
    /// Whether the deploy is authorised again when it starts (a `schedule.at` deploy: its
    /// token and its environment's policy as they are when its time comes, not as they were
    /// at submission). Such a deploy is always gated: it starts on the gate queue, holding
    /// no slot, so a policy that now asks for approval or dependencies waits there. Left
    /// out of the recorded form when false, so requests without it read as they were.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub authorise_at_start: bool,
    /// A fast rollback (`manent rollback --fast`): every target at once (`max_parallel` at
    /// a time, no waves, no pause), the worker fetches nothing up front, and a target whose
    /// release directory still holds the verified artifacts is reactivated in place.
    /// Always started under [`FAST_ROLLBACK_VERSION`] or later. Left out when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fast: bool,
    /// Only these targets of the environment are deployed (`manent reconcile`: the drifted
    /// ones). Always started under [`MANIFEST_VERSION`] or later. Left out when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub only_targets: Vec<String>,
    /// A reconcile's files to remove, per target (the `remove_added` of its recorded origin).
    /// Left out when none.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub remove_added: std::collections::BTreeMap<String, Vec<String>>,
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
            authorise_at_start: false,
            fast: false,
            only_targets: Vec::new(),
            remove_added: Default::default(),
        }
    }

    /// This request, authorised again when it starts ([`DeployRequest::authorise_at_start`]),
    /// and so gated.
    pub fn authorised_at_start(mut self) -> Self {
        self.authorise_at_start = true;
        self.gated = true;
        self
    }

    /// The token that submitted this deploy.
    pub fn submitter(&self) -> Submitter {
        Submitter::new(&self.submitted_by, &self.submitted_by_id)
    }

    /// How this deploy is enqueued: on the gate queue when it must wait first,
    /// else on its route's queue; partitioned by `<application>/<environment>`; under
    /// deploy workflow version `version` ([`startable_version`]), or the first that records
    /// its authorisation at start if it needs one.
    pub fn enqueue(&self, version: u32) -> EnqueueRequest {
        let version = if self.authorise_at_start {
            version.max(AUTHORISE_AT_START_VERSION)
        } else {
            version
        };
        // No worker without the code of a fast rollback claims one.
        let version = if self.fast {
            version.max(FAST_ROLLBACK_VERSION)
        } else {
            version
        };
        // Nor a deploy to some targets only: it would deploy them all.
        let version = if self.only_targets.is_empty() {
            version
        } else {
            version.max(MANIFEST_VERSION)
        };
        // Nor a deploy with tasks: it would skip them.
        let version = if self.effective.as_ref().is_some_and(|e| !e.tasks.is_empty()) {
            version.max(TASKS_VERSION)
        } else {
            version
        };
        // Nor one with variables, templates or the newer secret providers: it would run
        // the deploy without them. Nor an irreversible one: an older build cannot read a
        // descriptor that has the field.
        let version = if self.effective.as_ref().is_some_and(uses_vars)
            || self.descriptor.irreversible.is_some()
        {
            version.max(VARS_VERSION)
        } else {
            version
        };
        // Nor a container deploy: its steps are version 6's.
        let version = if self
            .effective
            .as_ref()
            .is_some_and(|e| e.plugin == manent_model::CONTAINER_PLUGIN)
        {
            version.max(CONTAINERS_VERSION)
        } else {
            version
        };
        // Nor one with an analysis: it would go on to the next wave unjudged.
        let version = if self
            .effective
            .as_ref()
            .is_some_and(|e| e.rollout.analysis.is_some())
        {
            version.max(ANALYSIS_VERSION)
        } else {
            version
        };
        let queue = if self.gated {
            GATE_QUEUE
        } else {
            self.route.queue.as_str()
        };
        let partition =
            manent_model::partition_key(&self.descriptor.application, &self.descriptor.environment);
        EnqueueRequest::new(DEPLOY_WORKFLOW, queue, self)
            .partition(partition)
            .version(version)
    }
}

/// Whether `eff` has what only workers of [`VARS_VERSION`] or later do.
fn uses_vars(eff: &EffectiveDescriptor) -> bool {
    !eff.variables.is_empty()
        || !eff.scoped_variables.is_empty()
        || !eff.descriptor_variables.is_empty()
        || !eff.templates.is_empty()
        || eff
            .secrets
            .values()
            .any(|s| s.command.is_some() || s.age.is_some())
}

/// The queue deploys wait on. Not one of the configuration's queues: it has no
/// limits and never appears in `manent queues`.
pub const GATE_QUEUE: &str = "manent.gate";

/// Message topic of approvals and rejections.
pub const APPROVAL_TOPIC: &str = "approval";

/// Message topic of `manent promote` and `manent abort` (docs/analysis.md).
pub const ANALYSIS_TOPIC: &str = "analysis";

/// The key of an event a deploy (or its region pass) publishes. Its text is stored: in the
/// events table and in the name of the step that recorded it (`manent.event:<key>`), so a
/// replay by another build of manent meets the same names; never change one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKey {
    /// `phase`: where the deploy stands, a [`Phase`].
    Phase,
    /// `waiting`: what a gated deploy waits for, in words (empty once it waits no more).
    Waiting,
    /// `approval_policy`: the policy a deploy waiting for approval is decided under.
    ApprovalPolicy,
    /// `approvals`: the decisions counted so far, in order.
    Approvals,
    /// `target:<name>`: one target's outcome (`targets::TargetOutcome`).
    Target(String),
    /// `measurements`: every measurement of `rollout.analysis` so far, in order.
    Measurements,
}

impl EventKey {
    const TARGET_PREFIX: &'static str = "target:";

    /// The key of target `name`'s outcome.
    pub fn target(name: &str) -> Self {
        EventKey::Target(name.to_string())
    }

    /// The key as stored.
    pub fn text(&self) -> std::borrow::Cow<'static, str> {
        match self {
            EventKey::Phase => "phase".into(),
            EventKey::Waiting => "waiting".into(),
            EventKey::ApprovalPolicy => "approval_policy".into(),
            EventKey::Approvals => "approvals".into(),
            EventKey::Measurements => "measurements".into(),
            EventKey::Target(name) => format!("{}{name}", Self::TARGET_PREFIX).into(),
        }
    }

    /// The key a stored event's text names; `None` for the engine's own (`recovery:<ms>`)
    /// and any this build does not publish.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "phase" => Some(EventKey::Phase),
            "waiting" => Some(EventKey::Waiting),
            "approval_policy" => Some(EventKey::ApprovalPolicy),
            "approvals" => Some(EventKey::Approvals),
            "measurements" => Some(EventKey::Measurements),
            other => other
                .strip_prefix(Self::TARGET_PREFIX)
                .map(|name| EventKey::Target(name.to_string())),
        }
    }
}

/// Publishes `value` as the deploy's event `key` (`WorkflowContext::set_event`).
pub async fn publish<T: Serialize + Sync>(
    ctx: &WorkflowContext,
    key: &EventKey,
    value: &T,
) -> Result<(), WorkflowError> {
    ctx.set_event(&key.text(), value).await
}

/// Deploy `id`'s event `key`, if it was published. One that cannot be read is an error
/// naming the deploy and the key: what it would have said (an approval, a phase) is not
/// taken as unsaid.
pub fn event<T: serde::de::DeserializeOwned>(
    id: &str,
    events: &[EventRecord],
    key: &EventKey,
) -> Result<Option<T>, EngineError> {
    let key = key.text();
    events
        .iter()
        .find(|e| e.key == key)
        .map(|e| {
            serde_json::from_str(&e.value).map_err(|error| EngineError::Unreadable {
                kind: "deploy event",
                id: format!("{id} {key}"),
                error: error.to_string(),
            })
        })
        .transpose()
}

impl std::fmt::Display for EventKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text())
    }
}

/// Where a deploy stands: what the views derive from its status (`scheduled`, `queued`,
/// `done`) and what the workflow publishes as event `phase` while it runs. Stored as a
/// stable code ([`Phase::code`], a JSON string: `wave:1:2:web`, `rolling_back`), apart from
/// how it is shown ([`Phase::text`]: `wave 1/2 (web)`, `rolling back`); the text an older
/// manent stored reads too. A code this build does not name (a newer worker's) is kept as
/// written (`Other`); a code it names that cannot be read is an error, never a default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Enqueued with a start time still to come.
    Scheduled,
    /// Enqueued, or through the gate and moving to its route's queue.
    Queued,
    WaitingApproval,
    WaitingDependency,
    /// Claimed, before the workflow said more.
    Running,
    /// Fetching and verifying the artifacts.
    Fetching,
    /// Deploying wave `number` of `of` (1-based), named `name`.
    Wave {
        number: usize,
        of: usize,
        name: String,
    },
    /// Pausing (`rollout.pause`) before wave `number` (1-based).
    PauseBeforeWave(usize),
    /// Measuring (`rollout.analysis`) after wave `number` (1-based).
    BakeAfterWave(usize),
    /// An analysis could not be taken often enough: waiting for `manent promote` or
    /// `manent abort`, holding no deploy slot.
    WaitingDecision,
    RollingBack,
    Done,
    /// Refused when it fired: a scheduled deploy whose token or environment no longer
    /// allows it (its error says why). Final, as `done`.
    Refused,
    /// A phase this build does not name, kept as written.
    Other(String),
}

impl Phase {
    /// The phase as stored and shown.
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Phase::Scheduled => "scheduled".into(),
            Phase::Queued => "queued".into(),
            Phase::WaitingApproval => "waiting_approval".into(),
            Phase::WaitingDependency => "waiting_dependency".into(),
            Phase::Running => "running".into(),
            Phase::Fetching => "fetching".into(),
            Phase::Wave { number, of, name } => format!("wave {number}/{of} ({name})").into(),
            Phase::PauseBeforeWave(number) => format!("pause before wave {number}").into(),
            Phase::BakeAfterWave(number) => format!("bake after wave {number}").into(),
            Phase::WaitingDecision => "waiting_decision".into(),
            Phase::RollingBack => "rolling back".into(),
            Phase::Done => "done".into(),
            Phase::Refused => "refused".into(),
            Phase::Other(text) => text.as_str().into(),
        }
    }

    /// The phase as stored: a stable code, which the way it is shown may change without.
    pub fn code(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Phase::Wave { number, of, name } => format!("wave:{number}:{of}:{name}").into(),
            Phase::PauseBeforeWave(number) => format!("pause_before_wave:{number}").into(),
            Phase::BakeAfterWave(number) => format!("bake_after_wave:{number}").into(),
            Phase::RollingBack => "rolling_back".into(),
            // The others' codes are their texts: names that never change.
            _ => self.text(),
        }
    }

    /// The phase a stored value names: its code, or the text an older manent stored. A
    /// value this build does not name is kept as written ([`Phase::Other`]); a code it names
    /// whose numbers cannot be read is an error.
    pub fn from_stored(stored: &str) -> Result<Self, String> {
        let numbered = |rest: &str| {
            rest.parse::<usize>()
                .map_err(|e| format!("the phase `{stored}` has no readable wave number: {e}"))
        };
        if let Some(rest) = stored.strip_prefix("pause_before_wave:") {
            return numbered(rest).map(Phase::PauseBeforeWave);
        }
        if let Some(rest) = stored.strip_prefix("bake_after_wave:") {
            return numbered(rest).map(Phase::BakeAfterWave);
        }
        if let Some(rest) = stored.strip_prefix("wave:") {
            let mut parts = rest.splitn(3, ':');
            let (number, of, name) = (parts.next(), parts.next(), parts.next());
            let (Some(number), Some(of), Some(name)) = (number, of, name) else {
                return Err(format!(
                    "the phase `{stored}` is not `wave:<number>:<of>:<name>`"
                ));
            };
            return Ok(Phase::Wave {
                number: numbered(number)?,
                of: numbered(of)?,
                name: name.to_string(),
            });
        }
        if stored == "rolling_back" {
            return Ok(Phase::RollingBack);
        }
        Ok(Self::parse_text(stored))
    }

    /// The phase an older manent stored as `text`. Whatever it is, its [`Phase::text`] is
    /// `text` again (a wave written `wave 01/2 (web)` is kept as `Other`, not rewritten).
    pub fn parse_text(text: &str) -> Self {
        let named = match text {
            "scheduled" => Some(Phase::Scheduled),
            "queued" => Some(Phase::Queued),
            "waiting_approval" => Some(Phase::WaitingApproval),
            "waiting_dependency" => Some(Phase::WaitingDependency),
            "waiting_decision" => Some(Phase::WaitingDecision),
            "running" => Some(Phase::Running),
            "fetching" => Some(Phase::Fetching),
            "rolling back" => Some(Phase::RollingBack),
            "done" => Some(Phase::Done),
            "refused" => Some(Phase::Refused),
            other => Self::parse_wave(other),
        };
        named
            .filter(|phase| phase.text() == text)
            .unwrap_or_else(|| Phase::Other(text.to_string()))
    }

    fn parse_wave(text: &str) -> Option<Self> {
        if let Some(number) = text.strip_prefix("pause before wave ") {
            return number.parse().ok().map(Phase::PauseBeforeWave);
        }
        if let Some(number) = text.strip_prefix("bake after wave ") {
            return number.parse().ok().map(Phase::BakeAfterWave);
        }
        let (number, rest) = text.strip_prefix("wave ")?.split_once('/')?;
        let (of, name) = rest.split_once(" (")?;
        Some(Phase::Wave {
            number: number.parse().ok()?,
            of: of.parse().ok()?,
            name: name.strip_suffix(')')?.to_string(),
        })
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text())
    }
}

impl PartialEq<&str> for Phase {
    fn eq(&self, other: &&str) -> bool {
        self.text() == *other
    }
}

impl Serialize for Phase {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.code())
    }
}

impl<'de> Deserialize<'de> for Phase {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let stored = String::deserialize(deserializer)?;
        Phase::from_stored(&stored).map_err(serde::de::Error::custom)
    }
}

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

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    /// Every phase as the events table holds it (a JSON string, its code); each reads back
    /// as itself.
    #[test]
    fn every_phase_is_stored_as_its_code_and_reads_back() {
        let phases = [
            Phase::Scheduled,
            Phase::Queued,
            Phase::WaitingApproval,
            Phase::WaitingDependency,
            Phase::Running,
            Phase::Fetching,
            Phase::Wave {
                number: 1,
                of: 2,
                name: "web (eu): a".into(),
            },
            Phase::PauseBeforeWave(2),
            Phase::BakeAfterWave(1),
            Phase::WaitingDecision,
            Phase::RollingBack,
            Phase::Done,
            Phase::Refused,
            Phase::Other("warming caches".into()),
        ];
        let written: Vec<String> = phases
            .iter()
            .map(|p| serde_json::to_string(p).expect("a phase serialises"))
            .collect();
        expect![[r#"
            "scheduled"
            "queued"
            "waiting_approval"
            "waiting_dependency"
            "running"
            "fetching"
            "wave:1:2:web (eu): a"
            "pause_before_wave:2"
            "bake_after_wave:1"
            "waiting_decision"
            "rolling_back"
            "done"
            "refused"
            "warming caches""#]]
        .assert_eq(&written.join("\n"));
        for (phase, json) in phases.iter().zip(&written) {
            let read: Phase = serde_json::from_str(json).expect("a recorded phase reads");
            assert_eq!(&read, phase, "{json} reads back as the phase that wrote it");
        }
    }

    #[test]
    fn the_text_an_older_manent_stored_reads_as_its_phase() {
        for (text, phase) in [
            (
                "wave 1/2 (web (eu))",
                Phase::Wave {
                    number: 1,
                    of: 2,
                    name: "web (eu)".into(),
                },
            ),
            ("pause before wave 2", Phase::PauseBeforeWave(2)),
            ("bake after wave 1", Phase::BakeAfterWave(1)),
            ("rolling back", Phase::RollingBack),
            ("waiting_approval", Phase::WaitingApproval),
        ] {
            let json = serde_json::to_string(text).unwrap();
            let read: Phase = serde_json::from_str(&json).expect("an older phase reads");
            assert_eq!(read, phase, "{text}, as stored before codes, is that phase");
            assert_eq!(read.text(), text, "and it is shown as before");
        }
    }

    #[test]
    fn a_phase_code_that_cannot_be_read_is_an_error_never_a_default() {
        for stored in [
            "wave:x:2:web",
            "wave:1:2",
            "pause_before_wave:",
            "bake_after_wave:-1",
        ] {
            let json = serde_json::to_string(stored).unwrap();
            let error = serde_json::from_str::<Phase>(&json)
                .expect_err("a damaged code is not read as some phase");
            assert!(
                error.to_string().contains(stored),
                "the error quotes what was stored: {error}"
            );
        }
        assert!(
            serde_json::from_str::<Phase>("3").is_err(),
            "a phase that is not a string is an error"
        );
    }

    #[test]
    fn a_phase_text_this_build_would_write_otherwise_is_kept_as_written() {
        for text in ["wave 01/2 (web)", "wave 1/2", "pause before wave x", "Done"] {
            let phase = Phase::from_stored(text).expect("a text is kept");
            assert_eq!(
                phase,
                Phase::Other(text.into()),
                "{text} is not rewritten into a phase that reads differently"
            );
            assert_eq!(phase.text(), text, "and it is shown as it was written");
        }
    }

    /// Every event key as stored (the events table, and the step `manent.event:<key>` that
    /// recorded it); each parses back.
    #[test]
    fn every_event_key_is_stored_as_before_and_parses_back() {
        let keys = [
            EventKey::Phase,
            EventKey::Waiting,
            EventKey::ApprovalPolicy,
            EventKey::Approvals,
            EventKey::target("web-1"),
            EventKey::Measurements,
        ];
        let texts: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        expect![[r#"
            phase
            waiting
            approval_policy
            approvals
            target:web-1
            measurements"#]]
        .assert_eq(&texts.join("\n"));
        for (key, text) in keys.iter().zip(&texts) {
            assert_eq!(
                EventKey::parse(text).as_ref(),
                Some(key),
                "{text} parses back"
            );
        }
        assert_eq!(
            EventKey::parse("recovery:1700000000000"),
            None,
            "the engine's own events are no deploy event"
        );
    }

    /// A deploy with `deploy.tasks` starts under [`TASKS_VERSION`] whatever the live
    /// workers run: a worker without their code would skip them. Others start as before.
    #[test]
    fn a_deploy_with_tasks_is_never_started_under_a_version_that_skips_them() {
        let request = |tasks: &str| {
            let env = manent_model::parse_environment(
                &format!("targets: [{{name: t, host: local}}]\ndeploy:\n  dest: /srv\n{tasks}"),
                "prod.yml",
                "ml/web",
                "prod",
            )
            .expect("a valid environment");
            let descriptor = manent_model::parse_descriptor(
                &format!(
                    "application: ml/web\nenvironment: prod\nartifacts: [{{name: a, type: t, \
                     version: \"1\", url: \"file:///a\", sha256: {}}}]\n",
                    "0".repeat(64)
                ),
                "d.yml",
            )
            .expect("a valid descriptor");
            let config =
                manent_config::Config::from_yaml_str("{}", "manent.yml", std::iter::empty())
                    .expect("a valid configuration");
            let route = manent_model::route(&config, &descriptor, Ok(&env));
            let effective = EffectiveDescriptor::build(&descriptor, &env).expect("effective");
            DeployRequest::new(
                descriptor,
                Some(effective),
                route,
                &Submitter::named("t"),
                0,
            )
        };
        let with_tasks = request("  tasks: [{name: m, run: x, when: after_activate}]\n");
        assert_eq!(
            with_tasks.enqueue(3).workflow_version,
            TASKS_VERSION,
            "a deploy with tasks waits for a worker that runs them"
        );
        assert_eq!(
            request("").enqueue(3).workflow_version,
            3,
            "a deploy without tasks starts under the version every live worker runs"
        );
    }
}
