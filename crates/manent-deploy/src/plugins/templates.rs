//! The templates of a deploy written onto one target by the built-in plugins: one durable
//! step `<target>: template <dest>` each, after the uploads and before `activate` (with
//! `remote-copy`) or before the first command (with `command`), from what the run rendered
//! before any target changed (docs/environments.md, "Templates"). A template under the
//! release directory is never written through a symbolic link where a directory belongs.

use std::time::Duration;

use manent_engine::{StepPolicy, WorkflowContext, WorkflowError};
use manent_model::Target;

use super::PassContext;
use crate::request::VARS_VERSION;
use crate::run::{release_scripts, targets};
use crate::vars::{run_values, writing};

/// Why writing a template onto a target failed.
#[derive(Debug, thiserror::Error)]
enum TemplateStepError {
    #[error(transparent)]
    Target(#[from] targets::TargetError),
    #[error(transparent)]
    Write(#[from] writing::WriteError),
}

impl TemplateStepError {
    fn is_transient(&self) -> bool {
        match self {
            TemplateStepError::Target(e) => e.is_transient(),
            TemplateStepError::Write(e) => e.is_transient(),
        }
    }
}

/// Writes the deploy's templates onto `target`, each in a step of its own; the lines say
/// what was written. Nothing without templates, or under a workflow version before them.
pub(crate) async fn write_templates(
    ctx: &WorkflowContext,
    pass: &PassContext<'_>,
    target: &Target,
) -> Result<Vec<String>, WorkflowError> {
    let eff = pass.eff;
    if eff.templates.is_empty() || ctx.workflow_version() < VARS_VERSION {
        return Ok(Vec::new());
    }
    let rendered = run_values::current()
        .and_then(|values| values.rendered(&target.name))
        .ok_or_else(|| {
            WorkflowError::failed(format!(
                "target {}: its templates were not rendered in this run",
                target.name
            ))
        })?;
    let staging = pass.dir.join("templates");
    let mut lines = Vec::new();
    for (template, rendered) in eff.templates.iter().zip(rendered.iter()) {
        let step = format!("{}: template {}", target.name, template.dest);
        let line: String = ctx
            .step_retrying_if(
                &step,
                StepPolicy::retry(3, Duration::from_secs(1)).recording_start(),
                TemplateStepError::is_transient,
                || async {
                    let conn = targets::connection(pass.pool, eff, target).await?;
                    if !template.dest.starts_with('/') {
                        refuse_linked(conn.as_ref(), pass, target, &template.dest).await?;
                    }
                    Ok::<_, TemplateStepError>(
                        writing::write(conn.as_ref(), rendered, &staging).await?,
                    )
                },
            )
            .await?;
        lines.push(line);
    }
    Ok(lines)
}

/// Fails naming the link when the release directory, a directory above it up to the
/// releases' root, or a directory of `dest` inside the release is a symbolic link.
async fn refuse_linked(
    conn: &dyn manent_ssh::Connection,
    pass: &PassContext<'_>,
    target: &Target,
    dest: &str,
) -> Result<(), targets::TargetError> {
    let mut directories = release_scripts::release_directories(pass.eff, target);
    if let Some(release) = directories.last().cloned() {
        let parts: Vec<&str> = dest.split('/').collect();
        for n in 1..parts.len() {
            directories.push(format!("{release}/{}", parts[..n].join("/")));
        }
    }
    let checked = conn
        .exec(&release_scripts::refuse_linked(&directories), &[])
        .await
        .map_err(|e| targets::TargetError::Transport(e.to_string()))?;
    if checked.status == release_scripts::RELEASE_LINKED {
        return Err(targets::TargetError::LinkedDirectory(
            checked.stdout.trim_end_matches('\n').to_string(),
        ));
    }
    Ok(())
}
