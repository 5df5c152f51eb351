//! The Prometheus metrics of docs/api.md, encoded by `prometheus-client` in the OpenMetrics
//! text format. Gauges (deploys by status, queue depths, workers) are read from the database
//! at each scrape, so any API instance answers them for the whole installation. Histograms
//! (claim latency, step durations) and counters (deploys ended) are cumulative since the
//! process started: each scrape reads what finished or was claimed since the last one, from
//! an index, into this process's own histograms, so `rate()` over them means what it says.

use manent_config::Config;
use manent_engine::{Client, EngineError, TimeWindow, WorkflowStatus};
use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use tokio::sync::Mutex;

use crate::{DEPLOY_WORKFLOW, views::platform};

/// A metric's labels, in order.
type Labels = Vec<(&'static str, String)>;

/// How far behind now the cumulative metrics read: a step is counted once its end is
/// this old, so that one committed a little after the time it records (or by a worker
/// whose clock is a little ahead) is not passed over.
const SETTLE_MS: i64 = 5_000;

/// Rows read per query; a scrape reads at most [`PAGES`] of them per metric and catches
/// up at the next one, so a scrape after a long pause stays short.
const PAGE: i64 = 5_000;
const PAGES: usize = 20;

/// Bucket bounds in seconds, for claim latencies and step durations alike: from a claim
/// of a few milliseconds to a command of half an hour.
const BUCKETS: [f64; 18] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
];

/// What this process has counted since it started, and up to when.
struct Cumulative {
    claim_latency: Histogram,
    step_duration: Histogram,
    deploys_ended: Family<Labels, Counter>,
    /// Each metric's high-water mark: the end of the last window read. Starts at this
    /// process's first scrape: what happened before is in no counter.
    claims_read_to: i64,
    steps_read_to: i64,
    ends_read_to: i64,
}

/// The metrics of one API process: its cumulative histograms and counters, and how the
/// rest is read.
pub struct Metrics {
    cumulative: Mutex<Cumulative>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let start = manent_engine::now_ms() - SETTLE_MS;
        Metrics {
            cumulative: Mutex::new(Cumulative {
                claim_latency: Histogram::new(BUCKETS),
                step_duration: Histogram::new(BUCKETS),
                deploys_ended: Family::default(),
                claims_read_to: start,
                steps_read_to: start,
                ends_read_to: start,
            }),
        }
    }

    /// The whole exposition: the installation's gauges, this process's cumulative
    /// metrics, and `more` (the API's own counters), ending with `# EOF`.
    pub async fn render(
        &self,
        client: &Client,
        config: &Config,
        more: impl FnOnce(&mut Registry),
    ) -> Result<String, EngineError> {
        let mut registry = Registry::default();
        gauges(&mut registry, client, config).await?;
        {
            let mut cumulative = self.cumulative.lock().await;
            cumulative.catch_up(client).await?;
            registry.register(
                "manent_claim_latency_seconds",
                "From ready (enqueued, or its start time) to the first claim, of the workflows \
                 claimed since this process started.",
                cumulative.claim_latency.clone(),
            );
            registry.register(
                "manent_step_duration_seconds",
                "Durations of the steps that finished since this process started.",
                cumulative.step_duration.clone(),
            );
            registry.register(
                "manent_deploys_ended",
                "Deploys that ended since this process started, by status.",
                cumulative.deploys_ended.clone(),
            );
        }
        more(&mut registry);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &registry);
        Ok(out)
    }
}

impl Cumulative {
    /// Reads what finished or was claimed since the last scrape into the histograms and
    /// counters.
    async fn catch_up(&mut self, client: &Client) -> Result<(), EngineError> {
        let until = manent_engine::now_ms() - SETTLE_MS;
        let latency = &self.claim_latency;
        self.claims_read_to = read_between(
            self.claims_read_to,
            until,
            |w| client.workflows_started_between(w),
            |(_, ms)| latency.observe(seconds(ms)),
        )
        .await?;
        let duration = &self.step_duration;
        self.steps_read_to = read_between(
            self.steps_read_to,
            until,
            |w| client.steps_finished_between(w),
            |(_, ms)| duration.observe(seconds(ms)),
        )
        .await?;
        let ended = &self.deploys_ended;
        self.ends_read_to = read_between(
            self.ends_read_to,
            until,
            |w| client.workflows_finished_between(DEPLOY_WORKFLOW, w),
            |(_, status)| {
                ended.get_or_create(&status_labels(status)).inc();
            },
        )
        .await?;
        Ok(())
    }
}

/// Counts the rows of `(after, until]` (read by `read`, oldest first, each with its time),
/// page by page; returns how far it read. A full page stops before the time of its last
/// row, so that rows sharing that time are read together by the next page; a page all of
/// one time is taken whole.
async fn read_between<T, Fut>(
    after: i64,
    until: i64,
    read: impl Fn(TimeWindow) -> Fut,
    mut count: impl FnMut((i64, T)),
) -> Result<i64, EngineError>
where
    Fut: std::future::Future<Output = Result<Vec<(i64, T)>, EngineError>>,
{
    let mut after = after;
    for _ in 0..PAGES {
        if after >= until {
            return Ok(after);
        }
        let rows = read(TimeWindow {
            after_ms: after,
            until_ms: until,
            limit: PAGE,
        })
        .await?;
        let full = i64::try_from(rows.len()).unwrap_or(i64::MAX) >= PAGE;
        let (first, last) = match (rows.first(), rows.last()) {
            (Some(first), Some(last)) => (first.0, last.0),
            _ => return Ok(until),
        };
        if !full {
            rows.into_iter().for_each(&mut count);
            return Ok(until);
        }
        let upto = if first == last { last } else { last - 1 };
        rows.into_iter()
            .filter(|(at, _)| *at <= upto)
            .for_each(&mut count);
        after = upto;
    }
    Ok(after)
}

fn status_labels(status: WorkflowStatus) -> Labels {
    vec![("status", status.as_str().to_string())]
}

/// The gauges, read from the database.
async fn gauges(
    registry: &mut Registry,
    client: &Client,
    config: &Config,
) -> Result<(), EngineError> {
    let deploys = Family::<Labels, Gauge>::default();
    for (status, n) in client.count_by_status(DEPLOY_WORKFLOW).await? {
        deploys.get_or_create(&status_labels(status)).set(n);
    }
    registry.register("manent_deploys", "Deploys by status.", deploys);

    let waiting = Family::<Labels, Gauge>::default();
    let live = client.live_workflow_versions().await?;
    for (version, n) in client.count_enqueued_by_version(DEPLOY_WORKFLOW).await? {
        // With no live worker at all nothing runs, whatever its version: the workers'
        // own metrics say so.
        if !live.is_empty() && !live.iter().any(|v| v.contains(version)) {
            waiting
                .get_or_create(&vec![("version", version.to_string())])
                .set(n);
        }
    }
    registry.register(
        "manent_deploys_waiting_for_workflow_version",
        "Queued deploys whose deploy workflow version no live worker runs: they wait for a \
         worker of a release that runs it (docs/upgrading.md).",
        waiting,
    );

    let notifications = Family::<Labels, Gauge>::default();
    let records = client.records();
    // Pending: deliveries on the queue (waiting, being tried, waiting to be tried again),
    // and the entries an older manent's outbox holds until a worker moves them there.
    let queued = client
        .queue_depths()
        .await?
        .into_iter()
        .filter(|d| d.queue == crate::notifications::NOTIFY_QUEUE)
        .map(|d| d.enqueued + d.running)
        .sum::<i64>();
    let old_outbox = records.list(crate::notifications::OUTBOX_KIND).await?.len();
    let failed = records.list(crate::notifications::FAILED_KIND).await?.len();
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    for (state, n) in [
        ("pending", queued.saturating_add(count(old_outbox))),
        ("failed", count(failed)),
    ] {
        notifications
            .get_or_create(&vec![("state", state.to_string())])
            .set(n);
    }
    registry.register(
        "manent_notifications",
        "Webhook deliveries: pending (waiting or being retried) and failed (every try \
         failed; see the workers' logs).",
        notifications,
    );

    let (enqueued, running) = (
        Family::<Labels, Gauge>::default(),
        Family::<Labels, Gauge>::default(),
    );
    for q in platform::queues(client, config).await? {
        let labels = vec![
            ("queue", q.name.clone()),
            ("kind", q.kind.as_str().to_string()),
        ];
        enqueued.get_or_create(&labels).set(q.enqueued);
        running.get_or_create(&labels).set(q.running);
    }
    registry.register(
        "manent_queue_enqueued",
        "Deploys waiting in a queue for a slot.",
        enqueued,
    );
    registry.register(
        "manent_queue_running",
        "Deploys holding a slot of a queue.",
        running,
    );

    let age = Family::<Labels, Gauge>::default();
    let held = Family::<Labels, Gauge>::default();
    let info = Family::<Labels, Gauge>::default();
    let up = Family::<Labels, Gauge>::default();
    for w in platform::workers(client, config).await? {
        let id = ("executor_id", w.executor_id.clone());
        age.get_or_create(&vec![id.clone(), ("state", w.state.as_str().to_string())])
            .set(w.heartbeat_age_secs);
        held.get_or_create(&vec![id.clone()]).set(w.running);
        info.get_or_create(&vec![id.clone(), ("version", w.version.clone())])
            .set(1);
        up.get_or_create(&vec![id])
            .set(i64::from(w.state == platform::WorkerState::Running));
    }
    registry.register(
        "manent_worker_heartbeat_age_seconds",
        "Seconds since a worker's last heartbeat.",
        age,
    );
    registry.register("manent_worker_running", "Workflows a worker holds.", held);
    registry.register(
        "manent_worker_info",
        "1 for each listed worker, labelled with the manent version it runs (schema and \
         workflow versions included).",
        info,
    );
    registry.register(
        "manent_worker_up",
        "1 for a running worker with a fresh heartbeat, 0 otherwise.",
        up,
    );
    Ok(())
}

fn seconds(ms: i64) -> f64 {
    ms.max(0) as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads `rows` (their times) between `after` and `until` with pages of `PAGE`; returns
    /// the times counted and how far it read.
    async fn check(rows: &[i64], after: i64, until: i64) -> (Vec<i64>, i64) {
        let mut counted = Vec::new();
        let read_to = read_between(
            after,
            until,
            |w| {
                let page: Vec<(i64, ())> = rows
                    .iter()
                    .copied()
                    .filter(|at| *at > w.after_ms && *at <= w.until_ms)
                    .take(usize::try_from(w.limit).unwrap())
                    .map(|at| (at, ()))
                    .collect();
                async move { Ok(page) }
            },
            |(at, ())| counted.push(at),
        )
        .await
        .unwrap();
        (counted, read_to)
    }

    #[tokio::test]
    async fn every_row_is_counted_once_across_pages_that_split_one_time() {
        // Two pages' worth, the first page ending inside a run of rows of one time.
        let mut rows: Vec<i64> = (1..PAGE).collect();
        rows.extend([PAGE, PAGE, PAGE, PAGE + 1]);
        let (counted, read_to) = check(&rows, 0, PAGE + 10).await;
        assert_eq!(counted, rows, "each row once, in order");
        assert_eq!(read_to, PAGE + 10, "read to the end of the window");
        let (again, _) = check(&rows, read_to, PAGE + 20).await;
        assert!(again.is_empty(), "the next window counts nothing twice");
    }

    #[tokio::test]
    async fn rows_past_the_window_wait_for_the_next_one() {
        let (counted, read_to) = check(&[5, 10, 15], 0, 10).await;
        assert_eq!(
            (counted, read_to),
            (vec![5, 10], 10),
            "the first read counts up to the newest step"
        );
        let (counted, _) = check(&[5, 10, 15], 10, 20).await;
        assert_eq!(counted, [15], "the next read counts only what is newer");
    }
}
