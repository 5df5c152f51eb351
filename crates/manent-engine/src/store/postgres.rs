//! What only PostgreSQL does: LISTEN/NOTIFY wake-ups and the session advisory
//! lock that proves an executor is alive.

use std::{str::FromStr, sync::Mutex, time::Duration};

use sqlx::{
    Connection,
    postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions},
};
use tokio::{sync::broadcast, task::JoinHandle};

use super::{Liveness, Wakeup};
use crate::error::StoreError;

/// The notification channel every store listens on.
pub(crate) const CHANNEL: &str = "manent_wakeup";
/// Notifications carry wake-ups; this poll only catches what a lost
/// connection made us miss.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(1000);
/// First key of the two-key advisory locks, so ours never collide with an application's.
pub(crate) const LOCK_NAMESPACE_EXECUTOR: i32 = 0x4d4e_0001;
pub(crate) const LOCK_NAMESPACE_QUEUE: i32 = 0x4d4e_0002;
pub(crate) const LOCK_MIGRATIONS: i64 = 0x4d4e_0000_0003;

/// How long a session of ours may sit inside a transaction waiting for us
/// before the server ends it. Our transactions never wait on anything but the
/// database between their statements, so a session idle in one belongs to a
/// process that is cut off or frozen; the server keeps such a session, and
/// every lock it holds (a claim's queue lock, rows a recovery must update),
/// until TCP tells it the client is gone, which takes hours: every other
/// worker would wait that long. Ended, its transaction rolls back (a claim
/// never half-done) and the process, if alive, meets a lost connection:
/// a transient error it retries. A URL that sets it in `options` wins.
pub(crate) const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) async fn connect(url: &str) -> Result<(PgPool, PgConnectOptions), sqlx::Error> {
    let options = PgConnectOptions::from_str(url)?.application_name("manent");
    let set_timeout = !options
        .get_options()
        .is_some_and(|o| o.contains("idle_in_transaction_session_timeout"));
    let pool = PgPoolOptions::new()
        .max_connections(24)
        .acquire_timeout(Duration::from_secs(30))
        .after_connect(move |conn, _meta| {
            Box::pin(async move {
                if set_timeout {
                    sqlx::query(&format!(
                        "SET idle_in_transaction_session_timeout = {}",
                        IDLE_IN_TRANSACTION_TIMEOUT.as_millis()
                    ))
                    .execute(conn)
                    .await?;
                }
                Ok(())
            })
        })
        .connect_with(options.clone())
        .await?;
    Ok((pool, options))
}

/// Wake-up payloads: `q:<queue>` or `w:<workflow id>`.
pub(crate) fn encode(wakeup: &Wakeup) -> String {
    match wakeup {
        Wakeup::Queue(q) => format!("q:{q}"),
        Wakeup::Workflow(w) => format!("w:{w}"),
    }
}

fn decode(payload: &str) -> Option<Wakeup> {
    let (kind, rest) = payload.split_once(':')?;
    match kind {
        "q" => Some(Wakeup::Queue(rest.to_string())),
        "w" => Some(Wakeup::Workflow(rest.to_string())),
        _ => None,
    }
}

/// Forwards notifications to the in-process bus until aborted. A dropped
/// connection is re-established by the listener; what was missed meanwhile
/// is caught by the fallback poll.
pub(crate) async fn spawn_listener(
    pool: &PgPool,
    bus: broadcast::Sender<Wakeup>,
) -> Result<JoinHandle<()>, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(tokio::spawn(async move {
        loop {
            match listener.recv().await {
                Ok(notification) => {
                    if let Some(wakeup) = decode(notification.payload()) {
                        let _ = bus.send(wakeup);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "notification listener lost its connection; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }))
}

/// A session advisory lock on the executor id, on a connection of its own
/// held for the executor's life: the server releases it when the process dies.
pub(crate) async fn acquire_liveness(
    options: &PgConnectOptions,
    executor_id: &str,
) -> Result<Liveness, StoreError> {
    let mut conn = PgConnection::connect_with(options)
        .await
        .map_err(super::sql::map_err)?;
    let acquired: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, hashtext($2))")
        .bind(LOCK_NAMESPACE_EXECUTOR)
        .bind(executor_id)
        .fetch_one(&mut conn)
        .await
        .map_err(super::sql::map_err)?;
    if acquired {
        Ok(Liveness::Acquired(Box::new(Mutex::new(conn))))
    } else {
        let _ = conn.close().await;
        Ok(Liveness::HeldElsewhere)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakeup_payloads_round_trip() {
        for w in [
            Wakeup::Queue("deploys".into()),
            Wakeup::Workflow("a:b".into()),
        ] {
            assert_eq!(
                decode(&encode(&w)),
                Some(w.clone()),
                "payload of {w:?} must decode to itself"
            );
        }
        assert_eq!(
            decode("x:1"),
            None,
            "an unknown kind is ignored, not misread"
        );
    }
}
