//! Deploys: the descriptor a user submits, what a submission answers, a deploy's status,
//! logs and output, and the bodies of approve, reject and rollback.

use serde::{Deserialize, Serialize};

use manent_enum::string_enum;

string_enum!(
    /// The life of a deploy, with DBOS's names.
    WorkflowStatus, listed: true,
    "ENQUEUED: waiting on its queue (or its scheduled time); PENDING: a worker runs it; \
     then SUCCESS, ERROR or CANCELLED." {
        Enqueued = "ENQUEUED",
        Pending = "PENDING",
        Success = "SUCCESS",
        Error = "ERROR",
        Cancelled = "CANCELLED",
    }
);

impl WorkflowStatus {
    /// SUCCESS, ERROR or CANCELLED: the deploy will not change any more.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            WorkflowStatus::Success | WorkflowStatus::Error | WorkflowStatus::Cancelled
        )
    }
}

string_enum!(
    /// What a submission answers: the deploy's status, or `SCHEDULED` for a recurring
    /// schedule.
    SubmittedStatus, listed: true,
    "The deploy's status (see WorkflowStatus); `SCHEDULED` when the descriptor has \
     `schedule.cron`, and then `id` is the schedule's." {
        Enqueued = "ENQUEUED",
        Pending = "PENDING",
        Success = "SUCCESS",
        Error = "ERROR",
        Cancelled = "CANCELLED",
        Scheduled = "SCHEDULED",
    }
);

impl From<WorkflowStatus> for SubmittedStatus {
    fn from(status: WorkflowStatus) -> Self {
        match status {
            WorkflowStatus::Enqueued => SubmittedStatus::Enqueued,
            WorkflowStatus::Pending => SubmittedStatus::Pending,
            WorkflowStatus::Success => SubmittedStatus::Success,
            WorkflowStatus::Error => SubmittedStatus::Error,
            WorkflowStatus::Cancelled => SubmittedStatus::Cancelled,
            WorkflowStatus::Other(text) => SubmittedStatus::Other(text),
        }
    }
}

string_enum!(
    /// Where a deploy stands: the phases manent names, or the workflow's own
    /// (`wave 1/2 (web)`, `fetching`, …) as `Other`.
    Phase, listed: false,
    "`scheduled`, `queued`, `waiting_approval` or `waiting_dependency` (holding no deploy \
     slot), then while it runs its own phase (`running`, `fetching`, `wave N/M (name)`, \
     `bake after wave N`, `pause before wave N`, `rolling back`, …; `waiting_decision`, \
     holding no slot, when an analysis waits for `manent promote` or `manent abort`), then `done`; `refused` for a scheduled \
     deploy refused when its time came (its token or its environment no longer allows it; \
     its `error` says why)." {
        Scheduled = "scheduled",
        Queued = "queued",
        WaitingApproval = "waiting_approval",
        WaitingDependency = "waiting_dependency",
        /// `rollout.analysis` could not measure often enough: waiting for `manent promote`
        /// or `manent abort`, holding no deploy slot (docs/analysis.md).
        WaitingDecision = "waiting_decision",
        Running = "running",
        Done = "done",
        Refused = "refused",
    }
);

string_enum!(
    /// One target's state in a deploy.
    TargetState, listed: true,
    "pending, deploying, deployed, failed, rolled_back, planned (a dry run) or cancelled." {
        Pending = "pending",
        Deploying = "deploying",
        Deployed = "deployed",
        Failed = "failed",
        RolledBack = "rolled_back",
        Planned = "planned",
        Cancelled = "cancelled",
    }
);

string_enum!(
    /// A recorded step: RUNNING while it runs (rerun after a crash), then SUCCESS or ERROR;
    /// STOPPED when its deploy ended while it ran (cancelled, or failed elsewhere): it will
    /// never finish.
    StepStatus, listed: true,
    "RUNNING, then SUCCESS or ERROR; STOPPED when the deploy ended while the step ran; \
     INTERRUPTED when the worker running it is gone (killed, frozen, cut off): it runs \
     again from its start where the deploy resumes." {
        Running = "RUNNING",
        Success = "SUCCESS",
        Error = "ERROR",
        Stopped = "STOPPED",
        Interrupted = "INTERRUPTED",
    }
);

string_enum!(
    /// An approver's decision.
    Decision, listed: true, "approved or rejected." {
        Approved = "approved",
        Rejected = "rejected",
    }
);

string_enum!(
    /// How a deploy came from an earlier one.
    RedeployKind, listed: true,
    "rollback (`manent rollback`: an earlier successful version) or redeploy \
     (`manent redeploy`: a past deploy's descriptor as it was)." {
        Rollback = "rollback",
        Redeploy = "redeploy",
    }
);

string_enum!(
    /// What the asking token may do to a deploy now.
    DeployAction, listed: true, "approve, reject, cancel, redeploy, promote or abort." {
        Approve = "approve",
        Reject = "reject",
        Cancel = "cancel",
        /// Submit its recorded descriptor again (an ended deploy).
        Redeploy = "redeploy",
        /// Pass its analysis (a bake, or a wait for a decision): `manent promote`.
        Promote = "promote",
        /// Fail it on its analysis: `manent abort`.
        Abort = "abort",
    }
);

string_enum!(
    /// Where a line of a deploy's output was printed.
    OutputStream, listed: true,
    "stdout, stderr, or progress (a plugin's progress note)." {
        Stdout = "stdout",
        Stderr = "stderr",
        Progress = "progress",
    }
);

string_enum!(
    /// `schedule.missed` of a descriptor.
    Missed, listed: true,
    "With `cron` only: what to do with ticks missed while no worker ran: `run_once` runs \
     the latest of them once, `skip` runs none." {
        RunOnce = "run_once",
        Skip = "skip",
    }
);

/// What a user submits to deploy (`POST /api/v1/deploys`, YAML or JSON). Unknown fields
/// are refused, and a descriptor cannot choose its queue: routing is operator
/// configuration. The server reads the text itself (its errors name the line); this is
/// the documented shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Descriptor {
    /// `tenant/app`.
    #[cfg_attr(feature = "openapi", schema(examples("ml/trainer")))]
    pub application: String,
    /// Letters, digits, `-`, `_` and `.`.
    #[cfg_attr(feature = "openapi", schema(examples("prod")))]
    pub environment: String,
    /// What to deploy; at least one, names unique.
    #[cfg_attr(feature = "openapi", schema(min_items = 1))]
    pub artifacts: Vec<Artifact>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deploy: Option<DeployOverrides>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
    /// Plan instead of act.
    #[serde(default)]
    pub dry_run: bool,
    /// Deploys that must have succeeded first, besides those of the environment file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depends_on: Option<Vec<Dependency>>,
    /// Why this deploy cannot be undone by running older code (a destructive schema
    /// migration, say), on one line: marks it, and a rollback to a version deployed before
    /// it is refused unless forced (docs/environments.md, "The rollback guard").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 200,
            examples("drops column users.legacy_name")
        )
    )]
    pub irreversible: Option<String>,
}

/// One artifact: what an approver approves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    /// Its file name on the targets (`<dest>/<name>`); no `/`, `\` or `..`.
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub name: String,
    /// `tarball`, `binary`, `ansible`, …
    #[serde(rename = "type")]
    #[cfg_attr(feature = "openapi", schema(min_length = 1, examples("tarball")))]
    pub artifact_type: String,
    /// Expanded as `{version}`; no `/`, `\` or `..`. A number is read as text.
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub version: String,
    /// Where to fetch it: `file://`, `http://` or `https://`; empty for an image pulled by
    /// `ref`.
    #[serde(default)]
    pub url: String,
    /// Hex SHA-256 of its content, verified after download; for an image pulled by `ref`,
    /// the reference's digest.
    #[cfg_attr(feature = "openapi", schema(pattern = r"^[0-9a-fA-F]{64}$"))]
    pub sha256: String,
    /// An image in a registry pinned by digest (`registry/app@sha256:<64 hex>`), pulled by
    /// each target (docs/containers.md, "Registry references"). Absent otherwise.
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(examples(
            "registry.example.com/shop/api@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
        ))
    )]
    pub reference: Option<String>,
}

/// Overrides of the environment file's `deploy:` section: each field set here wins.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DeployOverrides {
    /// `remote-copy`, `command`, or a configured plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// Where artifacts go on each target (placeholders `{version}`, `{target}`,
    /// `{application}`, `{environment}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest: Option<String>,
    /// Command run on each target once the artifacts are in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activate: Option<String>,
    /// Commands of the `command` plugin, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_items = 1))]
    pub commands: Option<Vec<String>>,
    /// Free plugin parameters; a mapping is merged key by key over the environment's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<serde_json::Value>,
    /// Variables over the environment file's, by name (where its `overrides:` lists
    /// `variables`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variables: Option<std::collections::BTreeMap<String, String>>,
}

/// When to deploy: exactly one of `at` (once) and `cron` (recurring).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    /// RFC 3339 with its offset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub at: Option<String>,
    /// Cron expression: five fields, or six whose first is the second (0-59).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(examples("30 2 * * 1-5")))]
    pub cron: Option<String>,
    /// IANA time zone `cron` is read in (UTC when absent); with `cron` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(examples("Europe/Paris")))]
    pub timezone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missed: Option<Missed>,
}

/// A deploy that must have succeeded before this one runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Dependency {
    /// `tenant/app`.
    #[cfg_attr(feature = "openapi", schema(pattern = r"^[^/]+/[^/]+$"))]
    pub application: String,
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub environment: String,
    /// The version it must run, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// How long to wait for it, like `10s`, `5m`, `1h`; forever when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(examples("10m")))]
    pub timeout: Option<String>,
}

/// A deploy just submitted (or cancelled), or a schedule just created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Submitted {
    /// The deploy's id (the schedule's with `SCHEDULED`).
    pub id: String,
    pub status: SubmittedStatus,
    /// The queue it was routed to.
    #[cfg_attr(feature = "openapi", schema(examples("default")))]
    pub queue: String,
}

/// A bulk submission (`POST /api/v1/deploys/batch`): many deploys in one request,
/// checked together and enqueued in one transaction, or none of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubmitBatch {
    /// The deploys, in order: at least one, at most 1,000.
    pub deploys: Vec<BatchEntry>,
}

/// One deploy of a bulk submission: a descriptor's text and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchEntry {
    /// The descriptor, in YAML or JSON, as in a file.
    #[cfg_attr(
        feature = "openapi",
        schema(examples(
            "application: web/shop\nenvironment: prod\nartifacts:\n  - {name: shop.tar.gz, type: \
             tarball, version: 1.4.2, url: \"https://releases.example.com/shop-1.4.2.tar.gz\", \
             sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}\n"
        ))
    )]
    pub descriptor: String,
    /// The descriptor's file name, for messages (default `deploys[N]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// What a rollback or redeploy answers: the new deploy, and what it submitted again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Resubmitted {
    #[serde(flatten)]
    pub submitted: Submitted,
    /// The deploy whose recorded descriptor was submitted again.
    pub redeploy_of: String,
    pub redeploy_kind: RedeployKind,
    /// The version deployed (the first artifact's).
    pub version: String,
}

/// One step of a deploy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepView {
    #[cfg_attr(feature = "openapi", schema(examples("t1: command 1")))]
    pub name: String,
    pub status: StepStatus,
    pub attempts: i64,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub started_at: String,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub finished_at: Option<String>,
    /// The worker that ran it.
    pub executor_id: String,
    pub error: Option<String>,
}

/// One target of a deploy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TargetView {
    pub name: String,
    pub status: TargetState,
    pub detail: Option<String>,
    /// Its roles in the environment file (`targets[].roles`). Absent when it has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    /// Under the `container` plugin, what it runs behind its proxy once switched
    /// (docs/containers.md). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerView>,
}

/// A target's container under the `container` plugin, as its steps recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ContainerView {
    /// `<name>-<version>`.
    #[cfg_attr(feature = "openapi", schema(examples("shop-api-prod-1.4.0")))]
    pub name: String,
    /// The image's tag on the target.
    #[cfg_attr(
        feature = "openapi",
        schema(examples("localhost/manent/shop-api-prod:1.4.0"))
    )]
    pub image: String,
    /// The image's id as the runtime reports it (`sha256:…`); empty when it did not say.
    pub image_digest: String,
    /// Where the container's port is published on the target.
    #[cfg_attr(feature = "openapi", schema(examples("127.0.0.1:41873")))]
    pub address: String,
    pub proxy: ContainerProxyView,
}

/// The proxy in front of a target's containers, as the last switch left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ContainerProxyView {
    /// Where it listens (`deploy.proxy.listen` expanded).
    #[cfg_attr(feature = "openapi", schema(examples("10.0.0.11:80")))]
    pub listen: String,
    /// The server new requests go to: the container's name.
    pub server: String,
    /// That server's address.
    pub upstream: String,
}

/// One approval or rejection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApprovalView {
    /// The approver's token name.
    pub by: String,
    pub decision: Decision,
    pub reason: Option<String>,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub at: String,
}

/// A deploy as status shows it (docs/cli.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeployStatus {
    pub id: String,
    /// `tenant/app`.
    #[cfg_attr(feature = "openapi", schema(examples("ml/trainer")))]
    pub application: String,
    #[cfg_attr(feature = "openapi", schema(examples("prod")))]
    pub environment: String,
    /// The version of the first artifact (empty if none).
    pub version: String,
    pub status: WorkflowStatus,
    pub phase: Phase,
    /// The queue it was routed to.
    pub queue: String,
    /// The kind of that queue.
    pub route_kind: crate::QueueKind,
    /// The worker that holds (or last held) it.
    pub executor_id: Option<String>,
    pub dry_run: bool,
    pub targets: Vec<TargetView>,
    /// Empty in lists and in activity.
    pub steps: Vec<StepView>,
    /// Why it failed.
    pub error: Option<String>,
    /// The name of the token that submitted it.
    pub submitted_by: String,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub created_at: String,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub updated_at: String,
    /// While it waits: why (`approval: 1 of 2 (approvers: …)`, `dependency: a successful
    /// deploy of ml/db/prod`). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// Approvals and a rejection received, in order. Absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<ApprovalView>,
    /// The artifacts as submitted (name, type, version, url, sha256): what an approver
    /// approves.
    #[serde(default)]
    pub artifacts: Vec<Artifact>,
    /// The `deploy:` fields the descriptor set over its environment file, with their
    /// values. Absent when none.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub overrides: serde_json::Map<String, serde_json::Value>,
    /// What the deploy does: the environment file with the descriptor's overrides applied
    /// (status only; absent when the environment could not be read at submission).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub effective: Option<serde_json::Value>,
    /// The version deployed in this environment now, while the deploy waits for approval.
    /// Absent otherwise or when nothing was deployed there yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployed_now: Option<String>,
    /// While it waits for approval: what it would change, target by target (computed once
    /// as it started waiting; docs/plan-and-drift.md). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<crate::ApprovalPlanView>,
    /// What the asking token may do to the deploy now (absent when nothing): the Platform
    /// page shows only these buttons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<DeployAction>,
    /// When a worker first took it (a wait for approval or dependencies counts); null
    /// before.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub started_at: Option<String>,
    /// When it ended (SUCCESS, ERROR or CANCELLED); null while it has not.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub finished_at: Option<String>,
    /// From `started_at` to `finished_at`, in milliseconds; null until both are known.
    #[serde(default)]
    pub duration_ms: Option<i64>,
    /// The deploy whose recorded descriptor this one submitted again (`manent rollback`,
    /// `manent redeploy`); null otherwise.
    #[serde(default)]
    pub redeploy_of: Option<String>,
    /// `rollback` or `redeploy` with `redeploy_of`; null otherwise.
    #[serde(default)]
    pub redeploy_kind: Option<RedeployKind>,
    /// Why the deploy cannot be undone by running older code (its descriptor's
    /// `irreversible`): a rollback to a version deployed before it is refused unless forced
    /// (docs/environments.md, "The rollback guard"). Null when it can.
    #[serde(default)]
    #[cfg_attr(
        feature = "openapi",
        schema(examples("drops column users.legacy_name"))
    )]
    pub irreversible: Option<String>,
    /// The rollout's waves and their targets (status only; absent in lists): the
    /// timeline's bands.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waves: Vec<WaveView>,
    /// The region passes of a region-routed deploy (status only; absent otherwise); their
    /// steps are among `steps`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passes: Vec<PassView>,
    /// Each time a worker holding it was lost and the deploy moved on (status only; absent
    /// when none): the timeline's interruptions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interruptions: Vec<InterruptionView>,
    /// Every measurement of `rollout.analysis` so far, in the order taken (docs/analysis.md).
    /// Absent when the deploy has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measurements: Vec<Measurement>,
}

/// A worker lost under a running deploy, and the recovery that moved the deploy on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InterruptionView {
    /// When the lost worker was last heard from (absent when it never registered, or when
    /// the worker itself resumed after a restart).
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub interrupted_at: Option<String>,
    /// What stopped, in words.
    pub interruption: Option<String>,
    /// When the deploy was recovered (handed back to its queue, or resumed).
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub recovered_at: String,
    /// The recovery's note: who recovered it, from which worker, and why.
    pub recovery: String,
    /// The worker that ran its next step after the recovery, and when it started.
    pub resumed_by: Option<String>,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub resumed_at: Option<String>,
}

string_enum!(
    /// How one measurement of an analysis judged its wave.
    MeasurementOutcome, listed: true,
    "passed (its `success` condition held), failed (it did not) or inconclusive (it could \
     not be taken: no data, an error, a timeout, no baseline)." {
        Passed = "passed",
        Failed = "failed",
        Inconclusive = "inconclusive",
    }
);

/// One measurement of a metric of `rollout.analysis` (docs/analysis.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Measurement {
    /// The wave it judged (1-based).
    pub wave: u32,
    pub metric: String,
    /// The target it was taken on, for a metric measured per target; null otherwise.
    #[serde(default)]
    pub target: Option<String>,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub at: String,
    /// Null when it could not be taken.
    #[serde(default)]
    pub value: Option<f64>,
    /// The same query over the targets not reached yet; null without one.
    #[serde(default)]
    pub baseline: Option<f64>,
    pub outcome: MeasurementOutcome,
    /// Why it is inconclusive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The bound of the metric's `success` condition at this measurement (`result <=
    /// baseline * 1.2` at its baseline); null when the condition is not one comparison of
    /// `result` with an expression, or its bound names a baseline that was not measured.
    #[serde(default)]
    pub threshold: Option<f64>,
}

/// The bake a deploy would run after one wave (docs/analysis.md, "In plans and dry runs").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PlannedBakeView {
    /// The wave baked (1-based), and its name.
    pub after_wave: u32,
    pub wave: String,
    /// The wave's targets (`{targets}`).
    pub targets: Vec<String>,
    /// The targets it is compared with, those of the later waves (`{baseline}`).
    pub baseline: Vec<String>,
    /// `rollout.analysis.bake` and `interval`, as durations (`5m`, `30s`).
    pub bake: String,
    pub interval: String,
    /// How many measurements of each metric a full bake takes.
    pub measurements: u32,
    /// How long it would wait for a decision; null: until someone decides.
    #[serde(default)]
    pub timeout: Option<String>,
    pub metrics: Vec<PlannedMetricView>,
}

/// One metric of a planned bake.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PlannedMetricView {
    pub name: String,
    /// `prometheus`, `http` or `command`.
    pub provider: String,
    /// The `success` condition.
    pub success: String,
    pub failure_limit: u32,
    pub inconclusive_limit: u32,
    /// What each measurement asks: one, or one per target for a per-target metric.
    pub asks: Vec<PlannedQueryView>,
}

/// What one measurement would ask, its placeholders filled in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PlannedQueryView {
    /// The target of a per-target metric; null otherwise.
    #[serde(default)]
    pub target: Option<String>,
    /// Where it is asked: the Prometheus address, the URL, `worker` or `target <name>`.
    pub source: String,
    /// The PromQL query, the JSON pointer of an HTTP answer, or the command.
    pub query: String,
    /// The same over the baseline targets (the query, the URL or the command), for a
    /// metric whose provider names `{targets}`; null otherwise.
    #[serde(default)]
    pub baseline_query: Option<String>,
}

/// One wave of the rollout: its name and its targets, in the order they are deployed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WaveView {
    pub name: String,
    pub targets: Vec<String>,
}

string_enum!(
    /// What a region pass does.
    PassMode, listed: true,
    "deploy (the new version to the region's targets) or rollback (the previous \
     version back on the targets it switched)." {
        Deploy = "deploy",
        Rollback = "rollback",
    }
);

/// One region's pass of a region-routed deploy: a child workflow on `<queue>.<region>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PassView {
    /// The pass's own workflow id (`<deploy id>.<n>`).
    pub id: String,
    pub region: String,
    pub mode: PassMode,
    pub status: WorkflowStatus,
    /// The worker that runs (or ran) it.
    pub executor_id: Option<String>,
    pub targets: Vec<String>,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub started_at: Option<String>,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub finished_at: Option<String>,
}

/// A deploy's log lines, and where its output goes on from (docs/api.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeployLogs {
    pub id: String,
    pub lines: Vec<String>,
    /// The `seq` of the last output line in `lines` (0 if none): follow with
    /// `/output?after=`.
    #[serde(default)]
    pub output_seq: i64,
}

/// One line a deploy's step printed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OutputLine {
    /// Increasing; pass the last one seen as `after` to follow.
    pub seq: i64,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub at: String,
    /// The run of the deploy that printed it (a step run again after a crash prints
    /// again).
    pub attempt: i64,
    /// The step that printed it, e.g. `web-1: command 1`.
    pub source: String,
    pub stream: OutputStream,
    pub line: String,
}

/// A page of a deploy's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeployOutput {
    pub id: String,
    pub lines: Vec<OutputLine>,
}

/// Body of approve and reject (optional): `{"reason": "…"}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// Comment (approve) or reason (reject).
    #[serde(default)]
    pub reason: Option<String>,
}

/// Body of a rollback (optional): `{"to": "1.0"}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RollbackBody {
    /// The version to return to; absent: the version before the live one.
    #[serde(default)]
    pub to: Option<String>,
    /// Reactivate the release in place where it is still on the targets (remote-copy):
    /// every target at once, `max_parallel` at a time, no waves or pauses, checks after.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fast: bool,
    /// Go back past an irreversible deploy anyway (docs/environments.md, "The rollback
    /// guard"): recorded in the audit trail with who forced it. Without it such a
    /// rollback is a 409 naming that deploy and its reason.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
}

/// Body of a redeploy (optional): `{"force": true}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RedeployBody {
    /// Deploy it again even if that goes back past an irreversible deploy, as
    /// `RollbackBody.force` (audited).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
}

/// What a manual recovery of an executor answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Recovered {
    pub executor_id: String,
    /// Ids of the deploys put back on their queues.
    pub recovered: Vec<String>,
}

/// The `status` filter of `GET /api/v1/deploys`: a deploy status, in either case (only
/// its schema: the server reads the query itself).
#[cfg(feature = "openapi")]
pub struct StatusFilter;

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for StatusFilter {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        let upper = WorkflowStatus::KNOWN.iter().map(|s| s.to_string());
        let lower = WorkflowStatus::KNOWN.iter().map(|s| s.to_ascii_lowercase());
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .enum_values(Some(upper.chain(lower)))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for StatusFilter {}
