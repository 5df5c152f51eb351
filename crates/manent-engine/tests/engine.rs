//! Workflows on both backends, in one process: replay, limits, dedup, scheduling,
//! messages, events, children, cancel/resume, retries, priority and moves between
//! queues. Recovery, fencing and draining live in `engine_recovery.rs`, what the store
//! keeps and reads back in `engine_records.rs`, multi-process tests in `processes.rs`.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use manent_engine::{
    Client, Database, Engine, EngineError, EnqueueRequest, QueueSpec, StepPolicy, StepStatus,
    WorkflowContext, WorkflowError, WorkflowStatus, now_ms, store,
};
use manent_testkit::{Db, TestDb, on_both_backends};
use tokio::sync::Notify;

mod common;
use common::{Gate, Ledger, WAIT, engine, open, recovery_notes, wait_success};

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
    step_retries_follow_the_policy_and_record_attempts,
    higher_priority_runs_first,
    a_panicking_workflow_ends_in_error,
    branches_replay_whatever_order_they_completed_in,
    a_workflow_moved_to_another_queue_goes_on_there_under_its_limits,
    cancelling_a_parent_stops_its_running_step_and_cancels_its_children,
);

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
                // Its start recorded, as every step on a target: its runs are counted.
                let shown = StepPolicy::default().recording_start();
                let b: u32 = ctx
                    .step_with("two", shown, || async {
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
        ["one", "two", "three"],
        "every step is recorded once, in order"
    );
    assert!(
        steps.iter().all(|s| s.status == StepStatus::Success),
        "every step recorded as a success"
    );
    assert_eq!(
        steps.iter().map(|s| s.attempts).collect::<Vec<_>>(),
        [1, 2, 1],
        "the interrupted step's attempts count both its runs, across the restart"
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
    let client = Client::new(Database::from(open(&db).await));
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
    let client = Client::new(Database::from(open(&db).await));
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
    let wf = Client::new(Database::from(enqueuer))
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
    assert_eq!(heard, "woken", "the receiver heard the message sent to it");
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
        Some("approved"),
        "the event the workflow set is what a client reads"
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
        WorkflowStatus::Cancelled,
        "cancelling a running workflow cancels it"
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
    assert_eq!(
        done.output.as_deref(),
        Some("7"),
        "the resumed workflow finished with its output"
    );
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
    // Fails once, then waits: its failed attempt's error is on the running step meanwhile.
    let gate = Gate::new();
    let first_try = Arc::new(AtomicUsize::new(0));
    let (g, f) = (gate.clone(), first_try.clone());
    e.register("patient", move |ctx: WorkflowContext, _: ()| {
        let (g, f) = (g.clone(), f.clone());
        async move {
            let policy = StepPolicy::retry(2, Duration::from_millis(5)).recording_start();
            ctx.step_with("patient", policy, || {
                let (g, f) = (g.clone(), f.clone());
                async move {
                    if f.fetch_add(1, Ordering::SeqCst) == 0 {
                        return Err("the first try failed".to_string());
                    }
                    g.wait().await;
                    Ok(())
                }
            })
            .await
        }
    });
    e.listen(QueueSpec::new("q"));
    e.launch().await.unwrap();
    let client = e.client();
    let patient = client
        .enqueue(EnqueueRequest::new("patient", "q", ()))
        .await
        .unwrap();
    let running = manent_testkit::eventually("the retried step shows its error", WAIT, || async {
        let steps = client.steps(&patient.id).await.unwrap();
        steps
            .into_iter()
            .find(|s| s.status == StepStatus::Running && s.error.is_some())
    })
    .await;
    assert!(
        running.attempts == 2
            && running.error.as_deref().is_some_and(
                |e| e.contains("attempt 1 failed") && e.contains("the first try failed")
            ),
        "the second attempt runs, the first's error shown: {running:?}"
    );
    gate.open();
    wait_success(&client, &patient.id).await;
    let ok = client
        .enqueue(EnqueueRequest::new("flaky", "q", ()))
        .await
        .unwrap();
    wait_success(&client, &ok.id).await;
    let steps = client.steps(&ok.id).await.unwrap();
    assert_eq!(steps[0].attempts, 3, "two failures then a success");
    assert_eq!(
        steps[0].error, None,
        "a step that succeeded in the end keeps no error"
    );
    let bad = client
        .enqueue(EnqueueRequest::new("hopeless", "q", ()))
        .await
        .unwrap();
    let done = client.wait(&bad.id, WAIT).await.unwrap();
    assert_eq!(
        done.status,
        WorkflowStatus::Error,
        "a step that always fails fails its workflow: {:?}",
        done.error
    );
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
    assert!(
        done.error.unwrap().contains("kaboom"),
        "a panic fails the workflow with its message"
    );
    e.shutdown(WAIT).await;
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
