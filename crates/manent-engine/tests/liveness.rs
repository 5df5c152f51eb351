//! Telling a killed worker at once (docs/scaling-and-recovery.md, "Recovery"): the
//! liveness lock of an executor id is looked at, never kept (its PostgreSQL session's
//! advisory lock in `pg_locks`, its OS file lock beside the SQLite file), and a live lease
//! whose holder's lock is free makes that holder suspect; an expired lease's holder is dead,
//! not suspect. On both backends.

use manent_engine::{
    Client, Database, now_ms,
    store::{self, ExecutorLease, LeaseGrant, Liveness},
};
use manent_testkit::{Db, TestDb, eventually, on_both_backends};

/// A bound for what another task does next; never reached when things work.
const WAIT: std::time::Duration = std::time::Duration::from_secs(30);

on_both_backends!(
    an_executor_lock_is_seen_held_while_its_guard_lives_and_free_once_it_is_dropped,
    a_live_lease_from_another_host_is_suspect_only_once_its_lock_is_free,
);

async fn an_executor_lock_is_seen_held_while_its_guard_lives_and_free_once_it_is_dropped(db: Db) {
    let db = TestDb::new(db).await;
    let store = store::open(&db.url).await.expect("open the test database");
    let never = store.liveness_free("never-seen").await;
    assert_eq!(
        never.ok(),
        Some(Some(true)),
        "an id no process ever took has a free lock"
    );
    let guard = store.acquire_liveness("w1").await.expect("take the lock");
    assert!(
        matches!(guard, Liveness::Acquired(_)),
        "the lock of w1 is taken: {guard:?}"
    );
    let held = store.liveness_free("w1").await;
    assert_eq!(
        held.ok(),
        Some(Some(false)),
        "while its guard lives, w1's lock is held"
    );
    drop(guard);
    // On PostgreSQL the session lets go of it as the next thing it does.
    eventually("w1's lock free once its guard is dropped", WAIT, || async {
        (store.liveness_free("w1").await.ok() == Some(Some(true))).then_some(())
    })
    .await;
}

async fn a_live_lease_from_another_host_is_suspect_only_once_its_lock_is_free(db: Db) {
    let db = TestDb::new(db).await;
    let store = store::open(&db.url).await.expect("open the test database");
    let client = Client::new(Database::from(store.clone()));
    let guard = store.acquire_liveness("far").await.expect("take the lock");
    let now = now_ms();
    let lease = ExecutorLease {
        executor_id: "far".into(),
        holder: "far-holder".into(),
        // Another machine: its pid says nothing here, only the lock does.
        host: "a-host-that-is-not-this-one".into(),
        pid: 1,
        acquired_at_ms: now,
        renewed_at_ms: now,
        expires_at_ms: now + 3_600_000,
    };
    let granted = store.acquire_executor_lease(&lease, false).await;
    assert_eq!(
        granted.ok(),
        Some(LeaseGrant::Granted),
        "the far worker's lease is taken"
    );
    let suspect = client.executor_suspect(&lease).await;
    assert_eq!(
        suspect.ok(),
        Some(false),
        "a live lease whose lock is held is not suspect"
    );
    drop(guard);
    eventually(
        "the far worker suspect once its lock is free",
        WAIT,
        || async { (client.executor_suspect(&lease).await.ok() == Some(true)).then_some(()) },
    )
    .await;
    let expired = ExecutorLease {
        expires_at_ms: now - 1,
        ..lease
    };
    let suspect = client.executor_suspect(&expired).await;
    assert_eq!(
        suspect.ok(),
        Some(false),
        "an expired lease's holder is dead, not suspect"
    );
}
