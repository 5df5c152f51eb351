//! One target's plan: what a deploy would change there, read without changing anything
//! (one listing of the new release directory and the live links, the live release's
//! manifest, the worker's copies of the artifacts, the run's rendered templates).

use std::collections::BTreeMap;

use manent_model::{EffectiveDescriptor, Target, TaskWhen};
use manent_ssh::ConnectionPool;

use super::{Change, ChangeKind, TargetPlan};
use crate::manifests::{self, Manifest};
use crate::run::artifacts::LocalArtifact;
use crate::run::targets::TargetError;

/// How a secret's value is shown in a plan.
pub const MASKED: &str = "***";

/// `target`'s plan for the deploy `eff`, `local` its artifacts on this worker.
pub async fn compute(
    pool: &ConnectionPool,
    records: &manent_engine::Records,
    eff: &EffectiveDescriptor,
    target: &Target,
    local: &[LocalArtifact],
) -> Result<TargetPlan, TargetError> {
    let live = manifests::read(records, &eff.application, &eff.environment, &target.name)
        .await
        .map_err(|e| TargetError::Script(e.to_string()))?;
    let mut links = manifests::live_link_paths(eff, target);
    for path in live.iter().flat_map(|m| m.snapshot.live_links.keys()) {
        if !links.contains(path) {
            links.push(path.clone());
        }
    }
    let now = match eff.dest_for(target) {
        Some(release) => Some(
            manifests::record::snapshot(pool, eff, target, release.trim_end_matches('/'), &links)
                .await?,
        ),
        None => None,
    };
    let live_version = now
        .as_ref()
        .and_then(|now| now.live_links.iter().next())
        .and_then(|(link, to)| version_at(eff, target, link, to, live.as_ref()));
    let mut changes = artifact_changes(eff, live.as_ref(), now.as_ref());
    let paths: Vec<std::path::PathBuf> = local.iter().map(|a| a.path.clone()).collect();
    let archives = tokio::task::spawn_blocking(move || {
        paths
            .iter()
            .filter_map(|p| super::archive::files(p, manifests::MAX_FILES))
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| TargetError::Script(format!("listing the artifacts' files: {e}")))?;
    let live_files = live.as_ref().map(|m| &m.snapshot.files);
    for files in archives {
        for (path, sum) in files {
            let from = live_files.and_then(|f| f.get(&path));
            if from != Some(&sum) {
                changes.push(change(
                    ChangeKind::File,
                    &path,
                    from.cloned(),
                    Some(sum),
                    None,
                ));
            }
        }
    }
    let templates = manifests::record::template_digests(eff, target);
    changes.extend(differing(
        ChangeKind::Template,
        live.as_ref().map(|m| &m.templates),
        &templates,
    ));
    changes.extend(variable_changes(eff, target, live.as_ref()));
    changes.extend(commands(eff, target));
    Ok(TargetPlan {
        name: target.name.clone(),
        live_version,
        changes,
    })
}

fn change(
    kind: ChangeKind,
    name: &str,
    from: Option<String>,
    to: Option<String>,
    note: Option<&str>,
) -> Change {
    Change {
        kind,
        name: name.to_string(),
        from,
        to,
        note: note.map(str::to_string),
    }
}

/// The version the live link `link` (pointing to `to`) names: the component of its target
/// at the place of `{version}` in `deploy.dest`; else the live manifest's version when the
/// link points to its release.
fn version_at(
    eff: &EffectiveDescriptor,
    target: &Target,
    link: &str,
    to: &str,
    live: Option<&Manifest>,
) -> Option<String> {
    let resolved = if to.starts_with('/') {
        to.to_string()
    } else {
        let dir = link.rsplit_once('/').map_or("", |(d, _)| d);
        format!("{dir}/{to}")
    };
    let normal: Vec<&str> = resolved
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if let Some(live) = live
        && live
            .release
            .split('/')
            .filter(|c| !c.is_empty())
            .eq(normal.iter().copied())
    {
        return Some(live.version.clone());
    }
    let dest = eff.dest.as_deref()?;
    let at = dest
        .split('/')
        .filter(|c| !c.is_empty())
        .position(|c| c == "{version}")?;
    let _ = target;
    normal.get(at).map(|v| v.to_string())
}

/// Each artifact: its sha256 in the live release and in this deploy; `already there` when
/// the new release directory holds it with that sha256.
pub(super) fn artifact_changes(
    eff: &EffectiveDescriptor,
    live: Option<&Manifest>,
    now: Option<&manifests::Snapshot>,
) -> Vec<Change> {
    eff.artifacts
        .iter()
        .map(|a| {
            let there = now.and_then(|n| n.files.get(&a.name)) == Some(&a.sha256);
            let from = live.and_then(|m| m.artifacts.get(&a.name)).cloned();
            let note = if there {
                Some("already there")
            } else if from.as_deref() == Some(a.sha256.as_str()) {
                Some("unchanged")
            } else {
                None
            };
            change(
                ChangeKind::Artifact,
                &a.name,
                from,
                Some(a.sha256.clone()),
                note,
            )
        })
        .collect()
}

/// What differs between the live values (none without a live release: all new) and now.
fn differing(
    kind: ChangeKind,
    live: Option<&BTreeMap<String, String>>,
    now: &BTreeMap<String, String>,
) -> Vec<Change> {
    let empty = BTreeMap::new();
    let live = live.unwrap_or(&empty);
    let mut changes = Vec::new();
    for (name, value) in now {
        if live.get(name) != Some(value) {
            changes.push(change(
                kind,
                name,
                live.get(name).cloned(),
                Some(value.clone()),
                None,
            ));
        }
    }
    for (name, value) in live {
        if !now.contains_key(name) {
            changes.push(change(kind, name, Some(value.clone()), None, None));
        }
    }
    changes
}

/// The variables that differ from the live release's, and the secrets added or removed
/// (a secret's value is never shown, nor compared: `***`).
pub(super) fn variable_changes(
    eff: &EffectiveDescriptor,
    target: &Target,
    live: Option<&Manifest>,
) -> Vec<Change> {
    let now: BTreeMap<String, String> = eff
        .variables_for(target)
        .into_iter()
        .map(|v| (v.name, v.value))
        .collect();
    let mut changes = differing(ChangeKind::Variable, live.map(|m| &m.variables), &now);
    let had = |name: &String| live.is_some_and(|m| m.secrets.contains(name));
    for name in eff.secrets.keys().filter(|n| !had(n)) {
        changes.push(change(
            ChangeKind::Variable,
            name,
            None,
            Some(MASKED.into()),
            Some("secret"),
        ));
    }
    for name in live
        .iter()
        .flat_map(|m| m.secrets.iter())
        .filter(|n| !eff.secrets.contains_key(*n))
    {
        changes.push(change(
            ChangeKind::Variable,
            name,
            Some(MASKED.into()),
            None,
            Some("secret"),
        ));
    }
    changes
}

/// The commands that would run on `target`, in order: the tasks before activate, activate
/// (or the `command` plugin's commands), the tasks after, the checks.
fn commands(eff: &EffectiveDescriptor, target: &Target) -> Vec<Change> {
    let run = |c: &str| Some(eff.command_for(c, target, manent_ssh::shell_quote));
    let task = |when: TaskWhen| {
        eff.tasks_on(target, when)
            .into_iter()
            .map(|t| {
                let note = match (when, t.once) {
                    (TaskWhen::BeforeActivate, true) => "once, before any target is switched",
                    (TaskWhen::BeforeActivate, false) => "before activate",
                    (TaskWhen::AfterActivate, true) => "once, after activate",
                    (TaskWhen::AfterActivate, false) => "after activate",
                };
                change(
                    ChangeKind::Command,
                    &format!("task {}", t.name),
                    None,
                    run(&t.run),
                    Some(note),
                )
            })
            .collect::<Vec<_>>()
    };
    let mut changes = task(TaskWhen::BeforeActivate);
    if eff.plugin == manent_model::COMMAND_PLUGIN {
        for (i, c) in eff.commands.iter().enumerate() {
            changes.push(change(
                ChangeKind::Command,
                &format!("command {}", i + 1),
                None,
                run(c),
                None,
            ));
        }
    } else if let Some(activate) = &eff.activate {
        changes.push(change(
            ChangeKind::Command,
            "activate",
            None,
            run(activate),
            None,
        ));
    }
    changes.extend(task(TaskWhen::AfterActivate));
    for check in eff.checks.iter().filter(|c| c.applies_to(target)) {
        changes.push(change(
            ChangeKind::Command,
            &format!("check {}", check.label()),
            None,
            None,
            Some("check"),
        ));
    }
    changes
}
