//! manent-engine-bench runs the benchmark peers' queue workload on manent's own engine
//! (`crates/manent-engine`), on Postgres and on SQLite, and prints one JSON line per
//! (backend, setting) on stdout, in the peers' format with `"engine":"manent"`.
//!
//! `--mode backlog` (backlog.rs) and `--mode workers` (workers.rs, whose child processes run
//! this binary with `--worker`) are manent-only measurements; this file is the peers' mode,
//! the workflow all modes share, and the argument parsing.
//!
//! # Workload (the peers', unchanged)
//!
//! N workflows (default 2,000) of three trivial steps each (input + 1, + 2, + 3; no sleep) are
//! enqueued onto ONE queue partitioned by key: workflow `i` carries partition key `p{i % 50}`, and
//! the queue is served with `QueueSpec::partition_concurrency(1)` (at most one running workflow
//! per key, across all executors: the claim transaction counts it). The benchmark process itself
//! is the only executor.
//!
//! # Throughput method
//!
//! The store is opened (schema migrated), the workflow registered and the queue listened to, and
//! all N workflows are enqueued through the engine's `Client` BEFORE `engine.launch()`, so no
//! claim loop exists while the backlog is written. The clock starts the moment `launch()` returns
//! (the claim loop is the last thing `launch` spawns, so nothing has been consumed before that)
//! and stops when a poll of `manent_workflows` (every 10 ms, on a connection of our own) counts N
//! rows in `SUCCESS`. Throughput = N / that time. The time `launch()` itself took is reported in
//! `note`, not counted.
//!
//! # Start-latency method
//!
//! With the engine launched, idle and the queue empty, one workflow is enqueued at a time on the
//! same queue (partition key `p{k % 50}`) through the engine's own client, as the peers do. Its
//! first step records `Instant::now()` when its body starts; latency = that instant - the instant
//! taken immediately before the enqueue call. We then wait (`Client::wait`) for the workflow to
//! reach `SUCCESS` before the next sample. Before each sample we sleep a pseudo-random gap in
//! [0, the store's fallback poll interval) — 1 s on Postgres, 50 ms on SQLite — so the enqueue
//! lands at a random phase of that poll. manent does not rely on the poll for this: an enqueue
//! wakes the claim loop at once (the in-process wake-up bus; on Postgres also LISTEN/NOTIFY).
//! p50 and p99 are nearest-rank percentiles (with 50 samples, p99 is the maximum).
//!
//! # Settings
//!
//! - `default`: `EngineConfig::new` defaults (claim batch 64, fallback poll from the store) and
//!   `QueueSpec::new(..).worker_concurrency(50).partition_concurrency(1)`.
//! - `tuned`: see [`Setting::tune`]; what it changes is written into `note`.
//!
//! Each Postgres run uses a fresh database `bench_manent_<pid>_<setting>`, created and dropped
//! through the database named by `--database-url`; each SQLite run uses a fresh file in the temp
//! directory, deleted afterwards with its `-wal`/`-shm` files and the engine's `.executors` lock
//! directory.

mod backlog;
mod fresh;
mod workers;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use manent_engine::{
    Client, Database, Engine, EngineConfig, EngineError, EnqueueRequest, QueueSpec, StepPolicy,
    WorkflowContext, WorkflowError, WorkflowStatus,
    store::{self, Store},
};
use sqlx::Executor as _;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

const EXECUTOR_ID: &str = "bench-manent";
const QUEUE: &str = "bench";
const WORKFLOW: &str = "bench_workflow";
const PARTITIONS: u64 = 50;
const WORKER_CONCURRENCY: u32 = 50;
/// Inputs at or above this are latency samples; their first step reports its start instant.
const LATENCY_BASE: u64 = 1_000_000_000;
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// How long each step sleeps (0 in the peers' workload; `--step-sleep-ms` in the workers mode,
/// where it makes the steps I/O-bound).
static STEP_SLEEP_MS: AtomicU64 = AtomicU64::new(0);
/// `--record-start`: every step records its start before its body runs
/// (`StepPolicy::recording_start`, one write more per step), to measure what that costs.
pub(crate) static RECORD_START: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
/// SQL statements the engine sent in this process, as sqlx logs them (`--count-statements`;
/// the progress counter's own connection logs nothing). SQLite's `BEGIN` and `COMMIT` go to
/// its worker thread without the logger and are not counted; PostgreSQL's are.
static STATEMENTS: AtomicU64 = AtomicU64::new(0);
/// Workflow bodies that returned in this process. The backlog mode watches it instead of
/// counting rows every 10 ms, which would scan a growing table while being measured.
static FINISHED: AtomicU64 = AtomicU64::new(0);
/// Workflow bodies that began in this process (nothing crashes here, so each body begins once):
/// the backlog mode's count of what is still queued is rows enqueued minus this.
static STARTED: AtomicU64 = AtomicU64::new(0);

/// Start instants recorded by the first step of latency-sample workflows, keyed by input.
static FIRST_STEP_STARTS: LazyLock<Mutex<HashMap<u64, Instant>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Setting {
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

    fn config(self) -> EngineConfig {
        let config = EngineConfig::new(EXECUTOR_ID);
        match self {
            Setting::Default => config,
            Setting::Tuned => Self::tune(config),
        }
    }

    /// The tuned configuration. manent has no poll interval that matters to an idle worker
    /// (enqueues wake the claim loop), and with 50 keys x partition concurrency 1 at most 50
    /// workflows can run, which one claim of the default batch (64) already takes. Neither a
    /// `claim_batch` of 8, 16 or 50 nor a 50 ms fallback poll measured better than the noise of
    /// a shared 2-core machine (see bench/README.md), so tuned is the default configuration,
    /// run a second time.
    fn tune(config: EngineConfig) -> EngineConfig {
        config
    }

    fn tuned_note(self) -> &'static str {
        match self {
            Setting::Default => "EngineConfig defaults",
            Setting::Tuned => {
                "tuned = EngineConfig defaults (no setting measured better: claim batch and \
                 fallback poll do not bind this workload)"
            }
        }
    }

    fn queue(self) -> QueueSpec {
        QueueSpec::new(QUEUE)
            .worker_concurrency(WORKER_CONCURRENCY)
            .partition_concurrency(1)
    }
}

/// How the backlog mode holds its backlog while it is timed (backlog.rs).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum BacklogMethod {
    /// The queue is topped up so that about N stay queued through the whole timed window.
    Constant,
    /// The backlog is enqueued once and drained (the method before 2026-12-01 06:00 UTC).
    Drain,
}

impl BacklogMethod {
    pub(crate) fn name(self) -> &'static str {
        match self {
            BacklogMethod::Constant => "constant",
            BacklogMethod::Drain => "drain",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        }
    }
}

/// What one invocation measures.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    /// The peers' workload (throughput and start latency), comparable with bench/peers.
    Peers,
    /// Throughput with a large backlog over many partitions (backlog.rs).
    Backlog,
    /// Throughput of 1, 2, 4… worker processes on one PostgreSQL (workers.rs).
    Workers,
    /// A child of the workers mode: one executor serving the queue until stdin closes.
    Worker,
}

pub(crate) struct Args {
    pub mode: Mode,
    pub database_url: String,
    pub workflows: u64,
    pub latency_samples: usize,
    pub settings: Vec<Setting>,
    pub backends: Vec<Backend>,
    pub timeout: Duration,
    /// Backlog mode: the backlog sizes, one fresh database each.
    pub backlogs: Vec<u64>,
    /// Backlog mode: how many times every (backend, backlog) is measured, the backlogs
    /// alternating within each round, so that a slow minute of the machine falls on all of
    /// them rather than on one.
    pub rounds: u32,
    /// Backlog and workers modes: workflow `i` has key `p{i % partitions}`.
    pub partitions: u64,
    /// Backlog mode: constant backlog (default) or drain.
    pub backlog_method: BacklogMethod,
    /// Backlog mode: workflows timed (constant: finished in the window; drain: the clock stops
    /// at min(backlog, window) in SUCCESS).
    pub window: u64,
    /// Backlog mode, constant method: workflows finished before the clock starts (default: a
    /// tenth of the window).
    pub warmup: Option<u64>,
    /// Backlog mode, constant method: requests per `Client::enqueue_many` call of the top-up.
    pub top_up: u64,
    /// Backlog mode: requests per `Client::enqueue_many` call.
    pub chunk: usize,
    /// Workers mode: the numbers of worker processes, one fresh database each.
    pub workers: Vec<u32>,
    pub step_sleep_ms: u64,
    /// Backlog mode and each worker process: the queue's worker concurrency.
    pub worker_concurrency: Option<u32>,
    /// Worker child: its executor id.
    pub executor_id: String,
    /// Peers mode: count the engine's SQL statements in the timed window (costs CPU).
    pub count_statements: bool,
}

fn list<T: FromStr>(flag: &str, value: &str) -> Result<Vec<T>> {
    value
        .split(',')
        .map(|v| {
            v.trim()
                .replace('_', "")
                .parse()
                .map_err(|_| anyhow!("{flag} takes a comma-separated list of numbers, not {value}"))
        })
        .collect()
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        mode: Mode::Peers,
        database_url: DEFAULT_URL.to_owned(),
        workflows: 2000,
        latency_samples: 50,
        settings: vec![Setting::Default, Setting::Tuned],
        backends: vec![Backend::Postgres, Backend::Sqlite],
        timeout: Duration::from_secs(600),
        backlogs: vec![1_000, 10_000, 100_000],
        rounds: 1,
        partitions: 5_000,
        backlog_method: BacklogMethod::Constant,
        window: 10_000,
        warmup: None,
        top_up: 100,
        chunk: 1_000,
        workers: vec![1, 2, 4],
        step_sleep_ms: 50,
        worker_concurrency: None,
        executor_id: EXECUTOR_ID.to_owned(),
        count_statements: false,
    };
    let mut workflows_set = false;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--mode" => {
                args.mode = match value()?.as_str() {
                    "peers" => Mode::Peers,
                    "backlog" => Mode::Backlog,
                    "workers" => Mode::Workers,
                    other => bail!("--mode must be peers, backlog or workers, not {other}"),
                }
            }
            "--worker" => args.mode = Mode::Worker,
            "--record-start" => RECORD_START.store(true, Ordering::SeqCst),
            "--count-statements" => args.count_statements = true,
            "--executor-id" => args.executor_id = value()?,
            "--database-url" => args.database_url = value()?,
            "--workflows" => {
                args.workflows = value()?.parse().context("--workflows takes a number")?;
                workflows_set = true;
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
                args.timeout =
                    Duration::from_secs(value()?.parse().context("--timeout-secs takes a number")?)
            }
            "--backlogs" => args.backlogs = list("--backlogs", &value()?)?,
            "--rounds" => args.rounds = value()?.parse().context("--rounds takes a number")?,
            "--partitions" => {
                args.partitions = value()?.parse().context("--partitions takes a number")?
            }
            "--window" => args.window = value()?.parse().context("--window takes a number")?,
            "--backlog-method" => {
                args.backlog_method = match value()?.as_str() {
                    "constant" => BacklogMethod::Constant,
                    "drain" => BacklogMethod::Drain,
                    other => bail!("--backlog-method must be constant or drain, not {other}"),
                }
            }
            "--warmup" => args.warmup = Some(value()?.parse().context("--warmup takes a number")?),
            "--top-up" => args.top_up = value()?.parse().context("--top-up takes a number")?,
            "--chunk" => args.chunk = value()?.parse().context("--chunk takes a number")?,
            "--workers" => args.workers = list("--workers", &value()?)?,
            "--step-sleep-ms" => {
                args.step_sleep_ms = value()?.parse().context("--step-sleep-ms takes a number")?
            }
            "--worker-concurrency" => {
                args.worker_concurrency = Some(
                    value()?
                        .parse()
                        .context("--worker-concurrency takes a number")?,
                )
            }
            "-h" | "--help" => {
                eprintln!(
                    "usage: manent-engine-bench [--mode peers|backlog|workers] [--database-url URL]\n\
                     \x20 peers (default): [--workflows N] [--latency-samples N] \
                     [--setting default|tuned|both] [--backend postgres|sqlite|both] \
                     [--timeout-secs S] [--record-start] [--count-statements]\n\
                     \x20 backlog: [--backlogs 1000,10000,100000] [--rounds 1] [--partitions 5000] \
                     [--backlog-method constant|drain] [--window 10000] [--warmup 1000] \
                     [--top-up 100] [--chunk 1000] [--worker-concurrency 50] \
                     [--backend ..] [--timeout-secs S]\n\
                     \x20 workers (PostgreSQL): [--workers 1,2,4] [--workflows 3000] \
                     [--step-sleep-ms 50] [--worker-concurrency 10] [--partitions 5000] \
                     [--timeout-secs S]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other}"),
        }
    }
    if args.mode == Mode::Workers && !workflows_set {
        args.workflows = 3_000;
    }
    if args.workflows == 0
        || args.partitions == 0
        || args.window == 0
        || args.chunk == 0
        || args.top_up == 0
        || args.rounds == 0
    {
        bail!(
            "--workflows, --partitions, --window, --chunk, --top-up and --rounds must be at least 1"
        );
    }
    if args.backlogs.contains(&0) || args.workers.contains(&0) {
        bail!("--backlogs and --workers take numbers of at least 1");
    }
    Ok(args)
}

async fn step_pause() {
    let ms = STEP_SLEEP_MS.load(Ordering::Relaxed);
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

fn step_policy() -> StepPolicy {
    if RECORD_START.load(Ordering::Relaxed) {
        StepPolicy::default().recording_start()
    } else {
        StepPolicy::default()
    }
}

/// The workflow under test: three trivial steps, each returning a small value (each sleeping
/// `STEP_SLEEP_MS` first, which is 0 except in the workers mode).
async fn bench_workflow(ctx: WorkflowContext, input: u64) -> Result<u64, WorkflowError> {
    STARTED.fetch_add(1, Ordering::Relaxed);
    let a: u64 = ctx
        .step_with("step1", step_policy(), move || async move {
            step_pause().await;
            if input >= LATENCY_BASE {
                FIRST_STEP_STARTS
                    .lock()
                    .expect("start map poisoned")
                    .insert(input, Instant::now());
            }
            Ok::<u64, std::convert::Infallible>(input + 1)
        })
        .await?;
    let b: u64 = ctx
        .step_with("step2", step_policy(), move || async move {
            step_pause().await;
            Ok::<u64, std::convert::Infallible>(a + 2)
        })
        .await?;
    let c: u64 = ctx
        .step_with("step3", step_policy(), move || async move {
            step_pause().await;
            Ok::<u64, std::convert::Infallible>(b + 3)
        })
        .await?;
    FINISHED.fetch_add(1, Ordering::Relaxed);
    Ok(c)
}

async fn enqueue(client: &Client, input: u64, key: String) -> Result<String> {
    let record = client
        .enqueue(EnqueueRequest::new(WORKFLOW, QUEUE, input).partition(key))
        .await
        .map_err(|e| anyhow!("enqueueing workflow {input}: {e}"))?;
    Ok(record.id)
}

/// Connect options that log no statement: the benchmark's own queries stay out of
/// [`STATEMENTS`].
fn quiet<O: sqlx::ConnectOptions>(options: O) -> O {
    options.disable_statement_logging()
}

/// Counts sqlx's statement events into [`STATEMENTS`] (and prints none of them).
struct StatementCounter;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for StatementCounter {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if event.metadata().target() == "sqlx::query" {
            STATEMENTS.fetch_add(1, Ordering::Relaxed);
        }
    }
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
    /// (succeeded, failed) workflow counts as the engine's database holds them.
    async fn counts(&self) -> Result<(i64, i64)> {
        const SQL: &str = "SELECT count(CASE WHEN status = 'SUCCESS' THEN 1 END), \
             count(CASE WHEN status IN ('ERROR', 'CANCELLED') THEN 1 END) FROM manent_workflows";
        match self {
            Counter::Postgres(pool) => sqlx::query_as::<_, (i64, i64)>(SQL)
                .fetch_one(pool)
                .await
                .context("counting finished workflows"),
            Counter::Sqlite(pool) => sqlx::query_as::<_, (i64, i64)>(SQL)
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

    /// CPU used so far by this process and (PostgreSQL) by the server processes serving the
    /// engine's connections to this database (all but the counter's own), by pid.
    async fn cpu(&self) -> Result<(f64, HashMap<i32, f64>)> {
        let own = fresh::cpu_ms(std::process::id()).unwrap_or(0.0);
        let mut backends = HashMap::new();
        if let Counter::Postgres(pool) = self {
            let pids: Vec<i32> = sqlx::query_scalar(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
                 AND pid <> pg_backend_pid()",
            )
            .fetch_all(pool)
            .await
            .context("listing the database's server processes")?;
            for pid in pids {
                if let Some(ms) = fresh::cpu_ms(pid as u32) {
                    backends.insert(pid, ms);
                }
            }
        }
        Ok((own, backends))
    }
}

impl Counter {
    /// From the engine's own timestamps (ms): the mean time from claim to finish of a workflow,
    /// and the mean time from a workflow's finish to the claim of the next one on its key.
    async fn timeline(&self) -> Result<(Option<f64>, Option<f64>)> {
        const SQL: &str = "SELECT CAST(AVG(finished_at - started_at) AS DOUBLE PRECISION), \
             CAST(AVG(gap) AS DOUBLE PRECISION) FROM (SELECT started_at, finished_at, \
             started_at - LAG(finished_at) OVER (PARTITION BY partition_key ORDER BY created_seq) \
             AS gap FROM manent_workflows WHERE status = 'SUCCESS') AS t";
        match self {
            Counter::Postgres(pool) => sqlx::query_as(SQL).fetch_one(pool).await,
            Counter::Sqlite(pool) => sqlx::query_as(SQL).fetch_one(pool).await,
        }
        .context("reading the run timeline")
    }
}

/// CPU used between two [`Counter::cpu`] readings: (this process, the server processes) in ms.
/// A server process that started in between counts from zero.
fn cpu_between(before: &(f64, HashMap<i32, f64>), after: &(f64, HashMap<i32, f64>)) -> (f64, f64) {
    let server = after
        .1
        .iter()
        .map(|(pid, ms)| ms - before.1.get(pid).copied().unwrap_or(0.0))
        .sum();
    (after.0 - before.0, server)
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
    enqueue_seconds: f64,
    /// The store's fallback poll, which also bounds the latency jitter.
    fallback_poll: Duration,
    latencies_ms: Vec<f64>,
    /// Why the latency probe stopped early, if it did.
    latency_aborted: Option<String>,
    /// CPU ms used during the timed window: (this process, PostgreSQL's server processes).
    cpu_ms: (f64, f64),
    /// Mean claim-to-finish time and mean finish-to-next-claim gap on a key, in ms.
    timeline: (Option<f64>, Option<f64>),
    /// SQL statements the engine sent in the timed window (`--count-statements`).
    statements: Option<u64>,
}

/// The database file and the files and directory SQLite and the engine keep beside it.
fn remove_sqlite_files(path: &Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(name));
    }
    let mut locks = path.as_os_str().to_owned();
    locks.push(".executors");
    let _ = std::fs::remove_dir_all(PathBuf::from(locks));
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
            let db = format!("bench_manent_{tag}");
            admin_exec(&admin, format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")).await?;
            admin_exec(&admin, format!("CREATE DATABASE {db}")).await?;
            let url = with_database(&args.database_url, &db)?;
            let result = async {
                let store = store::open(&url)
                    .await
                    .map_err(|e| anyhow!("opening the manent store: {e}"))?;
                let counter = Counter::Postgres(
                    PgPoolOptions::new()
                        .max_connections(1)
                        .connect_with(quiet(PgConnectOptions::from_str(&url)?))
                        .await
                        .context("connecting the progress poller")?,
                );
                let outcome = measure(args, backend, setting, store, &counter).await;
                counter.close().await;
                outcome
            }
            .await;
            admin_exec(&admin, format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")).await?;
            admin.close().await;
            result
        }
        Backend::Sqlite => {
            let path = std::env::temp_dir().join(format!("bench_manent_{tag}.db"));
            remove_sqlite_files(&path);
            let url = format!("sqlite://{}", path.display());
            let result = async {
                // The store creates the file and the schema; the counter opens it read-only after.
                let store = store::open(&url)
                    .await
                    .map_err(|e| anyhow!("opening the manent store: {e}"))?;
                let counter = Counter::Sqlite(
                    SqlitePoolOptions::new()
                        .max_connections(1)
                        .connect_with(quiet(SqliteConnectOptions::from_str(&url)?.read_only(true)))
                        .await
                        .context("connecting the progress poller")?,
                );
                let outcome = measure(args, backend, setting, store, &counter).await;
                counter.close().await;
                outcome
            }
            .await;
            remove_sqlite_files(&path);
            result
        }
    }
}

async fn measure(
    args: &Args,
    backend: Backend,
    setting: Setting,
    store: Arc<dyn Store>,
    counter: &Counter,
) -> Result<Outcome> {
    let label = format!("manent {} {}", backend.name(), setting.name());
    let config = setting.config();
    let fallback_poll = config
        .poll_interval
        .unwrap_or_else(|| store.poll_interval());
    let queue = setting.queue();
    eprintln!(
        "[{label}] queue: worker_concurrency={} partition_concurrency={:?} \
         global_concurrency={} claim_batch={} fallback_poll={:?}",
        queue.worker_concurrency,
        queue.partition_concurrency,
        queue.global_concurrency,
        config.claim_batch,
        fallback_poll
    );
    let engine = Engine::new(Database::from(store), config);
    engine.register(WORKFLOW, bench_workflow);
    engine.listen(queue);
    let client = engine.client();

    // Phase 1: the whole backlog is written before any claim loop exists.
    let enqueue_start = Instant::now();
    for i in 0..args.workflows {
        enqueue(&client, i, format!("p{}", i % PARTITIONS)).await?;
    }
    let enqueue_seconds = enqueue_start.elapsed().as_secs_f64();
    eprintln!(
        "[{label}] enqueued {} workflows in {enqueue_seconds:.2} s",
        args.workflows
    );

    // Phase 2: launch the executor and drain.
    let launch_start = Instant::now();
    engine
        .launch()
        .await
        .map_err(|e| anyhow!("launching the engine: {e}"))?;
    let started = Instant::now();
    let launch_seconds = (started - launch_start).as_secs_f64();
    let target = i64::try_from(args.workflows)?;
    let cpu_before = counter.cpu().await?;
    let statements_before = STATEMENTS.load(Ordering::Relaxed);
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
    let statements = args
        .count_statements
        .then(|| STATEMENTS.load(Ordering::Relaxed) - statements_before);
    let cpu_ms = cpu_between(&cpu_before, &counter.cpu().await?);
    let timeline = counter.timeline().await?;
    if timed_out {
        eprintln!(
            "[{label}] TIMED OUT: {completed} of {} workflows finished in {seconds:.3} s; \
             skipping the latency probe",
            args.workflows
        );
        engine.shutdown(Duration::from_secs(5)).await;
        return Ok(Outcome {
            seconds,
            completed,
            timed_out,
            launch_seconds,
            enqueue_seconds,
            fallback_poll,
            latencies_ms: Vec::new(),
            latency_aborted: None,
            cpu_ms,
            timeline,
            statements,
        });
    }
    eprintln!(
        "[{label}] {} workflows finished in {seconds:.3} s",
        args.workflows
    );

    // Phase 3: start latency, one workflow at a time against the idle engine.
    let mut jitter = Jitter::new();
    let mut latencies_ms = Vec::with_capacity(args.latency_samples);
    let mut latency_aborted = None;
    for k in 0..args.latency_samples as u64 {
        tokio::time::sleep(jitter.below(fallback_poll)).await;
        let input = LATENCY_BASE + k;
        let enqueued_at = Instant::now();
        let id = enqueue(&client, input, format!("p{}", k % PARTITIONS)).await?;
        match client.wait(&id, Duration::from_secs(60)).await {
            Ok(record) if record.status == WorkflowStatus::Success => {}
            Ok(record) => bail!(
                "latency sample {k} ended {} ({:?})",
                record.status,
                record.error
            ),
            Err(EngineError::WaitTimeout { .. }) => {
                latency_aborted = Some(format!("sample {k} did not finish within 60 s"));
                eprintln!("[{label}] latency probe aborted: sample {k} did not finish within 60 s");
                break;
            }
            Err(e) => bail!("waiting for latency sample {k}: {e}"),
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
    let report = engine.shutdown(Duration::from_secs(5)).await;
    if !report.left_pending.is_empty() {
        eprintln!(
            "[{label}] shutdown left {} workflows pending",
            report.left_pending.len()
        );
    }
    drop(client);
    drop(engine);

    Ok(Outcome {
        seconds,
        completed,
        timed_out,
        launch_seconds,
        enqueue_seconds,
        fallback_poll,
        latencies_ms,
        latency_aborted,
        cpu_ms,
        timeline,
        statements,
    })
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
        x.filter(|x| x.is_finite()).map_or_else(
            || "null".to_owned(),
            |x| serde_json::Value::from(x).to_string(),
        )
    };
    format!(
        "{{\"engine\":\"manent\",\"backend\":{},\"setting\":{},\"workflows\":{workflows},\
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

/// With `--features jemalloc`, manent-server's allocator; the system's otherwise.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    {
        use tracing_subscriber::{Layer as _, filter, layer::SubscriberExt as _};
        let print = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(filter::LevelFilter::WARN);
        // Off unless asked for: sqlx builds each statement's log record only when someone
        // listens, which costs CPU in the measured window.
        let count = args.count_statements.then(|| {
            StatementCounter.with_filter(filter::filter_fn(|m| m.target() == "sqlx::query"))
        });
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(print).with(count),
        )
        .context("installing the log subscriber")?;
    }
    match args.mode {
        Mode::Peers => {}
        Mode::Backlog => return backlog::run(&args).await,
        Mode::Workers => return workers::run(&args).await,
        Mode::Worker => return workers::serve(&args).await,
    }
    for &backend in &args.backends {
        for &setting in &args.settings {
            let outcome = run(&args, backend, setting)
                .await
                .with_context(|| format!("manent {} {} run", backend.name(), setting.name()))?;
            let mut sorted = outcome.latencies_ms.clone();
            sorted.sort_by(f64::total_cmp);
            let (pool, wakeup) = match backend {
                Backend::Postgres => (24, "LISTEN/NOTIFY + in-process bus"),
                Backend::Sqlite => (8, "in-process bus; WAL, synchronous=FULL"),
            };
            let config = setting.config();
            let mut note = format!(
                "manent-engine (path dep); {}; one partitioned queue, {PARTITIONS} keys, \
                 partition_concurrency=1 (fleet-wide, counted in the claim transaction); \
                 worker_concurrency={WORKER_CONCURRENCY}; claim_batch={}; wake-ups: {wakeup}; \
                 fallback poll {}ms (latency jitter bound); pool={pool}; enqueue of the backlog \
                 took {:.3}s; timer from launch() return (launch took {:.3}s, not counted); \
                 latency = first-step start - enqueue call, {} samples",
                setting.tuned_note(),
                config.claim_batch,
                outcome.fallback_poll.as_millis(),
                outcome.enqueue_seconds,
                outcome.launch_seconds,
                sorted.len()
            );
            let (own_cpu, server_cpu) = outcome.cpu_ms;
            let per_wf = |ms: f64| ms / outcome.completed.max(1) as f64;
            note.push_str(&format!(
                "; CPU in the timed window: this process {own_cpu:.0} ms ({:.2} ms/wf)",
                per_wf(own_cpu)
            ));
            if backend == Backend::Postgres {
                note.push_str(&format!(
                    ", PostgreSQL server processes of the engine's connections {server_cpu:.0} ms \
                     ({:.2} ms/wf)",
                    per_wf(server_cpu)
                ));
            }
            if RECORD_START.load(Ordering::Relaxed) {
                note.push_str("; --record-start: every step records its start before its body");
            }
            if let Some(statements) = outcome.statements {
                note.push_str(&format!(
                    "; SQL statements sent by the engine in the timed window: {statements} ({:.2} per \
                     workflow; SQLite's BEGIN and COMMIT not counted)",
                    statements as f64 / outcome.completed.max(1) as f64
                ));
            }
            if let (Some(run), Some(gap)) = outcome.timeline {
                note.push_str(&format!(
                    "; a workflow ran {run:.1} ms from claim to finish on average, and the next \
                     one on its key was claimed {gap:.1} ms after it finished"
                ));
            }
            if outcome.timed_out {
                note.push_str(&format!(
                    "; TIMED OUT: only {} of {} workflows reached SUCCESS within {:.0}s, \
                     wf_per_s is completed/elapsed, latency not measured",
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
