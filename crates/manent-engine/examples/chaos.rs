//! The engine's chaos test, as a command: worker processes are killed with
//! SIGKILL at random while partitioned workflows run, and PostgreSQL is
//! restarted now and then (crashed or stopped cleanly, down for a random
//! while, sometimes past the workers' fence window); then the run is checked:
//! every workflow succeeded, no step ran again after its checkpoint was
//! recorded, and no concurrency limit was ever exceeded.
//!
//! ```text
//! cargo run --release -p manent-engine --example chaos -- [--quick] [--database-url ADMIN_URL | --sqlite]
//!     [--workers 3] [--workflows 200] [--steps 5] [--step-ms 100] [--kill-every-ms 2000]
//!     [--restart-db-every-ms 0] [--seed N] [--timeout-s 600]
//! ```
//!
//! It creates a fresh PostgreSQL database next to the admin URL's (default
//! `postgres://postgres@127.0.0.1:5432/postgres`) and drops it at the end; with
//! `--sqlite`, a database file in a temporary directory. With
//! `--restart-db-every-ms N` (N > 0) it runs on a private PostgreSQL cluster of
//! its own instead (`manent_testkit::PgCluster`; root or the `postgres` user
//! needed), never restarting a shared one. Workers are this program
//! re-executed with `--worker`. Every step body appends `begin` and `done`
//! lines (workflow, step, partition, pid, generation) to a shared ledger, or
//! `dropped` when its run is stopped before it returns (fenced), and returns
//! its generation, which the engine records as the step's output; a rerun of a
//! recorded step would show up as a ledger line with a higher generation than
//! the recorded one. The parent appends `killed <pid>` once a killed worker is
//! reaped, closing that process's open step intervals. Exits 1 on any
//! violation. `--quick` is the CI preset (it includes PostgreSQL restarts).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fs::OpenOptions,
    io::Write,
    path::{Path, PathBuf},
    process::{Child, Command, ExitCode, Stdio},
    str::FromStr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use manent_engine::{
    Client, Engine, EngineConfig, EnqueueRequest, QueueSpec, StepStatus, WorkflowContext,
    WorkflowFilter, WorkflowStatus, store,
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sqlx::Connection;

const QUEUE: &str = "chaos";
const WORKFLOW: &str = "chaos";
const PARTITIONS: usize = 10;
const PARTITION_LIMIT: u32 = 1;
const GLOBAL_LIMIT: u32 = 6;
const WORKER_LIMIT: u32 = 4;
const STALE_MS: u64 = 3000;
const HEARTBEAT_MS: u64 = 300;

#[derive(Debug, Clone)]
struct Options {
    admin_url: String,
    sqlite: bool,
    workers: usize,
    workflows: usize,
    steps: usize,
    step_ms: u64,
    kill_every: Duration,
    /// Zero: never; else PostgreSQL (a private cluster) is restarted this often.
    restart_db_every: Duration,
    /// Zero: never; else worker 0 runs in a network namespace of its own and
    /// its link to PostgreSQL (a private cluster) is cut this often.
    partition_every: Duration,
    seed: u64,
    timeout: Duration,
}

impl Options {
    /// Whether the run needs a PostgreSQL cluster of its own (it restarts it, or cuts a worker off it).
    fn private_db(&self) -> bool {
        !self.restart_db_every.is_zero() || !self.partition_every.is_zero()
    }

    fn parse(args: &[String]) -> Result<Options> {
        let mut o = Options {
            admin_url: std::env::var("MANENT_TEST_POSTGRES")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into()),
            sqlite: false,
            workers: 3,
            workflows: 200,
            steps: 5,
            step_ms: 100,
            kill_every: Duration::from_millis(2000),
            restart_db_every: Duration::ZERO,
            partition_every: Duration::ZERO,
            seed: rand::random::<u32>().into(),
            timeout: Duration::from_secs(600),
        };
        // The preset first, so that explicit options override it wherever they stand.
        if args.iter().any(|a| a == "--quick") {
            o.workers = 3;
            o.workflows = 60;
            o.steps = 5;
            o.step_ms = 150;
            o.kill_every = Duration::from_millis(1500);
            o.restart_db_every = Duration::from_millis(4000);
            o.partition_every = Duration::from_millis(5000);
            o.timeout = Duration::from_secs(120);
        }
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut value = || {
                it.next()
                    .with_context(|| format!("{arg} needs a value"))
                    .cloned()
            };
            match arg.as_str() {
                "--quick" => {}
                "--sqlite" => o.sqlite = true,
                "--database-url" => o.admin_url = value()?,
                "--workers" => o.workers = number(arg, &value()?)?,
                "--workflows" => o.workflows = number(arg, &value()?)?,
                "--steps" => o.steps = number(arg, &value()?)?,
                "--step-ms" => o.step_ms = number(arg, &value()?)?,
                "--kill-every-ms" => o.kill_every = Duration::from_millis(number(arg, &value()?)?),
                "--restart-db-every-ms" => {
                    o.restart_db_every = Duration::from_millis(number(arg, &value()?)?)
                }
                "--partition-every-ms" => {
                    o.partition_every = Duration::from_millis(number(arg, &value()?)?)
                }
                "--seed" => o.seed = number(arg, &value()?)?,
                "--timeout-s" => o.timeout = Duration::from_secs(number(arg, &value()?)?),
                "-h" | "--help" => {
                    println!(
                        "usage: chaos [--quick] [--database-url ADMIN_URL | --sqlite] [--workers N] \
                         [--workflows N] [--steps N] [--step-ms MS] [--kill-every-ms MS] \
                         [--restart-db-every-ms MS (0: never)] [--partition-every-ms MS (0: never)] \
                         [--seed N] [--timeout-s S]"
                    );
                    std::process::exit(0);
                }
                other => bail!("unknown option {other} (try --help)"),
            }
        }
        if o.workers == 0 || o.steps == 0 || o.kill_every.is_zero() {
            bail!("--workers, --steps and --kill-every-ms must be positive");
        }
        if o.sqlite {
            for option in ["--restart-db-every-ms", "--partition-every-ms"] {
                if args.iter().any(|a| a == option) {
                    bail!("{option} is about PostgreSQL; it does not apply to --sqlite");
                }
            }
            o.restart_db_every = Duration::ZERO;
            o.partition_every = Duration::ZERO;
        }
        Ok(o)
    }
}

fn number<T: FromStr>(option: &str, text: &str) -> Result<T> {
    text.parse()
        .map_err(|_| anyhow::anyhow!("{option} expects a number, got `{text}`"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    if args.first().map(String::as_str) == Some("--worker") {
        return match runtime.block_on(worker(&args[1..])) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) if e.downcast_ref::<DatabaseDown>().is_some() => {
                eprintln!("worker: {e:#}");
                ExitCode::from(DATABASE_DOWN_EXIT)
            }
            Err(e) => {
                eprintln!("worker: {e:#}");
                ExitCode::from(3)
            }
        };
    }
    let options = match Options::parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("chaos: {e:#}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(parent(options)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("chaos: {e:#}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------- the worker

/// A worker's exit status when it could not start because the database was
/// down (restarted by the parent): the parent starts it again, no violation.
const DATABASE_DOWN_EXIT: u8 = 75;

/// The database could not be reached while the worker started.
#[derive(Debug, thiserror::Error)]
#[error("the database is unreachable while starting: {0}")]
struct DatabaseDown(String);

/// Appends `begin` at once, and `done` (the body returned) or `dropped` (its
/// run was stopped first: fenced, or the process is stopping) when it goes.
struct Body {
    ledger: Arc<PathBuf>,
    fields: (String, usize, String),
    done: bool,
}

impl Body {
    fn begin(ledger: Arc<PathBuf>, wf: &str, step: usize, rest: String) -> Body {
        append(&ledger, &format!("{wf} {step} begin {rest}"));
        Body {
            ledger,
            fields: (wf.to_string(), step, rest),
            done: false,
        }
    }

    fn done(mut self) {
        self.done = true;
        let (wf, step, rest) = &self.fields;
        append(&self.ledger, &format!("{wf} {step} done {rest}"));
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        if !self.done {
            let (wf, step, rest) = &self.fields;
            append(&self.ledger, &format!("{wf} {step} dropped {rest}"));
        }
    }
}

/// Appends one line in one write: with O_APPEND, lines of concurrent processes never interleave.
fn append(path: &Path, line: &str) {
    let written = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        // A lost line would make the checks lie: stop loudly instead.
        eprintln!("cannot append to the ledger {}: {e}", path.display());
        std::process::abort();
    }
}

async fn worker(args: &[String]) -> Result<()> {
    let mut values: HashMap<&str, &str> = HashMap::new();
    for pair in args.chunks(2) {
        if let [k, v] = pair {
            values.insert(k.as_str(), v.as_str());
        }
    }
    let get = |k: &str| {
        values
            .get(k)
            .copied()
            .with_context(|| format!("worker needs {k}"))
    };
    let id = get("--id")?.to_string();
    let url = get("--database-url")?.to_string();
    let ledger = PathBuf::from(get("--ledger")?);
    let steps: usize = number("--steps", get("--steps")?)?;
    let step_ms: u64 = number("--step-ms", get("--step-ms")?)?;
    let pid = std::process::id();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;

    // The database may be down for a restart: wait for it (the parent's timeout bounds this).
    let store = loop {
        match store::open(&url).await {
            Ok(store) => break store,
            Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => return Err(e.into()),
        }
    };
    let mut config = EngineConfig::new(&id);
    config.stale_after = Duration::from_millis(STALE_MS);
    config.heartbeat_interval = Duration::from_millis(HEARTBEAT_MS);
    config.automatic_recovery = true;
    let engine = Engine::new(store, config);
    engine.listen(
        QueueSpec::new(QUEUE)
            .worker_concurrency(WORKER_LIMIT)
            .partition_concurrency(PARTITION_LIMIT)
            .global_concurrency(GLOBAL_LIMIT),
    );
    let ledger = Arc::new(ledger);
    engine.register(WORKFLOW, move |ctx: WorkflowContext, (): ()| {
        let ledger = ledger.clone();
        async move {
            let (wf, partition, generation) =
                (ctx.workflow_id(), ctx.partition_key(), ctx.generation());
            for step in 0..steps {
                ctx.step(&format!("s{step}"), || async {
                    let body = Body::begin(
                        ledger.clone(),
                        wf,
                        step,
                        format!("{partition} {pid} {generation}"),
                    );
                    // A little work, of varying length.
                    let ms = step_ms / 2 + rand::random::<u64>() % (step_ms + 1);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    body.done();
                    Ok::<_, String>(generation)
                })
                .await?;
            }
            Ok(())
        }
    });
    match engine.launch().await {
        Ok(()) => {}
        Err(manent_engine::EngineError::Store(e)) if e.is_transient() => {
            return Err(DatabaseDown(e.to_string()).into());
        }
        Err(e) => return Err(e.into()),
    }
    terminate.recv().await;
    engine.shutdown(Duration::from_secs(5)).await;
    Ok(())
}

// ---------------------------------------------------------------- the parent

/// The database of one run: a fresh PostgreSQL database (dropped at the end),
/// one in a private cluster of the run's own (removed at the end; the one the
/// run restarts), or a SQLite file.
struct RunDb {
    url: String,
    admin_url: String,
    pg_name: Option<String>,
    cluster: Option<manent_testkit::PgCluster>,
    /// Worker 0's network namespace and the URL it reaches the cluster at from there.
    partition: Option<(manent_testkit::NetNs, String)>,
}

impl RunDb {
    async fn create(o: &Options, dir: &Path) -> Result<RunDb> {
        if o.sqlite {
            return Ok(RunDb {
                url: format!("sqlite://{}", dir.join("chaos.db").display()),
                admin_url: String::new(),
                pg_name: None,
                cluster: None,
                partition: None,
            });
        }
        if o.private_db() {
            let partitioned = !o.partition_every.is_zero();
            // On a blocking thread: it runs ip, initdb and pg_ctl.
            let (cluster, ns) = tokio::task::spawn_blocking(move || {
                let ns = partitioned.then(manent_testkit::NetNs::new);
                let cluster = match &ns {
                    Some(ns) => manent_testkit::PgCluster::start_listening(
                        std::slice::from_ref(&ns.host_addr),
                        std::slice::from_ref(&ns.network),
                    ),
                    None => manent_testkit::PgCluster::start(),
                };
                (cluster, ns)
            })
            .await?;
            let url = cluster.create_database("manent_chaos").await;
            println!(
                "chaos: a private PostgreSQL cluster on port {}{}",
                cluster.port(),
                match &ns {
                    Some(ns) => format!(
                        "; worker 0 in network namespace {} reaches it at {}",
                        ns.name, ns.host_addr
                    ),
                    None => String::new(),
                }
            );
            let partition = ns.map(|ns| {
                let far = cluster.url_at(&ns.host_addr, "manent_chaos");
                (ns, far)
            });
            return Ok(RunDb {
                url,
                admin_url: cluster.admin_url(),
                pg_name: None,
                cluster: Some(cluster),
                partition,
            });
        }
        let name = format!("manent_chaos_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(&o.admin_url)
            .await
            .with_context(|| format!("connect to {}", o.admin_url))?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await?;
        let _ = conn.close().await;
        let base = o.admin_url.rsplit_once('/').map_or("", |(b, _)| b);
        Ok(RunDb {
            url: format!("{base}/{name}"),
            admin_url: o.admin_url.clone(),
            pg_name: Some(name),
            cluster: None,
            partition: None,
        })
    }

    async fn drop_database(&self) {
        if let Some(name) = &self.pg_name
            && let Ok(mut conn) = sqlx::PgConnection::connect(&self.admin_url).await
        {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .execute(&mut conn)
                .await;
        }
    }
}

/// The worker processes, by slot; each slot keeps its executor id across restarts.
struct Workers {
    exe: PathBuf,
    dir: PathBuf,
    url: String,
    ledger: PathBuf,
    options: Options,
    slots: Vec<Option<Child>>,
    /// Slots killed and waiting to be restarted at the given time.
    restarts: Vec<(usize, Instant)>,
    violations: Vec<String>,
    /// Whether the database is restarted or worker 0 cut off during the run
    /// (a worker may then fail to start, and is started again).
    db_faults: bool,
    refused_starts: usize,
    /// Worker 0's network namespace and database URL, when it is partitioned now and then.
    far: Option<(String, String)>,
}

impl Workers {
    fn id(slot: usize) -> String {
        format!("manent-{slot}")
    }

    fn start(&mut self, slot: usize) -> Result<()> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", Self::id(slot))))?;
        let (mut command, url) = match (&self.far, slot) {
            (Some((ns, far_url)), 0) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.exe);
                (c, far_url.as_str())
            }
            _ => (Command::new(&self.exe), self.url.as_str()),
        };
        let child = command
            .arg("--worker")
            .args(["--id", &Self::id(slot)])
            .args(["--database-url", url])
            .arg("--ledger")
            .arg(&self.ledger)
            .args(["--steps", &self.options.steps.to_string()])
            .args(["--step-ms", &self.options.step_ms.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start a worker")?;
        self.slots[slot] = Some(child);
        Ok(())
    }

    /// SIGKILLs the worker in `slot` and reaps it; then closes its open intervals in the ledger.
    fn kill(&mut self, slot: usize) -> Result<u32> {
        let mut child = self.slots[slot].take().context("a running worker")?;
        let pid = child.id();
        signal(pid, "KILL");
        child.wait()?;
        append(&self.ledger, &format!("killed {pid}"));
        Ok(pid)
    }

    /// Notes workers that exited without being killed (a refused start, a crash).
    fn check_unexpected_exits(&mut self) -> Result<()> {
        for slot in 0..self.slots.len() {
            let exited = match &mut self.slots[slot] {
                Some(child) => child.try_wait()?.map(|status| (child.id(), status)),
                None => None,
            };
            if let Some((pid, status)) = exited {
                if status.code() == Some(i32::from(DATABASE_DOWN_EXIT)) && self.db_faults {
                    // Started while PostgreSQL was being restarted (or out of
                    // reach): start it again.
                    self.refused_starts += 1;
                } else {
                    self.violations.push(format!(
                        "worker {} (pid {pid}) exited on its own: {status}; see its log",
                        Self::id(slot)
                    ));
                }
                self.slots[slot] = None;
                append(&self.ledger, &format!("killed {pid}"));
                self.start(slot)?;
            }
        }
        Ok(())
    }

    /// SIGTERM everyone and wait for a clean drain; SIGKILL stragglers.
    async fn stop_all(&mut self) {
        for child in self.slots.iter().flatten() {
            signal(child.id(), "TERM");
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for child in self.slots.iter_mut().flatten() {
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                    Ok(None) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for child in self.slots.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status();
}

struct Counts {
    kills: usize,
    delayed_restarts: usize,
    db_restarts: usize,
    /// Of those, how many kept the database down past the workers' fence window.
    db_long_outages: usize,
    partitions: usize,
    /// Of those, how many lasted past stale_after (the others recover worker 0's work).
    long_partitions: usize,
}

/// How long worker 0's link is cut: the first time and often past
/// stale_after, so that the others recover its work while it fences itself;
/// otherwise a blip it rides out.
fn partition_length(rng: &mut StdRng, counts: &mut Counts) -> (Duration, bool) {
    counts.partitions += 1;
    let long = counts.partitions == 1 || rng.random_bool(0.5);
    let ms = if long {
        counts.long_partitions += 1;
        STALE_MS + 500 + rng.random_range(0..2000)
    } else {
        rng.random_range(50..(STALE_MS - STALE_MS / 4) / 2)
    };
    (Duration::from_millis(ms), long)
}

/// A PostgreSQL restart in progress: down since, back up at `until`.
struct Outage {
    until: Instant,
}

/// Stops the private cluster (a crash or a clean stop, at random) for a
/// random while: mostly a blip, sometimes past the workers' fence window (a
/// quarter of stale_after short of it), so that they all fence themselves
/// and resume once their lease renews.
async fn stop_database(
    cluster: &manent_testkit::PgCluster,
    rng: &mut StdRng,
    counts: &mut Counts,
) -> Result<Outage> {
    let mode = if rng.random_bool(0.5) {
        manent_testkit::StopMode::Immediate
    } else {
        manent_testkit::StopMode::Fast
    };
    let fence_ms = STALE_MS - STALE_MS / 4;
    // The first outage is a long one, so that even a short run meets fencing.
    let long = counts.db_restarts == 0 || rng.random_bool(0.4);
    let down_ms = if long {
        counts.db_long_outages += 1;
        fence_ms + 250 + rng.random_range(0..1000)
    } else {
        rng.random_range(50..fence_ms / 2)
    };
    counts.db_restarts += 1;
    let stop = std::panic::AssertUnwindSafe(|| cluster.stop(mode));
    tokio::task::block_in_place(|| std::panic::catch_unwind(stop))
        .map_err(|_| anyhow::anyhow!("could not stop the private PostgreSQL cluster"))?;
    println!(
        "  database stopped ({mode:?}) for {down_ms} ms{}",
        if long { ", past the fence window" } else { "" }
    );
    Ok(Outage {
        until: Instant::now() + Duration::from_millis(down_ms),
    })
}

fn start_database(cluster: &manent_testkit::PgCluster) -> Result<()> {
    let start = std::panic::AssertUnwindSafe(|| cluster.start_again());
    tokio::task::block_in_place(|| std::panic::catch_unwind(start))
        .map_err(|_| anyhow::anyhow!("could not start the private PostgreSQL cluster again"))
}

async fn parent(o: Options) -> Result<bool> {
    let dir = tempfile::Builder::new().prefix("manent-chaos-").tempdir()?;
    let db = RunDb::create(&o, dir.path()).await?;
    let outcome = run(&o, &db, dir.path()).await;
    db.drop_database().await;
    match outcome {
        Ok(true) => Ok(true),
        other => {
            // Keep the logs and the ledger for a post-mortem.
            let kept = dir.keep();
            eprintln!("logs and ledger kept in {}", kept.display());
            other
        }
    }
}

async fn run(o: &Options, db: &RunDb, dir: &Path) -> Result<bool> {
    println!(
        "chaos: {} workers, {} workflows x {} steps (~{} ms each), kill every {:?}, seed {}, {}",
        o.workers,
        o.workflows,
        o.steps,
        o.step_ms,
        o.kill_every,
        o.seed,
        if o.sqlite { "SQLite" } else { "PostgreSQL" }
    );
    let client = Client::new(store::open(&db.url).await?);
    let ledger = dir.join("ledger");
    let mut workers = Workers {
        exe: std::env::current_exe()?,
        dir: dir.to_path_buf(),
        url: db.url.clone(),
        ledger: ledger.clone(),
        options: o.clone(),
        slots: (0..o.workers).map(|_| None).collect(),
        restarts: Vec::new(),
        violations: Vec::new(),
        db_faults: db.cluster.is_some(),
        refused_starts: 0,
        far: db
            .partition
            .as_ref()
            .map(|(ns, far)| (ns.name.clone(), far.clone())),
    };
    for slot in 0..o.workers {
        workers.start(slot)?;
    }

    let started = Instant::now();
    for n in 0..o.workflows {
        client
            .enqueue(
                EnqueueRequest::new(WORKFLOW, QUEUE, ())
                    .id(format!("wf-{n:05}"))
                    .partition(format!("p{}", n % PARTITIONS)),
            )
            .await?;
    }

    let mut rng = StdRng::seed_from_u64(o.seed);
    let mut counts = Counts {
        kills: 0,
        delayed_restarts: 0,
        db_restarts: 0,
        db_long_outages: 0,
        partitions: 0,
        long_partitions: 0,
    };
    let mut next_partition = started + o.partition_every;
    let mut healed_at: Option<Instant> = None;
    let mut next_kill = started + o.kill_every;
    let mut next_db_restart = started + o.restart_db_every;
    let mut outage: Option<Outage> = None;
    let deadline = started + o.timeout;
    let mut last_report = started;
    let finished = loop {
        if let (Some(cluster), Some(down)) = (&db.cluster, &outage)
            && Instant::now() >= down.until
        {
            start_database(cluster)?;
            println!("  {:>5.1}s: database back", started.elapsed().as_secs_f64());
            outage = None;
            next_db_restart = Instant::now() + o.restart_db_every;
        }
        // While the database is down (or coming back) there is nothing to read;
        // bounded, since the pool would keep trying to connect for its acquire timeout.
        let depths = tokio::time::timeout(Duration::from_millis(500), client.queue_depths()).await;
        let open: Option<i64> = match depths {
            Ok(Ok(depths)) => Some(depths.iter().map(|d| d.enqueued + d.running).sum()),
            Ok(Err(_)) | Err(_) if db.cluster.is_some() => None,
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => bail!("the database did not answer within 500 ms"),
        };
        if open == Some(0) {
            break true;
        }
        let open = open.map_or_else(|| "?".to_string(), |n| n.to_string());
        let now = Instant::now();
        if now >= deadline {
            break false;
        }
        if now.duration_since(last_report) >= Duration::from_secs(5) {
            last_report = now;
            println!(
                "  {:>5.1}s: {open} workflows open, {} kills",
                started.elapsed().as_secs_f64(),
                counts.kills
            );
        }
        // Restarts that are due.
        let due: Vec<usize> = workers
            .restarts
            .iter()
            .filter(|(_, at)| *at <= now)
            .map(|(slot, _)| *slot)
            .collect();
        workers.restarts.retain(|(_, at)| *at > now);
        for slot in due {
            workers.start(slot)?;
        }
        workers.check_unexpected_exits()?;
        if let Some((ns, _)) = &db.partition {
            match healed_at {
                Some(at) if now >= at => {
                    ns.heal();
                    healed_at = None;
                    next_partition = now + o.partition_every;
                    println!(
                        "  {:>5.1}s: worker 0's link healed",
                        started.elapsed().as_secs_f64()
                    );
                }
                None if now >= next_partition => {
                    let (length, long) = partition_length(&mut rng, &mut counts);
                    ns.cut();
                    healed_at = Some(now + length);
                    println!(
                        "  {:>5.1}s: worker 0 cut off from PostgreSQL for {} ms{}",
                        started.elapsed().as_secs_f64(),
                        length.as_millis(),
                        if long { ", past stale_after" } else { "" }
                    );
                }
                _ => {}
            }
        }
        if let Some(cluster) = &db.cluster
            && !o.restart_db_every.is_zero()
            && outage.is_none()
            && now >= next_db_restart
        {
            outage = Some(stop_database(cluster, &mut rng, &mut counts).await?);
        }
        if now >= next_kill {
            next_kill = now + o.kill_every;
            let alive: Vec<usize> = (0..o.workers)
                .filter(|s| workers.slots[*s].is_some())
                .collect();
            if !alive.is_empty() {
                let slot = alive[rng.random_range(0..alive.len())];
                workers.kill(slot)?;
                counts.kills += 1;
                // Mostly an immediate restart under the same id (it resumes its own
                // work at once); sometimes a restart only after stale_after, so
                // that the other workers' automatic recovery takes its work first.
                let delay = if rng.random_bool(0.25) {
                    counts.delayed_restarts += 1;
                    Duration::from_millis(STALE_MS + 1000)
                } else {
                    Duration::ZERO
                };
                workers.restarts.push((slot, now + delay));
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let elapsed = started.elapsed();
    if let (Some(cluster), Some(_)) = (&db.cluster, &outage) {
        start_database(cluster)?;
    }
    if let (Some((ns, _)), Some(_)) = (&db.partition, healed_at) {
        ns.heal();
    }
    workers.stop_all().await;
    let mut violations = std::mem::take(&mut workers.violations);
    if !finished {
        violations.push(format!("not every workflow ended within {:?}", o.timeout));
    }

    let report = verify(o, &client, &ledger, &mut violations).await?;
    println!(
        "chaos: {} workflows ({} succeeded) in {:.1}s = {:.1} wf/s; {} kills ({} restarted late); \
         {} database restarts ({} past the fence window, {} worker starts refused meanwhile); \
         {} partitions of worker 0 ({} past stale_after); \
         {} step bodies run for {} steps: {} reruns of interrupted steps ({} by runs fenced while alive, \
         {} stopped mid-body)",
        o.workflows,
        report.succeeded,
        elapsed.as_secs_f64(),
        report.succeeded as f64 / elapsed.as_secs_f64(),
        counts.kills,
        counts.delayed_restarts,
        counts.db_restarts,
        counts.db_long_outages,
        workers.refused_starts,
        counts.partitions,
        counts.long_partitions,
        report.bodies,
        o.workflows * o.steps,
        report.reruns,
        report.fenced_live,
        report.dropped,
    );
    println!(
        "chaos: max concurrency seen: {} overall (limit {GLOBAL_LIMIT}), {} per partition (limit {PARTITION_LIMIT}), \
         {} per worker process (limit {WORKER_LIMIT})",
        report.max_total, report.max_partition, report.max_worker
    );
    if violations.is_empty() {
        println!("chaos: OK");
        Ok(true)
    } else {
        println!("chaos: {} VIOLATIONS", violations.len());
        for v in violations.iter().take(30) {
            println!("  - {v}");
        }
        Ok(false)
    }
}

#[derive(Default)]
struct Report {
    succeeded: usize,
    bodies: usize,
    reruns: usize,
    /// Interrupted runs whose process was not killed: recovered away from a
    /// live worker that looked stale (an overloaded machine), then fenced.
    fenced_live: usize,
    /// Step bodies stopped before they returned (their run fenced or stopped).
    dropped: usize,
    max_total: usize,
    max_partition: usize,
    max_worker: usize,
}

/// What a ledger line of a step body says.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Begin,
    Done,
    Dropped,
}

/// A ledger line of a step body.
struct StepLine {
    kind: Kind,
    partition: String,
    pid: u32,
    generation: i64,
}

fn parse_line(line: &str) -> Option<((String, usize), StepLine)> {
    let f: Vec<&str> = line.split(' ').collect();
    let [wf, step, kind, partition, pid, generation] = f.as_slice() else {
        return None;
    };
    Some((
        (wf.to_string(), step.parse().ok()?),
        StepLine {
            kind: match *kind {
                "begin" => Kind::Begin,
                "done" => Kind::Done,
                "dropped" => Kind::Dropped,
                _ => return None,
            },
            partition: partition.to_string(),
            pid: pid.parse().ok()?,
            generation: generation.parse().ok()?,
        },
    ))
}

async fn verify(
    o: &Options,
    client: &Client,
    ledger: &Path,
    violations: &mut Vec<String>,
) -> Result<Report> {
    let mut report = Report::default();
    let text = std::fs::read_to_string(ledger).unwrap_or_default();

    // 1. Limits, from the begin/done intervals in ledger order.
    let mut open: HashMap<u32, Vec<(String, usize, String)>> = HashMap::new();
    let mut per_partition: HashMap<String, usize> = HashMap::new();
    let mut total = 0usize;
    let mut by_step: BTreeMap<(String, usize), Vec<StepLine>> = BTreeMap::new();
    let mut killed: HashSet<u32> = HashSet::new();
    for line in text.lines() {
        if let Some(pid) = line.strip_prefix("killed ") {
            let pid: u32 = pid.parse().context("a killed line")?;
            killed.insert(pid);
            for (_, _, partition) in open.remove(&pid).unwrap_or_default() {
                total -= 1;
                *per_partition.entry(partition).or_default() -= 1;
            }
            continue;
        }
        let Some((key, l)) = parse_line(line) else {
            violations.push(format!("unreadable ledger line `{line}`"));
            continue;
        };
        let running = open.entry(l.pid).or_default();
        if l.kind == Kind::Dropped {
            report.dropped += 1;
        }
        if l.kind == Kind::Begin {
            running.push((key.0.clone(), key.1, l.partition.clone()));
            total += 1;
            let p = per_partition.entry(l.partition.clone()).or_default();
            *p += 1;
            report.max_total = report.max_total.max(total);
            report.max_partition = report.max_partition.max(*p);
            report.max_worker = report.max_worker.max(running.len());
            if total > GLOBAL_LIMIT as usize
                || *p > PARTITION_LIMIT as usize
                || running.len() > WORKER_LIMIT as usize
            {
                violations.push(format!(
                    "limit exceeded at `{line}`: {total} running, {} in partition {}, {} in pid {}",
                    p,
                    l.partition,
                    running.len(),
                    l.pid
                ));
            }
        } else if let Some(at) = running
            .iter()
            .position(|(wf, step, _)| *wf == key.0 && *step == key.1)
        {
            running.remove(at);
            total -= 1;
            *per_partition.entry(l.partition.clone()).or_default() -= 1;
        } else {
            violations.push(format!("`{line}` ends a step that never began"));
        }
        by_step.entry(key).or_default().push(l);
    }

    // 2. Outcomes and step records, against the ledger.
    let all = client
        .list(&WorkflowFilter {
            queue: Some(QUEUE.into()),
            limit: Some(i64::try_from(o.workflows).unwrap_or(i64::MAX) + 100),
            ..WorkflowFilter::default()
        })
        .await?;
    if all.len() != o.workflows {
        violations.push(format!(
            "{} workflows stored, {} enqueued",
            all.len(),
            o.workflows
        ));
    }
    for wf in &all {
        if wf.status != WorkflowStatus::Success {
            violations.push(format!(
                "workflow {} is {}, not SUCCESS (error: {:?})",
                wf.id, wf.status, wf.error
            ));
            continue;
        }
        report.succeeded += 1;
        let steps = client.steps(&wf.id).await?;
        if steps.len() != o.steps {
            violations.push(format!(
                "workflow {} has {} step records, not {}",
                wf.id,
                steps.len(),
                o.steps
            ));
        }
        for s in &steps {
            let recorded: Option<i64> = s.output.as_deref().and_then(|v| v.parse().ok());
            let (Some(recorded), StepStatus::Success) = (recorded, s.status) else {
                violations.push(format!(
                    "step {} of {} is recorded as {s:?}",
                    s.index, wf.id
                ));
                continue;
            };
            let lines = by_step
                .get(&(
                    wf.id.clone(),
                    usize::try_from(s.index).unwrap_or(usize::MAX),
                ))
                .map(Vec::as_slice)
                .unwrap_or_default();
            let begins: Vec<&StepLine> = lines.iter().filter(|l| l.kind == Kind::Begin).collect();
            report.bodies += begins.len();
            let interrupted: Vec<&&StepLine> =
                begins.iter().filter(|l| l.generation < recorded).collect();
            report.reruns += interrupted.len();
            report.fenced_live += interrupted
                .iter()
                .filter(|l| !killed.contains(&l.pid))
                .count();
            let later: Vec<String> = lines
                .iter()
                .filter(|l| l.generation > recorded)
                .map(|l| format!("pid {} generation {}", l.pid, l.generation))
                .collect();
            if !later.is_empty() {
                violations.push(format!(
                    "step {} of {} ran again after generation {recorded} recorded it: {}",
                    s.index,
                    wf.id,
                    later.join(", ")
                ));
            }
            let recording = lines.iter().filter(|l| l.generation == recorded);
            let (b, d) = recording.fold((0, 0), |(b, d), l| match l.kind {
                Kind::Begin => (b + 1, d),
                Kind::Done => (b, d + 1),
                Kind::Dropped => (b, d),
            });
            if (b, d) != (1, 1) {
                violations.push(format!(
                    "step {} of {}: the recording run (generation {recorded}) logged {b} begins and {d} ends",
                    s.index, wf.id
                ));
            }
        }
    }
    Ok(report)
}
