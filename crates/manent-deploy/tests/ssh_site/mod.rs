//! The site the SSH deploy tests share: one sshd per target on loopback addresses (the
//! testkit's `SshHosts`), an environments source, artifacts and in-process workers.
//!
//! Every "host" shares this machine's filesystem, so each target gets its own destination:
//! `deploy.dest` is `<base>/{target}/{version}`, where `<base>/<target>` is that target's
//! own directory (`root`), a real directory: the release steps refuse a symbolic link
//! where the directory holding the releases belongs.
#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use manent_config::Config;
use manent_deploy::{
    run::artifacts,
    submission,
    views::deploy_views::{self, DeployStatus},
};
use manent_engine::{Connections, Database, Engine, EngineConfig, WorkflowRecord};
use manent_testkit::{Db, TestDb, sshd::SshHosts};
use sha2::{Digest, Sha256};

/// A safety net for waits that end on an event; never a measure of speed.
pub const WAIT: Duration = Duration::from_secs(180);
/// The artifact's size: a few hundred KB, several SFTP chunks.
pub const ARTIFACT_LEN: usize = 300 * 1024;

// ---- the site: sshd hosts, environment file, artifacts, workers ----

/// Where a target sits: its region and availability zone.
pub struct Placement {
    pub region: &'static str,
    pub az: &'static str,
}

pub const FOUR_TARGETS_TWO_REGIONS: &[Placement] = &[
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

pub const TWO_TARGETS_TWO_REGIONS: &[Placement] = &[
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
pub struct Site {
    pub db: TestDb,
    pub hosts: SshHosts,
    pub source: PathBuf,
    /// `<base>/<target>`: each target's own directory.
    pub base: PathBuf,
    pub placements: &'static [Placement],
    /// Worker directories of the deploys run here, removed at the end.
    pub work_dirs: Mutex<Vec<PathBuf>>,
}

/// A YAML (and JSON) double-quoted scalar.
pub fn q(s: impl AsRef<str>) -> String {
    serde_json::to_string(s.as_ref()).expect("a string serialises")
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Bytes that differ per `seed` and do not compress.
pub fn pseudo_random(seed: &str, len: usize) -> Vec<u8> {
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
pub struct Artifact {
    pub version: String,
    pub url: String,
    pub sha256: String,
}

impl Site {
    pub async fn new(backend: Db, placements: &'static [Placement]) -> Site {
        manent_testkit::init_tracing();
        let db = TestDb::new(backend).await;
        let hosts = SshHosts::start(placements.len()).await;
        let source = db.path("environments");
        std::fs::create_dir_all(source.join("acme/web")).expect("create the environments source");
        let base = db.path("targets");
        std::fs::create_dir_all(&base).expect("create the targets' base directory");
        for i in 0..hosts.hosts.len() {
            std::fs::create_dir_all(base.join(target_name(i)))
                .expect("create each target's directory");
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
    pub fn write_environment(&self, known_hosts: &Path, waves: &str, extra: &str) {
        let base = path_str(&self.base);
        let activate = format!("ln -sfn \"$MANENT_VERSION\" \"{base}/$MANENT_TARGET/current\"");
        self.write_environment_activating(known_hosts, waves, extra, &activate);
    }

    /// As `write_environment`, with `activate` as the activate command.
    pub fn write_environment_activating(
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
    pub fn edit_environment(&self, from: &str, to: &str) {
        let file = self.source.join("acme/web/prod.yml");
        let text = std::fs::read_to_string(&file).expect("read the environment file");
        assert!(
            text.contains(from),
            "the environment file holds {from:?}:\n{text}"
        );
        std::fs::write(&file, text.replace(from, to)).expect("write the environment file");
    }

    /// The configuration of worker `executor_id` on this site's database.
    pub fn config(&self, executor_id: &str) -> Config {
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
    pub async fn worker(&self, executor_id: &str) -> Worker {
        let config = self.config(executor_id);
        let database = Database::open(&self.db.url, &Connections::default())
            .await
            .expect("open the test database");
        let engine = Engine::new(database, EngineConfig::new(executor_id));
        for queue in manent_deploy::worker_queues(&config) {
            engine.listen(queue.spec());
        }
        // No schedule.at deploys here: the authority that refuses them all does. Nothing
        // is fetched or checked over HTTP either: manent-server's tests do that, through
        // its client (manent-deploy holds none).
        manent_deploy::register_workflows(
            &engine,
            &config,
            Arc::new(manent_deploy::authority::NoTokens),
            Arc::new(manent_deploy::http::NoClient),
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
    pub fn artifact(&self, version: &str) -> Artifact {
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
    pub async fn deploy(
        &self,
        worker: &Worker,
        artifact: &Artifact,
        sha256: &str,
        dry_run: bool,
    ) -> (WorkflowRecord, DeployStatus) {
        let id = self.submit(worker, artifact, sha256, dry_run).await;
        self.wait_for(worker, &id).await
    }

    /// Waits for the end of deploy `id` and reads its status.
    pub async fn wait_for(&self, worker: &Worker, id: &str) -> (WorkflowRecord, DeployStatus) {
        let client = worker.engine.client();
        let record = client
            .wait(id, WAIT)
            .await
            .unwrap_or_else(|e| panic!("deploy {id} ends: {e}\n{}", self.hosts.logs()));
        let status = deploy_views::status(&client, id)
            .await
            .expect("read the deploy's status")
            .expect("the deploy exists");
        (record, status)
    }

    pub async fn submit(
        &self,
        worker: &Worker,
        artifact: &Artifact,
        sha256: &str,
        dry_run: bool,
    ) -> String {
        self.submit_text(worker, descriptor_text(artifact, sha256, dry_run))
            .await
    }

    /// Submits a deploy of `artifact` (with `sha256` as the descriptor's checksum): the
    /// submission's answer, a refusal included.
    pub async fn try_submit(
        &self,
        worker: &Worker,
        artifact: &Artifact,
        sha256: &str,
        dry_run: bool,
    ) -> Result<submission::Submitted, submission::SubmitError> {
        self.try_submit_text(worker, descriptor_text(artifact, sha256, dry_run))
            .await
    }

    /// Submits the descriptor `text` (YAML), which must be accepted: the deploy's id.
    pub async fn submit_text(&self, worker: &Worker, text: String) -> String {
        let submitted = self
            .try_submit_text(worker, text)
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

    /// Submits the descriptor `text` (YAML) through the whole submission path: the
    /// submission's answer, a refusal included.
    pub async fn try_submit_text(
        &self,
        worker: &Worker,
        text: String,
    ) -> Result<submission::Submitted, submission::SubmitError> {
        let descriptor = submission::parse(text, "deploy.yml".into())
            .await
            .expect("the descriptor parses");
        submission::submit(
            &worker.engine.client(),
            &std::sync::Arc::new(worker.config.clone()),
            descriptor,
            false,
            &manent_deploy::Submitter::named("test"),
        )
        .await
    }

    /// Target `target`'s directory, which holds its releases.
    pub fn root(&self, target: usize) -> PathBuf {
        self.base.join(target_name(target))
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

pub struct Worker {
    pub config: Config,
    pub engine: Engine,
    /// Where this worker keeps artifacts: its `Runtime`'s work directory, from the config.
    pub workdir: PathBuf,
}

impl Worker {
    pub async fn stop(self) {
        self.engine.shutdown(Duration::from_secs(10)).await;
    }
}

pub fn target_name(i: usize) -> String {
    format!("t{}", i + 1)
}

/// A unique executor id, so parallel tests never share a worker directory.
pub fn executor_id(role: &str) -> String {
    format!("ssh-{role}-{}", uuid::Uuid::new_v4().simple())
}

/// Every path under `dir`, not following symlinks.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
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

pub fn file_sha256(path: &Path) -> Option<String> {
    std::fs::read(path).ok().map(|b| sha256_hex(&b))
}

pub fn target<'a>(status: &'a DeployStatus, name: &str) -> &'a deploy_views::TargetView {
    status
        .targets
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("target {name} in the status: {status:#?}"))
}

pub fn step<'a>(status: &'a DeployStatus, name: &str) -> &'a deploy_views::StepView {
    status
        .steps
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("step `{name}` in the status: {:#?}", status.steps))
}

pub fn current_of(root: impl AsRef<Path>) -> Option<PathBuf> {
    std::fs::read_link(root.as_ref().join("current")).ok()
}

/// The descriptor of a deploy of `artifact` to acme/web/prod, with `sha256` as its checksum.
fn descriptor_text(artifact: &Artifact, sha256: &str, dry_run: bool) -> String {
    format!(
        "application: acme/web\nenvironment: prod\ndry_run: {dry_run}\nartifacts:\n  - \
         {{name: app.bin, type: binary, version: {}, url: {}, sha256: {}}}\n",
        q(&artifact.version),
        q(&artifact.url),
        q(sha256),
    )
}
