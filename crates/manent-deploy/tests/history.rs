//! What ran last on an application/environment is found however much else ran
//! since: dependencies, rollback and approvals read one partition's history, not
//! a window of the newest deploys of every application.

use std::time::Duration;

use manent_deploy::{DEPLOY_WORKFLOW, workflow::gate::dependency_met};
use manent_engine::{
    Connections, Database, Engine, EngineConfig, EnqueueRequest, QueueSpec, WorkflowContext,
};
use manent_model::Dependency;
use manent_testkit::{Db, TestDb};
use serde_json::{Value, json};

use manent_testkit::on_both_backends;

on_both_backends!(a_dependency_is_met_by_a_success_older_than_hundreds_of_later_deploys);

const QUEUE: &str = "history";

/// A recorded deploy request of `application` in prod at `version`, as submission stores it.
fn request(application: &str, version: &str, dry_run: bool) -> Value {
    json!({
        "descriptor": {
            "application": application,
            "environment": "prod",
            "artifacts": [{
                "name": "app.tar.gz", "type": "file", "version": version,
                "url": "file:///srv/app.tar.gz",
                "sha256": "239f59ed55e737c77147cf55ad0c1b030b6d7ee748a7426952f9b852d5a935e5",
            }],
            "dry_run": dry_run,
        },
        "effective": null,
        "route": {"queue": QUEUE, "kind": "default", "plugin": null},
        "submitted_by": "test",
        "submitted_at_ms": 0,
    })
}

fn dependency(version: &str) -> Dependency {
    serde_json::from_value(json!({
        "application": "shop/db", "environment": "prod", "version": version,
    }))
    .expect("a dependency")
}

async fn a_dependency_is_met_by_a_success_older_than_hundreds_of_later_deploys(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let database = Database::open(&db.url, &Connections::default())
        .await
        .expect("open the test database");
    let mut config = EngineConfig::new("history");
    config.heartbeat_interval = Duration::from_millis(200);
    let engine = Engine::new(database, config);
    // Stands in for the deploy workflow: these deploys only need to have succeeded.
    engine.register(DEPLOY_WORKFLOW, |_: WorkflowContext, _: Value| async move {
        Ok::<_, manent_engine::WorkflowError>(())
    });
    let client = engine.client();
    // shop/db 1.0 succeeds first; then 120 dry runs of shop/db 2.0 and 600 deploys of
    // other applications, more than any fixed window of recent deploys.
    let mut requests = vec![
        EnqueueRequest::new(DEPLOY_WORKFLOW, QUEUE, request("shop/db", "1.0", false))
            .partition("shop/db/prod"),
    ];
    for _ in 0..120 {
        requests.push(
            EnqueueRequest::new(DEPLOY_WORKFLOW, QUEUE, request("shop/db", "2.0", true))
                .partition("shop/db/prod"),
        );
    }
    for n in 0..600 {
        let application = format!("shop/app{n}");
        requests.push(
            EnqueueRequest::new(DEPLOY_WORKFLOW, QUEUE, request(&application, "9.9", false))
                .partition(format!("{application}/prod")),
        );
    }
    let ids: Vec<String> = client
        .enqueue_many(requests)
        .await
        .expect("enqueue the history")
        .into_iter()
        .map(|r| r.expect("each request is accepted").id)
        .collect();
    engine.listen(QueueSpec::new(QUEUE).worker_concurrency(50));
    engine.launch().await.expect("start the engine");
    for id in &ids {
        let done = client
            .wait(id, Duration::from_secs(120))
            .await
            .expect("each deploy ends");
        assert_eq!(
            done.status,
            manent_engine::WorkflowStatus::Success,
            "{id} succeeds"
        );
    }

    assert!(
        dependency_met(&client, &dependency("1.0")).await.unwrap(),
        "shop/db's last real deploy (1.0) is found behind 720 later ones"
    );
    assert!(
        !dependency_met(&client, &dependency("2.0")).await.unwrap(),
        "dry runs of 2.0 do not count as 2.0 running"
    );
    engine.shutdown(Duration::from_secs(10)).await;
}
