//! Notifications (docs/configuration.md, `notifications`): what happened to a deploy
//! (approval required, started, succeeded, failed, cancelled, rolled back, …) is told to
//! the webhooks that want it. Each event for each webhook is one durable workflow
//! `manent.notify` on the engine's queue `manent.notifications`, which every worker serves:
//! the engine's claims, leases, recovery and durable sleeps deliver it, several at once,
//! at most [`PER_WEBHOOK`] at a time to one webhook, so a webhook that is slow or down
//! delays only its own deliveries, and never a deploy. Nothing here ever fails a deploy: an
//! event that cannot be recorded is a log line.
//!
//! At least once: a delivery's workflow id names its deploy, event and webhook, so a deploy
//! replayed after a crash records none twice while the delivery's workflow is kept
//! (retention removes it with the deploys of its age); a try cut off before its answer is
//! sent again.
//!
//! - `delivery`: the workflow (one step per try, a durable wait between tries), the queue,
//!   one POST.
//! - `outbox`: the outbox an older manent wrote, moved onto the queue at a worker's start.

pub mod delivery;
pub mod outbox;

use hmac::{Hmac, Mac};
use manent_config::{Config, NotificationEvent, Webhook, WebhookFormat};
use manent_engine::{Client, EngineError, EnqueueRequest, now_ms};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

pub use delivery::{NOTIFY_QUEUE, NOTIFY_WORKFLOW, PER_WEBHOOK, register};

/// The outbox of an older manent (key: `<deploy>/<event>/<webhook>`): moved onto the queue
/// by [`outbox::adopt`], read by `/metrics` until then.
pub const OUTBOX_KIND: &str = "notification";
/// Entries whose deliveries all failed, kept for inspection (`/metrics`, logs).
pub const FAILED_KIND: &str = "notification-failed";

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

/// One delivery: the event, for one webhook, and how it went (the input of its workflow,
/// the value of a failed one's record and of an older manent's outbox entry).
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

impl Entry {
    /// `<deploy>/<event>/<webhook>`: the same for every try (`X-Manent-Delivery`).
    pub fn key(&self) -> String {
        format!(
            "{}/{}/{}",
            self.deploy.deploy_id,
            self.event.as_str(),
            self.webhook
        )
    }
}

/// The workflow id of the delivery whose key is `key`.
pub fn delivery_id(key: &str) -> String {
    format!("notify:{key}")
}

/// Records `event` of `deploy` for every webhook that wants it. Never fails: a delivery
/// that cannot be recorded is logged (the deploy goes on).
pub async fn record(client: &Client, config: &Config, event: NotificationEvent, deploy: &Facts) {
    for hook in &config.notifications.webhooks {
        if !hook.wants(event, &deploy.application) {
            continue;
        }
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
        if let Err(e) = enqueue(client, &entry).await {
            tracing::warn!(webhook = %hook.name, event = event.as_str(), deploy = %deploy.deploy_id, error = %e, "cannot record a notification; it will not be sent");
        }
    }
}

/// Puts the delivery of `entry` on the notifications queue, unless it is there already
/// (the same id: a replayed deploy, a second worker adopting the same outbox entry).
pub(crate) async fn enqueue(client: &Client, entry: &Entry) -> Result<(), EngineError> {
    let request = EnqueueRequest::new(NOTIFY_WORKFLOW, NOTIFY_QUEUE, entry)
        .id(delivery_id(&entry.key()))
        .partition(entry.webhook.clone());
    client.enqueue(request).await?;
    Ok(())
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
    match url::Url::parse(url) {
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
}
