//! One notification's delivery as the engine's durable work: the workflow `manent.notify`
//! on the queue `manent.notifications` that every worker serves. Each try is a recorded
//! step (`try <n>`, its answer or why it failed), each wait between tries a durable sleep
//! (`retry_after`, doubled after each try, at most an hour), so a worker that stops in the
//! middle leaves the delivery to the engine's recovery, which resumes it where it was;
//! after `max_attempts` tries it is kept as failed (`FAILED_KIND`) and its workflow ends in
//! error. A claim takes a delivery for one worker at a time (the engine's fencing), up to
//! [`PER_WEBHOOK`] deliveries of one webhook at once over all workers: a webhook that never
//! answers holds only those, never another webhook's deliveries.

use std::{sync::Arc, time::Duration};

use manent_config::{Config, Webhook};
use manent_engine::{
    Client, Engine, QueueSpec, StepPolicy, WorkflowContext, WorkflowError, now_ms,
};
use serde::Serialize;

use crate::http::{HttpFetch, HttpRequest};

use super::{Entry, FAILED_KIND, body, shown_url, signature, timestamped_signature};

/// The workflow of one delivery.
pub const NOTIFY_WORKFLOW: &str = "manent.notify";
/// The queue of deliveries (internal: not among `manent queues`).
pub const NOTIFY_QUEUE: &str = "manent.notifications";
/// Deliveries of one webhook running at once, over all workers (the queue's partition is
/// the webhook's name).
pub const PER_WEBHOOK: u32 = 4;
/// Deliveries running at once on one worker: each is one HTTP request or a wait.
const PER_WORKER: u32 = 64;
/// How long one try may take.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest wait between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// The notifications queue as every worker serves it.
pub fn queue_spec() -> QueueSpec {
    QueueSpec::new(NOTIFY_QUEUE)
        .kind("notifications")
        .worker_concurrency(PER_WORKER)
        .partition_concurrency(PER_WEBHOOK)
}

/// What a delivery needs on a worker.
struct Notifier {
    config: Arc<Config>,
    client: Client,
    http: Arc<dyn HttpFetch>,
}

/// How a delivery ended (its workflow's output).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivered {
    Sent,
    /// The webhook is no longer in the configuration: nothing to send it to.
    WebhookRemoved,
}

/// Serves the notifications queue on `engine` and registers the delivery workflow. Every
/// worker does, webhooks configured or not: deliveries recorded under another
/// configuration still end (a removed webhook's at once). `http` sends the POSTs.
pub fn register(engine: &Engine, config: &Config, http: Arc<dyn HttpFetch>) {
    engine.listen(queue_spec());
    let notifier = Arc::new(Notifier {
        config: Arc::new(config.clone()),
        client: engine.client(),
        http,
    });
    engine.register(
        NOTIFY_WORKFLOW,
        move |ctx: WorkflowContext, entry: Entry| {
            let notifier = notifier.clone();
            async move { deliver(&ctx, &notifier, entry).await }
        },
    );
}

/// Tries `entry` until it is delivered or its tries are spent.
async fn deliver(
    ctx: &WorkflowContext,
    notifier: &Notifier,
    entry: Entry,
) -> Result<Delivered, WorkflowError> {
    let key = entry.key();
    let settings = &notifier.config.notifications;
    let Some(hook) = settings.webhooks.iter().find(|h| h.name == entry.webhook) else {
        tracing::info!(webhook = %entry.webhook, key, "a notification's webhook is no longer configured; it is not sent");
        return Ok(Delivered::WebhookRemoved);
    };
    // The tries an older manent's outbox made count (`outbox::adopt`); at least one more.
    let first = entry.attempts.saturating_add(1);
    let last = settings.max_attempts.max(first);
    let mut last_error = entry.last_error.clone();
    for attempt in first..=last {
        let tried: Result<(), String> = ctx
            .step(&format!("try {attempt}"), || async {
                Ok::<_, String>(post(notifier, hook, &entry, &key).await)
            })
            .await?;
        let reason = match tried {
            Ok(()) => return Ok(Delivered::Sent),
            Err(reason) => reason,
        };
        if attempt < last {
            let wait = backoff(settings.retry_after, attempt);
            tracing::warn!(webhook = %hook.name, key, attempts = attempt, retry_in = ?wait, error = %reason, "a notification was not delivered; it is tried again");
            last_error = Some(reason);
            ctx.sleep(wait).await?;
        } else {
            last_error = Some(reason);
        }
    }
    let reason = last_error.unwrap_or_default();
    let failed = Entry {
        attempts: last,
        last_error: Some(reason.clone()),
        ..entry
    };
    let value = serde_json::to_string(&failed)?;
    let records = notifier.client.records();
    ctx.step_with(
        "keep as failed",
        StepPolicy::retry(5, Duration::from_secs(1)),
        || async {
            records
                .put(FAILED_KIND, &key, &value, now_ms())
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await?;
    tracing::error!(webhook = %hook.name, key, attempts = last, error = %reason, "a notification could not be delivered; it is kept as failed");
    Err(WorkflowError::failed(format!(
        "the notification {key} was not delivered after {last} tries: {reason}"
    )))
}

/// `retry_after` doubled for each failed try after the first, at most an hour.
fn backoff(retry_after: Duration, attempts: u32) -> Duration {
    let doubled = retry_after.saturating_mul(1u32 << attempts.saturating_sub(1).min(20));
    doubled.min(MAX_BACKOFF)
}

/// One POST of `entry` to `hook`; the reason it failed, if it did.
async fn post(notifier: &Notifier, hook: &Webhook, entry: &Entry, key: &str) -> Result<(), String> {
    let body = serde_json::to_vec(&body(hook, entry)).expect("a body serializes");
    let mut headers = vec![
        ("content-type", "application/json".to_string()),
        ("x-manent-event", entry.event.as_str().to_string()),
        ("x-manent-delivery", key.to_string()),
    ];
    if let Some(secret) = hook.secret(&notifier.config) {
        let secret = read_secret(&secret).await?;
        let timestamp = now_ms() / 1000;
        headers.extend([
            ("x-manent-signature", signature(secret.as_bytes(), &body)),
            ("x-manent-timestamp", timestamp.to_string()),
            (
                "x-manent-signature-256-timestamped",
                timestamped_signature(secret.as_bytes(), timestamp, &body),
            ),
        ]);
    }
    let request = headers.into_iter().fold(
        HttpRequest::post(&hook.url, body).timeout(DELIVERY_TIMEOUT),
        |request, (name, value)| request.header(name, value),
    );
    // The error never holds the URL, whose path may be the webhook's secret: the log names
    // the webhook and its host.
    let response = notifier
        .http
        .send(request)
        .await
        .map_err(|e| format!("POST to {} failed: {e}", shown_url(&hook.url)))?;
    if response.is_success() {
        Ok(())
    } else {
        Err(format!(
            "{} answered HTTP {}",
            shown_url(&hook.url),
            response.status
        ))
    }
}

async fn read_secret(secret: &manent_config::SecretRef) -> Result<String, String> {
    crate::run::secrets::read_secret_ref(secret)
        .await
        .map_err(|reason| format!("cannot read the webhook's secret ({secret}): {reason}"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
