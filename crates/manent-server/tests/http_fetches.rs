//! What a worker fetches and checks over HTTP goes through manent-server's client (its
//! `http.rs`, behind manent-deploy's port), on both backends: an artifact from an http://
//! source reached through a redirect to another source, the first source's bearer token
//! sent to it alone, and an HTTP check that follows a redirect to the page that answers
//! (docs/security.md, "Artifact sources"; docs/environments.md, checks).

mod common;

use std::sync::{Arc, Mutex};

use common::Site;
use manent_testkit::{Db, on_both_backends};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

on_both_backends!(an_artifact_behind_a_redirect_and_an_http_check_go_through_the_workers_client,);

/// What each request to [`artifact_server`] carried: its path and `Authorization` header.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// An HTTP/1.1 server on loopback: `/private/app` redirects to `/public/app.txt`, which
/// answers `payload`; `/health` redirects to `/health/ok`, which answers 200; anything else
/// is a 404. Returns its base URL and what it was asked.
async fn artifact_server() -> (String, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen: Seen = Arc::default();
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                let authorization = head.lines().find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("authorization")
                        .then(|| value.trim().to_string())
                });
                record.lock().unwrap().push((path.clone(), authorization));
                let answer = match path.as_str() {
                    "/private/app" => {
                        "HTTP/1.1 302 Found\r\nLocation: /public/app.txt\r\n\
                                       Content-Length: 0\r\nConnection: close\r\n\r\n"
                    }
                    "/public/app.txt" => {
                        "HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\
                                          Connection: close\r\n\r\npayload"
                    }
                    "/health" => {
                        "HTTP/1.1 302 Found\r\nLocation: /health/ok\r\n\
                                  Content-Length: 0\r\nConnection: close\r\n\r\n"
                    }
                    "/health/ok" => {
                        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\
                                     Connection: close\r\n\r\nok"
                    }
                    _ => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                };
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    (base, seen)
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
    assert_eq!(
        seen.lock().unwrap().clone(),
        [
            ("/private/app".to_string(), bearer),
            ("/public/app.txt".to_string(), None),
            ("/health".to_string(), None),
            ("/health/ok".to_string(), None),
        ],
        "the token went to its own source only, and the check followed its redirect"
    );
}
