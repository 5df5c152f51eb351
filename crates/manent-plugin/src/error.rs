//! What can go wrong between the host and a plugin, each error naming the plugin and what
//! to do, and whether trying again may help ([`PluginError::retryable`]).

use std::{path::PathBuf, time::Duration};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    #[error(
        "plugin `{plugin}`: {path} has sha256 {actual}, but plugins.{plugin}.external.sha256 is \
         {expected}; refusing to start it (install the right executable or fix the sum)"
    )]
    Checksum {
        plugin: String,
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error(
        "plugin `{plugin}`: cannot read or start {path}: {reason} (check plugins.{plugin}.external.command)"
    )]
    Start {
        plugin: String,
        path: PathBuf,
        reason: String,
    },
    #[error(
        "plugin `{plugin}` speaks protocol version {theirs}, this worker speaks {ours}; \
         install a version of the plugin that speaks {ours}"
    )]
    Version {
        plugin: String,
        ours: u32,
        theirs: String,
    },
    #[error(
        "plugin `{plugin}`: the executable calls itself `{reported}`; plugins.{plugin} must \
         point at the `{plugin}` plugin"
    )]
    Name { plugin: String, reported: String },
    #[error(
        "plugin `{plugin}` does not run on this worker; it runs only on workers with \
         dbos.plugins: [{plugin}]"
    )]
    NotOnThisWorker { plugin: String },
    #[error("plugin `{plugin}` exited with {status} during `{operation}`; stderr tail: {stderr}")]
    Exited {
        plugin: String,
        operation: String,
        status: String,
        stderr: String,
    },
    #[error(
        "plugin `{plugin}` broke the protocol during `{operation}`: {reason}: `{line}` \
         (the process was stopped; it restarts on the next request)"
    )]
    Protocol {
        plugin: String,
        operation: String,
        reason: String,
        line: String,
    },
    #[error(
        "plugin `{plugin}` did not answer `{operation}` within {timeout:?}; the process was stopped"
    )]
    Timeout {
        plugin: String,
        operation: String,
        timeout: Duration,
    },
    #[error("plugin `{plugin}` failed `{operation}` ({code}): {message}")]
    Plugin {
        plugin: String,
        operation: String,
        code: String,
        message: String,
        retryable: bool,
    },
    #[error(
        "plugin `{plugin}` cannot run confined on this worker, so it is not run: {reason}; \
         install bubblewrap (Debian: apt-get install bubblewrap) and let it create user \
         namespaces, point plugins.{plugin}.external.bwrap at it, or, knowing that a playbook \
         then runs with the worker's rights, set plugins.{plugin}.external.confinement: none \
         (docs/security.md)"
    )]
    Confinement { plugin: String, reason: String },
    #[error("plugin `{plugin}` is shutting down with the worker")]
    ShuttingDown { plugin: String },
}

impl PluginError {
    /// Whether the same request may succeed if tried again. A wrong sum, a stub, a version or
    /// name mismatch and a broken protocol do not change by trying again: the deploy fails
    /// at once and says why.
    pub fn retryable(&self) -> bool {
        match self {
            PluginError::Checksum { .. }
            | PluginError::Version { .. }
            | PluginError::Name { .. }
            | PluginError::NotOnThisWorker { .. }
            | PluginError::Confinement { .. }
            | PluginError::Protocol { .. } => false,
            PluginError::Start { .. }
            | PluginError::Exited { .. }
            | PluginError::Timeout { .. }
            | PluginError::ShuttingDown { .. } => true,
            PluginError::Plugin { retryable, .. } => *retryable,
        }
    }
}
