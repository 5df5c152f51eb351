//! Why a deploy does not move (`waiting_for`, docs/cli.md): the deploy that holds its
//! environment, the queue no live worker serves or none of the right workflow version, the
//! limit that is full, or the stopped worker that holds it and who may recover it.

use super::*;

/// The ids of `holders` but `own`.
pub(super) fn others<'a>(holders: impl Iterator<Item = &'a str>, own: &str) -> Vec<String> {
    holders
        .filter(|id| *id != own)
        .map(str::to_string)
        .collect()
}

/// What a deploy waits for, as `waiting_for` says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Waiting {
    /// Said to every reader.
    pub(super) reason: String,
    /// Said instead to a reader who may run what it names (`manent recover`, an admin's):
    /// a hint shown to a caller who would get 403 for it is a dead end.
    pub(super) to_recoverers: Option<String>,
}

impl Waiting {
    fn to_all(reason: String) -> Self {
        Waiting {
            reason,
            to_recoverers: None,
        }
    }
}

/// What holds the environment of queued deploy `record` (`environment_concurrency`): a
/// deploy that runs there, or the prune after one (docs/containers.md, "Pruning").
async fn environment_holder(
    client: &Client,
    record: &WorkflowRecord,
) -> Result<Option<String>, EngineError> {
    let running = |name: &str| WorkflowFilter {
        status: Some(WorkflowStatus::Pending),
        name: Some(name.into()),
        partition_key: Some(record.partition_key.clone()),
        limit: Some(5),
        ..Default::default()
    };
    let holders = client.list(&running(DEPLOY_WORKFLOW)).await?;
    // Read after the deploy's own record: it may have started meanwhile, and is not
    // waiting for itself.
    let ids = others(holders.iter().map(|h| h.id.as_str()), &record.id);
    if !ids.is_empty() {
        return Ok(Some(format!(
            "the environment {}: deploy {} runs there (environment_concurrency)",
            record.partition_key,
            ids.join(", ")
        )));
    }
    let prunes = client
        .list(&running(crate::request::PRUNE_WORKFLOW))
        .await?;
    Ok(prunes.first().map(|prune| {
        format!(
            "the environment {}: the prune after deploy {} runs there (environment_concurrency)",
            record.partition_key,
            prune.parent_id.as_deref().unwrap_or(&prune.id)
        )
    }))
}

/// Why a queued deploy does not start, or a claimed one does not move, when the
/// deploy itself does not say (approval and dependency waits do): the deploy that holds
/// its environment, the queue no live worker serves, or the stopped worker that holds
/// it and the command that recovers it. `None` when there is nothing more precise.
pub(super) async fn waiting_reason(
    client: &Client,
    record: &WorkflowRecord,
) -> Result<Option<Waiting>, EngineError> {
    let now = now_ms();
    match record.status {
        WorkflowStatus::Enqueued if record.not_before_ms <= now => {
            let executors = client.executors().await?;
            let mut live = Vec::new();
            let mut live_other_versions = Vec::new();
            let mut gone = Vec::new();
            for e in executors
                .iter()
                .filter(|e| e.queues.contains(&record.queue))
            {
                let lease = client
                    .executor_lease(&e.id)
                    .await?
                    .filter(|l| l.is_live(now));
                let suspect = match &lease {
                    Some(lease) if e.state == ExecutorState::Running => {
                        client.executor_suspect(lease).await?
                    }
                    _ => false,
                };
                if suspect {
                    gone.push(format!("{}, which stopped answering (suspect)", e.id));
                } else if e.state == ExecutorState::Running && lease.is_some() {
                    if e.workflow_versions.contains(record.workflow_version) {
                        live.push(e.id.clone());
                    } else {
                        live_other_versions.push(format!("{} ({})", e.id, e.workflow_versions));
                    }
                } else {
                    gone.push(format!("{} ({})", e.id, e.state));
                }
            }
            if live.is_empty() && !live_other_versions.is_empty() {
                // Never failed, never dropped: it starts once a worker of a build that runs
                // its version serves the queue (docs/upgrading.md).
                return Ok(Some(Waiting::to_all(format!(
                    "a worker that runs deploy workflow version {} on queue {}: the live ones \
                     run other versions ({}); start a manent release that runs version {}",
                    record.workflow_version,
                    record.queue,
                    live_other_versions.join(", "),
                    record.workflow_version
                ))));
            }
            if live.is_empty() {
                return Ok(Some(Waiting::to_all(format!(
                    "a worker serving queue {}: none is running{}",
                    record.queue,
                    if gone.is_empty() {
                        " (no worker has ever served it; see `manent queues`)".to_string()
                    } else {
                        format!(" (it was served by {})", gone.join(", "))
                    }
                ))));
            }
            if let Some(holder) = environment_holder(client, record).await? {
                return Ok(Some(Waiting::to_all(holder)));
            }
            let running = client.running_counts().await?;
            // Read after the deploy's own record, like the holders above: a deploy claimed
            // meanwhile is counted in `running` and would be said to wait for itself (a
            // limit "full" on an idle server).
            if client
                .get(&record.id)
                .await?
                .is_some_and(|now| now.status != WorkflowStatus::Enqueued)
            {
                return Ok(None);
            }
            let queue = client.queues().await?;
            let queue = queue.iter().find(|q| q.name == record.queue);
            Ok(Some(Waiting::to_all(full_limit(
                &record.queue,
                &live,
                &running,
                queue,
            ))))
        }
        WorkflowStatus::Pending => {
            let Some(executor) = &record.executor_id else {
                return Ok(None);
            };
            let lease = client.executor_lease(executor).await?;
            if let Some(lease) = lease.filter(|l| l.is_live(now)) {
                if !client.executor_suspect(&lease).await? {
                    return Ok(None);
                }
                // Killed, most likely: its lock is free (or its pid gone) while its lease
                // still looks live. Nothing moves its work before the lease runs out.
                let until = rfc3339(lease.expires_at_ms);
                let waiting = |who: &str| {
                    format!(
                        "worker {executor}, which holds it: worker {executor} stopped answering \
                         (suspect); its lease runs until {until}, then {who} hands the deploy \
                         to another worker (or recovery.automatic does)"
                    )
                };
                return Ok(Some(Waiting {
                    reason: waiting("an admin's `manent recover`"),
                    to_recoverers: Some(waiting(&format!(
                        "`manent recover --executor {executor}`"
                    ))),
                }));
            }
            // The lease expired: a worker that recorded no stop is dead, whatever it last
            // recorded (running, draining).
            let state = match client.executor(executor).await? {
                Some(e) if e.state == ExecutorState::Stopped => "stopped",
                Some(_) => "dead (its lease expired without a recorded stop)",
                None => "unknown",
            };
            let waiting = |who: &str| {
                format!(
                    "worker {executor}, which holds it, to come back: it is {state}; {who} \
                     hands the deploy to another worker (or recovery.automatic does)"
                )
            };
            Ok(Some(Waiting {
                reason: waiting("an admin's `manent recover`"),
                to_recoverers: Some(waiting(&format!("`manent recover --executor {executor}`"))),
            }))
        }
        _ => Ok(None),
    }
}

/// Why a deploy on `queue`, which the `live` workers serve, is not taken yet: the limit that
/// is full, named with its number, from what runs now (`running`) and the queue's limits
/// as registered; on an idle server, none (the next claim takes it). The limits of the
/// deploys' group (`dbos.concurrency`, `dbos.global_concurrency`) are each worker's own
/// and not recorded: a worker's is its queue's registered cap, and when something runs
/// but no worker and not the queue is at its cap, the total is what is full.
pub(super) fn full_limit(
    queue: &str,
    live: &[String],
    running: &[manent_engine::RunningCount],
    registered: Option<&manent_engine::QueueRecord>,
) -> String {
    let deploys = || {
        running
            .iter()
            .filter(|r| r.group.as_deref() == Some(crate::queues::DEPLOY_LIMIT_GROUP))
    };
    let total: i64 = deploys().map(|r| r.running).sum();
    let on = |executor: &str| -> i64 {
        deploys()
            .filter(|r| r.executor_id.as_deref() == Some(executor))
            .map(|r| r.running)
            .sum()
    };
    let workers = live.join(", ");
    let worker_cap = registered.and_then(|q| q.worker_concurrency);
    if let Some(cap) = worker_cap
        && live.iter().all(|w| on(w) >= cap)
    {
        let uses: Vec<String> = live.iter().map(|w| format!("{w} runs {}", on(w))).collect();
        return format!(
            "a free slot on queue {queue}: every worker serving it is at its limit of {cap} \
             deploy(s) at once (dbos.concurrency, or the queue's concurrency): {}",
            uses.join(", ")
        );
    }
    let queue_cap = registered.map_or(0, |q| q.global_concurrency);
    let on_queue: i64 = deploys()
        .filter(|r| r.queue == queue)
        .map(|r| r.running)
        .sum();
    if queue_cap > 0 && on_queue >= queue_cap {
        return format!(
            "a free slot on queue {queue}: its limit of {queue_cap} deploy(s) at once (the \
             queue's concurrency) is reached"
        );
    }
    if total > 0 {
        return format!(
            "a free slot on queue {queue}: {total} deploy(s) run over all deploy queues and \
             its workers ({workers}) have room, so the limit on the total is full \
             (dbos.global_concurrency; `manent queues` shows it)"
        );
    }
    format!("a worker of queue {queue} to take it: {workers} serve(s) it with free slots")
}
