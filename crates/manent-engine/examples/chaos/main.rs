//! The engine's chaos test, as a command: worker processes are killed with
//! SIGKILL at random while partitioned workflows run, frozen with SIGSTOP
//! (sometimes past stale_after, so that another worker takes their work) and
//! continued, and PostgreSQL is restarted now and then (crashed or stopped
//! cleanly, down for a random while, sometimes past the workers' fence
//! window); then the run is checked (`verify.rs`): every workflow succeeded,
//! no step ran again after its checkpoint was recorded, no concurrency limit
//! was ever exceeded, and no frozen worker's step body acted once its step was
//! taken over (the overlap check).
//!
//! ```text
//! cargo run --release -p manent-engine --example chaos -- [--quick] [--database-url ADMIN_URL | --sqlite]
//!     [--workers 3] [--workflows 200] [--steps 5] [--step-ms 100] [--kill-every-ms 2000]
//!     [--restart-db-every-ms 0] [--partition-every-ms 0] [--freeze-every-ms 0] [--seed N]
//!     [--timeout-s 600]
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
//! reaped, closing that process's open step intervals, and `frozen <pid>` /
//! `thawed <pid>` around a freeze. A body acts (its `done` line) only while its
//! worker may still act on its lease, as a command under the dead-man's switch
//! does: a frozen body whose step was taken over ends `dropped`, never `done`. Exits 1 on any
//! violation. `--quick` is the CI preset (it includes PostgreSQL restarts).

use std::{
    collections::HashMap,
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
    Client, Database, Engine, EngineConfig, EnqueueRequest, QueueSpec, WorkflowContext, store,
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sqlx::Connection;

mod verify;
use verify::{Report, verify};

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
    /// Zero: never; else a worker is frozen (SIGSTOP) this often, for a random
    /// while, sometimes past stale_after, then continued (SIGCONT).
    freeze_every: Duration,
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
            freeze_every: Duration::ZERO,
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
            o.freeze_every = Duration::from_millis(3000);
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
                "--freeze-every-ms" => {
                    o.freeze_every = Duration::from_millis(number(arg, &value()?)?)
                }
                "--seed" => o.seed = number(arg, &value()?)?,
                "--timeout-s" => o.timeout = Duration::from_secs(number(arg, &value()?)?),
                "-h" | "--help" => {
                    println!(
                        "usage: chaos [--quick] [--database-url ADMIN_URL | --sqlite] [--workers N] \
                         [--workflows N] [--steps N] [--step-ms MS] [--kill-every-ms MS] \
                         [--restart-db-every-ms MS (0: never)] [--partition-every-ms MS (0: never)] \
                         [--freeze-every-ms MS (0: never)] [--seed N] [--timeout-s S]"
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
    let engine = Engine::new(Database::from(store), config);
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
                    // It acts only while its worker may: woken from a freeze past its
                    // fence window, it waits to be stopped (the engine fences itself and
                    // drops the run), as a command under the dead-man's switch is killed.
                    if ctx.ensure_live().is_err() {
                        std::future::pending::<()>().await;
                    }
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
    /// The run's workers, none started yet, writing to `ledger` and logging under `dir`.
    fn new(o: &Options, db: &RunDb, dir: &Path, ledger: &Path) -> Result<Workers> {
        Ok(Workers {
            exe: std::env::current_exe()?,
            dir: dir.to_path_buf(),
            url: db.url.clone(),
            ledger: ledger.to_path_buf(),
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
        })
    }

    /// Starts again the killed workers whose restart is due at `now`.
    fn start_due(&mut self, now: Instant) -> Result<()> {
        let due: Vec<usize> = self
            .restarts
            .iter()
            .filter(|(_, at)| *at <= now)
            .map(|(slot, _)| *slot)
            .collect();
        self.restarts.retain(|(_, at)| *at > now);
        for slot in due {
            self.start(slot)?;
        }
        Ok(())
    }

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

    /// SIGSTOPs the worker in `slot`; returns its pid.
    fn freeze(&mut self, slot: usize) -> Result<u32> {
        let pid = self.slots[slot].as_ref().context("a running worker")?.id();
        signal(pid, "STOP");
        append(&self.ledger, &format!("frozen {pid}"));
        Ok(pid)
    }

    /// SIGCONTs a frozen worker.
    fn thaw(&mut self, pid: u32) {
        append(&self.ledger, &format!("thawed {pid}"));
        signal(pid, "CONT");
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
    freezes: usize,
    /// Of those, how many lasted past stale_after (another worker takes the work).
    long_freezes: usize,
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
    fault_length(rng, &mut counts.partitions, &mut counts.long_partitions)
}

/// How long a worker stays frozen: the first time and often past stale_after
/// (another worker recovers its work, and its bodies must not act once it is
/// continued); otherwise shorter than the fence window, which it rides out.
fn freeze_length(rng: &mut StdRng, counts: &mut Counts) -> (Duration, bool) {
    fault_length(rng, &mut counts.freezes, &mut counts.long_freezes)
}

/// The first fault of a kind and half the others last past stale_after; the rest are
/// blips within half the fence window. Counts it in `all` and, if long, in `long`.
fn fault_length(rng: &mut StdRng, all: &mut usize, long_ones: &mut usize) -> (Duration, bool) {
    *all += 1;
    let long = *all == 1 || rng.random_bool(0.5);
    let ms = if long {
        *long_ones += 1;
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

/// The faults of a run: when each strikes next, the ones in progress and how many
/// struck, drawn from the run's seed in the order the run's loop meets them.
struct Faults {
    started: Instant,
    rng: StdRng,
    counts: Counts,
    next_partition: Instant,
    /// When worker 0's link is healed, while it is cut.
    healed_at: Option<Instant>,
    next_kill: Instant,
    next_freeze: Instant,
    /// The frozen worker: its slot, pid and when it is continued.
    frozen: Option<(usize, u32, Instant)>,
}

impl Faults {
    /// Heals worker 0's link once its cut is over, or cuts it when a cut is due.
    fn partition(&mut self, ns: &manent_testkit::NetNs, now: Instant, o: &Options) {
        match self.healed_at {
            Some(at) if now >= at => {
                ns.heal();
                self.healed_at = None;
                self.next_partition = now + o.partition_every;
                println!(
                    "  {:>5.1}s: worker 0's link healed",
                    self.started.elapsed().as_secs_f64()
                );
            }
            None if now >= self.next_partition => {
                let (length, long) = partition_length(&mut self.rng, &mut self.counts);
                ns.cut();
                self.healed_at = Some(now + length);
                println!(
                    "  {:>5.1}s: worker 0 cut off from PostgreSQL for {} ms{}",
                    self.started.elapsed().as_secs_f64(),
                    length.as_millis(),
                    if long { ", past stale_after" } else { "" }
                );
            }
            _ => {}
        }
    }

    /// Continues the frozen worker once its freeze is over, or freezes one at random when
    /// a freeze is due.
    fn freeze(&mut self, workers: &mut Workers, now: Instant, o: &Options) -> Result<()> {
        match self.frozen {
            Some((_, pid, until)) if now >= until => {
                workers.thaw(pid);
                self.frozen = None;
                self.next_freeze = now + o.freeze_every;
            }
            None if !o.freeze_every.is_zero() && now >= self.next_freeze => {
                let alive: Vec<usize> = (0..o.workers)
                    .filter(|s| workers.slots[*s].is_some())
                    .collect();
                if !alive.is_empty() {
                    let slot = alive[self.rng.random_range(0..alive.len())];
                    let (length, long) = freeze_length(&mut self.rng, &mut self.counts);
                    let pid = workers.freeze(slot)?;
                    self.frozen = Some((slot, pid, now + length));
                    println!(
                        "  {:>5.1}s: worker {slot} frozen for {} ms{}",
                        self.started.elapsed().as_secs_f64(),
                        length.as_millis(),
                        if long { ", past stale_after" } else { "" }
                    );
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Kills a worker at random (never the frozen one) when a kill is due, and schedules
    /// its restart.
    fn kill(&mut self, workers: &mut Workers, now: Instant, o: &Options) -> Result<()> {
        if now >= self.next_kill {
            self.next_kill = now + o.kill_every;
            // Never the frozen one: it is continued, then maybe killed another time.
            let alive: Vec<usize> = (0..o.workers)
                .filter(|s| {
                    workers.slots[*s].is_some() && self.frozen.is_none_or(|(f, ..)| f != *s)
                })
                .collect();
            if !alive.is_empty() {
                let slot = alive[self.rng.random_range(0..alive.len())];
                workers.kill(slot)?;
                self.counts.kills += 1;
                // Mostly an immediate restart under the same id (it resumes its own
                // work at once); sometimes a restart only after stale_after, so
                // that the other workers' automatic recovery takes its work first.
                let delay = if self.rng.random_bool(0.25) {
                    self.counts.delayed_restarts += 1;
                    Duration::from_millis(STALE_MS + 1000)
                } else {
                    Duration::ZERO
                };
                workers.restarts.push((slot, now + delay));
            }
        }
        Ok(())
    }
}

/// Prints what the run did and saw, and the violations; true if there were none.
fn summarise(
    o: &Options,
    elapsed: Duration,
    counts: &Counts,
    refused_starts: usize,
    report: &Report,
    violations: &[String],
) -> bool {
    println!(
        "chaos: {} workflows ({} succeeded) in {:.1}s = {:.1} wf/s; {} kills ({} restarted late); \
         {} database restarts ({} past the fence window, {} worker starts refused meanwhile); \
         {} partitions of worker 0 ({} past stale_after); {} freezes ({} past stale_after, \
         {} bodies taken over while frozen); \
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
        refused_starts,
        counts.partitions,
        counts.long_partitions,
        counts.freezes,
        counts.long_freezes,
        report.superseded,
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
        true
    } else {
        println!("chaos: {} VIOLATIONS", violations.len());
        for v in violations.iter().take(30) {
            println!("  - {v}");
        }
        false
    }
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
    let client = Client::new(Database::from(store::open(&db.url).await?));
    let ledger = dir.join("ledger");
    let mut workers = Workers::new(o, db, dir, &ledger)?;
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

    let mut faults = Faults {
        started,
        rng: StdRng::seed_from_u64(o.seed),
        counts: Counts {
            kills: 0,
            freezes: 0,
            long_freezes: 0,
            delayed_restarts: 0,
            db_restarts: 0,
            db_long_outages: 0,
            partitions: 0,
            long_partitions: 0,
        },
        next_partition: started + o.partition_every,
        healed_at: None,
        next_kill: started + o.kill_every,
        next_freeze: started + o.freeze_every,
        frozen: None,
    };
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
                faults.counts.kills
            );
        }
        workers.start_due(now)?;
        workers.check_unexpected_exits()?;
        if let Some((ns, _)) = &db.partition {
            faults.partition(ns, now, o);
        }
        if let Some(cluster) = &db.cluster
            && !o.restart_db_every.is_zero()
            && outage.is_none()
            && now >= next_db_restart
        {
            outage = Some(stop_database(cluster, &mut faults.rng, &mut faults.counts).await?);
        }
        faults.freeze(&mut workers, now, o)?;
        faults.kill(&mut workers, now, o)?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let elapsed = started.elapsed();
    if let (Some(cluster), Some(_)) = (&db.cluster, &outage) {
        start_database(cluster)?;
    }
    if let (Some((ns, _)), Some(_)) = (&db.partition, faults.healed_at) {
        ns.heal();
    }
    if let Some((_, pid, _)) = faults.frozen {
        workers.thaw(pid);
    }
    workers.stop_all().await;
    let mut violations = std::mem::take(&mut workers.violations);
    if !finished {
        violations.push(format!("not every workflow ended within {:?}", o.timeout));
    }

    let report = verify(o, &client, &ledger, &mut violations).await?;
    Ok(summarise(
        o,
        elapsed,
        &faults.counts,
        workers.refused_starts,
        &report,
        &violations,
    ))
}
