//! Reads that decide something return their error instead of guessing (ARCHITECTURE.md,
//! invariant 10): a successful deploy whose record cannot be read is an error naming it for
//! the live version, a dependency, a rollback's source and what an approver sees deployed
//! now; an approvals record that cannot be read is an error, not "no approvals"; and a
//! deploy that exists but cannot be read is no 404 to an approver.

mod common;

use std::time::Duration;

use manent_deploy::{
    DEPLOY_WORKFLOW,
    history::live_version,
    submission::approvals::{Approver, DecideError, decide},
    submission::rollback_source,
    views::deploy_views,
    workflow::gate,
};
use manent_engine::{
    Client, Connections, Database, Engine, EngineConfig, EnqueueRequest, QueueSpec,
    WorkflowContext, WorkflowError, WorkflowStatus,
};
use manent_model::Dependency;
use manent_testkit::{Db, TestDb, eventually, on_both_backends};
use serde_json::{Value, json};

on_both_backends!(reads_that_decide_return_the_error_of_a_record_that_cannot_be_read);

const QUEUE: &str = "deciding";
const WAIT: Duration = Duration::from_secs(60);

/// Stands in for the deploy workflow: a request it cannot read succeeds at once; a readable
/// one publishes that it waits for approval (for `shop/api`, with approvals that cannot be
/// read) and waits.
async fn stand_in(ctx: WorkflowContext, input: Value) -> Result<(), WorkflowError> {
    let Some(application) = input["descriptor"]["application"].as_str() else {
        return Ok(());
    };
    if application == "shop/api" {
        ctx.set_event("approvals", &"not a list of decisions")
            .await?;
    }
    ctx.set_event("phase", &"waiting_approval").await?;
    let _: Option<Value> = ctx.recv("approval", Duration::from_secs(3600)).await?;
    Ok(())
}

async fn enqueue(client: &Client, input: Value, partition: &str) -> String {
    client
        .enqueue(EnqueueRequest::new(DEPLOY_WORKFLOW, QUEUE, input).partition(partition))
        .await
        .expect("enqueue a deploy")
        .id
}

async fn waiting_for_approval(client: &Client, id: &str) {
    eventually("the deploy waits for approval", WAIT, || async {
        client
            .events(id)
            .await
            .expect("read the deploy's events")
            .iter()
            .any(|e| e.key == "phase")
            .then_some(())
    })
    .await;
}

async fn reads_that_decide_return_the_error_of_a_record_that_cannot_be_read(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let database = Database::open(&db.url, &Connections::default())
        .await
        .expect("open the test database");
    let engine = Engine::new(database, EngineConfig::new("deciding"));
    engine.register(DEPLOY_WORKFLOW, stand_in);
    engine.listen(QueueSpec::new(QUEUE).worker_concurrency(10));
    engine.launch().await.expect("start the engine");
    let client = engine.client();

    // shop/web's last success is a deploy whose recorded request cannot be read.
    let unreadable = enqueue(&client, json!({"garbled": true}), "shop/web/prod").await;
    let done = client.wait(&unreadable, WAIT).await.expect("it ends");
    assert_eq!(done.status, WorkflowStatus::Success, "it succeeded");
    let waiting = enqueue(
        &client,
        common::recorded_request("shop/web", QUEUE, false),
        "shop/web/prod",
    )
    .await;
    let garbled_approvals = enqueue(
        &client,
        common::recorded_request("shop/api", QUEUE, false),
        "shop/api/prod",
    )
    .await;
    waiting_for_approval(&client, &waiting).await;
    waiting_for_approval(&client, &garbled_approvals).await;

    let names_it = |what: &str, error: String| {
        assert!(
            error.contains(&unreadable),
            "{what}: the error names the deploy that cannot be read ({unreadable}): {error}"
        );
    };
    let live = live_version(&client, "shop/web", "prod").await;
    names_it(
        "the live version",
        live.expect_err("the live version may be the unreadable deploy's")
            .to_string(),
    );
    let dependency: Dependency = serde_json::from_value(json!({
        "application": "shop/web", "environment": "prod", "version": "1.0",
    }))
    .expect("a dependency");
    let met = gate::dependency_met(&client, &dependency).await;
    names_it(
        "a dependency",
        met.expect_err("the unreadable deploy may be the version needed")
            .to_string(),
    );
    let source = rollback_source(&client, "shop/web", "prod", None).await;
    names_it(
        "a rollback's source",
        source
            .expect_err("the unreadable deploy may be the live one or the target")
            .to_string(),
    );
    let status = deploy_views::status(&client, &waiting).await;
    names_it(
        "what an approver sees deployed now",
        status
            .expect_err("`deployed_now` is not guessed as nothing")
            .to_string(),
    );

    let status = deploy_views::status(&client, &garbled_approvals).await;
    let error = status
        .expect_err("approvals that cannot be read are not shown as none")
        .to_string();
    assert!(
        error.contains(&garbled_approvals) && error.contains("approvals"),
        "the error names the deploy and its approvals record: {error}"
    );

    let approver = Approver {
        name: "alice".into(),
        token_id: "tok_alice".into(),
        role: "approver".into(),
    };
    let decision = decide(&client, &unreadable, &approver, true, None).await;
    match decision {
        Err(DecideError::Engine(error)) => names_it("an approval", error.to_string()),
        other => panic!(
            "a deploy that exists but cannot be read is an error, not a 404 or a decision: {other:?}"
        ),
    }
    engine.shutdown(Duration::from_secs(10)).await;
}
