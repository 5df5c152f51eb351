//! The deploy list and the activity view (what `manent list`, `manent activity` and the
//! Platform page poll) cost the same number of SQL statements with 5 deploys of each kind
//! as with 50: none is read one deploy at a time. Statements are counted from sqlx's own
//! per-statement trace (`sqlx::query`), with no engine running while a view is read.

mod common;

use std::{
    sync::{
        LazyLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use manent_deploy::{
    DEPLOY_WORKFLOW,
    views::deploy_views::{self, ListFilter},
};
use manent_engine::{
    Client, Connections, Database, Engine, EngineConfig, EnqueueRequest, QueueSpec,
    WorkflowContext, WorkflowFilter, WorkflowStatus,
};
use manent_testkit::{Db, TestDb, eventually};
use serde_json::{Value, json};
use tracing_subscriber::{Layer, layer::SubscriberExt};

use manent_testkit::on_both_backends;

on_both_backends!(list_and_activity_cost_the_same_statements_for_5_deploys_as_for_50);

/// The queue the running deploys run on; `PARKED` has no worker, so its deploys stay queued.
const QUEUE: &str = "views";
const PARKED: &str = "views.parked";

/// Statements sqlx ran in this test binary, counted from its `sqlx::query` events.
static STATEMENTS: AtomicUsize = AtomicUsize::new(0);
/// One test counts at a time: the counter is the whole process's.
static COUNTING: LazyLock<tokio::sync::Mutex<()>> = LazyLock::new(|| tokio::sync::Mutex::new(()));

struct CountStatements;

impl<S: tracing::Subscriber> Layer<S> for CountStatements {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() != "sqlx::query" {
            return;
        }
        let mut summary = Summary(String::new());
        event.record(&mut summary);
        // A connection the pool opens (at any moment, in the background) first sets up its
        // session: those statements are the pool's, not a view's.
        let setup = ["PRAGMA", "SET "]
            .iter()
            .any(|p| summary.0.trim_start_matches('"').starts_with(p));
        if !setup {
            STATEMENTS.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The `summary` field of sqlx's statement event: the statement's first words.
struct Summary(String);

impl tracing::field::Visit for Summary {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "summary" {
            self.0 = value.to_string();
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "summary" {
            self.0 = format!("{value:?}");
        }
    }
}

fn count_statements() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(CountStatements),
        )
        .expect("no other subscriber in this test binary");
    });
}

/// How many statements `list` and `activity` each ran over `per_kind` finished, running
/// (each with a phase and a target event) and queued deploys.
async fn statements_of_views(backend: Db, per_kind: usize) -> (usize, usize) {
    let db = TestDb::new(backend).await;
    let engine = Engine::new(
        Database::open(&db.url, &Connections::default())
            .await
            .expect("open the test database"),
        EngineConfig::new("views"),
    );
    // Stands in for the deploy workflow: a dry run ends at once; any other deploy publishes
    // its phase and a target's progress, then runs until the engine stops.
    engine.register(
        DEPLOY_WORKFLOW,
        |ctx: WorkflowContext, input: Value| async move {
            if input["descriptor"]["dry_run"] == true {
                return Ok::<_, manent_engine::WorkflowError>(());
            }
            ctx.set_event("phase", &"wave 1/1 (all)").await?;
            ctx.set_event("target:t1", &json!({"name": "t1", "status": "deploying"}))
                .await?;
            std::future::pending::<()>().await;
            Ok(())
        },
    );
    let client = engine.client();
    let mut requests = Vec::new();
    for n in 0..per_kind {
        for (kind, queue, dry_run) in [
            ("done", QUEUE, true),
            ("runs", QUEUE, false),
            ("waits", PARKED, false),
        ] {
            let application = format!("shop/{kind}{n}");
            requests.push(
                EnqueueRequest::new(
                    DEPLOY_WORKFLOW,
                    queue,
                    common::recorded_request(&application, queue, dry_run),
                )
                .partition(format!("{application}/prod")),
            );
        }
    }
    client
        .enqueue_many(requests)
        .await
        .expect("enqueue the deploys");
    engine.listen(QueueSpec::new(QUEUE).worker_concurrency(200));
    engine.launch().await.expect("start the engine");
    let count = |status| {
        let client = client.clone();
        async move {
            client
                .list(&WorkflowFilter {
                    status: Some(status),
                    ..Default::default()
                })
                .await
                .expect("list deploys")
        }
    };
    eventually(
        "every deploy finished, runs with its events, or waits",
        Duration::from_secs(120),
        || async {
            let running = count(WorkflowStatus::Pending).await;
            let ids: Vec<String> = running.iter().map(|r| r.id.clone()).collect();
            let events = client.events_of(&ids).await.expect("read events");
            (count(WorkflowStatus::Success).await.len() == per_kind
                && running.len() == per_kind
                && events.values().filter(|e| e.len() == 2).count() == per_kind)
                .then_some(())
        },
    )
    .await;
    // The runs are left PENDING (they do not wait durably, so nothing is handed back) and no
    // engine statement runs while the views are read.
    engine.shutdown(Duration::ZERO).await;
    let views = Client::new(
        Database::open(&db.url, &Connections::default())
            .await
            .expect("open the views' store"),
    );
    let everyone = |_: &str| true;
    let all = ListFilter {
        limit: Some(1000),
        ..Default::default()
    };

    let before = STATEMENTS.load(Ordering::SeqCst);
    let list = deploy_views::list(&views, &all, &everyone)
        .await
        .expect("list deploys");
    let list_statements = STATEMENTS.load(Ordering::SeqCst) - before;
    assert_eq!(list.len(), per_kind * 3, "the list shows every deploy");
    assert_eq!(
        list.iter().filter(|d| d.phase == "wave 1/1 (all)").count(),
        per_kind,
        "each running deploy's phase is read from its events"
    );

    let before = STATEMENTS.load(Ordering::SeqCst);
    let activity = deploy_views::activity(&views)
        .await
        .expect("read the activity");
    let activity_statements = STATEMENTS.load(Ordering::SeqCst) - before;
    assert_eq!(
        activity
            .iter()
            .filter(|d| d.phase == "wave 1/1 (all)")
            .count(),
        per_kind,
        "the activity shows each running deploy's phase"
    );
    assert_eq!(
        activity
            .iter()
            .filter(|d| d.status == WorkflowStatus::Enqueued)
            .count(),
        per_kind,
        "and each queued one"
    );
    (list_statements, activity_statements)
}

async fn list_and_activity_cost_the_same_statements_for_5_deploys_as_for_50(backend: Db) {
    let _one_at_a_time = COUNTING.lock().await;
    count_statements();
    let few = statements_of_views(backend, 5).await;
    let many = statements_of_views(backend, 50).await;
    eprintln!(
        "{backend:?}: list {} and activity {} statements for 15 deploys; {} and {} for 150",
        few.0, few.1, many.0, many.1
    );
    assert!(
        few.0 > 0 && few.1 > 0,
        "statements are counted at all (sqlx's trace reaches the counter): {few:?}"
    );
    assert_eq!(
        few, many,
        "(list, activity) statements do not grow with the number of deploys: 15 deploys {few:?}, 150 {many:?}"
    );
}
