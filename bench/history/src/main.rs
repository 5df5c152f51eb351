//! manent-history-bench: manent's views through its HTTP API over a short history and a long
//! one, on SQLite and PostgreSQL (issue 30, "Views that scale").
//!
//! For each backend and size: a fresh database; the first 1,000 deploys run through a real
//! engine (the deploy workflow, the command plugin on a local target: steps, events, output and
//! the audit trail as manent writes them), then the history is doubled by SQL copies of those
//! rows, each copy placed before the others in time, until it holds the size asked for. None
//! of that is timed. Then an API process serves the database and each view is requested
//! `--samples` times through HTTP (after 3 unmeasured requests); p50 and p95 are printed with
//! the ratio of each view's p50 at the largest size to its p50 at the smallest, against the
//! goal: within 1.5x, and under 50 ms.
//!
//! usage: manent-history-bench [--sizes 1000,1000000] [--backends sqlite,postgres]
//!        [--postgres-url postgres://postgres@127.0.0.1:5432/postgres] [--samples 30]

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use manent_api::{AppState, Role, auth};
use manent_config::Config;
use manent_deploy::{Submitter, authority, submission};
use manent_engine::{Client, Connections, Database, Engine, EngineConfig};
use sqlx::{Connection, Executor};

/// Deploys run through the engine; the rest of a history is copies of them.
const BASE: u64 = 1_000;
/// Applications × environments the deploys are spread over.
const APPLICATIONS: u64 = 20;
const ENVIRONMENTS: [&str; 3] = ["prod", "staging", "dev"];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Backend {
    Sqlite,
    Postgres,
}

struct Args {
    sizes: Vec<u64>,
    backends: Vec<Backend>,
    postgres_url: String,
    samples: usize,
}

fn args() -> Result<Args> {
    let mut args = Args {
        sizes: vec![1_000, 1_000_000],
        backends: vec![Backend::Sqlite, Backend::Postgres],
        postgres_url: std::env::var("MANENT_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into()),
        samples: 30,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--sizes" => {
                args.sizes = value
                    .split(',')
                    .map(|s| s.parse().with_context(|| format!("--sizes: {s}")))
                    .collect::<Result<_>>()?;
            }
            "--backends" => {
                args.backends = value
                    .split(',')
                    .map(|b| match b {
                        "sqlite" => Ok(Backend::Sqlite),
                        "postgres" => Ok(Backend::Postgres),
                        other => Err(anyhow!("--backends: {other} (sqlite or postgres)")),
                    })
                    .collect::<Result<_>>()?;
            }
            "--postgres-url" => args.postgres_url = value,
            "--samples" => args.samples = value.parse().context("--samples")?,
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(args)
}

/// A view of the API and the path it is read at.
struct View {
    name: &'static str,
    path: String,
}

/// One measurement: a view's p50 and p95 in ms at one size on one backend.
struct Measured {
    backend: Backend,
    size: u64,
    view: &'static str,
    p50: f64,
    p95: f64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = args()?;
    let mut results = Vec::new();
    for &backend in &args.backends {
        for &size in &args.sizes {
            eprintln!("== {backend:?}, {size} deploys");
            results.extend(run(&args, backend, size).await?);
        }
    }
    report(&args, &results);
    Ok(())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// A fresh database: a SQLite file in `dir`, or a new PostgreSQL database (dropped at the end).
async fn fresh_database(
    args: &Args,
    backend: Backend,
    dir: &std::path::Path,
    size: u64,
) -> Result<String> {
    match backend {
        Backend::Sqlite => Ok(format!("sqlite://{}", dir.join("manent.db").display())),
        Backend::Postgres => {
            let name = format!("bench_history_{}_{size}", std::process::id());
            let mut admin = sqlx::PgConnection::connect(&args.postgres_url)
                .await
                .with_context(|| format!("connecting to {}", args.postgres_url))?;
            admin
                .execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
                .await?;
            admin
                .execute(format!("CREATE DATABASE {name}").as_str())
                .await?;
            let (base, _) = args
                .postgres_url
                .rsplit_once('/')
                .context("the PostgreSQL URL ends with a database name")?;
            Ok(format!("{base}/{name}"))
        }
    }
}

async fn drop_database(args: &Args, url: &str) -> Result<()> {
    if let Some(name) = url
        .strip_prefix("postgres")
        .and(url.rsplit_once('/').map(|(_, n)| n))
    {
        let mut admin = sqlx::PgConnection::connect(&args.postgres_url).await?;
        admin
            .execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
            .await?;
    }
    Ok(())
}

async fn run(args: &Args, backend: Backend, size: u64) -> Result<Vec<Measured>> {
    let dir = tempfile::tempdir()?;
    let url = fresh_database(args, backend, dir.path(), size).await?;
    let config = site(dir.path(), &url)?;
    let database = Database::open(&url, &Connections::default())
        .await
        .context("open the database")?;
    let client = Client::new(database.clone());

    // The first deploys, through a real engine.
    let started = Instant::now();
    let engine = Engine::new(database.clone(), EngineConfig::new("bench-history"));
    for queue in manent_deploy::worker_queues(&config) {
        engine.listen(queue.spec());
    }
    // Its deploys fetch a `file://` artifact and check nothing over HTTP.
    manent_deploy::register_workflows(
        &engine,
        &config,
        Arc::new(authority::NoTokens),
        Arc::new(manent_deploy::http::NoClient),
    );
    engine.launch().await.context("launch the engine")?;
    let shared = Arc::new(config.clone());
    let base = size.min(BASE);
    let mut ids = Vec::new();
    for i in 0..base {
        let application = format!("bench/app{}", i % APPLICATIONS);
        let environment = ENVIRONMENTS[(i / APPLICATIONS) as usize % ENVIRONMENTS.len()];
        let descriptor = submission::parse(
            descriptor(dir.path(), &application, environment, i),
            "bench.yml".into(),
        )
        .await
        .map_err(|e| anyhow!("{e:?}"))?;
        let submitted = submission::submit(
            &client,
            &shared,
            descriptor,
            false,
            &Submitter::named("bench"),
        )
        .await
        .map_err(|e| anyhow!("{e:?}"))?;
        ids.push(submitted.id);
    }
    for id in &ids {
        client
            .wait(id, Duration::from_secs(600))
            .await
            .with_context(|| format!("deploy {id} ends"))?;
    }
    engine.shutdown(Duration::from_secs(10)).await;
    eprintln!(
        "   {base} deploys run in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The rest of the history: copies, each older than everything before it.
    let started = Instant::now();
    let rows = grow(backend, &url, size).await?;
    eprintln!(
        "   grown to {rows} deploys in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let token = auth::create_token(&client.records(), "bench", Role::Admin, None)
        .await
        .map_err(|e| anyhow!("{e:?}"))?;
    let state = AppState::new(client.clone(), Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            manent_api::app(state).into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    let http = reqwest::Client::new();
    let base_url = format!("http://{addr}");
    // The 50th newest deploy: the cursor of the second page.
    let first_page: serde_json::Value =
        get(&http, &base_url, &token, "/api/v1/deploys?limit=50").await?;
    let fiftieth = first_page[49]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let one = ids.first().cloned().unwrap_or_default();
    let views = views(&fiftieth, &one);
    let mut measured = Vec::new();
    for view in &views {
        let mut ms = Vec::with_capacity(args.samples);
        for n in 0..args.samples + 3 {
            let at = Instant::now();
            get(&http, &base_url, &token, &view.path).await?;
            if n >= 3 {
                ms.push(at.elapsed().as_secs_f64() * 1000.0);
            }
        }
        ms.sort_by(f64::total_cmp);
        let rank = |q: f64| ms[((q * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
        measured.push(Measured {
            backend,
            size,
            view: view.name,
            p50: rank(0.5),
            p95: rank(0.95),
        });
        eprintln!(
            "   {:<34} p50 {:>8.2} ms  p95 {:>8.2} ms",
            view.name,
            rank(0.5),
            rank(0.95)
        );
    }
    server.abort();
    drop(client);
    drop(database);
    drop_database(args, &url).await?;
    Ok(measured)
}

/// The views measured, in the order they are reported: `fiftieth` is the cursor of the
/// list's second page, `one` a deploy of the first batch.
fn views(fiftieth: &str, one: &str) -> [View; 14] {
    [
        View {
            name: "list",
            path: "/api/v1/deploys?limit=50".into(),
        },
        View {
            name: "list, next page",
            path: format!("/api/v1/deploys?limit=50&before={fiftieth}"),
        },
        View {
            name: "list --application",
            path: "/api/v1/deploys?limit=50&application=bench/app7".into(),
        },
        View {
            name: "list --application --environment",
            path: "/api/v1/deploys?limit=50&application=bench/app7&environment=staging".into(),
        },
        View {
            name: "list --environment",
            path: "/api/v1/deploys?limit=50&environment=staging".into(),
        },
        View {
            name: "list --status SUCCESS",
            path: "/api/v1/deploys?limit=50&status=SUCCESS".into(),
        },
        View {
            name: "list --status CANCELLED (none)",
            path: "/api/v1/deploys?limit=50&status=CANCELLED".into(),
        },
        View {
            name: "history",
            path: "/api/v1/apps/bench/app7/environments/prod/history?limit=50".into(),
        },
        View {
            name: "activity",
            path: "/api/v1/activity".into(),
        },
        View {
            name: "apps",
            path: "/api/v1/apps".into(),
        },
        View {
            name: "status",
            path: format!("/api/v1/deploys/{one}"),
        },
        View {
            name: "logs",
            path: format!("/api/v1/deploys/{one}/logs"),
        },
        View {
            name: "output",
            path: format!("/api/v1/deploys/{one}/output"),
        },
        View {
            name: "audit",
            path: "/api/v1/audit?limit=50".into(),
        },
    ]
}

async fn get(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    path: &str,
) -> Result<serde_json::Value> {
    let response = http
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .with_context(|| format!("GET {path}"))?;
    let status = response.status();
    let body: serde_json::Value = response
        .json()
        .await
        .with_context(|| format!("GET {path}: not JSON"))?;
    if !status.is_success() {
        bail!("GET {path}: {status} {body}");
    }
    Ok(body)
}

/// The environments source, the artifact and the configuration of the site.
fn site(dir: &std::path::Path, url: &str) -> Result<Config> {
    std::fs::write(dir.join("artifact.txt"), "history")?;
    for a in 0..APPLICATIONS {
        let app = dir.join(format!("environments/bench/app{a}"));
        std::fs::create_dir_all(&app)?;
        for environment in ENVIRONMENTS {
            std::fs::write(
                app.join(format!("{environment}.yml")),
                "targets: [{name: t1, host: local}]\ndeploy: {plugin: command, commands: [\"echo deployed $MANENT_VERSION\"]}\n",
            )?;
        }
    }
    let yaml = format!(
        "database: {{url: {url:?}}}\ndbos: {{executor_id: bench-history, concurrency: 20}}\n\
         environments: {{source: {:?}}}\nartifacts: {{sources: [{:?}]}}\nworker: {{workdir: {:?}}}\n",
        dir.join("environments").display().to_string(),
        format!("file://{}/", dir.display()),
        dir.join("work").display().to_string(),
    );
    Config::from_yaml_str(&yaml, "manent.yml", std::iter::empty()).map_err(|e| anyhow!("{e}"))
}

fn descriptor(dir: &std::path::Path, application: &str, environment: &str, i: u64) -> String {
    format!(
        "application: {application}\nenvironment: {environment}\nartifacts:\n  - {{name: artifact.txt, type: file, \
         version: \"1.{i}\", url: \"file://{}/artifact.txt\", \
         sha256: \"{}\"}}\n",
        dir.display(),
        // sha256("history")
        "259aa8ef98a8b91de574cd904138ef643240c23080cf24da4793a6f10a43fa9d"
    )
}

/// A connection of the benchmark's own, to either backend.
enum Conn {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

impl Conn {
    async fn open(backend: Backend, url: &str) -> Result<Self> {
        Ok(match backend {
            Backend::Sqlite => Conn::Sqlite(sqlx::SqliteConnection::connect(url).await?),
            Backend::Postgres => Conn::Postgres(sqlx::PgConnection::connect(url).await?),
        })
    }

    async fn exec(&mut self, sql: &str) -> Result<()> {
        match self {
            Conn::Sqlite(c) => c.execute(sql).await.map(|_| ()),
            Conn::Postgres(c) => c.execute(sql).await.map(|_| ()),
        }
        .with_context(|| format!("running {sql}"))
    }

    async fn number(&mut self, sql: &str) -> Result<i64> {
        match self {
            Conn::Sqlite(c) => sqlx::query_scalar(sql).fetch_one(c).await,
            Conn::Postgres(c) => sqlx::query_scalar(sql).fetch_one(c).await,
        }
        .with_context(|| format!("running {sql}"))
    }
}

/// Doubles the history by SQL copies until it holds `size` deploys; returns how many it holds.
/// Each copy is of the newest rows of the workflows table (all of them, or as many as are
/// still missing) with their steps, events and output, ids suffixed `~<round>`, placed before
/// the oldest in enqueue order and in time: the newest deploys stay those that really ran.
async fn grow(backend: Backend, url: &str, size: u64) -> Result<u64> {
    let mut conn = Conn::open(backend, url).await?;
    let mut round = 0;
    loop {
        let count = conn.number("SELECT COUNT(*) FROM manent_workflows").await?;
        let count = u64::try_from(count)?;
        if count >= size {
            if backend == Backend::Postgres {
                conn.exec("ANALYZE").await?;
            }
            return Ok(count);
        }
        let missing = (size - count).min(count);
        let seq_span = conn
            .number("SELECT MAX(created_seq) - MIN(created_seq) + 1 FROM manent_workflows")
            .await?;
        let ms_span = conn
            .number("SELECT MAX(COALESCE(finished_at, updated_at)) - MIN(created_at) + 1000 FROM manent_workflows")
            .await?;
        let tag = format!("~{round}");
        conn.exec("BEGIN").await?;
        conn.exec(&format!(
            "INSERT INTO manent_workflows (id, name, status, queue_name, partition_key, priority, \
             not_before, dedup_key, executor_id, input, output, error, parent_id, attempts, \
             generation, created_at, created_seq, updated_at, started_at, finished_at, \
             limit_group, workflow_version) \
             SELECT id || '{tag}', name, status, queue_name, partition_key, priority, \
             not_before, NULL, executor_id, input, output, error, parent_id || '{tag}', attempts, \
             generation, created_at - {ms_span}, created_seq - {seq_span}, updated_at - {ms_span}, \
             started_at - {ms_span}, finished_at - {ms_span}, limit_group, workflow_version \
             FROM manent_workflows ORDER BY created_seq DESC LIMIT {missing}"
        ))
        .await?;
        conn.exec(&format!(
            "INSERT INTO manent_steps (workflow_id, step_index, name, status, output, error, \
             attempts, started_at, finished_at, executor_id) \
             SELECT s.workflow_id || '{tag}', s.step_index, s.name, s.status, s.output, s.error, \
             s.attempts, s.started_at - {ms_span}, s.finished_at - {ms_span}, s.executor_id \
             FROM manent_steps s JOIN manent_workflows c ON c.id = s.workflow_id || '{tag}'"
        ))
        .await?;
        conn.exec(&format!(
            "INSERT INTO manent_events (workflow_id, event_key, value, updated_at) \
             SELECT e.workflow_id || '{tag}', e.event_key, e.value, e.updated_at - {ms_span} \
             FROM manent_events e JOIN manent_workflows c ON c.id = e.workflow_id || '{tag}'"
        ))
        .await?;
        conn.exec(&format!(
            "INSERT INTO manent_output (workflow_id, at, generation, source, stream, line) \
             SELECT o.workflow_id || '{tag}', o.at - {ms_span}, o.generation, o.source, o.stream, \
             o.line FROM manent_output o JOIN manent_workflows c ON c.id = o.workflow_id || '{tag}' \
             ORDER BY o.id"
        ))
        .await?;
        conn.exec("COMMIT").await?;
        eprintln!("   copy {round}: +{missing} deploys");
        round += 1;
    }
}

fn report(args: &Args, results: &[Measured]) {
    let (Some(&small), Some(&large)) = (args.sizes.iter().min(), args.sizes.iter().max()) else {
        return;
    };
    println!("\nload (1/5/15 min) at the end: {}", loadavg());
    for &backend in &args.backends {
        println!("\n{backend:?}: p50 (p95) in ms, {small} and {large} deploys\n");
        println!("| view | {small} | {large} | ratio | goal: <= 1.5x and < 50 ms |");
        println!("| --- | --- | --- | --- | --- |");
        let at = |size: u64, view: &str| {
            results
                .iter()
                .find(|m| m.backend == backend && m.size == size && m.view == view)
        };
        for m in results
            .iter()
            .filter(|m| m.backend == backend && m.size == small)
        {
            let Some(l) = at(large, m.view) else { continue };
            let ratio = l.p50 / m.p50.max(0.001);
            let ok = ratio <= 1.5 && l.p50 < 50.0;
            println!(
                "| {} | {:.2} ({:.2}) | {:.2} ({:.2}) | {ratio:.2}x | {} |",
                m.view,
                m.p50,
                m.p95,
                l.p50,
                l.p95,
                if ok { "PASS" } else { "FAIL" }
            );
        }
    }
}
