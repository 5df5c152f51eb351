//! The trust boundaries of the API, each finding of a hostile tenant's trial reproduced and
//! refused (docs/security.md): authorisation on the parsed descriptor, scoped reads,
//! artifact sources, the environment's `overrides:`, parsing limits and unknown plugins.

mod common;

use axum::http::StatusCode;
use common::{ARTIFACT, Api};
use manent_api::{Role, auth};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn sha() -> String {
    hex::encode(Sha256::digest(ARTIFACT))
}

fn artifact_url(api: &Api) -> String {
    format!("file://{}", api.db.path("web-v1.bin").display())
}

/// Writes `<tenant>/<app>/prod.yml` with one local target running `true`, plus `extra`.
fn environment(api: &Api, application: &str, extra: &str) {
    let dir = api.config.environments_source().join(application);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("prod.yml"),
        format!(
            "targets:\n  - {{name: t1, host: local}}\ndeploy:\n  plugin: command\n  commands: [\"true\"]\n{extra}"
        ),
    )
    .unwrap();
}

async fn scoped(api: &Api, name: &str, role: Role, on: &str) -> String {
    auth::create_token(&api.client.records(), name, role, Some(on))
        .await
        .expect("create a scoped token")
}

fn field(body: &Value) -> &str {
    body["error"]["field"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_deployer_cannot_deploy_another_tenants_app_by_hiding_its_name() {
    let api = Api::new().await;
    environment(&api, "ml/app", "");
    let ml = scoped(&api, "ml-bot", Role::Deployer, "ml/*").await;
    // A decoy `application:` line above the real one: the old check read the first line.
    let decoy = format!(
        "deploy: {{params: {{application: ml/app}}}}\napplication: acme/web\nenvironment: prod\n\
         artifacts:\n  - {{name: web.bin, type: binary, version: v1, url: \"{}\", sha256: {}}}\n",
        artifact_url(&api),
        sha()
    );
    let (status, body) = api.post_deploy(&ml, &decoy).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "authorisation reads the parsed application, acme/web: {body}"
    );
    // The same with a JSON escape in the key.
    let escaped = format!(
        "{{\"appl\\u0069cation\": \"acme/web\", \"environment\": \"prod\", \"artifacts\": \
         [{{\"name\": \"web.bin\", \"type\": \"binary\", \"version\": \"v1\", \"url\": \"{}\", \
         \"sha256\": \"{}\"}}]}}",
        artifact_url(&api),
        sha()
    );
    let (status, body) = api.post_deploy(&ml, &escaped).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "an escaped key names the same application once parsed: {body}"
    );
    assert_eq!(api.deploy_count().await, 0, "nothing was enqueued");
    // Its own tenant's application is deployable.
    let own = api.descriptor("ml/app", &sha());
    let (status, body) = api.post_deploy(&ml, &own).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the scope admits ml/app: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_token_sees_nothing_of_another_tenant() {
    let api = Api::new().await;
    environment(&api, "ml/app", "");
    let admin = api.token("root", Role::Admin).await;
    let (status, web) = api.post_deploy(&admin, &api.good_descriptor()).await;
    assert_eq!(status, StatusCode::CREATED, "{web}");
    let web_id = web["id"].as_str().unwrap().to_owned();
    let (status, ml) = api
        .post_deploy(&admin, &api.descriptor("ml/app", &sha()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{ml}");
    let ml_id = ml["id"].as_str().unwrap().to_owned();

    let viewer = scoped(&api, "ml-viewer", Role::Viewer, "ml/*").await;
    for uri in [
        format!("/api/v1/deploys/{web_id}"),
        format!("/api/v1/deploys/{web_id}/logs"),
    ] {
        let (status, body) = api.get(&uri, Some(&viewer)).await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "{uri}: another tenant's deploy answers like one that does not exist: {body}"
        );
    }
    let (status, _) = api
        .get(&format!("/api/v1/deploys/{ml_id}"), Some(&viewer))
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "its own tenant's deploy is readable"
    );

    let ids = |body: &Value| -> Vec<String> {
        body.as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["id"].as_str().map(str::to_owned))
            .collect()
    };
    for uri in ["/api/v1/deploys", "/api/v1/activity"] {
        let (status, body) = api.get(uri, Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK, "{uri}");
        let seen = ids(&body);
        assert!(
            seen.contains(&ml_id) && !seen.contains(&web_id),
            "{uri} lists only the token's tenant: {seen:?}"
        );
    }
    let (_, apps) = api.get("/api/v1/apps", Some(&viewer)).await;
    let apps: Vec<&str> = apps
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["application"].as_str())
        .collect();
    assert_eq!(apps, ["ml/app"], "apps lists only the token's applications");
    // A page's cursor: another tenant's deploy answers as a deploy that does not exist.
    for before in [web_id.as_str(), "no-such-deploy"] {
        let (status, body) = api
            .get(&format!("/api/v1/deploys?before={before}"), Some(&viewer))
            .await;
        assert!(
            status == StatusCode::NOT_FOUND
                && body["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("before: no deploy")),
            "before={before}: answered alike, naming the field: {status} {body}"
        );
    }
    let (status, body) = api
        .get(&format!("/api/v1/deploys?before={ml_id}"), Some(&viewer))
        .await;
    assert!(
        status == StatusCode::OK && ids(&body).is_empty(),
        "the page after its own tenant's only deploy is empty: {body}"
    );
    let (_, tenants) = api.get("/api/v1/tenants", Some(&viewer)).await;
    let tenants: Vec<&str> = tenants
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(tenants, ["ml"], "tenants lists only the token's tenant");

    // Acting on another tenant's deploy reveals nothing either.
    let deployer = scoped(&api, "ml-bot", Role::Deployer, "ml/*").await;
    let (status, _) = api
        .call(
            "POST",
            &format!("/api/v1/deploys/{web_id}/cancel"),
            Some(&deployer),
            "",
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "cancel of another tenant's deploy is a 404"
    );
    let (_, still) = api
        .get(&format!("/api/v1/deploys/{web_id}"), Some(&admin))
        .await;
    assert_ne!(still["status"], "CANCELLED", "and it changed nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_artifact_outside_the_sources_is_refused_at_submission_naming_its_field() {
    let api = Api::new().await;
    let deployer = api.token("ci", Role::Deployer).await;
    let good_url = artifact_url(&api);
    let cases = [
        "file:///etc/passwd".to_owned(),
        "file:///root/.ssh/id_ed25519".to_owned(),
        format!("{good_url}/../../../../etc/passwd"),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
    ];
    for url in cases {
        let text = api.good_descriptor().replace(
            &serde_json::to_string(&good_url).unwrap(),
            &format!("\"{url}\""),
        );
        assert!(text.contains(&url), "the test put {url} in the descriptor");
        let (status, body) = api.post_deploy(&deployer, &text).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{url} is under no source: {body}"
        );
        assert_eq!(
            field(&body),
            "artifacts[0].url",
            "the field is named: {body}"
        );
    }
    assert_eq!(api.deploy_count().await, 0, "nothing was enqueued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descriptor_may_set_only_the_deploy_keys_its_environment_allows() {
    let api = Api::new().await;
    let deployer = api.token("ci", Role::Deployer).await;
    let planted = format!(
        "{}deploy:\n  commands: [\"echo key >> ~/.ssh/authorized_keys\"]\n",
        api.good_descriptor()
    );
    let (status, body) = api.post_deploy(&deployer, &planted).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "commands are not in the default overrides (params only): {body}"
    );
    assert_eq!(field(&body), "deploy.commands", "the key is named: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("overrides"),
        "the message says how an operator allows it: {body}"
    );
    let params = format!(
        "{}deploy:\n  params: {{replicas: 3}}\n",
        api.good_descriptor()
    );
    let (status, body) = api.post_deploy(&deployer, &params).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "params are allowed by default: {body}"
    );

    environment(&api, "acme/open", "overrides: [commands, params]\n");
    let allowed = planted.replace("acme/web", "acme/open");
    let (status, body) = api.post_deploy(&deployer, &allowed).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "an environment listing commands lets a descriptor set them: {body}"
    );
    let id = body["id"].as_str().unwrap();
    let (_, shown) = api
        .get(&format!("/api/v1/deploys/{id}"), Some(&deployer))
        .await;
    assert_eq!(
        shown["overrides"]["commands"][0], "echo key >> ~/.ssh/authorized_keys",
        "status shows an approver every overridden field: {shown}"
    );
    assert_eq!(
        shown["artifacts"][0]["sha256"],
        sha(),
        "status shows the artifacts with their sha256: {shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deeply_nested_body_is_refused_without_parsing_it() {
    let api = Api::new().await;
    let deployer = api.token("ci", Role::Deployer).await;
    let body = format!(
        "{}deploy:\n  params: {{x: {}}}\n",
        api.good_descriptor(),
        "[".repeat(50_000)
    );
    let (status, answer) = api.post_deploy(&deployer, &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("nested deeper than"),
        "the refusal says why: {answer}"
    );
    assert_eq!(api.deploy_count().await, 0, "nothing was enqueued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_plugin_is_refused_at_submission() {
    let api = Api::new().await;
    let deployer = api.token("ci", Role::Deployer).await;
    environment(&api, "acme/plug", "overrides: [plugin, params]\n");
    let text = format!(
        "{}deploy:\n  plugin: no-such-plugin\n",
        api.good_descriptor().replace("acme/web", "acme/plug")
    );
    let (status, body) = api.post_deploy(&deployer, &text).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(field(&body), "deploy.plugin", "the field is named: {body}");
    assert_eq!(api.deploy_count().await, 0, "nothing was enqueued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_reach_commands_as_variables_and_nothing_that_is_shown() {
    let mut api = Api::new().await;
    let secret_file = api.db.path("db-password");
    let value = "s3cr3t-Value-42";
    std::fs::write(&secret_file, format!("{value}\n")).unwrap();
    let seen = api.db.path("seen-by-command");
    let dir = api.config.environments_source().join("acme/vault");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("prod.yml"),
        format!(
            "targets:\n  - {{name: t1, host: local}}\ndeploy:\n  plugin: command\n  commands:\n    \
             - \"printf '%s' \\\"$DB_PASSWORD\\\" > {}\"\n    - \"echo password=$DB_PASSWORD\"\n    \
             - \"echo leaked $DB_PASSWORD >&2; exit 3\"\nsecrets:\n  DB_PASSWORD: {{file: {}}}\n",
            seen.display(),
            secret_file.display()
        ),
    )
    .unwrap();
    let admin = api.token("root", Role::Admin).await;
    let (status, body) = api
        .post_deploy(&admin, &api.descriptor("acme/vault", &sha()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["id"].as_str().unwrap().to_owned();
    let worker = api.worker().await;
    api.client
        .wait(&id, common::WAIT)
        .await
        .expect("the deploy ends");
    assert_eq!(
        std::fs::read_to_string(&seen).unwrap(),
        value,
        "the command got the secret's value as a variable"
    );
    let (_, shown) = api
        .get(&format!("/api/v1/deploys/{id}"), Some(&admin))
        .await;
    let (_, logs) = api
        .get(&format!("/api/v1/deploys/{id}/logs"), Some(&admin))
        .await;
    let (_, list) = api.get("/api/v1/deploys", Some(&admin)).await;
    let (_, output) = api
        .get(&format!("/api/v1/deploys/{id}/output"), Some(&admin))
        .await;
    assert!(
        output.to_string().contains("password=***") && output.to_string().contains("leaked ***"),
        "the commands' output is kept, masked, stdout and stderr: {output}"
    );
    for (what, text) in [
        ("status", shown.to_string()),
        ("logs", logs.to_string()),
        ("list", list.to_string()),
        ("output", output.to_string()),
    ] {
        assert!(
            !text.contains(value),
            "{what} never shows the secret's value: {text}"
        );
    }
    assert_eq!(
        shown["status"], "ERROR",
        "the third command failed: {shown}"
    );
    assert!(
        shown.to_string().contains("leaked ***"),
        "errors show the mask where the value was: {shown}"
    );
    let steps = api.client.steps(&id).await.unwrap();
    let echoed = steps
        .iter()
        .find(|s| s.name == "t1: command 2")
        .and_then(|s| s.output.clone())
        .unwrap_or_default();
    assert!(
        echoed.contains("password=***"),
        "a command's recorded output shows the mask: {echoed}"
    );
    for step in steps {
        let recorded = format!("{:?} {:?}", step.output, step.error);
        assert!(
            !recorded.contains(value),
            "the recorded step {} holds no secret: {recorded}",
            step.name
        );
    }
    worker.shutdown(std::time::Duration::from_secs(5)).await;
}
