//! Owns configuration errors: the `ConfigError` type, the validation issue type, parsing the
//! YAML text into the model, and rewriting serde's messages into ones that name the file,
//! the line and the key and say what to do.

use std::fmt;
use std::path::PathBuf;

use crate::Config;
use crate::serde_util::DURATION_EXPECTED;
use crate::yaml::{self, place};

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {}: {source}; check the path given with -c", file.display())]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not well-formed YAML.
    #[error(
        "{}: YAML syntax error: {message}; fix the indentation, colons or quotes there",
        place(file, *line)
    )]
    Syntax {
        file: String,
        line: Option<usize>,
        message: String,
    },
    /// A value has the wrong type or shape, or a key is unknown or missing.
    #[error("{}: {}: {message}", place(file, *line), if key == "." { "(top level)" } else { key })]
    Parse {
        file: String,
        line: Option<usize>,
        /// Key path, e.g. `dbos.concurrency` or `queues[0].match`; `.` for the whole file.
        key: String,
        message: String,
    },
    /// An environment override is malformed or has a bad value.
    #[error("{var}: {key}: {message}")]
    Env {
        /// The environment variable, e.g. `MANENT__DBOS__CONCURRENCY`.
        var: String,
        key: String,
        message: String,
    },
    /// The configuration parsed but is refused; every problem found is listed.
    #[error("{}", issues.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid {
        file: String,
        issues: Vec<ConfigIssue>,
    },
}

/// One problem found by validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// The configuration file.
    pub file: String,
    /// The line of the key in the file, when it is written there.
    pub line: Option<usize>,
    /// The key path the problem is about, e.g. `queues[1].match`.
    pub key: String,
    /// The environment variable that set the key, when one did.
    pub env_var: Option<String>,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.env_var {
            Some(var) => write!(f, "{var}: {}: {}", self.key, self.message),
            None => write!(
                f,
                "{}: {}: {}",
                place(&self.file, self.line),
                self.key,
                self.message
            ),
        }
    }
}

impl Config {
    /// An issue about `key`, located in the file or attributed to the variable that set it.
    pub(crate) fn issue(&self, key: impl Into<String>, message: impl Into<String>) -> ConfigIssue {
        let key = key.into();
        let env_var = if key == "dbos.executor_id"
            && *self.executor_id_source() == crate::ExecutorIdSource::Vmid
        {
            Some(crate::VMID_VAR.to_owned())
        } else {
            self.overridden_by(&key).map(str::to_owned)
        };
        ConfigIssue {
            file: self.origin.file.clone(),
            line: self.line_of(&key),
            key,
            env_var,
            message: message.into(),
        }
    }

    /// The line where `key` (or its nearest written parent) is in the file.
    pub(crate) fn line_of(&self, key: &str) -> Option<usize> {
        yaml::locate(self.origin.source.as_deref()?, key)
    }
}

/// Parses YAML text into the model (no overrides, no validation).
pub(crate) fn parse_yaml(text: &str, file: &str) -> Result<Config, ConfigError> {
    // Depth before anything parses it: a deeply nested file would cost the parser seconds.
    if let Err(too_deep) = yaml::check_depth(text, yaml::MAX_DEPTH) {
        return Err(ConfigError::Syntax {
            file: file.to_owned(),
            line: Some(too_deep.line),
            message: too_deep.to_string(),
        });
    }
    // Syntax first, so that a malformed file is reported as such, not as a wrong value.
    if let Err(err) = yaml_serde::from_str::<yaml_serde::Value>(text) {
        let line = err.location().map(|l| l.line());
        let message = yaml::strip_location(&err.to_string(), &err);
        if let Some((parent, key)) = yaml::duplicate_key(&message) {
            return Err(ConfigError::Parse {
                file: file.to_owned(),
                line: yaml::locate_duplicate(text, parent, key).or(line),
                key: yaml::child(parent, key),
                message: format!("key `{key}` is written twice; keep only one"),
            });
        }
        return Err(ConfigError::Syntax {
            file: file.to_owned(),
            line,
            message,
        });
    }
    let deserializer = yaml_serde::Deserializer::from_str(text);
    serde_path_to_error::deserialize::<_, Config>(deserializer).map_err(|err| {
        let key = err.path().to_string();
        let inner = err.into_inner();
        let message = yaml::strip_path(&yaml::strip_location(&inner.to_string(), &inner), |p| {
            yaml::path_contains(p, &key)
        });
        let line = inner
            .location()
            .map(|l| l.line())
            .filter(|_| !(message.starts_with("duplicate") && key == "."))
            .or_else(|| yaml::locate(text, &key));
        ConfigError::Parse {
            file: file.to_owned(),
            line,
            key,
            message: humanize(&message),
        }
    })
}

/// Rewrites a serde message (`invalid type: string "ten", expected u32`) into one for an
/// operator (`expected an integer, found "ten"; write a whole number, without quotes`).
pub(crate) fn humanize(message: &str) -> String {
    yaml::humanize(message, &WORDING)
}

/// How `manent.yml` messages word serde's: keys, integers, durations and enum values.
const WORDING: yaml::Wording = yaml::Wording {
    noun: "key",
    expected: expected_and_hint,
};

fn expected_and_hint(
    expected: &str,
    found: &str,
    invalid_value: bool,
) -> Option<(String, &'static str)> {
    let range = invalid_value || found.starts_with("integer `-");
    Some(match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" if range => (
            "a whole number, 0 or more".to_owned(),
            "write a whole number, 0 or more",
        ),
        "u8" | "u16" | "u32" | "u64" | "usize" | "i32" | "i64" => (
            "an integer".to_owned(),
            "write a whole number, without quotes",
        ),
        DURATION_EXPECTED => (expected.to_owned(), "add a unit, e.g. 30s"),
        _ if expected.starts_with("variant ") || expected.starts_with("enum ") => {
            (expected.to_owned(), "use one of the documented values")
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::humanize;

    #[test]
    fn humanizes_serde_messages() {
        for (input, expected) in [
            (
                r#"invalid type: string "ten", expected u32"#,
                r#"expected an integer, found "ten"; write a whole number, without quotes"#,
            ),
            (
                "invalid value: integer `-1`, expected u32",
                "expected a whole number, 0 or more, found -1; write a whole number, 0 or more",
            ),
            (
                "invalid type: sequence, expected struct DbosConfig",
                "expected a mapping, found a list; write indented `key: value` lines under this key",
            ),
            (
                "unknown field `x`, there are no fields",
                "unknown key `x`; remove it",
            ),
            (
                "unknown field `x`, expected `a` or `b`",
                "unknown key `x`; remove it or fix its spelling (keys allowed here: a, b)",
            ),
            (
                "unknown variant `xml`, expected `text` or `json`",
                "unknown value `xml`; use one of: text, json",
            ),
            ("missing field `name`", "missing key `name`; add it"),
            ("something else", "something else"),
        ] {
            assert_eq!(
                humanize(input),
                expected,
                "serde's message {input:?} said in words"
            );
        }
    }
}
