//! The ssh wrapper's rewriting, and the remote guard run here under `sh` as sshd would
//! run it (a session leader): its connection lost, and taken over by a later run.

use std::{
    path::Path,
    process::{Child, Command},
    time::Duration,
};

use manent_testkit::{eventually, process_gone};

use super::*;

const WAIT: Duration = Duration::from_secs(60);

/// The arguments after rewriting, one per line, the guard's text shown as `<GUARD>`.
fn check(args: &[&str], expect: expect_test::Expect) {
    let args = args.iter().map(OsString::from).collect();
    let out: Vec<String> = guarded_args("deploy-7", args)
        .into_iter()
        .map(|a| {
            a.to_string_lossy()
                .replace(&sh_quote(REMOTE_GUARD), "<GUARD>")
        })
        .collect();
    expect.assert_eq(&out.join("\n"));
}

#[test]
fn an_exec_runs_under_the_guard_keyed_by_its_destination_and_anything_else_passes_through() {
    // What ansible's ssh connection runs with pipelining: the module on stdin.
    check(
        &[
            "-C",
            "-o",
            "ControlMaster=no",
            "-o",
            "Port=2222",
            "-o",
            "User=\"deploy\"",
            "-o",
            "ConnectTimeout=10",
            "127.0.0.2",
            "/bin/sh -c '/usr/bin/python3 && sleep 0'",
        ],
        expect_test::expect![[r#"
            -C
            -o
            ControlMaster=no
            -o
            Port=2222
            -o
            User="deploy"
            -o
            ConnectTimeout=10
            127.0.0.2
            exec sh -c <GUARD> manent-ansible-guard deploy-7.deploy@127.0.0.2:2222 '/bin/sh -c '\''/usr/bin/python3 && sleep 0'\'''"#]],
    );
    // Without a tty request, attached values and a login in the destination.
    check(
        &[
            "-tt", "-p22", "-lroot", "-i", "/k ey", "root@h", "echo", "~",
        ],
        expect_test::expect![[r#"
            -tt
            -p22
            -lroot
            -i
            /k ey
            root@h
            exec sh -c <GUARD> manent-ansible-guard deploy-7.root@h:22 'echo ~'"#]],
    );
    // sftp's subsystem, a control command, a login: as they are.
    for args in [
        &["-o", "Port=22", "-s", "--", "h", "sftp"][..],
        &["-O", "check", "h"],
        &["-o", "Port=22", "h"],
    ] {
        let given: Vec<OsString> = args.iter().map(OsString::from).collect();
        assert_eq!(
            guarded_args("deploy-7", given.clone()),
            given,
            "only a remote command is guarded: {args:?}"
        );
    }
}

#[test]
fn a_record_name_keeps_only_file_name_characters() {
    let destination = Destination {
        host: "h/../x y".into(),
        user: "root".into(),
        port: "22".into(),
    };
    assert_eq!(
        record_name("01J/../x", &destination),
        "01J_.._x.root@h_.._x_y:22",
        "no `/`: a record stays in its directory"
    );
}

/// A guard run as sshd runs a session's command: under `setsid` (a session leader, as
/// sshd makes it), the child of a shell that stands for the sshd session (killing that
/// shell is the connection dropping). `home` stands for the target's `$HOME`.
fn guard_under_session(home: &Path, key: &str, command: &str) -> Child {
    Command::new("sh")
        .arg("-c")
        // What follows keeps the session shell as the guard's parent (no exec), and
        // returns the guard's status.
        .arg("setsid sh -c \"$0\" manent-ansible-guard \"$1\" \"$2\"; rc=$?; exit $rc")
        .args([REMOTE_GUARD, key, command])
        .env("HOME", home)
        .spawn()
        .expect("run sh")
}

async fn pid_in(file: &Path) -> i32 {
    eventually("the command writes its pid", WAIT, || async {
        std::fs::read_to_string(file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
    })
    .await
}

#[tokio::test]
async fn a_guard_kills_its_command_once_its_session_is_gone() {
    let home = tempfile::tempdir().unwrap();
    let pid_file = home.path().join("pid");
    let mut session = guard_under_session(
        home.path(),
        "deploy-1.u@h:22",
        &format!("echo $$ > {}; exec sleep 3600", pid_file.display()),
    );
    let command = pid_in(&pid_file).await;
    assert!(
        home.path()
            .join(".manent/ansible/deploy-1.u@h:22")
            .is_file(),
        "the running command is recorded under its key"
    );
    session.kill().unwrap();
    session.wait().unwrap();
    eventually(
        "the command dies with its session (its guard reparented)",
        WAIT,
        || async { process_gone(command).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn a_guard_stops_and_waits_out_the_earlier_run_of_its_key_before_its_command_starts() {
    let home = tempfile::tempdir().unwrap();
    let ledger = home.path().join("ledger");
    let pid_file = home.path().join("pid");
    // The earlier run ignores SIGTERM: only the escalation to SIGKILL ends it.
    let mut earlier_session = guard_under_session(
        home.path(),
        "deploy-2.u@h:22",
        &format!(
            "trap '' TERM; echo $$ > {pid}; while :; do echo old >> {ledger}; sleep 0.05; done",
            pid = pid_file.display(),
            ledger = ledger.display()
        ),
    );
    let earlier = pid_in(&pid_file).await;
    let mut later = guard_under_session(
        home.path(),
        "deploy-2.u@h:22",
        &format!("echo new >> {}", ledger.display()),
    );
    let status = later.wait().unwrap();
    assert!(status.success(), "the later run's guard succeeds: {status}");
    assert!(
        process_gone(earlier),
        "the earlier run's command is gone once the later one ran"
    );
    let lines: Vec<String> = std::fs::read_to_string(&ledger)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(
        lines.last().map(String::as_str),
        Some("new"),
        "the earlier run wrote nothing once the later one began: {lines:?}"
    );
    assert_eq!(
        lines.iter().filter(|l| *l == "new").count(),
        1,
        "the later command ran once: {lines:?}"
    );
    assert!(
        !home.path().join(".manent/ansible/deploy-2.u@h:22").exists(),
        "a guard whose command ended removes its record"
    );
    let earlier_status = earlier_session.wait().unwrap();
    assert!(
        !earlier_status.success(),
        "the earlier run's guard was killed, not left to finish: {earlier_status}"
    );
}
