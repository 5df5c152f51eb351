//! The analysis a deploy would run (docs/analysis.md, "In plans and dry runs"): after each
//! wave but the last, every metric with its provider, what it would ask (the query, URL or
//! command with the placeholders filled in for that wave, and the same over the baseline),
//! its condition and limits, and the bake's interval and length. Computed from the
//! effective descriptor alone, so `manent plan` and a dry run's plan list it without
//! measuring anything; a dry run also prints it, one recorded step per bake
//! ([`list_in_dry_run`]).

use std::time::Duration;

use manent_engine::{WorkflowContext, WorkflowError};
use manent_model::{EffectiveDescriptor, Metric, Provider, RunOn, Target, plan_waves};

use super::providers::Over;

/// The bake after one wave.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedBake {
    /// The wave baked (1-based) and its name.
    pub after_wave: usize,
    pub wave: String,
    /// The wave's targets, then those it is compared with (the later waves').
    pub targets: Vec<String>,
    pub baseline: Vec<String>,
    pub bake: Duration,
    pub interval: Duration,
    /// How many measurements of each metric a full bake takes.
    pub measurements: u32,
    /// How long a deploy would wait for a decision (none: until someone decides).
    pub timeout: Option<Duration>,
    pub metrics: Vec<PlannedMetric>,
}

/// One metric of a bake.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedMetric {
    pub name: String,
    /// `prometheus`, `http` or `command`.
    pub provider: &'static str,
    pub success: String,
    pub failure_limit: u32,
    pub inconclusive_limit: u32,
    /// What each measurement asks: one, or one per target for a per-target metric.
    pub asks: Vec<PlannedQuery>,
}

/// What one measurement asks, placeholders filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedQuery {
    /// The target of a per-target metric.
    pub target: Option<String>,
    /// Where it is asked: the Prometheus address, the URL, `worker` or `target <name>`.
    pub source: String,
    /// The PromQL query, the JSON pointer of an HTTP answer, or the command.
    pub query: String,
    /// The same over the baseline targets (`baseline` in the condition), for a metric whose
    /// provider names `{targets}`.
    pub baseline_query: Option<String>,
}

/// The bakes `eff` would run: none without `rollout.analysis` or with a single wave.
pub fn planned(eff: &EffectiveDescriptor) -> Vec<PlannedBake> {
    let Some(analysis) = &eff.rollout.analysis else {
        return Vec::new();
    };
    let waves = plan_waves(eff);
    let names = |targets: &[Target]| targets.iter().map(|t| t.name.clone()).collect();
    let mut bakes = Vec::new();
    for w in 0..waves.len().saturating_sub(1) {
        let baseline: Vec<Target> = waves[w + 1..]
            .iter()
            .flat_map(|wave| wave.targets.iter().cloned())
            .collect();
        let over = Over {
            eff,
            targets: &waves[w].targets,
            baseline: &baseline,
            target: None,
        };
        bakes.push(PlannedBake {
            after_wave: w + 1,
            wave: waves[w].name.clone(),
            targets: names(&waves[w].targets),
            baseline: names(&baseline),
            bake: analysis.bake,
            interval: analysis.interval,
            measurements: analysis.rounds(),
            timeout: analysis.timeout,
            metrics: analysis
                .metrics
                .iter()
                .map(|metric| planned_metric(metric, over))
                .collect(),
        });
    }
    bakes
}

fn planned_metric(metric: &Metric, over: Over<'_>) -> PlannedMetric {
    let asks = if metric.per_target() {
        over.targets
            .iter()
            .map(|target| {
                asked(
                    metric,
                    Over {
                        target: Some(target),
                        ..over
                    },
                )
            })
            .collect()
    } else {
        vec![asked(metric, over)]
    };
    PlannedMetric {
        name: metric.name.clone(),
        provider: match metric.provider() {
            Some(Provider::Prometheus(_)) => "prometheus",
            Some(Provider::Http(_)) => "http",
            Some(Provider::Command(_)) => "command",
            None => "none",
        },
        success: metric.success.clone(),
        failure_limit: metric.failure_limit,
        inconclusive_limit: metric.inconclusive_limit,
        asks,
    }
}

/// What one measurement of `metric` over `over` asks, and its baseline.
fn asked(metric: &Metric, over: Over<'_>) -> PlannedQuery {
    let baseline = metric.has_baseline();
    let (source, query, baseline_query) = match metric.provider() {
        Some(Provider::Prometheus(p)) => (
            over.fill(&p.address, false),
            over.fill(&p.query, false),
            baseline.then(|| over.fill(&p.query, true)),
        ),
        Some(Provider::Http(h)) => (
            over.fill(&h.url, false),
            h.value.clone(),
            baseline.then(|| over.fill(&h.url, true)),
        ),
        Some(Provider::Command(c)) => (
            match (c.on, over.target) {
                (RunOn::Target, Some(target)) => format!("target {}", target.name),
                _ => "worker".to_string(),
            },
            over.fill(&c.run, false),
            baseline.then(|| over.fill(&c.run, true)),
        ),
        None => (String::new(), String::new(), None),
    };
    PlannedQuery {
        target: over.target.map(|t| t.name.clone()),
        source,
        query,
        baseline_query,
    }
}

impl PlannedBake {
    /// The bake in words, a line for it and one per metric and measurement asked.
    pub fn lines(&self) -> Vec<String> {
        let one_line = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut lines = vec![format!(
            "analysis after wave {} would take {} measurement(s) of each metric, one every {} \
             over {} ({}: {}; baseline {})",
            self.after_wave,
            self.measurements,
            humantime::format_duration(self.interval),
            humantime::format_duration(self.bake),
            self.wave,
            self.targets.join(", "),
            self.baseline.join(", "),
        )];
        for m in &self.metrics {
            for q in &m.asks {
                let baseline = q
                    .baseline_query
                    .as_deref()
                    .map_or(String::new(), |b| format!("; baseline: {}", one_line(b)));
                let on = q
                    .target
                    .as_deref()
                    .map_or(String::new(), |t| format!(" on {t}"));
                lines.push(format!(
                    "  metric {}{on} ({}, condition `{}`, failure_limit {}, inconclusive_limit \
                     {}): {}: {}{baseline}",
                    m.name,
                    m.provider,
                    one_line(&m.success),
                    m.failure_limit,
                    m.inconclusive_limit,
                    q.source,
                    one_line(&q.query),
                ));
            }
        }
        lines
    }
}

/// A dry run's bake after wave `wave` (1-based): nothing is measured; one recorded step
/// prints what the bake would do into the dry run's output (source `analysis`).
pub async fn list_in_dry_run(
    ctx: &WorkflowContext,
    eff: &EffectiveDescriptor,
    wave: usize,
) -> Result<(), WorkflowError> {
    let Some(bake) = planned(eff).into_iter().find(|b| b.after_wave == wave) else {
        return Ok(());
    };
    let output = ctx.output("analysis");
    let lines = bake.lines();
    ctx.step(&format!("dry run: analysis after wave {wave}"), || async {
        for line in &lines {
            output.line("progress", line);
        }
        Ok::<_, String>(())
    })
    .await
}
