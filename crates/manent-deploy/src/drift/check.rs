//! The workflow `manent.drift`: the environment read (the live deploy's descriptor over
//! the environment file as it is now: its targets, how to reach them, `drift.ignore`), each
//! target compared in a step `<target>: drift` of its own, `rollout.max_parallel` at a time,
//! then the result recorded for the environment and `drift_detected` told of differences
//! no earlier check reported (docs/plan-and-drift.md, "Drift").

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use manent_config::{Config, NotificationEvent};
use manent_engine::{Client, Engine, StepPolicy, WorkflowContext, WorkflowError};
use manent_model::{DriftSettings, EffectiveDescriptor, Target};
use manent_ssh::{ConnectionPool, WarmConnections};
use serde::{Deserialize, Serialize};

use super::{
    DRIFT_KIND, DRIFT_WORKFLOW, DriftReport, DriftRequest, DriftState, TargetDrift, compare, key,
};
use crate::manifests;
use crate::run::targets::TargetError;

/// What a worker needs to run drift checks.
struct DriftRuntime {
    config: Arc<Config>,
    client: Client,
    warm: Arc<WarmConnections>,
}

/// Registers the drift check on a worker's engine (beside `register_workflows`).
pub fn register(engine: &Engine, config: &Config) {
    let runtime = Arc::new(DriftRuntime {
        config: Arc::new(config.clone()),
        client: engine.client(),
        warm: WarmConnections::new(config.worker.ssh_keep_warm),
    });
    engine.register(
        DRIFT_WORKFLOW,
        move |ctx: WorkflowContext, request: DriftRequest| {
            let runtime = runtime.clone();
            async move { check(&ctx, &runtime, request).await }
        },
    );
}

/// What a check works from, read once (a durable step: a replay compares the same).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Setup {
    eff: EffectiveDescriptor,
    settings: DriftSettings,
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

async fn check(
    ctx: &WorkflowContext,
    rt: &DriftRuntime,
    request: DriftRequest,
) -> Result<DriftReport, WorkflowError> {
    let setup: Setup = ctx
        .step_with(
            "read environment",
            StepPolicy::retry(3, Duration::from_secs(1)),
            || setup(rt, &request),
        )
        .await?;
    let eff = &setup.eff;
    let partition = format!(
        "drift:{}",
        manent_model::partition_key(&request.application, &request.environment)
    );
    let mut here: Vec<&Target> = Vec::new();
    let mut passes = Vec::new();
    if !request.only_targets.is_empty() {
        // A region's pass: its targets only, the check that started it records.
        here.extend(
            eff.targets
                .iter()
                .filter(|t| request.only_targets.contains(&t.name)),
        );
    } else {
        // Under region routing each region's targets are reached from that region, by a
        // worker serving `<queue>.<region>`, as a deploy's passes are.
        let mut regions: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
        for target in &eff.targets {
            match target.region.as_deref() {
                Some(region) if rt.config.dbos.region_routing && !request.queue.is_empty() => {
                    regions.entry(region).or_default().push(target.name.clone())
                }
                _ => here.push(target),
            }
        }
        for (region, names) in regions {
            let pass = DriftRequest {
                only_targets: names,
                ..request.clone()
            };
            let queue = manent_model::region_queue(&request.queue, region);
            passes.push(
                ctx.start_child(DRIFT_WORKFLOW, &queue, Some(&partition), pass)
                    .await?,
            );
        }
    }
    let mut targets = compare_here(ctx, rt, &setup, &here).await?;
    for pass in &passes {
        let report: DriftReport = ctx.await_workflow(pass).await?;
        targets.extend(report.targets);
    }
    // In the environment file's order, whichever worker checked them.
    targets.sort_by_key(|t| eff.targets.iter().position(|e| e.name == t.name));
    let report = DriftReport {
        application: request.application.clone(),
        environment: request.environment.clone(),
        check_id: ctx.workflow_id().to_string(),
        checked_at_ms: now_ms(),
        targets,
    };
    if request.only_targets.is_empty() {
        ctx.step("record result", || record(rt, &report)).await?;
    }
    Ok(report)
}

/// `targets` compared by this worker, each in a step `<target>: drift` of its own,
/// `rollout.max_parallel` at a time.
async fn compare_here(
    ctx: &WorkflowContext,
    rt: &DriftRuntime,
    setup: &Setup,
    targets: &[&Target],
) -> Result<Vec<TargetDrift>, WorkflowError> {
    let eff = &setup.eff;
    let auth = crate::workflow::ssh_auth_for(&rt.config, eff);
    let pool = ConnectionPool::with_warm(auth, rt.warm.clone());
    let records = rt.client.records();
    let branches = ctx.branches(targets.len());
    let mut pending = Vec::new();
    for (b, target) in branches.into_iter().zip(targets.iter().copied()) {
        let (pool, records, settings) = (&pool, &records, &setup.settings);
        pending.push(async move {
            b.step(&format!("{}: drift", target.name), || async {
                Ok::<_, String>(one_target(pool, records, eff, settings, target).await)
            })
            .await
        });
    }
    let max_parallel = eff.rollout.max_parallel.max(1) as usize;
    let results: Vec<Result<TargetDrift, WorkflowError>> = futures::stream::iter(pending)
        .buffered(max_parallel)
        .collect()
        .await;
    results.into_iter().collect()
}

/// The live deploy's descriptor over the environment file as it is now.
async fn setup(rt: &DriftRuntime, request: &DriftRequest) -> Result<Setup, String> {
    let (application, environment) = (&request.application, &request.environment);
    let (_, live) = crate::history::last_success(&rt.client, application, environment, None)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("nothing deployed to {application} {environment} yet"))?;
    let source = rt.config.environments_source();
    let descriptor = live.descriptor.clone();
    tokio::task::spawn_blocking(move || {
        let env = manent_model::load_environment(
            &source,
            &descriptor.application,
            &descriptor.environment,
        )
        .map_err(|e| e.to_string())?;
        let eff = EffectiveDescriptor::build(&descriptor, &env).map_err(|e| e.to_string())?;
        Ok(Setup {
            eff,
            settings: env.drift.unwrap_or_default(),
        })
    })
    .await
    .map_err(|e| format!("reading the environment file: {e}"))?
}

/// One target compared with its manifest; never an error: a target manent cannot reach
/// is `unreachable`, one without a manifest `unknown`.
async fn one_target(
    pool: &ConnectionPool,
    records: &manent_engine::Records,
    eff: &EffectiveDescriptor,
    settings: &DriftSettings,
    target: &Target,
) -> TargetDrift {
    let outcome = |state, detail: String| TargetDrift {
        name: target.name.clone(),
        state,
        differences: Vec::new(),
        detail: Some(detail),
        version: None,
    };
    let manifest =
        match manifests::read(records, &eff.application, &eff.environment, &target.name).await {
            Ok(Some(manifest)) => manifest,
            Ok(None) => {
                return outcome(
                    DriftState::Unknown,
                    "no release recorded here yet: the next deploy records one".into(),
                );
            }
            Err(e) => return outcome(DriftState::Unknown, e.to_string()),
        };
    if let Some(recorded) = &manifest.container {
        return containers(pool, eff, target, &manifest, recorded).await;
    }
    if let Some(n) = manifest.snapshot.too_many_files {
        return TargetDrift {
            version: Some(manifest.version.clone()),
            ..outcome(
                DriftState::Unknown,
                format!(
                    "the release holds {n} files, more than the {} a manifest lists",
                    manifests::MAX_FILES
                ),
            )
        };
    }
    let mut live_links: Vec<String> = manifest.snapshot.live_links.keys().cloned().collect();
    for path in manifests::live_link_paths(eff, target) {
        if !live_links.contains(&path) {
            live_links.push(path);
        }
    }
    let now = match manifests::record::snapshot(pool, eff, target, &manifest.release, &live_links)
        .await
    {
        Ok(now) => now,
        Err(e @ (TargetError::Connect { .. } | TargetError::Transport(_))) => {
            return outcome(DriftState::Unreachable, e.to_string());
        }
        Err(e) => return outcome(DriftState::Unreachable, e.to_string()),
    };
    let differences = compare::differences(&manifest, &now, settings);
    TargetDrift {
        name: target.name.clone(),
        state: if differences.is_empty() {
            DriftState::InSync
        } else {
            DriftState::Drifted
        },
        differences,
        detail: None,
        version: Some(manifest.version),
    }
}

/// A container target against the container its manifest records
/// (`containers::manifest`, docs/containers.md "Drift").
async fn containers(
    pool: &ConnectionPool,
    eff: &EffectiveDescriptor,
    target: &Target,
    manifest: &manifests::Manifest,
    recorded: &manent_model::RunningContainer,
) -> TargetDrift {
    let (state, differences, detail) =
        match crate::containers::manifest::drift(pool, eff, target, recorded).await {
            Ok(found) if found.is_empty() => (DriftState::InSync, Vec::new(), None),
            Ok(found) => (
                DriftState::Drifted,
                found
                    .into_iter()
                    .map(|m| compare::Difference {
                        path: m.what,
                        expected: m.expected,
                        found: m.found,
                    })
                    .collect(),
                None,
            ),
            Err(e) => (DriftState::Unreachable, Vec::new(), Some(e.to_string())),
        };
    TargetDrift {
        name: target.name.clone(),
        state,
        differences,
        detail,
        version: Some(manifest.version.clone()),
    }
}

/// Records `report` as the environment's drift, and tells `drift_detected` of each
/// difference the previous result did not have (once per new difference, not per check).
async fn record(rt: &DriftRuntime, report: &DriftReport) -> Result<(), String> {
    let previous = super::last(&rt.client, &report.application, &report.environment)
        .await
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "the previous drift result cannot be read; every difference counts as new");
            None
        });
    let seen = |target: &str, d: &compare::Difference| {
        previous.as_ref().is_some_and(|p| {
            p.targets
                .iter()
                .any(|t| t.name == target && t.differences.contains(d))
        })
    };
    let new: Vec<String> = report
        .targets
        .iter()
        .flat_map(|t| {
            t.differences
                .iter()
                .filter(|d| !seen(&t.name, d))
                .map(|d| format!("{}: {}", t.name, d.path))
        })
        .collect();
    let text = serde_json::to_string(report).map_err(|e| e.to_string())?;
    rt.client
        .records()
        .put(
            DRIFT_KIND,
            &key(&report.application, &report.environment),
            &text,
            now_ms(),
        )
        .await
        .map_err(|e| e.to_string())?;
    if !new.is_empty() {
        let shown: Vec<&str> = new.iter().take(10).map(String::as_str).collect();
        let more = new.len().saturating_sub(shown.len());
        let facts = crate::notifications::Facts {
            deploy_id: report.check_id.clone(),
            application: report.application.clone(),
            environment: report.environment.clone(),
            version: report
                .targets
                .iter()
                .find_map(|t| t.version.clone())
                .unwrap_or_default(),
            submitted_by: "drift check".into(),
            error: Some(format!(
                "{} new difference(s): {}{}",
                new.len(),
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            )),
        };
        crate::notifications::record(
            &rt.client,
            &rt.config,
            NotificationEvent::DriftDetected,
            &facts,
        )
        .await;
    }
    Ok(())
}
