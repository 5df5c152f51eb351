//! Owns an environment file's `variables` and `scoped_variables`: their types, their
//! validation (names, one key per `match`, no two entries of the same specificity setting
//! a variable for one target) and the resolution of the effective value of each variable
//! for a target, with where it came from (docs/environments.md, "Variables").

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

use super::{EnvironmentFile, Target};
use crate::source::{Document, line_of};

/// Variables by name, their values as written (a number or a boolean is kept as its text).
pub type VariableValues = BTreeMap<String, String>;

/// One entry of `scoped_variables`: values that apply to the targets `match` selects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopedVariables {
    /// Which targets: exactly one of `target`, `az`, `region`, `label`.
    #[serde(rename = "match")]
    pub matches: VariableMatch,
    /// The values for those targets.
    #[serde(deserialize_with = "scalar_values")]
    pub variables: VariableValues,
}

/// `scoped_variables[].match`: exactly one key (checked when the file is read).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariableMatch {
    /// A target's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// A target's `az`, as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub az: Option<String>,
    /// A target's `region`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// `key=value`: a target whose `labels` has `key` set to `value`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// Where a variable's effective value for a target came from, most specific last.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum VariableSource {
    /// `variables:` of the environment file.
    Environment,
    /// A `scoped_variables` entry matching a label (`key=value`).
    Label(String),
    /// One matching the target's region.
    Region(String),
    /// One matching the target's availability zone.
    Az(String),
    /// One naming the target.
    Target(String),
    /// The descriptor's `deploy.variables` (where `overrides:` allows it).
    Descriptor,
}

impl VariableSource {
    /// How specific the source is: a more specific one wins; two scoped entries of the same
    /// rank setting one variable for a target are refused.
    fn rank(&self) -> u8 {
        match self {
            VariableSource::Environment => 0,
            VariableSource::Label(_) => 1,
            VariableSource::Region(_) => 2,
            VariableSource::Az(_) => 3,
            VariableSource::Target(_) => 4,
            VariableSource::Descriptor => 5,
        }
    }

    /// The kind of match, for messages: `label`, `region`, `az`, `target`.
    fn kind(&self) -> &'static str {
        match self {
            VariableSource::Environment => "environment",
            VariableSource::Label(_) => "label",
            VariableSource::Region(_) => "region",
            VariableSource::Az(_) => "az",
            VariableSource::Target(_) => "target",
            VariableSource::Descriptor => "descriptor",
        }
    }
}

impl fmt::Display for VariableSource {
    /// `environment`, `label tier=web`, `region eu`, `az eu-1a`, `target web-2`,
    /// `descriptor`: the `source` of `manent vars`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VariableSource::Environment | VariableSource::Descriptor => f.write_str(self.kind()),
            VariableSource::Label(value)
            | VariableSource::Region(value)
            | VariableSource::Az(value)
            | VariableSource::Target(value) => write!(f, "{} {value}", self.kind()),
        }
    }
}

/// A variable's effective value for one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectiveVariable {
    pub name: String,
    pub value: String,
    pub source: VariableSource,
}

impl VariableMatch {
    /// What this entry matches on, as a source; `None` unless exactly one key is written.
    fn source(&self) -> Option<VariableSource> {
        match (&self.target, &self.az, &self.region, &self.label) {
            (Some(t), None, None, None) => Some(VariableSource::Target(t.clone())),
            (None, Some(a), None, None) => Some(VariableSource::Az(a.clone())),
            (None, None, Some(r), None) => Some(VariableSource::Region(r.clone())),
            (None, None, None, Some(l)) => Some(VariableSource::Label(l.clone())),
            _ => None,
        }
    }

    /// Whether `target` is one of the targets this entry selects.
    fn selects(&self, target: &Target) -> bool {
        match self.source() {
            Some(VariableSource::Target(name)) => target.name == name,
            Some(VariableSource::Az(az)) => target.az.as_deref() == Some(az.as_str()),
            Some(VariableSource::Region(r)) => target.region.as_deref() == Some(r.as_str()),
            Some(VariableSource::Label(label)) => label.split_once('=').is_some_and(|(k, v)| {
                target.labels.get(k.trim()).map(String::as_str) == Some(v.trim())
            }),
            _ => false,
        }
    }
}

/// The effective value of each variable for `target`: `plain` (the environment file's
/// `variables`), overridden by the `scoped` entries that select it (label, then region,
/// then az, then target: the most specific wins), then by `descriptor` (a descriptor's
/// `deploy.variables`). Sorted by name.
pub fn resolve(
    plain: &VariableValues,
    scoped: &[ScopedVariables],
    descriptor: &VariableValues,
    target: &Target,
) -> Vec<EffectiveVariable> {
    let mut effective: BTreeMap<&str, (&str, VariableSource)> = plain
        .iter()
        .map(|(name, value)| (name.as_str(), (value.as_str(), VariableSource::Environment)))
        .collect();
    for entry in scoped.iter().filter(|entry| entry.matches.selects(target)) {
        let Some(source) = entry.matches.source() else {
            continue;
        };
        for (name, value) in &entry.variables {
            // A tie is refused when the file is read; were one to get here, the first wins.
            let wins = effective
                .get(name.as_str())
                .is_none_or(|(_, held)| held.rank() < source.rank());
            if wins {
                effective.insert(name, (value, source.clone()));
            }
        }
    }
    for (name, value) in descriptor {
        effective.insert(name, (value, VariableSource::Descriptor));
    }
    effective
        .into_iter()
        .map(|(name, (value, source))| EffectiveVariable {
            name: name.to_owned(),
            value: value.to_owned(),
            source,
        })
        .collect()
}

/// Whether `name` may be a variable or a secret: upper-case letters, digits and `_`, not
/// starting with a digit or `MANENT_` (manent's own).
pub(crate) fn is_upper_variable_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_uppercase())
        && name
            .chars()
            .all(|c| c == '_' || c.is_ascii_uppercase() || c.is_ascii_digit())
        && !name.starts_with("MANENT_")
}

/// Checks the names of `variables` at `at` (`variables`, `scoped_variables[2].variables`,
/// `deploy.variables`): each a valid name, and not also a secret of `secrets` (when known).
pub(crate) fn validate_names<'a>(
    doc: &mut Document<'_>,
    at: &str,
    names: impl IntoIterator<Item = &'a String>,
    secrets: Option<&BTreeMap<String, super::SecretSource>>,
) {
    for name in names {
        let field = format!("{at}.{name}");
        if !is_upper_variable_name(name) {
            doc.issue(
                field,
                format!(
                    "`{name}` is not a variable name; use upper-case letters, digits and `_`, \
                     not starting with a digit or MANENT_"
                ),
            );
        } else if secrets.is_some_and(|s| s.contains_key(name)) {
            doc.issue(
                field,
                format!("`{name}` is also a secret, which sets it (masked); rename one of the two"),
            );
        }
    }
}

/// Checks `variables` and `scoped_variables`, pushing each issue to `doc`.
pub(super) fn validate(doc: &mut Document<'_>, env: &EnvironmentFile) {
    validate_names(doc, "variables", env.variables.keys(), Some(&env.secrets));
    let scoped_names = env
        .scoped_variables
        .iter()
        .enumerate()
        .flat_map(|(i, entry)| {
            entry
                .variables
                .keys()
                .map(move |name| (format!("scoped_variables[{i}].variables.{name}"), name))
        });
    for (field, name) in env
        .variables
        .keys()
        .map(|name| (format!("variables.{name}"), name))
        .chain(scoped_names)
    {
        if env.inherit_env.contains(name) {
            doc.issue(
                field,
                format!(
                    "`{name}` is also in inherit_env, which sets it from the worker; remove it \
                     from one of the two"
                ),
            );
        }
    }
    for (i, entry) in env.scoped_variables.iter().enumerate() {
        let at = format!("scoped_variables[{i}]");
        validate_names(
            doc,
            &format!("{at}.variables"),
            entry.variables.keys(),
            Some(&env.secrets),
        );
        if entry.variables.is_empty() {
            doc.issue(
                format!("{at}.variables"),
                "is empty; write the variables these targets get, or remove the entry",
            );
        }
        match entry.matches.source() {
            None => doc.issue(
                format!("{at}.match"),
                "write exactly one of target, az, region or label (`key=value`)",
            ),
            Some(VariableSource::Target(name)) if !env.targets.iter().any(|t| t.name == name) => {
                doc.issue(
                    format!("{at}.match.target"),
                    format!(
                        "`{name}` is not a target of this environment; use a name from targets"
                    ),
                );
            }
            Some(VariableSource::Label(label))
                if label
                    .split_once('=')
                    .is_none_or(|(k, _)| k.trim().is_empty()) =>
            {
                doc.issue(
                    format!("{at}.match.label"),
                    format!(
                        "`{label}` is not `key=value`; write the label's key, `=` and its value"
                    ),
                );
            }
            Some(_) => {}
        }
    }
    refuse_ties(doc, env);
}

/// Refuses two `scoped_variables` entries of the same specificity that set one variable for
/// one target: which would apply is a guess (docs/environments.md, "Variables"). Each pair
/// and variable is named once, with both entries' lines.
fn refuse_ties(doc: &mut Document<'_>, env: &EnvironmentFile) {
    let entries = &env.scoped_variables;
    let mut reported = std::collections::BTreeSet::new();
    for target in &env.targets {
        let selecting: Vec<(usize, VariableSource)> = entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.matches.selects(target))
            .filter_map(|(i, e)| e.matches.source().map(|s| (i, s)))
            .collect();
        for (a, (i, first)) in selecting.iter().enumerate() {
            for (j, second) in &selecting[a + 1..] {
                if first.rank() != second.rank() {
                    continue;
                }
                for name in entries[*i].variables.keys() {
                    if !entries[*j].variables.contains_key(name) || !reported.insert((*i, *j, name))
                    {
                        continue;
                    }
                    let earlier = format!("scoped_variables[{i}]");
                    let place = match line_of(doc.text, &earlier) {
                        Some(line) => format!("{}:{line}", doc.file),
                        None => doc.file.to_owned(),
                    };
                    doc.issue(
                        format!("scoped_variables[{j}].variables.{name}"),
                        format!(
                            "`{name}` is also set by {earlier} ({place}, {first}), and both \
                             match target `{}` with the same specificity ({}): which applies \
                             would be a guess; set it in one entry, or match more precisely \
                             (target over az over region over label)",
                            target.name,
                            first.kind()
                        ),
                    );
                }
            }
        }
    }
}

/// Reads a mapping of variable values: each a string, a number or a boolean (kept as its
/// text); a list, a mapping or nothing is refused, naming the variable.
pub(crate) fn scalar_values<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<VariableValues, D::Error> {
    let raw: Option<BTreeMap<String, ScalarText>> = Option::deserialize(deserializer)?;
    Ok(raw
        .unwrap_or_default()
        .into_iter()
        .map(|(name, ScalarText(text))| (name, text))
        .collect())
}

/// A variable's value as written: text, a number or a boolean, as text.
struct ScalarText(String);

impl<'de> Deserialize<'de> for ScalarText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = ScalarText;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("text (a string, a number or true/false)")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_owned()))
            }

            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }

            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }

            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }

            fn visit_unit<E: serde::de::Error>(self) -> Result<ScalarText, E> {
                Err(E::custom("has no value; write one (\"\" for an empty one)"))
            }
        }
        deserializer.deserialize_any(Text)
    }
}

#[cfg(test)]
mod tests;
