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
