//! The PostgreSQL session of a process that listens: LISTEN for other processes' wake-ups
//! and, once an engine takes its executor id, that id's session advisory lock and the
//! renewals of its lease, all on one connection held for the process's life; everything
//! else goes through the pools (docs/scaling-and-recovery.md, "Connections"). The renewals
//! travel here, not through the connection the background loops share, so a recovery or a
//! claim kept waiting there never delays them.
//!
//! A lost connection (the server restarted, the backend was terminated, a statement failed)
//! is replaced by a new one, which listens again and takes the executor locks again: the
//! server released them with the old one, or releases them a moment later (a lock it has
//! not let go of yet is tried again until it is free). Nothing reconnects behind the
//! session's back: sqlx's listener is told not to (`eager_reconnect(false)`) and is dropped
//! at its first failure, so a connection that answers always holds the locks the session
//! says it holds. What was missed meanwhile is caught by the fallback poll.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool};
use tokio::{
    sync::{broadcast, mpsc, oneshot},
    task::JoinHandle,
    time::{Instant, MissedTickBehavior},
};

use super::{
    Liveness, Wakeup,
    postgres::{self, CHANNEL, LOCK_NAMESPACE_EXECUTOR, RENEW_LEASE},
};
use crate::error::StoreError;

/// How often the session tries again to take an executor lock it lost with a connection
/// and could not take on the new one yet (the old backend had not let it go yet).
const RETAKE_INTERVAL: Duration = Duration::from_millis(250);

/// How long after a lost connection an executor lock may stay out of reach before the
/// session says so (it keeps trying): a terminated backend lets go of its locks at once.
const RETAKE_WARNING: Duration = Duration::from_secs(5);

/// How long the session waits before opening a connection again after it failed to.
const REOPEN_INTERVAL: Duration = Duration::from_millis(500);

/// See the module documentation.
pub(crate) struct Session {
    commands: mpsc::UnboundedSender<Command>,
    task: JoinHandle<()>,
}

enum Command {
    Lock {
        executor_id: String,
        reply: oneshot::Sender<Result<bool, sqlx::Error>>,
    },
    Unlock {
        executor_id: String,
    },
    Renew {
        executor_id: String,
        holder: String,
        now_ms: i64,
        expires_at_ms: i64,
        reply: oneshot::Sender<Result<u64, sqlx::Error>>,
    },
}

impl Session {
    /// Opens the session's connection, listens, and forwards notifications to `bus` until dropped.
    pub(crate) async fn start(
        options: &PgConnectOptions,
        bus: broadcast::Sender<Wakeup>,
    ) -> Result<Self, sqlx::Error> {
        // A pool of one only to open the connection (again): the listener keeps it checked
        // out, and one it lets go of is closed, never handed out again with our locks.
        let pool =
            postgres::pool_options(options, 1, None, Some(postgres::SESSION_STATEMENT_TIMEOUT))
                .acquire_timeout(postgres::ONE_CONNECTION_ACQUIRE_TIMEOUT)
                .max_lifetime(None)
                .after_release(|_conn, _meta| Box::pin(async { Ok(false) }))
                .connect_lazy_with(options.clone());
        let listener = open_listener(&pool).await?;
        let (commands, queued) = mpsc::unbounded_channel();
        let task = tokio::spawn(session_loop(pool, listener, queued, bus));
        Ok(Self { commands, task })
    }

    /// The executor id's session advisory lock, held until the returned proof is dropped.
    pub(crate) async fn lock(&self, executor_id: &str) -> Result<Liveness, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Lock {
            executor_id: executor_id.to_string(),
            reply,
        })?;
        if answer.await.map_err(|_| session_gone())?? {
            Ok(Liveness::Acquired(Box::new(SessionLock {
                executor_id: executor_id.to_string(),
                commands: self.commands.clone(),
            })))
        } else {
            Ok(Liveness::HeldElsewhere)
        }
    }

    /// Extends `holder`'s lease of `executor_id`; returns how many leases were extended (0 or 1).
    /// A renewal whose caller stopped waiting (it timed out) is not sent at all.
    pub(crate) async fn renew(
        &self,
        executor_id: &str,
        holder: &str,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<u64, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Renew {
            executor_id: executor_id.to_string(),
            holder: holder.to_string(),
            now_ms,
            expires_at_ms,
            reply,
        })?;
        Ok(answer.await.map_err(|_| session_gone())??)
    }

    fn send(&self, command: Command) -> Result<(), StoreError> {
        self.commands.send(command).map_err(|_| session_gone())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn session_gone() -> StoreError {
    StoreError::Database("the PostgreSQL session task has ended (a bug)".into())
}

/// An executor id's lock held by the session; dropped, the session releases it.
struct SessionLock {
    executor_id: String,
    commands: mpsc::UnboundedSender<Command>,
}

impl Drop for SessionLock {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Unlock {
            executor_id: std::mem::take(&mut self.executor_id),
        });
    }
}

/// The executor locks of the session: those it promised (a proof is out for each) and
/// those its current connection holds. They differ only after a lost connection, until
/// the new one takes them again.
#[derive(Default)]
struct Locks {
    promised: Vec<String>,
    held: Vec<String>,
    /// Since when a promised lock is not held, and whether that was said.
    missing_since: Option<(Instant, bool)>,
}

impl Locks {
    fn all_held(&self) -> bool {
        self.promised.iter().all(|id| self.held.contains(id))
    }

    /// Takes the promised locks the connection does not hold; `Err` if a statement failed.
    async fn take_missing(&mut self, listener: &mut PgListener) -> Result<(), sqlx::Error> {
        let missing: Vec<String> = self
            .promised
            .iter()
            .filter(|id| !self.held.contains(id))
            .cloned()
            .collect();
        for executor_id in missing {
            if try_lock(listener, &executor_id).await? {
                self.held.push(executor_id);
            }
        }
        if self.all_held() {
            if self.missing_since.take().is_some_and(|(_, said)| said) {
                tracing::info!("the executor locks are held again");
            }
        } else {
            let (since, said) = self.missing_since.get_or_insert((Instant::now(), false));
            if !*said && since.elapsed() >= RETAKE_WARNING {
                *said = true;
                tracing::warn!(
                    missing = ?self.promised.iter().filter(|id| !self.held.contains(id)).collect::<Vec<_>>(),
                    "an executor id's lock is held by another session since this one's connection was lost; trying again (the lease still proves this process holds the id)"
                );
            }
        }
        Ok(())
    }
}

/// Serves the session's commands and forwards its notifications until aborted; see the
/// module documentation for lost connections.
async fn session_loop(
    pool: PgPool,
    listener: PgListener,
    mut commands: mpsc::UnboundedReceiver<Command>,
    bus: broadcast::Sender<Wakeup>,
) {
    let mut locks = Locks::default();
    // `None` once the connection was lost, until a new one listens and holds the locks.
    let mut current = Some(listener);
    let mut retake = tokio::time::interval(RETAKE_INTERVAL);
    retake.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let Some(listener) = current.as_mut() else {
            match open_listener(&pool).await {
                Ok(mut fresh) => {
                    locks.held.clear();
                    match locks.take_missing(&mut fresh).await {
                        Ok(()) => {
                            tracing::info!(
                                all_locks_held = locks.all_held(),
                                "the session's connection is open again: listening"
                            );
                            current = Some(fresh);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot take the executor locks on the session's new connection; opening another");
                            tokio::time::sleep(REOPEN_INTERVAL).await;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot open the session's connection again yet; retrying");
                    tokio::time::sleep(REOPEN_INTERVAL).await;
                }
            }
            continue;
        };
        let all_held = locks.all_held();
        let lost = tokio::select! {
            biased;
            command = commands.recv() => match command {
                Some(command) => serve(listener, command, &mut locks).await.err().is_some_and(replaced),
                None => return,
            },
            // Cancel-safe: a notification arriving while a command runs is buffered and
            // returned by the next call.
            received = listener.try_recv() => match received {
                Ok(Some(notification)) => {
                    if let Some(wakeup) = postgres::decode(notification.payload()) {
                        let _ = bus.send(wakeup);
                    }
                    false
                }
                Ok(None) => {
                    tracing::warn!("the session's connection was lost (LISTEN, executor lock); opening a new one");
                    true
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the session's connection failed (LISTEN, executor lock); opening a new one");
                    true
                }
            },
            _ = retake.tick(), if !all_held => {
                locks.take_missing(listener).await.map_err(|e| e.to_string()).err().is_some_and(replaced)
            }
        };
        if lost {
            // Gone before the new one is asked for: the pool holds one connection, and
            // closes the one it gets back.
            current = None;
        }
    }
}

/// Says why the session's connection is replaced (a statement of it failed); `true`.
fn replaced(error: String) -> bool {
    tracing::warn!(%error, "a statement on the session's connection failed; opening a new one");
    true
}

/// A listener on a new connection that never connects again by itself: the session does,
/// and takes its locks again when it does.
async fn open_listener(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.eager_reconnect(false);
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// Runs one command; `Err` if its statement failed (the connection is then replaced). The
/// caller of a lock or a renewal hears the error itself.
async fn serve(
    listener: &mut PgListener,
    command: Command,
    locks: &mut Locks,
) -> Result<(), String> {
    match command {
        Command::Lock { executor_id, reply } => {
            // Locks are counted per session: a second engine of this process asking for an
            // id this session holds must hear "held", as it would from another process.
            let taken = if locks.promised.contains(&executor_id) {
                Ok(false)
            } else {
                try_lock(listener, &executor_id).await
            };
            let failed = taken.as_ref().err().map(ToString::to_string);
            let acquired = matches!(taken, Ok(true));
            if acquired {
                locks.promised.push(executor_id.clone());
                locks.held.push(executor_id.clone());
            }
            if reply.send(taken).is_err() && acquired {
                // Nobody waits for the proof any more (the caller was dropped): let go.
                return Box::pin(serve(listener, Command::Unlock { executor_id }, locks)).await;
            }
            failed.map_or(Ok(()), Err)
        }
        Command::Unlock { executor_id } => {
            locks.promised.retain(|id| *id != executor_id);
            if let Some(at) = locks.held.iter().position(|id| *id == executor_id) {
                locks.held.swap_remove(at);
                // A lost connection released it anyway.
                sqlx::query("SELECT pg_advisory_unlock($1, hashtext($2))")
                    .bind(LOCK_NAMESPACE_EXECUTOR)
                    .bind(&executor_id)
                    .execute(&mut *listener)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        }
        Command::Renew {
            executor_id,
            holder,
            now_ms,
            expires_at_ms,
            reply,
        } => {
            if reply.is_closed() {
                // Its caller gave up (the session was opening a new connection meanwhile):
                // a later renewal carries the lease further than this one would.
                return Ok(());
            }
            let renewed = sqlx::query(RENEW_LEASE)
                .bind(&executor_id)
                .bind(&holder)
                .bind(now_ms)
                .bind(expires_at_ms)
                .execute(&mut *listener)
                .await
                .map(|r| r.rows_affected());
            let failed = renewed.as_ref().err().map(ToString::to_string);
            let _ = reply.send(renewed);
            failed.map_or(Ok(()), Err)
        }
    }
}

async fn try_lock(listener: &mut PgListener, executor_id: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_try_advisory_lock($1, hashtext($2))")
        .bind(LOCK_NAMESPACE_EXECUTOR)
        .bind(executor_id)
        .fetch_one(listener)
        .await
}

#[cfg(test)]
mod tests {
    use std::{
        str::FromStr,
        sync::{
            Arc,
            atomic::{AtomicU64, Ordering},
        },
    };

    use manent_testkit::{Db, TestDb};

    use super::*;

    const WAIT: Duration = Duration::from_secs(30);
    const APP: &str = "session-under-test";

    async fn start(test: &TestDb) -> (Session, broadcast::Sender<Wakeup>, PgPool) {
        manent_testkit::init_tracing();
        let options = PgConnectOptions::from_str(&test.url)
            .expect("the test URL")
            .application_name(APP);
        let bus = broadcast::channel(64).0;
        let session = Session::start(&options, bus.clone())
            .await
            .expect("start the session");
        let observer = PgPool::connect(&test.url)
            .await
            .expect("connect an observer");
        (session, bus, observer)
    }

    /// The pid of the session's connection holding an advisory lock, if any.
    async fn lock_holder(observer: &PgPool) -> Option<i32> {
        sqlx::query_scalar(
            "SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = $1 \
             AND a.datname = current_database()",
        )
        .bind(APP)
        .fetch_optional(observer)
        .await
        .expect("read pg_locks")
    }

    /// The pids of the session's connections the server has.
    async fn session_pids(observer: &PgPool) -> Vec<i32> {
        sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 \
             AND datname = current_database()",
        )
        .bind(APP)
        .fetch_all(observer)
        .await
        .expect("read pg_stat_activity")
    }

    async fn terminate(observer: &PgPool, pid: i32) {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(observer)
            .await
            .expect("cut the session's connection");
    }

    /// Waits until the session's one connection, not `old`, holds the lock: the one it
    /// listens and renews on.
    async fn held_on_a_new_connection(observer: &PgPool, old: i32, what: &str) -> i32 {
        manent_testkit::eventually(what, WAIT, || async {
            let pids = session_pids(observer).await;
            let holder = lock_holder(observer).await?;
            (holder != old && pids == [holder]).then_some(holder)
        })
        .await
    }

    async fn heard_again(bus: &broadcast::Sender<Wakeup>, observer: &PgPool, what: &str) {
        let heard = tokio::sync::Mutex::new(bus.subscribe());
        manent_testkit::eventually(what, WAIT, || async {
            sqlx::query("SELECT pg_notify($1, 'q:probe')")
                .bind(CHANNEL)
                .execute(observer)
                .await
                .expect("notify");
            let mut probe = None;
            let mut heard = heard.lock().await;
            while let Ok(wakeup) = heard.try_recv() {
                probe = probe.or((wakeup == Wakeup::Queue("probe".into())).then_some(()));
            }
            probe
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_whose_connection_is_cut_listens_and_holds_its_executor_lock_again() {
        let test = TestDb::new(Db::Postgres).await;
        let (session, bus, observer) = start(&test).await;
        let proof = session.lock("x").await.expect("ask for the lock");
        assert!(
            matches!(proof, Liveness::Acquired(_)),
            "a free lock is taken: {proof:?}"
        );
        let again = session.lock("x").await.expect("ask for the lock again");
        assert!(
            matches!(again, Liveness::HeldElsewhere),
            "an id this session holds is held for anyone else in the process: {again:?}"
        );
        let first = lock_holder(&observer)
            .await
            .expect("the session holds the lock");
        terminate(&observer, first).await;
        held_on_a_new_connection(
            &observer,
            first,
            "the lock is held again, on a new connection",
        )
        .await;
        heard_again(&bus, &observer, "wake-ups are heard again").await;
        drop(proof);
        manent_testkit::eventually("the dropped proof releases the lock", WAIT, || async {
            lock_holder(&observer).await.is_none().then_some(())
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_cut_before_its_first_command_takes_the_lock_on_its_new_connection() {
        let test = TestDb::new(Db::Postgres).await;
        let (session, bus, observer) = start(&test).await;
        let [first] = session_pids(&observer).await[..] else {
            panic!("the session opens one connection");
        };
        terminate(&observer, first).await;
        let proof = session.lock("x").await;
        // Asked while the cut may not have been seen yet: the lock is taken on the old
        // connection (and taken again on the new one), or the failure is a transient one.
        match proof {
            Ok(Liveness::Acquired(_)) => {}
            Err(ref e) if e.is_transient() => {
                let retried = session.lock("x").await.expect("ask again");
                assert!(
                    matches!(retried, Liveness::Acquired(_)),
                    "asked again on the new connection, the lock is taken: {retried:?}"
                );
                std::mem::forget(retried);
            }
            other => panic!("the lock is taken or the failure is transient: {other:?}"),
        }
        held_on_a_new_connection(&observer, first, "the lock is held on the new connection").await;
        heard_again(&bus, &observer, "wake-ups are heard on the new connection").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_cut_again_and_again_while_it_renews_holds_its_lock_listens_and_renews_on_each_new_connection()
     {
        let test = TestDb::new(Db::Postgres).await;
        sqlx::query(
            "CREATE TABLE manent_executor_leases (executor_id TEXT PRIMARY KEY, holder TEXT, \
             renewed_at BIGINT, expires_at BIGINT)",
        )
        .execute(&PgPool::connect(&test.url).await.expect("connect"))
        .await
        .expect("create the lease table");
        let (session, bus, observer) = start(&test).await;
        sqlx::query("INSERT INTO manent_executor_leases VALUES ('x', 'h', 0, 0)")
            .execute(&observer)
            .await
            .expect("a lease to renew");
        let session = Arc::new(session);
        let proof = session.lock("x").await.expect("ask for the lock");
        assert!(matches!(proof, Liveness::Acquired(_)), "the lock is taken");
        // Renewals one after the other, as fast as they are answered, each given up after a
        // while as the engine does: the cuts below land in the middle of one.
        let renewed = Arc::new(AtomicU64::new(0));
        let renewer = tokio::spawn({
            let (session, renewed) = (session.clone(), renewed.clone());
            async move {
                for n in 1.. {
                    let renewal =
                        tokio::time::timeout(Duration::from_secs(2), session.renew("x", "h", n, n));
                    if let Ok(Ok(1)) = renewal.await {
                        renewed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        });
        let mut holder = lock_holder(&observer)
            .await
            .expect("the session holds the lock");
        for cut in 1..=10 {
            let before = renewed.load(Ordering::SeqCst);
            terminate(&observer, holder).await;
            holder = held_on_a_new_connection(
                &observer,
                holder,
                &format!("after cut {cut}, the lock is held on the session's new connection"),
            )
            .await;
            manent_testkit::eventually(
                &format!("after cut {cut}, renewals are answered again"),
                WAIT,
                || async { (renewed.load(Ordering::SeqCst) > before + 1).then_some(()) },
            )
            .await;
            heard_again(
                &bus,
                &observer,
                &format!("after cut {cut}, wake-ups are heard"),
            )
            .await;
        }
        renewer.abort();
        drop(proof);
    }
}
