//! What a dry run says the tasks would do on one target: which, when, and from where.

use manent_model::{EffectiveDescriptor, Target, TaskWhen};

use crate::tasks::run::release_dir;

/// One line per task that would run on `target`, in the order they would run
/// (`would run task migrate once before activate, from /srv/web/1.2`).
pub fn lines(eff: &EffectiveDescriptor, target: &Target) -> Vec<String> {
    let from = release_dir(eff, target)
        .map(|dir| format!(", from {dir}"))
        .unwrap_or_default();
    [TaskWhen::BeforeActivate, TaskWhen::AfterActivate]
        .into_iter()
        .flat_map(|when| {
            let from = &from;
            eff.tasks_on(target, when).into_iter().map(move |task| {
                let run = eff.command_for(&task.run, target, manent_ssh::shell_quote);
                format!(
                    "would run task {}{} {}{from}: {run}",
                    task.name,
                    if task.once { " once" } else { "" },
                    match when {
                        TaskWhen::BeforeActivate if task.once => "before any target is switched",
                        TaskWhen::BeforeActivate => "before activate",
                        TaskWhen::AfterActivate => "after activate",
                    },
                )
            })
        })
        .collect()
}
