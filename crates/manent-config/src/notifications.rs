//! `notifications` of `manent.yml`: the webhooks told of deploys' events, which events and
//! applications each wants, and where its signing secret is read.

use std::{path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use crate::{Config, SecretRef, pattern, serde_util};

/// `notifications` (docs/configuration.md, `notifications`): webhooks told of deploys'
/// events, delivered by the workers as durable work, with retries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NotificationsConfig {
    /// Where events are sent.
    pub webhooks: Vec<Webhook>,
    /// Deliveries of one event to one webhook tried at most this many times; then it is
    /// kept as failed (a log line, `/metrics`).
    pub max_attempts: u32,
    /// The wait after a failed delivery, doubled after each (at most an hour).
    #[serde(with = "serde_util::duration")]
    pub retry_after: Duration,
}

impl Default for NotificationsConfig {
    fn default() -> Self {
        NotificationsConfig {
            webhooks: Vec::new(),
            max_attempts: 10,
            retry_after: Duration::from_secs(5),
        }
    }
}

/// One webhook of `notifications.webhooks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Webhook {
    /// Unique: names the webhook in logs and metrics.
    pub name: String,
    /// `https://…` (or `http://…`) that receives a POST per event.
    pub url: String,
    /// `json` (manent's own body, signed when a secret is set) or `slack` (an incoming
    /// webhook's `{"text": …}`).
    #[serde(default)]
    pub format: WebhookFormat,
    /// The HMAC-SHA256 key of `X-Manent-Signature`, read from this file when sending.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// The same, from this environment variable of the worker.
    #[serde(default)]
    pub secret_env: Option<String>,
    /// The events sent; all of them when empty.
    #[serde(default)]
    pub events: Vec<NotificationEvent>,
    /// Application patterns (`shop/*`) whose deploys are sent; all when empty.
    #[serde(default)]
    pub applications: Vec<String>,
}

/// `notifications.webhooks[].format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WebhookFormat {
    #[default]
    Json,
    Slack,
}

/// What happened to a deploy, as a webhook is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotificationEvent {
    ApprovalRequired,
    Started,
    Succeeded,
    Failed,
    Cancelled,
    RolledBack,
    /// A metric of `rollout.analysis` failed more measurements than its `failure_limit`.
    AnalysisFailed,
    /// An analysis could not be taken often enough: the deploy waits for `manent promote`
    /// or `manent abort`.
    WaitingDecision,
    /// A drift check found a difference it had not reported before (docs/plan-and-drift.md).
    DriftDetected,
}

impl NotificationEvent {
    /// The event as written in `events:` and sent.
    pub fn as_str(self) -> &'static str {
        match self {
            NotificationEvent::ApprovalRequired => "approval_required",
            NotificationEvent::Started => "started",
            NotificationEvent::Succeeded => "succeeded",
            NotificationEvent::Failed => "failed",
            NotificationEvent::Cancelled => "cancelled",
            NotificationEvent::RolledBack => "rolled_back",
            NotificationEvent::AnalysisFailed => "analysis_failed",
            NotificationEvent::WaitingDecision => "waiting_decision",
            NotificationEvent::DriftDetected => "drift_detected",
        }
    }
}

impl Webhook {
    /// Whether this webhook is told of `event` on `application`.
    pub fn wants(&self, event: NotificationEvent, application: &str) -> bool {
        (self.events.is_empty() || self.events.contains(&event))
            && (self.applications.is_empty()
                || self
                    .applications
                    .iter()
                    .any(|p| pattern::glob_match(p, application)))
    }

    /// Where its secret is read, its file resolved against `manent.yml`'s directory.
    pub fn secret(&self, config: &Config) -> Option<SecretRef> {
        match (&self.secret_file, &self.secret_env) {
            (Some(file), _) => Some(SecretRef::File(config.resolve_path(file))),
            (None, Some(name)) => Some(SecretRef::Env(name.clone())),
            (None, None) => None,
        }
    }
}
