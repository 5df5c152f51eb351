//! Irreversible deploys and the automatic rollback (docs/environments.md, "Irreversible
//! deploys"): a deploy whose descriptor says `irreversible: "reason"` (a destructive
//! migration, say) and one of whose `once` tasks succeeded has changed what the old code
//! expects; when it fails, its automatic rollback does not put the old code back on its
//! own, unless the environment says `rollback: {past_irreversible: true}`. The targets are
//! left as they are, and the deploy's error and each switched target say why.

use manent_engine::{WorkflowContext, WorkflowError};
use manent_model::EffectiveDescriptor;

use crate::{
    request::{EventKey, publish},
    run::targets::TargetOutcome,
    tasks::once::BeforeAnySwitch,
};

/// Why the automatic rollback of this failed deploy is held back, if it is: the deploy is
/// irreversible, a `once` task of it succeeded (before any switch, or after a target's
/// activate), and the environment does not roll back past that.
pub fn held_back(
    eff: &EffectiveDescriptor,
    once: &BeforeAnySwitch,
    outcomes: &[TargetOutcome],
) -> Option<String> {
    let reason = eff.irreversible.as_deref()?;
    if eff.rollback.past_irreversible {
        return None;
    }
    let succeeded: Vec<String> = once
        .succeeded
        .iter()
        .map(|(task, target)| format!("{task} on {target}"))
        .chain(outcomes.iter().flat_map(|o| {
            o.once_tasks
                .iter()
                .map(move |task| format!("{task} on {}", o.name))
        }))
        .collect();
    if succeeded.is_empty() {
        return None;
    }
    Some(format!(
        "not rolled back: the deploy is irreversible ({reason}) and its once task {} \
         succeeded, so the previous version was not reactivated and the targets are left as \
         they are; fix forward, or set rollback: {{past_irreversible: true}} in the \
         environment file to roll back past it",
        succeeded.join(", ")
    ))
}

/// Publishes, on each target this deploy switched, that it was not rolled back and why.
pub async fn hold(
    ctx: &WorkflowContext,
    outcomes: &[TargetOutcome],
    why: &str,
) -> Result<(), WorkflowError> {
    for outcome in outcomes.iter().filter(|o| o.switched) {
        let before = outcome.detail.clone().unwrap_or_default();
        let held = TargetOutcome {
            detail: Some(if before.is_empty() {
                why.to_string()
            } else {
                format!("{before}; {why}")
            }),
            ..outcome.clone()
        };
        publish(ctx, &EventKey::target(&outcome.name), &held).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::targets::TargetState;

    fn eff(irreversible: Option<&str>, past_irreversible: bool) -> EffectiveDescriptor {
        crate::tasks::effective_for_tests(
            &format!(
                "targets: [{{name: db-1, host: local, roles: [db]}}]\ndeploy:\n  dest: /srv\n  \
                 tasks: [{{name: migrate, run: m, when: before_activate, once: true}}]\n\
                 rollback: {{past_irreversible: {past_irreversible}}}\n"
            ),
            &irreversible
                .map(|r| format!("irreversible: {r:?}\n"))
                .unwrap_or_default(),
        )
    }

    fn migrated() -> BeforeAnySwitch {
        BeforeAnySwitch {
            succeeded: vec![("migrate".into(), "db-1".into())],
            failed: None,
        }
    }

    #[test]
    fn only_an_irreversible_deploy_whose_once_task_succeeded_holds_its_rollback_back() {
        let reason = held_back(&eff(Some("drops users.name"), false), &migrated(), &[])
            .expect("irreversible, migrated: held back");
        assert!(
            reason.contains("(drops users.name)") && reason.contains("migrate on db-1"),
            "the reason and the task that ran are named: {reason}"
        );
        assert_eq!(
            held_back(&eff(Some("drops users.name"), true), &migrated(), &[]),
            None,
            "rollback.past_irreversible: true rolls back anyway"
        );
        assert_eq!(
            held_back(&eff(None, false), &migrated(), &[]),
            None,
            "a deploy not marked irreversible rolls back as any other"
        );
        assert_eq!(
            held_back(
                &eff(Some("drops users.name"), false),
                &BeforeAnySwitch::default(),
                &[]
            ),
            None,
            "nothing irreversible happened while no once task succeeded"
        );
        let after_activate = TargetOutcome {
            once_tasks: vec!["backfill".into()],
            ..TargetOutcome::new("db-1", TargetState::Failed, None)
        };
        assert!(
            held_back(
                &eff(Some("drops users.name"), false),
                &BeforeAnySwitch::default(),
                &[after_activate]
            )
            .is_some_and(|why| why.contains("backfill on db-1")),
            "a once task after activate counts as well"
        );
    }
}
