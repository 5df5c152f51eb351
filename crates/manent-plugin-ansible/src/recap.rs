//! Reads ansible-playbook's output: the `PLAY RECAP` counts of each host, and the lines that
//! explain a failed or unreachable host.

use std::collections::BTreeMap;

/// One host's line of the `PLAY RECAP`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub ok: u32,
    pub changed: u32,
    pub unreachable: u32,
    pub failed: u32,
}

impl Counts {
    pub fn failed(&self) -> bool {
        self.unreachable > 0 || self.failed > 0
    }
}

/// The `PLAY RECAP` of `output`, by host name. Empty when there is none (ansible stopped
/// before running anything: a syntax error, a missing file).
pub fn parse(output: &str) -> BTreeMap<String, Counts> {
    let mut recap = BTreeMap::new();
    let mut in_recap = false;
    for line in output.lines() {
        if line.starts_with("PLAY RECAP") {
            in_recap = true;
            continue;
        }
        if !in_recap {
            continue;
        }
        let Some((host, counts)) = line.split_once(" : ") else {
            continue;
        };
        let mut parsed = Counts::default();
        for field in counts.split_whitespace() {
            let Some((key, value)) = field.split_once('=') else {
                continue;
            };
            let Ok(value) = value.parse::<u32>() else {
                continue;
            };
            match key {
                "ok" => parsed.ok = value,
                "changed" => parsed.changed = value,
                "unreachable" => parsed.unreachable = value,
                "failed" => parsed.failed = value,
                _ => {}
            }
        }
        recap.insert(host.trim().to_string(), parsed);
    }
    recap
}

/// The lines of `output` that say why `host` failed (`fatal: [host]…`, `failed: [host]…`).
pub fn failure_lines(output: &str, host: &str) -> Vec<String> {
    let tag = format!("[{host}]");
    output
        .lines()
        .filter(|l| (l.starts_with("fatal: ") || l.starts_with("failed: ")) && l.contains(&tag))
        .map(|l| l.chars().take(500).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use expect_test::{Expect, expect};

    use super::*;

    fn check(output: &str, expect: Expect) {
        let recap = parse(output);
        let mut text = String::new();
        for (host, c) in &recap {
            text.push_str(&format!(
                "{host}: ok={} changed={} unreachable={} failed={} -> {}\n",
                c.ok,
                c.changed,
                c.unreachable,
                c.failed,
                if c.failed() { "failed" } else { "fine" }
            ));
            for line in failure_lines(output, host) {
                text.push_str(&format!("  {line}\n"));
            }
        }
        expect.assert_eq(&text);
    }

    #[test]
    fn the_recap_gives_each_hosts_counts_and_failures_their_lines() {
        check(
            r#"
PLAY [all] *********************************************************************

TASK [copy] ********************************************************************
changed: [t1]
fatal: [t2]: UNREACHABLE! => {"changed": false, "msg": "Failed to connect", "unreachable": true}
failed: [t3] (item=a) => {"msg": "boom"}

PLAY RECAP *********************************************************************
t1                         : ok=2    changed=1    unreachable=0    failed=0    skipped=0    rescued=0    ignored=0
t2                         : ok=0    changed=0    unreachable=1    failed=0    skipped=0    rescued=0    ignored=0
t3                         : ok=1    changed=0    unreachable=0    failed=1    skipped=0    rescued=0    ignored=0
"#,
            expect![[r#"
                t1: ok=2 changed=1 unreachable=0 failed=0 -> fine
                t2: ok=0 changed=0 unreachable=1 failed=0 -> failed
                  fatal: [t2]: UNREACHABLE! => {"changed": false, "msg": "Failed to connect", "unreachable": true}
                t3: ok=1 changed=0 unreachable=0 failed=1 -> failed
                  failed: [t3] (item=a) => {"msg": "boom"}
            "#]],
        );
    }

    #[test]
    fn output_without_a_recap_has_no_hosts() {
        check(
            "ERROR! the playbook: site.yml could not be found\nok: [t1]\n",
            expect![[""]],
        );
    }
}
