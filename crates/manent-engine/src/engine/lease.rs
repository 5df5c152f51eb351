//! The executor lease: taking the executor id at launch, renewing it every heartbeat,
//! fencing this process when a renewal is late, and stopping everything once it is lost.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use tokio::time::Instant;

use super::run::spawn_run;
use super::{Engine, Shared, lock};
use crate::{
    error::EngineError,
    now_ms,
    store::{
        ExecutorLease, LeaseGrant, Liveness, Renewal, WorkflowFilter, WorkflowRecord,
        WorkflowStatus,
    },
};

/// How often a newcomer looks at a held lease again.
pub(super) const LEASE_POLL: Duration = Duration::from_millis(200);

/// Renews the lease, then records the heartbeat. Ends when the lease is lost.
/// Each call is bounded, so that nothing keeps the next renewal waiting.
pub(super) async fn heartbeat_loop(shared: Arc<Shared>) {
    let config = &shared.config;
    let mut ticker = tokio::time::interval(config.heartbeat_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if !renew_lease(&shared).await {
            return;
        }
        let state = *lock(&shared.state);
        let heartbeat = tokio::time::timeout(
            config.heartbeat_interval,
            shared.store.heartbeat(&config.executor_id, state, now_ms()),
        );
        match heartbeat.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "heartbeat failed"),
            Err(_) => tracing::warn!(
                "heartbeat not written within the heartbeat interval; the lease is renewed first next time"
            ),
        }
    }
}

/// One renewal of the executor lease. Returns `false` once the lease is lost
/// for good (taken by another process, or revoked).
pub(super) async fn renew_lease(shared: &Arc<Shared>) -> bool {
    let config = &shared.config;
    let sent = Instant::now();
    let now = now_ms();
    // Bounded, so a hung connection cannot hold the loop past the lease.
    let renewal = tokio::time::timeout(
        config.stale_after,
        shared.store.renew_executor_lease(
            &config.executor_id,
            &shared.holder,
            now,
            now.saturating_add(shared.stale_ms()),
        ),
    )
    .await;
    match renewal {
        Ok(Ok(Renewal::Renewed)) => {
            let until = sent + shared.fence_window();
            *lock(&shared.act_until) = Some(until);
            shared.renewed.notify_one();
            if shared.self_fenced.load(Ordering::SeqCst) && !shared.is_stopping() {
                take_over_own(shared, until).await;
            }
            if shared.lease_live()
                && !shared.is_stopping()
                && shared.orphaned.swap(false, Ordering::SeqCst)
            {
                adopt_orphans(shared, until).await;
            }
            true
        }
        Ok(Ok(Renewal::Lost(current))) => {
            lose_lease(shared, current);
            false
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot renew the executor lease; retrying");
            true
        }
        Err(_) => {
            tracing::warn!(timeout = ?config.stale_after, "renewing the executor lease timed out; retrying");
            true
        }
    }
}

/// After a fence, once the lease is renewed: this executor's pending workflows (whatever
/// was not recovered away meanwhile) are taken over under a new generation and run again.
/// Only within this renewal's window (`until`): a take-over that ends after it leaves the
/// process fenced (it stops what it started, as the watchdog would have) and is tried again
/// at the next renewal. Bounded by the window, so a take-over kept waiting (by a row lock,
/// by the connection it shares with the other loops) never holds up the next renewal.
async fn take_over_own(shared: &Arc<Shared>, until: Instant) {
    let config = &shared.config;
    let taken = tokio::time::timeout_at(
        until,
        shared.store.take_over_own(&config.executor_id, now_ms()),
    )
    .await;
    match taken {
        Ok(Ok(records)) => {
            shared.self_fenced.store(false, Ordering::SeqCst);
            let resumed = records.len();
            for record in records {
                spawn_run(shared, record);
            }
            if Instant::now() >= until {
                // The watchdog may have looked while we were still fenced: fence again here.
                tracing::warn!(executor_id = %config.executor_id, "taking over this executor's pending workflows ended after the lease's window; trying again at the next renewal");
                fence(shared);
            } else {
                tracing::warn!(executor_id = %config.executor_id, resumed, "executor lease renewed again; resuming this executor's pending workflows");
            }
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "lease renewed but the pending workflows cannot be read; trying again at the next renewal");
        }
        Err(_) => {
            tracing::warn!(executor_id = %config.executor_id, "taking over this executor's pending workflows did not end within the lease's window; trying again at the next renewal");
        }
    }
}

/// Starts the pending workflows of this executor that have no run here: those a claim or a
/// take-over returned while the lease was not live ([`spawn_run`] leaves them, and marks
/// `orphaned`). Each runs under the generation it holds; one that runs here already is left.
async fn adopt_orphans(shared: &Arc<Shared>, until: Instant) {
    let ours = WorkflowFilter {
        status: Some(WorkflowStatus::Pending),
        executor_id: Some(shared.config.executor_id.clone()),
        limit: Some(i64::MAX),
        ..Default::default()
    };
    match tokio::time::timeout_at(until, shared.store.list_workflows(&ours)).await {
        Ok(Ok(records)) => {
            let orphans: Vec<WorkflowRecord> = {
                let running = lock(&shared.running);
                records
                    .into_iter()
                    .filter(|r| !running.contains_key(&r.id))
                    .collect()
            };
            if !orphans.is_empty() {
                tracing::warn!(executor_id = %shared.config.executor_id, workflows = ?orphans.iter().map(|r| &r.id).collect::<Vec<_>>(), "starting this executor's pending workflows left without a run while its lease was not live");
            }
            for record in orphans {
                spawn_run(shared, record);
            }
        }
        failed => {
            let error = match failed {
                Ok(Err(e)) => e.to_string(),
                _ => "not read within the lease's window".to_string(),
            };
            tracing::warn!(%error, "cannot read this executor's pending workflows left without a run; trying again at the next renewal");
            shared.orphaned.store(true, Ordering::SeqCst);
        }
    }
}

/// Fences this process (unless it is already): every run is stopped, their commands
/// killed; the workflows stay pending under this id, taken over at the next renewal.
fn fence(shared: &Shared) {
    if !shared.self_fenced.swap(true, Ordering::SeqCst) {
        let stopped = shared.stop_all_runs();
        tracing::error!(executor_id = %shared.config.executor_id, stopped = ?stopped, "the executor lease could not be renewed in time: stopped every run and its commands before another worker may take over; they resume here if the lease is renewed, elsewhere after recovery");
    }
}

/// Another process holds our id now (or a forced recovery revoked it): stop
/// every run (killing its commands), stop claiming, and tell the binary.
pub(super) fn lose_lease(shared: &Shared, current: Option<ExecutorLease>) {
    let detail = match current {
        Some(l) => format!("it is now held by host `{}`, pid {}", l.host, l.pid),
        None => "its lease was revoked by a forced recovery".to_string(),
    };
    shared.self_fenced.store(true, Ordering::SeqCst);
    let _ = shared.stopping.send(true);
    let stopped = shared.stop_all_runs();
    tracing::error!(executor_id = %shared.config.executor_id, stopped = ?stopped, "executor lease lost: {detail}; stopped every run and its commands");
    shared.lost.send_replace(Some(detail));
}

/// Fences this process when its lease was not renewed in time: every run is
/// stopped (their commands killed) before the deadline others act on.
pub(super) async fn fence_watchdog(shared: Arc<Shared>) {
    loop {
        let until = lock(&shared.act_until).unwrap_or_else(Instant::now);
        if Instant::now() < until {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                _ = shared.renewed.notified() => {}
            }
            continue;
        }
        fence(&shared);
        shared.renewed.notified().await;
    }
}

impl Engine {
    /// The duplicate-id rule, on leases. A live lease keeps the id with its
    /// holder: we say at once that we wait, wait up to `stale_after` (a
    /// crashed or paused holder's lease runs out meanwhile) and then refuse,
    /// naming its host. The backend's lock only proves a holder dead at once:
    /// the lock is free *and* the holder ran on this host under a pid that is
    /// gone. A free lock alone proves nothing (a PostgreSQL connection cut
    /// frees it while its process lives on).
    pub(super) async fn take_executor_id(&self) -> Result<Liveness, EngineError> {
        let shared = &self.shared;
        let config = &shared.config;
        let started = Instant::now();
        let mut announced = false;
        loop {
            let proof = shared.store.acquire_liveness(&config.executor_id).await?;
            let previous = shared.store.get_executor_lease(&config.executor_id).await?;
            let proven_dead = matches!(proof, Liveness::Acquired(_))
                && previous
                    .as_ref()
                    .is_some_and(|l| l.host == config.host && !process_alive(l.pid));
            let sent = Instant::now();
            let now = now_ms();
            let lease = ExecutorLease {
                executor_id: config.executor_id.clone(),
                holder: shared.holder.clone(),
                host: config.host.clone(),
                pid: i64::from(std::process::id()),
                acquired_at_ms: now,
                renewed_at_ms: now,
                expires_at_ms: now.saturating_add(shared.stale_ms()),
            };
            match shared
                .store
                .acquire_executor_lease(&lease, proven_dead)
                .await?
            {
                LeaseGrant::Granted => {
                    if let Some(prev) = previous.filter(|p| p.holder != shared.holder) {
                        let why = if proven_dead {
                            "its process is gone"
                        } else {
                            "its lease ran out"
                        };
                        tracing::info!(executor_id = %config.executor_id, previous_host = %prev.host, previous_pid = prev.pid, "took over the executor id: {why}");
                    }
                    *lock(&shared.act_until) = Some(sent + shared.fence_window());
                    return Ok(proof);
                }
                LeaseGrant::Held(holder) => {
                    let age_secs =
                        u64::try_from((now - holder.renewed_at_ms).max(0) / 1000).unwrap_or(0);
                    // The holder's lease outlives our wait only if it is renewed: it is alive.
                    if started.elapsed() >= config.stale_after + LEASE_POLL {
                        return Err(EngineError::DuplicateExecutor {
                            executor_id: config.executor_id.clone(),
                            host: holder.host,
                            pid: holder.pid,
                            age_secs,
                        });
                    }
                    if !announced {
                        announced = true;
                        tracing::warn!(executor_id = %config.executor_id, holder_host = %holder.host, holder_pid = holder.pid, "executor id held by a live worker (lease renewed {age_secs}s ago); waiting up to stale_after ({:?}) for its lease to run out before refusing", config.stale_after);
                    }
                }
            }
            drop(proof);
            tokio::time::sleep(LEASE_POLL).await;
        }
    }
}

/// Whether a process with this pid exists on this host (a pid we may not
/// signal exists too).
pub(crate) fn process_alive(pid: i64) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    !matches!(
        rustix::process::test_kill_process(pid),
        Err(rustix::io::Errno::SRCH)
    )
}

/// This machine's name, as leases record their holder's host.
pub(crate) fn this_host() -> String {
    hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into())
}
