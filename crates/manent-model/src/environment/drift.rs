//! Owns `drift:` (docs/plan-and-drift.md): how often the workers compare an environment's
//! targets with the releases manent recorded there, and which paths they leave out.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::EnvironmentFile;
use crate::serde_util::{nullable, opt_duration};
use crate::source::Document;

/// The shortest `drift.every` accepted: a check reaches every target, and a shorter
/// interval is only useful in tests.
pub const MIN_DRIFT_EVERY: Duration = Duration::from_secs(10);

/// `drift:` of an environment file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriftSettings {
    /// Check on a schedule, this often (none: only when asked, `manent drift`).
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub every: Option<Duration>,
    /// Paths under the release directory left out of every comparison: glob patterns
    /// (`*` any run of characters, `/` included; `?` one character), or a directory
    /// (`log`, `tmp/`) and everything under it.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ignore: Vec<String>,
}

impl DriftSettings {
    /// Whether `path` (relative to the release directory, or a live link's absolute path)
    /// is left out of the comparison.
    pub fn ignores(&self, path: &str) -> bool {
        let path = path.trim_start_matches("./");
        self.ignore.iter().any(|pattern| {
            let pattern = pattern.trim_start_matches("./");
            let dir = pattern.trim_end_matches('/');
            manent_config::glob_match(pattern, path)
                || (!dir.is_empty()
                    && (path == dir
                        || path
                            .strip_prefix(dir)
                            .is_some_and(|rest| rest.starts_with('/'))))
        })
    }
}

pub(super) fn validate(doc: &mut Document<'_>, env: &EnvironmentFile) {
    let Some(drift) = &env.drift else {
        return;
    };
    if let Some(every) = drift.every
        && every < MIN_DRIFT_EVERY
    {
        doc.issue(
            "drift.every",
            format!(
                "{} is too often: a check reaches every target; write 10s or more (10m is usual)",
                humantime::format_duration(every)
            ),
        );
    }
    for (i, pattern) in drift.ignore.iter().enumerate() {
        if pattern.trim().is_empty() {
            doc.issue(
                format!("drift.ignore[{i}]"),
                "is empty; write a path pattern (`log/*`, `tmp/`) or remove the entry",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ignore_patterns_match_globs_and_whole_directories() {
        let drift = DriftSettings {
            every: None,
            ignore: vec![
                "log".into(),
                "tmp/".into(),
                "*.pid".into(),
                "cache/*".into(),
            ],
        };
        for path in ["log", "log/a.txt", "./tmp/x/y", "run/app.pid", "cache/z"] {
            assert!(
                drift.ignores(path),
                "{path} is ignored by {:?}",
                drift.ignore
            );
        }
        for path in ["logs/a", "bin/app", "tmpfile", "cache"] {
            assert!(
                !drift.ignores(path),
                "{path} is compared despite {:?}",
                drift.ignore
            );
        }
    }
}
