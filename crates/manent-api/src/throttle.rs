//! Failed authentications throttled per source, and summed up in the audit trail
//! (docs/security.md, "Failed authentications"): a source that fails `failures` times
//! within a window is answered 429 until the window ends; a valid token is never throttled
//! (the middleware asks this module only about requests without one). A valid token's
//! 403s on one action are not throttled but recorded once per window and summed up
//! (docs/security.md, "Audit trail").
//!
//! Per API process, in memory, bounded: at most `max_sources` windows are kept, the oldest
//! closed to make room. A window writes at most three audit entries: its first failure,
//! the moment it trips (with the count so far), and at its end what was not recorded one
//! by one (`auth.failures`, with the counts).

use std::{
    collections::HashMap,
    fmt,
    net::{IpAddr, Ipv6Addr, SocketAddr},
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{extract::ConnectInfo, http::HeaderMap};
use manent_config::AuthThrottleConfig;
use manent_engine::{AuditRecord, Records, now_ms};

/// The action of the entry that sums up a window.
pub const SUMMARY_ACTION: &str = "auth.failures";

/// Where failed authentications come from: an IPv4 address, or an IPv6 /64 (one host
/// usually holds a whole /64, so counting single addresses would not slow it down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source(Option<IpAddr>);

impl Source {
    /// The source of a request: its peer address, or with `trust_forwarded_for` the last
    /// address of `X-Forwarded-For` (the one the proxy in front of the API appended; the
    /// ones before it are the client's to write). Without either, `unknown`: one source
    /// for every such request (an API embedded without a socket).
    pub fn of(
        peer: Option<&ConnectInfo<SocketAddr>>,
        headers: &HeaderMap,
        trust_forwarded_for: bool,
    ) -> Self {
        let forwarded = trust_forwarded_for
            .then(|| {
                headers
                    .get_all("x-forwarded-for")
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .flat_map(|v| v.split(','))
                    .next_back()
                    .and_then(|last| last.trim().parse::<IpAddr>().ok())
            })
            .flatten();
        Source::from_ip(forwarded.or(peer.map(|ConnectInfo(addr)| addr.ip())))
    }

    /// The source of a connection from `ip`: IPv4 by address, IPv6 by /64; `unknown`
    /// without an address.
    pub fn from_ip(ip: Option<IpAddr>) -> Self {
        Source(ip.map(|ip| match ip {
            IpAddr::V4(_) => ip,
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => {
                    let mask = !0u128 << 64;
                    IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
                }
            },
        }))
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => f.write_str("unknown"),
            Some(IpAddr::V4(v4)) => write!(f, "{v4}"),
            Some(IpAddr::V6(v6)) => write!(f, "{v6}/64"),
        }
    }
}

/// What to do with a request that carried no valid token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Answer 401 and record it in the audit trail (a window's first failure).
    Record,
    /// Answer 401; counted, recorded in the window's summary.
    Count,
    /// The window just tripped: answer 401 and record this entry (the count so far).
    Tripped(AuditRecord),
    /// Answer 429, retry after this long; counted, recorded in the window's summary.
    Throttle { retry_after: Duration },
}

/// One source's window.
#[derive(Debug)]
struct Window {
    started: Instant,
    started_ms: i64,
    /// Failures answered 401 (the first included).
    failures: u64,
    /// Requests answered 429.
    throttled: u64,
}

/// The action of the entry that sums up a token's 403s in a window.
pub const FORBIDDEN_SUMMARY_ACTION: &str = "auth.forbidden";

/// One token's window of 403s on one action: the first is recorded on its own, the rest
/// summed up.
#[derive(Debug)]
struct ForbiddenWindow {
    started: Instant,
    started_ms: i64,
    token_id: String,
    token_name: String,
    action: String,
    /// Requests answered 403 (the first included).
    refused: u64,
}

/// The throttle of one API process.
pub struct AuthThrottle {
    config: AuthThrottleConfig,
    windows: Mutex<HashMap<Source, Window>>,
    /// 403s by token id and action: a valid token hammering a route it may not use is
    /// answered 403 every time, but recorded once per window and summed up at its end.
    forbidden: Mutex<HashMap<(String, String), ForbiddenWindow>>,
    sweeper: AtomicBool,
}

impl AuthThrottle {
    pub fn new(config: AuthThrottleConfig) -> Self {
        AuthThrottle {
            config,
            windows: Mutex::new(HashMap::new()),
            forbidden: Mutex::new(HashMap::new()),
            sweeper: AtomicBool::new(false),
        }
    }

    /// Whether `api.auth_throttle.trust_forwarded_for` is set.
    pub fn trusts_forwarded_for(&self) -> bool {
        self.config.trust_forwarded_for
    }

    /// Whether throttling is on (`failures` above 0); off, every failure is recorded.
    pub fn is_on(&self) -> bool {
        self.config.failures > 0
    }

    /// Counts a request from `source` without a valid token, at `now`. Returns what to
    /// answer and the summaries of windows that ended (to be written by the caller).
    pub fn failure(&self, source: Source, now: Instant) -> (Verdict, Vec<AuditRecord>) {
        let mut ended = Vec::new();
        let mut windows = self
            .windows
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if windows
            .get(&source)
            .is_some_and(|w| now.duration_since(w.started) >= self.config.window)
            && let Some(old) = windows.remove(&source)
        {
            ended.extend(self.summary(source, &old));
        }
        if !windows.contains_key(&source) && windows.len() >= self.config.max_sources {
            ended.extend(self.make_room(&mut windows, now));
        }
        let window = windows.entry(source).or_insert_with(|| Window {
            started: now,
            started_ms: now_ms(),
            failures: 0,
            throttled: 0,
        });
        let limit = u64::from(self.config.failures);
        let verdict = if window.failures >= limit {
            window.throttled += 1;
            Verdict::Throttle {
                retry_after: self
                    .config
                    .window
                    .saturating_sub(now.duration_since(window.started)),
            }
        } else {
            window.failures += 1;
            if window.failures == limit {
                Verdict::Tripped(self.entry(
                    source,
                    429,
                    format!(
                        "{} failed authentications from {source} within {}: further requests \
                         from it without a valid token are answered 429 until {} (a valid token \
                         is still served)",
                        window.failures,
                        humantime::format_duration(self.config.window),
                        manent_deploy::views::platform::rfc3339(
                            window.started_ms + duration_ms(self.config.window)
                        ),
                    ),
                ))
            } else if window.failures == 1 {
                Verdict::Record
            } else {
                Verdict::Count
            }
        };
        (verdict, ended)
    }

    /// Counts a 403 answered to the token `token_id` (named `token_name`) for `action` at
    /// `now`. Returns whether to record it on its own (the first of its window, or every
    /// one with throttling off) and the summaries of windows that ended.
    pub fn forbidden(
        &self,
        token_id: &str,
        token_name: &str,
        action: &str,
        now: Instant,
    ) -> (bool, Vec<AuditRecord>) {
        let key = (token_id.to_string(), action.to_string());
        if !self.is_on() {
            return (true, Vec::new());
        }
        let mut ended = Vec::new();
        let mut windows = self
            .forbidden
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let expired = |w: &ForbiddenWindow| now.duration_since(w.started) >= self.config.window;
        if windows.get(&key).is_some_and(expired)
            && let Some(old) = windows.remove(&key)
        {
            ended.extend(self.forbidden_summary(&old));
        }
        if !windows.contains_key(&key) && windows.len() >= self.config.max_sources {
            // Bounded as the failures' windows are: the oldest closes to make room.
            if let Some(oldest) = windows
                .iter()
                .min_by_key(|(_, w)| w.started)
                .map(|(key, _)| key.clone())
                && let Some(old) = windows.remove(&oldest)
            {
                ended.extend(self.forbidden_summary(&old));
            }
        }
        let window = windows.entry(key).or_insert_with(|| ForbiddenWindow {
            started: now,
            started_ms: now_ms(),
            token_id: token_id.to_string(),
            token_name: token_name.to_string(),
            action: action.to_string(),
            refused: 0,
        });
        window.refused += 1;
        (window.refused == 1, ended)
    }

    /// The entry of a token's 403s after the first of a window; `None` when there were none.
    fn forbidden_summary(&self, window: &ForbiddenWindow) -> Option<AuditRecord> {
        let more = window.refused.checked_sub(1).filter(|&n| n > 0)?;
        Some(AuditRecord {
            seq: 0,
            at_ms: now_ms(),
            actor: window.token_name.clone(),
            actor_id: window.token_id.clone(),
            action: FORBIDDEN_SUMMARY_ACTION.into(),
            target: window.action.clone(),
            outcome: 403,
            detail: format!(
                "{} requests `{}` by token {} answered 403 in the window from {}: the first \
                 recorded on its own, {more} more summed up here",
                window.refused,
                window.action,
                window.token_name,
                manent_deploy::views::platform::rfc3339(window.started_ms),
            ),
        })
    }

    /// Removes every window ended by `now` and returns their summaries.
    pub fn take_ended(&self, now: Instant) -> Vec<AuditRecord> {
        let mut summaries = self.take_ended_failures(now);
        let mut forbidden = self
            .forbidden
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let ended: Vec<(String, String)> = forbidden
            .iter()
            .filter(|(_, w)| now.duration_since(w.started) >= self.config.window)
            .map(|(key, _)| key.clone())
            .collect();
        for key in ended {
            if let Some(window) = forbidden.remove(&key) {
                summaries.extend(self.forbidden_summary(&window));
            }
        }
        summaries
    }

    fn take_ended_failures(&self, now: Instant) -> Vec<AuditRecord> {
        let mut windows = self
            .windows
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let ended: Vec<Source> = windows
            .iter()
            .filter(|(_, w)| now.duration_since(w.started) >= self.config.window)
            .map(|(source, _)| *source)
            .collect();
        ended
            .into_iter()
            .filter_map(|source| {
                let window = windows.remove(&source)?;
                self.summary(source, &window)
            })
            .collect()
    }

    /// Closes windows to make room for one more: those that ended, else the oldest.
    fn make_room(&self, windows: &mut HashMap<Source, Window>, now: Instant) -> Vec<AuditRecord> {
        let before = windows.len();
        let mut summaries = Vec::new();
        windows.retain(|source, window| {
            let ended = now.duration_since(window.started) >= self.config.window;
            if ended {
                summaries.extend(self.summary(*source, window));
            }
            !ended
        });
        if windows.len() == before
            && let Some(oldest) = windows
                .iter()
                .min_by_key(|(_, w)| w.started)
                .map(|(source, _)| *source)
            && let Some(window) = windows.remove(&oldest)
        {
            summaries.extend(self.summary(oldest, &window));
        }
        summaries
    }

    /// The entry of what a window did that no entry recorded yet: failures after the first
    /// (when it never tripped) and the 429s. `None` when there is nothing to add.
    fn summary(&self, source: Source, window: &Window) -> Option<AuditRecord> {
        let tripped = window.failures >= u64::from(self.config.failures);
        let unrecorded_failures = if tripped { 0 } else { window.failures - 1 };
        if unrecorded_failures == 0 && window.throttled == 0 {
            return None;
        }
        let mut detail = format!(
            "{} failed authentications from {source} in the window from {}",
            window.failures + window.throttled,
            manent_deploy::views::platform::rfc3339(window.started_ms),
        );
        if tripped {
            detail.push_str(&format!(
                ": {} answered 401 (recorded when the window tripped), {} answered 429",
                window.failures, window.throttled
            ));
        } else {
            detail.push_str(&format!(
                ": the first recorded on its own, {unrecorded_failures} more answered 401"
            ));
        }
        let outcome = if window.throttled > 0 { 429 } else { 401 };
        Some(self.entry(source, outcome, detail))
    }

    fn entry(&self, source: Source, outcome: i64, detail: String) -> AuditRecord {
        AuditRecord {
            seq: 0,
            at_ms: now_ms(),
            actor: "-".into(),
            actor_id: String::new(),
            action: SUMMARY_ACTION.into(),
            target: source.to_string(),
            outcome,
            detail,
        }
    }

    /// Starts, once per throttle, the task that writes the summaries of windows that
    /// ended with no later request from their source; it stops with the throttle.
    pub fn start_sweeper(self: &Arc<Self>, records: &Records) {
        if self.sweeper.swap(true, Ordering::AcqRel) {
            return;
        }
        let interval =
            (self.config.window / 4).clamp(Duration::from_secs(1), Duration::from_secs(30));
        tokio::spawn(sweep(Arc::downgrade(self), records.clone(), interval));
    }
}

async fn sweep(throttle: Weak<AuthThrottle>, records: Records, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(throttle) = throttle.upgrade() else {
            return;
        };
        let ended = throttle.take_ended(Instant::now());
        drop(throttle);
        write(&records, ended).await;
    }
}

/// Writes summaries to the audit trail; a failure is logged, as for any entry.
pub async fn write(records: &Records, entries: Vec<AuditRecord>) {
    for entry in entries {
        if let Err(e) = records.append_audit(&entry).await {
            tracing::error!(error = %e, action = %entry.action, target = %entry.target,
                "cannot write the audit trail");
        }
    }
}

fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle(failures: u32, max_sources: usize) -> AuthThrottle {
        AuthThrottle::new(AuthThrottleConfig {
            failures,
            window: Duration::from_secs(60),
            max_sources,
            trust_forwarded_for: false,
        })
    }

    fn source(text: &str) -> Source {
        Source::from_ip(Some(text.parse().unwrap()))
    }

    #[test]
    fn a_source_is_recorded_once_counted_then_tripped_then_throttled_until_its_window_ends() {
        let t = throttle(3, 10);
        let start = Instant::now();
        let s = source("192.0.2.7");
        let verdicts: Vec<String> = (0..5)
            .map(|_| match t.failure(s, start).0 {
                Verdict::Tripped(_) => "tripped".to_string(),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            verdicts,
            [
                "Record",
                "Count",
                "tripped",
                "Throttle { retry_after: 60s }",
                "Throttle { retry_after: 60s }"
            ],
            "the first failure is recorded, the third trips the window, then 429"
        );
        let summaries = t.take_ended(start + Duration::from_secs(60));
        assert_eq!(
            summaries.len(),
            1,
            "one summary for the window: {summaries:?}"
        );
        assert_eq!(
            (
                summaries[0].action.as_str(),
                summaries[0].target.as_str(),
                summaries[0].outcome
            ),
            (SUMMARY_ACTION, "192.0.2.7", 429),
            "the summary names its source and that it was throttled"
        );
        assert!(
            summaries[0].detail.contains("5 failed authentications")
                && summaries[0].detail.contains("2 answered 429"),
            "the summary counts every request of the window: {}",
            summaries[0].detail
        );
        assert_eq!(
            t.failure(s, start + Duration::from_secs(61)).0,
            Verdict::Record,
            "a new window starts afresh"
        );
    }

    #[test]
    fn a_token_answered_403_again_and_again_is_recorded_once_then_summed_up() {
        let t = throttle(3, 10);
        let start = Instant::now();
        let recorded: Vec<bool> = (0..50)
            .map(|_| t.forbidden("id-1", "ci", "deploy.submit", start).0)
            .collect();
        assert_eq!(
            recorded.iter().filter(|r| **r).count(),
            1,
            "only the first 403 of the window is recorded on its own: {recorded:?}"
        );
        assert!(
            t.forbidden("id-2", "other", "deploy.submit", start).0,
            "another token's first 403 is recorded on its own"
        );
        assert!(
            t.forbidden("id-1", "ci", "GET /api/v1/audit", start).0,
            "the same token's first 403 on another action is recorded on its own"
        );
        let summaries = t.take_ended(start + Duration::from_secs(60));
        let ci: Vec<_> = summaries.iter().filter(|e| e.actor == "ci").collect();
        assert!(
            ci.len() == 1
                && ci[0].action == FORBIDDEN_SUMMARY_ACTION
                && ci[0].outcome == 403
                && ci[0].detail.contains("50 requests")
                && ci[0].detail.contains("49 more"),
            "one summary counts the window's 403s, naming the token: {summaries:?}"
        );
        assert!(
            t.forbidden(
                "id-1",
                "ci",
                "deploy.submit",
                start + Duration::from_secs(61)
            )
            .0,
            "a new window records its first 403 again"
        );
        assert!(
            throttle(0, 10).forbidden("id-1", "ci", "x", start).0
                && throttle(0, 10).forbidden("id-1", "ci", "x", start).0,
            "with throttling off every 403 is recorded"
        );
    }

    #[test]
    fn memory_stays_bounded_closing_the_oldest_window_with_its_summary() {
        let t = throttle(5, 2);
        let start = Instant::now();
        t.failure(source("192.0.2.1"), start);
        t.failure(source("192.0.2.1"), start);
        t.failure(source("192.0.2.2"), start + Duration::from_secs(1));
        let (_, ended) = t.failure(source("192.0.2.3"), start + Duration::from_secs(2));
        assert_eq!(
            ended.iter().map(|e| e.target.as_str()).collect::<Vec<_>>(),
            ["192.0.2.1"],
            "the oldest window made room, its unrecorded failure summed up"
        );
        assert_eq!(
            t.windows.lock().unwrap().len(),
            2,
            "no more windows than max_sources"
        );
    }

    #[test]
    fn an_ipv6_source_is_its_64_prefix_and_forwarded_for_is_trusted_only_when_told() {
        assert_eq!(
            source("2001:db8:1:2:aaaa::1"),
            source("2001:db8:1:2:bbbb::9"),
            "one /64, one source"
        );
        assert_eq!(
            source("2001:db8:1:2::1").to_string(),
            "2001:db8:1:2::/64",
            "an IPv6 source is counted by its /64"
        );
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-forwarded-for",
            "203.0.113.9, 198.51.100.4".parse().unwrap(),
        );
        let peer = ConnectInfo(SocketAddr::from(([10, 0, 0, 1], 4000)));
        assert_eq!(
            Source::of(Some(&peer), &headers, false).to_string(),
            "10.0.0.1",
            "by default the peer address, whatever the header says"
        );
        assert_eq!(
            Source::of(Some(&peer), &headers, true).to_string(),
            "198.51.100.4",
            "trusted, the address the proxy appended (the last one)"
        );
    }
}
