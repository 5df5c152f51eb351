//! Release manifests and drift through the `manent` CLI against a real server, on both
//! backends (docs/plan-and-drift.md): a deploy records what each target's release holds;
//! `manent drift` finds hand edits, added and removed files and a moved live link on a
//! real sshd target and a local one, leaves out `drift.ignore`, says `unreachable` for a
//! target it cannot reach and `unknown` before anything was deployed; only a token that
//! may deploy runs a check, a viewer reads the last one; `manent reconcile` deploys the
//! live version again to the drifted targets only.

mod common;

use std::path::Path;

use common::Site;
use manent_testkit::{Db, on_both_backends, sshd::SshHosts};
use serde_json::Value;

on_both_backends!(drift_finds_hand_edits_added_and_removed_files_and_a_moved_link_and_nothing_else,);

/// acme/web prod: `t1` on the sshd host, `t2` local; releases under `<site>/srv/<target>`,
/// `current` beside them; `activate` writes `config.txt` into the release and switches the
/// link. `port` is t1's SSH port (another one makes it unreachable).
fn environment(site: &Site, hosts: &SshHosts, port: u16, extra: &str) {
    let srv = site.dir.join("srv").display().to_string();
    let h = &hosts.hosts[0];
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets:\n  - {{name: t1, host: \"{}\", port: {port}}}\n  - {{name: t2, host: local}}\n\
             ssh: {{user: \"{}\", key: \"{}\", known_hosts: \"{}\"}}\n\
             deploy:\n  dest: {srv}/{{target}}/releases/{{version}}\n  activate: \"echo a=1 > {srv}/{{target}}/releases/{{version}}/config.txt && ln -sfn {srv}/{{target}}/releases/{{version}} {srv}/{{target}}/current\"\n\
             {extra}",
            h.addr,
            hosts.user,
            hosts.client_key.display(),
            hosts.known_hosts.display(),
        ),
    );
}

/// `manent drift acme/web prod` (JSON): its exit code and answer.
fn drift(site: &Site, token: &str, extra: &[&str]) -> (i32, Value) {
    let mut args = vec!["drift", "acme/web", "prod"];
    args.extend_from_slice(extra);
    site.cli(token, &args)
}

/// Each target's state, by name.
fn states(report: &Value) -> Vec<(String, String)> {
    report["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            (
                t["name"].as_str().unwrap_or("?").to_string(),
                t["state"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect()
}

/// Target `name`'s differences as `path expected found` lines, paths relative to `srv`.
fn differences(report: &Value, name: &str, srv: &Path) -> Vec<String> {
    let srv = format!("{}/", srv.display());
    report["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["name"] == name)
        .flat_map(|t| t["differences"].as_array().cloned().unwrap_or_default())
        .map(|d| {
            let shown = |v: &Value| match v.as_str() {
                Some(s) if s.starts_with("sha256:") => "sha256".to_string(),
                Some(s) => s.replace(&srv, ""),
                None => "none".to_string(),
            };
            format!(
                "{} {} {}",
                d["path"].as_str().unwrap_or("?").replace(&srv, ""),
                shown(&d["expected"]),
                shown(&d["found"])
            )
        })
        .collect()
}

async fn drift_finds_hand_edits_added_and_removed_files_and_a_moved_link_and_nothing_else(db: Db) {
    let hosts = SshHosts::start(1).await;
    let mut site = Site::new(db, &[]).await;
    let port = hosts.hosts[0].port;
    environment(&site, &hosts, port, "drift: {ignore: [log/]}\n");
    let token = site.token();
    let viewer = site.token_named("viewer", "viewer");
    site.start("serve", "s1");
    site.wait_api().await;

    let (code, report) = drift(&site, &token, &[]);
    assert_eq!(code, 1, "nothing deployed yet is not in sync: {report}");
    assert_eq!(
        states(&report),
        [
            ("t1".into(), "unknown".into()),
            ("t2".into(), "unknown".into())
        ],
        "every target is unknown before the first deploy: {report}"
    );

    let descriptor = site.descriptor("1.0");
    let (code, status) = site.cli(
        &token,
        &["deploy", "--wait", "-f", descriptor.to_str().unwrap()],
    );
    assert_eq!(code, 0, "1.0 is deployed: {status}");
    for target in status["targets"].as_array().into_iter().flatten() {
        let detail = target["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains("manifest: 2 file(s), 0 link(s), live link"),
            "each target's detail says what its manifest holds: {target}"
        );
    }

    let (code, report) = drift(&site, &token, &[]);
    assert_eq!(code, 0, "a release as deployed is in sync: {report}");
    assert_eq!(
        states(&report),
        [
            ("t1".into(), "in_sync".into()),
            ("t2".into(), "in_sync".into())
        ],
        "both targets in sync: {report}"
    );

    // Behind manent's back: on t1 (over SSH) a hand edit, a file added and a log written
    // (ignored); on t2 a file removed and the live link moved.
    let srv = site.dir.join("srv");
    let t1 = srv.join("t1/releases/1.0");
    std::fs::write(t1.join("artifact.txt"), "hot-patched").unwrap();
    std::fs::write(t1.join("new.txt"), "added").unwrap();
    std::fs::create_dir_all(t1.join("log")).unwrap();
    std::fs::write(t1.join("log/app.log"), "a log line").unwrap();
    let t2 = srv.join("t2");
    std::fs::remove_file(t2.join("releases/1.0/config.txt")).unwrap();
    std::fs::create_dir_all(t2.join("releases/0.9")).unwrap();
    std::fs::remove_file(t2.join("current")).unwrap();
    std::os::unix::fs::symlink(t2.join("releases/0.9"), t2.join("current")).unwrap();

    let (code, report) = drift(&site, &token, &[]);
    assert_eq!(code, 1, "a drifted environment exits 1: {report}");
    assert_eq!(
        report["state"], "drifted",
        "the environment is drifted: {report}"
    );
    assert_eq!(
        differences(&report, "t1", &srv),
        [
            "t1/releases/1.0/artifact.txt sha256 sha256",
            "t1/releases/1.0/new.txt none sha256",
        ],
        "t1: the hand edit and the added file, the ignored log left out: {report}"
    );
    assert_eq!(
        differences(&report, "t2", &srv),
        [
            "t2/releases/1.0/config.txt sha256 none",
            "t2/current -> t2/releases/1.0 -> t2/releases/0.9",
        ],
        "t2: the removed file and the moved live link: {report}"
    );

    let (code, last) = drift(&site, &viewer, &["--last"]);
    assert_eq!(
        (code, &last["check_id"]),
        (1, &report["check_id"]),
        "a viewer reads the last check: {last}"
    );
    let (code, stderr) = site.cli_stderr(&viewer, &["drift", "acme/web", "prod"]);
    assert_eq!(code, 4, "a viewer may not run a check (403): {stderr}");

    // t1 put back by hand; `manent reconcile` deploys the live version to t2 only.
    std::fs::write(t1.join("artifact.txt"), "payload").unwrap();
    std::fs::remove_file(t1.join("new.txt")).unwrap();
    let (code, report) = drift(&site, &token, &[]);
    assert_eq!(
        (code, states(&report)),
        (
            1,
            vec![
                ("t1".into(), "in_sync".into()),
                ("t2".into(), "drifted".into())
            ]
        ),
        "t1 back in sync, t2 still drifted: {report}"
    );
    let (code, stderr) = site.cli_stderr(&viewer, &["reconcile", "acme/web", "prod"]);
    assert_eq!(code, 4, "a viewer may not reconcile (403): {stderr}");
    let (code, status) = site.cli(&token, &["reconcile", "acme/web", "prod", "--wait"]);
    assert_eq!(code, 0, "the reconcile succeeds: {status}");
    let deployed: Vec<&str> = status["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(
        (deployed, status["version"].as_str()),
        (vec!["t2"], Some("1.0")),
        "the live version, deployed to the drifted target only: {status}"
    );
    let (code, report) = drift(&site, &token, &[]);
    assert_eq!(
        code, 0,
        "after the reconcile every target is in sync: {report}"
    );

    // t1's SSH port closed: unreachable, t2 still compared.
    environment(&site, &hosts, common::free_port(), "");
    let (code, report) = drift(&site, &token, &[]);
    assert_eq!(code, 1, "an unreachable target is not in sync: {report}");
    assert_eq!(
        states(&report),
        [
            ("t1".into(), "unreachable".into()),
            ("t2".into(), "in_sync".into())
        ],
        "t1 unreachable, t2 still compared: {report}"
    );
}
