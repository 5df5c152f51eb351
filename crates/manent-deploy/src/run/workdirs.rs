//! A worker's work directories over its lifetime (docs/scaling-and-recovery.md, "Work
//! directories"): each deploy's or pass's directory goes when its run ends here
//! (`workflow.rs`), when the engine stops a run that is no longer this worker's (cancelled,
//! recovered by another worker), and, for what a killed process or a hand-back left, in a
//! sweep at start and every [`SWEEP_INTERVAL`]: a directory whose workflow has ended or is
//! held by another executor goes; one whose workflow is queued or pending under this
//! executor stays, for its resumption.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use manent_engine::{Client, Engine, EngineError, WorkflowStatus};

use crate::run::artifacts;

/// How often a worker sweeps its work directory.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(10 * 60);

/// Removes a workflow's directory under `workdir` whenever `engine` stops its run because
/// the workflow is no longer this executor's.
pub fn remove_when_taken_away(engine: &Engine, workdir: PathBuf) {
    engine.on_run_stopped(move |workflow_id| {
        let dir = artifacts::deploy_dir(&workdir, workflow_id);
        tokio::spawn(remove(dir));
    });
}

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Sweep {
    /// The directories removed (their workflows ended, or are another executor's).
    pub removed: Vec<String>,
    /// The directories kept (their workflows are queued, or pending here).
    pub kept: Vec<String>,
    /// Entries that name no workflow: left alone (not ours to judge), reported.
    pub unknown: Vec<String>,
}

/// Removes the directories under `workdir` whose workflows have ended or are held by an
/// executor other than `executor_id`.
pub async fn sweep(
    client: &Client,
    workdir: &Path,
    executor_id: &str,
) -> Result<Sweep, EngineError> {
    let mut sweep = Sweep::default();
    let mut entries = match tokio::fs::read_dir(workdir).await {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(sweep),
        Err(e) => {
            tracing::warn!(dir = %workdir.display(), error = %e, "cannot read the work directory to sweep it");
            return Ok(sweep);
        }
    };
    while let Ok(Some(entry)) = entries.next_entry().await {
        if !entry.file_type().await.is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(record) = client.get(&name).await? else {
            sweep.unknown.push(name);
            continue;
        };
        let foreign = record.status == WorkflowStatus::Pending
            && record.executor_id.as_deref() != Some(executor_id);
        if record.status.is_terminal() || foreign {
            remove(entry.path()).await;
            sweep.removed.push(name);
        } else {
            sweep.kept.push(name);
        }
    }
    sweep.removed.sort();
    sweep.kept.sort();
    sweep.unknown.sort();
    Ok(sweep)
}

/// Sweeps `workdir` now and every [`SWEEP_INTERVAL`], for as long as the process runs.
pub fn spawn_sweeper(client: Client, workdir: PathBuf, executor_id: String) {
    tokio::spawn(async move {
        loop {
            match sweep(&client, &workdir, &executor_id).await {
                Ok(s) if !s.removed.is_empty() => {
                    tracing::info!(
                        removed = s.removed.len(),
                        kept = s.kept.len(),
                        "work directories of ended deploys removed"
                    );
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot sweep the work directory now; trying again later");
                }
            }
            tokio::time::sleep(SWEEP_INTERVAL).await;
        }
    });
}

async fn remove(dir: PathBuf) {
    crate::run::artifacts::forget_dir(&dir);
    // A plugin wrote in there: std's `remove_dir_all` removes the links it finds (and `dir`
    // itself if it is one) and follows none (docs/security.md, "What the worker never trusts").
    match tokio::fs::remove_dir_all(&dir).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a work directory")
        }
    }
}
