//! The `manent` CLI's habits, against a real server: a descriptor on standard input,
//! ids by unique prefix, `wait` to re-attach, `deploy --wait` riding out an API restart,
//! `approve` printing the state after the approval, a quiet exit on a closed pipe,
//! commands' output live in `logs -f` and `deploy --wait`, several `-f` submitted at once,
//! and the output formats (`-o table|wide|json|yaml|name`, `--no-headers`, `-q`).

mod common;

use std::{
    io::Write,
    process::{Command, Output, Stdio},
};

use common::{Site, WAIT, cli_binary, ledger_path};
use manent_testkit::{Db, eventually, signal};
use serde_json::Value;

use manent_testkit::on_both_backends;

on_both_backends!(
    a_descriptor_on_stdin_ids_by_prefix_and_wait_to_reattach,
    deploy_wait_rides_out_an_api_restart,
    logs_follow_shows_what_commands_print_as_they_print_it,
    several_descriptors_are_submitted_together_and_wait_follows_each,
);

/// `manent` against the site, as JSON, with `stdin` fed to it.
fn manent(site: &Site, token: &str, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(cli_binary())
        .args(["--server", &format!("http://127.0.0.1:{}", site.port)])
        .args(["--token", token, "--output", "json"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run manent");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

async fn a_descriptor_on_stdin_ids_by_prefix_and_wait_to_reattach(db: Db) {
    let mut site = Site::new(db, &["true"]).await;
    let token = site.token();
    site.start("serve", "s1");
    site.wait_api().await;
    let descriptor = std::fs::read_to_string(site.descriptor("1.0")).unwrap();

    let out = manent(&site, &token, &["deploy", "-f", "-"], &descriptor);
    assert_eq!(out.status.code(), Some(0), "`-f -` reads stdin: {out:?}");
    let id = json_of(&out)["id"].as_str().unwrap().to_string();

    let prefix = &id[..8];
    let out = manent(&site, &token, &["wait", prefix], "");
    assert_eq!(
        out.status.code(),
        Some(0),
        "wait ends with the deploy: {out:?}"
    );
    let status = json_of(&out);
    assert_eq!(
        status["id"],
        id.as_str(),
        "the prefix named the deploy: {status}"
    );
    assert_eq!(
        status["status"], "SUCCESS",
        "wait prints the final status: {status}"
    );

    // The formats of a list, piped: plain columns with short ids, names, YAML.
    let printed = |args: &[&str]| {
        let (code, text) = site.cli_text(&token, args);
        assert_eq!(code, 0, "manent {args:?}: {text}");
        text
    };
    let table = printed(&["list"]);
    let row: Vec<&str> = table
        .lines()
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        row.first().copied(),
        Some(&id[..8]),
        "the first word of the deploy's row is its short id (no border)\n{table}"
    );
    assert!(
        table.starts_with("ID ") && !table.contains('│'),
        "a header line, no box drawing\n{table}"
    );
    let wide = printed(&["list", "-o", "wide", "--no-headers"]);
    assert!(
        wide.starts_with(&id) && !wide.contains("APPLICATION"),
        "-o wide shows the whole id; --no-headers leaves the header out\n{wide}"
    );
    for args in [["list", "-o", "name"], ["list", "-q", "--limit=1"]] {
        let names = printed(&args);
        assert_eq!(names.trim(), id, "{args:?} prints the whole id alone");
    }
    let yaml = printed(&["status", &id[..8], "-o", "yaml"]);
    assert!(
        yaml.contains(&format!("id: {id}")) && yaml.contains("status: SUCCESS"),
        "-o yaml is the status as YAML\n{yaml}"
    );

    let out = manent(&site, &token, &["status", &id[..4]], "");
    assert_eq!(
        out.status.code(),
        Some(2),
        "a prefix under 6 characters is not expanded: {out:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("too short"),
        "it says the prefix is too short, not that no deploy exists: {out:?}"
    );
    let out = manent(&site, &token, &["logs", "../tokens"], "");
    assert_eq!(
        out.status.code(),
        Some(2),
        "an id is one path segment, never another route: {out:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("../tokens"),
        "the error names what was asked: {out:?}"
    );

    // `manent list | head -0`: the reader is gone before the output is written.
    let mut child = Command::new(cli_binary())
        .args(["--server", &format!("http://127.0.0.1:{}", site.port)])
        .args(["--token", &token, "list"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a closed pipe ends the CLI quietly: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "no panic: {stderr}");
}

async fn deploy_wait_rides_out_an_api_restart(db: Db) {
    let mut site = Site::new(db, &[]).await;
    let ledger = ledger_path(&site.dir);
    let gate = site.dir.join("gate").display().to_string();
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets: [{{name: t1, host: local}}]\ndeploy:\n  plugin: command\n  commands:\n    - {}\n",
            serde_json::to_string(&format!(
                "echo started >> {ledger}; while [ ! -f {gate} ]; do sleep 0.05; done"
            ))
            .unwrap()
        ),
    );
    let token = site.token();
    let api = site.start("api", "api");
    site.start("worker", "w1");
    site.wait_api().await;
    let descriptor = site.descriptor("1.0");
    let mut waiting = Command::new(cli_binary())
        .args(["--server", &format!("http://127.0.0.1:{}", site.port)])
        .args(["--token", &token, "--output", "json"])
        .args(["deploy", "--wait", "-f", descriptor.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(site.dir.join("wait.err")).unwrap())
        .spawn()
        .unwrap();
    eventually("the deploy's command runs", WAIT, || async {
        site.ledger().contains("started").then_some(())
    })
    .await;

    signal(site.child(api), "KILL");
    site.child(api).wait().unwrap();
    let err_path = site.dir.join("wait.err");
    eventually("deploy --wait notices the outage", WAIT, || async {
        std::fs::read_to_string(&err_path)
            .unwrap_or_default()
            .contains("retrying")
            .then_some(())
    })
    .await;
    assert!(
        waiting.try_wait().unwrap().is_none(),
        "deploy --wait keeps waiting while the API is down"
    );
    site.start("api", "api");
    std::fs::write(&gate, "").unwrap();
    let status = manent_testkit::wait_exit(&mut waiting, WAIT).await;
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut waiting.stdout.take().unwrap(), &mut stdout).unwrap();
    assert!(
        status.success(),
        "deploy --wait ends with the deploy's success after the restart: {status}; {}",
        std::fs::read_to_string(&err_path).unwrap_or_default()
    );
    let final_status: Value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    assert_eq!(final_status["status"], "SUCCESS", "{stdout}");
}

async fn logs_follow_shows_what_commands_print_as_they_print_it(db: Db) {
    let mut site = Site::new(db, &[]).await;
    let gate = site.dir.join("gate").display().to_string();
    let command = format!(
        "for n in 1 2 3; do echo \"line $n\"; done; echo \"a warning\" >&2; \
         while [ ! -f {gate} ]; do sleep 0.05; done; echo \"after the gate\""
    );
    site.write_command_environment(&command);
    let token = site.token();
    site.start("serve", "s1");
    site.wait_api().await;
    let (id, _) = site.submit(&token, "acme/web");

    let out_path = site.dir.join("follow.out");
    let mut follower = Command::new(cli_binary())
        .args(["--server", &format!("http://127.0.0.1:{}", site.port)])
        .args(["--token", &token, "logs", "-f", &id])
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Live: the lines show while the command still runs (it waits for the gate).
    eventually(
        "logs -f shows the command's lines as it prints them",
        WAIT,
        || async {
            let text = std::fs::read_to_string(&out_path).unwrap_or_default();
            (text.contains("t1: command 1 | line 3")
                && text.contains("t1: command 1 ! a warning")
                && text.contains("t1: command 1 RUNNING"))
            .then_some(())
        },
    )
    .await;
    assert!(
        !std::fs::read_to_string(&out_path)
            .unwrap()
            .contains("after the gate"),
        "the command has not finished yet"
    );
    std::fs::write(&gate, "").unwrap();
    let status = manent_testkit::wait_exit(&mut follower, WAIT).await;
    assert!(status.success(), "logs -f ends with the deploy: {status}");
    let followed = std::fs::read_to_string(&out_path).unwrap();
    assert!(
        followed.contains("t1: command 1 | after the gate"),
        "lines printed after the follower attached are shown: {followed}"
    );
    assert_eq!(
        followed.matches("| line 1").count(),
        1,
        "each line once: {followed}"
    );
    for shown in [
        "t1: command 1 SUCCESS (attempts 1)",
        "target t1: deployed",
        "SUCCESS phase done",
    ] {
        assert!(
            followed.contains(shown),
            "logs -f shows what logs shows, as it happens: {shown:?} in {followed}"
        );
    }
    assert!(
        !followed.contains("attempts 0"),
        "a running step is not said to have made no attempt: {followed}"
    );

    let out = manent(&site, &token, &["logs", &id], "");
    let logs = json_of(&out);
    let lines: Vec<&str> = logs["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    let at = |needle: &str| {
        lines
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("logs have {needle:?}: {lines:#?}"))
    };
    assert!(
        at("| line 1") < at("| line 2") && at("| line 3") < at("| after the gate"),
        "output in the order it was printed: {lines:#?}"
    );
    assert!(
        at("| after the gate") < at("t1: command 1 SUCCESS"),
        "a step's output comes before its outcome: {lines:#?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("wake dependents") || l.contains("manent.")),
        "internal steps are not part of the log: {lines:#?}"
    );
}

async fn several_descriptors_are_submitted_together_and_wait_follows_each(db: Db) {
    let mut site = Site::new(db, &["true"]).await;
    let token = site.token();
    site.start("serve", "s1");
    site.wait_api().await;
    let (one, two) = (site.descriptor("1.0"), site.descriptor("2.0"));
    let (one, two) = (one.to_str().unwrap(), two.to_str().unwrap());

    let out = manent(
        &site,
        &token,
        &["deploy", "--wait", "-f", one, "-f", two],
        "",
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "both deploys succeed, so the exit is 0: {out:?}"
    );
    let statuses = json_of(&out);
    let statuses = statuses.as_array().expect("one final status per deploy");
    assert_eq!(statuses.len(), 2, "both are followed: {statuses:?}");
    for status in statuses {
        assert_eq!(
            status["status"], "SUCCESS",
            "each is waited for to its end: {status}"
        );
    }

    // One refused descriptor: nothing of the batch is enqueued, and the error names it.
    let bad = site.dir.join("bad.yml");
    std::fs::write(&bad, "application: acme/web\n").unwrap();
    let listed = |site: &Site| {
        let out = manent(site, &token, &["list"], "");
        json_of(&out).as_array().map_or(0, Vec::len)
    };
    let before = listed(&site);
    let out = manent(
        &site,
        &token,
        &["deploy", "-f", one, "-f", bad.to_str().unwrap()],
        "",
    );
    assert_eq!(out.status.code(), Some(2), "bad input exits 2: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("deploys[1]"),
        "the error says which descriptor: {stderr}"
    );
    assert_eq!(listed(&site), before, "a refused batch enqueues nothing");
}
