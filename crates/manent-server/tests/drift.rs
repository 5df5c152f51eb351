//! Release manifests and drift through the `manent` CLI against a real server, on both
//! backends (docs/plan-and-drift.md): a deploy records what each target's release holds;
//! `manent drift` finds hand edits, added and removed files and a moved live link on a
//! real sshd target and a local one, leaves out `drift.ignore`, says `unreachable` for a
//! target it cannot reach and `unknown` before anything was deployed; only a token that
//! may deploy runs a check, a viewer reads the last one; `manent reconcile` deploys the
//! live version again to the drifted targets only.

mod common;

use std::path::Path;

use common::{Site, WAIT};
use manent_testkit::{Db, eventually, on_both_backends, sshd::SshHosts};
use serde_json::Value;

on_both_backends!(
    drift_finds_hand_edits_added_and_removed_files_and_a_moved_link_and_nothing_else,
    a_scheduled_check_tells_drift_detected_once_per_new_difference_and_apps_shows_the_state,
    apps_shows_each_environments_last_check_its_drifted_targets_and_when_in_json_text_and_page,
    under_region_routing_each_regions_targets_are_checked_by_a_worker_of_that_region,
);

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

/// acme/web prod on one local target (with `extra` YAML lines) and 1.0 deployed there by
/// a `serve` process; the token that deployed it.
async fn local_deploy(site: &mut Site, extra: &str) -> String {
    let srv = site.dir.join("srv").display().to_string();
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets: [{{name: t1, host: local}}]\n\
             deploy:\n  dest: {srv}/{{target}}/releases/{{version}}\n  activate: \"ln -sfn {srv}/{{target}}/releases/{{version}} {srv}/{{target}}/current\"\n\
             {extra}"
        ),
    );
    let token = site.token();
    site.start("serve", "s1");
    site.wait_api().await;
    let descriptor = site.descriptor("1.0");
    let (code, status) = site.cli(
        &token,
        &["deploy", "--wait", "-f", descriptor.to_str().unwrap()],
    );
    assert_eq!(code, 0, "1.0 is deployed: {status}");
    token
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
    // (ignored); on t2 a file removed, one added and the live link moved.
    let srv = site.dir.join("srv");
    let t1 = srv.join("t1/releases/1.0");
    std::fs::write(t1.join("artifact.txt"), "hot-patched").unwrap();
    std::fs::write(t1.join("new.txt"), "added").unwrap();
    std::fs::create_dir_all(t1.join("log")).unwrap();
    std::fs::write(t1.join("log/app.log"), "a log line").unwrap();
    let t2 = srv.join("t2");
    std::fs::remove_file(t2.join("releases/1.0/config.txt")).unwrap();
    std::fs::write(t2.join("releases/1.0/stray.txt"), "added").unwrap();
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
            "t2/releases/1.0/stray.txt none sha256",
            "t2/current -> t2/releases/1.0 -> t2/releases/0.9",
        ],
        "t2: the removed file, the added one and the moved live link: {report}"
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
    assert!(
        !t2.join("releases/1.0/stray.txt").exists()
            && status["targets"][0]["detail"]
                .as_str()
                .is_some_and(|d| d.contains("removed 1 added file(s)")),
        "the file added behind manent's back is removed, and the detail says so: {status}"
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

/// An HTTP receiver on 127.0.0.1 answering 200 to each request (one per connection); the
/// bodies it got, as JSON.
async fn receiver() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = got.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let sink = sink.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let n = socket.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buffer.extend_from_slice(&chunk[..n]);
                    let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buffer[..end]).to_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if buffer.len() < end + 4 + length {
                        continue;
                    }
                    let body = serde_json::from_slice(&buffer[end + 4..end + 4 + length])
                        .unwrap_or(Value::Null);
                    sink.lock().unwrap().push(body);
                    let _ = socket
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                    return;
                }
            });
        }
    });
    (port, got)
}

async fn a_scheduled_check_tells_drift_detected_once_per_new_difference_and_apps_shows_the_state(
    db: Db,
) {
    let (port, got) = receiver().await;
    let mut site = Site::new(db, &[]).await;
    site.set_config(&format!(
        "notifications:\n  retry_after: 100ms\n  webhooks:\n\
         \x20   - {{name: ops, url: \"http://127.0.0.1:{port}/hook\", events: [drift_detected]}}\n"
    ));
    let token = local_deploy(&mut site, "drift: {every: 10s}\n").await;
    let release = site.dir.join("srv/t1/releases/1.0");
    std::fs::write(release.join("artifact.txt"), "hot-patched").unwrap();

    // The schedule finds it: drifted, and one notification.
    let first = eventually("a scheduled check finds t1 drifted", WAIT, || async {
        let (_, last) = drift(&site, &token, &["--last"]);
        (last["state"] == "drifted").then_some(last)
    })
    .await;
    let notified = eventually("drift_detected is delivered", WAIT, || async {
        let got = got.lock().unwrap().clone();
        (!got.is_empty()).then_some(got)
    })
    .await;
    assert_eq!(
        notified[0]["event"], "drift_detected",
        "the event: {notified:?}"
    );
    assert!(
        notified[0]["deploy"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("t1:") && e.contains("artifact.txt")),
        "it names the new difference: {notified:?}"
    );
    let (code, apps) = site.cli(&token, &["apps"]);
    let shown = apps
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["application"] == "acme/web")
        .map(|a| a["drift"]["prod"].clone());
    assert_eq!(
        (code, shown),
        (0, Some(Value::from("drifted"))),
        "manent apps shows the environment's drift state: {apps}"
    );

    // The next scheduled check finds the same difference: nothing new to tell. A new one
    // after it is told alone.
    eventually("the next scheduled check runs", WAIT, || async {
        let (_, last) = drift(&site, &token, &["--last"]);
        (last["check_id"] != first["check_id"] && last["state"] == "drifted").then_some(())
    })
    .await;
    std::fs::write(release.join("new.txt"), "added").unwrap();
    let notified = eventually("the new difference is told", WAIT, || async {
        let got = got.lock().unwrap().clone();
        (got.len() >= 2).then_some(got)
    })
    .await;
    let errors: Vec<&str> = notified
        .iter()
        .map(|n| n["deploy"]["error"].as_str().unwrap_or("?"))
        .collect();
    assert!(
        errors.len() == 2 && errors[1].contains("new.txt") && !errors[1].contains("artifact.txt"),
        "one notification per new difference, none for one already told: {errors:?}"
    );
}

async fn apps_shows_each_environments_last_check_its_drifted_targets_and_when_in_json_text_and_page(
    db: Db,
) {
    let mut site = Site::new(db, &[]).await;
    let token = local_deploy(&mut site, "").await;
    let (_, apps) = site.cli(&token, &["apps"]);
    assert!(
        apps[0].get("drift_checks").is_none(),
        "no check ran yet: nothing to show: {apps}"
    );
    let release = site.dir.join("srv/t1/releases/1.0");
    std::fs::write(release.join("artifact.txt"), "hot-patched").unwrap();
    let (code, report) = drift(&site, &token, &[]);
    assert_eq!(code, 1, "the check finds t1 drifted: {report}");

    let (code, apps) = site.cli(&token, &["apps"]);
    let check = &apps[0]["drift_checks"]["prod"];
    assert_eq!(
        (
            code,
            check["state"].as_str(),
            check["drifted_targets"].as_u64(),
            check["targets"].as_u64(),
            check["check_id"].as_str(),
            check["checked_at"].as_str(),
        ),
        (
            0,
            Some("drifted"),
            Some(1),
            Some(1),
            report["check_id"].as_str(),
            report["checked_at"].as_str()
        ),
        "manent apps carries the last check: its state, drifted targets and when: {apps}"
    );
    let (code, table) = site.cli_text(&token, &["apps"]);
    assert!(
        code == 0 && table.contains("DRIFT") && table.contains("drifted 1 of 1 targets"),
        "the apps table has a drift column: {table}"
    );

    let Some(chromium) = common::browser::chromium() else {
        return;
    };
    let base = format!("http://127.0.0.1:{}/", site.port);
    let page =
        common::browser::dump_dom(&chromium, &site.dir, &format!("{base}#token={token}")).await;
    assert!(
        page.contains("data-drift=\"drifted\"")
            && page.contains("drifted 1 of 1 targets, checked "),
        "the Platform page's apps table shows the drift and when it was checked: {page}"
    );
}

/// A directory holding `sha256sum`, which notes `<worker> <its working directory>` in the
/// site's ledger and runs the real one: put first on a worker's PATH, it tells which
/// worker hashed which release.
fn noting_sha256sum(site: &Site, worker: &str) -> String {
    let dir = site.dir.join(format!("bin-{worker}"));
    std::fs::create_dir_all(&dir).unwrap();
    let real = String::from_utf8(
        std::process::Command::new("sh")
            .args(["-c", "command -v sha256sum"])
            .output()
            .expect("find sha256sum")
            .stdout,
    )
    .unwrap();
    let script = dir.join("sha256sum");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"{worker} $PWD\" >> {}\nexec {} \"$@\"\n",
            common::ledger_path(&site.dir),
            real.trim()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

async fn under_region_routing_each_regions_targets_are_checked_by_a_worker_of_that_region(db: Db) {
    let mut site = Site::new(db, &[]).await;
    site.set_config("dbos: {region_routing: true}\n");
    let srv = site.dir.join("srv").display().to_string();
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets:\n  - {{name: eu-1, host: local, region: eu}}\n  - {{name: us-1, host: local, region: us}}\n\
             deploy:\n  dest: {srv}/{{target}}/releases/{{version}}\n  activate: \"ln -sfn {srv}/{{target}}/releases/{{version}} {srv}/{{target}}/current\"\n\
             rollout: {{waves: by_region}}\n"
        ),
    );
    let token = site.token();
    site.start("api", "api");
    for (worker, region) in [("worker-eu", "eu"), ("worker-us", "us")] {
        let path = noting_sha256sum(&site, worker);
        site.start_with(
            "worker",
            worker,
            &[("MANENT__DBOS__REGION", region), ("PATH", &path)],
        );
    }
    site.wait_api().await;
    let (id, _) = site.submit(&token, "acme/web");
    let status = site.wait_status(&token, &id, "SUCCESS").await;
    std::fs::write(common::ledger_path(&site.dir), "").unwrap();

    let (code, report) = drift(&site, &token, &[]);
    assert_eq!(
        (code, states(&report)),
        (
            0,
            vec![
                ("eu-1".to_string(), "in_sync".to_string()),
                ("us-1".to_string(), "in_sync".to_string())
            ]
        ),
        "both targets are checked, in the environment file's order: {report} (deploy {status})"
    );
    let mut hashed: Vec<(String, String)> = site
        .ledger()
        .lines()
        .map(|l| {
            let (worker, dir) = l.split_once(' ').expect("`<worker> <dir>` lines");
            let target = if dir.contains("/eu-1/") {
                "eu-1"
            } else {
                "us-1"
            };
            (target.to_string(), worker.to_string())
        })
        .collect();
    hashed.dedup();
    assert_eq!(
        hashed
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .cloned()
            .collect::<Vec<_>>(),
        [("eu-1", "worker-eu"), ("us-1", "worker-us")].map(|(t, w)| (t.to_string(), w.to_string())),
        "each region's release is hashed by its region's worker only: {}",
        site.ledger()
    );
}
