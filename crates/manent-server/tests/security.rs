//! Tokens, the audit trail, HTTPS and what commands see, against real processes: a token
//! revoked with `manent-server admin token revoke` is refused by the running API at once,
//! the administration commands never print a secret, the `manent` CLI verifies an HTTPS
//! API against a private CA (`--ca`) made for the test (and the server warns of a key
//! others may read), and a `host: local` command sees none of the worker's variables but
//! those its environment file lists in `inherit_env`.

mod common;

use std::process::{Command, Output};

use common::{Site, WAIT, cli_binary};
use manent_testkit::{Db, eventually};
use serde_json::Value;

use manent_testkit::on_both_backends;

on_both_backends!(
    a_token_revoked_on_the_command_line_is_refused_by_the_running_api_and_audited,
    token_administration_refuses_duplicates_and_unqualified_scopes_and_never_prints_a_secret,
);

/// `manent-server -c manent.yml admin token …`.
fn admin(site: &Site, args: &[&str]) -> Output {
    let mut all = vec!["admin", "token"];
    all.extend_from_slice(args);
    site.command(&all, "admin")
        .output()
        .expect("run manent-server admin")
}

async fn a_token_revoked_on_the_command_line_is_refused_by_the_running_api_and_audited(db: Db) {
    let mut site = Site::new(db, &["true"]).await;
    let admin_token = site.token();
    let bot = site.token_named("bot", "viewer");
    site.start("api", "api-1");
    site.wait_api().await;
    let (code, _) = site.cli(&bot, &["queues"]);
    assert_eq!(code, 0, "a live viewer token reads the queues");

    let out = admin(&site, &["revoke", "--name", "bot"]);
    assert!(
        out.status.success(),
        "revoke succeeds: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, _) = site.cli(&bot, &["queues"]);
    assert_eq!(
        code, 3,
        "the running API refuses the revoked token at its next request (401, exit 3)"
    );
    let (code, _) = site.cli(&admin_token, &["queues"]);
    assert_eq!(code, 0, "other tokens are untouched by the revocation");

    let entries = eventually("the refusal is in the audit trail", WAIT, || async {
        let (code, v) = site.cli(&admin_token, &["audit", "--limit", "20"]);
        assert_eq!(code, 0, "an admin reads the audit trail: {v}");
        let entries = v.as_array().cloned().unwrap_or_default();
        entries
            .iter()
            .any(|e| e["outcome"] == 401)
            .then_some(entries)
    })
    .await;
    let revoke = entries
        .iter()
        .find(|e| e["action"] == "token.revoke")
        .unwrap_or_else(|| panic!("the revocation is audited: {entries:#?}"));
    assert_eq!(
        (revoke["token"].as_str(), revoke["target"].as_str()),
        (Some("manent-server admin"), Some("bot")),
        "the entry says who revoked which token"
    );
    let (code, _) = site.cli(&bot, &["audit"]);
    assert_eq!(
        code, 3,
        "the audit trail is not readable with a revoked token"
    );
}

async fn token_administration_refuses_duplicates_and_unqualified_scopes_and_never_prints_a_secret(
    db: Db,
) {
    let site = Site::new(db, &["true"]).await;
    let secret = site.token_named("release-bot", "approver");
    let out = admin(
        &site,
        &["create", "--name", "release-bot", "--role", "admin"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("already exists"),
        "a second token named release-bot is refused, saying why: {stderr}"
    );
    let out = admin(
        &site,
        &[
            "create", "--name", "shopper", "--role", "deployer", "--on", "shop",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("`shop/*`"),
        "an unqualified scope is refused with a hint to write shop/*: {stderr}"
    );
    let out = admin(
        &site,
        &[
            "create",
            "--name",
            "temp",
            "--role",
            "viewer",
            "--on",
            "shop/*",
            "--expires",
            "1h",
        ],
    );
    assert!(
        out.status.success(),
        "a scoped token with an expiry is created: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let temp_secret = String::from_utf8_lossy(&out.stdout).trim().to_string();

    let table = admin(&site, &["list"]);
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    let json = admin(&site, &["list", "--output", "json"]);
    let json = String::from_utf8_lossy(&json.stdout).to_string();
    for (what, text) in [("the table", &table), ("the JSON", &json)] {
        assert!(
            !text.contains(&secret) && !text.contains(&temp_secret) && !text.contains("mnt_"),
            "{what} of `admin token list` never shows a secret:\n{text}"
        );
    }
    for column in ["NAME", "ROLE", "ON", "CREATED", "EXPIRES", "LAST USED"] {
        assert!(
            table.contains(column),
            "the table has a {column} column:\n{table}"
        );
    }
    let tokens: Vec<Value> = serde_json::from_str(&json).expect("--output json is JSON");
    let names: Vec<&str> = tokens.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["release-bot", "temp"], "one row per token, by name");
    let temp = &tokens[1];
    assert_eq!(
        (temp["on"].as_str(), temp["expires_at"].is_string()),
        (Some("shop/*"), true),
        "the scope and the expiry are listed: {temp}"
    );
    assert!(
        tokens
            .iter()
            .all(|t| t["id"].as_str().is_some_and(|id| id.starts_with("tok_"))),
        "every token has a stable id: {json}"
    );
}

/// A CA, and a certificate it signed for 127.0.0.1 and localhost: (CA PEM, cert PEM, key PEM).
fn private_ca() -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().expect("a CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "manent test CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("a CA certificate");
    let server_key = rcgen::KeyPair::generate().expect("a server key");
    let server_params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .unwrap();
    let server = server_params
        .signed_by(&server_key, &ca)
        .expect("a server certificate");
    (ca.pem(), server.pem(), server_key.serialize_pem())
}

/// `manent --server URL [--ca FILE] --output json queues`.
fn cli_over(token: &str, server: &str, ca: Option<&std::path::Path>) -> Output {
    let mut command = Command::new(cli_binary());
    command.args(["--server", server, "--token", token, "--output", "json"]);
    if let Some(ca) = ca {
        command.arg("--ca").arg(ca);
    }
    command.env_remove("MANENT_CA");
    command.arg("queues").output().expect("run manent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_verifies_the_https_api_against_a_private_ca_given_with_ca() {
    let mut site = Site::new(Db::Sqlite, &["true"]).await;
    let (ca, cert, key) = private_ca();
    std::fs::create_dir_all(site.dir.join("tls")).unwrap();
    std::fs::write(site.dir.join("tls/server.pem"), cert).unwrap();
    std::fs::write(site.dir.join("tls/server.key"), key).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        site.dir.join("tls/server.key"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let ca_path = site.dir.join("ca.pem");
    std::fs::write(&ca_path, ca).unwrap();
    // Relative paths: resolved against the directory of manent.yml.
    std::fs::write(
        site.dir.join("manent.yml"),
        format!(
            "database: {{url: \"{}\"}}\napi: {{listen: \"127.0.0.1:{}\", tls: {{cert: tls/server.pem, \
             key: tls/server.key}}}}\nenvironments: {{source: environments}}\n",
            site.db.url, site.port
        ),
    )
    .unwrap();
    let token = site.token();
    site.start("api", "api-1");
    site.wait_api().await;
    let https = format!("https://127.0.0.1:{}", site.port);

    let out = eventually("the HTTPS API answers the CLI", WAIT, || async {
        let out = cli_over(&token, &https, Some(&ca_path));
        out.status.success().then_some(out)
    })
    .await;
    let queues: Value = serde_json::from_slice(&out.stdout).expect("JSON over HTTPS");
    assert!(
        queues.is_array(),
        "the queues are read over HTTPS: {queues}"
    );

    let out = cli_over(&token, &https, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "without --ca the certificate of the private CA is not trusted: {stderr}"
    );
    assert!(
        stderr.to_lowercase().contains("certificate"),
        "the error says the certificate was refused: {stderr}"
    );
    let out = cli_over(&token, &format!("http://127.0.0.1:{}", site.port), None);
    assert_ne!(
        out.status.code(),
        Some(0),
        "plain HTTP gets nothing from an HTTPS listener"
    );
    let log = std::fs::read_to_string(site.dir.join("api-api-1.log")).expect("the API's log");
    assert!(
        log.contains("chmod 600") && log.contains("server.key"),
        "a key others may read (written 0644 here) is warned of, naming it and the fix: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_command_sees_none_of_the_workers_variables_but_those_inherit_env_lists() {
    let mut site = Site::new(Db::Sqlite, &[]).await;
    let seen = site.dir.join("seen-env");
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets:\n  - {{name: t1, host: local}}\ninherit_env: [PASSED_THROUGH]\n\
             deploy:\n  plugin: command\n  commands:\n    - {}\n",
            serde_json::to_string(&format!("env > {}", seen.display())).unwrap()
        ),
    );
    let token = site.token();
    site.start_with(
        "serve",
        "node-1",
        &[
            ("WORKER_ONLY_SECRET", "kept-on-the-worker"),
            ("PASSED_THROUGH", "listed-in-inherit-env"),
        ],
    );
    site.wait_api().await;
    let descriptor = site.descriptor("1.0");
    let (code, submitted) = site.cli(&token, &["deploy", "-f", descriptor.to_str().unwrap()]);
    assert_eq!(code, 0, "submission accepted: {submitted}");
    let id = submitted["id"].as_str().unwrap().to_string();
    let done = site.wait_status(&token, &id, "SUCCESS").await;
    let env = std::fs::read_to_string(&seen)
        .unwrap_or_else(|e| panic!("the command wrote its environment ({e}): {done}"));
    assert!(
        !env.contains("WORKER_ONLY_SECRET") && !env.contains("kept-on-the-worker"),
        "a variable of the worker not listed in inherit_env stays out: {env}"
    );
    assert!(
        env.lines()
            .any(|l| l == "PASSED_THROUGH=listed-in-inherit-env"),
        "a variable listed in inherit_env is passed through: {env}"
    );
    for name in ["MANENT_DEPLOY_ID", "MANENT_TARGET", "PATH"] {
        assert!(
            env.lines().any(|l| l.starts_with(&format!("{name}="))),
            "{name} is there as for an SSH command: {env}"
        );
    }
}
