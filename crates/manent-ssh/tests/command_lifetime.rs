//! Commands live and die with whoever runs them: a command whose run is
//! stopped (its future dropped: cancel, fence, drain timeout) is killed with
//! everything it started, locally and over real sshd, and a local command
//! dies with its worker even when the worker is killed with SIGKILL.
//!
//! The test binary is its own worker: `child_process_entry` runs a command
//! when the parent re-executes the binary with `MANENT_TEST_CHILD` set.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};

use manent_ssh::{Address, Connection, LocalConnection, SshAuth, connect};
use manent_testkit::{Children, eventually, process_gone, signal, sshd::SshHosts, wait_exit};

/// Generous bound for waits on other processes; never reached when things work.
const WAIT: Duration = Duration::from_secs(60);
const ROLE: &str = "MANENT_TEST_CHILD";

/// A command that starts a grandchild (`sleep`), records its pid and waits:
/// killing only the direct child would leave the `sleep` running.
fn long_command(pid_file: &Path) -> String {
    format!(
        "sleep 600 & echo $! > {}.tmp && mv {0}.tmp {0}; wait",
        pid_file.display()
    )
}

/// The pid the command wrote, once it is there.
async fn recorded_pid(pid_file: &Path) -> i32 {
    eventually("the command records its sleep's pid", WAIT, || async {
        std::fs::read_to_string(pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
    })
    .await
}

async fn wait_gone(pid: i32, what: &str) {
    eventually(what, WAIT, || async { process_gone(pid).then_some(()) }).await;
}

/// Runs the long command on `conn` in a task, waits until it runs, drops the
/// task (as a stopped run does) and returns the pid of the command's `sleep`.
async fn start_then_drop(conn: Arc<dyn Connection>, pid_file: &Path) -> i32 {
    let command = long_command(pid_file);
    let task = tokio::spawn(async move { conn.exec(&command, &[]).await });
    let pid = recorded_pid(pid_file).await;
    assert!(
        !process_gone(pid),
        "the command's sleep runs before the run is stopped"
    );
    task.abort();
    let _ = task.await;
    pid
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_command_whose_run_is_dropped_is_killed_with_what_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let pid = start_then_drop(Arc::new(LocalConnection::new()), &pid_file).await;
    wait_gone(pid, "the local command's sleep is killed with its run").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_command_whose_run_is_dropped_is_killed_on_the_target() {
    let hosts = SshHosts::start(1).await;
    let host = &hosts.hosts[0];
    let conn = connect(
        &Address::new(host.addr.clone(), host.port, hosts.user.clone()),
        &SshAuth::new(&hosts.client_key, &hosts.known_hosts),
    )
    .await
    .unwrap_or_else(|e| panic!("connect to sshd: {e}\n{}", hosts.logs()));
    let pid_file = host.root_dir.join("pid");
    // sshd runs on this machine: the target's pids are ours to look at.
    let pid = start_then_drop(conn.clone(), &pid_file).await;
    wait_gone(
        pid,
        "the remote command's sleep is killed when its channel closes",
    )
    .await;
    // The connection itself is still good for the next command.
    let out = conn.exec("echo still here", &[]).await.expect("run again");
    assert_eq!(
        out.stdout.trim(),
        "still here",
        "closing one command's channel leaves the connection usable"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_ends_by_itself_reports_its_output_and_status() {
    let out = LocalConnection::new()
        .exec("echo out; echo err >&2; exit 7", &[])
        .await
        .expect("run a command");
    assert_eq!(
        (out.status, out.stdout.as_str(), out.stderr.as_str()),
        (7, "out\n", "err\n"),
        "the supervisor passes the command's output and exit status through"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_command_dies_with_its_worker_killed_with_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let mut children = Children::default();
    let child = Command::new(std::env::current_exe().expect("the test binary's path"))
        .args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, "run-command")
        .env("MANENT_TEST_PID_FILE", &pid_file)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn the test binary as a worker");
    let i = children.push(child);
    let pid = recorded_pid(&pid_file).await;
    signal(&children.0[i], "KILL");
    wait_exit(&mut children.0[i], WAIT).await;
    wait_gone(
        pid,
        "the command's sleep dies with the worker killed by SIGKILL",
    )
    .await;
}

/// The worker side: returns at once in a normal test run; in a re-executed
/// child it runs the long command and never returns.
#[test]
fn child_process_entry() {
    if std::env::var(ROLE).as_deref() == Ok("run-command") {
        let pid_file = PathBuf::from(std::env::var("MANENT_TEST_PID_FILE").unwrap());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let _ = LocalConnection::new()
                .exec(&long_command(&pid_file), &[])
                .await;
        });
        std::process::exit(0);
    }
}
