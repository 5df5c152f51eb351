//! How the CLI prints: JSON as the API gave it, or tables for people, rendered from the
//! contract's types (`manent-contract`), field by field.

use std::{borrow::Borrow, io::Write};

use comfy_table::{ContentArrangement, Table, presets::UTF8_BORDERS_ONLY};
use manent_contract::{
    ApplicationView, ApprovalView, AuditEntry, DeployLogs, DeployStatus, OutputLine, OutputStream,
    QueueView, Recovered, Resubmitted, ScheduleDeleted, ScheduleView, Submitted, TenantView,
    WhoAmI, WorkerView,
};

use crate::client::Answer;

/// Prints `answer` ([`shown`]).
pub fn print<T: Borrow<B>, B: ?Sized>(
    json: bool,
    answer: &Answer<T>,
    human: impl Fn(&B) -> String,
) {
    print_line(&shown(json, answer, human));
}

/// `answer` as printed: its JSON as the server sent it (`--output json`), or `human` of
/// its typed body.
pub fn shown<T: Borrow<B>, B: ?Sized>(
    json: bool,
    answer: &Answer<T>,
    human: impl Fn(&B) -> String,
) -> String {
    if json {
        serde_json::to_string_pretty(&answer.json).unwrap_or_default()
    } else {
        human(answer.body.borrow())
    }
}

/// One line of a deploy's output as `logs` shows it: `source | line`, `!` for stderr,
/// `·` for a plugin's progress.
pub fn output_line(line: &OutputLine) -> String {
    let mark = match line.stream {
        OutputStream::Stderr => "!",
        OutputStream::Progress => "·",
        _ => "|",
    };
    format!(
        "{} {} {mark} {}",
        terminal_safe(&line.at),
        terminal_safe(&line.source),
        terminal_safe(&line.line)
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

/// A cell of a table: anything shown as text, made safe for a terminal.
trait Cell {
    fn cell(&self) -> String;
}

impl Cell for str {
    fn cell(&self) -> String {
        terminal_safe(self)
    }
}

impl Cell for String {
    fn cell(&self) -> String {
        terminal_safe(self)
    }
}

/// Absent is `-`.
impl<T: Cell> Cell for Option<T> {
    fn cell(&self) -> String {
        self.as_ref().map_or_else(|| "-".to_string(), Cell::cell)
    }
}

/// A list is its items joined by commas.
impl<T: Cell> Cell for Vec<T> {
    fn cell(&self) -> String {
        self.iter().map(Cell::cell).collect::<Vec<_>>().join(",")
    }
}

macro_rules! display_cells {
    ($($t:ty),+) => {
        $(impl Cell for $t {
            fn cell(&self) -> String {
                terminal_safe(&self.to_string())
            }
        })+
    };
}
display_cells!(
    bool,
    i64,
    u32,
    manent_contract::WorkflowStatus,
    manent_contract::Phase,
    manent_contract::TargetState,
    manent_contract::StepStatus,
    manent_contract::WorkerState,
    manent_contract::QueueKind,
    manent_contract::RedeployKind,
    manent_contract::Decision,
    manent_contract::SubmittedStatus,
    manent_contract::Role
);

/// A table with `columns` (upper-cased as headers) and one row of cells per item.
fn table<T>(items: &[T], columns: &[&str], row: impl Fn(&T) -> Vec<String>) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    // Wraps cells to the terminal's width; a pipe or file gets full lines.
    t.set_content_arrangement(ContentArrangement::Dynamic);
    t.set_header(columns.iter().map(|c| c.to_uppercase()));
    for item in items {
        t.add_row(row(item));
    }
    t.to_string()
}

pub fn submitted(s: &Submitted) -> String {
    format!(
        "{}  {}  queue {}",
        s.id.cell(),
        s.status.cell(),
        s.queue.cell()
    )
}

pub fn status(d: &DeployStatus) -> String {
    let mut out = format!(
        "deploy {}\n  {} / {}  {}  phase {}  queue {}  worker {}{}\n",
        d.id.cell(),
        d.application.cell(),
        d.environment.cell(),
        d.status.cell(),
        d.phase.cell(),
        d.queue.cell(),
        d.executor_id.cell(),
        if d.dry_run { "  (dry run)" } else { "" },
    );
    if let Some(error) = &d.error {
        out.push_str(&format!("  error: {}\n", error.cell()));
    }
    if let Some(of) = &d.redeploy_of {
        out.push_str(&format!("  {} of {}\n", d.redeploy_kind.cell(), of.cell()));
    }
    if let Some(waiting) = &d.waiting_for {
        out.push_str(&format!("  waiting for {}\n", waiting.cell()));
    }
    out.push_str(&approvals(&d.approvals));
    for a in &d.artifacts {
        out.push_str(&format!(
            "  artifact {} ({} {}) from {} sha256 {}\n",
            a.name.cell(),
            a.artifact_type.cell(),
            a.version.cell(),
            a.url.cell(),
            a.sha256.cell(),
        ));
    }
    for (key, value) in &d.overrides {
        // Shown in full: an approver must see every command a deployer chose.
        out.push_str(&format!(
            "  overrides deploy.{}: {}\n",
            key.cell(),
            value.to_string().cell()
        ));
    }
    if let Some(now) = &d.deployed_now {
        out.push_str(&format!("  deployed there now: {}\n", now.cell()));
    }
    out.push_str(&table(&d.targets, &["name", "status", "detail"], |t| {
        vec![t.name.cell(), t.status.cell(), t.detail.cell()]
    }));
    out.push('\n');
    out.push_str(&table(
        &d.steps,
        &[
            "name",
            "status",
            "attempts",
            "started_at",
            "finished_at",
            "executor_id",
        ],
        |s| {
            vec![
                s.name.cell(),
                s.status.cell(),
                s.attempts.cell(),
                s.started_at.cell(),
                s.finished_at.cell(),
                s.executor_id.cell(),
            ]
        },
    ));
    out
}

/// `  approved by alice at … (comment)` lines, one per decision.
fn approvals(approvals: &[ApprovalView]) -> String {
    approvals
        .iter()
        .map(|a| {
            format!(
                "  {} by {} at {}{}\n",
                a.decision.cell(),
                a.by.cell(),
                a.at.cell(),
                a.reason
                    .as_deref()
                    .map(|r| format!(" ({})", r.cell()))
                    .unwrap_or_default()
            )
        })
        .collect()
}

pub fn progress_line(d: &DeployStatus) -> String {
    let targets: Vec<String> = d
        .targets
        .iter()
        .map(|t| format!("{}={}", t.name.cell(), t.status.cell()))
        .collect();
    let waiting = d
        .waiting_for
        .as_deref()
        .map(|w| format!(" (waiting for {})", w.cell()))
        .unwrap_or_default();
    format!(
        "{} {} phase={}{waiting} {}",
        d.id.cell(),
        d.status.cell(),
        d.phase.cell(),
        targets.join(" ")
    )
}

pub fn logs(logs: &DeployLogs) -> String {
    logs.lines
        .iter()
        .map(Cell::cell)
        .collect::<Vec<_>>()
        .join("\n")
}

/// `850ms`, `12.4s`, `3m05s`, `2h10m`; `-` while a deploy has not ended.
fn duration_cell(d: &DeployStatus) -> String {
    d.duration_ms.map(duration).cell()
}

/// The columns a deploy starts with in `list` and `activity`, and its cells.
const DEPLOY_COLUMNS: [&str; 8] = [
    "id",
    "application",
    "environment",
    "version",
    "status",
    "phase",
    "dry_run",
    "duration",
];

/// A table of deploys: [`DEPLOY_COLUMNS`], then `more` columns with their cells.
fn deploy_table<const N: usize>(
    deploys: &[DeployStatus],
    more: [&str; N],
    more_cells: impl Fn(&DeployStatus) -> [String; N],
) -> String {
    let columns: Vec<&str> = DEPLOY_COLUMNS.iter().copied().chain(more).collect();
    table(deploys, &columns, |d| {
        let mut cells = vec![
            d.id.cell(),
            d.application.cell(),
            d.environment.cell(),
            d.version.cell(),
            d.status.cell(),
            d.phase.cell(),
            d.dry_run.cell(),
            duration_cell(d),
        ];
        cells.extend(more_cells(d));
        cells
    })
}

pub fn deploys(deploys: &[DeployStatus]) -> String {
    deploy_table(deploys, ["queue", "executor_id", "created_at"], |d| {
        [d.queue.cell(), d.executor_id.cell(), d.created_at.cell()]
    })
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
pub fn history(deploys: &[DeployStatus]) -> String {
    table(
        deploys,
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
        |d| {
            // `rollback of <id>` / `redeploy of <id>`: where a resubmitted deploy came from.
            let origin = match (&d.redeploy_kind, &d.redeploy_of) {
                (Some(kind), Some(of)) => Some(format!("{kind} of {of}")),
                _ => None,
            };
            vec![
                d.version.cell(),
                d.status.cell(),
                d.id.cell(),
                d.submitted_by.cell(),
                d.created_at.cell(),
                duration_cell(d),
                d.dry_run.cell(),
                origin.cell(),
            ]
        },
    )
}

/// A rollback's or redeploy's new deploy and what it resubmitted.
pub fn resubmitted(r: &Resubmitted) -> String {
    format!(
        "{} of {} (version {}): {}",
        r.redeploy_kind.cell(),
        r.redeploy_of.cell(),
        r.version.cell(),
        submitted(&r.submitted)
    )
}

pub fn recovered(r: &Recovered) -> String {
    format!(
        "recovered: {}",
        serde_json::Value::from(r.recovered.clone())
    )
}

/// The audit trail, newest first.
pub fn audit(entries: &[AuditEntry]) -> String {
    table(
        entries,
        &[
            "seq", "at", "token", "action", "target", "outcome", "detail",
        ],
        |e| {
            vec![
                e.seq.cell(),
                e.at.cell(),
                e.token.cell(),
                e.action.cell(),
                e.target.cell(),
                e.outcome.cell(),
                e.detail.cell(),
            ]
        },
    )
}

pub fn queues(queues: &[QueueView]) -> String {
    table(
        queues,
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
        |q| {
            // One column with each limit's use, e.g. `worker 3/4, env 1/1, total 5/8,
            // queue 2/2`.
            let used: Vec<String> = q
                .limits
                .iter()
                .map(|l| {
                    let short = match l.key.as_str() {
                        "dbos.concurrency" => "worker",
                        "dbos.environment_concurrency" => "env",
                        "dbos.global_concurrency" => "total",
                        _ => "queue",
                    };
                    format!("{short} {}/{}", l.in_use, l.limit.cell())
                })
                .collect();
            vec![
                q.name.cell(),
                q.kind.cell(),
                q.concurrency.cell(),
                q.environment_concurrency.cell(),
                q.global_concurrency.cell(),
                q.enqueued.cell(),
                q.running.cell(),
                used.join(", ").cell(),
                q.workers.cell(),
            ]
        },
    )
}

pub fn workers(workers: &[WorkerView]) -> String {
    table(
        workers,
        &[
            "executor_id",
            "host",
            "region",
            "state",
            "heartbeat_at",
            "running",
            "stale",
        ],
        |w| {
            vec![
                w.executor_id.cell(),
                w.host.cell(),
                w.region.cell(),
                w.state.cell(),
                w.heartbeat_at.cell(),
                w.running.cell(),
                w.stale.cell(),
            ]
        },
    )
}

pub fn activity(deploys: &[DeployStatus]) -> String {
    deploy_table(deploys, ["executor_id", "updated_at"], |d| {
        [d.executor_id.cell(), d.updated_at.cell()]
    })
}

pub fn schedules(schedules: &[ScheduleView]) -> String {
    let (unreadable, readable): (Vec<&ScheduleView>, Vec<&ScheduleView>) =
        schedules.iter().partition(|s| s.error.is_some());
    let table = table(
        &readable,
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
        |s| {
            vec![
                s.id.cell(),
                s.application.cell(),
                s.environment.cell(),
                s.cron.cell(),
                s.timezone.cell(),
                s.next_tick.cell(),
                s.last_tick.cell(),
                s.paused.cell(),
                s.queue.cell(),
            ]
        },
    );
    // A stored schedule that cannot be read is listed with its reason, below the table.
    let unreadable: String = unreadable
        .iter()
        .map(|s| {
            format!(
                "\nschedule {} cannot be read: {}",
                s.id.cell(),
                s.error.cell()
            )
        })
        .collect();
    // The latest refused tick of each schedule, with its reason, below the table too.
    let refused: String = readable
        .iter()
        .filter_map(|s| s.refused_ticks.last().map(|r| (s, r)))
        .map(|(s, r)| {
            format!(
                "\nschedule {}: tick {} refused: {}",
                s.id.cell(),
                r.tick.cell(),
                r.reason.cell()
            )
        })
        .collect();
    table + &unreadable + &refused
}

pub fn schedule(s: &ScheduleView) -> String {
    let refused: String = s
        .refused_ticks
        .iter()
        .map(|r| format!("\n  tick {} refused: {}", r.tick.cell(), r.reason.cell()))
        .collect();
    format!(
        "schedule {}  {} / {}  cron {} ({})  {}  next tick {}{refused}",
        s.id.cell(),
        s.application.cell(),
        s.environment.cell(),
        s.cron.cell(),
        s.timezone.cell(),
        if s.paused { "paused" } else { "active" },
        s.next_tick.cell(),
    )
}

pub fn schedule_deleted(s: &ScheduleDeleted) -> String {
    format!(
        "schedule {} {}",
        s.id.cell(),
        if s.deleted {
            "deleted"
        } else {
            "was already gone"
        }
    )
}

pub fn whoami(me: &WhoAmI) -> String {
    table(std::slice::from_ref(me), &["name", "role", "scope"], |m| {
        vec![
            m.name.cell(),
            m.role.cell(),
            m.scope.as_deref().unwrap_or("*").cell(),
        ]
    })
}

pub fn tenants(tenants: &[TenantView]) -> String {
    table(
        tenants,
        &["name", "queue", "declared", "applications"],
        |t| {
            vec![
                t.name.cell(),
                t.queue.cell(),
                t.declared.cell(),
                t.applications.cell(),
            ]
        },
    )
}

pub fn applications(applications: &[ApplicationView]) -> String {
    table(
        applications,
        &["application", "tenant", "environments", "live"],
        |a| {
            // `prod 1.0, staging 1.1`: the version live in each environment that had a
            // success.
            let live: Vec<String> = a
                .live
                .iter()
                .map(|(environment, live)| format!("{} {}", environment, live.version))
                .collect();
            vec![
                a.application.cell(),
                a.tenant.cell(),
                a.environments.cell(),
                live.join(", ").cell(),
            ]
        },
    )
}

#[cfg(test)]
mod tests;
