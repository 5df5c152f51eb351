//! External plugins in the deploy workflow, with `manent-test-plugin` as the plugin: a pass
//! per plugin request, dry-runs that change nothing, and the failures that must not be
//! retried (a wrong sha256, a stub on a worker that does not run the plugin, a confined
//! plugin whose sandbox cannot be made). The test plugin writes into a directory of the test,
//! so it runs unconfined (`confinement: none`) unless a test says otherwise; the sandbox
//! itself is tested with ansible in manent-server's `tests/plugins.rs`.

use std::{path::PathBuf, time::Duration};

use manent_config::Config;
use manent_deploy::{
    submission,
    views::deploy_views::{self, DeployStatus},
};
use manent_engine::{Connections, Database, Engine, EngineConfig, WorkflowStatus};
use manent_testkit::{Db, TestDb};

/// A safety net for waits that end on an event; never a measure of speed.
const WAIT: Duration = Duration::from_secs(120);

fn test_plugin() -> PathBuf {
    manent_testkit::workspace_binary("manent-test-plugin", "manent-plugin")
}

struct Site {
    db: TestDb,
    /// Unique per test, so parallel tests never share a worker directory.
    executor: String,
    /// Where the test plugin records each target's version.
    state: PathBuf,
    /// More keys of `plugins.test.external` (default `confinement: none`).
    external: String,
}

impl Site {
    async fn new() -> Site {
        let db = TestDb::new(Db::Sqlite).await;
        let state = db.path("state");
        std::fs::create_dir_all(&state).unwrap();
        let env = db.path("environments/acme/web");
        std::fs::create_dir_all(&env).unwrap();
        std::fs::write(
            env.join("prod.yml"),
            format!(
                "targets:\n  - {{name: t1, host: local}}\n  - {{name: t2, host: local}}\n\
                 deploy:\n  plugin: test\n  params: {{dir: \"{}\"}}\n\
                 checks:\n  - {{name: up, type: command, command: \"true\"}}\n",
                state.display()
            ),
        )
        .unwrap();
        std::fs::write(db.path("site.yml"), "- hosts: all\n").unwrap();
        let executor = db
            .path("")
            .file_name()
            .map(|n| {
                n.to_string_lossy()
                    .replace(|c: char| !c.is_ascii_alphanumeric(), "")
            })
            .unwrap_or_default();
        Site {
            db,
            executor,
            state,
            external: "confinement: none".into(),
        }
    }

    /// A worker dequeuing the plugin's queue; `serves` says whether its configuration lists
    /// the plugin in `dbos.plugins` (if not, the deploys reach it anyway).
    async fn worker(&self, sha256: &str, serves: bool) -> (Config, Worker) {
        let config = self.config(sha256, serves);
        let database = Database::open(&self.db.url, &Connections::default())
            .await
            .unwrap();
        let engine = Engine::new(database, EngineConfig::new(config.effective_executor_id()));
        for queue in manent_deploy::worker_queues(&self.config(sha256, true)) {
            engine.listen(queue.spec());
        }
        let plugins = manent_deploy::register_workflows(
            &engine,
            &config,
            std::sync::Arc::new(manent_deploy::authority::NoTokens),
            std::sync::Arc::new(manent_deploy::http::NoClient),
        );
        engine.launch().await.expect("launch the worker");
        (config, Worker { engine, plugins })
    }

    fn config(&self, sha256: &str, serves: bool) -> Config {
        let yaml = format!(
            "database: {{url: \"{}\"}}\nenvironments: {{source: \"{}\"}}\n\
             artifacts: {{sources: [\"{}\"]}}\n\
             dbos: {{executor_id: w-{}, plugins: [{}]}}\n\
             plugins:\n  test:\n    external: {{command: \"{}\", sha256: \"{sha256}\", {}}}\n    \
             artifact_types: [test]\n    queue: test\n",
            self.db.url,
            self.db.path("environments").display(),
            manent_testkit::temp_artifact_source(),
            self.executor,
            if serves { "test" } else { "" },
            test_plugin().display(),
            self.external,
        );
        Config::from_yaml_str(&yaml, "manent.yml", std::iter::empty())
            .expect("the test configuration is valid")
    }

    async fn deploy(&self, config: &Config, worker: &Worker, dry_run: bool) -> DeployStatus {
        self.deploy_with(config, worker, dry_run, "").await
    }

    /// A deploy whose descriptor ends with `extra` (e.g. `deploy:` overrides).
    async fn deploy_with(
        &self,
        config: &Config,
        worker: &Worker,
        dry_run: bool,
        extra: &str,
    ) -> DeployStatus {
        let sha = manent_plugin::host::file_sha256(&self.db.path("site.yml")).unwrap();
        let text = format!(
            "application: acme/web\nenvironment: prod\ndry_run: {dry_run}\nartifacts:\n  - \
             {{name: site.yml, type: test, version: \"3\", url: \"file://{}\", sha256: {sha}}}\n{extra}",
            self.db.path("site.yml").display()
        );
        let client = worker.engine.client();
        let descriptor = submission::parse(text, "deploy.yml".into())
            .await
            .expect("the descriptor parses");
        let submitted = submission::submit(
            &client,
            &std::sync::Arc::new(config.clone()),
            descriptor,
            false,
            &manent_deploy::Submitter::named("test"),
        )
        .await
        .expect("the descriptor is accepted");
        let record = client
            .wait(&submitted.id, WAIT)
            .await
            .expect("the deploy ends");
        let status = deploy_views::status(&client, &submitted.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            record.status == WorkflowStatus::Success,
            status.status == WorkflowStatus::Success,
            "the view agrees with the record"
        );
        status
    }

    fn version_of(&self, target: &str) -> Option<String> {
        std::fs::read_to_string(self.state.join(target)).ok()
    }
}

struct Worker {
    engine: Engine,
    plugins: std::sync::Arc<manent_deploy::Plugins>,
}

impl Worker {
    /// Stops like manent-server: the engine, then the plugin processes.
    async fn stop(self) {
        self.engine.shutdown(Duration::from_secs(10)).await;
        self.plugins.shutdown().await;
    }
}

fn targets(status: &DeployStatus) -> Vec<(String, String)> {
    status
        .targets
        .iter()
        .map(|t| (t.name.clone(), t.status.to_string()))
        .collect()
}

/// Status and attempts of the plugin's deploy step.
fn pass_step(status: &DeployStatus) -> (String, i64) {
    steps(status)
        .into_iter()
        .find(|s| s.0 == "test: deploy 2 targets")
        .map(|s| (s.1, s.2))
        .expect("the pass step ran")
}

fn steps(status: &DeployStatus) -> Vec<(String, String, i64)> {
    status
        .steps
        .iter()
        .map(|s| (s.name.clone(), s.status.to_string(), s.attempts))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_plugin_deploys_each_pass_in_one_step_then_checks_each_target() {
    let site = Site::new().await;
    let sum = manent_plugin::host::file_sha256(&test_plugin()).unwrap();
    let (config, worker) = site.worker(&sum, true).await;

    let planned = site.deploy(&config, &worker, true).await;
    assert_eq!(
        planned.status,
        WorkflowStatus::Success,
        "the dry-run succeeds: {planned:?}"
    );
    assert_eq!(planned.queue, "test", "routed to the plugin's queue");
    assert_eq!(
        targets(&planned),
        [
            ("t1".into(), "planned".into()),
            ("t2".into(), "planned".into())
        ],
        "each target is planned: {planned:?}"
    );
    assert_eq!(
        (site.version_of("t1"), site.version_of("t2")),
        (None, None),
        "a dry-run changes nothing"
    );

    let done = site.deploy(&config, &worker, false).await;
    assert_eq!(
        done.status,
        WorkflowStatus::Success,
        "the deploy succeeds: {done:?}"
    );
    assert_eq!(
        targets(&done),
        [
            ("t1".into(), "deployed".into()),
            ("t2".into(), "deployed".into())
        ],
        "each target is deployed: {done:?}"
    );
    assert_eq!(
        (site.version_of("t1"), site.version_of("t2")),
        (Some("3".into()), Some("3".into())),
        "the plugin installed the version on both targets"
    );
    // Leaves out the deploy's own last step (waking dependent deploys): not the plugin's.
    let names: Vec<String> = steps(&done)
        .into_iter()
        .map(|s| s.0)
        .filter(|name| name != "wake dependents")
        .collect();
    assert_eq!(
        names,
        [
            "fetch site.yml",
            "test: deploy 2 targets",
            "test: check 2 targets",
            "t1: check up",
            "t2: check up"
        ],
        "one step per plugin request, then manent's checks per target: {done:?}"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_prints_a_multi_line_secret_shows_none_of_it_in_output_or_error() {
    let site = Site::new().await;
    let key = "-----BEGIN OPENSSH PRIVATE KEY-----\n\
               b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n\
               QyNTUxOQAAACCf0qSZ2xH1Zx3VsCx4kq4Yb5u2cTQpXcq8hJ0bLqgIYwAAAJg2i9ZpNovW\n\
               -----END OPENSSH PRIVATE KEY-----";
    let key_file = site.db.path("key");
    std::fs::write(&key_file, format!("{key}\n")).unwrap();
    // The plugin reads the environment's key file (as a playbook might) and prints it as
    // progress lines, in its log and stderr, and in its error.
    std::fs::write(
        site.db.path("environments/acme/web/prod.yml"),
        format!(
            "targets:\n  - {{name: t1, host: local}}\n\
             deploy:\n  plugin: test\n  params: {{dir: \"{}\", say: \"{}\", mode: fail_saying}}\n\
             secrets:\n  SSH_KEY: {{file: \"{}\"}}\n",
            site.state.display(),
            key_file.display(),
            key_file.display()
        ),
    )
    .unwrap();
    let sum = manent_plugin::host::file_sha256(&test_plugin()).unwrap();
    let (config, worker) = site.worker(&sum, true).await;
    let done = site.deploy(&config, &worker, false).await;
    assert_eq!(
        done.status,
        WorkflowStatus::Error,
        "the plugin failed on purpose: {done:?}"
    );
    let client = worker.engine.client();
    let logs = deploy_views::logs(&client, &done.id, true)
        .await
        .unwrap()
        .expect("the deploy has logs");
    let output = logs.lines;
    assert!(
        output.iter().any(|l| l.ends_with("***")),
        "the key's progress lines, one stream, are masked as the key printed whole: {output:#?}"
    );
    let shown = format!("{done:?}\n{}", output.join("\n"));
    for line in key.lines() {
        let piece = line.trim_matches('-');
        assert!(
            !shown.contains(piece),
            "the status, error or output shows {piece:?} of the key:\n{shown}"
        );
    }
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_sha256_fails_the_deploy_at_once_and_says_why() {
    let site = Site::new().await;
    let wrong = "0".repeat(64);
    let (config, worker) = site.worker(&wrong, true).await;
    let done = site.deploy(&config, &worker, false).await;
    assert_eq!(
        done.status,
        WorkflowStatus::Error,
        "the deploy fails: {done:?}"
    );
    let error = done.error.clone().unwrap_or_default();
    assert!(
        error.contains("sha256") && error.contains(&wrong) && error.contains("refusing to start"),
        "the deploy says why: {error}"
    );
    assert_eq!(
        pass_step(&done),
        ("ERROR".to_string(), 1),
        "a wrong sum is not retried: {done:?}"
    );
    assert_eq!(site.version_of("t1"), None, "nothing was deployed");
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confined_plugin_whose_bwrap_cannot_run_is_refused_and_runs_once_confinement_is_none() {
    let mut site = Site::new().await;
    let sum = manent_plugin::host::file_sha256(&test_plugin()).unwrap();
    // Confinement is the default: no `confinement:` key, and a bwrap that is not there.
    site.external = "bwrap: /nonexistent/bwrap".into();
    let (config, worker) = site.worker(&sum, true).await;
    let issues = manent_deploy::plugins::confinement_issues(&config);
    assert!(
        issues.len() == 1 && issues[0].1.contains("/nonexistent/bwrap"),
        "check-config and the worker's start name the missing bwrap: {issues:?}"
    );
    let done = site.deploy(&config, &worker, false).await;
    assert_eq!(
        done.status,
        WorkflowStatus::Error,
        "a plugin that cannot be confined is not run: {done:?}"
    );
    let error = done.error.clone().unwrap_or_default();
    assert!(
        error.contains("plugin `test` cannot run confined")
            && error.contains("/nonexistent/bwrap")
            && error.contains("plugins.test.external.confinement: none"),
        "the error names the plugin, the bwrap it looked for and what to do: {error}"
    );
    assert_eq!(
        pass_step(&done),
        ("ERROR".to_string(), 1),
        "a sandbox that cannot be made is not retried: {done:?}"
    );
    assert_eq!(site.version_of("t1"), None, "nothing was deployed");
    worker.stop().await;

    // Turned off explicitly, the same plugin runs.
    site.external = "bwrap: /nonexistent/bwrap, confinement: none".into();
    let (config, worker) = site.worker(&sum, true).await;
    let done = site.deploy(&config, &worker, false).await;
    assert_eq!(
        done.status,
        WorkflowStatus::Success,
        "with confinement: none the plugin runs: {done:?}"
    );
    assert_eq!(
        site.version_of("t1").as_deref(),
        Some("3"),
        "the unconfined plugin deployed"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_reaching_a_worker_where_the_plugin_is_a_stub_fails_without_retries() {
    let site = Site::new().await;
    // The worker dequeues the plugin's queue without listing the plugin in dbos.plugins: a
    // deploy reaches a worker where the plugin is a stub.
    let (config, worker) = site.worker(&"f".repeat(64), false).await;
    let done = site.deploy(&config, &worker, false).await;
    assert_eq!(
        done.status,
        WorkflowStatus::Error,
        "the deploy fails: {done:?}"
    );
    let error = done.error.clone().unwrap_or_default();
    assert!(
        error.contains("runs only on workers with dbos.plugins: [test]"),
        "the deploy says where the plugin runs: {error}"
    );
    assert_eq!(
        steps(&done),
        [],
        "nothing was tried: no fetch, no pass: {done:?}"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_keeps_crashing_fails_the_deploy_with_its_exit_and_stderr() {
    let site = Site::new().await;
    let sum = manent_plugin::host::file_sha256(&test_plugin()).unwrap();
    let (config, worker) = site.worker(&sum, true).await;
    let done = site
        .deploy_with(&config, &worker, false, "deploy: {params: {mode: crash}}\n")
        .await;
    assert_eq!(
        done.status,
        WorkflowStatus::Error,
        "the deploy fails, it does not hang: {done:?}"
    );
    let error = done.error.clone().unwrap_or_default();
    assert!(
        error.contains("exited with exit status: 3") && error.contains("crashing on purpose"),
        "the deploy says how the plugin died: {error}"
    );
    assert_eq!(
        pass_step(&done),
        ("ERROR".to_string(), 3),
        "a crash is retryable: the pass was tried with a fresh process each time: {done:?}"
    );
    // The worker still serves the next deploy, with a fresh process.
    let next = site.deploy(&config, &worker, false).await;
    assert_eq!(
        next.status,
        WorkflowStatus::Success,
        "the next deploy works: {next:?}"
    );
    worker.stop().await;
}

/// Whether `bwrap` can be run here: required in CI (scripts/test installs bubblewrap), a
/// loud skip elsewhere.
fn bwrap_available() -> bool {
    if manent_plugin::sandbox::locate_bwrap(std::path::Path::new("bwrap")).is_ok() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "bwrap is not on the PATH: scripts/test installs bubblewrap; CI must run the sandbox \
         tests"
    );
    eprintln!("\n*** SKIPPED: this test needs bwrap (apt-get install bubblewrap) ***\n");
    false
}

/// Issue 43: a confined plugin plants links to another environment's file and to a
/// directory outside wherever the worker writes or once wrote in a deploy's directory, then
/// dies as if killed. The retry verifies the artifacts again and makes the plugin's `HOME`
/// without following a link; the end of the deploy removes its directory without following
/// one either. The other environment's file and the directory outside stay as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_a_confined_plugin_plants_before_dying_are_never_followed_on_the_retry_or_cleanup() {
    if !bwrap_available() {
        return;
    }
    let mut site = Site::new().await;
    site.external = "bwrap: bwrap".into();
    // Acme's environment file, the target of the attack, and an empty directory.
    let acme = site.db.path("environments/acme/web/prod.yml");
    let before = std::fs::read(&acme).unwrap();
    let outside = site.db.path("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let sum = manent_plugin::host::file_sha256(&test_plugin()).unwrap();
    let (config, worker) = site.worker(&sum, true).await;
    let done = site
        .deploy_with(
            &config,
            &worker,
            false,
            &format!(
                "deploy: {{params: {{mode: plant, outside_file: \"{}\", outside_dir: \"{}\"}}}}\n",
                acme.display(),
                outside.display()
            ),
        )
        .await;
    assert_eq!(
        done.status,
        WorkflowStatus::Success,
        "the retry deploys: {done:?}"
    );
    assert_eq!(
        pass_step(&done),
        ("SUCCESS".to_string(), 2),
        "the first process died, the second deployed: {done:?}"
    );
    let artifact = manent_plugin::host::file_sha256(&site.db.path("site.yml")).unwrap();
    for target in &done.targets {
        let detail = target.detail.clone().unwrap_or_default();
        assert!(
            detail.contains(&format!("site.yml={artifact}")),
            "{}: the retry's process reads the verified artifact: {detail}",
            target.name
        );
        assert!(
            detail.contains("beside-artifacts=0") && !detail.contains("planted=0"),
            "{}: the plugin planted links in its working directory, none beside the \
             artifacts (read-only in its sandbox): {detail}",
            target.name
        );
    }
    assert_eq!(
        std::fs::read(&acme).unwrap(),
        before,
        "acme's environment file is untouched"
    );
    let entries: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        entries.is_empty(),
        "nothing was made in the directory outside: {entries:?}"
    );
    let deploy_dir = manent_deploy::run::artifacts::deploy_dir(
        &manent_deploy::workflow::work_directory(&config),
        &done.id,
    );
    assert!(
        std::fs::symlink_metadata(&deploy_dir).is_err(),
        "the deploy's directory, links and all, is gone: {}",
        deploy_dir.display()
    );
    worker.stop().await;
}
