//! Commands live and die with whoever runs them: a command whose run is
//! stopped (its future dropped: cancel, fence, drain timeout) is killed with
//! everything it started, locally and over real sshd, and a local command
//! dies with its worker even when the worker is killed with SIGKILL. Under a
//! dead-man's switch, a command whose worker stops sending pulses (frozen with
//! SIGSTOP, or no longer allowed to act) is killed too, and one whose worker
//! goes on sending them outlives the switch's timeout.
//!
//! The test binary is its own worker: `child_process_entry` runs a command
//! when the parent re-executes the binary with `MANENT_TEST_CHILD` set.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use manent_guard::{DeadMansSwitch, guarded};
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

/// This test binary, started as a worker in `role` (see `child_process_entry`).
fn worker(role: &str, pid_file: &Path, env: &[(&str, String)]) -> std::process::Child {
    Command::new(std::env::current_exe().expect("the test binary's path"))
        .args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .env("MANENT_TEST_PID_FILE", pid_file)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn the test binary as a worker")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_command_dies_with_its_worker_killed_with_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let mut children = Children::default();
    let i = children.push(worker("run-command", &pid_file, &[]));
    let pid = recorded_pid(&pid_file).await;
    signal(&children.0[i], "KILL");
    wait_exit(&mut children.0[i], WAIT).await;
    wait_gone(
        pid,
        "the command's sleep dies with the worker killed by SIGKILL",
    )
    .await;
}

/// A switch with a one-second timeout that pulses while `holding` is set.
fn switch(holding: Arc<AtomicBool>) -> DeadMansSwitch {
    DeadMansSwitch::new(
        Duration::from_secs(1),
        Arc::new(move || {
            if holding.load(Ordering::SeqCst) {
                Duration::from_secs(3600)
            } else {
                Duration::ZERO
            }
        }),
    )
    .expect("a one-second switch")
}

async fn ssh_connection(hosts: &SshHosts) -> Arc<dyn Connection> {
    let host = &hosts.hosts[0];
    connect(
        &Address::new(host.addr.clone(), host.port, hosts.user.clone()),
        &SshAuth::new(&hosts.client_key, &hosts.known_hosts),
    )
    .await
    .unwrap_or_else(|e| panic!("connect to sshd: {e}\n{}", hosts.logs()))
}

/// Runs the long command under a switch, withdraws the worker's right to act once it
/// runs, and checks the command is killed with its `sleep`.
async fn check_killed_when_pulses_stop(conn: Arc<dyn Connection>, pid_file: &Path) {
    let holding = Arc::new(AtomicBool::new(true));
    let command = long_command(pid_file);
    let task = tokio::spawn(guarded(Some(switch(holding.clone())), async move {
        conn.exec(&command, &[]).await
    }));
    let pid = recorded_pid(pid_file).await;
    holding.store(false, Ordering::SeqCst);
    let out = task
        .await
        .expect("the run's task")
        .expect("the command ends with a status");
    assert_eq!(
        out.status, 137,
        "the guardian kills the command (SIGKILL) once the pulses stop: {out:?}"
    );
    wait_gone(pid, "the command's sleep is killed with it").await;
}

/// A command three times as long as the switch's timeout, with the pulses flowing.
async fn check_kept_alive_by_pulses(conn: Arc<dyn Connection>) {
    let holding = Arc::new(AtomicBool::new(true));
    let out = guarded(Some(switch(holding)), conn.exec("sleep 3; echo done", &[]))
        .await
        .expect("the command ends with a status");
    assert_eq!(
        (out.status, out.stdout.as_str()),
        (0, "done\n"),
        "a command whose worker keeps sending pulses outlives the switch's timeout: {out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_command_whose_pulses_stop_is_killed_and_one_whose_pulses_flow_lives_on() {
    let dir = tempfile::tempdir().unwrap();
    check_killed_when_pulses_stop(Arc::new(LocalConnection::new()), &dir.path().join("pid")).await;
    check_kept_alive_by_pulses(Arc::new(LocalConnection::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_command_whose_pulses_stop_is_killed_and_one_whose_pulses_flow_lives_on() {
    let hosts = SshHosts::start(1).await;
    let conn = ssh_connection(&hosts).await;
    check_killed_when_pulses_stop(conn.clone(), &hosts.hosts[0].root_dir.join("pid")).await;
    check_kept_alive_by_pulses(conn).await;
}

/// Starts this test binary as a worker that runs the long command under a switch (over
/// `via`: `local`, or `ssh` to the host described by the `MANENT_TEST_SSH_*` variables),
/// freezes it with SIGSTOP once the command runs, and checks the command is killed while
/// the worker is still frozen.
async fn check_frozen_worker(via: &str, pid_file: &Path, ssh: &[(&str, String)]) {
    let mut children = Children::default();
    let role = format!("run-command-under-switch-{via}");
    let i = children.push(worker(&role, pid_file, ssh));
    let pid = recorded_pid(pid_file).await;
    signal(&children.0[i], "STOP");
    wait_gone(
        pid,
        "the command's sleep is killed while its worker is frozen",
    )
    .await;
    signal(&children.0[i], "KILL");
    wait_exit(&mut children.0[i], WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_workers_local_command_is_killed_while_the_worker_is_frozen() {
    let dir = tempfile::tempdir().unwrap();
    check_frozen_worker("local", &dir.path().join("pid"), &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_workers_remote_command_is_killed_on_the_target_while_the_worker_is_frozen() {
    let hosts = SshHosts::start(1).await;
    let host = &hosts.hosts[0];
    let ssh = [
        ("MANENT_TEST_SSH_ADDR", host.addr.clone()),
        ("MANENT_TEST_SSH_PORT", host.port.to_string()),
        ("MANENT_TEST_SSH_USER", hosts.user.clone()),
        (
            "MANENT_TEST_SSH_KEY",
            hosts.client_key.display().to_string(),
        ),
        (
            "MANENT_TEST_SSH_KNOWN_HOSTS",
            hosts.known_hosts.display().to_string(),
        ),
    ];
    check_frozen_worker("ssh", &host.root_dir.join("pid"), &ssh).await;
}

fn worker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The worker side: returns at once in a normal test run; in a re-executed
/// child it runs the long command and never returns.
#[test]
fn child_process_entry() {
    if std::env::var(ROLE).as_deref() == Ok("run-command") {
        let pid_file = PathBuf::from(std::env::var("MANENT_TEST_PID_FILE").unwrap());
        let runtime = worker_runtime();
        runtime.block_on(async {
            let _ = LocalConnection::new()
                .exec(&long_command(&pid_file), &[])
                .await;
        });
        std::process::exit(0);
    }
    if let Some(via) = std::env::var(ROLE)
        .ok()
        .as_deref()
        .and_then(|r| r.strip_prefix("run-command-under-switch-"))
    {
        let pid_file = PathBuf::from(std::env::var("MANENT_TEST_PID_FILE").unwrap());
        let var = |name: &str| std::env::var(name).unwrap();
        let runtime = worker_runtime();
        runtime.block_on(async {
            let conn: Arc<dyn Connection> = match via {
                "local" => Arc::new(LocalConnection::new()),
                _ => connect(
                    &Address::new(
                        var("MANENT_TEST_SSH_ADDR"),
                        var("MANENT_TEST_SSH_PORT").parse().unwrap(),
                        var("MANENT_TEST_SSH_USER"),
                    ),
                    &SshAuth::new(
                        var("MANENT_TEST_SSH_KEY"),
                        var("MANENT_TEST_SSH_KNOWN_HOSTS"),
                    ),
                )
                .await
                .expect("connect to sshd"),
            };
            let holding = Arc::new(AtomicBool::new(true));
            let _ = guarded(
                Some(switch(holding)),
                conn.exec(&long_command(&pid_file), &[]),
            )
            .await;
        });
        std::process::exit(0);
    }
}
