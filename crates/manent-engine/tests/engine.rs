//! Engine behaviour on both backends, in one process: replay, limits, dedup,
//! scheduling, messages, events, children, cancel/resume, recovery, fencing
//! and the duplicate-id rule. Multi-process tests live in `processes.rs`.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use manent_engine::{
    Client, Engine, EngineConfig, EngineError, EnqueueRequest, QueueSpec, RecordEntry, StepPolicy,
    StepStatus, Store, TimeWindow, WorkflowContext, WorkflowError, WorkflowStatus, now_ms, store,
};
use manent_testkit::{Db, TestDb};
use tokio::sync::Notify;

const WAIT: Duration = Duration::from_secs(60);

/// Generates one `#[tokio::test]` per backend for each listed test body.
use manent_testkit::on_both_backends;

on_both_backends!(
    replay_skips_completed_steps_and_reruns_the_interrupted_one,
    limits_hold_with_several_engines_claiming_at_once,
    a_deduplication_key_admits_one_active_workflow,
    a_workflow_id_makes_a_start_idempotent,
    an_enqueue_wakes_the_claimers_of_another_store_once_it_is_committed,
    a_workflow_does_not_start_before_its_not_before_time,
    messages_reach_recv_and_events_reach_clients,
    recv_times_out_durably,
    children_run_on_their_own_queue_and_return_results,
    cancel_stops_a_run_and_resume_continues_it,
    a_changed_step_sequence_fails_loudly_as_non_determinism,
    manual_recovery_hands_work_to_another_executor_and_fences_the_first,
    automatic_recovery_takes_over_a_stale_executor,
    a_duplicate_executor_id_is_refused_while_the_first_is_alive,
    a_stopped_executor_id_is_reused_at_once,
    step_retries_follow_the_policy_and_record_attempts,
    drain_finishes_short_work_and_leaves_long_work_pending,
    concurrent_migrations_on_an_empty_database_all_succeed,
    higher_priority_runs_first,
    a_panicking_workflow_ends_in_error,
    records_are_kept_replaced_listed_and_deleted,
    records_written_together_are_inserted_all_or_none_and_deleted_together,
    audit_entries_are_appended_and_listed_newest_first,
    audit_filters_and_the_cursor_reach_past_thousands_of_newer_entries,
    branches_replay_whatever_order_they_completed_in,
    a_workflow_moved_to_another_queue_goes_on_there_under_its_limits,
    a_draining_executor_hands_its_durable_waits_back_to_the_queue,
    cancelling_a_parent_stops_its_running_step_and_cancels_its_children,
    recovering_an_unknown_executor_is_an_error,
    the_events_of_many_workflows_are_read_at_once,
    what_finished_or_started_in_a_window_is_read_oldest_first,
);

async fn open(db: &TestDb) -> Arc<dyn Store> {
    store::open(&db.url).await.expect("open the test database")
}

fn config(id: &str) -> EngineConfig {
    let mut c = EngineConfig::new(id);
    c.stale_after = Duration::from_secs(2);
    c.heartbeat_interval = Duration::from_millis(200);
    c
}

async fn engine(db: &TestDb, id: &str) -> Engine {
    Engine::new(open(db).await, config(id))
}

/// A gate a workflow step waits on, opened by the test.
#[derive(Clone, Default)]
struct Gate {
    open: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Gate {
    fn new() -> Self {
        Gate {
            open: Arc::new(tokio::sync::watch::channel(false).0),
        }
    }
    fn open(&self) {
        self.open.send_replace(true);
    }
    async fn wait(&self) {
        let mut rx = self.open.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// Counts how often each named step body ran.
#[derive(Clone, Default)]
struct Ledger(Arc<Mutex<HashMap<String, usize>>>);

impl Ledger {
    fn hit(&self, name: &str) {
        *self.0.lock().unwrap().entry(name.to_string()).or_default() += 1;
    }
    fn count(&self, name: &str) -> usize {
        self.0.lock().unwrap().get(name).copied().unwrap_or(0)
    }
}

/// The recovery notes of workflow `id` (its `recovery:` events), which its log shows.
async fn recovery_notes(client: &Client, id: &str) -> Vec<String> {
    client
        .events(id)
        .await
        .unwrap()
        .into_iter()
        .filter(|ev| ev.key.starts_with("recovery:"))
        .map(|ev| ev.value)
        .collect()
}

async fn wait_success(client: &Client, id: &str) -> manent_engine::WorkflowRecord {
    let record = client.wait(id, WAIT).await.expect("workflow ends");
    assert_eq!(
        record.status,
        WorkflowStatus::Success,
        "workflow {id} should succeed; error: {:?}",
        record.error
    );
    record
}

async fn replay_skips_completed_steps_and_reruns_the_interrupted_one(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let ledger = Ledger::default();
    let started_two = Arc::new(Notify::new());
    let gate = Gate::new();

    let register = |engine: &Engine, gate: Gate| {
        let ledger = ledger.clone();
        let started_two = started_two.clone();
        engine.register("three", move |ctx: WorkflowContext, input: u32| {
            let (ledger, started_two, gate) = (ledger.clone(), started_two.clone(), gate.clone());
            async move {
                let a: u32 = ctx
                    .step("one", || async {
                        ledger.hit("one");
                        Ok::<_, String>(input + 1)
                    })
                    .await?;
                let b: u32 = ctx
                    .step("two", || async {
                        ledger.hit("two");
                        started_two.notify_one();
                        gate.wait().await;
                        Ok::<_, String>(a * 10)
                    })
                    .await?;
                let c: u32 = ctx
                    .step("three", || async {
                        ledger.hit("three");
                        Ok::<_, String>(b + 1)
                    })
                    .await?;
                Ok(c)
            }
        });
    };

    let first = engine(&db, "w1").await;
    register(&first, gate.clone());
    first.listen(QueueSpec::new("q"));
    first.launch().await.unwrap();
    let wf = first
        .client()
        .enqueue(EnqueueRequest::new("three", "q", 4u32))
        .await
        .unwrap();
    started_two.notified().await;
    // The executor stops mid-step: the run is cut, the workflow stays PENDING.
    let report = first.shutdown(Duration::ZERO).await;
    assert_eq!(
        report.left_pending,
        vec![wf.id.clone()],
        "the interrupted workflow must be left pending"
    );
    assert_eq!(
        first.client().get(&wf.id).await.unwrap().unwrap().status,
        WorkflowStatus::Pending,
        "an interrupted workflow stays PENDING under its executor"
    );

    let second = engine(&db, "w1").await;
    let gate2 = Gate::new();
    gate2.open();
    register(&second, gate2);
    second.listen(QueueSpec::new("q"));
    second.launch().await.unwrap();
    let done = wait_success(&second.client(), &wf.id).await;
    assert_eq!(done.output.as_deref(), Some("51"), "(4+1)*10+1");
    assert_eq!(ledger.count("one"), 1, "a completed step is never rerun");
    assert_eq!(ledger.count("two"), 2, "the interrupted step reruns once");
    assert_eq!(ledger.count("three"), 1, "later steps run once");
    let steps = second.client().steps(&wf.id).await.unwrap();
    assert_eq!(
        steps.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["one", "two", "three"]
    );
    assert!(
        steps.iter().all(|s| s.status == StepStatus::Success),
        "every step recorded as a success"
    );
    let notes = recovery_notes(&second.client(), &wf.id).await;
    assert!(
        notes.len() == 1 && notes[0].contains("resumed by executor w1"),
        "the resumption after the restart is noted for the workflow's log: {notes:?}"
    );
    second.shutdown(WAIT).await;
}

/// Tracks how many workflows run at once, overall, per partition and per executor.
#[derive(Default)]
struct Running {
    total: usize,
    by_partition: HashMap<String, usize>,
    by_executor: HashMap<String, usize>,
}

#[derive(Default)]
struct Observer {
    now: Mutex<Running>,
    max_global: AtomicUsize,
    max_partition: AtomicUsize,
    max_executor: AtomicUsize,
}

impl Observer {
    fn enter(&self, partition: &str, executor: &str) {
        let mut g = self.now.lock().unwrap();
        g.total += 1;
        let p = {
            let e = g.by_partition.entry(partition.to_string()).or_default();
            *e += 1;
            *e
        };
        let x = {
            let e = g.by_executor.entry(executor.to_string()).or_default();
            *e += 1;
            *e
        };
        self.max_global.fetch_max(g.total, Ordering::SeqCst);
        self.max_partition.fetch_max(p, Ordering::SeqCst);
        self.max_executor.fetch_max(x, Ordering::SeqCst);
    }
    fn leave(&self, partition: &str, executor: &str) {
        let mut g = self.now.lock().unwrap();
        g.total -= 1;
        *g.by_partition.get_mut(partition).unwrap() -= 1;
        *g.by_executor.get_mut(executor).unwrap() -= 1;
    }
}

async fn limits_hold_with_several_engines_claiming_at_once(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let observer = Arc::new(Observer::default());
    let spec = QueueSpec::new("limited")
        .worker_concurrency(2)
        .partition_concurrency(1)
        .global_concurrency(4);
    let mut engines = Vec::new();
    for i in 0..3 {
        let e = engine(&db, &format!("w{i}")).await;
        let obs = observer.clone();
        e.register("observed", move |ctx: WorkflowContext, _: ()| {
            let obs = obs.clone();
            async move {
                let (p, x) = (
                    ctx.partition_key().to_string(),
                    ctx.executor_id().to_string(),
                );
                ctx.step("work", || async {
                    obs.enter(&p, &x);
                    // Hold the slot long enough for other claimers to try to overfill it.
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    obs.leave(&p, &x);
                    Ok::<_, String>(())
                })
                .await
            }
        });
        e.listen(spec.clone());
        engines.push(e);
    }
    let client = engines[0].client();
    let mut ids = Vec::new();
    for i in 0..40 {
        let req =
            EnqueueRequest::new("observed", "limited", ()).partition(format!("app/env{}", i % 5));
        ids.push(client.enqueue(req).await.unwrap().id);
    }
    for e in &engines {
        e.launch().await.unwrap();
    }
    for id in &ids {
        wait_success(&client, id).await;
    }
    assert!(
        observer.max_partition.load(Ordering::SeqCst) <= 1,
        "partition limit 1 exceeded"
    );
    assert!(
        observer.max_global.load(Ordering::SeqCst) <= 4,
        "global limit 4 exceeded"
    );
    assert!(
        observer.max_executor.load(Ordering::SeqCst) <= 2,
        "per-worker limit 2 exceeded"
    );
    assert!(
        observer.max_global.load(Ordering::SeqCst) >= 2,
        "work should have run in parallel at all"
    );
    for e in &engines {
        e.shutdown(WAIT).await;
    }
}

async fn a_deduplication_key_admits_one_active_workflow(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let client = Client::new(open(&db).await);
    let first = client
        .enqueue(EnqueueRequest::new("w", "q", 1).dedup("k"))
        .await
        .unwrap();
    let second = client
        .enqueue(EnqueueRequest::new("w", "q", 2).dedup("k"))
        .await;
    match second {
        Err(EngineError::Deduplicated { existing_id, .. }) => {
            assert_eq!(existing_id, first.id, "names the holder")
        }
        other => panic!("a second active workflow with the key must be refused, got {other:?}"),
    }
    let other_queue = client
        .enqueue(EnqueueRequest::new("w", "q2", 3).dedup("k"))
        .await;
    assert!(other_queue.is_ok(), "the key is per queue");
    client.cancel(&first.id).await.unwrap();
    let again = client
        .enqueue(EnqueueRequest::new("w", "q", 4).dedup("k"))
        .await;
    assert!(
        again.is_ok(),
        "once the holder is no longer active the key is free: {again:?}"
    );
}

async fn a_workflow_id_makes_a_start_idempotent(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let client = Client::new(open(&db).await);
    let a = client
        .enqueue(EnqueueRequest::new("w", "q", 1).id("fixed"))
        .await
        .unwrap();
    let b = client
        .enqueue(EnqueueRequest::new("w", "q", 2).id("fixed"))
        .await
        .unwrap();
    assert_eq!(
        a, b,
        "the second start returns the first workflow unchanged"
    );
    assert_eq!(b.input, "1", "the first input is kept");
    let c = client
        .enqueue(EnqueueRequest::new("other", "q", 1).id("fixed"))
        .await;
    assert!(
        matches!(c, Err(EngineError::IdConflict { .. })),
        "same id, other workflow: refused, got {c:?}"
    );
}

/// Another store on the same database stands for another worker process: on PostgreSQL
/// it hears of the enqueue through NOTIFY, on SQLite through the per-file bus.
async fn an_enqueue_wakes_the_claimers_of_another_store_once_it_is_committed(db: Db) {
    let db = TestDb::new(db).await;
    let enqueuer = open(&db).await;
    let claimer = open(&db).await;
    let mut wakeups = claimer.subscribe();
    let wf = Client::new(enqueuer)
        .enqueue(EnqueueRequest::new("noop", "woken", ()))
        .await
        .unwrap();
    let heard = tokio::time::timeout(WAIT, async {
        loop {
            match wakeups.recv().await {
                Ok(store::Wakeup::Queue(queue)) if queue == "woken" => return queue,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("the wake-up bus closed: {e}"),
            }
        }
    })
    .await
    .expect("the other store hears of the enqueue");
    assert_eq!(heard, "woken");
    assert_eq!(
        claimer
            .get_workflow(&wf.id)
            .await
            .unwrap()
            .map(|w| w.status),
        Some(WorkflowStatus::Enqueued),
        "what woke the other store is committed and visible to it"
    );
}

async fn a_workflow_does_not_start_before_its_not_before_time(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let e = engine(&db, "w").await;
    e.register("stamp", |ctx: WorkflowContext, _: ()| async move {
        ctx.step("now", || async { Ok::<_, String>(now_ms()) })
            .await
    });
    e.listen(QueueSpec::new("q"));
    e.launch().await.unwrap();
    let at = now_ms() + 400;
    let wf = e
        .client()
        .enqueue(EnqueueRequest::new("stamp", "q", ()).not_before(at))
        .await
        .unwrap();
    let done = wait_success(&e.client(), &wf.id).await;
    let ran_at: i64 = done.output.unwrap().parse().unwrap();
    assert!(
        ran_at >= at,
        "ran at {ran_at}, before its not-before time {at}"
    );
    e.shutdown(WAIT).await;
}

async fn messages_reach_recv_and_events_reach_clients(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let e = engine(&db, "w").await;
    e.register("approval", |ctx: WorkflowContext, _: ()| async move {
        ctx.set_event("phase", &"waiting").await?;
        let who: Option<String> = ctx.recv("approve", Duration::from_secs(60)).await?;
        ctx.set_event("phase", &"approved").await?;
        Ok(who)
    });
    e.listen(QueueSpec::new("q"));
    e.launch().await.unwrap();
    let client = e.client();
    let wf = client
        .enqueue(EnqueueRequest::new("approval", "q", ()))
        .await
        .unwrap();
    manent_testkit::eventually("the workflow publishes its phase", WAIT, || async {
        (client
            .event::<String>(&wf.id, "phase")
            .await
            .unwrap()
            .as_deref()
            == Some("waiting"))
        .then_some(())
    })
    .await;
    client.send(&wf.id, "approve", "alice").await.unwrap();
    let done = wait_success(&client, &wf.id).await;
    assert_eq!(
        done.output.as_deref(),
        Some("\"alice\""),
        "recv returns the message"
    );
    assert_eq!(
        client
            .event::<String>(&wf.id, "phase")
            .await
            .unwrap()
            .as_deref(),
        Some("approved")
    );
    let missing = client.send("nope", "approve", "x").await;
    assert!(
        matches!(missing, Err(EngineError::NotFound(_))),
        "sending to an unknown workflow is refused"
    );
    e.shutdown(WAIT).await;
}

async fn recv_times_out_durably(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let e = engine(&db, "w").await;
    e.register("timeout", |ctx: WorkflowContext, _: ()| async move {
        let got: Option<String> = ctx.recv("never", Duration::from_millis(100)).await?;
        Ok(got.is_none())
    });
    e.listen(QueueSpec::new("q"));
    e.launch().await.unwrap();
    let wf = e
        .client()
        .enqueue(EnqueueRequest::new("timeout", "q", ()))
        .await
        .unwrap();
    let done = wait_success(&e.client(), &wf.id).await;
    assert_eq!(
        done.output.as_deref(),
        Some("true"),
        "recv gives None after its timeout"
    );
    e.shutdown(WAIT).await;
}

async fn children_run_on_their_own_queue_and_return_results(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let e = engine(&db, "w").await;
    e.register("square", |ctx: WorkflowContext, n: i64| async move {
        ctx.step("square", || async { Ok::<_, String>(n * n) })
            .await
    });
    e.register("parent", |ctx: WorkflowContext, ns: Vec<i64>| async move {
        let mut children = Vec::new();
        for n in ns {
            children.push(ctx.start_child("square", "children", None, n).await?);
        }
        let mut total = 0i64;
        for c in &children {
            total += ctx.await_workflow::<i64>(c).await?;
        }
        Ok(total)
    });
    e.listen(QueueSpec::new("parents"));
    e.listen(QueueSpec::new("children"));
    e.launch().await.unwrap();
    let client = e.client();
    let wf = client
        .enqueue(EnqueueRequest::new("parent", "parents", vec![1, 2, 3]))
        .await
        .unwrap();
    let done = wait_success(&client, &wf.id).await;
    assert_eq!(done.output.as_deref(), Some("14"), "1+4+9");
    let kids = client
        .list(&manent_engine::WorkflowFilter {
            parent_id: Some(wf.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(kids.len(), 3, "three children recorded with their parent");
    assert!(
        kids.iter().all(|k| k.queue == "children"),
        "children ran on the queue they were started on"
    );
    e.shutdown(WAIT).await;
}

async fn cancel_stops_a_run_and_resume_continues_it(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let e = engine(&db, "w").await;
    let ledger = Ledger::default();
    let l = ledger.clone();
    e.register("waits", move |ctx: WorkflowContext, _: ()| {
        let l = l.clone();
        async move {
            ctx.step("before", || async {
                l.hit("before");
                Ok::<_, String>(())
            })
            .await?;
            let v: Option<u32> = ctx.recv("go", Duration::from_secs(120)).await?;
            Ok(v)
        }
    });
    e.listen(QueueSpec::new("q"));
    e.launch().await.unwrap();
    let client = e.client();
    let wf = client
        .enqueue(EnqueueRequest::new("waits", "q", ()))
        .await
        .unwrap();
    manent_testkit::eventually("the first step is recorded", WAIT, || async {
        (!client.steps(&wf.id).await.unwrap().is_empty()).then_some(())
    })
    .await;
    assert_eq!(
        client.cancel(&wf.id).await.unwrap(),
        WorkflowStatus::Cancelled
    );
    manent_testkit::eventually("the run notices the cancellation", WAIT, || async {
        (e.running_count() == 0).then_some(())
    })
    .await;
    assert_eq!(
        client.get(&wf.id).await.unwrap().unwrap().status,
        WorkflowStatus::Cancelled,
        "stays cancelled"
    );
    client.resume(&wf.id).await.unwrap();
    client.send(&wf.id, "go", 7u32).await.unwrap();
    let done = wait_success(&client, &wf.id).await;
    assert_eq!(done.output.as_deref(), Some("7"));
    assert_eq!(
        ledger.count("before"),
        1,
        "resume continues from the checkpoints"
    );
    let again = client.cancel(&wf.id).await;
    assert!(
        matches!(again, Err(EngineError::InvalidState { .. })),
        "a finished workflow cannot be cancelled"
    );
    e.shutdown(WAIT).await;
}

async fn a_changed_step_sequence_fails_loudly_as_non_determinism(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let reached = Arc::new(Notify::new());
    let first = engine(&db, "w").await;
    let r = reached.clone();
    first.register("evolving", move |ctx: WorkflowContext, _: ()| {
        let r = r.clone();
        async move {
            ctx.step("a", || async { Ok::<_, String>(1) }).await?;
            ctx.step("b", || async {
                r.notify_one();
                std::future::pending::<()>().await;
                Ok::<_, String>(2)
            })
            .await
        }
    });
    first.listen(QueueSpec::new("q"));
    first.launch().await.unwrap();
    let wf = first
        .client()
        .enqueue(EnqueueRequest::new("evolving", "q", ()))
        .await
        .unwrap();
    reached.notified().await;
    first.shutdown(Duration::ZERO).await;

    let second = engine(&db, "w").await;
    second.register("evolving", |ctx: WorkflowContext, _: ()| async move {
        ctx.step("renamed", || async { Ok::<_, String>(1) }).await
    });
    second.listen(QueueSpec::new("q"));
    second.launch().await.unwrap();
    let done = second.client().wait(&wf.id, WAIT).await.unwrap();
    assert_eq!(
        done.status,
        WorkflowStatus::Error,
        "a mismatch must not be guessed through"
    );
    let error = done.error.unwrap();
    assert!(
        error.contains("non-determinism") && error.contains("`a`") && error.contains("`renamed`"),
        "{error}"
    );
    second.shutdown(WAIT).await;
}

async fn manual_recovery_hands_work_to_another_executor_and_fences_the_first(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let ledger = Ledger::default();
    let in_step = Arc::new(Notify::new());
    let gate = Gate::new();
    // `a` listens to no queue: it only runs what it holds at launch, so after
    // the recovery the workflow can go nowhere but to `b`.
    let make = |id: &str, hold: bool| {
        let (ledger, in_step, gate) = (ledger.clone(), in_step.clone(), gate.clone());
        let db_url = db.url.clone();
        let id = id.to_string();
        async move {
            let e = Engine::new(store::open(&db_url).await.unwrap(), config(&id));
            e.register("work", move |ctx: WorkflowContext, _: ()| {
                let (ledger, in_step, gate) = (ledger.clone(), in_step.clone(), gate.clone());
                async move {
                    let who = ctx.executor_id().to_string();
                    ctx.step("long", || async {
                        ledger.hit(&format!("long@{who}"));
                        if hold {
                            in_step.notify_one();
                            gate.wait().await;
                        }
                        Ok::<_, String>(())
                    })
                    .await?;
                    ctx.step("after", || async {
                        ledger.hit(&format!("after@{who}"));
                        Ok::<_, String>(who.clone())
                    })
                    .await
                }
            });
            if !hold {
                e.listen(QueueSpec::new("q"));
            }
            e
        }
    };
    let a = make("a", true).await;
    let client = a.client();
    let wf = client
        .enqueue(EnqueueRequest::new("work", "q", ()))
        .await
        .unwrap();
    let limits = manent_engine::store::ClaimLimits {
        worker: 1,
        partition: None,
        global: 0,
        group: None,
    };
    let claimed = a
        .store()
        .claim(
            "q",
            "a",
            manent_engine::WorkflowVersions::FIRST,
            limits,
            now_ms(),
            1,
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "a holds the workflow before it launches");
    a.launch().await.unwrap();
    in_step.notified().await;

    // `a` is alive (its lease live): only a forced recovery takes its work.
    let refused = client.recover_executor("a", false, "test").await;
    assert!(
        matches!(refused, Err(EngineError::ExecutorAlive { .. })),
        "a live executor is not recovered without force: {refused:?}"
    );
    let recovered = client.recover_executor("a", true, "test").await.unwrap();
    assert_eq!(
        recovered,
        vec![wf.id.clone()],
        "a's pending workflow goes back to its queue"
    );
    let b = make("b", false).await;
    b.launch().await.unwrap();
    let done = wait_success(&client, &wf.id).await;
    assert_eq!(
        done.output.as_deref(),
        Some("\"b\""),
        "the other executor finished it"
    );
    assert_eq!(done.executor_id.as_deref(), Some("b"));

    // a's step body now completes; its checkpoint must be refused.
    gate.open();
    manent_testkit::eventually("a notices it was fenced", WAIT, || async {
        (a.running_count() == 0).then_some(())
    })
    .await;
    assert_eq!(
        ledger.count("after@a"),
        0,
        "the fenced runner must not go on to the next step"
    );
    let steps = client.steps(&wf.id).await.unwrap();
    assert!(
        steps.iter().all(|s| s.executor_id == "b"),
        "every recorded step is b's: {steps:?}"
    );
    a.shutdown(WAIT).await;
    b.shutdown(WAIT).await;
}

/// Leaves what a dead executor leaves behind: a PENDING workflow of queue `q` under the
/// id `dead`, whose executor row has an old heartbeat and which holds no lease.
async fn dead_executors_workflow(
    store: &Arc<dyn Store>,
    client: &Client,
) -> manent_engine::WorkflowRecord {
    let wf = client
        .enqueue(EnqueueRequest::new("noop", "q", ()))
        .await
        .unwrap();
    let claimed = store
        .claim(
            "q",
            "dead",
            manent_engine::WorkflowVersions::FIRST,
            manent_engine::store::ClaimLimits {
                worker: 1,
                partition: None,
                global: 0,
                group: None,
            },
            now_ms(),
            1,
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "the dead executor holds the workflow");
    store
        .upsert_executor(&manent_engine::ExecutorRecord {
            id: "dead".into(),
            host: "gone".into(),
            pid: 1,
            region: None,
            queues: vec!["q".into()],
            state: manent_engine::ExecutorState::Running,
            started_at_ms: 0,
            heartbeat_at_ms: now_ms() - 60_000,
            stopped_at_ms: None,
            version: "0".into(),
            workflow_versions: manent_engine::WorkflowVersions::FIRST,
            running: 0,
        })
        .await
        .unwrap();
    wf
}

/// The executor `alive`, recovering stale executors by itself, serving queue `q` with
/// the `noop` workflow the dead executor left behind; not launched yet.
fn recovering_engine(store: &Arc<dyn Store>) -> Engine {
    let mut cfg = config("alive");
    cfg.automatic_recovery = true;
    let e = Engine::new(store.clone(), cfg);
    e.register("noop", |ctx: WorkflowContext, _: ()| async move {
        ctx.step("x", || async { Ok::<_, String>(()) }).await
    });
    e.listen(QueueSpec::new("q"));
    e
}

async fn automatic_recovery_takes_over_a_stale_executor(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let store = open(&db).await;
    let client = Client::new(store.clone());
    let wf = dead_executors_workflow(&store, &client).await;
    let e = recovering_engine(&store);
    e.launch().await.unwrap();
    let done = wait_success(&client, &wf.id).await;
    assert_eq!(
        done.executor_id.as_deref(),
        Some("alive"),
        "the live executor resumed the stale one's work"
    );
    let notes = recovery_notes(&client, &wf.id).await;
    assert!(
        notes.len() == 1
            && notes[0].contains("recovered automatically by executor alive")
            && notes[0].contains("executor dead"),
        "the recovery is noted in the workflow's events, which its log shows: {notes:?}"
    );
    e.shutdown(WAIT).await;
}

/// PostgreSQL only: there, a row lock held by another session keeps a recovery waiting
/// while every other write goes on. On SQLite a held write lock stops every write, the
/// lease renewal's too, so there is nothing to keep apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_held_up_by_a_row_lock_does_not_keep_the_executor_from_renewing_its_lease() {
    use sqlx::Connection;
    manent_testkit::init_tracing();
    let db = TestDb::new(Db::Postgres).await;
    let store = open(&db).await;
    let client = Client::new(store.clone());
    let stale = dead_executors_workflow(&store, &client).await;
    // Another session holds the stale workflow's row, as a transaction stuck half-way would.
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT id FROM manent_workflows WHERE id = $1 FOR UPDATE")
        .bind(&stale.id)
        .fetch_one(&mut holder)
        .await
        .unwrap();
    // pg_stat_activity is read outside any transaction: inside one it is a snapshot.
    let observer = sqlx::PgPool::connect(&db.url).await.unwrap();

    let e = recovering_engine(&store);
    let gate = Gate::new();
    let ledger = Ledger::default();
    let (g, l) = (gate.clone(), ledger.clone());
    e.register("held", move |ctx: WorkflowContext, _: ()| {
        let (g, l) = (g.clone(), l.clone());
        async move {
            ctx.step("wait", || async {
                l.hit("wait");
                g.wait().await;
                Ok::<_, String>(())
            })
            .await
        }
    });
    e.launch().await.unwrap();
    let own = client
        .enqueue(EnqueueRequest::new("held", "q", ()))
        .await
        .unwrap();
    manent_testkit::eventually("the live executor runs its own workflow", WAIT, || async {
        (ledger.count("wait") == 1).then_some(())
    })
    .await;
    async fn recovery_waits(observer: &sqlx::PgPool) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND query LIKE 'UPDATE manent_workflows SET status = ''ENQUEUED''%'",
        )
        .fetch_one(observer)
        .await
        .unwrap()
    }
    manent_testkit::eventually("the recovery waits on the held row", WAIT, || async {
        (recovery_waits(&observer).await == 1).then_some(())
    })
    .await;
    let renewed_at = || async {
        store
            .get_executor_lease("alive")
            .await
            .unwrap()
            .expect("the live executor holds a lease")
            .renewed_at_ms
    };
    let waiting_since = renewed_at().await;
    let stale_after_ms = config("alive").stale_after.as_millis() as i64;
    manent_testkit::eventually(
        "the lease is renewed past its first lifetime while the recovery waits",
        WAIT,
        || async { (renewed_at().await > waiting_since + stale_after_ms).then_some(()) },
    )
    .await;
    assert_eq!(
        client.get(&own.id).await.unwrap().unwrap().status,
        WorkflowStatus::Pending,
        "the executor's own run goes on: it did not fence itself"
    );
    // The recovery gives up on the held row after a while and tries again next round
    // (`postgres::RECOVERY_LOCK_TIMEOUT`): the connection it shares with the claims is not
    // held for as long as the row is.
    let claimed_meanwhile = client
        .enqueue(EnqueueRequest::new("noop", "q", ()))
        .await
        .unwrap();
    wait_success(&client, &claimed_meanwhile.id).await;
    assert_eq!(
        client.get(&stale.id).await.unwrap().unwrap().status,
        WorkflowStatus::Pending,
        "the held workflow was not recovered while its row was held"
    );

    sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();
    gate.open();
    wait_success(&client, &own.id).await;
    assert_eq!(
        ledger.count("wait"),
        1,
        "the executor's own step ran once: it was never stopped and run again"
    );
    let recovered = wait_success(&client, &stale.id).await;
    assert_eq!(
        recovered.executor_id.as_deref(),
        Some("alive"),
        "once the row is free, the recovery goes through"
    );
    e.shutdown(WAIT).await;
}

async fn a_duplicate_executor_id_is_refused_while_the_first_is_alive(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let first = engine(&db, "same").await;
    first.launch().await.unwrap();
    let mut cfg = config("same");
    cfg.host = "second-host".into();
    let second = Engine::new(open(&db).await, cfg);
    let refused = second.launch().await;
    match refused {
        Err(EngineError::DuplicateExecutor {
            executor_id, host, ..
        }) => {
            assert_eq!(executor_id, "same");
            assert_eq!(
                host,
                config("x").host,
                "the error names the host using the id"
            );
        }
        other => panic!("a duplicate id must be refused, got {:?}", other.err()),
    }
    first.shutdown(WAIT).await;
}

async fn a_stopped_executor_id_is_reused_at_once(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let first = engine(&db, "same").await;
    first.launch().await.unwrap();
    first.shutdown(WAIT).await;
    let mut cfg = config("same");
    // Long enough that waiting for staleness would time the test out.
    cfg.stale_after = Duration::from_secs(3600);
    let second = Engine::new(open(&db).await, cfg);
    tokio::time::timeout(Duration::from_secs(60), second.launch())
        .await
        .expect("a cleanly stopped id starts without waiting for stale_after")
        .unwrap();
    second.shutdown(WAIT).await;
}

async fn step_retries_follow_the_policy_and_record_attempts(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let e = engine(&db, "w").await;
    let tries = Arc::new(AtomicUsize::new(0));
    let t = tries.clone();
    e.register("flaky", move |ctx: WorkflowContext, _: ()| {
        let t = t.clone();
        async move {
            ctx.step_with(
                "flaky",
                StepPolicy::retry(3, Duration::from_millis(5)),
                || {
                    let t = t.clone();
                    async move {
                        if t.fetch_add(1, Ordering::SeqCst) < 2 {
                            Err("not yet".to_string())
                        } else {
                            Ok(42)
                        }
                    }
                },
            )
            .await
        }
    });
    e.register("hopeless", |ctx: WorkflowContext, _: ()| async move {
        ctx.step_with(
            "hopeless",
            StepPolicy::retry(2, Duration::from_millis(5)),
            || async { Err::<(), _>("always".to_string()) },
        )
        .await
    });
    e.register("final", |ctx: WorkflowContext, _: ()| async move {
        ctx.step_retrying_if(
            "final",
            StepPolicy::retry(5, Duration::from_millis(5)),
            |e: &String| e != "final",
            || async { Err::<(), _>("final".to_string()) },
        )
        .await
    });
    e.listen(QueueSpec::new("q"));
    e.launch().await.unwrap();
    let client = e.client();
    let ok = client
        .enqueue(EnqueueRequest::new("flaky", "q", ()))
        .await
        .unwrap();
    wait_success(&client, &ok.id).await;
    let steps = client.steps(&ok.id).await.unwrap();
    assert_eq!(steps[0].attempts, 3, "two failures then a success");
    let bad = client
        .enqueue(EnqueueRequest::new("hopeless", "q", ()))
        .await
        .unwrap();
    let done = client.wait(&bad.id, WAIT).await.unwrap();
    assert_eq!(done.status, WorkflowStatus::Error);
    assert!(
        done.error.unwrap().contains("always"),
        "the step's error is the workflow's error"
    );
    let steps = client.steps(&bad.id).await.unwrap();
    assert_eq!(
        (steps[0].status, steps[0].attempts),
        (StepStatus::Error, 2),
        "the failure is recorded"
    );
    let fin = client
        .enqueue(EnqueueRequest::new("final", "q", ()))
        .await
        .unwrap();
    client.wait(&fin.id, WAIT).await.unwrap();
    let steps = client.steps(&fin.id).await.unwrap();
    assert_eq!(
        (steps[0].status, steps[0].attempts),
        (StepStatus::Error, 1),
        "an error that retry_if refuses is not retried"
    );
    e.shutdown(WAIT).await;
}

async fn drain_finishes_short_work_and_leaves_long_work_pending(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let e = engine(&db, "w").await;
    let short_gate = Gate::new();
    let entered = Arc::new(AtomicUsize::new(0));
    let all_in = Arc::new(Notify::new());
    let (g, n, a) = (short_gate.clone(), entered.clone(), all_in.clone());
    e.register("job", move |ctx: WorkflowContext, long: bool| {
        let (g, n, a) = (g.clone(), n.clone(), a.clone());
        async move {
            ctx.step("job", || async {
                if n.fetch_add(1, Ordering::SeqCst) == 1 {
                    a.notify_one();
                }
                if long {
                    std::future::pending::<()>().await
                } else {
                    g.wait().await
                }
                Ok::<_, String>(())
            })
            .await
        }
    });
    e.listen(QueueSpec::new("q"));
    e.launch().await.unwrap();
    let client = e.client();
    let short = client
        .enqueue(EnqueueRequest::new("job", "q", false))
        .await
        .unwrap();
    let long = client
        .enqueue(EnqueueRequest::new("job", "q", true))
        .await
        .unwrap();
    all_in.notified().await;
    let shutdown = tokio::spawn({
        let e = e.clone();
        async move { e.shutdown(Duration::from_secs(2)).await }
    });
    manent_testkit::eventually("the executor reports draining", WAIT, || async {
        let ex = client.executors().await.unwrap();
        (ex[0].state == manent_engine::ExecutorState::Draining).then_some(())
    })
    .await;
    short_gate.open();
    let report = shutdown.await.unwrap();
    assert_eq!(
        report.left_pending,
        vec![long.id.clone()],
        "only the long one is cut"
    );
    assert_eq!(
        client.get(&short.id).await.unwrap().unwrap().status,
        WorkflowStatus::Success,
        "short work finished"
    );
    assert_eq!(
        client.get(&long.id).await.unwrap().unwrap().status,
        WorkflowStatus::Pending,
        "long work stays PENDING"
    );
    let ex = client.executors().await.unwrap();
    assert_eq!(
        ex[0].state,
        manent_engine::ExecutorState::Stopped,
        "the executor ends stopped"
    );
}

async fn concurrent_migrations_on_an_empty_database_all_succeed(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let url = db.url.clone();
        tasks.push(tokio::spawn(
            async move { store::open(&url).await.map(|_| ()) },
        ));
    }
    for t in tasks {
        t.await.unwrap().expect("every concurrent start succeeds");
    }
    let s = open(&db).await;
    assert_eq!(
        s.schema_version().await.unwrap(),
        store::expected_schema_version(),
        "schema complete once"
    );
}

async fn higher_priority_runs_first(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let e = engine(&db, "w").await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let o = order.clone();
    e.register("p", move |ctx: WorkflowContext, n: i64| {
        let o = o.clone();
        async move {
            ctx.step("p", || async {
                o.lock().unwrap().push(n);
                Ok::<_, String>(())
            })
            .await
        }
    });
    e.listen(QueueSpec::new("q").worker_concurrency(1));
    let client = e.client();
    let mut ids = Vec::new();
    for (n, prio) in [(1, 5), (2, 1), (3, 3)] {
        ids.push(
            client
                .enqueue(EnqueueRequest::new("p", "q", n).priority(prio))
                .await
                .unwrap()
                .id,
        );
    }
    e.launch().await.unwrap();
    for id in &ids {
        wait_success(&client, id).await;
    }
    assert_eq!(
        *order.lock().unwrap(),
        vec![2, 3, 1],
        "lower priority value runs first"
    );
    e.shutdown(WAIT).await;
}

async fn a_panicking_workflow_ends_in_error(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let e = engine(&db, "w").await;
    e.register("boom", |_ctx: WorkflowContext, _: ()| async move {
        if true {
            panic!("kaboom");
        }
        Ok::<_, WorkflowError>(())
    });
    e.listen(QueueSpec::new("q"));
    e.launch().await.unwrap();
    let wf = e
        .client()
        .enqueue(EnqueueRequest::new("boom", "q", ()))
        .await
        .unwrap();
    let done = e.client().wait(&wf.id, WAIT).await.unwrap();
    assert_eq!(
        done.status,
        WorkflowStatus::Error,
        "a panic fails the workflow, not the executor"
    );
    assert!(done.error.unwrap().contains("kaboom"));
    e.shutdown(WAIT).await;
}

async fn records_are_kept_replaced_listed_and_deleted(db: Db) {
    let db = TestDb::new(db).await;
    let s = open(&db).await;
    assert!(
        s.insert_record("token", "a", "1", 1).await.unwrap(),
        "a free key is inserted"
    );
    assert!(
        !s.insert_record("token", "a", "2", 2).await.unwrap(),
        "insert never replaces"
    );
    s.put_record("token", "b", "3", 3).await.unwrap();
    s.put_record("token", "b", "4", 4).await.unwrap();
    s.put_record("other", "a", "5", 5).await.unwrap();
    assert_eq!(
        s.get_record("token", "a").await.unwrap().as_deref(),
        Some("1")
    );
    assert_eq!(
        s.list_records("token").await.unwrap(),
        vec![
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), "4".to_string())
        ],
        "put replaces; kinds are separate"
    );
    assert!(s.delete_record("token", "a").await.unwrap());
    assert!(
        !s.delete_record("token", "a").await.unwrap(),
        "deleting twice reports nothing deleted"
    );
    assert_eq!(s.get_record("token", "a").await.unwrap(), None);
}

async fn records_written_together_are_inserted_all_or_none_and_deleted_together(db: Db) {
    let db = TestDb::new(db).await;
    let s = open(&db).await;
    let entry = |kind, key, value| RecordEntry { kind, key, value };
    assert!(
        s.insert_records(&[entry("name", "ci", "h1"), entry("token", "h1", "{}")], 1)
            .await
            .unwrap(),
        "free keys are all inserted"
    );
    assert!(
        !s.insert_records(&[entry("token", "h2", "{}"), entry("name", "ci", "h2")], 2)
            .await
            .unwrap(),
        "a taken key refuses the whole write"
    );
    assert_eq!(
        s.get_record("token", "h2").await.unwrap(),
        None,
        "the record before the taken key was rolled back with it"
    );
    assert_eq!(
        s.get_record("name", "ci").await.unwrap().as_deref(),
        Some("h1"),
        "the taken key keeps its value"
    );
    assert_eq!(
        s.delete_records(&[("name", "ci"), ("token", "h1"), ("token", "absent")])
            .await
            .unwrap(),
        2,
        "deleting counts the records that existed"
    );
    assert_eq!(
        s.list_records("name").await.unwrap().len() + s.list_records("token").await.unwrap().len(),
        0,
        "both records are gone"
    );
}

async fn audit_entries_are_appended_and_listed_newest_first(db: Db) {
    let db = TestDb::new(db).await;
    let s = open(&db).await;
    for (n, action) in ["deploy.submit", "deploy.cancel", "token.revoke"]
        .into_iter()
        .enumerate()
    {
        s.append_audit(&manent_engine::AuditRecord {
            seq: 0,
            at_ms: 1000 + n as i64,
            actor: "ci".into(),
            actor_id: "tok_1".into(),
            action: action.into(),
            target: format!("d{n}"),
            outcome: 200,
            detail: String::new(),
        })
        .await
        .unwrap();
    }
    let newest_two = s
        .list_audit(&manent_engine::AuditFilter {
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    let actions: Vec<&str> = newest_two.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(
        actions,
        ["token.revoke", "deploy.cancel"],
        "the newest entries come first and the limit holds"
    );
    assert!(
        newest_two[0].seq > newest_two[1].seq,
        "the store numbers entries in the order they were appended"
    );
    assert_eq!(
        (
            newest_two[0].actor_id.as_str(),
            newest_two[0].target.as_str()
        ),
        ("tok_1", "d2"),
        "every field is kept"
    );
}

async fn branches_replay_whatever_order_they_completed_in(db: Db) {
    let db = TestDb::new(db).await;
    let ledger = Ledger::default();
    let halt = Arc::new(Notify::new());
    let register = |e: &Engine, stop_at_end: bool| {
        let (ledger, halt) = (ledger.clone(), halt.clone());
        e.register("fan", move |ctx: WorkflowContext, n: u64| {
            let (ledger, halt) = (ledger.clone(), halt.clone());
            async move {
                use futures::StreamExt;
                let branches = ctx.branches(n as usize);
                // Branch i finishes after (n - i) ms: the last created completes first.
                let results: Vec<u64> = futures::stream::iter(branches.into_iter().enumerate())
                    .map(|(i, b)| {
                        let ledger = ledger.clone();
                        async move {
                            b.step(&format!("b{i}"), || async {
                                tokio::time::sleep(Duration::from_millis((n - i as u64) * 3)).await;
                                ledger.hit(&format!("b{i}"));
                                Ok::<_, String>(i as u64)
                            })
                            .await
                        }
                    })
                    .buffer_unordered(4)
                    .collect::<Vec<_>>()
                    .await
                    .into_iter()
                    .collect::<Result<_, _>>()?;
                if stop_at_end {
                    halt.notify_one();
                    std::future::pending::<()>().await;
                }
                Ok(results.iter().sum::<u64>())
            }
        });
    };
    let first = engine(&db, "w").await;
    register(&first, true);
    first.listen(QueueSpec::new("q"));
    first.launch().await.unwrap();
    let wf = first
        .client()
        .enqueue(EnqueueRequest::new("fan", "q", 6u64))
        .await
        .unwrap();
    halt.notified().await;
    first.shutdown(Duration::ZERO).await;
    let second = engine(&db, "w").await;
    register(&second, false);
    second.listen(QueueSpec::new("q"));
    second.launch().await.unwrap();
    let done = wait_success(&second.client(), &wf.id).await;
    assert_eq!(done.output.as_deref(), Some("15"), "0+1+2+3+4+5");
    for i in 0..6 {
        assert_eq!(
            ledger.count(&format!("b{i}")),
            1,
            "branch {i}'s step ran once, replayed after"
        );
    }
    second.shutdown(WAIT).await;
}

async fn a_workflow_moved_to_another_queue_goes_on_there_under_its_limits(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let ledger = Ledger::default();
    // Two engines: `gate` serves only the gate queue, `runner` only the limited queue.
    let register = |e: &Engine, ledger: Ledger| {
        e.register("moving", move |ctx: WorkflowContext, _: ()| {
            let ledger = ledger.clone();
            async move {
                let before: String = ctx
                    .step("before", || async {
                        ledger.hit("before");
                        Ok::<_, String>(ctx.executor_id().to_string())
                    })
                    .await?;
                ctx.move_to_queue("limited", "app/env").await?;
                let after: String = ctx
                    .step("after", || async {
                        ledger.hit("after");
                        Ok::<_, String>(ctx.executor_id().to_string())
                    })
                    .await?;
                Ok(format!("{before}->{after}@{}", ctx.queue()))
            }
        });
    };
    let gate = engine(&db, "gate").await;
    register(&gate, ledger.clone());
    gate.listen(QueueSpec::new("gate"));
    gate.launch().await.unwrap();
    let client = gate.client();
    let wf = client
        .enqueue(EnqueueRequest::new("moving", "gate", ()).partition("app/env"))
        .await
        .unwrap();
    manent_testkit::eventually("the workflow moves to `limited`", WAIT, || async {
        let w = client.get(&wf.id).await.unwrap().unwrap();
        (w.queue == "limited" && w.status == WorkflowStatus::Enqueued).then_some(())
    })
    .await;
    assert_eq!(
        ledger.count("after"),
        0,
        "no worker of `limited` runs yet: the rest waits"
    );

    let runner = engine(&db, "runner").await;
    register(&runner, ledger.clone());
    runner.listen(QueueSpec::new("limited").partition_concurrency(1));
    runner.launch().await.unwrap();
    let done = wait_success(&client, &wf.id).await;
    assert_eq!(
        done.output.as_deref(),
        Some("\"gate->runner@limited\""),
        "the first step ran on the gate's worker, the rest on the runner, on `limited`"
    );
    assert_eq!(
        ledger.count("before"),
        1,
        "the step before the move is not rerun by the replay"
    );
    assert_eq!(
        ledger.count("after"),
        1,
        "the step after the move runs once"
    );
    gate.shutdown(WAIT).await;
    runner.shutdown(WAIT).await;
}

async fn a_draining_executor_hands_its_durable_waits_back_to_the_queue(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let register = |e: &Engine| {
        e.register("waiter", |ctx: WorkflowContext, _: ()| async move {
            ctx.set_event("phase", &"waiting").await?;
            let who: Option<String> = ctx.recv("approve", Duration::from_secs(3600)).await?;
            Ok(format!("{}:{}", who.unwrap_or_default(), ctx.executor_id()))
        });
    };
    let first = engine(&db, "first").await;
    register(&first);
    first.listen(QueueSpec::new("q"));
    first.launch().await.unwrap();
    let client = first.client();
    let wf = client
        .enqueue(EnqueueRequest::new("waiter", "q", ()))
        .await
        .unwrap();
    manent_testkit::eventually("the workflow waits for its message", WAIT, || async {
        (client
            .event::<String>(&wf.id, "phase")
            .await
            .unwrap()
            .as_deref()
            == Some("waiting"))
        .then_some(())
    })
    .await;
    // An hour-long drain timeout: the shutdown must not wait for the message.
    let report = first.shutdown(Duration::from_secs(3600)).await;
    assert_eq!(
        report.released, 1,
        "the waiting run is handed back: {report:?}"
    );
    assert!(
        report.left_pending.is_empty(),
        "nothing is left pending: {report:?}"
    );
    let w = client.get(&wf.id).await.unwrap().unwrap();
    assert_eq!(
        w.status,
        WorkflowStatus::Enqueued,
        "the workflow is back on its queue"
    );

    let second = engine(&db, "second").await;
    register(&second);
    second.listen(QueueSpec::new("q"));
    second.launch().await.unwrap();
    client.send(&wf.id, "approve", "alice").await.unwrap();
    let done = wait_success(&client, &wf.id).await;
    assert_eq!(
        done.output.as_deref(),
        Some("\"alice:second\""),
        "another executor takes the wait over and receives the message"
    );
    second.shutdown(WAIT).await;
}

async fn cancelling_a_parent_stops_its_running_step_and_cancels_its_children(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let e = engine(&db, "w").await;
    let started = Arc::new(Notify::new());
    // Set when the running step's future is dropped (the run was stopped).
    let dropped = Arc::new(tokio::sync::watch::channel(false).0);
    let (s, d) = (started.clone(), dropped.clone());
    e.register("parent", move |ctx: WorkflowContext, _: ()| {
        let (started, dropped) = (s.clone(), d.clone());
        async move {
            // A pass on a queue nobody serves yet, like a region without a worker.
            ctx.start_child("child", "nobody", None, ()).await?;
            ctx.step("long", || async {
                struct OnDrop(Arc<tokio::sync::watch::Sender<bool>>);
                impl Drop for OnDrop {
                    fn drop(&mut self) {
                        self.0.send_replace(true);
                    }
                }
                let _guard = OnDrop(dropped.clone());
                started.notify_one();
                std::future::pending::<()>().await;
                Ok::<_, String>(())
            })
            .await
        }
    });
    e.register(
        "child",
        |_ctx: WorkflowContext, _: ()| async move { Ok(()) },
    );
    e.listen(QueueSpec::new("q"));
    e.launch().await.unwrap();
    let client = e.client();
    let wf = client
        .enqueue(EnqueueRequest::new("parent", "q", ()))
        .await
        .unwrap();
    started.notified().await;
    assert_eq!(
        client.cancel(&wf.id).await.unwrap(),
        WorkflowStatus::Cancelled,
        "the parent is cancelled"
    );
    let mut stopped = dropped.subscribe();
    tokio::time::timeout(WAIT, stopped.wait_for(|d| *d))
        .await
        .expect("the running step is stopped by the cancel, not left to finish")
        .unwrap();
    let children = client
        .list(&manent_engine::store::WorkflowFilter {
            parent_id: Some(wf.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(children.len(), 1, "the parent started one child");
    assert_eq!(
        children[0].status,
        WorkflowStatus::Cancelled,
        "the child pass is cancelled with its parent, so nothing ships later"
    );
    // A worker for the child's queue arriving later finds nothing to run.
    let late = engine(&db, "late").await;
    late.register(
        "child",
        |_ctx: WorkflowContext, _: ()| async move { Ok(()) },
    );
    late.listen(QueueSpec::new("nobody"));
    late.launch().await.unwrap();
    assert_eq!(
        client.get(&children[0].id).await.unwrap().unwrap().status,
        WorkflowStatus::Cancelled,
        "the cancelled child is never claimed"
    );
    late.shutdown(WAIT).await;
    e.shutdown(WAIT).await;
}

async fn recovering_an_unknown_executor_is_an_error(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let client = Client::new(open(&db).await);
    let refused = client.recover_executor("nobody", false, "test").await;
    assert!(
        matches!(refused, Err(EngineError::UnknownExecutor(ref id)) if id == "nobody"),
        "an executor that never existed is an error, not a silent success: {refused:?}"
    );
}

async fn the_events_of_many_workflows_are_read_at_once(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let e = engine(&db, "w").await;
    e.register("tag", |ctx: WorkflowContext, n: u32| async move {
        ctx.set_event("n", &n).await?;
        ctx.set_event("phase", &"done").await?;
        Ok::<_, WorkflowError>(())
    });
    e.listen(QueueSpec::new("q"));
    e.launch().await.unwrap();
    let client = e.client();
    let mut ids = Vec::new();
    for n in 0..3u32 {
        let wf = client
            .enqueue(EnqueueRequest::new("tag", "q", n))
            .await
            .unwrap();
        wait_success(&client, &wf.id).await;
        ids.push(wf.id);
    }
    ids.push("no-such-workflow".to_string());
    let by_id = client.events_of(&ids).await.unwrap();
    for (n, id) in ids.iter().take(3).enumerate() {
        let events = &by_id[id];
        let keys: Vec<&str> = events.iter().map(|ev| ev.key.as_str()).collect();
        assert_eq!(keys, ["n", "phase"], "each workflow's own events, by key");
        assert_eq!(events[0].value, n.to_string(), "not another workflow's");
    }
    assert!(
        !by_id.contains_key("no-such-workflow"),
        "an id without events has no entry"
    );
    assert!(
        client.events_of(&[]).await.unwrap().is_empty(),
        "no ids, no query, nothing"
    );
    e.shutdown(WAIT).await;
}

async fn what_finished_or_started_in_a_window_is_read_oldest_first(db: Db) {
    let db = TestDb::new(db).await;
    let e = engine(&db, "w").await;
    e.register("two-steps", |ctx: WorkflowContext, fail: bool| async move {
        ctx.step("first", || async { Ok::<_, String>(1) }).await?;
        ctx.step("second", || async { Ok::<_, String>(2) }).await?;
        if fail {
            return Err(WorkflowError::failed("as asked"));
        }
        Ok::<_, WorkflowError>(())
    });
    e.listen(QueueSpec::new("q"));
    e.launch().await.unwrap();
    let client = e.client();
    let before = now_ms() - 1;
    for fail in [false, true] {
        let wf = client
            .enqueue(EnqueueRequest::new("two-steps", "q", fail))
            .await
            .unwrap();
        client.wait(&wf.id, WAIT).await.unwrap();
    }
    let all = TimeWindow {
        after_ms: before,
        until_ms: now_ms() + 1,
        limit: 100,
    };
    let steps = client.steps_finished_between(all).await.unwrap();
    assert_eq!(
        steps.len(),
        4,
        "two steps of each workflow, none of the engine's own: {steps:?}"
    );
    assert!(
        steps.windows(2).all(|w| w[0].0 <= w[1].0) && steps.iter().all(|(_, ms)| *ms >= 0),
        "oldest first, with their durations: {steps:?}"
    );
    let started = client.workflows_started_between(all).await.unwrap();
    assert_eq!(started.len(), 2, "both workflows were claimed: {started:?}");
    let ended = client
        .workflows_finished_between("two-steps", all)
        .await
        .unwrap();
    let statuses: Vec<WorkflowStatus> = ended.iter().map(|(_, s)| *s).collect();
    assert_eq!(
        statuses,
        [WorkflowStatus::Success, WorkflowStatus::Error],
        "each ended workflow once, in the order they ended: {ended:?}"
    );
    let first_only = TimeWindow { limit: 1, ..all };
    assert_eq!(
        client
            .workflows_finished_between("two-steps", first_only)
            .await
            .unwrap()
            .len(),
        1,
        "the limit holds"
    );
    let later = TimeWindow {
        after_ms: ended[1].0,
        ..all
    };
    assert!(
        client
            .workflows_finished_between("two-steps", later)
            .await
            .unwrap()
            .is_empty(),
        "the window's start is exclusive"
    );
    assert!(
        client
            .workflows_finished_between("another-name", all)
            .await
            .unwrap()
            .is_empty(),
        "only workflows of the name asked for"
    );
    e.shutdown(WAIT).await;
}

async fn audit_filters_and_the_cursor_reach_past_thousands_of_newer_entries(db: Db) {
    use manent_engine::{AuditFilter, AuditRecord};
    let db = TestDb::new(db).await;
    let s = open(&db).await;
    let entry = |at_ms: i64, actor: &str, action: &str| AuditRecord {
        seq: 0,
        at_ms,
        actor: actor.into(),
        actor_id: String::new(),
        action: action.into(),
        target: format!("t{at_ms}"),
        outcome: 200,
        detail: String::new(),
    };
    // Five entries of `alice`, old, then 3,000 newer ones of `-` (anonymous refusals).
    for n in 0..5 {
        let action = if n % 2 == 0 {
            "deploy.submit"
        } else {
            "token.revoke"
        };
        s.append_audit(&entry(1_000 + n, "alice", action))
            .await
            .unwrap();
    }
    for n in 0..3_000 {
        s.append_audit(&entry(10_000 + n, "-", "GET /api/v1/deploys"))
            .await
            .unwrap();
    }
    let alice = s
        .list_audit(&AuditFilter {
            actor: Some("alice".into()),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    let times: Vec<i64> = alice.iter().map(|e| e.at_ms).collect();
    assert_eq!(
        times,
        [1_004, 1_003, 1_002, 1_001, 1_000],
        "an actor's entries are found behind 3,000 newer entries of others, newest first"
    );
    let submits = s
        .list_audit(&AuditFilter {
            actor: Some("alice".into()),
            action: Some("deploy.submit".into()),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        submits.iter().map(|e| e.at_ms).collect::<Vec<_>>(),
        [1_004, 1_002, 1_000],
        "actor and action filters combine"
    );
    let window = s
        .list_audit(&AuditFilter {
            since_ms: Some(1_001),
            until_ms: Some(1_003),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        window.iter().map(|e| e.at_ms).collect::<Vec<_>>(),
        [1_002, 1_001],
        "since is inclusive, until exclusive"
    );
    // Paging through everything, 700 at a time, with the cursor of each answer.
    let mut seen = 0;
    let mut before = None;
    let mut pages = 0;
    loop {
        let page = s
            .list_audit(&AuditFilter {
                before_seq: before,
                limit: 700,
                ..Default::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        assert!(
            page.windows(2).all(|w| w[0].seq > w[1].seq),
            "each page is newest first"
        );
        if let Some(before) = before {
            assert!(
                page[0].seq < before,
                "a page starts below the cursor it was asked with"
            );
        }
        before = Some(last.seq);
        seen += page.len();
        pages += 1;
    }
    assert_eq!(
        (seen, pages),
        (3_005, 5),
        "the cursor reaches every entry once, the oldest included"
    );
}
