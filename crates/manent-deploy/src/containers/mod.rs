//! The `container` plugin (docs/containers.md): each version of an application runs on each
//! target as a container `<name>-<version>` behind a proxy manent configures. One durable
//! step per action, each safe to run again after a crash: upload the image archive, load
//! it, start the container beside the live one, wait for its health, switch the proxy,
//! run the checks, take the old container out of the proxy once its requests are done and
//! stop it; then, after the deploy's result, prune past `keep`. A rollback starts the kept
//! container again and switches back the same way.
//!
//! - `commands.rs`: the runtime's shell, one small function per action.
//! - `proxy.rs`: HAProxy's configuration and runtime API.
//! - `target.rs`: one target's steps, for a deploy and for a rollback.
//! - `manifest.rs`: the container in the release manifest, and `manent drift` against it.
//! - `prune.rs`: the workflow `manent.containers.prune` each deploy pass starts for its
//!   targets, which runs once the deploy has ended.
//!
//! It depends on `plugins` (the trait it implements), `run`, `request` and `manifests`
//! (`drift` calls `manifest.rs`); the workflow
//! finds it by name beside the registry of `plugins` (which cannot name it without a cycle).

mod commands;
pub mod manifest;
mod proxy;
mod prune;
mod target;

pub use prune::{PRUNE_WORKFLOW, PruneRequest, run as prune};

use async_trait::async_trait;
use futures::StreamExt;
use manent_engine::{WorkflowContext, WorkflowError};
use manent_model::{EffectiveDescriptor, Target};

use crate::{
    plugins::{PassContext, Plugin},
    run::targets::TargetOutcome,
};

/// The `container` plugin.
#[derive(Debug, Default)]
pub struct Container;

#[async_trait]
impl Plugin for Container {
    async fn deploy_pass(
        &self,
        ctx: &WorkflowContext,
        pass: &PassContext<'_>,
        targets: &[Target],
    ) -> Result<Vec<TargetOutcome>, WorkflowError> {
        refuse_older_version(ctx)?;
        if targets.is_empty() {
            return Ok(Vec::new());
        }
        let branches = ctx.branches(targets.len());
        let max_parallel = pass.eff.rollout.max_parallel.max(1) as usize;
        let mut pending = Vec::new();
        for (b, t) in branches.into_iter().zip(targets) {
            pending.push(async move { target::deploy(&b, pass, t).await });
        }
        let results: Vec<Result<TargetOutcome, WorkflowError>> = futures::stream::iter(pending)
            .buffer_unordered(max_parallel)
            .collect()
            .await;
        let outcomes = results.into_iter().collect::<Result<Vec<_>, _>>()?;
        if ctx.workflow_version() >= crate::request::PRUNE_AFTER_VERSION {
            prune::start(ctx, pass.eff, pass.deploy_id, &outcomes).await?;
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
        refuse_older_version(ctx)?;
        let switched: Vec<(&TargetOutcome, &Target)> = switched
            .iter()
            .filter_map(|o| {
                pass.eff
                    .targets
                    .iter()
                    .find(|t| t.name == o.name)
                    .map(|t| (o, t))
            })
            .collect();
        if switched.is_empty() {
            return Ok(Vec::new());
        }
        let branches = ctx.branches(switched.len());
        let max_parallel = pass.eff.rollout.max_parallel.max(1) as usize;
        let mut pending = Vec::new();
        for (b, (outcome, t)) in branches.into_iter().zip(switched) {
            pending.push(async move { target::roll_back(&b, pass, previous, outcome, t).await });
        }
        let results: Vec<Result<TargetOutcome, WorkflowError>> = futures::stream::iter(pending)
            .buffered(max_parallel)
            .collect()
            .await;
        results.into_iter().collect()
    }
}

/// A deploy started under a version before [`crate::request::CONTAINERS_VERSION`] was
/// submitted by a build without this plugin: it cannot have been recorded with its steps.
fn refuse_older_version(ctx: &WorkflowContext) -> Result<(), WorkflowError> {
    if ctx.workflow_version() < crate::request::CONTAINERS_VERSION {
        return Err(WorkflowError::failed(format!(
            "the container plugin runs in deploy workflow version {} or later; this deploy \
             started under {}: submit it again",
            crate::request::CONTAINERS_VERSION,
            ctx.workflow_version()
        )));
    }
    Ok(())
}
