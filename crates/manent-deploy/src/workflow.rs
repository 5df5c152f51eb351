//! The deploy workflow: fetch and verify the artifacts, then wave by wave
//! deploy and check each target (`max_parallel` at a time), stop and roll back
//! on failure. Every line of work is a durable step: a deploy interrupted
//! anywhere resumes at the step where it stopped.

use std::{path::PathBuf, sync::Arc, time::Duration};

use futures::StreamExt;
use manent_config::Config;
use manent_engine::{Engine, EnqueueRequest, StepPolicy, WorkflowContext, WorkflowError};
use manent_model::{Descriptor, EffectiveDescriptor, OnFailure, Route, Target, plan_waves};
use manent_ssh::{ConnectionPool, SshAuth};
use serde::{Deserialize, Serialize};

use crate::{
    artifacts::{self, LocalArtifact},
    gate,
    targets::{self, TargetOutcome},
};

/// The workflow's registered name.
pub const DEPLOY_WORKFLOW: &str = "manent.deploy";

/// What a submission records: the request, with its route decided once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeployRequest {
    pub descriptor: Descriptor,
    /// Built at submission; `None` when the environment configuration could
    /// not be read then (it is built by the worker's first step).
    pub effective: Option<EffectiveDescriptor>,
    pub route: Route,
    pub submitted_by: String,
    pub submitted_at_ms: i64,
    /// Whether the deploy first waits on the gate queue (approval, dependencies),
    /// holding no deploy slot, before it moves to `route.queue`. Decided at submission.
    #[serde(default)]
    pub gated: bool,
}

impl DeployRequest {
    pub fn new(
        descriptor: Descriptor,
        effective: Option<EffectiveDescriptor>,
        route: Route,
        submitted_by: &str,
        submitted_at_ms: i64,
    ) -> Self {
        DeployRequest {
            gated: gate::needs_gate(effective.as_ref()),
            descriptor,
            effective,
            route,
            submitted_by: submitted_by.to_string(),
            submitted_at_ms,
        }
    }

    /// How this deploy is enqueued: on the gate queue when it must wait first,
    /// else on its route's queue; partitioned by `<application>/<environment>`.
    pub fn enqueue(&self) -> EnqueueRequest {
        let queue = if self.gated {
            gate::GATE_QUEUE
        } else {
            self.route.queue.as_str()
        };
        let partition =
            manent_model::partition_key(&self.descriptor.application, &self.descriptor.environment);
        EnqueueRequest::new(DEPLOY_WORKFLOW, queue, self).partition(partition)
    }
}

/// The final output of a successful deploy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeployResult {
    pub targets: Vec<TargetOutcome>,
}

/// What a worker needs to run deploys.
pub struct Runtime {
    pub config: Arc<Config>,
    pub client: manent_engine::Client,
    /// Where artifacts are kept on this worker (`MANENT_WORKDIR`).
    pub workdir: PathBuf,
}

impl Runtime {
    pub fn new(config: Arc<Config>, client: manent_engine::Client) -> Self {
        let workdir = std::env::var_os("MANENT_WORKDIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                std::env::temp_dir()
                    .join("manent-work")
                    .join(config.effective_executor_id())
            });
        Runtime {
            config,
            client,
            workdir,
        }
    }
}

/// Registers manent's workflows on a worker's engine, and the gate queue
/// every worker serves (deploys waiting for approval or dependencies).
pub fn register_workflows(engine: &Engine, config: &Config) {
    engine.listen(gate::gate_queue_spec());
    let runtime = Arc::new(Runtime::new(Arc::new(config.clone()), engine.client()));
    let runtime_for_deploys = runtime.clone();
    engine.register(
        DEPLOY_WORKFLOW,
        move |ctx: WorkflowContext, request: DeployRequest| {
            let runtime = runtime_for_deploys.clone();
            async move { deploy(&ctx, &runtime, request).await }
        },
    );
    let runtime_for_passes = runtime.clone();
    engine.register(
        PASS_WORKFLOW,
        move |ctx: WorkflowContext, request: PassRequest| {
            let runtime = runtime_for_passes.clone();
            async move { pass(&ctx, &runtime, request).await }
        },
    );
}

async fn phase(ctx: &WorkflowContext, phase: &str) -> Result<(), WorkflowError> {
    ctx.set_event("phase", &phase.to_string()).await
}

async fn deploy(
    ctx: &WorkflowContext,
    rt: &Runtime,
    request: DeployRequest,
) -> Result<DeployResult, WorkflowError> {
    let deploy_id = ctx.workflow_id().to_string();
    let eff: EffectiveDescriptor = match request.effective.clone() {
        Some(eff) => eff,
        None => {
            let source = rt.config.environments_source();
            let descriptor = request.descriptor.clone();
            ctx.step_with(
                "resolve environment",
                StepPolicy::retry(5, Duration::from_secs(2)),
                || {
                    let (source, descriptor) = (source.clone(), descriptor.clone());
                    async move {
                        let env = manent_model::load_environment(
                            &source,
                            &descriptor.application,
                            &descriptor.environment,
                        )
                        .map_err(|e| e.to_string())?;
                        EffectiveDescriptor::build(&descriptor, &env).map_err(|e| e.to_string())
                    }
                },
            )
            .await?
        }
    };
    if request.gated {
        // Approval and dependency waits, then the move to the route's queue: what
        // follows runs on a worker of that queue, under its limits.
        gate::pass_gate(ctx, &rt.client, &request, &eff).await?;
    }
    if eff.plugin != manent_model::DEFAULT_PLUGIN && eff.plugin != manent_model::COMMAND_PLUGIN {
        // A plugin this worker does not run (external plugins are served by their own pools).
        return Err(WorkflowError::failed(format!(
            "plugin `{}` is not available on worker `{}`; it runs only on the workers of its queue",
            eff.plugin,
            ctx.executor_id()
        )));
    }

    phase(ctx, "fetching").await?;
    let dir = artifacts::deploy_dir(&rt.workdir, &deploy_id);
    let local = fetch_all(ctx, &eff, &dir).await?;

    let pool = ConnectionPool::new(ssh_auth(rt, &eff));
    let waves = plan_waves(&eff);
    let region_routing = rt.config.dbos.region_routing;
    let mut outcomes: Vec<TargetOutcome> = Vec::new();
    let mut failure: Option<String> = None;
    for (w, wave) in waves.iter().enumerate() {
        phase(
            ctx,
            &format!("wave {}/{} ({})", w + 1, waves.len(), wave.name),
        )
        .await?;
        let mut wave_outcomes = Vec::new();
        if region_routing {
            // Each region's targets are deployed by a pass on `<queue>.<region>`,
            // run by a worker of that region (its network, its SSH).
            let mut children = Vec::new();
            let mut regionless = Vec::new();
            for (region, targets) in wave.passes() {
                match region {
                    Some(region) => {
                        let pass = PassRequest {
                            effective: eff.clone(),
                            targets: targets.iter().map(|t| t.name.clone()).collect(),
                            mode: PassMode::Deploy,
                        };
                        children.push(start_pass(ctx, &request.route.queue, &region, pass).await?);
                    }
                    None => regionless.extend(targets.into_iter().cloned()),
                }
            }
            wave_outcomes.extend(
                run_targets(ctx, &eff, &regionless, &local, &pool, &deploy_id, &dir).await?,
            );
            wave_outcomes.extend(await_passes(ctx, &children).await?);
        } else {
            wave_outcomes =
                run_targets(ctx, &eff, &wave.targets, &local, &pool, &deploy_id, &dir).await?;
        }
        for outcome in wave_outcomes {
            if outcome.status == "failed" && failure.is_none() {
                failure = Some(format!(
                    "target {}: {}",
                    outcome.name,
                    outcome.detail.clone().unwrap_or_default()
                ));
            }
            outcomes.push(outcome);
        }
        if failure.is_some() {
            break;
        }
        if let Some(pause) = eff.rollout.pause
            && w + 1 < waves.len()
        {
            phase(ctx, &format!("pause before wave {}", w + 2)).await?;
            ctx.sleep(pause).await?;
        }
    }
    outcomes.sort_by(|a, b| a.name.cmp(&b.name));

    if let Some(reason) = failure {
        if !eff.dry_run && eff.rollback.on_failure == OnFailure::ReactivatePrevious {
            phase(ctx, "rolling back").await?;
            let previous: Option<EffectiveDescriptor> = ctx
                .step("find previous version", || async {
                    crate::service::previous_success(rt, &eff, &deploy_id).await
                })
                .await?;
            let switched: Vec<TargetOutcome> =
                outcomes.iter().filter(|o| o.switched).cloned().collect();
            if region_routing {
                let mut children = Vec::new();
                let mut regionless = Vec::new();
                for region in distinct_regions(&eff, &switched) {
                    let mine: Vec<TargetOutcome> = switched
                        .iter()
                        .filter(|o| target_region(&eff, &o.name) == region)
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
                            children
                                .push(start_pass(ctx, &request.route.queue, &region, pass).await?);
                        }
                        None => regionless = mine,
                    }
                }
                roll_back(ctx, &eff, previous.as_ref(), &pool, &deploy_id, &regionless).await?;
                await_passes(ctx, &children).await?;
            } else {
                roll_back(ctx, &eff, previous.as_ref(), &pool, &deploy_id, &switched).await?;
            }
        }
        phase(ctx, "done").await?;
        return Err(WorkflowError::failed(format!(
            "deploy failed: {reason}; later waves were not started"
        )));
    }
    if !eff.dry_run {
        // Deploys waiting for this application/environment check again now.
        ctx.step("wake dependents", || async {
            gate::wake_dependents(&rt.client, &eff.application, &eff.environment).await
        })
        .await?;
    }
    phase(ctx, "done").await?;
    Ok(DeployResult { targets: outcomes })
}

fn ssh_auth(rt: &Runtime, eff: &EffectiveDescriptor) -> SshAuth {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"));
    let resolve = |p: &std::path::Path| {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            rt.config.environments_source().join(p)
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
    auth
}

/// Deploys one target in its own branch of the workflow and publishes its
/// outcome. A failed step is the target's failure; fencing, cancellation and
/// database errors stop the whole workflow.
async fn deploy_target(
    ctx: &WorkflowContext,
    eff: &EffectiveDescriptor,
    target: &Target,
    local: &[LocalArtifact],
    pool: &ConnectionPool,
    deploy_id: &str,
    dir: &std::path::Path,
) -> Result<TargetOutcome, WorkflowError> {
    let key = format!("target:{}", target.name);
    let name = &target.name;
    ctx.set_event(&key, &TargetOutcome::new(name, "deploying", None))
        .await?;
    let env = targets::command_env(eff, deploy_id, target, local);
    // Set once the new version is in place: a later failure (a check) leaves
    // the target switched, for the rollback.
    let mut switched = false;
    let result: Result<Vec<String>, WorkflowError> = async {
        if eff.dry_run {
            let lines: Vec<String> = ctx
                .step(&format!("{name}: plan"), || async {
                    let present = ensure_all(eff, dir).await?;
                    targets::plan(pool, eff, target, &present).await
                })
                .await?;
            return Ok(lines);
        }
        let mut lines = Vec::new();
        if eff.plugin == manent_model::COMMAND_PLUGIN {
            for (i, command) in eff.commands.iter().enumerate() {
                let out: String = ctx
                    .step(&format!("{name}: command {}", i + 1), || async {
                        targets::run(pool, eff, target, command, &env).await
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
        } else {
            for a in local {
                let remote: String = ctx
                    .step_with(
                        &format!("{name}: upload {}", a.name),
                        StepPolicy::retry(3, Duration::from_secs(1)).recording_start(),
                        || async {
                            // After a recovery on another machine the artifact may be missing here.
                            let present = ensure_all(eff, dir).await?;
                            let artifact = present
                                .iter()
                                .find(|p| p.name == a.name)
                                .ok_or("artifact vanished")?;
                            targets::upload(pool, eff, target, artifact).await
                        },
                    )
                    .await?;
                lines.push(format!("uploaded {remote}"));
            }
            if let Some(activate) = &eff.activate {
                ctx.step(&format!("{name}: activate"), || async {
                    targets::run(pool, eff, target, activate, &env).await
                })
                .await?;
                lines.push("activated".into());
            }
        }
        switched = true;
        // No intermediate "checking" event: the target stays "deploying" until its outcome
        // (one checkpoint less per target); a failed check's outcome says it was switched.
        for check in &eff.checks {
            let kind = check.kind_for(target);
            let policy = StepPolicy {
                backoff_factor: 1.0,
                ..StepPolicy::retry(check.retries + 1, check.interval)
            };
            let out: String = ctx
                .step_with(
                    &format!("{name}: check {}", check.label()),
                    policy,
                    || async {
                        targets::check_once(pool, eff, target, &kind, check.timeout, &env).await
                    },
                )
                .await?;
            lines.push(out);
        }
        Ok(lines)
    }
    .await;
    let outcome = match result {
        Ok(lines) => TargetOutcome {
            switched,
            ..TargetOutcome::new(
                name,
                if eff.dry_run { "planned" } else { "deployed" },
                Some(lines.join("; ")),
            )
        },
        Err(WorkflowError::Step {
            name: step,
            message,
        }) => TargetOutcome {
            switched,
            ..TargetOutcome::new(name, "failed", Some(format!("{step}: {message}")))
        },
        Err(other) => return Err(other),
    };
    ctx.set_event(&key, &outcome).await?;
    Ok(outcome)
}

async fn ensure_all(
    eff: &EffectiveDescriptor,
    dir: &std::path::Path,
) -> Result<Vec<LocalArtifact>, String> {
    let mut out = Vec::new();
    for a in &eff.artifacts {
        out.push(artifacts::ensure_local(a, dir).await?);
    }
    Ok(out)
}

/// Re-activates the previous version on the targets this deploy switched.
async fn roll_back(
    ctx: &WorkflowContext,
    eff: &EffectiveDescriptor,
    previous: Option<&EffectiveDescriptor>,
    pool: &ConnectionPool,
    deploy_id: &str,
    switched: &[TargetOutcome],
) -> Result<Vec<TargetOutcome>, WorkflowError> {
    let mut rolled_back = Vec::new();
    for outcome in switched {
        let Some(target) = eff.targets.iter().find(|t| t.name == outcome.name) else {
            continue;
        };
        let key = format!("target:{}", target.name);
        let detail = match previous.and_then(|p| p.activate.as_ref().map(|a| (p, a))) {
            None => "no previous version to re-activate".to_string(),
            Some((prev, activate)) => {
                let env = targets::command_env(prev, deploy_id, target, &[]);
                let step = ctx
                    .step(
                        &format!("{}: reactivate {}", target.name, prev.version),
                        || async { targets::run(pool, prev, target, activate, &env).await },
                    )
                    .await;
                match step {
                    Ok(_) => format!("re-activated {}", prev.version),
                    Err(WorkflowError::Step { message, .. }) => {
                        format!("rollback failed: {message}")
                    }
                    Err(other) => return Err(other),
                }
            }
        };
        let rolled = TargetOutcome {
            detail: Some(format!(
                "{}; {detail}",
                outcome.detail.clone().unwrap_or_default()
            )),
            switched: false,
            ..TargetOutcome::new(&target.name, "rolled_back", None)
        };
        ctx.set_event(&key, &rolled).await?;
        rolled_back.push(rolled);
    }
    Ok(rolled_back)
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

/// Fetches and verifies every artifact into `dir`, one durable step each.
async fn fetch_all(
    ctx: &WorkflowContext,
    eff: &EffectiveDescriptor,
    dir: &std::path::Path,
) -> Result<Vec<LocalArtifact>, WorkflowError> {
    let mut local = Vec::new();
    for artifact in &eff.artifacts {
        let fetched: LocalArtifact = ctx
            .step_with(
                &format!("fetch {}", artifact.name),
                StepPolicy::retry(3, Duration::from_secs(1)),
                || async { artifacts::ensure_local(artifact, dir).await },
            )
            .await?;
        local.push(fetched);
    }
    Ok(local)
}

/// Deploys `targets`, `max_parallel` at a time, each in a branch of its own.
async fn run_targets(
    ctx: &WorkflowContext,
    eff: &EffectiveDescriptor,
    targets: &[Target],
    local: &[LocalArtifact],
    pool: &ConnectionPool,
    deploy_id: &str,
    dir: &std::path::Path,
) -> Result<Vec<TargetOutcome>, WorkflowError> {
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    let branches = ctx.branches(targets.len());
    let max_parallel = eff.rollout.max_parallel.max(1) as usize;
    // Futures built in a plain loop (not a closure) keep the workflow future Send.
    let mut pending = Vec::new();
    for (b, target) in branches.into_iter().zip(targets) {
        pending
            .push(async move { deploy_target(&b, eff, target, local, pool, deploy_id, dir).await });
    }
    let results: Vec<Result<TargetOutcome, WorkflowError>> = futures::stream::iter(pending)
        .buffer_unordered(max_parallel)
        .collect()
        .await;
    results.into_iter().collect()
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
            ctx.set_event(&format!("target:{}", outcome.name), outcome)
                .await?;
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
    let pool = ConnectionPool::new(ssh_auth(rt, eff));
    match &request.mode {
        PassMode::Deploy => {
            let dir = artifacts::deploy_dir(&rt.workdir, &deploy_id);
            let local = fetch_all(ctx, eff, &dir).await?;
            let targets: Vec<Target> = eff
                .targets
                .iter()
                .filter(|t| request.targets.contains(&t.name))
                .cloned()
                .collect();
            run_targets(ctx, eff, &targets, &local, &pool, &deploy_id, &dir).await
        }
        PassMode::Rollback { previous, outcomes } => {
            roll_back(ctx, eff, previous.as_deref(), &pool, &deploy_id, outcomes).await
        }
    }
}
