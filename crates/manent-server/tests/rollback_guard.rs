//! The rollback guard through the `manent` CLI against a real server, on both backends
//! (docs/environments.md, "The rollback guard"): `manent history` marks the irreversible
//! deploy; `manent rollback` and `manent redeploy` to a version from before it exit 2
//! naming it and its reason; `--force` goes through and `manent audit` shows who forced it.

mod common;

use common::Site;
use manent_testkit::{Db, on_both_backends};
use serde_json::Value;

on_both_backends!(a_rollback_past_an_irreversible_deploy_exits_2_naming_it_and_force_is_audited);

const REASON: &str = "drops column users.legacy_name";

/// `manent deploy --wait` of acme/web prod at `version`, with the descriptor lines
/// `extra`; returns the deploy's id.
fn deploy(site: &Site, token: &str, version: &str, extra: &str) -> String {
    let path = site.descriptor(version);
    let text = std::fs::read_to_string(&path).expect("read the descriptor");
    std::fs::write(&path, format!("{text}{extra}")).expect("write the descriptor");
    let (code, status) = site.cli(token, &["deploy", "--wait", "-f", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{version} is deployed: {status}");
    status["id"].as_str().unwrap().to_string()
}

async fn a_rollback_past_an_irreversible_deploy_exits_2_naming_it_and_force_is_audited(db: Db) {
    let mut site = Site::new(db, &["true"]).await;
    let token = site.token();
    let dora = site.token_named("dora", "deployer");
    site.start("serve", "s1");
    site.wait_api().await;

    let old = deploy(&site, &token, "1.0", "");
    let migration = deploy(
        &site,
        &token,
        "2.0",
        &format!("irreversible: \"{REASON}\"\n"),
    );
    deploy(&site, &token, "2.1", "");
    history_marks_the_irreversible_deploy(&site, &token, &migration);

    for args in [
        vec!["rollback", "acme/web", "prod", "--to", "1.0"],
        vec!["redeploy", old.as_str()],
    ] {
        let (code, stderr) = site.cli_stderr(&dora, &args);
        assert_eq!(
            code,
            2,
            "`manent {}` is refused (exit 2): {stderr}",
            args.join(" ")
        );
        assert!(
            stderr.contains(&migration) && stderr.contains(REASON) && stderr.contains("--force"),
            "the refusal names the irreversible deploy, its reason and --force: {stderr}"
        );
    }
    let (code, status) = site.cli(&dora, &["rollback", "acme/web", "prod", "--to", "1.0"]);
    assert_eq!(code, 2, "refused again, with nothing on stdout: {status}");

    let (code, status) = site.cli(
        &dora,
        &[
            "rollback", "acme/web", "prod", "--to", "1.0", "--force", "--wait",
        ],
    );
    assert_eq!(code, 0, "the forced rollback succeeds: {status}");
    assert_eq!(
        (status["version"].as_str(), status["redeploy_of"].as_str()),
        (Some("1.0"), Some(old.as_str())),
        "it deploys 1.0's recorded deploy again: {status}"
    );
    let forced = status["id"].as_str().unwrap_or_default().to_string();
    let (code, trail) = site.cli(&token, &["audit", "--action", "deploy.force_irreversible"]);
    assert_eq!(code, 0, "manent audit answers: {trail}");
    let entries: Vec<&Value> = trail.as_array().into_iter().flatten().collect();
    assert!(
        entries.len() == 1
            && entries[0]["token"] == "dora"
            && entries[0]["target"]
                .as_str()
                .is_some_and(|t| t.starts_with(&forced))
            && entries[0]["detail"]
                .as_str()
                .is_some_and(|d| d.contains(&migration) && d.contains(REASON)),
        "the audit trail names who forced which rollback past which deploy: {trail}"
    );
}

/// `manent history` marks the irreversible deploy: its reason in the JSON and in the
/// table's IRREVERSIBLE column, null and `-` for the others.
fn history_marks_the_irreversible_deploy(site: &Site, token: &str, migration: &str) {
    let (code, history) = site.cli(token, &["history", "acme/web", "prod"]);
    assert_eq!(code, 0, "manent history: {history}");
    let marks: Vec<(&str, &Value)> = history
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| (d["id"].as_str().unwrap_or("?"), &d["irreversible"]))
        .collect();
    assert!(
        marks.len() == 3
            && marks.iter().all(|(id, reason)| {
                if *id == migration {
                    reason.as_str() == Some(REASON)
                } else {
                    reason.is_null()
                }
            }),
        "the JSON has the reason on the irreversible deploy only: {history}"
    );
    let (code, text) = site.cli_text(token, &["history", "acme/web", "prod"]);
    let marked: Vec<&str> = text.lines().filter(|l| l.contains(REASON)).collect();
    assert!(
        code == 0
            && text
                .lines()
                .next()
                .is_some_and(|h| h.contains("IRREVERSIBLE"))
            && marked.len() == 1
            && marked[0].starts_with("2.0"),
        "the table has an IRREVERSIBLE column with the reason on 2.0's row: {text}"
    );
}
