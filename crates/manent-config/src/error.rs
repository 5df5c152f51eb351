//! Owns configuration errors: the `ConfigError` type, the validation issue type, parsing the
//! YAML text into the model, and rewriting serde's messages into ones that name the file,
//! the line and the key and say what to do.

use std::fmt;
use std::path::PathBuf;

use crate::Config;
use crate::locate;
use crate::serde_util::DURATION_EXPECTED;

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

fn place(file: &str, line: Option<usize>) -> String {
    match line {
        Some(line) => format!("{file}:{line}"),
        None => file.to_owned(),
    }
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
        locate::locate(self.origin.source.as_deref()?, key)
    }
}

/// Parses YAML text into the model (no overrides, no validation).
pub(crate) fn parse_yaml(text: &str, file: &str) -> Result<Config, ConfigError> {
    // Syntax first, so that a malformed file is reported as such, not as a wrong value.
    if let Err(err) = yaml_serde::from_str::<yaml_serde::Value>(text) {
        let line = err.location().map(|l| l.line());
        let message = strip_location(&err.to_string(), &err);
        if let Some((parent, key)) = duplicate_key(&message) {
            let path = if parent == "." {
                key.to_owned()
            } else {
                format!("{parent}.{key}")
            };
            return Err(ConfigError::Parse {
                file: file.to_owned(),
                line: locate::locate_duplicate(text, parent, key).or(line),
                key: path,
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
        let message = strip_key(&strip_location(&inner.to_string(), &inner), &key);
        let line = inner
            .location()
            .map(|l| l.line())
            .filter(|_| !(message.starts_with("duplicate") && key == "."))
            .or_else(|| locate::locate(text, &key));
        ConfigError::Parse {
            file: file.to_owned(),
            line,
            key,
            message: humanize(&message),
        }
    })
}

/// `dbos: duplicate entry with key "region"` → `("dbos", "region")`; `.` for the root.
fn duplicate_key(message: &str) -> Option<(&str, &str)> {
    const MARK: &str = "duplicate entry with key ";
    let at = message.find(MARK)?;
    let parent = message[..at].trim_end().trim_end_matches(':');
    let key = message[at + MARK.len()..].trim().trim_matches('"');
    Some((if parent.is_empty() { "." } else { parent }, key))
}

/// Removes yaml_serde's ` at line L column C` suffix (the line is reported separately).
fn strip_location(message: &str, err: &yaml_serde::Error) -> String {
    if let Some(location) = err.location() {
        let suffix = format!(" at line {} column {}", location.line(), location.column());
        if let Some(stripped) = message.strip_suffix(&suffix) {
            return stripped.to_owned();
        }
    }
    message.to_owned()
}

/// Removes yaml_serde's `path: ` prefix (the key is reported separately).
fn strip_key(message: &str, key: &str) -> String {
    if let Some((prefix, rest)) = message.split_once(": ")
        && !prefix.contains(char::is_whitespace)
        && (prefix == "." || locate::path_contains(prefix, key))
    {
        return rest.to_owned();
    }
    message.to_owned()
}

/// Rewrites a serde message (`invalid type: string "ten", expected u32`) into one for an
/// operator (`expected an integer, found "ten"; write a whole number, without quotes`).
pub(crate) fn humanize(message: &str) -> String {
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some((found, expected)) = rest.split_once(", expected ")
        {
            let range = prefix == "invalid value: " || found.starts_with("integer `-");
            let (expected, hint) = expected_and_hint(expected, range);
            return format!("expected {expected}, found {}; {hint}", found_text(found));
        }
    }
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let (field, known) = split_known(rest);
        return match known {
            Some(known) => format!(
                "unknown key {field}; remove it or fix its spelling (keys allowed here: {known})"
            ),
            None => format!("unknown key {field}; remove it"),
        };
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let (value, known) = split_known(rest);
        return format!(
            "unknown value {value}; use one of: {}",
            known.unwrap_or_default()
        );
    }
    if let Some(field) = message.strip_prefix("missing field ") {
        return format!("missing key {field}; add it");
    }
    if let Some(field) = message.strip_prefix("duplicate field ") {
        return format!("key {field} is written twice; keep only one");
    }
    message.to_owned()
}

/// Splits "`x`, expected one of `a`, `b`" into ("`x`", Some("a, b")).
fn split_known(rest: &str) -> (&str, Option<String>) {
    let Some((name, known)) = rest.split_once(", ") else {
        return (rest, None);
    };
    if known.starts_with("there are no") {
        return (name, None);
    }
    let known = known
        .trim_start_matches("expected one of ")
        .trim_start_matches("expected ")
        .replace(" or ", ", ")
        .replace('`', "");
    (name, Some(known))
}

fn found_text(found: &str) -> String {
    if let Some(quoted) = found.strip_prefix("string ") {
        return quoted.to_owned();
    }
    for kind in ["integer ", "floating point ", "boolean "] {
        if let Some(value) = found.strip_prefix(kind) {
            return value.trim_matches('`').to_owned();
        }
    }
    match found {
        "sequence" => "a list".to_owned(),
        "map" => "a mapping".to_owned(),
        "unit value" | "null" => "an empty value".to_owned(),
        other => other.to_owned(),
    }
}

fn expected_and_hint(expected: &str, range: bool) -> (String, &'static str) {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" if range => (
            "a whole number, 0 or more".to_owned(),
            "write a whole number, 0 or more",
        ),
        "u8" | "u16" | "u32" | "u64" | "usize" | "i32" | "i64" => (
            "an integer".to_owned(),
            "write a whole number, without quotes",
        ),
        "a boolean" => (
            "true or false".to_owned(),
            "write true or false, without quotes",
        ),
        "a sequence" => ("a list".to_owned(), "write a list, e.g. [a, b]"),
        "a string" => ("a string".to_owned(), "put the value in quotes"),
        DURATION_EXPECTED => (expected.to_owned(), "add a unit, e.g. 30s"),
        _ if expected.starts_with("struct ") || expected.starts_with("a map") => (
            "a mapping".to_owned(),
            "write indented `key: value` lines under this key",
        ),
        _ if expected.starts_with("variant ") || expected.starts_with("enum ") => {
            (expected.to_owned(), "use one of the documented values")
        }
        _ => (expected.to_owned(), "fix the value"),
    }
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
            assert_eq!(humanize(input), expected);
        }
    }
}
