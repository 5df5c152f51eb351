//! The run watcher: stops the runs whose workflow is no longer this executor's.

use std::{
    collections::HashSet,
    sync::{Arc, atomic::Ordering},
};

use tokio::sync::broadcast::error::RecvError;

use super::{Shared, lock};
use crate::store::{Lease, Wakeup, WorkflowFilter, WorkflowRecord, WorkflowStatus};

/// Stops the runs whose workflow is no longer ours (cancelled, recovered
/// away, finished elsewhere): at once on a wake-up for the workflow, and at
/// every heartbeat interval for what no wake-up told us (SQLite across processes).
pub(super) async fn run_watcher(shared: Arc<Shared>) {
    let mut wakeups = shared.store.subscribe();
    let mut ticker = tokio::time::interval(shared.config.heartbeat_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut bus_open = true;
    loop {
        let wakeup = async {
            if bus_open {
                wakeups.recv().await
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            _ = ticker.tick() => check_all_runs(&shared).await,
            wakeup = wakeup => match wakeup {
                Ok(Wakeup::Workflow(id)) => check_run(&shared, &id).await,
                // Another process wrote (SQLite): a cancel from an API process is seen at
                // the next tick, as before.
                Ok(Wakeup::Queue(_) | Wakeup::Elsewhere) => {}
                Err(RecvError::Lagged(_)) => check_all_runs(&shared).await,
                Err(RecvError::Closed) => bus_open = false,
            },
        }
    }
}

/// The lease of this executor's run of `workflow_id`, unless there is none or the run is
/// handing the workflow on by itself (its outcome or move is being written): such a run is
/// ending on its own and is neither stopped nor reported as taken away.
pub(super) fn run_lease(shared: &Shared, workflow_id: &str) -> Option<Lease> {
    lock(&shared.running)
        .get(workflow_id)
        .filter(|run| !run.ending.load(Ordering::SeqCst))
        .map(|run| run.lease.clone())
}

pub(super) fn lease_holds(record: &WorkflowRecord, lease: &Lease) -> bool {
    record.status == WorkflowStatus::Pending
        && record.executor_id.as_deref() == Some(lease.executor_id.as_str())
        && record.generation == lease.generation
}

pub(super) async fn check_run(shared: &Arc<Shared>, workflow_id: &str) {
    let Some(lease) = run_lease(shared, workflow_id) else {
        return;
    };
    if let Ok(record) = shared.store.get_workflow(workflow_id).await {
        let holds = record.as_ref().is_some_and(|r| lease_holds(r, &lease));
        let stopped = if !holds && run_lease(shared, workflow_id) == Some(lease) {
            shared.stop_run(workflow_id)
        } else {
            None
        };
        if let Some(task) = stopped {
            let status = record.as_ref().map(|r| r.status);
            if status == Some(WorkflowStatus::Cancelled) {
                tracing::info!(workflow_id, "stopped the run: the workflow was cancelled");
            } else {
                // Recovered by another worker while this one was silent (paused, cut off):
                // an operator should know that this process had fallen behind.
                tracing::warn!(
                    workflow_id,
                    status = ?status,
                    "stopped the run: the workflow is no longer ours (recovered by another \
                     worker, or gone)"
                );
            }
            // The hooks run once the aborted run has been dropped, so what they clean up
            // (the deploy's work directory) is no longer written to.
            let (shared, workflow_id) = (shared.clone(), workflow_id.to_string());
            tokio::spawn(async move {
                let _ = task.await;
                shared.run_stopped(&workflow_id);
            });
        }
    }
}

pub(super) async fn check_all_runs(shared: &Arc<Shared>) {
    let leases: Vec<Lease> = lock(&shared.running)
        .values()
        .map(|run| run.lease.clone())
        .collect();
    if leases.is_empty() {
        return;
    }
    let Ok(ours) = shared
        .store
        .list_workflows(&WorkflowFilter {
            status: Some(WorkflowStatus::Pending),
            executor_id: Some(shared.config.executor_id.clone()),
            limit: Some(i64::MAX),
            ..Default::default()
        })
        .await
    else {
        return;
    };
    let held: HashSet<(String, i64)> = ours.into_iter().map(|r| (r.id, r.generation)).collect();
    for lease in leases {
        if !held.contains(&(lease.workflow_id.clone(), lease.generation)) {
            check_run(shared, &lease.workflow_id).await;
        }
    }
}
