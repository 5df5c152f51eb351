//! The authorisation matrix through the router: every `/api/v1` route × every role ×
//! scoped and unscoped tokens × the token's own tenant and another one. Each cell asserts
//! the status code, and where a change is refused, that nothing changed
//! (docs/security.md, "Tokens, roles and scopes"). Every operation of the generated
//! OpenAPI document must have its cells: a route added without them fails here.

mod common;

use std::sync::Mutex;

use axum::http::StatusCode;
use common::{ARTIFACT, Api};
use manent_api::{Role, auth};
use serde_json::Value;
use sha2::{Digest, Sha256};

const OWN: &str = "acme/web";
const OTHER: &str = "ml/app";

/// Who calls: a role, scoped to `acme/*` or not.
#[derive(Clone, Copy, Debug)]
struct Who {
    role: Role,
    scoped: bool,
}

impl Who {
    fn may_deploy(self) -> bool {
        matches!(self.role, Role::Deployer | Role::Admin)
    }
    fn may_approve(self) -> bool {
        matches!(self.role, Role::Approver | Role::Admin)
    }
    fn may_administer(self) -> bool {
        self.role == Role::Admin && !self.scoped
    }
    /// Whether `application` is inside the token's scope.
    fn sees(self, application: &str) -> bool {
        !self.scoped || application == OWN
    }
}

fn everyone() -> Vec<Who> {
    let roles = [Role::Viewer, Role::Deployer, Role::Approver, Role::Admin];
    roles
        .iter()
        .flat_map(|&role| [false, true].map(|scoped| Who { role, scoped }))
        .collect()
}

struct Site {
    api: Api,
    root: String,
    /// Every (method, path) a cell called, for the coverage check.
    called: Mutex<Vec<(String, String)>>,
}

impl Site {
    async fn new() -> Site {
        let api = Api::new().await;
        let dir = api.config.environments_source().join(OTHER);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("prod.yml"),
            "targets:\n  - {name: t1, host: local}\ndeploy:\n  plugin: command\n  commands: [\"true\"]\n",
        )
        .unwrap();
        let root = api.token("root", Role::Admin).await;
        Site {
            api,
            root,
            called: Mutex::new(Vec::new()),
        }
    }

    async fn token(&self, who: Who, n: usize) -> String {
        let name = format!("{}-{}-{n}", who.role, if who.scoped { "s" } else { "u" });
        let on = who.scoped.then_some("acme/*");
        auth::create_token(&self.api.client.records(), &name, who.role, on)
            .await
            .expect("create the cell's token")
    }

    fn descriptor(&self, application: &str) -> String {
        self.api
            .descriptor(application, &hex::encode(Sha256::digest(ARTIFACT)))
    }

    /// A fresh deploy of `application`, submitted by the unscoped admin.
    async fn deploy(&self, application: &str) -> String {
        let (status, body) = self
            .api
            .post_deploy(&self.root, &self.descriptor(application))
            .await;
        assert_eq!(status, StatusCode::CREATED, "the fixture deploy: {body}");
        body["id"].as_str().unwrap().to_owned()
    }

    /// A fresh recurring schedule of `application`.
    async fn schedule(&self, application: &str) -> String {
        let text = format!(
            "{}schedule: {{cron: \"0 3 * * *\"}}\n",
            self.descriptor(application)
        );
        let (status, body) = self.api.post_deploy(&self.root, &text).await;
        assert_eq!(status, StatusCode::CREATED, "the fixture schedule: {body}");
        body["id"].as_str().unwrap().to_owned()
    }

    async fn state_of(&self, uri: &str) -> Value {
        self.api.get(uri, Some(&self.root)).await.1
    }

    async fn call(&self, method: &str, uri: &str, token: &str, body: &str) -> StatusCode {
        let path = uri.split('?').next().unwrap_or(uri).to_string();
        self.called
            .lock()
            .expect("the list of calls")
            .push((method.to_string(), path));
        self.api.call(method, uri, Some(token), body).await.0
    }

    /// The operations of the OpenAPI document under the token that no cell called.
    fn uncovered(&self) -> Vec<String> {
        let called = self.called.lock().expect("the list of calls");
        let doc = manent_api::openapi::document();
        let mut missing = Vec::new();
        for (template, item) in doc["paths"].as_object().expect("the document has paths") {
            if !template.starts_with("/api/v1/") || template == "/api/v1/openapi.json" {
                continue;
            }
            for method in item.as_object().expect("a path item").keys() {
                let method = method.to_ascii_uppercase();
                let covered = called
                    .iter()
                    .any(|(m, path)| *m == method && fits(template, path));
                if !covered {
                    missing.push(format!("{method} {template}"));
                }
            }
        }
        missing
    }
}

/// Whether `path` is an instance of the route `template` (`{id}` stands for a segment).
fn fits(template: &str, path: &str) -> bool {
    let (t, p): (Vec<&str>, Vec<&str>) = (template.split('/').collect(), path.split('/').collect());
    t.len() == p.len()
        && t.iter()
            .zip(&p)
            .all(|(t, p)| t == p || (t.starts_with('{') && !p.is_empty()))
}

/// Asserts one cell; `what` names it in the message.
fn check(got: StatusCode, expected: StatusCode, who: Who, what: &str) {
    assert_eq!(
        got,
        expected,
        "{what} by a {} token ({}): expected {expected}, got {got}",
        who.role,
        if who.scoped {
            "scoped to acme/*"
        } else {
            "unscoped"
        }
    );
}

/// What a route that acts on a recorded application answers: 404 outside the scope
/// (existence is not revealed), 403 inside it without the right, `allowed` otherwise.
fn on_recorded(who: Who, application: &str, right: bool, allowed: StatusCode) -> StatusCode {
    if !who.sees(application) {
        StatusCode::NOT_FOUND
    } else if right {
        allowed
    } else {
        StatusCode::FORBIDDEN
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_each_role_and_scope_as_the_security_model_says() {
    let site = Site::new().await;
    for (n, who) in everyone().into_iter().enumerate() {
        let token = site.token(who, n).await;
        check_platform_reads(&site, who, &token).await;
        for app in [OWN, OTHER] {
            check_submissions(&site, who, &token, app).await;
            check_one_deploy(&site, who, &token, app).await;
            check_schedules(&site, who, &token, app).await;
        }
        check_administration(&site, who, &token, n).await;
    }
    let uncovered = site.uncovered();
    assert!(
        uncovered.is_empty(),
        "every documented /api/v1 operation has its cells in this matrix; add them for: \
         {uncovered:?}"
    );
}

/// The cells of the platform-wide reads.
async fn check_platform_reads(site: &Site, who: Who, token: &str) {
    // Platform-wide reads: every token.
    for uri in [
        "/api/v1/deploys",
        "/api/v1/activity",
        "/api/v1/schedules",
        "/api/v1/apps",
        "/api/v1/tenants",
        "/api/v1/queues",
        "/api/v1/workers",
    ] {
        check(
            site.call("GET", uri, token, "").await,
            StatusCode::OK,
            who,
            uri,
        );
    }
}

/// The cells of a single and a bulk submission of `app`.
async fn check_submissions(site: &Site, who: Who, token: &str, app: &str) {
    // Submission: the parsed application decides.
    let before = site.api.deploy_count().await;
    let expected = if who.may_deploy() && who.sees(app) {
        StatusCode::CREATED
    } else {
        StatusCode::FORBIDDEN
    };
    let got = site
        .call("POST", "/api/v1/deploys", token, &site.descriptor(app))
        .await;
    check(got, expected, who, &format!("submitting {app}"));
    if expected != StatusCode::CREATED {
        assert_eq!(
            site.api.deploy_count().await,
            before,
            "a refused submission of {app} by {who:?} enqueues nothing"
        );
    }

    // A bulk submission: every parsed application decides, and a batch holding
    // one the caller may not deploy enqueues none of them.
    for apps in [vec![app], vec![OWN, OTHER]] {
        let before = site.api.deploy_count().await;
        let allowed = who.may_deploy() && apps.iter().all(|a| who.sees(a));
        let expected = if allowed {
            StatusCode::CREATED
        } else {
            StatusCode::FORBIDDEN
        };
        let entries: Vec<Value> = apps
            .iter()
            .map(|a| serde_json::json!({"descriptor": site.descriptor(a)}))
            .collect();
        let body = serde_json::json!({ "deploys": entries }).to_string();
        let got = site
            .call("POST", "/api/v1/deploys/batch", token, &body)
            .await;
        check(got, expected, who, &format!("submitting {apps:?} at once"));
        let added = if allowed { apps.len() } else { 0 };
        assert_eq!(
            site.api.deploy_count().await,
            before + added,
            "a batch of {apps:?} by {who:?} enqueues all of it or nothing"
        );
    }
}

/// The cells of one deploy of `app`: its reads, its environment's history, redeploy and
/// rollback, approve and reject, and cancel.
async fn check_one_deploy(site: &Site, who: Who, token: &str, app: &str) {
    // Reads of one deploy.
    let id = site.deploy(app).await;
    let read = on_recorded(who, app, true, StatusCode::OK);
    for uri in [
        format!("/api/v1/deploys/{id}"),
        format!("/api/v1/deploys/{id}/logs"),
        format!("/api/v1/deploys/{id}/output"),
    ] {
        check(site.call("GET", &uri, token, "").await, read, who, &uri);
    }

    // An environment's history: read by any token in scope.
    let (tenant, name) = app.split_once('/').unwrap();
    let environment = format!("/api/v1/apps/{tenant}/{name}/environments/prod");
    let uri = format!("{environment}/history");
    check(site.call("GET", &uri, token, "").await, read, who, &uri);
    // Its variables: read by a token that may deploy it.
    let uri = format!("{environment}/vars");
    let vars = on_recorded(who, app, who.may_deploy(), StatusCode::OK);
    check(site.call("GET", &uri, token, "").await, vars, who, &uri);
    // Plan and drift (docs/plan-and-drift.md): the deploy's plan and the last drift check
    // are read by any token in scope (no check ran yet: 404 for all); a check reaches every
    // target and a reconcile deploys, so both need deploy rights. Nothing was deployed
    // (no worker runs here), so a check finds every target unknown and a reconcile has
    // nothing to do (409).
    let uri = format!("/api/v1/deploys/{id}/plan");
    check(site.call("GET", &uri, token, "").await, read, who, &uri);
    let uri = format!("{environment}/drift");
    let last = on_recorded(who, app, true, StatusCode::NOT_FOUND);
    check(site.call("GET", &uri, token, "").await, last, who, &uri);
    let check_now = on_recorded(who, app, who.may_deploy(), StatusCode::OK);
    check(
        site.call("POST", &uri, token, "").await,
        check_now,
        who,
        &uri,
    );
    let uri = format!("{environment}/reconcile");
    let reconcile = on_recorded(who, app, who.may_deploy(), StatusCode::CONFLICT);
    check(
        site.call("POST", &uri, token, "").await,
        reconcile,
        who,
        &uri,
    );

    // Redeploy submits a deploy; a rollback finds no success (no worker runs here),
    // so an allowed caller meets 409. Refused ones enqueue nothing.
    let before = site.api.deploy_count().await;
    let uri = format!("/api/v1/deploys/{id}/redeploy");
    let expected = on_recorded(who, app, who.may_deploy(), StatusCode::CREATED);
    check(
        site.call("POST", &uri, token, "").await,
        expected,
        who,
        &uri,
    );
    let uri = format!("{environment}/rollback");
    let rollback = on_recorded(who, app, who.may_deploy(), StatusCode::CONFLICT);
    check(
        site.call("POST", &uri, token, "").await,
        rollback,
        who,
        &uri,
    );
    if expected != StatusCode::CREATED {
        assert_eq!(
            site.api.deploy_count().await,
            before,
            "a refused redeploy or rollback by {who:?} enqueues nothing"
        );
    }

    // Approve and reject, promote and abort (docs/analysis.md): the deploy waits for
    // nothing, so an allowed caller meets 409.
    for verb in ["approve", "reject", "promote", "abort"] {
        let uri = format!("/api/v1/deploys/{id}/{verb}");
        let expected = on_recorded(who, app, who.may_approve(), StatusCode::CONFLICT);
        check(
            site.call("POST", &uri, token, "").await,
            expected,
            who,
            &uri,
        );
    }

    // Cancel changes the deploy: refused ones must leave it as it was.
    let uri = format!("/api/v1/deploys/{id}/cancel");
    let before = site.state_of(&format!("/api/v1/deploys/{id}")).await["status"].clone();
    let expected = on_recorded(who, app, who.may_deploy(), StatusCode::OK);
    check(
        site.call("POST", &uri, token, "").await,
        expected,
        who,
        &uri,
    );
    let after = site.state_of(&format!("/api/v1/deploys/{id}")).await["status"].clone();
    if expected == StatusCode::OK {
        assert_eq!(after, "CANCELLED", "an allowed cancel cancels");
    } else {
        assert_eq!(after, before, "a refused cancel by {who:?} changes nothing");
    }
}

/// The cells of a schedule of `app`.
async fn check_schedules(site: &Site, who: Who, token: &str, app: &str) {
    // Schedules: read by any token in scope; pause, resume and delete by deployers.
    let schedule = site.schedule(app).await;
    let uri = format!("/api/v1/schedules/{schedule}");
    let read = on_recorded(who, app, true, StatusCode::OK);
    check(site.call("GET", &uri, token, "").await, read, who, &uri);
    for (method, action) in [("POST", "pause"), ("POST", "resume"), ("DELETE", "")] {
        let target = if action.is_empty() {
            uri.clone()
        } else {
            format!("{uri}/{action}")
        };
        let before = site.state_of(&uri).await;
        let expected = on_recorded(who, app, who.may_deploy(), StatusCode::OK);
        check(
            site.call(method, &target, token, "").await,
            expected,
            who,
            &target,
        );
        if expected != StatusCode::OK {
            assert_eq!(
                site.state_of(&uri).await,
                before,
                "a refused {method} {target} by {who:?} changes nothing"
            );
        }
    }
}

/// The cells of administration: unscoped admins only. `n` makes the token names unique.
async fn check_administration(site: &Site, who: Who, token: &str, n: usize) {
    let admin_only = |allowed: StatusCode| {
        if who.may_administer() {
            allowed
        } else {
            StatusCode::FORBIDDEN
        }
    };
    check(
        site.call("GET", "/api/v1/tokens", token, "").await,
        admin_only(StatusCode::OK),
        who,
        "listing tokens",
    );
    check(
        site.call("GET", "/api/v1/audit", token, "").await,
        admin_only(StatusCode::OK),
        who,
        "reading the audit trail",
    );
    check(
        site.call("GET", "/api/v1/whoami", token, "").await,
        StatusCode::OK,
        who,
        "asking who it is",
    );
    let new_name = format!("made-by-{n}");
    let body = format!("{{\"name\": \"{new_name}\", \"role\": \"viewer\"}}");
    check(
        site.call("POST", "/api/v1/tokens", token, &body).await,
        admin_only(StatusCode::CREATED),
        who,
        "creating a token",
    );
    let (_, listed) = site.api.get("/api/v1/tokens", Some(&site.root)).await;
    let exists = listed.to_string().contains(&new_name);
    assert_eq!(
        exists,
        who.may_administer(),
        "a token exists only if an unscoped admin created it"
    );
    let victim = format!("victim-{n}");
    let victim_secret = auth::create_token(&site.api.client.records(), &victim, Role::Viewer, None)
        .await
        .expect("create the token to revoke");
    check(
        site.call("DELETE", &format!("/api/v1/tokens/{victim}"), token, "")
            .await,
        admin_only(StatusCode::OK),
        who,
        "revoking a token",
    );
    let (status, _) = site.api.get("/api/v1/deploys", Some(&victim_secret)).await;
    let expected = if who.may_administer() {
        StatusCode::UNAUTHORIZED
    } else {
        StatusCode::OK
    };
    assert_eq!(
        status, expected,
        "the token works again only if the revoke by {who:?} was refused"
    );
    // An unknown executor: an admin is authorised and told it does not exist.
    check(
        site.call("POST", "/api/v1/executors/nobody/recover", token, "")
            .await,
        admin_only(StatusCode::NOT_FOUND),
        who,
        "recovering an executor",
    );
}
