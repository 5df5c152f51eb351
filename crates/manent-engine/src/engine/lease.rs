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
    store::{ExecutorLease, LeaseGrant, Liveness, Renewal},
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
            *lock(&shared.act_until) = Some(sent + shared.fence_window());
            shared.renewed.notify_one();
            if shared.self_fenced.load(Ordering::SeqCst) && !shared.is_stopping() {
                // Nobody took the id while we could not renew: go on with
                // whatever was not recovered away meanwhile.
                match shared
                    .store
                    .take_over_own(&config.executor_id, now_ms())
                    .await
                {
                    Ok(records) => {
                        shared.self_fenced.store(false, Ordering::SeqCst);
                        tracing::warn!(executor_id = %config.executor_id, resumed = records.len(), "executor lease renewed again; resuming this executor's pending workflows");
                        for record in records {
                            spawn_run(shared, record);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "lease renewed but the pending workflows cannot be read; trying again at the next renewal");
                    }
                }
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
        if !shared.self_fenced.swap(true, Ordering::SeqCst) {
            let stopped = shared.stop_all_runs();
            tracing::error!(executor_id = %shared.config.executor_id, stopped = ?stopped, "the executor lease could not be renewed in time: stopped every run and its commands before another worker may take over; they resume here if the lease is renewed, elsewhere after recovery");
        }
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
