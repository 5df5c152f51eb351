//! The Prometheus metrics of docs/api.md, in the text exposition format:
//! deploys by status, queue depths, claim latency, step durations and the
//! workers' heartbeats. Everything is read from the database, so any API
//! instance answers for the whole installation.

use std::fmt::Write;

use manent_config::Config;
use manent_engine::{Client, EngineError};

use crate::{DEPLOY_WORKFLOW, views};

/// How many recent claims and steps the latency and duration summaries cover.
const RECENT: i64 = 1000;

/// The metrics as `text/plain; version=0.0.4`.
pub async fn render(client: &Client, config: &Config) -> Result<String, EngineError> {
    let mut out = String::new();

    family(&mut out, "manent_deploys", "gauge", "Deploys by status.");
    for (status, n) in client.count_by_status(DEPLOY_WORKFLOW).await? {
        let _ = writeln!(out, "manent_deploys{{status=\"{status}\"}} {n}");
    }

    family(
        &mut out,
        "manent_deploys_waiting_for_workflow_version",
        "gauge",
        "Queued deploys whose deploy workflow version no live worker runs: they wait for a \
         worker of a release that runs it (docs/upgrading.md).",
    );
    let live = client.live_workflow_versions().await?;
    for (version, n) in client.count_enqueued_by_version(DEPLOY_WORKFLOW).await? {
        // With no live worker at all nothing runs, whatever its version: the workers'
        // own metrics say so.
        if !live.is_empty() && !live.iter().any(|v| v.contains(version)) {
            let _ = writeln!(
                out,
                "manent_deploys_waiting_for_workflow_version{{version=\"{version}\"}} {n}"
            );
        }
    }

    family(
        &mut out,
        "manent_notifications",
        "gauge",
        "Webhook deliveries: pending (waiting or being retried) and failed (every try \
         failed; see the workers' logs).",
    );
    let records = client.records();
    for (state, kind) in [
        ("pending", crate::notifications::OUTBOX_KIND),
        ("failed", crate::notifications::FAILED_KIND),
    ] {
        let n = records.list(kind).await?.len();
        let _ = writeln!(out, "manent_notifications{{state=\"{state}\"}} {n}");
    }

    let queues = views::queues(client, config).await?;
    family(
        &mut out,
        "manent_queue_enqueued",
        "gauge",
        "Deploys waiting in a queue for a slot.",
    );
    for q in &queues {
        let _ = writeln!(
            out,
            "manent_queue_enqueued{{queue=\"{}\",kind=\"{}\"}} {}",
            label(&q.name),
            q.kind.as_str(),
            q.enqueued
        );
    }
    family(
        &mut out,
        "manent_queue_running",
        "gauge",
        "Deploys holding a slot of a queue.",
    );
    for q in &queues {
        let _ = writeln!(
            out,
            "manent_queue_running{{queue=\"{}\",kind=\"{}\"}} {}",
            label(&q.name),
            q.kind.as_str(),
            q.running
        );
    }

    summary(
        &mut out,
        "manent_claim_latency_seconds",
        "From ready (enqueued or its start time) to claimed, over the most recent claims.",
        client.recent_claim_latencies(RECENT).await?,
    );
    summary(
        &mut out,
        "manent_step_duration_seconds",
        "Durations of the most recently finished steps.",
        client.recent_step_durations(RECENT).await?,
    );

    let workers = views::workers(client, config).await?;
    family(
        &mut out,
        "manent_worker_heartbeat_age_seconds",
        "gauge",
        "Seconds since a worker's last heartbeat.",
    );
    for w in &workers {
        let _ = writeln!(
            out,
            "manent_worker_heartbeat_age_seconds{{executor_id=\"{}\",state=\"{}\"}} {}",
            label(&w.executor_id),
            label(w.state.as_str()),
            w.heartbeat_age_secs
        );
    }
    family(
        &mut out,
        "manent_worker_running",
        "gauge",
        "Workflows a worker holds.",
    );
    for w in &workers {
        let _ = writeln!(
            out,
            "manent_worker_running{{executor_id=\"{}\"}} {}",
            label(&w.executor_id),
            w.running
        );
    }
    family(
        &mut out,
        "manent_worker_info",
        "gauge",
        "1 for each listed worker, labelled with the manent version it runs (schema and workflow versions included).",
    );
    for w in &workers {
        let _ = writeln!(
            out,
            "manent_worker_info{{executor_id=\"{}\",version=\"{}\"}} 1",
            label(&w.executor_id),
            label(&w.version)
        );
    }
    family(
        &mut out,
        "manent_worker_up",
        "gauge",
        "1 for a running worker with a fresh heartbeat, 0 otherwise.",
    );
    for w in &workers {
        let up = u8::from(w.state == views::WorkerState::Running);
        let _ = writeln!(
            out,
            "manent_worker_up{{executor_id=\"{}\"}} {up}",
            label(&w.executor_id)
        );
    }
    Ok(out)
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A summary with the 0.5, 0.9 and 0.99 quantiles of `values_ms`, in seconds.
fn summary(out: &mut String, name: &str, help: &str, mut values_ms: Vec<i64>) {
    family(out, name, "summary", help);
    values_ms.sort_unstable();
    if !values_ms.is_empty() {
        for q in [0.5, 0.9, 0.99] {
            // Nearest rank: the smallest value with at least q of the values at or below it.
            let rank = ((q * values_ms.len() as f64).ceil() as usize).clamp(1, values_ms.len());
            let _ = writeln!(
                out,
                "{name}{{quantile=\"{q}\"}} {}",
                seconds(values_ms[rank - 1])
            );
        }
    }
    let sum: i64 = values_ms.iter().map(|v| (*v).max(0)).sum();
    let _ = writeln!(out, "{name}_sum {}", seconds(sum));
    let _ = writeln!(out, "{name}_count {}", values_ms.len());
}

fn seconds(ms: i64) -> String {
    format!("{:.3}", ms.max(0) as f64 / 1000.0)
}

/// A label value escaped as the exposition format wants.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_has_nearest_rank_quantiles_sum_and_count() {
        let mut out = String::new();
        summary(
            &mut out,
            "x_seconds",
            "help",
            (1..=10).map(|v| v * 100).collect(),
        );
        assert_eq!(
            out,
            "# HELP x_seconds help\n# TYPE x_seconds summary\n\
             x_seconds{quantile=\"0.5\"} 0.500\nx_seconds{quantile=\"0.9\"} 0.900\n\
             x_seconds{quantile=\"0.99\"} 1.000\nx_seconds_sum 5.500\nx_seconds_count 10\n"
        );
    }

    #[test]
    fn an_empty_summary_has_only_sum_and_count() {
        let mut out = String::new();
        summary(&mut out, "x", "h", Vec::new());
        assert!(out.ends_with("x_sum 0.000\nx_count 0\n"), "{out}");
        assert!(
            !out.contains("quantile"),
            "no quantile without values: {out}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
