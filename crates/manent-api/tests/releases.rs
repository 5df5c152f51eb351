//! Releases through the router: an environment's history, the version live in it, rollback
//! to an earlier successful version and redeploy of a past deploy (docs/cli.md, "Releases"),
//! with their authorisation (viewers refused, other tenants' deploys and environments 404),
//! the refusals that say there is nothing to roll back to, and the submission path they go
//! through (today's rules, approvals, the caller as submitter).

mod common;

use std::time::Duration;

use axum::http::StatusCode;
use common::{Api, WAIT};
use manent_api::{Role, auth};
use serde_json::{Value, json};

const HISTORY: &str = "/api/v1/apps/acme/web/environments/prod/history";
const ROLLBACK: &str = "/api/v1/apps/acme/web/environments/prod/rollback";

/// A descriptor of acme/web in prod at `version` (the same verified artifact each time).
fn descriptor(api: &Api, version: &str, dry_run: bool) -> String {
    api.descriptor_at(version, &format!("dry_run: {dry_run}\n"))
}

/// Submits `version` as `token` and waits for its success; returns its id.
async fn deployed(api: &Api, token: &str, version: &str, dry_run: bool) -> String {
    api.deployed(token, &descriptor(api, version, dry_run))
        .await
}

async fn succeeds(api: &Api, id: &str) {
    api.succeeds(id).await
}

fn versions(list: &Value) -> Vec<&str> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|d| d["version"].as_str().unwrap_or("?"))
        .collect()
}

/// The version `GET /apps` shows live in acme/web prod.
async fn live(api: &Api, token: &str) -> Value {
    let (status, apps) = api.get("/api/v1/apps", Some(token)).await;
    assert_eq!(status, StatusCode::OK, "the applications: {apps}");
    apps.as_array()
        .into_iter()
        .flatten()
        .find(|a| a["application"] == "acme/web")
        .map(|a| a["live"]["prod"].clone())
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_deploys_the_recorded_artifacts_of_the_version_before_the_live_one() {
    let mut api = Api::new().await;
    let worker = api.worker().await;
    let root = api.token("root", Role::Admin).await;
    let ci = api.token("ci", Role::Deployer).await;

    let first = deployed(&api, &root, "1.0", false).await;
    let second = deployed(&api, &root, "1.1", false).await;
    // A dry run is never live and never a version to return to.
    deployed(&api, &root, "0.9", true).await;
    assert_eq!(
        live(&api, &ci).await["version"],
        "1.1",
        "the last successful deploy that was not a dry run is live"
    );

    let (status, body) = api.call("POST", ROLLBACK, Some(&ci), "").await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the rollback is submitted: {body}"
    );
    assert_eq!(
        (
            &body["redeploy_of"],
            &body["redeploy_kind"],
            &body["version"]
        ),
        (&json!(first), &json!("rollback"), &json!("1.0")),
        "it resubmits the deploy of the version before the live one: {body}"
    );
    let rollback = body["id"].as_str().unwrap().to_string();
    succeeds(&api, &rollback).await;

    let (_, original) = api
        .get(&format!("/api/v1/deploys/{first}"), Some(&root))
        .await;
    let (_, again) = api
        .get(&format!("/api/v1/deploys/{rollback}"), Some(&root))
        .await;
    assert_eq!(
        again["artifacts"], original["artifacts"],
        "the rollback deploys the recorded artifacts, URLs and sha256 included"
    );
    assert_eq!(
        (&again["redeploy_of"], &again["redeploy_kind"]),
        (&json!(first), &json!("rollback")),
        "the new deploy records where it came from: {again}"
    );
    assert_eq!(
        again["submitted_by"], "ci",
        "the caller submits the rollback, not the original submitter"
    );
    assert!(
        again["duration_ms"].as_i64().is_some_and(|ms| ms >= 0)
            && again["finished_at"].is_string()
            && again["started_at"].is_string(),
        "a finished deploy has its start, end and duration: {again}"
    );
    assert_eq!(
        live(&api, &ci).await,
        json!({"version": "1.0", "deploy_id": rollback, "finished_at": again["finished_at"],
               "submitted_by": "ci"}),
        "1.0 is live again, through the rollback's deploy, submitted by the caller"
    );

    let (status, history) = api.get(HISTORY, Some(&ci)).await;
    assert_eq!(status, StatusCode::OK, "the history: {history}");
    assert_eq!(
        versions(&history),
        ["1.0", "0.9", "1.1", "1.0"],
        "the environment's deploys, newest first, dry run included"
    );
    assert_eq!(
        history[1]["dry_run"], true,
        "the dry run is marked as one: {history}"
    );

    let (status, body) = api
        .call(
            "POST",
            &format!("/api/v1/deploys/{second}/redeploy"),
            Some(&ci),
            "",
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the redeploy is submitted: {body}"
    );
    assert_eq!(
        (
            &body["redeploy_of"],
            &body["redeploy_kind"],
            &body["version"]
        ),
        (&json!(second), &json!("redeploy"), &json!("1.1")),
        "it resubmits the named deploy: {body}"
    );
    succeeds(&api, body["id"].as_str().unwrap()).await;
    assert_eq!(
        live(&api, &ci).await["version"],
        "1.1",
        "the redeployed 1.1 is live"
    );

    // `to`: the newest successful deploy of that version.
    let (status, body) = api
        .call("POST", ROLLBACK, Some(&ci), r#"{"to": "1.0"}"#)
        .await;
    assert_eq!(status, StatusCode::CREATED, "a rollback to 1.0: {body}");
    assert_eq!(
        body["redeploy_of"], rollback,
        "the newest successful deploy of 1.0 is resubmitted: {body}"
    );
    succeeds(&api, body["id"].as_str().unwrap()).await;
    worker.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_to_roll_back_to_is_refused_with_the_reason() {
    let mut api = Api::new().await;
    let root = api.token("root", Role::Admin).await;

    let (status, body) = api.call("POST", ROLLBACK, Some(&root), "").await;
    assert_eq!(status, StatusCode::CONFLICT, "no deploy at all: {body}");
    assert!(
        body["error"]["message"].as_str().is_some_and(
            |m| m.contains("nothing to roll back to") && m.contains("no successful deploy yet")
        ),
        "the refusal says why: {body}"
    );

    let worker = api.worker().await;
    let only = deployed(&api, &root, "1.0", false).await;
    deployed(&api, &root, "0.9", true).await;
    let before = api.deploy_count().await;
    for (body, says) in [
        ("", "is the only version"),
        (r#"{"to": "1.0"}"#, "is live in acme/web prod now"),
        (r#"{"to": "0.9"}"#, "no successful deploy of version 0.9"),
        (r#"{"to": "7"}"#, "no successful deploy of version 7"),
    ] {
        let (status, answer) = api.call("POST", ROLLBACK, Some(&root), body).await;
        assert_eq!(
            status,
            StatusCode::CONFLICT,
            "rollback `{body}` with only 1.0 successful: {answer}"
        );
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("nothing to roll back to") && message.contains(says),
            "the refusal of `{body}` says `{says}`: {message}"
        );
    }
    assert!(
        api.call("POST", ROLLBACK, Some(&root), "").await.1["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&only)),
        "the refusal names the live deploy"
    );
    let (status, answer) = api
        .call("POST", ROLLBACK, Some(&root), r#"{"version": "1.0"}"#)
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "an unknown body field is refused: {answer}"
    );
    assert_eq!(
        api.deploy_count().await,
        before,
        "a refused rollback enqueues nothing"
    );
    let (status, answer) = api
        .call(
            "POST",
            "/api/v1/deploys/no-such-deploy/redeploy",
            Some(&root),
            "",
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "no deploy to redeploy: {answer}"
    );
    worker.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewers_are_refused_and_other_tenants_see_nothing() {
    let mut api = Api::new().await;
    let worker = api.worker().await;
    let root = api.token("root", Role::Admin).await;
    let first = deployed(&api, &root, "1.0", false).await;
    deployed(&api, &root, "1.1", false).await;
    let viewer = api.token("watcher", Role::Viewer).await;
    let stranger = auth::create_token(&api.client.records(), "ml-ci", Role::Deployer, Some("ml/*"))
        .await
        .expect("a token scoped to another tenant");
    let redeploy = format!("/api/v1/deploys/{first}/redeploy");
    let before = api.deploy_count().await;

    for (method, uri) in [("POST", redeploy.as_str()), ("POST", ROLLBACK)] {
        let (status, body) = api.call(method, uri, Some(&viewer), "").await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "a viewer may not {uri}: {body}"
        );
    }
    let (status, body) = api.get(HISTORY, Some(&viewer)).await;
    assert_eq!(
        (status, versions(&body)),
        (StatusCode::OK, vec!["1.1", "1.0"]),
        "a viewer reads the history: {body}"
    );

    for (method, uri) in [
        ("POST", redeploy.as_str()),
        ("POST", ROLLBACK),
        ("GET", HISTORY),
    ] {
        let (status, body) = api.call(method, uri, Some(&stranger), "").await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "another tenant's {uri} is not found: {body}"
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            !message.contains("1.0") && !message.contains("1.1"),
            "the 404 reveals nothing of what acme/web ran: {message}"
        );
    }
    let (_, apps) = api.get("/api/v1/apps", Some(&stranger)).await;
    assert!(
        !apps.to_string().contains("acme"),
        "another tenant's live versions are not listed: {apps}"
    );
    assert_eq!(
        api.deploy_count().await,
        before,
        "refused rollbacks and redeploys enqueue nothing"
    );
    worker.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redeploy_of_a_deploy_the_current_rules_refuse_is_refused_naming_the_field() {
    let mut api = Api::new().await;
    let worker = api.worker().await;
    let root = api.token("root", Role::Admin).await;
    let id = deployed(&api, &root, "1.0", false).await;
    // Deployed while the environment file handed `params` over (the default); then the
    // operator takes it back: a redeploy is checked against the file as it is now.
    let with_params = format!(
        "{}deploy: {{params: {{replicas: 2}}}}\n",
        descriptor(&api, "1.2", false)
    );
    let (status, body) = api.post_deploy(&root, &with_params).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "params are allowed now: {body}"
    );
    let with_params_id = body["id"].as_str().unwrap().to_string();
    succeeds(&api, &with_params_id).await;
    let env = api.config.environments_source().join("acme/web/prod.yml");
    let text = std::fs::read_to_string(&env).unwrap();
    std::fs::write(&env, format!("{text}overrides: []\n")).unwrap();

    let (status, body) = api
        .call(
            "POST",
            &format!("/api/v1/deploys/{with_params_id}/redeploy"),
            Some(&root),
            "",
        )
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "the environment file no longer allows params: {body}"
    );
    assert_eq!(
        body["error"]["field"], "deploy.params",
        "the refusal names the field: {body}"
    );
    let (status, body) = api
        .call(
            "POST",
            &format!("/api/v1/deploys/{id}/redeploy"),
            Some(&root),
            "",
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "a recorded descriptor today's rules accept is submitted: {body}"
    );
    succeeds(&api, body["id"].as_str().unwrap()).await;
    worker.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_waits_for_approval_like_any_deploy_and_its_caller_is_its_submitter() {
    let mut api = Api::new().await;
    let worker = api.worker().await;
    let root = api.token("root", Role::Admin).await;
    let ci = api.token("ci", Role::Deployer).await;
    deployed(&api, &ci, "1.0", false).await;
    deployed(&api, &ci, "1.1", false).await;
    // From now on prod needs an approval.
    let env = api.config.environments_source().join("acme/web/prod.yml");
    let text = std::fs::read_to_string(&env).unwrap();
    std::fs::write(&env, format!("{text}approval: {{count: 1}}\n")).unwrap();

    let (status, body) = api.call("POST", ROLLBACK, Some(&root), "").await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the rollback is submitted: {body}"
    );
    let id = body["id"].as_str().unwrap().to_string();
    let uri = format!("/api/v1/deploys/{id}");
    manent_testkit::eventually("the rollback waits for approval", WAIT, || async {
        let (_, s) = api.get(&uri, Some(&root)).await;
        (s["phase"] == "waiting_approval").then_some(())
    })
    .await;
    let (_, waiting) = api.get(&uri, Some(&root)).await;
    assert_eq!(
        (&waiting["submitted_by"], &waiting["deployed_now"]),
        (&json!("root"), &json!("1.1")),
        "the caller submitted it, and the approver sees what it replaces: {waiting}"
    );
    let (status, body) = api
        .call("POST", &format!("{uri}/approve"), Some(&root), "")
        .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "the caller may not approve its own rollback: {body}"
    );
    let approver = api.token("alice", Role::Approver).await;
    let (status, body) = api
        .call("POST", &format!("{uri}/approve"), Some(&approver), "")
        .await;
    assert_eq!(status, StatusCode::OK, "another approver approves: {body}");
    succeeds(&api, &id).await;
    assert_eq!(live(&api, &ci).await["version"], "1.0", "1.0 is live again");
    worker.shutdown(Duration::from_secs(10)).await;
}
