//! manent's plugin protocol, both ends of it: the wire format ([`protocol`]), the host that
//! runs an external plugin as a child process ([`host`]), the stub that stands for a plugin
//! on workers that do not run it ([`stub`]), and the loop a plugin executable runs
//! ([`serve`]). This crate is the only one that knows the wire format; see
//! `docs/plugin-protocol.md`.

pub mod files;
pub mod host;
pub mod protocol;
pub mod sandbox;
pub mod serve;
pub mod stub;

mod error;

pub use error::PluginError;
pub use host::{ExternalPlugin, OnProgress, Redact};
pub use protocol::{
    ArtifactRef, Operation, PROTOCOL_VERSION, Pass, PassResult, PluginInfo, SshRef, TargetRef,
    TargetResult, TargetStatus,
};
pub use sandbox::{Bwrap, Confinement, PassScope};
pub use serve::{Failure, Handler, Reporter, serve};
pub use stub::StubPlugin;

/// A plugin as the worker sees it: a process it runs, or a stub that never starts.
#[derive(Debug)]
pub enum PluginHost {
    External(Box<ExternalPlugin>),
    Stub(StubPlugin),
}

impl PluginHost {
    /// The configured name.
    pub fn name(&self) -> &str {
        match self {
            PluginHost::External(p) => p.name(),
            PluginHost::Stub(s) => s.name(),
        }
    }

    /// Why this plugin cannot run here, if it cannot (a stub).
    pub fn unavailable(&self) -> Option<PluginError> {
        match self {
            PluginHost::External(_) => None,
            PluginHost::Stub(s) => Some(s.error()),
        }
    }

    /// Runs `operation` on `pass`.
    pub async fn call(&self, operation: Operation, pass: &Pass) -> Result<PassResult, PluginError> {
        self.call_for_pass(operation, pass, None, &|_, _| {}, host::no_redaction())
            .await
    }

    /// As [`PluginHost::call`], for a pass whose files are `scope` (what a confined
    /// plugin's sandbox is made of), handing each `progress` line to `on_progress`; the
    /// plugin's log lines and stderr reach the server's log through `redact`.
    pub async fn call_for_pass(
        &self,
        operation: Operation,
        pass: &Pass,
        scope: Option<&PassScope>,
        on_progress: OnProgress<'_>,
        redact: Redact,
    ) -> Result<PassResult, PluginError> {
        match self {
            PluginHost::External(p) => {
                p.call_for_pass(operation, pass, scope, on_progress, redact)
                    .await
            }
            PluginHost::Stub(s) => Err(s.error()),
        }
    }

    /// Stops the plugin's process, if one runs.
    pub async fn shutdown(&self) {
        if let PluginHost::External(p) = self {
            p.shutdown().await;
        }
    }
}
