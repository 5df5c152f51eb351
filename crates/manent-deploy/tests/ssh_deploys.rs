//! Deploys over real SSH: the deploy workflow on an in-process engine, its targets real
//! OpenSSH servers on loopback addresses (the testkit's `SshHosts`). Waves, parallelism,
//! checksums, strict host keys, failing checks with rollback, dry runs, a deploy resumed
//! on another worker that lacks the artifact, a cancelled deploy's commands and work
//! directory, and the release directories `keep_releases` leaves.
//!
//! Every "host" shares this machine's filesystem, so each target gets its own destination:
//! `deploy.dest` is `<base>/{target}/{version}`, where `<base>/<target>` is a symlink to that
//! target's host scratch directory (`root_dir`). What a test reads under a host's
//! `root_dir` is what was written over SSH to that host.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use manent_config::Config;
use manent_deploy::{
    artifacts,
    deploy_views::{self, DeployStatus},
    submission,
};
use manent_engine::{Engine, EngineConfig, WorkflowRecord, WorkflowStatus, store};
use manent_testkit::{Db, TestDb, process_gone, sshd::SshHosts};
use sha2::{Digest, Sha256};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::mpsc,
};

/// A safety net for waits that end on an event; never a measure of speed.
const WAIT: Duration = Duration::from_secs(180);
/// The artifact's size: a few hundred KB, several SFTP chunks.
const ARTIFACT_LEN: usize = 300 * 1024;

// ---- the site: sshd hosts, environment file, artifacts, workers ----

/// Where a target sits: its region and availability zone.
struct Placement {
    region: &'static str,
    az: &'static str,
}

const FOUR_TARGETS_TWO_REGIONS: &[Placement] = &[
    Placement {
        region: "eu",
        az: "eu-a",
    },
    Placement {
        region: "eu",
        az: "eu-b",
    },
    Placement {
        region: "us",
        az: "us-a",
    },
    Placement {
        region: "us",
        az: "us-b",
    },
];

const TWO_TARGETS_TWO_REGIONS: &[Placement] = &[
    Placement {
        region: "eu",
        az: "eu-a",
    },
    Placement {
        region: "us",
        az: "us-a",
    },
];

/// A test's whole world: a fresh database, one sshd per target, an environments source.
struct Site {
    db: TestDb,
    hosts: SshHosts,
    source: PathBuf,
    /// `<base>/<target>` → the target's host `root_dir`.
    base: PathBuf,
    placements: &'static [Placement],
    /// Worker directories of the deploys run here, removed at the end.
    work_dirs: Mutex<Vec<PathBuf>>,
}

/// A YAML (and JSON) double-quoted scalar.
fn q(s: impl AsRef<str>) -> String {
    serde_json::to_string(s.as_ref()).expect("a string serialises")
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Bytes that differ per `seed` and do not compress.
fn pseudo_random(seed: &str, len: usize) -> Vec<u8> {
    let mut state =
        u64::from_le_bytes(Sha256::digest(seed.as_bytes())[..8].try_into().unwrap()) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// A deployed artifact: its descriptor fields and the bytes it should have on a target.
struct Artifact {
    version: String,
    url: String,
    sha256: String,
}

impl Site {
    async fn new(backend: Db, placements: &'static [Placement]) -> Site {
        manent_testkit::init_tracing();
        let db = TestDb::new(backend).await;
        let hosts = SshHosts::start(placements.len()).await;
        let source = db.path("environments");
        std::fs::create_dir_all(source.join("acme/web")).expect("create the environments source");
        let base = db.path("targets");
        std::fs::create_dir_all(&base).expect("create the targets' base directory");
        for (i, host) in hosts.hosts.iter().enumerate() {
            std::os::unix::fs::symlink(&host.root_dir, base.join(target_name(i)))
                .expect("link each target's directory to its host's scratch directory");
        }
        Site {
            db,
            hosts,
            source,
            base,
            placements,
            work_dirs: Mutex::new(Vec::new()),
        }
    }

    /// Writes `acme/web/prod.yml`: every target on its sshd, remote-copy to
    /// `<base>/{target}/{version}`, `current` switched by `activate`, waves `waves` with
    /// two targets at a time, and `extra` YAML.
    fn write_environment(&self, known_hosts: &Path, waves: &str, extra: &str) {
        let base = path_str(&self.base);
        let activate = format!("ln -sfn \"$MANENT_VERSION\" \"{base}/$MANENT_TARGET/current\"");
        self.write_environment_activating(known_hosts, waves, extra, &activate);
    }

    /// As `write_environment`, with `activate` as the activate command.
    fn write_environment_activating(
        &self,
        known_hosts: &Path,
        waves: &str,
        extra: &str,
        activate: &str,
    ) {
        let targets: String = self
            .placements
            .iter()
            .zip(&self.hosts.hosts)
            .enumerate()
            .map(|(i, (p, h))| {
                format!(
                    "  - {{name: {}, host: {}, port: {}, user: {}, region: {}, az: {}}}\n",
                    target_name(i),
                    q(&h.addr),
                    h.port,
                    q(&self.hosts.user),
                    p.region,
                    p.az
                )
            })
            .collect();
        let base = path_str(&self.base);
        let text = format!(
            "targets:\n{targets}\
             ssh: {{key: {key}, known_hosts: {known_hosts}}}\n\
             deploy:\n  plugin: remote-copy\n  dest: {dest}\n  activate: {activate}\n\
             rollout: {{waves: {waves}, max_parallel: 2}}\n{extra}",
            key = q(path_str(&self.hosts.client_key)),
            known_hosts = q(path_str(known_hosts)),
            dest = q(format!("{base}/{{target}}/{{version}}")),
            activate = q(activate),
        );
        std::fs::write(self.source.join("acme/web/prod.yml"), text)
            .expect("write the environment file");
    }

    /// Replaces `from` with `to` in the environment file (which must hold `from`).
    fn edit_environment(&self, from: &str, to: &str) {
        let file = self.source.join("acme/web/prod.yml");
        let text = std::fs::read_to_string(&file).expect("read the environment file");
        assert!(
            text.contains(from),
            "the environment file holds {from:?}:\n{text}"
        );
        std::fs::write(&file, text.replace(from, to)).expect("write the environment file");
    }

    /// The configuration of worker `executor_id` on this site's database.
    fn config(&self, executor_id: &str) -> Config {
        let yaml = format!(
            "database: {{url: {}}}\ndbos: {{executor_id: {}}}\nenvironments: {{source: {}}}\n\
             artifacts: {{sources: [{}]}}\n",
            q(&self.db.url),
            q(executor_id),
            q(path_str(&self.source)),
            q(manent_testkit::temp_artifact_source()),
        );
        Config::from_yaml_str(&yaml, "manent.yml", std::iter::empty())
            .expect("the test configuration is valid")
    }

    /// A launched worker serving the configuration's queues with the deploy workflow.
    async fn worker(&self, executor_id: &str) -> Worker {
        let config = self.config(executor_id);
        let store = store::open(&self.db.url)
            .await
            .expect("open the test database");
        let engine = Engine::new(store, EngineConfig::new(executor_id));
        for queue in manent_deploy::worker_queues(&config) {
            engine.listen(queue.spec());
        }
        // No schedule.at deploys here: the authority that refuses them all does.
        manent_deploy::register_workflows(
            &engine,
            &config,
            Arc::new(manent_deploy::authority::NoTokens),
        );
        engine.launch().await.expect("launch the worker");
        let workdir = config.worker_workdir();
        Worker {
            config,
            engine,
            workdir,
        }
    }

    /// Writes version `version` of the artifact (its own bytes) and returns what a
    /// descriptor says of it.
    fn artifact(&self, version: &str) -> Artifact {
        let bytes = pseudo_random(version, ARTIFACT_LEN);
        let path = self.db.path(&format!("app-{version}.bin"));
        std::fs::write(&path, &bytes).expect("write the artifact");
        Artifact {
            version: version.to_string(),
            url: format!("file://{}", path.display()),
            sha256: sha256_hex(&bytes),
        }
    }

    /// Submits a deploy of `artifact` (with `sha256` as the descriptor's checksum) and
    /// waits for its end.
    async fn deploy(
        &self,
        worker: &Worker,
        artifact: &Artifact,
        sha256: &str,
        dry_run: bool,
    ) -> (WorkflowRecord, DeployStatus) {
        let id = self.submit(worker, artifact, sha256, dry_run).await;
        let client = worker.engine.client();
        let record = client
            .wait(&id, WAIT)
            .await
            .unwrap_or_else(|e| panic!("deploy {id} ends: {e}\n{}", self.hosts.logs()));
        let status = deploy_views::status(&client, &id)
            .await
            .expect("read the deploy's status")
            .expect("the deploy exists");
        (record, status)
    }

    async fn submit(
        &self,
        worker: &Worker,
        artifact: &Artifact,
        sha256: &str,
        dry_run: bool,
    ) -> String {
        let text = format!(
            "application: acme/web\nenvironment: prod\ndry_run: {dry_run}\nartifacts:\n  - \
             {{name: app.bin, type: binary, version: {}, url: {}, sha256: {}}}\n",
            q(&artifact.version),
            q(&artifact.url),
            q(sha256),
        );
        let descriptor = submission::parse(text, "deploy.yml".into())
            .await
            .expect("the descriptor parses");
        let submitted = submission::submit(
            &worker.engine.client(),
            &std::sync::Arc::new(worker.config.clone()),
            descriptor,
            false,
            &manent_deploy::Submitter::named("test"),
        )
        .await
        .expect("the descriptor is accepted");
        assert_eq!(
            submitted.queue, "default",
            "with no routing configured, a deploy goes to the default queue"
        );
        self.work_dirs
            .lock()
            .unwrap()
            .push(artifacts::deploy_dir(&worker.workdir, &submitted.id));
        submitted.id
    }

    fn root(&self, target: usize) -> &Path {
        &self.hosts.hosts[target].root_dir
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        for dir in self.work_dirs.lock().unwrap().drain(..) {
            let _ = std::fs::remove_dir_all(&dir);
            if let Some(parent) = dir.parent() {
                // The worker's own directory, if this test's deploys were all it held.
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
}

struct Worker {
    config: Config,
    engine: Engine,
    /// Where this worker keeps artifacts: its `Runtime`'s work directory, from the config.
    workdir: PathBuf,
}

impl Worker {
    async fn stop(self) {
        self.engine.shutdown(Duration::from_secs(10)).await;
    }
}

fn target_name(i: usize) -> String {
    format!("t{}", i + 1)
}

/// A unique executor id, so parallel tests never share a worker directory.
fn executor_id(role: &str) -> String {
    format!("ssh-{role}-{}", uuid::Uuid::new_v4().simple())
}

/// Every path under `dir`, not following symlinks.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("list a target directory") {
            let path = entry.expect("read a directory entry").path();
            let meta = std::fs::symlink_metadata(&path).expect("stat a target file");
            if meta.is_dir() {
                stack.push(path.clone());
            }
            out.push(path);
        }
    }
    out.sort();
    out
}

fn file_sha256(path: &Path) -> Option<String> {
    std::fs::read(path).ok().map(|b| sha256_hex(&b))
}

fn target<'a>(status: &'a DeployStatus, name: &str) -> &'a deploy_views::TargetView {
    status
        .targets
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("target {name} in the status: {status:#?}"))
}

fn step<'a>(status: &'a DeployStatus, name: &str) -> &'a deploy_views::StepView {
    status
        .steps
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("step `{name}` in the status: {:#?}", status.steps))
}

fn current_of(root: &Path) -> Option<PathBuf> {
    std::fs::read_link(root.join("current")).ok()
}

// ---- the tests ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_targets_in_two_regions_are_deployed_wave_by_wave_on_sqlite() {
    four_targets_in_two_regions_are_deployed_wave_by_wave(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_targets_in_two_regions_are_deployed_wave_by_wave_on_postgres() {
    four_targets_in_two_regions_are_deployed_wave_by_wave(Db::Postgres).await;
}

async fn four_targets_in_two_regions_are_deployed_wave_by_wave(backend: Db) {
    let site = Site::new(backend, FOUR_TARGETS_TWO_REGIONS).await;
    site.write_environment(&site.hosts.known_hosts, "by_region", "");
    let worker = site.worker(&executor_id("w1")).await;
    let v1 = site.artifact("v1");

    let (record, status) = site.deploy(&worker, &v1, &v1.sha256, false).await;

    assert_eq!(
        record.status,
        WorkflowStatus::Success,
        "every target is reachable and accepts the artifact, so the deploy succeeds: {:?}\n{status:#?}",
        record.error
    );
    assert_eq!(
        status.status,
        WorkflowStatus::Success,
        "the status view agrees with the record"
    );
    for i in 0..4 {
        let name = target_name(i);
        let root = site.root(i);
        let placed = root.join("v1/app.bin");
        assert_eq!(
            file_sha256(&placed).as_deref(),
            Some(v1.sha256.as_str()),
            "{name} holds the artifact at <dest>/<name> with the submitted sha256"
        );
        let leftovers: Vec<_> = files_under(root)
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "part"))
            .collect();
        assert!(
            leftovers.is_empty(),
            "the upload's .part file is renamed into place, none is left on {name}: {leftovers:?}"
        );
        assert_eq!(
            current_of(root),
            Some(PathBuf::from("v1")),
            "activate ran on {name} with MANENT_TARGET and MANENT_VERSION, switching current to v1"
        );
        assert_eq!(
            target(&status, &name).status,
            "deployed",
            "the status shows {name} deployed"
        );
        for s in [
            format!("{name}: upload app.bin"),
            format!("{name}: activate"),
        ] {
            assert_eq!(
                step(&status, &s).status,
                deploy_views::StepState::Success,
                "each target has its own durable upload and activate steps"
            );
        }
    }
    assert_eq!(
        step(&status, "fetch app.bin").attempts,
        1,
        "the artifact is fetched and verified once for all targets"
    );
    // by_region: t1 and t2 (eu) form the first wave, t3 and t4 (us) the second.
    let wave_one_done = ["t1", "t2"]
        .iter()
        .map(|t| {
            step(&status, &format!("{t}: activate"))
                .finished_at
                .clone()
                .expect("a finished step has its end time")
        })
        .max()
        .unwrap();
    for t in ["t3", "t4"] {
        let started = &step(&status, &format!("{t}: upload app.bin")).started_at;
        assert!(
            *started >= wave_one_done,
            "the us wave starts only after the eu wave is done: {t} started at {started}, \
             the eu wave ended at {wave_one_done}"
        );
    }
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_sha256_fails_the_deploy_before_anything_reaches_a_target() {
    let site = Site::new(Db::Sqlite, TWO_TARGETS_TWO_REGIONS).await;
    site.write_environment(&site.hosts.known_hosts, "by_region", "");
    let worker = site.worker(&executor_id("w1")).await;
    let v1 = site.artifact("v1");
    let wrong = sha256_hex(b"not the artifact");

    let (record, status) = site.deploy(&worker, &v1, &wrong, false).await;

    assert_eq!(
        record.status,
        WorkflowStatus::Error,
        "an artifact whose content does not match its sha256 fails the deploy: {status:#?}"
    );
    let error = record.error.clone().unwrap_or_default();
    assert!(
        error.contains("sha256 mismatch"),
        "the error says why: the checksum does not match, got {error:?}"
    );
    for i in 0..site.placements.len() {
        let files = files_under(site.root(i));
        assert!(
            files.is_empty(),
            "the fetch fails before any upload, so nothing exists on {}: {files:?}",
            target_name(i)
        );
    }
    assert!(
        !status.steps.iter().any(|s| s.name.contains("upload")),
        "no upload step ever started: {:#?}",
        status.steps
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_with_an_unknown_host_key_fails_and_so_does_the_deploy() {
    let site = Site::new(Db::Sqlite, TWO_TARGETS_TWO_REGIONS).await;
    // t2's host is missing from known_hosts; both targets are in one wave.
    let known_hosts = site.hosts.known_hosts_without(1);
    site.write_environment(&known_hosts, "all", "");
    let worker = site.worker(&executor_id("w1")).await;
    let v1 = site.artifact("v1");

    let (record, status) = site.deploy(&worker, &v1, &v1.sha256, false).await;

    assert_eq!(
        record.status,
        WorkflowStatus::Error,
        "a target that cannot be reached safely fails the deploy: {status:#?}"
    );
    let t2 = target(&status, "t2");
    assert_eq!(
        t2.status, "failed",
        "strict host-key checking refuses t2, whose key is not in known_hosts"
    );
    let detail = t2.detail.clone().unwrap_or_default();
    assert!(
        detail.contains("host key") && detail.contains(&site.hosts.hosts[1].addr),
        "t2's outcome names the host and says its host key is unknown: {detail:?}"
    );
    assert!(
        record.error.as_deref().unwrap_or_default().contains("t2"),
        "the deploy's error names the failed target: {:?}",
        record.error
    );
    assert!(
        !site.root(1).join("v1").exists(),
        "nothing was written to the refused host"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_whose_activate_switched_then_failed_is_rolled_back_with_its_placeholders_and_a_first_deploy_has_nothing_to_return_to()
 {
    let site = Site::new(Db::Sqlite, TWO_TARGETS_TWO_REGIONS).await;
    let base = path_str(&site.base);
    // Switches `current`, then fails on t2 for any version but v1: t2 runs the new
    // version although its activate step failed. Written with placeholders, which the
    // rollback's activate must expand with the version it returns to (docs/environments.md,
    // "Placeholders in commands").
    let activate = format!(
        "ln -sfn {{version}} \"{base}\"/{{target}}/current && \
         {{ [ {{version}} = v1 ] || [ {{target}} != t2 ]; }}"
    );
    site.write_environment_activating(&site.hosts.known_hosts, "all", "", &activate);
    let worker = site.worker(&executor_id("w1")).await;

    let v2 = site.artifact("v2");
    let (first, status) = site.deploy(&worker, &v2, &v2.sha256, false).await;
    assert_eq!(
        first.status,
        WorkflowStatus::Error,
        "t2's activate fails: {status:#?}"
    );
    for name in ["t1", "t2"] {
        let t = target(&status, name);
        assert_ne!(
            t.status, "rolled_back",
            "a first deploy has nothing to roll {name} back to, so it is not called rolled back"
        );
        assert!(
            t.detail
                .as_deref()
                .unwrap_or_default()
                .contains("no earlier successful deploy"),
            "{name}'s outcome says there was nothing to return to: {:?}",
            t.detail
        );
    }
    let error = first.error.clone().unwrap_or_default();
    assert!(
        !error.contains("wave"),
        "with one wave, no later wave is said to be left out: {error}"
    );

    let v1 = site.artifact("v1");
    let (ok, status) = site.deploy(&worker, &v1, &v1.sha256, false).await;
    assert_eq!(
        ok.status,
        WorkflowStatus::Success,
        "v1 activates everywhere: {status:#?}"
    );

    let (again, status) = site.deploy(&worker, &v2, &v2.sha256, false).await;
    assert_eq!(
        again.status,
        WorkflowStatus::Error,
        "t2's activate fails again: {status:#?}"
    );
    for i in 0..2 {
        let name = target_name(i);
        let t = target(&status, &name);
        assert_eq!(
            t.status, "rolled_back",
            "{name} ran v2 (t2 although its activate failed), and went back to v1: {t:?}"
        );
        assert_eq!(
            current_of(site.root(i)),
            Some(PathBuf::from("v1")),
            "{name}'s current points at v1 again"
        );
    }
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_releases_leaves_the_newest_release_directories_and_the_live_one_on_each_target() {
    let site = Site::new(Db::Sqlite, TWO_TARGETS_TWO_REGIONS).await;
    site.write_environment(&site.hosts.known_hosts, "all", "");
    let base = path_str(&site.base);
    site.edit_environment(
        "deploy:\n",
        &format!(
            "deploy:\n  keep_releases: 2\n  shared: {{dir: {}, paths: [log/, app.conf]}}\n",
            q(format!("{base}/{{target}}/.shared"))
        ),
    );
    for i in 0..2 {
        // The target's own configuration, written once on it.
        std::fs::create_dir_all(site.root(i).join(".shared")).unwrap();
        std::fs::write(site.root(i).join(".shared/app.conf"), "port: 8080\n").unwrap();
    }
    let worker = site.worker(&executor_id("w1")).await;
    let releases = |i: usize| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(site.root(i))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };

    for version in ["v1", "v2", "v3"] {
        let artifact = site.artifact(version);
        let (record, status) = site
            .deploy(&worker, &artifact, &artifact.sha256, false)
            .await;
        assert_eq!(record.status, WorkflowStatus::Success, "{status:#?}");
    }
    for i in 0..2 {
        assert_eq!(
            releases(i),
            [".shared", "current", "v2", "v3"],
            "after v3, {} keeps v3 (live) and v2 (what a rollback returns to); v1 is gone, \
             the hidden shared directory stays",
            target_name(i)
        );
        let v3 = site.root(i).join("v3");
        assert_eq!(
            std::fs::read_to_string(v3.join("app.conf")).unwrap(),
            "port: 8080\n",
            "the release reads the target's shared configuration"
        );
        assert!(
            std::fs::symlink_metadata(v3.join("log"))
                .unwrap()
                .is_symlink()
                && site.root(i).join(".shared/log").is_dir(),
            "the release's log/ is a link to the shared one"
        );
    }
    // v1 again: its directory is made anew and is the live one; of the others, the newest stays.
    let v1 = site.artifact("v1");
    let (record, status) = site.deploy(&worker, &v1, &v1.sha256, false).await;
    assert_eq!(record.status, WorkflowStatus::Success, "{status:#?}");
    for i in 0..2 {
        let name = target_name(i);
        assert_eq!(
            releases(i),
            [".shared", "current", "v1", "v3"],
            "{name} after v1 again"
        );
        assert_eq!(current_of(site.root(i)), Some(PathBuf::from("v1")));
        assert_eq!(
            step(&status, &format!("{name}: prune releases")).status,
            deploy_views::StepState::Success,
            "pruning is a step of its own on {name}"
        );
        let detail = target(&status, &name).detail.clone().unwrap_or_default();
        assert!(
            detail.contains("2 releases kept, removed: v2"),
            "{name}'s outcome says what was removed: {detail}"
        );
    }
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_rollback_reactivates_releases_in_place_and_uploads_only_where_one_is_gone() {
    let site = Site::new(Db::Sqlite, FOUR_TARGETS_TWO_REGIONS).await;
    site.write_environment(
        &site.hosts.known_hosts,
        "all",
        "checks:\n  - {name: live, type: command, command: 'test -e app.bin || test -n \"$MANENT_VERSION\"'}\n",
    );
    site.edit_environment("deploy:\n", "deploy:\n  keep_releases: 3\n");
    let worker = site.worker(&executor_id("w1")).await;
    let (v1, v2) = (site.artifact("v1"), site.artifact("v2"));
    // Version 1 everywhere, then version 2 everywhere, in one wave each.
    for artifact in [&v1, &v2] {
        let (record, status) = site
            .deploy(&worker, artifact, &artifact.sha256, false)
            .await;
        assert_eq!(record.status, WorkflowStatus::Success, "{status:#?}");
    }
    // From now on: waves by region with an hour's pause between them.
    site.edit_environment(
        "waves: all, max_parallel: 2}",
        "waves: by_region, max_parallel: 2, pause: 1h}",
    );
    // t4 lost its v1 release.
    std::fs::remove_dir_all(site.root(3).join("v1")).unwrap();

    let client = worker.engine.client();
    let (source, request) = submission::rollback_source(&client, "acme/web", "prod", None)
        .await
        .expect("v1 is there to roll back to");
    let submitted = submission::resubmit(
        &client,
        &std::sync::Arc::new(worker.config.clone()),
        &source,
        request,
        manent_deploy::history::OriginKind::Rollback,
        true,
        &manent_deploy::Submitter::named("test"),
    )
    .await
    .expect("the fast rollback is accepted");
    let record = client.wait(&submitted.id, WAIT).await.unwrap();
    let status = deploy_views::status(&client, &submitted.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        record.status,
        WorkflowStatus::Success,
        "the fast rollback ran every target in one wave, without the hour's pause: {status:#?}"
    );
    assert!(
        !status.steps.iter().any(|s| s.name.starts_with("fetch ")),
        "nothing is fetched up front: {:#?}",
        status.steps
    );
    for i in 0..4 {
        let name = target_name(i);
        assert_eq!(
            current_of(site.root(i)),
            Some(PathBuf::from("v1")),
            "{name} runs v1 again"
        );
        assert_eq!(
            step(&status, &format!("{name}: find release v1")).status,
            deploy_views::StepState::Success,
            "{name} was looked at for v1's release"
        );
        let uploaded = status
            .steps
            .iter()
            .any(|s| s.name == format!("{name}: upload app.bin"));
        assert_eq!(
            uploaded,
            i == 3,
            "only t4, whose release was removed, is uploaded to again ({name})"
        );
        assert_eq!(
            step(&status, &format!("{name}: check live")).status,
            deploy_views::StepState::Success,
            "{name} is checked after its reactivation"
        );
    }
    assert_eq!(
        file_sha256(&site.root(3).join("v1/app.bin")).as_deref(),
        Some(v1.sha256.as_str()),
        "t4's release was made again from the verified artifact"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_check_stops_the_rollout_and_rolls_the_first_wave_back() {
    let site = Site::new(Db::Sqlite, FOUR_TARGETS_TWO_REGIONS).await;
    // Passes for v1, fails for any other version: the check sees MANENT_VERSION.
    site.write_environment(
        &site.hosts.known_hosts,
        "by_region",
        "checks:\n  - {name: version-is-v1, type: command, command: 'test \"$MANENT_VERSION\" = v1', retries: 0}\n",
    );
    let worker = site.worker(&executor_id("w1")).await;
    let v1 = site.artifact("v1");
    let (first, status) = site.deploy(&worker, &v1, &v1.sha256, false).await;
    assert_eq!(
        first.status,
        WorkflowStatus::Success,
        "v1 passes its check everywhere, giving the next deploy a previous version: {status:#?}"
    );

    let v2 = site.artifact("v2");
    let (second, status) = site.deploy(&worker, &v2, &v2.sha256, false).await;

    assert_eq!(
        second.status,
        WorkflowStatus::Error,
        "v2 fails its check in the first wave, so the deploy fails: {status:#?}"
    );
    let error = second.error.clone().unwrap_or_default();
    assert!(
        error.contains("version-is-v1"),
        "the deploy's error names the failing check: {error:?}"
    );
    for i in 0..2 {
        let name = target_name(i);
        let t = target(&status, &name);
        assert_eq!(
            t.status, "rolled_back",
            "{name} was switched to v2 in wave 1, then the rollback re-activated v1"
        );
        assert!(
            t.detail
                .as_deref()
                .unwrap_or_default()
                .contains("re-activated v1"),
            "{name}'s outcome says which version it went back to: {:?}",
            t.detail
        );
        assert_eq!(
            current_of(site.root(i)),
            Some(PathBuf::from("v1")),
            "{name}'s current points at v1 again after the rollback"
        );
        assert_eq!(
            step(
                &status,
                &format!("{name}: check version-is-v1 after reactivating v1")
            )
            .status,
            deploy_views::StepState::Success,
            "the rollback checks {name} after reactivating v1 (workflow version 4)"
        );
    }
    for i in 2..4 {
        let name = target_name(i);
        assert!(
            !site.root(i).join("v2").exists(),
            "the rollout stopped after wave 1, so wave 2's {name} never received v2"
        );
        assert_eq!(
            current_of(site.root(i)),
            Some(PathBuf::from("v1")),
            "{name} keeps running v1"
        );
        assert_eq!(
            target(&status, &name).status,
            "pending",
            "{name} was never touched by the failed deploy"
        );
        assert!(
            !status
                .steps
                .iter()
                .any(|s| s.name.starts_with(&format!("{name}:"))),
            "no step ran for {name}: {:#?}",
            status.steps
        );
    }
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_plans_every_target_and_changes_nothing() {
    let site = Site::new(Db::Sqlite, TWO_TARGETS_TWO_REGIONS).await;
    site.write_environment(&site.hosts.known_hosts, "by_region", "");
    let worker = site.worker(&executor_id("w1")).await;
    let v1 = site.artifact("v1");

    let (record, status) = site.deploy(&worker, &v1, &v1.sha256, true).await;

    assert_eq!(
        record.status,
        WorkflowStatus::Success,
        "every target is reachable with room to spare, so the plan succeeds: {status:#?}"
    );
    assert!(status.dry_run, "the status says it was a dry run");
    for i in 0..site.placements.len() {
        let name = target_name(i);
        let t = target(&status, &name);
        assert_eq!(
            t.status, "planned",
            "a dry run plans {name}, it does not deploy it"
        );
        let expected = format!("would upload {}/{name}/v1/app.bin", site.base.display());
        let detail = t.detail.clone().unwrap_or_default();
        assert!(
            detail.contains(&expected),
            "{name}'s plan says what would change ({expected}): {detail:?}"
        );
        let files = files_under(site.root(i));
        assert!(
            files.is_empty(),
            "a dry run creates nothing on {name}: {files:?}"
        );
    }
    assert!(
        !status
            .steps
            .iter()
            .any(|s| s.name.contains("upload") || s.name.contains("activate")),
        "a dry run has no upload or activate step: {:#?}",
        status.steps
    );
    worker.stop().await;
}

/// An HTTP server for checks: it holds the first request for `/t1` without answering
/// (and reports it on the channel), and answers 200 to every other request.
async fn holding_check_server() -> (u16, mpsc::UnboundedReceiver<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the check server on loopback");
    let port = listener.local_addr().unwrap().port();
    let (arrived, rx) = mpsc::unbounded_channel();
    let held = Arc::new(AtomicBool::new(false));
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (arrived, held) = (arrived.clone(), held.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                if path == "/t1" && !held.swap(true, Ordering::SeqCst) {
                    let _ = arrived.send(());
                    // Hold: no answer until the client goes away.
                    while matches!(socket.read(&mut buf).await, Ok(n) if n > 0) {}
                    return;
                }
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (port, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_resumed_on_another_worker_fetches_and_verifies_the_artifact_again() {
    let site = Site::new(Db::Sqlite, TWO_TARGETS_TWO_REGIONS).await;
    let (port, mut arrived) = holding_check_server().await;
    // Wave 1 is t1 (eu), wave 2 is t2 (us). t1's first check never answers, which holds
    // the deploy on worker A after the fetch and t1's upload.
    site.write_environment(
        &site.hosts.known_hosts,
        "by_region",
        &format!(
            "checks:\n  - {{name: health, type: http, url: \"http://127.0.0.1:{port}/{{target}}\", \
             retries: 0, timeout: 1h}}\n"
        ),
    );
    let a = site.worker(&executor_id("a")).await;
    let v1 = site.artifact("v1");
    let id = site.submit(&a, &v1, &v1.sha256, false).await;
    tokio::time::timeout(WAIT, arrived.recv())
        .await
        .expect("worker A reaches t1's check")
        .expect("the check server runs");

    // Worker A goes away mid-deploy, and its copy of the artifact with it.
    let a_id = a.engine.executor_id().to_string();
    let a_dir = artifacts::deploy_dir(&a.workdir, &id);
    assert!(
        artifacts::artifacts_dir(&a_dir).join("app.bin").exists(),
        "worker A fetched the artifact before uploading it to t1"
    );
    let report = a.engine.shutdown(Duration::ZERO).await;
    assert_eq!(
        report.left_pending,
        vec![id.clone()],
        "the deploy held in t1's check is left pending when A stops"
    );
    std::fs::remove_dir_all(&a_dir).expect("remove worker A's copy of the artifact");

    let b = site.worker(&executor_id("b")).await;
    let b_dir = artifacts::deploy_dir(&b.workdir, &id);
    site.work_dirs.lock().unwrap().push(b_dir.clone());
    assert!(
        !b_dir.exists(),
        "worker B has no copy of the artifact before it takes the deploy over"
    );
    let recovered = b
        .engine
        .client()
        .recover_executor(&a_id, false, "test")
        .await
        .expect("recover worker A's deploys");
    assert_eq!(
        recovered,
        vec![id.clone()],
        "A's pending deploy is handed over"
    );
    let client = b.engine.client();
    let record = client
        .wait(&id, WAIT)
        .await
        .unwrap_or_else(|e| panic!("deploy {id} ends: {e}\n{}", site.hosts.logs()));
    let status = deploy_views::status(&client, &id).await.unwrap().unwrap();

    assert_eq!(
        record.status,
        WorkflowStatus::Success,
        "worker B finishes the deploy: {:?}\n{status:#?}",
        record.error
    );
    assert_eq!(
        record.executor_id.as_deref(),
        Some(b.engine.executor_id()),
        "the deploy ended on worker B"
    );
    let fetch = step(&status, "fetch app.bin");
    assert_eq!(
        (fetch.executor_id.as_str(), fetch.attempts),
        (a_id.as_str(), 1),
        "the recorded fetch step is not rerun by B"
    );
    assert_eq!(
        step(&status, "t1: upload app.bin").executor_id,
        a_id,
        "t1's upload, done by A, is not redone"
    );
    assert_eq!(
        step(&status, "t2: upload app.bin").executor_id,
        b.engine.executor_id(),
        "wave 2 ran on worker B"
    );
    // B uploaded t2's copy (verified below), so it fetched the artifact again; its
    // directory for the deploy is gone once the deploy ended.
    assert!(
        !b_dir.exists(),
        "worker B removes its working directory of the deploy when the deploy ends"
    );
    for i in 0..2 {
        assert_eq!(
            file_sha256(&site.root(i).join("v1/app.bin")).as_deref(),
            Some(v1.sha256.as_str()),
            "{} holds the verified artifact",
            target_name(i)
        );
        assert_eq!(
            target(&status, &target_name(i)).status,
            "deployed",
            "{} is deployed",
            target_name(i)
        );
    }
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_deploy_kills_its_local_and_remote_commands_on_sqlite() {
    cancelling_a_deploy_kills_its_local_and_remote_commands(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_deploy_kills_its_local_and_remote_commands_on_postgres() {
    cancelling_a_deploy_kills_its_local_and_remote_commands(Db::Postgres).await;
}

async fn cancelling_a_deploy_kills_its_local_and_remote_commands(backend: Db) {
    let site = Site::new(backend, TWO_TARGETS_TWO_REGIONS).await;
    let pids = site.db.path("pids");
    std::fs::create_dir_all(&pids).expect("create the pid directory");
    // t1 over SSH, t2 on the worker itself; each command starts a `sleep` it waits for.
    let h = &site.hosts.hosts[0];
    let text = format!(
        "targets:\n  - {{name: t1, host: {}, port: {}, user: {}}}\n  - {{name: t2, host: local}}\n\
         ssh: {{key: {}, known_hosts: {}}}\n\
         deploy:\n  plugin: command\n  commands:\n    - {}\n\
         rollout: {{max_parallel: 2}}\n",
        q(&h.addr),
        h.port,
        q(&site.hosts.user),
        q(path_str(&site.hosts.client_key)),
        q(path_str(&site.hosts.known_hosts)),
        q(format!(
            "sleep 600 & echo $! > {dir}/$MANENT_TARGET.tmp && mv {dir}/$MANENT_TARGET.tmp {dir}/$MANENT_TARGET.pid; wait",
            dir = path_str(&pids)
        )),
    );
    std::fs::write(site.source.join("acme/web/prod.yml"), text)
        .expect("write the environment file");
    let worker = site.worker(&executor_id("cancel")).await;
    let v1 = site.artifact("v1");
    let id = site.submit(&worker, &v1, &v1.sha256, false).await;

    let mut running = Vec::new();
    for target in ["t1", "t2"] {
        let file = pids.join(format!("{target}.pid"));
        let pid = manent_testkit::eventually(&format!("{target}'s command runs"), WAIT, || async {
            std::fs::read_to_string(&file)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
        })
        .await;
        assert!(
            !process_gone(pid),
            "{target}'s command runs before the cancel"
        );
        running.push((target, pid));
    }
    let client = worker.engine.client();
    let work_dir = artifacts::deploy_dir(&worker.workdir, &id);
    assert!(
        work_dir.is_dir(),
        "the running deploy has its work directory {}",
        work_dir.display()
    );
    assert_eq!(
        client.cancel(&id).await.expect("cancel the deploy"),
        WorkflowStatus::Cancelled,
        "the deploy is cancelled"
    );
    for (target, pid) in running {
        manent_testkit::eventually(
            &format!("{target}'s command is killed by the cancel"),
            WAIT,
            || async { process_gone(pid).then_some(()) },
        )
        .await;
    }
    manent_testkit::eventually("the worker stops the cancelled run", WAIT, || async {
        (worker.engine.running_count() == 0).then_some(())
    })
    .await;
    manent_testkit::eventually(
        "the cancelled deploy's work directory is removed",
        WAIT,
        || async { (!work_dir.exists()).then_some(()) },
    )
    .await;
    let status = deploy_views::status(&client, &id).await.unwrap().unwrap();
    for name in ["t1", "t2"] {
        assert_eq!(
            target(&status, name).status,
            "cancelled",
            "{name} is recorded as cancelled, not left deploying"
        );
    }
    worker.stop().await;
}
