//! Recurring schedules: a schedule as listed, and what deleting one answers.

use serde::{Deserialize, Serialize};

use manent_enum::string_enum;

string_enum!(
    /// What a schedule does with ticks missed while no worker ran.
    MissedPolicy, listed: true,
    "run_once runs the latest missed tick once, skip runs none; empty for a schedule \
     that cannot be read (see `error`)." {
        RunOnce = "run_once",
        Skip = "skip",
        Unreadable = "",
    }
);

/// A schedule, as `manent schedules` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScheduleView {
    pub id: String,
    pub application: String,
    pub environment: String,
    /// The version of the first artifact.
    pub version: String,
    pub cron: String,
    #[cfg_attr(feature = "openapi", schema(examples("UTC")))]
    pub timezone: String,
    pub missed: MissedPolicy,
    pub paused: bool,
    pub queue: String,
    /// RFC 3339; none when paused or when the expression never matches again.
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub next_tick: Option<String>,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub last_tick: Option<String>,
    /// The id of the deploy of the last tick.
    pub last_deploy: Option<String>,
    /// The name of the token that created it.
    pub created_by: String,
    pub created_at: String,
    /// Present only for a stored schedule that cannot be read: why. It does not tick
    /// until fixed; its other fields are empty, and only unscoped tokens see it. An
    /// unscoped admin may delete it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The latest ticks refused when they fell due (at most 20, oldest first): each tick
    /// is authorised again (its token, the environment's policy then), and a refused one
    /// enqueues no deploy. Empty when none was refused.
    #[serde(default)]
    pub refused_ticks: Vec<RefusedTick>,
}

/// A schedule's tick refused when it fell due.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RefusedTick {
    /// The tick, RFC 3339 in the schedule's time zone.
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub tick: String,
    /// Why: the token (revoked, expired, no longer allowed), an artifact source, an
    /// override the environment no longer allows, or the environment gone.
    pub reason: String,
}

/// What deleting a schedule answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScheduleDeleted {
    pub id: String,
    /// True: the schedule is gone.
    pub deleted: bool,
}
