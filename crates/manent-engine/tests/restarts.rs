//! A store's PostgreSQL connections through restarts of the server, on a private cluster
//! of the test's own (the shared one on 5432 must never be restarted): the session (the
//! executor's lock, its lease's renewals, LISTEN) and the one connection the background
//! loops share come back after each restart, whatever they were doing when it came
//! (docs/scaling-and-recovery.md, "Connections"). Needs root, as `faults.rs` does.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use manent_engine::{
    ExecutorState, now_ms,
    store::{self, ExecutorLease, LeaseGrant, Liveness, Renewal, Store, Wakeup},
};
use manent_testkit::{PgCluster, StopMode, eventually};
use sqlx::PgPool;

/// Generous bounds for waits on the server; never reached when things work.
const WAIT: Duration = Duration::from_secs(60);
const ROUNDS: u64 = 8;

/// How many calls of a kind were answered: a counter a load task bumps.
#[derive(Clone, Default)]
struct Answered(Arc<AtomicU64>);

impl Answered {
    fn count(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
    fn one(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Renews `x`'s lease one renewal after the other, each given up after a while as the
/// engine does.
fn renew_forever(store: Arc<dyn Store>, answered: Answered) {
    tokio::spawn(async move {
        loop {
            let now = now_ms();
            let renewal = tokio::time::timeout(
                Duration::from_secs(2),
                store.renew_executor_lease("x", "h", now, now + 2000),
            );
            if let Ok(Ok(Renewal::Renewed)) = renewal.await {
                answered.one();
            }
            // Paces the load; nothing waits for it.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

/// Three loops on the background connection, as a worker's claims, heartbeat and recovery.
fn background_forever(store: &Arc<dyn Store>, answered: &Answered) {
    for _ in 0..3 {
        let (store, answered) = (store.clone(), answered.clone());
        tokio::spawn(store::background(async move {
            loop {
                let beat = tokio::time::timeout(
                    Duration::from_secs(1),
                    store.heartbeat("x", ExecutorState::Running, now_ms()),
                );
                if let Ok(Ok(())) = beat.await {
                    answered.one();
                }
                if store
                    .recover_stale(now_ms() - 2000, "x", now_ms())
                    .await
                    .is_ok()
                {
                    answered.one();
                }
                // Paces the load; nothing waits for it.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
}

async fn a_wakeup_is_heard(store: &Arc<dyn Store>, observer: &PgPool, what: &str) {
    let heard = tokio::sync::Mutex::new(store.subscribe());
    eventually(what, WAIT, || async {
        sqlx::query("SELECT pg_notify('manent_wakeup', 'q:probe')")
            .execute(observer)
            .await
            .ok()?;
        let mut heard = heard.lock().await;
        let mut probe = None;
        while let Ok(wakeup) = heard.try_recv() {
            probe = probe.or((wakeup == Wakeup::Queue("probe".into())).then_some(()));
        }
        probe
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_and_the_background_connection_come_back_after_every_restart_of_postgresql() {
    manent_testkit::init_tracing();
    let cluster = PgCluster::start();
    let url = cluster.create_database("restarts").await;
    let store = store::open(&url).await.expect("open the test database");
    let proof = store.acquire_liveness("x").await.expect("ask for the lock");
    assert!(
        matches!(proof, Liveness::Acquired(_)),
        "the executor's lock is free"
    );
    let now = now_ms();
    let lease = ExecutorLease {
        executor_id: "x".into(),
        holder: "h".into(),
        host: "here".into(),
        pid: i64::from(std::process::id()),
        acquired_at_ms: now,
        renewed_at_ms: now,
        expires_at_ms: now + 2000,
    };
    assert!(
        matches!(
            store.acquire_executor_lease(&lease, false).await,
            Ok(LeaseGrant::Granted)
        ),
        "the lease is free"
    );
    let (renewals, background) = (Answered::default(), Answered::default());
    renew_forever(store.clone(), renewals.clone());
    background_forever(&store, &background);

    for round in 1..=ROUNDS {
        // Fast: every connection is told and closed; immediate: the server dies at once.
        if round % 2 == 0 {
            cluster.restart(StopMode::Fast);
        } else {
            cluster.stop(StopMode::Immediate);
            cluster.start_again();
        }
        let (renewed, worked) = (renewals.count(), background.count());
        eventually(
            &format!("round {round}: the lease is renewed again"),
            WAIT,
            || async { (renewals.count() > renewed + 1).then_some(()) },
        )
        .await;
        eventually(
            &format!("round {round}: the background loops are answered again"),
            WAIT,
            || async { (background.count() > worked + 1).then_some(()) },
        )
        .await;
        let observer = PgPool::connect(&url).await.expect("connect an observer");
        eventually(
            &format!("round {round}: the executor's lock is held again"),
            WAIT,
            || async {
                let held: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted",
                )
                .fetch_one(&observer)
                .await
                .ok()?;
                (held == 1).then_some(())
            },
        )
        .await;
        a_wakeup_is_heard(
            &store,
            &observer,
            &format!("round {round}: wake-ups are heard again"),
        )
        .await;
        observer.close().await;
    }
    drop(proof);
}
