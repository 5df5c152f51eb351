//! The claim loop: claims from the queues this executor serves, within their limits.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use tokio::{sync::broadcast::error::RecvError, time::Instant};

use super::run::spawn_run;
use super::{QueueSpec, Shared, read};
use crate::{error::StoreError, now_ms, store::Wakeup};

/// Claims whenever a queue we serve may have work: on a wake-up (of this process, or
/// [`Wakeup::Elsewhere`]: another process wrote), on the not-before time of each queue's
/// earliest scheduled workflow, and on the fallback poll.
pub(super) async fn claim_loop(shared: Arc<Shared>) {
    let mut wakeups = shared.store.subscribe();
    let mut stopping = shared.stopping.subscribe();
    let mut dirty: HashSet<String> = read(&shared.queues)
        .iter()
        .map(|q| q.name.clone())
        .collect();
    // Each queue's earliest scheduled workflow, as its last claim learnt: kept until the
    // queue is claimed from again, whatever other queue woke the loop meanwhile.
    let mut due: HashMap<String, i64> = HashMap::new();
    let mut failures = 0u32;
    let mut round = 0usize;
    loop {
        if shared.is_stopping() {
            return;
        }
        let queues = read(&shared.queues).clone();
        let mut failed = false;
        // Queues of one limit group compete for its slots: start each round at
        // the next queue, so none is always served last.
        round = round.wrapping_add(1);
        let start = round % queues.len().max(1);
        let in_turn = queues[start..].iter().chain(&queues[..start]);
        for spec in in_turn.filter(|q| dirty.contains(&q.name)) {
            match claim_queue(&shared, spec).await {
                Ok(Some(at)) => {
                    due.insert(spec.name.clone(), at);
                }
                Ok(None) => {
                    due.remove(&spec.name);
                }
                Err(e) => {
                    failed = true;
                    tracing::warn!(queue = %spec.name, error = %e, "claim failed");
                }
            }
        }
        dirty.clear();
        due.retain(|name, _| queues.iter().any(|q| &q.name == name));
        failures = if failed { failures + 1 } else { 0 };
        let poll = if failed {
            Duration::from_millis(100 * 2u64.pow(failures.min(5)))
        } else {
            shared.poll_interval()
        };
        let polled_at = Instant::now() + poll;
        let mut until = polled_at;
        if let Some(at) = due.values().min() {
            let in_ms = u64::try_from((at - now_ms()).max(0)).unwrap_or(0);
            until = until.min(Instant::now() + Duration::from_millis(in_ms));
        }
        let all = || {
            queues
                .iter()
                .map(|q| q.name.clone())
                .collect::<HashSet<_>>()
        };
        // Wait for something relevant, then take every wake-up already queued
        // so that a burst of them costs one claim per queue.
        tokio::select! {
            _ = tokio::time::sleep_until(until) => {
                dirty = if Instant::now() >= polled_at {
                    all()
                } else {
                    // The earliest scheduled work is due: its queues only.
                    let now = now_ms();
                    due.iter().filter(|(_, at)| **at <= now).map(|(q, _)| q.clone()).collect()
                };
            }
            _ = stopping.changed() => return,
            _ = async {
                loop {
                    match wakeups.recv().await {
                        Ok(Wakeup::Queue(q)) if queues.iter().any(|s| s.name == q) => { dirty.extend(sharing_limits(&queues, &q)); return; }
                        Ok(Wakeup::Elsewhere) => { dirty = all(); return; }
                        Ok(_) => {}
                        Err(RecvError::Lagged(_)) => { dirty = all(); return; }
                        Err(RecvError::Closed) => std::future::pending::<()>().await,
                    }
                }
            } => {}
        }
        loop {
            match wakeups.try_recv() {
                Ok(Wakeup::Queue(q)) if queues.iter().any(|s| s.name == q) => {
                    dirty.extend(sharing_limits(&queues, &q));
                }
                Ok(Wakeup::Elsewhere) => dirty = all(),
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => dirty = all(),
                Err(_) => break,
            }
        }
    }
}

/// Claims from one queue until it yields less than a batch; returns the next
/// not-before time to wake up for, if the queue has scheduled work.
pub(super) async fn claim_queue(
    shared: &Arc<Shared>,
    spec: &QueueSpec,
) -> Result<Option<i64>, StoreError> {
    let config = &shared.config;
    loop {
        if shared.is_stopping() || !shared.lease_live() {
            return Ok(None);
        }
        let claimed = shared
            .store
            .claim(
                &spec.name,
                &config.executor_id,
                shared.workflow_versions(),
                spec.limits(),
                now_ms(),
                config.claim_batch,
            )
            .await?;
        let count = claimed.len() as u32;
        for record in claimed {
            spawn_run(shared, record);
        }
        if count < config.claim_batch {
            // Idle, blocked or drained: learn when scheduled work becomes due (the loop
            // keeps it until this queue is claimed from again).
            return shared.store.next_not_before(&spec.name, now_ms()).await;
        }
    }
}

/// `queue` and the queues of its limit group: a slot freed on one may be taken by any.
pub(super) fn sharing_limits(queues: &[QueueSpec], queue: &str) -> Vec<String> {
    let group = queues
        .iter()
        .find(|q| q.name == queue)
        .and_then(|q| q.group.as_ref())
        .map(|g| g.name.as_str());
    queues
        .iter()
        .filter(|q| {
            q.name == queue
                || (group.is_some() && q.group.as_ref().map(|g| g.name.as_str()) == group)
        })
        .map(|q| q.name.clone())
        .collect()
}
