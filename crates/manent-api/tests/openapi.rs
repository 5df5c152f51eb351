//! The generated OpenAPI document served at `/api/v1/openapi.json` (docs/api.md) against
//! the router it is generated from, driven in-process over a fresh SQLite store: every
//! operation it documents is served with exactly its methods, no route is added outside
//! utoipa-axum (so none is served undocumented), every `/api/v1` operation is behind the
//! bearer token, and every error answer it documents is the error body, which real
//! refusals (the token layer's, the handlers', axum's own) are. The documented descriptor
//! holds the fields the server reads.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use axum::http::StatusCode;
use common::Api;
use manent_api::Role;
use manent_contract::ErrorBody;
use serde_json::Value;

/// The one `/api/v1` route served without a token.
const DOCUMENT: &str = "/api/v1/openapi.json";

const METHODS: &[&str] = &["get", "put", "post", "delete", "patch"];

/// The served document, fetched without a token.
async fn document(api: &Api) -> Value {
    let (status, doc) = api.call("GET", DOCUMENT, None, "").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the document is served without a token"
    );
    assert_eq!(
        &doc,
        manent_api::openapi::document(),
        "the served document is the one generated from the router"
    );
    doc
}

/// Documented operations: path → methods (lower case).
fn operations(doc: &Value) -> BTreeMap<String, BTreeSet<String>> {
    doc["paths"]
        .as_object()
        .expect("the document has paths")
        .iter()
        .map(|(path, item)| {
            let methods = item
                .as_object()
                .expect("a path item is an object")
                .keys()
                .filter(|k| METHODS.contains(&k.as_str()))
                .cloned()
                .collect();
            (path.clone(), methods)
        })
        .collect()
}

/// `$ref`s followed to what they name.
fn resolve<'a>(doc: &'a Value, mut node: &'a Value) -> &'a Value {
    while let Some(reference) = node.get("$ref").and_then(Value::as_str) {
        let pointer = reference
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("only local references are used: {reference}"));
        node = doc
            .pointer(pointer)
            .unwrap_or_else(|| panic!("the reference {reference} resolves in the document"));
    }
    node
}

/// Every `$ref` anywhere in `node`.
fn collect_references(node: &Value, out: &mut Vec<String>) {
    match node {
        Value::Object(map) => {
            if let Some(r) = map.get("$ref").and_then(Value::as_str) {
                out.push(r.to_string());
            }
            map.values().for_each(|v| collect_references(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| collect_references(v, out)),
        _ => {}
    }
}

/// A concrete URI of a path template (`{id}` → `x`).
fn concrete(path: &str) -> String {
    ["{id}", "{name}", "{tenant}", "{app}", "{environment}"]
        .iter()
        .fold(path.to_string(), |path, parameter| {
            path.replace(parameter, "x")
        })
}

fn is_protected(path: &str) -> bool {
    path.starts_with("/api/v1/") && path != DOCUMENT
}

/// Asserts that `body` is the documented error body with a known code.
fn assert_error_body(what: &str, body: &Value) {
    let parsed: ErrorBody = serde_json::from_value(body.clone())
        .unwrap_or_else(|e| panic!("{what}: the answer is the error body ({e}): {body}"));
    let keys: Vec<&String> = body["error"]
        .as_object()
        .expect("an object")
        .keys()
        .collect();
    assert!(
        body.as_object().is_some_and(|b| b.len() == 1)
            && keys
                .iter()
                .all(|k| ["code", "message", "field"].contains(&k.as_str())),
        "{what}: the body holds only the documented fields: {body}"
    );
    assert!(
        parsed.error.code.as_str() != "" && !parsed.error.message.is_empty(),
        "{what}: the error has a code and a message: {body}"
    );
    assert!(
        manent_contract::ErrorCode::KNOWN.contains(&parsed.error.code.as_str()),
        "{what}: the code is a documented one: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_of_the_router_is_documented_with_exactly_its_methods() {
    // Every protected route is asked without a token, all from one source: more failures
    // than the throttle admits (tested in tokens.rs), so it is off here.
    let api = Api::with_api_config("{auth_throttle: {failures: 0}}").await;
    let doc = document(&api).await;
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "`openapi` names an OpenAPI 3 version, got {:?}",
        doc["openapi"]
    );
    assert!(
        doc["info"]["title"].is_string() && doc["info"]["version"].is_string(),
        "info has its title and version"
    );
    let operations = operations(&doc);
    for (path, expected) in [
        ("/", "get"),
        ("/platform", "get"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
        (DOCUMENT, "get"),
        ("/api/v1/deploys", "post"),
        ("/api/v1/deploys", "get"),
        ("/api/v1/schedules/{id}", "delete"),
        ("/api/v1/tokens/{name}", "delete"),
        (
            "/api/v1/apps/{tenant}/{app}/environments/{environment}/rollback",
            "post",
        ),
    ] {
        assert!(
            operations.get(path).is_some_and(|m| m.contains(expected)),
            "{expected} {path} is documented (a route of docs/api.md): {operations:?}"
        );
    }

    let admin = api.token("root", Role::Admin).await;
    for (path, methods) in &operations {
        let uri = concrete(path);
        for method in METHODS {
            let upper = method.to_ascii_uppercase();
            let (status, body) = api.call(&upper, &uri, Some(&admin), "").await;
            if methods.contains(*method) {
                assert!(
                    status != StatusCode::METHOD_NOT_ALLOWED
                        && !body["error"]["message"]
                            .as_str()
                            .is_some_and(|m| m.starts_with("no such API route")),
                    "documented {upper} {path} is a route of the router: {status} {body}"
                );
                if is_protected(path) {
                    let (status, body) = api.call(&upper, &uri, None, "").await;
                    assert_eq!(
                        status,
                        StatusCode::UNAUTHORIZED,
                        "{upper} {path} is served behind the token: {body}"
                    );
                    assert_error_body(&format!("{upper} {path} without a token"), &body);
                }
            } else {
                assert_eq!(
                    status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{upper} {path} is not documented, so the router does not serve it: {body}"
                );
            }
        }
    }
    let (status, body) = api
        .call("GET", "/api/v1/nothing-here", Some(&admin), "")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "an unknown path is a 404");
    assert_error_body("an unknown /api/v1 path", &body);
}

/// Every `.rs` file under `dir`, at any depth, sorted.
fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read a source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The router and the document are built by the same calls only if every route goes
/// through utoipa-axum's `routes!`: a plain `.route(…)` would be served undocumented.
#[test]
fn no_route_is_added_outside_utoipa_axum() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = rust_files(&src);
    assert!(
        files.iter().any(|f| f.ends_with("routes/deploys.rs")),
        "the walk reaches the route modules: {files:?}"
    );
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read the source");
        for call in [
            ".route(",
            ".route_service(",
            ".nest_service(",
            "axum::routing::",
        ] {
            assert!(
                !text.contains(call),
                "{} adds a route with `{call}`, which the OpenAPI document would not show; \
                 add it with `.routes(routes!(handler))` and a `#[utoipa::path]`",
                file.display()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_error_is_the_error_body_and_real_refusals_are() {
    let api = Api::new().await;
    let doc = document(&api).await;
    let error_schema = &doc["components"]["schemas"]["Error"];
    assert_eq!(
        error_schema["required"],
        serde_json::json!(["error"]),
        "the error body is `{{\"error\": …}}`: {error_schema}"
    );
    let scheme = &doc["components"]["securitySchemes"]["bearerAuth"];
    assert_eq!(
        (scheme["type"].as_str(), scheme["scheme"].as_str()),
        (Some("http"), Some("bearer")),
        "bearerAuth is an HTTP bearer scheme: {scheme}"
    );
    let mut references = Vec::new();
    collect_references(&doc, &mut references);
    assert!(
        !references.is_empty(),
        "schemas are shared through references"
    );
    for reference in references {
        resolve(&doc, &serde_json::json!({ "$ref": reference }));
    }
    let bearer = serde_json::json!({ "bearerAuth": [] });
    let error_ref = Value::String("#/components/schemas/Error".into());

    for (path, methods) in operations(&doc) {
        for method in methods {
            let operation = &doc["paths"][&path][&method];
            let responses = operation["responses"]
                .as_object()
                .unwrap_or_else(|| panic!("{method} {path} documents its responses"));
            let security = operation["security"]
                .as_array()
                .unwrap_or_else(|| panic!("{method} {path} states its security"));
            let mut required = Vec::new();
            if is_protected(&path) {
                assert!(
                    security.contains(&bearer),
                    "{method} {path} requires the bearer token: {security:?}"
                );
                required.extend(["401", "429", "500", "503"]);
                if !operation["requestBody"].is_null() {
                    required.extend(["400", "413"]);
                }
            } else {
                assert!(
                    security.is_empty(),
                    "{method} {path} is served without a token, and documented so"
                );
            }
            for status in &required {
                assert!(
                    responses.contains_key(*status),
                    "{method} {path} documents its {status} answer: {:?}",
                    responses.keys()
                );
            }
            for (status, response) in responses {
                let is_error = status.starts_with('4') || status.starts_with('5');
                let response = resolve(&doc, response);
                let json = &response["content"]["application/json"]["schema"];
                if is_error && !json.is_null() {
                    assert_eq!(
                        json["$ref"], error_ref,
                        "the {status} answer of {method} {path} is the error body"
                    );
                } else if is_error {
                    // Only outside /api/v1 an error may be plain text (`/readyz`).
                    assert!(
                        !is_protected(&path),
                        "the {status} answer of {method} {path} is JSON: {response}"
                    );
                }
            }
        }
    }

    // Real refusals, before and after the handlers, are that body.
    let admin = api.token("root", Role::Admin).await;
    let viewer = api.token("alice", Role::Viewer).await;
    for (what, method, uri, token, body, want) in [
        (
            "no token",
            "GET",
            "/api/v1/workers",
            None,
            "",
            StatusCode::UNAUTHORIZED,
        ),
        (
            "a viewer recovering",
            "POST",
            "/api/v1/executors/x/recover",
            Some(&viewer),
            "",
            StatusCode::FORBIDDEN,
        ),
        (
            "no such deploy",
            "GET",
            "/api/v1/deploys/nothing",
            Some(&viewer),
            "",
            StatusCode::NOT_FOUND,
        ),
        (
            "a bad descriptor",
            "POST",
            "/api/v1/deploys",
            Some(&admin),
            "application: [",
            StatusCode::BAD_REQUEST,
        ),
        (
            "a query string that cannot be read",
            "GET",
            "/api/v1/audit?limit=many",
            Some(&admin),
            "",
            StatusCode::BAD_REQUEST,
        ),
        (
            "an unknown role",
            "POST",
            "/api/v1/tokens",
            Some(&admin),
            r#"{"name": "x", "role": "root"}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            "a method the route does not have",
            "PUT",
            "/api/v1/queues",
            Some(&admin),
            "",
            StatusCode::METHOD_NOT_ALLOWED,
        ),
    ] {
        let (status, answer) = api.call(method, uri, token.map(String::as_str), body).await;
        assert_eq!(status, want, "{what}: {answer}");
        assert_error_body(what, &answer);
    }
}

/// The documented descriptor (`manent_contract::Descriptor`, the request body of `POST
/// /api/v1/deploys`) and the one the server reads (manent-model's) have the same fields:
/// a descriptor using every field goes from one to the other and back unchanged, both
/// refusing unknown fields.
#[tokio::test]
async fn the_documented_descriptor_has_the_fields_the_server_reads() {
    let every_field = serde_json::json!({
        "application": "acme/web",
        "environment": "prod",
        "artifacts": [{
            "name": "web.tgz", "type": "tarball", "version": "1.4.2",
            "url": "https://repo.example/web-1.4.2.tgz",
            "sha256": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
        }],
        "deploy": {
            "plugin": "command", "dest": "/srv/{version}", "activate": "true",
            "commands": ["./deploy.sh"], "params": {"k": "v"}
        },
        "schedule": {"cron": "30 2 * * 1-5", "timezone": "Europe/Paris", "missed": "skip"},
        "dry_run": true,
        "depends_on": [{"application": "acme/db", "environment": "prod", "version": "2", "timeout": "10m"}],
        "irreversible": "drops column users.legacy_name"
    });
    let documented: manent_contract::Descriptor = serde_json::from_value(every_field.clone())
        .expect("the contract reads a descriptor with every field");
    let read = manent_deploy::submission::parse(
        serde_json::to_string(&documented).expect("serialises"),
        "deploy.json".into(),
    )
    .await
    .expect("the server reads the documented descriptor with every field");
    let back: manent_contract::Descriptor =
        serde_json::from_value(serde_json::to_value(&read).expect("serialises"))
            .expect("the contract reads every field the server writes back");
    assert_eq!(
        back, documented,
        "the server's descriptor and the documented one hold the same fields"
    );
}
