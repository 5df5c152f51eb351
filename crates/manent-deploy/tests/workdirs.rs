//! A worker's sweep of its work directory, on both backends: what a killed process, a
//! recovery elsewhere or a hand-back left goes once its deploy has ended or another worker
//! holds it; a deploy queued or pending under this worker keeps its directory, and an entry
//! that names no deploy is left alone. A link a plugin left inside goes, what it points to
//! stays.

use manent_deploy::run::workdirs;
use manent_engine::{
    Client, Database, EnqueueRequest, WorkflowStatus, WorkflowVersions, now_ms,
    store::{self, ClaimLimits},
};
use manent_testkit::{Db, TestDb, on_both_backends};

on_both_backends!(a_sweep_removes_the_directories_of_ended_and_foreign_deploys_and_keeps_the_rest,);

const LIMITS: ClaimLimits = ClaimLimits {
    worker: 10,
    partition: None,
    global: 0,
    group: None,
};

async fn a_sweep_removes_the_directories_of_ended_and_foreign_deploys_and_keeps_the_rest(db: Db) {
    let test = TestDb::new(db).await;
    let store = store::open(&test.url)
        .await
        .expect("open the test database");
    let client = Client::new(Database::from(store.clone()));
    let enqueue = |queue: &'static str| {
        let client = client.clone();
        async move {
            client
                .enqueue(EnqueueRequest::new("manent.deploy", queue, ()))
                .await
                .expect("enqueue")
                .id
        }
    };
    // One deploy per state, each on a queue of its own so a claim takes exactly it.
    let ended = enqueue("ended").await;
    let cancelled = enqueue("cancelled").await;
    let elsewhere = enqueue("elsewhere").await;
    let mine = enqueue("mine").await;
    let queued = enqueue("queued").await;
    let now = now_ms();
    let claim = |queue: &'static str, executor: &'static str| {
        let store = store.clone();
        async move {
            store
                .claim(queue, executor, WorkflowVersions::FIRST, LIMITS, now, 1)
                .await
                .expect("claim")
                .remove(0)
        }
    };
    let lease = claim("ended", "me").await.lease().expect("a lease");
    store
        .finish(&lease, WorkflowStatus::Success, Some("null"), None, now)
        .await
        .expect("finish");
    client.cancel(&cancelled).await.expect("cancel");
    claim("elsewhere", "another-worker").await;
    claim("mine", "me").await;

    let workdir = test.path("work");
    for name in [
        &ended,
        &cancelled,
        &elsewhere,
        &mine,
        &queued,
        &"cache".to_string(),
    ] {
        std::fs::create_dir_all(workdir.join(name).join("sub")).expect("make a directory");
        std::fs::write(workdir.join(name).join("sub/app.tar.gz.part"), b"x").expect("a file");
    }
    // What a plugin may leave in its working directory: links to a file and a directory
    // outside. The sweep removes the links, never what they point to.
    let outside = test.path("outside");
    std::fs::create_dir_all(outside.join("dir")).expect("a directory outside");
    std::fs::write(outside.join("dir/kept"), b"kept").expect("a file in it");
    std::fs::write(outside.join("prod.yml"), b"acme").expect("a file outside");
    let work = workdir.join(&ended).join("work");
    std::fs::create_dir_all(&work).expect("the plugin's working directory");
    std::os::unix::fs::symlink(outside.join("prod.yml"), work.join("prod.yml")).expect("link");
    std::os::unix::fs::symlink(outside.join("dir"), work.join("dir")).expect("link");

    let sweep = workdirs::sweep(&client, &workdir, "me")
        .await
        .expect("sweep");
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    assert_eq!(
        sweep.removed,
        sorted(vec![ended.clone(), cancelled.clone(), elsewhere.clone()]),
        "the directories of ended deploys and of one another worker holds go"
    );
    assert_eq!(
        sweep.kept,
        sorted(vec![mine.clone(), queued.clone()]),
        "a deploy pending here or queued keeps its directory, for its resumption"
    );
    assert_eq!(
        sweep.unknown,
        vec!["cache".to_string()],
        "an entry that names no deploy is reported and left alone"
    );
    for (name, present) in [
        (&ended, false),
        (&cancelled, false),
        (&elsewhere, false),
        (&mine, true),
        (&queued, true),
    ] {
        assert_eq!(
            workdir.join(name).exists(),
            present,
            "{name}'s directory is there: {present}"
        );
    }
    assert_eq!(
        (
            std::fs::read(outside.join("prod.yml")).ok(),
            std::fs::read(outside.join("dir/kept")).ok()
        ),
        (Some(b"acme".to_vec()), Some(b"kept".to_vec())),
        "the files the removed links pointed to are untouched"
    );
}
