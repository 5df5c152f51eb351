//! The Platform page (docs/api.md) in a real headless browser: `manent-server serve` with
//! one deploy that succeeded and one waiting for approval, and Debian's `chromium`
//! (`MANENT_TEST_CHROMIUM`, set by `scripts/test`) loading the page with a token in the URL
//! fragment and dumping the DOM its script built from the API. The data is waited for with
//! chromium's virtual time budget, not with sleeps.

mod common;

use std::{
    path::Path,
    process::{Command, Stdio},
};

use common::{Site, WAIT};
use manent_testkit::{Db, eventually};
use serde_json::Value;

/// chromium's own budget of (virtual) time for the page's script and its API calls.
const VIRTUAL_TIME_BUDGET_MS: u32 = 10_000;

/// The chromium binary, or `None` (after saying so loudly) when this machine has none and
/// this is not CI. On CI a missing browser fails the test.
fn chromium() -> Option<String> {
    match std::env::var("MANENT_TEST_CHROMIUM") {
        Ok(path) if !path.trim().is_empty() => Some(path),
        _ if std::env::var_os("CI").is_some() => panic!(
            "MANENT_TEST_CHROMIUM is unset on CI: the Platform page must be tested in a real \
             browser (scripts/test installs Debian's chromium and sets it)"
        ),
        _ => {
            eprintln!(
                "\n!!!!!!!! SKIPPED: the Platform page's browser test needs MANENT_TEST_CHROMIUM \
                 (e.g. `apt-get install chromium` and MANENT_TEST_CHROMIUM=$(command -v chromium)); \
                 scripts/test sets it !!!!!!!!\n"
            );
            None
        }
    }
}

/// Loads `url` in headless chromium and returns the DOM after the virtual time budget (its
/// stdout only: chromium's stderr is noise). `scratch` holds its profile and home.
async fn dump_dom(chromium: &str, scratch: &Path, url: &str) -> String {
    let home = scratch.join("chromium-home");
    let profile = scratch.join("chromium-profile");
    std::fs::create_dir_all(&home).expect("create chromium's home");
    let out_path = scratch.join("chromium-dom.html");
    let out = std::fs::File::create(&out_path).expect("create the DOM file");
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            &format!("--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}"),
            &format!("--user-data-dir={}", profile.display()),
            "--dump-dom",
            url,
        ])
        .env("HOME", &home)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromium");
    // A safety net for a browser that never exits; the page's data is waited for by the
    // virtual time budget above.
    let status = eventually("chromium exits after dumping the DOM", WAIT, || {
        let status = child.try_wait().expect("poll chromium");
        async move { status }
    })
    .await;
    assert!(status.success(), "chromium ran to the end: {status}");
    let dom = std::fs::read_to_string(&out_path).expect("read the dumped DOM");
    assert!(
        dom.contains("</html>"),
        "chromium dumped a whole document for {url}: {dom}"
    );
    dom
}

/// The `<tr>` whose `data-deploy` is `id`, as dumped (the first table that shows it).
fn deploy_row<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom
        .find(&format!("data-deploy=\"{id}\""))
        .unwrap_or_else(|| panic!("deploy {id} has a row on the page: {dom}"));
    let end = dom[start..].find("</tr>").map_or(dom.len(), |e| start + e);
    &dom[start..end]
}

/// The error box stays hidden: every API call of the page succeeded.
fn assert_no_error_shown(dom: &str, page: &str) {
    let at = dom
        .find("id=\"error\"")
        .unwrap_or_else(|| panic!("the {page} has its error box: {dom}"));
    let tag = &dom[at..at + dom[at..].find('>').expect("the error box's tag ends")];
    assert!(
        tag.contains("hidden"),
        "the {page} shows no API error: {}",
        &dom[at..(at + 600).min(dom.len())]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_platform_page_shows_queues_workers_deploys_approvals_and_a_timeline_in_a_real_browser()
{
    let Some(chromium) = chromium() else { return };
    let mut site = Site::new(Db::Sqlite, &["echo platform-output-line"]).await;
    site.write_environment(
        "acme/gated",
        "prod",
        "targets: [{name: t1, host: local}]\ndeploy:\n  plugin: command\n  commands: [\"true\"]\napproval: {}\n",
    );
    let token = site.token();
    site.start("serve", "s1");
    site.wait_api().await;

    let (done, _) = site.submit(&token, "acme/web");
    let succeeded = site.wait_status(&token, &done, "SUCCESS").await;
    let steps = succeeded["steps"].as_array().map_or(0, Vec::len);
    assert!(
        steps > 0,
        "the succeeded deploy has steps to draw: {succeeded}"
    );
    let (waiting, _) = site.submit(&token, "acme/gated");
    site.wait_until(&token, &waiting, "phase waiting_approval", |s: &Value| {
        s["phase"] == "waiting_approval"
    })
    .await;

    let base = format!("http://127.0.0.1:{}/", site.port);
    let overview = dump_dom(&chromium, &site.dir, &format!("{base}#token={token}")).await;
    assert_no_error_shown(&overview, "overview");
    assert!(
        overview.contains("data-queue=\"default\""),
        "the queues view lists the default queue: {overview}"
    );
    assert!(
        overview.contains("data-worker=\"s1\""),
        "the workers view lists the serving process s1: {overview}"
    );
    assert!(
        !overview.contains(&token),
        "the token is taken out of the URL and never shown in the page"
    );
    let done_row = deploy_row(&overview, &done);
    assert!(
        done_row.contains("SUCCESS") && !done_row.contains("data-action"),
        "the succeeded deploy shows its status and no button: {done_row}"
    );
    assert!(
        done_row.contains("<td>1</td>"),
        "the deploy's version has its column: {done_row}"
    );
    let waiting_row = deploy_row(&overview, &waiting);
    assert!(
        waiting_row.contains("waiting_approval"),
        "the gated deploy shows its phase waiting_approval: {waiting_row}"
    );
    assert!(
        waiting_row.contains("data-action=\"approve\"")
            && waiting_row.contains(">Approve</button>"),
        "a deploy waiting for approval has an Approve button: {waiting_row}"
    );
    assert!(
        waiting_row.contains("data-action=\"reject\"")
            && waiting_row.contains("data-action=\"cancel\""),
        "and Reject and Cancel buttons, since it is still PENDING: {waiting_row}"
    );

    // A viewer sees the same deploys, and no button it could not use.
    let viewer = site.token_named("eve", "viewer");
    let as_viewer = dump_dom(&chromium, &site.dir, &format!("{base}#token={viewer}")).await;
    assert_no_error_shown(&as_viewer, "overview as a viewer");
    let viewer_row = deploy_row(&as_viewer, &waiting);
    assert!(
        viewer_row.contains("waiting_approval") && !viewer_row.contains("data-action"),
        "a viewer gets no Approve, Reject or Cancel: {viewer_row}"
    );

    let page = dump_dom(
        &chromium,
        &site.dir,
        &format!("{base}#deploy={done}&token={token}"),
    )
    .await;
    assert!(
        page.contains("t1: command 1 | platform-output-line"),
        "the deploy page shows what its command printed: {page}"
    );
    assert_no_error_shown(&page, "deploy page");
    assert!(
        page.contains(&format!("<code id=\"deploy-id\">{done}</code>")),
        "the deploy page names its deploy: {page}"
    );
    let svg = page
        .find("<svg")
        .map(|at| &page[at..at + page[at..].find("</svg>").expect("the svg ends")])
        .unwrap_or_else(|| panic!("the deploy page draws an SVG timeline: {page}"));
    assert_eq!(
        svg.matches("data-step=").count(),
        steps,
        "the timeline has one bar per step of `manent status`: {svg}"
    );
    assert_eq!(
        page.matches("data-step=").count(),
        steps,
        "only the timeline's bars carry data-step"
    );
    assert!(
        svg.contains("class=\"bar SUCCESS\""),
        "the bars are coloured by the steps' status: {svg}"
    );
    for step in succeeded["steps"].as_array().into_iter().flatten() {
        let name = step["name"].as_str().unwrap_or_default();
        assert!(
            page.contains(name),
            "the step {name:?} is labelled on the deploy page"
        );
    }
    assert!(
        !page.contains("data-action="),
        "a finished deploy offers no approve, reject or cancel: {page}"
    );
}
