//! Tokens and the audit trail through the router (`oneshot`, no socket): token
//! administration over `/api/v1/tokens`, expiry and revocation answering 401, the
//! case-insensitive bearer scheme, refusals counted in `/metrics`, and the audit trail
//! of changes and refusals. The token store itself runs on both backends.

mod common;

use axum::{
    body::Body,
    http::{Request, StatusCode, header},
};
use common::Api;
use manent_api::{Role, auth};
use manent_engine::{Client, Connections, Database, now_ms};
use manent_testkit::{Db, TestDb};
use serde_json::Value;
use tower::ServiceExt;

use manent_testkit::on_both_backends;

on_both_backends!(
    the_token_store_keeps_names_unique_and_forgets_revoked_and_expired_tokens,
    of_concurrent_creations_of_one_name_exactly_one_makes_a_token,
    the_audit_trail_is_kept_on_each_backend,
);

async fn the_token_store_keeps_names_unique_and_forgets_revoked_and_expired_tokens(db: Db) {
    let db = TestDb::new(db).await;
    let records = Client::new(
        Database::open(&db.url, &Connections::default())
            .await
            .expect("open the database"),
    )
    .records();
    let secret = auth::create_token(&records, "ci", Role::Admin, None)
        .await
        .expect("a new name is accepted");
    let duplicate = auth::create_token(&records, "ci", Role::Viewer, None).await;
    assert!(
        matches!(duplicate, Err(auth::TokenError::Duplicate(_))),
        "a second token named ci is refused: {duplicate:?}"
    );
    let first = auth::authenticate(&records, &secret)
        .await
        .unwrap()
        .expect("the token authenticates");
    assert_eq!(first.token.name, "ci", "the secret finds its token");

    let revoked = auth::revoke(&records, "ci").await.expect("ci is revoked");
    assert_eq!(
        revoked.id, first.token.id,
        "revoke returns the revoked token"
    );
    assert!(
        auth::authenticate(&records, &secret)
            .await
            .unwrap()
            .is_none(),
        "a revoked token no longer authenticates"
    );
    let again = auth::create_token(&records, "ci", Role::Admin, None)
        .await
        .expect("a revoked name may be used again");
    let second = auth::authenticate(&records, &again).await.unwrap().unwrap();
    assert_ne!(
        second.token.id, first.token.id,
        "a name created again is another token (another id)"
    );

    let (_, expired) = auth::create(
        &records,
        &auth::NewToken {
            name: "old".into(),
            role: Role::Viewer,
            on: None,
            expires_at_ms: Some(now_ms() - 1),
        },
    )
    .await
    .unwrap();
    assert!(
        auth::authenticate(&records, &expired)
            .await
            .unwrap()
            .is_none(),
        "an expired token does not authenticate"
    );
    let listed = auth::list(&records).await.unwrap();
    let summary: Vec<(&str, bool, bool)> = listed
        .iter()
        .map(|t| (t.name.as_str(), t.expired, t.last_used_at.is_some()))
        .collect();
    assert_eq!(
        summary,
        [("ci", false, true), ("old", true, false)],
        "the list shows each token once, its expiry and its last use"
    );
}

async fn of_concurrent_creations_of_one_name_exactly_one_makes_a_token(db: Db) {
    let db = TestDb::new(db).await;
    let records = Client::new(
        Database::open(&db.url, &Connections::default())
            .await
            .expect("open the database"),
    )
    .records();
    let attempts: Vec<_> = (0..8)
        .map(|_| {
            let records = records.clone();
            tokio::spawn(
                async move { auth::create_token(&records, "ci", Role::Deployer, None).await },
            )
        })
        .collect();
    let mut created = 0;
    for attempt in attempts {
        match attempt.await.expect("a creation does not panic") {
            Ok(_) => created += 1,
            Err(auth::TokenError::Duplicate(name)) => {
                assert_eq!(name, "ci", "the token is listed under its name")
            }
            Err(other) => panic!("a concurrent creation fails only as a duplicate: {other}"),
        }
    }
    assert_eq!(created, 1, "exactly one creation of `ci` succeeds");
    assert_eq!(
        auth::list(&records).await.unwrap().len(),
        1,
        "the refused creations left no token behind"
    );
    auth::revoke(&records, "ci").await.expect("ci is revoked");
    assert!(
        auth::list(&records).await.unwrap().is_empty(),
        "revoking removes the token"
    );
    assert!(
        matches!(
            auth::revoke(&records, "ci").await,
            Err(auth::TokenError::NotFound(_))
        ),
        "a second revoke finds nothing"
    );
}

async fn the_audit_trail_is_kept_on_each_backend(db: Db) {
    let db = TestDb::new(db).await;
    let records = Client::new(
        Database::open(&db.url, &Connections::default())
            .await
            .expect("open the database"),
    )
    .records();
    manent_api::audit::record_admin(&records, "manent-server admin", "token.revoke", "bot").await;
    let entries = manent_api::audit::list(&records, &manent_engine::AuditFilter::newest(10))
        .await
        .unwrap();
    assert_eq!(entries.len(), 1, "one entry was recorded: {entries:?}");
    assert_eq!(
        (entries[0].action.as_str(), entries[0].target.as_str()),
        ("token.revoke", "bot"),
        "what and on what are kept"
    );
}

/// Sends a request with a raw `Authorization` value.
async fn call_with_authorization(api: &Api, uri: &str, authorization: &str) -> StatusCode {
    let request = Request::builder()
        .uri(uri)
        .header(header::AUTHORIZATION, authorization)
        .body(Body::empty())
        .unwrap();
    api.router.clone().oneshot(request).await.unwrap().status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_case_insensitive() {
    let api = Api::new().await;
    let token = api.token("ci", Role::Viewer).await;
    for scheme in ["Bearer", "bearer", "BEARER"] {
        assert_eq!(
            call_with_authorization(&api, "/api/v1/queues", &format!("{scheme} {token}")).await,
            StatusCode::OK,
            "`{scheme}` is accepted as the bearer scheme"
        );
    }
    assert_eq!(
        call_with_authorization(&api, "/api/v1/queues", &format!("Basic {token}")).await,
        StatusCode::UNAUTHORIZED,
        "another scheme is refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admins_create_list_and_revoke_tokens_over_the_api() {
    let api = Api::new().await;
    let admin = api.token("root", Role::Admin).await;
    let body = r#"{"name": "shop-ci", "role": "deployer", "on": "shop/*", "expires": "30d"}"#;
    let (status, created) = api.call("POST", "/api/v1/tokens", Some(&admin), body).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "an admin creates a token: {created}"
    );
    let secret = created["secret"]
        .as_str()
        .expect("the secret is returned once");
    assert_eq!(created["on"], "shop/*", "the scope is kept: {created}");

    let (status, again) = api.call("POST", "/api/v1/tokens", Some(&admin), body).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a taken name is refused: {again}"
    );
    let (status, bad) = api
        .call(
            "POST",
            "/api/v1/tokens",
            Some(&admin),
            r#"{"name": "x", "role": "viewer", "on": "shop"}"#,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "an unqualified scope is refused"
    );
    assert_eq!(bad["error"]["field"], "on", "the field is named: {bad}");
    assert!(
        bad["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`shop/*`")),
        "the message hints shop/*: {bad}"
    );

    let (status, list) = api.get("/api/v1/tokens", Some(&admin)).await;
    assert_eq!(status, StatusCode::OK, "an admin lists the tokens");
    let text = list.to_string();
    assert!(
        !text.contains(secret) && !text.contains(&admin) && !text.contains("secret"),
        "the list never carries a secret: {text}"
    );
    assert_eq!(
        list.as_array().map(Vec::len),
        Some(2),
        "root and shop-ci: {list}"
    );

    let (status, _) = api.get("/api/v1/tokens", Some(secret)).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a deployer may not list tokens"
    );
    let (status, _) = api
        .call("DELETE", "/api/v1/tokens/root", Some(secret), "")
        .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a deployer may not revoke tokens"
    );

    let (status, revoked) = api
        .call("DELETE", "/api/v1/tokens/shop-ci", Some(&admin), "")
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an admin revokes a token: {revoked}"
    );
    let (status, _) = api.get("/api/v1/queues", Some(secret)).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "the revoked token answers 401 from then on"
    );
    let (status, _) = api
        .call("DELETE", "/api/v1/tokens/shop-ci", Some(&admin), "")
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "revoking twice finds nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_are_counted_in_metrics() {
    let api = Api::new().await;
    let viewer = api.token("viewer", Role::Viewer).await;
    let (status, _) = api.get("/api/v1/queues", Some("mnt_unknown")).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "an unknown token is refused"
    );
    let (status, _) = api.get("/api/v1/tokens", Some(&viewer)).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a viewer may not list tokens"
    );
    let response = api
        .router
        .clone()
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&bytes);
    for status in ["401", "403"] {
        let count: u64 = text
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "manent_api_refused_requests_total{{status=\"{status}\"}} "
                ))
            })
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("/metrics has the {status} counter:\n{text}"));
        assert!(count >= 1, "the {status} just answered is counted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_and_refusals_are_in_the_audit_trail_newest_first() {
    let api = Api::new().await;
    let admin = api.token("root", Role::Admin).await;
    let deployer = api.token("ci", Role::Deployer).await;
    let viewer = api.token("eve", Role::Viewer).await;
    let (status, submitted) = api.post_deploy(&deployer, &api.good_descriptor()).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the deploy is accepted: {submitted}"
    );
    let id = submitted["id"].as_str().unwrap().to_string();
    let (status, _) = api
        .call(
            "POST",
            &format!("/api/v1/deploys/{id}/cancel"),
            Some(&deployer),
            "",
        )
        .await;
    assert_eq!(status, StatusCode::OK, "the submitter cancels it");
    let (status, _) = api.post_deploy(&viewer, &api.good_descriptor()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a viewer may not deploy");
    let (status, _) = api.get("/api/v1/deploys", Some("mnt_forged")).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a forged token is refused"
    );

    let (status, _) = api.get("/api/v1/audit", Some(&viewer)).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "only admins read the audit trail"
    );
    let (status, trail) = api.get("/api/v1/audit?limit=4", Some(&admin)).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an admin reads the audit trail: {trail}"
    );
    let rows: Vec<(String, String, i64)> = trail
        .as_array()
        .expect("a list")
        .iter()
        .map(|e| {
            (
                e["token"].as_str().unwrap_or_default().to_string(),
                e["action"].as_str().unwrap_or_default().to_string(),
                e["outcome"].as_i64().unwrap_or_default(),
            )
        })
        .collect();
    let expected = [
        ("eve", "GET /api/v1/audit", 403),
        ("-", "GET /api/v1/deploys", 401),
        ("eve", "deploy.submit", 403),
        ("ci", "deploy.cancel", 200),
    ]
    .map(|(t, a, o)| (t.to_string(), a.to_string(), o));
    assert_eq!(rows, expected, "the newest four, newest first");
    let all = api.get("/api/v1/audit", Some(&admin)).await.1;
    let submit = all
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action"] == "deploy.submit" && e["outcome"] == 201)
        .unwrap_or_else(|| panic!("the accepted submission is audited: {all}"));
    assert_eq!(submit["target"], id.as_str(), "its target is the deploy id");
    assert!(
        submit["token_id"]
            .as_str()
            .is_some_and(|i| i.starts_with("tok_")),
        "the token's id is recorded with its name: {submit}"
    );
    let (_, denied) = api.post_deploy(&viewer, &api.good_descriptor()).await;
    assert!(
        denied["error"].is_object(),
        "refusals still answer their error"
    );
}

/// Polls the deploy's status until `done` holds (deadline `WAIT`); returns it.
async fn wait_for(
    api: &Api,
    token: &str,
    id: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = std::time::Instant::now() + common::WAIT;
    loop {
        let (_, status) = api.get(&format!("/api/v1/deploys/{id}"), Some(token)).await;
        if done(&status) {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "deploy {id} never {what}: {status}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_know_tokens_by_id_so_a_recreated_name_is_another_token_that_counts_once() {
    let mut api = Api::new().await;
    std::fs::write(
        api.config.environments_source().join("acme/web/prod.yml"),
        "targets:\n  - {name: t1, host: local}\ndeploy:\n  plugin: command\n  commands: [\"true\"]\n\
         approval: {approvers: [ci, bot], count: 2}\n",
    )
    .unwrap();
    let worker = api.worker().await;
    let records = api.client.records();
    let ci = api.token("ci", Role::Admin).await;
    let bot = api.token("bot", Role::Approver).await;
    let (status, submitted) = api.post_deploy(&ci, &api.good_descriptor()).await;
    assert_eq!(status, StatusCode::CREATED, "ci submits: {submitted}");
    let id = submitted["id"].as_str().unwrap().to_string();
    wait_for(&api, &ci, &id, "waits for approval", |s| {
        s["phase"] == "waiting_approval"
    })
    .await;
    let approve = |token: String| {
        let api = &api;
        let id = id.clone();
        async move {
            api.call(
                "POST",
                &format!("/api/v1/deploys/{id}/approve"),
                Some(&token),
                "",
            )
            .await
        }
    };

    let (status, body) = approve(ci.clone()).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "ci may not approve its own deploy: {body}"
    );
    let (status, body) = approve(bot.clone()).await;
    assert_eq!(status, StatusCode::OK, "bot approves: {body}");

    auth::revoke(&records, "bot").await.unwrap();
    let bot_again = auth::create_token(&records, "bot", Role::Approver, None)
        .await
        .unwrap();
    let (status, body) = approve(bot_again).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the new bot is a listed approver and may approve: {body}"
    );
    auth::revoke(&records, "ci").await.unwrap();
    let ci_again = auth::create_token(&records, "ci", Role::Admin, None)
        .await
        .unwrap();
    let (status, body) = approve(ci_again.clone()).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a new token named ci is not the submitter (another id): {body}"
    );
    let done = wait_for(&api, &ci_again, &id, "ends", |s| {
        matches!(s["status"].as_str(), Some("SUCCESS" | "ERROR"))
    })
    .await;
    assert_eq!(
        done["status"], "SUCCESS",
        "two distinct approvers let it run: {done}"
    );
    let approvers: Vec<&str> = done["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["by"].as_str())
        .collect();
    assert_eq!(
        approvers,
        ["bot", "ci"],
        "bot counted once although two tokens of that name approved, in order"
    );
    worker.shutdown(common::WAIT).await;
}

/// `GET uri` from `peer` with `Authorization: Bearer <token>` when given; the status, the
/// `Retry-After` header and the body.
async fn call_from(
    api: &Api,
    peer: [u8; 4],
    uri: &str,
    token: Option<&str>,
) -> (StatusCode, Option<String>, Value) {
    let mut request = Request::get(uri);
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let mut request = request.body(Body::empty()).unwrap();
    // What the listener's `into_make_service_with_connect_info` gives every request.
    request
        .extensions_mut()
        .insert(axum::extract::ConnectInfo(std::net::SocketAddr::from((
            peer, 40_000,
        ))));
    let response = api.router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let retry_after = response
        .headers()
        .get(header::RETRY_AFTER)
        .map(|v| v.to_str().unwrap_or_default().to_string());
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        retry_after,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_authentications_from_one_source_are_throttled_and_summed_up_while_a_valid_token_is_served()
 {
    let api = Api::with_api_config("{auth_throttle: {failures: 5, window: 1h}}").await;
    let admin = api.token("root", Role::Admin).await;
    let hostile = [192, 0, 2, 66];
    let mut statuses = Vec::new();
    for n in 0..40 {
        let forged = format!("mnt_forged_{n}");
        let token = (n % 2 == 0).then_some(forged.as_str());
        statuses.push(call_from(&api, hostile, "/api/v1/deploys", token).await);
    }
    let codes: Vec<u16> = statuses.iter().map(|(s, _, _)| s.as_u16()).collect();
    assert_eq!(
        codes,
        [[401u16; 5].as_slice(), [429u16; 35].as_slice()].concat(),
        "five failures are answered 401, then the source is answered 429"
    );
    let (_, retry_after, body) = &statuses[39];
    let seconds: u64 = retry_after
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("a 429 says when to retry: {retry_after:?}"));
    assert!(
        (1..=3600).contains(&seconds),
        "Retry-After is within the window: {seconds}"
    );
    assert_eq!(
        body["error"]["code"], "too_many_requests",
        "a 429 answers the error body: {body}"
    );
    let (status, _, _) = call_from(&api, hostile, "/api/v1/deploys", Some(&admin)).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a valid token from the throttled source is served"
    );
    let (status, _, _) = call_from(&api, [198, 51, 100, 1], "/api/v1/deploys", None).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "another source is not throttled by the first one's failures"
    );
    let (_, _, trail) = call_from(
        &api,
        hostile,
        "/api/v1/audit?actor=-&limit=1000",
        Some(&admin),
    )
    .await;
    let rows = trail.as_array().expect("the audit trail");
    assert_eq!(
        rows.len(),
        3,
        "41 anonymous refusals are three entries (the first of each source and the moment \
         the hostile one tripped), not one each: {trail}"
    );
    let tripped = rows
        .iter()
        .find(|e| e["action"] == "auth.failures")
        .unwrap_or_else(|| panic!("the trip is recorded with its source: {trail}"));
    assert_eq!(tripped["target"], "192.0.2.66", "it names the source");
    assert!(
        tripped["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("5 failed authentications from 192.0.2.66")),
        "it counts the failures: {tripped}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_trail_is_filtered_and_paged_past_thousands_of_newer_entries() {
    let api = Api::new().await;
    let admin = api.token("root", Role::Admin).await;
    let records = api.client.records();
    let entry = |at_ms: i64, actor: &str, action: &str| manent_engine::AuditRecord {
        seq: 0,
        at_ms,
        actor: actor.into(),
        actor_id: String::new(),
        action: action.into(),
        target: format!("t{at_ms}"),
        outcome: 200,
        detail: String::new(),
    };
    // 2026-01-01T00:00:00Z and the next seconds: three of alice's, then 2,500 newer ones.
    let base = 1_767_225_600_000;
    for n in 0..3 {
        records
            .append_audit(&entry(base + n * 1000, "alice", "deploy.submit"))
            .await
            .unwrap();
    }
    for n in 0..2_500 {
        records
            .append_audit(&entry(base + 3_600_000 + n, "bob", "deploy.cancel"))
            .await
            .unwrap();
    }
    let (status, alice) = api
        .get(
            "/api/v1/audit?actor=alice&action=deploy.submit",
            Some(&admin),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "filters are accepted: {alice}");
    let targets: Vec<&str> = alice
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["target"].as_str())
        .collect();
    assert_eq!(
        targets,
        [
            format!("t{}", base + 2000),
            format!("t{}", base + 1000),
            format!("t{base}")
        ],
        "alice's entries, found behind 2,500 newer ones, newest first"
    );
    let (_, window) = api
        .get(
            "/api/v1/audit?since=2026-01-01T00:00:01Z&until=2026-01-01T00:00:02Z",
            Some(&admin),
        )
        .await;
    assert_eq!(
        window.as_array().map(Vec::len),
        Some(1),
        "since is inclusive, until exclusive: {window}"
    );
    let mut before: Option<i64> = None;
    let mut seen = 0;
    loop {
        let uri = match before {
            Some(seq) => format!("/api/v1/audit?actor=bob&limit=1000&before={seq}"),
            None => "/api/v1/audit?actor=bob&limit=1000".into(),
        };
        let (status, page) = api.get(&uri, Some(&admin)).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {page}");
        let page = page.as_array().unwrap().clone();
        let Some(last) = page.last() else { break };
        before = last["seq"].as_i64();
        seen += page.len();
    }
    assert_eq!(
        seen, 2_500,
        "the cursor pages through every one of bob's entries"
    );
    let (status, empty) = api
        .get(
            "/api/v1/audit?limit=5&since=&until=&actor=&action=",
            Some(&admin),
        )
        .await;
    assert_eq!(
        (status, empty.as_array().map(Vec::len)),
        (StatusCode::OK, Some(5)),
        "empty filters, as a form sends them, filter nothing: {empty}"
    );
    let (status, body) = api.get("/api/v1/audit?since=yesterday", Some(&admin)).await;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("since")),
        "a time that cannot be read is a 400 naming the field: {body}"
    );
}
