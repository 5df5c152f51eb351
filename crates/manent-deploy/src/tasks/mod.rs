//! Tasks of a release, `deploy.tasks` (docs/environments.md, "Tasks and roles"): commands
//! run from a new release on the targets of some roles, before its `activate` or after it,
//! or once per deploy; and what a failed irreversible deploy does when one of its `once`
//! tasks succeeded. Which tasks run where is the model's (`EffectiveDescriptor::tasks_on`,
//! `once_before_activate`); this room runs them as durable steps.
//!
//! - `run`: one task on one target, a step `<target>: task <name>` run from the release
//!   directory (`MANENT_RELEASE`) with the environment of every command, its timeout, its
//!   output masked; and the tasks of one target at one moment.
//! - `once`: the `once` tasks run before any target is switched: their target's release
//!   put in place by the plugin (the [`once::Release`] it implements), then each task, a
//!   failure failing the deploy before anything changed.
//! - `irreversible`: whether the automatic rollback of a failed deploy is held back.
//! - `plan`: what a dry run says the tasks would do on a target.
//!
//! It depends on `run` (commands on targets) and `request` (events, workflow versions);
//! the built-in plugins and the workflow call into it.

pub mod irreversible;
pub mod once;
pub mod plan;
pub mod run;

pub use once::{BeforeAnySwitch, Release, before_any_switch};
pub use run::{Ran, run_on};

/// The effective descriptor of a deploy of ml/web's prod at version 1.2, with `descriptor`
/// (YAML lines) added to the descriptor and `environment` as its environment file.
#[cfg(test)]
pub(crate) fn effective_for_tests(
    environment: &str,
    descriptor: &str,
) -> manent_model::EffectiveDescriptor {
    let env = manent_model::parse_environment(environment, "prod.yml", "ml/web", "prod")
        .expect("a valid environment");
    let descriptor = manent_model::parse_descriptor(
        &format!(
            "application: ml/web\nenvironment: prod\nartifacts: [{{name: a, type: t, version: \
             \"1.2\", url: \"file:///a\", sha256: {}}}]\n{descriptor}",
            "0".repeat(64)
        ),
        "d.yml",
    )
    .expect("a valid descriptor");
    manent_model::EffectiveDescriptor::build(&descriptor, &env).expect("an effective descriptor")
}
