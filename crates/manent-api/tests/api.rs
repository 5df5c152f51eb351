//! The HTTP API driven in-process with `tower::ServiceExt::oneshot` (no socket): tokens and
//! roles, bad input with the field named, unknown things, a submission, the status of a
//! deploy with the fields of docs/cli.md, health, readiness, queues and workers.

mod common;

use std::time::Duration;

use axum::http::StatusCode;
use common::{ARTIFACT, Api, WAIT};
use manent_api::Role;
use manent_engine::WorkflowStatus;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tower::ServiceExt;

/// `{"error": {"code", "message", ...}}`: the error body every failure has.
fn error_of(body: &Value) -> (&str, &str) {
    let code = body["error"]["code"].as_str();
    let message = body["error"]["message"].as_str();
    match (code, message) {
        (Some(c), Some(m)) => (c, m),
        _ => panic!("an error body is {{\"error\": {{\"code\", \"message\"}}}}, got {body}"),
    }
}

fn assert_fields(value: &Value, fields: &[&str], what: &str) {
    for field in fields {
        assert!(
            value.get(field).is_some(),
            "{what} has the documented field `{field}`: {value:#}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_token_is_refused_with_401_and_a_json_error() {
    let api = Api::new().await;
    let (status, body) = api.get("/api/v1/deploys", None).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "every /api/v1 route needs a token"
    );
    let (code, message) = error_of(&body);
    assert_eq!(code, "unauthorized", "the error code says what is wrong");
    assert!(
        message.contains("Authorization: Bearer"),
        "the message says how to send a token: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_token_is_refused_with_401() {
    let api = Api::new().await;
    api.token("ci", Role::Admin).await;
    let (status, body) = api
        .get("/api/v1/deploys", Some("mnt_not-a-token-of-this-server"))
        .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a token the server never issued is refused like no token"
    );
    assert_eq!(error_of(&body).0, "unauthorized", "the body says why");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_action_on_a_deploy_is_audited_with_the_deploy_as_its_target() {
    let api = Api::new().await;
    let deployer = api.token("ci", Role::Deployer).await;
    let viewer = api.token("alice", Role::Viewer).await;
    let admin = api.token("root", Role::Admin).await;
    let (status, submitted) = api.post_deploy(&deployer, &api.good_descriptor()).await;
    assert_eq!(status, StatusCode::CREATED, "{submitted}");
    let id = submitted["id"].as_str().unwrap();
    let (status, body) = api
        .call(
            "POST",
            &format!("/api/v1/deploys/{id}/cancel"),
            Some(&viewer),
            "",
        )
        .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a viewer may not cancel: {body}"
    );
    let (_, trail) = api.get("/api/v1/audit?limit=10", Some(&admin)).await;
    let refused = trail
        .as_array()
        .expect("the audit trail is a list")
        .iter()
        .find(|e| e["token"] == "alice" && e["outcome"] == 403)
        .unwrap_or_else(|| panic!("the refusal is audited: {trail}"));
    assert_eq!(
        refused["target"], id,
        "the refused action names the deploy it was about: {refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_may_not_submit_a_deploy_and_nothing_is_enqueued() {
    let api = Api::new().await;
    let viewer = api.token("alice", Role::Viewer).await;
    let (status, body) = api.post_deploy(&viewer, &api.good_descriptor()).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a viewer may read but not deploy: {body}"
    );
    let (code, message) = error_of(&body);
    assert_eq!(
        code, "forbidden",
        "the error code says the token lacks the right"
    );
    assert!(
        message.contains("alice") && message.contains("acme/web"),
        "the message names the token and what it may not do: {message}"
    );
    assert_eq!(
        api.deploy_count().await,
        0,
        "a refused submission enqueues nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descriptor_without_environment_is_a_400_naming_the_field() {
    let api = Api::new().await;
    let deployer = api.token("ci", Role::Deployer).await;
    let text = api.good_descriptor().replace("environment: prod\n", "");
    let (status, body) = api.post_deploy(&deployer, &text).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "a descriptor without its environment is bad input: {body}"
    );
    let (code, message) = error_of(&body);
    assert_eq!(code, "bad_request", "the code says the input is bad");
    assert_eq!(
        body["error"]["field"], "environment",
        "the error names the missing field: {body}"
    );
    assert!(
        message.contains("environment"),
        "the message mentions the field: {message}"
    );
    assert_eq!(api.deploy_count().await, 0, "bad input enqueues nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_sha256_is_a_400_naming_the_artifact_field() {
    let api = Api::new().await;
    let deployer = api.token("ci", Role::Deployer).await;
    let text = api.descriptor("acme/web", "not-a-checksum");
    let (status, body) = api.post_deploy(&deployer, &text).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "a sha256 that is not 64 hex digits is bad input: {body}"
    );
    assert_eq!(
        body["error"]["field"], "artifacts[0].sha256",
        "the error names the artifact's sha256 field: {body}"
    );
    let message = error_of(&body).1;
    assert!(
        message.contains("sha256"),
        "the message mentions the field: {message}"
    );
    assert_eq!(api.deploy_count().await, 0, "bad input enqueues nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_while_the_environments_source_cannot_be_read_is_routed_by_artifact_type() {
    let api = Api::new().await;
    let deployer = api.token("ci", Role::Deployer).await;
    // What a network mount that went away looks like: the source is not there at all.
    let source = api.config.environments_source();
    std::fs::rename(&source, source.with_extension("away")).expect("take the source away");
    let (status, body) = api.post_deploy(&deployer, &api.good_descriptor()).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the environment cannot be read now, so the deploy is accepted and resolves its \
         environment when it runs: {body}"
    );
    assert_eq!(
        body["queue"], "default",
        "no plugin claims its artifact type: the default queue: {body}"
    );
    assert_eq!(api.deploy_count().await, 1, "the deploy is enqueued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelt_environment_or_application_is_a_404_naming_the_field_and_the_nearest_name() {
    let api = Api::new().await;
    let deployer = api.token("ci", Role::Deployer).await;
    let sha = hex::encode(Sha256::digest(ARTIFACT));
    let typo = api
        .good_descriptor()
        .replace("environment: prod", "environment: prdo");
    let (status, body) = api.post_deploy(&deployer, &typo).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a typo is refused at once: {body}"
    );
    let (_, message) = error_of(&body);
    assert!(
        message.starts_with("environment: ") && message.contains("did you mean `prod`?"),
        "the refusal names the field and the nearest environment: {message}"
    );
    let (status, body) = api
        .post_deploy(&deployer, &api.descriptor("acme/wbe", &sha))
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "an unknown application too: {body}"
    );
    let (_, message) = error_of(&body);
    assert!(
        message.starts_with("application: ") && message.contains("did you mean `acme/web`?"),
        "the refusal names the field and the nearest application: {message}"
    );
    assert_eq!(api.deploy_count().await, 0, "nothing is enqueued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_submission_is_201_with_id_status_and_the_default_queue() {
    let api = Api::new().await;
    let deployer = api.token("ci", Role::Deployer).await;
    let (status, body) = api.post_deploy(&deployer, &api.good_descriptor()).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "a valid descriptor is accepted: {body}"
    );
    let id = body["id"].as_str().expect("the answer has the deploy's id");
    assert!(!id.is_empty(), "the id is not empty");
    assert_eq!(
        body["status"], "ENQUEUED",
        "no worker runs here, so the deploy waits on its queue: {body}"
    );
    assert_eq!(
        body["queue"], "default",
        "with no routing configured, the deploy goes to the default queue: {body}"
    );
    let record = api
        .client
        .get(id)
        .await
        .unwrap()
        .expect("the deploy is stored");
    assert_eq!(
        record.status,
        WorkflowStatus::Enqueued,
        "the stored deploy is the one answered"
    );
}

/// `{"deploys": [{"descriptor": text}, …]}`, the body of a bulk submission.
fn batch_of(descriptors: &[String]) -> String {
    let entries: Vec<Value> = descriptors
        .iter()
        .map(|d| serde_json::json!({ "descriptor": d }))
        .collect();
    serde_json::json!({ "deploys": entries }).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_submission_enqueues_every_deploy_and_answers_them_in_order() {
    let api = Api::new().await;
    let deployer = api.token("ci", Role::Deployer).await;
    let sha = hex::encode(Sha256::digest(ARTIFACT));
    // Two of acme/web's prod and one of acme/shop's.
    let shop = api.config.environments_source().join("acme/shop/prod.yml");
    std::fs::create_dir_all(shop.parent().unwrap()).unwrap();
    std::fs::write(
        &shop,
        "targets:\n  - {name: t1, host: local}\ndeploy:\n  plugin: command\n  commands: [\"true\"]\n",
    )
    .unwrap();
    let descriptors = vec![
        api.good_descriptor(),
        api.descriptor("acme/shop", &sha),
        api.good_descriptor(),
    ];
    let (status, body) = api
        .call(
            "POST",
            "/api/v1/deploys/batch",
            Some(&deployer),
            &batch_of(&descriptors),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "all three are valid: {body}");
    let answers = body.as_array().expect("one answer per deploy");
    assert_eq!(answers.len(), 3, "one answer per deploy, in order: {body}");
    let mut ids = Vec::new();
    for answer in answers {
        assert_fields(answer, &["id", "status", "queue"], "each batch answer");
        assert_eq!(
            answer["status"], "ENQUEUED",
            "no worker runs here: {answer}"
        );
        assert_eq!(
            answer["queue"], "default",
            "no routing configured: {answer}"
        );
        ids.push(answer["id"].as_str().unwrap().to_string());
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "each deploy has its own id: {body}");
    let (_, second) = api
        .get(
            &format!("/api/v1/deploys/{}", answers[1]["id"].as_str().unwrap()),
            Some(&deployer),
        )
        .await;
    assert_eq!(
        second["application"], "acme/shop",
        "the answers are in the order the deploys were given: {second}"
    );
    assert_eq!(api.deploy_count().await, 3, "all three are stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_bulk_submission_answers_every_id_and_is_audited_with_them() {
    let api = Api::new().await;
    let admin = api.token("ops", Role::Admin).await;
    let descriptors = vec![api.good_descriptor(); manent_deploy::submission::MAX_BATCH];
    let (status, body) = api
        .call(
            "POST",
            "/api/v1/deploys/batch",
            Some(&admin),
            &batch_of(&descriptors),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "a full batch is accepted");
    // About 85 KB of answer: more than the audit trail once read of an answer, which then
    // answered nothing at all.
    let ids: Vec<&str> = body
        .as_array()
        .unwrap_or_else(|| panic!("the answer reaches the client whole, got {body}"))
        .iter()
        .filter_map(|a| a["id"].as_str())
        .collect();
    assert_eq!(
        ids.len(),
        manent_deploy::submission::MAX_BATCH,
        "every deploy's id is answered"
    );
    let (_, listed) = api.get("/api/v1/deploys?limit=1000", Some(&admin)).await;
    assert_eq!(
        listed.as_array().map_or(0, Vec::len),
        manent_deploy::submission::MAX_BATCH,
        "every deploy is stored"
    );
    let (_, trail) = api.get("/api/v1/audit?limit=1", Some(&admin)).await;
    let entry = &trail[0];
    assert_eq!(
        entry["action"], "deploy.submit_batch",
        "the batch is audited: {entry}"
    );
    let target = entry["target"].as_str().unwrap_or_default();
    assert!(
        ids.iter().all(|id| target.contains(id)),
        "the audit entry names every deploy the batch created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_submission_with_one_refused_deploy_enqueues_none_and_names_it() {
    let api = Api::new().await;
    let deployer = api.token("ci", Role::Deployer).await;
    let good = api.good_descriptor();
    let cron = format!("{good}schedule: {{cron: \"0 3 * * *\"}}\n");
    let too_many = vec![good.clone(); manent_deploy::submission::MAX_BATCH + 1];
    // (body, the field the 400 must name)
    let cases: Vec<(String, &str)> = vec![
        (
            batch_of(&[
                good.clone(),
                api.descriptor("acme/web", "not-a-checksum"),
                good.clone(),
            ]),
            "deploys[1].artifacts[0].sha256",
        ),
        (
            batch_of(&[good.clone(), "application: [unclosed".into()]),
            "deploys[1]",
        ),
        (batch_of(&[good.clone(), cron]), "deploys[1].schedule.cron"),
        (batch_of(&[]), "deploys"),
        (batch_of(&too_many), "deploys"),
        (good.clone(), "deploys"),
        ("{\"deploys\": [{\"file\": \"a.yml\"}]}".into(), "deploys"),
    ];
    for (body, field) in cases {
        let (status, answer) = api
            .call("POST", "/api/v1/deploys/batch", Some(&deployer), &body)
            .await;
        let shown: String = body.chars().take(120).collect();
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "refused as bad input: {shown} -> {answer}"
        );
        let error_field = answer["error"]["field"].as_str().unwrap_or_default();
        assert!(
            error_field.starts_with(field),
            "the error names {field}, got {error_field}: {answer}"
        );
        assert!(
            error_of(&answer)
                .1
                .starts_with(field.split('.').next().unwrap()),
            "the message says which deploy: {answer}"
        );
        assert_eq!(
            api.deploy_count().await,
            0,
            "a refused batch enqueues none of its deploys: {shown}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_of_a_finished_deploy_has_the_fields_of_the_contract() {
    let mut api = Api::new().await;
    let worker = api.worker().await;
    let deployer = api.token("ci", Role::Deployer).await;
    let viewer = api.token("alice", Role::Viewer).await;
    let (status, body) = api.post_deploy(&deployer, &api.good_descriptor()).await;
    assert_eq!(status, StatusCode::CREATED, "submitted: {body}");
    let id = body["id"].as_str().unwrap().to_string();
    let record = api.client.wait(&id, WAIT).await.expect("the deploy ends");
    assert_eq!(
        record.status,
        WorkflowStatus::Success,
        "the local target runs `true`, so the deploy succeeds: {:?}",
        record.error
    );

    let (status, view) = api
        .get(&format!("/api/v1/deploys/{id}"), Some(&viewer))
        .await;
    assert_eq!(status, StatusCode::OK, "a viewer may read a deploy: {view}");
    assert_fields(
        &view,
        &[
            "id",
            "application",
            "environment",
            "status",
            "phase",
            "queue",
            "executor_id",
            "dry_run",
            "targets",
            "steps",
        ],
        "a deploy's status",
    );
    assert_eq!(view["id"], id.as_str(), "it is the deploy asked for");
    assert_eq!(view["application"], "acme/web", "from the descriptor");
    assert_eq!(view["environment"], "prod", "from the descriptor");
    assert_eq!(view["status"], "SUCCESS", "the final status");
    assert_eq!(view["queue"], "default", "the queue it ran from");
    assert_eq!(
        view["executor_id"],
        worker.executor_id(),
        "the worker that ran it"
    );
    assert_eq!(view["dry_run"], false, "it was a real deploy");
    let targets = view["targets"].as_array().expect("targets is an array");
    assert_eq!(targets.len(), 1, "the environment has one target: {view:#}");
    assert_fields(&targets[0], &["name", "status"], "a target");
    assert_eq!(
        (&targets[0]["name"], &targets[0]["status"]),
        (&Value::from("t1"), &Value::from("deployed")),
        "t1 ran the command and is deployed"
    );
    let steps = view["steps"].as_array().expect("steps is an array");
    assert!(!steps.is_empty(), "a finished deploy has steps: {view:#}");
    for s in steps {
        assert_fields(
            s,
            &[
                "name",
                "status",
                "attempts",
                "started_at",
                "finished_at",
                "executor_id",
            ],
            "a step",
        );
    }
    assert!(
        steps.iter().any(|s| s["name"] == "t1: command 1"),
        "the command plugin's command is a step of its own: {view:#}"
    );
    worker.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_held_with_wait_ms_is_answered_with_the_deploys_end() {
    let mut api = Api::new().await;
    let deployer = api.token("ci", Role::Deployer).await;
    let (status, body) = api.post_deploy(&deployer, &api.good_descriptor()).await;
    assert_eq!(status, StatusCode::CREATED, "submitted: {body}");
    let id = body["id"].as_str().unwrap().to_string();
    let (status, body) = api
        .get(
            &format!("/api/v1/deploys/{id}?wait_ms=10001"),
            Some(&deployer),
        )
        .await;
    assert_eq!(
        (status, error_of(&body).1.contains("wait_ms is 10001")),
        (StatusCode::BAD_REQUEST, true),
        "a wait over 10 s is refused, naming the field: {body}"
    );
    let (status, body) = api
        .get(
            &format!("/api/v1/deploys/{id}?wait_ms=soon"),
            Some(&deployer),
        )
        .await;
    assert_eq!(
        (status, error_of(&body).0),
        (StatusCode::BAD_REQUEST, "bad_request"),
        "a wait that is not a number is refused: {body}"
    );
    // No worker yet: the deploy is queued when the request is held, and runs meanwhile.
    let request = axum::http::Request::get(format!("/api/v1/deploys/{id}?wait_ms=10000"))
        .header("authorization", format!("Bearer {deployer}"))
        .body(axum::body::Body::empty())
        .unwrap();
    let held = tokio::spawn(common::answer(api.router.clone(), request));
    let _worker = api.worker().await;
    let (status, body) = held.await.unwrap();
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("SUCCESS")),
        "the held answer is the deploy as it ended, not as it was when asked: {body}"
    );
    let (status, _) = api
        .get(
            "/api/v1/deploys/no-such-deploy?wait_ms=10000",
            Some(&deployer),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "an unknown deploy is a 404 at once, never waited for"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_of_an_unknown_deploy_is_a_404() {
    let api = Api::new().await;
    let viewer = api.token("alice", Role::Viewer).await;
    let (status, body) = api
        .get("/api/v1/deploys/no-such-deploy", Some(&viewer))
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "no deploy has that id: {body}"
    );
    let message = error_of(&body).1;
    assert!(
        message.contains("no-such-deploy"),
        "the message names the id: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_readiness_answer_without_a_token() {
    let api = Api::new().await;
    let (status, _) = api.get("/healthz", None).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "/healthz says the process is up, without a token"
    );
    let (status, _) = api.get("/readyz", None).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "/readyz says the database is reachable and its schema current"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_and_workers_are_arrays_with_the_fields_of_the_contract() {
    let mut api = Api::new().await;
    let worker = api.worker().await;
    let viewer = api.token("alice", Role::Viewer).await;

    let (status, queues) = api.get("/api/v1/queues", Some(&viewer)).await;
    assert_eq!(status, StatusCode::OK, "a viewer may list queues: {queues}");
    let queues = queues.as_array().expect("queues is an array");
    for q in queues {
        assert_fields(
            q,
            &[
                "name",
                "kind",
                "concurrency",
                "environment_concurrency",
                "global_concurrency",
                "enqueued",
                "running",
                "workers",
            ],
            "a queue",
        );
    }
    let default = queues
        .iter()
        .find(|q| q["name"] == "default")
        .expect("the default queue is listed");
    assert_eq!(default["kind"], "default", "its kind is default");
    assert_eq!(
        default["workers"],
        serde_json::json!([worker.executor_id()]),
        "the running worker serves the default queue"
    );

    let (status, workers) = api.get("/api/v1/workers", Some(&viewer)).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a viewer may list workers: {workers}"
    );
    let workers = workers.as_array().expect("workers is an array");
    assert_eq!(workers.len(), 1, "one worker is registered: {workers:?}");
    assert_fields(
        &workers[0],
        &[
            "executor_id",
            "host",
            "region",
            "state",
            "heartbeat_at",
            "running",
        ],
        "a worker",
    );
    assert_eq!(
        workers[0]["executor_id"],
        worker.executor_id(),
        "it is the worker started here"
    );
    assert_eq!(workers[0]["state"], "running", "the worker is running");
    worker.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_and_applications_come_from_the_environments_source() {
    let api = Api::new().await;
    let source = api.config.environments_source();
    std::fs::create_dir_all(source.join("acme/api")).unwrap();
    std::fs::write(source.join("acme/api/staging.yml"), "targets: []\n").unwrap();
    std::fs::write(source.join("acme/api/notes.txt"), "not an environment").unwrap();
    let token = api.token("viewer", Role::Viewer).await;
    let (status, apps) = api.get("/api/v1/apps", Some(&token)).await;
    assert_eq!(status, StatusCode::OK, "{apps}");
    assert_eq!(
        apps,
        serde_json::json!([
            {"application": "acme/api", "tenant": "acme", "environments": ["staging"], "live": {}, "can_deploy": false},
            {"application": "acme/web", "tenant": "acme", "environments": ["prod"], "live": {}, "can_deploy": false},
        ]),
        "each <tenant>/<app>/<env>.yml is an environment; other files are not; nothing is live          before a successful deploy"
    );
    let (status, tenants) = api.get("/api/v1/tenants", Some(&token)).await;
    assert_eq!(status, StatusCode::OK, "{tenants}");
    assert_eq!(
        tenants,
        serde_json::json!([
            {"name": "acme", "queue": null, "declared": false, "applications": ["acme/api", "acme/web"]},
        ]),
        "a tenant with environment files is listed even if manent.yml does not declare it"
    );
}

/// `/metrics`, without a token: its status and text.
async fn scrape(api: &Api) -> (StatusCode, String) {
    let response = api
        .router
        .clone()
        .oneshot(
            axum::http::Request::get("/metrics")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// The value of `series` (a metric's name with its labels) in a scrape; 0 when absent.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Submits a deploy and waits for its end.
async fn deployed(api: &Api, token: &str) {
    let (status, created) = api.post_deploy(token, &api.good_descriptor()).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    api.client.wait(&id, WAIT).await.expect("the deploy ends");
}

/// Scrapes until `n` successful deploys have been counted as ended.
async fn scraped_after(api: &Api, n: f64) -> String {
    manent_testkit::eventually(
        &format!("/metrics counts {n} successful deploys ended"),
        WAIT,
        || async {
            let (_, text) = scrape(api).await;
            (sample(&text, "manent_deploys_ended_total{status=\"SUCCESS\"}") >= n).then_some(text)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_without_a_token_with_deploys_queues_and_workers() {
    let mut api = Api::new().await;
    let worker = api.worker().await;
    let token = api.token("deployer", Role::Deployer).await;
    deployed(&api, &token).await;
    let (status, text) = scrape(&api).await;
    assert_eq!(status, StatusCode::OK, "no token needed");
    for line in [
        "manent_deploys{status=\"SUCCESS\"} 1",
        "manent_queue_enqueued{queue=\"default\",kind=\"default\"} 0",
        "# TYPE manent_step_duration_seconds histogram",
        "manent_step_duration_seconds_count ",
        "manent_claim_latency_seconds_bucket{le=\"0.005\"} ",
        "manent_worker_up{executor_id=\"",
        "manent_api_refused_requests_total{status=\"401\"} ",
    ] {
        assert!(text.contains(line), "the metrics have `{line}`:\n{text}");
    }
    assert!(
        text.ends_with("# EOF\n"),
        "a whole OpenMetrics exposition:\n{text}"
    );
    worker.shutdown(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histograms_and_counters_add_up_across_scrapes() {
    let mut api = Api::new().await;
    let worker = api.worker().await;
    let token = api.token("deployer", Role::Deployer).await;
    deployed(&api, &token).await;
    let first = scraped_after(&api, 1.0).await;
    deployed(&api, &token).await;
    let second = scraped_after(&api, 2.0).await;
    for histogram in [
        "manent_step_duration_seconds",
        "manent_claim_latency_seconds",
    ] {
        let count = |text: &str| sample(text, &format!("{histogram}_count"));
        assert!(
            count(&second) > count(&first) && count(&first) > 0.0,
            "{histogram} counts the second deploy on top of the first: {} then {}",
            count(&first),
            count(&second)
        );
        let sum = |text: &str| sample(text, &format!("{histogram}_sum"));
        assert!(
            sum(&second) >= sum(&first),
            "{histogram}_sum never goes down"
        );
        for le in ["0.005", "0.1", "1.0", "60.0", "+Inf"] {
            let bucket = format!("{histogram}_bucket{{le=\"{le}\"}}");
            assert!(
                sample(&second, &bucket) >= sample(&first, &bucket),
                "{bucket} is cumulative: {} then {}",
                sample(&first, &bucket),
                sample(&second, &bucket)
            );
        }
        assert_eq!(
            sample(&second, &format!("{histogram}_bucket{{le=\"+Inf\"}}")),
            count(&second),
            "the +Inf bucket holds every observation"
        );
    }
    worker.shutdown(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_whose_recorded_input_cannot_be_read_is_an_error_naming_it_not_a_404() {
    let api = Api::new().await;
    let viewer = api.token("alice", Role::Viewer).await;
    // A deploy workflow whose input a newer (or broken) writer left unreadable.
    let record = api
        .client
        .enqueue(
            manent_engine::EnqueueRequest::new(
                manent_deploy::DEPLOY_WORKFLOW,
                "nobody-serves-this",
                serde_json::json!({"descriptor": "not a descriptor"}),
            )
            .id("garbled"),
        )
        .await
        .expect("enqueue a raw workflow");
    let (status, body) = api.get("/api/v1/deploys/garbled", Some(&viewer)).await;
    assert_eq!(
        status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "the deploy exists but cannot be read: an error, not 404: {body}"
    );
    let message = error_of(&body).1;
    assert!(
        message.contains("garbled") && message.contains("cannot be read"),
        "the message names the deploy and the problem: {message}"
    );
    let kept = api.client.get(&record.id).await.unwrap();
    assert!(kept.is_some(), "the record is kept as it is");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_that_cannot_be_read_is_listed_with_its_error_keeps_its_tick_state_and_an_admin_may_delete_it()
 {
    let api = Api::new().await;
    let admin = api.token("root", Role::Admin).await;
    let records = api.client.records();
    records
        .put(
            manent_deploy::background::schedules::SCHEDULE_KIND,
            "garbled",
            "{\"id\": 42}",
            0,
        )
        .await
        .unwrap();
    records
        .put(
            manent_deploy::background::schedules::TICK_KIND,
            "garbled",
            "{\"last_tick\": 1700000000}",
            0,
        )
        .await
        .unwrap();

    let (status, body) = api.get("/api/v1/schedules", Some(&admin)).await;
    assert_eq!(status, StatusCode::OK, "the list still answers: {body}");
    let listed = body
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "garbled")
        .unwrap_or_else(|| panic!("the unreadable schedule is listed, not hidden: {body}"));
    assert!(
        listed["error"].as_str().is_some_and(|e| !e.is_empty()),
        "it carries the reason: {listed}"
    );
    let (status, body) = api.get("/api/v1/schedules/garbled", Some(&admin)).await;
    assert_eq!(
        status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "showing it is an error naming it, not a 404: {body}"
    );
    assert!(error_of(&body).1.contains("garbled"), "{body}");

    manent_deploy::background::schedules::tick_once(
        &api.client,
        &api.tick_policy(),
        manent_engine::now_ms(),
    )
    .await
    .expect("a tick pass goes on past the unreadable schedule");
    assert!(
        records
            .get(manent_deploy::background::schedules::TICK_KIND, "garbled")
            .await
            .unwrap()
            .is_some(),
        "the unreadable schedule's tick state is kept, not taken for an orphan"
    );

    let (status, body) = api
        .call("DELETE", "/api/v1/schedules/garbled", Some(&admin), "")
        .await;
    assert_eq!(status, StatusCode::OK, "an admin may delete it: {body}");
    assert!(
        records
            .get(
                manent_deploy::background::schedules::SCHEDULE_KIND,
                "garbled"
            )
            .await
            .unwrap()
            .is_none(),
        "deleted on request"
    );
}

/// Sends raw bytes; returns the status, the content type and the body as JSON.
async fn raw_call(
    api: &Api,
    method: &str,
    uri: &str,
    token: &str,
    body: Vec<u8>,
) -> (StatusCode, String, Value) {
    let request = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {token}"))
        .body(axum::body::Body::from(body))
        .unwrap();
    let response = api.router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        content_type,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_axum_rejects_before_any_handler_get_the_json_error_body() {
    let api = Api::new().await;
    let admin = api.token("root", Role::Admin).await;
    let check = |what: &str, want: StatusCode, got: (StatusCode, String, Value)| {
        let (status, content_type, body) = got;
        assert_eq!(status, want, "{what}: {body}");
        assert!(
            content_type.starts_with("application/json"),
            "{what}: a JSON body, not {content_type}"
        );
        let (code, message) = error_of(&body);
        assert!(!code.is_empty() && !message.is_empty(), "{what}: {body}");
    };
    check(
        "a body that is not UTF-8",
        StatusCode::BAD_REQUEST,
        raw_call(
            &api,
            "POST",
            "/api/v1/deploys",
            &admin,
            vec![0xff, 0xfe, b'a'],
        )
        .await,
    );
    check(
        "an unknown route",
        StatusCode::NOT_FOUND,
        raw_call(&api, "GET", "/api/v1/no-such-thing", &admin, Vec::new()).await,
    );
    check(
        "a method the route does not have",
        StatusCode::METHOD_NOT_ALLOWED,
        raw_call(&api, "DELETE", "/api/v1/queues", &admin, Vec::new()).await,
    );
    check(
        "a body over the size limit",
        StatusCode::PAYLOAD_TOO_LARGE,
        raw_call(
            &api,
            "POST",
            "/api/v1/deploys",
            &admin,
            vec![b'a'; 3 * 1024 * 1024],
        )
        .await,
    );
    assert_eq!(
        api.deploy_count().await,
        0,
        "nothing was enqueued by the refused requests"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_refused_because_its_token_was_revoked_is_shown_with_the_reason_by_the_schedule_views()
 {
    let api = Api::new().await;
    let admin = api.token("root", Role::Admin).await;
    let deployer = api.token("ci", Role::Deployer).await;
    let text = format!(
        "{}schedule: {{cron: \"* * * * *\"}}\n",
        api.good_descriptor()
    );
    let (status, created) = api.post_deploy(&deployer, &text).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the schedule is created: {created}"
    );
    let id = created["id"]
        .as_str()
        .expect("the schedule's id")
        .to_string();
    manent_api::auth::revoke(&api.client.records(), "ci")
        .await
        .expect("revoke the token");
    let schedule = manent_deploy::background::schedules::get(&api.client, &id)
        .await
        .unwrap()
        .expect("the schedule is stored");
    let a_minute_on = (schedule.created_at_ms.div_euclid(60_000) + 1) * 60_000 + 5_000;
    let enqueued = manent_deploy::background::schedules::tick_once(
        &api.client,
        &api.tick_policy(),
        a_minute_on,
    )
    .await
    .expect("a ticker pass");
    assert!(
        enqueued.is_empty(),
        "the tick of a revoked token enqueues nothing: {enqueued:?}"
    );

    let (status, shown) = api
        .get(&format!("/api/v1/schedules/{id}"), Some(&admin))
        .await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    let refused = shown["refused_ticks"]
        .as_array()
        .unwrap_or_else(|| panic!("the schedule lists its refused ticks: {shown}"));
    assert_eq!(refused.len(), 1, "one tick refused: {shown}");
    assert_fields(&refused[0], &["tick", "reason"], "a refused tick");
    assert!(
        refused[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("`ci`") && r.contains("no longer exists")),
        "the reason names the token and what became of it: {shown}"
    );
    let (_, listed) = api.get("/api/v1/schedules", Some(&admin)).await;
    assert_eq!(
        listed[0]["refused_ticks"], shown["refused_ticks"],
        "the list shows the same history"
    );
}
