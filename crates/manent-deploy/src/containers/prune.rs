//! The prune after a container deploy (deploy workflow version 8, docs/containers.md,
//! "Pruning"): each pass of the `container` plugin ends by starting one workflow
//! `manent.containers.prune` for the targets it deployed. It is a child of the deploy (or
//! of its region's pass), on the same queue and partition, so it is claimed once the deploy
//! has ended and before the environment's next deploy starts: the deploy's result does not
//! wait for it, and it never runs beside the next deploy's switch. Its steps are the
//! `<target>: prune containers` a deploy under version 7 ran itself.

use futures::StreamExt;
use manent_engine::{WorkflowContext, WorkflowError};
use manent_model::{EffectiveDescriptor, Target};
use serde::{Deserialize, Serialize};

use super::target::OnTarget;
use crate::run::targets::{TargetOutcome, TargetState};

pub use crate::request::PRUNE_WORKFLOW;

/// What one prune does: the targets of one pass, as that pass's descriptor has them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PruneRequest {
    /// The deploy whose pass started it (`MANENT_DEPLOY_ID` of its commands).
    pub deploy_id: String,
    pub effective: EffectiveDescriptor,
    /// The targets the pass deployed, in the pass's order.
    pub targets: Vec<String>,
}

/// Starts the prune of the targets `outcomes` says were deployed, when there is one: a
/// recorded child of `ctx`'s workflow, started again by no replay.
pub(super) async fn start(
    ctx: &WorkflowContext,
    eff: &EffectiveDescriptor,
    deploy_id: &str,
    outcomes: &[TargetOutcome],
) -> Result<(), WorkflowError> {
    let targets = deployed(eff, outcomes);
    if targets.is_empty() || eff.dry_run {
        return Ok(());
    }
    let request = PruneRequest {
        deploy_id: deploy_id.to_string(),
        effective: eff.clone(),
        targets,
    };
    let (queue, partition) = (ctx.queue().to_string(), ctx.partition_key().to_string());
    let partition = Some(partition.as_str()).filter(|p| !p.is_empty());
    ctx.start_child(PRUNE_WORKFLOW, &queue, partition, request)
        .await?;
    Ok(())
}

/// The targets `outcomes` says were deployed, in the descriptor's order (the branches
/// finish in any).
fn deployed(eff: &EffectiveDescriptor, outcomes: &[TargetOutcome]) -> Vec<String> {
    eff.targets
        .iter()
        .filter(|t| {
            outcomes
                .iter()
                .any(|o| o.name == t.name && o.status == TargetState::Deployed)
        })
        .map(|t| t.name.clone())
        .collect()
}

/// The workflow: each target's prune, `rollout.max_parallel` at a time. A target the
/// descriptor no longer names is skipped; a prune that fails is shown, never a failure.
pub async fn run(
    ctx: &WorkflowContext,
    pool: &manent_ssh::ConnectionPool,
    request: &PruneRequest,
) -> Result<Vec<String>, WorkflowError> {
    let eff = &request.effective;
    let targets: Vec<&Target> = request
        .targets
        .iter()
        .filter_map(|name| eff.targets.iter().find(|t| &t.name == name))
        .collect();
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    let branches = ctx.branches(targets.len());
    let max_parallel = eff.rollout.max_parallel.max(1) as usize;
    let mut pending = Vec::new();
    for (b, t) in branches.into_iter().zip(targets) {
        pending.push(async move {
            let on = OnTarget::new(eff, t, &request.deploy_id)?;
            let line = on.prune(&b, pool).await?;
            Ok::<String, WorkflowError>(format!("{}: {line}", t.name))
        });
    }
    let lines: Vec<Result<String, WorkflowError>> = futures::stream::iter(pending)
        .buffered(max_parallel)
        .collect()
        .await;
    lines.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_deployed_targets_are_pruned_in_the_descriptors_order() {
        let mut eff = crate::tasks::effective_for_tests(
            "deploy: {dest: /srv/web}\ntargets:\n  - {name: a, host: 10.0.0.1}\n  - {name: b, host: 10.0.0.2}\n  - {name: c, host: 10.0.0.3}\n",
            "",
        );
        let outcomes = [
            TargetOutcome::new("c", TargetState::Deployed, None),
            TargetOutcome::new("b", TargetState::Failed, None),
            TargetOutcome::new("a", TargetState::Deployed, None),
        ];
        assert_eq!(
            deployed(&eff, &outcomes),
            ["a", "c"],
            "a failed target keeps what it had; the others in the descriptor's order"
        );
        eff.targets.truncate(1);
        assert_eq!(
            deployed(&eff, &outcomes),
            ["a"],
            "a target the descriptor does not name is not pruned"
        );
    }
}
