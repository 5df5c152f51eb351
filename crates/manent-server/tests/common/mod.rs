//! Shared by manent-server's integration tests: a manent installation in a
//! temporary directory, its processes, and the `manent` CLI.
#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use manent_testkit::{Children, Db, TestDb, eventually};
use serde_json::Value;

pub mod browser;

pub const SERVER: &str = env!("CARGO_BIN_EXE_manent-server");
pub const WAIT: Duration = Duration::from_secs(90);

/// A manent installation in a temporary directory: config, environments, token.
pub struct Site {
    pub db: TestDb,
    pub dir: PathBuf,
    pub port: u16,
    pub children: Children,
}

/// The `manent` CLI, built by `cargo test --workspace` next to this test's directory.
pub fn cli_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().and_then(Path::parent).unwrap().join("manent");
    assert!(
        path.exists(),
        "the manent CLI is not built at {}: run `cargo build -p manent-cli` (./scripts/test does)",
        path.display()
    );
    path
}

/// The test site's manent.yml, with `extra` appended (top-level sections
/// other than database, api, environments, recovery).
pub fn base_config(url: &str, port: u16, extra: &str) -> String {
    let source = manent_testkit::temp_artifact_source();
    format!(
        "database: {{url: \"{url}\"}}\napi: {{listen: \"127.0.0.1:{port}\"}}\nenvironments: {{source: environments}}\n\
         recovery: {{stale_after: 3s, heartbeat_interval: 300ms}}\nartifacts: {{sources: [\"{source}\"]}}\n{extra}\n"
    )
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Site {
    pub async fn new(backend: Db, commands: &[&str]) -> Site {
        let db = TestDb::new(backend).await;
        let dir = db.path("site");
        std::fs::create_dir_all(dir.join("environments/acme/web")).unwrap();
        let port = free_port();
        std::fs::write(dir.join("manent.yml"), base_config(&db.url, port, "")).unwrap();
        let commands: String = commands
            .iter()
            .map(|c| format!("    - {}\n", serde_json::to_string(c).unwrap()))
            .collect();
        std::fs::write(
            dir.join("environments/acme/web/prod.yml"),
            format!("targets:\n  - {{name: t1, host: local}}\ndeploy:\n  plugin: command\n  commands:\n{commands}"),
        )
        .unwrap();
        std::fs::write(dir.join("artifact.txt"), "payload").unwrap();
        Site {
            db,
            dir,
            port,
            children: Children::default(),
        }
    }

    /// Rewrites manent.yml with `extra` appended (e.g. `queues:` or `dbos:`).
    pub fn set_config(&self, extra: &str) {
        std::fs::write(
            self.dir.join("manent.yml"),
            base_config(&self.db.url, self.port, extra),
        )
        .unwrap();
    }

    /// Writes `environments/<application>/<environment>.yml`.
    pub fn write_environment(&self, application: &str, environment: &str, yaml: &str) {
        let path = self
            .dir
            .join("environments")
            .join(application)
            .join(format!("{environment}.yml"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, yaml).unwrap();
    }

    /// Makes acme/web's prod one `host: local` target deployed by the one shell `command`.
    pub fn write_command_environment(&self, command: &str) {
        self.write_environment(
            "acme/web",
            "prod",
            &format!(
                "targets: [{{name: t1, host: local}}]\ndeploy:\n  plugin: command\n  commands:\n    - {}\n",
                serde_json::to_string(command).unwrap()
            ),
        );
    }

    /// Starts `manent-server <role>` with extra environment variables.
    pub fn start_with(&mut self, role: &str, executor: &str, env: &[(&str, &str)]) -> usize {
        self.start_binary(Path::new(SERVER), role, executor, env)
    }

    /// Starts `<binary> <role>` (a `manent-server`, maybe another release's) with extra
    /// environment variables; its log is appended to `<role>-<executor>.log`.
    pub fn start_binary(
        &mut self,
        binary: &Path,
        role: &str,
        executor: &str,
        env: &[(&str, &str)],
    ) -> usize {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{role}-{executor}.log")))
            .unwrap();
        let mut command = self.command_of(binary, &[role], executor);
        command
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log);
        self.children
            .push(command.spawn().expect("start manent-server"))
    }

    /// A descriptor of `application` in prod.
    pub fn descriptor_for(&self, application: &str, version: &str) -> PathBuf {
        let path = self.descriptor(version);
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("acme/web", application);
        let path = self.dir.join(format!(
            "deploy-{}-{version}.yml",
            application.replace('/', "-")
        ));
        std::fs::write(&path, text).unwrap();
        path
    }

    pub fn command(&self, args: &[&str], executor: &str) -> Command {
        self.command_of(Path::new(SERVER), args, executor)
    }

    /// `manent-server` from `binary` (another release's, in the upgrade test) on this site.
    pub fn command_of(&self, binary: &Path, args: &[&str], executor: &str) -> Command {
        let mut c = Command::new(binary);
        c.arg("-c").arg(self.dir.join("manent.yml")).args(args);
        c.env("DBOS__VMID", executor)
            .env("MANENT_WORKDIR", self.dir.join(format!("work-{executor}")));
        c.env("RUST_LOG", "info,sqlx=warn");
        c
    }

    /// Starts `manent-server <role>`; returns its index in `children`.
    pub fn start(&mut self, role: &str, executor: &str) -> usize {
        let log = std::fs::File::create(self.dir.join(format!("{role}-{executor}.log"))).unwrap();
        let child = self
            .command(&[role], executor)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start manent-server");
        self.children.push(child)
    }

    /// Starts an API process and one worker per region, `worker-eu` (region eu) and
    /// `worker-us` (region us), and waits for the API.
    pub async fn start_api_and_region_workers(&mut self) {
        self.start("api", "api");
        self.start_with("worker", "worker-eu", &[("MANENT__DBOS__REGION", "eu")]);
        self.start_with("worker", "worker-us", &[("MANENT__DBOS__REGION", "us")]);
        self.wait_api().await;
    }

    pub fn child(&mut self, i: usize) -> &mut Child {
        &mut self.children.0[i]
    }

    /// An admin token named `ci`.
    pub fn token(&self) -> String {
        self.token_named("ci", "admin")
    }

    /// A new token named `name` with `role` on every application.
    pub fn token_named(&self, name: &str, role: &str) -> String {
        self.token_made_by(Path::new(SERVER), name, role)
    }

    /// A new token named `name` with `role`, created by the `manent-server` at `binary`.
    pub fn token_made_by(&self, binary: &Path, name: &str, role: &str) -> String {
        let out = self
            .command_of(
                binary,
                &["admin", "token", "create", "--name", name, "--role", role],
                "admin",
            )
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "token create: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    pub fn descriptor(&self, version: &str) -> PathBuf {
        let sha = "239f59ed55e737c77147cf55ad0c1b030b6d7ee748a7426952f9b852d5a935e5"; // sha256("payload")
        let path = self.dir.join(format!("deploy-{version}.yml"));
        std::fs::write(
            &path,
            format!(
                "application: acme/web\nenvironment: prod\nartifacts:\n  - {{name: artifact.txt, type: file, version: \"{version}\", \
                 url: \"file://{}\", sha256: \"{sha}\"}}\n",
                self.dir.join("artifact.txt").display()
            ),
        )
        .unwrap();
        path
    }

    /// Runs the `manent` CLI with `--output json`.
    pub fn cli(&self, token: &str, args: &[&str]) -> (i32, Value) {
        let out = self.run_cli(token, args);
        let value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out.status.code().unwrap_or(-1), value)
    }

    /// Runs the `manent` CLI with `--output json`; returns its exit code and stderr.
    pub fn cli_stderr(&self, token: &str, args: &[&str]) -> (i32, String) {
        let out = self.run_cli(token, args);
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs the `manent` CLI as a person reads it (its default format, or as `args` say),
    /// stdout a pipe; returns its exit code and stdout.
    pub fn cli_text(&self, token: &str, args: &[&str]) -> (i32, String) {
        let out = Command::new(cli_binary())
            .args(["--server", &format!("http://127.0.0.1:{}", self.port)])
            .args(["--token", token])
            .args(args)
            .output()
            .expect("run manent");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    fn run_cli(&self, token: &str, args: &[&str]) -> std::process::Output {
        Command::new(cli_binary())
            .args([
                "--server",
                &format!("http://127.0.0.1:{}", self.port),
                "--token",
                token,
                "--output",
                "json",
            ])
            .args(args)
            .output()
            .expect("run manent")
    }

    /// `manent status ID` as JSON.
    pub fn status(&self, token: &str, id: &str) -> Value {
        self.cli(token, &["status", id]).1
    }

    /// Waits until the deploy's status satisfies `done`; returns that status.
    pub async fn wait_until(
        &self,
        token: &str,
        id: &str,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        // The last status seen is printed when it changes: a timeout shows where it stopped.
        let last = std::sync::Mutex::new(Value::Null);
        eventually(&format!("deploy {id}: {what}"), WAIT, || async {
            let s = self.status(token, id);
            let mut seen = last.lock().unwrap();
            if *seen != s {
                eprintln!("deploy {id}: {s}");
                *seen = s.clone();
            }
            done(&s).then_some(s)
        })
        .await
    }

    /// Waits until the deploy's status is `want` (SUCCESS, ERROR, …).
    pub async fn wait_status(&self, token: &str, id: &str, want: &str) -> Value {
        self.wait_until(token, id, &format!("reaches {want}"), |s| {
            s["status"] == want
        })
        .await
    }

    /// Submits version 1 of `application` in prod; returns its id and queue.
    pub fn submit(&self, token: &str, application: &str) -> (String, String) {
        let path = self.descriptor_for(application, "1");
        let (code, v) = self.cli(token, &["deploy", "-f", path.to_str().unwrap()]);
        assert_eq!(code, 0, "submission of {application}: {v}");
        (
            v["id"].as_str().unwrap().to_string(),
            v["queue"].as_str().unwrap().to_string(),
        )
    }

    pub async fn wait_api(&self) {
        let port = self.port;
        eventually("the API accepts connections", WAIT, || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(|_| ())
        })
        .await;
    }

    pub fn ledger(&self) -> String {
        std::fs::read_to_string(self.dir.join("ledger")).unwrap_or_default()
    }
}

pub fn ledger_path(site_dir: &Path) -> String {
    site_dir.join("ledger").display().to_string()
}

/// `<pid> <n>` lines of a ledger that commands append to, in the order they were
/// appended: `(pid, n)`, one pid per run of a command.
pub fn ledger_runs(text: &str) -> Vec<(String, usize)> {
    text.lines()
        .map(|l| {
            let (pid, n) = l.split_once(' ').expect("`<pid> <n>` lines");
            (pid.to_string(), n.parse().expect("a line number"))
        })
        .collect()
}

/// Asserts that `runs` (of [`ledger_runs`]) are an earlier run stopped before its end,
/// whose lines all precede the first of a later run that wrote its `lines` lines once,
/// whole: the two never ran at once. `what` names the case in the messages.
pub fn assert_stopped_then_run_once(runs: &[(String, usize)], lines: usize, what: &str) {
    let earlier = &runs
        .first()
        .unwrap_or_else(|| panic!("{what}: the ledger is empty"))
        .0;
    let first_of_later = runs
        .iter()
        .position(|(pid, _)| pid != earlier)
        .unwrap_or_else(|| panic!("{what}: the step ran again: {runs:?}"));
    assert!(
        runs[first_of_later..].iter().all(|(pid, _)| pid != earlier),
        "{what}: the earlier run wrote its last line before the later run's first: {runs:?}"
    );
    assert!(
        first_of_later < lines,
        "{what}: the earlier run was stopped, not left to its end: {runs:?}"
    );
    let later: Vec<usize> = runs[first_of_later..].iter().map(|(_, n)| *n).collect();
    assert_eq!(
        later,
        (0..lines).collect::<Vec<_>>(),
        "{what}: the later run ran the step once, from its start to its end: {runs:?}"
    );
}
