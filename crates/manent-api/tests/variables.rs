//! `GET /api/v1/apps/{tenant}/{app}/environments/{environment}/vars` (docs/api.md): each
//! variable's effective value per target with its source, secrets as `***` with their
//! provider, nothing read from a provider. Who may call it is in `rbac.rs`.

mod common;

use axum::http::StatusCode;
use common::Api;
use manent_api::Role;

const VARS: &str = "/api/v1/apps/acme/web/environments/prod/vars";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_environments_variables_are_listed_per_target_with_their_source_and_secrets_masked() {
    let api = Api::new().await;
    std::fs::write(
        api.config.environments_source().join("acme/web/prod.yml"),
        "targets:\n  - {name: t1, host: local, region: eu}\n  - {name: t2, host: local, region: us}\n\
         deploy: {plugin: command, commands: [\"true\"]}\n\
         variables: {DB_HOST: db.internal}\n\
         scoped_variables:\n  - {match: {region: us}, variables: {DB_HOST: db.us.internal}}\n  \
         - {match: {target: t1}, variables: {POOL: 5}}\n\
         secrets:\n  TOKEN: {command: \"exit 1\"}\n",
    )
    .unwrap();
    let deployer = api.token("deployer", Role::Deployer).await;
    let (status, body) = api.get(VARS, Some(&deployer)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let rows: Vec<String> = body
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| {
            format!(
                "{} {}={} ({})",
                r["target"], r["name"], r["value"], r["source"]
            )
        })
        .collect();
    expect_test::expect![[r#"
        "t1" "DB_HOST"="db.internal" ("environment")
        "t1" "POOL"="5" ("target t1")
        "t1" "TOKEN"="***" ("secret (command)")
        "t2" "DB_HOST"="db.us.internal" ("region us")
        "t2" "TOKEN"="***" ("secret (command)")"#]]
    .assert_eq(&rows.join("\n"));

    let (status, body) = api.get(&format!("{VARS}?target=t2"), Some(&deployer)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body.as_array().map(Vec::len),
        Some(2),
        "only t2's rows: {body}"
    );
    let (status, body) = api.get(&format!("{VARS}?target=t9"), Some(&deployer)).await;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("target")),
        "an unknown target is refused naming the field: {body}"
    );
    let (status, body) = api
        .get(
            "/api/v1/apps/acme/web/environments/staging/vars",
            Some(&deployer),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "an environment without a file: {body}"
    );
}
