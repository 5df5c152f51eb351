//! Scheduled and recurring deploys through real processes: one deploy per
//! cron tick with two API instances and two workers (one restarted in
//! between), a deploy at a time that starts no earlier than it, and pause,
//! resume and delete.

mod common;

use std::{
    collections::BTreeSet,
    path::PathBuf,
    process::Command,
    time::{SystemTime, UNIX_EPOCH},
};

use common::{Site, WAIT, cli_binary};
use manent_testkit::{Db, eventually, signal, wait_exit};
use serde_json::Value;

use manent_testkit::on_both_backends;

on_both_backends!(
    a_recurring_schedule_yields_one_deploy_per_tick_across_instances_and_restarts,
    a_deploy_at_a_time_starts_no_earlier_than_it,
);

/// Every two seconds (the leading seconds field keeps the test short).
const EVERY_TWO_SECONDS: &str = "*/2 * * * * *";

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The `manent` CLI against the API at `port`, with `--output json`.
fn cli_at(port: u16, token: &str, args: &[&str]) -> (i32, Value) {
    let out = Command::new(cli_binary())
        .args([
            "--server",
            &format!("http://127.0.0.1:{port}"),
            "--token",
            token,
            "--output",
            "json",
        ])
        .args(args)
        .output()
        .expect("run manent");
    let value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), value)
}

/// A descriptor of acme/web with `schedule` (YAML lines, indented) appended.
fn scheduled_descriptor(site: &Site, version: &str, schedule: &str) -> PathBuf {
    let path = site.descriptor(version);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("schedule:\n");
    text.push_str(schedule);
    std::fs::write(&path, text).unwrap();
    path
}

/// The deploys of a schedule: tick (unix seconds) → status, failing on an id
/// that is not `<schedule>@<tick>` or on a tick seen twice.
fn ticks_of(site: &Site, token: &str, schedule: &str) -> Vec<(i64, String)> {
    let (code, list) = site.cli(token, &["list", "--limit", "1000"]);
    assert_eq!(code, 0, "list: {list}");
    let mut out = Vec::new();
    for d in list.as_array().unwrap() {
        let id = d["id"].as_str().unwrap();
        let Some(tick) = id.strip_prefix(&format!("{schedule}@")) else {
            continue;
        };
        let tick: i64 = tick.parse().unwrap_or_else(|_| panic!("tick id {id}"));
        out.push((tick, d["status"].as_str().unwrap().to_string()));
    }
    out.sort();
    let unique: BTreeSet<i64> = out.iter().map(|(t, _)| *t).collect();
    assert_eq!(unique.len(), out.len(), "a tick with two deploys: {out:?}");
    out
}

/// Ticks are every two seconds from the first on: none lost, none doubled.
fn assert_every_tick_once(ticks: &[(i64, String)]) {
    for pair in ticks.windows(2) {
        assert_eq!(pair[1].0 - pair[0].0, 2, "ticks in order: {ticks:?}");
    }
    for (t, _) in ticks {
        assert_eq!(t % 2, 0, "a tick of */2 seconds: {ticks:?}");
    }
}

async fn wait_ticks(
    site: &Site,
    token: &str,
    schedule: &str,
    what: &str,
    done: impl Fn(&[(i64, String)]) -> bool,
) -> Vec<(i64, String)> {
    eventually(what, WAIT, || async {
        let ticks = ticks_of(site, token, schedule);
        done(&ticks).then_some(ticks)
    })
    .await
}

async fn all_succeed(site: &Site, token: &str, schedule: &str) -> Vec<(i64, String)> {
    wait_ticks(site, token, schedule, "every tick's deploy succeeds", |t| {
        t.iter().all(|(_, s)| s == "SUCCESS")
    })
    .await
}

/// Waits until a plain deploy submitted now has succeeded and the clock has
/// passed two more ticks: the workers are up and ticking, and had the time
/// to enqueue a tick if they wrongly would.
async fn let_two_ticks_pass(site: &Site, token: &str) {
    let from = now_secs();
    let path = site.descriptor("plain");
    let (code, v) = site.cli(token, &["deploy", "-f", path.to_str().unwrap(), "--wait"]);
    assert_eq!(code, 0, "plain deploy: {v}");
    eventually("two ticks pass", WAIT, || async {
        (now_secs() >= from + 5).then_some(())
    })
    .await;
}

async fn a_recurring_schedule_yields_one_deploy_per_tick_across_instances_and_restarts(db: Db) {
    let mut site = Site::new(db, &["true"]).await;
    // Ticks every two seconds keep the test short; the default minimum is a minute.
    site.set_config("schedules: {min_interval: 1s}");
    let token = site.token();
    let port2 = common::free_port();
    let listen2 = format!("127.0.0.1:{port2}");
    site.start("api", "api-1");
    site.start_with("api", "api-2", &[("MANENT__API__LISTEN", listen2.as_str())]);
    let w1 = site.start("worker", "worker-1");
    site.start("worker", "worker-2");
    site.wait_api().await;
    eventually("the second API accepts connections", WAIT, || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port2))
            .await
            .ok()
            .map(|_| ())
    })
    .await;

    let path = scheduled_descriptor(
        &site,
        "1",
        &format!("  cron: \"{EVERY_TWO_SECONDS}\"\n  timezone: Europe/Paris\n"),
    );
    let (code, created) = cli_at(port2, &token, &["deploy", "-f", path.to_str().unwrap()]);
    assert_eq!(code, 0, "schedule submission: {created}");
    assert_eq!(
        created["status"], "SCHEDULED",
        "a deploy with a schedule is a schedule: {created}"
    );
    assert_eq!(created["queue"], "default", "its queue: {created}");
    let schedule = created["id"].as_str().unwrap().to_string();
    assert!(schedule.starts_with("sch-"), "{schedule}");

    let (code, list) = site.cli(&token, &["schedules"]);
    assert_eq!(code, 0, "schedules: {list}");
    let listed = list
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == schedule.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{schedule} in {list}"));
    assert_eq!(
        (&listed["paused"], listed["cron"].as_str()),
        (&serde_json::Value::Bool(false), Some(EVERY_TWO_SECONDS)),
        "a new schedule is not paused and keeps its cron: {listed}"
    );
    assert!(listed["next_tick"].is_string(), "{listed}");

    let before = wait_ticks(&site, &token, &schedule, "three ticks", |t| t.len() >= 3).await;

    // Restart one worker (graceful stop, same executor id) while the other keeps ticking.
    signal(site.child(w1), "TERM");
    wait_exit(site.child(w1), WAIT).await;
    let restarted_at = now_secs();
    site.start("worker", "worker-1");
    let after = wait_ticks(
        &site,
        &token,
        &schedule,
        "three ticks after the restart",
        |t| t.iter().filter(|(tick, _)| *tick > restarted_at).count() >= 3,
    )
    .await;
    assert!(
        after.len() > before.len(),
        "the schedule ticked again: {} then {} ticks",
        before.len(),
        after.len()
    );
    assert_every_tick_once(&after);

    // Pause (through the other API): no tick after it, until resumed.
    // A schedule is named by a unique prefix too, by the rule deploys follow.
    let (code, paused) = cli_at(port2, &token, &["schedule", "pause", &schedule[..8]]);
    assert_eq!(code, 0, "pause: {paused}");
    assert_eq!(paused["paused"], true, "the schedule is paused: {paused}");
    assert!(paused["next_tick"].is_null(), "{paused}");
    let paused_at = now_secs();
    let_two_ticks_pass(&site, &token).await;
    let during_pause = all_succeed(&site, &token, &schedule).await;
    assert!(
        during_pause.iter().all(|(t, _)| *t <= paused_at),
        "no tick after the pause at {paused_at}: {during_pause:?}"
    );
    assert_every_tick_once(&during_pause);

    let resumed_at = now_secs();
    let (code, resumed) = site.cli(&token, &["schedule", "resume", &schedule]);
    assert_eq!(code, 0, "resume: {resumed}");
    assert_eq!(
        resumed["paused"], false,
        "the schedule is resumed: {resumed}"
    );
    let after_resume = wait_ticks(
        &site,
        &token,
        &schedule,
        "two ticks after the resume",
        |t| t.iter().filter(|(tick, _)| *tick >= resumed_at).count() >= 2,
    )
    .await;
    assert!(
        after_resume
            .iter()
            .all(|(t, _)| *t <= paused_at || *t >= resumed_at),
        "the ticks of the pause are not run: {after_resume:?}"
    );

    // Delete: gone from the list, and no tick after it.
    let (code, deleted) = site.cli(&token, &["schedule", "delete", &schedule]);
    assert_eq!(code, 0, "delete: {deleted}");
    assert_eq!(
        deleted["deleted"], true,
        "the schedule is deleted: {deleted}"
    );
    let deleted_at = now_secs();
    let (_, list) = cli_at(port2, &token, &["schedules"]);
    assert!(
        !list
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == schedule.as_str()),
        "{list}"
    );
    let (code, _) = site.cli(&token, &["schedule", "pause", &schedule]);
    assert_eq!(code, 2, "a deleted schedule is unknown");
    let_two_ticks_pass(&site, &token).await;
    let last = all_succeed(&site, &token, &schedule).await;
    assert!(
        last.iter().all(|(t, _)| *t <= deleted_at),
        "no tick after the delete at {deleted_at}: {last:?}"
    );
    // Every deploy of a tick was a real deploy of the descriptor, on the recorded queue.
    let (_, status) = site.cli(&token, &["status", &format!("{schedule}@{}", last[0].0)]);
    assert_eq!(status["status"], "SUCCESS", "{status}");
    assert_eq!(
        status["queue"], "default",
        "the tick's deploy went to the default queue: {status}"
    );
    assert_eq!(
        status["version"], "1",
        "the tick deploys the schedule's version: {status}"
    );
}

async fn a_deploy_at_a_time_starts_no_earlier_than_it(db: Db) {
    let mut site = Site::new(db, &["true"]).await;
    let token = site.token();
    site.start("api", "api");
    site.start("worker", "worker");
    site.wait_api().await;
    let at = now_secs() + 4;
    let at_text = chrono::DateTime::from_timestamp(at, 0)
        .unwrap()
        .with_timezone(&chrono::FixedOffset::east_opt(3600).unwrap())
        .to_rfc3339();
    let path = scheduled_descriptor(&site, "2", &format!("  at: \"{at_text}\"\n"));
    let (code, created) = site.cli(&token, &["deploy", "-f", path.to_str().unwrap()]);
    assert_eq!(code, 0, "submission: {created}");
    assert_eq!(
        created["status"], "ENQUEUED",
        "a one-off deploy at a past time is enqueued at once: {created}"
    );
    let id = created["id"].as_str().unwrap().to_string();
    let (_, status) = site.cli(&token, &["status", &id]);
    assert_eq!(status["phase"], "scheduled", "{status}");
    let done = eventually("the scheduled deploy succeeds", WAIT, || async {
        let (_, s) = site.cli(&token, &["status", &id]);
        (s["status"] == "SUCCESS").then_some(s)
    })
    .await;
    let steps = done["steps"].as_array().unwrap();
    assert!(!steps.is_empty(), "{done}");
    for step in steps {
        let started = chrono::DateTime::parse_from_rfc3339(step["started_at"].as_str().unwrap())
            .unwrap()
            .timestamp_millis();
        assert!(
            started >= at * 1000,
            "step {} started at {started} ms, before {at_text}",
            step["name"]
        );
    }
}
