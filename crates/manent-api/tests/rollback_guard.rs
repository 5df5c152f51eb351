//! The rollback guard through the router (docs/environments.md, "The rollback guard"): a
//! rollback or redeploy to a version from before the environment's newest irreversible
//! deploy is a 409 naming that deploy, its version and reason, and `force`; `force` goes
//! through and is audited with who forced it; versions that ran after the irreversible
//! deploy, and its own, stay a rollback away.

mod common;

use axum::http::StatusCode;
use common::Api;
use manent_api::{Role, audit};
use manent_engine::AuditFilter;
use serde_json::{Value, json};

const ROLLBACK: &str = "/api/v1/apps/acme/web/environments/prod/rollback";
const REASON: &str = "drops column users.legacy_name";

/// Submits acme/web prod at `version` as `token` (marked irreversible with `REASON` when
/// `irreversible`) and waits for its success; returns its id.
async fn deployed(api: &Api, token: &str, version: &str, irreversible: bool) -> String {
    let mark = if irreversible {
        format!("irreversible: \"{REASON}\"\n")
    } else {
        String::new()
    };
    api.deployed(token, &api.descriptor_at(version, &mark))
        .await
}

/// `POST` of `body` to `uri` as `token`, expected to be submitted: the new deploy's id,
/// once it succeeded.
async fn resubmitted(api: &Api, token: &str, uri: &str, body: Value, what: &str) -> String {
    let (status, answer) = api.call("POST", uri, Some(token), &body.to_string()).await;
    assert_eq!(status, StatusCode::CREATED, "{what} is submitted: {answer}");
    let id = answer["id"].as_str().expect("an id").to_string();
    api.succeeds(&id).await;
    id
}

/// `POST` of `body` to `uri` as `token`, expected to be refused by the guard naming
/// `irreversible` (the deploy of 2.0): the message.
async fn refused(api: &Api, token: &str, uri: &str, body: Value, irreversible: &str) -> String {
    let before = api.deploy_count().await;
    let (status, answer) = api.call("POST", uri, Some(token), &body.to_string()).await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (StatusCode::CONFLICT, &json!("conflict")),
        "{uri} {body} goes back past an irreversible deploy: a 409 with the error body: {answer}"
    );
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    for (part, why) in [
        (irreversible, "the irreversible deploy's id"),
        ("version 2.0", "its version"),
        (REASON, "its reason"),
        ("--force", "how to go back anyway"),
    ] {
        assert!(message.contains(part), "the refusal names {why}: {message}");
    }
    assert_eq!(
        api.deploy_count().await,
        before,
        "a refused rollback enqueues nothing"
    );
    message.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn going_back_past_an_irreversible_deploy_is_a_409_naming_it_until_forced_and_audited() {
    let mut api = Api::new().await;
    let _worker = api.worker().await;
    let root = api.token("root", Role::Admin).await;
    let ci = api.token("ci", Role::Deployer).await;
    let viewer = api.token("eve", Role::Viewer).await;

    let old = deployed(&api, &root, "1.0", false).await;
    let migration = deployed(&api, &root, "2.0", true).await;
    deployed(&api, &root, "2.1", false).await;
    history_marks_the_irreversible_deploy(&api, &root, &migration).await;

    let (status, answer) = api
        .call("POST", ROLLBACK, Some(&viewer), r#"{"to": "1.0"}"#)
        .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a token that may not deploy is refused before the guard is asked: {answer}"
    );
    refused(&api, &ci, ROLLBACK, json!({"to": "1.0"}), &migration).await;
    refused(
        &api,
        &ci,
        ROLLBACK,
        json!({"to": "1.0", "fast": true}),
        &migration,
    )
    .await;
    let redeploy_old = format!("/api/v1/deploys/{old}/redeploy");
    refused(&api, &ci, &redeploy_old, Value::Null, &migration).await;

    // The irreversible deploy's own version, and a version that ran after it, are no going
    // back; a rollback to 2.0 carries its mark, and still 2.1 is a rollback away.
    resubmitted(
        &api,
        &ci,
        ROLLBACK,
        json!({"to": "2.0"}),
        "a rollback to 2.0",
    )
    .await;
    resubmitted(
        &api,
        &ci,
        ROLLBACK,
        json!({"to": "2.1"}),
        "a rollback to 2.1",
    )
    .await;

    let forced = resubmitted(
        &api,
        &ci,
        ROLLBACK,
        json!({"to": "1.0", "force": true}),
        "a forced rollback to 1.0",
    )
    .await;
    the_force_is_audited_naming_who_and_what(&api, (&root, &ci), &forced, &migration).await;
    // A version forced back does not count as run after the change: going to it again
    // needs --force again.
    refused(
        &api,
        &ci,
        &format!("/api/v1/deploys/{forced}/redeploy"),
        Value::Null,
        &migration,
    )
    .await;
    resubmitted(&api, &ci, ROLLBACK, json!({}), "a rollback from 1.0 to 2.1").await;
}

/// `GET …/history` has the reason on the irreversible deploy and null on the others.
async fn history_marks_the_irreversible_deploy(api: &Api, token: &str, migration: &str) {
    let (status, history) = api
        .get(
            "/api/v1/apps/acme/web/environments/prod/history",
            Some(token),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "the history: {history}");
    let marks: Vec<(&str, &Value)> = history
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| (d["version"].as_str().unwrap_or("?"), &d["irreversible"]))
        .collect();
    assert_eq!(
        marks,
        [
            ("2.1", &Value::Null),
            ("2.0", &json!(REASON)),
            ("1.0", &Value::Null)
        ],
        "history marks the irreversible deploy {migration} with its reason: {history}"
    );
}

/// The audit trail has an entry `deploy.force_irreversible` by `ci` (name and id) about
/// the forced rollback `forced`, naming the irreversible deploy it went back past.
async fn the_force_is_audited_naming_who_and_what(
    api: &Api,
    (root, ci): (&str, &str),
    forced: &str,
    migration: &str,
) {
    let entries = audit::list(
        &api.client.records(),
        &AuditFilter {
            action: Some("deploy.force_irreversible".into()),
            ..AuditFilter::newest(10)
        },
    )
    .await
    .expect("read the audit trail");
    let [entry] = entries.as_slice() else {
        panic!("one forced rollback, one entry: {entries:?}");
    };
    let (_, tokens) = api.get("/api/v1/tokens", Some(root)).await;
    let ci_id = tokens
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["name"] == "ci")
        .map(|t| t["id"].clone())
        .unwrap_or_default();
    assert_eq!(
        (entry.actor.as_str(), json!(entry.actor_id), entry.outcome),
        ("ci", ci_id, 201),
        "the entry says who forced it, by name and token id: {entry:?}"
    );
    assert!(
        entry.target.starts_with(forced) && entry.target.contains("acme/web"),
        "its target is the forced rollback's deploy and application: {entry:?}"
    );
    assert!(
        entry.detail.contains(migration)
            && entry.detail.contains(REASON)
            && entry.detail.contains("rollback of deploy")
            && entry.detail.contains("forced by ci"),
        "its detail names what was forced past which irreversible deploy: {entry:?}"
    );
    let (_, status) = api
        .get(&format!("/api/v1/deploys/{forced}"), Some(ci))
        .await;
    assert_eq!(
        (&status["version"], &status["irreversible"]),
        (&json!("1.0"), &Value::Null),
        "the forced rollback deploys 1.0, which is not marked: {status}"
    );
}
