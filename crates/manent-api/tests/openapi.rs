//! The OpenAPI document served at `/api/v1/openapi.json` (docs/api.md) against the router
//! it describes, driven in-process with `tower::ServiceExt::oneshot` over a fresh SQLite
//! store: it is OpenAPI 3, documents every route the router serves (and no other), puts
//! every `/api/v1` operation behind the bearer token, and real responses (workers, queues,
//! a deploy's submission, status, logs, list and activity, errors) fit its schemas.

mod common;

use std::{collections::BTreeSet, time::Duration};

use axum::http::StatusCode;
use common::{Api, WAIT};
use manent_api::Role;
use manent_engine::WorkflowStatus;
use serde_json::Value;

/// Every route `manent_api::app` serves, as (method, path template). Keep in step with
/// `app()`: a route listed here and missing from the document fails the test, and so does
/// a documented operation missing here.
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/"),
    ("GET", "/platform"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/api/v1/openapi.json"),
    ("POST", "/api/v1/deploys"),
    ("GET", "/api/v1/deploys"),
    ("GET", "/api/v1/deploys/{id}"),
    ("GET", "/api/v1/deploys/{id}/logs"),
    ("GET", "/api/v1/deploys/{id}/output"),
    ("POST", "/api/v1/deploys/{id}/cancel"),
    ("POST", "/api/v1/deploys/{id}/approve"),
    ("POST", "/api/v1/deploys/{id}/reject"),
    ("POST", "/api/v1/deploys/{id}/redeploy"),
    (
        "GET",
        "/api/v1/apps/{tenant}/{app}/environments/{environment}/history",
    ),
    (
        "POST",
        "/api/v1/apps/{tenant}/{app}/environments/{environment}/rollback",
    ),
    ("GET", "/api/v1/schedules"),
    ("GET", "/api/v1/schedules/{id}"),
    ("DELETE", "/api/v1/schedules/{id}"),
    ("POST", "/api/v1/schedules/{id}/pause"),
    ("POST", "/api/v1/schedules/{id}/resume"),
    ("GET", "/api/v1/activity"),
    ("GET", "/api/v1/tenants"),
    ("GET", "/api/v1/apps"),
    ("GET", "/api/v1/workers"),
    ("GET", "/api/v1/queues"),
    ("POST", "/api/v1/executors/{id}/recover"),
    ("GET", "/api/v1/tokens"),
    ("POST", "/api/v1/tokens"),
    ("DELETE", "/api/v1/tokens/{name}"),
    ("GET", "/api/v1/audit"),
    ("GET", "/api/v1/whoami"),
];

/// The one `/api/v1` route served without a token.
const UNAUTHENTICATED_V1: &str = "/api/v1/openapi.json";

/// The served document, fetched without a token.
async fn document(api: &Api) -> Value {
    let (status, doc) = api.call("GET", UNAUTHENTICATED_V1, None, "").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the document is served without a token"
    );
    assert!(
        doc.is_object(),
        "the served document parses as a JSON object: {doc}"
    );
    doc
}

/// `$ref`s followed to the schema (or response, or parameter) they name.
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

/// The JSON schema the document gives the `status` answer of `method path`.
fn response_schema<'a>(doc: &'a Value, method: &str, path: &str, status: &str) -> &'a Value {
    let operation = &doc["paths"][path][method.to_ascii_lowercase()];
    let response = resolve(doc, &operation["responses"][status]);
    let schema = &response["content"]["application/json"]["schema"];
    assert!(
        !schema.is_null(),
        "{method} {path} documents a JSON {status} answer"
    );
    schema
}

fn type_matches(value: &Value, ty: &str) -> bool {
    match ty {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        other => panic!("unknown schema type `{other}`"),
    }
}

/// Checks `value` against `schema` (the subset of JSON Schema the document uses: `$ref`,
/// `type`, `enum`, `const`, `properties`, `additionalProperties: true`, `required`, `items`). Every field of an object
/// must be a documented property. Problems are pushed to `problems`, with their JSON path.
fn check(doc: &Value, value: &Value, schema: &Value, at: &str, problems: &mut Vec<String>) {
    let schema = resolve(doc, schema);
    if let Some(ty) = schema.get("type") {
        let types: Vec<&str> = match ty {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            other => panic!("a schema type is a string or a list: {other}"),
        };
        if !types.iter().any(|t| type_matches(value, t)) {
            problems.push(format!("{at}: {value} is not of type {ty}"));
            return;
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        problems.push(format!("{at}: {value} is not one of {allowed:?}"));
    }
    if let Some(constant) = schema.get("const")
        && constant != value
    {
        problems.push(format!("{at}: {value} is not {constant}"));
    }
    if let Some(object) = value.as_object() {
        let properties = schema.get("properties").and_then(Value::as_object);
        // A free-form object (plugin parameters, the effective descriptor) says so; a map
        // (live versions by environment) gives the schema of its values.
        let additional = schema.get("additionalProperties");
        let open = additional == Some(&Value::Bool(true));
        let values = additional.filter(|a| a.is_object());
        for (key, field) in object {
            match properties.and_then(|p| p.get(key)).or(values) {
                Some(property) => check(doc, field, property, &format!("{at}.{key}"), problems),
                None if open => {}
                None => problems.push(format!(
                    "{at}.{key}: answered but not a documented property"
                )),
            }
        }
        for required in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !object.contains_key(required) {
                problems.push(format!("{at}.{required}: documented as required, absent"));
            }
        }
    }
    if let (Some(items), Some(schema)) = (value.as_array(), schema.get("items")) {
        for (i, item) in items.iter().enumerate() {
            check(doc, item, schema, &format!("{at}[{i}]"), problems);
        }
    }
}

/// Asserts that the `status` answer `body` of `method path` fits its documented schema.
fn assert_fits(doc: &Value, method: &str, path: &str, status: StatusCode, body: &Value) {
    let schema = response_schema(doc, method, path, status.as_str());
    let mut problems = Vec::new();
    check(doc, body, schema, "$", &mut problems);
    assert!(
        problems.is_empty(),
        "the {status} answer of {method} {path} fits its documented schema:\n{}\nbody: {body:#}",
        problems.join("\n")
    );
}

/// Every `$ref` anywhere in `node`.
fn references<'a>(node: &'a Value, out: &mut Vec<&'a str>) {
    match node {
        Value::Object(map) => {
            if let Some(r) = map.get("$ref").and_then(Value::as_str) {
                out.push(r);
            }
            map.values().for_each(|v| references(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| references(v, out)),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_is_openapi_3_and_documents_every_route_of_the_router() {
    let api = Api::new().await;
    let doc = document(&api).await;

    let version = doc["openapi"].as_str().unwrap_or_default();
    assert!(
        version.starts_with("3."),
        "`openapi` names an OpenAPI 3 version, got {:?}",
        doc["openapi"]
    );
    assert!(
        doc["info"]["title"].is_string() && doc["info"]["version"].is_string(),
        "info has its title and version"
    );

    // Documented operations, as (METHOD, path).
    let paths = doc["paths"].as_object().expect("the document has paths");
    let documented: BTreeSet<(String, String)> = paths
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .expect("a path item is an object")
                .keys()
                .filter(|k| {
                    matches!(
                        k.as_str(),
                        "get" | "put" | "post" | "delete" | "options" | "head" | "patch" | "trace"
                    )
                })
                .map(move |m| (m.to_ascii_uppercase(), path.clone()))
        })
        .collect();
    let served: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    let missing: Vec<_> = served.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "every route the router serves is documented; missing: {missing:?}"
    );
    let extra: Vec<_> = documented.difference(&served).collect();
    assert!(
        extra.is_empty(),
        "the document describes only routes the router serves (update ROUTES with app()); \
         extra: {extra:?}"
    );

    // The bearer scheme, and on every /api/v1 operation (but the document itself).
    let scheme = &doc["components"]["securitySchemes"]["bearerAuth"];
    assert_eq!(
        (scheme["type"].as_str(), scheme["scheme"].as_str()),
        (Some("http"), Some("bearer")),
        "bearerAuth is an HTTP bearer scheme: {scheme}"
    );
    let bearer = serde_json::json!({ "bearerAuth": [] });
    for (method, path) in &served {
        let operation = &doc["paths"][path][method.to_ascii_lowercase()];
        let security = operation["security"]
            .as_array()
            .unwrap_or_else(|| panic!("{method} {path} states its security"));
        let protected = path.starts_with("/api/v1/") && path != UNAUTHENTICATED_V1;
        if protected {
            assert!(
                security.contains(&bearer),
                "{method} {path} requires the bearer token: {security:?}"
            );
        } else {
            assert!(
                security.is_empty(),
                "{method} {path} is served without a token, and documented so: {security:?}"
            );
        }
        assert!(
            operation["responses"]
                .as_object()
                .is_some_and(|r| !r.is_empty()),
            "{method} {path} documents its responses"
        );
        if protected {
            for status in ["401", "503"] {
                response_schema(&doc, method, path, status);
            }
        }
    }

    // Every reference resolves.
    let mut refs = Vec::new();
    references(&doc, &mut refs);
    assert!(!refs.is_empty(), "schemas are shared through references");
    for r in refs {
        resolve(&doc, &serde_json::json!({ "$ref": r }));
    }

    // The list is the router's. Without a token each listed /api/v1 route answers 401
    // with the documented error and the others answer 200; with a token, each listed route
    // is matched (no 405, no empty 404 of an unknown path), while an unserved method or
    // path is refused. (The token layer covers a whole path, so a wrong method is only
    // told apart with a token.)
    let admin = api.token("root", Role::Admin).await;
    for (method, path) in ROUTES {
        let (status, body) = api.call(method, &concrete(path), None, "").await;
        if path.starts_with("/api/v1/") && *path != UNAUTHENTICATED_V1 {
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{method} {path} is served, behind the token: {body}"
            );
            assert_fits(&doc, method, path, status, &body);
        } else {
            assert_eq!(status, StatusCode::OK, "{method} {path} is served: {body}");
        }
        let (status, body) = api.call(method, &concrete(path), Some(&admin), "").await;
        assert!(
            status != StatusCode::METHOD_NOT_ALLOWED
                && !(status == StatusCode::NOT_FOUND && body.is_null()),
            "{method} {path} is a route of the router: {status} {body}"
        );
    }
    let (status, _) = api
        .call("GET", "/api/v1/nothing-here", Some(&admin), "")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "an unknown path is a 404");
    let (status, _) = api.call("PUT", "/api/v1/deploys", Some(&admin), "").await;
    assert_eq!(
        status,
        StatusCode::METHOD_NOT_ALLOWED,
        "a method the router does not serve is a 405"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_answers_fit_the_documented_schemas() {
    let mut api = Api::new().await;
    let doc = document(&api).await;
    let worker = api.worker().await;
    let viewer = api.token("alice", Role::Viewer).await;
    let deployer = api.token("ci", Role::Deployer).await;

    for path in ["/api/v1/workers", "/api/v1/queues"] {
        let (status, body) = api.get(path, Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK, "a viewer may read {path}: {body}");
        assert!(
            body.as_array().is_some_and(|a| !a.is_empty()),
            "with a worker running, {path} lists something to check: {body}"
        );
        assert_fits(&doc, "GET", path, status, &body);
    }

    // Errors: a 400 naming its field, a 403, a 404.
    let bad = api.descriptor("acme/web", "not-a-checksum");
    let (status, body) = api
        .call("POST", "/api/v1/deploys", Some(&deployer), &bad)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a bad sha256: {body}");
    assert!(body["error"]["field"].is_string(), "it names the field");
    assert_fits(&doc, "POST", "/api/v1/deploys", status, &body);
    let (status, body) = api
        .call("POST", "/api/v1/executors/x/recover", Some(&viewer), "")
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a viewer may not recover");
    assert_fits(
        &doc,
        "POST",
        "/api/v1/executors/{id}/recover",
        status,
        &body,
    );
    let (status, body) = api
        .get("/api/v1/deploys/no-such-deploy", Some(&viewer))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no such deploy: {body}");
    assert_fits(&doc, "GET", "/api/v1/deploys/{id}", status, &body);

    // A deploy, from submission to its logs.
    let good = api.good_descriptor();
    let (status, body) = api
        .call("POST", "/api/v1/deploys", Some(&deployer), &good)
        .await;
    assert_eq!(status, StatusCode::CREATED, "submitted: {body}");
    assert_fits(&doc, "POST", "/api/v1/deploys", status, &body);
    let id = body["id"].as_str().expect("an id").to_string();
    let record = api.client.wait(&id, WAIT).await.expect("the deploy ends");
    assert_eq!(
        record.status,
        WorkflowStatus::Success,
        "the deploy succeeds: {:?}",
        record.error
    );
    let (status, body) = api
        .get(&format!("/api/v1/deploys/{id}"), Some(&viewer))
        .await;
    assert_eq!(status, StatusCode::OK, "its status: {body}");
    assert!(
        body["steps"].as_array().is_some_and(|s| !s.is_empty())
            && body["targets"].as_array().is_some_and(|t| !t.is_empty()),
        "a finished deploy has steps and targets to check: {body:#}"
    );
    assert_fits(&doc, "GET", "/api/v1/deploys/{id}", status, &body);
    let (status, body) = api
        .get(&format!("/api/v1/deploys/{id}/logs"), Some(&viewer))
        .await;
    assert_eq!(status, StatusCode::OK, "its logs: {body}");
    assert_fits(&doc, "GET", "/api/v1/deploys/{id}/logs", status, &body);
    for path in ["/api/v1/deploys", "/api/v1/activity"] {
        let (status, body) = api.get(path, Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        assert!(
            body.as_array().is_some_and(|a| !a.is_empty()),
            "{path} lists the deploy: {body}"
        );
        assert_fits(&doc, "GET", path, status, &body);
    }
    let (status, body) = api
        .call(
            "POST",
            &format!("/api/v1/deploys/{id}/cancel"),
            Some(&deployer),
            "",
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "a finished deploy: {body}");
    assert_fits(&doc, "POST", "/api/v1/deploys/{id}/cancel", status, &body);

    // Releases: the live version, the history, a refused rollback and a redeploy.
    let (status, body) = api.get("/api/v1/apps", Some(&viewer)).await;
    assert_eq!(status, StatusCode::OK, "the applications: {body}");
    assert!(
        body.to_string().contains(&id),
        "the deploy is live in acme/web prod: {body}"
    );
    assert_fits(&doc, "GET", "/api/v1/apps", status, &body);
    let environment = "/api/v1/apps/{tenant}/{app}/environments/{environment}";
    let (status, body) = api
        .get(
            "/api/v1/apps/acme/web/environments/prod/history",
            Some(&viewer),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "the history: {body}");
    assert_fits(
        &doc,
        "GET",
        &format!("{environment}/history"),
        status,
        &body,
    );
    let (status, body) = api
        .call(
            "POST",
            "/api/v1/apps/acme/web/environments/prod/rollback",
            Some(&deployer),
            "",
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "one version only: {body}");
    assert_fits(
        &doc,
        "POST",
        &format!("{environment}/rollback"),
        status,
        &body,
    );
    let (status, body) = api
        .call(
            "POST",
            &format!("/api/v1/deploys/{id}/redeploy"),
            Some(&deployer),
            "",
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "redeployed: {body}");
    assert_fits(&doc, "POST", "/api/v1/deploys/{id}/redeploy", status, &body);
    let again = body["id"].as_str().expect("an id").to_string();
    api.client
        .wait(&again, WAIT)
        .await
        .expect("the redeploy ends");
    let (status, body) = api
        .get(&format!("/api/v1/deploys/{again}"), Some(&viewer))
        .await;
    assert_eq!(
        body["redeploy_of"],
        id.as_str(),
        "where it came from: {body}"
    );
    assert_fits(&doc, "GET", "/api/v1/deploys/{id}", status, &body);

    // A recurring schedule: its creation, list, view, pause and deletion.
    let cron = format!("{good}schedule:\n  cron: \"0 0 1 1 *\"\n");
    let (status, body) = api
        .call("POST", "/api/v1/deploys", Some(&deployer), &cron)
        .await;
    assert_eq!(status, StatusCode::CREATED, "a schedule is created: {body}");
    assert_fits(&doc, "POST", "/api/v1/deploys", status, &body);
    let schedule = body["id"].as_str().expect("an id").to_string();
    let (status, body) = api.get("/api/v1/schedules", Some(&viewer)).await;
    assert_eq!(status, StatusCode::OK, "the schedules: {body}");
    assert!(
        body.as_array().is_some_and(|a| !a.is_empty()),
        "it lists the schedule: {body}"
    );
    assert_fits(&doc, "GET", "/api/v1/schedules", status, &body);
    let (status, body) = api
        .get(&format!("/api/v1/schedules/{schedule}"), Some(&viewer))
        .await;
    assert_eq!(status, StatusCode::OK, "the schedule: {body}");
    assert_fits(&doc, "GET", "/api/v1/schedules/{id}", status, &body);
    let (status, body) = api
        .call(
            "POST",
            &format!("/api/v1/schedules/{schedule}/pause"),
            Some(&deployer),
            "",
        )
        .await;
    assert_eq!(status, StatusCode::OK, "paused: {body}");
    assert_fits(&doc, "POST", "/api/v1/schedules/{id}/pause", status, &body);
    let (status, body) = api
        .call(
            "DELETE",
            &format!("/api/v1/schedules/{schedule}"),
            Some(&deployer),
            "",
        )
        .await;
    assert_eq!(status, StatusCode::OK, "deleted: {body}");
    assert_fits(&doc, "DELETE", "/api/v1/schedules/{id}", status, &body);

    let admin = api.token("root", Role::Admin).await;
    let (status, body) = api
        .call("POST", "/api/v1/executors/gone/recover", Some(&admin), "")
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "an executor that never existed is an error: {body}"
    );
    assert_fits(
        &doc,
        "POST",
        "/api/v1/executors/{id}/recover",
        status,
        &body,
    );
    let live = format!("/api/v1/executors/{}/recover", worker.executor_id());
    let (status, body) = api.call("POST", &live, Some(&admin), "").await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a live worker is not recovered without force: {body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("live lease")),
        "the refusal says why: {body}"
    );
    assert_fits(
        &doc,
        "POST",
        "/api/v1/executors/{id}/recover",
        status,
        &body,
    );
    let (status, body) = api
        .call("POST", &format!("{live}?force=true"), Some(&admin), "")
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an admin may force a recovery: {body}"
    );
    assert_fits(
        &doc,
        "POST",
        "/api/v1/executors/{id}/recover",
        status,
        &body,
    );
    worker.shutdown(Duration::from_secs(10)).await;
}
