//! Queue routing through real worker processes: routed queues served only by
//! their pool, exclusive workers, region passes on their region's workers,
//! routes kept through config changes, and the startup refusals.

mod common;

use common::{Site, WAIT};
use manent_testkit::{Db, eventually};

use manent_testkit::on_both_backends;

on_both_backends!(
    a_routed_deploy_waits_for_its_pool_and_plain_workers_never_take_it,
    an_exclusive_worker_takes_only_its_queues,
    region_passes_run_only_on_their_regions_workers,
    a_cancelled_region_routed_deploy_ships_nothing_to_a_region_whose_worker_comes_later,
    environment_concurrency_serializes_one_environment_while_others_run,
    global_and_per_worker_concurrency_are_never_exceeded,
);

const GPU: &str =
    "queues:\n  - name: gpu\n    match: {applications: [\"ml/*\"]}\n    concurrency: 2\n";

async fn a_routed_deploy_waits_for_its_pool_and_plain_workers_never_take_it(db: Db) {
    let mut site = Site::new(db, &["true"]).await;
    site.set_config(GPU);
    site.write_environment(
        "ml/trainer",
        "prod",
        "targets: [{name: t1, host: local}]\ndeploy: {plugin: command, commands: [\"true\"]}\n",
    );
    let token = site.token();
    site.start("api", "api");
    site.start("worker", "plain");
    site.wait_api().await;
    let (routed, queue) = site.submit(&token, "ml/trainer");
    assert_eq!(queue, "gpu", "ml/* is routed to gpu");
    // A deploy on the default queue completing proves the plain worker is up and claiming.
    let (plain, queue) = site.submit(&token, "acme/web");
    assert_eq!(
        queue, "default",
        "a deploy no rule routes goes to the default queue"
    );
    site.wait_status(&token, &plain, "SUCCESS").await;
    assert_eq!(
        site.status(&token, &routed)["status"],
        "ENQUEUED",
        "no pool worker: the routed deploy waits"
    );
    let (_, queues) = site.cli(&token, &["queues"]);
    let gpu = queues
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "gpu")
        .cloned()
        .unwrap();
    assert_eq!(
        (gpu["kind"].as_str(), gpu["enqueued"].as_i64()),
        (Some("routed"), Some(1)),
        "{gpu}"
    );
    assert_eq!(
        gpu["workers"],
        serde_json::json!([]),
        "shown while no worker serves it"
    );

    // The route was recorded: a config change after submission does not move it.
    site.set_config("");
    site.start_with(
        "worker",
        "pool",
        &[
            (
                "MANENT__QUEUES",
                "[{\"name\":\"gpu\",\"match\":{\"applications\":[\"ml/*\"]}}]",
            ),
            ("MANENT__DBOS__QUEUES", "gpu"),
        ],
    );
    let done = site.wait_status(&token, &routed, "SUCCESS").await;
    assert_eq!(done["executor_id"], "pool", "only the pool worker ran it");
    assert_eq!(done["queue"], "gpu", "the recorded route is kept");
}

async fn an_exclusive_worker_takes_only_its_queues(db: Db) {
    let mut site = Site::new(db, &["true"]).await;
    site.set_config(&format!("{GPU}dbos: {{queues: [gpu], exclusive: true}}\n"));
    site.write_environment(
        "ml/trainer",
        "prod",
        "targets: [{name: t1, host: local}]\ndeploy: {plugin: command, commands: [\"true\"]}\n",
    );
    let token = site.token();
    site.start("api", "api");
    site.start("worker", "exclusive");
    site.wait_api().await;
    let (plain, _) = site.submit(&token, "acme/web");
    let (routed, _) = site.submit(&token, "ml/trainer");
    site.wait_status(&token, &routed, "SUCCESS").await;
    assert_eq!(
        site.status(&token, &plain)["status"],
        "ENQUEUED",
        "an exclusive worker leaves the default queue alone"
    );
}

async fn region_passes_run_only_on_their_regions_workers(db: Db) {
    let mut site = Site::new(db, &[]).await;
    site.set_config("dbos: {region_routing: true}\n");
    let ledger = common::ledger_path(&site.dir);
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets:\n  - {{name: eu-1, host: local, region: eu}}\n  - {{name: us-1, host: local, region: us}}\n\
             deploy: {{plugin: command, commands: [\"echo $MANENT_TARGET >> {ledger}; echo printed-by-$MANENT_TARGET\"]}}\nrollout: {{waves: by_region}}\n"
        ),
    );
    let token = site.token();
    site.start_api_and_region_workers().await;
    let (id, _) = site.submit(&token, "acme/web");
    let status = site.wait_status(&token, &id, "SUCCESS").await;
    let passes: Vec<(String, String, String)> = status["passes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["region"].as_str().unwrap_or_default().to_string(),
                p["executor_id"].as_str().unwrap_or_default().to_string(),
                p["status"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        passes,
        [("eu", "worker-eu"), ("us", "worker-us")].map(|(r, w)| (
            r.to_string(),
            w.to_string(),
            "SUCCESS".to_string()
        )),
        "status lists each region's pass, its worker and outcome, in the order they started: {status}"
    );
    assert_eq!(
        status["waves"],
        serde_json::json!([{"name": "eu", "targets": ["eu-1"]}, {"name": "us", "targets": ["us-1"]}]),
        "status lists the rollout's waves: {status}"
    );
    for (step, worker) in [
        ("eu-1: command 1", "worker-eu"),
        ("us-1: command 1", "worker-us"),
    ] {
        assert!(
            status["steps"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["name"] == step
                    && s["executor_id"] == worker
                    && s["status"] == "SUCCESS"),
            "the pass's step {step:?} is among the deploy's steps, run by {worker}: {status}"
        );
    }
    let (_, logs) = site.cli(&token, &["logs", &id]);
    let text = logs["lines"].to_string();
    for target in ["eu-1", "us-1"] {
        assert!(
            text.contains(&format!("{target}: command 1 | printed-by-{target}")),
            "what the {target} pass's command printed is in the deploy's logs: {text}"
        );
    }
    let client = manent_engine::Client::new(
        manent_engine::Database::open(&site.db.url, &manent_engine::Connections::default())
            .await
            .unwrap(),
    );
    let passes = client
        .list(&manent_engine::WorkflowFilter {
            parent_id: Some(id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut seen: Vec<(String, String)> = passes
        .iter()
        .map(|p| (p.queue.clone(), p.executor_id.clone().unwrap_or_default()))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("default.eu".into(), "worker-eu".into()),
            ("default.us".into(), "worker-us".into())
        ],
        "each region's pass ran from its region's queue, on its region's worker"
    );
    let text = site.ledger();
    assert_eq!(
        (text.matches("eu-1").count(), text.matches("us-1").count()),
        (1, 1),
        "each target deployed once: {text}"
    );
}

#[test]
fn startup_refusals_stop_the_worker_with_their_message() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "plugins:\n  ansible: {artifact_types: [ansible], queue: ansible}\ndbos: {region_routing: true, plugins: [ansible]}\n",
            "not supported together",
        ),
        (
            &format!("{GPU}dbos: {{region_routing: true}}\n") as &str,
            "not supported together",
        ),
        (
            &format!("{GPU}tenants: [{{name: ml, queue: gpu}}]\n") as &str,
            "tenant",
        ),
        (
            "plugins:\n  a: {artifact_types: [x], queue: qa}\n  b: {artifact_types: [x], queue: qb}\n",
            "x",
        ),
        ("tenants: [{name: ml, queue: default}]\n", "default queue"),
        (
            "queues: [{name: manent.gate, match: {applications: [\"ml/*\"]}}]\n",
            "manent.gate",
        ),
    ];
    for (i, (yaml, needle)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad-{i}.yml"));
        std::fs::write(
            &path,
            format!(
                "database: {{url: \"sqlite://{}/m.db\"}}\n{yaml}",
                dir.path().display()
            ),
        )
        .unwrap();
        let out = std::process::Command::new(common::SERVER)
            .arg("-c")
            .arg(&path)
            .arg("worker")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "case {i} must refuse to start:\n{yaml}"
        );
        assert!(
            stderr.contains(needle),
            "case {i}: the message says why ({needle}): {stderr}"
        );
    }
}

#[test]
fn a_queue_name_clash_stops_workers_only_while_check_config_and_admin_report_it_and_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clash.yml");
    std::fs::write(
        &path,
        format!(
            "database: {{url: \"sqlite://{}/m.db\"}}\n{GPU}tenants: [{{name: ml, queue: gpu}}]\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(common::SERVER)
            .arg("-c")
            .arg(&path)
            .args(args)
            .output()
            .unwrap()
    };
    let check = run(&["admin", "check-config"]);
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "check-config goes on past a queue-name clash: {stdout}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        stdout.contains("workers will refuse to start") && stdout.contains("gpu"),
        "check-config reports the clash: {stdout}"
    );
    let migrate = run(&["admin", "migrate"]);
    assert!(
        migrate.status.success(),
        "admin goes on past a queue-name clash: {}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    let worker = run(&["worker"]);
    let stderr = String::from_utf8_lossy(&worker.stderr);
    assert!(
        !worker.status.success() && stderr.contains("tenant registry"),
        "the worker refuses to start, naming the clash: {stderr}"
    );
}

async fn environment_concurrency_serializes_one_environment_while_others_run(db: Db) {
    let mut site = Site::new(db, &[]).await;
    let ledger = common::ledger_path(&site.dir);
    let gate = site.dir.join("other-started").display().to_string();
    // acme/web waits until a deploy of another application has started: that
    // can only happen if the other one runs while acme/web holds its slot.
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets: [{{name: t1, host: local}}]\ndeploy: {{plugin: command, commands: [{}]}}\n",
            serde_json::to_string(&format!(
                "echo start $MANENT_DEPLOY_ID >> {ledger}; while [ ! -f {gate} ]; do sleep 0.05; done; echo end $MANENT_DEPLOY_ID >> {ledger}"
            ))
            .unwrap()
        ),
    );
    site.write_environment(
        "acme/other",
        "prod",
        &format!("targets: [{{name: t1, host: local}}]\ndeploy: {{plugin: command, commands: [\"touch {gate}\"]}}\n"),
    );
    let token = site.token();
    site.start("api", "api");
    site.start("worker", "w1");
    site.start("worker", "w2");
    site.wait_api().await;
    let (first, _) = site.submit(&token, "acme/web");
    eventually("the first acme/web deploy started", WAIT, || async {
        site.ledger().contains(&first).then_some(())
    })
    .await;
    let (second, _) = site.submit(&token, "acme/web");
    let (other, _) = site.submit(&token, "acme/other");
    for id in [&first, &second, &other] {
        site.wait_status(&token, id, "SUCCESS").await;
    }
    let text = site.ledger();
    let lines: Vec<&str> = text.lines().collect();
    let at = |l: String| {
        lines
            .iter()
            .position(|x| *x == l)
            .unwrap_or_else(|| panic!("{l} missing: {lines:?}"))
    };
    assert!(
        at(format!("end {first}")) < at(format!("start {second}")),
        "environment_concurrency 1: the second deploy of acme/web/prod starts after the first ends: {lines:?}"
    );
}

/// The most deploys running at once in `lines` of `start|end <worker> <deploy>`,
/// overall and on any one worker.
fn max_running(lines: &[&str]) -> (usize, usize) {
    let mut running: std::collections::HashMap<&str, usize> = Default::default();
    let (mut overall, mut per_worker) = (0, 0);
    for line in lines {
        let mut fields = line.split(' ');
        let (Some(edge), Some(worker)) = (fields.next(), fields.next()) else {
            panic!("ledger line {line:?}");
        };
        let n = running.entry(worker).or_default();
        match edge {
            "start" => *n += 1,
            "end" => *n -= 1,
            _ => panic!("ledger line {line:?}"),
        }
        per_worker = per_worker.max(*n);
        overall = overall.max(running.values().sum());
    }
    (overall, per_worker)
}

#[test]
fn max_running_counts_overlaps_overall_and_per_worker() {
    let lines = [
        "start w1 a",
        "start w1 b",
        "start w2 c",
        "end w1 a",
        "start w2 d",
        "end w2 c",
        "end w1 b",
        "end w2 d",
    ];
    assert_eq!(
        max_running(&lines),
        (3, 2),
        "three at once; two on w1, then two on w2"
    );
}

async fn global_and_per_worker_concurrency_are_never_exceeded(db: Db) {
    let mut site = Site::new(db, &[]).await;
    // Per worker 2, overall 3, with 3 workers (6 slots without the global limit)
    // and every deploy in a partition of its own.
    site.set_config("dbos: {concurrency: 2, global_concurrency: 3}\n");
    let ledger = common::ledger_path(&site.dir);
    // Each deploy records when it starts and ends, and on which worker ($DBOS__VMID
    // of the worker process it runs in, passed through by `inherit_env`); it lasts long
    // enough to overlap others.
    let command = serde_json::to_string(&format!(
        "echo start $DBOS__VMID $MANENT_DEPLOY_ID >> {ledger}; sleep 0.3; echo end $DBOS__VMID $MANENT_DEPLOY_ID >> {ledger}"
    ))
    .unwrap();
    let applications: Vec<String> = (0..12).map(|i| format!("acme/app{i}")).collect();
    for application in &applications {
        site.write_environment(
            application,
            "prod",
            &format!("targets: [{{name: t1, host: local}}]\ndeploy: {{plugin: command, commands: [{command}]}}\ninherit_env: [DBOS__VMID]\n"),
        );
    }
    let token = site.token();
    site.start("api", "api");
    for worker in ["w1", "w2", "w3"] {
        site.start("worker", worker);
    }
    site.wait_api().await;
    let ids: Vec<String> = applications
        .iter()
        .map(|a| site.submit(&token, a).0)
        .collect();
    for id in &ids {
        site.wait_status(&token, id, "SUCCESS").await;
    }
    let text = site.ledger();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        24,
        "every deploy started and ended once: {lines:?}"
    );
    assert!(
        lines
            .iter()
            .all(|l| ["w1", "w2", "w3"].contains(&l.split(' ').nth(1).unwrap_or(""))),
        "each line names the worker that ran it: {lines:?}"
    );
    let (overall, per_worker) = max_running(&lines);
    assert!(
        overall <= 3,
        "global_concurrency 3 is never exceeded: {overall} at once: {lines:?}"
    );
    assert!(
        per_worker <= 2,
        "concurrency 2 per worker is never exceeded: {per_worker}: {lines:?}"
    );
}

async fn a_cancelled_region_routed_deploy_ships_nothing_to_a_region_whose_worker_comes_later(
    db: Db,
) {
    let mut site = Site::new(db, &[]).await;
    site.set_config("dbos: {region_routing: true}\n");
    let ledger = common::ledger_path(&site.dir);
    let gate = site.dir.join("gate").display().to_string();
    let command = format!(
        "echo \"start $MANENT_TARGET $$\" >> {ledger}; while [ ! -f {gate} ]; do sleep 0.05; done; \
         echo \"done $MANENT_TARGET\" >> {ledger}"
    );
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets:\n  - {{name: eu-1, host: local, region: eu}}\n  - {{name: ap-1, host: local, region: ap}}\n\
             deploy: {{plugin: command, commands: [{}]}}\nrollout: {{waves: all}}\n",
            serde_json::to_string(&command).unwrap()
        ),
    );
    let token = site.token();
    site.start("api", "api");
    site.start_with("worker", "worker-eu", &[("MANENT__DBOS__REGION", "eu")]);
    site.wait_api().await;
    let (id, _) = site.submit(&token, "acme/web");
    // eu's pass runs; ap's waits on `default.ap`, which no worker serves yet.
    let eu_pid: i32 = eventually("eu's command runs", WAIT, || async {
        site.ledger()
            .lines()
            .find_map(|l| l.strip_prefix("start eu-1 ")?.parse().ok())
    })
    .await;
    let client = manent_engine::Client::new(
        manent_engine::Database::open(&site.db.url, &manent_engine::Connections::default())
            .await
            .unwrap(),
    );
    let passes = || async {
        client
            .list(&manent_engine::WorkflowFilter {
                parent_id: Some(id.clone()),
                ..Default::default()
            })
            .await
            .unwrap()
    };
    eventually("ap's pass is enqueued", WAIT, || async {
        passes()
            .await
            .iter()
            .any(|p| p.queue == "default.ap")
            .then_some(())
    })
    .await;

    let (code, out) = site.cli(&token, &["cancel", &id]);
    assert_eq!(code, 0, "cancel is accepted: {out}");
    site.wait_status(&token, &id, "CANCELLED").await;
    eventually("eu's command is killed", WAIT, || async {
        manent_testkit::process_gone(eu_pid).then_some(())
    })
    .await;
    for pass in passes().await {
        assert_eq!(
            pass.status,
            manent_engine::WorkflowStatus::Cancelled,
            "every region pass is cancelled with its deploy, ap's before any worker took it: {}",
            pass.queue
        );
    }

    // ap's worker comes up later: there is nothing left for it to take.
    site.start_with("worker", "worker-ap", &[("MANENT__DBOS__REGION", "ap")]);
    eventually("ap's worker is up", WAIT, || async {
        client
            .executor("worker-ap")
            .await
            .ok()
            .flatten()
            .map(|_| ())
    })
    .await;
    std::fs::write(&gate, "").unwrap();
    let text = site.ledger();
    assert!(
        !text.contains("ap-1") && !text.contains("done eu-1"),
        "nothing shipped to ap, and eu's command never finished: {text}"
    );
    let status = site.status(&token, &id);
    assert!(
        status["targets"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["status"] == "cancelled"),
        "both targets are recorded as cancelled: {status}"
    );
}
