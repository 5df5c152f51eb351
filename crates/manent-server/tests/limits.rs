//! The deploy limits as the configuration states them, through real worker
//! processes: `dbos.concurrency` per worker over every queue it serves,
//! `dbos.global_concurrency` over all queues and workers,
//! `environment_concurrency` per `<application>/<environment>` over all
//! queues, and a routed queue's own `concurrency` on top; with a default, a
//! tenant and a routed queue and two workers, proven on a ledger of start/end
//! lines the deploys' commands write.

mod common;

use std::collections::HashMap;

use common::{Site, WAIT};
use manent_testkit::{Db, eventually};
use serde_json::Value;

use manent_testkit::on_both_backends;

on_both_backends!(limits_count_over_every_queue_and_are_reached_but_never_exceeded);

const CONFIG: &str = "dbos: {concurrency: 3, global_concurrency: 5, queues: [gpu]}
tenants:
  - {name: ten, queue: ten-queue}
queues:
  - name: gpu
    match: {artifacts: [model]}
    concurrency: 2
";

/// Submits version 1 of `application` in prod with one artifact named `artifact`
/// (`model` routes it to `gpu`); returns its id and queue.
fn submit(
    site: &Site,
    token: &str,
    application: &str,
    artifact: &str,
    n: usize,
) -> (String, String) {
    let sha = "239f59ed55e737c77147cf55ad0c1b030b6d7ee748a7426952f9b852d5a935e5"; // sha256("payload")
    let path = site.dir.join(format!(
        "deploy-{}-{artifact}-{n}.yml",
        application.replace('/', "-")
    ));
    std::fs::write(
        &path,
        format!(
            "application: {application}\nenvironment: prod\nartifacts:\n  - {{name: {artifact}, type: file, \
             version: \"1\", url: \"file://{}\", sha256: \"{sha}\"}}\n",
            site.dir.join("artifact.txt").display()
        ),
    )
    .unwrap();
    let (code, v) = site.cli(token, &["deploy", "-f", path.to_str().unwrap()]);
    assert_eq!(code, 0, "submission of {application}: {v}");
    (
        v["id"].as_str().unwrap().to_string(),
        v["queue"].as_str().unwrap().to_string(),
    )
}

/// One ledger line: `start|end <worker> <application>/<environment> <deploy id>`.
struct Edge<'a> {
    start: bool,
    worker: &'a str,
    environment: &'a str,
    deploy: &'a str,
}

fn edges(text: &str) -> Vec<Edge<'_>> {
    text.lines()
        .map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            assert_eq!(f.len(), 4, "ledger line {line:?}");
            Edge {
                start: match f[0] {
                    "start" => true,
                    "end" => false,
                    other => panic!("ledger line {line:?}: {other}"),
                },
                worker: f[1],
                environment: f[2],
                deploy: f[3],
            }
        })
        .collect()
}

/// The most deploys running at once under any one key (`key` of an edge;
/// `None` leaves the edge out), replaying the ledger in order.
fn peak(edges: &[Edge<'_>], key: impl Fn(&Edge<'_>) -> Option<String>) -> usize {
    let mut running: HashMap<String, usize> = HashMap::new();
    let mut peak = 0;
    for e in edges {
        let Some(k) = key(e) else { continue };
        let n = running.entry(k).or_default();
        if e.start {
            *n += 1;
            peak = peak.max(*n);
        } else {
            *n -= 1;
        }
    }
    peak
}

fn started(site: &Site) -> usize {
    edges(&site.ledger()).iter().filter(|e| e.start).count()
}

#[test]
fn peak_counts_overlaps_per_key() {
    let ledger = "start w1 a/prod 1\nstart w2 b/prod 2\nend w1 a/prod 1\nstart w1 a/prod 3\nstart w1 c/prod 4\nend w2 b/prod 2\nend w1 a/prod 3\nend w1 c/prod 4\n";
    let e = edges(ledger);
    assert_eq!(peak(&e, |_| Some(String::new())), 3, "2, 3 and 4 overlap");
    assert_eq!(peak(&e, |e| Some(e.worker.into())), 2, "3 and 4 on w1");
    assert_eq!(
        peak(&e, |e| Some(e.environment.into())),
        1,
        "a/prod's two deploys do not overlap"
    );
}

async fn limits_count_over_every_queue_and_are_reached_but_never_exceeded(db: Db) {
    let mut site = Site::new(db, &[]).await;
    site.set_config(CONFIG);
    let ledger = common::ledger_path(&site.dir);
    // Each deploy writes its start, then holds its slot until the test
    // releases its phase, then writes its end: the test decides when slots
    // free up, so each limit is reached for certain.
    let environment = |phase: &str| {
        let release = site
            .dir
            .join(format!("release-{phase}"))
            .display()
            .to_string();
        let command = serde_json::to_string(&format!(
            "echo start $DBOS__VMID $MANENT_APPLICATION/$MANENT_ENVIRONMENT $MANENT_DEPLOY_ID >> {ledger}; \
             while [ ! -f {release} ]; do sleep 0.05; done; \
             echo end $DBOS__VMID $MANENT_APPLICATION/$MANENT_ENVIRONMENT $MANENT_DEPLOY_ID >> {ledger}"
        ))
        .unwrap();
        format!(
            "targets: [{{name: t1, host: local}}]\ndeploy: {{plugin: command, commands: [{command}]}}\n\
             inherit_env: [DBOS__VMID]\n"
        )
    };
    let phase1: Vec<String> = (0..5)
        .map(|i| format!("acme/a{i}"))
        .chain((0..3).map(|i| format!("ten/b{i}")))
        .collect();
    let phase2: Vec<String> = (0..4).map(|i| format!("acme/g{i}")).collect();
    for application in &phase1 {
        site.write_environment(application, "prod", &environment("1"));
    }
    for application in phase2.iter().chain([&"acme/shared".to_string()]) {
        site.write_environment(application, "prod", &environment("2"));
    }
    let token = site.token();
    site.start("api", "api");
    site.wait_api().await;
    let mut queue_of: HashMap<String, String> = HashMap::new();

    // Phase 1: 8 deploys on the default and the tenant queue, each of its own
    // environment; one worker takes its 3, the second only 2 more (5 in all).
    for application in &phase1 {
        let (id, queue) = submit(&site, &token, application, "artifact.txt", 1);
        queue_of.insert(id, queue);
    }
    assert!(
        queue_of.values().any(|q| q == "default") && queue_of.values().any(|q| q == "ten-queue"),
        "phase 1 uses the default and the tenant queue: {queue_of:?}"
    );
    site.start("worker", "w1");
    eventually("w1 runs 3 deploys", WAIT, || async {
        (started(&site) >= 3).then_some(())
    })
    .await;
    site.start("worker", "w2");
    eventually("5 deploys run", WAIT, || async {
        (started(&site) >= 5).then_some(())
    })
    .await;
    queues_show_the_limits_and_their_use(&site, &token);
    std::fs::write(site.dir.join("release-1"), "").unwrap();

    // Phase 2: the routed queue (2 at most) and one environment, acme/shared/prod,
    // submitted to the routed queue (artifact `model`) and to the default queue.
    let (shared_gpu, queue) = submit(&site, &token, "acme/shared", "model", 1);
    assert_eq!(queue, "gpu", "the model artifact routes to gpu");
    queue_of.insert(shared_gpu.clone(), queue);
    for application in &phase2 {
        let (id, queue) = submit(&site, &token, application, "model", 1);
        queue_of.insert(id, queue);
    }
    let (shared_default, queue) = submit(&site, &token, "acme/shared", "artifact.txt", 2);
    assert_eq!(
        queue, "default",
        "without the model artifact: the default queue"
    );
    queue_of.insert(shared_default.clone(), queue);
    eventually("2 deploys of gpu run", WAIT, || async {
        let text = site.ledger();
        let gpu = peak(&edges(&text), |e| {
            (queue_of.get(e.deploy).map(String::as_str) == Some("gpu")).then(String::new)
        });
        (gpu == 2).then_some(())
    })
    .await;
    std::fs::write(site.dir.join("release-2"), "").unwrap();
    for id in queue_of.keys() {
        site.wait_status(&token, id, "SUCCESS").await;
    }

    let text = site.ledger();
    let e = edges(&text);
    assert_eq!(
        e.len(),
        2 * queue_of.len(),
        "every deploy started and ended once: {text}"
    );
    let per_worker = peak(&e, |e| Some(e.worker.to_string()));
    let global = peak(&e, |_| Some(String::new()));
    let per_environment = peak(&e, |e| Some(e.environment.to_string()));
    let gpu = peak(&e, |e| {
        (queue_of.get(e.deploy).map(String::as_str) == Some("gpu")).then(String::new)
    });
    assert_eq!(
        per_worker, 3,
        "dbos.concurrency 3 per worker over all its queues: reached, never exceeded:\n{text}"
    );
    assert_eq!(
        global, 5,
        "dbos.global_concurrency 5 over all queues and workers: reached, never exceeded:\n{text}"
    );
    assert_eq!(
        per_environment, 1,
        "environment_concurrency 1 over all queues: never two deploys of one environment:\n{text}"
    );
    assert_eq!(
        gpu, 2,
        "gpu's own concurrency 2 on top of the deploy limits: reached, never exceeded:\n{text}"
    );
    let shared: Vec<&Edge<'_>> = e
        .iter()
        .filter(|e| e.environment == "acme/shared/prod" && e.start)
        .collect();
    assert_eq!(
        shared.len(),
        2,
        "acme/shared/prod ran once on gpu and once on default, one after the other:\n{text}"
    );
}

/// `manent queues` while phase 1 holds its 5 slots: the global limit and its use over all
/// deploy queues, the per-worker limit and w1's use, and no internal queue.
fn queues_show_the_limits_and_their_use(site: &Site, token: &str) {
    let (_, queues) = site.cli(token, &["queues"]);
    let queues = queues.as_array().cloned().unwrap_or_default();
    assert!(
        queues.iter().all(|q| q["name"] != "manent.gate"),
        "the gate queue is internal and never shown: {queues:?}"
    );
    let default = queues.iter().find(|q| q["name"] == "default").unwrap();
    let use_of = |q: &Value, key: &str| {
        q["limits"]
            .as_array()
            .and_then(|l| l.iter().find(|l| l["key"] == key))
            .cloned()
            .unwrap_or_else(|| panic!("{key} missing from {q}"))
    };
    let global = use_of(default, "dbos.global_concurrency");
    assert_eq!(
        (global["limit"].as_i64(), global["in_use"].as_i64()),
        (Some(5), Some(5)),
        "manent queues shows the global limit and its use over all deploy queues: {global}"
    );
    let per_worker = use_of(default, "dbos.concurrency");
    assert_eq!(
        (
            per_worker["limit"].as_i64(),
            per_worker["by"]["w1"].as_i64()
        ),
        (Some(3), Some(3)),
        "manent queues shows the per-worker limit and w1's use: {per_worker}"
    );
}
