//! The API test fixture shared by `api.rs` and `openapi.rs`: an API over a fresh
//! SQLite database, driven in-process with `tower::ServiceExt::oneshot`.
#![allow(dead_code)]

use std::{path::PathBuf, sync::Arc, time::Duration};

use axum::{
    Router,
    body::Body,
    http::{Method, Request, StatusCode, header},
};
use manent_api::{AppState, Role, app, auth};
use manent_config::Config;
use manent_engine::{Client, Connections, Database, Engine, EngineConfig};
use manent_testkit::{Db, TestDb};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tower::ServiceExt;

/// A safety net for waits that end on an event; never a measure of speed.
pub const WAIT: Duration = Duration::from_secs(120);
pub const ARTIFACT: &[u8] = b"the payload of web v1";

/// An API over a fresh SQLite database, with `acme/web/prod` configured (one local
/// target, the command plugin) and a valid artifact on disk.
pub struct Api {
    pub db: TestDb,
    pub config: Arc<Config>,
    pub client: Client,
    pub router: Router,
    /// Working directories of the workers started here, removed at the end.
    pub work_dirs: Vec<PathBuf>,
}

impl Api {
    pub async fn new() -> Api {
        Api::with_api_config("{}").await
    }

    /// [`Api::new`] with `api:` set to `api_yaml` (a YAML flow mapping).
    pub async fn with_api_config(api_yaml: &str) -> Api {
        manent_testkit::init_tracing();
        let db = TestDb::new(Db::Sqlite).await;
        let source = db.path("environments");
        std::fs::create_dir_all(source.join("acme/web")).unwrap();
        std::fs::write(
            source.join("acme/web/prod.yml"),
            "targets:\n  - {name: t1, host: local}\ndeploy:\n  plugin: command\n  commands: [\"true\"]\n",
        )
        .unwrap();
        std::fs::write(db.path("web-v1.bin"), ARTIFACT).unwrap();
        let yaml = format!(
            "database: {{url: {}}}\nenvironments: {{source: {}}}\nartifacts: {{sources: [{}]}}\napi: {api_yaml}\n",
            serde_json::to_string(&db.url).unwrap(),
            serde_json::to_string(&source).unwrap(),
            serde_json::to_string(&manent_testkit::temp_artifact_source()).unwrap(),
        );
        let config = Arc::new(
            Config::from_yaml_str(&yaml, "manent.yml", std::iter::empty())
                .expect("the test configuration is valid"),
        );
        let database = Database::open(&db.url, &Connections::default())
            .await
            .expect("open the test database");
        let client = Client::new(database);
        let router = app(AppState::new(client.clone(), config.clone()));
        Api {
            db,
            config,
            client,
            router,
            work_dirs: Vec::new(),
        }
    }

    pub async fn token(&self, name: &str, role: Role) -> String {
        auth::create_token(&self.client.records(), name, role, None)
            .await
            .expect("create a token")
    }

    /// A descriptor deploying the artifact to `application`'s `prod`, with this sha256.
    pub fn descriptor(&self, application: &str, sha256: &str) -> String {
        format!(
            "application: {application}\nenvironment: prod\nartifacts:\n  - {{name: web.bin, \
             type: binary, version: v1, url: {}, sha256: {sha256}}}\n",
            serde_json::to_string(&format!("file://{}", self.db.path("web-v1.bin").display()))
                .unwrap()
        )
    }

    pub fn good_descriptor(&self) -> String {
        self.descriptor("acme/web", &hex::encode(Sha256::digest(ARTIFACT)))
    }

    /// A descriptor of acme/web in prod at `version` (the same verified artifact each
    /// time), `extra` lines appended.
    pub fn descriptor_at(&self, version: &str, extra: &str) -> String {
        let text = self
            .good_descriptor()
            .replace("version: v1", &format!("version: \"{version}\""));
        assert!(text.contains(version), "the version is set: {text}");
        format!("{text}{extra}")
    }

    /// Submits `descriptor` as `token` and waits for its success; returns its id.
    pub async fn deployed(&self, token: &str, descriptor: &str) -> String {
        let (status, body) = self.post_deploy(token, descriptor).await;
        assert_eq!(
            status,
            StatusCode::CREATED,
            "{descriptor} is submitted: {body}"
        );
        let id = body["id"].as_str().expect("an id").to_string();
        self.succeeds(&id).await;
        id
    }

    /// Waits for deploy `id` to end, asserting that it succeeded.
    pub async fn succeeds(&self, id: &str) {
        let record = self.client.wait(id, WAIT).await.expect("the deploy ends");
        assert_eq!(
            record.status,
            manent_engine::WorkflowStatus::Success,
            "deploy {id} succeeds: {:?}",
            record.error
        );
    }

    /// Sends one request; returns the status and the body as JSON (`Null` when empty or
    /// not JSON).
    pub async fn call(
        &self,
        method: impl AsRef<str>,
        uri: &str,
        token: Option<&str>,
        body: &str,
    ) -> (StatusCode, Value) {
        let method = Method::from_bytes(method.as_ref().as_bytes()).expect("a method");
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(Body::from(body.to_string()))
            .expect("a valid request");
        answer(self.router.clone(), request).await
    }

    pub async fn get(&self, uri: &str, token: Option<&str>) -> (StatusCode, Value) {
        self.call(Method::GET, uri, token, "").await
    }

    pub async fn post_deploy(&self, token: &str, descriptor: &str) -> (StatusCode, Value) {
        self.call(Method::POST, "/api/v1/deploys", Some(token), descriptor)
            .await
    }

    /// A launched worker serving the configuration's queues with the deploy workflow.
    pub async fn worker(&mut self) -> Engine {
        let id = format!("api-test-{}", unique_suffix());
        let yaml = format!(
            "database: {{url: {}}}\ndbos: {{executor_id: {}}}\nenvironments: {{source: {}}}\n\
             artifacts: {{sources: [{}]}}\n",
            serde_json::to_string(&self.db.url).unwrap(),
            serde_json::to_string(&id).unwrap(),
            serde_json::to_string(&self.config.environments_source()).unwrap(),
            serde_json::to_string(&manent_testkit::temp_artifact_source()).unwrap(),
        );
        let config = Config::from_yaml_str(&yaml, "manent.yml", std::iter::empty()).unwrap();
        let database = Database::open(&self.db.url, &Connections::default())
            .await
            .unwrap();
        let engine = Engine::new(database, EngineConfig::new(&id));
        for queue in manent_deploy::worker_queues(&config) {
            engine.listen(queue.spec());
        }
        // The API's tests deploy nothing that is fetched or checked over HTTP.
        let http = Arc::new(manent_deploy::http::NoClient);
        manent_deploy::register_workflows(&engine, &config, self.authority(), http);
        engine.launch().await.expect("launch the worker");
        self.work_dirs.push(config.worker_workdir());
        engine
    }

    /// The token store as the workers and tickers ask it (`auth::TokenAuthority`).
    pub fn authority(&self) -> Arc<dyn manent_deploy::authority::Authority> {
        Arc::new(auth::TokenAuthority::new(self.client.records()))
    }

    /// What this API's tickers authorise each tick against.
    pub fn tick_policy(&self) -> manent_deploy::background::schedules::TickPolicy {
        manent_deploy::background::schedules::TickPolicy {
            config: self.config.clone(),
            authority: self.authority(),
        }
    }

    /// How many deploys exist, whatever their status.
    pub async fn deploy_count(&self) -> usize {
        manent_deploy::views::deploy_views::list(&self.client, &Default::default(), &|_| true)
            .await
            .expect("list deploys")
            .len()
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        for dir in &self.work_dirs {
            // Only a directory of this test's own worker id (MANENT_WORKDIR is left alone).
            if dir.to_string_lossy().contains("api-test-") {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// A unique suffix (time and a counter), so parallel tests never share a worker directory.
/// `request` sent to `router`: the status and the body as JSON (`Null` when empty or not
/// JSON). Owns what it needs, so that a request can be held while the test goes on.
pub async fn answer(router: Router, request: Request<Body>) -> (StatusCode, Value) {
    let response = router.oneshot(request).await.expect("the router answers");
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("read the body");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

pub fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}-{}",
        std::process::id(),
        manent_engine::now_ms(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
