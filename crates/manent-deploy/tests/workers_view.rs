//! What `manent workers`, the Platform page and `/metrics` say of a worker: its recorded
//! state while it heartbeats, `dead` once it is silent past `recovery.stale_after` without a
//! recorded stop (killed, frozen, cut off), and nothing at all once it has been stopped or
//! dead for longer than `recovery.forget_after`, unless it still holds deploys. A dead
//! worker's step is interrupted, not running, and its deploy says what it waits for.

mod common;

use manent_config::Config;
use manent_deploy::{
    DEPLOY_WORKFLOW,
    views::deploy_views::{self, StepState},
    views::platform::{self, WorkerState},
};
use manent_engine::{
    Client, Database, Engine, EngineConfig, EnqueueRequest, ExecutorRecord, ExecutorState,
    QueueSpec, StepRecord, StepStatus, WorkflowStatus, WorkflowVersions, now_ms,
    store::{self, Checkpoint, ClaimLimits},
};
use manent_testkit::{Db, TestDb, on_both_backends};

on_both_backends!(
    workers_are_live_dead_or_stopped_and_long_gone_ones_are_forgotten,
    a_dead_workers_step_is_interrupted_and_its_deploy_says_what_it_waits_for,
    a_deploy_no_live_worker_can_replay_waits_and_says_which_version_it_needs,
);

const LIMITS: ClaimLimits = ClaimLimits {
    worker: 1,
    partition: None,
    global: 0,
    group: None,
};

const MINUTE: i64 = 60_000;

/// A configuration on `test`'s database, with `extra` YAML after the database.
fn config(test: &TestDb, extra: &str) -> Config {
    Config::from_yaml_str(
        &format!(
            "database: {{url: {}}}\n{extra}",
            serde_json::to_string(&test.url).unwrap()
        ),
        "manent.yml",
        std::iter::empty(),
    )
    .expect("a valid configuration")
}
const DAY: i64 = 24 * 60 * MINUTE;

fn executor(id: &str, state: ExecutorState, heartbeat_at_ms: i64) -> ExecutorRecord {
    ExecutorRecord {
        id: id.into(),
        host: "node".into(),
        pid: 1,
        region: None,
        queues: vec!["q".into()],
        state,
        started_at_ms: heartbeat_at_ms - MINUTE,
        heartbeat_at_ms,
        stopped_at_ms: (state == ExecutorState::Stopped).then_some(heartbeat_at_ms),
        version: "0.1.0".into(),
        workflow_versions: WorkflowVersions::FIRST,
        running: 0,
    }
}

async fn workers_are_live_dead_or_stopped_and_long_gone_ones_are_forgotten(db: Db) {
    let test = TestDb::new(db).await;
    let store = store::open(&test.url)
        .await
        .expect("open the test database");
    let config = config(&test, "recovery: {stale_after: 30s, forget_after: 7d}\n");
    let now = now_ms();
    for record in [
        executor("live", ExecutorState::Running, now),
        executor("draining", ExecutorState::Draining, now),
        executor("killed", ExecutorState::Running, now - 10 * MINUTE),
        executor("stopped", ExecutorState::Stopped, now - DAY),
        executor("stopped-long-ago", ExecutorState::Stopped, now - 30 * DAY),
        executor("dead-long-ago", ExecutorState::Running, now - 30 * DAY),
        executor(
            "dead-long-ago-holding",
            ExecutorState::Draining,
            now - 30 * DAY,
        ),
    ] {
        store
            .upsert_executor(&record)
            .await
            .expect("record a worker");
    }
    // A deploy still held by a worker that died a month ago: someone must recover it.
    let client = Client::new(Database::from(store.clone()));
    client
        .enqueue(EnqueueRequest::new("manent.deploy", "q", ()))
        .await
        .expect("enqueue");
    let held = store
        .claim(
            "q",
            "dead-long-ago-holding",
            WorkflowVersions::FIRST,
            LIMITS,
            now,
            1,
        )
        .await
        .expect("claim under the dead worker's id");
    assert_eq!(held.len(), 1, "the dead worker holds one deploy");

    let shown: Vec<(String, WorkerState, bool)> = platform::workers(&client, &config)
        .await
        .expect("list the workers")
        .into_iter()
        .map(|w| (w.executor_id, w.state, w.stale))
        .collect();
    let expected = [
        ("dead-long-ago-holding", WorkerState::Dead, true),
        ("draining", WorkerState::Draining, false),
        ("killed", WorkerState::Dead, true),
        ("live", WorkerState::Running, false),
        ("stopped", WorkerState::Stopped, false),
    ];
    let mut sorted = shown.clone();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        sorted,
        expected
            .iter()
            .map(|(id, state, stale)| (id.to_string(), *state, *stale))
            .collect::<Vec<_>>(),
        "live workers show what they recorded, silent ones are dead, and those gone for \
         longer than forget_after are left out unless they hold a deploy: {shown:?}"
    );

    let metrics = manent_deploy::views::metrics::Metrics::new()
        .render(&client, &config, |_| {})
        .await
        .expect("render the metrics");
    for (id, up) in [("live", 1), ("killed", 0), ("dead-long-ago-holding", 0)] {
        assert!(
            metrics.contains(&format!("manent_worker_up{{executor_id=\"{id}\"}} {up}")),
            "{id} is up={up} in /metrics:\n{metrics}"
        );
    }
    assert!(
        !metrics.contains("stopped-long-ago"),
        "a forgotten worker is not in /metrics either:\n{metrics}"
    );
}

async fn a_dead_workers_step_is_interrupted_and_its_deploy_says_what_it_waits_for(db: Db) {
    let test = TestDb::new(db).await;
    let store = store::open(&test.url)
        .await
        .expect("open the test database");
    let client = Client::new(Database::from(store.clone()));
    let now = now_ms();
    let last_heard = now - 10 * MINUTE;
    // Killed mid-step: it recorded "running" and never a stop; it holds no live lease.
    store
        .upsert_executor(&executor("killed", ExecutorState::Running, last_heard))
        .await
        .expect("record the worker");
    let deploy = client
        .enqueue(EnqueueRequest::new(
            DEPLOY_WORKFLOW,
            "q",
            common::recorded_request("shop/web", "q", false),
        ))
        .await
        .expect("enqueue a deploy");
    let claimed = store
        .claim(
            "q",
            "killed",
            WorkflowVersions::FIRST,
            LIMITS,
            last_heard,
            1,
        )
        .await
        .expect("the worker claimed it");
    let lease = claimed[0].lease().expect("a claimed deploy has a lease");
    let step = StepRecord {
        workflow_id: deploy.id.clone(),
        index: 0,
        name: "t1: upload app.tar.gz".into(),
        status: StepStatus::Running,
        output: None,
        error: None,
        attempts: 1,
        started_at_ms: last_heard - MINUTE,
        finished_at_ms: None,
        executor_id: "killed".into(),
    };
    assert_eq!(
        store
            .record_step(&lease, &step)
            .await
            .expect("record the step"),
        Checkpoint::Written,
        "the step started under the worker's lease"
    );

    let status = deploy_views::status(&client, &deploy.id)
        .await
        .expect("read the deploy")
        .expect("the deploy exists");
    let shown = status
        .steps
        .iter()
        .find(|s| s.name == step.name)
        .expect("the step is shown");
    assert_eq!(
        shown.status,
        StepState::Interrupted,
        "a step whose worker is gone is interrupted, not running: {shown:?}"
    );
    assert_eq!(
        shown.finished_at.as_deref(),
        Some(manent_deploy::request::rfc3339(last_heard).as_str()),
        "its bar ends when its worker was last heard of: {shown:?}"
    );
    let waiting = status.waiting_for.as_deref().unwrap_or_default();
    assert!(
        waiting.contains("worker killed") && waiting.contains("it is dead"),
        "the deploy waits for its dead worker, and says so: {waiting}"
    );
}

async fn a_deploy_no_live_worker_can_replay_waits_and_says_which_version_it_needs(db: Db) {
    let test = TestDb::new(db).await;
    let store = store::open(&test.url)
        .await
        .expect("open the test database");
    let config = config(&test, "");
    // A live worker of a release that runs deploy workflow version 1 only.
    let mut engine_config = EngineConfig::new("old");
    engine_config.workflow_versions = WorkflowVersions::FIRST;
    let worker = Engine::new(Database::from(store.clone()), engine_config);
    worker.listen(QueueSpec::new("q"));
    worker.launch().await.expect("launch the worker");
    let client = Client::new(Database::from(store.clone()));
    // Recorded by a newer release, under version 2 (a rolling downgrade left it behind).
    let deploy = client
        .enqueue(
            EnqueueRequest::new(
                DEPLOY_WORKFLOW,
                "q",
                common::recorded_request("shop/web", "q", false),
            )
            .version(2),
        )
        .await
        .expect("enqueue a deploy");

    let status = deploy_views::status(&client, &deploy.id)
        .await
        .expect("read the deploy")
        .expect("the deploy exists");
    let waiting = status.waiting_for.as_deref().unwrap_or_default();
    assert!(
        waiting.contains("deploy workflow version 2") && waiting.contains("old (1)"),
        "the deploy says which version it needs and what the live worker runs: {waiting}"
    );
    let metrics = manent_deploy::views::metrics::Metrics::new()
        .render(&client, &config, |_| {})
        .await
        .expect("render the metrics");
    assert!(
        metrics.contains("manent_deploys_waiting_for_workflow_version{version=\"2\"} 1"),
        "/metrics counts the deploy that waits for a worker of its version:\n{metrics}"
    );
    assert_eq!(
        client
            .get(&deploy.id)
            .await
            .expect("read the deploy")
            .expect("the deploy exists")
            .status,
        WorkflowStatus::Enqueued,
        "it waits, never failed: the worker left it queued"
    );
    worker.shutdown(std::time::Duration::from_secs(10)).await;
}
