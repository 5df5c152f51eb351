//! Owns the environment configuration, `<source>/<tenant>/<app>/<env>.yml`, as data: targets,
//! SSH settings, the default deploy settings, rollout (waves), checks, approval, dependencies
//! and rollback policy; parsing its text. Validation is `validate.rs`, reading it from disk `load.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::error::ModelError;
use crate::serde_util::{duration, nullable, opt_duration};
use crate::source::Document;
use crate::{CHECK_PLACEHOLDERS, DEFAULT_PLUGIN, DEST_PLACEHOLDERS, rules};

pub(crate) mod analysis;
mod container;
mod drift;
pub(crate) mod load;
pub(crate) mod scoped;
mod tasks;
pub(crate) mod templates;
mod validate;
mod variables;

pub use analysis::{
    ANALYSIS_PLACEHOLDERS, Analysis, DEFAULT_INCONCLUSIVE_LIMIT, HttpValue, Metric, MetricCommand,
    PrometheusQuery, Provider, RunOn, condition_problem, evaluate,
};
pub(crate) use container::check_image_reference;
pub use container::{
    CONTAINER_NAME_PLACEHOLDERS, CONTAINER_PLUGIN, ContainerHealth, ContainerRuntime,
    ContainerSettings, IMAGE_ARTIFACT, PROXY_LISTEN_PLACEHOLDERS, ProxySettings, ProxyState,
    RunningContainer, container_base, container_name, image_reference,
};
pub use drift::{DriftSettings, MIN_DRIFT_EVERY};
pub use tasks::{DEFAULT_TASK_TIMEOUT, ReleaseMode, Task, TaskWhen, has_role};
use validate::validate;
pub(crate) use validate::{
    KEEP_RELEASES_NEEDS_VERSION_DIR, validate_dependencies, validate_deploy_fields,
};
pub use variables::InheritEnv;

/// The environment configuration of one application's environment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentFile {
    /// The hosts deployed to; at least one.
    #[serde(default, deserialize_with = "nullable")]
    pub targets: Vec<Target>,
    /// How to reach the targets.
    #[serde(default, deserialize_with = "nullable")]
    pub ssh: SshSettings,
    /// The default plugin and its settings (a descriptor's `deploy:` wins).
    #[serde(default, deserialize_with = "nullable")]
    pub deploy: DeploySettings,
    /// Waves, parallelism and pause between waves.
    #[serde(default, deserialize_with = "nullable")]
    pub rollout: Rollout,
    /// Checks run on each target after it is deployed.
    #[serde(default, deserialize_with = "nullable")]
    pub checks: Vec<Check>,
    /// The approval policy; none when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
    /// Deploys that must have succeeded first.
    #[serde(default, deserialize_with = "nullable")]
    pub depends_on: Vec<Dependency>,
    /// Applications of other tenants (patterns qualified with the tenant, `web/*`) whose
    /// deploys may name this environment in `depends_on`; the tenant's own applications
    /// always may (docs/environments.md, "Dependencies across tenants").
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub dependents: Vec<String>,
    /// What to do when a deploy fails.
    #[serde(default, deserialize_with = "nullable")]
    pub rollback: RollbackPolicy,
    /// The `deploy:` keys a descriptor may set (`params` when absent): the environment
    /// decides what runs on its targets, a deployer only what the operator allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrides: Option<Vec<String>>,
    /// Secrets the commands get as environment variables, by variable name. Only where to
    /// read them is written here; the values are read on the worker at each step and never
    /// recorded.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "std::collections::BTreeMap::is_empty"
    )]
    pub secrets: std::collections::BTreeMap<String, SecretSource>,
    /// Variables of the worker process a `host: local` command gets, by name; it gets no
    /// other (docs/environments.md, `inherit_env`).
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub inherit_env: InheritEnv,
    /// Variables the commands get and templates use, by name (docs/environments.md,
    /// "Variables"); `scoped_variables` override them for some targets.
    #[serde(
        default,
        deserialize_with = "scoped::scalar_values",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub variables: scoped::VariableValues,
    /// Values of variables for the targets each entry matches; the most specific wins.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub scoped_variables: Vec<scoped::ScopedVariables>,
    /// Files rendered per target and written into the release before `activate`.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub templates: Vec<templates::TemplateFile>,
    /// Drift detection: how often the targets are compared with their recorded releases,
    /// and the paths left out (docs/plan-and-drift.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<DriftSettings>,
}

/// Where a secret's value is read, on the worker: exactly one of `file`, `env`, `command`
/// and `age` (docs/environments.md, "Secret providers").
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretSource {
    /// A file on the worker (its content, without the final newline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<std::path::PathBuf>,
    /// An environment variable of the worker process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// A command run on the worker (`sh -c`, in the environment file's directory): its
    /// stdout, without the final newline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// How long `command` may run (default 30s).
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout: Option<Duration>,
    /// An age-encrypted file, relative to the environment file (or absolute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age: Option<PathBuf>,
    /// The age identity file that decrypts `age`, on the worker (relative to the
    /// environment file, or absolute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<PathBuf>,
}

impl SecretSource {
    /// The provider's name, as `manent vars` shows it: `file`, `env`, `command` or `age`.
    pub fn provider(&self) -> &'static str {
        if self.command.is_some() {
            "command"
        } else if self.age.is_some() {
            "age"
        } else if self.env.is_some() {
            "env"
        } else {
            "file"
        }
    }
}

/// The `deploy:` keys a descriptor may set: those of [`DeploySettings`] it may override, in
/// their order, then `variables` (over the environment file's `variables`).
pub const OVERRIDABLE_KEYS: [&str; 6] = [
    "plugin",
    "dest",
    "activate",
    "commands",
    "params",
    "variables",
];

/// What `overrides:` is when an environment file does not write it.
pub const DEFAULT_OVERRIDES: [&str; 1] = ["params"];

impl EnvironmentFile {
    /// Whether a descriptor may set `deploy.<key>` (see [`EnvironmentFile::overrides`]).
    pub fn allows_override(&self, key: &str) -> bool {
        match &self.overrides {
            Some(keys) => keys.iter().any(|k| k == key),
            None => DEFAULT_OVERRIDES.contains(&key),
        }
    }
}

/// A host of the environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// Unique in the environment; expanded as `{target}`.
    pub name: String,
    /// Host name or address; `local` is the worker's own machine (no SSH).
    pub host: String,
    /// SSH port.
    #[serde(default = "default_port")]
    pub port: u16,
    /// SSH user for this target (over `ssh.user`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Region, for `by_region` waves and region routing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Availability zone, for `by_az` waves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub az: Option<String>,
    /// Free labels.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub labels: BTreeMap<String, String>,
    /// Roles (`db`, `web`): which checks and tasks run on it (docs/environments.md, "Tasks
    /// and roles").
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub roles: Vec<String>,
}

impl Target {
    /// True when the target is the worker's own machine (`host: local`).
    pub fn is_local(&self) -> bool {
        self.host == crate::LOCAL_HOST
    }
}

fn default_port() -> u16 {
    22
}

/// `ssh:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SshSettings {
    /// Default SSH user (a target's `user` wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Private key file, as written (resolved by the worker that connects).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// known_hosts file, as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_hosts: Option<PathBuf>,
    /// Refuse hosts whose key is not in known_hosts.
    #[serde(default = "yes")]
    pub strict_host_key_checking: bool,
    /// How an upload is verified before its rename: `auto` (the default: `sftp` up to 8 MiB,
    /// `command` above), `sftp` (read back and hashed on the worker; no command on the
    /// target) or `command` (hashed on the target; no read-back traffic).
    #[serde(default)]
    pub verify: VerifyBy,
}

/// `ssh.verify`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VerifyBy {
    #[default]
    Auto,
    Sftp,
    Command,
}

impl Default for SshSettings {
    fn default() -> Self {
        SshSettings {
            user: None,
            key: None,
            known_hosts: None,
            strict_host_key_checking: true,
            verify: VerifyBy::Auto,
        }
    }
}

fn yes() -> bool {
    true
}

/// `deploy:` in an environment file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploySettings {
    /// The plugin that deploys.
    #[serde(default = "default_plugin")]
    pub plugin: String,
    /// Where artifacts go on each target (`{version}`, `{target}`, `{application}`,
    /// `{environment}` expanded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest: Option<String>,
    /// Command run on each target once the artifacts are in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activate: Option<String>,
    /// Commands of the `command` plugin, in order.
    #[serde(default, deserialize_with = "nullable")]
    pub commands: Vec<String>,
    /// Free plugin parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<serde_json::Value>,
    /// `remote-copy` with `{version}` in `dest`: the release directories kept on each target
    /// after a successful activate, newest first, the live one always among them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_releases: Option<u32>,
    /// `remote-copy`: paths every release shares, kept in `dir` and linked into each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<SharedPaths>,
    /// Commands run from each new release, before or after it is activated, on the targets
    /// of some roles or once per deploy (docs/environments.md, "Tasks and roles").
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tasks: Vec<Task>,
    /// `remote-copy`: the mode of the release directories manent makes; the target user's
    /// umask decides it when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ReleaseMode>,
    /// The `container` plugin's container (docs/containers.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerSettings>,
    /// The `container` plugin's proxy (docs/containers.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxySettings>,
}

/// `deploy.shared`: what each release links to instead of holding its own (logs, uploads,
/// a configuration written once on the target).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedPaths {
    /// Where they are kept on each target (`{target}`, `{application}`, `{environment}`).
    pub dir: String,
    /// Paths relative to a release: `log/` (a trailing `/`: a directory, made if missing)
    /// or `config/database.yml` (a file, which must exist in `dir`).
    pub paths: Vec<String>,
}

impl Default for DeploySettings {
    fn default() -> Self {
        DeploySettings {
            plugin: default_plugin(),
            dest: None,
            activate: None,
            commands: Vec::new(),
            params: None,
            keep_releases: None,
            shared: None,
            tasks: Vec::new(),
            mode: None,
            container: None,
            proxy: None,
        }
    }
}

fn default_plugin() -> String {
    DEFAULT_PLUGIN.to_owned()
}

/// `rollout:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rollout {
    /// How targets are grouped into waves, deployed one after the other.
    #[serde(default)]
    pub waves: Waves,
    /// Targets deployed at once within a wave.
    #[serde(default = "default_max_parallel")]
    pub max_parallel: u32,
    /// Wait between two waves.
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub pause: Option<Duration>,
    /// The bake after each wave but the last (docs/analysis.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<analysis::Analysis>,
}

impl Default for Rollout {
    fn default() -> Self {
        Rollout {
            waves: Waves::All,
            max_parallel: default_max_parallel(),
            pause: None,
            analysis: None,
        }
    }
}

fn default_max_parallel() -> u32 {
    5
}

/// `rollout.waves`: `all`, `by_region`, `by_az`, or explicit lists of target names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Waves {
    /// One wave of every target.
    #[default]
    All,
    /// One wave per region, in order of first appearance among the targets.
    ByRegion,
    /// One wave per (region, az), in order of first appearance.
    ByAz,
    /// These waves of target names, in order; each target in exactly one.
    Explicit(Vec<Vec<String>>),
}

const WAVES_HINT: &str = "write all, by_region, by_az, or a list of lists of target names, \
                          e.g. [[web-1], [web-2, web-3]]";

impl Serialize for Waves {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Waves::All => serializer.serialize_str("all"),
            Waves::ByRegion => serializer.serialize_str("by_region"),
            Waves::ByAz => serializer.serialize_str("by_az"),
            Waves::Explicit(waves) => waves.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Waves {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(WavesVisitor)
    }
}

struct WavesVisitor;

impl<'de> Visitor<'de> for WavesVisitor {
    type Value = Waves;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("all, by_region, by_az or a list of lists of target names")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Waves, E> {
        match value {
            "all" => Ok(Waves::All),
            "by_region" => Ok(Waves::ByRegion),
            "by_az" => Ok(Waves::ByAz),
            other => Err(E::custom(format!("unknown waves `{other}`; {WAVES_HINT}"))),
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Waves, A::Error> {
        let mut waves = Vec::new();
        while let Some(WaveNames(names)) = seq.next_element()? {
            waves.push(names);
        }
        Ok(Waves::Explicit(waves))
    }
}

/// One explicit wave: a list of target names.
struct WaveNames(Vec<String>);

impl<'de> Deserialize<'de> for WaveNames {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = WaveNames;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of target names")
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<WaveNames, E> {
                Err(E::custom(format!(
                    "found the name `{value}` where a wave (a list of target names) was \
                     expected; waves is a list of lists, e.g. [[web-1], [web-2, web-3]]"
                )))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<WaveNames, A::Error> {
                let mut names = Vec::new();
                while let Some(name) = seq.next_element::<String>()? {
                    names.push(name);
                }
                Ok(WaveNames(names))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A check run on each target after it is deployed (`{target}` and `{host}` are expanded in
/// its URL, host or command).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawCheck")]
pub struct Check {
    /// A name for results and messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What to check (`type: http | tcp | command`).
    #[serde(flatten)]
    pub kind: CheckKind,
    /// Further attempts after a failed one.
    pub retries: u32,
    /// Wait between attempts.
    #[serde(with = "duration")]
    pub interval: Duration,
    /// Limit of one attempt.
    #[serde(with = "duration")]
    pub timeout: Duration,
    /// The roles of the targets it runs on; every target when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
}

/// What a [`Check`] checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CheckKind {
    /// An HTTP GET answers with `expect_status`.
    Http {
        /// `http://` or `https://` URL.
        url: String,
        /// Expected status code.
        expect_status: u16,
    },
    /// A TCP connection succeeds.
    Tcp {
        /// Host to connect to.
        host: String,
        /// Port to connect to.
        port: u16,
    },
    /// A command on the target exits with `expect_exit`.
    Command {
        /// Shell command run on the target.
        command: String,
        /// Expected exit code.
        expect_exit: i32,
    },
}

impl Check {
    /// The check's name, or a description of it.
    pub fn label(&self) -> String {
        if let Some(name) = &self.name {
            return name.clone();
        }
        match &self.kind {
            CheckKind::Http { url, .. } => format!("http {url}"),
            CheckKind::Tcp { host, port } => format!("tcp {host}:{port}"),
            CheckKind::Command { command, .. } => format!("command {command}"),
        }
    }

    /// The check's kind with `{target}` and `{host}` replaced for `target`.
    pub fn kind_for(&self, target: &Target) -> CheckKind {
        let values = [
            ("target", target.name.as_str()),
            ("host", target.host.as_str()),
        ];
        match &self.kind {
            CheckKind::Http { url, expect_status } => CheckKind::Http {
                url: rules::expand(url, &values),
                expect_status: *expect_status,
            },
            CheckKind::Tcp { host, port } => CheckKind::Tcp {
                host: rules::expand(host, &values),
                port: *port,
            },
            CheckKind::Command {
                command,
                expect_exit,
            } => CheckKind::Command {
                command: rules::expand(command, &values),
                expect_exit: *expect_exit,
            },
        }
    }
}

/// The check as written: every field of every type, sorted out by [`Check::try_from`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCheck {
    #[serde(default)]
    name: Option<String>,
    #[serde(rename = "type")]
    kind: CheckType,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    expect_status: Option<u16>,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    port: Option<u16>,
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    expect_exit: Option<i32>,
    #[serde(default = "default_retries")]
    retries: u32,
    #[serde(default = "default_interval", with = "duration")]
    interval: Duration,
    #[serde(default = "default_timeout", with = "duration")]
    timeout: Duration,
    #[serde(default, deserialize_with = "nullable")]
    roles: Vec<String>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum CheckType {
    Http,
    Tcp,
    Command,
}

fn default_retries() -> u32 {
    3
}

fn default_interval() -> Duration {
    Duration::from_secs(1)
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

impl TryFrom<RawCheck> for Check {
    type Error = String;

    fn try_from(raw: RawCheck) -> Result<Check, String> {
        let (type_name, fields): (&str, &[&str]) = match raw.kind {
            CheckType::Http => ("http", &["url", "expect_status"]),
            CheckType::Tcp => ("tcp", &["host", "port"]),
            CheckType::Command => ("command", &["command", "expect_exit"]),
        };
        let present = [
            ("url", raw.url.is_some()),
            ("expect_status", raw.expect_status.is_some()),
            ("host", raw.host.is_some()),
            ("port", raw.port.is_some()),
            ("command", raw.command.is_some()),
            ("expect_exit", raw.expect_exit.is_some()),
        ];
        if let Some((field, _)) = present
            .iter()
            .find(|(field, present)| *present && !fields.contains(field))
        {
            return Err(format!(
                "`{field}` does not apply to a {type_name} check (its fields: {}); remove it \
                 or change type",
                fields.join(", ")
            ));
        }
        let missing = |field: &str| format!("a {type_name} check needs `{field}`; add it");
        let kind = match raw.kind {
            CheckType::Http => CheckKind::Http {
                url: raw.url.ok_or_else(|| missing("url"))?,
                expect_status: raw.expect_status.unwrap_or(200),
            },
            CheckType::Tcp => CheckKind::Tcp {
                host: raw.host.ok_or_else(|| missing("host"))?,
                port: raw.port.ok_or_else(|| missing("port"))?,
            },
            CheckType::Command => CheckKind::Command {
                command: raw.command.ok_or_else(|| missing("command"))?,
                expect_exit: raw.expect_exit.unwrap_or(0),
            },
        };
        Ok(Check {
            name: raw.name,
            kind,
            retries: raw.retries,
            interval: raw.interval,
            timeout: raw.timeout,
            roles: raw.roles,
        })
    }
}

/// `approval:`: who must approve a deploy before it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    /// Whether approval is required (true when the section is written and this is not).
    #[serde(default = "yes")]
    pub required: bool,
    /// Who may approve (user or token names); anyone allowed to approve when empty.
    #[serde(default, deserialize_with = "nullable")]
    pub approvers: Vec<String>,
    /// Approvals needed.
    #[serde(default = "one")]
    pub count: u32,
    /// The deploy is refused when not approved in time; it waits forever when absent.
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout: Option<Duration>,
    /// Whether the submitter may approve their own deploy.
    #[serde(default)]
    pub allow_self_approval: bool,
}

fn one() -> u32 {
    1
}

/// A deploy that must have succeeded before this one runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dependency {
    /// `tenant/app`.
    pub application: String,
    /// Its environment.
    pub environment: String,
    /// The version it must run, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// How long to wait for it; forever when absent.
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout: Option<Duration>,
}

impl Dependency {
    /// `(application, environment)`: what identifies a dependency.
    pub fn key(&self) -> (&str, &str) {
        (&self.application, &self.environment)
    }
}

/// `rollback:`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackPolicy {
    /// What to do on targets already switched when a deploy fails.
    #[serde(default)]
    pub on_failure: OnFailure,
    /// Whether the automatic rollback reactivates the previous version even after a failed
    /// irreversible deploy whose `once` task succeeded (docs/environments.md, "Irreversible
    /// deploys"). Left out when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub past_irreversible: bool,
}

/// `rollback.on_failure`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// Re-activate the previous version on the targets already switched.
    #[default]
    ReactivatePrevious,
    /// Leave the targets as they are.
    None,
}

impl EnvironmentFile {
    /// Whether a deploy of `application` (`tenant/app`) may depend on this environment of
    /// `owner` (`tenant/app`): always within a tenant, across tenants only when this file
    /// lists it under `dependents`.
    pub fn admits_dependent(&self, owner: &str, application: &str) -> bool {
        crate::tenant_of(owner) == crate::tenant_of(application)
            || self
                .dependents
                .iter()
                .any(|pattern| manent_config::glob_match(pattern, application))
    }
}

/// Parses and validates the text of the environment file of `application`'s `environment`
/// (used to refuse a dependency on itself). `file_name` is used in messages.
pub fn parse_environment(
    text: &str,
    file_name: &str,
    application: &str,
    environment: &str,
) -> Result<EnvironmentFile, ModelError> {
    let mut doc = Document::new(text, file_name);
    let Some(value) = doc.syntax() else {
        return Err(ModelError::environment_invalid(file_name, doc.issues));
    };
    let mut read = if value.is_null() {
        crate::salvage::Salvaged {
            value: Some(EnvironmentFile::default()),
            removed: Vec::new(),
        }
    } else {
        // Every unknown key and wrong value, not only the first (docs/cli.md, `validate`).
        doc.typed_every::<EnvironmentFile>(value)
    };
    let Some(env) = read.value.take() else {
        return Err(ModelError::environment_invalid(file_name, doc.issues));
    };
    let structural = doc.issues.len();
    validate(&mut doc, &env, (application, environment));
    let mut at = 0;
    // A check of a section read past a problem would judge defaults, not what is written.
    doc.issues.retain(|issue| {
        at += 1;
        at <= structural || !read.hides(&issue.field)
    });
    if doc.issues.is_empty() {
        Ok(env)
    } else {
        Err(ModelError::environment_invalid(file_name, doc.issues))
    }
}

impl EnvironmentFile {
    /// The effective value of each variable for `target`, with where it came from
    /// (`variables`, then the matching `scoped_variables`; docs/environments.md).
    pub fn variables_for(&self, target: &Target) -> Vec<scoped::EffectiveVariable> {
        scoped::resolve(
            &self.variables,
            &self.scoped_variables,
            &BTreeMap::new(),
            target,
        )
    }

    /// The names a command or a template of `target` has from this file: its variables
    /// and secrets.
    pub(crate) fn names_for(&self, target: &Target) -> BTreeSet<String> {
        self.variables_for(target)
            .into_iter()
            .map(|v| v.name)
            .chain(self.secrets.keys().cloned())
            .collect()
    }
}

/// Parses and validates an environment file as [`parse_environment`] does, then reads its
/// templates' sources beside it, in `dir` (the file's directory), and checks the names each
/// uses against what each target has. `file_name` is used in messages.
pub fn parse_environment_in(
    text: &str,
    file_name: &str,
    application: &str,
    environment: &str,
    dir: &std::path::Path,
) -> Result<EnvironmentFile, ModelError> {
    let mut env = parse_environment(text, file_name, application, environment)?;
    let mut doc = Document::new(text, file_name);
    templates::read_sources(&mut doc, &mut env, dir);
    if doc.issues.is_empty() {
        let loaded: Vec<templates::Template> =
            env.templates.iter().filter_map(|t| t.loaded()).collect();
        if let Some((i, error)) =
            templates::first_unknown(&loaded, &env.targets, |t| env.names_for(t), None)
        {
            doc.issue(format!("templates[{i}].src"), error.to_string());
        }
    }
    if doc.issues.is_empty() {
        Ok(env)
    } else {
        Err(ModelError::environment_invalid(file_name, doc.issues))
    }
}

#[cfg(test)]
mod tests;
