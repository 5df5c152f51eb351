//! manent-server as operators run it: real processes on SQLite and
//! PostgreSQL, driven through the `manent` CLI. Crash and restart mid-deploy,
//! drain on SIGTERM, the duplicate executor id, `recover` and its refusals, and
//! the workers view.

mod common;

use std::process::Command;

use common::{Site, WAIT, ledger_path};
use manent_testkit::{Db, eventually, process_gone, signal};

use manent_testkit::on_both_backends;

on_both_backends!(
    a_deploy_killed_mid_way_resumes_on_a_replaced_machine_and_runs_each_completed_step_once,
    recover_refuses_a_live_executor_and_an_unknown_one_and_force_moves_the_work,
    waiting_for_names_the_deploy_in_the_way_and_the_worker_that_is_gone,
    sigterm_drains_short_work_and_leaves_long_work_pending_for_the_restart,
    a_second_worker_with_a_live_id_exits_naming_the_host,
    workers_lists_each_worker_with_state_and_heartbeat,
    eight_workers_started_together_on_an_empty_database_all_come_up,
);

async fn a_deploy_killed_mid_way_resumes_on_a_replaced_machine_and_runs_each_completed_step_once(
    db: Db,
) {
    let mut site = Site::new(db, &[]).await;
    let ledger = ledger_path(&site.dir);
    let gate = site.dir.join("gate").display().to_string();
    // Step 2 reads the artifact through the path manent gives it, records its shell's
    // pid, then waits for a gate file, so the test can kill the worker inside it.
    let commands = [
        format!("echo one >> {ledger}"),
        format!(
            "echo two-start >> {ledger}; echo \"two-read $(cat \"$MANENT_ARTIFACT_ARTIFACT_TXT\")\" >> {ledger}; \
             echo \"two-pid $$\" >> {ledger}; while [ ! -f {gate} ]; do sleep 0.05; done; echo two-done >> {ledger}"
        ),
        format!("echo three >> {ledger}"),
    ];
    std::fs::write(
        site.dir.join("environments/acme/web/prod.yml"),
        format!(
            "targets:\n  - {{name: t1, host: local}}\ndeploy:\n  plugin: command\n  commands:\n{}",
            commands
                .iter()
                .map(|c| format!("    - {}\n", serde_json::to_string(c).unwrap()))
                .collect::<String>()
        ),
    )
    .unwrap();
    let token = site.token();
    let serve = site.start("serve", "node-1");
    site.wait_api().await;
    let descriptor = site.descriptor("1.0");
    let (code, submitted) = site.cli(&token, &["deploy", "-f", descriptor.to_str().unwrap()]);
    assert_eq!(code, 0, "submission accepted: {submitted}");
    let id = submitted["id"].as_str().unwrap().to_string();
    let pid: i32 = eventually("step two has started", WAIT, || async {
        site.ledger()
            .lines()
            .find_map(|l| l.strip_prefix("two-pid ")?.parse().ok())
    })
    .await;
    signal(site.child(serve), "KILL");
    site.child(serve).wait().unwrap();
    // kill -9 of the worker ends its command too (issue: commands live and die
    // with their step), before anything could let it finish.
    eventually("the killed worker's command is gone", WAIT, || async {
        process_gone(pid).then_some(())
    })
    .await;
    // The machine is replaced: same executor id (a StatefulSet's pod name), empty
    // disk. The resumed step must fetch the artifact again, not use the old path.
    std::fs::remove_dir_all(site.dir.join("work-node-1")).expect("remove the work directory");
    std::fs::write(&gate, "").unwrap();

    site.start("serve", "node-1");
    site.wait_api().await;
    let done = eventually("the deploy finishes after the restart", WAIT, || async {
        let (_, status) = site.cli(&token, &["status", &id]);
        matches!(status["status"].as_str(), Some("SUCCESS" | "ERROR")).then_some(status)
    })
    .await;
    assert_eq!(done["status"], "SUCCESS", "the deploy completes: {done}");
    let text = site.ledger();
    let lines: Vec<&str> = text.lines().collect();
    let count = |l: &str| lines.iter().filter(|x| **x == l).count();
    assert_eq!(count("one"), 1, "a completed step never reruns: {lines:?}");
    assert_eq!(
        count("two-start"),
        2,
        "the interrupted step restarts: {lines:?}"
    );
    assert_eq!(
        count("two-read payload"),
        2,
        "both runs of step two read the artifact, the second from a fresh fetch: {lines:?}"
    );
    assert_eq!(
        count("two-done"),
        1,
        "the killed run's command died with its worker and never finished: {lines:?}"
    );
    assert_eq!(count("three"), 1, "later steps run once: {lines:?}");
    assert!(
        done["steps"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["executor_id"] == "node-1"),
        "every step ran on node-1: {done}"
    );
}

async fn recover_refuses_a_live_executor_and_an_unknown_one_and_force_moves_the_work(db: Db) {
    let mut site = Site::new(db, &[]).await;
    let ledger = ledger_path(&site.dir);
    let gate = site.dir.join("gate").display().to_string();
    let pid_file = site.dir.join("pid").display().to_string();
    // The command itself notes an overlap: the pid of the run before it still alive.
    let command = format!(
        "p=$(cat {pid_file} 2>/dev/null); if [ -n \"$p\" ]; then s=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null); \
         if [ -n \"$s\" ] && [ \"$s\" != Z ]; then echo overlap >> {ledger}; fi; fi; echo $$ > {pid_file}; \
         echo \"start $$\" >> {ledger}; while [ ! -f {gate} ]; do sleep 0.05; done; echo done >> {ledger}"
    );
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets:\n  - {{name: t1, host: local}}\ndeploy:\n  plugin: command\n  commands:\n    - {}\n",
            serde_json::to_string(&command).unwrap()
        ),
    );
    let token = site.token();
    site.start("api", "api");
    let first = site.start("worker", "w1");
    site.wait_api().await;
    let (id, _) = site.submit(&token, "acme/web");
    let first_pid: i32 = eventually("w1 runs the deploy's command", WAIT, || async {
        site.ledger()
            .lines()
            .find_map(|l| l.strip_prefix("start ")?.parse().ok())
    })
    .await;
    // Ready to take the deploy the moment it is handed back.
    site.start("worker", "w2");

    let (code, stderr) = site.cli_stderr(&token, &["recover", "--executor", "w1"]);
    assert_eq!(
        code, 2,
        "a live executor is refused without --force: {stderr}"
    );
    assert!(
        stderr.contains("w1") && stderr.contains("--force"),
        "the refusal names the executor and the way out: {stderr}"
    );
    let (code, stderr) = site.cli_stderr(&token, &["recover", "--executor", "nobody"]);
    assert_eq!(code, 2, "an unknown executor is an error: {stderr}");
    assert!(
        stderr.contains("nobody"),
        "the error names the id: {stderr}"
    );

    let (code, out) = site.cli(&token, &["recover", "--executor", "w1", "--force"]);
    assert_eq!(code, 0, "an admin may force the recovery: {out}");
    // The revoked holder stops at its next renewal, killing its command, and exits
    // non-zero; the deploy moves to w2 only at the revoked lease's deadline.
    let status = manent_testkit::wait_exit(site.child(first), WAIT).await;
    assert!(
        !status.success(),
        "the fenced worker exits non-zero: {status}"
    );
    eventually("the fenced worker's command is gone", WAIT, || async {
        process_gone(first_pid).then_some(())
    })
    .await;
    eventually("w2 restarts the interrupted step", WAIT, || async {
        (site
            .ledger()
            .lines()
            .filter(|l| l.starts_with("start "))
            .count()
            == 2)
            .then_some(())
    })
    .await;
    std::fs::write(&gate, "").unwrap();
    let done = site.wait_status(&token, &id, "SUCCESS").await;
    let text = site.ledger();
    assert_eq!(
        text.lines().filter(|l| *l == "overlap").count(),
        0,
        "w2 started the command only once w1's was gone: {text}"
    );
    assert_eq!(
        text.lines().filter(|l| *l == "done").count(),
        1,
        "the step ran to its end once, on w2: {text}"
    );
    let (_, logs) = site.cli(&token, &["logs", &id]);
    assert!(
        logs.to_string().contains("recovered from executor w1"),
        "the deploy's log records the recovery: {logs}"
    );
    assert!(
        done["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["executor_id"] == "w2"),
        "w2 finished the deploy: {done}"
    );
}

async fn sigterm_drains_short_work_and_leaves_long_work_pending_for_the_restart(db: Db) {
    let mut site = Site::new(db, &[]).await;
    let ledger = ledger_path(&site.dir);
    let release = site.dir.join("release").display().to_string();
    // One command that outlives drain_timeout (3 s) unless released.
    std::fs::write(
        site.dir.join("environments/acme/web/prod.yml"),
        format!(
            "targets:\n  - {{name: t1, host: local}}\ndeploy:\n  plugin: command\n  commands:\n    - {}\n",
            serde_json::to_string(&format!(
                "echo start >> {ledger}; while [ ! -f {release} ]; do sleep 0.05; done; echo end >> {ledger}"
            ))
            .unwrap()
        ),
    )
    .unwrap();
    let token = site.token();
    let serve = site.start("serve", "node-1");
    site.wait_api().await;
    let (_, submitted) = site.cli(
        &token,
        &["deploy", "-f", site.descriptor("1").to_str().unwrap()],
    );
    let id = submitted["id"].as_str().unwrap().to_string();
    eventually("the long step runs", WAIT, || async {
        site.ledger().contains("start").then_some(())
    })
    .await;
    signal(site.child(serve), "TERM");
    let status = site.child(serve).wait().unwrap();
    assert!(status.success(), "a drained shutdown exits 0");
    assert!(
        !site.ledger().contains("end"),
        "the step was cut at the drain timeout"
    );
    // Read the database directly: no API runs now.
    let client = manent_engine::Client::new(
        manent_engine::Database::open(&site.db.url, &manent_engine::Connections::default())
            .await
            .unwrap(),
    );
    let record = client.get(&id).await.unwrap().unwrap();
    assert_eq!(
        record.status,
        manent_engine::WorkflowStatus::Pending,
        "left PENDING for the restart"
    );
    let executor = client.executor("node-1").await.unwrap().unwrap();
    assert_eq!(
        executor.state,
        manent_engine::ExecutorState::Stopped,
        "the worker recorded its stop"
    );

    std::fs::write(&release, "").unwrap();
    site.start("serve", "node-1");
    site.wait_api().await;
    let done = eventually("the restart resumes it", WAIT, || async {
        let (_, s) = site.cli(&token, &["status", &id]);
        (s["status"] == "SUCCESS").then_some(s)
    })
    .await;
    assert_eq!(
        done["executor_id"], "node-1",
        "node-1 ran the deploy: {done}"
    );
    assert_eq!(
        site.ledger().matches("end").count(),
        1,
        "resumed once and finished"
    );
}

async fn a_second_worker_with_a_live_id_exits_naming_the_host(db: Db) {
    let mut site = Site::new(db, &["true"]).await;
    site.start("worker", "same-id");
    let url = site.db.url.clone();
    eventually("the first worker registered", WAIT, || {
        let url = url.clone();
        async move {
            let database =
                manent_engine::Database::open(&url, &manent_engine::Connections::default())
                    .await
                    .ok()?;
            manent_engine::Client::new(database)
                .executor("same-id")
                .await
                .ok()
                .flatten()
                .map(|_| ())
        }
    })
    .await;
    let out = site.command(&["worker"], "same-id").output().unwrap();
    assert!(!out.status.success(), "a duplicate id must not start");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let host = hostname();
    assert!(
        stderr.contains("same-id") && stderr.contains(&format!("host `{host}`")),
        "the error names the id and host: {stderr}"
    );
}

fn hostname() -> String {
    String::from_utf8(Command::new("hostname").output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_string()
}

async fn workers_lists_each_worker_with_state_and_heartbeat(db: Db) {
    let mut site = Site::new(db, &["true"]).await;
    let token = site.token();
    site.start("api", "api-1");
    let w = site.start("worker", "w-1");
    site.start("worker", "w-2");
    site.wait_api().await;
    let workers = eventually("both workers are listed", WAIT, || async {
        let (_, v) = site.cli(&token, &["workers"]);
        (v.as_array().map_or(0, |a| a.len()) == 2).then_some(v)
    })
    .await;
    for w in workers.as_array().unwrap() {
        for field in [
            "executor_id",
            "host",
            "region",
            "state",
            "heartbeat_at",
            "running",
        ] {
            assert!(
                w.get(field).is_some(),
                "documented field {field} present in {w}"
            );
        }
        assert_eq!(w["state"], "running", "the worker is running: {w}");
    }
    signal(site.child(w), "TERM");
    site.child(w).wait().unwrap();
    let (code, workers) = site.cli(&token, &["workers"]);
    assert_eq!(code, 0, "the command succeeded");
    let w1 = workers
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["executor_id"] == "w-1")
        .unwrap()
        .clone();
    assert_eq!(
        w1["state"], "stopped",
        "a cleanly stopped worker shows as stopped"
    );
    let (code, _) = site.cli("wrong-token", &["workers"]);
    assert_eq!(code, 3, "a refused token exits 3");
    let (code, me) = site.cli(&token, &["whoami"]);
    assert_eq!(code, 0, "whoami answers: {me}");
    assert_eq!(
        (me["name"].as_str(), me["role"].as_str(), &me["scope"]),
        (Some("ci"), Some("admin"), &serde_json::Value::Null),
        "whoami names the token in use, its role and its scope (every application)"
    );
}

async fn eight_workers_started_together_on_an_empty_database_all_come_up(db: Db) {
    // The database is empty: no schema until the workers create it, all at once.
    let mut site = Site::new(db, &["true"]).await;
    let workers: Vec<usize> = (0..8)
        .map(|i| site.start("worker", &format!("manent-{i}")))
        .collect();
    let url = site.db.url.clone();
    let executors = eventually("all eight workers register", WAIT, || {
        let url = url.clone();
        async move {
            let database =
                manent_engine::Database::open(&url, &manent_engine::Connections::default())
                    .await
                    .ok()?;
            let executors = manent_engine::Client::new(database)
                .executors()
                .await
                .ok()?;
            (executors.len() == 8).then_some(executors)
        }
    })
    .await;
    assert!(
        executors
            .iter()
            .all(|e| e.state == manent_engine::ExecutorState::Running),
        "{executors:?}"
    );
    for i in workers {
        assert!(
            site.child(i).try_wait().unwrap().is_none(),
            "worker {i} is still running after the others came up"
        );
        signal(site.child(i), "TERM");
        assert!(
            site.child(i).wait().unwrap().success(),
            "worker {i} stops cleanly"
        );
    }
}

async fn waiting_for_names_the_deploy_in_the_way_and_the_worker_that_is_gone(db: Db) {
    let mut site = Site::new(db, &[]).await;
    let gate = site.dir.join("gate").display().to_string();
    let ledger = ledger_path(&site.dir);
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets: [{{name: t1, host: local}}]\ndeploy:\n  plugin: command\n  commands:\n    - {}\n",
            serde_json::to_string(&format!(
                "echo started >> {ledger}; while [ ! -f {gate} ]; do sleep 0.05; done"
            ))
            .unwrap()
        ),
    );
    site.set_config("dbos: {environment_concurrency: 1}");
    let token = site.token();
    site.start("api", "api");
    let worker = site.start("worker", "w1");
    site.wait_api().await;
    let (first, _) = site.submit(&token, "acme/web");
    eventually("the first deploy runs its command", WAIT, || async {
        site.ledger().contains("started").then_some(())
    })
    .await;
    let (second, _) = site.submit(&token, "acme/web");
    let waiting = site
        .wait_until(&token, &second, "it says which deploy is in its way", |s| {
            s["waiting_for"]
                .as_str()
                .is_some_and(|w| w.contains(&first) && w.contains("acme/web/prod"))
        })
        .await;
    assert_eq!(waiting["status"], "ENQUEUED", "{waiting}");

    signal(site.child(worker), "KILL");
    site.child(worker).wait().unwrap();
    let stuck = site
        .wait_until(
            &token,
            &first,
            "it names the gone worker and the way out",
            |s| {
                s["waiting_for"]
                    .as_str()
                    .is_some_and(|w| w.contains("manent recover --executor w1"))
            },
        )
        .await;
    assert_eq!(stuck["status"], "PENDING", "{stuck}");
    // A deployer would get 403 for `manent recover`: it is not offered the command.
    let deployer = site.token_named("dev", "deployer");
    let as_deployer = site
        .wait_until(
            &deployer,
            &first,
            "a deployer reads the gone worker too",
            |s| s["waiting_for"].as_str().is_some_and(|w| w.contains("w1")),
        )
        .await;
    let said = as_deployer["waiting_for"].as_str().unwrap_or_default();
    assert!(
        said.contains("an admin's `manent recover`") && !said.contains("--executor"),
        "a deployer is told an admin can recover, not given the command: {said}"
    );
    let orphan = site
        .wait_until(&token, &second, "it says no worker serves its queue", |s| {
            s["waiting_for"]
                .as_str()
                .is_some_and(|w| w.contains("none is running") && w.contains("w1"))
        })
        .await;
    assert_eq!(orphan["status"], "ENQUEUED", "{orphan}");
}
