//! `manent-server admin copy` (docs/scaling-and-recovery.md, "From one machine to many"): the
//! quickstart's SQLite database copied into PostgreSQL keeps its history, schedules, tokens
//! and audit trail, and a server on the copy serves them (the same token signs in); copied
//! back into a new SQLite file, the same again. Refused from a source a server runs on and
//! into a destination that holds anything. Real databases and processes.

mod common;

use std::process::Output;

use common::{SERVER, Site, WAIT, base_config};
use manent_testkit::{Db, TestDb, signal, wait_exit};

/// `manent-server admin copy --from FROM --to TO`.
fn copy(from: &str, to: &str) -> Output {
    std::process::Command::new(SERVER)
        .args(["admin", "copy", "--from", from, "--to", to])
        .output()
        .expect("run manent-server admin copy")
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Points the site's manent.yml at `url`, starts `serve` there and waits for its API.
async fn serve_on(site: &mut Site, url: &str, executor: &str) -> usize {
    std::fs::write(site.dir.join("manent.yml"), base_config(url, site.port, "")).unwrap();
    let server = site.start("serve", executor);
    site.wait_api().await;
    server
}

async fn stop(site: &mut Site, server: usize) {
    signal(site.child(server), "TERM");
    let status = wait_exit(site.child(server), WAIT).await;
    assert!(status.success(), "the server stops cleanly: {status:?}");
}

/// What a server on a copy must still serve: the deploy in the environment's history, the
/// schedule, the token (it signs in: every call here uses it) and the audit trail.
fn assert_served(site: &Site, token: &str, deploy: &str, schedule: &str, copies: usize) {
    let (code, history) = site.cli(token, &["history", "acme/web", "prod"]);
    let ids: Vec<&str> = history
        .as_array()
        .map(|all| all.iter().filter_map(|d| d["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        (code, ids.contains(&deploy)),
        (0, true),
        "the deploy is in the copy's history (the token signs in): {history}"
    );
    let status = site.status(token, deploy);
    assert_eq!(
        status["status"], "SUCCESS",
        "the deploy's status and steps came along: {status}"
    );
    let (code, schedules) = site.cli(token, &["schedules"]);
    assert!(
        code == 0
            && schedules
                .as_array()
                .is_some_and(|all| all.iter().any(|s| s["id"] == schedule)),
        "the schedule came along: {schedules}"
    );
    let (code, audit) = site.cli(token, &["audit", "--limit", "200"]);
    let actions: Vec<&str> = audit
        .as_array()
        .map(|all| all.iter().filter_map(|e| e["action"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        code == 0 && actions.contains(&"deploy.submit"),
        "the audit trail came along: {actions:?}"
    );
    assert_eq!(
        actions.iter().filter(|a| **a == "database.copy").count(),
        copies,
        "each copy is recorded in the copy's audit trail: {actions:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_database_copied_to_postgresql_and_back_keeps_history_schedules_tokens_and_audit()
{
    let mut site = Site::new(Db::Sqlite, &["true"]).await;
    let token = site.token();
    let sqlite_url = site.db.url.clone();
    let server = site.start("serve", "s1");
    site.wait_api().await;
    let (deploy, _) = site.submit(&token, "acme/web");
    site.wait_status(&token, &deploy, "SUCCESS").await;
    let path = site.descriptor("2");
    let mut descriptor = std::fs::read_to_string(&path).unwrap();
    descriptor.push_str("schedule:\n  cron: \"0 3 * * *\"\n");
    std::fs::write(&path, descriptor).unwrap();
    let (code, created) = site.cli(&token, &["deploy", "-f", path.to_str().unwrap()]);
    assert_eq!(code, 0, "the schedule is created: {created}");
    let schedule = created["id"].as_str().unwrap_or_default().to_string();

    let postgres = TestDb::new(Db::Postgres).await;
    let refused = copy(&sqlite_url, &postgres.url);
    assert!(
        !refused.status.success() && text(&refused).contains("is in use"),
        "a source a server runs on is refused, naming what to do: {}",
        text(&refused)
    );
    stop(&mut site, server).await;

    let copied = copy(&sqlite_url, &postgres.url);
    assert!(
        copied.status.success() && text(&copied).contains("manent_workflows"),
        "the copy into PostgreSQL succeeds and counts each table: {}",
        text(&copied)
    );
    let again = copy(&sqlite_url, &postgres.url);
    assert!(
        !again.status.success() && text(&again).contains("is not empty"),
        "a destination that holds anything is refused: {}",
        text(&again)
    );
    let server = serve_on(&mut site, &postgres.url, "s2").await;
    assert_served(&site, &token, &deploy, &schedule, 1);
    // The copy goes on where the original stopped: a new deploy and new audit entries.
    let (next, _) = site.submit(&token, "acme/web");
    site.wait_status(&token, &next, "SUCCESS").await;
    stop(&mut site, server).await;

    let back = TestDb::new(Db::Sqlite).await;
    let copied = copy(&postgres.url, &back.url);
    assert!(
        copied.status.success(),
        "the copy back into a new SQLite file succeeds: {}",
        text(&copied)
    );
    let server = serve_on(&mut site, &back.url, "s3").await;
    assert_served(&site, &token, &next, &schedule, 2);
    stop(&mut site, server).await;
}
