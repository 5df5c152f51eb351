//! Many workers on one PostgreSQL: thirty worker processes and an API on a private server
//! with PostgreSQL's default `max_connections` (100) start, run a burst of deploys to
//! SUCCESS, never hold more than their pools allow, and once idle hold at most two
//! connections each (docs/scaling-and-recovery.md, "Connections").

mod common;

use std::collections::BTreeMap;

use common::{Site, WAIT};
use manent_testkit::{Db, PgCluster, StopMode, eventually};
use sqlx::{Connection, PgConnection};

const WORKERS: usize = 30;
const DEPLOYS: usize = 60;
/// PostgreSQL's default.
const SERVER_MAX: i64 = 100;
/// `database.max_connections` of each worker and of the API in this test: with a worker's
/// session and background connection, 30 x (1 + 2) + (4 + 1) = 95 fit in 100.
const WORKER_POOL: u32 = 1;
const API_POOL: u32 = 4;

/// The connections of the site's database by `application_name` (`manent worker w7`).
async fn connections_by_process(observer: &mut PgConnection) -> BTreeMap<String, i64> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT application_name, count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid() GROUP BY 1",
    )
    .fetch_all(&mut *observer)
    .await
    .expect("read pg_stat_activity");
    rows.into_iter().collect()
}

/// The most connections a process may hold: its pool, plus the session and the background
/// connection of a worker, plus the session of the API.
fn allowed(process: &str) -> i64 {
    if process.starts_with("manent worker ") {
        i64::from(WORKER_POOL) + 2
    } else if process == "manent api" {
        i64::from(API_POOL) + 1
    } else {
        0
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_workers_and_an_api_fit_the_default_max_connections_and_hold_two_each_once_idle() {
    let cluster = PgCluster::start();
    let mut admin = PgConnection::connect(&cluster.admin_url())
        .await
        .expect("connect to the private cluster");
    sqlx::query(&format!("ALTER SYSTEM SET max_connections = {SERVER_MAX}"))
        .execute(&mut admin)
        .await
        .expect("set max_connections");
    drop(admin);
    cluster.restart(StopMode::Fast);
    let url = cluster.create_database("manent_connections").await;

    // The site's files, its processes on the private cluster's database.
    let mut site = Site::new(Db::Sqlite, &[]).await;
    site.db.url = url.clone();
    site.set_config("");
    for i in 0..DEPLOYS {
        site.write_environment(
            &format!("acme/app{i}"),
            "prod",
            "targets: [{name: t1, host: local}]\ndeploy: {plugin: command, commands: [\"true\"]}\n",
        );
    }
    let token = site.token();
    let pool = |n: u32| n.to_string();
    let (worker_pool, api_pool) = (pool(WORKER_POOL), pool(API_POOL));
    // The defaults of a real installation, not the test site's fast heartbeat: thirty
    // debug builds on two cores must not fence themselves.
    let common_env = [
        ("MANENT__DATABASE__IDLE_TIMEOUT", "2s"),
        ("MANENT__RECOVERY__STALE_AFTER", "30s"),
        ("MANENT__RECOVERY__HEARTBEAT_INTERVAL", "5s"),
    ];
    let api_env: Vec<(&str, &str)> = common_env
        .into_iter()
        .chain([("MANENT__DATABASE__MAX_CONNECTIONS", api_pool.as_str())])
        .collect();
    let worker_env: Vec<(&str, &str)> = common_env
        .into_iter()
        .chain([("MANENT__DATABASE__MAX_CONNECTIONS", worker_pool.as_str())])
        .collect();
    site.start_with("api", "api", &api_env);
    for w in 0..WORKERS {
        site.start_with("worker", &format!("w{w}"), &worker_env);
    }
    site.wait_api().await;

    let observer = tokio::sync::Mutex::new(
        PgConnection::connect(&url)
            .await
            .expect("connect the observer"),
    );
    eventually("every worker has started", WAIT, || async {
        let started: Option<i64> =
            sqlx::query_scalar("SELECT count(*) FROM manent_executor_leases")
                .fetch_one(&mut *observer.lock().await)
                .await
                .ok();
        (started == Some(WORKERS as i64)).then_some(())
    })
    .await;
    let observer = observer.into_inner();

    let ids: Vec<String> = (0..DEPLOYS)
        .map(|i| site.submit(&token, &format!("acme/app{i}")).0)
        .collect();
    // Watched until every deploy is done: the most each process and all of them held.
    struct Watch {
        observer: PgConnection,
        peak_total: i64,
        peak_of: BTreeMap<String, i64>,
        done: i64,
    }
    let watch = tokio::sync::Mutex::new(Watch {
        observer,
        peak_total: 0,
        peak_of: BTreeMap::new(),
        done: 0,
    });
    eventually("every deploy reaches SUCCESS", WAIT, || async {
        let mut watch = watch.lock().await;
        let now = connections_by_process(&mut watch.observer).await;
        watch.peak_total = watch.peak_total.max(now.values().sum());
        for (process, count) in now {
            let peak = watch.peak_of.entry(process).or_default();
            *peak = (*peak).max(count);
        }
        let done: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM manent_workflows WHERE id = ANY($1) AND status = 'SUCCESS'",
        )
        .bind(&ids)
        .fetch_one(&mut watch.observer)
        .await
        .expect("count the finished deploys");
        if done != watch.done {
            eprintln!("{done} of {DEPLOYS} deploys succeeded");
            watch.done = done;
        }
        (done == DEPLOYS as i64).then_some(())
    })
    .await;
    let Watch {
        observer,
        peak_total,
        peak_of,
        ..
    } = watch.into_inner();

    eprintln!("peak connections: {peak_total} in all; by process: {peak_of:?}");
    assert!(
        peak_total < SERVER_MAX,
        "the processes held {peak_total} connections at once, not under max_connections \
         ({SERVER_MAX}) with room for the observer"
    );
    for (process, peak) in &peak_of {
        assert!(
            *peak <= allowed(process),
            "{process} held {peak} connections at once; its pool and session allow {}",
            allowed(process)
        );
    }
    for (i, child) in site.children.0.iter_mut().enumerate() {
        assert!(
            child.try_wait().expect("look at a process").is_none(),
            "process {i} (0 is the API, then w0, w1…) exited during the burst; see its log in {}",
            site.dir.display()
        );
    }

    // Idle: each worker keeps its session and its background connection, the API its
    // session; what the pools opened for the burst is closed after `idle_timeout`.
    let observer = tokio::sync::Mutex::new(observer);
    let settled = eventually(
        "every process holds at most 2 connections",
        WAIT,
        || async {
            let now = connections_by_process(&mut *observer.lock().await).await;
            (now.len() == WORKERS + 1 && now.values().all(|n| *n <= 2)).then_some(now)
        },
    )
    .await;
    let total: i64 = settled.values().sum();
    eprintln!("idle: {total} connections in all; by process: {settled:?}");
    assert_eq!(
        settled.get("manent api"),
        Some(&1),
        "an idle API holds only its session (LISTEN): {settled:?}"
    );
}
