//! Executors on both backends, in one process: manual and automatic recovery, fencing,
//! the duplicate-id rule and draining. Multi-process tests live in `processes.rs`.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use manent_engine::{
    Client, Database, Engine, EngineError, EnqueueRequest, QueueSpec, WorkflowContext,
    WorkflowStatus, now_ms,
    store::{self, Store},
};
use manent_testkit::{Db, TestDb, on_both_backends};
use tokio::sync::Notify;

mod common;
use common::{Gate, Ledger, WAIT, config, engine, open, recovery_notes, wait_success};

on_both_backends!(
    manual_recovery_hands_work_to_another_executor_and_fences_the_first,
    automatic_recovery_takes_over_a_stale_executor,
    a_duplicate_executor_id_is_refused_while_the_first_is_alive,
    a_stopped_executor_id_is_reused_at_once,
    drain_finishes_short_work_and_leaves_long_work_pending,
    a_draining_executor_hands_its_durable_waits_back_to_the_queue,
    recovering_an_unknown_executor_is_an_error,
);

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
            let e = Engine::new(
                Database::from(store::open(&db_url).await.unwrap()),
                config(&id),
            );
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
    assert_eq!(
        done.executor_id.as_deref(),
        Some("b"),
        "b, which took the workflow over, holds it last"
    );

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
    let e = Engine::new(Database::from(store.clone()), cfg);
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
    let client = Client::new(Database::from(store.clone()));
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
    // The interruption beside it, dated at the dead executor's last heartbeat.
    let dead = client
        .executor("dead")
        .await
        .unwrap()
        .map(|d| d.heartbeat_at_ms);
    let interrupted: Vec<(i64, String)> = client
        .events(&wf.id)
        .await
        .unwrap()
        .into_iter()
        .filter(|ev| ev.key.starts_with("interrupted:"))
        .map(|ev| (ev.updated_at_ms, ev.value))
        .collect();
    assert!(
        interrupted.len() == 1
            && Some(interrupted[0].0) == dead
            && interrupted[0].1.contains("worker dead stopped answering"),
        "the interruption is noted at the dead executor's last heartbeat {dead:?}: {interrupted:?}"
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
    let client = Client::new(Database::from(store.clone()));
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

/// After a fence, the executor takes its pending workflows over once its lease is renewed.
/// A take-over kept waiting (here on a workflow row another session holds) past that
/// renewal's window resumes nothing then; a later renewal takes them over again, and each
/// runs: none is left pending under a live executor with no run anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_kept_waiting_past_its_renewals_window_still_resumes_the_executors_workflows() {
    use sqlx::Connection;
    manent_testkit::init_tracing();
    let db = TestDb::new(Db::Postgres).await;
    let store = open(&db).await;
    let client = Client::new(Database::from(store.clone()));
    let e = Engine::new(Database::from(store.clone()), config("alive"));
    let ledger = Ledger::default();
    let window = Arc::new(std::sync::Mutex::new(None));
    let (l, w) = (ledger.clone(), window.clone());
    // The first run's step waits until it is stopped; the next one ends at once.
    e.register("held", move |ctx: WorkflowContext, _: ()| {
        let (l, w) = (l.clone(), w.clone());
        async move {
            let lease = ctx.lease_window();
            ctx.step("wait", || async {
                l.hit("wait");
                if l.count("wait") == 1 {
                    *w.lock().unwrap() = Some(lease.clone());
                    std::future::pending::<()>().await;
                }
                Ok::<_, String>(())
            })
            .await
        }
    });
    e.listen(QueueSpec::new("q"));
    e.launch().await.unwrap();
    let wf = client
        .enqueue(EnqueueRequest::new("held", "q", ()))
        .await
        .unwrap();
    manent_testkit::eventually("the executor runs the workflow", WAIT, || async {
        (ledger.count("wait") == 1).then_some(())
    })
    .await;

    // Renewals wait on the lease's row until the executor fences itself; the workflow's row
    // is held too, so the take-over after the next renewal waits.
    let mut lease_holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut row_holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    for (conn, sql, id) in [
        (
            &mut lease_holder,
            "SELECT 1 FROM manent_executor_leases WHERE executor_id = $1 FOR UPDATE",
            "alive",
        ),
        (
            &mut row_holder,
            "SELECT 1 FROM manent_workflows WHERE id = $1 FOR UPDATE",
            wf.id.as_str(),
        ),
    ] {
        sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
        sqlx::query(sql).bind(id).execute(&mut *conn).await.unwrap();
    }
    manent_testkit::eventually("the executor fences itself", WAIT, || async {
        let lease = window.lock().unwrap().clone()?;
        (lease.may_act_for() == Duration::ZERO).then_some(())
    })
    .await;
    sqlx::query("ROLLBACK")
        .execute(&mut lease_holder)
        .await
        .unwrap();
    let observer = sqlx::PgPool::connect(&db.url).await.unwrap();
    manent_testkit::eventually("the take-over waits on the held row", WAIT, || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' \
             AND query LIKE 'UPDATE manent_workflows SET generation = generation + 1%'",
        )
        .fetch_one(&observer)
        .await
        .unwrap();
        (waiting > 0).then_some(())
    })
    .await;
    let renewed_before = store
        .get_executor_lease("alive")
        .await
        .unwrap()
        .expect("the executor holds its lease")
        .renewed_at_ms;
    let stale_after_ms = config("alive").stale_after.as_millis() as i64;
    manent_testkit::eventually(
        "the window of the renewal the take-over followed has passed",
        WAIT,
        || async { (now_ms() > renewed_before + stale_after_ms).then_some(()) },
    )
    .await;
    sqlx::query("ROLLBACK")
        .execute(&mut row_holder)
        .await
        .unwrap();

    wait_success(&client, &wf.id).await;
    assert_eq!(
        ledger.count("wait"),
        2,
        "the stopped step ran once more, after the take-over"
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
    let second = Engine::new(Database::from(open(&db).await), cfg);
    let refused = second.launch().await;
    match refused {
        Err(EngineError::DuplicateExecutor {
            executor_id, host, ..
        }) => {
            assert_eq!(
                executor_id, "same",
                "the workflow stays with the executor that restarted under its id"
            );
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
    let second = Engine::new(Database::from(open(&db).await), cfg);
    tokio::time::timeout(Duration::from_secs(60), second.launch())
        .await
        .expect("a cleanly stopped id starts without waiting for stale_after")
        .unwrap();
    second.shutdown(WAIT).await;
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

async fn recovering_an_unknown_executor_is_an_error(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let client = Client::new(Database::from(open(&db).await));
    let refused = client.recover_executor("nobody", false, "test").await;
    assert!(
        matches!(refused, Err(EngineError::UnknownExecutor(ref id)) if id == "nobody"),
        "an executor that never existed is an error, not a silent success: {refused:?}"
    );
}
