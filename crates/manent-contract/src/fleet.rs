//! The fleet as operators see it: workers, queues with their limits, tenants, and
//! applications with the version live in each environment.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use manent_enum::string_enum;

string_enum!(
    /// The state a worker last recorded for itself, or `dead`.
    WorkerState, listed: true,
    "running, draining or stopped, as the worker last recorded it; suspect: its lease still \
     looks live but it stopped answering (its liveness lock is free or its pid on this host \
     is gone: killed, most likely); dead: silent for longer than `recovery.stale_after` \
     without a recorded stop (killed, frozen or cut off; its deploys wait for it or for \
     recovery)." {
        Running = "running",
        Draining = "draining",
        Stopped = "stopped",
        Suspect = "suspect",
        Dead = "dead",
    }
);

string_enum!(
    /// What kind of queue a deploy was routed to.
    QueueKind, listed: true,
    "default; tenant (`tenants[].queue`); region (`<queue>.<region>`); plugin \
     (`plugins.<name>.queue`); routed (`queues[]`)." {
        Default = "default",
        Tenant = "tenant",
        Region = "region",
        Plugin = "plugin",
        Routed = "routed",
    }
);

/// One worker (executor), as `manent workers` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkerView {
    pub executor_id: String,
    pub host: String,
    pub region: Option<String>,
    pub state: WorkerState,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub heartbeat_at: String,
    /// Workflows it holds (PENDING under its id).
    pub running: i64,
    pub pid: i64,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub started_at: String,
    /// The queues it dequeues.
    pub queues: Vec<String>,
    /// Seconds since the last heartbeat.
    pub heartbeat_age_secs: i64,
    /// Not stopped, but silent for longer than `recovery.stale_after`: its deploys wait
    /// for it to come back or for recovery.
    pub stale: bool,
    /// The worker's manent version.
    pub version: String,
}

/// One queue, as `manent queues` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueView {
    pub name: String,
    pub kind: QueueKind,
    /// The most deploys of this queue one worker runs at once.
    pub concurrency: u32,
    /// Per `<application>/<environment>`, across workers.
    pub environment_concurrency: u32,
    /// The most deploys of this queue running at once in total; 0 = no limit.
    pub global_concurrency: u32,
    pub enqueued: i64,
    pub running: i64,
    /// Executor ids of the live workers that dequeue it.
    pub workers: Vec<String>,
    /// A routed queue's own `concurrency` (in total and on each worker), on top of the
    /// deploy limits; null for other queues.
    #[serde(default)]
    pub queue_concurrency: Option<u32>,
    /// Every limit a claim from this queue checks, with its current use.
    #[serde(default)]
    pub limits: Vec<LimitUse>,
}

/// One limit and how much of it is used now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LimitUse {
    /// The configuration key that sets it: dbos.concurrency, dbos.environment_concurrency,
    /// dbos.global_concurrency or queues[].concurrency.
    pub key: String,
    /// What it counts, in words.
    pub counts: String,
    /// The limit; null = none.
    pub limit: Option<u32>,
    /// The current count: the busiest worker or environment for limits per worker or per
    /// environment, the total otherwise.
    pub in_use: i64,
    /// Current counts per worker (executor id) or per `<application>/<environment>`; empty
    /// for totals.
    pub by: BTreeMap<String, i64>,
}

/// One tenant, as `manent tenants` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TenantView {
    pub name: String,
    /// Its dedicated queue (`tenants[].queue`), if any.
    pub queue: Option<String>,
    /// Whether `manent.yml` declares it (else it only has environment files).
    pub declared: bool,
    pub applications: Vec<String>,
}

/// One application, as `manent apps` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApplicationView {
    /// `tenant/app`.
    pub application: String,
    pub tenant: String,
    pub environments: Vec<String>,
    /// By environment, the version live there: its last successful deploy that was not a
    /// dry run. Environments without one are absent.
    #[serde(default)]
    pub live: BTreeMap<String, LiveVersion>,
    /// Whether the asking token may deploy this application, and so roll its environments
    /// back (the Platform page's Rollback buttons; the route checks again).
    #[serde(default)]
    pub can_deploy: bool,
    /// By environment, the state its last drift check found (`in_sync`, `drifted`,
    /// `unreachable`, `unknown`; docs/plan-and-drift.md). Environments never checked are
    /// absent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub drift: BTreeMap<String, crate::DriftState>,
    /// By environment, its last drift check: the state, how many targets drifted, when it
    /// was checked (docs/plan-and-drift.md). Environments never checked are absent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub drift_checks: BTreeMap<String, DriftCheckView>,
}

/// An environment's last drift check, in `manent apps`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DriftCheckView {
    pub state: crate::DriftState,
    /// How many targets were found drifted.
    pub drifted_targets: u64,
    /// How many targets were checked.
    pub targets: u64,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub checked_at: String,
    /// The check (`manent status` does not show it: `manent drift --last` does).
    pub check_id: String,
}

/// The version live in one environment: its last successful deploy that was not a dry run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LiveVersion {
    /// The deploy's version (its first artifact's).
    pub version: String,
    /// The successful deploy that put it there.
    pub deploy_id: String,
    /// When that deploy ended.
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub finished_at: Option<String>,
    /// Who submitted it (a token's name); absent from servers before it was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
    /// Under the `container` plugin, the container running it on each target (`{target}`
    /// left in when its name has one); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

/// One variable of one target of an environment, as `manent vars` shows it: its effective
/// value and where it came from; a secret's value is `***`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VariableView {
    /// The target's name.
    pub target: String,
    /// The variable's name, as commands see it.
    pub name: String,
    /// Its effective value for that target; `***` for a secret.
    pub value: String,
    /// Where it came from: `environment`, `label tier=web`, `region eu`, `az eu-1a`,
    /// `target web-2`, or `secret (<provider>)` (`file`, `env`, `command`, `age`).
    pub source: String,
}
