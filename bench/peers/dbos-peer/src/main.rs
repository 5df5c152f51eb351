//! dbos-peer owns the DBOS Transact for Rust (crate `dbos` 0.5) side of the queue benchmark: it
//! runs the shared workload on Postgres and prints one JSON line per setting on stdout.
//!
//! # Workload
//!
//! N workflows (default 2,000) of three trivial steps each are enqueued onto ONE queue that is
//! partitioned by key: workflow `i` carries partition key `p{i % 50}`, and the queue is registered
//! with `partition_concurrency: Some(1)` (at most one running workflow per key, fleet-wide). The
//! benchmark process itself is the only worker.
//!
//! # Throughput method
//!
//! All N workflows are enqueued first, by a separate DBOS instance launched with
//! `listen_queues: Some(vec![])` so that it dequeues nothing from the benchmark queue; it is shut
//! down once every row is `ENQUEUED`. Then the worker instance is launched. The clock starts the
//! moment `launch()` returns (the dequeue loop is the last thing `launch` spawns, so nothing has
//! been consumed before that) and stops when a poll of `dbos.workflow_status` (every 10 ms, on a
//! connection of our own) counts N rows in `SUCCESS`. Throughput = N / that time. The time
//! `launch()` itself took (connect, migration check, recovery) is reported in `note`, not counted.
//!
//! # Start-latency method
//!
//! With the worker launched, idle and the queue empty, one workflow is enqueued at a time on the
//! same queue (partition key `p{k % 50}`). Its first step records `Instant::now()` when its body
//! starts; latency = that instant - the instant taken immediately before the enqueue call. We then
//! wait for the workflow to reach `SUCCESS` before the next sample. Before each sample we sleep a
//! pseudo-random gap in [0, queue polling interval) so the enqueue lands at a random phase of the
//! poll cycle rather than at a fixed offset from the previous dequeue. p50 and p99 are
//! nearest-rank percentiles over the samples (with 50 samples, p99 is the maximum).
//!
//! # Settings
//!
//! - `default`: `QueueOptions::default()` plus `partition_concurrency: Some(1)` — polling
//!   interval 1 s (dbos's default), worker concurrency unlimited (dbos's default), pool of 10.
//! - `tuned`: the same with `polling_interval: 50 ms`. Worker concurrency stays unlimited, which is
//!   already "high enough": 50 partitions x 1 caps the in-flight count at 50.
//!
//! dbos 0.5 hard-codes two things no setting reaches: a queue worker's interval starts at 1 s and
//! shrinks 0.9x per clean poll down to `polling_interval` (about 10 s to reach 50 ms), and
//! contention backs it off towards a fixed 120 s ceiling.
//!
//! Each (setting) run uses a fresh database `bench_dbos_<pid>_<setting>`, created and dropped
//! through the `postgres` database named by `--database-url`.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use dbos::sysdb::types::WorkflowStatus;
use dbos::{
    Config, DBOS, Enqueue, QueueConflict, QueueOptions, StartOptions, WorkflowHandle, WorkflowRef,
};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Executor as _};

const APP_NAME: &str = "bench-dbos";
const APP_VERSION: &str = "bench";
const QUEUE: &str = "bench";
const WORKFLOW: &str = "bench_workflow";
const PARTITIONS: u64 = 50;
/// Inputs at or above this are latency samples; their first step reports its start instant.
const LATENCY_BASE: u64 = 1_000_000_000;
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Start instants recorded by the first step of latency-sample workflows, keyed by input.
static FIRST_STEP_STARTS: LazyLock<Mutex<HashMap<u64, Instant>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Setting {
    Default,
    Tuned,
}

impl Setting {
    fn name(self) -> &'static str {
        match self {
            Setting::Default => "default",
            Setting::Tuned => "tuned",
        }
    }

    fn polling_interval(self) -> Duration {
        match self {
            Setting::Default => QueueOptions::default().polling_interval,
            Setting::Tuned => Duration::from_millis(50),
        }
    }

    fn queue_options(self) -> QueueOptions {
        QueueOptions {
            partition_concurrency: Some(1),
            polling_interval: self.polling_interval(),
            ..QueueOptions::default()
        }
    }
}

struct Args {
    database_url: String,
    workflows: u64,
    latency_samples: usize,
    settings: Vec<Setting>,
    timeout: Duration,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        database_url: DEFAULT_URL.to_owned(),
        workflows: 2000,
        latency_samples: 50,
        settings: vec![Setting::Default, Setting::Tuned],
        timeout: Duration::from_secs(600),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--database-url" => args.database_url = value()?,
            "--workflows" => {
                args.workflows = value()?.parse().context("--workflows takes a number")?
            }
            "--latency-samples" => {
                args.latency_samples = value()?
                    .parse()
                    .context("--latency-samples takes a number")?
            }
            "--setting" => {
                args.settings = match value()?.as_str() {
                    "default" => vec![Setting::Default],
                    "tuned" => vec![Setting::Tuned],
                    "both" => vec![Setting::Default, Setting::Tuned],
                    other => bail!("--setting must be default, tuned or both, not {other}"),
                }
            }
            "--backend" => {
                let backend = value()?;
                if backend != "postgres" && backend != "both" {
                    bail!("dbos runs on Postgres only; --backend {backend} is not available");
                }
            }
            "--timeout-secs" => {
                args.timeout = Duration::from_secs(
                    value()?.parse().context("--timeout-secs takes a number")?,
                )
            }
            "-h" | "--help" => {
                eprintln!(
                    "usage: dbos-peer [--database-url URL] [--workflows N] [--latency-samples N] \
                     [--setting default|tuned|both] [--backend postgres] [--timeout-secs S]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other}"),
        }
    }
    if args.workflows == 0 {
        bail!("--workflows must be at least 1");
    }
    Ok(args)
}

/// The workflow under test: three trivial steps, each returning a small value.
async fn bench_workflow(input: u64) -> dbos::Result<u64> {
    let a = dbos::step("step1", move || async move {
        if input >= LATENCY_BASE {
            FIRST_STEP_STARTS
                .lock()
                .expect("start map poisoned")
                .insert(input, Instant::now());
        }
        Ok::<u64, dbos::Error>(input + 1)
    })
    .await?;
    let b = dbos::step("step2", move || async move { Ok::<u64, dbos::Error>(a + 2) }).await?;
    let c = dbos::step("step3", move || async move { Ok::<u64, dbos::Error>(b + 3) }).await?;
    Ok(c)
}

/// A DBOS instance with the benchmark workflow registered, not yet launched.
fn instance(url: &str, listen_queues: Option<Vec<String>>) -> Result<(DBOS, WorkflowRef<u64, u64>)> {
    let dbos = DBOS::new(Config {
        app_version: Some(APP_VERSION.to_owned()),
        listen_queues,
        ..Config::new(APP_NAME, url)
    });
    let workflow = dbos
        .register_workflow(WORKFLOW, bench_workflow)
        .context("registering the benchmark workflow")?;
    Ok((dbos, workflow))
}

async fn enqueue(workflow: &WorkflowRef<u64, u64>, input: u64, key: &str) -> Result<WorkflowHandle<u64>> {
    workflow
        .start_with(
            input,
            StartOptions {
                queue: Some(Enqueue {
                    partition_key: Some(key),
                    ..Enqueue::new(QUEUE)
                }),
                ..StartOptions::default()
            },
        )
        .await
        .map_err(|e| anyhow!("enqueueing workflow {input}: {e}"))
}

/// `url` with its database name replaced by `db`.
fn with_database(url: &str, db: &str) -> Result<String> {
    let scheme_end = url.find("://").context("database URL has no scheme")? + 3;
    let (base, query) = match url.find('?') {
        Some(q) => (&url[..q], &url[q..]),
        None => (url, ""),
    };
    let authority_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    Ok(format!("{}/{db}{query}", &base[..authority_end]))
}

async fn admin_exec(admin: &PgPool, sql: String) -> Result<()> {
    admin
        .execute(AssertSqlSafe(sql.clone()))
        .await
        .with_context(|| format!("running `{sql}`"))?;
    Ok(())
}

/// (succeeded, failed) workflow counts as the system database holds them.
async fn outcome_counts(pool: &PgPool) -> Result<(i64, i64)> {
    sqlx::query_as::<_, (i64, i64)>(
        "SELECT count(*) FILTER (WHERE status = 'SUCCESS'), \
                count(*) FILTER (WHERE status IN ('ERROR', 'CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED')) \
         FROM dbos.workflow_status",
    )
    .fetch_one(pool)
    .await
    .context("counting finished workflows")
}

/// xorshift64 seeded from the clock: enough to scatter the latency probes over the poll cycle.
struct Jitter(u64);

impl Jitter {
    fn new() -> Self {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0x9E37_79B9, |d| d.as_nanos() as u64);
        Self(nanos | 1)
    }

    fn below(&mut self, bound: Duration) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        bound.mul_f64((self.0 % 1_000_000) as f64 / 1_000_000.0)
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn round(x: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (x * f).round() / f
}

struct Outcome {
    /// Time from `launch()` returning to the last `SUCCESS` (or to the timeout).
    seconds: f64,
    /// Workflows in `SUCCESS` when the clock stopped: N, unless the run timed out.
    completed: u64,
    timed_out: bool,
    launch_seconds: f64,
    latencies_ms: Vec<f64>,
    /// Why the latency probe stopped early, if it did.
    latency_aborted: Option<String>,
}

async fn run_setting(args: &Args, setting: Setting) -> Result<Outcome> {
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&args.database_url)
        .await
        .with_context(|| format!("connecting to {}", args.database_url))?;
    let db = format!("bench_dbos_{}_{}", std::process::id(), setting.name());
    admin_exec(&admin, format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")).await?;
    admin_exec(&admin, format!("CREATE DATABASE {db}")).await?;
    let url = with_database(&args.database_url, &db)?;

    let result = measure(args, setting, &url).await;

    admin_exec(&admin, format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")).await?;
    admin.close().await;
    result
}

async fn measure(args: &Args, setting: Setting, url: &str) -> Result<Outcome> {
    let label = format!("dbos {}", setting.name());
    // Phase 1: an instance that listens to no queue creates the schema, registers the queue and
    // enqueues everything, then goes away.
    let (enqueuer, workflow) = instance(url, Some(Vec::new()))?;
    enqueuer
        .launch()
        .await
        .map_err(|e| anyhow!("launching the enqueuing instance: {e}"))?;
    let queue = enqueuer
        .register_queue(QUEUE, setting.queue_options(), QueueConflict::AlwaysUpdate)
        .await
        .map_err(|e| anyhow!("registering the queue: {e}"))?;
    eprintln!(
        "[{label}] queue: partition_concurrency={:?} worker_concurrency={:?} polling_interval={:?}",
        queue.partition_concurrency(),
        queue.worker_concurrency(),
        queue.polling_interval()
    );
    let enqueue_start = Instant::now();
    for i in 0..args.workflows {
        enqueue(&workflow, i, &format!("p{}", i % PARTITIONS)).await?;
    }
    eprintln!(
        "[{label}] enqueued {} workflows in {:.2?}",
        args.workflows,
        enqueue_start.elapsed()
    );
    enqueuer.shutdown().await;

    let counter = PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .context("connecting the progress poller")?;

    // Phase 2: the worker drains the backlog.
    let (worker, workflow) = instance(url, None)?;
    let launch_start = Instant::now();
    worker
        .launch()
        .await
        .map_err(|e| anyhow!("launching the worker: {e}"))?;
    let started = Instant::now();
    let launch_seconds = (started - launch_start).as_secs_f64();
    let target = i64::try_from(args.workflows)?;
    let (seconds, completed, timed_out) = loop {
        let (done, failed) = outcome_counts(&counter).await?;
        if failed > 0 {
            bail!("{failed} workflows did not succeed");
        }
        if done >= target {
            break (started.elapsed().as_secs_f64(), args.workflows, false);
        }
        if started.elapsed() > args.timeout {
            break (started.elapsed().as_secs_f64(), u64::try_from(done)?, true);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    if timed_out {
        eprintln!(
            "[{label}] TIMED OUT: {completed} of {} workflows finished in {seconds:.3} s; \
             skipping the latency probe",
            args.workflows
        );
        worker.shutdown().await;
        counter.close().await;
        return Ok(Outcome {
            seconds,
            completed,
            timed_out,
            launch_seconds,
            latencies_ms: Vec::new(),
            latency_aborted: None,
        });
    }
    eprintln!("[{label}] {} workflows finished in {seconds:.3} s", args.workflows);

    // Phase 3: start latency, one workflow at a time against the idle worker.
    let mut jitter = Jitter::new();
    let mut latencies_ms = Vec::with_capacity(args.latency_samples);
    let mut latency_aborted = None;
    'samples: for k in 0..args.latency_samples as u64 {
        tokio::time::sleep(jitter.below(setting.polling_interval())).await;
        let input = LATENCY_BASE + k;
        let enqueued_at = Instant::now();
        let handle = enqueue(&workflow, input, &format!("p{}", k % PARTITIONS)).await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = handle
                .status()
                .await
                .map_err(|e| anyhow!("reading latency sample {k}: {e}"))?;
            match status {
                WorkflowStatus::Success => break,
                WorkflowStatus::Enqueued | WorkflowStatus::Pending | WorkflowStatus::Delayed => {}
                other => bail!("latency sample {k} ended {other:?}"),
            }
            if Instant::now() > deadline {
                latency_aborted = Some(format!("sample {k} did not finish within 60 s"));
                eprintln!("[{label}] latency probe aborted: sample {k} did not finish within 60 s");
                break 'samples;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let first_step = FIRST_STEP_STARTS
            .lock()
            .expect("start map poisoned")
            .remove(&input)
            .with_context(|| format!("latency sample {k} recorded no first-step start"))?;
        let latency_ms = (first_step - enqueued_at).as_secs_f64() * 1000.0;
        eprintln!("[{label}] latency sample {k}: {latency_ms:.2} ms");
        latencies_ms.push(latency_ms);
    }
    worker.shutdown().await;
    counter.close().await;

    Ok(Outcome {
        seconds,
        completed,
        timed_out,
        launch_seconds,
        latencies_ms,
        latency_aborted,
    })
}

/// One result line with the fields in the agreed order, whatever serde_json's map ordering is.
fn result_line(
    setting: &str,
    workflows: u64,
    seconds: f64,
    wf_per_s: f64,
    p50: Option<f64>,
    p99: Option<f64>,
    note: &str,
) -> String {
    let num = |x: Option<f64>| {
        x.filter(|x| x.is_finite())
            .map_or_else(|| "null".to_owned(), |x| serde_json::Value::from(x).to_string())
    };
    format!(
        "{{\"engine\":\"dbos\",\"backend\":\"postgres\",\"setting\":{},\
         \"workflows\":{workflows},\"seconds\":{},\"wf_per_s\":{},\"latency_p50_ms\":{},\
         \"latency_p99_ms\":{},\"note\":{}}}",
        serde_json::Value::from(setting),
        num(Some(seconds)),
        num(Some(wf_per_s)),
        num(p50),
        num(p99),
        serde_json::Value::from(note),
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .init();
    let args = parse_args()?;
    for &setting in &args.settings {
        let outcome = run_setting(&args, setting)
            .await
            .with_context(|| format!("dbos {} run", setting.name()))?;
        let mut sorted = outcome.latencies_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let mut note = format!(
            "dbos 0.5; one partitioned queue, {PARTITIONS} keys, partition_concurrency=1 \
             (fleet-wide); polling_interval={}ms (dbos starts each queue worker at 1 s and \
             scales 0.9x per clean poll down to it; backoff ceiling 120 s, fixed); \
             worker_concurrency=unlimited; pool=10; timer from worker launch() return (launch \
             took {:.3}s, not counted); latency = first-step start - enqueue call, {} samples",
            setting.polling_interval().as_millis(),
            outcome.launch_seconds,
            sorted.len()
        );
        if outcome.timed_out {
            note.push_str(&format!(
                "; TIMED OUT: only {} of {} workflows reached SUCCESS within {:.0}s, wf_per_s \
                 is completed/elapsed, latency not measured",
                outcome.completed, args.workflows, outcome.seconds
            ));
        }
        if let Some(aborted) = &outcome.latency_aborted {
            note.push_str(&format!("; latency probe aborted: {aborted}"));
        }
        let (p50, p99) = if sorted.is_empty() {
            (None, None)
        } else {
            (
                Some(round(percentile(&sorted, 50.0), 2)),
                Some(round(percentile(&sorted, 99.0), 2)),
            )
        };
        println!(
            "{}",
            result_line(
                setting.name(),
                args.workflows,
                round(outcome.seconds, 3),
                round(outcome.completed as f64 / outcome.seconds, 1),
                p50,
                p99,
                &note,
            )
        );
    }
    Ok(())
}
