//! The inventory of a pass: one host per target with how to reach it, and a group per
//! region (`region_<r>`) and availability zone (`az_<a>`). Written as JSON, which
//! ansible's YAML inventory plugin reads, so no value ever needs quoting rules.

use manent_plugin::Pass;
use serde_json::{Map, Value, json};

/// The inventory for `pass`'s targets.
pub fn render(pass: &Pass) -> Value {
    let mut hosts = Map::new();
    let mut groups: Map<String, Value> = Map::new();
    let strict = if pass.ssh.strict_host_key_checking {
        "yes"
    } else {
        "no"
    };
    for t in &pass.targets {
        let mut vars = Map::new();
        if t.host == "local" {
            vars.insert("ansible_connection".into(), json!("local"));
        } else {
            vars.insert("ansible_host".into(), json!(t.host));
            vars.insert("ansible_port".into(), json!(t.port));
            vars.insert("ansible_user".into(), json!(t.user));
            vars.insert("ansible_ssh_private_key_file".into(), json!(pass.ssh.key));
            vars.insert(
                "ansible_ssh_common_args".into(),
                json!(format!(
                    "-o UserKnownHostsFile={} -o StrictHostKeyChecking={strict}",
                    sh_quote(&pass.ssh.known_hosts)
                )),
            );
        }
        vars.insert("manent_target".into(), json!(t.name));
        if !t.labels.is_empty() {
            vars.insert("manent_labels".into(), json!(t.labels));
        }
        hosts.insert(t.name.clone(), Value::Object(vars));
        let memberships = [("region", &t.region), ("az", &t.az)];
        for (kind, value) in memberships {
            if let Some(value) = value {
                let group = groups
                    .entry(format!("{kind}_{}", group_name(value)))
                    .or_insert_with(|| json!({"hosts": {}}));
                group["hosts"][&t.name] = json!({});
            }
        }
    }
    let mut all = Map::new();
    all.insert("hosts".into(), Value::Object(hosts));
    if !groups.is_empty() {
        all.insert("children".into(), Value::Object(groups));
    }
    json!({ "all": all })
}

/// Ansible group names are identifiers: anything else becomes `_`.
fn group_name(value: &str) -> String {
    value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `s` as one shell word (ansible splits `ansible_ssh_common_args` like a shell).
pub(crate) fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:@,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use expect_test::{Expect, expect};
    use manent_plugin::{SshRef, TargetRef};

    use super::*;

    fn check(targets: Vec<TargetRef>, strict: bool, expect: Expect) {
        let pass = Pass {
            targets,
            ssh: SshRef {
                key: "/keys/id_ed25519".into(),
                known_hosts: "/etc/manent/known hosts".into(),
                strict_host_key_checking: strict,
            },
            ..Pass::default()
        };
        expect.assert_eq(&serde_json::to_string_pretty(&render(&pass)).unwrap());
    }

    fn target(name: &str, host: &str, region: Option<&str>, az: Option<&str>) -> TargetRef {
        TargetRef {
            name: name.into(),
            host: host.into(),
            port: 2222,
            user: "deploy".into(),
            region: region.map(Into::into),
            az: az.map(Into::into),
            labels: BTreeMap::new(),
        }
    }

    #[test]
    fn each_target_is_a_host_with_its_ssh_settings_and_region_and_az_groups() {
        check(
            vec![
                target("web-1", "10.0.0.1", Some("eu"), Some("eu-1a")),
                target("web-2", "10.0.0.2", Some("eu"), None),
            ],
            true,
            expect![[r#"
                {
                  "all": {
                    "children": {
                      "az_eu_1a": {
                        "hosts": {
                          "web-1": {}
                        }
                      },
                      "region_eu": {
                        "hosts": {
                          "web-1": {},
                          "web-2": {}
                        }
                      }
                    },
                    "hosts": {
                      "web-1": {
                        "ansible_host": "10.0.0.1",
                        "ansible_port": 2222,
                        "ansible_ssh_common_args": "-o UserKnownHostsFile='/etc/manent/known hosts' -o StrictHostKeyChecking=yes",
                        "ansible_ssh_private_key_file": "/keys/id_ed25519",
                        "ansible_user": "deploy",
                        "manent_target": "web-1"
                      },
                      "web-2": {
                        "ansible_host": "10.0.0.2",
                        "ansible_port": 2222,
                        "ansible_ssh_common_args": "-o UserKnownHostsFile='/etc/manent/known hosts' -o StrictHostKeyChecking=yes",
                        "ansible_ssh_private_key_file": "/keys/id_ed25519",
                        "ansible_user": "deploy",
                        "manent_target": "web-2"
                      }
                    }
                  }
                }"#]],
        );
    }

    #[test]
    fn a_local_target_uses_the_local_connection_and_lax_checking_says_no() {
        check(
            vec![
                target("here", "local", None, None),
                target("there", "h", None, None),
            ],
            false,
            expect![[r#"
                {
                  "all": {
                    "hosts": {
                      "here": {
                        "ansible_connection": "local",
                        "manent_target": "here"
                      },
                      "there": {
                        "ansible_host": "h",
                        "ansible_port": 2222,
                        "ansible_ssh_common_args": "-o UserKnownHostsFile='/etc/manent/known hosts' -o StrictHostKeyChecking=no",
                        "ansible_ssh_private_key_file": "/keys/id_ed25519",
                        "ansible_user": "deploy",
                        "manent_target": "there"
                      }
                    }
                  }
                }"#]],
        );
    }
}
