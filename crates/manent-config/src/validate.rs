//! Owns the startup refusals: every rule a parsed configuration must satisfy, each problem
//! reported with its key, its line (or the variable that set it) and what to do.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::{Config, ConfigIssue, ExecutorIdSource, pattern};

/// Every problem of `config`, in the order of the file's sections.
pub(crate) fn validate(config: &Config) -> Vec<ConfigIssue> {
    let mut v = Validator {
        config,
        issues: Vec::new(),
    };
    v.database();
    v.api();
    v.dbos();
    v.recovery();
    v.retention();
    v.notifications();
    v.plugins();
    v.queues();
    v.tenants();
    v.plugin_queue_names();
    v.environments();
    v.artifacts();
    v.log();
    v.worker();
    v.schedules();
    v.issues
}

/// What stops a worker, and only a worker, from starting with `config`: queue names that
/// clash (the seed's page: "A queue name also in the tenant registry stops the workers at
/// startup"). `api`, `admin` and `check-config` report these and go on: which queues a
/// worker serves is the worker's concern, and submission routes the same either way.
pub(crate) fn worker_refusals(config: &Config) -> Vec<ConfigIssue> {
    let mut v = Validator {
        config,
        issues: Vec::new(),
    };
    v.queue_names();
    v.issues
}

struct Validator<'c> {
    config: &'c Config,
    issues: Vec<ConfigIssue>,
}

/// Queue, tenant, plugin and region names: letters, digits, `-` and `_` (a region queue is
/// `<queue>.<region>`, and application names are `<tenant>/<app>`).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The queue of deploys no tenant or routed queue takes (`manent_model::DEFAULT_QUEUE`).
const DEFAULT_QUEUE_NAME: &str = "default";

const NAME_RULE: &str = "use letters, digits, '-' and '_' only";

fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

impl Validator<'_> {
    fn push(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.issues.push(self.config.issue(key, message));
    }

    /// `key` and where it is set, for messages about two keys: `queues[0], line 3`,
    /// `dbos.region_routing, set by MANENT__DBOS__REGION_ROUTING`.
    fn refer(&self, key: &str) -> String {
        if let Some(var) = self.config.overridden_by(key) {
            return format!("{key}, set by {var}");
        }
        match self.config.line_of(key) {
            Some(line) => format!("{key}, line {line}"),
            None => key.to_owned(),
        }
    }

    fn name(&mut self, key: String, what: &str, name: &str) {
        if name.is_empty() {
            self.push(
                key,
                format!("the {what} name is empty; give it a name ({NAME_RULE})"),
            );
        } else if !valid_name(name) {
            self.push(key, format!("invalid {what} name `{name}`; {NAME_RULE}"));
        }
    }

    fn database(&mut self) {
        let url = &self.config.database.url;
        let known = ["sqlite:", "postgres://", "postgresql://"];
        if url.trim().is_empty() {
            self.push(
                "database.url",
                "the database URL is empty; use sqlite://FILE (one machine) or \
                 postgres://USER@HOST/DB (several nodes)",
            );
        } else if !known.iter().any(|scheme| url.starts_with(scheme)) {
            self.push(
                "database.url",
                format!(
                    "unsupported database URL `{url}`; use sqlite://FILE (one machine) or \
                     postgres://USER@HOST/DB (several nodes)"
                ),
            );
        }
        if self.config.database.max_connections == Some(0) {
            self.push(
                "database.max_connections",
                "0 would leave the pool without a connection; write e.g. 10, or remove it for \
                 the default of the process's role",
            );
        }
        if self.config.database.idle_timeout.is_zero() {
            self.push(
                "database.idle_timeout",
                "0s would close every connection as soon as it is returned; write e.g. 30s",
            );
        }
    }

    fn api(&mut self) {
        let listen = &self.config.api.listen;
        let valid = listen
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !valid {
            self.push(
                "api.listen",
                format!("`{listen}` is not HOST:PORT; write e.g. 127.0.0.1:8080 or 0.0.0.0:8080"),
            );
        }
        if let Some(url) = &self.config.api.public_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            self.push(
                "api.public_url",
                format!("`{url}` is not an http:// or https:// URL; write e.g. https://manent.example.com"),
            );
        }
        if self.config.api.max_connections == 0 {
            self.push(
                "api.max_connections",
                "0 would refuse every connection; write the most clients at once, e.g. 4096",
            );
        }
        if self.config.api.max_connections_per_source == 0 {
            self.push(
                "api.max_connections_per_source",
                "0 would refuse every connection; write the most connections one client \
                 address may hold, e.g. 128 (as many as max_connections lifts the cap)",
            );
        }
        if self.config.api.header_read_timeout.is_zero() {
            self.push(
                "api.header_read_timeout",
                "0s would close every connection at once; write e.g. 30s",
            );
        }
        let throttle = &self.config.api.auth_throttle;
        if throttle.failures > 0 && throttle.window.is_zero() {
            self.push(
                "api.auth_throttle.window",
                "0s would never throttle; write e.g. 60s, or set failures: 0 to turn throttling off",
            );
        }
        if throttle.failures > 0 && throttle.max_sources == 0 {
            self.push(
                "api.auth_throttle.max_sources",
                "0 would track no source; write e.g. 10000",
            );
        }
        if let Some(tls) = &self.config.api.tls {
            for (key, path) in [("api.tls.cert", &tls.cert), ("api.tls.key", &tls.key)] {
                if path.as_os_str().is_empty() {
                    self.push(
                        key,
                        "empty path: name a PEM file, e.g. /etc/manent/tls/server.pem",
                    );
                }
            }
        }
    }

    fn dbos(&mut self) {
        let config = self.config;
        let dbos = &config.dbos;
        let id = config.effective_executor_id();
        if id.trim().is_empty() {
            let message = match (&config.origin.hostname_error, config.executor_id_source()) {
                (Some(err), ExecutorIdSource::Hostname) => format!(
                    "no executor id: the host name could not be read ({err}); set dbos.executor_id \
                     or DBOS__VMID to a unique, stable name such as manent-0"
                ),
                _ => "the executor id is empty; set it to a unique, stable name such as manent-0"
                    .to_owned(),
            };
            self.push("dbos.executor_id", message);
        } else if id.trim() != id {
            self.push(
                "dbos.executor_id",
                format!("the executor id `{id}` has leading or trailing spaces; remove them"),
            );
        }
        if let Some(region) = &dbos.region {
            self.name("dbos.region".to_owned(), "region", region);
        }
        if dbos.concurrency == 0 {
            self.push(
                "dbos.concurrency",
                "must be at least 1: it is the number of deploys this worker runs at once",
            );
        }
        if dbos.environment_concurrency == 0 {
            self.push(
                "dbos.environment_concurrency",
                "must be at least 1: it is the number of deploys of one application/environment \
                 running at once (1 serializes them)",
            );
        }
        if dbos.region_routing && !dbos.plugins.is_empty() {
            let routing = self.refer("dbos.region_routing");
            self.push(
                "dbos.plugins",
                format!(
                    "dbos.plugins is not supported together with dbos.region_routing yet \
                     ({routing}); remove one of them"
                ),
            );
        }
        for (i, name) in dbos.plugins.iter().enumerate() {
            let key = format!("dbos.plugins[{i}]");
            match config.plugins.get(name) {
                None => self.push(
                    key,
                    format!(
                        "plugin `{name}` is not declared under plugins; declare plugins.{name} \
                         (with its queue) or remove it from dbos.plugins"
                    ),
                ),
                Some(plugin) if plugin.queue.is_none() => self.push(
                    key,
                    format!(
                        "plugin `{name}` has no queue, so every worker runs it; set \
                         plugins.{name}.queue or remove it from dbos.plugins"
                    ),
                ),
                Some(_) => {}
            }
        }
        for (i, name) in dbos.queues.iter().enumerate() {
            if config.routed_queue(name).is_none() {
                let known: Vec<&str> = config.queues.iter().map(|q| q.name.as_str()).collect();
                let known = if known.is_empty() {
                    "none is declared".to_owned()
                } else {
                    format!("declared: {}", known.join(", "))
                };
                self.push(
                    format!("dbos.queues[{i}]"),
                    format!(
                        "`{name}` is not a routed queue ({known}); declare it under queues or \
                         remove it from dbos.queues"
                    ),
                );
            }
        }
        if dbos.exclusive && dbos.queues.is_empty() && dbos.plugins.is_empty() {
            self.push(
                "dbos.exclusive",
                "an exclusive worker serves only dbos.queues and dbos.plugins, and both are \
                 empty; list its queues or plugins, or remove dbos.exclusive",
            );
        }
    }

    fn recovery(&mut self) {
        let recovery = &self.config.recovery;
        if recovery.heartbeat_interval.is_zero() {
            self.push(
                "recovery.heartbeat_interval",
                "must be longer than 0; write e.g. 5s",
            );
        } else if recovery.heartbeat_interval >= recovery.stale_after {
            let stale = self.refer("recovery.stale_after");
            self.push(
                "recovery.heartbeat_interval",
                format!(
                    "heartbeat_interval ({}) must be shorter than stale_after ({}, {stale}), \
                     or live workers would look stale; e.g. heartbeat_interval: 5s with \
                     stale_after: 30s",
                    fmt_duration(recovery.heartbeat_interval),
                    fmt_duration(recovery.stale_after),
                ),
            );
        }
    }

    fn notifications(&mut self) {
        let notifications = &self.config.notifications;
        let mut names = std::collections::BTreeSet::new();
        for (i, hook) in notifications.webhooks.iter().enumerate() {
            let base = format!("notifications.webhooks[{i}]");
            if hook.name.trim().is_empty() {
                self.push(
                    format!("{base}.name"),
                    "is empty; name the webhook (e.g. ops)",
                );
            } else if !names.insert(hook.name.as_str()) {
                self.push(
                    format!("{base}.name"),
                    format!("`{}` names two webhooks; give each its own name", hook.name),
                );
            }
            let scheme_ok = hook.url.starts_with("https://") || hook.url.starts_with("http://");
            if !scheme_ok || hook.url.len() <= "https://".len() {
                self.push(
                    format!("{base}.url"),
                    format!(
                        "{:?} is not an http(s) URL; write e.g. https://hooks.example.com/manent",
                        hook.url
                    ),
                );
            }
            if hook.secret_file.is_some() && hook.secret_env.is_some() {
                self.push(
                    format!("{base}.secret_env"),
                    "give secret_file or secret_env, not both",
                );
            }
            for (j, pattern) in hook.applications.iter().enumerate() {
                if let Err(e) = pattern::check_application_pattern(pattern) {
                    self.push(format!("{base}.applications[{j}]"), e);
                }
            }
        }
        if notifications.max_attempts == 0 {
            self.push(
                "notifications.max_attempts",
                "must be at least 1; write e.g. max_attempts: 10",
            );
        }
        if notifications.retry_after.is_zero() {
            self.push(
                "notifications.retry_after",
                "must be longer than 0; write e.g. retry_after: 5s",
            );
        }
    }

    fn retention(&mut self) {
        let retention = &self.config.retention;
        if retention.keep_last == 0 {
            self.push(
                "retention.keep_last",
                "must be at least 1: the live deploy of each environment is always kept; \
                 write e.g. keep_last: 20",
            );
        }
        if retention.every.is_zero() {
            self.push(
                "retention.every",
                "must be longer than 0; write e.g. every: 10m",
            );
        }
        if !(1..=10_000).contains(&retention.batch) {
            self.push(
                "retention.batch",
                format!(
                    "{} is outside 1..=10000: a batch is one transaction, which must stay short; \
                     write e.g. batch: 500",
                    retention.batch
                ),
            );
        }
    }

    fn plugins(&mut self) {
        let config = self.config;
        // Artifact type → first plugin with a queue that claims it.
        let mut claimed: BTreeMap<&str, &str> = BTreeMap::new();
        // Plugin queue → first plugin using it.
        let mut queues: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, plugin) in &config.plugins {
            let base = format!("plugins.{name}");
            self.name(base.clone(), "plugin", name);
            if let Some(external) = &plugin.external {
                if external.command.as_os_str().is_empty() {
                    self.push(
                        format!("{base}.external.command"),
                        "the command is empty; give the path of the plugin's executable",
                    );
                }
                for (i, entry) in external.env.iter().enumerate() {
                    let name = entry.split_once('=').map_or(entry.as_str(), |(n, _)| n);
                    let valid = name
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                    if !valid {
                        self.push(
                            format!("{base}.external.env[{i}]"),
                            format!(
                                "`{entry}` is neither NAME nor NAME=value (a name is letters, \
                                 digits and _, not starting with a digit)"
                            ),
                        );
                    } else if name == "HOME" || name == "TMPDIR" {
                        self.push(
                            format!("{base}.external.env[{i}]"),
                            format!(
                                "`{name}` is the plugin's own, private to each pass; remove it"
                            ),
                        );
                    }
                }
                let sha = &external.sha256;
                if sha.len() != 64 || !sha.chars().all(|c| c.is_ascii_hexdigit()) {
                    self.push(
                        format!("{base}.external.sha256"),
                        format!(
                            "`{sha}` is not a SHA-256: expected 64 hexadecimal characters; \
                             compute it with `sha256sum {}`",
                            if external.command.as_os_str().is_empty() {
                                "EXECUTABLE".to_owned()
                            } else {
                                external.command.display().to_string()
                            }
                        ),
                    );
                }
            }
            for (i, artifact_type) in plugin.artifact_types.iter().enumerate() {
                if artifact_type.trim().is_empty() {
                    self.push(
                        format!("{base}.artifact_types[{i}]"),
                        "empty artifact type; remove it",
                    );
                }
            }
            let Some(queue) = &plugin.queue else { continue };
            self.name(format!("{base}.queue"), "queue", queue);
            if let Some(other) = queues.insert(queue, name) {
                queues.insert(queue, other);
                self.push(
                    format!("{base}.queue"),
                    format!(
                        "queue `{queue}` is also the queue of plugin `{other}` ({}); give each \
                         plugin its own queue",
                        self.refer(&format!("plugins.{other}.queue"))
                    ),
                );
            }
            for (i, artifact_type) in plugin.artifact_types.iter().enumerate() {
                match claimed.get(artifact_type.as_str()) {
                    Some(other) => self.push(
                        format!("{base}.artifact_types[{i}]"),
                        format!(
                            "artifact type `{artifact_type}` is claimed by plugins `{other}` and \
                             `{name}`, which both have a queue; each artifact type may belong to \
                             at most one plugin with a queue, so remove it from one of them"
                        ),
                    ),
                    None => {
                        claimed.insert(artifact_type, name);
                    }
                }
            }
        }
    }

    fn queues(&mut self) {
        let config = self.config;
        if !config.queues.is_empty() && config.dbos.region_routing {
            let routing = self.refer("dbos.region_routing");
            self.push(
                "queues",
                format!(
                    "queues is not supported together with dbos.region_routing yet ({routing}); \
                     remove the routed queues or region routing"
                ),
            );
        }
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, queue) in config.queues.iter().enumerate() {
            let base = format!("queues[{i}]");
            self.name(format!("{base}.name"), "queue", &queue.name);
            if let Some(first) = seen.get(queue.name.as_str()) {
                self.push(
                    format!("{base}.name"),
                    format!(
                        "routed queue `{}` is declared twice (also {}); give each queue a \
                         unique name",
                        queue.name,
                        self.refer(&format!("queues[{first}]"))
                    ),
                );
            } else {
                seen.insert(&queue.name, i);
            }
            if queue.matcher.is_empty() {
                self.push(
                    format!("{base}.match"),
                    "match needs at least one pattern: set applications, artifacts or \
                     environments (a queue matching everything would take every deploy)",
                );
            }
            let lists = [
                ("applications", &queue.matcher.applications),
                ("artifacts", &queue.matcher.artifacts),
                ("environments", &queue.matcher.environments),
            ];
            for (list, patterns) in lists {
                for (j, pattern) in patterns.iter().enumerate() {
                    let key = format!("{base}.match.{list}[{j}]");
                    if pattern.trim().is_empty() {
                        self.push(key, "empty pattern; remove it");
                    } else if list == "applications"
                        && let Err(message) = crate::check_application_pattern(pattern)
                    {
                        self.push(key, message);
                    }
                }
            }
            if queue.concurrency == Some(0) {
                self.push(
                    format!("{base}.concurrency"),
                    "must be at least 1; remove it for no limit of its own (the dbos limits still apply)",
                );
            }
        }
    }

    fn tenants(&mut self) {
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, tenant) in self.config.tenants.iter().enumerate() {
            let base = format!("tenants[{i}]");
            self.name(format!("{base}.name"), "tenant", &tenant.name);
            if let Some(first) = seen.get(tenant.name.as_str()) {
                self.push(
                    format!("{base}.name"),
                    format!(
                        "tenant `{}` is declared twice (also {}); keep one entry",
                        tenant.name,
                        self.refer(&format!("tenants[{first}]"))
                    ),
                );
            } else {
                seen.insert(&tenant.name, i);
            }
            if let Some(queue) = &tenant.queue {
                self.name(format!("{base}.queue"), "queue", queue);
            }
        }
    }

    /// Routed and plugin queue names must not be names of the tenant registry, nor each
    /// other, nor the default queue's; `manent.` names (the gate queue) are refused by
    /// the name rule already, as `.` is not allowed.
    fn queue_names(&mut self) {
        let config = self.config;
        let mut named: Vec<(String, &str)> = Vec::new();
        for (i, tenant) in config.tenants.iter().enumerate() {
            if let Some(queue) = &tenant.queue {
                named.push((format!("tenants[{i}].queue"), queue));
            }
        }
        for (i, queue) in config.queues.iter().enumerate() {
            named.push((format!("queues[{i}].name"), &queue.name));
        }
        for (name, plugin) in &config.plugins {
            if let Some(queue) = &plugin.queue {
                named.push((format!("plugins.{name}.queue"), queue));
            }
        }
        for (key, queue) in named {
            if queue == DEFAULT_QUEUE_NAME {
                self.push(
                    key,
                    format!(
                        "`{DEFAULT_QUEUE_NAME}` is the name of the default queue, which every \
                         worker serves; workers refuse to start: give this queue another name"
                    ),
                );
            }
        }
        // Name → description of the tenant registry entry using it.
        let mut tenant_names: BTreeMap<&str, (usize, String)> = BTreeMap::new();
        for (i, tenant) in config.tenants.iter().enumerate() {
            if let Some(queue) = &tenant.queue {
                tenant_names
                    .entry(queue)
                    .or_insert((i, format!("the queue of tenant `{}`", tenant.name)));
            }
            tenant_names
                .entry(&tenant.name)
                .or_insert((i, format!("tenant `{}`", tenant.name)));
        }
        for (i, queue) in config.queues.iter().enumerate() {
            if let Some((t, what)) = tenant_names.get(queue.name.as_str()) {
                self.push(
                    format!("queues[{i}].name"),
                    format!(
                        "queue name `{}` is also in the tenant registry ({what}: {}); workers \
                         refuse to start: rename the routed queue or the tenant queue",
                        queue.name,
                        self.refer(&format!("tenants[{t}]"))
                    ),
                );
            }
        }
        for (name, plugin) in &config.plugins {
            let Some(queue) = &plugin.queue else { continue };
            let key = format!("plugins.{name}.queue");
            if let Some((t, what)) = tenant_names.get(queue.as_str()) {
                self.push(
                    key,
                    format!(
                        "queue name `{queue}` is also in the tenant registry ({what}: {}); \
                         rename the plugin queue or the tenant queue",
                        self.refer(&format!("tenants[{t}]"))
                    ),
                );
            }
        }
    }

    /// A plugin's queue may not be a routed queue: routed workers without the plugin's
    /// runtime would claim its deploys (a configuration error for every role, unlike the
    /// clashes of [`Validator::queue_names`], which only workers refuse).
    fn plugin_queue_names(&mut self) {
        let config = self.config;
        for (name, plugin) in &config.plugins {
            let Some(queue) = &plugin.queue else { continue };
            if let Some(i) = config.queues.iter().position(|q| q.name == *queue) {
                self.push(
                    format!("plugins.{name}.queue"),
                    format!(
                        "queue name `{queue}` is also a routed queue ({}); give the plugin a \
                         queue of its own",
                        self.refer(&format!("queues[{i}]"))
                    ),
                );
            }
        }
    }

    fn environments(&mut self) {
        if self.config.environments.source.as_os_str().is_empty() {
            self.push(
                "environments.source",
                "empty path; give the directory of the environment configurations",
            );
        }
    }

    fn artifacts(&mut self) {
        if let Err((i, e)) = self.config.parse_artifact_sources() {
            let source = self.config.artifacts.sources[i].url().to_owned();
            self.push(format!("artifacts.sources[{i}]"), format!("`{source}` {e}"));
        }
        if self.config.artifacts.max_bytes == 0 {
            self.push(
                "artifacts.max_bytes",
                "0 would refuse every artifact; write the largest size in bytes, e.g. \
                 10737418240 (10 GiB)",
            );
        }
    }

    fn worker(&mut self) {
        if let Some(dir) = &self.config.worker.workdir
            && dir.as_os_str().is_empty()
        {
            self.push(
                "worker.workdir",
                "empty path; give a directory for fetched artifacts, or remove the key for the \
                 default under the state directory",
            );
        }
        if self.config.worker.max_output_mib == 0 {
            self.push(
                "worker.max_output_mib",
                "must be at least 1: it is how many MiB of output one deploy keeps (64 by default)",
            );
        }
    }

    fn schedules(&mut self) {
        if self.config.schedules.min_interval.is_zero() {
            self.push(
                "schedules.min_interval",
                "0s would let a schedule fire every second; give the shortest time between two \
                 ticks a schedule may ask for (at least 1s; default 60s)",
            );
        }
    }

    fn log(&mut self) {
        const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
        let level = &self.config.log.level;
        let valid = !level.trim().is_empty()
            && level.split(',').all(|directive| {
                let level = directive
                    .rsplit_once('=')
                    .map_or(directive, |(_, level)| level);
                LEVELS.contains(&level.trim().to_ascii_lowercase().as_str())
            });
        if !valid {
            self.push(
                "log.level",
                format!(
                    "`{level}` is not a log level; use one of {} or a filter such as \
                     info,manent_engine=debug",
                    LEVELS.join(", ")
                ),
            );
        }
    }
}
