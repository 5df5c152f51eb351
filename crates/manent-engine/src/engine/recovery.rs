//! Automatic recovery: the pending workflows of stale executors go back to their queues.

use std::sync::Arc;

use super::{Shared, lock};
use crate::{now_ms, store::ExecutorState};

/// Re-enqueues the pending workflows of stale executors, every heartbeat interval.
/// A task of its own, not a step of [`super::lease::heartbeat_loop`]: a recovery held up (by a row
/// lock another session holds, by a slow database) must not hold up the lease renewal,
/// or this executor would fence itself, stopping its own runs, while it waits to
/// recover another's.
pub(super) async fn recovery_loop(shared: Arc<Shared>) {
    let config = &shared.config;
    let mut ticker = tokio::time::interval(config.heartbeat_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stale_ms = shared.stale_ms();
    loop {
        ticker.tick().await;
        if *lock(&shared.state) != ExecutorState::Running || !shared.lease_live() {
            continue;
        }
        let now = now_ms();
        match shared
            .store
            .recover_stale(now - stale_ms, &config.executor_id, now)
            .await
        {
            Ok(recovered) if !recovered.is_empty() => {
                tracing::warn!(count = recovered.len(), workflows = ?recovered, "recovered the workflows of stale executors");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "automatic recovery failed"),
        }
    }
}
