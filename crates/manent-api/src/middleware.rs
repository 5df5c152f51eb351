//! The `/api/v1` middleware: the bearer token, the audit entry of every refusal and change,
//! a request that runs to its end once started, and a handler's panic answered 500.

use std::{any::Any, net::SocketAddr, panic::AssertUnwindSafe, sync::Arc, time::Instant};

use axum::{
    extract::{ConnectInfo, MatchedPath, Request, State},
    http::{Method, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use futures::FutureExt;

use manent_engine::Records;

use crate::{
    AppError, AppState, audit, auth, refusals,
    throttle::{self, Verdict},
};

/// Every `/api/v1` route needs a known, unexpired bearer token (the scheme in any case:
/// `bearer x` works). Refusals and changes are recorded in the audit trail (`audit`).
pub(crate) async fn require_token(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let template = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| path.clone(), |p| p.as_str().to_string());
    let records = state.client.records();
    let source = throttle::Source::of(
        request.extensions().get::<ConnectInfo<SocketAddr>>(),
        request.headers(),
        state.throttle.trusts_forwarded_for(),
    );
    let caller = match bearer_secret(&request) {
        Some(secret) => match auth::authenticate(&records, secret).await {
            Ok(caller) => caller,
            Err(e) => return AppError::from(e).into_response(),
        },
        None => None,
    };
    // From here on the request runs to its end and is audited even if its client goes
    // away: hyper drops a request's future when the connection closes, which would stop
    // a handler between two of its writes, or lose the audit entry of a change or a
    // refusal that already happened (a prober closing at once would leave no trace).
    to_completion(format!("{method} {path}"), async move {
        let Some(caller) = caller else {
            let throttle = &state.throttle;
            return unauthenticated(throttle, &records, source, &method, &template, &path).await;
        };
        request.extensions_mut().insert(caller.clone());
        // A handler that panics answers 500 with the error body, and the request is audited
        // like any other: a bug is an answer the client and the trail both see.
        let response = match AssertUnwindSafe(next.run(request)).catch_unwind().await {
            Ok(response) => response,
            Err(panic) => handler_panicked(&format!("{method} {path}"), panic.as_ref()),
        };
        if response.status() == axum::http::StatusCode::FORBIDDEN {
            // A token hammering routes it may not use is recorded once per window, then
            // summed up (docs/security.md, "Audit trail"); every 403 is still answered.
            let throttle = &state.throttle;
            throttle.start_sweeper(&records);
            let action = audit::action_of(&method, &template);
            let token = &caller.token;
            let (record, ended) =
                throttle.forbidden(&token.id, &token.name, &action, Instant::now());
            throttle::write(&records, ended).await;
            if !record {
                let reason = "forbidden (summed up in the audit trail)";
                refusals::note(403, &caller.token.name, method.as_str(), &path, reason);
                return response;
            }
        }
        audit::after_response(&records, Some(caller), &method, &template, &path, response).await
    })
    .await
}

/// The answer to a request without a valid token: 401, recorded in the audit trail as the
/// first of its source's window, then counted; 429 once the source has failed too often
/// (docs/security.md, "Failed authentications"). Only requests without a valid token reach
/// here: a valid token is never throttled.
async fn unauthenticated(
    throttle: &Arc<throttle::AuthThrottle>,
    records: &Records,
    source: throttle::Source,
    method: &Method,
    template: &str,
    path: &str,
) -> Response {
    let refused = || AppError::Unauthorized.into_response();
    if !throttle.is_on() {
        return audit::after_response(records, None, method, template, path, refused()).await;
    }
    throttle.start_sweeper(records);
    let (verdict, ended) = throttle.failure(source, Instant::now());
    throttle::write(records, ended).await;
    let reason = AppError::Unauthorized.to_string();
    match verdict {
        Verdict::Record => {
            audit::after_response(records, None, method, template, path, refused()).await
        }
        Verdict::Count => {
            refusals::note(401, "-", method.as_str(), path, &reason);
            refused()
        }
        Verdict::Tripped(entry) => {
            refusals::note(401, "-", method.as_str(), path, &reason);
            throttle::write(records, vec![entry]).await;
            refused()
        }
        Verdict::Throttle { retry_after } => {
            let error = AppError::TooManyFailures {
                client: source.to_string(),
                // Whole seconds, rounded up: a client that waits that long is admitted.
                retry_after_secs: retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0),
            };
            refusals::note(429, "-", method.as_str(), path, &error.to_string());
            error.into_response()
        }
    }
}

/// The 500 of a handler that panicked while serving `request` (its method and path),
/// logged with the panic's message.
pub(crate) fn handler_panicked(request: &str, panic: &(dyn Any + Send)) -> Response {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into());
    tracing::error!(%request, panic = %message, "a request handler panicked; answered 500");
    AppError::Internal(format!(
        "the server failed while handling {request} (a bug, logged on the server): it may or may not have been applied"
    ))
    .into_response()
}

/// Runs `request` (a handler and its audit entry) on a task of its own and returns its
/// response. Dropping the returned future (the client went away) does not stop it: a
/// change either does not start or runs to its end with its entry written. A panic that
/// escapes it (the audit's own) and a runtime shutting down answer 500.
pub(crate) async fn to_completion<F>(what: String, request: F) -> Response
where
    F: Future<Output = Response> + Send + 'static,
{
    match tokio::spawn(request).await {
        Ok(response) => response,
        Err(e) if e.is_panic() => handler_panicked(&what, e.into_panic().as_ref()),
        Err(_) => AppError::Internal(
            "the server shut down while the request ran: it may or may not have been applied"
                .into(),
        )
        .into_response(),
    }
}

/// The secret of an `Authorization: Bearer <secret>` header; the scheme is
/// case-insensitive (RFC 9110 §11.1).
pub(crate) fn bearer_secret(request: &Request) -> Option<&str> {
    let value = request
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, secret) = value.trim().split_once(' ')?;
    let secret = secret.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !secret.is_empty()).then_some(secret)
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use axum::{
        Router,
        body::Body,
        http::{Request as HttpRequest, StatusCode},
        middleware,
    };
    use manent_config::Config;
    use manent_contract::ErrorBody;
    use manent_engine::{Client, Connections, Database, now_ms};
    use manent_testkit::{Db, TestDb};
    use tokio::sync::Notify;
    use tower::ServiceExt;

    use super::*;
    use crate::Role;

    const WAIT: Duration = Duration::from_secs(60);

    /// A state over a fresh SQLite database, and an admin token's secret.
    async fn admin_state() -> (TestDb, Database, AppState, String) {
        let db = TestDb::new(Db::Sqlite).await;
        let database = Database::open(&db.url, &Connections::default())
            .await
            .expect("open the test database");
        let config = Config::from_yaml_str(
            &format!(
                "database: {{url: {}}}\n",
                serde_json::to_string(&db.url).unwrap()
            ),
            "manent.yml",
            std::iter::empty(),
        )
        .expect("a valid configuration");
        let state = AppState::new(Client::new(database.clone()), Arc::new(config));
        let token = auth::create_token(&state.client.records(), "ops", Role::Admin, None)
            .await
            .expect("create a token");
        (db, database, state, token)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handler_that_panics_answers_500_with_the_error_body_and_is_audited() {
        let (_db, database, state, token) = admin_state().await;
        let router = Router::new()
            .fallback(|| async {
                if true {
                    panic!("a bug in a handler");
                }
                "never"
            })
            .layer(middleware::from_fn_with_state(state, require_token));
        let request = HttpRequest::post("/changes")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap();
        let response = router.oneshot(request).await.expect("the router answers");
        assert_eq!(
            response.status(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "a panic is a 500, not a dropped connection"
        );
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("read the body");
        let body: ErrorBody = serde_json::from_slice(&body).expect("the body is the error body");
        assert!(
            body.error.message.contains("POST /changes"),
            "the error names the request: {:?}",
            body.error
        );
        let audited = audit::list(
            &Client::new(database.clone()).records(),
            &manent_engine::AuditFilter::newest(10),
        )
        .await
        .expect("read the audit trail");
        assert!(
            audited.iter().any(|e| e.actor == "ops" && e.outcome == 500),
            "the failed request is in the audit trail with its 500: {audited:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_change_whose_client_goes_away_mid_request_still_completes_and_is_audited() {
        let (_db, database, state, token) = admin_state().await;
        // A change in two halves with the client's departure between them: the handler
        // says it started, then waits for the test before it writes.
        let (started, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let handler_records = Client::new(database.clone()).records();
        let (s, g) = (started.clone(), gate.clone());
        // The handler answers every path (a fallback, not a route of the API).
        let router = Router::new()
            .fallback(move || async move {
                s.notify_one();
                g.notified().await;
                handler_records
                    .put("probe", "change", "done", now_ms())
                    .await
                    .expect("the change's write");
                "done"
            })
            .layer(middleware::from_fn_with_state(state, require_token));
        let request = HttpRequest::post("/changes")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap();
        let call = tokio::spawn(router.oneshot(request));
        started.notified().await;
        // What hyper does when the connection closes: the request's future is dropped.
        call.abort();
        assert!(
            call.await.is_err_and(|e| e.is_cancelled()),
            "the request's own future is gone"
        );
        gate.notify_one();
        let entry = manent_testkit::eventually("the change's audit entry", WAIT, || async {
            audit::list(
                &Client::new(database.clone()).records(),
                &manent_engine::AuditFilter::newest(10),
            )
            .await
            .expect("read the audit trail")
            .into_iter()
            .find(|e| e.action == "change.create")
        })
        .await;
        assert_eq!(
            (entry.actor.as_str(), entry.outcome),
            ("ops", 200),
            "the entry names who made the change and that it succeeded"
        );
        assert_eq!(
            Client::new(database.clone())
                .records()
                .get("probe", "change")
                .await
                .expect("read the probe")
                .as_deref(),
            Some("done"),
            "the change ran to its end although nobody waited for it"
        );
    }
}
