//! Owns environment overrides: `MANENT__SECTION__KEY=value` sets any key (levels separated
//! by a double underscore, names case-insensitive, list entries by index or by `name`),
//! `DBOS__VMID` sets `dbos.executor_id` over everything else, and `MANENT_WORKDIR` is the
//! worker's work directory as is (for tests and benchmarks, docs/configuration.md).
//!
//! An override is applied to the configuration as a JSON tree and the tree is read back
//! into the model, so every key can be overridden and a bad value is reported with the
//! same checks as in the file, naming the variable.

use serde_json::Value;

use crate::error::humanize;
use crate::yaml::{Segment, join};
use crate::{Config, ConfigError, ENV_PREFIX, VMID_VAR, WORKDIR_VAR};

/// The process environment, for [`Config::load`]. Variables whose name or value is not
/// UTF-8 are skipped.
pub fn process_env() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
}

/// One `MANENT__…` variable.
#[derive(Debug)]
pub(crate) struct Override {
    var: String,
    /// Lower-cased key names.
    keys: Vec<String>,
    value: String,
}

/// The variables of the environment that concern the configuration.
#[derive(Debug, Default)]
pub(crate) struct EnvInput {
    pub(crate) overrides: Vec<Override>,
    pub(crate) vmid: Option<String>,
    /// `MANENT_WORKDIR`, when set and not empty.
    pub(crate) workdir: Option<std::path::PathBuf>,
}

impl EnvInput {
    pub(crate) fn collect(
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<EnvInput, ConfigError> {
        let mut input = EnvInput::default();
        for (var, value) in env {
            if var.eq_ignore_ascii_case(VMID_VAR) {
                input.vmid = Some(value);
                continue;
            }
            if var == WORKDIR_VAR {
                input.workdir = Some(value).filter(|dir| !dir.is_empty()).map(Into::into);
                continue;
            }
            let Some(rest) = var
                .get(..ENV_PREFIX.len())
                .filter(|prefix| prefix.eq_ignore_ascii_case(ENV_PREFIX))
                .map(|_| &var[ENV_PREFIX.len()..])
            else {
                continue;
            };
            let keys: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
            if keys.iter().any(String::is_empty) {
                return Err(ConfigError::Env {
                    key: keys.join("."),
                    var,
                    message: "empty key name; separate levels with a double underscore, \
                              e.g. MANENT__DBOS__REGION"
                        .to_owned(),
                });
            }
            input.overrides.push(Override { var, keys, value });
        }
        // Whole sections first, so that a more specific variable wins over a whole section.
        input
            .overrides
            .sort_by(|a, b| (a.keys.len(), &a.var).cmp(&(b.keys.len(), &b.var)));
        Ok(input)
    }
}

/// Applies the overrides, in order, to `config`.
pub(crate) fn apply(config: Config, overrides: &[Override]) -> Result<Config, ConfigError> {
    if overrides.is_empty() {
        return Ok(config);
    }
    let mut origin = config.origin.clone();
    let mut tree = serde_json::to_value(&config).map_err(|err| ConfigError::Env {
        var: overrides[0].var.clone(),
        key: ".".to_owned(),
        message: format!("cannot apply environment overrides: {err}"),
    })?;
    let mut current = config;
    for ov in overrides {
        let (path, slot) = resolve(&tree, ov)?;
        let mut first_error = None;
        let mut accepted = false;
        for candidate in candidates(slot, &ov.value) {
            let mut attempt = tree.clone();
            set(&mut attempt, &path, candidate);
            match serde_path_to_error::deserialize::<_, Config>(attempt.clone()) {
                Ok(config) => {
                    tree = attempt;
                    current = config;
                    accepted = true;
                    break;
                }
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        if !accepted && let Some(err) = first_error {
            let key = err.path().to_string();
            return Err(ConfigError::Env {
                var: ov.var.clone(),
                key: if key == "." { join(&path) } else { key },
                message: humanize(&err.into_inner().to_string()),
            });
        }
        origin.overrides.push((join(&path), ov.var.clone()));
    }
    current.origin = origin;
    Ok(current)
}

/// The concrete path an override designates (keys matched case-insensitively, list entries
/// by index or `name`) and the value there now, if any.
fn resolve<'t>(
    tree: &'t Value,
    ov: &Override,
) -> Result<(Vec<Segment>, Option<&'t Value>), ConfigError> {
    let mut path = Vec::new();
    let mut slot = Some(tree);
    for key in &ov.keys {
        let error = |path: &[Segment], message: String| ConfigError::Env {
            var: ov.var.clone(),
            key: join(path),
            message,
        };
        match slot {
            Some(Value::Object(map)) => {
                let name = map
                    .keys()
                    .find(|k| k.eq_ignore_ascii_case(key))
                    .cloned()
                    .unwrap_or_else(|| key.clone());
                slot = map.get(&name);
                path.push(Segment::Key(name));
            }
            Some(Value::Array(items)) => {
                let index = match key.parse::<usize>() {
                    Ok(index) if index <= items.len() => index,
                    Ok(index) => {
                        return Err(error(
                            &path,
                            format!(
                                "there is no entry {index}: the list has {} (an index equal to the \
                                 length adds one)",
                                items.len()
                            ),
                        ));
                    }
                    Err(_) => items
                        .iter()
                        .position(|item| {
                            item.get("name")
                                .and_then(Value::as_str)
                                .is_some_and(|name| name.eq_ignore_ascii_case(key))
                        })
                        .ok_or_else(|| {
                            error(
                                &path,
                                format!(
                                    "no entry named `{key}`; name an existing entry, use its index, \
                                     or set the whole list as JSON in {ENV_PREFIX}{}",
                                    path_var(&path)
                                ),
                            )
                        })?,
                };
                slot = items.get(index);
                path.push(Segment::Index(index));
            }
            None | Some(Value::Null) => {
                slot = None;
                path.push(Segment::Key(key.clone()));
            }
            Some(_) => {
                return Err(error(
                    &path,
                    format!("this key holds a single value, it has no key `{key}`"),
                ));
            }
        }
    }
    Ok((path, slot))
}

/// `dbos.plugins` → `DBOS__PLUGINS`.
fn path_var(path: &[Segment]) -> String {
    path.iter()
        .map(|segment| match segment {
            Segment::Key(key) => key.to_ascii_uppercase(),
            Segment::Index(index) => index.to_string(),
        })
        .collect::<Vec<_>>()
        .join("__")
}

/// Sets `value` at `path`, creating mappings (and appending a list entry) on the way.
fn set(tree: &mut Value, path: &[Segment], value: Value) {
    let Some((first, rest)) = path.split_first() else {
        *tree = value;
        return;
    };
    let child = match first {
        Segment::Key(key) => {
            if !tree.is_object() {
                *tree = Value::Object(serde_json::Map::new());
            }
            let Value::Object(map) = tree else { return };
            map.entry(key.clone()).or_insert(Value::Null)
        }
        Segment::Index(index) => {
            let Value::Array(items) = tree else { return };
            if *index == items.len() {
                items.push(Value::Null);
            }
            &mut items[*index]
        }
    };
    set(child, rest, value);
}

/// The values a variable's text may stand for, in order of preference, from the kind of
/// value it replaces. The first one the model accepts wins; if none does, the first one's
/// error is reported.
fn candidates(slot: Option<&Value>, raw: &str) -> Vec<Value> {
    // An empty variable (`MANENT__DBOS__REGION=` from a template) unsets an optional key.
    let mut out = Vec::new();
    if raw.trim().is_empty() {
        out.push(Value::Null);
    }
    out.extend(typed_candidates(slot, raw));
    out
}

fn typed_candidates(slot: Option<&Value>, raw: &str) -> Vec<Value> {
    let text = || Value::String(raw.to_owned());
    match slot {
        Some(Value::Bool(_)) => vec![parse_bool(raw).map(Value::Bool).unwrap_or_else(text)],
        Some(Value::Number(_)) => vec![parse_integer(raw).unwrap_or_else(text)],
        Some(Value::Array(_)) => vec![list(raw)],
        Some(Value::Object(_)) => vec![
            parse_yaml(raw)
                .filter(Value::is_object)
                .unwrap_or_else(text),
        ],
        Some(Value::String(_)) => vec![text()],
        None | Some(Value::Null) => {
            let mut out = Vec::new();
            if let Some(parsed) = parse_yaml(raw).filter(|v| !v.is_string()) {
                out.push(parsed);
            }
            out.push(text());
            out.push(list(raw));
            out
        }
    }
}

fn parse_bool(raw: &str) -> Option<bool> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

fn parse_integer(raw: &str) -> Option<Value> {
    let raw = raw.trim();
    raw.parse::<u64>()
        .map(Value::from)
        .or_else(|_| raw.parse::<i64>().map(Value::from))
        .ok()
}

/// A list: JSON (or YAML flow) when it starts with `[`, else comma-separated names.
fn list(raw: &str) -> Value {
    if raw.trim_start().starts_with('[') {
        return parse_yaml(raw)
            .filter(Value::is_array)
            .unwrap_or_else(|| Value::String(raw.to_owned()));
    }
    Value::Array(
        raw.split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(|item| Value::String(item.to_owned()))
            .collect(),
    )
}

/// JSON, or any YAML value.
fn parse_yaml(raw: &str) -> Option<Value> {
    yaml_serde::from_str(raw).ok()
}
