//! `manent plan` through the CLI against a real server, on both backends
//! (docs/plan-and-drift.md, "Plans"): after a deploy, the plan of the next one shows the
//! live version read from the target, the artifacts from → to, the files of a tar
//! artifact, the variable changed in the environment file, the template whose rendering
//! changed (never its content), a secret only as `***`, and the commands, tasks and checks
//! that would run; and nothing changes on the target. A deploy waiting for approval shows
//! its plan (computed once as it starts waiting) in `manent status`, its JSON and on the
//! Platform page.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::Site;
use manent_testkit::zip::ZipEntry;
use manent_testkit::{Db, on_both_backends};
use serde_json::Value;

on_both_backends!(
    a_plan_shows_what_would_change_against_the_live_release_and_changes_nothing,
    a_deploy_waiting_for_approval_shows_its_plan_in_status_json_text_and_on_the_page,
);

const SECRET: &str = "s3cr3t-value-never-shown";

/// acme/web prod, one local target: releases under `<site>/srv/t1`, a variable, a secret
/// read from a file, a template naming both, a task and a check.
fn environment(site: &Site, greeting: &str) {
    environment_with(site, greeting, "");
}

/// [`environment`] with `extra` (YAML lines) appended.
fn environment_with(site: &Site, greeting: &str, extra: &str) {
    let srv = site.dir.join("srv").display().to_string();
    std::fs::write(site.dir.join("secret.txt"), SECRET).unwrap();
    std::fs::write(
        site.dir.join("environments/acme/web/app.conf.j2"),
        "greeting={{ GREETING }}\npassword={{ DB_PASSWORD }}\n",
    )
    .unwrap();
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets: [{{name: t1, host: local}}]\n\
             deploy:\n  dest: {srv}/{{target}}/releases/{{version}}\n  activate: \"ln -sfn {srv}/{{target}}/releases/{{version}} {srv}/{{target}}/current\"\n\
             \x20 tasks: [{{name: migrate, run: \"true\", when: after_activate}}]\n\
             checks: [{{type: command, name: alive, command: \"true\"}}]\n\
             variables: {{GREETING: {greeting}}}\n\
             secrets: {{DB_PASSWORD: {{file: {}}}}}\n\
             templates: [{{src: app.conf.j2, dest: app.conf}}]\n{extra}",
            site.dir.join("secret.txt").display()
        ),
    );
}

/// Every file and link under `dir`: its path, and its content or where it points.
fn tree(dir: &Path) -> BTreeMap<String, String> {
    let mut all = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let shown = path.display().to_string();
            if meta.file_type().is_symlink() {
                all.insert(
                    shown,
                    format!("-> {}", std::fs::read_link(&path).unwrap().display()),
                );
            } else if meta.is_dir() {
                all.insert(shown, "dir".into());
                stack.push(path);
            } else {
                all.insert(
                    shown,
                    String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into(),
                );
            }
        }
    }
    all
}

/// A descriptor of version 1.1 with the site's artifact, a tar.gz holding `bin/app` and a
/// zip holding `web/index.html`.
fn descriptor_with_archive(site: &Site) -> std::path::PathBuf {
    let staging = site.dir.join("staging/bin");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::write(staging.join("app"), "binary").unwrap();
    let archive = site.dir.join("app.tar.gz");
    let made = std::process::Command::new("tar")
        .arg("czf")
        .arg(&archive)
        .arg("-C")
        .arg(site.dir.join("staging"))
        .arg("bin/app")
        .status()
        .expect("tar runs");
    assert!(made.success(), "the archive is made");
    let sum = manent_plugin::host::file_sha256(&archive).unwrap();
    let zipped = site.dir.join("web.zip");
    std::fs::write(
        &zipped,
        manent_testkit::zip::zip(&[ZipEntry::stored("web/index.html", b"<p>hi</p>")]),
    )
    .unwrap();
    let zip_sum = manent_plugin::host::file_sha256(&zipped).unwrap();
    let text = std::fs::read_to_string(site.descriptor("1.1")).unwrap();
    let path = site.dir.join("deploy-1.1-archive.yml");
    std::fs::write(
        &path,
        format!(
            "{text}  - {{name: app.tar.gz, type: tarball, version: \"1.1\", url: \"file://{}\", sha256: \"{sum}\"}}\n\
             \x20 - {{name: web.zip, type: zip, version: \"1.1\", url: \"file://{}\", sha256: \"{zip_sum}\"}}\n",
            archive.display(),
            zipped.display()
        ),
    )
    .unwrap();
    path
}

/// The site with `serve` running and 1.0 deployed to t1 (greeting `hello`); its token.
async fn deployed_1_0(db: Db) -> (Site, String) {
    let mut site = Site::new(db, &[]).await;
    environment(&site, "hello");
    let token = site.token();
    site.start("serve", "s1");
    site.wait_api().await;
    let first = site.descriptor("1.0");
    let (code, status) = site.cli(&token, &["deploy", "--wait", "-f", first.to_str().unwrap()]);
    assert_eq!(code, 0, "1.0 is deployed: {status}");
    (site, token)
}

async fn a_plan_shows_what_would_change_against_the_live_release_and_changes_nothing(db: Db) {
    let (site, token) = deployed_1_0(db).await;

    // The variable changes in the environment file; 1.1 brings a tar artifact.
    environment(&site, "bonjour");
    let next = descriptor_with_archive(&site);
    let srv = site.dir.join("srv");
    let before = tree(&srv);
    let out = std::process::Command::new(common::cli_binary())
        .args(["--server", &format!("http://127.0.0.1:{}", site.port)])
        .args(["--token", &token, "--output", "json", "plan", "-f"])
        .arg(&next)
        .output()
        .expect("run manent plan");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "the plan succeeds: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains(SECRET),
        "no secret's value in the plan: {text}"
    );
    assert_eq!(tree(&srv), before, "nothing changed on the target");
    let plan: Value = serde_json::from_str(&text).expect("the plan is JSON");
    let target = &plan["targets"][0];
    assert_eq!(
        (target["name"].as_str(), target["live_version"].as_str()),
        (Some("t1"), Some("1.0")),
        "t1's live version is read from its live link: {plan}"
    );
    let changes = change_lines(&target["changes"], None);
    assert_eq!(
        changes,
        [
            "artifact artifact.txt sha sha unchanged",
            "artifact app.tar.gz - sha ",
            "artifact web.zip - sha ",
            "file bin/app - sha ",
            "file web/index.html - sha ",
            "template app.conf sha sha ",
            "variable GREETING hello bonjour ",
            "command activate - ln -sfn PLACEHOLDER ",
            "command task migrate - true after activate",
            "command check alive - - check",
        ]
        .map(|c| c.replace(
            "PLACEHOLDER",
            &format!(
                "{srv}/'t1'/releases/'1.1' {srv}/'t1'/current",
                srv = srv.display()
            )
        )),
        "each change once, in order: {plan}"
    );
}

/// The plan's lines of one target, `kind name from to note`, sha256s as `sha`; the kind
/// is each change's own unless given.
fn change_lines(changes: &Value, kind: Option<&str>) -> Vec<String> {
    changes
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let shown = |v: &Value| match v.as_str() {
                Some(s) if s.len() == 64 => "sha".to_string(),
                Some(s) => s.to_string(),
                None => "-".to_string(),
            };
            format!(
                "{} {} {} {} {}",
                kind.or(c["kind"].as_str()).unwrap_or("?"),
                c["name"].as_str().unwrap_or("?"),
                shown(&c["from"]),
                shown(&c["to"]),
                c["note"].as_str().unwrap_or("")
            )
        })
        .collect()
}

async fn a_deploy_waiting_for_approval_shows_its_plan_in_status_json_text_and_on_the_page(db: Db) {
    let (site, token) = deployed_1_0(db).await;

    environment_with(
        &site,
        "bonjour",
        "approval: {approvers: [alice], count: 1}\n",
    );
    let next = descriptor_with_archive(&site);
    let before = tree(&site.dir.join("srv"));
    let (code, submitted) = site.cli(&token, &["deploy", "-f", next.to_str().unwrap()]);
    assert_eq!(code, 0, "1.1 is submitted: {submitted}");
    let id = submitted["id"].as_str().expect("an id").to_string();
    let status = site
        .wait_until(&token, &id, "waits for approval with its plan", |s| {
            s["phase"] == "waiting_approval" && s["plan"].is_object()
        })
        .await;
    let text = status.to_string();
    assert!(
        !text.contains(SECRET),
        "no secret's value in the status: {text}"
    );
    let target = &status["plan"]["targets"][0];
    assert_eq!(
        (
            target["name"].as_str(),
            target["from_version"].as_str(),
            target["to_version"].as_str()
        ),
        (Some("t1"), Some("1.0"), Some("1.1")),
        "t1 from its live release's version to the deploy's: {status}"
    );
    assert_eq!(
        (target["files_changed"].as_u64(), target["files"].clone()),
        (Some(2), serde_json::json!(["bin/app", "web/index.html"])),
        "the tar's and the zip's files are new on t1: {status}"
    );
    let lines = [
        change_lines(&target["artifacts"], Some("artifact")),
        change_lines(&target["templates"], Some("template")),
        change_lines(&target["variables"], Some("variable")),
    ]
    .concat();
    assert_eq!(
        lines,
        [
            "artifact artifact.txt sha sha unchanged",
            "artifact app.tar.gz - sha ",
            "artifact web.zip - sha ",
            "template app.conf sha - rendered once approved",
            "variable GREETING hello bonjour ",
        ],
        "artifacts, templates (never rendered before approval) and the changed variable: \
         {status}"
    );
    assert_eq!(
        tree(&site.dir.join("srv")),
        before,
        "nothing changed on the target while the deploy waits"
    );

    let (code, shown) = site.cli_text(&token, &["status", &id]);
    assert_eq!(code, 0, "status prints: {shown}");
    assert!(
        shown.contains("plan (what approving would change)")
            && shown.contains("t1: 1.0 -> 1.1")
            && shown.contains("2 file(s) would change: bin/app, web/index.html")
            && shown.contains("variable GREETING: hello -> bonjour"),
        "`manent status` shows the plan to an approver: {shown}"
    );

    let Some(chromium) = common::browser::chromium() else {
        return;
    };
    let base = format!("http://127.0.0.1:{}/", site.port);
    let page = common::browser::dump_dom(
        &chromium,
        &site.dir,
        &format!("{base}#deploy={id}&token={token}"),
    )
    .await;
    let plan = page
        .find("data-plan-target=\"t1\"")
        .map(|at| &page[at..at + page[at..].find("</ul>").unwrap_or(page.len() - at)])
        .unwrap_or_else(|| panic!("the deploy page shows t1's plan: {page}"));
    assert!(
        plan.contains("1.0 → 1.1")
            && plan.contains("2 file(s) would change: bin/app, web/index.html")
            && plan.contains("variable GREETING: hello → bonjour"),
        "the page's plan says the versions, the file and the variable: {plan}"
    );
}
