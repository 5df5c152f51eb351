//! Claims under limit groups (limits several queues share), claims that skip
//! full partitions at the head of a long backlog, and bulk enqueues, on both
//! backends, through the store and the client directly.

use std::sync::Arc;

use manent_engine::{
    Client, Database, EngineError, EnqueueRequest, LimitGroup, WorkflowStatus, now_ms,
    store::{self, ClaimLimits, Store},
};
use manent_testkit::{Db, TestDb};

use manent_testkit::on_both_backends;

on_both_backends!(
    a_group_worker_limit_counts_every_queue_of_the_group,
    a_group_global_limit_counts_every_executor_and_queue,
    a_partition_running_on_one_queue_of_a_group_blocks_it_on_the_others,
    a_queue_cap_holds_on_top_of_its_group,
    a_claim_finds_free_partitions_behind_a_long_full_one,
    a_bulk_enqueue_creates_all_and_reports_existing_ids,
);

async fn open(db: &TestDb) -> Arc<dyn Store> {
    store::open(&db.url).await.expect("open the test database")
}

fn group(worker: Option<u32>, partition: Option<u32>, global: Option<u32>) -> ClaimLimits {
    ClaimLimits {
        worker: 100,
        partition: None,
        global: 0,
        group: Some(LimitGroup {
            name: "deploys".into(),
            worker,
            partition,
            global,
        }),
    }
}

async fn enqueue(client: &Client, queue: &str, partition: &str) -> String {
    client
        .enqueue(EnqueueRequest::new("w", queue, ()).partition(partition))
        .await
        .expect("enqueue")
        .id
}

async fn claim(store: &Arc<dyn Store>, queue: &str, executor: &str, limits: ClaimLimits) -> usize {
    store
        .claim(
            queue,
            executor,
            manent_engine::WorkflowVersions::FIRST,
            limits,
            now_ms(),
            64,
        )
        .await
        .expect("claim")
        .len()
}

async fn a_group_worker_limit_counts_every_queue_of_the_group(db: Db) {
    let db = TestDb::new(db).await;
    let store = open(&db).await;
    let client = Client::new(Database::from(store.clone()));
    for i in 0..4 {
        enqueue(&client, "a", &format!("a{i}")).await;
        enqueue(&client, "b", &format!("b{i}")).await;
    }
    let limits = group(Some(3), None, None);
    assert_eq!(
        claim(&store, "a", "w1", limits.clone()).await,
        3,
        "w1 may run 3 over the group"
    );
    assert_eq!(
        claim(&store, "b", "w1", limits.clone()).await,
        0,
        "queue b is in the same group: w1 is full"
    );
    assert_eq!(
        claim(&store, "b", "w2", limits).await,
        3,
        "another executor has its own 3"
    );
}

async fn a_group_global_limit_counts_every_executor_and_queue(db: Db) {
    let db = TestDb::new(db).await;
    let store = open(&db).await;
    let client = Client::new(Database::from(store.clone()));
    for i in 0..4 {
        enqueue(&client, "a", &format!("a{i}")).await;
        enqueue(&client, "b", &format!("b{i}")).await;
    }
    let limits = group(Some(2), None, Some(3));
    assert_eq!(
        claim(&store, "a", "w1", limits.clone()).await,
        2,
        "w1 takes two, its limit"
    );
    assert_eq!(
        claim(&store, "b", "w2", limits.clone()).await,
        1,
        "3 in total over the group: 2 run on a"
    );
    assert_eq!(
        claim(&store, "a", "w3", limits).await,
        0,
        "the group is full"
    );
}

async fn a_partition_running_on_one_queue_of_a_group_blocks_it_on_the_others(db: Db) {
    let db = TestDb::new(db).await;
    let store = open(&db).await;
    let client = Client::new(Database::from(store.clone()));
    enqueue(&client, "a", "app/prod").await;
    let blocked = enqueue(&client, "b", "app/prod").await;
    let other = enqueue(&client, "b", "app/staging").await;
    let limits = group(None, Some(1), None);
    assert_eq!(
        claim(&store, "a", "w1", limits.clone()).await,
        1,
        "w1 takes one more once a slot frees"
    );
    let claimed = store
        .claim(
            "b",
            "w2",
            manent_engine::WorkflowVersions::FIRST,
            limits,
            now_ms(),
            64,
        )
        .await
        .unwrap();
    let ids: Vec<&str> = claimed.iter().map(|w| w.id.as_str()).collect();
    assert_eq!(
        ids,
        vec![other.as_str()],
        "app/prod runs on queue a: its deploy on b waits, app/staging does not"
    );
    let waiting = store.get_workflow(&blocked).await.unwrap().unwrap();
    assert_eq!(
        waiting.status,
        WorkflowStatus::Enqueued,
        "the workflow over the limit stays queued"
    );
}

async fn a_queue_cap_holds_on_top_of_its_group(db: Db) {
    let db = TestDb::new(db).await;
    let store = open(&db).await;
    let client = Client::new(Database::from(store.clone()));
    for i in 0..5 {
        enqueue(&client, "gpu", &format!("g{i}")).await;
    }
    let mut limits = group(Some(10), None, None);
    limits.worker = 2;
    limits.global = 2;
    assert_eq!(
        claim(&store, "gpu", "w1", limits.clone()).await,
        2,
        "gpu's own cap"
    );
    assert_eq!(
        claim(&store, "gpu", "w2", limits).await,
        0,
        "gpu's cap is in total, whatever the group leaves"
    );
}

async fn a_claim_finds_free_partitions_behind_a_long_full_one(db: Db) {
    let db = TestDb::new(db).await;
    let store = open(&db).await;
    let client = Client::new(Database::from(store.clone()));
    // 300 workflows of one partition first, then 5 of other partitions.
    let mut batch: Vec<EnqueueRequest> = (0..300)
        .map(|_| EnqueueRequest::new("w", "q", ()).partition("busy"))
        .collect();
    batch.extend((0..5).map(|i| EnqueueRequest::new("w", "q", ()).partition(format!("p{i}"))));
    client.enqueue_many(batch).await.unwrap();
    let limits = ClaimLimits {
        worker: 4,
        partition: Some(1),
        global: 0,
        group: None,
    };
    let first = store
        .claim(
            "q",
            "w1",
            manent_engine::WorkflowVersions::FIRST,
            limits.clone(),
            now_ms(),
            64,
        )
        .await
        .unwrap();
    let partitions: Vec<&str> = first.iter().map(|w| w.partition_key.as_str()).collect();
    assert_eq!(
        partitions,
        vec!["busy", "p0", "p1", "p2"],
        "one of the busy partition, then the next free partitions in order"
    );
    let second = store
        .claim(
            "q",
            "w2",
            manent_engine::WorkflowVersions::FIRST,
            limits,
            now_ms(),
            64,
        )
        .await
        .unwrap();
    let partitions: Vec<&str> = second.iter().map(|w| w.partition_key.as_str()).collect();
    assert_eq!(
        partitions,
        vec!["p3", "p4"],
        "the 299 left of the running busy partition are passed over"
    );
}

async fn a_bulk_enqueue_creates_all_and_reports_existing_ids(db: Db) {
    let db = TestDb::new(db).await;
    let store = open(&db).await;
    let client = Client::new(Database::from(store.clone()));
    let existing = client
        .enqueue(EnqueueRequest::new("w", "q", ()).id("taken"))
        .await
        .unwrap();
    let mut batch: Vec<EnqueueRequest> = (0..1200)
        .map(|i| EnqueueRequest::new("w", "q", i).id(format!("bulk-{i}")))
        .collect();
    batch.push(EnqueueRequest::new("w", "q", ()).id("taken"));
    batch.push(EnqueueRequest::new("other", "q", ()).id("taken"));
    let outcomes = client.enqueue_many(batch).await.unwrap();
    assert_eq!(outcomes.len(), 1202, "one outcome per request");
    assert!(
        outcomes[..1200].iter().all(|o| o
            .as_ref()
            .is_ok_and(|w| w.status == WorkflowStatus::Enqueued)),
        "1,200 new workflows, over several statements"
    );
    assert_eq!(
        outcomes[1200].as_ref().unwrap().created_at_ms,
        existing.created_at_ms,
        "an existing id of the same workflow returns the existing one"
    );
    assert!(
        matches!(outcomes[1201], Err(EngineError::IdConflict { .. })),
        "an existing id of another workflow is a conflict: {:?}",
        outcomes[1201]
    );
    let depth = client.queue_depths().await.unwrap();
    assert_eq!(depth[0].enqueued, 1201, "all stored: {depth:?}");
}
