//! Releases through the `manent` CLI against a real server, on both backends: an
//! environment's history, the version live in each environment (`manent apps`), `manent
//! rollback` to the version before the live one and `manent redeploy` of a past deploy,
//! each running the recorded artifacts on the targets again (docs/cli.md, "Releases").

mod common;

use common::{Site, ledger_path};
use manent_testkit::Db;
use serde_json::Value;

use manent_testkit::on_both_backends;

on_both_backends!(
    rollback_puts_the_previous_version_back_and_redeploy_the_named_one,
    after_retention_removed_old_deploys_rollback_still_returns_to_the_previous_kept_one,
);

/// The versions the targets ran, in order (the ledger the deploy's command appends to).
fn ledger_versions(site: &Site) -> Vec<String> {
    site.ledger().lines().map(str::to_string).collect()
}

/// The version `manent apps` shows live in acme/web prod.
fn live(site: &Site, token: &str) -> Value {
    let (code, apps) = site.cli(token, &["apps"]);
    assert_eq!(code, 0, "manent apps: {apps}");
    apps.as_array()
        .into_iter()
        .flatten()
        .find(|a| a["application"] == "acme/web")
        .map(|a| a["live"]["prod"]["version"].clone())
        .unwrap_or(Value::Null)
}

/// acme/web prod: one local target whose command appends the version to the ledger.
fn version_ledger_environment(site: &Site) {
    let ledger = ledger_path(&site.dir);
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets: [{{name: t1, host: local}}]\ndeploy:\n  plugin: command\n  commands:\n    - \"echo $MANENT_VERSION >> {ledger}\"\n"
        ),
    );
}

/// `manent deploy -f <version> --wait`; returns the deploy's id.
fn deploy(site: &Site, token: &str, version: &str) -> String {
    let path = site.descriptor(version);
    let (code, status) = site.cli(token, &["deploy", "--wait", "-f", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{version} is deployed: {status}");
    status["id"].as_str().unwrap().to_string()
}

async fn rollback_puts_the_previous_version_back_and_redeploy_the_named_one(db: Db) {
    let mut site = Site::new(db, &[]).await;
    version_ledger_environment(&site);
    let token = site.token();
    site.start("serve", "s1");
    site.wait_api().await;

    let (code, stderr) = site.cli_stderr(&token, &["rollback", "acme/web", "prod"]);
    assert_eq!(code, 2, "nothing to roll back to is refused: {stderr}");
    assert!(
        stderr.contains("nothing to roll back to") && stderr.contains("no successful deploy yet"),
        "the refusal says why: {stderr}"
    );

    let first = deploy(&site, &token, "1.0");
    let second = deploy(&site, &token, "1.1");
    assert_eq!(ledger_versions(&site), ["1.0", "1.1"], "both versions ran");
    assert_eq!(live(&site, &token), "1.1", "1.1 is live");

    let (code, stderr) = site.cli_stderr(&token, &["rollback", "acme/web", "prod", "--fast"]);
    assert!(
        code == 2 && stderr.contains("fast rollback") && stderr.contains("`command`"),
        "a fast rollback of an environment without release directories is refused, saying \
         why: {code} {stderr}"
    );
    assert_eq!(
        live(&site, &token),
        "1.1",
        "the refused rollback changed nothing"
    );

    let (code, status) = site.cli(&token, &["rollback", "acme/web", "prod", "--wait"]);
    assert_eq!(code, 0, "the rollback succeeds: {status}");
    assert_eq!(
        (
            status["version"].as_str(),
            status["redeploy_of"].as_str(),
            status["redeploy_kind"].as_str()
        ),
        (Some("1.0"), Some(first.as_str()), Some("rollback")),
        "the rollback deploys 1.0's recorded deploy again: {status}"
    );
    let rollback = status["id"].as_str().unwrap().to_string();
    assert_eq!(
        ledger_versions(&site).last().map(String::as_str),
        Some("1.0"),
        "the target runs 1.0 again"
    );
    assert_eq!(live(&site, &token), "1.0", "manent apps shows 1.0 live");

    let (code, history) = site.cli(&token, &["history", "acme/web", "prod"]);
    assert_eq!(code, 0, "manent history: {history}");
    let rows: Vec<(&str, &str, &str)> = history
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            (
                d["version"].as_str().unwrap_or("?"),
                d["id"].as_str().unwrap_or("?"),
                d["status"].as_str().unwrap_or("?"),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("1.0", rollback.as_str(), "SUCCESS"),
            ("1.1", second.as_str(), "SUCCESS"),
            ("1.0", first.as_str(), "SUCCESS"),
        ],
        "three deploys, newest first, with their versions: {history}"
    );
    for view in [history.clone(), site.cli(&token, &["list"]).1] {
        let targets: Vec<(String, String)> = view
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["status"] == "SUCCESS")
            .flat_map(|d| d["targets"].as_array().cloned().unwrap_or_default())
            .map(|t| (t["name"].to_string(), t["status"].to_string()))
            .collect();
        assert!(
            !targets.is_empty() && targets.iter().all(|(_, status)| status == "\"deployed\""),
            "a list's JSON tells each target of a successful deploy as deployed, not pending: \
             {targets:?}"
        );
    }
    let (code, text) = site.cli_text(&token, &["history", "acme/web", "prod"]);
    assert_eq!(code, 0, "the history table: {text}");
    for column in ["VERSION", "DURATION", "DRY_RUN", "SUBMITTED_BY"] {
        assert!(text.contains(column), "the table has {column}: {text}");
    }
    assert!(
        text.contains(&format!("rollback of {}", &first[..8])),
        "the table says where the rollback came from: {text}"
    );
    let (code, text) = site.cli_text(&token, &["apps"]);
    let prod_row = text.lines().find_map(|l| {
        let cells: Vec<&str> = l.split_whitespace().collect();
        (cells.get(1) == Some(&"prod")).then(|| cells.get(2).copied())
    });
    assert!(
        code == 0 && prod_row == Some(Some("1.0")),
        "the apps table's prod row shows 1.0 live: {text}"
    );

    let (code, status) = site.cli(&token, &["redeploy", &second[..8], "--wait"]);
    assert_eq!(code, 0, "the redeploy succeeds: {status}");
    assert_eq!(
        (
            status["version"].as_str(),
            status["redeploy_of"].as_str(),
            status["redeploy_kind"].as_str()
        ),
        (Some("1.1"), Some(second.as_str()), Some("redeploy")),
        "the redeploy deploys 1.1's recorded deploy again (the id by prefix): {status}"
    );
    assert_eq!(
        ledger_versions(&site),
        ["1.0", "1.1", "1.0", "1.1"],
        "the targets ran each deploy in order"
    );
    assert_eq!(live(&site, &token), "1.1", "1.1 is live again");

    let (code, text) = site.cli_text(&token, &["list"]);
    assert!(
        code == 0 && text.contains("VERSION") && text.contains("DURATION"),
        "the list shows versions and durations: {text}"
    );
}

async fn after_retention_removed_old_deploys_rollback_still_returns_to_the_previous_kept_one(
    db: Db,
) {
    let mut site = Site::new(db, &[]).await;
    // Everything finished is past its age at once; the two newest successful deploys are
    // kept. The workers' own pass is an hour away: `admin prune` applies it here.
    site.set_config("retention: {keep_last: 2, deploys: 1ms, output: 0s, every: 1h}\n");
    version_ledger_environment(&site);
    let token = site.token();
    site.start("serve", "s1");
    site.wait_api().await;
    let ids: Vec<String> = ["1.0", "1.1", "1.2", "1.3"]
        .iter()
        .map(|v| deploy(&site, &token, v))
        .collect();

    let prune = |extra: &[&str]| {
        let mut args = vec!["admin", "prune", "--output", "json"];
        args.extend_from_slice(extra);
        let out = site
            .command(&args, "admin")
            .output()
            .expect("run admin prune");
        assert!(
            out.status.success(),
            "admin prune: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).expect("a JSON report")
    };
    let dry = prune(&["--dry-run"]);
    assert_eq!(
        (dry["dry_run"].as_bool(), dry["deploys"].as_u64()),
        (Some(true), Some(2)),
        "a dry run counts 1.0 and 1.1: {dry}"
    );
    let (code, _) = site.cli(&token, &["status", &ids[0]]);
    assert_eq!(code, 0, "the dry run removed nothing");
    let done = prune(&[]);
    assert_eq!(done["deploys"].as_u64(), Some(2), "1.0 and 1.1 go: {done}");
    let (code, gone) = site.cli_stderr(&token, &["status", &ids[0]]);
    assert_ne!(code, 0, "1.0's deploy is gone: {gone}");

    let (code, status) = site.cli(&token, &["rollback", "acme/web", "prod", "--wait"]);
    assert_eq!(code, 0, "the rollback succeeds: {status}");
    assert_eq!(
        (status["version"].as_str(), status["redeploy_of"].as_str()),
        (Some("1.2"), Some(ids[2].as_str())),
        "the rollback returns to 1.2, the kept deploy before the live one: {status}"
    );
    assert_eq!(
        ledger_versions(&site).last().map(String::as_str),
        Some("1.2"),
        "the target runs 1.2 again"
    );
}
