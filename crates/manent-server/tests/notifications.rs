//! Notifications through a real server and a real HTTP receiver, on both backends: a
//! webhook is told of a deploy's start and end (signed with HMAC-SHA256 when it has a
//! secret), of a wait for approval and of a cancellation; a Slack webhook filtered to
//! failures gets only those; a webhook that is down delays no deploy, is retried, and is
//! kept as failed after its last try (docs/configuration.md, `notifications`). Deliveries
//! are the engine's durable work: a webhook that never answers holds up no other webhook's
//! delivery, and with two workers each delivery (also one an older manent left in its
//! outbox) is made once.

mod common;

use std::sync::{Arc, Mutex};

use common::{Site, WAIT};
use manent_testkit::{Db, eventually, on_both_backends};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

on_both_backends!(
    webhooks_hear_of_starts_ends_approvals_and_cancellations_and_one_that_is_down_delays_nothing,
    a_webhook_that_never_answers_does_not_delay_another_webhooks_delivery,
    two_workers_make_each_delivery_once_also_those_an_older_manent_left_in_its_outbox,
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
        manent_engine::Database::open(&site.db.url, &manent_engine::Connections::default())
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

/// A receiver on 127.0.0.1 that reads each request and never answers; `log` gets `got`
/// when a request has arrived and `closed` when the sender gave up on it.
async fn never_answering(log: Arc<Mutex<Vec<String>>>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let log = log.clone();
            tokio::spawn(async move {
                let mut chunk = [0u8; 4096];
                let mut said = false;
                while socket.read(&mut chunk).await.unwrap_or(0) > 0 {
                    if !said {
                        log.lock().unwrap().push("stuck: got".into());
                        said = true;
                    }
                }
                log.lock().unwrap().push("stuck: closed".into());
            });
        }
    });
    port
}

/// The site's configuration as a worker reads it (to record events from the test).
fn site_config(site: &Site) -> manent_config::Config {
    let text = std::fs::read_to_string(site.dir.join("manent.yml")).unwrap();
    manent_config::Config::from_yaml_str(&text, "manent.yml", std::iter::empty())
        .expect("the site's configuration")
}

/// A client on the site's database.
async fn engine_client(site: &Site) -> manent_engine::Client {
    manent_engine::Client::new(
        manent_engine::Database::open(&site.db.url, &manent_engine::Connections::default())
            .await
            .expect("open the database"),
    )
}

/// The facts of a deploy `id` of `application` (no deploy runs: events are recorded as a
/// deploy would record them).
fn facts(id: &str, application: &str) -> manent_deploy::notifications::Facts {
    manent_deploy::notifications::Facts {
        deploy_id: id.into(),
        application: application.into(),
        environment: "prod".into(),
        version: "1.0.0".into(),
        submitted_by: "ci".into(),
        error: None,
    }
}

async fn a_webhook_that_never_answers_does_not_delay_another_webhooks_delivery(db: Db) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let stuck_port = never_answering(log.clone()).await;
    let (ok_port, ok) = receiver().await;
    let mut site = Site::new(db, &["true"]).await;
    site.set_config(&format!(
        "notifications:\n  max_attempts: 1\n  webhooks:\n\
         \x20   - {{name: stuck, url: \"http://127.0.0.1:{stuck_port}/\", applications: [\"acme/first\"]}}\n\
         \x20   - {{name: ok, url: \"http://127.0.0.1:{ok_port}/\", applications: [\"acme/second\"]}}\n"
    ));
    site.start("worker", "w1");
    let (client, config) = (engine_client(&site).await, site_config(&site));
    use manent_config::NotificationEvent::Started;
    manent_deploy::notifications::record(&client, &config, Started, &facts("d-1", "acme/first"))
        .await;
    eventually("the stuck webhook gets its request", WAIT, || async {
        log.lock()
            .unwrap()
            .contains(&"stuck: got".to_string())
            .then_some(())
    })
    .await;
    // While that request hangs, the other webhook's event is recorded and delivered.
    manent_deploy::notifications::record(&client, &config, Started, &facts("d-2", "acme/second"))
        .await;
    eventually("the other webhook gets its delivery", WAIT, || async {
        (!ok.lock().unwrap().is_empty()).then_some(())
    })
    .await;
    log.lock().unwrap().push("ok: got".into());
    let order = log.lock().unwrap().clone();
    assert_eq!(
        order,
        ["stuck: got", "ok: got"],
        "the other webhook's delivery arrived while the stuck one's try was still waiting \
         for an answer (one after the other, it would have come only after that try gave up)"
    );
}

async fn two_workers_make_each_delivery_once_also_those_an_older_manent_left_in_its_outbox(db: Db) {
    use manent_deploy::notifications::{Entry, FAILED_KIND, NOTIFY_WORKFLOW, OUTBOX_KIND};
    let (ops_port, ops) = receiver().await;
    let site = Site::new(db, &["true"]).await;
    site.set_config(&format!(
        "notifications:\n  webhooks:\n\
         \x20   - {{name: ops, url: \"http://127.0.0.1:{ops_port}/hook\"}}\n"
    ));
    let (client, config) = (engine_client(&site).await, site_config(&site));
    // What an older manent left: three entries waiting (one tried once already) and one
    // that cannot be read.
    let records = client.records();
    for (i, attempts) in [(1, 0), (2, 1), (3, 0)] {
        let entry = Entry {
            webhook: "ops".into(),
            event: manent_config::NotificationEvent::Succeeded,
            deploy: facts(&format!("old-{i}"), "acme/web"),
            at_ms: 1,
            attempts,
            next_at_ms: 1,
            last_error: None,
        };
        let value = serde_json::to_string(&entry).unwrap();
        records
            .put(OUTBOX_KIND, &entry.key(), &value, 1)
            .await
            .unwrap();
    }
    records
        .put(OUTBOX_KIND, "old-4/succeeded/ops", "{not json", 1)
        .await
        .unwrap();
    let mut site = site;
    site.start("worker", "w1");
    site.start("worker", "w2");
    for i in 1..=10 {
        let event = manent_config::NotificationEvent::Started;
        manent_deploy::notifications::record(
            &client,
            &config,
            event,
            &facts(&format!("new-{i}"), "acme/web"),
        )
        .await;
    }
    let filter = manent_engine::WorkflowFilter {
        name: Some(NOTIFY_WORKFLOW.into()),
        ..Default::default()
    };
    let ended = eventually("every delivery has ended", WAIT, || async {
        let all = client.list(&filter).await.ok()?;
        (all.len() == 13 && all.iter().all(|w| w.status.is_terminal())).then_some(all)
    })
    .await;
    assert!(
        ended
            .iter()
            .all(|w| w.status == manent_engine::WorkflowStatus::Success),
        "every delivery went through: {ended:?}"
    );
    let mut keys: Vec<String> = ops
        .lock()
        .unwrap()
        .iter()
        .map(|r| {
            r.header("x-manent-delivery")
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    keys.sort();
    let mut unique = keys.clone();
    unique.dedup();
    assert_eq!(
        (keys.len(), unique.len()),
        (13, 13),
        "three old entries and ten new events, each delivered once by one of two workers: {keys:?}"
    );
    assert!(
        records.list(OUTBOX_KIND).await.unwrap().is_empty(),
        "the old outbox is empty once moved onto the queue"
    );
    let failed = records.list(FAILED_KIND).await.unwrap();
    assert_eq!(
        failed,
        [("old-4/succeeded/ops".to_string(), "{not json".to_string())],
        "the unreadable old entry is kept as failed, as it was, never dropped"
    );
}
