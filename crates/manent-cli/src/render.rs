//! How the CLI prints: the answer as the API gave it (`-o json`, `-o yaml`), its names
//! (`-o name`), or plain aligned columns for people (`-o table`, `-o wide`), rendered from
//! the contract's types (`manent-contract`), field by field. docs/cli.md describes the
//! formats.

use std::{borrow::Borrow, io::Write};

use chrono::{DateTime, Utc};
use comfy_table::{ColumnConstraint, ContentArrangement, Row, Table, Width, presets::NOTHING};
use manent_contract::{
    ApplicationView, ApprovalView, AuditEntry, DeployLogs, DeployStatus, OutputLine, OutputStream,
    QueueView, Recovered, Resubmitted, ScheduleDeleted, ScheduleView, Submitted, TargetView,
    TenantView, WhoAmI, WorkerView,
};

use crate::client::Answer;

pub(crate) mod analysis;
mod approval_plan;
mod containers;
mod fleet;

pub use fleet::{
    activity, applications, queues, schedule, schedule_deleted, schedules, tenants, whoami, workers,
};

/// What `--output` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Plain aligned columns: short ids, relative times, rows cut to the terminal's width.
    Table,
    /// The same columns and more, with whole ids and times, never cut.
    Wide,
    /// The answer as the server sent it, one document (one per line while following).
    Json,
    /// The same document as YAML (one `---` document each while following).
    Yaml,
    /// Only the names (ids) of what is shown, one per line, for `xargs` and `while read`.
    Name,
}

/// How wide a table may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// The terminal's width.
    Terminal,
    /// This many columns (`COLUMNS`).
    Columns(u16),
    /// Full lines (a pipe, a file).
    Unlimited,
}

/// How an answer is printed: the format, headers or not, the width to fit, and the time
/// relative times are counted from.
#[derive(Clone, Copy, Debug)]
pub struct Style {
    pub format: Format,
    pub headers: bool,
    pub fit: Fit,
    pub now: DateTime<Utc>,
}

impl Style {
    /// Whether the answer is printed as a document (JSON or YAML) rather than for people.
    pub fn is_document(&self) -> bool {
        matches!(self.format, Format::Json | Format::Yaml)
    }

    fn wide(&self) -> bool {
        self.format == Format::Wide
    }

    /// A deploy's or schedule's id as a table shows it: whole with `-o wide`, else short
    /// ([`short_id`]); every short id is also a prefix the CLI resolves.
    fn id(&self, id: &str) -> String {
        if self.wide() {
            id.cell()
        } else {
            short_id(id).cell()
        }
    }

    /// An optional id, `-` when absent.
    fn id_or_dash(&self, id: Option<&str>) -> String {
        id.map_or_else(|| "-".to_string(), |id| self.id(id))
    }

    /// An RFC 3339 time as a table shows it: as sent with `-o wide`, else relative to now
    /// (`5m ago`, `in 2h`); `-` when absent.
    fn time(&self, at: Option<&str>) -> String {
        let Some(at) = at else {
            return "-".to_string();
        };
        if self.wide() {
            return at.cell();
        }
        match DateTime::parse_from_rfc3339(at) {
            Ok(then) => relative(self.now, then.with_timezone(&Utc)),
            Err(_) => at.cell(),
        }
    }
}

/// Characters of a whole id kept in its short form.
const SHORT_ID: usize = 8;

/// An id's short form: the first 8 characters of a deploy's UUID; `sch-` and 8 of a
/// schedule's; a scheduled run (`<schedule>@<tick>`) keeps its tick, since every run of a
/// schedule shares the schedule's id. `resolve` in main.rs accepts each of these.
pub fn short_id(id: &str) -> String {
    let (head, tick) = match id.split_once('@') {
        Some((head, tick)) => (head, Some(tick)),
        None => (id, None),
    };
    let keep = if head.starts_with("sch-") {
        4 + SHORT_ID
    } else {
        SHORT_ID
    };
    let short: String = head.chars().take(keep).collect();
    match tick {
        Some(tick) => format!("{short}@{tick}"),
        None => short,
    }
}

/// `12s ago`, `5m ago`, `3h ago`, `4d ago`; `in 5m` for a time to come.
fn relative(now: DateTime<Utc>, then: DateTime<Utc>) -> String {
    let seconds = (now - then).num_seconds();
    let amount = |s: i64| match s {
        ..60 => format!("{s}s"),
        60..3_600 => format!("{}m", s / 60),
        3_600..86_400 => format!("{}h", s / 3_600),
        _ => format!("{}d", s / 86_400),
    };
    if seconds >= 0 {
        format!("{} ago", amount(seconds))
    } else {
        format!("in {}", amount(-seconds))
    }
}

/// What `-o name` prints of an answer: the ids (or names) of what it shows.
pub trait Names {
    fn names(&self) -> Vec<String>;
}

impl<T: Names> Names for [T] {
    fn names(&self) -> Vec<String> {
        self.iter().flat_map(Names::names).collect()
    }
}

impl<T: Names> Names for Vec<T> {
    fn names(&self) -> Vec<String> {
        self.as_slice().names()
    }
}

macro_rules! named_by {
    ($($t:ty => $field:ident),+ $(,)?) => {
        $(impl Names for $t {
            fn names(&self) -> Vec<String> {
                vec![self.$field.to_string()]
            }
        })+
    };
}
named_by!(
    DeployStatus => id,
    DeployLogs => id,
    Submitted => id,
    QueueView => name,
    WorkerView => executor_id,
    WhoAmI => name,
    TenantView => name,
    ApplicationView => application,
    ScheduleView => id,
    ScheduleDeleted => id,
    AuditEntry => seq,
    manent_contract::VariableView => name,
);

impl Names for Resubmitted {
    fn names(&self) -> Vec<String> {
        self.submitted.names()
    }
}

impl Names for Recovered {
    fn names(&self) -> Vec<String> {
        self.recovered.clone()
    }
}

/// Prints `answer` ([`shown`]), its relative times counted from the moment it is printed:
/// a command that followed a deploy for minutes prints its final state against the clock of
/// then, not of its start (a step that finished would read "in 5s").
pub fn print<T: Borrow<B>, B: ?Sized + Names>(
    style: &Style,
    answer: &Answer<T>,
    human: impl Fn(&Style, &B) -> String,
) {
    let style = Style {
        now: Utc::now(),
        ..*style
    };
    print_line(&shown(&style, answer, human));
}

/// `answer` as printed: its JSON as the server sent it (`-o json`), the same as YAML, its
/// names, or `human` of its typed body.
pub fn shown<T: Borrow<B>, B: ?Sized + Names>(
    style: &Style,
    answer: &Answer<T>,
    human: impl Fn(&Style, &B) -> String,
) -> String {
    match style.format {
        Format::Json => serde_json::to_string_pretty(&answer.json).unwrap_or_default(),
        Format::Yaml => yaml(&answer.json),
        Format::Name => answer.body.borrow().names().join("\n"),
        Format::Table | Format::Wide => human(style, answer.body.borrow()),
    }
}

/// One document of a stream (`logs -f`): JSON on one line, or a YAML document.
pub fn document(style: &Style, value: &serde_json::Value) -> String {
    match style.format {
        Format::Yaml => format!("---\n{}", yaml(value)),
        _ => value.to_string(),
    }
}

fn yaml(value: &serde_json::Value) -> String {
    let text = yaml_serde::to_string(value).unwrap_or_default();
    text.trim_end_matches('\n').to_string()
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
/// window or ring the bell of whoever reads `manent logs`. So is an invisible or
/// direction-changing character ([`is_invisible_format`]): a line cannot read backwards
/// (U+202E), hide a word or break where no newline is (docs/security.md, "Terminal safety").
pub fn terminal_safe(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if (c.is_control() && c != '\n' && c != '\t') || is_invisible_format(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// The characters that change how a line reads without showing themselves: the
/// bidirectional embeddings, overrides, isolates and marks, the zero-width ones, the line
/// and paragraph separators (U+2028, U+2029, which some terminals and viewers break on),
/// the invisible operators, the interlinear annotations and the tag characters.
fn is_invisible_format(c: char) -> bool {
    matches!(c,
        '\u{061C}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}'
        | '\u{E0000}'..='\u{E007F}')
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

/// The fewest characters a cut cell keeps.
const CUT_TO: usize = 12;

/// A table with `columns` (upper-cased as headers) and one row of cells per item: plain
/// columns three spaces apart, no borders, no trailing spaces. In `-o table` on a
/// terminal, the columns on the right are left out while even their headers would not fit,
/// then cells are cut (`…`) so that each row fits on one line; the first column (the id)
/// and the headers are never cut. Callers list columns most important first.
pub(crate) fn table<T>(
    style: &Style,
    items: &[T],
    columns: &[&str],
    row: impl Fn(&T) -> Vec<String>,
) -> String {
    let mut rows: Vec<Vec<String>> = items.iter().map(row).collect();
    let headers: Vec<String> = columns.iter().map(|c| c.to_uppercase()).collect();
    let mut t = Table::new();
    t.load_preset(NOTHING);
    let fit = !style.wide();
    let width = match style.fit {
        Fit::Terminal => t.width(),
        Fit::Columns(width) => Some(width),
        Fit::Unlimited => {
            t.force_no_tty();
            None
        }
    };
    // The narrowest each column may be: its header, and its widest cell up to
    // [`CUT_TO`] characters (so a status or an age is never cut); the first (the id) whole.
    let least: Vec<usize> = headers
        .iter()
        .enumerate()
        .map(|(i, header)| {
            let widest = rows
                .iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0);
            let cell = if i == 0 { widest } else { widest.min(CUT_TO) };
            cell.max(header.len())
        })
        .collect();
    let mut least = least;
    let mut kept = headers.len();
    if let (true, Some(width)) = (fit, width) {
        while kept > 1 && least[..kept].iter().sum::<usize>() + 3 * (kept - 1) > usize::from(width)
        {
            kept -= 1;
        }
        fold_into_status(&headers, &mut rows, &mut least, kept);
        while kept > 1 && least[..kept].iter().sum::<usize>() + 3 * (kept - 1) > usize::from(width)
        {
            kept -= 1;
        }
        t.set_content_arrangement(ContentArrangement::Dynamic);
        t.set_truncation_indicator("…");
        t.set_width(width);
    } else {
        t.set_content_arrangement(ContentArrangement::Disabled);
    }
    if style.headers {
        t.set_header(&headers[..kept]);
    }
    for cells in &mut rows {
        cells.truncate(kept);
        let mut cells = Row::from(std::mem::take(cells));
        if fit {
            cells.max_height(1);
        }
        t.add_row(cells);
    }
    if t.column_count() == 0 {
        return String::new();
    }
    let last = t.column_count() - 1;
    for (i, column) in t.column_iter_mut().enumerate() {
        // The last column's right padding is trimmed; counting it would waste a column.
        let padding = if i == last { 0 } else { 3 };
        column.set_padding((0, padding));
        if fit {
            // A constraint's width counts the padding.
            let least = u16::try_from(least[i] + usize::from(padding)).unwrap_or(u16::MAX);
            column.set_constraint(ColumnConstraint::LowerBoundary(Width::Fixed(least)));
        }
    }
    t.trim_fmt()
}

/// Columns whose news must survive a narrow terminal: when one is left out, a cell of it
/// that says something is told in the status cell instead (`SUCCESS (dry run)`, `SUCCESS
/// (rollback)`, `SUCCESS (irreversible)`), so a dry run never reads as a plain success at 80 columns.
const FOLDED_INTO_STATUS: &[(&str, CellNews)] = &[
    ("DRY_RUN", |cell| {
        (cell == "true").then(|| "dry run".to_owned())
    }),
    ("ORIGIN", |cell| {
        // `rollback of <id>` / `redeploy of <id>`: the kind is what the status needs.
        (cell != "-").then(|| cell.split_whitespace().next().unwrap_or(cell).to_owned())
    }),
    ("IRREVERSIBLE", |cell| {
        (cell != "-").then(|| "irreversible".to_owned())
    }),
];

/// What a left-out column's cell has to say in the status cell, if anything.
type CellNews = fn(&str) -> Option<String>;

/// Tells the news of the left-out columns (`kept` and after) in the status cell, and widens
/// the status column's floor so that what it now says is never cut.
fn fold_into_status(
    headers: &[String],
    rows: &mut [Vec<String>],
    least: &mut [usize],
    kept: usize,
) {
    let Some(status) = headers[..kept].iter().position(|h| h == "STATUS") else {
        return;
    };
    for row in rows.iter_mut() {
        let news: Vec<String> = FOLDED_INTO_STATUS
            .iter()
            .filter_map(|(header, said)| {
                let column = headers.iter().position(|h| h == header)?;
                (column >= kept).then(|| row.get(column).and_then(|c| said(c)))?
            })
            .collect();
        if !news.is_empty() {
            row[status] = format!("{} ({})", row[status], news.join(", "));
            least[status] = least[status].max(row[status].chars().count());
        }
    }
}

pub fn submitted(style: &Style, s: &Submitted) -> String {
    format!(
        "{}  {}  queue {}",
        style.id(&s.id),
        s.status.cell(),
        s.queue.cell()
    )
}

/// One deploy in full: what, where, who decided, which artifacts, its targets and steps.
/// Its own id is always whole: it is what `status` was asked about.
pub fn status(style: &Style, d: &DeployStatus) -> String {
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
    out.push_str(&format!(
        "  submitted by {} {}{}\n",
        d.submitted_by.cell(),
        style.time(Some(&d.created_at)),
        d.duration_ms
            .map(|ms| format!(", took {}", duration(ms)))
            .unwrap_or_default()
    ));
    if let Some(error) = &d.error {
        out.push_str(&format!("  error: {}\n", error.cell()));
    }
    if let Some(of) = &d.redeploy_of {
        out.push_str(&format!(
            "  {} of {}\n",
            d.redeploy_kind.cell(),
            style.id(of)
        ));
    }
    if let Some(waiting) = &d.waiting_for {
        out.push_str(&format!("  waiting for {}\n", waiting.cell()));
    }
    out.push_str(&approvals(style, &d.approvals));
    out.push_str(&analysis::section(style, d));
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
    out.push_str(&approval_plan::section(d));
    out.push('\n');
    out.push_str(&targets_by_role(style, d));
    out.push_str(&containers::section(style, d));
    out.push_str("\n\n");
    let mut columns = vec!["step", "status", "attempts", "started_at", "finished_at"];
    if style.wide() {
        columns.push("executor_id");
    }
    out.push_str(&table(style, &d.steps, &columns, |s| {
        let mut cells = vec![
            s.name.cell(),
            s.status.cell(),
            s.attempts.cell(),
            style.time(Some(&s.started_at)),
            style.time(s.finished_at.as_deref()),
        ];
        if style.wide() {
            cells.push(s.executor_id.cell());
        }
        cells
    }));
    // A step tried again says why: its last attempt's error (the failed ones' are the
    // deploy's error).
    for s in d
        .steps
        .iter()
        .filter(|s| s.status == manent_contract::StepStatus::Running)
    {
        if let Some(error) = &s.error {
            out.push_str(&format!("  step {}: {}\n", s.name.cell(), error.cell()));
        }
    }
    out
}

/// A target's state as the page words it too (docs/api.md, "Targets"): one a deploy ended
/// before reaching is "not started", not pending (it will not start any more).
fn target_status(d: &DeployStatus, t: &manent_contract::TargetView) -> String {
    if t.status == manent_contract::TargetState::Pending && d.status.is_terminal() {
        "not started".to_string()
    } else {
        t.status.cell()
    }
}

/// A deploy's targets: one table, or, when some have roles (docs/cli.md, "status"), one
/// table per set of roles, each under a `role db` (`roles db, web`) line, in order of first
/// appearance, the targets without a role last under `no role`.
fn targets_by_role(style: &Style, d: &DeployStatus) -> String {
    let targets = d.targets.as_slice();
    let rows = |targets: &[TargetView]| {
        table(style, targets, &["target", "status", "detail"], |t| {
            vec![t.name.cell(), target_status(d, t), t.detail.cell()]
        })
    };
    if targets.iter().all(|t| t.roles.is_empty()) {
        return rows(targets);
    }
    let mut groups: Vec<(&[String], Vec<TargetView>)> = Vec::new();
    for target in targets {
        match groups
            .iter_mut()
            .find(|(roles, _)| *roles == target.roles.as_slice())
        {
            Some((_, members)) => members.push(target.clone()),
            None => groups.push((target.roles.as_slice(), vec![target.clone()])),
        }
    }
    groups.sort_by_key(|(roles, _)| roles.is_empty());
    groups
        .iter()
        .map(|(roles, members)| {
            let heading = match roles.len() {
                0 => "no role".to_string(),
                1 => format!("role {}", roles[0].cell()),
                _ => format!("roles {}", roles.join(", ").cell()),
            };
            format!("{heading}\n{}", rows(members))
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// `  approved by alice 5m ago (comment)` lines, one per decision.
fn approvals(style: &Style, approvals: &[ApprovalView]) -> String {
    approvals
        .iter()
        .map(|a| {
            format!(
                "  {} by {} {}{}\n",
                a.decision.cell(),
                a.by.cell(),
                style.time(Some(&a.at)),
                a.reason
                    .as_deref()
                    .map(|r| format!(" ({})", r.cell()))
                    .unwrap_or_default()
            )
        })
        .collect()
}

/// The line a follower prints when a deploy's phase or a target's status changes.
pub fn progress_line(d: &DeployStatus) -> String {
    let targets: Vec<String> = d
        .targets
        .iter()
        .map(|t| format!("{}={}", t.name.cell(), target_status(d, t)))
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

pub fn logs(_: &Style, logs: &DeployLogs) -> String {
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

/// The columns every table of deploys starts with.
const DEPLOY_COLUMNS: [&str; 6] = [
    "id",
    "application",
    "environment",
    "version",
    "status",
    "phase",
];

/// A table of deploys: [`DEPLOY_COLUMNS`], then `more`, then with `-o wide` `wide_more`;
/// `more_cells` gives the cells of both.
fn deploy_table(
    style: &Style,
    deploys: &[DeployStatus],
    more: &[&str],
    wide_more: &[&str],
    more_cells: impl Fn(&DeployStatus) -> Vec<String>,
) -> String {
    let mut columns: Vec<&str> = DEPLOY_COLUMNS.iter().chain(more).copied().collect();
    if style.wide() {
        columns.extend(wide_more);
    }
    table(style, deploys, &columns, |d| {
        let mut cells = vec![
            style.id(&d.id),
            d.application.cell(),
            d.environment.cell(),
            d.version.cell(),
            d.status.cell(),
            d.phase.cell(),
        ];
        cells.extend(more_cells(d));
        cells.truncate(columns.len());
        cells
    })
}

/// `manent list`: recent deploys, newest first.
pub fn deploys(style: &Style, deploys: &[DeployStatus]) -> String {
    deploy_table(
        style,
        deploys,
        &["created_at", "duration", "submitted_by", "dry_run"],
        &["queue", "executor_id"],
        |d| {
            vec![
                style.time(Some(&d.created_at)),
                duration_cell(d),
                d.submitted_by.cell(),
                d.dry_run.cell(),
                d.queue.cell(),
                d.executor_id.cell(),
            ]
        },
    )
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
/// `manent vars`: target, name, value and source of each variable.
pub fn variables(style: &Style, rows: &[manent_contract::VariableView]) -> String {
    table(style, rows, &["target", "name", "value", "source"], |v| {
        vec![
            v.target.clone(),
            v.name.clone(),
            v.value.clone(),
            v.source.clone(),
        ]
    })
}

pub fn history(style: &Style, deploys: &[DeployStatus]) -> String {
    table(
        style,
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
            "irreversible",
        ],
        |d| {
            // `rollback of <id>` / `redeploy of <id>`: where a resubmitted deploy came from.
            let origin = match (&d.redeploy_kind, &d.redeploy_of) {
                (Some(kind), Some(of)) => Some(format!("{kind} of {}", style.id(of))),
                _ => None,
            };
            vec![
                d.version.cell(),
                d.status.cell(),
                style.id(&d.id),
                d.submitted_by.cell(),
                style.time(Some(&d.created_at)),
                duration_cell(d),
                d.dry_run.cell(),
                origin.cell(),
                // The reason a rollback past it is refused (docs/environments.md).
                d.irreversible.cell(),
            ]
        },
    )
}

/// A rollback's or redeploy's new deploy and what it resubmitted.
pub fn resubmitted(style: &Style, r: &Resubmitted) -> String {
    format!(
        "{} of {} (version {}): {}",
        r.redeploy_kind.cell(),
        style.id(&r.redeploy_of),
        r.version.cell(),
        submitted(style, &r.submitted)
    )
}

pub fn recovered(_: &Style, r: &Recovered) -> String {
    match r.recovered.len() {
        0 => "recovered: no deploy (none was pending on that executor)".to_owned(),
        n => format!(
            "recovered {n} deploy{}: {}",
            if n == 1 { "" } else { "s" },
            r.recovered.join(", ")
        ),
    }
}

/// The audit trail, newest first.
pub fn audit(style: &Style, entries: &[AuditEntry]) -> String {
    table(
        style,
        entries,
        &[
            "seq", "at", "token", "action", "target", "outcome", "detail",
        ],
        |e| {
            vec![
                e.seq.cell(),
                style.time(Some(&e.at)),
                e.token.cell(),
                e.action.cell(),
                e.target.cell(),
                e.outcome.cell(),
                e.detail.cell(),
            ]
        },
    )
}

#[cfg(test)]
mod tests;
