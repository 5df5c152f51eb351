//! What a run does first once it knows its effective descriptor: every secret read and
//! every template rendered for its targets, in memory (`vars::run_values`), so that one
//! that cannot be read or rendered fails the deploy before any target changes
//! (docs/environments.md, "Fail before touching anything"). From workflow version
//! [`VARS_VERSION`] a step records that it was done, never a value.

use std::path::Path;
use std::sync::Arc;

use manent_config::Config;
use manent_engine::{WorkflowContext, WorkflowError};
use manent_model::{EffectiveDescriptor, Target};

use crate::request::VARS_VERSION;
use crate::run::{artifacts, masking::Masker, targets};
use crate::vars::run_values::{self, RunValues};

/// The step that records that a run's secrets and templates were resolved (its result says
/// how many, never a value). Its name is stored: never change it.
pub const RESOLVE_STEP: &str = "resolve secrets and templates";

/// The values of a run of `application`'s `environment` on this worker: its environment
/// file's directory is where relative secret paths and `command` providers start.
pub(super) fn run_values(config: &Config, application: &str, environment: &str) -> Arc<RunValues> {
    let source = crate::plugins::absolute(&config.environments_source());
    let file = manent_model::environment_path(&source, application, environment);
    Arc::new(RunValues::new(file.parent().map(Path::to_path_buf)))
}

/// Reads every secret of `eff` and renders its templates for `targets` (the deploy's or a
/// pass's), before anything changes on a target; `dir` is the run's work directory. A
/// failure fails the deploy, naming the secret or the template (secrets masked).
pub(super) async fn resolve(
    ctx: &WorkflowContext,
    eff: &EffectiveDescriptor,
    deploy_id: &str,
    dir: &Path,
    targets: &[Target],
) -> Result<(), WorkflowError> {
    let Some(values) = run_values::current() else {
        return Ok(());
    };
    if !eff.templates.is_empty() && ctx.workflow_version() < VARS_VERSION {
        return Err(WorkflowError::failed(format!(
            "this deploy started under workflow version {}, which writes no templates, and its \
             environment file now has some; deploy again once every worker runs version {VARS_VERSION} \
             or later (docs/upgrading.md)",
            ctx.workflow_version()
        )));
    }
    let local = super::not_fetched(eff, &artifacts::artifacts_dir(dir));
    let prepared = values
        .prepare(eff, targets, |target| {
            targets::command_env(eff, deploy_id, target, &local)
        })
        .await;
    let masker = Masker::new(values.secret_values().await.iter().map(String::as_str));
    let prepared = prepared
        .map(|done| done.to_string())
        .map_err(|e| masker.redact(&e.to_string()));
    if ctx.workflow_version() >= VARS_VERSION
        && (!eff.secrets.is_empty() || !eff.templates.is_empty())
    {
        // On a replay the record answers, and this run's own reading decides below.
        ctx.step(RESOLVE_STEP, || async { prepared.clone() })
            .await?;
    }
    prepared.map(|_| ()).map_err(WorkflowError::failed)
}
