//! Notifications through a real server and a real HTTP receiver, on both backends: a
//! webhook is told of a deploy's start and end (signed with HMAC-SHA256 when it has a
//! secret), of a wait for approval and of a cancellation; a Slack webhook filtered to
//! failures gets only those; a webhook that is down delays no deploy, is retried, and is
//! kept as failed after its last try (docs/configuration.md, `notifications`).

mod common;

use std::sync::{Arc, Mutex};

use common::{Site, WAIT};
use manent_testkit::{Db, eventually, on_both_backends};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

on_both_backends!(
    webhooks_hear_of_starts_ends_approvals_and_cancellations_and_one_that_is_down_delays_nothing,
);

/// One request the receiver got: its headers (lower-case names) and body.
#[derive(Debug, Clone)]
struct Received {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

/// An HTTP/1.1 receiver on 127.0.0.1 that answers 200 to every request, one per connection.
async fn receiver() -> (u16, Arc<Mutex<Vec<Received>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let got = Arc::new(Mutex::new(Vec::new()));
    let sink = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let sink = sink.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 4096];
                let (head_end, length) = loop {
                    let n = socket.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buffer.extend_from_slice(&chunk[..n]);
                    if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buffer[..end]).to_lowercase();
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        break (end + 4, length);
                    }
                };
                while buffer.len() < head_end + length {
                    let n = socket.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buffer.extend_from_slice(&chunk[..n]);
                }
                let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
                let headers = head
                    .lines()
                    .skip(1)
                    .filter_map(|l| l.split_once(':'))
                    .map(|(n, v)| (n.trim().to_lowercase(), v.trim().to_string()))
                    .collect();
                let body = buffer[head_end..head_end + length].to_vec();
                sink.lock().unwrap().push(Received { headers, body });
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    (port, got)
}

/// The `(event, deploy id)` pairs `got` holds, in arrival order.
fn events(got: &Mutex<Vec<Received>>) -> Vec<(String, String)> {
    got.lock()
        .unwrap()
        .iter()
        .map(|r| {
            let v = r.json();
            (
                v["event"].as_str().unwrap_or_default().to_string(),
                v["deploy"]["id"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

async fn webhooks_hear_of_starts_ends_approvals_and_cancellations_and_one_that_is_down_delays_nothing(
    db: Db,
) {
    let (ops_port, ops) = receiver().await;
    let (slack_port, slack) = receiver().await;
    let down_port = common::free_port();
    let mut site = Site::new(db, &["true"]).await;
    std::fs::write(site.dir.join("webhook.secret"), "s3cret\n").unwrap();
    site.set_config(&format!(
        "notifications:\n  retry_after: 100ms\n  max_attempts: 2\n  webhooks:\n\
         \x20   - {{name: ops, url: \"http://127.0.0.1:{ops_port}/hook\", secret_file: webhook.secret}}\n\
         \x20   - {{name: chat, url: \"http://127.0.0.1:{slack_port}/slack\", format: slack, events: [failed]}}\n\
         \x20   - {{name: down, url: \"http://127.0.0.1:{down_port}/\", events: [succeeded], applications: [\"acme/web\"]}}\n"
    ));
    let gate = site.dir.join("gate").display().to_string();
    site.write_environment(
        "acme/broken",
        "prod",
        "targets: [{name: t1, host: local}]\ndeploy:\n  plugin: command\n  commands: [\"exit 3\"]\n",
    );
    site.write_environment(
        "acme/gated",
        "prod",
        "targets: [{name: t1, host: local}]\ndeploy:\n  plugin: command\n  commands: [\"true\"]\n\
         approval: {approvers: [approver], count: 1}\n",
    );
    site.write_environment(
        "acme/slow",
        "prod",
        &format!(
            "targets: [{{name: t1, host: local}}]\ndeploy:\n  plugin: command\n  commands: [\"while [ ! -f {gate} ]; do sleep 0.1; done\"]\n"
        ),
    );
    let token = site.token();
    site.start("serve", "s1");
    site.wait_api().await;

    // A webhook that is down delays nothing: the deploy ends as fast as without it.
    let (ok, _) = site.submit(&token, "acme/web");
    site.wait_status(&token, &ok, "SUCCESS").await;
    let (broken, _) = site.submit(&token, "acme/broken");
    site.wait_status(&token, &broken, "ERROR").await;
    let (gated, _) = site.submit(&token, "acme/gated");
    let (slow, _) = site.submit(&token, "acme/slow");
    site.wait_until(&token, &slow, "runs its command", |s| {
        s["status"] == "PENDING" && s["phase"] != "queued"
    })
    .await;
    eventually(
        "the ops webhook hears the slow deploy start",
        WAIT,
        || async {
            events(&ops)
                .iter()
                .any(|(e, id)| e == "started" && *id == slow)
                .then_some(())
        },
    )
    .await;
    let (code, cancelled) = site.cli(&token, &["cancel", &slow]);
    assert_eq!(code, 0, "cancel: {cancelled}");

    // The broken deploy is its environment's first: nothing to roll back to, no
    // `rolled_back`.
    let want = [
        ("started", ok.as_str()),
        ("succeeded", ok.as_str()),
        ("started", broken.as_str()),
        ("failed", broken.as_str()),
        ("approval_required", gated.as_str()),
        ("started", slow.as_str()),
        ("cancelled", slow.as_str()),
    ];
    let heard = eventually("the ops webhook hears of every event", WAIT, || async {
        let heard = events(&ops);
        want.iter()
            .all(|(e, id)| heard.iter().any(|(he, hid)| he == e && hid == id))
            .then_some(heard)
    })
    .await;
    assert_eq!(
        heard.len(),
        want.len(),
        "each event once, nothing else: {heard:?}"
    );
    assert_every_delivery_signed(&ops);
    let failed = ops
        .lock()
        .unwrap()
        .iter()
        .map(Received::json)
        .find(|v| v["event"] == "failed")
        .unwrap();
    assert!(
        failed["deploy"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("exit")),
        "a failure says why: {failed}"
    );

    let chat = eventually("the chat webhook hears of the failure", WAIT, || async {
        let got = slack.lock().unwrap().clone();
        (!got.is_empty()).then_some(got)
    })
    .await;
    assert_eq!(
        chat.len(),
        1,
        "only failures go to the chat webhook: {chat:?}"
    );
    let text = chat[0].json()["text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        text.contains("acme/broken") && text.contains("failed"),
        "Slack's incoming-webhook body: a text naming the application and what happened: {text}"
    );
    assert_eq!(
        chat[0].header("x-manent-signature"),
        None,
        "no secret, no signature"
    );

    // The webhook that is down: tried max_attempts times, then kept as failed.
    assert_down_delivery_kept_as_failed(&site).await;
}

/// Every delivery to `ops` signed with its secret (`s3cret`), alone and with its timestamp.
fn assert_every_delivery_signed(ops: &Mutex<Vec<Received>>) {
    for r in ops.lock().unwrap().iter() {
        assert_eq!(
            r.header("x-manent-signature"),
            Some(manent_deploy::notifications::signature(b"s3cret", &r.body).as_str()),
            "every body is signed with the webhook's secret (its file's final newline \
             excluded): {r:?}"
        );
        let timestamp: i64 = r
            .header("x-manent-timestamp")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("a delivery carries its time in unix seconds: {r:?}"));
        assert_eq!(
            r.header("x-manent-signature-256-timestamped"),
            Some(
                manent_deploy::notifications::timestamped_signature(b"s3cret", timestamp, &r.body)
                    .as_str()
            ),
            "the timestamp and the body are signed together, so a replay can be refused: {r:?}"
        );
    }
}

/// The delivery wanted by the webhook that is down, kept as failed after its two tries.
async fn assert_down_delivery_kept_as_failed(site: &Site) {
    let client = manent_engine::Client::new(
        manent_engine::store::open(&site.db.url)
            .await
            .expect("open the database"),
    );
    let kept = eventually(
        "the down webhook's delivery is kept as failed after its tries",
        WAIT,
        || async {
            let failed = client
                .records()
                .list(manent_deploy::notifications::FAILED_KIND)
                .await
                .ok()?;
            (!failed.is_empty()).then_some(failed)
        },
    )
    .await;
    assert_eq!(
        kept.len(),
        1,
        "one event wanted by the down webhook: {kept:?}"
    );
    let entry: manent_deploy::notifications::Entry =
        serde_json::from_str(&kept[0].1).expect("a readable entry");
    assert!(
        entry.webhook == "down"
            && entry.attempts == 2
            && entry
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("refused")),
        "its two tries and why they failed are kept: {entry:?}"
    );
}
