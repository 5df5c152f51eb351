//! Owns rewording what serde and yaml_serde say (`invalid type: string "ten", expected u32
//! at line 3 column 5`) into messages for a person, the line and key path being reported
//! apart: stripping positions and path prefixes, reading duplicate keys, and [`humanize`].

/// `file:line`, or `file` when the line is not known.
pub fn place(file: &str, line: Option<usize>) -> String {
    match line {
        Some(line) => format!("{file}:{line}"),
        None => file.to_owned(),
    }
}

/// `dbos: duplicate entry with key "region"` → `("dbos", "region")`; `.` for the root.
pub fn duplicate_key(message: &str) -> Option<(&str, &str)> {
    const MARK: &str = "duplicate entry with key ";
    let at = message.find(MARK)?;
    let parent = message[..at].trim_end().trim_end_matches(':');
    let key = message[at + MARK.len()..].trim().trim_matches('"');
    Some((if parent.is_empty() { "." } else { parent }, key))
}

/// Removes yaml_serde's ` at line L column C` suffix (the line is reported separately).
pub fn strip_location(message: &str, err: &yaml_serde::Error) -> String {
    if let Some(location) = err.location() {
        let suffix = format!(" at line {} column {}", location.line(), location.column());
        if let Some(stripped) = message.strip_suffix(&suffix) {
            return stripped.to_owned();
        }
    }
    message.to_owned()
}

/// Removes yaml_serde's `path: ` prefix (the path is reported separately): a prefix without
/// spaces that is `.` or that `is_path` accepts.
pub fn strip_path(message: &str, is_path: impl Fn(&str) -> bool) -> String {
    if let Some((prefix, rest)) = message.split_once(": ")
        && !prefix.contains(char::is_whitespace)
        && (prefix == "." || is_path(prefix))
    {
        return rest.to_owned();
    }
    message.to_owned()
}

/// How a kind of document words serde's messages.
#[derive(Debug, Clone, Copy)]
pub struct Wording {
    /// What a mapping key is called: `key` (manent.yml) or `field` (descriptors).
    pub noun: &'static str,
    /// The document's own reading of the `expected` part of a type or value error, given
    /// the `found` part and whether serde said `invalid value` (right type, value out of
    /// range): the expected value and the hint. `None` for the readings every document
    /// shares (booleans, lists, strings, mappings, anything else).
    pub expected:
        fn(expected: &str, found: &str, invalid_value: bool) -> Option<(String, &'static str)>,
}

/// Rewrites a serde message (`invalid type: string "ten", expected u32`) into one for a
/// person (`expected an integer, found "ten"; write a whole number, without quotes`).
pub fn humanize(message: &str, wording: &Wording) -> String {
    let noun = wording.noun;
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some((found, expected)) = rest.split_once(", expected ")
        {
            let (expected, hint) =
                match (wording.expected)(expected, found, prefix == "invalid value: ") {
                    Some((expected, hint)) => (expected, hint.to_owned()),
                    None => shared_expected_and_hint(expected, noun),
                };
            return format!("expected {expected}, found {}; {hint}", found_text(found));
        }
    }
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let (field, known) = split_known(rest);
        return match known {
            Some(known) => format!(
                "unknown {noun} {field}; remove it or fix its spelling ({noun}s allowed here: \
                 {known})"
            ),
            None => format!("unknown {noun} {field}; remove it"),
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
        return format!("missing {noun} {field}; add it");
    }
    if let Some(field) = message.strip_prefix("duplicate field ") {
        return format!("{noun} {field} is written twice; keep only one");
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

fn shared_expected_and_hint(expected: &str, noun: &str) -> (String, String) {
    let (expected, hint) = match expected {
        "a boolean" => ("true or false", "write true or false, without quotes"),
        "a sequence" => ("a list", "write a list, e.g. [a, b]"),
        "a string" => ("a string", "put the value in quotes"),
        _ if expected.starts_with("struct ") || expected.starts_with("a map") => {
            return (
                "a mapping".to_owned(),
                format!("write indented `key: value` lines under this {noun}"),
            );
        }
        _ => (expected, "fix the value"),
    };
    (expected.to_owned(), hint.to_owned())
}
