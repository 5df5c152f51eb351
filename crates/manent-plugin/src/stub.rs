//! The stand-in for an external plugin on a worker that does not run it (the API, workers
//! without `dbos.plugins: [name]`): it knows the plugin's name and artifact types and never
//! starts anything, so the plugin's executable and runtime need not exist there.

use crate::PluginError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StubPlugin {
    name: String,
    artifact_types: Vec<String>,
}

impl StubPlugin {
    pub fn new(name: impl Into<String>, artifact_types: Vec<String>) -> Self {
        StubPlugin {
            name: name.into(),
            artifact_types,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn artifact_types(&self) -> &[String] {
        &self.artifact_types
    }

    /// The answer to every request: not here (never retried).
    pub fn error(&self) -> PluginError {
        PluginError::NotOnThisWorker {
            plugin: self.name.clone(),
        }
    }
}
