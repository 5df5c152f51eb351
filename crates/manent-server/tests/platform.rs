//! The Platform page (docs/api.md) in a real headless browser, Debian's `chromium`
//! (`MANENT_TEST_CHROMIUM`, set by `scripts/test`), against `manent-server serve`:
//! - the DOM its script built from the API for one deploy that succeeded and one waiting for
//!   approval, dumped by chromium (waited for with its virtual time budget, not sleeps);
//! - real clicks on Approve, Reject and Cancel (a running deploy, its running step and
//!   output shown live) and a viewer's page without buttons, driven by `playwright-core`
//!   (`platform-browser/clicks.cjs`, `MANENT_TEST_PLAYWRIGHT`), each click's effect checked
//!   through the API; screenshots are kept in `<target>/test-artifacts/platform`.

mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use common::browser::{chromium, dump_dom};
use common::{Site, WAIT};
use manent_testkit::{Db, eventually};
use serde_json::Value;

/// The `<tr>` whose `data-deploy` is `id`, as dumped (the first table that shows it).
fn deploy_row<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom
        .find(&format!("data-deploy=\"{id}\""))
        .unwrap_or_else(|| panic!("deploy {id} has a row on the page: {dom}"));
    let end = dom[start..].find("</tr>").map_or(dom.len(), |e| start + e);
    &dom[start..end]
}

/// The page says who is signed in: the token's name and role.
fn assert_signed_in_as(dom: &str, name: &str, role: &str) {
    let shown =
        format!("<span id=\"signed-in\">signed in as <strong>{name}</strong> ({role})</span>");
    assert!(
        dom.contains(&shown),
        "the page names the token {name} and its role {role} as signed in: {dom}"
    );
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
    assert_signed_in_as(&overview, "ci", "admin");
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
    let where_row = {
        let at = overview
            .find("data-app=\"acme/web\" data-environment=\"prod\"")
            .unwrap_or_else(|| panic!("what runs where has acme/web in prod: {overview}"));
        &overview[at..at + overview[at..].find("</tr>").expect("the row ends")]
    };
    assert!(
        where_row.contains("<td class=\"live\">1</td>")
            && where_row.contains(">ci<")
            && where_row.contains(&format!("title=\"{done}\""))
            && where_row.contains("data-action=\"rollback\""),
        "what runs where shows version 1 live in prod, who deployed it, the deploy, and a \
         Rollback for this admin: {where_row}"
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
    assert_signed_in_as(&as_viewer, "eve", "viewer");
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
    for action in ["approve", "reject", "cancel"] {
        assert!(
            !page.contains(&format!("data-action=\"{action}\"")),
            "a finished deploy offers no {action}: {page}"
        );
    }
    assert!(
        page.contains("data-action=\"redeploy\""),
        "a finished deploy offers Redeploy to a token that may deploy it: {page}"
    );
    assert!(
        page.contains("239f59ed55e737c77147cf55ad0c1b030b6d7ee748a7426952f9b852d5a935e5"),
        "the deploy page shows the artifact's sha256, as an approver needs: {page}"
    );
}

/// The `node_modules` holding `playwright-core` (`MANENT_TEST_PLAYWRIGHT`, installed by
/// `scripts/test` with `npm ci` from `tests/platform-browser/package-lock.json`), or `None`
/// (said loudly) off CI. On CI a missing driver fails the test.
fn playwright() -> Option<PathBuf> {
    match std::env::var("MANENT_TEST_PLAYWRIGHT") {
        Ok(path) if !path.trim().is_empty() => Some(PathBuf::from(path)),
        _ if std::env::var_os("CI").is_some() => panic!(
            "MANENT_TEST_PLAYWRIGHT is unset on CI: the Platform page's buttons must be clicked \
             in a real browser (scripts/test runs `npm ci` for tests/platform-browser and sets it)"
        ),
        _ => {
            eprintln!(
                "\n!!!!!!!! SKIPPED: clicking the Platform page's buttons needs \
                 MANENT_TEST_PLAYWRIGHT, the node_modules of crates/manent-server/tests/platform-browser \
                 (`npm ci` there); scripts/test sets it !!!!!!!!\n"
            );
            None
        }
    }
}

/// chromium and the node_modules of its driver, for the tests that click; `None` (said
/// loudly) when either is missing off CI.
fn browser_and_driver() -> Option<(String, PathBuf)> {
    Some((chromium()?, playwright()?))
}

/// Where the browser test keeps its screenshots: `<target>/test-artifacts/platform`.
fn artifacts_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory holds tmp/")
        .join("test-artifacts/platform");
    std::fs::create_dir_all(&dir).expect("create the screenshots' directory");
    dir
}

/// Runs `platform-browser/clicks.cjs` with `config` and returns what it saw.
async fn click_through(node_modules: &Path, config: &Value, scratch: &Path) -> Value {
    drive(node_modules, "clicks.cjs", config, scratch).await
}

/// Runs the driver `platform-browser/<script>` with `config` and returns what it saw.
async fn drive(node_modules: &Path, script: &str, config: &Value, scratch: &Path) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/platform-browser")
        .join(script);
    let stdout_path = scratch.join("clicks.out");
    let stderr_path = scratch.join("clicks.err");
    let mut child = Command::new("node")
        .arg(&script)
        .arg(config.to_string())
        .env("NODE_PATH", node_modules)
        .env("HOME", scratch)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).expect("create the driver's stdout"))
        .stderr(std::fs::File::create(&stderr_path).expect("create the driver's stderr"))
        .spawn()
        .expect("start node (the browser driver)");
    // The driver waits for the page's conditions itself (60 s each); this is a safety net.
    let status = eventually("the browser driver exits", WAIT * 4, || {
        let status = child.try_wait().expect("poll node");
        async move { status }
    })
    .await;
    let out = std::fs::read_to_string(&stdout_path).unwrap_or_default();
    let err = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    assert!(
        status.success(),
        "the browser driver ran to the end ({status}): {out}\n{err}"
    );
    let seen: Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("the driver printed one JSON object ({e}): {out}\n{err}"));
    assert!(
        seen.get("failure").is_none(),
        "the browser driver did every click and saw every condition: {}\n(screenshots in {})",
        seen["failure"],
        config["artifacts"]
    );
    seen
}

/// Whether the deploy's status records `by`'s `decision` with `reason`.
fn decided(status: &Value, by: &str, decision: &str, reason: &str) -> bool {
    status["approvals"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|a| a["by"] == by && a["decision"] == decision && a["reason"] == reason)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_reject_and_cancel_clicked_in_a_real_browser_take_effect_and_a_viewer_gets_no_button()
 {
    let Some((chromium, node_modules)) = browser_and_driver() else {
        return;
    };
    let mut site = Site::new(Db::Sqlite, &["true"]).await;
    // One application each, so that no deploy waits for another's environment.
    for application in ["acme/approve", "acme/reject", "acme/waits"] {
        site.write_environment(
            application,
            "prod",
            "targets: [{name: t1, host: local}]\ndeploy:\n  plugin: command\n  commands: [\"true\"]\napproval: {}\n",
        );
    }
    // Two versions deployed one after the other: what a Rollback click returns to.
    site.write_environment(
        "acme/released",
        "prod",
        "targets: [{name: t1, host: local}]\ndeploy:\n  plugin: command\n  commands: [\"true\"]\n",
    );
    // Two versions, the second irreversible: its Rollback click is refused by the guard.
    site.write_environment(
        "acme/migrated",
        "prod",
        "targets: [{name: t1, host: local}]\ndeploy:\n  plugin: command\n  commands: [\"true\"]\n",
    );
    // A deploy that runs until it is cancelled: its second command is the running step.
    site.write_environment(
        "acme/slow",
        "prod",
        "targets: [{name: t1, host: local}]\ndeploy:\n  plugin: command\n  commands: [\"echo started-c\", \"sleep 600\"]\n",
    );
    let token = site.token();
    let approver = site.token_named("carol", "admin");
    let viewer = site.token_named("eve", "viewer");
    site.start("serve", "s1");
    site.wait_api().await;

    for version in ["1", "2"] {
        let path = site.descriptor_for("acme/released", version);
        let (code, v) = site.cli(&token, &["deploy", "--wait", "-f", path.to_str().unwrap()]);
        assert_eq!(code, 0, "acme/released {version} is deployed: {v}");
    }
    let migration = deploy_migrated(&site, &token);
    let (to_approve, _) = site.submit(&token, "acme/approve");
    let (to_reject, _) = site.submit(&token, "acme/reject");
    let (left_waiting, _) = site.submit(&token, "acme/waits");
    let (to_cancel, _) = site.submit(&token, "acme/slow");
    for id in [&to_approve, &to_reject, &left_waiting] {
        site.wait_until(&token, id, "phase waiting_approval", |s: &Value| {
            s["phase"] == "waiting_approval"
        })
        .await;
    }
    let running = site
        .wait_until(
            &token,
            &to_cancel,
            "runs its second command",
            |s: &Value| {
                s["steps"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|step| step["name"] == "t1: command 2" && step["status"] == "RUNNING")
            },
        )
        .await;
    assert!(
        running["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|step| step["name"] == "t1: command 2" && step["finished_at"].is_null()),
        "status shows the running step with its start and no end: {running}"
    );

    let artifacts = artifacts_dir();
    eprintln!("the Platform page's screenshots: {}", artifacts.display());
    let config = serde_json::json!({
        "base": format!("http://127.0.0.1:{}/", site.port),
        "chromium": chromium,
        "artifacts": artifacts,
        "approver": approver,
        "viewer": viewer,
        "approve": to_approve,
        "reject": to_reject,
        "cancel": to_cancel,
        "waiting": left_waiting,
    });
    let seen = click_through(&node_modules, &config, &site.dir).await;

    let approved = site.wait_status(&token, &to_approve, "SUCCESS").await;
    assert!(
        decided(&approved, "carol", "approved", "approved from the browser"),
        "the Approve click approved the deploy as carol, with the prompt's comment: {approved}"
    );
    let rejected = site
        .wait_until(
            &token,
            &to_reject,
            "ends after its rejection",
            |s: &Value| s["phase"] == "done",
        )
        .await;
    assert!(
        decided(&rejected, "carol", "rejected", "rejected from the browser"),
        "the Reject click rejected the deploy with the prompt's reason: {rejected}"
    );
    assert_ne!(
        rejected["status"], "SUCCESS",
        "a rejected deploy does not succeed: {rejected}"
    );
    let cancelled = site.status(&token, &to_cancel);
    assert_eq!(
        cancelled["status"], "CANCELLED",
        "the Cancel click on the running deploy's page cancelled it: {cancelled}"
    );
    let interrupted = cancelled["steps"]
        .as_array()
        .and_then(|steps| steps.iter().find(|s| s["name"] == "t1: command 2"))
        .cloned()
        .unwrap_or_default();
    assert!(
        interrupted["status"] == "STOPPED" && interrupted["finished_at"].is_string(),
        "the step the cancel interrupted is STOPPED, ending with its deploy, not RUNNING \
         forever: {interrupted}"
    );
    let waiting = site.status(&token, &left_waiting);
    assert_eq!(
        waiting["phase"], "waiting_approval",
        "the deploy no one clicked still waits: {waiting}"
    );

    the_page_showed_the_running_step_and_no_button_to_a_viewer(&seen);
    the_rollback_and_redeploy_clicks_took_effect(&site, &token, &seen).await;
    the_rollback_click_past_an_irreversible_deploy_showed_the_refusal(
        &site, &token, &seen, &migration,
    );
}

/// The reason acme/migrated's version 2 is marked irreversible with.
const MIGRATION_REASON: &str = "drops column users.legacy_name";

/// Deploys acme/migrated 1, then 2 marked irreversible; returns 2's deploy id.
fn deploy_migrated(site: &Site, token: &str) -> String {
    let mut id = String::new();
    for (version, extra) in [
        ("1", String::new()),
        ("2", format!("irreversible: \"{MIGRATION_REASON}\"\n")),
    ] {
        let path = site.descriptor_for("acme/migrated", version);
        let text = std::fs::read_to_string(&path).expect("read the descriptor");
        std::fs::write(&path, format!("{text}{extra}")).expect("write the descriptor");
        let (code, v) = site.cli(token, &["deploy", "--wait", "-f", path.to_str().unwrap()]);
        assert_eq!(code, 0, "acme/migrated {version} is deployed: {v}");
        id = v["id"].as_str().unwrap_or_default().to_string();
    }
    id
}

/// The Rollback click on acme/migrated (2 irreversible) showed the guard's refusal, naming
/// the irreversible deploy and its reason, and made no deploy: 2 is still live.
fn the_rollback_click_past_an_irreversible_deploy_showed_the_refusal(
    site: &Site,
    token: &str,
    seen: &Value,
    migration: &str,
) {
    let refusal = seen["guard_refusal"].as_str().unwrap_or_default();
    assert!(
        refusal.contains("409")
            && refusal.contains(migration)
            && refusal.contains(MIGRATION_REASON)
            && refusal.contains("--force"),
        "the page showed the refusal naming the irreversible deploy and its reason: {seen}"
    );
    let (code, history) = site.cli(token, &["history", "acme/migrated", "prod"]);
    assert_eq!(
        (code, history.as_array().map_or(0, Vec::len)),
        (0, 2),
        "the refused click made no deploy: {history}"
    );
}

/// What the browser driver saw on the page (`seen`): the running step and its growing
/// elapsed time, one output pane per target, no button for a viewer, each click's
/// question, no API error and every screenshot.
fn the_page_showed_the_running_step_and_no_button_to_a_viewer(seen: &Value) {
    assert!(
        seen["running_step"]
            .as_str()
            .is_some_and(|s| s.starts_with("command 2, running for")),
        "the running deploy's target shows its running step: {seen}"
    );
    assert_ne!(
        seen["elapsed_first"], seen["elapsed_later"],
        "the running step's elapsed time grows on the page: {seen}"
    );
    assert_eq!(
        seen["output_panes"],
        serde_json::json!(["t1"]),
        "the output is shown in one pane per target: {seen}"
    );
    assert_eq!(
        seen["viewer_overview_buttons"], 0,
        "a viewer sees no Approve, Reject, Cancel or Recover button on the overview: {seen}"
    );
    assert_eq!(
        seen["viewer_deploy_buttons"], 0,
        "a viewer sees no button on a deploy waiting for approval: {seen}"
    );
    assert_eq!(
        seen["dialogs"].as_array().map_or(0, Vec::len),
        6,
        "each click asked its question (approve comment, reject reason, cancel, the refused \
         rollback, rollback, redeploy): {seen}"
    );
    assert_eq!(
        (&seen["approver_error"], &seen["viewer_error"]),
        (&Value::Bool(false), &Value::Bool(false)),
        "no API error was shown: {seen}"
    );
    let shots = seen["screenshots"].as_array().map_or(0, Vec::len);
    assert_eq!(shots, 9, "every screenshot was kept: {seen}");
}

/// The Rollback and Redeploy clicks the driver reported in `seen` made the deploys they say.
async fn the_rollback_and_redeploy_clicks_took_effect(site: &Site, token: &str, seen: &Value) {
    // The Rollback click made a rollback of acme/released to 1, and the page went to it; the
    // Redeploy click on its page deployed that rollback's descriptor again.
    let rolled_back = seen["rolled_back"].as_str().unwrap_or_default().to_string();
    let rollback = site.wait_status(token, &rolled_back, "SUCCESS").await;
    assert_eq!(
        (
            &rollback["redeploy_kind"],
            &rollback["version"],
            &rollback["submitted_by"]
        ),
        (
            &Value::from("rollback"),
            &Value::from("1"),
            &Value::from("carol")
        ),
        "the Rollback click rolled acme/released back to 1 as carol: {rollback}"
    );
    let redeployed = seen["redeployed"].as_str().unwrap_or_default().to_string();
    let redeploy = site.wait_status(token, &redeployed, "SUCCESS").await;
    assert_eq!(
        (&redeploy["redeploy_kind"], &redeploy["redeploy_of"]),
        (&Value::from("redeploy"), &Value::from(rolled_back.as_str())),
        "the Redeploy click on the rollback's page deployed it again: {redeploy}"
    );
    assert_eq!(
        seen["viewer_rollback_buttons"], 0,
        "a viewer sees what runs where without a Rollback button: {seen}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_routed_deploy_is_drawn_as_wave_bands_with_their_region_passes_and_one_output_pane_per_target()
 {
    let Some(chromium) = chromium() else { return };
    let mut site = Site::new(Db::Sqlite, &[]).await;
    site.set_config("dbos: {region_routing: true}\n");
    site.write_environment(
        "acme/web",
        "prod",
        "targets:\n  - {name: eu-1, host: local, region: eu}\n  - {name: us-1, host: local, region: us}\n\
         deploy: {plugin: command, commands: [\"echo printed-by-$MANENT_TARGET\"]}\nrollout: {waves: by_region}\n",
    );
    let token = site.token();
    site.start_api_and_region_workers().await;
    let (id, _) = site.submit(&token, "acme/web");
    let done = site.wait_status(&token, &id, "SUCCESS").await;
    let passes = done["passes"].as_array().map_or(0, Vec::len);
    assert_eq!(passes, 2, "status has the two region passes: {done}");

    let base = format!("http://127.0.0.1:{}/", site.port);
    let page = dump_dom(
        &chromium,
        &site.dir,
        &format!("{base}#deploy={id}&token={token}"),
    )
    .await;
    assert_no_error_shown(&page, "deploy page");
    let svg = page
        .find("<svg")
        .map(|at| &page[at..at + page[at..].find("</svg>").expect("the svg ends")])
        .unwrap_or_else(|| panic!("the deploy page draws an SVG timeline: {page}"));
    for wave in ["Wave 1/2: eu", "Wave 2/2: us"] {
        assert!(
            svg.contains(wave),
            "the timeline has a labelled band {wave:?}: {svg}"
        );
    }
    for (region, worker) in [("eu", "worker-eu"), ("us", "worker-us")] {
        assert!(
            svg.contains(&format!("region {region} pass · {worker}")),
            "the timeline draws the {region} pass and its worker: {svg}"
        );
    }
    assert_eq!(
        svg.matches("data-pass=").count(),
        2,
        "one row per pass: {svg}"
    );
    let eu_band = svg.find("Wave 1/2: eu").expect("the eu band");
    let us_band = svg.find("Wave 2/2: us").expect("the us band");
    let eu_step = svg.find(">eu-1: command 1<").expect("eu-1's step is drawn");
    let us_step = svg.find(">us-1: command 1<").expect("us-1's step is drawn");
    assert!(
        eu_band < eu_step && eu_step < us_band && us_band < us_step,
        "each pass's steps are drawn in their wave's band: {svg}"
    );
    for target in ["eu-1", "us-1"] {
        let pane = page
            .find(&format!("data-output-target=\"{target}\""))
            .unwrap_or_else(|| panic!("{target} has an output pane: {page}"));
        let end = page[pane..]
            .find("</details>")
            .map_or(page.len(), |e| pane + e);
        assert!(
            page[pane..end].contains(&format!("printed-by-{target}")),
            "{target}'s pane shows what its pass's command printed: {}",
            &page[pane..end]
        );
    }
}

/// An environment of two targets, t1 the canary, whose analysis measures `errors` (0.02 on
/// the canary, 0.01 on the baseline: within `result <= baseline * 3`, a bound the chart
/// draws) and `quiet` (a command printing nothing: inconclusive at once, over a limit of 0,
/// so the deploy waits for a decision; its condition has no single bound).
const DECIDED_ENVIRONMENT: &str = "targets: [{name: t1, host: local}, {name: t2, host: local}]
deploy:
  plugin: command
  commands: [\"true\"]
rollout:
  waves: [[t1], [t2]]
  analysis:
    bake: 600s
    interval: 1s
    metrics:
      - name: errors
        success: \"result <= baseline * 3\"
        command: {run: \"case '{targets}' in t1) echo 0.02;; *) echo 0.01;; esac\"}
      - name: quiet
        success: \"math::abs(result) < 1\"
        inconclusive_limit: 0
        command: {run: \"true\"}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_and_abort_clicked_on_a_deploy_waiting_for_a_decision_take_effect_and_its_chart_draws_the_threshold()
 {
    let Some((chromium, node_modules)) = browser_and_driver() else {
        return;
    };
    let mut site = Site::new(Db::Sqlite, &["true"]).await;
    for application in ["acme/promote", "acme/abort"] {
        site.write_environment(application, "prod", DECIDED_ENVIRONMENT);
    }
    let token = site.token();
    let approver = site.token_named("carol", "admin");
    let viewer = site.token_named("eve", "viewer");
    site.start("serve", "s1");
    site.wait_api().await;
    let (to_promote, _) = site.submit(&token, "acme/promote");
    let (to_abort, _) = site.submit(&token, "acme/abort");
    for id in [&to_promote, &to_abort] {
        site.wait_until(&token, id, "phase waiting_decision", |s: &Value| {
            s["phase"] == "waiting_decision"
        })
        .await;
    }
    let waiting = site.status(&token, &to_promote);
    let errors = element(&waiting["measurements"], "metric", "errors");
    assert!(
        errors["threshold"]
            .as_f64()
            .is_some_and(|t| (t - 0.03).abs() < 1e-9),
        "the measurement carries its threshold, baseline 0.01 * 3: {errors}"
    );
    let quiet = element(&waiting["measurements"], "metric", "quiet");
    assert!(
        quiet["threshold"].is_null() && quiet["outcome"] == "inconclusive",
        "a condition without a single bound has no threshold: {quiet}"
    );

    let artifacts = artifacts_dir();
    let config = serde_json::json!({
        "base": format!("http://127.0.0.1:{}/", site.port),
        "chromium": chromium,
        "artifacts": artifacts,
        "approver": approver,
        "viewer": viewer,
        "promote": to_promote,
        "abort": to_abort,
    });
    let seen = drive(&node_modules, "analysis.cjs", &config, &site.dir).await;
    the_charts_drew_the_threshold_where_the_condition_has_one(&seen);
    assert_eq!(
        seen["viewer_buttons"], 0,
        "a viewer gets no Promote or Abort button: {seen}"
    );
    assert!(
        seen["promote_label"] == "Promote" && seen["abort_shown"] == 1,
        "an approver gets Promote and Abort on a deploy waiting for a decision: {seen}"
    );
    assert_eq!(
        seen["approver_error"], false,
        "no click answered an error: {seen}"
    );

    let promoted = site.wait_status(&token, &to_promote, "SUCCESS").await;
    let t2 = element(&promoted["targets"], "name", "t2");
    assert_eq!(
        t2["status"], "deployed",
        "the Promote click passed the analysis: the next wave ran: {promoted}"
    );
    let aborted = site.wait_status(&token, &to_abort, "ERROR").await;
    assert!(
        aborted["error"]
            .as_str()
            .is_some_and(|e| e.contains("aborted by carol: aborted from the browser")),
        "the Abort click failed the deploy as carol, with the prompt's reason: {aborted}"
    );
}

/// The charts of the deploy waiting for a decision: `errors` with its threshold line beside
/// the canary and the baseline, `quiet` without one and saying so in its title.
fn the_charts_drew_the_threshold_where_the_condition_has_one(seen: &Value) {
    let chart = |metric: &str| element(&seen["charts"], "metric", metric);
    let errors = chart("errors");
    assert_eq!(
        (errors["threshold"].as_str(), errors["lines"].clone()),
        (
            Some("yes"),
            serde_json::json!(["threshold", "baseline", "canary"])
        ),
        "the errors chart draws the threshold, the baseline and the canary: {seen}"
    );
    let quiet = chart("quiet");
    assert!(
        quiet["threshold"] == "no"
            && quiet["title"]
                .as_str()
                .is_some_and(|t| t.contains("math::abs(result) < 1") && t.contains("no threshold")),
        "the quiet chart names its condition and says it has no threshold line: {seen}"
    );
}

/// The element of the array `list` whose `field` is `value` (null when none).
fn element(list: &Value, field: &str, value: &str) -> Value {
    list.as_array()
        .and_then(|items| items.iter().find(|item| item[field] == value))
        .cloned()
        .unwrap_or_default()
}
