//! Owns the operator configuration `manent.yml`: its typed model, defaults, the loading
//! pipeline (YAML, then `MANENT__…`/`DBOS__VMID`/`MANENT_WORKDIR` environment overrides, then
//! validation) and
//! the look-ups the server needs. It knows nothing of SQL, HTTP or the engine.
//!
//! ```no_run
//! # use std::path::Path;
//! let config = manent_config::Config::load(Path::new("manent.yml"), manent_config::process_env())?;
//! println!("executor {}", config.effective_executor_id());
//! # Ok::<(), manent_config::ConfigError>(())
//! ```

mod env;
mod error;
mod notifications;
mod paths;
mod pattern;
mod plugins;
mod serde_util;
mod sources;
mod validate;
pub mod yaml;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use env::process_env;
pub use error::{ConfigError, ConfigIssue};
pub use notifications::{NotificationEvent, NotificationsConfig, Webhook, WebhookFormat};
pub use pattern::{check_application_pattern, glob_match};
pub use plugins::{Confinement, ExternalPlugin, PluginConfig};
pub use sources::{
    ArtifactSource, ArtifactSources, ArtifactsConfig, BasicAuth, Credentials,
    DEFAULT_MAX_ARTIFACT_BYTES, ScopedSource, SecretRef, SourceEntry, SourceError,
};

/// `database.url` when the file does not set it.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://manent.db";
/// `api.listen` when the file does not set it.
pub const DEFAULT_API_LISTEN: &str = "127.0.0.1:8080";
/// The environment variable that overrides `dbos.executor_id`, over everything else.
pub const VMID_VAR: &str = "DBOS__VMID";
/// The environment variable naming the worker's work directory, used as is (no executor id
/// directory added) over `worker.workdir`: for tests and benchmarks (docs/configuration.md).
pub const WORKDIR_VAR: &str = "MANENT_WORKDIR";
/// The prefix of the variables that override keys: `MANENT__SECTION__KEY`.
pub const ENV_PREFIX: &str = "MANENT__";

/// The whole operator configuration. Build it with [`Config::load`],
/// [`Config::from_yaml_str`], [`Config::from_env`] or [`Config::default`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default = "Config::unresolved", deny_unknown_fields)]
pub struct Config {
    /// The database shared by every API and worker process.
    #[serde(deserialize_with = "yaml::nullable")]
    pub database: DatabaseConfig,
    /// The HTTP API and the Platform page.
    #[serde(deserialize_with = "yaml::nullable")]
    pub api: ApiConfig,
    /// The durable engine and this worker's share of the queues.
    #[serde(deserialize_with = "yaml::nullable")]
    pub dbos: DbosConfig,
    /// Executor liveness and recovery of deploys left pending.
    #[serde(deserialize_with = "yaml::nullable")]
    pub recovery: RecoveryConfig,
    /// Plugins by name (external executables, their artifact types and queue).
    #[serde(deserialize_with = "yaml::nullable")]
    pub plugins: BTreeMap<String, PluginConfig>,
    /// Routed queues, in order: at submission the first whose `match` applies wins.
    #[serde(deserialize_with = "yaml::nullable")]
    pub queues: Vec<RoutedQueue>,
    /// The tenant registry.
    #[serde(deserialize_with = "yaml::nullable")]
    pub tenants: Vec<Tenant>,
    /// Where environment configurations are read.
    #[serde(deserialize_with = "yaml::nullable")]
    pub environments: EnvironmentsConfig,
    /// Where artifacts may be fetched from.
    #[serde(deserialize_with = "yaml::nullable")]
    pub artifacts: ArtifactsConfig,
    /// Logging.
    #[serde(deserialize_with = "yaml::nullable")]
    pub log: LogConfig,
    /// What a worker keeps on its own disk.
    #[serde(deserialize_with = "yaml::nullable")]
    pub worker: WorkerConfig,
    /// Bounds on recurring schedules (`schedule.cron`).
    #[serde(deserialize_with = "yaml::nullable")]
    pub schedules: SchedulesConfig,
    /// How long finished deploys, their output and the audit trail are kept.
    #[serde(deserialize_with = "yaml::nullable")]
    pub retention: RetentionConfig,
    /// Webhooks told of deploys' events (approval required, started, ended).
    #[serde(deserialize_with = "yaml::nullable")]
    pub notifications: NotificationsConfig,
    /// Where this configuration came from; used for messages and relative paths.
    #[serde(skip)]
    origin: Origin,
}

/// `database`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    /// `sqlite://FILE` (development, workers on one machine) or `postgres://…` (several nodes).
    pub url: String,
    /// PostgreSQL: the most connections of a process's pool (its session and background
    /// connection aside); unset, what its role needs (docs/scaling-and-recovery.md).
    pub max_connections: Option<u32>,
    /// PostgreSQL: how long a pooled connection may stay unused before it is closed.
    #[serde(with = "serde_util::duration")]
    pub idle_timeout: Duration,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        DatabaseConfig {
            url: DEFAULT_DATABASE_URL.to_owned(),
            max_connections: None,
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// `api`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    /// `HOST:PORT` the API listens on.
    pub listen: String,
    /// The URL clients use to reach the API (behind a load balancer), if not `listen`.
    pub public_url: Option<String>,
    /// Serve HTTPS with this certificate and key (PEM); plain HTTP without it.
    pub tls: Option<ApiTls>,
    /// The most connections open at once; one more is closed at once (fitted to the
    /// process's open-file limit at start).
    pub max_connections: usize,
    /// The most connections open at once from one source (an IPv4 address, an IPv6 /64);
    /// one more is closed at once, but for the few kept for health probes
    /// (docs/security.md, "The listener").
    pub max_connections_per_source: usize,
    /// How long a connection may take to send a request's head, and may stay idle between
    /// requests, before it is closed.
    #[serde(with = "serde_util::duration")]
    pub header_read_timeout: Duration,
    /// Failed authentications throttled per source (docs/security.md).
    #[serde(deserialize_with = "yaml::nullable")]
    pub auth_throttle: AuthThrottleConfig,
}

/// `api.auth_throttle`: a source (client address) that fails to authenticate `failures`
/// times within `window` is answered 429 until the window ends; a valid token is never
/// throttled (docs/security.md, "Failed authentications").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthThrottleConfig {
    /// Failed authentications a source may make per window; `0` turns throttling off.
    pub failures: u32,
    /// How long a window lasts, from a source's first failure.
    #[serde(with = "serde_util::duration")]
    pub window: Duration,
    /// The most sources tracked at once (memory stays bounded); the oldest window is
    /// closed to make room.
    pub max_sources: usize,
    /// Take the source from the last address of `X-Forwarded-For` (set by a proxy in front
    /// of the API) instead of the connection's peer address.
    pub trust_forwarded_for: bool,
}

impl Default for AuthThrottleConfig {
    fn default() -> Self {
        AuthThrottleConfig {
            failures: 10,
            window: Duration::from_secs(60),
            max_sources: 10_000,
            trust_forwarded_for: false,
        }
    }
}

/// `api.tls`: PEM files; relative paths are relative to the directory of `manent.yml`
/// (see [`Config::resolve_path`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiTls {
    /// The certificate chain, the server's certificate first.
    pub cert: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1). Keep it readable by manent only.
    pub key: PathBuf,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: DEFAULT_API_LISTEN.to_owned(),
            public_url: None,
            tls: None,
            max_connections: 4096,
            max_connections_per_source: 128,
            header_read_timeout: Duration::from_secs(30),
            auth_throttle: AuthThrottleConfig::default(),
        }
    }
}

/// `dbos`: the engine, named after DBOS Transact whose keys operators know.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DbosConfig {
    /// This worker's unique, stable id. After loading, holds the effective id
    /// (`DBOS__VMID` > `MANENT__DBOS__EXECUTOR_ID` > file > host name); read it with
    /// [`Config::effective_executor_id`].
    pub executor_id: Option<String>,
    /// This worker's region, for region routing.
    pub region: Option<String>,
    /// Run only the passes on this worker's region's targets, from `<queue>.<region>`.
    pub region_routing: bool,
    /// Plugins with their own queue that this worker serves.
    #[serde(deserialize_with = "yaml::nullable")]
    pub plugins: Vec<String>,
    /// Routed queues (top-level `queues`) that this worker serves.
    #[serde(deserialize_with = "yaml::nullable")]
    pub queues: Vec<String>,
    /// Serve only `dbos.queues` and `dbos.plugins` (and approvals), not the default and
    /// tenant queues.
    pub exclusive: bool,
    /// Deploys running at once on this worker, over all the queues it serves.
    pub concurrency: u32,
    /// Deploys running at once for one `<application>/<environment>`, on all workers and queues.
    pub environment_concurrency: u32,
    /// Deploys running at once in total, on all workers and queues (0 = no limit).
    pub global_concurrency: u32,
    /// On SIGINT/SIGTERM, how long to wait for running deploys before leaving them pending.
    #[serde(with = "serde_util::duration")]
    pub drain_timeout: Duration,
}

impl Default for DbosConfig {
    fn default() -> Self {
        DbosConfig {
            executor_id: None,
            region: None,
            region_routing: false,
            plugins: Vec::new(),
            queues: Vec::new(),
            exclusive: false,
            concurrency: 10,
            environment_concurrency: 1,
            global_concurrency: 0,
            drain_timeout: Duration::from_secs(60),
        }
    }
}

/// `recovery`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecoveryConfig {
    /// An executor whose heartbeat is older than this is considered gone.
    #[serde(with = "serde_util::duration")]
    pub stale_after: Duration,
    /// How often a live executor records its heartbeat; shorter than `stale_after`.
    #[serde(with = "serde_util::duration")]
    pub heartbeat_interval: Duration,
    /// Live workers re-enqueue the pending deploys of stale executors.
    pub automatic: bool,
    /// A worker stopped, or dead (silent past `stale_after` without a recorded stop), for
    /// longer than this is no longer listed, unless it still holds deploys.
    #[serde(with = "serde_util::duration")]
    pub forget_after: Duration,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig {
            stale_after: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(5),
            automatic: false,
            forget_after: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// An entry of `queues`: a routed queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutedQueue {
    /// The queue's name.
    pub name: String,
    /// Which deploys go to this queue (`match` in YAML).
    #[serde(rename = "match", default, deserialize_with = "yaml::nullable")]
    pub matcher: QueueMatch,
    /// The queue's deploys running at once in total, also its cap per worker, on top of the
    /// `dbos` limits (which count every deploy queue together); default: none of its own.
    #[serde(default)]
    pub concurrency: Option<u32>,
}

/// `queues[].match`: every non-empty list must match; an empty list matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueMatch {
    /// Application patterns qualified with the tenant (`ml/*`, `ml/trainer`).
    #[serde(deserialize_with = "yaml::nullable")]
    pub applications: Vec<String>,
    /// Artifact name patterns; a deploy matches when any of its artifacts does.
    #[serde(deserialize_with = "yaml::nullable")]
    pub artifacts: Vec<String>,
    /// Environment patterns (`prod`, `staging-*`).
    #[serde(deserialize_with = "yaml::nullable")]
    pub environments: Vec<String>,
}

/// An entry of `tenants`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tenant {
    /// The tenant's name, the first part of its applications' names (`ml` in `ml/trainer`).
    pub name: String,
    /// The tenant's dedicated queue, if it has one.
    #[serde(default)]
    pub queue: Option<String>,
}

/// `environments`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvironmentsConfig {
    /// Directory of `<tenant>/<application>/<environment>.yml`; a relative path is relative
    /// to the directory of `manent.yml` (see [`Config::environments_source`]).
    pub source: PathBuf,
}

impl Default for EnvironmentsConfig {
    fn default() -> Self {
        EnvironmentsConfig {
            source: PathBuf::from("environments"),
        }
    }
}

/// `log`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A level (`info`) or a `tracing` filter (`info,manent_engine=debug`).
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: "info".to_owned(),
        }
    }
}

/// `worker`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// Where fetched artifacts are kept, one directory per executor and deploy, removed as
    /// the deploy ends; a relative path is relative to the directory of `manent.yml`.
    /// Default: under the state directory (see [`Config::worker_workdir`]).
    pub workdir: Option<PathBuf>,
    /// How long a worker keeps its SSH connections open after a deploy, for the next
    /// deploy to the same targets (as OpenSSH's `ControlPersist`). `0s`: never.
    #[serde(with = "serde_util::duration")]
    pub ssh_keep_warm: Duration,
    /// MiB of output (what commands and plugins print) one run of a deploy keeps; past
    /// it, a line says so and the rest is not recorded (docs/configuration.md).
    pub max_output_mib: u64,
}

impl WorkerConfig {
    /// [`WorkerConfig::max_output_mib`] in bytes.
    pub fn max_output_bytes(&self) -> u64 {
        self.max_output_mib.saturating_mul(1024 * 1024)
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            workdir: None,
            ssh_keep_warm: Duration::from_secs(60),
            max_output_mib: 64,
        }
    }
}

/// `schedules`: bounds on recurring schedules, checked when one is created
/// (docs/configuration.md, `schedules`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulesConfig {
    /// The shortest time a `schedule.cron` may leave between two ticks.
    #[serde(with = "serde_util::duration")]
    pub min_interval: Duration,
    /// The most schedules one tenant may have at once.
    pub max_per_tenant: u32,
}

impl Default for SchedulesConfig {
    fn default() -> Self {
        SchedulesConfig {
            min_interval: Duration::from_secs(60),
            max_per_tenant: 100,
        }
    }
}

/// `retention`: what workers delete, and when (docs/configuration.md, `retention`). A
/// duration of `0s` keeps that kind of history for ever.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// The successful deploys of each environment never removed, newest first: the live
    /// one and those `manent rollback` chooses among.
    pub keep_last: u32,
    /// Finished deploys older than this (since they ended) are removed, with their steps,
    /// events and output, unless `keep_last` keeps them.
    #[serde(with = "serde_util::duration")]
    pub deploys: Duration,
    /// Output lines older than this are removed from finished deploys that are kept.
    #[serde(with = "serde_util::duration")]
    pub output: Duration,
    /// Audit entries older than this are removed.
    #[serde(with = "serde_util::duration")]
    pub audit: Duration,
    /// How often each worker applies the policy.
    #[serde(with = "serde_util::duration")]
    pub every: Duration,
    /// Deploys (or output lines, or audit entries) removed per transaction.
    pub batch: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        const DAY: u64 = 24 * 3600;
        RetentionConfig {
            keep_last: 20,
            deploys: Duration::from_secs(90 * DAY),
            output: Duration::from_secs(30 * DAY),
            audit: Duration::from_secs(365 * DAY),
            every: Duration::from_secs(600),
            batch: 500,
        }
    }
}

/// `log.format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Where the effective `dbos.executor_id` came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ExecutorIdSource {
    /// The `DBOS__VMID` environment variable.
    Vmid,
    /// A `MANENT__…` environment variable (named).
    Environment(String),
    /// `dbos.executor_id` in the file.
    File,
    /// The machine's host name (the default).
    #[default]
    Hostname,
}

/// Provenance of a [`Config`]: file name, source text, overrides applied.
#[derive(Debug, Clone, Default)]
struct Origin {
    /// The file name used in messages.
    file: String,
    /// The YAML text, to find the line of a key.
    source: Option<Arc<str>>,
    /// The directory relative paths are resolved against.
    base_dir: Option<PathBuf>,
    /// `(key path, variable)` for every environment override applied, in order.
    overrides: Vec<(String, String)>,
    executor_id_source: ExecutorIdSource,
    /// Why the host name could not be used as executor id, if it could not.
    hostname_error: Option<String>,
    /// `MANENT_WORKDIR`: the work directory as is (see [`Config::worker_workdir`]).
    workdir_from_env: Option<PathBuf>,
}

/// The file name used in messages for a configuration built without a file.
const NO_FILE: &str = "<defaults>";

impl Default for Config {
    /// The configuration of a `manent.yml` that sets nothing: SQLite, local API, and the host
    /// name as executor id. No environment variable is read.
    fn default() -> Self {
        let mut config = Config::unresolved();
        config.resolve_executor_id(None);
        config
    }
}

impl Config {
    /// The defaults, before the executor id is resolved.
    fn unresolved() -> Self {
        Config {
            database: DatabaseConfig::default(),
            api: ApiConfig::default(),
            dbos: DbosConfig::default(),
            recovery: RecoveryConfig::default(),
            plugins: BTreeMap::new(),
            queues: Vec::new(),
            tenants: Vec::new(),
            environments: EnvironmentsConfig::default(),
            artifacts: ArtifactsConfig::default(),
            log: LogConfig::default(),
            worker: WorkerConfig::default(),
            schedules: SchedulesConfig::default(),
            retention: RetentionConfig::default(),
            notifications: NotificationsConfig::default(),
            origin: Origin {
                file: NO_FILE.to_owned(),
                ..Origin::default()
            },
        }
    }

    /// Reads, overrides and validates the configuration file at `path`. `env` is the process
    /// environment (see [`process_env`]); only `MANENT__…`, `DBOS__VMID` and `MANENT_WORKDIR`
    /// are used.
    pub fn load(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.to_path_buf(),
            source,
        })?;
        let base_dir = path
            .parent()
            .map(|dir| {
                if dir.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    dir.to_path_buf()
                }
            })
            .unwrap_or_else(|| PathBuf::from("."));
        Self::build(&text, &path.display().to_string(), Some(base_dir), env)
    }

    /// Parses, overrides and validates YAML text; `file_name` is used in messages, and
    /// relative paths stay relative to the working directory.
    pub fn from_yaml_str(
        text: &str,
        file_name: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        Self::build(text, file_name, None, env)
    }

    /// The defaults with the environment overrides applied, validated: for running without
    /// a configuration file.
    pub fn from_env(
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        Config::unresolved().finish(env)
    }

    fn build(
        text: &str,
        file_name: &str,
        base_dir: Option<PathBuf>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut config = error::parse_yaml(text, file_name)?;
        config.origin = Origin {
            file: file_name.to_owned(),
            source: Some(Arc::from(text)),
            base_dir,
            ..Origin::default()
        };
        config.finish(env)
    }

    /// Applies the environment, resolves the executor id and validates.
    fn finish(
        self,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let input = env::EnvInput::collect(env)?;
        let mut config = env::apply(self, &input.overrides)?;
        config.resolve_executor_id(input.vmid);
        config.origin.workdir_from_env = input.workdir;
        let issues = config.validate();
        if issues.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid {
                file: config.origin.file.clone(),
                issues,
            })
        }
    }

    /// `DBOS__VMID` > `MANENT__DBOS__EXECUTOR_ID` > file > host name.
    fn resolve_executor_id(&mut self, vmid: Option<String>) {
        let from_env = self
            .overridden_by("dbos.executor_id")
            .map(str::to_owned)
            .filter(|_| self.dbos.executor_id.is_some());
        if let Some(vmid) = vmid {
            self.dbos.executor_id = Some(vmid);
            self.origin.executor_id_source = ExecutorIdSource::Vmid;
        } else if let Some(var) = from_env {
            self.origin.executor_id_source = ExecutorIdSource::Environment(var);
        } else if self.dbos.executor_id.is_some() {
            self.origin.executor_id_source = ExecutorIdSource::File;
        } else {
            self.origin.executor_id_source = ExecutorIdSource::Hostname;
            match hostname::get() {
                Ok(name) => self.dbos.executor_id = Some(name.to_string_lossy().into_owned()),
                Err(err) => {
                    self.dbos.executor_id = Some(String::new());
                    self.origin.hostname_error = Some(err.to_string());
                }
            }
        }
    }

    /// Every problem of this configuration, each naming its key and line (empty when valid).
    /// [`Config::load`] and friends already refuse a configuration with problems.
    pub fn validate(&self) -> Vec<ConfigIssue> {
        validate::validate(self)
    }

    /// What stops a worker (`worker`, `serve`) from starting with this configuration, and
    /// nothing else: clashing queue names. Loading accepts them, so `api`, `admin` and
    /// `check-config` report them and go on.
    pub fn worker_refusals(&self) -> Vec<ConfigIssue> {
        validate::worker_refusals(self)
    }

    /// This worker's executor id, resolved at load: `DBOS__VMID`, else
    /// `MANENT__DBOS__EXECUTOR_ID`, else `dbos.executor_id`, else the host name.
    pub fn effective_executor_id(&self) -> &str {
        self.dbos.executor_id.as_deref().unwrap_or_default()
    }

    /// Where [`Config::effective_executor_id`] came from (for the startup log).
    pub fn executor_id_source(&self) -> &ExecutorIdSource {
        &self.origin.executor_id_source
    }

    /// The file name this configuration was read from (`<defaults>` without a file).
    pub fn file_name(&self) -> &str {
        &self.origin.file
    }

    /// The environment variable that set `key` (a key path such as `dbos.region` or
    /// `queues[0].name`) or one of its parents, if any.
    pub fn overridden_by(&self, key: &str) -> Option<&str> {
        self.origin
            .overrides
            .iter()
            .rev()
            .find(|(path, _)| yaml::path_contains(path, key))
            .map(|(_, var)| var.as_str())
    }

    /// Resolves a path from the configuration: relative paths are relative to the directory
    /// of the configuration file (the working directory without a file).
    pub fn resolve_path(&self, path: &Path) -> PathBuf {
        match &self.origin.base_dir {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path.to_path_buf(),
        }
    }

    /// The configuration file, when the configuration was read from one.
    pub fn config_file(&self) -> Option<PathBuf> {
        self.origin
            .base_dir
            .as_ref()
            .map(|_| PathBuf::from(&self.origin.file))
    }

    /// The SQLite database file, when `database.url` names one.
    pub fn sqlite_file(&self) -> Option<PathBuf> {
        let url = self.database_url();
        let rest = url.strip_prefix("sqlite:")?;
        let rest = rest.strip_prefix("//").unwrap_or(rest);
        let file = rest.split('?').next().unwrap_or(rest);
        (!file.is_empty() && !file.starts_with(':') && !file.starts_with("file:"))
            .then(|| PathBuf::from(file))
    }

    /// Whether the worker's work directory comes from `MANENT_WORKDIR` (used as it is).
    pub fn workdir_from_env(&self) -> bool {
        self.origin.workdir_from_env.is_some()
    }

    /// `database.url` with a relative SQLite file resolved with [`Config::resolve_path`]
    /// (`sqlite://manent.db` next to `manent.yml`, wherever the process runs); other URLs
    /// (PostgreSQL, `sqlite::memory:`, absolute files) unchanged.
    pub fn database_url(&self) -> String {
        paths::resolve_sqlite_url(&self.database.url, |path| self.resolve_path(path))
    }

    /// The directory where this worker keeps fetched artifacts: `worker.workdir` (resolved
    /// with [`Config::resolve_path`]), else `$STATE_DIRECTORY/work` (systemd's
    /// `StateDirectory=`), else `$XDG_STATE_HOME/manent/work`, else
    /// `~/.local/state/manent/work`, else `<temp dir>/manent/work`; then a directory of this
    /// worker's executor id, so that workers sharing a machine never share files.
    /// `MANENT_WORKDIR`, when the environment given at load sets it, is used as is instead.
    pub fn worker_workdir(&self) -> PathBuf {
        if let Some(dir) = &self.origin.workdir_from_env {
            return dir.clone();
        }
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let base = match &self.worker.workdir {
            Some(dir) => self.resolve_path(dir),
            None => paths::default_state_dir(var).join("work"),
        };
        base.join(paths::file_name_of(self.effective_executor_id()))
    }

    /// `api.tls` with its paths resolved with [`Config::resolve_path`]: (cert, key).
    pub fn api_tls_paths(&self) -> Option<(PathBuf, PathBuf)> {
        self.api
            .tls
            .as_ref()
            .map(|tls| (self.resolve_path(&tls.cert), self.resolve_path(&tls.key)))
    }

    /// `environments.source`, resolved with [`Config::resolve_path`].
    pub fn environments_source(&self) -> PathBuf {
        self.resolve_path(&self.environments.source)
    }

    /// `artifacts.sources`, parsed (validation refused any entry that does not parse).
    pub fn artifact_sources(&self) -> ArtifactSources {
        self.parse_artifact_sources().unwrap_or_default()
    }

    /// `artifacts.sources` and `artifacts.max_bytes`, parsed: an entry written as a path
    /// (no `scheme://`) is a local directory, relative to the directory of `manent.yml` like
    /// every path of the file (a credentials file too). The first bad entry is an error
    /// naming its index.
    pub fn parse_artifact_sources(&self) -> Result<ArtifactSources, (usize, SourceError)> {
        let sources = self
            .artifacts
            .sources
            .iter()
            .enumerate()
            .map(|(i, entry)| self.artifact_source(entry).map_err(|e| (i, e)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ArtifactSources::new(sources).with_max_bytes(self.artifacts.max_bytes))
    }

    fn artifact_source(&self, entry: &SourceEntry) -> Result<ArtifactSource, SourceError> {
        let text = entry.url();
        let url = if text.contains("://") {
            text.to_owned()
        } else {
            let path = self.resolve_path(Path::new(text));
            let path = std::path::absolute(&path).unwrap_or(path);
            url::Url::from_directory_path(&path)
                .map(String::from)
                .unwrap_or_else(|()| text.to_owned())
        };
        let source = ArtifactSource::parse(&url)?;
        let SourceEntry::Scoped(scoped) = entry else {
            return Ok(source);
        };
        let source = source.for_applications(&scoped.applications)?;
        let secret = |key: &str, file: &Option<PathBuf>, env: &Option<String>| match (file, env) {
            (Some(file), None) => Ok(SecretRef::File(self.resolve_path(file))),
            (None, Some(env)) if !env.is_empty() => Ok(SecretRef::Env(env.clone())),
            _ => Err(SourceError::Invalid(format!(
                "give exactly one of {key}_file and {key}_env"
            ))),
        };
        let bearer = (scoped.bearer_token_file.is_some() || scoped.bearer_token_env.is_some())
            .then(|| {
                secret(
                    "bearer_token",
                    &scoped.bearer_token_file,
                    &scoped.bearer_token_env,
                )
            })
            .transpose()?;
        let credentials = match (bearer, &scoped.basic_auth) {
            (Some(_), Some(_)) => {
                return Err(SourceError::Invalid(
                    "give a bearer token or basic_auth, not both".into(),
                ));
            }
            (Some(token), None) => Some(Credentials::Bearer(token)),
            (None, Some(basic)) => Some(Credentials::Basic {
                username: basic.username.clone(),
                password: secret("password", &basic.password_file, &basic.password_env)?,
            }),
            (None, None) => None,
        };
        match credentials {
            Some(credentials) => source.with_credentials(credentials),
            None => Ok(source),
        }
    }

    /// The routed queue named `name`.
    pub fn routed_queue(&self, name: &str) -> Option<&RoutedQueue> {
        self.queues.iter().find(|queue| queue.name == name)
    }

    /// The first routed queue whose `match` applies to a deploy of `application`
    /// (`tenant/app`) with these artifact names to `environment`.
    pub fn routed_queue_for<I, S>(
        &self,
        application: &str,
        artifacts: I,
        environment: &str,
    ) -> Option<&RoutedQueue>
    where
        I: IntoIterator<Item = S> + Clone,
        S: AsRef<str>,
    {
        self.queues.iter().find(|queue| {
            queue
                .matcher
                .matches(application, artifacts.clone(), environment)
        })
    }

    /// The queue of plugin `plugin`, if it is declared and has one.
    pub fn plugin_queue(&self, plugin: &str) -> Option<&str> {
        self.plugins.get(plugin)?.queue.as_deref()
    }

    /// The plugin with a queue that claims artifact type `artifact_type`, with its queue:
    /// `(plugin name, queue)`. Validation guarantees there is at most one.
    pub fn plugin_for_artifact_type(&self, artifact_type: &str) -> Option<(&str, &str)> {
        self.plugins.iter().find_map(|(name, plugin)| {
            let queue = plugin.queue.as_deref()?;
            plugin
                .artifact_types
                .iter()
                .any(|t| t == artifact_type)
                .then_some((name.as_str(), queue))
        })
    }

    /// The queue of the plugin with a queue that claims `artifact_type`: the route by
    /// artifact type when the environment configuration cannot be read.
    pub fn plugin_queue_for_artifact_type(&self, artifact_type: &str) -> Option<&str> {
        self.plugin_for_artifact_type(artifact_type)
            .map(|(_, queue)| queue)
    }

    /// The tenant named `name` in the tenant registry.
    pub fn tenant(&self, name: &str) -> Option<&Tenant> {
        self.tenants.iter().find(|tenant| tenant.name == name)
    }

    /// True as soon as a plugin has its own queue or routed queues are declared: then every
    /// worker dequeues only the queues it knows.
    pub fn has_dedicated_queues(&self) -> bool {
        !self.queues.is_empty() || self.plugins.values().any(|p| p.queue.is_some())
    }
}

impl RoutedQueue {
    /// Whether a deploy goes to this queue (see [`QueueMatch::matches`]).
    pub fn matches<I, S>(&self, application: &str, artifacts: I, environment: &str) -> bool
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.matcher.matches(application, artifacts, environment)
    }
}

impl QueueMatch {
    /// True when no list has a pattern (refused by validation: such a match would take
    /// every deploy).
    pub fn is_empty(&self) -> bool {
        self.applications.is_empty() && self.artifacts.is_empty() && self.environments.is_empty()
    }

    /// Every non-empty list must match: `applications` against `application`,
    /// `environments` against `environment`, `artifacts` against any of `artifacts`.
    pub fn matches<I, S>(&self, application: &str, artifacts: I, environment: &str) -> bool
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let any = |patterns: &[String], text: &str| patterns.iter().any(|p| glob_match(p, text));
        (self.applications.is_empty() || any(&self.applications, application))
            && (self.environments.is_empty() || any(&self.environments, environment))
            && (self.artifacts.is_empty()
                || artifacts
                    .into_iter()
                    .any(|artifact| any(&self.artifacts, artifact.as_ref())))
    }
}
