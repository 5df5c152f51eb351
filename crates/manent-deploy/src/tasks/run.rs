//! One task on one target as a durable step, and the tasks of one target at one moment of
//! its deploy (docs/environments.md, "Tasks and roles").

use manent_engine::{StepPolicy, WorkflowContext, WorkflowError};
use manent_model::{EffectiveDescriptor, Target, Task, TaskWhen};
use manent_ssh::ConnectionPool;

use crate::run::targets::{self, TargetError};

/// The variable holding the release directory a task runs from.
pub const RELEASE_VARIABLE: &str = "MANENT_RELEASE";

/// The name of `task`'s step on `target`.
pub fn step_name(target: &Target, task: &Task) -> String {
    format!("{}: task {}", target.name, task.name)
}

/// The directory `target`'s tasks run from: the deploy's `dest` there (the new release
/// under `remote-copy`), when it has one.
pub fn release_dir(eff: &EffectiveDescriptor, target: &Target) -> Option<String> {
    eff.dest_for(target).map(|dest| {
        let trimmed = dest.trim_end_matches('/');
        if trimmed.is_empty() {
            dest
        } else {
            trimmed.to_string()
        }
    })
}

/// The shell text of `task` on `target`: into the release directory, then its command with
/// `{version}`, `{target}`, `{application}` and `{environment}` replaced as in `activate`.
fn script(eff: &EffectiveDescriptor, target: &Target, task: &Task) -> String {
    let run = eff.command_for(&task.run, target, manent_ssh::shell_quote);
    match release_dir(eff, target) {
        Some(dir) => format!("cd -- {} || exit 1\n{run}", manent_ssh::shell_quote(&dir)),
        None => run,
    }
}

/// Runs `task` on `target` in a step of its own (run once, its start recorded so status
/// shows it running), with `env` (the variables every command of the deploy gets) and
/// `MANENT_RELEASE`; stopped and failed past its `timeout`. Its output is kept under the
/// step's name, masked like every command's. Returns what the step recorded.
pub async fn run_task(
    ctx: &WorkflowContext,
    pool: &ConnectionPool,
    eff: &EffectiveDescriptor,
    target: &Target,
    task: &Task,
    env: &[(String, String)],
) -> Result<String, WorkflowError> {
    let step = step_name(target, task);
    let mut env = env.to_vec();
    if let Some(dir) = release_dir(eff, target) {
        env.push((RELEASE_VARIABLE.to_string(), dir));
    }
    let script = script(eff, target, task);
    ctx.step_with(&step, StepPolicy::default().recording_start(), || async {
        let output = ctx.output(&step);
        // Dropping the command's future ends it on the target (its supervisor dies with
        // the channel).
        let ran = tokio::time::timeout(
            task.timeout,
            targets::run(pool, eff, target, &script, &env, &output),
        )
        .await
        .unwrap_or(Err(TargetError::TimedOut(task.timeout)));
        output.finish().await;
        ran
    })
    .await
}

/// What the tasks of one target at one moment did.
#[derive(Debug, Default)]
pub struct Ran {
    /// One line per task, for the target's outcome.
    pub lines: Vec<String>,
    /// The `once` tasks among them (all succeeded: a failure is an error).
    pub once: Vec<String>,
}

/// Runs the tasks of `target` at `when`, in order; the first failure stops them and is the
/// target's failure (a step error). Before activate, the `once` tasks are left out: they
/// ran before any target was switched ([`crate::tasks::before_any_switch`]).
pub async fn run_on(
    ctx: &WorkflowContext,
    pool: &ConnectionPool,
    eff: &EffectiveDescriptor,
    target: &Target,
    env: &[(String, String)],
    when: TaskWhen,
) -> Result<Ran, WorkflowError> {
    let mut ran = Ran::default();
    for task in eff.tasks_on(target, when) {
        if task.once && when == TaskWhen::BeforeActivate {
            continue;
        }
        let out = run_task(ctx, pool, eff, target, task, env).await?;
        ran.lines.push(line(task, &out));
        if task.once {
            ran.once.push(task.name.clone());
        }
    }
    Ok(ran)
}

/// `task migrate: ok (what it printed last)`.
pub fn line(task: &Task, out: &str) -> String {
    if out.is_empty() {
        format!("task {}: ok", task.name)
    } else {
        format!("task {}: ok ({out})", task.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eff(environment: &str) -> EffectiveDescriptor {
        crate::tasks::effective_for_tests(environment, "")
    }

    #[test]
    fn a_task_runs_from_the_release_directory_with_its_placeholders_quoted() {
        let eff = eff(
            "targets: [{name: web-1, host: local}]\ndeploy:\n  dest: /srv/web/{version}/\n  \
             tasks: [{name: m, run: \"bin/migrate --to {version}\", when: before_activate}]\n",
        );
        let target = &eff.targets[0];
        expect_test::expect![[r#"
            cd -- '/srv/web/1.2' || exit 1
            bin/migrate --to '1.2'"#]]
        .assert_eq(&script(&eff, target, &eff.tasks[0]));
        assert_eq!(
            step_name(target, &eff.tasks[0]),
            "web-1: task m",
            "a task's step is named after its target, as every step of a target is"
        );
    }

    #[test]
    fn under_the_command_plugin_without_dest_a_task_runs_where_the_login_starts() {
        let eff = eff(
            "targets: [{name: w, host: local}]\ndeploy:\n  plugin: command\n  commands: [x]\n  \
             tasks: [{name: m, run: \"echo {target}\", when: after_activate}]\n",
        );
        assert_eq!(
            script(&eff, &eff.targets[0], &eff.tasks[0]),
            "echo 'w'",
            "no release directory: no cd, and no MANENT_RELEASE"
        );
        assert_eq!(
            release_dir(&eff, &eff.targets[0]),
            None,
            "a plugin without a release directory gives none"
        );
    }
}
