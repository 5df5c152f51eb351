//! Approvals and dependency waits through real processes: a deploy waiting
//! for approval survives `kill -9` of every process and proceeds when
//! approved; rejection and expiry fail it; waiting deploys hold no deploy
//! slot; a dependency wait releases when the dependency succeeds and not
//! before; cycles are refused; a promotion waits for the same version; the
//! route recorded at submission is kept;
//! exclusive workers serve the waits too.

mod common;

use common::Site;
use manent_testkit::{Db, signal};
use serde_json::Value;

use manent_testkit::on_both_backends;

on_both_backends!(
    a_deploy_waiting_for_approval_survives_kill_9_of_every_process_and_proceeds_when_approved,
    rejection_expiry_and_self_approval_are_refused_with_reasons,
    deploys_waiting_for_approval_hold_no_deploy_slot,
    a_dependency_wait_releases_when_the_dependency_succeeds_and_not_before,
    the_route_recorded_before_an_approval_is_kept_after_a_queues_change,
    a_promotion_waits_for_the_earlier_environment_to_run_the_same_version,
    a_dry_run_waits_for_no_dependency_and_no_pause_and_says_what_a_deploy_would_wait_for,
);

/// An environment of `host: local` targets whose one command appends
/// `<application> <version>` to the site's ledger, with `extra` YAML appended.
fn ledger_environment(site: &Site, application: &str, environment: &str, extra: &str) {
    let ledger = common::ledger_path(&site.dir);
    site.write_environment(
        application,
        environment,
        &format!(
            "targets: [{{name: t1, host: local}}]\ndeploy:\n  plugin: command\n  commands:\n    - \"echo $MANENT_APPLICATION $MANENT_VERSION >> {ledger}\"\n{extra}"
        ),
    );
}

/// `manent deploy --dry-run --wait` of acme/web `version`: its exit code and final status.
fn dry_run_and_wait(site: &Site, token: &str, version: &str) -> (i32, Value) {
    let path = site.descriptor_for("acme/web", version);
    site.cli(
        token,
        &[
            "deploy",
            "-f",
            path.to_str().unwrap(),
            "--dry-run",
            "--wait",
        ],
    )
}

fn decide(site: &Site, token: &str, verb: &str, id: &str, extra: &[&str]) -> (i32, Value) {
    let mut args = vec![verb, id];
    args.extend_from_slice(extra);
    site.cli(token, &args)
}

fn approvers(status: &Value) -> Vec<String> {
    status["approvals"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            format!(
                "{} {}",
                a["decision"].as_str().unwrap(),
                a["by"].as_str().unwrap()
            )
        })
        .collect()
}

async fn wait_phase(site: &Site, token: &str, id: &str, phase: &str) -> Value {
    site.wait_until(token, id, &format!("phase {phase}"), |s| {
        s["phase"] == phase
    })
    .await
}

async fn a_deploy_waiting_for_approval_survives_kill_9_of_every_process_and_proceeds_when_approved(
    db: Db,
) {
    let mut site = Site::new(db, &["true"]).await;
    ledger_environment(
        &site,
        "acme/web",
        "prod",
        "approval: {approvers: [alice, bob], count: 2}\n",
    );
    let token = site.token();
    let alice = site.token_named("alice", "approver");
    let bob = site.token_named("bob", "approver");
    let carol = site.token_named("carol", "approver");
    let api = site.start("api", "api");
    let worker = site.start("worker", "w1");
    site.wait_api().await;

    let (id, queue) = site.submit(&token, "acme/web");
    assert_eq!(
        queue, "default",
        "the route's queue is reported, not the gate's"
    );
    let waiting = wait_phase(&site, &token, &id, "waiting_approval").await;
    assert_eq!(waiting["status"], "PENDING", "{waiting}");
    assert!(
        waiting["waiting_for"]
            .as_str()
            .is_some_and(|w| w.contains("0 of 2") && w.contains("alice, bob")),
        "status says why it waits: {waiting}"
    );

    let (code, refused) = decide(&site, &carol, "approve", &id, &[]);
    assert_eq!(
        code, 4,
        "carol is not one of the approvers: not allowed, exit 4 ({refused})"
    );
    let (code, approved) = decide(&site, &alice, "approve", &id, &["--comment", "looks good"]);
    assert_eq!(code, 0, "alice approves: {approved}");
    assert_eq!(
        approvers(&approved),
        ["approved alice"],
        "approve prints the state after the approval, not before: {approved}"
    );
    assert!(
        approved["waiting_for"]
            .as_str()
            .is_some_and(|w| w.starts_with("approval: 1 of 2")),
        "and what it still waits for counts the approval: {approved}"
    );
    let (code, again) = site.cli_stderr(&alice, &["approve", &id]);
    assert!(
        code == 2 && again.contains("alice already approved"),
        "a second approval by the same approver is refused, saying it counts once: {again}"
    );

    // Every process dies; the deploy is only in the database.
    signal(site.child(api), "KILL");
    signal(site.child(worker), "KILL");
    let _ = site.child(api).wait();
    let _ = site.child(worker).wait();
    site.start("api", "api");
    site.start("worker", "w1");
    site.wait_api().await;
    let after = wait_phase(&site, &token, &id, "waiting_approval").await;
    assert_eq!(
        approvers(&after),
        ["approved alice"],
        "the approval survives the crash: {after}"
    );
    assert!(site.ledger().is_empty(), "nothing ran before approval");

    let (code, _) = decide(&site, &alice, "approve", &id, &[]);
    assert_eq!(
        code, 2,
        "alice's approval is remembered across the crash: a second one is still refused"
    );
    let (code, approved) = decide(&site, &bob, "approve", &id, &[]);
    assert_eq!(code, 0, "bob approves: {approved}");
    assert!(
        !approved["waiting_for"]
            .as_str()
            .is_some_and(|w| w.contains("of 2")),
        "after the last approval the printout no longer says it waits for one: {approved}"
    );
    let done = site.wait_status(&token, &id, "SUCCESS").await;
    assert_eq!(
        approvers(&done),
        ["approved alice", "approved bob"],
        "who approved is shown by status: {done}"
    );
    assert_eq!(
        site.ledger(),
        "acme/web 1\n",
        "the deploy ran once, after approval"
    );
    let (_, activity) = site.cli(&token, &["activity"]);
    let entry = activity
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["id"] == id.as_str())
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        approvers(&entry),
        ["approved alice", "approved bob"],
        "and by activity: {activity}"
    );
}

async fn rejection_expiry_and_self_approval_are_refused_with_reasons(db: Db) {
    let mut site = Site::new(db, &["true"]).await;
    ledger_environment(
        &site,
        "acme/web",
        "prod",
        "approval: {approvers: [alice, bob]}\n",
    );
    ledger_environment(
        &site,
        "acme/web",
        "staging",
        "approval: {approvers: [approver], timeout: 1s}\n",
    );
    // alice may deploy and approve; the policy names her.
    let alice = site.token_named("alice", "admin");
    let bob = site.token_named("bob", "approver");
    site.start("serve", "s1");
    site.wait_api().await;

    // alice submits and may not approve her own deploy.
    let (id, _) = site.submit(&alice, "acme/web");
    wait_phase(&site, &alice, &id, "waiting_approval").await;
    let (code, refused) = decide(&site, &alice, "approve", &id, &[]);
    assert_eq!(code, 4, "self-approval is not allowed (exit 4): {refused}");
    let (code, _) = decide(&site, &bob, "reject", &id, &["--reason", "not on a Friday"]);
    assert_eq!(code, 0, "bob rejects");
    let rejected = site.wait_status(&alice, &id, "ERROR").await;
    assert!(
        rejected["error"]
            .as_str()
            .is_some_and(|e| e.contains("rejected by bob: not on a Friday")),
        "the rejection and its reason are the error: {rejected}"
    );
    assert_eq!(
        approvers(&rejected),
        ["rejected bob"],
        "bob's rejection is recorded"
    );
    let (code, late) = decide(&site, &bob, "approve", &id, &[]);
    assert_eq!(code, 2, "approving a finished deploy is a conflict: {late}");
    let (_, late) = site.cli_stderr(&bob, &["approve", &id]);
    assert!(
        late.contains("has ended (ERROR") && !late.contains("phase waiting_approval"),
        "the refusal says the deploy ended, not that it waits: {late}"
    );

    let staging = site.descriptor_for("acme/web", "2");
    let text = std::fs::read_to_string(&staging)
        .unwrap()
        .replace("environment: prod", "environment: staging");
    std::fs::write(&staging, text).unwrap();
    let (code, v) = site.cli(&alice, &["deploy", "-f", staging.to_str().unwrap()]);
    assert_eq!(code, 0, "{v}");
    let expired = site
        .wait_status(&alice, v["id"].as_str().unwrap(), "ERROR")
        .await;
    assert!(
        expired["error"]
            .as_str()
            .is_some_and(|e| e.contains("approval expired after 1s: 0 of 1")),
        "expiry fails it with a clear reason: {expired}"
    );
    assert!(site.ledger().is_empty(), "neither deploy ran");
}

async fn deploys_waiting_for_approval_hold_no_deploy_slot(db: Db) {
    let mut site = Site::new(db, &["true"]).await;
    site.set_config("dbos: {environment_concurrency: 1, concurrency: 1}\n");
    ledger_environment(&site, "acme/web", "prod", "approval: {}\n");
    let token = site.token();
    site.start("serve", "s1");
    site.wait_api().await;
    let mut waiting = Vec::new();
    for _ in 0..3 {
        let (id, _) = site.submit(&token, "acme/web");
        waiting.push(id);
    }
    for id in &waiting {
        wait_phase(&site, &token, id, "waiting_approval").await;
    }
    // A dry-run needs no approval: it takes the one slot of acme/web/prod and runs.
    let (code, done) = dry_run_and_wait(&site, &token, "9");
    assert_eq!(code, 0, "the fourth deploy runs while three wait: {done}");
    assert_eq!(done["status"], "SUCCESS", "the deploy succeeded: {done}");
    for id in &waiting {
        assert_eq!(
            site.status(&token, id)["phase"],
            "waiting_approval",
            "the others still wait"
        );
    }
    // Approved one by one, they run one at a time through the same limits.
    for id in &waiting {
        let (code, _) = decide(&site, &token, "approve", id, &[]);
        assert_eq!(
            code, 4,
            "the submitter (ci) may not approve its own deploy (exit 4)"
        );
    }
    let approver = site.token_named("alice", "approver");
    for id in &waiting {
        let (code, v) = decide(&site, &approver, "approve", id, &[]);
        assert_eq!(code, 0, "{v}");
    }
    for id in &waiting {
        site.wait_status(&token, id, "SUCCESS").await;
    }
    assert_eq!(
        site.ledger().lines().count(),
        3,
        "each approved deploy ran once"
    );
}

async fn a_dependency_wait_releases_when_the_dependency_succeeds_and_not_before(db: Db) {
    let mut site = Site::new(db, &["true"]).await;
    // acme/db waits for approval, so the test decides when the dependency succeeds.
    ledger_environment(&site, "acme/db", "prod", "approval: {approvers: [alice]}\n");
    ledger_environment(
        &site,
        "acme/api",
        "prod",
        "depends_on: [{application: acme/db, environment: prod}]\n",
    );
    // A cycle is refused at submission.
    ledger_environment(
        &site,
        "acme/a",
        "prod",
        "depends_on: [{application: acme/b, environment: prod}]\n",
    );
    ledger_environment(
        &site,
        "acme/b",
        "prod",
        "depends_on: [{application: acme/a, environment: prod}]\n",
    );
    // A dependency that never succeeds, with a timeout.
    ledger_environment(
        &site,
        "acme/late",
        "prod",
        "depends_on: [{application: acme/never, environment: prod, timeout: 1s}]\n",
    );
    let token = site.token();
    let alice = site.token_named("alice", "approver");
    site.start("serve", "s1");
    site.wait_api().await;

    let (late, _) = site.submit(&token, "acme/late");
    let expired = site.wait_status(&token, &late, "ERROR").await;
    assert!(
        expired["error"]
            .as_str()
            .is_some_and(|e| e
                .contains("dependency not met: no successful deploy of acme/never/prod within 1s")),
        "the dependency's timeout fails the deploy with a clear reason: {expired}"
    );

    let path = site.descriptor_for("acme/a", "1");
    let (code, refused) = site.cli(&token, &["deploy", "-f", path.to_str().unwrap()]);
    assert_eq!(code, 2, "a dependency cycle is refused: {refused}");
    let (code, v) = site.cli(&token, &["list", "--application", "acme/a"]);
    assert_eq!(code, 0, "the command succeeded");
    assert_eq!(v, serde_json::json!([]), "and nothing was accepted");

    let (api_deploy, _) = site.submit(&token, "acme/api");
    let waiting = wait_phase(&site, &token, &api_deploy, "waiting_dependency").await;
    assert!(
        waiting["waiting_for"]
            .as_str()
            .is_some_and(|w| w.contains("acme/db/prod")),
        "status says what it waits for: {waiting}"
    );
    let (db_deploy, _) = site.submit(&token, "acme/db");
    wait_phase(&site, &token, &db_deploy, "waiting_approval").await;
    assert_eq!(
        site.status(&token, &api_deploy)["phase"],
        "waiting_dependency",
        "no successful acme/db deploy yet: still waiting"
    );
    assert!(site.ledger().is_empty(), "nothing ran yet");
    let step_named = |status: &serde_json::Value, name: &str| -> Vec<serde_json::Value> {
        status["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["name"].as_str().is_some_and(|n| n.contains(name)))
            .cloned()
            .collect()
    };
    let waiting = site.status(&token, &api_deploy);
    let waits = step_named(&waiting, "acme/db/prod");
    assert!(
        waits.len() == 1
            && waits[0]["name"] == "wait for acme/db/prod"
            && waits[0]["status"] == "RUNNING",
        "the wait is one running step, however many checks it made: {waiting}"
    );
    let (code, v) = decide(&site, &alice, "approve", &db_deploy, &[]);
    assert_eq!(code, 0, "{v}");
    site.wait_status(&token, &db_deploy, "SUCCESS").await;
    let done = site.wait_status(&token, &api_deploy, "SUCCESS").await;
    let waits = step_named(&done, "acme/db/prod");
    assert!(
        waits.len() == 1
            && waits[0]["status"] == "SUCCESS"
            && waits[0]["finished_at"].is_string()
            && waits[0]["attempts"].as_i64().is_some_and(|n| n >= 1),
        "once met, the wait is one step that ended, its attempts the checks made: {done}"
    );
    assert_eq!(
        site.ledger(),
        "acme/db 1\nacme/api 1\n",
        "the dependent deploy ran after its dependency"
    );
}

async fn the_route_recorded_before_an_approval_is_kept_after_a_queues_change(db: Db) {
    let mut site = Site::new(db, &["true"]).await;
    let gpu = "queues:\n  - name: gpu\n    match: {applications: [\"acme/*\"]}\n";
    site.set_config(gpu);
    ledger_environment(
        &site,
        "acme/web",
        "prod",
        "approval: {approvers: [alice]}\n",
    );
    let token = site.token();
    let alice = site.token_named("alice", "approver");
    // An exclusive pool worker of gpu, started with the first configuration:
    // it also serves the waits (approvals are served by exclusive workers).
    site.start_with(
        "worker",
        "pool",
        &[
            ("MANENT__DBOS__QUEUES", "gpu"),
            ("MANENT__DBOS__EXCLUSIVE", "true"),
        ],
    );
    site.start("api", "api");
    site.wait_api().await;
    let (id, queue) = site.submit(&token, "acme/web");
    assert_eq!(queue, "gpu", "routed at submission");
    let waiting = wait_phase(&site, &token, &id, "waiting_approval").await;
    assert_eq!(
        waiting["executor_id"], "pool",
        "the exclusive worker serves the wait"
    );

    // The configuration now routes acme/* elsewhere; a worker of that queue runs.
    site.set_config("queues:\n  - name: other\n    match: {applications: [\"acme/*\"]}\n");
    site.start_with("worker", "other", &[("MANENT__DBOS__QUEUES", "other")]);
    let (code, v) = decide(&site, &alice, "approve", &id, &[]);
    assert_eq!(code, 0, "{v}");
    let done = site.wait_status(&token, &id, "SUCCESS").await;
    assert_eq!(done["queue"], "gpu", "the recorded route is kept: {done}");
    assert_eq!(done["executor_id"], "pool", "and only its pool ran it");
}

/// Submits acme/web `version` to `environment`; returns the deploy's id.
fn submit_web(site: &Site, token: &str, environment: &str, version: &str) -> String {
    let text = std::fs::read_to_string(site.descriptor(version))
        .unwrap()
        .replace("environment: prod", &format!("environment: {environment}"));
    let path = site.dir.join(format!("web-{environment}-{version}.yml"));
    std::fs::write(&path, text).unwrap();
    let (code, v) = site.cli(token, &["deploy", "-f", path.to_str().unwrap()]);
    assert_eq!(code, 0, "submission of {environment} {version}: {v}");
    v["id"].as_str().unwrap().to_string()
}

async fn a_promotion_waits_for_the_earlier_environment_to_run_the_same_version(db: Db) {
    let mut site = Site::new(db, &["true"]).await;
    ledger_environment(&site, "acme/web", "staging", "");
    ledger_environment(
        &site,
        "acme/web",
        "prod",
        "depends_on: [{application: acme/web, environment: staging}]\n",
    );
    let token = site.token();
    site.start("serve", "s1");
    site.wait_api().await;

    let staging_1_0 = submit_web(&site, &token, "staging", "1.0");
    site.wait_status(&token, &staging_1_0, "SUCCESS").await;
    // staging runs 1.0: prod's 1.1 must not take that for staging's 1.1.
    let prod_1_1 = submit_web(&site, &token, "prod", "1.1");
    let waiting = wait_phase(&site, &token, &prod_1_1, "waiting_dependency").await;
    assert!(
        waiting["waiting_for"]
            .as_str()
            .is_some_and(|w| w.contains("acme/web/staging")),
        "prod 1.1 waits for staging: {waiting}"
    );
    assert!(
        !site.ledger().contains("acme/web 1.1"),
        "nothing of 1.1 ran before staging ran it"
    );
    let staging_1_1 = submit_web(&site, &token, "staging", "1.1");
    site.wait_status(&token, &staging_1_1, "SUCCESS").await;
    site.wait_status(&token, &prod_1_1, "SUCCESS").await;
    let ledger = site.ledger();
    let order: Vec<&str> = ledger.lines().collect();
    assert_eq!(
        order,
        ["acme/web 1.0", "acme/web 1.1", "acme/web 1.1"],
        "staging 1.0, then staging 1.1, then prod 1.1"
    );
}

async fn a_dry_run_waits_for_no_dependency_and_no_pause_and_says_what_a_deploy_would_wait_for(
    db: Db,
) {
    let mut site = Site::new(db, &["true"]).await;
    // A dependency nothing will meet, and an hour's pause between two waves.
    site.write_environment(
        "acme/web",
        "prod",
        "targets: [{name: t1, host: local}, {name: t2, host: local}]\n\
         deploy:\n  plugin: command\n  commands: [\"true\"]\n\
         rollout: {waves: [[t1], [t2]], pause: 1h}\n\
         depends_on:\n  - {application: acme/db, environment: prod, version: \"7\", timeout: 30m}\n",
    );
    let token = site.token();
    site.start("serve", "s1");
    site.wait_api().await;
    let (code, done) = dry_run_and_wait(&site, &token, "1");
    assert_eq!(code, 0, "the dry run ends without waiting: {done}");
    assert_eq!(done["status"], "SUCCESS", "{done}");
    let steps: Vec<(String, Value)> = done["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or_default().to_string(),
                s.clone(),
            )
        })
        .collect();
    // The steps' results, as `manent logs` shows them.
    let out = std::process::Command::new(common::cli_binary())
        .args(["--server", &format!("http://127.0.0.1:{}", site.port)])
        .args(["--token", &token, "logs", done["id"].as_str().unwrap()])
        .output()
        .expect("run manent logs");
    let logs = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        steps
            .iter()
            .any(|(name, _)| name == "dry run: dependency acme/db/prod at version 7")
            && logs.contains(
                "dependency acme/db/prod at version 7: not met: a deploy would wait up to 30m"
            ),
        "the dependency is reported, not waited for: {steps:?}\n{logs}"
    );
    assert!(
        steps
            .iter()
            .any(|(name, _)| name == "dry run: pause before wave 2")
            && logs.contains("a deploy would pause 1h before wave 2"),
        "the pause is reported, not waited for: {steps:?}\n{logs}"
    );
}
