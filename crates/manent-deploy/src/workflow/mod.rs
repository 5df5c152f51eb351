//! The deploy workflow: fetch and verify the artifacts, then wave by wave
//! deploy and check each target (`max_parallel` at a time), stop and roll back
//! on failure. Every line of work is a durable step: a deploy interrupted
//! anywhere resumes at the step where it stopped.
//!
//! The room also holds `gate`: approvals, dependencies and the re-authorisation of
//! scheduled deploys, the waits before a deploy runs.

pub mod gate;
pub mod values;

use std::{path::PathBuf, sync::Arc, time::Duration};

use manent_config::{Config, NotificationEvent};
use manent_engine::{Engine, StepPolicy, WorkflowContext, WorkflowError};
use manent_model::{EffectiveDescriptor, OnFailure, Target, Wave, plan_waves};
use manent_ssh::{ConnectionPool, SshAuth};
use serde::{Deserialize, Serialize};

use crate::request::{AUTHORISE_AT_START_STEP, EventKey, Phase, publish};
pub use crate::request::{DEPLOY_WORKFLOW, DeployRequest, Submitter, same_token};
use crate::{
    authority::Authority,
    http::HttpFetch,
    plugins::{BuiltInRelease, PassContext, Plugin, Plugins},
    run::artifacts::{self, LocalArtifact},
    run::targets::TargetOutcome,
    workflow::gate::Reauthorised,
};

/// The final output of a successful deploy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeployResult {
    pub targets: Vec<TargetOutcome>,
}

/// What a worker needs to run deploys.
pub struct Runtime {
    pub config: Arc<Config>,
    pub client: manent_engine::Client,
    /// Where artifacts are kept on this worker: [`Config::worker_workdir`] (`worker.workdir`,
    /// or `MANENT_WORKDIR` given at load). One directory per deploy, removed as the deploy
    /// ends.
    pub workdir: PathBuf,
    /// The plugins: built in, external ones this worker runs, stubs for the others.
    pub plugins: Arc<Plugins>,
    /// `artifacts.sources`: the only places artifacts are fetched from.
    pub artifact_sources: Arc<manent_config::ArtifactSources>,
    /// SSH connections kept open between deploys (`worker.ssh_keep_warm`).
    pub warm: Arc<manent_ssh::WarmConnections>,
    /// Who may still deploy: asked again when a `schedule.at` deploy starts.
    pub authority: Arc<dyn Authority>,
    /// The worker's HTTP client (manent-server's): artifact downloads, HTTP checks, the
    /// analysis' HTTP providers.
    pub http: Arc<dyn HttpFetch>,
}

impl Runtime {
    pub fn new(
        config: Arc<Config>,
        client: manent_engine::Client,
        authority: Arc<dyn Authority>,
        http: Arc<dyn HttpFetch>,
    ) -> Self {
        let workdir = work_directory(&config);
        let plugins = Arc::new(Plugins::from_config(&config));
        let artifact_sources = Arc::new(config.artifact_sources());
        let warm = manent_ssh::WarmConnections::new(config.worker.ssh_keep_warm);
        Runtime {
            config,
            client,
            workdir,
            plugins,
            artifact_sources,
            warm,
            authority,
            http,
        }
    }
}

/// The worker's work directory, made absolute against the process's working directory at
/// start: `MANENT_ARTIFACT_*` (the worker's copies) must stay valid for a command that
/// changes directory, whatever `worker.workdir` or `MANENT_WORKDIR` said.
pub fn work_directory(config: &Config) -> PathBuf {
    crate::plugins::absolute(&config.worker_workdir())
}

/// Removes a deploy's (or a pass's) working directory once its run has ended for good
/// (success, failure, cancellation), so the work directory does not grow with every deploy.
/// A run that stops without an outcome (fenced, moved to another queue, a checkpoint that
/// could not be written and will be replayed) keeps it: the run goes on, here or elsewhere,
/// and its recorded fetches name these files.
async fn removing_when_ended<T>(
    dir: &std::path::Path,
    result: Result<T, WorkflowError>,
) -> Result<T, WorkflowError> {
    let goes_on = matches!(
        result,
        Err(WorkflowError::Fenced | WorkflowError::Moved { .. } | WorkflowError::Store(_))
    );
    if !goes_on {
        artifacts::forget_dir(dir);
        match tokio::fs::remove_dir_all(dir).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot remove the deploy's work directory")
            }
        }
    }
    result
}

/// Registers manent's workflows on a worker's engine, and the gate queue every
/// worker serves (deploys waiting for approval or dependencies). `authority` answers
/// whether a `schedule.at` deploy's token may still deploy when it starts (manent-api's
/// token store; [`crate::authority::NoTokens`] refuses them all). `http` is the worker's
/// HTTP client (manent-server's; [`crate::http::NoClient`] refuses every request). Returns
/// the worker's plugins: stop them with [`Plugins::shutdown`] once the engine has stopped.
pub fn register_workflows(
    engine: &Engine,
    config: &Config,
    authority: Arc<dyn Authority>,
    http: Arc<dyn HttpFetch>,
) -> Arc<Plugins> {
    engine.listen(gate::gate_queue_spec());
    // The versions of the deploy workflow this code replays (ARCHITECTURE.md, "Workflow
    // versions"): whoever builds the engine, it claims no deploy it cannot run.
    engine.run_workflow_versions(crate::request::DEPLOY_WORKFLOW_VERSIONS);
    let runtime = Arc::new(Runtime::new(
        Arc::new(config.clone()),
        engine.client(),
        authority,
        http,
    ));
    // A run stopped because its deploy is no longer ours (cancelled, recovered elsewhere)
    // never reaches `removing_when_ended`.
    crate::run::workdirs::remove_when_taken_away(engine, runtime.workdir.clone());
    let plugins = runtime.plugins.clone();
    let runtime_for_deploys = runtime.clone();
    engine.register(
        DEPLOY_WORKFLOW,
        move |ctx: WorkflowContext, request: DeployRequest| {
            let runtime = runtime_for_deploys.clone();
            async move {
                let dir = artifacts::deploy_dir(&runtime.workdir, ctx.workflow_id());
                let ended = (!request.descriptor.dry_run).then(|| request.clone());
                let values = values::run_values(
                    &runtime.config,
                    &request.descriptor.application,
                    &request.descriptor.environment,
                );
                let run = crate::vars::run_values::scoped(values, deploy(&ctx, &runtime, request));
                let result = manent_guard::guarded(dead_mans_switch(&ctx), run).await;
                if let Some(request) = ended {
                    notify_end(&runtime, &request, ctx.workflow_id(), &result).await;
                }
                removing_when_ended(&dir, result).await
            }
        },
    );
    let runtime_for_passes = runtime.clone();
    engine.register(
        PASS_WORKFLOW,
        move |ctx: WorkflowContext, request: PassRequest| {
            let runtime = runtime_for_passes.clone();
            async move {
                let dir = artifacts::deploy_dir(&runtime.workdir, ctx.workflow_id());
                let values = values::run_values(
                    &runtime.config,
                    &request.effective.application,
                    &request.effective.environment,
                );
                let run = crate::vars::run_values::scoped(values, pass(&ctx, &runtime, request));
                let result = manent_guard::guarded(dead_mans_switch(&ctx), run).await;
                removing_when_ended(&dir, result).await
            }
        },
    );
    let runtime_for_prunes = runtime.clone();
    engine.register(
        crate::containers::PRUNE_WORKFLOW,
        move |ctx: WorkflowContext, request: crate::containers::PruneRequest| {
            let runtime = runtime_for_prunes.clone();
            async move {
                let eff = &request.effective;
                let pool = ConnectionPool::with_warm(ssh_auth(&runtime, eff), runtime.warm.clone());
                let values =
                    values::run_values(&runtime.config, &eff.application, &eff.environment);
                let run = crate::vars::run_values::scoped(
                    values,
                    crate::containers::prune(&ctx, &pool, &request),
                );
                manent_guard::guarded(dead_mans_switch(&ctx), run).await
            }
        },
    );
    plugins
}

/// The switch every command and plugin process of this run starts under: it ends them
/// when this worker stops proving it may act on its steps (frozen, fenced), before
/// `recovery.stale_after` lets another worker run the step again. None with a
/// `stale_after` under 4 s (a timeout under a second).
fn dead_mans_switch(ctx: &WorkflowContext) -> Option<manent_guard::DeadMansSwitch> {
    let lease = ctx.lease_window();
    let timeout = lease.dead_man_timeout();
    manent_guard::DeadMansSwitch::new(timeout, Arc::new(move || lease.may_act_for()))
}

/// Records `event` of the deploy for the webhooks that want it (never fails the deploy).
async fn notify(
    rt: &Runtime,
    event: NotificationEvent,
    request: &DeployRequest,
    deploy_id: &str,
    error: Option<String>,
) {
    let mut facts = crate::notifications::Facts::of(request, deploy_id);
    facts.error = error;
    crate::notifications::record(&rt.client, &rt.config, event, &facts).await;
}

/// Tells the webhooks how a deploy ended: succeeded, or failed with its error. A run that
/// stops without an outcome (fenced, moved, a checkpoint not written: it goes on
/// elsewhere) or was cancelled (the API records that) tells nothing here.
async fn notify_end<T>(
    rt: &Runtime,
    request: &DeployRequest,
    deploy_id: &str,
    result: &Result<T, WorkflowError>,
) {
    match result {
        Ok(_) => notify(rt, NotificationEvent::Succeeded, request, deploy_id, None).await,
        Err(
            WorkflowError::Fenced
            | WorkflowError::Moved { .. }
            | WorkflowError::Store(_)
            | WorkflowError::Cancelled,
        ) => {}
        Err(e) => {
            let error = Some(e.to_string());
            notify(rt, NotificationEvent::Failed, request, deploy_id, error).await;
        }
    }
}

async fn phase(ctx: &WorkflowContext, phase: Phase) -> Result<(), WorkflowError> {
    publish(ctx, &EventKey::Phase, &phase).await
}

/// Why the check of a `schedule.at` deploy as it starts did not pass.
#[derive(Debug, thiserror::Error)]
enum StartRefusal {
    #[error("refused when its time came: {0}")]
    Refused(String),
    /// The token store could not be read (retried; after the last try the deploy is
    /// refused: it never runs on an authorisation nobody checked).
    #[error("refused when its time came: its token could not be checked: {0}")]
    Unchecked(String),
}

/// The first step of a deploy marked `authorise_at_start`: its token and its environment's
/// policy checked as they are now (`gate::reauthorise`); the effective descriptor it runs
/// with. A refusal ends the deploy in ERROR, phase `refused`, the reason in its error and,
/// through the failed step, in its logs.
async fn authorise_at_start(
    ctx: &WorkflowContext,
    rt: &Runtime,
    request: &DeployRequest,
) -> Result<Option<EffectiveDescriptor>, WorkflowError> {
    let submitter = request.submitter();
    let checked = ctx
        .step_retrying_if(
            AUTHORISE_AT_START_STEP,
            StepPolicy::retry(5, Duration::from_secs(1)),
            |e: &StartRefusal| matches!(e, StartRefusal::Unchecked(_)),
            || async {
                match gate::reauthorise(
                    &rt.config,
                    rt.authority.as_ref(),
                    &request.descriptor,
                    &submitter,
                )
                .await
                {
                    Ok(Reauthorised::Allowed(eff)) => Ok(eff.map(|eff| *eff)),
                    Ok(Reauthorised::Refused(reason)) => Err(StartRefusal::Refused(reason)),
                    Err(e) => Err(StartRefusal::Unchecked(e.to_string())),
                }
            },
        )
        .await;
    match checked {
        Ok(eff) => Ok(eff),
        Err(WorkflowError::Step { message, .. }) => {
            tracing::warn!(deploy = %ctx.workflow_id(), reason = %message, "a scheduled deploy was refused as it started");
            phase(ctx, Phase::Refused).await?;
            Err(WorkflowError::failed(message))
        }
        Err(other) => Err(other),
    }
}

async fn deploy(
    ctx: &WorkflowContext,
    rt: &Runtime,
    request: DeployRequest,
) -> Result<DeployResult, WorkflowError> {
    let deploy_id = ctx.workflow_id().to_string();
    // Version 2 (request.rs, DEPLOY_WORKFLOW_VERSIONS): checked again as it starts.
    let effective = match request.authorise_at_start {
        true => authorise_at_start(ctx, rt, &request).await?,
        false => request.effective.clone(),
    };
    let eff = match effective {
        Some(eff) => eff,
        None => resolve_environment(ctx, rt, &request).await?,
    };
    if request.gated {
        // Approval and dependency waits, then the move to the route's queue: what
        // follows runs on a worker of that queue (its plugins), under its limits.
        gate::pass_gate(
            ctx,
            &rt.client,
            &rt.config,
            rt.http.as_ref(),
            &request,
            &eff,
        )
        .await?;
    }
    let plugin = plugin_for(ctx, rt, &eff)?;
    let eff = as_requested(ctx, &request, eff);
    let dir = artifacts::deploy_dir(&rt.workdir, &deploy_id);
    values::resolve(ctx, &eff, &deploy_id, &dir, &eff.targets).await?;

    phase(ctx, Phase::Fetching).await?;
    if !eff.dry_run {
        notify(rt, NotificationEvent::Started, &request, &deploy_id, None).await;
    }
    let local = if request.fast {
        // Fetched (and verified) only by a target that needs an upload.
        not_fetched(&eff, &artifacts::artifacts_dir(&dir))
    } else {
        fetch_all(ctx, &eff, &dir, rt).await?
    };

    let auth = ssh_auth(rt, &eff);
    let pool = ConnectionPool::with_warm(auth.clone(), rt.warm.clone());
    let records = rt.client.records();
    let pc = PassContext {
        eff: &eff,
        deploy_id: &deploy_id,
        local: &local,
        pool: &pool,
        auth: &auth,
        dir: &dir,
        sources: &rt.artifact_sources,
        http: rt.http.as_ref(),
        records: &records,
    };
    let waves = plan_waves(&eff);
    let region_routing = rt.config.dbos.region_routing;
    let mut outcomes: Vec<TargetOutcome> = Vec::new();
    let mut failure: Option<String> = None;
    // The waves that never started because an earlier one failed.
    let mut not_started = 0;
    // What the `once` tasks did before any target was switched (issue 39).
    let mut once = crate::tasks::BeforeAnySwitch::default();
    let mut measured = Vec::new(); // every measurement of `rollout.analysis` so far
    for (w, wave) in waves.iter().enumerate() {
        phase(
            ctx,
            Phase::Wave {
                number: w + 1,
                of: waves.len(),
                name: wave.name.clone(),
            },
        )
        .await?;
        if w == 0 {
            // The `once` tasks, before any target is switched (docs/environments.md).
            once = crate::tasks::before_any_switch(ctx, &BuiltInRelease { pass: &pc }).await?;
            if let Some(failed) = once.failed.clone() {
                let detail = failed.detail.clone().unwrap_or_default();
                failure = Some(format!("target {}: {detail}", failed.name));
                outcomes.push(failed);
                not_started = waves.len() - 1;
                break;
            }
        }
        let wave_outcomes = if region_routing {
            deploy_wave_by_region(ctx, plugin, &pc, &request.route.queue, wave).await?
        } else {
            plugin.deploy_pass(ctx, &pc, &wave.targets).await?
        };
        for outcome in wave_outcomes {
            failure = failure.or_else(|| target_failure(&outcome));
            outcomes.push(outcome);
        }
        if failure.is_none() {
            failure = bake_wave(ctx, rt, &pc, &request, &waves, w, &mut measured).await?;
        }
        if failure.is_some() {
            not_started = waves.len() - w - 1;
            break;
        }
        if let Some(pause) = eff.rollout.pause
            && w + 1 < waves.len()
        {
            pause_before_wave(ctx, &eff, pause, w + 2).await?;
        }
    }
    outcomes.sort_by(|a, b| a.name.cmp(&b.name));

    if let Some(reason) = failure {
        // Whether a target was switched back to the previous release (a rollback happened),
        // and why not when an irreversible deploy held it back.
        let (rolled_back, held) =
            if !eff.dry_run && eff.rollback.on_failure == OnFailure::ReactivatePrevious {
                roll_back_unless_held(ctx, rt, plugin, &pc, &request, &once, &outcomes).await?
            } else {
                (false, None)
            };
        if rolled_back {
            let why = Some(reason.clone());
            notify(rt, NotificationEvent::RolledBack, &request, &deploy_id, why).await;
        }
        phase(ctx, Phase::Done).await?;
        let mut message = format!("deploy failed: {reason}");
        if not_started > 0 {
            message.push_str(&if not_started == 1 {
                "; the next wave was not started".to_string()
            } else {
                format!("; the {not_started} later waves were not started")
            });
        }
        if let Some(why) = held {
            message.push_str(&format!("; {why}"));
        }
        return Err(WorkflowError::failed(message));
    }
    if !eff.dry_run {
        // Deploys waiting for this application/environment check again now.
        ctx.step("wake dependents", || async {
            gate::wake_dependents(&rt.client, &eff.application, &eff.environment).await
        })
        .await?;
    }
    phase(ctx, Phase::Done).await?;
    Ok(DeployResult { targets: outcomes })
}

/// Why the deploy fails when `outcome` is a failed target.
fn target_failure(outcome: &TargetOutcome) -> Option<String> {
    if outcome.status != crate::run::targets::TargetState::Failed {
        return None;
    }
    // A step's detail starts with the target's name (`web1: link shared: …`): said once.
    let detail = outcome.detail.as_deref().unwrap_or_default();
    let detail = detail
        .strip_prefix(&format!("{}: ", outcome.name))
        .unwrap_or(detail);
    Some(format!("target {}: {detail}", outcome.name))
}

/// The bake after wave `w` (0-based) under `rollout.analysis` (docs/analysis.md), but the
/// last, in a deploy started under [`crate::request::ANALYSIS_VERSION`] or later (a dry run
/// lists it instead): why the deploy fails, if it does.
async fn bake_wave(
    ctx: &WorkflowContext,
    rt: &Runtime,
    pc: &PassContext<'_>,
    request: &DeployRequest,
    waves: &[Wave],
    w: usize,
    measured: &mut Vec<crate::analysis::Measurement>,
) -> Result<Option<String>, WorkflowError> {
    let eff = pc.eff;
    let Some(analysis) = &eff.rollout.analysis else {
        return Ok(None);
    };
    if w + 1 >= waves.len() || ctx.workflow_version() < crate::request::ANALYSIS_VERSION {
        return Ok(None);
    }
    if eff.dry_run {
        // It bakes nothing; it says what the bake would do (docs/analysis.md).
        crate::analysis::plan::list_in_dry_run(ctx, eff, w + 1).await?;
        return Ok(None);
    }
    // The targets this deploy has not reached yet.
    let baseline: Vec<Target> = waves[w + 1..]
        .iter()
        .flat_map(|wave| wave.targets.iter().cloned())
        .collect();
    let bake = crate::analysis::Bake {
        client: &rt.client,
        config: &rt.config,
        request,
        deploy_id: pc.deploy_id,
        eff,
        pool: pc.pool,
        http: pc.http,
        wave: w + 1,
        targets: &waves[w].targets,
        baseline: &baseline,
    };
    Ok(
        match crate::analysis::bake(ctx, &bake, analysis, measured).await? {
            crate::analysis::Judged::Passed => None,
            crate::analysis::Judged::Failed(reason) => Some(reason),
        },
    )
}

/// `eff` as `request` asks it run: a fast rollback (version 4) in one wave, no pause,
/// targets that still hold the release reactivated in place; a reconcile (version 6) on
/// its drifted targets only (docs/plan-and-drift.md).
fn as_requested(
    ctx: &WorkflowContext,
    request: &DeployRequest,
    mut eff: EffectiveDescriptor,
) -> EffectiveDescriptor {
    if request.fast {
        eff.rollout.waves = manent_model::Waves::All;
        eff.rollout.pause = None;
        eff.reuse_releases = true;
    }
    if !request.only_targets.is_empty()
        && ctx.workflow_version() >= crate::request::MANIFEST_VERSION
    {
        eff.targets
            .retain(|t| request.only_targets.contains(&t.name));
        eff.remove_added = request.remove_added.clone();
    }
    eff
}

/// The effective descriptor of a request recorded without one: the environment file read
/// as the deploy starts (a durable step, so a replay reads the same).
async fn resolve_environment(
    ctx: &WorkflowContext,
    rt: &Runtime,
    request: &DeployRequest,
) -> Result<EffectiveDescriptor, WorkflowError> {
    let source = rt.config.environments_source();
    let descriptor = request.descriptor.clone();
    ctx.step_with(
        "resolve environment",
        StepPolicy::retry(5, Duration::from_secs(2)),
        || {
            let (source, descriptor) = (source.clone(), descriptor.clone());
            async move {
                // A file read and a parse: off the async threads.
                tokio::task::spawn_blocking(move || {
                    let env = manent_model::load_environment(
                        &source,
                        &descriptor.application,
                        &descriptor.environment,
                    )
                    .map_err(|e| e.to_string())?;
                    EffectiveDescriptor::build(&descriptor, &env).map_err(|e| e.to_string())
                })
                .await
                .map_err(|e| format!("reading the environment file: {e}"))?
            }
        },
    )
    .await
}

/// One wave under region routing: each region's targets deployed by a pass on
/// `<queue>.<region>`, run by a worker of that region (its network, its SSH); targets with
/// no region by this run.
async fn deploy_wave_by_region(
    ctx: &WorkflowContext,
    plugin: &dyn Plugin,
    pc: &PassContext<'_>,
    queue: &str,
    wave: &Wave,
) -> Result<Vec<TargetOutcome>, WorkflowError> {
    let mut children = Vec::new();
    let mut regionless = Vec::new();
    for (region, targets) in wave.passes() {
        match region {
            Some(region) => {
                let pass = PassRequest {
                    effective: pc.eff.clone(),
                    targets: targets.iter().map(|t| t.name.clone()).collect(),
                    mode: PassMode::Deploy,
                };
                children.push(start_pass(ctx, queue, &region, pass).await?);
            }
            None => regionless.extend(targets.into_iter().cloned()),
        }
    }
    let mut outcomes = plugin.deploy_pass(ctx, pc, &regionless).await?;
    outcomes.extend(await_passes(ctx, &children).await?);
    Ok(outcomes)
}

/// The rollout's pause before wave `next` (1-based): slept durably, or in a dry run
/// reported, not waited for (version 3, request.rs).
async fn pause_before_wave(
    ctx: &WorkflowContext,
    eff: &EffectiveDescriptor,
    pause: Duration,
    next: usize,
) -> Result<(), WorkflowError> {
    if eff.dry_run && ctx.workflow_version() >= crate::request::DRY_RUNS_DO_NOT_WAIT_VERSION {
        let what = format!(
            "a deploy would pause {} before wave {next}",
            humantime::format_duration(pause),
        );
        let output = ctx.output("dry run");
        ctx.step(&format!("dry run: pause before wave {next}"), || async {
            output.line("progress", &what);
            Ok::<_, String>(what.clone())
        })
        .await?;
    } else {
        phase(ctx, Phase::PauseBeforeWave(next)).await?;
        ctx.sleep(pause).await?;
    }
    Ok(())
}

/// Puts the targets this deploy switched back on the environment's previous successful
/// version (`rollback.on_failure: reactivate_previous`); under region routing each region's
/// by a pass of its own. Whether a target was switched back: something to return to, and a
/// target that had left it.
async fn roll_back(
    ctx: &WorkflowContext,
    rt: &Runtime,
    plugin: &dyn Plugin,
    pc: &PassContext<'_>,
    request: &DeployRequest,
    outcomes: &[TargetOutcome],
) -> Result<bool, WorkflowError> {
    let eff = pc.eff;
    phase(ctx, Phase::RollingBack).await?;
    let previous: Option<EffectiveDescriptor> = ctx
        .step("find previous version", || async {
            crate::history::previous_success(&rt.client, eff, pc.deploy_id).await
        })
        .await?;
    let switched: Vec<TargetOutcome> = outcomes.iter().filter(|o| o.switched).cloned().collect();
    // Something to return to, and a target that had left it.
    let rolled_back = previous.is_some() && !switched.is_empty();
    if rt.config.dbos.region_routing {
        let mut children = Vec::new();
        let mut regionless = Vec::new();
        for region in distinct_regions(eff, &switched) {
            let mine: Vec<TargetOutcome> = switched
                .iter()
                .filter(|o| target_region(eff, &o.name) == region)
                .cloned()
                .collect();
            match region {
                Some(region) => {
                    let pass = PassRequest {
                        effective: eff.clone(),
                        targets: mine.iter().map(|o| o.name.clone()).collect(),
                        mode: PassMode::Rollback {
                            previous: previous.clone().map(Box::new),
                            outcomes: mine,
                        },
                    };
                    children.push(start_pass(ctx, &request.route.queue, &region, pass).await?);
                }
                None => regionless = mine,
            }
        }
        plugin
            .rollback_pass(ctx, pc, previous.as_ref(), &regionless)
            .await?;
        await_passes(ctx, &children).await?;
    } else {
        plugin
            .rollback_pass(ctx, pc, previous.as_ref(), &switched)
            .await?;
    }
    Ok(rolled_back)
}

/// [`roll_back`], unless the deploy is irreversible and one of its `once` tasks succeeded
/// (docs/environments.md, "Irreversible deploys"): then the targets are left as they are,
/// each switched one says why, and so does the second value.
async fn roll_back_unless_held(
    ctx: &WorkflowContext,
    rt: &Runtime,
    plugin: &dyn Plugin,
    pc: &PassContext<'_>,
    request: &DeployRequest,
    once: &crate::tasks::BeforeAnySwitch,
    outcomes: &[TargetOutcome],
) -> Result<(bool, Option<String>), WorkflowError> {
    match crate::tasks::irreversible::held_back(pc.eff, once, outcomes) {
        Some(why) => {
            crate::tasks::irreversible::hold(ctx, outcomes, &why).await?;
            Ok((false, Some(why)))
        }
        None => Ok((
            roll_back(ctx, rt, plugin, pc, request, outcomes).await?,
            None,
        )),
    }
}

/// The plugin of the deploy; fails the workflow at once (no retries) when it is unknown or
/// does not run on this worker.
fn plugin_for<'r>(
    ctx: &WorkflowContext,
    rt: &'r Runtime,
    eff: &EffectiveDescriptor,
) -> Result<&'r dyn Plugin, WorkflowError> {
    // The container plugin is a room of its own, which `plugins` cannot name (it
    // implements their trait): found here, beside the registry.
    static CONTAINER: crate::containers::Container = crate::containers::Container;
    let found = if eff.plugin == manent_model::CONTAINER_PLUGIN {
        Some(&CONTAINER as &dyn Plugin)
    } else {
        rt.plugins.get(&eff.plugin)
    };
    let plugin = found.ok_or_else(|| {
        WorkflowError::failed(format!(
            "plugin `{}` is not available on worker `{}`: it is neither built in nor \
             configured under plugins",
            eff.plugin,
            ctx.executor_id()
        ))
    })?;
    if let Some(why) = plugin.unavailable() {
        return Err(WorkflowError::failed(format!(
            "{why} (this is worker `{}`)",
            ctx.executor_id()
        )));
    }
    Ok(plugin)
}

fn ssh_auth(rt: &Runtime, eff: &EffectiveDescriptor) -> SshAuth {
    ssh_auth_for(&rt.config, eff)
}

/// How this worker reaches `eff`'s targets: its key and known hosts, relative paths
/// against the environments source (a drift check reaches them the same way).
pub(crate) fn ssh_auth_for(config: &Config, eff: &EffectiveDescriptor) -> SshAuth {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"));
    let resolve = |p: &std::path::Path| {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            config.environments_source().join(p)
        }
    };
    let key = eff
        .ssh
        .key
        .as_deref()
        .map(resolve)
        .unwrap_or_else(|| home.join(".ssh/id_ed25519"));
    let known_hosts = eff
        .ssh
        .known_hosts
        .as_deref()
        .map(resolve)
        .unwrap_or_else(|| home.join(".ssh/known_hosts"));
    let mut auth = SshAuth::new(key, known_hosts);
    auth.strict_host_key_checking = eff.ssh.strict_host_key_checking;
    auth.verify = match eff.ssh.verify {
        manent_model::VerifyBy::Auto => manent_ssh::VerifyUploads::Auto,
        manent_model::VerifyBy::Sftp => manent_ssh::VerifyUploads::Sftp,
        manent_model::VerifyBy::Command => manent_ssh::VerifyUploads::Command,
    };
    auth
}

fn target_region(eff: &EffectiveDescriptor, name: &str) -> Option<String> {
    eff.targets
        .iter()
        .find(|t| t.name == name)
        .and_then(|t| t.region.clone())
}

fn distinct_regions(eff: &EffectiveDescriptor, outcomes: &[TargetOutcome]) -> Vec<Option<String>> {
    let mut regions: Vec<Option<String>> = Vec::new();
    for o in outcomes {
        let r = target_region(eff, &o.name);
        if !regions.contains(&r) {
            regions.push(r);
        }
    }
    regions
}

/// Fetches and verifies every artifact into the artifacts directory of `dir` (the deploy's
/// directory), one durable step each, from `rt`'s sources through its HTTP client.
async fn fetch_all(
    ctx: &WorkflowContext,
    eff: &EffectiveDescriptor,
    dir: &std::path::Path,
    rt: &Runtime,
) -> Result<Vec<LocalArtifact>, WorkflowError> {
    let (sources, http) = (&rt.artifact_sources, rt.http.as_ref());
    let dir = &artifacts::artifacts_dir(dir);
    let mut local = Vec::new();
    // An image pulled by `ref` is fetched by the target itself (docs/containers.md).
    for artifact in eff.artifacts.iter().filter(|a| a.reference.is_none()) {
        let fetched: LocalArtifact = ctx
            .step_retrying_if(
                &format!("fetch {}", artifact.name),
                StepPolicy::retry(3, Duration::from_secs(1)),
                artifacts::ArtifactError::is_transient,
                || async {
                    artifacts::ensure_local(artifact, &eff.application, dir, sources, http).await
                },
            )
            .await?;
        local.push(fetched);
    }
    Ok(local)
}

/// The deploy's artifacts where this worker would keep them, not fetched yet: each upload
/// step fetches and verifies what it needs (a fast rollback).
fn not_fetched(eff: &EffectiveDescriptor, dir: &std::path::Path) -> Vec<LocalArtifact> {
    eff.artifacts
        .iter()
        .map(|a| LocalArtifact {
            name: a.name.clone(),
            path: dir.join(&a.name),
            sha256: a.sha256.clone(),
            size: 0,
        })
        .collect()
}

/// Starts a region's pass on `<queue>.<region>`.
async fn start_pass(
    ctx: &WorkflowContext,
    queue: &str,
    region: &str,
    pass: PassRequest,
) -> Result<String, WorkflowError> {
    let partition = pass.effective.partition_key();
    ctx.start_child(
        PASS_WORKFLOW,
        &manent_model::region_queue(queue, region),
        Some(&partition),
        pass,
    )
    .await
}

/// Waits for the passes and republishes their targets' outcomes on the deploy.
async fn await_passes(
    ctx: &WorkflowContext,
    children: &[String],
) -> Result<Vec<TargetOutcome>, WorkflowError> {
    let mut all = Vec::new();
    for child in children {
        let pass: Vec<TargetOutcome> = ctx.await_workflow(child).await?;
        for outcome in &pass {
            publish(ctx, &EventKey::target(&outcome.name), outcome).await?;
        }
        all.extend(pass);
    }
    Ok(all)
}

/// The workflow of one region's pass under region routing.
pub const PASS_WORKFLOW: &str = "manent.deploy.pass";

/// What a region's pass does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PassRequest {
    pub effective: EffectiveDescriptor,
    pub targets: Vec<String>,
    pub mode: PassMode,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PassMode {
    Deploy,
    Rollback {
        previous: Option<Box<EffectiveDescriptor>>,
        outcomes: Vec<TargetOutcome>,
    },
}

/// A region's pass, run by a worker of that region: fetch, then deploy or
/// roll back its targets. The deploy's id names the working directory.
async fn pass(
    ctx: &WorkflowContext,
    rt: &Runtime,
    request: PassRequest,
) -> Result<Vec<TargetOutcome>, WorkflowError> {
    let eff = &request.effective;
    let deploy_id = ctx
        .workflow_id()
        .rsplit_once('.')
        .map_or(ctx.workflow_id(), |(parent, _)| parent)
        .to_string();
    let plugin = plugin_for(ctx, rt, eff)?;
    let auth = ssh_auth(rt, eff);
    let pool = ConnectionPool::with_warm(auth.clone(), rt.warm.clone());
    // The pass's own directory: it may run on the deploy's worker, whose directory the
    // deploy removes when it ends.
    let dir = artifacts::deploy_dir(&rt.workdir, ctx.workflow_id());
    let records = rt.client.records();
    let pc = PassContext {
        eff,
        deploy_id: &deploy_id,
        local: &[],
        pool: &pool,
        auth: &auth,
        dir: &dir,
        sources: &rt.artifact_sources,
        http: rt.http.as_ref(),
        records: &records,
    };
    match &request.mode {
        PassMode::Deploy => {
            let targets: Vec<Target> = eff
                .targets
                .iter()
                .filter(|t| request.targets.contains(&t.name))
                .cloned()
                .collect();
            values::resolve(ctx, eff, &deploy_id, &dir, &targets).await?;
            let local = fetch_all(ctx, eff, &dir, rt).await?;
            let pc = PassContext {
                local: &local,
                ..pc
            };
            plugin.deploy_pass(ctx, &pc, &targets).await
        }
        PassMode::Rollback { previous, outcomes } => {
            plugin
                .rollback_pass(ctx, &pc, previous.as_deref(), outcomes)
                .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_work_directory_is_absolute_even_when_configured_relative() {
        let config = Config::from_yaml_str(
            "worker: {workdir: work}\ndbos: {executor_id: w1}\n",
            "manent.yml",
            Vec::new(),
        )
        .expect("a valid configuration");
        assert!(
            config.worker_workdir().is_relative(),
            "the configuration says a relative directory (the case this guards)"
        );
        let dir = work_directory(&config);
        assert!(
            dir.is_absolute() && dir.ends_with("work/w1"),
            "the artifacts' paths given to commands are absolute: {}",
            dir.display()
        );
    }
}
