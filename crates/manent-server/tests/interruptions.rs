//! A worker killed with `kill -9` under a deploy (docs/scaling-and-recovery.md,
//! "Recovery"): `manent workers` and the deploy's `waiting_for` say it stopped answering
//! (suspect) at once, long before its lease runs out; once it is recovered and another
//! worker resumes the deploy, its status (`interruptions`) and `manent logs` show the
//! interruption, the recovery and who resumed it, instead of a gap. Real processes on
//! SQLite and PostgreSQL, driven through the `manent` CLI.

mod common;

use common::{Site, WAIT, ledger_path};
use manent_testkit::{Db, eventually, on_both_backends, process_gone, signal};

on_both_backends!(
    a_killed_worker_is_suspect_at_once_and_its_deploy_shows_the_interruption_and_the_recovery,
);

async fn a_killed_worker_is_suspect_at_once_and_its_deploy_shows_the_interruption_and_the_recovery(
    db: Db,
) {
    let mut site = Site::new(db, &[]).await;
    let ledger = ledger_path(&site.dir);
    let gate = site.dir.join("gate").display().to_string();
    let releases = site.dir.join("releases").display().to_string();
    // `activate` records its shell's pid, then waits for the gate file: the test kills the
    // worker inside it.
    let activate = format!(
        "echo \"activate-pid $$\" >> {ledger}; while [ ! -f {gate} ]; do sleep 0.05; done; \
         echo activated >> {ledger}"
    );
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets:\n  - {{name: t1, host: local}}\ndeploy:\n  dest: {}\n  activate: {}\n",
            serde_json::to_string(&format!("{releases}/{{target}}/{{version}}")).unwrap(),
            serde_json::to_string(&activate).unwrap(),
        ),
    );
    let token = site.token();
    // A lease of an hour: whatever the test sees of w1 before its recovery, it sees while
    // w1's lease still looks live.
    let hour = [("MANENT__RECOVERY__STALE_AFTER", "1h")];
    site.start_with("api", "api", &hour);
    let first = site.start_with("worker", "w1", &hour);
    site.wait_api().await;
    let (id, _) = site.submit(&token, "acme/web");
    let pid: i32 = eventually("the activate has started", WAIT, || async {
        site.ledger()
            .lines()
            .find_map(|l| l.strip_prefix("activate-pid ")?.parse().ok())
    })
    .await;
    let (code, workers) = site.cli(&token, &["workers"]);
    let state_of_w1 = |workers: &serde_json::Value| {
        workers
            .as_array()
            .and_then(|all| all.iter().find(|w| w["executor_id"] == "w1"))
            .map(|w| w["state"].clone())
    };
    assert_eq!(
        (code, state_of_w1(&workers)),
        (0, Some("running".into())),
        "w1 runs the deploy: {workers}"
    );

    signal(site.child(first), "KILL");
    site.child(first).wait().unwrap();
    eventually("the killed worker's activate is gone", WAIT, || async {
        process_gone(pid).then_some(())
    })
    .await;
    let workers = eventually("w1 shown as suspect", WAIT, || async {
        let (_, workers) = site.cli(&token, &["workers"]);
        (state_of_w1(&workers) == Some("suspect".into())).then_some(workers)
    })
    .await;
    let w1 = workers
        .as_array()
        .and_then(|all| all.iter().find(|w| w["executor_id"] == "w1"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        w1["stale"], false,
        "suspect, not yet silent past stale_after: {w1}"
    );
    let status = site.status(&token, &id);
    let waiting = status["waiting_for"].as_str().unwrap_or_default();
    assert!(
        waiting.contains("worker w1 stopped answering (suspect)"),
        "the deploy says its worker stopped answering: {status}"
    );
    let (_, text) = site.cli_text(&token, &["workers"]);
    assert!(
        text.contains("suspect"),
        "`manent workers` shows w1 as suspect: {text}"
    );

    // Proven gone on this host: recovered at once, then resumed by w2.
    let (code, recovered) = site.cli_text(&token, &["recover", "--executor", "w1"]);
    assert_eq!(code, 0, "w1's deploy is recovered: {recovered}");
    std::fs::write(&gate, "").unwrap();
    site.start_with("worker", "w2", &hour);
    let done = site.wait_status(&token, &id, "SUCCESS").await;

    let interruptions = done["interruptions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        interruptions.len(),
        1,
        "one interruption in the deploy's status: {done}"
    );
    let i = &interruptions[0];
    let recovery = i["recovery"].as_str().unwrap_or_default();
    assert!(
        recovery.contains("recovered from executor w1"),
        "the recovery names the lost worker: {i}"
    );
    assert!(
        i["interrupted_at"].is_string()
            && i["interruption"]
                .as_str()
                .is_some_and(|t| t.contains("worker w1 stopped answering")),
        "the interruption is dated at w1's last heartbeat and says what stopped: {i}"
    );
    assert_eq!(
        i["resumed_by"], "w2",
        "the worker that resumed the deploy: {i}"
    );
    assert!(
        i["interrupted_at"].as_str() <= i["recovered_at"].as_str()
            && i["recovered_at"].as_str() <= i["resumed_at"].as_str(),
        "interrupted, then recovered, then resumed: {i}"
    );

    let (code, logs) = site.cli_text(&token, &["logs", &id]);
    assert_eq!(code, 0, "manent logs: {logs}");
    let position = |needle: &str| {
        logs.find(needle)
            .unwrap_or_else(|| panic!("`{needle}` in the deploy's log:\n{logs}"))
    };
    let (stopped, moved, resumed) = (
        position("worker w1 stopped answering"),
        position("recovered from executor w1"),
        position("resumed by worker w2"),
    );
    assert!(
        stopped < moved && moved < resumed,
        "the log tells the interruption, the recovery and the resumption in order:\n{logs}"
    );
}
