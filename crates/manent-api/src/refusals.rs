//! Refused requests (401, 403, 429): counted per API process for `/metrics`, and logged as a
//! warning at most once per window so that a flood of bad tokens cannot flood the log.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// At most one warning per window; the next one says how many were not logged.
const LOG_WINDOW: Duration = Duration::from_secs(10);

static UNAUTHORIZED: AtomicU64 = AtomicU64::new(0);
static FORBIDDEN: AtomicU64 = AtomicU64::new(0);
static THROTTLED: AtomicU64 = AtomicU64::new(0);

struct Window {
    logged_at: Option<Instant>,
    unlogged: u64,
}

static WINDOW: Mutex<Window> = Mutex::new(Window {
    logged_at: None,
    unlogged: 0,
});

/// Counts a refusal and logs it unless one was logged within the window.
pub fn note(status: u16, token: &str, method: &str, path: &str, reason: &str) {
    match status {
        401 => UNAUTHORIZED.fetch_add(1, Ordering::Relaxed),
        429 => THROTTLED.fetch_add(1, Ordering::Relaxed),
        _ => FORBIDDEN.fetch_add(1, Ordering::Relaxed),
    };
    let mut window = WINDOW
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let now = Instant::now();
    if window
        .logged_at
        .is_none_or(|at| now.duration_since(at) >= LOG_WINDOW)
    {
        tracing::warn!(
            status,
            token,
            method,
            path,
            reason,
            unlogged_since_last = window.unlogged,
            "request refused (further refusals within {}s are counted in /metrics, not logged)",
            LOG_WINDOW.as_secs()
        );
        window.logged_at = Some(now);
        window.unlogged = 0;
    } else {
        window.unlogged += 1;
    }
}

/// Registers the refused-request counters: per API process, since it started.
pub fn register_metrics(registry: &mut prometheus_client::registry::Registry) {
    use prometheus_client::metrics::{counter::Counter, family::Family};
    let refused = Family::<Vec<(&'static str, &'static str)>, Counter>::default();
    for (status, count) in [
        ("401", &UNAUTHORIZED),
        ("403", &FORBIDDEN),
        ("429", &THROTTLED),
    ] {
        refused
            .get_or_create(&vec![("status", status)])
            .inc_by(count.load(Ordering::Relaxed));
    }
    registry.register(
        "manent_api_refused_requests",
        "Requests this API process refused since it started (401: no valid token; 403: not \
         allowed; 429: a source throttled after failed authentications).",
        refused,
    );
}
