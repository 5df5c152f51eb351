//! `manent plan`, `manent drift` and `manent reconcile` (docs/plan-and-drift.md): the
//! requests they send, what they print and their exit codes.

use std::path::Path;

use manent_contract::{DriftState, DriftView, PlanView, Resubmitted, WorkflowStatus};

use crate::{
    Command,
    client::{Answer, ApiClient, CliError},
    deploy_path, environment_path, follow, read_descriptor, render,
    render::{Names, Style, terminal_safe},
};

impl Names for PlanView {
    fn names(&self) -> Vec<String> {
        self.targets.iter().map(|t| t.name.clone()).collect()
    }
}

impl Names for DriftView {
    fn names(&self) -> Vec<String> {
        self.targets
            .iter()
            .filter(|t| t.state != DriftState::InSync)
            .map(|t| t.name.clone())
            .collect()
    }
}

/// `manent plan`, `drift` and `reconcile`.
pub async fn dispatch(api: &ApiClient, command: Command, style: &Style) -> Result<u8, CliError> {
    match command {
        Command::Plan { file } => plan(api, &file, style).await,
        Command::Drift {
            application,
            environment,
            last,
        } => drift(api, (&application, &environment), last, style).await,
        Command::Reconcile {
            application,
            environment,
            wait,
        } => reconcile(api, (&application, &environment), wait, style).await,
        _ => unreachable!("dispatched here only for plan, drift and reconcile"),
    }
}

/// `manent plan -f F`: the descriptor submitted as a dry run, followed to its end, and its
/// plan printed. Exit 0 when the dry run succeeded, 1 otherwise (its error on stderr).
pub async fn plan(api: &ApiClient, file: &Path, style: &Style) -> Result<u8, CliError> {
    let text = read_descriptor(file)?;
    let created = api.submit(&text, file, true).await?;
    let status = follow(api, &created.body.id, style).await?;
    let plan: Answer<PlanView> = api.get(&deploy_path(&created.body.id, "/plan")).await?;
    render::print(style, &plan, show_plan);
    if status.body.status == WorkflowStatus::Success {
        Ok(0)
    } else {
        eprintln!(
            "the dry run {} ended {}: {}",
            created.body.id,
            status.body.status.as_str(),
            terminal_safe(status.body.error.as_deref().unwrap_or("see manent logs"))
        );
        Ok(1)
    }
}

fn show_plan(_: &Style, plan: &PlanView) -> String {
    let mut out = Vec::new();
    for target in &plan.targets {
        out.push(format!(
            "{} (live {})",
            terminal_safe(&target.name),
            terminal_safe(target.live_version.as_deref().unwrap_or("none"))
        ));
        for c in &target.changes {
            let from = c.from.as_deref().map(short).unwrap_or_else(|| "-".into());
            let to = c.to.as_deref().map(short).unwrap_or_else(|| "-".into());
            let note = c
                .note
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default();
            out.push(terminal_safe(&format!(
                "  {:<9} {}: {from} -> {to}{note}",
                c.kind.as_str(),
                c.name
            )));
        }
    }
    if out.is_empty() {
        out.push("no target planned (the dry run ran under a workflow version before 6?)".into());
    }
    out.extend(render::analysis::planned(&plan.analysis));
    out.join("\n")
}

/// A sha256 shortened to 12 characters; other values as they are.
fn short(value: &str) -> String {
    let hex = value.strip_prefix("sha256:").unwrap_or(value);
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        format!("{}…", &value[..value.len() - 52])
    } else {
        value.to_string()
    }
}

/// `manent drift APP ENV [--last]`: a check now (or the last result) printed; exit 0 only
/// when every target is in sync.
pub async fn drift(
    api: &ApiClient,
    (application, environment): (&str, &str),
    last: bool,
    style: &Style,
) -> Result<u8, CliError> {
    let path = environment_path(application, environment, "drift")?;
    let report: Answer<DriftView> = if last {
        api.get(&path).await?
    } else {
        api.post(&path, &serde_json::Value::Null).await?
    };
    render::print(style, &report, show_drift);
    Ok(if report.body.state == DriftState::InSync {
        0
    } else {
        1
    })
}

fn show_drift(_: &Style, report: &DriftView) -> String {
    let mut out = vec![format!(
        "{} {}: {} (checked {})",
        report.application,
        report.environment,
        report.state.as_str(),
        report.checked_at
    )];
    for t in &report.targets {
        let detail = t
            .detail
            .as_deref()
            .map(|d| format!(": {d}"))
            .unwrap_or_default();
        out.push(format!("{} {}{detail}", t.name, t.state.as_str()));
        for d in &t.differences {
            out.push(format!(
                "  {}: {} -> {}",
                d.path,
                d.expected
                    .as_deref()
                    .map(short)
                    .unwrap_or_else(|| "(none)".into()),
                d.found
                    .as_deref()
                    .map(short)
                    .unwrap_or_else(|| "(none)".into())
            ));
        }
    }
    terminal_safe(&out.join("\n"))
}

/// `manent reconcile APP ENV [--wait]`: the live version deployed again to the drifted
/// targets only.
pub async fn reconcile(
    api: &ApiClient,
    (application, environment): (&str, &str),
    wait: bool,
    style: &Style,
) -> Result<u8, CliError> {
    let path = environment_path(application, environment, "reconcile")?;
    let created: Answer<Resubmitted> = api.post(&path, &serde_json::Value::Null).await?;
    crate::resubmitted(api, created, wait, style).await
}
