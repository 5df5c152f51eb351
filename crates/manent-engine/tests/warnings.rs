//! What a healthy executor logs: a lone executor whose runs all finish by themselves
//! logs no warning. A binary of its own, because it installs a process-wide tracing
//! subscriber that records every warning (the runs log from the runtime's worker
//! threads, which a thread-local subscriber would not see).

use std::sync::{Mutex, OnceLock};

use manent_engine::{
    Database, Engine, EngineConfig, EnqueueRequest, QueueSpec, WorkflowContext, WorkflowError,
    WorkflowStatus, store,
};
use manent_testkit::{Db, TestDb, on_both_backends};
use tracing::field::{Field, Visit};
use tracing_subscriber::{Layer, layer::SubscriberExt};

on_both_backends!(a_lone_executor_whose_runs_finish_by_themselves_logs_no_warning);

/// Every event at WARN or above, as `message field=value …`.
static WARNINGS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();

struct RecordWarnings;

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl<S: tracing::Subscriber> Layer<S> for RecordWarnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() <= tracing::Level::WARN {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            warnings().lock().unwrap().push(fields.0);
        }
    }
}

fn warnings() -> &'static Mutex<Vec<String>> {
    WARNINGS.get_or_init(|| {
        let subscriber = tracing_subscriber::registry().with(RecordWarnings);
        tracing::subscriber::set_global_default(subscriber)
            .expect("the only subscriber of this binary");
        Mutex::default()
    })
}

async fn a_lone_executor_whose_runs_finish_by_themselves_logs_no_warning(db: Db) {
    warnings();
    let db = TestDb::new(db).await;
    let store = store::open(&db.url).await.expect("open the test database");
    let engine = Engine::new(Database::from(store), EngineConfig::new("lone"));
    engine.register("short", |ctx: WorkflowContext, n: u32| async move {
        let doubled: u32 = ctx
            .step("double", || async move { Ok::<_, String>(n * 2) })
            .await?;
        Ok::<_, WorkflowError>(doubled)
    });
    engine.listen(QueueSpec::new("q").worker_concurrency(8));
    engine.launch().await.expect("the executor starts");

    let mut ids = Vec::new();
    for n in 0..300u32 {
        let started = engine
            .client()
            .enqueue(EnqueueRequest::new("short", "q", n))
            .await
            .expect("enqueue");
        ids.push(started.id);
    }
    for id in &ids {
        let done = engine
            .client()
            .wait(id, std::time::Duration::from_secs(120))
            .await
            .expect("the run ends");
        assert_eq!(
            done.status,
            WorkflowStatus::Success,
            "workflow {id}: {:?}",
            done.error
        );
    }
    engine.shutdown(std::time::Duration::from_secs(30)).await;

    let about_ours: Vec<String> = warnings()
        .lock()
        .unwrap()
        .iter()
        .filter(|line| ids.iter().any(|id| line.contains(id.as_str())))
        .cloned()
        .collect();
    assert!(
        about_ours.is_empty(),
        "a lone executor's own runs finishing are not runs taken away, nor anything else to \
         warn about; it warned: {about_ours:#?}"
    );
}
