//! Retention (docs/configuration.md, `retention`): what history goes, in bounded batches.
//! Finished deploys older than `retention.deploys` go with their passes, steps, events and
//! output, except the newest `keep_last` successful ones of each environment (the live one
//! and rollback's choices); output lines older than `retention.output` go from finished
//! deploys; audit entries older than `retention.audit` go; drift checks older than
//! `retention.deploys` go, but the newest of each environment, and so do notifications'
//! deliveries (`manent.notify`) ended before then. Nothing in flight or waiting is
//! ever chosen, and schedules' definitions are records, never touched here.

use std::time::Duration;

use manent_config::RetentionConfig;
use manent_engine::{Client, EngineError, PruneQuery};

use crate::request::DEPLOY_WORKFLOW;

/// What one application of the policy removed (or, `dry_run`, would remove).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PruneReport {
    /// Nothing was removed: the figures say what would have been.
    pub dry_run: bool,
    pub deploys: u64,
    /// The deploys' region passes, removed with them.
    pub passes: u64,
    pub steps: u64,
    /// Output lines: those of the removed deploys, then old lines of kept ones.
    pub output_lines: u64,
    pub audit_entries: u64,
}

impl PruneReport {
    /// Whether anything was (or would be) removed.
    pub fn is_empty(&self) -> bool {
        self.deploys + self.passes + self.steps + self.output_lines + self.audit_entries == 0
    }
}

/// `now_ms` less `age`; `None` for an age of zero (that history is kept for ever).
fn cutoff(now_ms: i64, age: Duration) -> Option<i64> {
    (!age.is_zero())
        .then(|| now_ms.saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX)))
}

/// Applies `retention` as of `now_ms`, one batch (one short transaction) at a time, so
/// that claims and checkpoints are never kept waiting for long. With `dry_run`, counts.
pub async fn prune(
    client: &Client,
    retention: &RetentionConfig,
    now_ms: i64,
    dry_run: bool,
) -> Result<PruneReport, EngineError> {
    let batch = i64::from(retention.batch.max(1));
    let mut report = PruneReport {
        dry_run,
        ..PruneReport::default()
    };
    let output_before = cutoff(now_ms, retention.output);
    // Dry run: the old output lines of the deploys that would go, which the count of old
    // output lines below includes and the real run removes with their deploys first.
    let mut counted_twice = 0;
    if let Some(before) = cutoff(now_ms, retention.deploys) {
        let mut query = PruneQuery {
            name: DEPLOY_WORKFLOW.to_string(),
            finished_before_ms: before,
            keep_successful: i64::from(retention.keep_last.max(1)),
            limit: batch,
        };
        if dry_run {
            // The same choice and the same walk as the real run's, counted.
            query.limit = i64::MAX;
            let ids = client.prunable_workflows(&query).await?;
            let (would, old_output) = client.count_workflows_removal(&ids, output_before).await?;
            report.deploys = would.workflows;
            report.passes = would.children;
            report.steps = would.steps;
            report.output_lines = would.output_lines;
            counted_twice = old_output;
        } else {
            loop {
                let ids = client.prunable_workflows(&query).await?;
                if ids.is_empty() {
                    break;
                }
                let deleted = client.delete_workflows(&ids).await?;
                report.deploys += deleted.workflows;
                report.passes += deleted.children;
                report.steps += deleted.steps;
                report.output_lines += deleted.output_lines;
                if deleted.workflows == 0 {
                    break; // every one chosen was resumed meanwhile: nothing more to do now
                }
                tokio::task::yield_now().await;
            }
        }
    }
    if let Some(before) = cutoff(now_ms, retention.deploys)
        && !dry_run
    {
        prune_drift_checks(client, before, batch).await?;
        prune_finished(
            client,
            crate::notifications::NOTIFY_WORKFLOW,
            before,
            0,
            batch,
        )
        .await?;
    }
    if let Some(before) = output_before {
        let old_lines = drain(batch, dry_run, |limit| {
            client.prune_output(before, limit, dry_run)
        })
        .await?;
        report.output_lines += old_lines.saturating_sub(counted_twice);
    }
    if let Some(before) = cutoff(now_ms, retention.audit) {
        report.audit_entries += drain(batch, dry_run, |limit| {
            client.prune_audit(before, limit, dry_run)
        })
        .await?;
    }
    // Every pass, not only one that removed something: on PostgreSQL the updates of
    // deploys in flight leave dead rows whether or not anything was old enough to go.
    if !dry_run {
        client.reclaim_space(false).await?;
    }
    Ok(report)
}

/// Removes finished drift checks (`manent.drift`) older than `before`, but the newest of
/// each environment (docs/plan-and-drift.md): their results are kept per environment in a
/// record of their own.
async fn prune_drift_checks(client: &Client, before: i64, batch: i64) -> Result<(), EngineError> {
    prune_finished(client, crate::request::DRIFT_WORKFLOW, before, 1, batch).await
}

/// Removes finished workflows named `name` that ended before `before`, but the newest
/// `keep` successful ones of each partition, `batch` at a time.
async fn prune_finished(
    client: &Client,
    name: &str,
    before: i64,
    keep: i64,
    batch: i64,
) -> Result<(), EngineError> {
    let query = PruneQuery {
        name: name.to_string(),
        finished_before_ms: before,
        keep_successful: keep,
        limit: batch,
    };
    loop {
        let ids = client.prunable_workflows(&query).await?;
        if ids.is_empty() || client.delete_workflows(&ids).await?.workflows == 0 {
            return Ok(());
        }
        tokio::task::yield_now().await;
    }
}

/// Calls `remove` with `batch` until it removes fewer; with `dry_run`, once, counting all.
async fn drain<F, Fut>(batch: i64, dry_run: bool, mut remove: F) -> Result<u64, EngineError>
where
    F: FnMut(i64) -> Fut,
    Fut: std::future::Future<Output = Result<u64, EngineError>>,
{
    if dry_run {
        return remove(i64::MAX).await;
    }
    let mut total = 0;
    loop {
        let removed = remove(batch).await?;
        total += removed;
        if removed < u64::try_from(batch).unwrap_or(u64::MAX) {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}

/// Applies `retention` every `retention.every` on this worker, for as long as the process
/// runs; the first time after a random part of that interval, so that workers started
/// together do not all prune at once. Failures are logged and tried again next time.
pub fn spawn_pruner(client: Client, retention: RetentionConfig) {
    tokio::spawn(async move {
        let every = retention.every.max(Duration::from_secs(1));
        let first = every.mul_f64(rand_fraction());
        tokio::time::sleep(first).await;
        loop {
            match prune(&client, &retention, manent_engine::now_ms(), false).await {
                Ok(report) if !report.is_empty() => tracing::info!(
                    deploys = report.deploys,
                    passes = report.passes,
                    steps = report.steps,
                    output_lines = report.output_lines,
                    audit_entries = report.audit_entries,
                    "retention removed old history"
                ),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "retention could not be applied now; trying again later")
                }
            }
            tokio::time::sleep(every).await;
        }
    });
}

/// A fraction in [0, 1) from the clock's sub-second digits: spreads workers' first runs.
fn rand_fraction() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    f64::from(nanos % 1000) / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_age_of_zero_keeps_that_history_for_ever() {
        assert_eq!(cutoff(10_000, Duration::ZERO), None, "0s: never pruned");
        assert_eq!(
            cutoff(10_000, Duration::from_secs(3)),
            Some(7_000),
            "finished more than 3 s before now"
        );
    }
}
