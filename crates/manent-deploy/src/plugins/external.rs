//! An external plugin (or its stub) in the deploy workflow: one durable step per pass
//! calling the plugin, then the plugin's `check` and manent's own checks per target. The
//! plugin's steps are idempotent, so a pass interrupted by a crash is simply run again.

use std::{path::Path, sync::Arc, time::Duration};

use async_trait::async_trait;
use futures::StreamExt;
use manent_engine::{StepPolicy, WorkflowContext, WorkflowError};
use manent_model::{EffectiveDescriptor, Target};
use manent_plugin::{
    ArtifactRef, Operation, Pass, PassResult, PassScope, PluginHost, Redact, SshRef, TargetRef,
    TargetStatus,
};

use super::{PassContext, Plugin, absolute, builtin::run_checks, ensure_all};
use crate::{
    request::{EventKey, publish},
    run::artifacts::{self, ArtifactError, LocalArtifact},
    run::printed::Progress,
    run::secrets::Secrets,
    run::targets,
    run::targets::{RollbackResult, TargetOutcome, TargetState},
};

/// Attempts of a pass whose plugin error is retryable (a crash, a timeout, a busy host).
const PASS_ATTEMPTS: u32 = 3;
const PASS_BACKOFF: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub struct External {
    host: PluginHost,
}

impl External {
    pub fn new(host: PluginHost) -> Self {
        External { host }
    }

    pub fn host(&self) -> &PluginHost {
        &self.host
    }

    /// One durable step running `operation` on `targets`, tried again (with a fresh plugin
    /// process if it died) only when the error is retryable; any other error fails the step
    /// at once, with its message.
    async fn pass_step(
        &self,
        ctx: &WorkflowContext,
        pass: &PassContext<'_>,
        operation: Operation,
        targets: &[Target],
        previous: Option<&EffectiveDescriptor>,
    ) -> Result<PassResult, WorkflowError> {
        let n = targets.len();
        let name = format!(
            "{}: {operation} {n} target{}",
            self.host.name(),
            if n == 1 { "" } else { "s" }
        );
        let policy = StepPolicy::retry(PASS_ATTEMPTS, PASS_BACKOFF).recording_start();
        ctx.step_retrying_if(&name, policy, PassError::retryable, || async {
            // What the plugin says is masked of the environment's secrets wherever it goes:
            // the deploy's output, the step's error and result, the server's log.
            let secrets = Secrets::read(pass.eff).await.map_err(PassError::Secret)?;
            // After a recovery on another machine the artifacts may be missing here; on a
            // retry they are verified again, whatever the last attempt's process did.
            let kept = match previous {
                Some(_) => artifacts::previous_dir(pass.dir),
                None => artifacts::artifacts_dir(pass.dir),
            };
            let source = previous.unwrap_or(pass.eff);
            let artifacts = ensure_all(source, &kept, pass.sources, pass.http)
                .await
                .map_err(PassError::Artifacts)?;
            let request = build_pass(pass, targets, source, previous, &artifacts);
            let scope = pass_scope(pass, &kept)
                .await
                .map_err(PassError::Artifacts)?;
            // The plugin's progress lines, as they come: `manent logs -f` shows them.
            let output = ctx.output(&name);
            let progress = Progress::new(secrets.masker(), self.host.name(), &output);
            let masker = Arc::new(secrets.masker().clone());
            let redact: Redact = Arc::new(move |text: &str| masker.redact(text));
            let result = self
                .host
                .call_for_pass(
                    operation,
                    &request,
                    Some(&scope),
                    &|target, message| progress.take(target, message),
                    redact,
                )
                .await;
            progress.finish();
            output.finish().await;
            match result {
                Ok(mut result) => {
                    for target in &mut result.targets {
                        target.detail = secrets.redact(&target.detail);
                    }
                    Ok(result)
                }
                Err(e) => Err(PassError::Plugin {
                    message: secrets.redact(&e.to_string()),
                    retryable: e.retryable(),
                }),
            }
        })
        .await
    }
}

/// Why a pass step failed.
#[derive(Debug, thiserror::Error)]
enum PassError {
    #[error(transparent)]
    Artifacts(crate::run::artifacts::ArtifactError),
    #[error(transparent)]
    Secret(crate::run::secrets::SecretError),
    /// The plugin's error (which may quote its stderr), secrets masked.
    #[error("{message}")]
    Plugin { message: String, retryable: bool },
}

impl PassError {
    fn retryable(&self) -> bool {
        match self {
            // A download may pass the next time; a refused source or a wrong sha256 not.
            PassError::Artifacts(e) => e.is_transient(),
            PassError::Secret(_) => false,
            PassError::Plugin { retryable, .. } => *retryable,
        }
    }
}

/// The plugin's working directory in a deploy's directory: the only place a confined plugin
/// writes. The worker makes nothing there but the plugin's `HOME` and `TMPDIR` (without
/// following links) and reads nothing from there.
const WORK_DIR: &str = "work";

/// What a confined plugin's sandbox holds for this pass besides the system: its working
/// directory (read-write: the plugin's scratch files, private `HOME` and `TMPDIR`); read-only,
/// the pass's verified artifacts (`kept`, a directory the plugin cannot write), the
/// environment's SSH key and `known_hosts`, and its secret files (docs/security.md). The
/// working directory is made here without following a link: a deploy begun under an older
/// worker had its plugin write the deploy's whole directory.
async fn pass_scope(pass: &PassContext<'_>, kept: &Path) -> Result<PassScope, ArtifactError> {
    let work = pass.dir.join(WORK_DIR);
    artifacts::private_dir(pass.dir, Path::new(WORK_DIR))
        .await
        .map_err(|error| ArtifactError::WorkDir {
            action: "create",
            path: work.clone(),
            error,
        })?;
    let mut read_only = vec![
        absolute(kept),
        absolute(&pass.auth.key_path),
        absolute(&pass.auth.known_hosts_path),
    ];
    read_only.extend(
        pass.eff
            .secrets
            .values()
            .filter_map(|s| s.file.as_deref())
            .map(absolute),
    );
    Ok(PassScope {
        work_dir: absolute(&work),
        read_only,
    })
}

/// The pass sent to the plugin (absolute paths: a confined plugin runs elsewhere). `source` is the deploy whose artifacts and variables are
/// sent: the current one, or for a rollback the previous one.
fn build_pass(
    pass: &PassContext<'_>,
    targets: &[Target],
    source: &EffectiveDescriptor,
    previous: Option<&EffectiveDescriptor>,
    artifacts: &[LocalArtifact],
) -> Pass {
    let eff = pass.eff;
    Pass {
        deploy_id: pass.deploy_id.to_string(),
        application: eff.application.clone(),
        environment: eff.environment.clone(),
        version: eff.version.clone(),
        previous_version: previous.map(|p| p.version.clone()),
        targets: targets
            .iter()
            .map(|t| TargetRef {
                name: t.name.clone(),
                host: t.host.clone(),
                port: t.port,
                user: targets::address(eff, t).user,
                region: t.region.clone(),
                az: t.az.clone(),
                labels: t.labels.clone(),
            })
            .collect(),
        ssh: SshRef {
            key: absolute(&pass.auth.key_path).display().to_string(),
            known_hosts: absolute(&pass.auth.known_hosts_path).display().to_string(),
            strict_host_key_checking: pass.auth.strict_host_key_checking,
        },
        artifacts: artifacts
            .iter()
            .map(|a| {
                let declared = source.artifacts.iter().find(|d| d.name == a.name);
                ArtifactRef {
                    name: a.name.clone(),
                    kind: declared
                        .map(|d| d.artifact_type.clone())
                        .unwrap_or_default(),
                    version: declared.map(|d| d.version.clone()).unwrap_or_default(),
                    path: absolute(&a.path).display().to_string(),
                    sha256: a.sha256.clone(),
                    size: a.size,
                }
            })
            .collect(),
        vars: vars_of(source),
    }
}

/// `deploy.params` as the pass's variables: a mapping's strings as they are, other values
/// as JSON text.
fn vars_of(eff: &EffectiveDescriptor) -> std::collections::BTreeMap<String, String> {
    let Some(serde_json::Value::Object(map)) = &eff.params else {
        return Default::default();
    };
    map.iter()
        .map(|(k, v)| {
            let value = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), value)
        })
        .collect()
}

/// The plugin's word on `target` in `result`; a target it did not mention failed.
fn reported<'r>(
    result: &'r PassResult,
    target: &str,
) -> Result<&'r manent_plugin::TargetResult, String> {
    match result.targets.iter().find(|r| r.name == target) {
        Some(r) if r.status == TargetStatus::Failed => Err(r.detail.clone()),
        Some(r) => Ok(r),
        None => Err("the plugin reported no result for this target".into()),
    }
}

fn with_detail(status: TargetStatus, detail: &str) -> String {
    let status = match status {
        TargetStatus::Ok => "ok",
        TargetStatus::Changed => "changed",
        TargetStatus::Failed => "failed",
    };
    if detail.is_empty() {
        status.to_string()
    } else {
        format!("{status}: {detail}")
    }
}

#[async_trait]
impl Plugin for External {
    fn unavailable(&self) -> Option<String> {
        self.host.unavailable().map(|e| e.to_string())
    }

    async fn deploy_pass(
        &self,
        ctx: &WorkflowContext,
        pass: &PassContext<'_>,
        targets: &[Target],
    ) -> Result<Vec<TargetOutcome>, WorkflowError> {
        if targets.is_empty() {
            return Ok(Vec::new());
        }
        let eff = pass.eff;
        for t in targets {
            publish(
                ctx,
                &EventKey::target(&t.name),
                &TargetOutcome::new(&t.name, TargetState::Deploying, None),
            )
            .await?;
        }
        let operation = if eff.dry_run {
            Operation::Plan
        } else {
            Operation::Deploy
        };
        let mut outcomes: Vec<TargetOutcome> =
            match self.pass_step(ctx, pass, operation, targets, None).await {
                Ok(result) => targets
                    .iter()
                    .map(|t| match reported(&result, &t.name) {
                        Ok(r) => TargetOutcome {
                            switched: !eff.dry_run,
                            ..TargetOutcome::new(
                                &t.name,
                                if eff.dry_run {
                                    TargetState::Planned
                                } else {
                                    TargetState::Deployed
                                },
                                Some(with_detail(r.status, &r.detail)),
                            )
                        },
                        // A target the plugin failed on may be half-way: it is rolled back.
                        Err(detail) => TargetOutcome {
                            switched: !eff.dry_run,
                            ..TargetOutcome::new(&t.name, TargetState::Failed, Some(detail))
                        },
                    })
                    .collect(),
                Err(WorkflowError::Step { name, message }) => targets
                    .iter()
                    .map(|t| {
                        TargetOutcome::new(
                            &t.name,
                            TargetState::Failed,
                            Some(format!("{name}: {message}")),
                        )
                    })
                    .collect(),
                Err(other) => return Err(other),
            };

        if !eff.dry_run {
            let deployed: Vec<Target> = targets
                .iter()
                .zip(&outcomes)
                .filter(|(_, o)| o.status == TargetState::Deployed)
                .map(|(t, _)| t.clone())
                .collect();
            if !deployed.is_empty() {
                let checked = self
                    .pass_step(ctx, pass, Operation::Check, &deployed, None)
                    .await;
                for o in outcomes
                    .iter_mut()
                    .filter(|o| o.status == TargetState::Deployed)
                {
                    let failure = match &checked {
                        Ok(result) => reported(result, &o.name).err(),
                        Err(WorkflowError::Step { name, message }) => {
                            Some(format!("{name}: {message}"))
                        }
                        Err(_) => None,
                    };
                    if let Some(why) = failure {
                        o.status = TargetState::Failed;
                        o.detail = Some(format!("check: {why}"));
                    }
                }
                if let Err(e) = checked
                    && !matches!(e, WorkflowError::Step { .. })
                {
                    return Err(e);
                }
            }
            // manent's own checks, per target, as for the built-in plugins.
            let still: Vec<(usize, &Target)> = targets
                .iter()
                .enumerate()
                .filter(|(i, _)| outcomes[*i].status == TargetState::Deployed)
                .collect();
            if !eff.checks.is_empty() && !still.is_empty() {
                let branches = ctx.branches(still.len());
                let max_parallel = eff.rollout.max_parallel.max(1) as usize;
                let mut pending = Vec::new();
                for (b, (i, target)) in branches.into_iter().zip(still) {
                    pending.push(async move {
                        let env = targets::command_env(eff, pass.deploy_id, target, pass.local);
                        (
                            i,
                            run_checks(&b, pass.pool, pass.http, eff, target, &env, "").await,
                        )
                    });
                }
                let results: Vec<_> = futures::stream::iter(pending)
                    .buffer_unordered(max_parallel)
                    .collect()
                    .await;
                for (i, result) in results {
                    let o = &mut outcomes[i];
                    match result {
                        Ok(lines) => {
                            let mut detail = o.detail.clone().unwrap_or_default();
                            for line in lines {
                                detail.push_str("; ");
                                detail.push_str(&line);
                            }
                            o.detail = Some(detail);
                        }
                        Err(WorkflowError::Step { name, message }) => {
                            o.status = TargetState::Failed;
                            o.detail = Some(format!("{name}: {message}"));
                        }
                        Err(other) => return Err(other),
                    }
                }
            }
        }
        for o in &outcomes {
            publish(ctx, &EventKey::target(&o.name), o).await?;
        }
        Ok(outcomes)
    }

    async fn rollback_pass(
        &self,
        ctx: &WorkflowContext,
        pass: &PassContext<'_>,
        previous: Option<&EffectiveDescriptor>,
        switched: &[TargetOutcome],
    ) -> Result<Vec<TargetOutcome>, WorkflowError> {
        let targets: Vec<Target> = switched
            .iter()
            .filter_map(|o| pass.eff.targets.iter().find(|t| t.name == o.name))
            .cloned()
            .collect();
        if targets.is_empty() {
            return Ok(Vec::new());
        }
        let result = match previous {
            None => None,
            Some(prev) => Some(
                match self
                    .pass_step(ctx, pass, Operation::Rollback, &targets, Some(prev))
                    .await
                {
                    Ok(result) => Ok(result),
                    Err(WorkflowError::Step { message, .. }) => Err(message),
                    Err(other) => return Err(other),
                },
            ),
        };
        let mut rolled_back = Vec::new();
        for outcome in switched {
            let rollback = match (&result, previous) {
                (Some(Ok(result)), Some(prev)) => match reported(result, &outcome.name) {
                    Ok(_) => RollbackResult::Restored {
                        version: prev.version.clone(),
                    },
                    Err(why) => RollbackResult::Failed(why),
                },
                (Some(Err(message)), _) => RollbackResult::Failed(message.clone()),
                _ => RollbackResult::NothingToRestore(format!(
                    "no earlier successful deploy of {}/{} to return to",
                    pass.eff.application, pass.eff.environment
                )),
            };
            let rolled = outcome.after_rollback(&rollback);
            publish(ctx, &EventKey::target(&outcome.name), &rolled).await?;
            rolled_back.push(rolled);
        }
        Ok(rolled_back)
    }
}
