//! The judgement between waves (`rollout.analysis`, docs/analysis.md): after each wave but
//! the last, once its checks pass, every metric is measured every `interval` for `bake`.
//!
//! - `mod.rs` (this file): the bake, a durable loop. Each interval is a durable wait on
//!   the topic `analysis` (a restart waits only what is left, and `manent promote` or
//!   `manent abort` ends it at once); each round of measurements is one recorded step,
//!   so a worker killed mid-bake is taken over and the bake goes on from what was
//!   recorded, neither shortened nor started over, no measurement counted twice. Too many
//!   failed measurements fail the deploy; too many inconclusive ones make it wait in
//!   `waiting_decision` on the gate queue, holding no deploy slot (invariant 7).
//! - `providers.rs`: one measurement: `prometheus`, `http`, `command`.
//! - `decide.rs`: `manent promote` and `manent abort`, as the API sends them.
//! - `plan.rs`: the bakes a deploy would run, as `manent plan` lists them.
//! - `threshold.rs`: the bound of a `success` condition, drawn on the Platform page.
//!
//! It depends on `request`, `run` (a target's connection) and `notifications`.

pub mod decide;
pub mod plan;
pub mod providers;
pub mod threshold;

use std::time::Duration;

use manent_config::{Config, NotificationEvent};
use manent_engine::{Client, WorkflowContext, WorkflowError, now_ms};
use manent_model::{Analysis, EffectiveDescriptor, Metric, Target};
use manent_ssh::ConnectionPool;
use serde::{Deserialize, Serialize};

use crate::request::{
    ANALYSIS_TOPIC, DeployRequest, EventKey, GATE_QUEUE, Phase, publish, rfc3339,
};
use providers::Over;

/// A "forever" that still fits the engine's millisecond deadlines.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How a measurement judged the wave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Passed,
    Failed,
    /// It could not be taken: no data, an error, a timeout, no baseline.
    Inconclusive,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Failed => "failed",
            Outcome::Inconclusive => "inconclusive",
        }
    }
}

/// One measurement of one metric (on one target, for a metric measured per target), as
/// recorded by its round's step and published in the event `measurements`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// The wave it judged (1-based).
    pub wave: usize,
    pub metric: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    pub at_ms: i64,
    #[serde(default)]
    pub value: Option<f64>,
    #[serde(default)]
    pub baseline: Option<f64>,
    pub outcome: Outcome,
    /// Why it is inconclusive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The condition's bound at this measurement ([`threshold`]): computed when the
    /// deploy's status is read, never recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
}

/// `manent promote` (pass the analysis, skipping the rest of a bake) or `manent abort`
/// (fail the deploy), as sent on the topic `analysis`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnalysisDecision {
    pub promote: bool,
    pub by: String,
    #[serde(default)]
    pub by_id: String,
    #[serde(default)]
    pub reason: Option<String>,
    pub at_ms: i64,
    /// The wave whose analysis it decides: a decision sent as one bake ended is not taken
    /// by the next.
    pub wave: usize,
}

/// What a bake concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judged {
    /// The next wave may start.
    Passed,
    /// The deploy fails, for this reason (a metric, an abort, no decision in time).
    Failed(String),
}

/// What one wave's bake is about.
pub struct Bake<'a> {
    pub client: &'a Client,
    pub config: &'a Config,
    pub request: &'a DeployRequest,
    pub deploy_id: &'a str,
    pub eff: &'a EffectiveDescriptor,
    pub pool: &'a ConnectionPool,
    /// Asks the HTTP providers (Prometheus, HTTP JSON pointer).
    pub http: &'a dyn crate::http::HttpFetch,
    /// The wave baked (1-based).
    pub wave: usize,
    pub targets: &'a [Target],
    /// The targets this deploy has not reached yet.
    pub baseline: &'a [Target],
}

/// Bakes wave `b.wave`: `rounds` measurements of every metric, one `interval` apart,
/// appended to `all` (every measurement of the deploy so far) and published.
pub async fn bake(
    ctx: &WorkflowContext,
    b: &Bake<'_>,
    analysis: &Analysis,
    all: &mut Vec<Measurement>,
) -> Result<Judged, WorkflowError> {
    publish(ctx, &EventKey::Phase, &Phase::BakeAfterWave(b.wave)).await?;
    let rounds = analysis.rounds();
    for round in 1..=rounds {
        let decision: Option<AnalysisDecision> =
            ctx.recv(ANALYSIS_TOPIC, analysis.interval).await?;
        match decision {
            Some(d) if d.wave == b.wave => return decided(ctx, b, &d).await,
            // A decision about another wave's analysis (sent as it ended): not this one's.
            _ => {}
        }
        let output = ctx.output("analysis");
        let taken: Vec<Measurement> = ctx
            .step(
                &format!("wave {}: measure {round}/{rounds}", b.wave),
                || async {
                    let taken = take_round(b, analysis).await;
                    for m in &taken {
                        output.line("progress", &describe(m));
                    }
                    Ok::<_, String>(taken)
                },
            )
            .await?;
        all.extend(taken);
        publish(ctx, &EventKey::Measurements, all).await?;
        match judge(analysis, b.wave, all) {
            Verdict::Going => {}
            Verdict::Failed(reason) => {
                let reason = format!("analysis after wave {}: {reason}", b.wave);
                notify(b, NotificationEvent::AnalysisFailed, Some(reason.clone())).await;
                return Ok(Judged::Failed(reason));
            }
            Verdict::Undecided(why) => return wait_for_decision(ctx, b, analysis, why).await,
        }
    }
    Ok(Judged::Passed)
}

/// The judgement a decision makes.
async fn decided(
    ctx: &WorkflowContext,
    b: &Bake<'_>,
    d: &AnalysisDecision,
) -> Result<Judged, WorkflowError> {
    let said = if d.promote {
        format!("promoted by {}", d.by)
    } else {
        format!("aborted by {}", d.by)
    };
    let reason = d
        .reason
        .as_deref()
        .map_or(String::new(), |r| format!(": {r}"));
    let output = ctx.output("analysis");
    let line = format!("analysis after wave {}: {said}{reason}", b.wave);
    ctx.step(&format!("wave {}: decision", b.wave), || async {
        output.line("progress", &line);
        Ok::<_, String>(())
    })
    .await?;
    Ok(if d.promote {
        Judged::Passed
    } else {
        Judged::Failed(format!("analysis after wave {}: {said}{reason}", b.wave))
    })
}

/// Waits in `waiting_decision` on the gate queue (holding no deploy slot) for `manent
/// promote` or `manent abort`, up to `analysis.timeout`, then goes back to the route's
/// queue.
async fn wait_for_decision(
    ctx: &WorkflowContext,
    b: &Bake<'_>,
    analysis: &Analysis,
    why: String,
) -> Result<Judged, WorkflowError> {
    let id = ctx.workflow_id();
    let why = format!("analysis after wave {}: {why}", b.wave);
    let deadline = match analysis.timeout {
        Some(t) => format!(" (for {})", humantime::format_duration(t)),
        None => String::new(),
    };
    publish(
        ctx,
        &EventKey::Waiting,
        &format!("decision{deadline}: {why}; manent promote {id} or manent abort {id}"),
    )
    .await?;
    publish(ctx, &EventKey::Phase, &Phase::WaitingDecision).await?;
    notify(b, NotificationEvent::WaitingDecision, Some(why.clone())).await;
    let partition = b.eff.partition_key();
    ctx.move_to_queue(GATE_QUEUE, &partition).await?;
    let decision: Option<AnalysisDecision> = ctx
        .recv(ANALYSIS_TOPIC, analysis.timeout.unwrap_or(FOREVER))
        .await?;
    publish(ctx, &EventKey::Waiting, &String::new()).await?;
    publish(ctx, &EventKey::Phase, &Phase::Queued).await?;
    ctx.move_to_queue(&b.request.route.queue, &partition)
        .await?;
    match decision {
        Some(d) => decided(ctx, b, &d).await,
        None => Ok(Judged::Failed(format!(
            "{why}; nobody promoted or aborted it within {} (rollout.analysis.timeout)",
            humantime::format_duration(analysis.timeout.unwrap_or_default())
        ))),
    }
}

async fn notify(b: &Bake<'_>, event: NotificationEvent, error: Option<String>) {
    let mut facts = crate::notifications::Facts::of(b.request, b.deploy_id);
    facts.error = error;
    crate::notifications::record(b.client, b.config, event, &facts).await;
}

/// One round: every metric, once per target of the wave for those measured per target.
async fn take_round(b: &Bake<'_>, analysis: &Analysis) -> Vec<Measurement> {
    let mut taken = Vec::new();
    for metric in &analysis.metrics {
        let over = Over {
            eff: b.eff,
            targets: b.targets,
            baseline: b.baseline,
            target: None,
        };
        if metric.per_target() {
            for target in b.targets {
                let over = Over {
                    target: Some(target),
                    ..over
                };
                taken.push(measure(b, metric, over).await);
            }
        } else {
            taken.push(measure(b, metric, over).await);
        }
    }
    taken
}

async fn measure(b: &Bake<'_>, metric: &Metric, over: Over<'_>) -> Measurement {
    let value = providers::measure(metric, over, false, b.pool, b.http).await;
    let baseline = if metric.has_baseline() {
        Some(providers::measure(metric, over, true, b.pool, b.http).await)
    } else {
        None
    };
    let at_ms = now_ms();
    let mut m = Measurement {
        wave: b.wave,
        metric: metric.name.clone(),
        target: over.target.map(|t| t.name.clone()),
        at_ms,
        value: value.as_ref().ok().copied(),
        baseline: baseline.as_ref().and_then(|r| r.as_ref().ok().copied()),
        outcome: Outcome::Inconclusive,
        detail: None,
        threshold: None,
    };
    let judged = match (value, baseline) {
        (Err(e), _) => Err(e),
        (Ok(_), Some(Err(e))) => Err(format!("baseline: {e}")),
        (Ok(v), Some(Ok(base))) => metric.passes(v, Some(base)),
        (Ok(v), None) => metric.passes(v, None),
    };
    match judged {
        Ok(true) => m.outcome = Outcome::Passed,
        Ok(false) => m.outcome = Outcome::Failed,
        Err(e) => m.detail = Some(e),
    }
    m
}

/// A measurement as a line of the deploy's output.
fn describe(m: &Measurement) -> String {
    let on = m
        .target
        .as_deref()
        .map_or(String::new(), |t| format!(" on {t}"));
    let value = m.value.map_or("-".to_string(), |v| v.to_string());
    let baseline = m
        .baseline
        .map_or(String::new(), |v| format!(" (baseline {v})"));
    let why = m
        .detail
        .as_deref()
        .map_or(String::new(), |d| format!(": {d}"));
    format!(
        "{}{on} at {}: {value}{baseline} {}{why}",
        m.metric,
        rfc3339(m.at_ms),
        m.outcome.as_str()
    )
}

/// Where a wave's bake stands after a round.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Going,
    Failed(String),
    Undecided(String),
}

/// Counts wave `wave`'s measurements per metric: more failed than `failure_limit` fails;
/// more inconclusive than `inconclusive_limit` asks for a decision. A failure wins.
fn judge(analysis: &Analysis, wave: usize, all: &[Measurement]) -> Verdict {
    let mut undecided = None;
    for metric in &analysis.metrics {
        let mine: Vec<&Measurement> = all
            .iter()
            .filter(|m| m.wave == wave && m.metric == metric.name)
            .collect();
        let count = |o: Outcome| mine.iter().filter(|m| m.outcome == o).count();
        let (failed, inconclusive) = (count(Outcome::Failed), count(Outcome::Inconclusive));
        if failed > metric.failure_limit as usize {
            let last = mine.iter().rev().find(|m| m.outcome == Outcome::Failed);
            let value = last
                .and_then(|m| m.value)
                .map_or(String::new(), |v| format!("; last value {v}"));
            return Verdict::Failed(format!(
                "metric {} failed {failed} of {} measurements (failure_limit {}): `{}` was \
                 false{value}",
                metric.name,
                mine.len(),
                metric.failure_limit,
                metric.success
            ));
        }
        if undecided.is_none() && inconclusive > metric.inconclusive_limit as usize {
            let last = mine.iter().rev().find_map(|m| m.detail.as_deref());
            undecided = Some(format!(
                "metric {} could not be measured {inconclusive} times (inconclusive_limit {}){}",
                metric.name,
                metric.inconclusive_limit,
                last.map_or(String::new(), |d| format!(": {d}"))
            ));
        }
    }
    undecided.map_or(Verdict::Going, Verdict::Undecided)
}

#[cfg(test)]
mod tests;
