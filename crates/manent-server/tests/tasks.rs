//! A `once` task across a crash (docs/environments.md, "Tasks and roles"): its success is
//! recorded before the deploy goes on, so a worker killed with `kill -9` after it (during
//! the `activate` that follows) leaves a deploy that another worker resumes without running
//! the task again. Real processes on SQLite and PostgreSQL, driven through the `manent` CLI.

mod common;

use common::{Site, WAIT, ledger_path};
use manent_testkit::{Db, eventually, on_both_backends, process_gone, signal};

on_both_backends!(
    a_once_task_that_succeeded_is_not_run_again_when_another_worker_resumes_the_deploy,
);

async fn a_once_task_that_succeeded_is_not_run_again_when_another_worker_resumes_the_deploy(
    db: Db,
) {
    let mut site = Site::new(db, &[]).await;
    let ledger = ledger_path(&site.dir);
    let gate = site.dir.join("gate").display().to_string();
    let releases = site.dir.join("releases").display().to_string();
    // The task appends a line per run. `activate` records its shell's pid, then waits for
    // the gate file, so the test kills the worker inside it: after the task's success.
    let migrate = format!("echo \"migrate $MANENT_TARGET\" >> {ledger}");
    let activate = format!(
        "echo \"activate-pid $$\" >> {ledger}; while [ ! -f {gate} ]; do sleep 0.05; done; \
         echo activated >> {ledger}"
    );
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets:\n  - {{name: t1, host: local, roles: [web]}}\n  - {{name: t2, host: local, \
             roles: [db]}}\ndeploy:\n  dest: {}\n  activate: {}\n  tasks:\n    - {{name: migrate, \
             when: before_activate, once: true, roles: [db], run: {}}}\n",
            serde_json::to_string(&format!("{releases}/{{target}}/{{version}}")).unwrap(),
            serde_json::to_string(&activate).unwrap(),
            serde_json::to_string(&migrate).unwrap(),
        ),
    );
    let token = site.token();
    site.start("api", "api");
    let recovering = [("MANENT__RECOVERY__AUTOMATIC", "true")];
    let first = site.start_with("worker", "w1", &recovering);
    site.wait_api().await;
    let (id, _) = site.submit(&token, "acme/web");
    let pid: i32 = eventually("an activate has started after the task", WAIT, || async {
        site.ledger()
            .lines()
            .find_map(|l| l.strip_prefix("activate-pid ")?.parse().ok())
    })
    .await;
    assert_eq!(
        site.ledger().lines().filter(|l| *l == "migrate t2").count(),
        1,
        "the task ran on t2 (the db target) before any activate: {}",
        site.ledger()
    );
    signal(site.child(first), "KILL");
    site.child(first).wait().unwrap();
    eventually("the killed worker's activate is gone", WAIT, || async {
        process_gone(pid).then_some(())
    })
    .await;
    std::fs::write(&gate, "").unwrap();
    // Another worker takes the deploy over once w1's lease is stale (recovery.stale_after).
    site.start_with("worker", "w2", &recovering);
    let done = site.wait_status(&token, &id, "SUCCESS").await;

    let text = site.ledger();
    assert_eq!(
        text.lines().filter(|l| l.starts_with("migrate")).count(),
        1,
        "the once task's recorded success is never run again: {text}"
    );
    assert_eq!(
        text.lines().filter(|l| *l == "activated").count(),
        2,
        "each target's activate finished once, the interrupted one on w2: {text}"
    );
    let steps = done["steps"].as_array().expect("the deploy's steps");
    let task = steps
        .iter()
        .find(|s| s["name"] == "t2: task migrate")
        .unwrap_or_else(|| panic!("the task's step in the status: {done}"));
    assert_eq!(
        (task["executor_id"].as_str(), task["attempts"].as_i64()),
        (Some("w1"), Some(1)),
        "the task's step was run by w1, once: {task}"
    );
    assert!(
        steps
            .iter()
            .any(|s| s["executor_id"] == "w2" && s["name"].as_str().unwrap().ends_with("activate")),
        "w2 resumed the deploy at an activate: {done}"
    );
}
