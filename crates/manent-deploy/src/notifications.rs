//! Notifications (docs/configuration.md, `notifications`): what happened to a deploy
//! (approval required, started, succeeded, failed, cancelled, rolled back) is written to an
//! outbox in the database, one entry per event and webhook, and the workers deliver the
//! entries in the background with retries. Nothing here ever blocks or fails a deploy: an
//! entry that cannot be written is a log line, a webhook that is down only delays its own
//! deliveries.
//!
//! At least once: an event is recorded under a key (deploy, event, webhook) that is kept
//! for a week after delivery, so a deploy replayed after a crash does not send it again
//! within that time; a delivery cut off before its answer is sent again.

use std::time::Duration;

use hmac::{Hmac, Mac};
use manent_config::{Config, NotificationEvent, Webhook, WebhookFormat};
use manent_engine::{Client, EngineError, RecordEntry, now_ms};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// Entries waiting for delivery (key: `<deploy>/<event>/<webhook>`).
pub const OUTBOX_KIND: &str = "notification";
/// Entries whose deliveries all failed, kept for inspection (`/metrics`, logs).
pub const FAILED_KIND: &str = "notification-failed";
/// The keys of events already recorded, so that a replay records none twice.
const RECORDED_KIND: &str = "notification-recorded";
/// A worker delivering an entry now (value: since when, ms).
const CLAIM_KIND: &str = "notification-claim";
/// How long a recorded key is kept after its event.
const RECORDED_FOR: Duration = Duration::from_secs(7 * 24 * 3600);
/// A claim older than this belongs to a worker that stopped mid-delivery.
const CLAIM_STALE: Duration = Duration::from_secs(120);
/// How long one delivery may take.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the keys of old events are dropped.
const FORGET_EVERY: Duration = Duration::from_secs(600);
/// The longest wait between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// The deploy an event is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Facts {
    pub deploy_id: String,
    pub application: String,
    pub environment: String,
    pub version: String,
    /// The token name that submitted it.
    pub submitted_by: String,
    /// Why it failed (failed, rolled back).
    pub error: Option<String>,
}

impl Facts {
    /// The deploy `deploy_id` that `request` started.
    pub fn of(request: &crate::request::DeployRequest, deploy_id: &str) -> Facts {
        Facts {
            deploy_id: deploy_id.to_string(),
            application: request.descriptor.application.clone(),
            environment: request.descriptor.environment.clone(),
            version: request.descriptor.version().to_string(),
            submitted_by: request.submitted_by.clone(),
            error: None,
        }
    }
}

/// One outbox entry: the event, for one webhook, and how its delivery goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub webhook: String,
    pub event: NotificationEvent,
    pub deploy: Facts,
    pub at_ms: i64,
    pub attempts: u32,
    pub next_at_ms: i64,
    pub last_error: Option<String>,
}

/// Records `event` of `deploy` for every webhook that wants it. Never fails: an entry
/// that cannot be written is logged (the deploy goes on).
pub async fn record(client: &Client, config: &Config, event: NotificationEvent, deploy: &Facts) {
    for hook in &config.notifications.webhooks {
        if !hook.wants(event, &deploy.application) {
            continue;
        }
        if let Err(e) = record_one(client, hook, event, deploy).await {
            tracing::warn!(webhook = %hook.name, event = event.as_str(), deploy = %deploy.deploy_id, error = %e, "cannot record a notification; it will not be sent");
        }
    }
}

async fn record_one(
    client: &Client,
    hook: &Webhook,
    event: NotificationEvent,
    deploy: &Facts,
) -> Result<(), EngineError> {
    let key = format!("{}/{}/{}", deploy.deploy_id, event.as_str(), hook.name);
    let now = now_ms();
    let entry = Entry {
        webhook: hook.name.clone(),
        event,
        deploy: deploy.clone(),
        at_ms: now,
        attempts: 0,
        next_at_ms: now,
        last_error: None,
    };
    let value = serde_json::to_string(&entry).expect("an entry serializes");
    let recorded_until = (now + millis(RECORDED_FOR)).to_string();
    // Both or neither: a key recorded without its entry would never be sent.
    client
        .records()
        .insert_all(
            &[
                RecordEntry {
                    kind: RECORDED_KIND,
                    key: &key,
                    value: &recorded_until,
                },
                RecordEntry {
                    kind: OUTBOX_KIND,
                    key: &key,
                    value: &value,
                },
            ],
            now,
        )
        .await?;
    Ok(())
}

/// What one pass over the outbox did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drained {
    pub delivered: usize,
    pub retried: usize,
    pub failed: usize,
}

/// Delivers the entries that are due, each by one worker at a time.
pub async fn drain(client: &Client, config: &Config, now: i64) -> Result<Drained, EngineError> {
    let records = client.records();
    let mut drained = Drained::default();
    for (key, value) in records.list(OUTBOX_KIND).await? {
        let mut entry: Entry = match serde_json::from_str(&value) {
            Ok(entry) => entry,
            Err(e) => {
                // Never deleted unread: kept as failed, with why.
                tracing::error!(key, error = %e, "an outbox entry cannot be read; it is kept as failed");
                records.put(FAILED_KIND, &key, &value, now).await?;
                records.delete(OUTBOX_KIND, &key).await?;
                drained.failed += 1;
                continue;
            }
        };
        if entry.next_at_ms > now || !claim(client, &key, now).await? {
            continue;
        }
        let Some(hook) = config
            .notifications
            .webhooks
            .iter()
            .find(|h| h.name == entry.webhook)
        else {
            // The webhook was removed from the configuration: nothing to send it to.
            records.delete(OUTBOX_KIND, &key).await?;
            records.delete(CLAIM_KIND, &key).await?;
            continue;
        };
        match deliver(hook, config, &entry, &key).await {
            Ok(()) => {
                records.delete(OUTBOX_KIND, &key).await?;
                drained.delivered += 1;
            }
            Err(reason) => {
                entry.attempts += 1;
                entry.last_error = Some(reason.clone());
                let value = serde_json::to_string(&entry).expect("an entry serializes");
                if entry.attempts >= config.notifications.max_attempts {
                    tracing::error!(webhook = %hook.name, key, attempts = entry.attempts, error = %reason, "a notification could not be delivered; it is kept as failed");
                    records.put(FAILED_KIND, &key, &value, now).await?;
                    records.delete(OUTBOX_KIND, &key).await?;
                    drained.failed += 1;
                } else {
                    let wait = backoff(config.notifications.retry_after, entry.attempts);
                    entry.next_at_ms = now + millis(wait);
                    let value = serde_json::to_string(&entry).expect("an entry serializes");
                    tracing::warn!(webhook = %hook.name, key, attempts = entry.attempts, retry_in = ?wait, error = %reason, "a notification was not delivered; it is tried again");
                    records.put(OUTBOX_KIND, &key, &value, now).await?;
                    drained.retried += 1;
                }
            }
        }
        records.delete(CLAIM_KIND, &key).await?;
    }
    Ok(drained)
}

/// Takes `key` for this worker's delivery; `false` when another worker has it. A claim
/// left by a worker that stopped mid-delivery is taken over once stale.
async fn claim(client: &Client, key: &str, now: i64) -> Result<bool, EngineError> {
    let records = client.records();
    if records
        .insert(CLAIM_KIND, key, &now.to_string(), now)
        .await?
    {
        return Ok(true);
    }
    let since: i64 = records
        .get(CLAIM_KIND, key)
        .await?
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if now - since > millis(CLAIM_STALE) {
        records.delete(CLAIM_KIND, key).await?;
        return Ok(records
            .insert(CLAIM_KIND, key, &now.to_string(), now)
            .await?);
    }
    Ok(false)
}

/// Drops the keys of events recorded more than a week ago.
pub async fn forget_recorded_keys(client: &Client, now: i64) -> Result<(), EngineError> {
    let records = client.records();
    for (key, until) in records.list(RECORDED_KIND).await? {
        if until.parse::<i64>().is_ok_and(|until| until < now) {
            records.delete(RECORDED_KIND, &key).await?;
        }
    }
    Ok(())
}

/// `retry_after` doubled for each failed try after the first, at most an hour.
fn backoff(retry_after: Duration, attempts: u32) -> Duration {
    let doubled = retry_after.saturating_mul(1u32 << attempts.saturating_sub(1).min(20));
    doubled.min(MAX_BACKOFF)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The body a webhook receives for `entry`.
pub fn body(hook: &Webhook, entry: &Entry) -> serde_json::Value {
    let d = &entry.deploy;
    match hook.format {
        WebhookFormat::Json => serde_json::json!({
            "event": entry.event.as_str(),
            "at": chrono::DateTime::from_timestamp_millis(entry.at_ms)
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
            "deploy": {
                "id": d.deploy_id,
                "application": d.application,
                "environment": d.environment,
                "version": d.version,
                "submitted_by": d.submitted_by,
                "error": d.error,
            },
        }),
        WebhookFormat::Slack => {
            let what = match entry.event {
                NotificationEvent::ApprovalRequired => "waits for approval",
                NotificationEvent::Started => "started",
                NotificationEvent::Succeeded => "succeeded",
                NotificationEvent::Failed => "failed",
                NotificationEvent::Cancelled => "was cancelled",
                NotificationEvent::RolledBack => "failed and was rolled back",
                NotificationEvent::AnalysisFailed => "failed its analysis",
                NotificationEvent::WaitingDecision => "waits for a decision on its analysis",
                NotificationEvent::DriftDetected => "drifted from its recorded release",
            };
            // Every value comes from a deployer (a version, an error a command printed):
            // escaped, so that `<!channel>` or `<https://evil|click>` is shown as text,
            // never a mention or a link (docs/configuration.md, `notifications`).
            let mut text = format!(
                "{} {} to {}: deploy {} {what} (by {})",
                slack_escape(&d.application),
                slack_escape(&d.version),
                slack_escape(&d.environment),
                slack_escape(&d.deploy_id),
                slack_escape(&d.submitted_by)
            );
            if let Some(error) = &d.error {
                text.push_str(&format!(": {}", slack_escape(error)));
            }
            serde_json::json!({ "text": text })
        }
    }
}

/// `text` with Slack's control characters escaped (`&`, `<`, `>`), shown as written.
fn slack_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `sha256=<hex>`: the HMAC-SHA256 of `body` under `secret`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// `t=<timestamp>,sha256=<hex>`: the HMAC-SHA256 of `<timestamp>.<body>` under `secret`,
/// the header a receiver checks to refuse a replayed delivery (docs/configuration.md,
/// `notifications`).
pub fn timestamped_signature(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let mut signed = format!("{timestamp}.").into_bytes();
    signed.extend_from_slice(body);
    let signature = signature(secret, &signed);
    format!("t={timestamp},{signature}")
}

/// Where a webhook is, for logs and errors: its scheme, host and port only. The path and
/// the query of a webhook's URL are often its secret (a Slack incoming webhook's are).
fn shown_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(parsed) => {
            let host = parsed.host_str().unwrap_or("?");
            match parsed.port() {
                Some(port) => format!("{}://{host}:{port}", parsed.scheme()),
                None => format!("{}://{host}", parsed.scheme()),
            }
        }
        Err(_) => "(an unreadable URL)".to_string(),
    }
}

/// One POST of `entry` to `hook`; the reason it failed, if it did.
async fn deliver(hook: &Webhook, config: &Config, entry: &Entry, key: &str) -> Result<(), String> {
    let body = serde_json::to_vec(&body(hook, entry)).expect("a body serializes");
    let mut request = reqwest::Client::builder()
        .timeout(DELIVERY_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())?
        .post(&hook.url)
        .header("content-type", "application/json")
        .header("x-manent-event", entry.event.as_str())
        .header("x-manent-delivery", key);
    if let Some(secret) = hook.secret(config) {
        let secret = read_secret(&secret).await?;
        let timestamp = now_ms() / 1000;
        request = request
            .header("x-manent-signature", signature(secret.as_bytes(), &body))
            .header("x-manent-timestamp", timestamp)
            .header(
                "x-manent-signature-256-timestamped",
                timestamped_signature(secret.as_bytes(), timestamp, &body),
            );
    }
    let response = request.body(body).send().await.map_err(|e| {
        // Without the URL, whose path may be the webhook's secret: the log names the
        // webhook and its host.
        let e = e.without_url();
        let mut text = format!("POST to {} failed: {e}", shown_url(&hook.url));
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            text.push_str(&format!(": {c}"));
            cause = c.source();
        }
        text
    })?;
    let status = response.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("{} answered {status}", shown_url(&hook.url)))
    }
}

async fn read_secret(secret: &manent_config::SecretRef) -> Result<String, String> {
    crate::run::secrets::read_secret_ref(secret)
        .await
        .map_err(|reason| format!("cannot read the webhook's secret ({secret}): {reason}"))
}

/// Delivers the outbox every second on this worker, for as long as the process runs.
pub fn spawn_sender(client: Client, config: std::sync::Arc<Config>) {
    if config.notifications.webhooks.is_empty() {
        return;
    }
    // Every second, idle or not: on the store's background connection.
    tokio::spawn(manent_engine::store::background(async move {
        let mut last_forget: Option<tokio::time::Instant> = None;
        loop {
            if let Err(e) = drain(&client, &config, now_ms()).await {
                tracing::warn!(error = %e, "cannot deliver notifications now; trying again");
            }
            // The recorded keys are many (a week of events): looked at every ten minutes.
            if last_forget.is_none_or(|t| t.elapsed() >= FORGET_EVERY) {
                last_forget = Some(tokio::time::Instant::now());
                if let Err(e) = forget_recorded_keys(&client, now_ms()).await {
                    tracing::warn!(error = %e, "cannot drop old notification keys now");
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_the_hmac_sha256_of_the_body_in_hex() {
        // RFC 4231, test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            "HMAC-SHA256 of RFC 4231 test case 2"
        );
    }

    #[test]
    fn the_timestamped_signature_signs_the_timestamp_a_dot_and_the_body() {
        assert_eq!(
            timestamped_signature(b"Jefe", 1_700_000_000, b"{}"),
            format!("t=1700000000,{}", signature(b"Jefe", b"1700000000.{}")),
            "the timestamp is in the signed text, so a replay under a new time fails"
        );
        assert_ne!(
            timestamped_signature(b"Jefe", 1_700_000_001, b"{}"),
            timestamped_signature(b"Jefe", 1_700_000_000, b"{}")
                .replace("t=1700000000", "t=1700000001"),
            "a changed timestamp does not carry the old signature"
        );
    }

    #[test]
    fn a_slack_message_shows_deployer_text_as_text_never_a_mention_or_a_link() {
        let hook: Webhook = serde_json::from_str(
            r#"{"name": "chat", "url": "https://hooks.slack.com/services/T/B/s", "format": "slack"}"#,
        )
        .expect("a webhook");
        let entry = Entry {
            webhook: "chat".into(),
            event: NotificationEvent::Failed,
            deploy: Facts {
                deploy_id: "d-1".into(),
                application: "web/shop".into(),
                environment: "prod".into(),
                version: "<!channel>".into(),
                submitted_by: "ci & co".into(),
                error: Some("see <https://evil.example|click>".into()),
            },
            at_ms: 0,
            attempts: 0,
            next_at_ms: 0,
            last_error: None,
        };
        assert_eq!(
            body(&hook, &entry)["text"],
            "web/shop &lt;!channel&gt; to prod: deploy d-1 failed (by ci &amp; co): see \
             &lt;https://evil.example|click&gt;",
            "&, < and > of every deployer-provided value are escaped"
        );
    }

    #[test]
    fn a_webhook_is_shown_by_its_host_never_its_path_or_query() {
        for (url, shown) in [
            (
                "https://hooks.slack.com/services/T0/B0/XXXXsecret",
                "https://hooks.slack.com",
            ),
            (
                "http://10.0.0.5:8080/hook?token=abc",
                "http://10.0.0.5:8080",
            ),
        ] {
            assert_eq!(
                shown_url(url),
                shown,
                "{url} is shown without its secret part"
            );
        }
    }

    #[test]
    fn retries_wait_twice_as_long_each_time_up_to_an_hour() {
        let five = Duration::from_secs(5);
        assert_eq!(
            backoff(five, 1),
            five,
            "the first retry waits the base delay"
        );
        assert_eq!(
            backoff(five, 2),
            Duration::from_secs(10),
            "the second retry waits twice as long"
        );
        assert_eq!(
            backoff(five, 4),
            Duration::from_secs(40),
            "the fourth retry waits eight times as long"
        );
        assert_eq!(backoff(five, 30), MAX_BACKOFF, "never more than an hour");
    }
}
