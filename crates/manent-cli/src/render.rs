//! How the CLI prints: JSON as the API gave it, or tables for people.

use std::io::Write;

use comfy_table::{ContentArrangement, Table, presets::UTF8_BORDERS_ONLY};
use serde_json::Value;

pub fn print(json: bool, value: &Value, human: impl Fn(&Value) -> String) {
    let text = if json {
        serde_json::to_string_pretty(value).unwrap_or_default()
    } else {
        human(value)
    };
    print_line(&text);
}

/// One line of a deploy's output as `logs` shows it: `source | line`, `!` for stderr,
/// `·` for a plugin's progress.
pub fn output_line(v: &Value) -> String {
    let mark = match v["stream"].as_str() {
        Some("stderr") => "!",
        Some("progress") => "·",
        _ => "|",
    };
    format!(
        "{} {} {mark} {}",
        text(&v["at"]),
        text(&v["source"]),
        text(&v["line"])
    )
}

/// Writes `text` and a newline to stdout; a reader that went away ends the CLI quietly.
pub fn print_line(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{text}").and_then(|()| out.flush()) {
        // `manent list | head`: the reader has what it wanted; that is not an error.
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("manent: cannot write the output: {e}");
        std::process::exit(1);
    }
}

/// Text from the server, made safe for a terminal. Much of it comes from targets (command
/// output, error messages), so a control character other than newline and tab is shown
/// escaped (`\u{1b}`): a target cannot move the cursor, rewrite earlier lines, retitle the
/// window or ring the bell of whoever reads `manent logs`.
pub fn terminal_safe(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => terminal_safe(s),
        Value::Array(items) => items.iter().map(text).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

fn table(rows: &Value, columns: &[&str]) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    // Wraps cells to the terminal's width; a pipe or file gets full lines.
    t.set_content_arrangement(ContentArrangement::Dynamic);
    t.set_header(columns.iter().map(|c| c.to_uppercase()));
    for row in rows.as_array().into_iter().flatten() {
        t.add_row(columns.iter().map(|c| text(&row[*c])));
    }
    t.to_string()
}

pub fn submitted(v: &Value) -> String {
    format!(
        "{}  {}  queue {}",
        text(&v["id"]),
        text(&v["status"]),
        text(&v["queue"])
    )
}

pub fn status(v: &Value) -> String {
    let mut out = format!(
        "deploy {}\n  {} / {}  {}  phase {}  queue {}  worker {}{}\n",
        text(&v["id"]),
        text(&v["application"]),
        text(&v["environment"]),
        text(&v["status"]),
        text(&v["phase"]),
        text(&v["queue"]),
        text(&v["executor_id"]),
        if v["dry_run"] == true {
            "  (dry run)"
        } else {
            ""
        },
    );
    if v["error"].is_string() {
        out.push_str(&format!("  error: {}\n", text(&v["error"])));
    }
    if v["redeploy_of"].is_string() {
        out.push_str(&format!(
            "  {} of {}\n",
            text(&v["redeploy_kind"]),
            text(&v["redeploy_of"])
        ));
    }
    if v["waiting_for"].is_string() {
        out.push_str(&format!("  waiting for {}\n", text(&v["waiting_for"])));
    }
    out.push_str(&approvals(&v["approvals"]));
    for a in v["artifacts"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  artifact {} ({} {}) from {} sha256 {}\n",
            text(&a["name"]),
            text(&a["type"]),
            text(&a["version"]),
            text(&a["url"]),
            text(&a["sha256"]),
        ));
    }
    for (key, value) in v["overrides"].as_object().into_iter().flatten() {
        // Shown in full: an approver must see every command a deployer chose.
        out.push_str(&format!(
            "  overrides deploy.{}: {}\n",
            terminal_safe(key),
            terminal_safe(&value.to_string())
        ));
    }
    if v["deployed_now"].is_string() {
        out.push_str(&format!(
            "  deployed there now: {}\n",
            text(&v["deployed_now"])
        ));
    }
    out.push_str(&table(&v["targets"], &["name", "status", "detail"]));
    out.push('\n');
    out.push_str(&table(
        &v["steps"],
        &[
            "name",
            "status",
            "attempts",
            "started_at",
            "finished_at",
            "executor_id",
        ],
    ));
    out
}

/// `  approved by alice at … (comment)` lines, one per decision.
fn approvals(v: &Value) -> String {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            format!(
                "  {} by {} at {}{}\n",
                text(&a["decision"]),
                text(&a["by"]),
                text(&a["at"]),
                a["reason"]
                    .as_str()
                    .map(|r| format!(" ({})", terminal_safe(r)))
                    .unwrap_or_default()
            )
        })
        .collect()
}

pub fn progress_line(v: &Value) -> String {
    let targets: Vec<String> = v["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| format!("{}={}", text(&t["name"]), text(&t["status"])))
        .collect();
    let waiting = v["waiting_for"]
        .as_str()
        .map(|w| format!(" (waiting for {})", terminal_safe(w)))
        .unwrap_or_default();
    format!(
        "{} {} phase={}{waiting} {}",
        text(&v["id"]),
        text(&v["status"]),
        text(&v["phase"]),
        targets.join(" ")
    )
}

pub fn logs(v: &Value) -> String {
    v["lines"]
        .as_array()
        .into_iter()
        .flatten()
        .map(text)
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn deploys(v: &Value) -> String {
    table(
        &with_duration(v),
        &[
            "id",
            "application",
            "environment",
            "version",
            "status",
            "phase",
            "dry_run",
            "duration",
            "queue",
            "executor_id",
            "created_at",
        ],
    )
}

/// The rows with a `duration` column made of `duration_ms` (`850ms`, `12.4s`, `3m05s`,
/// `2h10m`); `-` while a deploy has not ended.
fn with_duration(v: &Value) -> Value {
    let mut rows = v.clone();
    for row in rows.as_array_mut().into_iter().flatten() {
        row["duration"] = row["duration_ms"]
            .as_i64()
            .map_or(Value::Null, |ms| Value::String(duration(ms)));
    }
    rows
}

fn duration(ms: i64) -> String {
    let secs = ms / 1000;
    match ms {
        ..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{}.{}s", secs, (ms % 1000) / 100),
        60_000..3_600_000 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60),
    }
}

/// One environment's deploys (`manent history`), newest first.
pub fn history(v: &Value) -> String {
    let mut rows = with_duration(v);
    for row in rows.as_array_mut().into_iter().flatten() {
        // `rollback of <id>` / `redeploy of <id>`: where a resubmitted deploy came from.
        row["origin"] = match (row["redeploy_kind"].as_str(), row["redeploy_of"].as_str()) {
            (Some(kind), Some(of)) => Value::String(format!("{kind} of {of}")),
            _ => Value::Null,
        };
    }
    table(
        &rows,
        &[
            "version",
            "status",
            "id",
            "submitted_by",
            "created_at",
            "duration",
            "dry_run",
            "origin",
        ],
    )
}

/// A rollback's or redeploy's new deploy and what it resubmitted.
pub fn resubmitted(v: &Value) -> String {
    format!(
        "{} of {} (version {}): {}",
        text(&v["redeploy_kind"]),
        text(&v["redeploy_of"]),
        text(&v["version"]),
        submitted(v)
    )
}

/// The audit trail, newest first.
pub fn audit(v: &Value) -> String {
    table(v, &["at", "token", "action", "target", "outcome", "detail"])
}

pub fn queues(v: &Value) -> String {
    // One column with each limit's use, e.g. `worker 3/4, env 1/1, total 5/8, queue 2/2`.
    let mut rows = v.clone();
    for row in rows.as_array_mut().into_iter().flatten() {
        let used: Vec<String> = row["limits"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|l| {
                let short = match l["key"].as_str().unwrap_or_default() {
                    "dbos.concurrency" => "worker",
                    "dbos.environment_concurrency" => "env",
                    "dbos.global_concurrency" => "total",
                    _ => "queue",
                };
                format!("{short} {}/{}", text(&l["in_use"]), text(&l["limit"]))
            })
            .collect();
        row["in_use"] = Value::String(used.join(", "));
    }
    table(
        &rows,
        &[
            "name",
            "kind",
            "concurrency",
            "environment_concurrency",
            "global_concurrency",
            "enqueued",
            "running",
            "in_use",
            "workers",
        ],
    )
}

pub fn workers(v: &Value) -> String {
    table(
        v,
        &[
            "executor_id",
            "host",
            "region",
            "state",
            "heartbeat_at",
            "running",
            "stale",
        ],
    )
}

pub fn activity(v: &Value) -> String {
    table(
        &with_duration(v),
        &[
            "id",
            "application",
            "environment",
            "version",
            "status",
            "phase",
            "dry_run",
            "duration",
            "executor_id",
            "updated_at",
        ],
    )
}

pub fn schedules(v: &Value) -> String {
    // A stored schedule that cannot be read is listed with its reason, below the table.
    let unreadable: String = v
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s.get("error").is_some_and(|e| !e.is_null()))
        .map(|s| {
            format!(
                "\nschedule {} cannot be read: {}",
                text(&s["id"]),
                text(&s["error"])
            )
        })
        .collect();
    let readable: Vec<Value> = v
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s.get("error").is_none_or(Value::is_null))
        .cloned()
        .collect();
    table(
        &Value::Array(readable),
        &[
            "id",
            "application",
            "environment",
            "cron",
            "timezone",
            "next_tick",
            "last_tick",
            "paused",
            "queue",
        ],
    ) + &unreadable
}

pub fn schedule(v: &Value) -> String {
    if v.get("deleted").is_some() {
        return format!(
            "schedule {} {}",
            text(&v["id"]),
            if v["deleted"] == true {
                "deleted"
            } else {
                "was already gone"
            }
        );
    }
    format!(
        "schedule {}  {} / {}  cron {} ({})  {}  next tick {}",
        text(&v["id"]),
        text(&v["application"]),
        text(&v["environment"]),
        text(&v["cron"]),
        text(&v["timezone"]),
        if v["paused"] == true {
            "paused"
        } else {
            "active"
        },
        text(&v["next_tick"]),
    )
}

pub fn tenants(v: &Value) -> String {
    table(v, &["name", "queue", "declared", "applications"])
}

pub fn applications(v: &Value) -> String {
    // `prod 1.0, staging 1.1`: the version live in each environment that had a success.
    let mut rows = v.clone();
    for row in rows.as_array_mut().into_iter().flatten() {
        let live: Vec<String> = row["live"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(environment, live)| {
                format!("{} {}", terminal_safe(environment), text(&live["version"]))
            })
            .collect();
        row["live"] = Value::String(live.join(", "));
    }
    table(&rows, &["application", "tenant", "environments", "live"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_from_targets_are_shown_escaped() {
        let hostile = "ok\u{1b}]0;pwned\u{7}\u{1b}[2J\rdone\u{9b}31m";
        let shown = terminal_safe(hostile);
        assert!(
            !shown.chars().any(|c| c.is_control()),
            "no raw control character reaches the terminal: {shown:?}"
        );
        assert_eq!(
            shown,
            "ok\\u{1b}]0;pwned\\u{7}\\u{1b}[2J\\u{d}done\\u{9b}31m"
        );
        assert_eq!(
            terminal_safe("line 1\n\tline 2"),
            "line 1\n\tline 2",
            "newlines and tabs stay"
        );
    }

    #[test]
    fn a_rollback_says_what_it_came_from() {
        let rolled = serde_json::json!({"id": "n", "redeploy_kind": "rollback",
            "redeploy_of": "3f2a9c", "targets": [], "steps": []});
        assert!(
            status(&rolled).contains("  rollback of 3f2a9c\n"),
            "status names the deploy a rollback resubmitted: {}",
            status(&rolled)
        );
        let plain = serde_json::json!({"id": "n", "redeploy_of": null, "targets": [], "steps": []});
        assert!(
            !status(&plain).contains(" of "),
            "a deploy submitted otherwise says nothing of it: {}",
            status(&plain)
        );
    }

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(duration(850), "850ms");
        assert_eq!(duration(12_480), "12.4s");
        assert_eq!(duration(185_000), "3m05s");
        assert_eq!(duration(7_830_000), "2h10m");
    }

    #[test]
    fn log_lines_and_status_fields_go_through_the_escape() {
        let logs_json = serde_json::json!({"lines": ["target t1: \u{1b}[31mred"]});
        assert!(
            !logs(&logs_json).contains('\u{1b}'),
            "logs escape target text"
        );
        let status_json = serde_json::json!({"error": "\u{1b}[2Jboom", "waiting_for": "\u{7}",
            "approvals": [{"decision": "rejected", "by": "a", "at": "t", "reason": "\u{1b}x"}],
            "targets": [], "steps": []});
        assert!(
            !status(&status_json).contains(['\u{1b}', '\u{7}']),
            "status escapes every server text"
        );
    }
}
