//! What a worker fetches and checks over HTTP goes through manent-server's client (its
//! `http.rs`, behind manent-deploy's port), on both backends: an artifact from an http://
//! source reached through a redirect to another source, the first source's bearer token
//! sent to it alone, and an HTTP check that follows a redirect to the page that answers
//! (docs/security.md, "Artifact sources"; docs/environments.md, checks).

mod common;

use common::Site;
use manent_testkit::{Db, http, on_both_backends};

on_both_backends!(an_artifact_behind_a_redirect_and_an_http_check_go_through_the_workers_client,);

/// An HTTP/1.1 server on loopback: `/private/app` redirects to `/public/app.txt`, which
/// answers `payload`; `/health` redirects to `/health/ok`, which answers 200; anything else
/// is a 404. Returns its base URL and the heads of the requests it got.
async fn artifact_server() -> (String, http::Heads) {
    let redirect = |to: &str| {
        (
            format!(
                "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close"
            ),
            Vec::new(),
        )
    };
    let ok = |body: &str| {
        (
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close",
                body.len()
            ),
            body.as_bytes().to_vec(),
        )
    };
    http::serve(move |path| match path {
        "/private/app" => redirect("/public/app.txt"),
        "/public/app.txt" => ok("payload"),
        "/health" => redirect("/health/ok"),
        "/health/ok" => ok("ok"),
        _ => (
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close".into(),
            Vec::new(),
        ),
    })
    .await
}

async fn an_artifact_behind_a_redirect_and_an_http_check_go_through_the_workers_client(db: Db) {
    let (base, seen) = artifact_server().await;
    let mut site = Site::new(db, &[]).await;
    let token_file = site.dir.join("artifacts.token");
    std::fs::write(&token_file, "t0ken\n").unwrap();
    // The site's configuration with these sources in place of its own.
    let config = common::base_config(&site.db.url, site.port, "")
        .lines()
        .map(|line| {
            if line.starts_with("artifacts:") {
                format!(
                    "artifacts:\n  sources:\n    - url: {base}/private/\n      \
                     bearer_token_file: {}\n    - {base}/public/",
                    token_file.display()
                )
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(site.dir.join("manent.yml"), config).unwrap();
    let deployed = site.dir.join("deployed.txt");
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets: [{{name: t1, host: local}}]\ndeploy:\n  plugin: command\n  commands:\n    \
             - {}\nchecks: [{{type: http, name: up, url: \"{base}/health\", expect_status: 200, \
             retries: 0}}]\n",
            serde_json::to_string(&format!(
                "cp \"$MANENT_ARTIFACT_ARTIFACT_TXT\" {}",
                deployed.display()
            ))
            .unwrap()
        ),
    );
    let descriptor = site.descriptor("1");
    let text = std::fs::read_to_string(&descriptor).unwrap();
    let file_url = format!("file://{}", site.dir.join("artifact.txt").display());
    assert!(
        text.contains(&file_url),
        "the site's descriptor names {file_url}: {text}"
    );
    std::fs::write(
        &descriptor,
        text.replace(&file_url, &format!("{base}/private/app")),
    )
    .unwrap();

    let token = site.token();
    site.start("serve", "w1");
    site.wait_api().await;
    let (code, submitted) = site.cli(&token, &["deploy", "-f", descriptor.to_str().unwrap()]);
    assert_eq!(code, 0, "the deploy is accepted: {submitted}");
    let id = submitted["id"].as_str().unwrap_or_default().to_string();
    let status = site
        .wait_until(&token, &id, "ends", |s| {
            s["status"] == "SUCCESS" || s["status"] == "ERROR"
        })
        .await;
    let log = std::fs::read_to_string(site.dir.join("serve-w1.log")).unwrap_or_default();
    assert_eq!(
        status["status"], "SUCCESS",
        "the artifact is fetched through the redirect and the check passes: {status}\n{log}"
    );
    assert_eq!(
        std::fs::read_to_string(&deployed).ok().as_deref(),
        Some("payload"),
        "the command got the worker's verified copy"
    );
    let bearer = Some("Bearer t0ken".to_string());
    let seen: Vec<(String, Option<String>)> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|h| (http::path(h).to_string(), http::header(h, "authorization")))
        .collect();
    assert_eq!(
        seen,
        [
            ("/private/app".to_string(), bearer),
            ("/public/app.txt".to_string(), None),
            ("/health".to_string(), None),
            ("/health/ok".to_string(), None),
        ],
        "the token went to its own source only, and the check followed its redirect"
    );
}
