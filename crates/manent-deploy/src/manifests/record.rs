//! The step `<target>: manifest` (docs/plan-and-drift.md, "What is recorded"): once a
//! target's checks pass, its release listed on the target by one command and recorded as
//! the target's manifest, replacing the one before. A failure to list is shown in the
//! target's detail and fails nothing: the release is live and checked.

use manent_engine::{Records, StepPolicy, WorkflowContext, WorkflowError};
use manent_model::{EffectiveDescriptor, Target};
use manent_ssh::ConnectionPool;
use sha2::{Digest, Sha256};

use super::{MANIFEST_KIND, Manifest, key, live_link_paths, script};
use crate::run::targets::{self, TargetError};

/// Lists `target`'s release now ([`script::listing`]): what a manifest, a drift check and
/// a plan read. `release` is the release directory.
pub async fn snapshot(
    pool: &ConnectionPool,
    eff: &EffectiveDescriptor,
    target: &Target,
    release: &str,
    live_links: &[String],
) -> Result<script::Snapshot, TargetError> {
    let conn = targets::connection(pool, eff, target).await?;
    let listed = conn
        .exec(&script::listing(release, live_links), &[])
        .await
        .map_err(|e| TargetError::Transport(e.to_string()))?;
    if !listed.success() {
        return Err(TargetError::Script(crate::run::release_scripts::failure(
            &listed.stderr,
            listed.status,
        )));
    }
    script::parse(&listed.stdout).map_err(|e| TargetError::Script(e.to_string()))
}

/// The manifest of `target` as this deploy leaves it, from what the target holds now and
/// what the run knows (its artifacts, variables, secrets' names, rendered templates).
async fn build(
    pool: &ConnectionPool,
    eff: &EffectiveDescriptor,
    target: &Target,
    deploy_id: &str,
) -> Result<Option<Manifest>, TargetError> {
    let Some(release) = eff.dest_for(target) else {
        return Ok(None);
    };
    let release = release.trim_end_matches('/').to_string();
    let snapshot = snapshot(pool, eff, target, &release, &live_link_paths(eff, target)).await?;
    Ok(Some(Manifest {
        release,
        snapshot,
        templates: template_digests(eff, target),
        ..of_run(eff, target, deploy_id)
    }))
}

/// What every manifest of `target` holds from the run alone: the deploy, the version, when,
/// each artifact's sha256, the variables that are not secrets and the secrets' names.
pub fn of_run(eff: &EffectiveDescriptor, target: &Target, deploy_id: &str) -> Manifest {
    Manifest {
        deploy_id: deploy_id.to_string(),
        version: eff.version.clone(),
        at_ms: now_ms(),
        artifacts: eff
            .artifacts
            .iter()
            .map(|a| (a.name.clone(), a.sha256.clone()))
            .collect(),
        variables: eff
            .variables_for(target)
            .into_iter()
            .map(|v| (v.name, v.value))
            .collect(),
        secrets: eff.secrets.keys().cloned().collect(),
        ..Manifest::default()
    }
}

/// Each template's rendered sha256 on `target`, by its `dest` as written, from what this
/// run rendered (none when it rendered nothing).
pub fn template_digests(
    eff: &EffectiveDescriptor,
    target: &Target,
) -> std::collections::BTreeMap<String, String> {
    let Some(rendered) =
        crate::vars::run_values::current().and_then(|values| values.rendered(&target.name))
    else {
        return Default::default();
    };
    eff.templates
        .iter()
        .zip(rendered.iter())
        .map(|(template, r)| (template.dest.clone(), hex::encode(Sha256::digest(&r.bytes))))
        .collect()
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The step `<target>: manifest` of a deploy under [`super::MANIFEST_VERSION`] or later,
/// after its checks: the line it adds to the target's detail (`manifest: 12 files, 1 link,
/// live link /srv/web/current`), or why none was recorded. Nothing before that version, and
/// nothing for a target without a release directory (`deploy.dest`).
pub async fn record_step(
    ctx: &WorkflowContext,
    pool: &ConnectionPool,
    records: &Records,
    eff: &EffectiveDescriptor,
    target: &Target,
    deploy_id: &str,
) -> Result<Option<String>, WorkflowError> {
    if ctx.workflow_version() < super::MANIFEST_VERSION || eff.dest_for(target).is_none() {
        return Ok(None);
    }
    let step = format!("{}: manifest", target.name);
    let recorded: Result<String, WorkflowError> = ctx
        .step_with(&step, StepPolicy::default().recording_start(), || async {
            let Some(manifest) = build(pool, eff, target, deploy_id).await? else {
                return Ok::<_, RecordError>("no release directory, no manifest".to_string());
            };
            let text =
                serde_json::to_string(&manifest).map_err(|e| RecordError::Store(e.to_string()))?;
            records
                .put(
                    MANIFEST_KIND,
                    &key(&eff.application, &eff.environment, &target.name),
                    &text,
                    now_ms(),
                )
                .await
                .map_err(|e| RecordError::Store(e.to_string()))?;
            Ok(summary(&manifest))
        })
        .await;
    match recorded {
        Ok(line) => Ok(Some(line)),
        Err(WorkflowError::Step { message, .. }) => {
            Ok(Some(format!("manifest not recorded: {message}")))
        }
        Err(other) => Err(other),
    }
}

/// Why a manifest was not recorded.
#[derive(Debug, thiserror::Error)]
enum RecordError {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("the manifest could not be stored: {0}")]
    Store(String),
}

/// One line saying what a manifest holds.
fn summary(manifest: &Manifest) -> String {
    let s = &manifest.snapshot;
    let files = match s.too_many_files {
        Some(n) => format!("{n} files (more than {}, not hashed)", super::MAX_FILES),
        None => format!("{} file(s)", s.files.len()),
    };
    let live = if s.live_links.is_empty() {
        String::new()
    } else {
        let paths: Vec<&str> = s.live_links.keys().map(String::as_str).collect();
        format!(", live link {}", paths.join(" "))
    };
    format!("manifest: {files}, {} link(s){live}", s.links.len())
}

/// Why a recorded manifest could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading the manifest of {key}: {error}")]
    Store { key: String, error: String },
    #[error("the manifest of {key} cannot be read ({error}); the next deploy records it again")]
    Unreadable { key: String, error: String },
}

/// The manifest recorded for `target` of `application`'s `environment`, if any.
pub async fn read(
    records: &Records,
    application: &str,
    environment: &str,
    target: &str,
) -> Result<Option<Manifest>, ReadError> {
    let key = key(application, environment, target);
    let Some(text) = records
        .get(MANIFEST_KIND, &key)
        .await
        .map_err(|e| ReadError::Store {
            key: key.clone(),
            error: e.to_string(),
        })?
    else {
        return Ok(None);
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| ReadError::Unreadable {
            key,
            error: e.to_string(),
        })
}
