//! A private, throwaway PostgreSQL cluster for tests that stop, restart or
//! cut off the database: the machine's shared cluster (127.0.0.1:5432) serves
//! other tests at the same time and must never be restarted.
//!
//! The cluster lives in a temporary directory owned by the `postgres` user
//! (`initdb` and `postgres` refuse to run as root), listens on a free port of
//! 127.0.0.1 (plus any extra address asked for, such as the host side of a
//! test's network namespace) and on a unix socket in its own directory, trusts
//! every local and listed client, and runs without fsync: it holds nothing
//! worth keeping. Dropping it stops it at once and removes its directory; a
//! later cluster also removes what a killed test process left behind.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use sqlx::{Connection, postgres::PgConnection};

/// Directory name prefix of every cluster, followed by the owning test process's pid.
const PREFIX: &str = "manent-pg-";

/// A PostgreSQL cluster of the test's own; see the module documentation.
pub struct PgCluster {
    bin: PathBuf,
    /// The temporary directory (owned by `postgres`) holding data, socket and log.
    root: PathBuf,
    port: u16,
}

impl PgCluster {
    /// Creates and starts a cluster on 127.0.0.1 only.
    pub fn start() -> PgCluster {
        Self::start_listening(&[], &[])
    }

    /// Creates and starts a cluster that also listens on `extra_addresses`
    /// and trusts clients from `trusted_networks` (CIDR, e.g. `10.213.4.0/30`).
    pub fn start_listening(extra_addresses: &[String], trusted_networks: &[String]) -> PgCluster {
        remove_leftovers();
        let bin = postgres_bin_dir();
        let root = std::env::temp_dir().join(format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        for dir in [root.clone(), root.join("socket")] {
            std::fs::create_dir(&dir).expect("create the cluster's directories");
            if euid() == 0 {
                let (uid, gid) = postgres_ids();
                std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                    .expect("give the cluster's directories to the postgres user");
            }
        }
        let data = root.join("data");
        let out = as_postgres(&root, &bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .output()
            .expect("run initdb");
        check(&out, "initdb");

        let mut listen = vec!["127.0.0.1".to_string()];
        listen.extend(extra_addresses.iter().cloned());
        let mut hba = String::from(
            "local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n",
        );
        for net in trusted_networks {
            hba.push_str(&format!("host all all {net} trust\n"));
        }
        std::fs::write(data.join("pg_hba.conf"), hba).expect("write pg_hba.conf");

        // A port that is free now; another process may take it before the
        // server binds it, so a failed first start tries another one.
        for attempt in 0..5 {
            let port = free_port();
            // fsync off: a commit still reaches the kernel before it is
            // acknowledged, so a crash of the server (`stop -m immediate`)
            // loses nothing; only a crash of the machine would. Never
            // `synchronous_commit = off`: a crashed server would then forget
            // commits it acknowledged, and the tests would see work redone.
            let conf = format!(
                "\n# manent-testkit\nport = {port}\nlisten_addresses = '{}'\n\
                 unix_socket_directories = '{}'\nfsync = off\n\
                 full_page_writes = off\nmax_connections = 300\nshared_buffers = 16MB\n\
                 logging_collector = off\n",
                listen.join(","),
                root.join("socket").display()
            );
            let conf_path = data.join("postgresql.auto.conf");
            std::fs::write(&conf_path, conf).expect("write the cluster's settings");
            let cluster = PgCluster {
                bin: bin.clone(),
                root: root.clone(),
                port,
            };
            match cluster.try_start_server() {
                Ok(()) => return cluster,
                Err(e) if attempt < 4 => {
                    eprintln!(
                        "private PostgreSQL did not start on port {port}, trying another: {e}"
                    );
                    std::mem::forget(cluster);
                }
                Err(e) => panic!("private PostgreSQL did not start: {e}"),
            }
        }
        unreachable!()
    }

    /// The TCP port on 127.0.0.1 (and any extra address).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The admin URL over TCP on 127.0.0.1.
    pub fn admin_url(&self) -> String {
        self.url_at("127.0.0.1", "postgres")
    }

    /// The URL of `database` reached at `host` (an address the cluster listens on).
    pub fn url_at(&self, host: &str, database: &str) -> String {
        format!("postgres://postgres@{host}:{}/{database}", self.port)
    }

    /// Creates a fresh database; returns its URL on 127.0.0.1.
    pub async fn create_database(&self, name: &str) -> String {
        let mut conn = PgConnection::connect(&self.admin_url())
            .await
            .expect("connect to the private PostgreSQL cluster");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .expect("create a database in the private cluster");
        let _ = conn.close().await;
        self.url_at("127.0.0.1", name)
    }

    /// Stops the server: `fast` ends every session cleanly (a planned
    /// restart), `immediate` kills it without a checkpoint (a crash; the next
    /// start runs crash recovery). Returns once the server is gone.
    pub fn stop(&self, mode: StopMode) {
        let out = self
            .pg_ctl()
            .args(["stop", "-w", "-m", mode.as_str()])
            .output();
        check(&out.expect("run pg_ctl stop"), "pg_ctl stop");
    }

    /// Starts the stopped server again on the same port; returns once it accepts connections.
    pub fn start_again(&self) {
        if let Err(e) = self.try_start_server() {
            panic!("private PostgreSQL did not start again: {e}");
        }
    }

    /// `stop(mode)` then `start_again()`.
    pub fn restart(&self, mode: StopMode) {
        self.stop(mode);
        self.start_again();
    }

    /// Whether the server is running (its postmaster answers `pg_ctl status`).
    pub fn is_running(&self) -> bool {
        self.pg_ctl()
            .arg("status")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The server's log (shown by tests on failure).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Where the server writes its log.
    pub fn log_path(&self) -> PathBuf {
        self.root.join("server.log")
    }

    fn try_start_server(&self) -> Result<(), String> {
        let out = self
            .pg_ctl()
            .args(["start", "-w", "-t", "60", "-l"])
            .arg(self.log_path())
            .output()
            .map_err(|e| format!("cannot run pg_ctl: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_ctl start: {}\n{}\n{}\nserver log:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.log()
            ))
        }
    }

    fn pg_ctl(&self) -> Command {
        let mut cmd = as_postgres(&self.root, &self.bin.join("pg_ctl"));
        cmd.arg("-D").arg(self.root.join("data"));
        cmd
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        destroy(&self.bin, &self.root);
    }
}

/// How [`PgCluster::stop`] stops the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    Fast,
    Immediate,
}

impl StopMode {
    fn as_str(self) -> &'static str {
        match self {
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        }
    }
}

/// Stops a cluster (if it runs) and removes its directory.
fn destroy(bin: &Path, root: &Path) {
    let data = root.join("data");
    if data.join("postmaster.pid").exists() {
        let _ = as_postgres(root, &bin.join("pg_ctl"))
            .arg("-D")
            .arg(&data)
            .args(["stop", "-w", "-m", "immediate"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    let _ = std::fs::remove_dir_all(root);
}

/// Removes the clusters of test processes that are gone (killed before their Drop ran).
fn remove_leftovers() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    let bin = postgres_bin_dir();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            destroy(&bin, &entry.path());
        }
    }
}

/// `/usr/lib/postgresql/<newest version>/bin`, or `MANENT_TEST_PG_BIN`.
fn postgres_bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("MANENT_TEST_PG_BIN") {
        return PathBuf::from(dir);
    }
    let base = Path::new("/usr/lib/postgresql");
    let newest = std::fs::read_dir(base)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version: u32 = e.file_name().to_string_lossy().parse().ok()?;
            e.path().join("bin/initdb").exists().then_some(version)
        })
        .max();
    match newest {
        Some(version) => base.join(version.to_string()).join("bin"),
        None => panic!(
            "PostgreSQL's server binaries are required (initdb, pg_ctl under \
             /usr/lib/postgresql/<version>/bin; set MANENT_TEST_PG_BIN otherwise)"
        ),
    }
}

fn postgres_ids() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("run id");
        assert!(
            out.status.success(),
            "a `postgres` system user is required to run a private PostgreSQL cluster"
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a numeric id")
    };
    (id("-u"), id("-g"))
}

/// A command run as the `postgres` user (we may be root, which PostgreSQL
/// refuses), from a directory that user may enter.
fn as_postgres(cwd: &Path, program: &Path) -> Command {
    let running_as_root = euid() == 0;
    let mut cmd = if running_as_root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    cmd.current_dir(cwd).stdin(Stdio::null());
    cmd
}

/// The effective uid, read from /proc (no libc dependency for one number).
fn euid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

fn check(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
