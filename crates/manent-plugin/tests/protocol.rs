//! The plugin protocol end to end: the host against `manent-test-plugin`, a real process
//! (handshake, each request, crashes, garbage, hangs, wrong sums and versions), and the stub.

use std::{collections::BTreeMap, path::Path, time::Duration};

use manent_plugin::{
    Bwrap, Confinement, ExternalPlugin, Operation, Pass, PassScope, PluginError, PluginHost,
    StubPlugin, TargetRef, TargetStatus, host::file_sha256,
};

const TEST_PLUGIN: &str = env!("CARGO_BIN_EXE_manent-test-plugin");

fn plugin() -> ExternalPlugin {
    let sum = file_sha256(Path::new(TEST_PLUGIN)).expect("hash the test plugin");
    ExternalPlugin::new("test", TEST_PLUGIN, &sum)
}

fn pass(dir: &Path, version: &str, mode: Option<&str>) -> Pass {
    let mut vars = BTreeMap::from([("dir".to_string(), dir.display().to_string())]);
    if let Some(mode) = mode {
        vars.insert("mode".into(), mode.into());
    }
    Pass {
        deploy_id: format!("d-{version}"),
        application: "acme/web".into(),
        environment: "prod".into(),
        version: version.into(),
        targets: ["t1", "t2"]
            .iter()
            .map(|n| TargetRef {
                name: n.to_string(),
                host: "127.0.0.1".into(),
                port: 22,
                user: "root".into(),
                ..TargetRef::default()
            })
            .collect(),
        vars,
        ..Pass::default()
    }
}

fn statuses(result: &manent_plugin::PassResult) -> Vec<(String, TargetStatus)> {
    result
        .targets
        .iter()
        .map(|t| (t.name.clone(), t.status))
        .collect()
}

fn all(status: TargetStatus) -> Vec<(String, TargetStatus)> {
    vec![("t1".into(), status), ("t2".into(), status)]
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test]
async fn the_handshake_returns_the_plugins_name_version_and_artifact_types() {
    let host = plugin();
    assert_eq!(host.pid(), None, "nothing starts before the first request");
    let info = host.start().await.expect("the test plugin starts");
    assert_eq!(
        (info.name.as_str(), info.protocol, info.artifact_types),
        ("test", 1, vec!["test".to_string()]),
        "the handshake result names the plugin, its protocol and its artifact types"
    );
    assert!(
        host.pid().is_some_and(pid_alive),
        "the process runs after the handshake"
    );
    host.shutdown().await;
}

#[tokio::test]
async fn every_request_gets_its_result_from_one_reused_process() {
    let dir = tempfile::tempdir().unwrap();
    let host = plugin();
    let plan = host
        .call(Operation::Plan, &pass(dir.path(), "1", None))
        .await
        .expect("plan");
    assert_eq!(
        statuses(&plan),
        all(TargetStatus::Changed),
        "plan says what would change"
    );
    assert!(
        !dir.path().join("t1").exists(),
        "plan changes nothing on the targets"
    );
    let pid = host.pid();
    let deploy = host
        .call(Operation::Deploy, &pass(dir.path(), "1", None))
        .await
        .expect("deploy");
    assert_eq!(
        statuses(&deploy),
        all(TargetStatus::Changed),
        "deploy changes"
    );
    let again = host
        .call(Operation::Deploy, &pass(dir.path(), "1", None))
        .await
        .expect("deploy again");
    assert_eq!(
        statuses(&again),
        all(TargetStatus::Ok),
        "a rerun pass finds everything in place"
    );
    let check = host
        .call(Operation::Check, &pass(dir.path(), "1", None))
        .await
        .expect("check");
    assert_eq!(statuses(&check), all(TargetStatus::Ok), "the check passes");
    host.call(Operation::Deploy, &pass(dir.path(), "2", None))
        .await
        .expect("deploy 2");
    let rollback = host
        .call(
            Operation::Rollback,
            &Pass {
                previous_version: Some("1".into()),
                ..pass(dir.path(), "2", None)
            },
        )
        .await
        .expect("rollback");
    assert_eq!(
        statuses(&rollback),
        all(TargetStatus::Changed),
        "rollback restores the previous version"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("t2")).unwrap(),
        "1",
        "the previous version is back"
    );
    assert_eq!(
        host.pid(),
        pid,
        "one process served every request: started on first use, then reused"
    );
    host.shutdown().await;
}

#[tokio::test]
async fn a_plugin_error_reply_fails_the_request_and_keeps_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let host = plugin();
    let err = host
        .call(Operation::Deploy, &pass(dir.path(), "1", Some("fail")))
        .await
        .expect_err("the plugin answered an error");
    assert!(
        matches!(&err, PluginError::Plugin { code, retryable: false, .. } if code == "failed"),
        "the error shape reaches the caller: {err:?}"
    );
    let pid = host.pid();
    let err = host
        .call(Operation::Deploy, &pass(dir.path(), "1", Some("retryable")))
        .await
        .expect_err("the plugin answered an error");
    assert!(
        err.retryable(),
        "the plugin decides whether its error is retryable: {err}"
    );
    assert_eq!(host.pid(), pid, "an error reply is not a reason to restart");
    host.shutdown().await;
}

#[tokio::test]
async fn a_plugin_that_crashes_mid_pass_fails_that_pass_and_restarts_on_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let host = plugin();
    host.start().await.unwrap();
    let first = host.pid().unwrap();
    let err = host
        .call(Operation::Deploy, &pass(dir.path(), "1", Some("crash")))
        .await
        .expect_err("the plugin died mid-pass");
    let message = err.to_string();
    assert!(
        matches!(err, PluginError::Exited { .. })
            && message.contains("exit status: 3")
            && message.contains("crashing on purpose"),
        "the error says the plugin exited, how, and quotes its stderr: {message}"
    );
    assert!(err.retryable(), "a crash may pass when tried again");
    assert!(!pid_alive(first), "the dead process was reaped");
    let deploy = host
        .call(Operation::Deploy, &pass(dir.path(), "1", None))
        .await
        .expect("the next request restarts the plugin");
    assert_eq!(
        statuses(&deploy),
        all(TargetStatus::Changed),
        "and it works"
    );
    assert_ne!(host.pid(), Some(first), "a new process");
    host.shutdown().await;
}

#[tokio::test]
async fn a_plugin_that_answers_garbage_gets_a_clear_error_and_the_host_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let host = plugin();
    let err = host
        .call(Operation::Deploy, &pass(dir.path(), "1", Some("garbage")))
        .await
        .expect_err("garbage is not a reply");
    let message = err.to_string();
    assert!(
        matches!(err, PluginError::Protocol { .. })
            && message.contains("plugin `test`")
            && message.contains("this is not json"),
        "the error names the plugin and quotes the bad line: {message}"
    );
    assert!(
        !err.retryable(),
        "a plugin breaking the protocol is not retried"
    );
    let deploy = host
        .call(Operation::Deploy, &pass(dir.path(), "1", None))
        .await
        .expect("the host starts a fresh process for the next request");
    assert_eq!(
        statuses(&deploy),
        all(TargetStatus::Changed),
        "and it works"
    );
    host.shutdown().await;
}

#[tokio::test]
async fn a_plugin_that_never_answers_times_out_and_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let host = plugin().timeout(Duration::from_secs(1));
    host.start().await.unwrap();
    let pid = host.pid().unwrap();
    let err = host
        .call(Operation::Deploy, &pass(dir.path(), "1", Some("hang")))
        .await
        .expect_err("a silent plugin does not hang the pass");
    assert!(
        matches!(err, PluginError::Timeout { .. }),
        "the error says it timed out: {err}"
    );
    assert!(!pid_alive(pid), "the silent process was killed and reaped");
    host.shutdown().await;
}

#[tokio::test]
async fn an_executable_whose_sha256_does_not_match_is_never_started() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("started");
    let script = dir.path().join("plugin.sh");
    std::fs::write(&script, format!("#!/bin/sh\ntouch {}\n", marker.display())).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let wrong = "0".repeat(64);
    let host = ExternalPlugin::new("test", &script, &wrong);
    let err = host
        .call(Operation::Deploy, &pass(dir.path(), "1", None))
        .await
        .expect_err("a wrong sum is refused");
    let actual = file_sha256(&script).unwrap();
    let message = err.to_string();
    assert!(
        message.contains(&script.display().to_string())
            && message.contains(&wrong)
            && message.contains(&actual),
        "the error names the path, the expected and the actual sums: {message}"
    );
    assert!(!err.retryable(), "a wrong sum is not retried");
    assert!(!marker.exists(), "the executable never ran");
}

#[tokio::test]
async fn a_plugin_of_another_protocol_version_or_name_is_refused() {
    let host = plugin().env("MANENT_TEST_PLUGIN_PROTOCOL", "2");
    let err = host.start().await.expect_err("protocol 2 is refused");
    assert!(
        matches!(err, PluginError::Version { .. }) && !err.retryable(),
        "a version mismatch is a clear, final error: {err}"
    );
    assert_eq!(host.pid(), None, "no process is kept");

    let host = plugin().env("MANENT_TEST_PLUGIN_NAME", "other");
    let err = host.start().await.expect_err("another plugin's executable");
    assert!(
        matches!(err, PluginError::Name { .. }) && err.to_string().contains("`other`"),
        "a name mismatch names both: {err}"
    );
}

#[tokio::test]
async fn shutdown_stops_the_process_and_refuses_later_requests() {
    let dir = tempfile::tempdir().unwrap();
    let host = plugin();
    host.start().await.unwrap();
    let pid = host.pid().unwrap();
    host.shutdown().await;
    assert!(!pid_alive(pid), "the process exited when its stdin closed");
    let err = host
        .call(Operation::Deploy, &pass(dir.path(), "1", None))
        .await
        .expect_err("no request after shutdown");
    assert!(
        matches!(err, PluginError::ShuttingDown { .. }),
        "a request after shutdown is refused: {err}"
    );
    assert_eq!(host.pid(), None, "nothing was restarted");
}

#[tokio::test]
async fn a_stub_knows_its_name_and_types_and_fails_every_request_without_retries() {
    let stub = StubPlugin::new("ansible", vec!["ansible".into()]);
    assert_eq!(
        stub.artifact_types(),
        ["ansible".to_string()],
        "types known"
    );
    let host = PluginHost::Stub(stub);
    let dir = tempfile::tempdir().unwrap();
    let err = host
        .call(Operation::Deploy, &pass(dir.path(), "1", None))
        .await
        .expect_err("a stub never runs anything");
    assert!(
        err.to_string()
            .contains("runs only on workers with dbos.plugins: [ansible]")
            && !err.retryable(),
        "the stub says where the plugin runs, and it is final: {err}"
    );
    assert_eq!(
        host.unavailable().map(|e| e.to_string()),
        Some(err.to_string()),
        "the worker can tell before calling"
    );
}

#[tokio::test]
async fn a_request_whose_caller_gave_up_does_not_confuse_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let host = plugin();
    host.start().await.unwrap();
    let first = host.pid().unwrap();
    // A cancelled deploy drops its pass while the plugin is still working on it.
    let abandoned = tokio::time::timeout(
        Duration::from_millis(300),
        host.call(Operation::Deploy, &pass(dir.path(), "1", Some("hang"))),
    )
    .await;
    assert!(abandoned.is_err(), "the caller gave up on the hanging pass");
    let deploy = host
        .call(Operation::Deploy, &pass(dir.path(), "1", None))
        .await
        .expect("the next request gets its own answer");
    assert_eq!(
        statuses(&deploy),
        all(TargetStatus::Changed),
        "and it works"
    );
    assert!(
        !pid_alive(first) && host.pid() != Some(first),
        "the process that owed an answer was replaced"
    );
    host.shutdown().await;
}

#[tokio::test]
async fn a_confined_plugin_runs_each_pass_in_a_sandbox_of_its_own_seeing_only_that_pass() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let other_work = dir.path().join("other-deploy");
    let key = dir.path().join("keys/own");
    let other_key = dir.path().join("keys/other");
    for d in [&work, &other_work, &key.parent().unwrap().to_path_buf()] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(&key, "own").unwrap();
    std::fs::write(&other_key, "other").unwrap();
    let host = plugin()
        .env("SET_BY_THE_OPERATOR", "1")
        .confinement(bwrap());
    let scope = PassScope {
        work_dir: work.clone(),
        read_only: vec![key.clone()],
    };
    let mut probe = pass(&work, "1", Some("probe"));
    probe.vars.insert(
        "probe".into(),
        [&work, &key, &other_key, &other_work]
            .map(|p| p.display().to_string())
            .join(":"),
    );
    let err = host
        .call(Operation::Deploy, &probe)
        .await
        .expect_err("a confined plugin needs its pass's scope");
    assert!(
        matches!(err, PluginError::Confinement { .. }) && !err.retryable(),
        "without a scope it is refused, not run unconfined: {err}"
    );
    for round in 0..2 {
        let result = host
            .call_for_pass(
                Operation::Deploy,
                &probe,
                Some(&scope),
                &|_, _| {},
                manent_plugin::host::no_redaction(),
            )
            .await
            .unwrap_or_else(|e| panic!("pass {round} runs in bwrap: {e}"));
        assert_eq!(
            result.targets[0].detail,
            format!(
                "env=HOME,LANG,PATH,PWD,SET_BY_THE_OPERATOR,TMPDIR seen={}:{}",
                work.display(),
                key.display()
            ),
            "the process has only its own variables and sees only its pass's files"
        );
        assert_eq!(
            host.pid(),
            None,
            "the pass's process is gone once it answered (pass {round})"
        );
    }
    host.shutdown().await;
}

#[tokio::test]
async fn a_confined_plugin_whose_bwrap_is_missing_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let host = plugin().confinement(Confinement::Bwrap(Bwrap {
        bwrap: "/nonexistent/bwrap".into(),
        ..Bwrap::default()
    }));
    let scope = PassScope {
        work_dir: dir.path().to_path_buf(),
        read_only: Vec::new(),
    };
    let err = host
        .call_for_pass(
            Operation::Deploy,
            &pass(dir.path(), "1", None),
            Some(&scope),
            &|_, _| {},
            manent_plugin::host::no_redaction(),
        )
        .await
        .expect_err("no sandbox, no run");
    assert!(
        err.to_string().contains("/nonexistent/bwrap")
            && err.to_string().contains("confinement: none")
            && !err.retryable(),
        "the error names the bwrap and what to do, and is not retried: {err}"
    );
    assert!(!dir.path().join("t1").exists(), "the plugin never ran");
}

/// Confinement by the `bwrap` on PATH, with no extra paths.
fn bwrap() -> Confinement {
    Confinement::Bwrap(Bwrap {
        bwrap: "bwrap".into(),
        read_only: Vec::new(),
        hidden: Vec::new(),
    })
}

/// A pass's scope: `dir` as its work directory, nothing more.
fn scope_of(dir: &Path) -> PassScope {
    PassScope {
        work_dir: dir.to_path_buf(),
        read_only: Vec::new(),
    }
}

/// A one-second dead-man's switch that pulses while `holding` is set.
fn switch(holding: &std::sync::Arc<std::sync::atomic::AtomicBool>) -> manent_guard::DeadMansSwitch {
    let holding = holding.clone();
    manent_guard::DeadMansSwitch::new(
        Duration::from_secs(1),
        std::sync::Arc::new(move || {
            if holding.load(std::sync::atomic::Ordering::SeqCst) {
                Duration::from_secs(3600)
            } else {
                Duration::ZERO
            }
        }),
    )
    .expect("a one-second switch")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_whose_workers_pulses_stop_is_killed_mid_pass_confined_or_not() {
    check_killed_when_pulses_stop(false).await;
    check_killed_when_pulses_stop(true).await;
}

/// Starts a pass that never answers under a switch, withdraws the worker's right to act
/// once the process runs, and checks the pass fails because the process was stopped.
async fn check_killed_when_pulses_stop(confined: bool) {
    use std::sync::{Arc, atomic::AtomicBool, atomic::Ordering};
    let dir = tempfile::tempdir().unwrap();
    let mut host = plugin();
    if confined {
        host = host.confinement(bwrap());
    }
    let host = Arc::new(host);
    let holding = Arc::new(AtomicBool::new(true));
    let call = {
        let (host, pass) = (host.clone(), pass(dir.path(), "1", Some("hang")));
        let scope = scope_of(dir.path());
        tokio::spawn(manent_guard::guarded(Some(switch(&holding)), async move {
            host.call_for_pass(
                Operation::Deploy,
                &pass,
                confined.then_some(&scope),
                &|_, _| {},
                manent_plugin::host::no_redaction(),
            )
            .await
        }))
    };
    let pid = manent_testkit::eventually(
        "the plugin answers the handshake",
        Duration::from_secs(60),
        || async { host.pid() },
    )
    .await;
    holding.store(false, Ordering::SeqCst);
    let err = call
        .await
        .expect("the call's task")
        .expect_err("a plugin whose worker stopped pulsing does not finish its pass");
    assert!(
        matches!(err, PluginError::Exited { .. }),
        "the pass fails because the process was killed, not by the 30-minute timeout \
         (confined: {confined}): {err}"
    );
    manent_testkit::eventually(
        "the plugin process is reaped",
        Duration::from_secs(60),
        || async { (!pid_alive(pid)).then_some(()) },
    )
    .await;
    host.shutdown().await;
}

/// The `probe` pass saw exactly the variables `names` (comma-separated, sorted).
fn check_environment(result: &manent_plugin::PassResult, names: &str) {
    let detail = &result.targets[0].detail;
    assert!(
        detail.starts_with(&format!("env={names} ")),
        "the watcher adds no variable to the plugin's environment: {detail}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_under_a_pulsing_switch_answers_confined_or_not_with_nothing_added_to_its_environment()
 {
    let dir = tempfile::tempdir().unwrap();
    let holding = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut probe = pass(dir.path(), "1", Some("probe"));
    probe.vars.insert("probe".into(), String::new());
    let unconfined = plugin().env("SET_BY_THE_OPERATOR", "1");
    let result = manent_guard::guarded(
        Some(switch(&holding)),
        unconfined.call(Operation::Deploy, &probe),
    )
    .await
    .expect("an unconfined pass under a switch");
    check_environment(&result, "HOME,LANG,PATH,SET_BY_THE_OPERATOR,TMPDIR");
    unconfined.shutdown().await;

    let confined = plugin()
        .env("SET_BY_THE_OPERATOR", "1")
        .confinement(bwrap());
    let scope = scope_of(dir.path());
    let result = manent_guard::guarded(
        Some(switch(&holding)),
        confined.call_for_pass(
            Operation::Deploy,
            &probe,
            Some(&scope),
            &|_, _| {},
            manent_plugin::host::no_redaction(),
        ),
    )
    .await
    .expect("a confined pass under a switch");
    check_environment(&result, "HOME,LANG,PATH,PWD,SET_BY_THE_OPERATOR,TMPDIR");
    confined.shutdown().await;
}
