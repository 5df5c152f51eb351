//! The plan of a deploy waiting for approval in `manent status` (docs/plan-and-drift.md,
//! "The plan shown to approvers"): per target, the version from → to, the artifacts, the
//! changed files (counted, the first few named), templates and variables (secrets `***`).

use manent_contract::{ChangeView, DeployStatus};

use super::Cell;

/// A sha256 shortened for a line; anything else as it is.
fn short(value: Option<&String>) -> String {
    match value {
        Some(v) if v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()) => {
            format!("{}…", &v[..12])
        }
        Some(v) => v.cell().to_string(),
        None => "none".into(),
    }
}

fn change(out: &mut String, what: &str, c: &ChangeView) {
    out.push_str(&format!(
        "      {what} {}: {} -> {}{}\n",
        c.name.cell(),
        short(c.from.as_ref()),
        short(c.to.as_ref()),
        c.note
            .as_ref()
            .map(|n| format!(" ({})", n.cell()))
            .unwrap_or_default()
    ));
}

/// `plan` lines, one block per target; empty without a plan.
pub(super) fn section(d: &DeployStatus) -> String {
    let Some(plan) = &d.plan else {
        return String::new();
    };
    let mut out = String::from("  plan (what approving would change):\n");
    for t in &plan.targets {
        out.push_str(&format!(
            "    {}: {} -> {}\n",
            t.name.cell(),
            t.from_version
                .as_ref()
                .map(|v| v.cell().to_string())
                .unwrap_or_else(|| "nothing recorded".into()),
            t.to_version.cell()
        ));
        for c in &t.artifacts {
            change(&mut out, "artifact", c);
        }
        if t.files_changed > 0 {
            let more = t.files_changed.saturating_sub(t.files.len() as u64);
            out.push_str(&format!(
                "      {} file(s) would change: {}{}\n",
                t.files_changed,
                t.files
                    .iter()
                    .map(|f| f.cell().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ));
        }
        for c in &t.templates {
            change(&mut out, "template", c);
        }
        for c in &t.variables {
            change(&mut out, "variable", c);
        }
    }
    if plan.more_targets > 0 {
        out.push_str(&format!("    and {} more target(s)\n", plan.more_targets));
    }
    if let Some(note) = &plan.note {
        out.push_str(&format!("    note: {}\n", note.cell()));
    }
    out
}
