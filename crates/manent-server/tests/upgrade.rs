//! An upgrade from the release `deploy/upgrade-from` names to this build, with deploys in
//! every state at the moment of the upgrade: one mid-command, one queued behind it, one
//! waiting for approval, one paused between waves, one mid-rollback (its reactivation of the
//! previous version running) and one scheduled to start after the upgrade. On PostgreSQL the
//! old API and two old workers are replaced one at a time as a StatefulSet rolls them
//! (SIGTERM, a short drain, the same executor id back); on SQLite one old `serve` is killed
//! (SIGKILL) and this build's starts in its place. Each deploy ends as it would have without
//! the upgrade, and a ledger every command appends to (each line naming the build that ran
//! it) holds exactly the lines docs/scaling-and-recovery.md promises: every finished step
//! once, the interrupted ones once more on this build. docs/upgrading.md.
//!
//! The old release is built once by `scripts/upgrade-from` (`./scripts/test` runs it and
//! passes its directory in `MANENT_TEST_UPGRADE_FROM`).

mod common;

use std::path::{Path, PathBuf};

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

/// Set in each process's environment and handed to the commands of its deploys as the
/// secret [`BUILD_SECRET`] (`{env: …}`, read on the worker that runs the command; both builds
/// know it, and a `host: local` command no longer inherits the worker's environment), which
/// they write into the ledger.
const BUILD_VARIABLE: &str = "UPGRADE_TEST_BUILD";
const BUILD_SECRET: &str = "UPGRADE_BUILD";
const OLD: &str = "old";
const NEW: &str = "new";

/// A shell command that appends `begin <event> <application> <target> <version> <build>`
/// to the ledger, waits for the file `gate` when `gated`, then appends the same line with
/// `end`.
fn ledger_command(site: &Site, event: &str, gated: bool) -> String {
    let ledger = common::ledger_path(&site.dir);
    let line =
        format!("{event} $MANENT_APPLICATION $MANENT_TARGET $MANENT_VERSION ${BUILD_SECRET}");
    let wait = if gated {
        let gate = site.dir.join("gate").display().to_string();
        format!("while [ ! -f {gate} ]; do sleep 0.1; done; ")
    } else {
        String::new()
    };
    format!("echo \"begin {line}\" >> {ledger}; {wait}echo \"end {line}\" >> {ledger}")
}

/// A ledger line: `begin` or `end`, the event, the deploy's application, target and
/// version, and the build that ran the command.
fn line(
    edge: &str,
    event: &str,
    application: &str,
    target: &str,
    version: &str,
    build: &str,
) -> String {
    format!("{edge} {event} {application} {target} {version} {build}")
}

/// The `begin` and `end` lines of one command that ran to its end on `build`.
fn ran(event: &str, application: &str, target: &str, version: &str, build: &str) -> [String; 2] {
    ["begin", "end"].map(|edge| line(edge, event, application, target, version, build))
}

/// Writes the prod environment of `application`: `targets` (`host: local`) deployed by the
/// `command` plugin with the one command `command`; `extra` YAML is appended.
fn command_environment(
    site: &Site,
    application: &str,
    targets: &[&str],
    command: &str,
    extra: &str,
) {
    let targets: Vec<String> = targets
        .iter()
        .map(|t| format!("{{name: {t}, host: local}}"))
        .collect();
    site.write_environment(
        application,
        "prod",
        &format!(
            "secrets: {{{BUILD_SECRET}: {{env: {BUILD_VARIABLE}}}}}\ntargets: [{}]\n\
             deploy:\n  plugin: command\n  commands:\n    - {}\n{extra}",
            targets.join(", "),
            serde_json::to_string(command).unwrap()
        ),
    );
}

/// The environments of the scenario, one per state a deploy is in at the upgrade.
fn write_environments(site: &Site) {
    let deploy = ledger_command(site, "deploy", false);
    command_environment(
        site,
        "acme/cmd",
        &["t1"],
        &ledger_command(site, "deploy", true),
        "",
    );
    let approval = "approval: {approvers: [approver], count: 1}\n";
    command_environment(site, "acme/approved", &["t1"], &deploy, approval);
    let waves = "rollout: {waves: [[t1], [t2]], pause: 60s}\n";
    command_environment(site, "acme/waves", &["t1", "t2"], &deploy, waves);
    command_environment(site, "acme/sched", &["t1"], &deploy, "");
    // Version 2 fails after its command ran, so the target is rolled back: its reactivation
    // of version 1 (the `activate` of the command plugin's previous deploy) waits for the gate.
    let activate = format!(
        "  activate: {}\n",
        serde_json::to_string(&ledger_command(site, "reactivate", true)).unwrap()
    );
    command_environment(
        site,
        "acme/rb",
        &["t1"],
        &format!("{deploy}; [ \"$MANENT_VERSION\" != 2 ]"),
        &activate,
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

fn assert_phase(site: &Site, token: &str, id: &str, phase: &str, when: &str) {
    let status = site.status(token, id);
    assert_eq!(
        status["phase"], phase,
        "{when}, deploy {id} is in phase {phase}: {status}"
    );
}

async fn wait_ledger_line(site: &Site, want: &str) {
    eventually(
        &format!("the ledger has the line `{want}`"),
        WAIT,
        || async { site.ledger().lines().any(|l| l == want).then_some(()) },
    )
    .await;
}

/// The deploys of the scenario, each in its own state at the upgrade.
struct Deploys {
    /// acme/cmd 1: its command is running (waiting for the gate).
    running: String,
    /// acme/cmd 2: queued behind it (one deploy per environment at a time).
    queued: String,
    /// acme/approved 1: waiting for an approval.
    approval: String,
    /// acme/waves 1: its first wave done, paused before the second.
    paused: String,
    /// acme/rb 2: failed, its target's reactivation of version 1 running.
    rollback: String,
    /// acme/sched 1: scheduled 30 s after its submission, the last before the upgrade.
    scheduled: String,
}

/// Puts deploys in every state on the old build's processes (already started).
async fn deploys_in_every_state(site: &Site, token: &str) -> Deploys {
    // The rollback needs a successful version to return to.
    let first = submit(site, token, "acme/rb", "1", "");
    let running = submit(site, token, "acme/cmd", "1", "");
    let queued = submit(site, token, "acme/cmd", "2", "");
    let approval = submit(site, token, "acme/approved", "1", "");
    site.wait_status(token, &first, "SUCCESS").await;
    let rollback = submit(site, token, "acme/rb", "2", "");
    wait_ledger_line(site, &line("begin", "deploy", "acme/cmd", "t1", "1", OLD)).await;
    wait_ledger_line(
        site,
        &line("begin", "reactivate", "acme/rb", "t1", "1", OLD),
    )
    .await;
    wait_phase(site, token, &rollback, "rolling back").await;
    wait_phase(site, token, &approval, "waiting_approval").await;
    let queued_status = site.status(token, &queued);
    assert_eq!(
        queued_status["status"], "ENQUEUED",
        "the second acme/cmd deploy waits behind the first: {queued_status}"
    );
    // The two deploys waiting for a time come last: the pause and the schedule outlast the
    // upgrade that follows (5–8 s here; a minute leaves room for a loaded machine), so both resume on this build.
    let paused = submit(site, token, "acme/waves", "1", "");
    wait_phase(site, token, &paused, "pause before wave 2").await;
    let at = (chrono::Utc::now() + chrono::Duration::seconds(60))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let schedule = format!("schedule: {{at: \"{at}\"}}\n");
    let scheduled = submit(site, token, "acme/sched", "1", &schedule);
    assert_phase(site, token, &scheduled, "scheduled", "before the upgrade");
    Deploys {
        running,
        queued,
        approval,
        paused,
        rollback,
        scheduled,
    }
}

/// How the old build's processes run and are replaced.
#[derive(Clone, Copy)]
enum Layout {
    /// An API and two workers (PostgreSQL), rolled as a StatefulSet does: SIGTERM, a drain,
    /// the same executor id back; the workers first, then the API.
    Rolling,
    /// One `serve` (SQLite, one machine), killed (SIGKILL) and started again.
    Killed,
}

impl Layout {
    /// The processes, as (role, executor id), in the order they are replaced.
    fn processes(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Layout::Rolling => &[
                ("worker", "worker-0"),
                ("worker", "worker-1"),
                ("api", "api"),
            ],
            Layout::Killed => &[("serve", "serve-0")],
        }
    }

    fn stop_signal(self) -> &'static str {
        match self {
            Layout::Rolling => "TERM",
            Layout::Killed => "KILL",
        }
    }
}

/// Stops each of the old build's processes (`started`, in `layout`'s order), waits for it
/// to exit and starts this build's in its place, under the same executor id; returns
/// this build's processes, in the same order.
async fn upgrade(site: &mut Site, layout: Layout, started: &[usize]) -> Vec<usize> {
    let mut replaced = Vec::new();
    for (&index, &(role, executor)) in started.iter().zip(layout.processes()) {
        signal(&site.children.0[index], layout.stop_signal());
        wait_exit(site.child(index), WAIT).await;
        replaced.push(site.start_binary(
            Path::new(common::SERVER),
            role,
            executor,
            &[(BUILD_VARIABLE, NEW)],
        ));
    }
    site.wait_api().await;
    replaced
}

/// Waits until the running workers are this build's worker processes (`started`, the
/// indexes in `site.children` of this build's processes, in `layout`'s order), each with
/// this build's version: a worker registers a moment after its start.
async fn wait_workers_are_this_build(site: &Site, token: &str, layout: Layout, started: &[usize]) {
    let this_build = String::from_utf8(
        std::process::Command::new(common::SERVER)
            .arg("--version")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let this_build = this_build.trim().trim_start_matches("manent-server ");
    let mut want: Vec<u32> = started
        .iter()
        .zip(layout.processes())
        .filter(|(_, (role, _))| *role != "api")
        .map(|(&index, _)| site.children.0[index].id())
        .collect();
    want.sort_unstable();
    let what = format!("the running workers are this build's ({this_build}), pids {want:?}");
    let last = std::sync::Mutex::new(Value::Null);
    eventually(&what, WAIT, || async {
        let (code, workers) = site.cli(token, &["workers"]);
        assert_eq!(code, 0, "manent workers: {workers}");
        let running: Vec<&Value> = workers
            .as_array()
            .into_iter()
            .flatten()
            .filter(|w| w["state"] == "running")
            .collect();
        let mut pids: Vec<u32> = running
            .iter()
            .filter_map(|w| w["pid"].as_u64().map(|p| p as u32))
            .collect();
        pids.sort_unstable();
        let done = pids == want && running.iter().all(|w| w["version"] == this_build);
        if !done {
            // Printed when it changes: a timeout shows where it stopped.
            let mut seen = last.lock().unwrap();
            if *seen != workers {
                eprintln!("manent workers: {workers}");
                *seen = workers.clone();
            }
        }
        done.then_some(())
    })
    .await;
}

/// The ledger the scenario must leave, sorted: each finished command once, on the build
/// that ran it; the two commands running at the upgrade (acme/cmd 1's, acme/rb 2's
/// reactivation) begun on the old build and run again, once, to their end on this one
/// (docs/scaling-and-recovery.md, "Recovery": the interrupted step runs again).
fn expected_ledger() -> Vec<String> {
    let mut lines: Vec<String> = [
        ran("deploy", "acme/cmd", "t1", "2", NEW),
        ran("deploy", "acme/approved", "t1", "1", NEW),
        ran("deploy", "acme/waves", "t1", "1", OLD),
        ran("deploy", "acme/waves", "t2", "1", NEW),
        ran("deploy", "acme/rb", "t1", "1", OLD),
        ran("deploy", "acme/rb", "t1", "2", OLD),
        ran("deploy", "acme/sched", "t1", "1", NEW),
        ran("deploy", "acme/cmd", "t1", "1", NEW),
        ran("reactivate", "acme/rb", "t1", "1", NEW),
    ]
    .into_iter()
    .flatten()
    .collect();
    lines.push(line("begin", "deploy", "acme/cmd", "t1", "1", OLD));
    lines.push(line("begin", "reactivate", "acme/rb", "t1", "1", OLD));
    lines.sort();
    lines
}

/// The whole scenario on `backend` with `layout`.
async fn upgrade_with_deploys_in_every_state(backend: Db, layout: Layout) {
    manent_testkit::init_tracing();
    let old = old_server();
    let mut site = Site::new(backend, &["true"]).await;
    // A short drain, as the chart's terminationGracePeriodSeconds would allow: the running
    // commands outlast it and stay pending.
    site.set_config("dbos: {drain_timeout: 2s}\n");
    write_environments(&site);

    // The old release creates the tokens, as its installation did.
    let token = site.token_made_by(&old, "ci", "admin");
    let approver = site.token_made_by(&old, "approver", "approver");
    let started: Vec<usize> = layout
        .processes()
        .iter()
        .map(|&(role, executor)| site.start_binary(&old, role, executor, &[(BUILD_VARIABLE, OLD)]))
        .collect();
    site.wait_api().await;
    let d = deploys_in_every_state(&site, &token).await;

    let replaced = upgrade(&mut site, layout, &started).await;
    wait_workers_are_this_build(&site, &token, layout, &replaced).await;

    // Each deploy is as it was: what it waited for has not come yet.
    let after = "after the upgrade";
    assert_phase(&site, &token, &d.approval, "waiting_approval", after);
    assert_phase(&site, &token, &d.paused, "pause before wave 2", after);
    assert_phase(&site, &token, &d.scheduled, "scheduled", after);
    // The two interrupted commands run again on this build, still waiting for the gate.
    wait_ledger_line(&site, &line("begin", "deploy", "acme/cmd", "t1", "1", NEW)).await;
    wait_ledger_line(
        &site,
        &line("begin", "reactivate", "acme/rb", "t1", "1", NEW),
    )
    .await;
    assert_phase(&site, &token, &d.rollback, "rolling back", after);

    // What the deploys waited for comes: the gate, the approval (taken by this build's
    // API), the pause's end, the time.
    std::fs::write(site.dir.join("gate"), "").unwrap();
    let (code, decided) = site.cli(&approver, &["approve", &d.approval]);
    assert_eq!(code, 0, "the approval is taken by the new API: {decided}");
    for id in [&d.running, &d.queued, &d.approval, &d.paused, &d.scheduled] {
        site.wait_status(&token, id, "SUCCESS").await;
    }
    let rolled = site.wait_status(&token, &d.rollback, "ERROR").await;
    let targets: Vec<(&Value, &Value)> = rolled["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| (&t["name"], &t["status"]))
        .collect();
    assert_eq!(
        targets,
        vec![(&Value::from("t1"), &Value::from("rolled_back"))],
        "the failed deploy's rollback completes to version 1 on this build: {rolled}"
    );

    let mut ledger: Vec<String> = site.ledger().lines().map(str::to_string).collect();
    ledger.sort();
    assert_eq!(
        ledger,
        expected_ledger(),
        "every command ran once, on the build expected, and the two interrupted by the \
         upgrade once more, to their end, on this build (lines sorted)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_on_postgresql_finishes_deploys_in_every_state_as_they_began_and_reruns_no_finished_step()
 {
    upgrade_with_deploys_in_every_state(Db::Postgres, Layout::Rolling).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_serve_on_sqlite_replaced_by_this_build_finishes_deploys_in_every_state_as_they_began_and_reruns_no_finished_step()
 {
    upgrade_with_deploys_in_every_state(Db::Sqlite, Layout::Killed).await;
}
