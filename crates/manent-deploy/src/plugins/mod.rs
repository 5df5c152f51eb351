//! The plugins a deploy can use, behind one trait so the workflow treats them alike: the
//! built-ins (`remote-copy`, `command`), external plugins run by this worker, and stubs for
//! the external plugins it does not run. The registry is built once per worker from
//! `plugins` and `dbos.plugins`, and shut down after the engine.

mod builtin;
mod external;
mod templates;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use async_trait::async_trait;
use manent_config::Config;
use manent_engine::{WorkflowContext, WorkflowError};
use manent_model::{EffectiveDescriptor, Target};
use manent_plugin::{Bwrap, Confinement, ExternalPlugin, PluginHost, StubPlugin};
use manent_ssh::{ConnectionPool, SshAuth};

pub use builtin::{BuiltIn, BuiltInRelease};
pub(crate) use builtin::{ensure_all, run_checks};
pub use external::External;

use crate::{run::artifacts::LocalArtifact, run::targets::TargetOutcome};

/// What a plugin gets for a pass: the deploy, its artifacts on this worker, and how to
/// reach the targets.
#[derive(Clone, Copy)]
pub struct PassContext<'a> {
    pub eff: &'a EffectiveDescriptor,
    pub deploy_id: &'a str,
    /// The deploy's artifacts, fetched and verified (empty for a rollback pass).
    pub local: &'a [LocalArtifact],
    pub pool: &'a ConnectionPool,
    pub auth: &'a SshAuth,
    /// The deploy's working directory on this worker.
    pub dir: &'a Path,
    /// Where artifacts may be fetched from again (a resumed deploy on another machine).
    pub sources: &'a manent_config::ArtifactSources,
    /// The worker's HTTP client: artifact downloads, HTTP checks.
    pub http: &'a dyn crate::http::HttpFetch,
    /// The engine's records: where release manifests are kept (`manifests`).
    pub records: &'a manent_engine::Records,
}

/// A plugin as the deploy workflow uses it. Every method records its work as durable
/// steps and publishes each target's outcome as the event `target:<name>`.
#[async_trait]
pub trait Plugin: Send + Sync {
    /// Why this plugin cannot run on this worker, if it cannot; the deploy then fails at
    /// once, without retries.
    fn unavailable(&self) -> Option<String> {
        None
    }

    /// Deploys `targets` (plans them under dry-run). A target's failure is its outcome;
    /// an error stops the workflow (fencing, cancellation, database).
    async fn deploy_pass(
        &self,
        ctx: &WorkflowContext,
        pass: &PassContext<'_>,
        targets: &[Target],
    ) -> Result<Vec<TargetOutcome>, WorkflowError>;

    /// Restores `previous` on the targets this deploy switched.
    async fn rollback_pass(
        &self,
        ctx: &WorkflowContext,
        pass: &PassContext<'_>,
        previous: Option<&EffectiveDescriptor>,
        switched: &[TargetOutcome],
    ) -> Result<Vec<TargetOutcome>, WorkflowError>;
}

/// The host of the external plugin `name` on this worker: its own environment (the
/// variables `env` lists, nothing else of the worker's) and its confinement
/// (docs/security.md, "Plugins").
fn external_plugin(
    config: &Config,
    name: &str,
    external: &manent_config::ExternalPlugin,
) -> ExternalPlugin {
    let (env, missing) = external.environment(|var| std::env::var(var).ok());
    for var in missing {
        tracing::warn!(
            plugin = name,
            variable = %var,
            "plugins.{name}.external.env passes {var}, which this worker's environment does not have; the plugin runs without it"
        );
    }
    let confinement = match external.confinement {
        manent_config::Confinement::None => Confinement::None,
        manent_config::Confinement::Bwrap => Confinement::Bwrap(Bwrap {
            bwrap: external
                .bwrap
                .as_deref()
                .map(|p| {
                    if p.components().count() > 1 {
                        absolute(&config.resolve_path(p))
                    } else {
                        p.to_path_buf()
                    }
                })
                .unwrap_or_else(|| PathBuf::from("bwrap")),
            read_only: external
                .read_only
                .iter()
                .map(|p| absolute(&config.resolve_path(p)))
                .collect(),
            hidden: hidden_paths(config),
        }),
    };
    let mut plugin = ExternalPlugin::new(
        name.to_string(),
        absolute(&config.resolve_path(&external.command)),
        &external.sha256,
    )
    .confinement(confinement)
    .private_dir(absolute(&config.worker_workdir()).join(format!(".plugin-{name}")));
    for (key, value) in env {
        plugin = plugin.env(key, value);
    }
    plugin
}

/// For each plugin this worker would run confined (`dbos.plugins`, or no queue) whose
/// `bwrap` cannot be found: the plugin's name and a sentence saying so and what to do. Such
/// a plugin is refused at its first pass; `check-config` and a worker's start say it first.
pub fn confinement_issues(config: &Config) -> Vec<(String, String)> {
    config
        .plugins
        .iter()
        .filter_map(|(name, plugin)| {
            let external = plugin.external.as_ref()?;
            if external.confinement != manent_config::Confinement::Bwrap {
                return None;
            }
            let runs_here = plugin.queue.is_none() || config.dbos.plugins.contains(name);
            let bwrap = external
                .bwrap
                .as_deref()
                .map(|p| config.resolve_path(p))
                .unwrap_or_else(|| PathBuf::from("bwrap"));
            let reason = manent_plugin::sandbox::locate_bwrap(&bwrap).err()?;
            Some((
                name.clone(),
                format!(
                    "plugins.{name}.external.confinement is bwrap, but {reason}: {} refuse to \
                     run plugin `{name}`; install bubblewrap (Debian: apt-get install \
                     bubblewrap), set plugins.{name}.external.bwrap to its path, or set \
                     plugins.{name}.external.confinement: none (docs/security.md)",
                    if runs_here {
                        "this worker will"
                    } else {
                        "workers running it will"
                    }
                ),
            ))
        })
        .collect()
}

/// What a confined plugin never sees, even where it lies under what it sees (the system,
/// `read_only`): the configuration, the database, the work directories, the environment
/// files, the API's TLS files. A directory is hidden whole unless it is a top-level one or
/// under `/usr`; then only the file is.
pub fn hidden_paths(config: &Config) -> Vec<PathBuf> {
    let mut hidden = Vec::new();
    let file_and_dir = |hidden: &mut Vec<PathBuf>, file: PathBuf| {
        let file = absolute(&file);
        if let Some(dir) = file.parent()
            && dir.components().count() > 2
            && !dir.starts_with("/usr")
        {
            hidden.push(dir.to_path_buf());
        }
        hidden.push(file);
    };
    if let Some(file) = config.config_file() {
        file_and_dir(&mut hidden, file);
    }
    if let Some(db) = config.sqlite_file() {
        for suffix in ["-wal", "-shm", "-journal"] {
            hidden.push(absolute(&PathBuf::from(format!(
                "{}{suffix}",
                db.display()
            ))));
        }
        file_and_dir(&mut hidden, db);
    }
    if let Some((cert, key)) = config.api_tls_paths() {
        file_and_dir(&mut hidden, cert);
        file_and_dir(&mut hidden, key);
    }
    let workdir = absolute(&config.worker_workdir());
    if !config.workdir_from_env()
        && let Some(all) = workdir.parent()
    {
        hidden.push(all.to_path_buf());
    }
    hidden.push(workdir);
    hidden.push(absolute(&config.environments_source()));
    hidden
}

/// `path` made absolute against the worker's working directory (a sandbox has its own).
pub(crate) fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The plugins of one worker.
#[derive(Debug, Default)]
pub struct Plugins {
    builtin: BuiltIn,
    configured: BTreeMap<String, External>,
}

impl Plugins {
    /// External plugins get a real host (nothing starts before their first pass) where they
    /// run: on the workers listing them in `dbos.plugins` when they have a queue, on every
    /// worker when they have none. Everywhere else a configured plugin is a stub.
    pub fn from_config(config: &Config) -> Self {
        let configured = config
            .plugins
            .iter()
            .map(|(name, plugin)| {
                let host = match &plugin.external {
                    Some(external)
                        if plugin.queue.is_none() || config.dbos.plugins.contains(name) =>
                    {
                        PluginHost::External(Box::new(external_plugin(config, name, external)))
                    }
                    _ => PluginHost::Stub(StubPlugin::new(
                        name.clone(),
                        plugin.artifact_types.clone(),
                    )),
                };
                (name.clone(), External::new(host))
            })
            .collect();
        Plugins {
            builtin: BuiltIn,
            configured,
        }
    }

    /// The plugin called `name`, if this installation knows it.
    pub fn get(&self, name: &str) -> Option<&dyn Plugin> {
        if name == manent_model::DEFAULT_PLUGIN || name == manent_model::COMMAND_PLUGIN {
            return Some(&self.builtin);
        }
        self.configured.get(name).map(|p| p as &dyn Plugin)
    }

    /// The host of a configured plugin (its process, or its stub).
    pub fn host(&self, name: &str) -> Option<&PluginHost> {
        self.configured.get(name).map(External::host)
    }

    /// Stops every plugin process. Call after the engine has stopped.
    pub async fn shutdown(&self) {
        for plugin in self.configured.values() {
            plugin.host().shutdown().await;
        }
    }
}
