//! Owns the model's errors: [`ModelError`] and [`Issue`], one problem located in a file
//! (file, line, field) with a message that says what to do, and
//! [`EnvironmentsSourceUnreadable`], an environments source that cannot be listed.

use std::fmt;
use std::path::PathBuf;

use manent_config::yaml::{self, place};

/// One problem found in a descriptor or an environment file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Issue {
    /// The file name given to the parser (a descriptor's name, an environment file's path).
    pub file: String,
    /// The 1-based line of the field in the file, when it is written there.
    pub line: Option<usize>,
    /// The field path, e.g. `artifacts[1].sha256`; `.` for the whole document.
    pub field: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}: {}",
            place(&self.file, self.line),
            field_text(&self.field),
            self.message
        )
    }
}

fn field_text(field: &str) -> &str {
    if field == "." { "(top level)" } else { field }
}

fn lines(issues: &[Issue]) -> String {
    issues
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A directory of the environments source (`environments.source`) cannot be listed, so the
/// applications it holds are not known: an error, never an empty list.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot list the environments source at {}: {source}; check that environments.source is a \
     directory this process can read",
    path.display()
)]
pub struct EnvironmentsSourceUnreadable {
    /// The directory (or the entry of one) that could not be read.
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Why a descriptor or an environment configuration was refused, or could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// The descriptor is refused; every problem found is listed.
    #[error("{}", lines(issues))]
    DescriptorInvalid {
        /// The descriptor's file name.
        file: String,
        /// Every problem found, in document order as far as practical.
        issues: Vec<Issue>,
    },
    /// The environment file is missing or cannot be read at this moment (routing then
    /// falls back to the artifact types).
    #[error(
        "cannot read environment configuration {}: {reason}; check that the file exists under \
         environments.source and that this process can read it",
        path.display()
    )]
    EnvironmentUnavailable {
        /// The file that was looked for.
        path: PathBuf,
        /// Why it could not be read.
        reason: String,
    },
    /// The environment file was read but its content is refused. `line`, `field` and
    /// `message` are the first problem; `more` holds the others found at the same time.
    #[error("{}", lines(&self.issues()))]
    EnvironmentInvalid {
        /// The environment file.
        file: String,
        /// The line of the first problem, when known.
        line: Option<usize>,
        /// The field of the first problem, e.g. `rollout.waves[1][0]`.
        field: String,
        /// What is wrong and what to do.
        message: String,
        /// The other problems found.
        more: Vec<Issue>,
    },
    /// An application, environment or other name used to find a file is refused.
    #[error("{field} {value:?}: {message}")]
    InvalidName {
        /// What the name is (`application`, `environment`).
        field: String,
        /// The name as given.
        value: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// The descriptor and the environment configuration are each valid, but together do not
    /// make a deploy (e.g. remote-copy without `dest`).
    #[error("{application}/{environment}: {field}: {message}")]
    EffectiveInvalid {
        /// `tenant/app`.
        application: String,
        /// The environment.
        environment: String,
        /// The field of the effective descriptor, e.g. `deploy.dest`.
        field: String,
        /// What is wrong and what to do.
        message: String,
    },
}

impl ModelError {
    /// Every located problem of this error (empty for errors that are not about a document's
    /// content), for APIs that return problems as a list.
    pub fn issues(&self) -> Vec<Issue> {
        match self {
            ModelError::DescriptorInvalid { issues, .. } => issues.clone(),
            ModelError::EnvironmentInvalid {
                file,
                line,
                field,
                message,
                more,
            } => {
                let mut all = vec![Issue {
                    file: file.clone(),
                    line: *line,
                    field: field.clone(),
                    message: message.clone(),
                }];
                all.extend(more.iter().cloned());
                all
            }
            _ => Vec::new(),
        }
    }

    /// True when the environment configuration could not be read at that moment.
    pub fn is_environment_unavailable(&self) -> bool {
        matches!(self, ModelError::EnvironmentUnavailable { .. })
    }

    /// Builds [`ModelError::EnvironmentInvalid`] from a non-empty list of issues.
    pub(crate) fn environment_invalid(file: &str, mut issues: Vec<Issue>) -> ModelError {
        let first = issues.remove(0);
        ModelError::EnvironmentInvalid {
            file: file.to_owned(),
            line: first.line,
            field: first.field,
            message: first.message,
            more: issues,
        }
    }
}

/// Rewrites a serde message (`invalid type: string "x", expected u16`) into one for a person
/// (`expected a whole number, found "x"; write it without quotes`).
pub(crate) fn humanize(message: &str) -> String {
    yaml::humanize(message, &WORDING)
}

/// How the model's messages word serde's: fields, and integers by their range.
const WORDING: yaml::Wording = yaml::Wording {
    noun: "field",
    expected: expected_and_hint,
};

fn expected_and_hint(
    expected: &str,
    found: &str,
    invalid_value: bool,
) -> Option<(String, &'static str)> {
    let range = invalid_value && found.starts_with("integer");
    Some(match expected {
        "u16" => (
            "a whole number from 0 to 65535".to_owned(),
            if range {
                "write a number in that range"
            } else {
                "write a whole number, without quotes"
            },
        ),
        "u8" | "u32" | "u64" | "usize" if range => (
            "a whole number, 0 or more".to_owned(),
            "write a whole number, 0 or more",
        ),
        "u8" | "u32" | "u64" | "usize" => (
            "a whole number, 0 or more".to_owned(),
            "write a whole number, without quotes",
        ),
        "i32" | "i64" => (
            "a whole number".to_owned(),
            "write a whole number, without quotes",
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn humanizes_serde_messages() {
        for (input, expected) in [
            (
                r#"invalid type: string "ten", expected u32"#,
                r#"expected a whole number, 0 or more, found "ten"; write a whole number, without quotes"#,
            ),
            (
                "invalid value: integer `70000`, expected u16",
                "expected a whole number from 0 to 65535, found 70000; write a number in that range",
            ),
            (
                "invalid type: sequence, expected struct Schedule",
                "expected a mapping, found a list; write indented `key: value` lines under this field",
            ),
            (
                "unknown field `x`, expected `a` or `b`",
                "unknown field `x`; remove it or fix its spelling (fields allowed here: a, b)",
            ),
            (
                "unknown variant `xml`, expected `none` or `reactivate_previous`",
                "unknown value `xml`; use one of: none, reactivate_previous",
            ),
            ("missing field `url`", "missing field `url`; add it"),
            ("anything else", "anything else"),
        ] {
            assert_eq!(
                humanize(input),
                expected,
                "serde's message {input:?} said in words"
            );
        }
    }

    #[test]
    fn environment_invalid_lists_every_issue() {
        let issue = |line, field: &str| Issue {
            file: "prod.yml".into(),
            line,
            field: field.into(),
            message: "fix it".into(),
        };
        let err = ModelError::environment_invalid(
            "prod.yml",
            vec![issue(Some(3), "targets[0].port"), issue(None, ".")],
        );
        assert_eq!(
            err.to_string(),
            "prod.yml:3: targets[0].port: fix it\nprod.yml: (top level): fix it",
            "each issue on its own line, with file, line and field"
        );
        assert_eq!(err.issues().len(), 2, "two issues");
    }
}
