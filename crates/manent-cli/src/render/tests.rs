//! What the CLI prints for answers as the server sends them: tables and lines for people,
//! and the answer as sent for `--output json` (`UPDATE_EXPECT=1` rewrites the
//! expectations).

use expect_test::{Expect, expect};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::*;

/// The answer `json`, read as the CLI reads it.
fn answer<T: DeserializeOwned>(json: Value) -> Answer<T> {
    Answer::read("GET /test", json).expect("the CLI reads the answer")
}

fn check(actual: String, expected: Expect) {
    expected.assert_eq(&actual);
}

/// Ten minutes after the sample deploy below ended: relative times read `10m ago`.
fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-12-01T02:10:02Z")
        .expect("a time")
        .with_timezone(&Utc)
}

/// `format`, with headers, on full lines (as piped).
fn in_format(format: Format) -> Style {
    Style {
        format,
        headers: true,
        fit: Fit::Unlimited,
        now: now(),
    }
}

/// The default: `-o table`, piped.
fn style() -> Style {
    in_format(Format::Table)
}

/// A finished deploy as `GET /api/v1/deploys/{id}` answers it.
fn deploy() -> Value {
    json!({
        "id": "3f2a9c71",
        "application": "acme/web",
        "environment": "prod",
        "version": "1.4.2",
        "status": "SUCCESS",
        "phase": "done",
        "queue": "default",
        "route_kind": "default",
        "executor_id": "worker-1",
        "dry_run": false,
        "targets": [
            {"name": "web-1", "status": "deployed", "detail": null},
            {"name": "web-2", "status": "failed", "detail": "activate: exit 1"}
        ],
        "steps": [
            {"name": "web-1: command 1", "status": "SUCCESS", "attempts": 1,
             "started_at": "2026-12-01T02:00:00.000Z", "finished_at": "2026-12-01T02:00:01.500Z",
             "executor_id": "worker-1", "error": null}
        ],
        "error": null,
        "submitted_by": "ci",
        "created_at": "2026-12-01T01:59:59.000Z",
        "updated_at": "2026-12-01T02:00:02.000Z",
        "approvals": [
            {"by": "alice", "decision": "approved", "reason": "looks good", "at": "2026-12-01T02:00:00.000Z"}
        ],
        "artifacts": [
            {"name": "web.tgz", "type": "tarball", "version": "1.4.2",
             "url": "https://repo.example/web-1.4.2.tgz", "sha256": "ab12"}
        ],
        "overrides": {"commands": ["./deploy.sh"]},
        "started_at": "2026-12-01T02:00:00.000Z",
        "finished_at": "2026-12-01T02:00:02.000Z",
        "duration_ms": 2000,
        "redeploy_of": null,
        "redeploy_kind": null
    })
}

#[test]
fn list_is_a_table_of_deploys_with_their_durations() {
    let mut running = deploy();
    running["id"] = json!("77aa0b12");
    running["status"] = json!("PENDING");
    running["phase"] = json!("wave 1/2 (web)");
    running["duration_ms"] = Value::Null;
    running["executor_id"] = Value::Null;
    let list: Answer<Vec<DeployStatus>> = answer(json!([deploy(), running]));
    check(
        deploys(&style(), &list.body),
        expect![[r#"
            ID         APPLICATION   ENVIRONMENT   VERSION   STATUS    PHASE            CREATED_AT   DURATION   SUBMITTED_BY   DRY_RUN
            3f2a9c71   acme/web      prod          1.4.2     SUCCESS   done             10m ago      2.0s       ci             false
            77aa0b12   acme/web      prod          1.4.2     PENDING   wave 1/2 (web)   10m ago      -          ci             false"#]],
    );
    check(
        activity(&style(), &list.body),
        expect![[r#"
            ID         APPLICATION   ENVIRONMENT   VERSION   STATUS    PHASE            EXECUTOR_ID   UPDATED_AT
            3f2a9c71   acme/web      prod          1.4.2     SUCCESS   done             worker-1      10m ago
            77aa0b12   acme/web      prod          1.4.2     PENDING   wave 1/2 (web)   -             10m ago"#]],
    );
    check(
        history(&style(), &list.body),
        expect![[r#"
            VERSION   STATUS    ID         SUBMITTED_BY   CREATED_AT   DURATION   DRY_RUN   ORIGIN   IRREVERSIBLE
            1.4.2     SUCCESS   3f2a9c71   ci             10m ago      2.0s       false     -        -
            1.4.2     PENDING   77aa0b12   ci             10m ago      -          false     -        -"#]],
    );
}

#[test]
fn a_target_an_ended_deploy_never_reached_reads_not_started_as_on_the_page() {
    let mut failed = deploy();
    failed["status"] = json!("ERROR");
    failed["targets"][0]["status"] = json!("pending");
    let failed: Answer<DeployStatus> = answer(failed);
    check(
        progress_line(&failed.body),
        expect!["3f2a9c71 ERROR phase=done web-1=not started web-2=failed"],
    );
    let table = super::status(&style(), &failed.body);
    assert!(
        table.contains("web-1    not started"),
        "the status table says the same: {table}"
    );
    let mut running = deploy();
    running["status"] = json!("PENDING");
    running["targets"][0]["status"] = json!("pending");
    let running: Answer<DeployStatus> = answer(running);
    assert!(
        progress_line(&running.body).contains("web-1=pending"),
        "a running deploy's target that has not started yet is pending: {}",
        progress_line(&running.body)
    );
}

#[test]
fn status_shows_the_deploy_its_decisions_artifacts_targets_and_steps() {
    let status: Answer<DeployStatus> = answer(deploy());
    check(
        super::status(&style(), &status.body),
        expect![[r#"
            deploy 3f2a9c71
              acme/web / prod  SUCCESS  phase done  queue default  worker worker-1
              submitted by ci 10m ago, took 2.0s
              approved by alice 10m ago (looks good)
              artifact web.tgz (tarball 1.4.2) from https://repo.example/web-1.4.2.tgz sha256 ab12
              overrides deploy.commands: ["./deploy.sh"]

            TARGET   STATUS     DETAIL
            web-1    deployed   -
            web-2    failed     activate: exit 1

            STEP               STATUS    ATTEMPTS   STARTED_AT   FINISHED_AT
            web-1: command 1   SUCCESS   1          10m ago      10m ago"#]],
    );
    check(
        progress_line(&status.body),
        expect!["3f2a9c71 SUCCESS phase=done web-1=deployed web-2=failed"],
    );
}

#[test]
fn json_output_is_the_answer_as_the_server_sent_it() {
    let mut sent = deploy();
    // A field a newer server added: --output json keeps it.
    sent["added_later"] = json!({"kept": true});
    let status: Answer<DeployStatus> = answer(sent.clone());
    let printed: Value =
        serde_json::from_str(&shown(&in_format(Format::Json), &status, super::status))
            .expect("--output json prints JSON");
    assert_eq!(printed, sent, "the JSON printed is the answer as sent");
    let logs_answer: Answer<DeployLogs> =
        answer(json!({"id": "3f2a9c71", "lines": ["a", "b"], "output_seq": 4}));
    check(
        shown(&in_format(Format::Json), &logs_answer, logs),
        expect![[r#"
            {
              "id": "3f2a9c71",
              "lines": [
                "a",
                "b"
              ],
              "output_seq": 4
            }"#]],
    );
}

#[test]
fn logs_are_their_lines_and_output_lines_are_marked_by_stream() {
    let answer: Answer<DeployLogs> = answer(json!({
        "id": "3f2a9c71",
        "lines": ["2026-12-01T02:00:00.000Z submitted by ci to queue default",
                  "target web-1: deployed"],
        "output_seq": 2
    }));
    check(
        logs(&style(), &answer.body),
        expect![[r#"
        2026-12-01T02:00:00.000Z submitted by ci to queue default
        target web-1: deployed"#]],
    );
    let line = |stream: &str| {
        let line: Answer<OutputLine> = super::tests::answer(json!({
            "seq": 1, "at": "2026-12-01T02:00:00.500Z", "attempt": 1,
            "source": "web-1: command 1", "stream": stream, "line": "hello"
        }));
        output_line(&line.body)
    };
    check(
        [
            line("stdout"),
            line("stderr"),
            line("progress"),
            line("a-new-stream"),
        ]
        .join("\n"),
        expect![[r#"
            2026-12-01T02:00:00.500Z web-1: command 1 | hello
            2026-12-01T02:00:00.500Z web-1: command 1 ! hello
            2026-12-01T02:00:00.500Z web-1: command 1 · hello
            2026-12-01T02:00:00.500Z web-1: command 1 | hello"#]],
    );
}

#[test]
fn queues_show_each_limit_in_use() {
    let answer: Answer<Vec<QueueView>> = answer(json!([{
        "name": "default", "kind": "default", "concurrency": 4,
        "environment_concurrency": 1, "global_concurrency": 0,
        "enqueued": 2, "running": 3, "workers": ["worker-1", "worker-2"],
        "queue_concurrency": null,
        "limits": [
            {"key": "dbos.concurrency", "counts": "…", "limit": 4, "in_use": 2, "by": {"worker-1": 2}},
            {"key": "dbos.environment_concurrency", "counts": "…", "limit": 1, "in_use": 1, "by": {}},
            {"key": "dbos.global_concurrency", "counts": "…", "limit": null, "in_use": 3, "by": {}}
        ]
    }]));
    check(
        queues(&style(), &answer.body),
        expect![[r#"
            NAME      KIND      CONCURRENCY   ENVIRONMENT_CONCURRENCY   GLOBAL_CONCURRENCY   ENQUEUED   RUNNING   IN_USE                           WORKERS
            default   default   4             1                         0                    2          3         worker 2/4, env 1/1, total 3/-   worker-1,worker-2"#]],
    );
}

#[test]
fn workers_show_their_state_and_staleness() {
    let answer: Answer<Vec<WorkerView>> = answer(json!([{
        "executor_id": "worker-1", "host": "h1", "region": null, "state": "running",
        "heartbeat_at": "2026-12-01T02:00:00.000Z", "running": 2, "pid": 42,
        "started_at": "2026-12-01T01:00:00.000Z", "queues": ["default"],
        "heartbeat_age_secs": 1, "stale": false, "version": "0.1.0"
    }, {
        "executor_id": "worker-2", "host": "h2", "region": "eu", "state": "hibernating",
        "heartbeat_at": "2026-12-01T01:00:00.000Z", "running": 0, "pid": 43,
        "started_at": "2026-12-01T00:00:00.000Z", "queues": [],
        "heartbeat_age_secs": 3600, "stale": true, "version": "0.2.0"
    }]));
    check(
        workers(&style(), &answer.body),
        expect![[r#"
            EXECUTOR_ID   HOST   REGION   STATE         HEARTBEAT_AT   RUNNING   STALE   VERSION
            worker-1      h1     -        running       10m ago        2         false   0.1.0
            worker-2      h2     eu       hibernating   1h ago         0         true    0.2.0"#]],
    );
}

#[test]
fn an_answer_the_cli_cannot_read_is_an_error_naming_the_field() {
    let mut broken = deploy();
    broken.as_object_mut().expect("an object").remove("status");
    let error = Answer::<DeployStatus>::read("GET /api/v1/deploys/x", broken)
        .expect_err("a deploy without a status cannot be shown");
    assert!(
        error.to_string().contains("missing field `status`")
            && error.to_string().contains("GET /api/v1/deploys/x"),
        "the error names the field and the request: {error}"
    );
}

#[test]
fn control_characters_from_targets_are_shown_escaped() {
    let hostile = "ok\u{1b}]0;pwned\u{7}\u{1b}[2J\rdone\u{9b}31m";
    let shown = terminal_safe(hostile);
    assert!(
        !shown.chars().any(|c| c.is_control()),
        "no raw control character reaches the terminal: {shown:?}"
    );
    assert_eq!(
        shown, "ok\\u{1b}]0;pwned\\u{7}\\u{1b}[2J\\u{d}done\\u{9b}31m",
        "control characters escaped"
    );
    assert_eq!(
        terminal_safe("line 1\n\tline 2"),
        "line 1\n\tline 2",
        "newlines and tabs stay"
    );
}

/// Each character a target or a deployer may send that changes how a line reads, and how
/// `manent` shows it; ordinary text, accents and combining marks included, is kept.
#[test]
fn invisible_and_direction_changing_characters_are_shown_escaped() {
    let cases = [
        ("app\u{202E}gpj.exe", "app\\u{202e}gpj.exe"),
        (
            "a\u{202A}b\u{202B}c\u{202C}d\u{202D}e",
            "a\\u{202a}b\\u{202b}c\\u{202c}d\\u{202d}e",
        ),
        (
            "x\u{2066}y\u{2067}z\u{2068}w\u{2069}",
            "x\\u{2066}y\\u{2067}z\\u{2068}w\\u{2069}",
        ),
        (
            "l\u{200E}r\u{200F}a\u{061C}",
            "l\\u{200e}r\\u{200f}a\\u{61c}",
        ),
        (
            "line\u{2028}para\u{2029}end",
            "line\\u{2028}para\\u{2029}end",
        ),
        (
            "zero\u{200B}width\u{200D}joiner\u{FEFF}",
            "zero\\u{200b}width\\u{200d}joiner\\u{feff}",
        ),
        ("word\u{2060}joiner\u{180E}", "word\\u{2060}joiner\\u{180e}"),
        ("tag\u{E0041}\u{E007F}", "tag\\u{e0041}\\u{e007f}"),
        ("next\u{85}line", "next\\u{85}line"),
        ("café déjà vu – ok ✓", "café déjà vu – ok ✓"),
        ("cafe\u{301} 日本語 עברית", "cafe\u{301} 日本語 עברית"),
    ];
    let shown: Vec<String> = cases.iter().map(|(raw, _)| terminal_safe(raw)).collect();
    let expected: Vec<&str> = cases.iter().map(|(_, want)| *want).collect();
    assert_eq!(
        shown, expected,
        "each invisible or direction-changing character is escaped, other text kept"
    );
}

#[test]
fn a_rollback_says_what_it_came_from() {
    let mut rolled = deploy();
    rolled["redeploy_kind"] = json!("rollback");
    rolled["redeploy_of"] = json!("3f2a9c");
    let rolled: Answer<DeployStatus> = answer(rolled);
    assert!(
        super::status(&style(), &rolled.body).contains("  rollback of 3f2a9c\n"),
        "status names the deploy a rollback resubmitted: {}",
        super::status(&style(), &rolled.body)
    );
    let plain: Answer<DeployStatus> = answer(deploy());
    assert!(
        !super::status(&style(), &plain.body).contains(" of "),
        "a deploy submitted otherwise says nothing of it: {}",
        super::status(&style(), &plain.body)
    );
}

#[test]
fn durations_read_at_a_glance() {
    assert_eq!(duration(850), "850ms", "milliseconds");
    assert_eq!(duration(12_480), "12.4s", "seconds with a tenth");
    assert_eq!(duration(185_000), "3m05s", "minutes and seconds");
    assert_eq!(duration(7_830_000), "2h10m", "hours and minutes");
}

#[test]
fn log_lines_and_status_fields_go_through_the_escape() {
    let logs_answer: Answer<DeployLogs> =
        answer(json!({"id": "x", "lines": ["target t1: \u{1b}[31mred"]}));
    assert!(
        !logs(&style(), &logs_answer.body).contains('\u{1b}'),
        "logs escape target text"
    );
    let mut hostile = deploy();
    hostile["error"] = json!("\u{1b}[2Jboom");
    hostile["waiting_for"] = json!("\u{7}");
    hostile["approvals"] =
        json!([{"decision": "rejected", "by": "a", "at": "t", "reason": "\u{1b}x"}]);
    hostile["targets"][0]["detail"] = json!("\u{1b}[1A");
    let status: Answer<DeployStatus> = answer(hostile);
    assert!(
        !super::status(&style(), &status.body).contains(['\u{1b}', '\u{7}']),
        "status escapes every server text"
    );
}

#[test]
fn schedules_show_their_latest_refused_tick_with_the_reason() {
    let schedule = json!({
        "id": "sch-1", "application": "acme/web", "environment": "prod", "version": "1",
        "cron": "0 3 * * *", "timezone": "UTC", "missed": "run_once", "paused": false,
        "queue": "default", "next_tick": "2026-12-02T03:00:00+00:00",
        "last_tick": "2026-12-01T03:00:00+00:00", "last_deploy": null,
        "created_by": "ci", "created_at": "2026-11-30T10:00:00.000Z",
        "refused_ticks": [
            {"tick": "2026-11-30T03:00:00+00:00", "reason": "token `ci` (tok_1) no longer exists (revoked)"},
            {"tick": "2026-12-01T03:00:00+00:00", "reason": "token `ci` (tok_1) no longer exists (revoked)"}
        ]
    });
    let list: Answer<Vec<ScheduleView>> = answer(json!([schedule.clone()]));
    let text = schedules(&style(), &list.body);
    assert!(
        text.ends_with(
            "schedule sch-1: tick 2026-12-01T03:00:00+00:00 refused: token `ci` (tok_1) no \
             longer exists (revoked)"
        ),
        "below the table, the latest refused tick and why: {text}"
    );
    let one: Answer<ScheduleView> = answer(schedule);
    check(
        super::schedule(&style(), &one.body),
        expect![[r#"
            schedule sch-1  acme/web / prod  cron 0 3 * * * (UTC)  active  next tick in 1d
              tick 2026-11-30T03:00:00+00:00 refused: token `ci` (tok_1) no longer exists (revoked)
              tick 2026-12-01T03:00:00+00:00 refused: token `ci` (tok_1) no longer exists (revoked)"#]],
    );
    // A server from before refused ticks sends none: the schedule reads the same.
    let older: Answer<ScheduleView> = answer(json!({
        "id": "sch-2", "application": "acme/web", "environment": "prod", "version": "1",
        "cron": "0 3 * * *", "timezone": "UTC", "missed": "skip", "paused": true,
        "queue": "default", "next_tick": null, "last_tick": null, "last_deploy": null,
        "created_by": "ci", "created_at": "2026-11-30T10:00:00.000Z"
    }));
    assert!(
        older.body.refused_ticks.is_empty(),
        "no refused_ticks field reads as none: {:?}",
        older.body
    );
}

/// Two deploys with whole UUIDs, as a busy server lists them.
fn busy_list() -> Answer<Vec<DeployStatus>> {
    let mut first = deploy();
    first["id"] = json!("3f2a9c71-5d0e-4c1b-9a57-2b8e6f01d4aa");
    first["application"] = json!("payments/checkout-api");
    first["environment"] = json!("production-eu-west");
    first["phase"] = json!("wave 2/3 (canary hosts behind the eu-west balancer)");
    let mut second = deploy();
    second["id"] = json!("sch-0b7c2e9f4a1d4c3e8f5a6b7c8d9e0f1a@1796224050");
    answer(json!([first, second]))
}

#[test]
fn tables_are_plain_aligned_columns_without_box_drawing() {
    let text = deploys(&style(), &busy_list().body);
    assert!(
        !text.contains(['│', '┌', '─', '╞', '|']),
        "no border character: `awk '{{print $1}}'` prints an id\n{text}"
    );
    let first_words: Vec<&str> = text
        .lines()
        .map(|l| l.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(
        first_words,
        ["ID", "3f2a9c71", "sch-0b7c2e9f@1796224050"],
        "the first word of each line is the header, then each short id\n{text}"
    );
    assert!(
        text.lines().all(|l| !l.ends_with(' ')),
        "no trailing spaces\n{text}"
    );
}

#[test]
fn on_a_terminal_each_row_fits_on_one_line_and_no_header_is_cut() {
    for width in [80_u16, 100, 120, 200] {
        let mut narrow = style();
        narrow.fit = Fit::Columns(width);
        let text = deploys(&narrow, &busy_list().body);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines.len(),
            3,
            "one line per deploy and one for the header at {width} columns\n{text}"
        );
        for header in ["APPLICATION", "ENVIRONMENT", "VERSION", "STATUS"] {
            assert!(
                lines[0].contains(header),
                "{header} is whole at {width} columns\n{text}"
            );
        }
        assert!(
            lines[1..].iter().all(|l| l.contains(" SUCCESS")),
            "a short cell such as the status is never cut ({width} columns)\n{text}"
        );
        assert_eq!(
            lines[0].contains("DRY_RUN"),
            width >= 200,
            "the rightmost columns are left out only when even their headers do not fit \
             ({width} columns)\n{text}"
        );
        assert!(
            lines[1].starts_with("3f2a9c71 "),
            "the short id is never cut at {width} columns\n{text}"
        );
        if width < 200 {
            assert!(
                lines
                    .iter()
                    .all(|l| l.chars().count() <= usize::from(width)),
                "no line is wider than {width} columns\n{text}"
            );
            assert!(
                text.contains('…'),
                "what does not fit is cut, and marked so\n{text}"
            );
        }
    }
}

#[test]
fn wide_shows_whole_ids_and_times_and_is_never_cut() {
    let mut wide = in_format(Format::Wide);
    wide.fit = Fit::Columns(80);
    let text = deploys(&wide, &busy_list().body);
    for whole in [
        "3f2a9c71-5d0e-4c1b-9a57-2b8e6f01d4aa",
        "sch-0b7c2e9f4a1d4c3e8f5a6b7c8d9e0f1a@1796224050",
        "2026-12-01T01:59:59.000Z",
        "wave 2/3 (canary hosts behind the eu-west balancer)",
        "EXECUTOR_ID",
    ] {
        assert!(text.contains(whole), "-o wide shows {whole}\n{text}");
    }
    assert!(!text.contains('…'), "-o wide cuts nothing\n{text}");
}

#[test]
fn times_in_tables_are_relative() {
    let text = deploys(&style(), &busy_list().body);
    assert!(
        text.contains("10m ago") && !text.contains("2026-12-01T"),
        "created_at reads as an age in -o table\n{text}"
    );
    assert_eq!(
        relative(now(), now() - chrono::Duration::seconds(42)),
        "42s ago",
        "seconds ago"
    );
    assert_eq!(
        relative(now(), now() - chrono::Duration::hours(5)),
        "5h ago",
        "hours ago"
    );
    assert_eq!(
        relative(now(), now() - chrono::Duration::days(40)),
        "40d ago",
        "days ago"
    );
    assert_eq!(
        relative(now(), now() + chrono::Duration::minutes(5)),
        "in 5m",
        "in the future"
    );
}

#[test]
fn no_headers_leaves_only_the_rows() {
    let mut bare = style();
    bare.headers = false;
    let text = deploys(&bare, &busy_list().body);
    assert_eq!(text.lines().count(), 2, "two deploys, two lines\n{text}");
    assert!(!text.contains("APPLICATION"), "no header\n{text}");
}

#[test]
fn name_output_is_one_whole_id_per_line() {
    check(
        shown(&in_format(Format::Name), &busy_list(), deploys),
        expect![[r#"
            3f2a9c71-5d0e-4c1b-9a57-2b8e6f01d4aa
            sch-0b7c2e9f4a1d4c3e8f5a6b7c8d9e0f1a@1796224050"#]],
    );
}

#[test]
fn yaml_output_is_the_answer_as_sent() {
    let mut sent = deploy();
    sent["added_later"] = json!({"kept": true});
    let status: Answer<DeployStatus> = answer(sent.clone());
    let printed = shown(&in_format(Format::Yaml), &status, super::status);
    let read: Value = yaml_serde::from_str(&printed).expect("-o yaml prints YAML");
    assert_eq!(
        read, sent,
        "the YAML printed is the answer as sent\n{printed}"
    );
    let streamed = document(&in_format(Format::Yaml), &json!({"seq": 1}));
    assert_eq!(
        streamed, "---\nseq: 1",
        "each streamed document starts with ---"
    );
}

#[test]
fn apps_show_what_runs_where() {
    let apps: Answer<Vec<ApplicationView>> = answer(json!([{
        "application": "acme/web", "tenant": "acme", "environments": ["prod", "staging"],
        "live": {"prod": {"version": "1.4.2", "deploy_id": "3f2a9c71-5d0e-4c1b-9a57-2b8e6f01d4aa",
                          "finished_at": "2026-12-01T01:10:02.000Z"}}
    }, {
        "application": "acme/new", "tenant": "acme", "environments": [], "live": {}
    }]));
    check(
        applications(&style(), &apps.body),
        expect![[r#"
            APPLICATION   ENVIRONMENT   LIVE    SINCE    DEPLOY
            acme/web      prod          1.4.2   1h ago   3f2a9c71
            acme/web      staging       -       -        -
            without environments: acme/new"#]],
    );
}

#[test]
fn a_dry_run_and_a_rollback_stay_visible_in_the_status_cell_when_their_column_must_go() {
    let mut dry = deploy();
    dry["dry_run"] = json!(true);
    let mut rollback = deploy();
    rollback["id"] = json!("77aa0b12");
    rollback["redeploy_kind"] = json!("rollback");
    rollback["redeploy_of"] = json!("3f2a9c71");
    let list: Answer<Vec<DeployStatus>> = answer(json!([dry, rollback]));
    let mut narrow = style();
    narrow.fit = Fit::Columns(80);
    let listed = deploys(&narrow, &list.body);
    assert!(
        !listed.lines().next().unwrap_or("").contains("DRY_RUN"),
        "at 80 columns the DRY_RUN column is left out (else this test proves nothing)\n{listed}"
    );
    assert!(
        listed.contains("SUCCESS (dry run)"),
        "a dry run reads as one at 80 columns\n{listed}"
    );
    let history = history(&narrow, &list.body);
    assert!(
        history.contains("SUCCESS (rollback)"),
        "a rollback reads as one at 80 columns\n{history}"
    );
    let mut migration = deploy();
    migration["irreversible"] = json!("drops column users.legacy_name");
    let list: Answer<Vec<DeployStatus>> = answer(json!([migration, deploy()]));
    let marked = super::history(&narrow, &list.body);
    assert!(
        !marked.lines().next().unwrap_or("").contains("IRREVERSIBLE")
            && marked.contains("SUCCESS (irreversible)"),
        "at 80 columns the IRREVERSIBLE column is left out and its mark told in the status \
         cell\n{marked}"
    );
    check(
        super::history(&style(), &list.body),
        expect![[r#"
            VERSION   STATUS    ID         SUBMITTED_BY   CREATED_AT   DURATION   DRY_RUN   ORIGIN   IRREVERSIBLE
            1.4.2     SUCCESS   3f2a9c71   ci             10m ago      2.0s       false     -        drops column users.legacy_name
            1.4.2     SUCCESS   3f2a9c71   ci             10m ago      2.0s       false     -        -"#]],
    );
    let wide = deploys(&style(), &list.body);
    assert!(
        !wide.contains("(dry run)"),
        "with room for every column the status cell says only the status\n{wide}"
    );
}

#[test]
fn status_groups_the_targets_by_role_where_they_have_any() {
    let mut grouped = deploy();
    grouped["targets"] = json!([
        {"name": "web-1", "status": "deployed", "detail": null, "roles": ["web"]},
        {"name": "jobs-1", "status": "deployed", "detail": null},
        {"name": "db-1", "status": "deployed", "detail": "task migrate: ok once", "roles": ["db", "web"]},
        {"name": "web-2", "status": "failed", "detail": "activate: exit 1", "roles": ["web"]}
    ]);
    let status: Answer<DeployStatus> = answer(grouped);
    let shown = super::status(&style(), &status.body);
    let targets =
        &shown[shown.find("role web").expect("a role heading")..shown.find("STEP").unwrap()];
    check(
        targets.trim_end().to_string(),
        expect![[r#"
            role web
            TARGET   STATUS     DETAIL
            web-1    deployed   -
            web-2    failed     activate: exit 1

            roles db, web
            TARGET   STATUS     DETAIL
            db-1     deployed   task migrate: ok once

            no role
            TARGET   STATUS     DETAIL
            jobs-1   deployed   -"#]],
    );
}
