//! `manent-server -c manent.yml {serve|api|worker|admin …}`: a thin binary
//! over the library crates. Parses arguments, loads the configuration, opens
//! the database and runs the chosen role until SIGINT or SIGTERM.

use std::{
    io::IsTerminal,
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context, Result, anyhow, bail};
use axum_server::tls_rustls::RustlsConfig;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use manent_api::{AppState, Role, auth};
use manent_config::{Config, LogFormat};
use manent_deploy::{Plugins, background::schedules::Ticker};
use manent_engine::{Client, Connections, Database, Engine, EngineConfig, Records};
use tokio::signal::unix::{SignalKind, signal};

mod http;
mod listener;

/// jemalloc for every allocation of the process, SQLite's included: a worker that runs for
/// months holds what it uses, not what its busiest moment took (docs/scaling-and-recovery.md,
/// "Memory"; the choice and its measurements in the workspace Cargo.toml).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "manent-server",
    version,
    about = "manent: durable deploys. API, worker, or both, over one database."
)]
struct Args {
    /// The configuration file (manent.yml). Without it, defaults plus MANENT__* variables.
    #[arg(short, long, global = true, env = "MANENT_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The API and a worker in one process (development, small installs).
    Serve,
    /// The HTTP API (stateless: run N behind a load balancer).
    Api,
    /// A worker: runs deploys from the queues (each with its own stable executor id).
    Worker,
    /// Administration.
    #[command(subcommand)]
    Admin(Admin),
    /// Prints the completion script for SHELL on stdout, e.g.
    /// `manent-server completion bash > /etc/bash_completion.d/manent-server`.
    Completion { shell: clap_complete::Shell },
}

#[derive(Subcommand)]
enum Admin {
    /// Creates or updates the database schema.
    Migrate,
    /// Hands the pending deploys of an executor back to the queues, for any worker to resume.
    Recover {
        #[arg(long)]
        executor: String,
        /// Recover even an executor whose lease is live: the lease is revoked
        /// and its process stops at its next renewal.
        #[arg(long)]
        force: bool,
    },
    /// API tokens.
    #[command(subcommand)]
    Token(Token),
    /// Validates the configuration and exits.
    CheckConfig,
    /// Copies a whole manent database (history, schedules, tokens, audit, output) into an
    /// empty one, SQLite to PostgreSQL or back: the way from the quickstart's file to a
    /// shared server. Stop every worker and server on the source first.
    Copy {
        /// The database to copy: `sqlite://PATH` or `postgres://…`.
        #[arg(long)]
        from: String,
        /// An empty database to copy into (created if it is a SQLite file that is missing).
        #[arg(long)]
        to: String,
    },
    /// Applies `retention` now (workers do it every `retention.every`): removes finished
    /// deploys past their age (never the newest `keep_last` successful ones of each
    /// environment, nor anything in flight), old output lines and audit entries.
    Prune {
        /// Counts what would be removed; removes nothing.
        #[arg(long)]
        dry_run: bool,
        /// Then rewrites a SQLite file to give the freed space back (VACUUM: the file is
        /// locked meanwhile, and needs as much free disk again). On PostgreSQL every
        /// prune already ends with a plain VACUUM of manent's tables; this adds nothing.
        #[arg(long)]
        vacuum: bool,
        /// `table` (default) or `json`.
        #[arg(long, short = 'o', default_value = "table")]
        output: OutputFormat,
    },
}

#[derive(Subcommand)]
enum Token {
    /// Creates a token and prints it on stdout (shown once). Names are unique.
    Create {
        #[arg(long)]
        name: String,
        /// viewer, deployer, approver or admin.
        #[arg(long)]
        role: String,
        /// Application pattern the role is granted on, qualified with the tenant (`ml/*`).
        #[arg(long)]
        on: Option<String>,
        /// When the token stops working: a duration from now (`30d`, `12h`) or an RFC 3339
        /// time (`2027-01-31T00:00:00Z`). Without it, never.
        #[arg(long)]
        expires: Option<String>,
    },
    /// Lists the tokens: name, id, role, scope, created, expires, last used (never a secret).
    List {
        /// `table` (default) or `json`.
        #[arg(long, short = 'o', default_value = "table")]
        output: OutputFormat,
    },
    /// Revokes a token: from then on it answers 401.
    Revoke {
        #[arg(long)]
        name: String,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum OutputFormat {
    Table,
    Json,
}

fn main() -> std::process::ExitCode {
    // The release, the schema and the workflow versions (`manent_deploy::build_version`):
    // computed, so clap's `version` attribute cannot hold it; leaked once, for the process.
    let version: &'static str = Box::leak(manent_deploy::build_version().into_boxed_str());
    let matches = Args::command().version(version).get_matches();
    let args = match Args::from_arg_matches(&matches) {
        Ok(args) => args,
        Err(e) => e.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("manent-server: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("manent-server: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn load_config(path: Option<&PathBuf>) -> Result<Config> {
    let env = manent_config::process_env();
    Ok(match path {
        Some(p) => Config::load(p, env)?,
        None => Config::from_env(env)?,
    })
}

fn init_logging(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{},sqlx=warn", config.log.level))
    });
    // Colour codes only on a terminal: a log file or journald gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match config.log.format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

async fn open_database(config: &Config, command: &Command) -> Result<Database> {
    // A relative SQLite file is relative to manent.yml's directory, not to the shell's.
    Database::open(&config.database_url(), &connections(config, command))
        .await
        .with_context(|| "cannot open the database (database.url)".to_string())
}

/// The PostgreSQL connections of a process of this role (docs/scaling-and-recovery.md,
/// "Connections"): a pool of `database.max_connections`, by default as many as a worker runs
/// deploys at once (`dbos.concurrency`'s default) or as many API requests talk to the
/// database at once, the sum of both for `serve`, two for `admin`; the API and the workers
/// listen for wake-ups, `admin` does not.
fn connections(config: &Config, command: &Command) -> Connections {
    let executor = config.effective_executor_id();
    let (role_max, listen, name) = match command {
        Command::Api => (10, true, "manent api".to_string()),
        Command::Worker => (10, true, format!("manent worker {executor}")),
        Command::Serve => (20, true, format!("manent serve {executor}")),
        Command::Admin(_) | Command::Completion { .. } => (2, false, "manent admin".to_string()),
    };
    Connections {
        max: config.database.max_connections.unwrap_or(role_max),
        idle_timeout: config.database.idle_timeout,
        listen,
        application_name: name,
    }
}

async fn run(args: Args) -> Result<()> {
    if let Command::Completion { shell } = args.command {
        let mut command = Args::command();
        clap_complete::generate(shell, &mut command, "manent-server", &mut std::io::stdout());
        return Ok(());
    }
    if let Command::Admin(Admin::Copy { from, to }) = &args.command {
        return copy_database(from, to).await;
    }
    let config = Arc::new(load_config(args.config.as_ref())?);
    // Clashing queue names stop workers only (the seed's page); every other role reports
    // them and goes on.
    let worker_refusals = config.worker_refusals();
    let starts_a_worker = matches!(args.command, Command::Serve | Command::Worker);
    if starts_a_worker && !worker_refusals.is_empty() {
        let issues: Vec<String> = worker_refusals.iter().map(ToString::to_string).collect();
        anyhow::bail!(
            "{}: a worker cannot start with this configuration:\n{}",
            config.file_name(),
            issues.join("\n")
        );
    }
    if let Command::Admin(Admin::CheckConfig) = args.command {
        println!(
            "{}: valid (executor id {})",
            config.file_name(),
            config.effective_executor_id()
        );
        for issue in &worker_refusals {
            println!("warning: workers will refuse to start: {issue}");
        }
        for (_, issue) in manent_deploy::plugins::confinement_issues(&config) {
            println!("warning: {issue}");
        }
        return Ok(());
    }
    init_logging(&config);
    for issue in &worker_refusals {
        tracing::warn!(%issue, "workers will refuse to start with this configuration");
    }
    let database = open_database(&config, &args.command).await?;
    match args.command {
        Command::Serve => serve(config, database, true, true).await,
        Command::Api => serve(config, database, true, false).await,
        Command::Worker => serve(config, database, false, true).await,
        Command::Admin(Admin::Prune {
            dry_run,
            vacuum,
            output,
        }) => prune(&config, database, dry_run, vacuum, output).await,
        Command::Admin(admin) => run_admin(admin, database).await,
        Command::Completion { .. } => unreachable!("handled before the configuration is read"),
    }
}

/// `admin copy`: the database at `from` into the empty one at `to`, then a line per table
/// and an audit entry in the copy.
async fn copy_database(from: &str, to: &str) -> Result<()> {
    let report = Database::copy(from, to, manent_engine::now_ms())
        .await
        .with_context(|| "cannot copy the database".to_string())?;
    let total: u64 = report.tables.iter().map(|(_, rows)| rows).sum();
    println!("copied {total} row(s) into the new database:");
    for (table, rows) in &report.tables {
        println!("  {table} {rows}");
    }
    let copy = Database::open(
        to,
        &Connections {
            max: 2,
            listen: false,
            application_name: "manent admin".into(),
            ..Default::default()
        },
    )
    .await
    .context("cannot open the copy")?;
    let kind = |url: &str| {
        if url.starts_with("sqlite:") {
            "sqlite"
        } else {
            "postgres"
        }
    };
    audit_admin(
        &Client::new(copy).records(),
        "database.copy",
        &format!("from {} to {}", kind(from), kind(to)),
    )
    .await;
    println!("point database.url at it, then start the servers and workers there");
    Ok(())
}

/// `admin prune`: the retention policy, now (docs/configuration.md, `retention`).
async fn prune(
    config: &Config,
    database: Database,
    dry_run: bool,
    vacuum: bool,
    output: OutputFormat,
) -> Result<()> {
    let client = Client::new(database);
    let report = manent_deploy::background::retention::prune(
        &client,
        &config.retention,
        manent_engine::now_ms(),
        dry_run,
    )
    .await
    .context("applying retention")?;
    if vacuum && !dry_run {
        client
            .reclaim_space(true)
            .await
            .context("giving the freed space back (VACUUM)")?;
    }
    if !dry_run {
        audit_admin(&client.records(), "retention.prune", "").await;
    }
    match output {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        OutputFormat::Table => {
            let verb = if dry_run { "would remove" } else { "removed" };
            println!(
                "{verb}: deploys {} (passes {}, steps {}), output lines {}, audit entries {}",
                report.deploys,
                report.passes,
                report.steps,
                report.output_lines,
                report.audit_entries
            );
        }
    }
    Ok(())
}

async fn run_admin(admin: Admin, database: Database) -> Result<()> {
    let client = Client::new(database);
    match admin {
        // The database was migrated when it was opened.
        Admin::Migrate => {
            println!("schema at version {}", client.schema_version().await?);
            Ok(())
        }
        Admin::Recover { executor, force } => {
            let recovered = client
                .recover_executor(&executor, force, "manent-server admin recover")
                .await?;
            audit_admin(&client.records(), "executor.recover", &executor).await;
            println!(
                "recovered {} workflow(s) of executor {executor}",
                recovered.len()
            );
            for id in recovered {
                println!("{id}");
            }
            Ok(())
        }
        Admin::Token(token) => run_token(token, &client.records()).await,
        Admin::CheckConfig => Ok(()),
        Admin::Prune { .. } => unreachable!("handled with the configuration"),
        Admin::Copy { .. } => unreachable!("handled before the configuration is read"),
    }
}

/// Who did it, in the audit trail, when a change is made with `manent-server admin`.
const ADMIN_ACTOR: &str = "manent-server admin";

async fn run_token(token: Token, records: &Records) -> Result<()> {
    match token {
        Token::Create {
            name,
            role,
            on,
            expires,
        } => {
            let role: Role = role.parse().map_err(anyhow::Error::msg).context("--role")?;
            let expires_at_ms = expires
                .as_deref()
                .map(|text| auth::parse_expiry(text, manent_engine::now_ms()))
                .transpose()
                .context("--expires")?;
            let new = auth::NewToken {
                name,
                role,
                on,
                expires_at_ms,
            };
            let (record, secret) = auth::create(records, &new)
                .await
                .with_context(|| format!("cannot create token `{}`", new.name))?;
            audit_admin(records, "token.create", &record.name).await;
            println!("{secret}");
            Ok(())
        }
        Token::List { output } => {
            let tokens = auth::list(records).await?;
            match output {
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&tokens)?),
                OutputFormat::Table => print!("{}", token_table(&tokens)),
            }
            Ok(())
        }
        Token::Revoke { name } => {
            let revoked = auth::revoke(records, &name)
                .await
                .with_context(|| format!("cannot revoke token `{name}`"))?;
            audit_admin(records, "token.revoke", &revoked.name).await;
            println!("revoked token {} ({})", revoked.name, revoked.id);
            Ok(())
        }
    }
}

/// Records a change made on the command line in the audit trail.
async fn audit_admin(records: &Records, action: &str, target: &str) {
    manent_api::audit::record_admin(records, ADMIN_ACTOR, action, target).await;
}

/// The tokens as a plain table (columns padded to their widest value).
fn token_table(tokens: &[auth::TokenView]) -> String {
    let mut rows = vec![
        [
            "NAME",
            "ID",
            "ROLE",
            "ON",
            "CREATED",
            "EXPIRES",
            "LAST USED",
        ]
        .map(String::from),
    ];
    for t in tokens {
        let expires = match (&t.expires_at, t.expired) {
            (Some(at), true) => format!("{at} (expired)"),
            (Some(at), false) => at.clone(),
            (None, _) => "never".into(),
        };
        rows.push([
            t.name.clone(),
            t.id.clone(),
            t.role.to_string(),
            t.on.clone().unwrap_or_else(|| "*".into()),
            t.created_at.clone(),
            expires,
            t.last_used_at.clone().unwrap_or_else(|| "never".into()),
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Runs the API and/or a worker until SIGINT or SIGTERM, then shuts down:
/// the API stops accepting, the worker drains for `dbos.drain_timeout`.
async fn serve(
    config: Arc<Config>,
    database: Database,
    with_api: bool,
    with_worker: bool,
) -> Result<()> {
    let mut sigterm = signal(SignalKind::terminate()).context("install the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("install the SIGINT handler")?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);

    let worker = if with_worker {
        for (plugin, issue) in manent_deploy::plugins::confinement_issues(&config) {
            tracing::error!(%plugin, "{issue}");
        }
        Some(start_worker(&config, database.clone()).await?)
    } else {
        None
    };

    let mut api = if with_api {
        let listener = tokio::net::TcpListener::bind(&config.api.listen)
            .await
            .with_context(|| format!("cannot listen on {} (api.listen)", config.api.listen))?;
        let addr = listener.local_addr()?;
        let state = AppState::new(Client::new(database.clone()), config.clone());
        let app = manent_api::app(state);
        let mut stop = stop_rx.clone();
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        let limits = listener::Limits {
            max_connections: listener::fit_to_this_process(config.api.max_connections),
            max_connections_per_source: config.api.max_connections_per_source,
            header_read_timeout: config.api.header_read_timeout,
        };
        let tls = match config.api_tls_paths() {
            None => {
                tracing::info!(%addr, max_connections = limits.max_connections, max_connections_per_source = limits.max_connections_per_source, "API listening (HTTP)");
                None
            }
            Some((cert, key)) => {
                // Read at startup: a bad certificate or key stops the process, naming the file.
                let tls = tls_config(&cert, &key)?;
                tracing::info!(%addr, cert = %cert.display(), max_connections = limits.max_connections, max_connections_per_source = limits.max_connections_per_source, "API listening (HTTPS)");
                Some(tls)
            }
        };
        // Where a person opens the Platform page (`#token=…` may be appended: docs/api.md).
        let page = page_url(config.api.public_url.as_deref(), addr, tls.is_some());
        tracing::info!(url = %page, "the Platform page is at {page}");
        Some(listener::serve(listener, app, tls, limits, shutdown)?)
    } else {
        None
    };

    let lease_lost = async {
        match &worker {
            Some((engine, _, _)) => engine.lease_lost().await,
            None => std::future::pending().await,
        }
    };
    let api_ended = async {
        match api.as_mut() {
            Some(task) => task.await,
            None => std::future::pending().await,
        }
    };
    let signal = async {
        tokio::select! {
            _ = sigterm.recv() => "SIGTERM",
            _ = sigint.recv() => "SIGINT",
        }
    };
    let stop = first_stop(signal, lease_lost, api_ended).await;
    let api_failure = match stop {
        Stop::Signal(name) => {
            tracing::info!("{name}: shutting down");
            None
        }
        Stop::LeaseLost(lost) => {
            // Another process holds this executor id now: its runs were stopped
            // and their commands killed; touch nothing more, exit non-zero.
            let _ = stop_tx.send(true);
            if let Some((_, _, plugins)) = worker {
                plugins.shutdown().await;
            }
            return Err(anyhow::Error::new(lost).context("the worker stopped"));
        }
        Stop::ApiEnded(ended) => {
            // Nobody asked the API to stop: the process must not go on as a worker whose
            // API is silently gone. The worker drains as on a signal; the exit is non-zero.
            api = None;
            let failure = match ended {
                Ok(Ok(())) => anyhow!("the API server stopped although no shutdown was asked"),
                Ok(Err(e)) => anyhow::Error::new(e).context("the API server failed"),
                Err(e) => anyhow::Error::new(e).context("the API task ended"),
            };
            tracing::error!(error = %format!("{failure:#}"), "the API stopped; shutting down");
            Some(failure)
        }
    };
    let _ = stop_tx.send(true);
    if let Some((engine, ticker, plugins)) = worker {
        // No new tick once shutting down; the deploys already enqueued wait for any worker.
        ticker.stop().await;
        let report = engine.shutdown(config.dbos.drain_timeout).await;
        tracing::info!(
            drained = report.drained,
            left_pending = report.left_pending.len(),
            "worker stopped"
        );
        // After the engine: no pass can need a plugin process any more.
        plugins.shutdown().await;
    }
    if let Some(failure) = api_failure {
        return Err(failure);
    }
    if let Some(api) = api {
        api.await.context("API task")?.context("API server")?;
    }
    Ok(())
}

/// Why `serve` stops: a signal, the worker's lease lost, or the API's task ending by
/// itself (with its result).
#[derive(Debug)]
enum Stop<A> {
    Signal(&'static str),
    LeaseLost(manent_engine::EngineError),
    ApiEnded(A),
}

/// The first of the three that happens.
async fn first_stop<A>(
    signal: impl Future<Output = &'static str>,
    lease_lost: impl Future<Output = manent_engine::EngineError>,
    api_ended: impl Future<Output = A>,
) -> Stop<A> {
    tokio::select! {
        name = signal => Stop::Signal(name),
        lost = lease_lost => Stop::LeaseLost(lost),
        ended = api_ended => Stop::ApiEnded(ended),
    }
}

/// The TLS configuration of `api.tls`: the certificate chain and key from PEM files,
/// TLS 1.2 and 1.3 with rustls' safe defaults over the `ring` provider (the one already
/// used for SSH and the CLI), HTTP/1.1 only (`axum::serve` speaks only HTTP/1.1 too).
fn tls_config(cert: &Path, key: &Path) -> Result<RustlsConfig> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .with_context(|| {
            format!(
                "api.tls.cert: cannot read PEM certificates from {}",
                cert.display()
            )
        })?;
    if chain.is_empty() {
        bail!(
            "api.tls.cert: no certificate in {} (expected PEM `BEGIN CERTIFICATE`)",
            cert.display()
        );
    }
    warn_if_others_may_read(key);
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| {
        format!(
            "api.tls.key: cannot read a PEM private key from {}",
            key.display()
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("api.tls: TLS versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("api.tls: the key does not match the certificate, or is not supported")?;
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(RustlsConfig::from_config(Arc::new(server)))
}

/// Warns when the TLS private key is readable by its group or others (docs/security.md,
/// "TLS"): whoever reads it can impersonate the API. Not refused: a Kubernetes secret
/// volume is 0644 unless its `defaultMode` says otherwise.
fn warn_if_others_may_read(key: &Path) {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(key) {
        Ok(meta) if meta.permissions().mode() & 0o077 != 0 => tracing::warn!(
            key = %key.display(),
            mode = format!("{:o}", meta.permissions().mode() & 0o777),
            "api.tls.key: the TLS private key {} may be read by other users than its owner; \
             run `chmod 600 {}` (in Kubernetes, defaultMode: 0400 on the secret's volume)",
            key.display(),
            key.display()
        ),
        Ok(_) => {}
        // Reading the key itself says what is wrong with it, next.
        Err(_) => {}
    }
}

/// How often a worker's ticker looks for due schedule ticks.
const TICK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Starts the engine on this worker's queues, and the schedule ticker; returns them with the
/// worker's plugins (their processes start on first use).
async fn start_worker(
    config: &Config,
    database: Database,
) -> Result<(Engine, Ticker, Arc<Plugins>)> {
    let mut engine_config = EngineConfig::new(config.effective_executor_id());
    // What `manent workers` shows: which schema and workflow versions this worker runs.
    engine_config.version = manent_deploy::build_version();
    engine_config.region = config.dbos.region.clone();
    engine_config.stale_after = config.recovery.stale_after;
    engine_config.heartbeat_interval = config.recovery.heartbeat_interval;
    engine_config.automatic_recovery = config.recovery.automatic;
    engine_config.output_per_run = config.worker.max_output_bytes();
    let engine = Engine::new(database.clone(), engine_config);
    let queues = manent_deploy::worker_queues(config);
    if queues.is_empty() {
        bail!("this worker serves no queue: check dbos.exclusive, dbos.queues and dbos.plugins");
    }
    for q in &queues {
        engine.listen(q.spec());
    }
    // Scheduled deploys are authorised again as they fire, against the API's token store
    // (manent-deploy asks through its `Authority` trait; it does not know tokens).
    let client = Client::new(database);
    let authority: Arc<dyn manent_deploy::authority::Authority> =
        Arc::new(manent_api::auth::TokenAuthority::new(client.records()));
    // The worker's one HTTP client (manent-deploy asks through its port, `HttpFetch`):
    // artifact downloads, HTTP checks, the analysis' providers, webhooks.
    let http: Arc<dyn manent_deploy::http::HttpFetch> = Arc::new(http::Reqwest::new()?);
    let plugins =
        manent_deploy::register_workflows(&engine, config, authority.clone(), http.clone());
    manent_deploy::drift::register(&engine, config);
    manent_deploy::notifications::register(&engine, config, http);
    engine.launch().await.context("the worker did not start")?;
    // After the launch resumed this worker's own deploys: their directories stay.
    manent_deploy::run::workdirs::spawn_sweeper(
        client.clone(),
        config.worker_workdir(),
        config.effective_executor_id().to_string(),
    );
    manent_deploy::background::retention::spawn_pruner(client.clone(), config.retention.clone());
    manent_deploy::notifications::outbox::spawn_adopter(client.clone());
    manent_deploy::drift::schedule::spawn(client.clone(), Arc::new(config.clone()));
    let policy = manent_deploy::background::schedules::TickPolicy {
        config: Arc::new(config.clone()),
        authority,
    };
    let ticker = Ticker::start(client, policy, TICK_INTERVAL);
    Ok((engine, ticker, plugins))
}

/// The Platform page's URL: `api.public_url` when set (behind a load balancer), else the
/// address listened on, with `localhost` for an unspecified one (`0.0.0.0`, `::`).
fn page_url(public_url: Option<&str>, addr: std::net::SocketAddr, https: bool) -> String {
    if let Some(public) = public_url {
        return format!("{}/", public.trim_end_matches('/'));
    }
    let scheme = if https { "https" } else { "http" };
    let host = if addr.ip().is_unspecified() {
        "localhost".to_string()
    } else if addr.is_ipv6() {
        format!("[{}]", addr.ip())
    } else {
        addr.ip().to_string()
    };
    format!("{scheme}://{host}:{}/", addr.port())
}

#[cfg(test)]
mod tests {
    use std::future::{pending, ready};

    use super::*;

    #[test]
    fn the_page_url_is_the_public_one_or_the_address_listened_on() {
        let addr = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        assert_eq!(
            page_url(None, addr("127.0.0.1:8080"), false),
            "http://127.0.0.1:8080/",
            "an IPv4 listener's page URL"
        );
        assert_eq!(
            page_url(None, addr("0.0.0.0:8443"), true),
            "https://localhost:8443/",
            "an unspecified address is opened as localhost"
        );
        assert_eq!(
            page_url(None, addr("[::1]:80"), false),
            "http://[::1]:80/",
            "an IPv6 listener's page URL, bracketed"
        );
        assert_eq!(
            page_url(
                Some("https://deploy.example.com/"),
                addr("0.0.0.0:80"),
                false
            ),
            "https://deploy.example.com/",
            "behind a load balancer, the URL people use"
        );
    }

    fn lost() -> manent_engine::EngineError {
        manent_engine::EngineError::LeaseLost {
            executor_id: "w1".into(),
            detail: "taken over".into(),
        }
    }

    #[tokio::test]
    async fn an_api_that_ends_by_itself_stops_serve() {
        let stop = first_stop(pending(), pending(), ready("ended")).await;
        assert!(
            matches!(stop, Stop::ApiEnded("ended")),
            "the API's end is noticed, with its result: {stop:?}"
        );
    }

    #[tokio::test]
    async fn a_signal_stops_serve_while_the_api_runs() {
        let stop = first_stop(ready("SIGTERM"), pending(), pending::<()>()).await;
        assert!(
            matches!(stop, Stop::Signal("SIGTERM")),
            "a signal is a shutdown: {stop:?}"
        );
    }

    #[tokio::test]
    async fn a_lost_lease_stops_serve_while_the_api_runs() {
        let stop = first_stop(pending(), ready(lost()), pending::<()>()).await;
        assert!(
            matches!(stop, Stop::LeaseLost(_)),
            "a lost lease stops the process: {stop:?}"
        );
    }
}
