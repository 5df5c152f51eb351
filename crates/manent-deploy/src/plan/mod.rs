//! Plans (docs/plan-and-drift.md, "Plans"): what a deploy would change on each target,
//! computed by its dry run under workflow version 6 or later in one step per target,
//! `<target>: changes`, which only reads: the live version from the target's live link,
//! each artifact's sha256 from the live release to the new one (or already there), the
//! files of a tar or zip archive that differ from the live release's manifest, the variables and
//! rendered templates that differ from what the live release recorded (secrets as `***`,
//! templates by their sha256), and the commands, tasks and checks that would run.
//!
//! - `changes`: computing one target's plan.
//! - `approval`: the plan shown to approvers, recorded as a deploy starts waiting for
//!   approval (reaching no target).
//! - `archive`: the regular files of a tar (or gzip-compressed tar) artifact, hashed;
//!   `zip` those of a zip artifact.
//!
//! It depends on `manifests` (the live release), `run` (reaching a target), `vars` (the
//! run's rendered templates) and `tasks` (which tasks run where); `plugins` runs it in a
//! dry run, the API reads a dry run's plan back ([`of_deploy`]).

pub mod approval;
pub mod archive;
pub mod changes;
pub mod zip;

use manent_engine::{Client, EngineError, StepStatus};
use serde::{Deserialize, Serialize};

pub use changes::compute;

/// The suffix of the step that records a target's plan (`<target>: changes`). Stored:
/// never change it.
pub const CHANGES_STEP: &str = ": changes";

/// What a change is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Artifact,
    File,
    Template,
    Variable,
    Command,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Artifact => "artifact",
            ChangeKind::File => "file",
            ChangeKind::Template => "template",
            ChangeKind::Variable => "variable",
            ChangeKind::Command => "command",
        }
    }
}

/// One change a deploy would make on a target: `from` what the live release has (none when
/// new), `to` what the deploy brings (none when it goes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub kind: ChangeKind,
    pub name: String,
    pub from: Option<String>,
    pub to: Option<String>,
    /// `already there` (an artifact the target holds), `would run before activate`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One target's plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetPlan {
    pub name: String,
    /// The version the target's live link points to, read from the target (none without
    /// a live link).
    pub live_version: Option<String>,
    pub changes: Vec<Change>,
}

impl TargetPlan {
    /// One line for the target's detail: how many changes of each kind.
    pub fn summary(&self) -> String {
        let count = |kind| self.changes.iter().filter(|c| c.kind == kind).count();
        format!(
            "plan: live {}; {} artifact(s), {} file(s), {} template(s), {} variable(s) \
             would change; {} command(s) would run",
            self.live_version.as_deref().unwrap_or("none"),
            count(ChangeKind::Artifact),
            count(ChangeKind::File),
            count(ChangeKind::Template),
            count(ChangeKind::Variable),
            count(ChangeKind::Command),
        )
    }
}

/// Why a deploy's plan could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("the plan of {target} in deploy {deploy_id} cannot be read: {error}")]
    Unreadable {
        deploy_id: String,
        target: String,
        error: String,
    },
}

/// The plan a dry run recorded, target by target in the order they were planned; empty
/// before version 6 or before any target was planned.
pub async fn of_deploy(client: &Client, deploy_id: &str) -> Result<Vec<TargetPlan>, PlanError> {
    let mut plans = Vec::new();
    for step in client.steps(deploy_id).await? {
        let Some(target) = step.name.strip_suffix(CHANGES_STEP) else {
            continue;
        };
        if step.status != StepStatus::Success {
            continue;
        }
        let plan: TargetPlan = serde_json::from_str(step.output.as_deref().unwrap_or("null"))
            .map_err(|e| PlanError::Unreadable {
                deploy_id: deploy_id.to_string(),
                target: target.to_string(),
                error: e.to_string(),
            })?;
        plans.push(plan);
    }
    Ok(plans)
}
