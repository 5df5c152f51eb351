//! Every key of manent.yml is documented for users: each section and each of its keys
//! appears in docs/configuration.md (or, for the security keys, docs/security.md), so a
//! new key cannot ship undocumented.

use manent_config::Config;
use serde_json::Value;

const CONFIGURATION: &str = include_str!("../../../docs/configuration.md");
const SECURITY: &str = include_str!("../../../docs/security.md");

/// `(section, key)` for every key of the defaults; `None` for sections whose entries are
/// named by the operator (plugins, queues, tenants).
fn keys() -> Vec<(String, Option<String>)> {
    let value = serde_json::to_value(Config::default()).expect("the configuration serializes");
    let Value::Object(sections) = value else {
        panic!("the configuration is a mapping")
    };
    let mut keys = Vec::new();
    for (section, body) in sections {
        match body {
            Value::Object(fields) if !fields.is_empty() => {
                keys.extend(fields.keys().map(|k| (section.clone(), Some(k.clone()))));
            }
            _ => keys.push((section, None)),
        }
    }
    keys
}

#[test]
fn every_section_and_key_of_manent_yml_is_in_the_user_documentation() {
    let keys = keys();
    assert!(
        keys.iter()
            .any(|(s, k)| s == "dbos" && k.as_deref() == Some("drain_timeout")),
        "the walk finds nested keys: {keys:?}"
    );
    let docs = format!("{CONFIGURATION}\n{SECURITY}");
    let mut missing = Vec::new();
    for (section, key) in &keys {
        if !docs.contains(&format!("`{section}`")) {
            missing.push(section.clone());
        }
        if let Some(key) = key
            && !docs.contains(&format!("`{key}`"))
            && !docs.contains(&format!("`{section}.{key}`"))
        {
            missing.push(format!("{section}.{key}"));
        }
    }
    assert!(
        missing.is_empty(),
        "document these keys of manent.yml in docs/configuration.md (or docs/security.md): {missing:?}"
    );
}

/// Every page of docs/ is linked from the README's documentation list.
#[test]
fn every_page_of_the_documentation_is_linked_from_the_readme() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("read README.md");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root.join("docs")).expect("list docs/") {
        let name = entry.expect("a docs/ entry").file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".md") && !readme.contains(&format!("(docs/{name})")) {
            missing.push(name.into_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "link these from the README's Documentation list: {missing:?}"
    );
}

/// A table of docs/configuration.md is one run of `|` lines: a blank line inside one
/// splits it, and the rows after it render as text (as `api.tls` once did).
#[test]
fn no_table_of_the_configuration_page_is_split_by_a_blank_line() {
    let lines: Vec<&str> = CONFIGURATION.lines().collect();
    let split: Vec<String> = lines
        .windows(3)
        .filter(|w| w[0].starts_with('|') && w[1].trim().is_empty() && w[2].starts_with("| `"))
        .map(|w| w[2].to_string())
        .collect();
    assert!(
        split.is_empty(),
        "these rows follow a blank line after a table's row: {split:?}"
    );
}
