//! What a deploy waits for before it takes a deploy slot: approvals and
//! dependencies. A deploy that must wait is enqueued on the gate queue (no
//! limits, served by every worker, exclusive ones too), waits there durably,
//! then moves to the queue of its recorded route, where the claim counts it
//! against that queue's limits. While it waits it holds no deploy slot.
//!
//! A scheduled deploy (a cron tick, a `schedule.at` start) is also authorised again here
//! when it fires ([`reauthorise`]): its token, and the environment's policy as it is then.

use std::{collections::HashMap, time::Duration};

use manent_config::Config;
use manent_engine::{
    Client, EngineError, QueueSpec, StepPolicy, StepRecord, StepStatus, WorkflowContext,
    WorkflowError, now_ms,
};
use manent_model::{
    Approval, Dependency, Descriptor, EffectiveDescriptor, load_environment, missing_environment,
};
use serde::{Deserialize, Serialize};

use crate::authority::{Authority, Verdict};

pub use crate::request::{APPROVAL_TOPIC, Decision, GATE_QUEUE, needs_gate};
use crate::request::{
    DeployRequest, EventKey, Phase, Submitter, approval_required, publish, same_token,
};

/// The first dependency on another tenant's environment that does not list `descriptor`'s
/// application under `dependents:` (docs/environments.md, "Dependencies across tenants"),
/// as `(field, message)`. The message is the same whether the other environment is missing,
/// invalid or does not allow it: it tells nothing of another tenant's configuration.
/// Checked at submission and again at every tick of a schedule.
pub(crate) fn unadmitted_cross_tenant_dependency(
    source: &std::path::Path,
    descriptor: &Descriptor,
    dependencies: &[Dependency],
) -> Option<(String, String)> {
    let application = descriptor.application.as_str();
    let unadmitted = dependencies.iter().find(|dependency| {
        manent_model::tenant_of(&dependency.application) != manent_model::tenant_of(application)
            && !load_environment(source, &dependency.application, &dependency.environment)
                .is_ok_and(|env| env.admits_dependent(&dependency.application, application))
    })?;
    let position = descriptor.depends_on.iter().position(|d| {
        d.application == unadmitted.application && d.environment == unadmitted.environment
    });
    let (field, whose) = match position {
        Some(i) => (format!("depends_on[{i}]"), ""),
        None => ("depends_on".to_string(), " (from the environment file)"),
    };
    let message = format!(
        "{field}{whose}: {}/{} is another tenant's environment, which does not list \
         {application} under `dependents:`; a deploy may depend on another tenant's \
         environment only where that environment allows it: ask its operator, or remove this \
         dependency",
        unadmitted.application, unadmitted.environment
    );
    Some((field, message))
}

/// The gate queue as every worker serves it: no limit that a waiting deploy could exhaust.
pub fn gate_queue_spec() -> QueueSpec {
    QueueSpec::new(GATE_QUEUE)
        .kind("gate")
        .worker_concurrency(100_000)
}

/// Message topic that nudges a deploy waiting for a dependency.
const DEPENDENCY_TOPIC: &str = "dependency";
/// Record kind: `<application>/<environment>/<waiting deploy id>` of a dependency wait.
const DEPENDENCY_WAITER_KIND: &str = "dependency-waiter";

/// A "forever" that still fits the engine's millisecond deadlines.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Runs the waits of a gated deploy, then moves it to its route's queue.
/// On replay (on the route's worker) every wait returns its record at once. `http` fetches
/// the artifacts an approval plan lists the files of.
pub async fn pass_gate(
    ctx: &WorkflowContext,
    client: &Client,
    config: &manent_config::Config,
    http: &dyn crate::http::HttpFetch,
    request: &DeployRequest,
    eff: &EffectiveDescriptor,
) -> Result<(), WorkflowError> {
    if let Some(policy) = approval_required(eff) {
        wait_for_approval(ctx, client, config, http, request, eff, policy).await?;
    }
    for dep in &eff.depends_on {
        if eff.dry_run && ctx.workflow_version() >= crate::request::DRY_RUNS_DO_NOT_WAIT_VERSION {
            report_dependency(ctx, client, dep).await?;
        } else {
            wait_for_dependency(ctx, client, dep).await?;
        }
    }
    publish(ctx, &EventKey::Waiting, &String::new()).await?;
    publish(ctx, &EventKey::Phase, &Phase::Queued).await?;
    ctx.move_to_queue(&request.route.queue, &eff.partition_key())
        .await
}

fn approvers_text(policy: &Approval) -> String {
    if policy.approvers.is_empty() {
        "anyone with the approver role".into()
    } else {
        policy.approvers.join(", ")
    }
}

async fn wait_for_approval(
    ctx: &WorkflowContext,
    client: &Client,
    config: &manent_config::Config,
    http: &dyn crate::http::HttpFetch,
    request: &DeployRequest,
    eff: &EffectiveDescriptor,
    policy: &Approval,
) -> Result<(), WorkflowError> {
    publish(ctx, &EventKey::ApprovalPolicy, policy).await?;
    // What approvers are shown (version 6): computed once, reaching no target.
    let records = client.records();
    let workdir = super::work_directory(config);
    crate::plan::approval::record_step(ctx, config, http, &records, eff, &workdir).await?;
    // The deadline is recorded once, so every replay and every worker agrees on it.
    let timeout = policy.timeout;
    let deadline: Option<i64> = ctx
        .step("approval deadline", || async move {
            Ok::<_, String>(timeout.map(|t| now_ms() + duration_ms(t)))
        })
        .await?;
    let mut approvals: Vec<Decision> = Vec::new();
    while approvals.len() < policy.count as usize {
        publish(
            ctx,
            &EventKey::Waiting,
            &format!(
                "approval: {} of {} (approvers: {}{})",
                approvals.len(),
                policy.count,
                approvers_text(policy),
                deadline.map_or(String::new(), |d| format!(
                    "; expires at {}",
                    crate::request::rfc3339(d)
                ))
            ),
        )
        .await?;
        if approvals.is_empty() {
            // After `waiting_for`, so a reader never sees the phase without its reason.
            publish(ctx, &EventKey::Phase, &Phase::WaitingApproval).await?;
            // Approvers are told (recorded once: a replay finds the event's key).
            crate::notifications::record(
                client,
                config,
                manent_config::NotificationEvent::ApprovalRequired,
                &crate::notifications::Facts::of(request, ctx.workflow_id()),
            )
            .await;
        }
        let left = deadline.map_or(FOREVER, |d| {
            Duration::from_millis(u64::try_from(d - now_ms()).unwrap_or(0))
        });
        let decision: Option<Decision> = ctx.recv(APPROVAL_TOPIC, left).await?;
        let Some(decision) = decision else {
            return Err(WorkflowError::failed(format!(
                "approval expired after {}: {} of {} approvals (approvers: {}); submit the deploy again",
                humantime::format_duration(timeout.unwrap_or_default()),
                approvals.len(),
                policy.count,
                approvers_text(policy)
            )));
        };
        if !decision.approve {
            let reason = decision
                .reason
                .clone()
                .unwrap_or_else(|| "no reason given".into());
            approvals.push(decision.clone());
            publish(ctx, &EventKey::Approvals, &approvals).await?;
            return Err(WorkflowError::failed(format!(
                "rejected by {}: {reason}",
                decision.by
            )));
        }
        // The API refuses ineligible approvers. One approver counts once: one token id
        // once, and one name once (a name revoked and created again is another token,
        // yet it does not count twice). The submitter is known by its token id.
        let counted = approvals
            .iter()
            .any(|a| a.by == decision.by || (!a.by_id.is_empty() && a.by_id == decision.by_id));
        let own = same_token(
            (&decision.by, &decision.by_id),
            (&request.submitted_by, &request.submitted_by_id),
        );
        if counted || (own && !policy.allow_self_approval) {
            continue;
        }
        approvals.push(decision);
        publish(ctx, &EventKey::Approvals, &approvals).await?;
    }
    Ok(())
}

/// What a dependency check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum DependencyState {
    Met,
    NotYet,
    Expired,
}

fn dependency_label(dep: &Dependency) -> String {
    match &dep.version {
        Some(v) => format!("{}/{} at version {v}", dep.application, dep.environment),
        None => format!("{}/{}", dep.application, dep.environment),
    }
}

/// A dry run's dependency: whether it is met now, and what a real deploy would wait for,
/// recorded as one step's result (shown in `status`, `logs` and the page). It never waits.
async fn report_dependency(
    ctx: &WorkflowContext,
    client: &Client,
    dep: &Dependency,
) -> Result<(), WorkflowError> {
    let label = dependency_label(dep);
    let timeout = dep.timeout;
    let output = ctx.output("dry run");
    ctx.step_with(
        &format!("dry run: dependency {label}"),
        StepPolicy::retry(5, Duration::from_secs(1)),
        || async {
            let said = if dependency_met(client, dep).await? {
                format!("dependency {label}: met")
            } else {
                format!(
                    "dependency {label}: not met: a deploy would wait {} for a successful \
                     deploy of it",
                    timeout.map_or("without a limit".to_string(), |t| format!(
                        "up to {}",
                        humantime::format_duration(t)
                    ))
                )
            };
            // Shown by `logs` and the page beside the step.
            output.line("progress", &said);
            Ok::<_, EngineError>(said)
        },
    )
    .await?;
    Ok(())
}

async fn wait_for_dependency(
    ctx: &WorkflowContext,
    client: &Client,
    dep: &Dependency,
) -> Result<(), WorkflowError> {
    let label = dependency_label(dep);
    publish(
        ctx,
        &EventKey::Waiting,
        &format!("dependency: a successful deploy of {label}"),
    )
    .await?;
    publish(ctx, &EventKey::Phase, &Phase::WaitingDependency).await?;
    let timeout = dep.timeout;
    let deadline: Option<i64> = ctx
        .step(&format!("dependency deadline {label}"), || async move {
            Ok::<_, String>(timeout.map(|t| now_ms() + duration_ms(t)))
        })
        .await?;
    let waiter_key = format!(
        "{}/{}/{}",
        dep.application,
        dep.environment,
        ctx.workflow_id()
    );
    ctx.step(&format!("watch {label}"), || async {
        client
            .records()
            .put(DEPENDENCY_WAITER_KIND, &waiter_key, "{}", now_ms())
            .await
    })
    .await?;
    let mut backoff = Duration::from_millis(500);
    loop {
        // Met / not yet / expired is decided inside the step, so a replay after the
        // deadline still follows the recorded path.
        let state: DependencyState = ctx
            .step_with(
                &format!("{CHECK_STEP}{label}"),
                StepPolicy::retry(5, Duration::from_secs(1)),
                || async {
                    if dependency_met(client, dep).await? {
                        Ok::<_, EngineError>(DependencyState::Met)
                    } else if deadline.is_some_and(|d| now_ms() >= d) {
                        Ok(DependencyState::Expired)
                    } else {
                        Ok(DependencyState::NotYet)
                    }
                },
            )
            .await?;
        match state {
            DependencyState::Met => break,
            DependencyState::Expired => {
                return Err(WorkflowError::failed(format!(
                    "dependency not met: no successful deploy of {label} within {}",
                    humantime::format_duration(timeout.unwrap_or_default())
                )));
            }
            DependencyState::NotYet => {}
        }
        let left = deadline.map_or(FOREVER, |d| {
            Duration::from_millis(u64::try_from(d - now_ms()).unwrap_or(0))
        });
        // A successful deploy of the dependency nudges its waiters; the growing
        // timeout is only the fallback for a nudge that was missed.
        let nudged: Option<serde_json::Value> =
            ctx.recv(DEPENDENCY_TOPIC, backoff.min(left)).await?;
        backoff = if nudged.is_some() {
            Duration::from_millis(500)
        } else {
            (backoff * 2).min(Duration::from_secs(60))
        };
    }
    ctx.step(&format!("unwatch {label}"), || async {
        client
            .records()
            .delete(DEPENDENCY_WAITER_KIND, &waiter_key)
            .await
            .map(|_| ())
    })
    .await?;
    Ok(())
}

/// The name of the step that checks a dependency once, followed by its label.
const CHECK_STEP: &str = "check ";

/// `steps` as people read them: the checks of each dependency a deploy waited for (one
/// durable step per check, so a replay follows the recorded path) shown as one step,
/// `wait for <dependency>`: started with the first check, running while the last said
/// "not yet", a success once one found it met (ended then), an error if the wait ran out.
/// Its attempts are the checks made.
pub(crate) fn dependency_waits_as_one(steps: Vec<StepRecord>) -> Vec<StepRecord> {
    let mut out: Vec<StepRecord> = Vec::with_capacity(steps.len());
    // Where each dependency's merged step is in `out`.
    let mut merged: HashMap<String, usize> = HashMap::new();
    for step in steps {
        let Some(label) = step.name.strip_prefix(CHECK_STEP) else {
            out.push(step);
            continue;
        };
        let found: Option<DependencyState> = step
            .output
            .as_deref()
            .and_then(|o| serde_json::from_str(o).ok());
        let (status, finished_at_ms, error) = match (step.status, found) {
            (StepStatus::Success, Some(DependencyState::Met)) => {
                (StepStatus::Success, step.finished_at_ms, None)
            }
            (StepStatus::Success, Some(DependencyState::Expired)) => (
                StepStatus::Error,
                step.finished_at_ms,
                Some(format!("no successful deploy of {label} in time")),
            ),
            (StepStatus::Error, _) => (StepStatus::Error, step.finished_at_ms, step.error.clone()),
            // Not met yet, or a check under way: still waiting.
            _ => (StepStatus::Running, None, None),
        };
        match merged.get(label) {
            Some(&at) => {
                let wait = &mut out[at];
                wait.status = status;
                wait.finished_at_ms = finished_at_ms;
                wait.error = error;
                wait.attempts += 1;
                wait.executor_id = step.executor_id;
            }
            None => {
                merged.insert(label.to_string(), out.len());
                out.push(StepRecord {
                    name: format!("wait for {label}"),
                    status,
                    finished_at_ms,
                    error,
                    attempts: 1,
                    output: None,
                    ..step
                });
            }
        }
    }
    out
}

/// Whether `dep` is met: the latest successful (not dry-run) deploy of its
/// application and environment exists and, if a version is named, runs that version.
pub async fn dependency_met(client: &Client, dep: &Dependency) -> Result<bool, EngineError> {
    let latest = crate::history::last_success(client, &dep.application, &dep.environment, None)
        .await?
        .map(|(_, r)| r);
    Ok(match (latest, &dep.version) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(r), Some(version)) => r.descriptor.artifacts.iter().any(|a| &a.version == version),
    })
}

/// Nudges the deploys waiting for `application/environment` after a success.
pub async fn wake_dependents(
    client: &Client,
    application: &str,
    environment: &str,
) -> Result<usize, EngineError> {
    let prefix = format!("{application}/{environment}/");
    let waiters = client.records().list(DEPENDENCY_WAITER_KIND).await?;
    let mut woken = 0;
    for (key, _) in waiters {
        if let Some(waiting_deploy) = key.strip_prefix(&prefix) {
            // A waiter that is gone (finished, deleted) is no reason to fail this deploy.
            if client
                .send(waiting_deploy, DEPENDENCY_TOPIC, &now_ms())
                .await
                .is_ok()
            {
                woken += 1;
            }
        }
    }
    Ok(woken)
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

/// What a scheduled deploy's check when it fires found.
#[derive(Debug, Clone, PartialEq)]
pub enum Reauthorised {
    /// It may run, under the environment as it is now: the effective descriptor built
    /// from the environment file of now (`None` when that file cannot be read now: the
    /// deploy then waits on the gate and resolves it when it runs, as at submission).
    Allowed(Option<Box<EffectiveDescriptor>>),
    /// It may not: why (the token, the source, the override or the environment refused).
    Refused(String),
}

/// Authorises a scheduled deploy again as it fires (docs/security.md, "Schedules are
/// authorised at every tick"): the token `submitter` must still exist, be unexpired and
/// may deploy the application (`authority`); the artifact URLs must be under today's
/// `artifacts.sources`; and the descriptor is resolved against the environment file as
/// it is now, so its current `overrides:` (an override no longer allowed is refused),
/// `approval:` and `depends_on:` apply. The route is not decided again: the queue chosen
/// at submission stays. Reads files: the file work runs off the async threads.
pub async fn reauthorise(
    config: &Config,
    authority: &dyn Authority,
    descriptor: &Descriptor,
    submitter: &Submitter,
) -> Result<Reauthorised, EngineError> {
    if let Verdict::Refused(reason) = authority
        .may_deploy(submitter, &descriptor.application)
        .await?
    {
        return Ok(Reauthorised::Refused(reason));
    }
    let sources = config.artifact_sources();
    let source = config.environments_source();
    let descriptor = descriptor.clone();
    tokio::task::spawn_blocking(move || {
        for (i, artifact) in descriptor.artifacts.iter().enumerate() {
            if let Err(e) = sources.check(&descriptor.application, &artifact.url) {
                return Reauthorised::Refused(format!(
                    "artifacts[{i}].url: `{}` {e}",
                    artifact.url
                ));
            }
        }
        let (application, environment) = (&descriptor.application, &descriptor.environment);
        match load_environment(&source, application, environment) {
            Ok(env) => match EffectiveDescriptor::build(&descriptor, &env) {
                Ok(eff) => {
                    match unadmitted_cross_tenant_dependency(&source, &descriptor, &eff.depends_on)
                    {
                        Some((_, message)) => Reauthorised::Refused(message),
                        None => Reauthorised::Allowed(Some(Box::new(eff))),
                    }
                }
                Err(e) => Reauthorised::Refused(e.to_string()),
            },
            Err(e) if e.is_environment_unavailable() => {
                match missing_environment(&source, application, environment) {
                    // The file is gone from a source that can be read: nowhere to deploy.
                    Some(missing) => Reauthorised::Refused(missing.message),
                    None => Reauthorised::Allowed(None),
                }
            }
            Err(e) => Reauthorised::Refused(e.to_string()),
        }
    })
    .await
    .map_err(|e| EngineError::InvalidInput(format!("the check of a scheduled deploy stopped: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(name: &str, status: StepStatus, output: Option<&str>, at: i64) -> StepRecord {
        StepRecord {
            workflow_id: "d".into(),
            index: at,
            name: name.into(),
            status,
            output: output.map(str::to_string),
            error: None,
            attempts: 1,
            started_at_ms: at,
            finished_at_ms: (status != StepStatus::Running).then_some(at + 1),
            executor_id: "w".into(),
        }
    }

    /// The merged steps as `name status attempts started..finished`.
    fn check(steps: Vec<StepRecord>, expected: &[&str]) {
        let shown: Vec<String> = dependency_waits_as_one(steps)
            .iter()
            .map(|s| {
                format!(
                    "{} {:?} {} {}..{:?}",
                    s.name, s.status, s.attempts, s.started_at_ms, s.finished_at_ms
                )
            })
            .collect();
        assert_eq!(
            shown, expected,
            "the dependency waits of a step are shown as one"
        );
    }

    #[test]
    fn a_dependency_wait_reads_as_one_step() {
        let not_yet = Some("\"NotYet\"");
        let met = Some("\"Met\"");
        check(
            vec![
                step("fetch a", StepStatus::Success, None, 1),
                step("check shop/db/prod", StepStatus::Success, not_yet, 10),
                step("check shop/db/prod", StepStatus::Success, not_yet, 20),
                step("check shop/db/prod", StepStatus::Running, None, 30),
            ],
            &[
                "fetch a Success 1 1..Some(2)",
                "wait for shop/db/prod Running 3 10..None",
            ],
        );
        check(
            vec![
                step("check shop/db/prod", StepStatus::Success, not_yet, 10),
                step(
                    "check shop/cache/prod at version 2",
                    StepStatus::Success,
                    met,
                    15,
                ),
                step("check shop/db/prod", StepStatus::Success, met, 20),
                step("t1: check health", StepStatus::Success, None, 30),
            ],
            &[
                "wait for shop/db/prod Success 2 10..Some(21)",
                "wait for shop/cache/prod at version 2 Success 1 15..Some(16)",
                "t1: check health Success 1 30..Some(31)",
            ],
        );
        check(
            vec![step(
                "check shop/db/prod",
                StepStatus::Success,
                Some("\"Expired\""),
                10,
            )],
            &["wait for shop/db/prod Error 1 10..Some(11)"],
        );
    }
}
