//! durare-peer owns the durare (crate `durare` 0.5) side of the queue benchmark: it runs the
//! shared workload on Postgres and on SQLite and prints one JSON line per (backend, setting) on
//! stdout.
//!
//! # Workload
//!
//! N workflows (default 2,000) of three trivial steps each are enqueued onto ONE queue that is
//! partitioned by key: workflow `i` carries partition key `p{i % 50}`. The queue is
//! `WorkflowQueue::new(..).partitioned().worker_concurrency(1)`: on a partitioned queue durare
//! scopes every budget to the partition key, so this is "at most one running workflow per key in
//! this process" (the documented idiom). The benchmark process itself is the only worker.
//!
//! # Throughput method
//!
//! The engine is built (schema migrated, workflow and queue registered) and all N workflows are
//! enqueued with `engine.start(.., WorkflowOptions::queue(..).partition_key(..))` BEFORE
//! `engine.launch()`, so no dispatcher exists while the backlog is written. The clock starts the
//! moment `launch()` returns (the queue dispatchers are spawned at the end of `launch`, so nothing
//! has been consumed before that) and stops when a poll of `workflow_status` (every 10 ms, on a
//! connection of our own) counts N rows in `SUCCESS`. Throughput = N / that time. The time
//! `launch()` itself took is reported in `note`, not counted.
//!
//! # Start-latency method
//!
//! With the engine launched, idle and the queue empty, one workflow is enqueued at a time on the
//! same queue (partition key `p{k % 50}`). Its first step records `Instant::now()` when its body
//! starts; latency = that instant - the instant taken immediately before the enqueue call. We then
//! wait for the workflow to reach `SUCCESS` before the next sample. Before each sample we sleep a
//! pseudo-random gap in [0, queue polling interval) so the enqueue lands at a random phase of the
//! poll cycle. p50 and p99 are nearest-rank percentiles (with 50 samples, p99 is the maximum).
//!
//! # Settings
//!
//! - `default`: `WorkflowQueue::new` defaults — base polling interval 1 s, max_tasks_per_iteration
//!   100 — plus `partitioned()` and `worker_concurrency(1)` (the per-partition limit).
//! - `tuned`: the same with `base_polling_interval(50 ms)` and `max_polling_interval(50 ms)`, so a
//!   failed dequeue cannot back the poll off past 50 ms. There is no process-wide concurrency knob
//!   on a partitioned queue (`worker_concurrency` is re-scoped per key), so concurrency is
//!   unchanged and already unbounded across keys: 50 partitions x 1 caps in-flight at 50.
//!
//! On SQLite durare's dequeue is a deferred transaction (read, then write); while workflows commit
//! steps on other pooled connections it fails with SQLITE_BUSY ("database is locked") and the
//! dispatcher doubles its interval towards `max_polling_interval` (120 s by default), so the
//! default setting nearly stalls there. The count of failed polls is reported in `note`.
//!
//! Each Postgres run uses a fresh database `bench_durare_<pid>_<setting>`, created and dropped
//! through the `postgres` database named by `--database-url`; each SQLite run uses a fresh file
//! in the temp directory, deleted afterwards.

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use durare::{DurableContext, DurableEngine, WorkflowHandle, WorkflowOptions, WorkflowQueue};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::Executor as _;

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
            Setting::Default => WorkflowQueue::new(QUEUE).base_polling_interval,
            Setting::Tuned => Duration::from_millis(50),
        }
    }

    fn queue(self) -> WorkflowQueue {
        let queue = WorkflowQueue::new(QUEUE)
            .partitioned()
            .worker_concurrency(1)
            .base_polling_interval(self.polling_interval());
        match self {
            Setting::Default => queue,
            // "Poll every 50 ms" taken literally: without this a failed dequeue doubles the
            // interval up to the 120 s default ceiling, which on SQLite (see the module docs)
            // happens constantly.
            Setting::Tuned => queue.max_polling_interval(self.polling_interval()),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        }
    }
}

struct Args {
    database_url: String,
    workflows: u64,
    latency_samples: usize,
    settings: Vec<Setting>,
    backends: Vec<Backend>,
    timeout: Duration,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        database_url: DEFAULT_URL.to_owned(),
        workflows: 2000,
        latency_samples: 50,
        settings: vec![Setting::Default, Setting::Tuned],
        backends: vec![Backend::Postgres, Backend::Sqlite],
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
                args.backends = match value()?.as_str() {
                    "postgres" => vec![Backend::Postgres],
                    "sqlite" => vec![Backend::Sqlite],
                    "both" => vec![Backend::Postgres, Backend::Sqlite],
                    other => bail!("--backend must be postgres, sqlite or both, not {other}"),
                }
            }
            "--timeout-secs" => {
                args.timeout = Duration::from_secs(
                    value()?.parse().context("--timeout-secs takes a number")?,
                )
            }
            "-h" | "--help" => {
                eprintln!(
                    "usage: durare-peer [--database-url URL] [--workflows N] [--latency-samples N] \
                     [--setting default|tuned|both] [--backend postgres|sqlite|both] \
                     [--timeout-secs S]"
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
async fn bench_workflow(ctx: DurableContext, input: u64) -> durare::Result<u64> {
    let a = ctx
        .step("step1", move || async move {
            if input >= LATENCY_BASE {
                FIRST_STEP_STARTS
                    .lock()
                    .expect("start map poisoned")
                    .insert(input, Instant::now());
            }
            Ok::<u64, durare::Error>(input + 1)
        })
        .await?;
    let b = ctx
        .step("step2", move || async move { Ok::<u64, durare::Error>(a + 2) })
        .await?;
    let c = ctx
        .step("step3", move || async move { Ok::<u64, durare::Error>(b + 3) })
        .await?;
    Ok(c)
}

async fn enqueue(engine: &DurableEngine, input: u64, key: String) -> Result<WorkflowHandle<u64>> {
    engine
        .start::<u64, u64>(
            WORKFLOW,
            input,
            WorkflowOptions::default().queue(QUEUE).partition_key(key),
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
        .execute(sql.as_str())
        .await
        .with_context(|| format!("running `{sql}`"))?;
    Ok(())
}

/// A connection of our own for watching progress, independent of the engine's pool.
enum Counter {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

impl Counter {
    /// (succeeded, failed) workflow counts as the system database holds them.
    async fn counts(&self) -> Result<(i64, i64)> {
        const FILTERS: &str = "count(CASE WHEN status = 'SUCCESS' THEN 1 END), \
             count(CASE WHEN status IN ('ERROR', 'CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED') \
             THEN 1 END)";
        match self {
            Counter::Postgres(pool) => sqlx::query_as::<_, (i64, i64)>(&format!(
                "SELECT {FILTERS} FROM dbos.workflow_status"
            ))
            .fetch_one(pool)
            .await
            .context("counting finished workflows"),
            Counter::Sqlite(pool) => sqlx::query_as::<_, (i64, i64)>(&format!(
                "SELECT {FILTERS} FROM workflow_status"
            ))
            .fetch_one(pool)
            .await
            .context("counting finished workflows"),
        }
    }

    async fn close(&self) {
        match self {
            Counter::Postgres(pool) => pool.close().await,
            Counter::Sqlite(pool) => pool.close().await,
        }
    }
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
    /// Failed dequeue polls over the whole run, from `engine.metrics()`.
    dequeue_errors: u64,
}

fn sqlite_files(path: &PathBuf) -> Vec<PathBuf> {
    ["", "-wal", "-shm", "-journal"]
        .iter()
        .map(|suffix| {
            let mut name = path.as_os_str().to_owned();
            name.push(suffix);
            PathBuf::from(name)
        })
        .collect()
}

async fn run(args: &Args, backend: Backend, setting: Setting) -> Result<Outcome> {
    let tag = format!("{}_{}", std::process::id(), setting.name());
    match backend {
        Backend::Postgres => {
            let admin = PgPoolOptions::new()
                .max_connections(1)
                .connect(&args.database_url)
                .await
                .with_context(|| format!("connecting to {}", args.database_url))?;
            let db = format!("bench_durare_{tag}");
            admin_exec(&admin, format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")).await?;
            admin_exec(&admin, format!("CREATE DATABASE {db}")).await?;
            let url = with_database(&args.database_url, &db)?;
            let result = async {
                let counter = Counter::Postgres(
                    PgPoolOptions::new()
                        .max_connections(1)
                        .connect(&url)
                        .await
                        .context("connecting the progress poller")?,
                );
                let outcome = measure(args, backend, setting, &url, &counter).await;
                counter.close().await;
                outcome
            }
            .await;
            admin_exec(&admin, format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")).await?;
            admin.close().await;
            result
        }
        Backend::Sqlite => {
            let path = std::env::temp_dir().join(format!("bench_durare_{tag}.db"));
            for file in sqlite_files(&path) {
                let _ = std::fs::remove_file(file);
            }
            let url = format!("sqlite://{}", path.display());
            // The engine connects first so that it creates the file and the schema; the
            // counter opens it read-only afterwards.
            let result = measure_sqlite(args, setting, &url).await;
            for file in sqlite_files(&path) {
                let _ = std::fs::remove_file(file);
            }
            result
        }
    }
}

async fn measure_sqlite(args: &Args, setting: Setting, url: &str) -> Result<Outcome> {
    // Create the file (and let durare migrate it) before opening our own read connection.
    let engine = build_engine(url, setting).await?;
    let counter = Counter::Sqlite(
        SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(SqliteConnectOptions::from_str(url)?.read_only(true))
            .await
            .context("connecting the progress poller")?,
    );
    let outcome = measure_with(args, Backend::Sqlite, setting, engine, &counter).await;
    counter.close().await;
    outcome
}

async fn build_engine(url: &str, setting: Setting) -> Result<DurableEngine> {
    let mut builder = DurableEngine::connect(url)
        .await
        .map_err(|e| anyhow!("connecting durare to {url}: {e}"))?;
    builder
        .register(WORKFLOW, bench_workflow)
        .register_queue(setting.queue())
        .app_version(APP_VERSION);
    builder
        .build()
        .await
        .map_err(|e| anyhow!("building the durare engine: {e}"))
}

async fn measure(
    args: &Args,
    backend: Backend,
    setting: Setting,
    url: &str,
    counter: &Counter,
) -> Result<Outcome> {
    let engine = build_engine(url, setting).await?;
    measure_with(args, backend, setting, engine, counter).await
}

async fn measure_with(
    args: &Args,
    backend: Backend,
    setting: Setting,
    engine: DurableEngine,
    counter: &Counter,
) -> Result<Outcome> {
    let label = format!("durare {} {}", backend.name(), setting.name());
    let queue = setting.queue();
    eprintln!(
        "[{label}] queue: partitioned={} worker_concurrency(per partition)={:?} \
         global_concurrency={:?} base_polling_interval={:?} max_tasks_per_iteration={}",
        queue.partitioned,
        queue.worker_concurrency,
        queue.global_concurrency,
        queue.base_polling_interval,
        queue.max_tasks_per_iteration
    );

    // Phase 1: the whole backlog is written before any dispatcher exists.
    let enqueue_start = Instant::now();
    for i in 0..args.workflows {
        enqueue(&engine, i, format!("p{}", i % PARTITIONS)).await?;
    }
    eprintln!(
        "[{label}] enqueued {} workflows in {:.2?}",
        args.workflows,
        enqueue_start.elapsed()
    );

    // Phase 2: launch the dispatchers and drain.
    let launch_start = Instant::now();
    engine
        .launch()
        .await
        .map_err(|e| anyhow!("launching the engine: {e}"))?;
    let started = Instant::now();
    let launch_seconds = (started - launch_start).as_secs_f64();
    let target = i64::try_from(args.workflows)?;
    let (seconds, completed, timed_out) = loop {
        let (done, failed) = counter.counts().await?;
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
        let dequeue_errors = dequeue_errors(&engine).await;
        engine
            .shutdown(Duration::from_secs(5))
            .await
            .map_err(|e| anyhow!("shutting the engine down: {e}"))?;
        return Ok(Outcome {
            seconds,
            completed,
            timed_out,
            launch_seconds,
            latencies_ms: Vec::new(),
            latency_aborted: None,
            dequeue_errors,
        });
    }
    eprintln!("[{label}] {} workflows finished in {seconds:.3} s", args.workflows);

    // Phase 3: start latency, one workflow at a time against the idle engine.
    let mut jitter = Jitter::new();
    let mut latencies_ms = Vec::with_capacity(args.latency_samples);
    let mut latency_aborted = None;
    'samples: for k in 0..args.latency_samples as u64 {
        tokio::time::sleep(jitter.below(setting.polling_interval())).await;
        let input = LATENCY_BASE + k;
        let enqueued_at = Instant::now();
        let handle = enqueue(&engine, input, format!("p{}", k % PARTITIONS)).await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = handle
                .get_status()
                .await
                .map_err(|e| anyhow!("reading latency sample {k}: {e}"))?
                .status;
            match status.as_str() {
                durare::STATUS_SUCCESS => break,
                durare::STATUS_ENQUEUED | durare::STATUS_PENDING | durare::STATUS_DELAYED => {}
                other => bail!("latency sample {k} ended {other}"),
            }
            if Instant::now() > deadline {
                // A dispatcher backed off towards its 120 s ceiling can leave one sample waiting
                // that long; report the probe as aborted rather than stall the whole run.
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
    let dequeue_errors = dequeue_errors(&engine).await;
    engine
        .shutdown(Duration::from_secs(5))
        .await
        .map_err(|e| anyhow!("shutting the engine down: {e}"))?;
    drop(engine);

    Ok(Outcome {
        seconds,
        completed,
        timed_out,
        launch_seconds,
        latencies_ms,
        latency_aborted,
        dequeue_errors,
    })
}

/// The engine's own count of failed dequeue polls (0 if the metrics read itself fails).
async fn dequeue_errors(engine: &DurableEngine) -> u64 {
    match engine.metrics().await {
        Ok(metrics) => metrics.dequeue_errors_total,
        Err(e) => {
            eprintln!("could not read durare metrics: {e}");
            0
        }
    }
}

/// One result line with the fields in the agreed order, whatever serde_json's map ordering is.
#[allow(clippy::too_many_arguments)]
fn result_line(
    backend: &str,
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
        "{{\"engine\":\"durare\",\"backend\":{},\"setting\":{},\"workflows\":{workflows},\
         \"seconds\":{},\"wf_per_s\":{},\"latency_p50_ms\":{},\"latency_p99_ms\":{},\
         \"note\":{}}}",
        serde_json::Value::from(backend),
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
    for &backend in &args.backends {
        for &setting in &args.settings {
            let outcome = run(&args, backend, setting)
                .await
                .with_context(|| format!("durare {} {} run", backend.name(), setting.name()))?;
            let mut sorted = outcome.latencies_ms.clone();
            sorted.sort_by(f64::total_cmp);
            let pool = match backend {
                Backend::Postgres => 8,
                Backend::Sqlite => 5,
            };
            let queue = setting.queue();
            let mut note = format!(
                "durare 0.5; one partitioned queue, {PARTITIONS} keys, worker_concurrency=1 \
                 (per partition, this process; durare has no process-wide cap on a partitioned \
                 queue); base_polling_interval={}ms; max_polling_interval={}ms; pool={pool}; \
                 timer from launch() return (launch took {:.3}s, not counted); latency = \
                 first-step start - enqueue call, {} samples",
                queue.base_polling_interval.as_millis(),
                queue.max_polling_interval.as_millis(),
                outcome.launch_seconds,
                sorted.len()
            );
            if outcome.timed_out {
                note.push_str(&format!(
                    "; TIMED OUT: only {} of {} workflows reached SUCCESS within {:.0}s, \
                     wf_per_s is completed/elapsed, latency not measured",
                    outcome.completed,
                    args.workflows,
                    outcome.seconds
                ));
            }
            if let Some(aborted) = &outcome.latency_aborted {
                note.push_str(&format!("; latency probe aborted: {aborted}"));
            }
            if outcome.dequeue_errors > 0 {
                note.push_str(&format!(
                    "; {} dequeue polls failed (engine metric dequeue_errors_total; on SQLite \
                     these are SQLITE_BUSY 'database is locked') and the dispatcher backed off",
                    outcome.dequeue_errors
                ));
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
                    backend.name(),
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
    }
    Ok(())
}
