//! The Platform page in headless chromium (`MANENT_TEST_CHROMIUM`): its DOM once its
//! script has built it from the API, for the tests that read what a page shows.

use std::{
    path::Path,
    process::{Command, Stdio},
};

use manent_testkit::eventually;

use super::WAIT;

/// chromium's own budget of (virtual) time for the page's script and its API calls.
const VIRTUAL_TIME_BUDGET_MS: u32 = 10_000;

/// The chromium binary, or `None` (after saying so loudly) when this machine has none and
/// this is not CI. On CI a missing browser fails the test.
pub fn chromium() -> Option<String> {
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
pub async fn dump_dom(chromium: &str, scratch: &Path, url: &str) -> String {
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
