//! `manent whoami` with CLI contexts against a real server, in a clean home directory
//! (docs/cli.md, "Contexts"): a context's server and token file are used with no flag
//! and no variable, whoami names the context and where each setting came from, and a
//! flag wins over the context.

mod common;

use std::process::Command;

use common::{Site, cli_binary};
use manent_testkit::Db;
use serde_json::Value;

/// `manent ARGS` in the clean home `home`: its exit code, stdout and stderr.
fn manent(home: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(cli_binary())
        .env_clear()
        .env("HOME", home)
        .args(args)
        .output()
        .expect("run manent");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whoami_names_the_context_in_use_and_where_each_setting_came_from() {
    let mut site = Site::new(Db::Sqlite, &["true"]).await;
    let token = site.token();
    let dora = site.token_named("dora", "deployer");
    site.start("api", "a1");
    site.wait_api().await;
    let home = tempfile::tempdir().expect("a clean home");
    let token_file = home.path().join("site.token");
    std::fs::write(&token_file, format!("{token}\n")).expect("write the token file");
    let server = format!("http://127.0.0.1:{}", site.port);
    let (code, _, err) = manent(
        home.path(),
        &[
            "context",
            "add",
            "site",
            "--server",
            &server,
            "--token-file",
            token_file.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "the context is added: {err}");

    let (code, text, err) = manent(home.path(), &["whoami"]);
    assert_eq!(code, 0, "whoami through the context alone: {err}");
    let row = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        row("ci").contains("admin")
            && row("context").contains("site")
            && row("server").contains(&server)
            && row("server").contains("context site")
            && row("token").contains(&format!("token file {}", token_file.display())),
        "whoami names the token, the context and where each setting came from:\n{text}"
    );
    assert!(!text.contains(&token), "never the token itself:\n{text}");

    let (code, json, err) = manent(home.path(), &["whoami", "-o", "json"]);
    assert_eq!(code, 0, "whoami -o json: {err}");
    let me: Value = serde_json::from_str(&json).expect("one JSON document");
    assert_eq!(
        (
            &me["name"],
            &me["context"],
            &me["settings"]["server"]["from"],
            &me["settings"]["token"]["value"]
        ),
        (
            &Value::from("ci"),
            &Value::from("site"),
            &Value::from("context site"),
            &Value::from("***")
        ),
        "the server's answer with the context and the settings' origins: {me}"
    );

    let (code, text, err) = manent(home.path(), &["whoami", "--token", &dora]);
    assert!(
        code == 0
            && text.lines().any(|l| l.starts_with("dora"))
            && text
                .lines()
                .any(|l| l.starts_with("token") && l.contains("--token")),
        "a flag wins over the context's token file: {text}{err}"
    );
}
