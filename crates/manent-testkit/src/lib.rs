//! Test support shared by manent's crates: a fresh database per test on
//! either backend, a guard that kills child processes at the end, for fault
//! tests a private PostgreSQL cluster and a network namespace, and a canned HTTP
//! server (`http`).
//!
//! PostgreSQL is required: a test that cannot reach it fails, it is never
//! skipped in silence. `MANENT_TEST_POSTGRES` overrides the admin URL
//! (default `postgres://postgres@127.0.0.1:5432/postgres`).

use std::{path::PathBuf, process::Child};

use sqlx::{Connection, postgres::PgConnection};

pub mod http;
pub mod netns;
pub mod pg_cluster;
pub mod sshd;
pub mod zip;

pub use netns::NetNs;
pub use pg_cluster::{PgCluster, StopMode};

/// The two backends every storage test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    Sqlite,
    Postgres,
}

fn admin_url() -> String {
    std::env::var("MANENT_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A database of its own for one test, removed when dropped.
pub struct TestDb {
    pub url: String,
    pub backend: Db,
    /// Holds the SQLite file's directory; also a scratch directory for the test.
    pub dir: tempfile::TempDir,
    pg_name: Option<String>,
}

impl TestDb {
    pub async fn new(backend: Db) -> TestDb {
        let dir = tempfile::tempdir().expect("a temporary directory for the test");
        match backend {
            Db::Sqlite => {
                let path = dir.path().join("manent.db");
                TestDb {
                    url: format!("sqlite://{}", path.display()),
                    backend,
                    dir,
                    pg_name: None,
                }
            }
            Db::Postgres => {
                let name = format!("manent_test_{}", uuid::Uuid::new_v4().simple());
                let admin = admin_url();
                let mut conn = PgConnection::connect(&admin).await.unwrap_or_else(|e| {
                    panic!(
                        "PostgreSQL is required for this test and is not reachable at {admin}: {e}. \
                         Start it (./scripts/test does) or set MANENT_TEST_POSTGRES."
                    )
                });
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut conn)
                    .await
                    .expect("create a fresh test database");
                let _ = conn.close().await;
                let base = admin
                    .rsplit_once('/')
                    .map_or(admin.as_str(), |(b, _)| b)
                    .to_string();
                TestDb {
                    url: format!("{base}/{name}"),
                    backend,
                    dir,
                    pg_name: Some(name),
                }
            }
        }
    }

    /// A scratch path inside the test's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = self.pg_name.take() {
            let admin = admin_url();
            // Drop runs outside any runtime's async context: use a small one of our own.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                if let Ok(rt) = rt {
                    rt.block_on(async {
                        if let Ok(mut conn) = PgConnection::connect(&admin).await {
                            let _ = sqlx::query(&format!(
                                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                            ))
                            .execute(&mut conn)
                            .await;
                        }
                    });
                }
            })
            .join();
        }
    }
}

/// Kills its child processes when dropped, so a failing test leaves none behind.
#[derive(Default)]
pub struct Children(pub Vec<Child>);

impl Children {
    pub fn push(&mut self, child: Child) -> usize {
        self.0.push(child);
        self.0.len() - 1
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sends a signal to a child process (SIGKILL, SIGTERM, SIGSTOP, SIGCONT).
pub fn signal(child: &Child, signal: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {} failed", child.id());
}

/// Waits for a child process to exit (polling, since `Child::wait` blocks a
/// runtime thread), failing the test after `timeout`.
pub async fn wait_exit(
    child: &mut Child,
    timeout: std::time::Duration,
) -> std::process::ExitStatus {
    let pid = child.id();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("poll a child process") {
            return status;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for process {pid} to exit");
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

/// Waits until every thread of a child process is stopped (after `SIGSTOP`):
/// the signal is delivered asynchronously, so `kill` returning is not proof.
/// Linux only (reads `/proc/<pid>/task/*/stat`).
pub async fn wait_stopped(child: &Child, timeout: std::time::Duration) {
    let pid = child.id();
    eventually(
        &format!("process {pid} to be stopped"),
        timeout,
        || async move { all_threads_stopped(pid).then_some(()) },
    )
    .await
}

fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            return false;
        };
        // The state follows the parenthesised command name, which may hold spaces.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if !matches!(state, Some("T") | Some("t")) {
            return false;
        }
        any = true;
    }
    any
}

/// Polls `check` until it returns `Some`, failing the test after `timeout`.
/// For waiting on another process's visible effects, where no event can be awaited.
pub async fn eventually<T, F, Fut>(what: &str, timeout: std::time::Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

/// Sends the code under test's logs to the test's output (shown on failure).
/// `RUST_LOG` filters them; the default shows warnings.
/// The `artifacts.sources` entry admitting the system's temporary directory, where tests
/// keep their artifacts (`file://<temp dir>/`, symlinks resolved). Tests about the sources
/// themselves write their own.
pub fn temp_artifact_source() -> String {
    let dir = std::env::temp_dir();
    let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
    format!(
        "file://{}/",
        dir.display().to_string().trim_end_matches('/')
    )
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A binary of the workspace that this test's package does not build itself (so no
/// `CARGO_BIN_EXE_…`): the workspace build puts it next to the test's directory. Fails the
/// test, saying how to build it, when it is missing.
pub fn workspace_binary(name: &str, package: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let path = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("the test binary lies in <target>/<profile>/deps")
        .join(name);
    assert!(
        path.exists(),
        "{name} is not built at {}: run `cargo build -p {package}` (./scripts/test builds every \
         binary of the workspace)",
        path.display()
    );
    path
}

/// True once process `pid` has exited: no such process, or a zombie nobody has
/// reaped yet (it runs nothing; in a container, pid 1 may never reap it).
pub fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Appends `line` to a ledger file that several processes write (one `write` of a
/// whole line on a file opened for appending: lines never interleave).
/// SIGSTOPs a child at a moment it holds no database lock (a worker frozen
/// inside a transaction would block every other process, which is not what
/// the tests that freeze workers are about): stop, check, and if needed
/// continue and retry.
pub async fn pause_outside_transactions(child: &Child, url: &str) {
    let wait = std::time::Duration::from_secs(60);
    for _ in 0..200 {
        signal(child, "STOP");
        wait_stopped(child, wait).await;
        if database_is_quiet(url).await {
            return;
        }
        signal(child, "CONT");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!(
        "could not pause process {} outside a transaction",
        child.id()
    );
}

/// Whether the database has no transaction or statement in flight other
/// than ours: a process stopped now holds no lock the others need.
pub async fn database_is_quiet(url: &str) -> bool {
    use std::str::FromStr;
    use std::time::Duration;
    if url.starts_with("sqlite:") {
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
            .expect("a SQLite url")
            .busy_timeout(Duration::ZERO);
        let mut conn = sqlx::SqliteConnection::connect_with(&options)
            .await
            .expect("connect to the SQLite database");
        let free = sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .is_ok();
        if free {
            sqlx::query("ROLLBACK")
                .execute(&mut conn)
                .await
                .expect("roll back");
        }
        let _ = conn.close().await;
        free
    } else {
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .expect("connect to the PostgreSQL database");
        let busy: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND state <> 'idle'",
        )
        .fetch_one(&mut conn)
        .await
        .expect("read pg_stat_activity");
        let _ = conn.close().await;
        busy == 0
    }
}

pub fn append_line(path: &std::path::Path, line: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open the ledger");
    file.write_all(format!("{line}\n").as_bytes())
        .expect("append to the ledger");
}

/// The settings a re-executed test binary gets from its parent, in environment variables.
pub mod child_env {
    /// The variable's value, `None` when unset or empty.
    pub fn var(name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }

    /// The variable's value; the parent always sets it.
    pub fn required(name: &str) -> String {
        var(name).unwrap_or_else(|| panic!("the parent sets {name}"))
    }

    /// The variable as a number, `None` when unset.
    pub fn number(name: &str) -> Option<u64> {
        var(name).map(|v| v.parse().unwrap_or_else(|_| panic!("{name} is a number")))
    }
}

/// Runs each named `async fn name(db: Db)` of the calling test file once on SQLite and once
/// on PostgreSQL, as `sqlite::name` and `postgres::name` (every storage test runs on both).
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),+ $(,)?) => {
        mod sqlite { $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name($crate::Db::Sqlite).await } )+ }
        mod postgres { $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name($crate::Db::Postgres).await } )+ }
    };
}
