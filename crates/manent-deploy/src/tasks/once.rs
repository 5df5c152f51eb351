//! The `once` tasks run before any target is switched (docs/environments.md, "Tasks and
//! roles"): in the first wave, on the first target in rollout order having one of their
//! roles, once that target's new release is in place (its files, shared links, templates),
//! each a durable step. A success is recorded and never run again, whichever worker resumes
//! the deploy; a failure fails the deploy before any target is switched.

use async_trait::async_trait;
use manent_engine::{WorkflowContext, WorkflowError};
use manent_model::{EffectiveDescriptor, Target, Task};
use manent_ssh::ConnectionPool;

use crate::{
    request::{EventKey, TASKS_VERSION, publish},
    run::targets::{TargetOutcome, TargetState},
    tasks::run::{line, run_task},
};

/// What the `once` tasks need of the plugin that deploys: the release of one target put in
/// place as its wave would (recorded steps), and how commands reach it.
#[async_trait]
pub trait Release: Send + Sync {
    /// The deploy.
    fn eff(&self) -> &EffectiveDescriptor;
    /// How the targets are reached.
    fn pool(&self) -> &ConnectionPool;
    /// The variables every command on `target` gets.
    fn env(&self, target: &Target) -> Vec<(String, String)>;
    /// Puts `target`'s new release in place without switching it; the lines say what
    /// was done. Its wave then leaves it as it is.
    async fn put_in_place(
        &self,
        ctx: &WorkflowContext,
        target: &Target,
    ) -> Result<Vec<String>, WorkflowError>;
}

/// What the `once` tasks did before any target was switched.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BeforeAnySwitch {
    /// `(task, target)` of each that succeeded, in order.
    pub succeeded: Vec<(String, String)>,
    /// The outcome of the target where putting the release in place or a task failed: the
    /// deploy fails with it, no target switched.
    pub failed: Option<TargetOutcome>,
}

/// Whether `target`'s release was put in place before any target was switched, so that its
/// wave leaves it as it is: it runs a `once` task before its `activate`.
pub fn placed_before_any_switch(eff: &EffectiveDescriptor, target: &Target) -> bool {
    !eff.dry_run
        && eff
            .once_before_activate()
            .iter()
            .any(|(_, once)| once.name == target.name)
}

/// Runs the deploy's `once` tasks of `before_activate`, target by target: the release put in
/// place, then its tasks in order. Records nothing for a deploy without tasks (or a dry run,
/// whose plan lists them), so such deploys replay as before; refuses to run tasks in a
/// deploy started under a workflow version without them.
pub async fn before_any_switch(
    ctx: &WorkflowContext,
    release: &dyn Release,
) -> Result<BeforeAnySwitch, WorkflowError> {
    let eff = release.eff();
    let mut done = BeforeAnySwitch::default();
    if eff.tasks.is_empty() || eff.dry_run {
        return Ok(done);
    }
    if ctx.workflow_version() < TASKS_VERSION {
        return Err(WorkflowError::failed(format!(
            "the environment has deploy.tasks, which deploy workflow version {} does not run \
             (this deploy started under it while a worker of an older release was live); \
             deploy again: it starts under version {TASKS_VERSION} or later",
            ctx.workflow_version()
        )));
    }
    for (target, tasks) in by_target(eff.once_before_activate()) {
        let key = EventKey::target(&target.name);
        let deploying = TargetOutcome::new(&target.name, TargetState::Deploying, None);
        publish(ctx, &key, &deploying).await?;
        let env = release.env(&target);
        let result: Result<Vec<String>, WorkflowError> = async {
            let mut lines = release.put_in_place(ctx, &target).await?;
            for task in &tasks {
                let out = run_task(ctx, release.pool(), eff, &target, task, &env).await?;
                lines.push(format!("{} once", line(task, &out)));
                done.succeeded
                    .push((task.name.clone(), target.name.clone()));
            }
            Ok(lines)
        }
        .await;
        let outcome = match result {
            Ok(lines) => TargetOutcome::new(
                &target.name,
                TargetState::Pending,
                Some(format!("{}; switched with its wave", lines.join("; "))),
            ),
            Err(WorkflowError::Step { name, message }) => {
                let failed = TargetOutcome::new(
                    &target.name,
                    TargetState::Failed,
                    Some(format!("{name}: {message}; no target was switched")),
                );
                publish(ctx, &key, &failed).await?;
                done.failed = Some(failed);
                return Ok(done);
            }
            Err(other) => return Err(other),
        };
        publish(ctx, &key, &outcome).await?;
    }
    Ok(done)
}

/// `once` tasks grouped by their target, targets in order of their first task.
fn by_target(once: Vec<(&Task, Target)>) -> Vec<(Target, Vec<&Task>)> {
    let mut groups: Vec<(Target, Vec<&Task>)> = Vec::new();
    for (task, target) in once {
        match groups.iter_mut().find(|(t, _)| t.name == target.name) {
            Some((_, tasks)) => tasks.push(task),
            None => groups.push((target, vec![task])),
        }
    }
    groups
}
