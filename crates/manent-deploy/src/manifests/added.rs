//! The step `<target>: remove added files` of a reconcile (docs/plan-and-drift.md,
//! "Reconcile"): what the drift check found added to a release goes before the manifest is
//! recorded again (the drift room finds the files; this step, run by the deploy, removes them).

use manent_engine::{StepPolicy, WorkflowContext, WorkflowError};
use manent_model::{EffectiveDescriptor, Target};
use manent_ssh::ConnectionPool;

use crate::run::release_scripts::failure;
use crate::run::targets::{TargetError, connection};

/// The step `<target>: remove added files` of a reconcile, once the target's release is live
/// and checked again: the files and links its drift check found added to the release are
/// removed (`rm -f`), so that the manifest recorded next is the release as deployed, not as
/// found. `None` when there is nothing to remove; otherwise the line for the target's detail
/// and whether every file went (when not, the manifest is not recorded again: the next drift
/// check still shows what stayed).
pub async fn remove_added(
    ctx: &WorkflowContext,
    pool: &ConnectionPool,
    eff: &EffectiveDescriptor,
    target: &Target,
) -> Result<Option<(String, bool)>, WorkflowError> {
    let Some(paths) = eff.remove_added.get(&target.name).filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let Some(release) = eff.dest_for(target) else {
        return Ok(None);
    };
    let (script, refused) = removal_script(&release, paths);
    let step = format!("{}: remove added files", target.name);
    let removed: Result<String, WorkflowError> = ctx
        .step_with(&step, StepPolicy::default().recording_start(), || async {
            if script.is_empty() {
                return Ok::<_, TargetError>(String::new());
            }
            let conn = connection(pool, eff, target).await?;
            let out = conn
                .exec(&script, &[])
                .await
                .map_err(|e| TargetError::Transport(e.to_string()))?;
            if !out.success() {
                return Err(TargetError::Script(failure(&out.stderr, out.status)));
            }
            Ok(String::new())
        })
        .await;
    let removed_count = paths.len() - refused.len();
    Ok(Some(match removed {
        Ok(_) if refused.is_empty() => (
            format!("removed {removed_count} added file(s) the drift check found"),
            true,
        ),
        Ok(_) => (
            format!(
                "removed {removed_count} added file(s); left {} outside the release {release}: \
                 {}",
                refused.len(),
                refused.join(", ")
            ),
            false,
        ),
        Err(WorkflowError::Step { message, .. }) => (
            format!("the added files could not be removed: {message}"),
            false,
        ),
        Err(other) => return Err(other),
    }))
}

/// `rm -f` of each of `paths` inside `release` (absolute, below it, no `.` or `..`
/// component), and the paths refused: they came from a listing of the target, which
/// whoever writes there controls.
fn removal_script(release: &str, paths: &[String]) -> (String, Vec<String>) {
    let prefix = format!("{}/", release.trim_end_matches('/'));
    let (ok, refused): (Vec<&String>, Vec<&String>) = paths.iter().partition(|p| {
        p.strip_prefix(&prefix).is_some_and(|rest| {
            !rest.is_empty()
                && !p.contains(['\n', '\0'])
                && rest
                    .split('/')
                    .all(|c| !c.is_empty() && c != "." && c != "..")
        })
    });
    let script = if ok.is_empty() {
        String::new()
    } else {
        let quoted: Vec<String> = ok.iter().map(|p| manent_ssh::shell_quote(p)).collect();
        format!("rm -f -- {}", quoted.join(" "))
    };
    (script, refused.into_iter().cloned().collect())
}

#[cfg(test)]
mod tests {
    use super::removal_script;

    fn check(paths: &[&str], script: &str, refused: &[&str]) {
        let paths: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
        let (got, left) = removal_script("/srv/web/releases/1.0/", &paths);
        assert_eq!(
            (
                got.as_str(),
                left.iter().map(String::as_str).collect::<Vec<_>>()
            ),
            (script, refused.to_vec()),
            "the removal of {paths:?}"
        );
    }

    #[test]
    fn only_paths_inside_the_release_are_removed_each_quoted() {
        check(
            &[
                "/srv/web/releases/1.0/stray.txt",
                "/srv/web/releases/1.0/it's here",
            ],
            "rm -f -- '/srv/web/releases/1.0/stray.txt' '/srv/web/releases/1.0/it'\\''s here'",
            &[],
        );
        check(
            &[
                "/srv/web/releases/1.0/../../etc/passwd",
                "/srv/web/releases/1.0",
                "/srv/web/releases/1.0/",
                "/srv/web/current",
                "/srv/web/releases/1.0//x",
            ],
            "",
            &[
                "/srv/web/releases/1.0/../../etc/passwd",
                "/srv/web/releases/1.0",
                "/srv/web/releases/1.0/",
                "/srv/web/current",
                "/srv/web/releases/1.0//x",
            ],
        );
    }
}
