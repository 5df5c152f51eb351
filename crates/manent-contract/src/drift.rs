//! Plans and drift (docs/plan-and-drift.md): what a deploy would change on each target,
//! and each target compared with the release manent recorded there.

use serde::{Deserialize, Serialize};

use manent_enum::string_enum;

string_enum!(
    /// What a planned change is of.
    ChangeKind, listed: true,
    "artifact (sha256 from the live release to this deploy's), file (a file inside a tar or \
     zip artifact that differs from the live release), template (its rendered sha256), variable \
     (its value; a secret as ***), command (what would run: tasks, activate or commands, \
     checks)." {
        Artifact = "artifact",
        File = "file",
        Template = "template",
        Variable = "variable",
        Command = "command",
    }
);

string_enum!(
    /// Where a target stands against its recorded release.
    DriftState, listed: true,
    "in_sync: as recorded; drifted: a file changed, added or removed, a link elsewhere, the \
     live link moved, the release gone; unreachable: the check could not reach it; unknown: \
     no release recorded there yet." {
        InSync = "in_sync",
        Drifted = "drifted",
        Unreachable = "unreachable",
        Unknown = "unknown",
    }
);

/// One change a deploy would make on a target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChangeView {
    pub kind: ChangeKind,
    pub name: String,
    /// What the live release has; null when new.
    pub from: Option<String>,
    /// What this deploy brings; null when it goes (or for a check).
    pub to: Option<String>,
    /// `already there`, `unchanged`, `secret`, when a task would run, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One target's plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TargetPlanView {
    pub name: String,
    /// The version the target's live link points to, read from the target.
    pub live_version: Option<String>,
    pub changes: Vec<ChangeView>,
}

/// A deploy's plan (`manent plan`): its dry run's changes, target by target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PlanView {
    /// The dry run (or deploy) that planned it.
    pub deploy_id: String,
    pub targets: Vec<TargetPlanView>,
    /// The analysis the deploy would run after each wave but the last (docs/analysis.md);
    /// absent without `rollout.analysis`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub analysis: Vec<crate::PlannedBakeView>,
}

/// One difference between a target and its recorded release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DifferenceView {
    /// The file or link (absolute).
    pub path: String,
    /// As recorded (`sha256:…`, `-> target`, `directory`); null for what was added.
    pub expected: Option<String>,
    /// As found; null for what is gone.
    pub found: Option<String>,
}

/// One target's drift.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TargetDriftView {
    pub name: String,
    pub state: DriftState,
    pub differences: Vec<DifferenceView>,
    /// Why unreachable or unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The version its recorded release holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// An environment's drift (`manent drift`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DriftView {
    pub application: String,
    pub environment: String,
    /// in_sync when every target is, else the first of drifted, unreachable, unknown.
    pub state: DriftState,
    /// The check that found it (empty when nothing was deployed yet).
    pub check_id: String,
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub checked_at: String,
    pub targets: Vec<TargetDriftView>,
}

/// One target's part of the plan shown to approvers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApprovalTargetView {
    pub name: String,
    /// The version its live release recorded; null before its first recorded deploy.
    pub from_version: Option<String>,
    pub to_version: String,
    /// Each artifact, from the live release's sha256 to this deploy's.
    pub artifacts: Vec<ChangeView>,
    /// How many files of the archive artifacts differ from the live release's.
    pub files_changed: u64,
    /// The first few of them.
    pub files: Vec<String>,
    /// Each template by its `dest` (rendered only once approved: `from` is the live
    /// release's rendered sha256).
    pub templates: Vec<ChangeView>,
    /// The variables that differ from the live release's; a secret added or removed as
    /// `***`.
    pub variables: Vec<ChangeView>,
}

/// What a deploy waiting for approval would change (docs/plan-and-drift.md), computed once
/// as it started waiting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApprovalPlanView {
    pub targets: Vec<ApprovalTargetView>,
    /// The targets not shown (past the first 100).
    #[serde(default)]
    pub more_targets: u64,
    /// Why part of the plan is missing (an artifact that could not be fetched); absent
    /// when it is whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}
