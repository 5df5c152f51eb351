//! Tests of schedules: cron and time zones, tick computation, intervals, the tick state.

use std::collections::BTreeSet;

use super::*;

fn secs(tz: Tz, local: &str) -> i64 {
    let naive = chrono::NaiveDateTime::parse_from_str(local, "%Y-%m-%d %H:%M:%S").unwrap();
    tz.from_local_datetime(&naive)
        .earliest()
        .unwrap()
        .timestamp()
}

fn show(tz: Tz, ticks: &[i64]) -> Vec<String> {
    ticks
        .iter()
        .map(|t| at(tz, *t).unwrap().to_rfc3339())
        .collect()
}

/// Every tick in `(from, to]`.
fn ticks(cron: &str, tz: Tz, from: i64, to: i64) -> Vec<i64> {
    let cron = parse_cron(cron).unwrap();
    let mut out = Vec::new();
    let mut cursor = from;
    while let Some(t) = next_tick(&cron, tz, cursor) {
        if t > to {
            break;
        }
        out.push(t);
        cursor = t;
    }
    out
}

#[test]
fn spring_forward_in_paris_runs_the_skipped_hour_once() {
    let tz = chrono_tz::Europe::Paris;
    // 2025-03-30: 02:00 CET becomes 03:00 CEST; 02:30 does not exist that day.
    let from = secs(tz, "2025-03-29 00:00:00");
    let to = secs(tz, "2025-03-31 23:59:00");
    assert_eq!(
        show(tz, &ticks("30 2 * * *", tz, from, to)),
        [
            "2025-03-29T02:30:00+01:00",
            "2025-03-30T03:00:00+02:00",
            "2025-03-31T02:30:00+02:00"
        ],
        "a tick in the spring-forward gap runs at the first valid time after it"
    );
    // Hourly: 02:xx is skipped on the wall clock, never doubled.
    let hourly = ticks(
        "0 * * * *",
        tz,
        secs(tz, "2025-03-30 00:30:00"),
        secs(tz, "2025-03-30 04:30:00"),
    );
    assert_eq!(
        show(tz, &hourly),
        [
            "2025-03-30T01:00:00+01:00",
            "2025-03-30T03:00:00+02:00",
            "2025-03-30T04:00:00+02:00"
        ],
        "the hour that does not exist is skipped"
    );
}

#[test]
fn fall_back_in_paris_runs_the_repeated_hour_once() {
    let tz = chrono_tz::Europe::Paris;
    // 2025-10-26: 03:00 CEST becomes 02:00 CET; 02:30 happens twice.
    let from = secs(tz, "2025-10-25 00:00:00");
    let to = secs(tz, "2025-10-27 23:59:00");
    assert_eq!(
        show(tz, &ticks("30 2 * * *", tz, from, to)),
        [
            "2025-10-25T02:30:00+02:00",
            "2025-10-26T02:30:00+02:00",
            "2025-10-27T02:30:00+01:00"
        ],
        "a tick in the fall-back hour runs once"
    );
    // A daily tick is 25 hours after the one before across the change.
    let daily = ticks("0 9 * * *", tz, from, to);
    assert_eq!(
        daily[1] - daily[0],
        25 * 3600,
        "the day the clocks go back is 25 hours long"
    );
    assert_eq!(
        daily[2] - daily[1],
        24 * 3600,
        "an ordinary day is 24 hours long"
    );
}

#[test]
fn on_time_ticks_each_run_and_nothing_runs_twice() {
    let tz = chrono_tz::UTC;
    let cron = parse_cron("*/2 * * * * *").unwrap();
    let now = 1_000_000; // even
    let p = plan(&cron, tz, Missed::Skip, now - 5, now);
    assert_eq!(
        p.enqueue,
        [now - 4, now - 2, now],
        "run_all enqueues every missed tick"
    );
    assert_eq!(p.last_tick, Some(now), "the last tick is now");
    // The next pass from the recorded last tick finds nothing new.
    let p = plan(&cron, tz, Missed::Skip, now, now + 1);
    assert_eq!(p, TickPlan::default(), "nothing is due: nothing planned");
    // A tick at the floor itself is not due again.
    let p = plan(&cron, tz, Missed::RunOnce, now, now);
    assert!(
        p.enqueue.is_empty(),
        "a tick at the floor itself is not due again: {p:?}"
    );
}

#[test]
fn missed_ticks_run_once_or_are_skipped() {
    let tz = chrono_tz::Europe::Paris;
    let cron = parse_cron("0 * * * *").unwrap();
    // Down from 10:30 to 15:20: the 11:00 … 15:00 ticks were missed.
    let floor = secs(tz, "2025-06-02 10:30:00");
    let now = secs(tz, "2025-06-02 15:20:00");
    let p = plan(&cron, tz, Missed::RunOnce, floor, now);
    assert_eq!(
        show(tz, &p.enqueue),
        ["2025-06-02T15:00:00+02:00"],
        "run_once enqueues the latest missed tick only"
    );
    assert_eq!(
        p.last_tick,
        Some(secs(tz, "2025-06-02 15:00:00")),
        "the last tick is the one enqueued"
    );
    let p = plan(&cron, tz, Missed::Skip, floor, now);
    assert!(
        p.enqueue.is_empty(),
        "skip enqueues none of the missed ticks: {p:?}"
    );
    assert_eq!(
        p.last_tick,
        Some(secs(tz, "2025-06-02 15:00:00")),
        "the last tick stays"
    );
    // The next pass resumes at 16:00 either way.
    let p = plan(
        &cron,
        tz,
        Missed::Skip,
        secs(tz, "2025-06-02 15:00:00"),
        secs(tz, "2025-06-02 16:00:10"),
    );
    assert_eq!(
        show(tz, &p.enqueue),
        ["2025-06-02T16:00:00+02:00"],
        "the next tick is enqueued when it falls due"
    );
    // Nothing due: nothing to do.
    let p = plan(
        &cron,
        tz,
        Missed::RunOnce,
        floor,
        secs(tz, "2025-06-02 10:59:59"),
    );
    assert_eq!(p, TickPlan::default(), "a paused schedule plans nothing");
}

#[test]
fn a_missed_tick_is_not_run_when_an_on_time_one_runs() {
    let tz = chrono_tz::UTC;
    let cron = parse_cron("*/30 * * * * *").unwrap();
    // Ticks every 30 s from a floor 200 s back: the ones within a minute run, the late ones do not.
    let now = 1_000_020; // a multiple of 30
    let p = plan(&cron, tz, Missed::RunOnce, now - 200, now);
    assert_eq!(
        p.enqueue,
        [now - 60 + 30, now],
        "every tick since the last one is enqueued"
    );
    assert_eq!(p.last_tick, Some(now), "the last tick is now");
}

#[test]
fn tick_ids_and_timezones() {
    assert_eq!(
        tick_id("sch-1", 1_700_000_000),
        "sch-1@1700000000",
        "a tick's deploy id is the schedule's id and the tick"
    );
    assert!(
        parse_timezone("Mars/Base").is_err(),
        "an unknown time zone is refused"
    );
    assert!(
        parse_cron("* * * * *").is_ok(),
        "a five-field cron is accepted"
    );
    assert!(
        parse_cron("*/5 * * * * *").is_ok(),
        "a six-field cron (with seconds) is accepted"
    );
    let refused = parse_cron("61 * * * *").unwrap_err();
    assert!(
        matches!(&refused, ScheduleError::Cron { expr, .. } if expr == "61 * * * *")
            && refused.to_string().contains("write five fields"),
        "a refused cron names the expression and says what to write: {refused}"
    );
}
/// Lets every token deploy: these tests are about ticking, not about tokens (those are
/// manent-api's; the re-authorisation is tested with them in manent-server's tests).
struct EveryTokenAllowed;

#[async_trait::async_trait]
impl Authority for EveryTokenAllowed {
    async fn may_deploy(
        &self,
        _submitter: &Submitter,
        _application: &str,
    ) -> Result<crate::authority::Verdict, EngineError> {
        Ok(crate::authority::Verdict::Allowed)
    }
}

/// A policy with acme/web/prod configured under `db`'s directory, artifacts from `/`.
fn policy(db: &manent_testkit::TestDb) -> TickPolicy {
    let environments = db.path("environments");
    std::fs::create_dir_all(environments.join("acme/web")).unwrap();
    std::fs::write(
        environments.join("acme/web/prod.yml"),
        "targets: [{name: t1, host: local}]\ndeploy: {plugin: command, commands: [\"true\"]}\n",
    )
    .unwrap();
    let yaml = format!(
        "database: {{url: {}}}\nenvironments: {{source: {}}}\nartifacts: {{sources: [\"file:///\"]}}\n\
         schedules: {{min_interval: 1s}}\n",
        serde_json::to_string(&db.url).unwrap(),
        serde_json::to_string(&environments).unwrap(),
    );
    TickPolicy {
        config: Arc::new(
            Config::from_yaml_str(&yaml, "manent.yml", std::iter::empty())
                .expect("a valid test configuration"),
        ),
        authority: Arc::new(EveryTokenAllowed),
    }
}

#[test]
fn the_shortest_interval_is_found_wherever_it_falls() {
    let tz = chrono_tz::UTC;
    let shortest = |expr: &str| shortest_interval(&parse_cron(expr).unwrap(), tz, 1_000_000);
    assert_eq!(shortest("* * * * * *"), Some(1), "a per-second cron");
    assert_eq!(
        shortest("*/2 * * * * *"),
        Some(2),
        "the shortest interval of every two seconds is two seconds"
    );
    assert_eq!(shortest("* * * * *"), Some(60), "a per-minute cron");
    assert_eq!(shortest("0 3 * * *"), Some(86_400), "a daily one");
    assert_eq!(
        shortest("0,1 0 1 1 *"),
        Some(60),
        "two ticks a minute apart once a year are found however far the date"
    );
}

/// A schedule of acme/web/prod version 1 every two seconds, missed ticks run once.
async fn every_two_seconds(client: &Client) -> ScheduleRecord {
    let sha = "0".repeat(64);
    let text = format!(
        "application: acme/web\nenvironment: prod\nartifacts:\n  - {{name: a, type: file, \
         version: \"1\", url: \"file:///a\", sha256: \"{sha}\"}}\n"
    );
    let descriptor = manent_model::parse_descriptor(&text, "d.yml").unwrap();
    let route: Route = serde_json::from_value(
        serde_json::json!({"queue": "default", "kind": "default", "plugin": null}),
    )
    .unwrap();
    create(
        client,
        descriptor,
        None,
        route,
        "*/2 * * * * *",
        "UTC",
        Missed::RunOnce,
        &Submitter::named("ci"),
    )
    .await
    .expect("the schedule is created")
}

/// Tickers racing, a stale tick state, a pause and a long outage, on a real store.
#[tokio::test]
async fn tickers_enqueue_each_tick_once_and_respect_pause() {
    let db = manent_testkit::TestDb::new(manent_testkit::Db::Sqlite).await;
    let client = Client::new(
        manent_engine::Database::open(&db.url, &manent_engine::Connections::default())
            .await
            .unwrap(),
    );
    let policy = policy(&db);
    let s = every_two_seconds(&client).await;
    let deploys = || async {
        client
            .list(&manent_engine::WorkflowFilter::default())
            .await
            .unwrap()
            .into_iter()
            .map(|w| w.id)
            .collect::<BTreeSet<_>>()
    };
    let t0 = s.created_at_ms + 7_000;
    // Two tickers at the same instant: the same ids, enqueued once.
    let first = tick_once(&client, &policy, t0).await.unwrap();
    let second = tick_once(&client, &policy, t0).await.unwrap();
    assert!(first.len() >= 3, "{first:?}");
    assert!(second.is_empty(), "already recorded: {second:?}");
    assert_eq!(
        deploys().await,
        first.iter().cloned().collect(),
        "each due tick became one deploy"
    );
    // A lost update of the tick state re-enqueues existing ids only.
    client.records().delete(TICK_KIND, &s.id).await.unwrap();
    let again = tick_once(&client, &policy, t0).await.unwrap();
    assert_eq!(
        again, first,
        "a second tick at the same time enqueues the same deploys"
    );
    assert_eq!(deploys().await.len(), first.len(), "and no more of them");
    // Paused: nothing, however much time passes.
    set_paused(&client, &s.id, true).await.unwrap();
    assert!(
        tick_once(&client, &policy, t0 + 10_000)
            .await
            .unwrap()
            .is_empty(),
        "nothing is due ten seconds later"
    );
    set_paused(&client, &s.id, false).await.unwrap();
    // Down for ten minutes: the ticks of the last minute are on time and run each; the
    // older ones were missed, and are not run on top of them.
    let late = t0 + 600_000;
    let after_outage = tick_once(&client, &policy, late).await.unwrap();
    let on_time_from = late / 1000 - MISSED_AFTER_SECS;
    assert_eq!(after_outage.len(), 30, "{after_outage:?}");
    assert!(
        after_outage
            .iter()
            .all(|id| id > &tick_id(&s.id, on_time_from)),
        "{after_outage:?}"
    );
    assert_eq!(
        deploys().await.len(),
        first.len() + after_outage.len(),
        "the ticks missed during the outage are deployed once each"
    );
    let view = super::show(&client, &s.id).await.unwrap().unwrap();
    assert!(
        view.next_tick.is_some() && view.last_deploy.is_some(),
        "{view:?}"
    );
    // Deleted: gone, and never ticked again.
    assert!(
        delete(&client, &s.id).await.unwrap(),
        "the schedule is deleted"
    );
    assert!(
        tick_once(&client, &policy, late + 10_000)
            .await
            .unwrap()
            .is_empty(),
        "a deleted schedule ticks no more"
    );
    assert!(
        list(&client).await.unwrap().is_empty(),
        "no schedule is left"
    );
}

/// A tick state someone stored that cannot be read stops its schedule, shown with the
/// error; ticking on from the schedule's start would enqueue ticks already deployed.
#[tokio::test]
async fn an_unreadable_tick_state_stops_its_schedule_and_is_shown_never_reset() {
    let db = manent_testkit::TestDb::new(manent_testkit::Db::Sqlite).await;
    let client = Client::new(
        manent_engine::Database::open(&db.url, &manent_engine::Connections::default())
            .await
            .unwrap(),
    );
    let policy = policy(&db);
    let s = every_two_seconds(&client).await;
    client
        .records()
        .put(TICK_KIND, &s.id, "{not json", now_ms())
        .await
        .unwrap();
    let ticked = tick_once(&client, &policy, s.created_at_ms + 7_000)
        .await
        .unwrap();
    assert!(
        ticked.is_empty(),
        "a schedule whose tick state cannot be read must not tick: {ticked:?}"
    );
    let listed = list(&client).await.unwrap();
    let error = listed[0].error.clone().unwrap_or_default();
    assert!(
        error.contains("tick state cannot be read") && error.contains(&s.id),
        "the list must say why the schedule stopped and name its record: {listed:?}"
    );
    let shown = super::show(&client, &s.id).await.unwrap().unwrap();
    assert!(
        shown.error.is_some(),
        "show must carry the same error: {shown:?}"
    );
    assert_eq!(
        client
            .records()
            .get(TICK_KIND, &s.id)
            .await
            .unwrap()
            .as_deref(),
        Some("{not json"),
        "the unreadable record is kept as it is for the operator, never overwritten"
    );
}
