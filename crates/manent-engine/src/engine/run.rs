//! One run of a workflow on this executor: started once per claim, to its outcome,
//! which is written (retrying while the database is unreachable) before the run ends.

use std::{
    panic::AssertUnwindSafe,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::FutureExt;

use super::{Running, Shared, lock, read};
use crate::{
    context::WorkflowContext,
    error::WorkflowError,
    now_ms,
    store::{Checkpoint, Lease, WorkflowRecord, WorkflowStatus},
};

/// Runs `record` on this executor unless it already runs here.
pub(super) fn spawn_run(shared: &Arc<Shared>, record: WorkflowRecord) {
    let Some(lease) = record.lease() else {
        tracing::error!(workflow_id = %record.id, "claimed workflow has no executor; skipping");
        return;
    };
    if !shared.lease_live() {
        // It stays PENDING under this id: started at the next live renewal
        // (`lease::adopt_orphans`), or recovered elsewhere.
        shared.orphaned.store(true, Ordering::SeqCst);
        tracing::warn!(workflow_id = %record.id, "not started: the executor lease is not live; it starts once the lease is renewed");
        return;
    }
    let versions = shared.workflow_versions();
    if !versions.contains(record.workflow_version) {
        // Left under this id by a build that ran another version (a downgrade): this
        // code cannot replay it, so it goes back to its queue for a worker that can
        // (ARCHITECTURE.md, "Workflow versions").
        tracing::warn!(
            workflow_id = %record.id,
            workflow_version = record.workflow_version,
            runs = %versions,
            "handing a workflow back to its queue: this worker cannot replay its version"
        );
        let store = shared.store.clone();
        tokio::spawn(async move {
            if let Err(e) = store.release(&lease, now_ms()).await {
                tracing::warn!(workflow_id = %lease.workflow_id, error = %e, "could not hand the workflow back; it is recovered when this worker's lease expires");
            }
        });
        return;
    }
    let token = shared.next_token.fetch_add(1, Ordering::Relaxed);
    let mut running = lock(&shared.running);
    if let Some(old) = running.remove(&record.id) {
        // An older run of the same workflow here was fenced by this new
        // generation; stop it now rather than at its next checkpoint.
        old.handle.abort();
    }
    let id = record.id.clone();
    let waits = Arc::new(AtomicUsize::new(0));
    let ending = Arc::new(AtomicBool::new(false));
    let handle = tokio::spawn(run_workflow(
        shared.clone(),
        record,
        lease.clone(),
        token,
        waits.clone(),
        ending.clone(),
    ));
    running.insert(
        id,
        Running {
            token,
            handle,
            lease,
            waits,
            ending,
        },
    );
}

pub(super) async fn run_workflow(
    shared: Arc<Shared>,
    record: WorkflowRecord,
    lease: Lease,
    token: u64,
    waits: Arc<AtomicUsize>,
    ending: Arc<AtomicBool>,
) {
    let id = record.id.clone();
    run_to_outcome(&shared, record, lease, waits, ending).await;
    let mut running = lock(&shared.running);
    if running.get(&id).is_some_and(|r| r.token == token) {
        running.remove(&id);
    }
    drop(running);
    shared.run_finished.notify_waiters();
}

pub(super) async fn run_to_outcome(
    shared: &Arc<Shared>,
    record: WorkflowRecord,
    lease: Lease,
    waits: Arc<AtomicUsize>,
    ending: Arc<AtomicBool>,
) {
    let function = read(&shared.registry).get(&record.name).cloned();
    let Some(function) = function else {
        let message = format!(
            "workflow `{}` is not registered on executor `{}`; it cannot run here",
            record.name, shared.config.executor_id
        );
        tracing::error!(workflow_id = %record.id, "{message}");
        ending.store(true, Ordering::SeqCst);
        finish(shared, &lease, WorkflowStatus::Error, None, Some(&message)).await;
        return;
    };
    let mut wait = Duration::from_millis(100);
    // A workflow's first claim is its first lease: no run before it could write a
    // checkpoint (every step write needs a lease), so there is nothing to load. A
    // replay after a failed checkpoint, or any later claim or take-over, loads them.
    let mut nothing_recorded = record.attempts <= 1;
    loop {
        let loaded = if std::mem::take(&mut nothing_recorded) {
            Ok(Vec::new())
        } else {
            shared.store.load_steps(&record.id).await
        };
        let steps = match loaded {
            Ok(steps) => steps,
            Err(e) if e.is_transient() && !shared.is_stopping() => {
                tracing::warn!(workflow_id = %record.id, error = %e, "cannot load checkpoints; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
                continue;
            }
            Err(e) => {
                tracing::error!(workflow_id = %record.id, error = %e, "cannot load checkpoints");
                return;
            }
        };
        let ctx = WorkflowContext::new(
            shared.clone(),
            lease.clone(),
            &record,
            steps,
            waits.clone(),
            ending.clone(),
        );
        let outcome = AssertUnwindSafe(function(ctx, record.input.clone()))
            .catch_unwind()
            .await;
        // Every arm below but the transient replay ends this run; an outcome it writes
        // makes the record stop naming this lease, which the watcher must not mistake
        // for a recovery elsewhere.
        let replays = matches!(&outcome, Ok(Err(WorkflowError::Store(e))) if e.is_transient());
        if !replays {
            ending.store(true, Ordering::SeqCst);
        }
        match outcome {
            Ok(Ok(output)) => {
                finish(shared, &lease, WorkflowStatus::Success, Some(&output), None).await;
            }
            Ok(Err(e)) if e.stops_silently() => {
                tracing::info!(workflow_id = %record.id, reason = %e, "run stopped");
            }
            Ok(Err(WorkflowError::Store(e))) if e.is_transient() => {
                if shared.is_stopping() {
                    return;
                }
                // The database went away mid-run: replay from the checkpoints once it is back.
                tracing::warn!(workflow_id = %record.id, error = %e, retry_in = ?wait, "checkpoint failed; replaying later");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
                continue;
            }
            Ok(Err(e)) => {
                let message = e.to_string();
                // Escaped: the error may quote what a target printed, which must not forge
                // a line of the server's log.
                tracing::warn!(workflow_id = %record.id, error = %message.escape_debug(), "workflow failed");
                finish(shared, &lease, WorkflowStatus::Error, None, Some(&message)).await;
            }
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                tracing::error!(workflow_id = %record.id, panic = %message, "workflow panicked (a bug)");
                finish(
                    shared,
                    &lease,
                    WorkflowStatus::Error,
                    None,
                    Some(&format!("workflow panicked: {message}")),
                )
                .await;
            }
        }
        return;
    }
}

/// Records the outcome, retrying while the database is unreachable.
pub(super) async fn finish(
    shared: &Shared,
    lease: &Lease,
    status: WorkflowStatus,
    output: Option<&str>,
    error: Option<&str>,
) {
    let mut wait = Duration::from_millis(100);
    loop {
        match shared
            .store
            .finish(lease, status, output, error, now_ms())
            .await
        {
            Ok(Checkpoint::Written) => return,
            Ok(Checkpoint::Fenced) => {
                tracing::info!(workflow_id = %lease.workflow_id, "outcome not recorded: the workflow is no longer ours");
                return;
            }
            Err(e) if e.is_transient() && !shared.is_stopping() => {
                tracing::warn!(workflow_id = %lease.workflow_id, error = %e, "cannot record the outcome; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                tracing::error!(workflow_id = %lease.workflow_id, error = %e, "cannot record the outcome; it stays PENDING");
                return;
            }
        }
    }
}
