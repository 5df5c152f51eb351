//! The plan shown to approvers (docs/plan-and-drift.md, "The plan shown to approvers"):
//! computed once, in the step [`APPROVAL_PLAN_STEP`] a deploy under workflow version 6 or
//! later runs as it starts waiting for approval, on the gate queue's worker, reaching no
//! target: the live version and what each target's live release recorded (its manifest)
//! against this deploy's artifacts, the files of its archives (downloaded to a temporary
//! directory, listed, removed), its templates and variables (secrets as `***`). Bounded:
//! [`MAX_TARGETS`] targets, the first [`FIRST_FILES`] changed files of each.

use std::collections::BTreeMap;
use std::path::Path;

use manent_engine::StepRecord;
use manent_model::EffectiveDescriptor;
use serde::{Deserialize, Serialize};

use super::changes::{artifact_changes, variable_changes};
use super::{Change, ChangeKind, PlanError};
use crate::manifests::{self, Manifest};

/// The step that records the plan shown to approvers. Stored: never change it.
pub const APPROVAL_PLAN_STEP: &str = "approval plan";
/// The most targets an approval plan shows; it counts the others.
pub const MAX_TARGETS: usize = 100;
/// The changed files an approval plan names per target; it counts the others.
pub const FIRST_FILES: usize = 5;
/// What a template's change says before approval: it is rendered only once approved (its
/// secrets are read by the worker that runs the deploy, never at the gate).
pub const TEMPLATE_NOTE: &str = "rendered once approved";

/// What a deploy waiting for approval would change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalPlan {
    pub targets: Vec<ApprovalTarget>,
    /// The targets past [`MAX_TARGETS`], not shown.
    #[serde(default)]
    pub more_targets: usize,
    /// Why part of the plan is missing (an artifact that could not be fetched: its files
    /// are not listed); none when it is whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One target's part of an [`ApprovalPlan`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalTarget {
    pub name: String,
    /// The version its live release recorded (none before its first recorded deploy).
    pub from_version: Option<String>,
    pub to_version: String,
    /// Each artifact, from its live sha256 to this deploy's.
    pub artifacts: Vec<Change>,
    /// How many files of the archives differ from the live release's.
    pub files_changed: usize,
    /// The first [`FIRST_FILES`] of them, in path order.
    pub files: Vec<String>,
    /// Each template (by `dest`) the live release recorded or this deploy writes.
    pub templates: Vec<Change>,
    /// The variables that differ from the live release's; secrets added or removed as
    /// `***`.
    pub variables: Vec<Change>,
}

/// The approval plan of `eff`: manifests read from `records`, artifacts fetched (from
/// `sources` through `http`) into `scratch`, removed before it returns. Never fails: what
/// cannot be read is said in [`ApprovalPlan::note`].
pub async fn compute(
    records: &manent_engine::Records,
    eff: &EffectiveDescriptor,
    scratch: &Path,
    sources: &manent_config::ArtifactSources,
    http: &dyn crate::http::HttpFetch,
) -> ApprovalPlan {
    let mut notes = Vec::new();
    let files = match archive_files(eff, scratch, sources, http).await {
        Ok(files) => files,
        Err(why) => {
            notes.push(format!("the archives' files are not listed: {why}"));
            BTreeMap::new()
        }
    };
    let mut plan = ApprovalPlan {
        more_targets: eff.targets.len().saturating_sub(MAX_TARGETS),
        ..ApprovalPlan::default()
    };
    for target in eff.targets.iter().take(MAX_TARGETS) {
        let live = match manifests::read(records, &eff.application, &eff.environment, &target.name)
            .await
        {
            Ok(live) => live,
            Err(e) => {
                notes.push(format!("{}: its manifest cannot be read: {e}", target.name));
                None
            }
        };
        plan.targets
            .push(target_plan(eff, target, live.as_ref(), &files));
    }
    plan.note = (!notes.is_empty()).then(|| notes.join("; "));
    plan
}

fn target_plan(
    eff: &EffectiveDescriptor,
    target: &manent_model::Target,
    live: Option<&Manifest>,
    files: &BTreeMap<String, String>,
) -> ApprovalTarget {
    let live_files = live.map(|m| &m.snapshot.files);
    let changed: Vec<&String> = files
        .iter()
        .filter(|(path, sum)| live_files.and_then(|f| f.get(*path)) != Some(*sum))
        .map(|(path, _)| path)
        .collect();
    let mut templates: Vec<Change> = eff
        .templates
        .iter()
        .map(|t| Change {
            kind: ChangeKind::Template,
            name: t.dest.clone(),
            from: live.and_then(|m| m.templates.get(&t.dest)).cloned(),
            to: None,
            note: Some(TEMPLATE_NOTE.into()),
        })
        .collect();
    for (dest, sum) in live.iter().flat_map(|m| &m.templates) {
        if !eff.templates.iter().any(|t| &t.dest == dest) {
            templates.push(Change {
                kind: ChangeKind::Template,
                name: dest.clone(),
                from: Some(sum.clone()),
                to: None,
                note: Some("no longer written".into()),
            });
        }
    }
    ApprovalTarget {
        name: target.name.clone(),
        from_version: live.map(|m| m.version.clone()),
        to_version: eff.version.clone(),
        artifacts: artifact_changes(eff, live, None),
        files_changed: changed.len(),
        files: changed.into_iter().take(FIRST_FILES).cloned().collect(),
        templates,
        variables: variable_changes(eff, target, live),
    }
}

/// Every regular file of `eff`'s archive artifacts with its sha256, fetched (and verified)
/// into `scratch` (a directory of this plan's own), removed when done.
async fn archive_files(
    eff: &EffectiveDescriptor,
    scratch: &Path,
    sources: &manent_config::ArtifactSources,
    http: &dyn crate::http::HttpFetch,
) -> Result<BTreeMap<String, String>, String> {
    if eff.artifacts.is_empty() {
        return Ok(BTreeMap::new());
    }
    let listed = fetch_and_list(eff, scratch, sources, http).await;
    crate::run::artifacts::forget_dir(scratch);
    match tokio::fs::remove_dir_all(scratch).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(dir = %scratch.display(), error = %e, "cannot remove the approval plan's directory")
        }
    }
    listed
}

async fn fetch_and_list(
    eff: &EffectiveDescriptor,
    scratch: &Path,
    sources: &manent_config::ArtifactSources,
    http: &dyn crate::http::HttpFetch,
) -> Result<BTreeMap<String, String>, String> {
    if let Some(workdir) = scratch.parent() {
        tokio::fs::create_dir_all(workdir)
            .await
            .map_err(|e| format!("creating {}: {e}", workdir.display()))?;
    }
    let mut paths = Vec::new();
    for artifact in &eff.artifacts {
        let local =
            crate::run::artifacts::ensure_local(artifact, &eff.application, scratch, sources, http)
                .await
                .map_err(|e| e.to_string())?;
        paths.push(local.path);
    }
    tokio::task::spawn_blocking(move || {
        let mut all = BTreeMap::new();
        for path in &paths {
            all.extend(super::archive::files(path, manifests::MAX_FILES).unwrap_or_default());
        }
        all
    })
    .await
    .map_err(|e| format!("listing the artifacts' files: {e}"))
}

/// The approval plan recorded among `steps` (a deploy's), if any.
pub fn from_steps(
    deploy_id: &str,
    steps: &[StepRecord],
) -> Result<Option<ApprovalPlan>, PlanError> {
    let Some(step) = steps
        .iter()
        .find(|s| s.name == APPROVAL_PLAN_STEP && s.status == manent_engine::StepStatus::Success)
    else {
        return Ok(None);
    };
    serde_json::from_str(step.output.as_deref().unwrap_or("null")).map_err(|e| {
        PlanError::Unreadable {
            deploy_id: deploy_id.to_string(),
            target: "every target (the approval plan)".into(),
            error: e.to_string(),
        }
    })
}

/// The step [`APPROVAL_PLAN_STEP`] of a deploy that starts waiting for approval, under
/// workflow version [`crate::request::MANIFEST_VERSION`] or later (nothing before).
/// `workdir` is the worker's work directory; `http` fetches the artifacts.
pub async fn record_step(
    ctx: &manent_engine::WorkflowContext,
    config: &manent_config::Config,
    http: &dyn crate::http::HttpFetch,
    records: &manent_engine::Records,
    eff: &EffectiveDescriptor,
    workdir: &Path,
) -> Result<(), manent_engine::WorkflowError> {
    if ctx.workflow_version() < crate::request::MANIFEST_VERSION {
        return Ok(());
    }
    let sources = config.artifact_sources();
    let scratch = workdir.join(format!(
        "approval-plan-{}",
        ctx.workflow_id().replace(['/', '\\'], "_")
    ));
    ctx.step(APPROVAL_PLAN_STEP, || async {
        Ok::<_, String>(compute(records, eff, &scratch, &sources, http).await)
    })
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests;
