//! Release manifests (docs/plan-and-drift.md, "What is recorded"): after a target's
//! `activate` and checks succeed, what its release holds, hashed on the target by one
//! command: the sha256 of each regular file under the release directory, its symbolic
//! links, and where the live link (`current`) points; with the values a plan compares
//! (artifacts' sha256, the variables that are not secrets, each template's rendered
//! sha256). One record per target in the engine's records (kind [`MANIFEST_KIND`]), the
//! newest replacing the one before: bounded by the environment's targets.
//!
//! - `script`: the shell that lists a release (no symbolic link followed, nothing parsed
//!   from a listing: NUL-separated), and reading what it printed ([`Snapshot`]).
//! - `record`: the step `<target>: manifest` of a deploy under [`MANIFEST_VERSION`], and
//!   reading a target's record back.
//!
//! It depends on `run` (reaching a target), `vars` (a run's rendered templates) and
//! `request` (the workflow version); `plugins`, `drift` and `plan` use it.

pub mod added;
pub mod record;
pub mod script;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::request::MANIFEST_VERSION;
pub use record::{read, record_step};
pub use script::{MAX_FILES, Snapshot};

/// The kind of the records holding manifests, keyed `<application>/<environment>/<target>`.
pub const MANIFEST_KIND: &str = "manent.manifest";

/// The key of `target`'s manifest in `application`'s `environment`.
pub fn key(application: &str, environment: &str, target: &str) -> String {
    format!("{application}/{environment}/{target}")
}

/// What a target's release held once its deploy's checks passed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The deploy that recorded it.
    pub deploy_id: String,
    pub version: String,
    pub at_ms: i64,
    /// The release directory on the target (absolute).
    pub release: String,
    /// What was found there.
    pub snapshot: Snapshot,
    /// Each artifact's sha256, by name.
    #[serde(default)]
    pub artifacts: BTreeMap<String, String>,
    /// The target's variables that are not secrets, by name (their values).
    #[serde(default)]
    pub variables: BTreeMap<String, String>,
    /// The names of the deploy's secrets (never a value, never a digest).
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Each template's rendered sha256, by its `dest` as written.
    #[serde(default)]
    pub templates: BTreeMap<String, String>,
    /// Under the `container` plugin, the container the target runs and the proxy's
    /// upstream (`containers::manifest`); no release directory is listed then. Left out
    /// otherwise, so manifests read and write as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<manent_model::RunningContainer>,
}

/// The paths where a live link (`current`) is looked for on `target`, given the release
/// directory template `dest`: beside the releases (`<root>/current`) and above them
/// (`<parent of root>/current`) when `dest` has a `{version}` component, else beside the
/// release directory. A link found at one of them is recorded with where it points.
pub fn live_link_paths(
    eff: &manent_model::EffectiveDescriptor,
    target: &manent_model::Target,
) -> Vec<String> {
    let Some(dest) = eff.dest_for(target) else {
        return Vec::new();
    };
    let parent = |path: &str| -> Option<String> {
        let path = path.trim_end_matches('/');
        let (up, _) = path.rsplit_once('/')?;
        Some(if up.is_empty() {
            "/".to_string()
        } else {
            up.to_string()
        })
    };
    let join = |dir: String| format!("{}/current", dir.trim_end_matches('/'));
    let mut paths = Vec::new();
    let root = eff.releases_root_for(target);
    match root {
        Some(root) => {
            paths.push(join(root.clone()));
            paths.extend(parent(&root).map(join));
        }
        None => paths.extend(parent(&dest).map(join)),
    }
    paths.dedup();
    paths
}
