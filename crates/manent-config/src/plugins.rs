//! `plugins.<name>` of `manent.yml`: an external plugin's executable, its sha256, its
//! confinement and what it sees of the worker (docs/configuration.md, `plugins`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::yaml;

/// `plugins.<name>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PluginConfig {
    /// An external executable speaking the plugin protocol; absent for built-in plugins.
    pub external: Option<ExternalPlugin>,
    /// Artifact types this plugin deploys (routes by type when the environment
    /// configuration cannot be read at submission).
    #[serde(deserialize_with = "yaml::nullable")]
    pub artifact_types: Vec<String>,
    /// The plugin's own queue, served only by workers listing it in `dbos.plugins`.
    pub queue: Option<String>,
}

/// `plugins.<name>.external`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalPlugin {
    /// The executable; a relative path is relative to the directory of `manent.yml`
    /// (see [`Config::resolve_path`]).
    pub command: PathBuf,
    /// Hex SHA-256 of the executable, verified before it starts.
    pub sha256: String,
    /// How the process is confined: a bubblewrap sandbox per pass (the default), or none.
    #[serde(default)]
    pub confinement: Confinement,
    /// The `bwrap` executable (default: `bwrap` on the worker's `PATH`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwrap: Option<PathBuf>,
    /// The process's variables besides `PATH`, `LANG`, `HOME` and `TMPDIR`: `NAME` passes
    /// the worker's value, `NAME=value` sets one. Nothing else of the worker's reaches it.
    #[serde(
        default,
        deserialize_with = "yaml::nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub env: Vec<String>,
    /// Paths the confined process sees read-only besides the system (its runtime: a
    /// virtualenv, a toolchain); relative to `manent.yml`'s directory.
    #[serde(
        default,
        deserialize_with = "yaml::nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub read_only: Vec<PathBuf>,
}

/// `plugins.<name>.external.confinement`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Confinement {
    /// A bubblewrap sandbox per pass; refused to run where it cannot be made.
    #[default]
    Bwrap,
    /// No sandbox: the plugin sees what the worker's user sees.
    None,
}

impl ExternalPlugin {
    /// [`ExternalPlugin::env`] as `(name, value)`, a passed variable read from `lookup` (the
    /// worker's environment); a passed variable the worker does not have is left out and
    /// returned in the second list.
    pub fn environment(
        &self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> (Vec<(String, String)>, Vec<String>) {
        let mut set = Vec::new();
        let mut missing = Vec::new();
        for entry in &self.env {
            match entry.split_once('=') {
                Some((name, value)) => set.push((name.to_string(), value.to_string())),
                None => match lookup(entry) {
                    Some(value) => set.push((entry.clone(), value)),
                    None => missing.push(entry.clone()),
                },
            }
        }
        (set, missing)
    }
}
