//! The built-in plugins, `remote-copy` and `command`: each target a branch of the workflow
//! (`max_parallel` at a time) with one durable step per upload, command and check, so a
//! deploy resumes at the exact step where it stopped.

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use manent_engine::{StepPolicy, WorkflowContext, WorkflowError};
use manent_model::{EffectiveDescriptor, Target, TaskWhen};
use manent_ssh::ConnectionPool;

use super::{PassContext, Plugin};
use crate::{
    http::HttpFetch,
    manifests,
    request::{EventKey, publish},
    run::artifacts::{self, ArtifactError, LocalArtifact},
    run::release_scripts,
    run::targets::{self, RollbackResult, TargetError, TargetOutcome, TargetState},
    tasks,
};

/// `remote-copy` and `command`.
#[derive(Debug, Default)]
pub struct BuiltIn;

#[async_trait]
impl Plugin for BuiltIn {
    async fn deploy_pass(
        &self,
        ctx: &WorkflowContext,
        pass: &PassContext<'_>,
        targets: &[Target],
    ) -> Result<Vec<TargetOutcome>, WorkflowError> {
        run_targets(ctx, pass, targets).await
    }

    async fn rollback_pass(
        &self,
        ctx: &WorkflowContext,
        pass: &PassContext<'_>,
        previous: Option<&EffectiveDescriptor>,
        switched: &[TargetOutcome],
    ) -> Result<Vec<TargetOutcome>, WorkflowError> {
        roll_back(
            ctx,
            pass.eff,
            previous,
            pass.pool,
            pass.http,
            pass.deploy_id,
            switched,
        )
        .await
    }
}

/// Deploys `targets`, `max_parallel` at a time, each in a branch of its own.
async fn run_targets(
    ctx: &WorkflowContext,
    pass: &PassContext<'_>,
    targets: &[Target],
) -> Result<Vec<TargetOutcome>, WorkflowError> {
    let eff = pass.eff;
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    let branches = ctx.branches(targets.len());
    let max_parallel = eff.rollout.max_parallel.max(1) as usize;
    // Futures built in a plain loop (not a closure) keep the workflow future Send.
    let mut pending = Vec::new();
    for (b, target) in branches.into_iter().zip(targets) {
        pending.push(async move { deploy_target(&b, pass, target).await });
    }
    let results: Vec<Result<TargetOutcome, WorkflowError>> = futures::stream::iter(pending)
        .buffer_unordered(max_parallel)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Deploys one target in its own branch of the workflow and publishes its
/// outcome. A failed step is the target's failure; fencing, cancellation and
/// database errors stop the whole workflow.
async fn deploy_target(
    ctx: &WorkflowContext,
    pass: &PassContext<'_>,
    target: &Target,
) -> Result<TargetOutcome, WorkflowError> {
    let PassContext {
        eff,
        pool,
        dir,
        sources,
        http,
        ..
    } = *pass;
    // The deploy's verified copies, where no plugin writes.
    let dir = &artifacts::artifacts_dir(dir);
    let key = EventKey::target(&target.name);
    let name = &target.name;
    publish(
        ctx,
        &key,
        &TargetOutcome::new(name, TargetState::Deploying, None),
    )
    .await?;
    let env = command_env_here(pass, target);
    let uses_local_copies = eff.plugin != manent_model::DEFAULT_PLUGIN && !eff.artifacts.is_empty();
    // Set once the new version is in place: a later failure (a check) leaves
    // the target switched, for the rollback.
    let mut switched = false;
    // The `once` tasks that succeeded here after activate (an irreversible deploy's).
    let mut once_tasks = Vec::new();
    let result: Result<Vec<String>, WorkflowError> = async {
        if eff.dry_run {
            let lines: Vec<String> = ctx
                .step_with(&format!("{name}: plan"), shown_running(), || async {
                    let present = ensure_all(eff, dir, sources, http).await?;
                    targets::plan(pool, eff, target, &present).await
                })
                .await?;
            // Issue 39: the tasks this target would run (docs/environments.md).
            let mut lines = [lines, tasks::plan::lines(eff, target)].concat();
            if ctx.workflow_version() >= manifests::MANIFEST_VERSION {
                // Issue 41: what would change, against the live release (read only).
                let step = format!("{name}{}", crate::plan::CHANGES_STEP);
                let plan: crate::plan::TargetPlan = ctx
                    .step_with(&step, shown_running(), || async {
                        let present = ensure_all(eff, dir, sources, http).await?;
                        crate::plan::compute(pool, pass.records, eff, target, &present).await
                    })
                    .await?;
                lines.push(plan.summary());
            }
            return Ok(lines);
        }
        let on = OnTarget {
            ctx,
            pass,
            target,
            env: &env,
            dir,
        };
        let mut lines = if eff.plugin == manent_model::COMMAND_PLUGIN {
            on.run_commands(uses_local_copies, &mut switched).await?
        } else {
            on.copy_and_activate(&mut switched).await?
        };
        // Issue 39: the tasks after activate, before the checks (docs/environments.md).
        let after = tasks::run_on(ctx, pool, eff, target, &env, TaskWhen::AfterActivate).await?;
        lines.extend(after.lines);
        once_tasks = after.once;
        // No intermediate "checking" event: the target stays "deploying" until its outcome
        // (one checkpoint less per target); a failed check's outcome says it was switched.
        lines.extend(run_checks(ctx, pool, http, eff, target, &env, "").await?);
        // A reconcile: what the drift check found added goes (docs/plan-and-drift.md).
        let removed = crate::manifests::added::remove_added(ctx, pool, eff, target).await?;
        let all_removed = removed.as_ref().is_none_or(|(_, all)| *all);
        lines.extend(removed.map(|(line, _)| line));
        // Issue 41: what the release holds, once live and checked (docs/plan-and-drift.md);
        // kept as it was when a reconcile left added files, which the next check shows.
        if all_removed {
            let recorded =
                manifests::record_step(ctx, pool, pass.records, eff, target, pass.deploy_id);
            lines.extend(recorded.await?);
        }
        // Once the new release is live and checked: the older ones past keep_releases go
        // (after the checks, so that a failed check still finds the previous release).
        if let Some(releases) = eff.releases_for(target) {
            lines.push(prune_releases(ctx, pool, eff, target, &releases).await?);
        }
        Ok(lines)
    }
    .await;
    let outcome = match result {
        Ok(lines) => TargetOutcome {
            switched,
            once_tasks,
            ..TargetOutcome::new(
                name,
                if eff.dry_run {
                    TargetState::Planned
                } else {
                    TargetState::Deployed
                },
                Some(lines.join("; ")),
            )
        },
        Err(WorkflowError::Step {
            name: step,
            message,
        }) => TargetOutcome {
            switched,
            once_tasks,
            ..TargetOutcome::new(
                name,
                TargetState::Failed,
                Some(format!("{step}: {message}")),
            )
        },
        Err(other) => return Err(other),
    };
    publish(ctx, &key, &outcome).await?;
    Ok(outcome)
}

/// The variables every command on `target` gets, the artifacts' paths resolved against this
/// machine's work directory: after a recovery on another machine the recorded paths name
/// the old machine's copies.
fn command_env_here(pass: &PassContext<'_>, target: &Target) -> Vec<(String, String)> {
    let dir = artifacts::artifacts_dir(pass.dir);
    let here: Vec<LocalArtifact> = pass
        .local
        .iter()
        .map(|a| LocalArtifact {
            path: dir.join(&a.name),
            ..a.clone()
        })
        .collect();
    targets::command_env(pass.eff, pass.deploy_id, target, &here)
}

/// One target's work in a deploy: what the `command` and `remote-copy` plugins run there.
struct OnTarget<'a> {
    ctx: &'a WorkflowContext,
    pass: &'a PassContext<'a>,
    target: &'a Target,
    env: &'a [(String, String)],
    /// The deploy's verified copies, where no plugin writes.
    dir: &'a std::path::Path,
}

impl OnTarget<'_> {
    /// `command`: each of `deploy.commands` a step of its own. `switched` is set once one
    /// has started.
    async fn run_commands(
        &self,
        uses_local_copies: bool,
        switched: &mut bool,
    ) -> Result<Vec<String>, WorkflowError> {
        let OnTarget {
            ctx,
            target,
            env,
            dir,
            ..
        } = *self;
        let PassContext {
            eff,
            pool,
            sources,
            http,
            ..
        } = *self.pass;
        let name = &target.name;
        // Templates first, then the tasks before activate, before the commands
        // (docs/environments.md, "Templates", "Tasks and roles").
        let mut lines = super::templates::write_templates(ctx, self.pass, target).await?;
        let before = tasks::run_on(ctx, pool, eff, target, env, TaskWhen::BeforeActivate);
        lines.extend(before.await?.lines);
        // The commands are the deploy: once one has started, the target may run the
        // new version in part, and a rollback must include it.
        *switched = !eff.commands.is_empty();
        for (i, command) in eff.commands.iter().enumerate() {
            let step = format!("{name}: command {}", i + 1);
            let out: String = ctx
                .step_with(&step, shown_running(), || async {
                    if uses_local_copies {
                        // A missing copy (a replaced machine) is fetched and verified again.
                        ensure_all(eff, dir, sources, http).await?;
                    }
                    run_printing(ctx, &step, pool, eff, target, command, env).await
                })
                .await?;
            lines.push(format!(
                "command {}: ok{}",
                i + 1,
                if out.is_empty() {
                    String::new()
                } else {
                    format!(" ({out})")
                }
            ));
        }
        Ok(lines)
    }

    /// `remote-copy`: the release put in place ([`OnTarget::release_files`]; before any
    /// target was switched when a `once` task runs here), the tasks before activate, then
    /// `activate`. `switched` is set before `activate`.
    async fn copy_and_activate(&self, switched: &mut bool) -> Result<Vec<String>, WorkflowError> {
        let OnTarget {
            ctx, target, env, ..
        } = *self;
        let PassContext { eff, pool, .. } = *self.pass;
        let name = &target.name;
        let mut lines = if tasks::once::placed_before_any_switch(eff, target) {
            Vec::new()
        } else {
            self.release_files().await?
        };
        // Issue 39: the tasks before activate (docs/environments.md).
        let before = tasks::run_on(ctx, pool, eff, target, env, TaskWhen::BeforeActivate);
        lines.extend(before.await?.lines);
        // From here the target may run the new version, even if `activate` then
        // fails half-way: a rollback must include it.
        *switched = true;
        if let Some(activate) = &eff.activate {
            let step = format!("{name}: activate");
            ctx.step_with(&step, shown_running(), || async {
                run_printing(ctx, &step, pool, eff, target, activate, env).await
            })
            .await?;
            lines.push("activated".into());
        }
        Ok(lines)
    }

    /// `remote-copy`'s release put in place, nothing switched: the artifacts uploaded (or,
    /// in a fast rollback, the release found in place) and the shared paths linked.
    async fn release_files(&self) -> Result<Vec<String>, WorkflowError> {
        let OnTarget {
            ctx,
            target,
            env,
            dir,
            ..
        } = *self;
        let PassContext {
            eff,
            pool,
            sources,
            http,
            local,
            ..
        } = *self.pass;
        let name = &target.name;
        let mut lines = Vec::new();
        // A fast rollback: a target that still holds the release needs no upload.
        let in_place = eff.reuse_releases
            && ctx
                .step_with(
                    &format!("{name}: find release {}", eff.version),
                    shown_running(),
                    || async { targets::release_in_place(pool, eff, target).await },
                )
                .await?;
        if in_place {
            lines.push(format!("release {} in place", eff.version));
        }
        for a in local.iter().filter(|_| !in_place) {
            let remote: String = ctx
                .step_retrying_if(
                    &format!("{name}: upload {}", a.name),
                    StepPolicy::retry(3, Duration::from_secs(1)).recording_start(),
                    TargetError::is_transient,
                    || async {
                        // After a recovery on another machine the artifact may be missing here.
                        let present = ensure_all(eff, dir, sources, http).await?;
                        let artifact = present
                            .iter()
                            .find(|p| p.name == a.name)
                            .ok_or_else(|| TargetError::ArtifactMissing(a.name.clone()))?;
                        targets::upload(pool, eff, target, artifact).await
                    },
                )
                .await?;
            lines.push(format!("uploaded {remote}"));
        }
        lines.extend(super::templates::write_templates(ctx, self.pass, target).await?);
        if let Some((shared, paths)) = eff.shared_for(target) {
            let step = format!("{name}: link shared");
            // Never an empty release: the script works under it (`rm -rf -- "$release"/…`).
            let release = eff
                .dest_for(target)
                .filter(|dest| !dest.trim().is_empty())
                .ok_or_else(|| {
                    WorkflowError::failed(format!(
                        "target {name}: deploy.shared needs deploy.dest, the release directory \
                         its paths are linked from; set deploy.dest in the environment file"
                    ))
                })?;
            let directories = release_scripts::release_directories(eff, target);
            let script = release_scripts::link_shared(&directories, &release, &shared, &paths);
            let linked: String = ctx
                .step_with(&step, shown_running(), || async {
                    run_script(ctx, &step, pool, eff, target, &script, env)
                        .await
                        .map_err(TargetError::of_own_script)
                })
                .await?;
            lines.push(linked);
        }
        Ok(lines)
    }
}

/// What the `once` tasks need of the built-in plugins (`tasks::Release`): a target's release
/// put in place before any target is switched, as its wave would (`remote-copy`; nothing
/// under `command`, whose commands are the deploy).
pub struct BuiltInRelease<'a> {
    pub pass: &'a PassContext<'a>,
}

#[async_trait]
impl tasks::Release for BuiltInRelease<'_> {
    fn eff(&self) -> &EffectiveDescriptor {
        self.pass.eff
    }

    fn pool(&self) -> &ConnectionPool {
        self.pass.pool
    }

    fn env(&self, target: &Target) -> Vec<(String, String)> {
        command_env_here(self.pass, target)
    }

    async fn put_in_place(
        &self,
        ctx: &WorkflowContext,
        target: &Target,
    ) -> Result<Vec<String>, WorkflowError> {
        if self.pass.eff.plugin == manent_model::COMMAND_PLUGIN {
            return Ok(Vec::new());
        }
        let env = command_env_here(self.pass, target);
        let on = OnTarget {
            ctx,
            pass: self.pass,
            target,
            env: &env,
            dir: &artifacts::artifacts_dir(self.pass.dir),
        };
        on.release_files().await
    }
}

/// The policy of a step that works on a target (a command, `activate`, a plan): run once,
/// its start recorded so that status, the Platform page and `logs` show it while it runs
/// (docs/api.md). One write more per step, small beside a command over SSH.
fn shown_running() -> StepPolicy {
    StepPolicy::default().recording_start()
}

/// Removes `target`'s release directories past `deploy.keep_releases`, in a step of its
/// own. A failure is shown (the step fails, the target's detail says so) but fails
/// nothing: the new release is live and checked.
async fn prune_releases(
    ctx: &WorkflowContext,
    pool: &ConnectionPool,
    eff: &EffectiveDescriptor,
    target: &Target,
    releases: &manent_model::Releases,
) -> Result<String, WorkflowError> {
    let step = format!("{}: prune releases", target.name);
    let script = release_scripts::prune_releases(releases);
    let pruned: Result<String, WorkflowError> = ctx
        .step_with(&step, shown_running(), || async {
            run_script(ctx, &step, pool, eff, target, &script, &[])
                .await
                .map_err(TargetError::of_own_script)
        })
        .await;
    match pruned {
        // `2 releases kept, removed: 1.1 1.2`: what is there, counted on the target. A step
        // recorded by an earlier build said only `removed: …`, shown as it is.
        Ok(removed) => Ok(removed),
        Err(WorkflowError::Step { message, .. }) => {
            Ok(format!("old releases not removed: {message}"))
        }
        Err(other) => Err(other),
    }
}

/// Runs `command` on `target`, its output kept line by line under the step's name.
async fn run_printing(
    ctx: &WorkflowContext,
    step: &str,
    pool: &ConnectionPool,
    eff: &EffectiveDescriptor,
    target: &Target,
    command: &str,
    env: &[(String, String)],
) -> Result<String, TargetError> {
    let command = eff.command_for(command, target, manent_ssh::shell_quote);
    run_script(ctx, step, pool, eff, target, &command, env).await
}

/// Runs `script` on `target` as written (manent's own, placeholders already in place), its
/// output kept line by line under the step's name.
async fn run_script(
    ctx: &WorkflowContext,
    step: &str,
    pool: &ConnectionPool,
    eff: &EffectiveDescriptor,
    target: &Target,
    script: &str,
    env: &[(String, String)],
) -> Result<String, TargetError> {
    let output = ctx.output(step);
    let result = targets::run(pool, eff, target, script, env, &output).await;
    output.finish().await;
    result
}

pub(crate) async fn ensure_all(
    eff: &EffectiveDescriptor,
    dir: &std::path::Path,
    sources: &manent_config::ArtifactSources,
    http: &dyn HttpFetch,
) -> Result<Vec<LocalArtifact>, ArtifactError> {
    let mut out = Vec::new();
    for a in &eff.artifacts {
        out.push(artifacts::ensure_local(a, &eff.application, dir, sources, http).await?);
    }
    Ok(out)
}

/// Re-activates the previous version on the targets this deploy switched: from version 4
/// (request.rs) `max_parallel` at a time, each in a branch with the previous version's
/// checks after its reactivation; before, one after the other without checks, as those
/// deploys recorded it.
async fn roll_back(
    ctx: &WorkflowContext,
    eff: &EffectiveDescriptor,
    previous: Option<&EffectiveDescriptor>,
    pool: &ConnectionPool,
    http: &dyn HttpFetch,
    deploy_id: &str,
    switched: &[TargetOutcome],
) -> Result<Vec<TargetOutcome>, WorkflowError> {
    let switched: Vec<(&TargetOutcome, &Target)> = switched
        .iter()
        .filter_map(|o| {
            eff.targets
                .iter()
                .find(|t| t.name == o.name)
                .map(|t| (o, t))
        })
        .collect();
    if ctx.workflow_version() < crate::request::FAST_ROLLBACK_VERSION {
        let mut rolled_back = Vec::new();
        for (outcome, target) in switched {
            rolled_back.push(
                roll_back_target(
                    ctx, eff, previous, pool, http, deploy_id, outcome, target, false,
                )
                .await?,
            );
        }
        return Ok(rolled_back);
    }
    if switched.is_empty() {
        return Ok(Vec::new());
    }
    let branches = ctx.branches(switched.len());
    let max_parallel = eff.rollout.max_parallel.max(1) as usize;
    let mut pending = Vec::new();
    for (b, (outcome, target)) in branches.into_iter().zip(switched) {
        pending.push(async move {
            roll_back_target(
                &b, eff, previous, pool, http, deploy_id, outcome, target, true,
            )
            .await
        });
    }
    let results: Vec<Result<TargetOutcome, WorkflowError>> = futures::stream::iter(pending)
        .buffered(max_parallel)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Re-activates the previous version on one target, then (`checked`) runs its checks, and
/// publishes the target's outcome.
#[allow(clippy::too_many_arguments)]
async fn roll_back_target(
    ctx: &WorkflowContext,
    eff: &EffectiveDescriptor,
    previous: Option<&EffectiveDescriptor>,
    pool: &ConnectionPool,
    http: &dyn HttpFetch,
    deploy_id: &str,
    outcome: &TargetOutcome,
    target: &Target,
    checked: bool,
) -> Result<TargetOutcome, WorkflowError> {
    let result = match previous {
        None => RollbackResult::NothingToRestore(format!(
            "no earlier successful deploy of {}/{} to return to",
            eff.application, eff.environment
        )),
        Some(prev) => match &prev.activate {
            None => RollbackResult::NothingToRestore(format!(
                "version {} has no `activate` command to run again",
                prev.version
            )),
            Some(activate) => {
                let env = targets::command_env(prev, deploy_id, target, &[]);
                let name = format!("{}: reactivate {}", target.name, prev.version);
                let step = ctx
                    .step_with(&name, shown_running(), || async {
                        run_printing(ctx, &name, pool, prev, target, activate, &env).await
                    })
                    .await;
                let after = format!(" after reactivating {}", prev.version);
                let checks = match step {
                    Ok(_) if checked => run_checks(ctx, pool, http, prev, target, &env, &after)
                        .await
                        .map(|_| ()),
                    Ok(_) => Ok(()),
                    Err(WorkflowError::Step { message, .. }) => {
                        return finish_rollback(ctx, outcome, RollbackResult::Failed(message))
                            .await;
                    }
                    Err(other) => return Err(other),
                };
                match checks {
                    Ok(()) => RollbackResult::Restored {
                        version: prev.version.clone(),
                    },
                    Err(WorkflowError::Step { name, message }) => {
                        RollbackResult::Failed(format!("{name}: {message}"))
                    }
                    Err(other) => return Err(other),
                }
            }
        },
    };
    finish_rollback(ctx, outcome, result).await
}

/// Publishes and returns a target's outcome after its rollback.
async fn finish_rollback(
    ctx: &WorkflowContext,
    outcome: &TargetOutcome,
    result: RollbackResult,
) -> Result<TargetOutcome, WorkflowError> {
    let rolled = outcome.after_rollback(&result);
    publish(ctx, &EventKey::target(&outcome.name), &rolled).await?;
    Ok(rolled)
}

/// manent's checks (`checks:`) on one deployed target, one durable step each with the
/// check's retries, named `<target>: check <label><suffix>`.
pub(crate) async fn run_checks(
    ctx: &WorkflowContext,
    pool: &ConnectionPool,
    http: &dyn HttpFetch,
    eff: &EffectiveDescriptor,
    target: &Target,
    env: &[(String, String)],
    suffix: &str,
) -> Result<Vec<String>, WorkflowError> {
    let mut lines = Vec::new();
    // `checks[].roles`: a check runs on the targets having one of its roles.
    for check in eff.checks.iter().filter(|c| c.applies_to(target)) {
        let kind = check.kind_for(target);
        let policy = StepPolicy {
            backoff_factor: 1.0,
            ..StepPolicy::retry(check.retries + 1, check.interval)
        }
        .recording_start();
        let out: String = ctx
            .step_with(
                &format!("{}: check {}{suffix}", target.name, check.label()),
                policy,
                || async {
                    targets::check_once(pool, http, eff, target, &kind, check.timeout, env).await
                },
            )
            .await?;
        lines.push(out);
    }
    Ok(lines)
}
