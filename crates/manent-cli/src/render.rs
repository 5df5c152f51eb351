//! How the CLI prints: JSON as the API gave it, or tables for people.

use comfy_table::{Table, presets::UTF8_BORDERS_ONLY};
use serde_json::Value;

pub fn print(json: bool, value: &Value, human: impl Fn(&Value) -> String) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_default()
        );
    } else {
        println!("{}", human(value));
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().map(text).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

fn table(rows: &Value, columns: &[&str]) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
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
    if let Some(error) = v["error"].as_str() {
        out.push_str(&format!("  error: {error}\n"));
    }
    if let Some(waiting) = v["waiting_for"].as_str() {
        out.push_str(&format!("  waiting for {waiting}\n"));
    }
    out.push_str(&approvals(&v["approvals"]));
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
                    .map(|r| format!(" ({r})"))
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
        .map(|w| format!(" (waiting for {w})"))
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
        v,
        &[
            "id",
            "application",
            "environment",
            "status",
            "phase",
            "queue",
            "executor_id",
            "created_at",
        ],
    )
}

/// The audit trail, newest first.
pub fn audit(v: &Value) -> String {
    table(v, &["at", "token", "action", "target", "outcome", "detail"])
}

pub fn queues(v: &Value) -> String {
    table(
        v,
        &[
            "name",
            "kind",
            "concurrency",
            "environment_concurrency",
            "global_concurrency",
            "enqueued",
            "running",
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
        v,
        &[
            "id",
            "application",
            "environment",
            "status",
            "phase",
            "executor_id",
            "updated_at",
        ],
    )
}

pub fn schedules(v: &Value) -> String {
    table(
        v,
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
    )
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
    table(v, &["application", "tenant", "environments"])
}
