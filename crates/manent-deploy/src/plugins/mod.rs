//! The plugins a deploy can use, behind one trait so the workflow treats them alike: the
//! built-ins (`remote-copy`, `command`), external plugins run by this worker, and stubs for
//! the external plugins it does not run. The registry is built once per worker from
//! `plugins` and `dbos.plugins`, and shut down after the engine.

mod builtin;
mod external;

use std::{collections::BTreeMap, path::Path};

use async_trait::async_trait;
use manent_config::Config;
use manent_engine::{WorkflowContext, WorkflowError};
use manent_model::{EffectiveDescriptor, Target};
use manent_plugin::{ExternalPlugin, PluginHost, StubPlugin};
use manent_ssh::{ConnectionPool, SshAuth};

pub use builtin::BuiltIn;
pub(crate) use builtin::ensure_all;
pub use external::External;

use crate::{artifacts::LocalArtifact, targets::TargetOutcome};

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
                        PluginHost::External(Box::new(ExternalPlugin::new(
                            name.clone(),
                            config.resolve_path(&external.command),
                            &external.sha256,
                        )))
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
