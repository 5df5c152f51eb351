//! A rolling upgrade from the release `deploy/upgrade-from` names to this build, on
//! PostgreSQL, with deploys in every state: the old API and two old workers run deploys
//! (one mid-command, one queued behind it, one waiting for approval, one paused between
//! waves, one scheduled); the workers are replaced one at a time by this build as a
//! StatefulSet rolls them (SIGTERM, a short drain, the same executor id back), then the API.
//! Every deploy ends SUCCESS and no finished step runs again (a ledger every command appends
//! to). docs/upgrading.md.
//!
//! The old release is built once by `scripts/upgrade-from` (`./scripts/test` runs it and
//! passes its directory in `MANENT_TEST_UPGRADE_FROM`).

mod common;

use std::path::PathBuf;

use common::{Site, WAIT};
use manent_testkit::{Db, eventually, signal, wait_exit};
use serde_json::Value;

/// The old release's `manent-server`.
fn old_server() -> PathBuf {
    let dir = std::env::var("MANENT_TEST_UPGRADE_FROM").unwrap_or_else(|_| {
        panic!(
            "MANENT_TEST_UPGRADE_FROM is not set: run `./scripts/upgrade-from` (it builds the \
             release deploy/upgrade-from names, once) and set it to the directory it prints; \
             ./scripts/test does"
        )
    });
    let path = PathBuf::from(dir).join("manent-server");
    assert!(
        path.exists(),
        "no manent-server in MANENT_TEST_UPGRADE_FROM ({}): run ./scripts/upgrade-from",
        path.display()
    );
    path
}

/// An environment of `targets` (`host: local`) whose one command appends `begin` and `end`
/// lines naming the application and target to the ledger, the `end` only once `gate` exists
/// when `gated`; `extra` YAML is appended.
fn ledger_environment(site: &Site, application: &str, targets: &[&str], gated: bool, extra: &str) {
    let ledger = common::ledger_path(&site.dir);
    let gate = site.dir.join("gate").display().to_string();
    let wait = if gated {
        format!("while [ ! -f {gate} ]; do sleep 0.1; done; ")
    } else {
        String::new()
    };
    let command = format!(
        "echo \"begin $MANENT_APPLICATION $MANENT_TARGET\" >> {ledger}; {wait}\
         echo \"end $MANENT_APPLICATION $MANENT_TARGET\" >> {ledger}"
    );
    let targets: Vec<String> = targets
        .iter()
        .map(|t| format!("{{name: {t}, host: local}}"))
        .collect();
    site.write_environment(
        application,
        "prod",
        &format!(
            "targets: [{}]\ndeploy:\n  plugin: command\n  commands:\n    - {}\n{extra}",
            targets.join(", "),
            serde_json::to_string(&command).unwrap()
        ),
    );
}

/// Submits `application` version `version` with `extra` descriptor YAML; returns its id.
fn submit(site: &Site, token: &str, application: &str, version: &str, extra: &str) -> String {
    let path = site.descriptor_for(application, version);
    let text = std::fs::read_to_string(&path).unwrap() + extra;
    std::fs::write(&path, text).unwrap();
    let (code, v) = site.cli(token, &["deploy", "-f", path.to_str().unwrap()]);
    assert_eq!(code, 0, "submission of {application} {version}: {v}");
    v["id"].as_str().unwrap().to_string()
}

async fn wait_phase(site: &Site, token: &str, id: &str, phase: &str) -> Value {
    site.wait_until(token, id, &format!("reaches phase {phase}"), |s| {
        s["phase"] == phase
    })
    .await
}

fn count(ledger: &str, line: &str) -> usize {
    ledger.lines().filter(|l| *l == line).count()
}

/// SIGTERMs the process at `index` (a StatefulSet's rolling update), waits for it to drain
/// and exit, and starts this build's `role` under the same executor id in its place.
async fn roll(site: &mut Site, index: usize, role: &str, executor: &str) -> usize {
    signal(&site.children.0[index], "TERM");
    wait_exit(site.child(index), WAIT).await;
    site.start(role, executor)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_with_deploys_in_every_state_strands_nothing_and_reruns_no_finished_step()
{
    manent_testkit::init_tracing();
    let old = old_server();
    let mut site = Site::new(Db::Postgres, &["true"]).await;
    // A short drain, as the chart's terminationGracePeriodSeconds would allow.
    site.set_config("dbos: {drain_timeout: 2s}\n");
    ledger_environment(&site, "acme/cmd", &["t1"], true, "");
    ledger_environment(
        &site,
        "acme/approved",
        &["t1"],
        false,
        "approval: {approvers: [approver], count: 1}\n",
    );
    ledger_environment(
        &site,
        "acme/waves",
        &["t1", "t2"],
        false,
        "rollout: {waves: [[t1], [t2]], pause: 25s}\n",
    );
    ledger_environment(&site, "acme/sched", &["t1"], false, "");

    // The old release creates the tokens, as its installation did.
    let token = site.token_made_by(&old, "ci", "admin");
    let approver = site.token_made_by(&old, "approver", "approver");
    let api = site.start_binary(&old, "api", "api", &[]);
    let w0 = site.start_binary(&old, "worker", "worker-0", &[]);
    let w1 = site.start_binary(&old, "worker", "worker-1", &[]);
    site.wait_api().await;

    // Deploys in every state, all submitted to the old API.
    let running = submit(&site, &token, "acme/cmd", "1", "");
    let queued = submit(&site, &token, "acme/cmd", "2", "");
    let approval = submit(&site, &token, "acme/approved", "1", "");
    let paused = submit(&site, &token, "acme/waves", "1", "");
    let at = (chrono::Utc::now() + chrono::Duration::seconds(40))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let scheduled = submit(
        &site,
        &token,
        "acme/sched",
        "1",
        &format!("schedule: {{at: \"{at}\"}}\n"),
    );
    eventually(
        "the first acme/cmd deploy runs its command",
        WAIT,
        || async { (count(&site.ledger(), "begin acme/cmd t1") == 1).then_some(()) },
    )
    .await;
    wait_phase(&site, &token, &approval, "waiting_approval").await;
    wait_phase(&site, &token, &paused, "pause before wave 2").await;
    let queued_status = site.status(&token, &queued);
    assert_eq!(
        queued_status["status"], "ENQUEUED",
        "the second acme/cmd deploy waits behind the first: {queued_status}"
    );
    let scheduled_status = site.status(&token, &scheduled);
    assert_eq!(
        scheduled_status["phase"], "scheduled",
        "the scheduled deploy waits for its time: {scheduled_status}"
    );

    // The rolling update: worker-0, worker-1, then the API, one at a time.
    let _w0 = roll(&mut site, w0, "worker", "worker-0").await;
    let _w1 = roll(&mut site, w1, "worker", "worker-1").await;
    let _api = roll(&mut site, api, "api", "api").await;
    site.wait_api().await;

    let (code, workers) = site.cli(&token, &["workers"]);
    assert_eq!(code, 0, "manent workers: {workers}");
    let this_build = String::from_utf8(
        std::process::Command::new(common::SERVER)
            .arg("--version")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let this_build = this_build.trim().trim_start_matches("manent-server ");
    let running_workers: Vec<&Value> = workers
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| w["state"] == "running")
        .collect();
    assert!(
        running_workers.len() == 2 && running_workers.iter().all(|w| w["version"] == this_build),
        "both running workers are this build ({this_build}) after the roll: {workers}"
    );

    // What the deploys waited for comes: the gate, the approval, the pause's end, the time.
    std::fs::write(site.dir.join("gate"), "").unwrap();
    let (code, decided) = site.cli(&approver, &["approve", &approval]);
    assert_eq!(code, 0, "the approval is taken by the new API: {decided}");
    for id in [&running, &queued, &approval, &paused, &scheduled] {
        site.wait_status(&token, id, "SUCCESS").await;
    }

    let ledger = site.ledger();
    for (app, target) in [
        ("acme/cmd", "t1"),
        ("acme/approved", "t1"),
        ("acme/waves", "t1"),
        ("acme/waves", "t2"),
        ("acme/sched", "t1"),
    ] {
        let ends = count(&ledger, &format!("end {app} {target}"));
        let want = if app == "acme/cmd" { 2 } else { 1 };
        assert_eq!(
            ends, want,
            "{app} on {target} finished its command {want} time(s) (one per deploy), never \
             again after the roll: {ledger}"
        );
    }
    assert!(
        count(&ledger, "begin acme/waves t1") == 1,
        "the wave that finished before the roll is not run again after it: {ledger}"
    );
}
