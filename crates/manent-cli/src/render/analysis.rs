//! The analysis in `manent status` (docs/analysis.md): per wave and metric, its condition,
//! its measurements and the outcome so far; and in `manent plan`, the bakes a deploy would
//! run.

use manent_contract::{DeployStatus, Measurement, MeasurementOutcome, PlannedBakeView};

use super::{Cell, Style};

/// `analysis after wave N` blocks, one line per metric and one per measurement; empty
/// when the deploy has no measurements.
pub(super) fn section(style: &Style, d: &DeployStatus) -> String {
    let mut out = String::new();
    let mut waves: Vec<u32> = d.measurements.iter().map(|m| m.wave).collect();
    waves.dedup();
    for wave in waves {
        out.push_str(&format!("  analysis after wave {wave}\n"));
        let mine: Vec<&Measurement> = d.measurements.iter().filter(|m| m.wave == wave).collect();
        let mut metrics: Vec<&str> = Vec::new();
        for m in &mine {
            if !metrics.contains(&m.metric.as_str()) {
                metrics.push(&m.metric);
            }
        }
        for metric in metrics {
            let taken: Vec<&&Measurement> = mine.iter().filter(|m| m.metric == metric).collect();
            let count = |o: MeasurementOutcome| taken.iter().filter(|m| m.outcome == o).count();
            let limits = limits(d, metric);
            let (failed, inconclusive) = (
                count(MeasurementOutcome::Failed),
                count(MeasurementOutcome::Inconclusive),
            );
            let outcome = match limits {
                Some((_, f, _)) if failed > f => "failed",
                Some((_, _, i)) if inconclusive > i => "inconclusive",
                _ => "passed",
            };
            out.push_str(&format!(
                "    metric {}  condition {}  {} passed, {failed} failed, {inconclusive} \
                 inconclusive: {outcome}\n",
                metric.cell(),
                limits.map_or("-".to_string(), |(c, _, _)| format!("`{}`", c.cell())),
                count(MeasurementOutcome::Passed),
            ));
            for m in taken {
                out.push_str(&format!("      {}\n", line(style, m)));
            }
        }
    }
    out
}

/// One measurement: when, where, its value (and baseline), its outcome and why.
fn line(style: &Style, m: &Measurement) -> String {
    let on = m
        .target
        .as_deref()
        .map_or(String::new(), |t| format!("{} ", t.cell()));
    let value = m.value.map_or("-".to_string(), |v| v.to_string());
    let baseline = m
        .baseline
        .map_or(String::new(), |b| format!(" (baseline {b})"));
    let why = m
        .detail
        .as_deref()
        .map_or(String::new(), |d| format!(": {}", d.cell()));
    format!(
        "{on}{}  {value}{baseline}  {}{why}",
        style.time(Some(&m.at)),
        m.outcome.to_string().cell()
    )
}

/// The metric's `success`, `failure_limit` and `inconclusive_limit`, from the effective
/// descriptor the status carries.
fn limits(d: &DeployStatus, metric: &str) -> Option<(String, usize, usize)> {
    let metrics = d.effective.as_ref()?["rollout"]["analysis"]["metrics"].as_array()?;
    let m = metrics.iter().find(|m| m["name"] == metric)?;
    let limit = |key: &str, default: u64| {
        usize::try_from(m[key].as_u64().unwrap_or(default)).unwrap_or(usize::MAX)
    };
    Some((
        m["success"].as_str()?.to_string(),
        limit("failure_limit", 0),
        limit("inconclusive_limit", 2),
    ))
}

/// `manent plan`'s analysis: per bake, its targets, its rhythm, then each metric with its
/// condition, limits and what it would ask (multi-line queries on one line).
pub(crate) fn planned(bakes: &[PlannedBakeView]) -> Vec<String> {
    let one_line =
        |text: &str| super::terminal_safe(&text.split_whitespace().collect::<Vec<_>>().join(" "));
    let mut out = Vec::new();
    for b in bakes {
        let wait = b
            .timeout
            .as_deref()
            .map_or("until someone decides".to_string(), |t| {
                format!("up to {t}")
            });
        out.push(one_line(&format!(
            "analysis after wave {} ({}: {}; baseline {}): {} measurement(s), one every {} over \
             {}; a decision waited for {wait}",
            b.after_wave,
            b.wave,
            b.targets.join(", "),
            if b.baseline.is_empty() {
                "none".to_string()
            } else {
                b.baseline.join(", ")
            },
            b.measurements,
            b.interval,
            b.bake,
        )));
        for m in &b.metrics {
            out.push(format!(
                "  metric {} ({})  condition `{}`  failure_limit {}, inconclusive_limit {}",
                one_line(&m.name),
                m.provider,
                one_line(&m.success),
                m.failure_limit,
                m.inconclusive_limit
            ));
            for q in &m.asks {
                let on = q
                    .target
                    .as_deref()
                    .map_or(String::new(), |t| format!("{} ", one_line(t)));
                out.push(format!(
                    "    {on}{}: {}",
                    one_line(&q.source),
                    one_line(&q.query)
                ));
                if let Some(baseline) = &q.baseline_query {
                    out.push(format!("    {on}baseline: {}", one_line(baseline)));
                }
            }
        }
    }
    out
}
