//! Workflow versions on both backends: a workflow runs only on an executor whose code can
//! replay the version it started under (claims, resumption at start, hand-back), and new
//! workflows start under the newest version every live executor runs (ARCHITECTURE.md,
//! "Workflow versions").

use std::{sync::Arc, time::Duration};

use manent_engine::{
    Client, Database, Engine, EngineConfig, EnqueueRequest, QueueSpec, WorkflowContext,
    WorkflowStatus, WorkflowVersions, store,
};
use manent_testkit::{Db, TestDb, on_both_backends};
use tokio::sync::Notify;

const WAIT: Duration = Duration::from_secs(60);

on_both_backends!(
    a_workflow_is_claimed_only_by_an_executor_that_runs_its_version,
    a_partition_waits_whole_behind_a_workflow_of_another_version,
    new_workflows_start_under_the_newest_version_every_live_executor_runs,
    an_executor_that_cannot_replay_a_workflow_it_holds_hands_it_back,
    a_child_workflow_runs_under_its_parents_version,
);

/// An executor `id` running versions `min..=max` of workflow `w`, whose steps differ by
/// version: version 1 records `one`, version 2 records `one` then `two`, and each returns
/// the version it ran.
async fn executor(db: &TestDb, id: &str, min: u32, max: u32) -> Engine {
    let mut config = EngineConfig::new(id);
    config.stale_after = Duration::from_secs(2);
    config.heartbeat_interval = Duration::from_millis(200);
    config.workflow_versions = WorkflowVersions::new(min, max).expect("a valid range");
    let engine = Engine::new(
        Database::from(store::open(&db.url).await.expect("open the test database")),
        config,
    );
    engine.register("w", |ctx: WorkflowContext, _: ()| async move {
        ctx.step("one", || async { Ok::<_, String>(()) }).await?;
        if ctx.workflow_version() >= 2 {
            ctx.step("two", || async { Ok::<_, String>(()) }).await?;
        }
        Ok(ctx.workflow_version())
    });
    engine.listen(QueueSpec::new("q").partition_concurrency(1));
    engine
}

async fn enqueue(client: &Client, partition: &str, version: u32) -> String {
    client
        .enqueue(
            EnqueueRequest::new("w", "q", ())
                .partition(partition)
                .version(version),
        )
        .await
        .expect("enqueue")
        .id
}

async fn status(client: &Client, id: &str) -> WorkflowStatus {
    client
        .get(id)
        .await
        .expect("read the workflow")
        .expect("the workflow exists")
        .status
}

/// Waits for `id` to succeed and returns the version its code ran and its executor.
async fn finished(client: &Client, id: &str) -> (u32, Option<String>) {
    let record = client.wait(id, WAIT).await.expect("the workflow ends");
    assert_eq!(
        record.status,
        WorkflowStatus::Success,
        "workflow {id} succeeds: {:?}",
        record.error
    );
    let ran: u32 = serde_json::from_str(record.output.as_deref().unwrap_or("null"))
        .expect("the workflow returns the version it ran");
    (ran, record.executor_id)
}

async fn a_workflow_is_claimed_only_by_an_executor_that_runs_its_version(db: Db) {
    let db = TestDb::new(db).await;
    let old = executor(&db, "old", 1, 1).await;
    old.launch().await.expect("launch the old executor");
    let client = old.client();
    let newer = enqueue(&client, "a", 2).await;
    // Enqueued after the version-2 workflow, so every claim that takes it has read the
    // version-2 one first and left it.
    let sentinel = enqueue(&client, "b", 1).await;
    assert_eq!(
        finished(&client, &sentinel).await,
        (1, Some("old".into())),
        "the old executor runs version 1"
    );
    assert_eq!(
        status(&client, &newer).await,
        WorkflowStatus::Enqueued,
        "a version-2 workflow waits: the only live executor runs version 1 only"
    );

    let new = executor(&db, "new", 1, 2).await;
    new.launch().await.expect("launch the new executor");
    assert_eq!(
        finished(&client, &newer).await,
        (2, Some("new".into())),
        "the executor that runs version 2 takes it, and its code branches on the version"
    );
    let steps = client.steps(&newer).await.expect("read the steps");
    assert_eq!(
        steps.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["one", "two"],
        "version 2's steps were recorded"
    );
    old.shutdown(WAIT).await;
    new.shutdown(WAIT).await;
}

async fn a_partition_waits_whole_behind_a_workflow_of_another_version(db: Db) {
    let db = TestDb::new(db).await;
    let old = executor(&db, "old", 1, 1).await;
    old.launch().await.expect("launch the old executor");
    let client = old.client();
    let head = enqueue(&client, "p", 2).await;
    let behind = enqueue(&client, "p", 1).await;
    let sentinel = enqueue(&client, "other", 1).await;
    finished(&client, &sentinel).await;
    assert_eq!(
        status(&client, &behind).await,
        WorkflowStatus::Enqueued,
        "a partition's workflows start in order: the version-1 workflow behind a version-2 \
         one is not taken before it"
    );
    let new = executor(&db, "new", 1, 2).await;
    new.launch().await.expect("launch the new executor");
    assert_eq!(
        finished(&client, &head).await.0,
        2,
        "the head runs as version 2"
    );
    assert_eq!(
        finished(&client, &behind).await.0,
        1,
        "then the workflow behind it, as version 1"
    );
    old.shutdown(WAIT).await;
    new.shutdown(WAIT).await;
}

async fn new_workflows_start_under_the_newest_version_every_live_executor_runs(db: Db) {
    let db = TestDb::new(db).await;
    let client = Client::new(Database::from(store::open(&db.url).await.expect("open")));
    assert_eq!(
        client
            .startable_version(2)
            .await
            .expect("read the executors"),
        2,
        "with no live executor, the caller's newest version"
    );
    let new = executor(&db, "new", 1, 2).await;
    new.launch().await.expect("launch");
    assert_eq!(
        client
            .startable_version(2)
            .await
            .expect("read the executors"),
        2,
        "every live executor runs version 2"
    );
    assert_eq!(
        client
            .startable_version(3)
            .await
            .expect("read the executors"),
        2,
        "never newer than the newest a live executor runs"
    );
    let old = executor(&db, "old", 1, 1).await;
    old.launch().await.expect("launch");
    assert_eq!(
        client
            .startable_version(2)
            .await
            .expect("read the executors"),
        1,
        "during a rolling upgrade an old executor is live: new work starts as version 1, \
         which it can replay"
    );
    old.shutdown(WAIT).await;
    assert_eq!(
        client
            .startable_version(2)
            .await
            .expect("read the executors"),
        2,
        "a stopped executor counts no more"
    );
    new.shutdown(WAIT).await;
}

async fn an_executor_that_cannot_replay_a_workflow_it_holds_hands_it_back(db: Db) {
    let db = TestDb::new(db).await;
    let started = Arc::new(Notify::new());
    let gate = Arc::new(Notify::new());
    let holding = executor(&db, "w1", 1, 2).await;
    {
        let (started, gate) = (started.clone(), gate.clone());
        // Re-registered: this run blocks in its first step until the gate opens.
        holding.register("w", move |ctx: WorkflowContext, _: ()| {
            let (started, gate) = (started.clone(), gate.clone());
            async move {
                ctx.step("one", || async {
                    started.notify_one();
                    gate.notified().await;
                    Ok::<_, String>(())
                })
                .await?;
                Ok(ctx.workflow_version())
            }
        });
    }
    holding.launch().await.expect("launch");
    let client = holding.client();
    let id = enqueue(&client, "p", 2).await;
    started.notified().await;
    // Stopped mid-step: the workflow stays PENDING under w1.
    let report = holding.shutdown(Duration::ZERO).await;
    assert_eq!(
        report.left_pending,
        vec![id.clone()],
        "left pending under w1"
    );

    // w1 comes back as an older build (a downgrade): it cannot replay version 2.
    let downgraded = executor(&db, "w1", 1, 1).await;
    downgraded.launch().await.expect("launch the downgraded w1");
    manent_testkit::eventually(
        "the downgraded worker hands the version-2 workflow back to its queue",
        WAIT,
        || async { (status(&client, &id).await == WorkflowStatus::Enqueued).then_some(()) },
    )
    .await;

    let able = executor(&db, "w2", 1, 2).await;
    able.launch().await.expect("launch w2");
    assert_eq!(
        finished(&client, &id).await,
        (2, Some("w2".into())),
        "a worker that runs version 2 finishes it"
    );
    downgraded.shutdown(WAIT).await;
    able.shutdown(WAIT).await;
}

async fn a_child_workflow_runs_under_its_parents_version(db: Db) {
    let db = TestDb::new(db).await;
    let engine = executor(&db, "new", 1, 2).await;
    engine.register("parent", |ctx: WorkflowContext, _: ()| async move {
        let child = ctx.start_child("w", "q", Some("child"), ()).await?;
        let ran: u32 = ctx.await_workflow(&child).await?;
        Ok(ran)
    });
    engine.launch().await.expect("launch");
    let client = engine.client();
    let parent = client
        .enqueue(EnqueueRequest::new("parent", "q", ()).version(2))
        .await
        .expect("enqueue")
        .id;
    let record = client.wait(&parent, WAIT).await.expect("the parent ends");
    assert_eq!(
        record.status,
        WorkflowStatus::Success,
        "the parent succeeds: {:?}",
        record.error
    );
    let children = client
        .list(&manent_engine::WorkflowFilter {
            parent_id: Some(parent.clone()),
            ..Default::default()
        })
        .await
        .expect("list the children");
    assert_eq!(
        children
            .iter()
            .map(|c| c.workflow_version)
            .collect::<Vec<_>>(),
        [2],
        "the child started under its parent's version"
    );
    engine.shutdown(WAIT).await;
}
