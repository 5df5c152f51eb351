//! What a deploy's timeline is drawn from besides its own steps: the waves its rollout
//! plans, and the region passes (child workflows on `<queue>.<region>`) that deployed a
//! wave's targets under region routing, with their steps, target events and output
//! (docs/api.md, "The Platform page"); and the interruptions: a worker lost under the
//! deploy, the recovery that moved it on and the worker that resumed it.

use std::collections::{BTreeMap, HashMap};

use manent_engine::{
    Client, EngineError, EventRecord, OutputLine, StepRecord, WorkflowFilter, WorkflowRecord,
    WorkflowStatus,
};
use manent_model::{EffectiveDescriptor, plan_waves};

use crate::{
    request::rfc3339,
    workflow::{PASS_WORKFLOW, PassMode, PassRequest},
};

/// One wave of the rollout: its name and its targets, in the order they are deployed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaveView {
    pub name: String,
    pub targets: Vec<String>,
}

/// What a region pass does: deploy the new version, or roll the targets it switched back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassAction {
    Deploy,
    Rollback,
}

/// One region's pass of a region-routed deploy: a child workflow on `<queue>.<region>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassView {
    /// The pass's own workflow id (`<deploy id>.<n>`).
    pub id: String,
    pub region: String,
    pub action: PassAction,
    pub status: WorkflowStatus,
    /// The worker that runs (or ran) it.
    pub executor_id: Option<String>,
    pub targets: Vec<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
}

/// A worker lost under a running deploy (or one of its passes), and the recovery that moved
/// it on: from the `recovery:<ms>` and `interrupted:<ms>` events the engine writes in the
/// transaction that moves the work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterruptionView {
    /// When the lost worker was last heard from; `None` when nothing says (a worker that
    /// resumed its own deploys after a restart, or a record from before this was kept).
    pub interrupted_at: Option<i64>,
    pub interruption: Option<String>,
    pub recovered_at: i64,
    /// Who recovered it, from which worker, and why.
    pub recovery: String,
    /// The worker that ran the first step started after the recovery, and when.
    pub resumed_by: Option<String>,
    pub resumed_at: Option<i64>,
}

/// The interruptions `events` record (a deploy's and its passes' events, one recovery
/// counted once), oldest first, each with the first of `steps` started after it.
pub fn interruptions<'a>(
    events: impl IntoIterator<Item = &'a EventRecord>,
    steps: &[StepRecord],
) -> Vec<InterruptionView> {
    let text =
        |value: &str| serde_json::from_str::<String>(value).unwrap_or_else(|_| value.to_string());
    let mut recoveries = BTreeMap::new();
    let mut interrupted = HashMap::new();
    for e in events {
        if let Some(at) = e.key.strip_prefix("recovery:") {
            recoveries
                .entry((e.updated_at_ms, at.to_string()))
                .or_insert_with(|| text(&e.value));
        } else if let Some(at) = e.key.strip_prefix("interrupted:") {
            interrupted.insert(at.to_string(), (e.updated_at_ms, text(&e.value)));
        }
    }
    recoveries
        .into_iter()
        .map(|((recovered_at, key), recovery)| {
            let (interrupted_at, interruption) = interrupted.remove(&key).unzip();
            let resumed = steps
                .iter()
                .filter(|s| s.started_at_ms >= recovered_at)
                .min_by_key(|s| s.started_at_ms);
            InterruptionView {
                interrupted_at,
                interruption,
                recovered_at,
                recovery,
                resumed_by: resumed.map(|s| s.executor_id.clone()),
                resumed_at: resumed.map(|s| s.started_at_ms),
            }
        })
        .collect()
}

/// The waves `eff` deploys, as status shows them.
pub fn waves(eff: &EffectiveDescriptor) -> Vec<WaveView> {
    plan_waves(eff)
        .into_iter()
        .map(|w| WaveView {
            name: w.name,
            targets: w.targets.into_iter().map(|t| t.name).collect(),
        })
        .collect()
}

/// A deploy's region passes and what they recorded, read in a constant number of queries
/// plus one per pass (its steps).
pub struct Passes {
    pub views: Vec<PassView>,
    /// Every pass's steps, in pass order.
    pub steps: Vec<StepRecord>,
    /// Every pass's events (its targets' progress before the deploy republishes them).
    pub events: Vec<EventRecord>,
    /// The prunes the deploy and its passes started after their targets (deploy workflow
    /// version 8, docs/containers.md), oldest first, each with its steps: they may still
    /// run once the deploy has ended.
    pub prunes: Vec<(WorkflowRecord, Vec<StepRecord>)>,
}

/// The passes deploy `id` started (none unless it is region-routed), oldest first.
pub async fn passes(client: &Client, id: &str, queue: &str) -> Result<Passes, EngineError> {
    let mut children = pass_records(client, id).await?;
    // Started in this order (`<deploy id>.<position>`); the time first, as positions of
    // later waves are larger anyway.
    children.sort_by_key(|c| {
        let position =
            c.id.rsplit_once('.')
                .and_then(|(_, n)| n.parse::<i64>().ok());
        (c.created_at_ms, position)
    });
    let ids: Vec<String> = children.iter().map(|c| c.id.clone()).collect();
    let mut events_by_id = if ids.is_empty() {
        HashMap::new()
    } else {
        client.events_of(&ids).await?
    };
    let mut passes = Passes {
        views: Vec::new(),
        steps: Vec::new(),
        events: Vec::new(),
        prunes: Vec::new(),
    };
    for child in &children {
        let request: Option<PassRequest> = serde_json::from_str(&child.input).ok();
        let Some(request) = request else {
            return Err(EngineError::Unreadable {
                kind: "region pass",
                id: child.id.clone(),
                error: "its input is not a pass request".into(),
            });
        };
        passes.views.push(PassView {
            id: child.id.clone(),
            region: child
                .queue
                .strip_prefix(&format!("{queue}."))
                .unwrap_or(&child.queue)
                .to_string(),
            action: match request.mode {
                PassMode::Deploy => PassAction::Deploy,
                PassMode::Rollback { .. } => PassAction::Rollback,
            },
            status: child.status,
            executor_id: child.executor_id.clone(),
            targets: request.targets,
            started_at: child.started_at_ms.map(rfc3339),
            finished_at: child
                .finished_at_ms
                .filter(|_| child.status.is_terminal())
                .map(rfc3339),
        });
        passes.steps.extend(client.steps(&child.id).await?);
        passes
            .events
            .extend(events_by_id.remove(&child.id).unwrap_or_default());
    }
    for prune in prune_records(client, id, &ids).await? {
        let steps = client.steps(&prune.id).await?;
        passes.prunes.push((prune, steps));
    }
    Ok(passes)
}

/// The prunes (`manent.containers.prune`) deploy `id` and its passes `passes` started,
/// oldest first: none before deploy workflow version 8 or under another plugin.
async fn prune_records(
    client: &Client,
    id: &str,
    passes: &[String],
) -> Result<Vec<WorkflowRecord>, EngineError> {
    let mut all = Vec::new();
    for parent in std::iter::once(id).chain(passes.iter().map(String::as_str)) {
        all.extend(
            client
                .list(&WorkflowFilter {
                    parent_id: Some(parent.to_string()),
                    name: Some(crate::request::PRUNE_WORKFLOW.into()),
                    ..Default::default()
                })
                .await?,
        );
    }
    all.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
    Ok(all)
}

/// What deploy `id`, its passes and its prunes printed after `after`, oldest first, at
/// most `limit` lines: `seq` is one sequence for every workflow, so the lines of the deploy
/// and its children merge in print order.
pub async fn output(
    client: &Client,
    id: &str,
    after: i64,
    limit: i64,
) -> Result<Vec<OutputLine>, EngineError> {
    let mut lines = client.output(id, after, limit).await?;
    let passes: Vec<String> = pass_records(client, id)
        .await?
        .into_iter()
        .map(|p| p.id)
        .collect();
    for child in &passes {
        lines.extend(client.output(child, after, limit).await?);
    }
    for prune in prune_records(client, id, &passes).await? {
        lines.extend(client.output(&prune.id, after, limit).await?);
    }
    lines.sort_by_key(|l| l.seq);
    lines.truncate(usize::try_from(limit).unwrap_or(0));
    Ok(lines)
}

async fn pass_records(client: &Client, id: &str) -> Result<Vec<WorkflowRecord>, EngineError> {
    client
        .list(&WorkflowFilter {
            parent_id: Some(id.to_string()),
            name: Some(PASS_WORKFLOW.into()),
            ..Default::default()
        })
        .await
}
