//! Tests of the shared SQL: query plans on both backends, fencing of grouped writes, upgrades.

use super::claims::CLAIM_RUNNING_SQL;
use super::claims::claim_page_sql;
use super::claims::claim_update_sql;
use super::claims::pg_claim_begin;
use super::migrate::LEGACY_MIGRATIONS_TABLE;
use super::workflows::QUEUE_DEPTHS_SQL;
use super::workflows::json_list;
use super::workflows::list_merged_sql;
use super::workflows::list_sql;
use super::workflows::next_seq;
use super::*;
use crate::store::migrations;

#[test]
fn redact_hides_the_password_only() {
    assert_eq!(
        redact("postgres://u:secret@h/db"),
        "postgres://u:***@h/db",
        "password must not be shown"
    );
    assert_eq!(
        redact("postgres://u@h/db"),
        "postgres://u@h/db",
        "no password, nothing to hide"
    );
    assert_eq!(
        redact("sqlite://x.db"),
        "sqlite://x.db",
        "a SQLite URL has no password to hide"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_page_scans_the_claimable_index_without_sorting_on_sqlite() {
    claim_page_plans_read_the_claimable_index(manent_testkit::Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_step_writes_on_postgresql_fence_each_row_by_its_own_lease() {
    grouped_writes_fence_each_row(manent_testkit::Db::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_step_writes_on_sqlite_fence_each_row_by_its_own_lease() {
    grouped_writes_fence_each_row(manent_testkit::Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_sqlite_leaves_the_writer_synced_for_every_later_write() {
    let test = manent_testkit::TestDb::new(manent_testkit::Db::Sqlite).await;
    let store = SqlStore::connect(&test.url).await.expect("connect");
    store.migrate().await.expect("migrate");
    let now = crate::now_ms();
    store
        .enqueue(&queued("w0".into(), String::new(), now))
        .await
        .expect("enqueue");
    let Pool::Sqlite { write, .. } = &store.pool else {
        unreachable!("a SQLite store")
    };
    let limits = ClaimLimits {
        worker: 1,
        partition: None,
        global: 0,
        group: None,
    };
    let claimed = store
        .claim(
            "q",
            "e",
            crate::store::WorkflowVersions::FIRST,
            limits,
            now,
            1,
        )
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1, "the queued workflow is claimed");
    let level: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(write)
        .await
        .expect("read the writer's level");
    assert_eq!(
        level, 2,
        "after a claim the writer is back at FULL: every checkpoint is synced"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_wal_grown_behind_a_long_read_is_cut_back_after_the_next_checkpoint() {
    let test = manent_testkit::TestDb::new(manent_testkit::Db::Sqlite).await;
    let store = SqlStore::connect(&test.url).await.expect("connect");
    store.migrate().await.expect("migrate");
    let Pool::Sqlite { write, read, .. } = &store.pool else {
        unreachable!("a SQLite store")
    };
    let limit = crate::store::sqlite::WAL_SIZE_LIMIT;
    let wal = format!("{}-wal", test.url.trim_start_matches("sqlite://"));
    let wal_size = || std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0) as i64;
    let write_sql = |sql: &'static str| async move {
        sqlx::query(sql).execute(write).await.expect(sql);
    };
    write_sql("CREATE TABLE scratch (b BLOB)").await;
    // A reader holds its snapshot: no checkpoint can complete, the WAL only grows.
    let mut reader = read.acquire().await.expect("a reader");
    for sql in ["BEGIN", "SELECT count(*) FROM manent_workflows"] {
        sqlx::query(sql).execute(&mut *reader).await.expect(sql);
    }
    for _ in 0..80 {
        write_sql("INSERT INTO scratch VALUES (randomblob(200000))").await;
    }
    let grown = wal_size();
    assert!(
        grown > 2 * limit,
        "the WAL grew past the limit behind the reader ({grown} bytes)"
    );
    sqlx::query("COMMIT")
        .execute(&mut *reader)
        .await
        .expect("end the read");
    drop(reader);
    // The next commit checkpoints (the WAL is past 1,000 pages and nobody reads), the one
    // after starts the log over, and cuts the file back.
    for _ in 0..2 {
        write_sql("DELETE FROM scratch WHERE rowid = (SELECT min(rowid) FROM scratch)").await;
    }
    let after = wal_size();
    assert!(
        after <= limit,
        "the WAL is cut back to journal_size_limit ({limit} bytes) once restarted, not kept at \
         {grown}: {after} bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_sqlite_file_gives_the_pages_retention_empties_back_to_the_file_system() {
    let test = manent_testkit::TestDb::new(manent_testkit::Db::Sqlite).await;
    let store = SqlStore::connect(&test.url).await.expect("connect");
    store.migrate().await.expect("migrate");
    let Pool::Sqlite { write, .. } = &store.pool else {
        unreachable!("a SQLite store")
    };
    let pragma = |name: &'static str| async move {
        sqlx::query_scalar::<_, i64>(&format!("PRAGMA {name}"))
            .fetch_one(write)
            .await
            .expect("read a pragma")
    };
    assert_eq!(pragma("auto_vacuum").await, 2, "a new file is INCREMENTAL");
    let now = crate::now_ms();
    store
        .enqueue(&queued("w0".into(), String::new(), now))
        .await
        .expect("enqueue");
    let lines: Vec<OutputLine> = (0..2000)
        .map(|n| OutputLine {
            seq: 0,
            at_ms: 0,
            generation: 1,
            source: "t1".into(),
            stream: "stdout".into(),
            line: format!("{n:0>200}"),
        })
        .collect();
    store.append_output("w0", &lines).await.expect("append");
    sqlx::query("DELETE FROM manent_output")
        .execute(write)
        .await
        .expect("remove the lines");
    assert!(
        pragma("freelist_count").await > 0,
        "removed rows leave free pages in the file"
    );
    store.reclaim_space(false).await.expect("reclaim");
    assert_eq!(
        pragma("freelist_count").await,
        0,
        "the incremental vacuum gave every free page back"
    );
    let file = test.url.trim_start_matches("sqlite://");
    let on_disk = std::fs::metadata(file).expect("the database file").len() as i64;
    let pages = pragma("page_count").await * pragma("page_size").await;
    assert_eq!(
        on_disk, pages,
        "the file on disk holds exactly its pages: a checkpoint copied the log back and cut \
         the file to them"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_on_postgresql_vacuums_the_tables_deploys_churn() {
    let test = manent_testkit::TestDb::new(manent_testkit::Db::Postgres).await;
    let store = SqlStore::connect(&test.url).await.expect("connect");
    store.migrate().await.expect("migrate");
    let Pool::Postgres(pool) = &store.pool else {
        unreachable!("a PostgreSQL store")
    };
    let now = crate::now_ms();
    for n in 0..3 {
        store
            .enqueue(&queued(format!("w{n}"), String::new(), now))
            .await
            .expect("enqueue");
    }
    sqlx::query("DELETE FROM manent_workflows WHERE id = 'w0'")
        .execute(pool)
        .await
        .expect("remove one");
    store.reclaim_space(false).await.expect("reclaim");
    // VACUUM records the live rows it counted in pg_class as it ends (no statistics
    // collector in between): -1 there would mean the table was never vacuumed.
    for table in [
        "manent_workflows",
        "manent_steps",
        "manent_events",
        "manent_audit",
    ] {
        let counted: f32 = sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE relname = $1")
            .bind(table)
            .fetch_one(pool)
            .await
            .expect("read pg_class");
        assert!(
            counted >= 0.0,
            "{table} was vacuumed by the reclaim ({counted})"
        );
    }
    let workflows: f32 =
        sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE relname = 'manent_workflows'")
            .fetch_one(pool)
            .await
            .expect("read pg_class");
    assert_eq!(
        workflows, 2.0,
        "the vacuum counted the two live workflows, not the removed one"
    );
}

/// Workflow `id` of `w` on queue `q`, in `partition`, claimable from `now`.
fn queued(id: String, partition: String, now: i64) -> NewWorkflow {
    NewWorkflow {
        id,
        name: "w".into(),
        queue: "q".into(),
        partition_key: partition,
        priority: 0,
        not_before_ms: now,
        dedup_key: None,
        input: "null".into(),
        parent_id: None,
        now_ms: now,
        workflow_version: 1,
    }
}

/// Ten runs write a step at once (so the writes share groups); one of them
/// holds a stale generation. Only that one is fenced; every other is written,
/// and a finished step is never overwritten by a later write of it.
async fn grouped_writes_fence_each_row(db: manent_testkit::Db) {
    let test = manent_testkit::TestDb::new(db).await;
    let store = SqlStore::connect(&test.url).await.expect("connect");
    store.migrate().await.expect("migrate");
    let now = crate::now_ms();
    let wfs: Vec<NewWorkflow> = (0..10)
        .map(|i| queued(format!("w{i}"), String::new(), now))
        .collect();
    store.enqueue_many(&wfs).await.expect("enqueue");
    let limits = ClaimLimits {
        worker: 10,
        partition: None,
        global: 0,
        group: None,
    };
    let claimed = store
        .claim(
            "q",
            "e",
            crate::store::WorkflowVersions::FIRST,
            limits,
            now,
            10,
        )
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 10, "all ten are claimed");
    let writes = claimed.iter().map(|record| {
        let mut lease = record.lease().expect("a claimed workflow has a lease");
        if record.id == "w3" {
            lease.generation -= 1;
        }
        let step = StepRecord {
            workflow_id: record.id.clone(),
            index: 0,
            name: "s".into(),
            status: super::super::StepStatus::Success,
            output: Some(format!("\"{}\"", record.id)),
            error: None,
            attempts: 1,
            started_at_ms: now,
            finished_at_ms: Some(now),
            executor_id: "e".into(),
        };
        let store = &store;
        async move {
            (
                lease.workflow_id.clone(),
                store.record_step(&lease, &step).await,
            )
        }
    });
    for (id, written) in futures::future::join_all(writes).await {
        let written = written.unwrap_or_else(|e| panic!("the write of {id} runs: {e}"));
        let expected = if id == "w3" {
            Checkpoint::Fenced
        } else {
            Checkpoint::Written
        };
        assert_eq!(written, expected, "{id}: only the stale lease is fenced");
        let steps = store.load_steps(&id).await.expect("load");
        assert_eq!(
            steps.len(),
            usize::from(id != "w3"),
            "{id}: the step is recorded exactly when its lease held"
        );
    }
    // A second write of a finished step changes nothing.
    let record = claimed.iter().find(|r| r.id == "w1").expect("w1");
    let lease = record.lease().expect("lease");
    let mut again = store.load_steps("w1").await.expect("load").remove(0);
    again.output = Some("\"changed\"".into());
    store
        .record_step(&lease, &again)
        .await
        .expect("write again");
    let kept = store.load_steps("w1").await.expect("load").remove(0);
    assert_eq!(
        kept.output.as_deref(),
        Some("\"w1\""),
        "a recorded step is never overwritten"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claims_one_round_trip_begin_takes_the_same_queue_lock_as_the_bound_form() {
    let test = manent_testkit::TestDb::new(manent_testkit::Db::Postgres).await;
    let store = SqlStore::connect(&test.url).await.expect("connect");
    let Pool::Postgres(pool) = &store.pool else {
        panic!("a PostgreSQL store")
    };
    for name in ["deploys", "it's", "back\\slash\\'", "group:ü"] {
        let holder = pool
            .begin_with(pg_claim_begin(name))
            .await
            .unwrap_or_else(|e| panic!("the begin for {name:?} runs: {e}"));
        let mut other = pool.acquire().await.expect("a second connection");
        let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1, hashtext($2))")
            .bind(postgres::LOCK_NAMESPACE_QUEUE)
            .bind(name)
            .fetch_one(&mut *other)
            .await
            .expect("try the bound lock");
        assert!(
            !free,
            "the lock the begin took for {name:?} is the one claimers of that queue take"
        );
        drop(other);
        holder.rollback().await.expect("rollback");
    }
}

/// Workflow `i` of [`store_with_unanalyzed_backlog`]: an id as long as the engine's
/// (UUIDs), so the index that carries them grows, and with it the planner's price
/// for reading it.
fn backlog_id(i: usize) -> String {
    format!("0190c0de-0000-7000-8000-{i:012}")
}

/// A fresh store with `n` workflows enqueued in one burst over 5,000 partitions and
/// never analyzed (the state right after a bulk enqueue), and the time they were
/// enqueued at. The database lives as long as the returned `TestDb`.
async fn store_with_unanalyzed_backlog(
    db: manent_testkit::Db,
    n: usize,
) -> (manent_testkit::TestDb, SqlStore, i64) {
    let test = manent_testkit::TestDb::new(db).await;
    let store = SqlStore::connect(&test.url)
        .await
        .expect("connect the test store");
    store.migrate().await.expect("migrate the test store");
    let now = crate::now_ms();
    let wfs: Vec<NewWorkflow> = (0..n)
        .map(|i| queued(backlog_id(i), format!("p{}", i % 5000), now))
        .collect();
    store.enqueue_many(&wfs).await.expect("enqueue the backlog");
    (test, store, now)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_page_scans_the_claimable_index_without_sorting_on_postgres() {
    claim_page_plans_read_the_claimable_index(manent_testkit::Db::Postgres).await;
}

/// A backlog written in one burst and never analyzed (the state right
/// after a bulk enqueue): each form of the claim's page query must be the
/// ordered scan of `manent_workflows_claimable`, never a sort of the backlog.
/// 100,000 rows: with fewer, PostgreSQL's estimates happened to favour the
/// claimable index even without the fix, and the test proved nothing there.
async fn claim_page_plans_read_the_claimable_index(db: manent_testkit::Db) {
    let (_test, store, now) = store_with_unanalyzed_backlog(db, 100_000).await;
    // Work running, as when a claim is woken by a finished workflow.
    let limits = ClaimLimits {
        worker: 50,
        partition: Some(1),
        global: 0,
        group: None,
    };
    let claimed = store
        .claim(
            "q",
            "e",
            crate::store::WorkflowVersions::FIRST,
            limits,
            now,
            64,
        )
        .await
        .expect("claim the first batch");
    assert_eq!(
        claimed.len(),
        50,
        "the first claim fills the worker's 50 slots"
    );
    let is_pg = db == manent_testkit::Db::Postgres;
    for (keyset, excluded) in [(false, 0), (false, 3), (true, 0), (true, 3)] {
        let sql = claim_page_sql(is_pg, keyset);
        let keys: Vec<String> = (0..excluded).map(|i| format!("p{i}")).collect();
        let keys = json_list(&keys.iter().map(String::as_str).collect::<Vec<_>>());
        let plan = match &store.pool {
            Pool::Postgres(pool) => {
                // Inside a claim transaction, as the claim runs it, and with the
                // plan a prepared statement settles on after a few runs.
                let mut tx = pool.begin_with(pg_claim_begin("q")).await.expect("begin");
                sqlx::query("SET LOCAL plan_cache_mode = force_generic_plan")
                    .execute(&mut *tx)
                    .await
                    .expect("generic plans");
                let explain = format!("EXPLAIN {sql}");
                let mut query = sqlx::query_scalar::<_, String>(&explain)
                    .bind("q")
                    .bind(now)
                    .bind(16_i64)
                    .bind(&keys);
                if keyset {
                    query = query
                        .bind(0_i64)
                        .bind(5_000_i64)
                        .bind("0190c0de-0000-7000-8000-000000005000");
                }
                let lines = query.fetch_all(&mut *tx).await.expect("explain the page");
                tx.rollback().await.expect("rollback");
                lines.join("\n")
            }
            Pool::Sqlite { read: pool, .. } => {
                let explain = format!("EXPLAIN QUERY PLAN {sql}");
                let mut query = sqlx::query_as::<_, (i64, i64, i64, String)>(&explain)
                    .bind("q")
                    .bind(now)
                    .bind(16_i64)
                    .bind(&keys);
                if keyset {
                    query = query
                        .bind(0_i64)
                        .bind(5_000_i64)
                        .bind("0190c0de-0000-7000-8000-000000005000");
                }
                let rows = query.fetch_all(pool).await.expect("explain the page");
                rows.into_iter()
                    .map(|(_, _, _, detail)| detail)
                    .collect::<Vec<_>>()
                    .join("\n")
            }
        };
        assert!(
            plan.contains("manent_workflows_claimable"),
            "the page (keyset {keyset}, {excluded} excluded) must read the claimable index, \
             not scan the backlog; plan:\n{plan}"
        );
        assert!(
            !plan.contains("Sort") && !plan.contains("TEMP B-TREE"),
            "the page (keyset {keyset}, {excluded} excluded) must come in index order, not \
             from sorting every queued row; plan:\n{plan}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claims_update_reaches_the_picked_rows_by_primary_key_on_postgres() {
    claim_update_plans_use_the_primary_key(manent_testkit::Db::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claims_update_reaches_the_picked_rows_by_primary_key_on_sqlite() {
    claim_update_plans_use_the_primary_key(manent_testkit::Db::Sqlite).await;
}

/// 10,000 queued in one burst and never analyzed, the backlog at which PostgreSQL
/// read the whole claimable index to find the picked ids: the update must look
/// them up by primary key, in the plan a fresh statement gets and in the one a
/// prepared statement settles on.
async fn claim_update_plans_use_the_primary_key(db: manent_testkit::Db) {
    let (_test, store, now) = store_with_unanalyzed_backlog(db, 10_000).await;
    let picked = [backlog_id(17), backlog_id(4_000), backlog_id(9_999)];
    let picked = json_list(&picked.iter().map(String::as_str).collect::<Vec<_>>());
    let sql = claim_update_sql(db == manent_testkit::Db::Postgres);
    let plans: Vec<(&str, String)> = match &store.pool {
        Pool::Postgres(pool) => {
            let mut plans = Vec::new();
            for mode in ["force_custom_plan", "force_generic_plan"] {
                let mut tx = pool.begin_with(pg_claim_begin("q")).await.expect("begin");
                sqlx::query(&format!("SET LOCAL plan_cache_mode = {mode}"))
                    .execute(&mut *tx)
                    .await
                    .expect("set the plan cache mode");
                let lines = sqlx::query_scalar::<_, String>(&format!("EXPLAIN {sql}"))
                    .bind("e")
                    .bind("q")
                    .bind(now)
                    .bind(&picked)
                    .fetch_all(&mut *tx)
                    .await
                    .expect("explain the update");
                tx.rollback().await.expect("rollback");
                plans.push((mode, lines.join("\n")));
            }
            plans
        }
        Pool::Sqlite { read: pool, .. } => {
            let rows =
                sqlx::query_as::<_, (i64, i64, i64, String)>(&format!("EXPLAIN QUERY PLAN {sql}"))
                    .bind("e")
                    .bind("q")
                    .bind(now)
                    .bind(&picked)
                    .fetch_all(pool)
                    .await
                    .expect("explain the update");
            let plan = rows.into_iter().map(|(_, _, _, d)| d).collect::<Vec<_>>();
            vec![("sqlite", plan.join("\n"))]
        }
    };
    for (mode, plan) in plans {
        assert!(
            !plan.contains("manent_workflows_claimable")
                && !plan.contains("manent_workflows_scheduled"),
            "the update ({mode}) must not read a backlog index to find a few ids; \
             plan:\n{plan}"
        );
        assert!(
            plan.contains("manent_workflows_pkey")
                || plan.contains("sqlite_autoindex_manent_workflows_1"),
            "the update ({mode}) must look the picked ids up by primary key; plan:\n{plan}"
        );
    }
}

#[test]
fn the_list_query_filters_on_what_was_asked_only_with_placeholders_in_order() {
    fn check(f: WorkflowFilter, expected: &str, values: &[&str]) {
        let (sql, bound) = list_sql(&f);
        let rest = sql
            .split_once(" FROM manent_workflows")
            .map(|(_, rest)| rest)
            .expect("the query reads manent_workflows");
        assert_eq!(rest, expected, "the filters of {f:?}");
        assert_eq!(
            bound, values,
            "the values bound before limit and offset for {f:?}"
        );
    }
    check(
        WorkflowFilter::default(),
        " ORDER BY created_seq DESC LIMIT $1 OFFSET $2",
        &[],
    );
    check(
        WorkflowFilter {
            status: Some(WorkflowStatus::Success),
            name: Some("deploy".into()),
            partition_key: Some("shop/prod".into()),
            limit: Some(100),
            ..Default::default()
        },
        " WHERE status = 'SUCCESS' AND name = $1 AND partition_key = $2 \
         ORDER BY created_seq DESC LIMIT $3 OFFSET $4",
        &["deploy", "shop/prod"],
    );
    check(
        WorkflowFilter {
            name: Some("deploy".into()),
            partition_prefix: Some("shop/web/".into()),
            ..Default::default()
        },
        " WHERE name = $1 AND partition_key >= $2 AND partition_key < $3 \
         ORDER BY created_seq DESC LIMIT $4 OFFSET $5",
        &["deploy", "shop/web/", "shop/web0"],
    );
    check(
        WorkflowFilter {
            queue: Some("q".into()),
            executor_id: Some("e".into()),
            parent_id: Some("p".into()),
            ..Default::default()
        },
        " WHERE queue_name = $1 AND executor_id = $2 AND parent_id = $3 \
         ORDER BY created_seq DESC LIMIT $4 OFFSET $5",
        &["q", "e", "p"],
    );
    check(
        WorkflowFilter {
            status: Some(WorkflowStatus::Pending),
            name: Some("deploy".into()),
            ..Default::default()
        },
        " WHERE status = 'PENDING' AND name = $1 ORDER BY created_seq + 0 DESC LIMIT $2 OFFSET $3",
        &["deploy"],
    );
    check(
        WorkflowFilter {
            name: Some("deploy".into()),
            partition_key: Some("shop/prod".into()),
            before_id: Some("d-41".into()),
            ..Default::default()
        },
        " WHERE name = $1 AND partition_key = $2 AND created_seq < \
         (SELECT created_seq FROM manent_workflows WHERE id = $3) \
         ORDER BY created_seq DESC LIMIT $4 OFFSET $5",
        &["deploy", "shop/prod", "d-41"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_by_partition_and_of_running_work_use_their_indexes_on_sqlite() {
    status_reads_use_their_indexes(manent_testkit::Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_by_partition_and_of_running_work_use_their_indexes_on_postgres() {
    status_reads_use_their_indexes(manent_testkit::Db::Postgres).await;
}

/// A query's plan (PostgreSQL: the plan a fresh statement gets and the one a
/// prepared statement settles on), `texts` then `ints` bound in order.
async fn plans(
    store: &SqlStore,
    sql: &str,
    texts: &[&str],
    ints: &[i64],
) -> Vec<(&'static str, String)> {
    match &store.pool {
        Pool::Postgres(pool) => {
            let mut plans = Vec::new();
            for mode in ["force_custom_plan", "force_generic_plan"] {
                let mut tx = pool.begin().await.expect("begin");
                sqlx::query(&format!("SET LOCAL plan_cache_mode = {mode}"))
                    .execute(&mut *tx)
                    .await
                    .expect("plan mode");
                let explain = format!("EXPLAIN {sql}");
                let mut query = sqlx::query_scalar::<_, String>(&explain);
                for text in texts {
                    query = query.bind(*text);
                }
                for int in ints {
                    query = query.bind(*int);
                }
                let lines = query.fetch_all(&mut *tx).await.expect("explain");
                tx.rollback().await.expect("rollback");
                plans.push((mode, lines.join("\n")));
            }
            plans
        }
        Pool::Sqlite { read: pool, .. } => {
            let explain = format!("EXPLAIN QUERY PLAN {sql}");
            let mut query = sqlx::query_as::<_, (i64, i64, i64, String)>(&explain);
            for text in texts {
                query = query.bind(*text);
            }
            for int in ints {
                query = query.bind(*int);
            }
            let rows = query.fetch_all(pool).await.expect("explain");
            let plan = rows.into_iter().map(|(_, _, _, d)| d).collect::<Vec<_>>();
            vec![("sqlite", plan.join("\n"))]
        }
    }
}

/// Whether `plan` reads every row of manent_workflows rather than an index of it.
fn reads_the_whole_table(plan: &str) -> bool {
    plan.contains("Seq Scan on manent_workflows")
        || plan
            .lines()
            .any(|l| l.contains("SCAN manent_workflows") && !l.contains("INDEX"))
}

/// 100,000 queued in one burst and never analyzed, 50 of them running: one
/// partition's history (rollback, dependencies, `manent history`), the claim's count
/// of running work and the queues' depths each read an index made for them, never
/// the whole history.
async fn status_reads_use_their_indexes(db: manent_testkit::Db) {
    let (_test, store, now) = store_with_unanalyzed_backlog(db, 100_000).await;
    let limits = ClaimLimits {
        worker: 50,
        partition: Some(1),
        global: 0,
        group: None,
    };
    let claimed = store
        .claim(
            "q",
            "e",
            crate::store::WorkflowVersions::FIRST,
            limits,
            now,
            64,
        )
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 50, "50 are running while the plans are read");
    // Every environment of one application: a range of the partition index, its few rows
    // then sorted.
    let by_application = WorkflowFilter {
        name: Some("w".into()),
        partition_prefix: Some("p7".into()),
        ..Default::default()
    };
    let (sql, values) = list_sql(&by_application);
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    for (mode, plan) in plans(&store, &sql, &values, &[100, 0]).await {
        assert!(
            plan.contains("manent_workflows_partition") && !reads_the_whole_table(&plan),
            "{by_application:?} ({mode}) must read a range of the partition index; plan:\n{plan}"
        );
    }
    // The same, merged partition by partition: each arm in the partition index's order, only
    // the arms' few rows sorted.
    let (sql, values) = list_merged_sql(
        &WorkflowFilter {
            limit: Some(100),
            ..by_application.clone()
        },
        &["p7".to_string(), "p70".to_string()],
    );
    assert!(
        sql.matches(" UNION ALL ").count() == 1
            && sql.contains("partition_key = $2")
            && sql.contains("partition_key = $4")
            && sql.ends_with("LIMIT $5 OFFSET $6"),
        "two arms, each with its own placeholders: {sql}"
    );
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    assert_eq!(
        values,
        ["w", "p7", "w", "p70"],
        "the values in the order they were written"
    );
    for (mode, plan) in plans(&store, &sql, &values, &[100, 0]).await {
        assert!(
            plan.contains("manent_workflows_partition") && !reads_the_whole_table(&plan),
            "a merged list ({mode}) reads each partition from its index; plan:\n{plan}"
        );
    }
    // The next page of one partition's history: the same index, from the cursor down.
    let next_page = WorkflowFilter {
        name: Some("w".into()),
        partition_key: Some("p7".into()),
        before_id: Some("wf-7-3".into()),
        ..Default::default()
    };
    let (sql, values) = list_sql(&next_page);
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    for (mode, plan) in plans(&store, &sql, &values, &[100, 0]).await {
        assert!(
            plan.contains("manent_workflows_partition") && !reads_the_whole_table(&plan),
            "{next_page:?} ({mode}) must read the partition index from the cursor; plan:\n{plan}"
        );
    }
    let by_partition = [
        WorkflowFilter {
            status: Some(WorkflowStatus::Success),
            name: Some("w".into()),
            partition_key: Some("p7".into()),
            ..Default::default()
        },
        WorkflowFilter {
            name: Some("w".into()),
            partition_key: Some("p7".into()),
            ..Default::default()
        },
        WorkflowFilter {
            status: Some(WorkflowStatus::Pending),
            name: Some("w".into()),
            partition_key: Some("p7".into()),
            ..Default::default()
        },
    ];
    for filter in &by_partition {
        let (sql, values) = list_sql(filter);
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        for (mode, plan) in plans(&store, &sql, &values, &[100, 0]).await {
            // Running rows may also come from the (smaller) index of running work.
            assert!(
                plan.contains("manent_workflows_partition")
                    || plan.contains("manent_workflows_running"),
                "{filter:?} ({mode}) must read the partition's index; plan:\n{plan}"
            );
            assert!(
                !reads_the_whole_table(&plan),
                "{filter:?} ({mode}) must not read the table; plan:\n{plan}"
            );
            // PostgreSQL may sort the partition's few rows it found; SQLite, without
            // statistics, would otherwise sort everything it read.
            assert!(
                !plan.contains("TEMP B-TREE"),
                "{filter:?} ({mode}) must come newest first from the index; plan:\n{plan}"
            );
        }
    }
    for (mode, plan) in plans(&store, CLAIM_RUNNING_SQL, &["q", "g"], &[]).await {
        assert!(
            plan.contains("manent_workflows_running")
                && plan.contains("manent_workflows_group_running"),
            "the claim's count ({mode}) must read the indexes of running rows; \
             plan:\n{plan}"
        );
        assert!(
            !reads_the_whole_table(&plan),
            "the claim's count ({mode}) must not read the table; plan:\n{plan}"
        );
    }
    for (mode, plan) in plans(&store, QUEUE_DEPTHS_SQL, &[], &[]).await {
        assert!(
            !reads_the_whole_table(&plan),
            "the queues' depths ({mode}) must read the partial indexes of queued and \
             running rows, not the whole history; plan:\n{plan}"
        );
    }
    let depths = store.queue_depths().await.expect("depths");
    assert_eq!(
        depths,
        vec![QueueDepth {
            queue: "q".into(),
            enqueued: 99_950,
            running: 50,
        }],
        "both counts of the queue, in one entry"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_8_database_with_work_in_it_migrates_to_9_on_sqlite() {
    upgrade_from_version_8(manent_testkit::Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_8_database_with_work_in_it_migrates_to_9_on_postgres() {
    upgrade_from_version_8(manent_testkit::Db::Postgres).await;
}

/// The names of manent_workflows' indexes, sorted.
async fn workflow_indexes(store: &SqlStore) -> Vec<String> {
    let mut names: Vec<String> = match &store.pool {
        Pool::Postgres(pool) => sqlx::query_scalar(
            "SELECT indexname::text FROM pg_indexes WHERE tablename = 'manent_workflows'",
        )
        .fetch_all(pool)
        .await
        .expect("list indexes"),
        Pool::Sqlite { read: pool, .. } => sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'manent_workflows'",
        )
        .fetch_all(pool)
        .await
        .expect("list indexes"),
    };
    names.sort();
    names
}

/// The ids and statuses of both test partitions' histories, newest first.
async fn partition_histories(store: &SqlStore) -> Vec<(String, String, WorkflowStatus)> {
    let mut seen = Vec::new();
    for partition in ["app/env0", "app/env1"] {
        let rows = store
            .list_workflows(&WorkflowFilter {
                partition_key: Some(partition.into()),
                ..Default::default()
            })
            .await
            .expect("list a partition");
        seen.extend(
            rows.into_iter()
                .map(|r| (partition.to_string(), r.id, r.status)),
        );
    }
    seen
}

/// A database that version 8 made and used (queued, running and finished work in two
/// partitions) takes migration 9 with nothing lost: the same rows listed by partition,
/// the same depths, the old indexes gone and the new ones there. Version 8 kept no
/// checksums: its record gains the column and every version its checksum.
async fn upgrade_from_version_8(db: manent_testkit::Db) {
    let test = manent_testkit::TestDb::new(db).await;
    let store = SqlStore::connect(&test.url).await.expect("connect");
    let backend = store.backend();
    with_writer!(store, pool => {
        sqlx::query(LEGACY_MIGRATIONS_TABLE).execute(pool).await.expect("migrations table");
        for m in migrations::MIGRATIONS.iter().filter(|m| m.version <= 8) {
            for statement in m.statements(backend) {
                sqlx::query(&statement).execute(pool).await.expect("a version 8 statement");
            }
            sqlx::query("INSERT INTO manent_schema_migrations (version, name, applied_at) VALUES ($1, $2, 0)")
                .bind(m.version)
                .bind(m.name)
                .execute(pool)
                .await
                .expect("record the version");
        }
    });
    assert!(
        workflow_indexes(&store)
            .await
            .contains(&"manent_workflows_partition_history".to_string()),
        "the database starts as version 8 left it"
    );
    // The work version 8 left, written with version 8's columns (this build's statements
    // name columns later versions added): in each partition of `app/env0` and `app/env1`
    // three workflows; w0 finished, w1 running under `e`, the other four queued.
    let now = crate::now_ms();
    let status_of = |i: usize| match i {
        0 => WorkflowStatus::Success,
        1 => WorkflowStatus::Pending,
        _ => WorkflowStatus::Enqueued,
    };
    with_writer!(store, pool => {
        for i in 0..6usize {
            let seq = i64::try_from(i).expect("a small number");
            sqlx::query(
                "INSERT INTO manent_workflows (id, name, status, queue_name, partition_key, priority, not_before, \
                 executor_id, input, attempts, generation, created_at, created_seq, updated_at) \
                 VALUES ($1, 'w', $2, 'q', $3, 0, $4, $5, 'null', 0, 0, $4, $6, $4)",
            )
            .bind(format!("w{i}"))
            .bind(status_of(i).as_str())
            .bind(format!("app/env{}", i % 2))
            .bind(now)
            .bind((i < 2).then_some("e"))
            .bind(now * 1000 + seq)
            .execute(pool)
            .await
            .expect("a version 8 row");
        }
    });
    let before: Vec<(String, String, WorkflowStatus)> = [4, 2, 0, 5, 3, 1]
        .into_iter()
        .map(|i: usize| (format!("app/env{}", i % 2), format!("w{i}"), status_of(i)))
        .collect();
    let depths_before = vec![QueueDepth {
        queue: "q".into(),
        enqueued: 4,
        running: 1,
    }];

    store
        .migrate()
        .await
        .expect("migrate to the latest version");

    assert_eq!(
        partition_histories(&store).await,
        before,
        "every partition's history reads the same after the migration"
    );
    assert_eq!(
        store.queue_depths().await.expect("depths"),
        depths_before,
        "the queue's depths read the same after the migration"
    );
    assert_eq!(
        depths_before,
        vec![QueueDepth {
            queue: "q".into(),
            enqueued: 4,
            running: 1,
        }],
        "four queued and one running, counted from the new indexes too"
    );
    let indexes = workflow_indexes(&store).await;
    for gone in [
        "manent_workflows_queue",
        "manent_workflows_partition_history",
    ] {
        assert!(
            !indexes.contains(&gone.to_string()),
            "{gone} is dropped: {indexes:?}"
        );
    }
    for made in ["manent_workflows_running", "manent_workflows_partition"] {
        assert!(
            indexes.contains(&made.to_string()),
            "{made} is made: {indexes:?}"
        );
    }
    assert_eq!(
        recorded_checksums(&store).await,
        migrations::MIGRATIONS
            .iter()
            .map(|m| (m.version, Some(m.checksum())))
            .collect::<Vec<_>>(),
        "every applied version carries this build's checksum after the migration"
    );
}

/// Each version's recorded checksum, by version.
async fn recorded_checksums(store: &SqlStore) -> Vec<(i64, Option<String>)> {
    with_pool!(store, pool => sqlx::query_as::<_, (i64, Option<String>)>(
        "SELECT version, checksum FROM manent_schema_migrations ORDER BY version",
    )
    .fetch_all(pool)
    .await)
    .expect("read the migrations record")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_migration_is_refused_at_start_on_sqlite() {
    edited_migration_is_refused(manent_testkit::Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_migration_is_refused_at_start_on_postgres() {
    edited_migration_is_refused(manent_testkit::Db::Postgres).await;
}

/// A database whose record says migration 4 was applied with other statements than this
/// build's is refused by the next start, naming the version; nothing is applied or stamped.
async fn edited_migration_is_refused(db: manent_testkit::Db) {
    let test = manent_testkit::TestDb::new(db).await;
    let store = SqlStore::connect(&test.url).await.expect("connect");
    store.migrate().await.expect("a fresh database migrates");
    with_writer!(store, pool => {
        sqlx::query("UPDATE manent_schema_migrations SET checksum = 'edited' WHERE version = 4")
            .execute(pool)
            .await
            .expect("pretend migration 4 was applied from other statements");
    });
    let error = store
        .migrate()
        .await
        .expect_err("an edited migration must stop the start");
    assert!(
        matches!(error, StoreError::MigrationEdited { version: 4, .. }),
        "the refusal names migration 4: {error}"
    );
    let recorded = recorded_checksums(&store).await;
    assert_eq!(
        recorded
            .iter()
            .find(|(v, _)| *v == 4)
            .and_then(|(_, c)| c.clone())
            .as_deref(),
        Some("edited"),
        "the refused record is left as it was, for the operator to see"
    );
}

#[test]
fn sequence_is_strictly_increasing_within_a_millisecond() {
    let a = next_seq(1_000);
    let b = next_seq(1_000);
    assert!(
        b > a,
        "two enqueues in one millisecond must keep their order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_a_newer_release_migrated_is_refused_unless_declared_compatible_on_sqlite() {
    newer_schema_needs_a_declaration(manent_testkit::Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_a_newer_release_migrated_is_refused_unless_declared_compatible_on_postgres() {
    newer_schema_needs_a_declaration(manent_testkit::Db::Postgres).await;
}

/// What a rolling upgrade looks like to the old binary: a newer release applied migration
/// `latest + 1`. Without a declaration this build refuses to start, naming both versions;
/// once the row declares it compatible with this build's schema, this build starts.
async fn newer_schema_needs_a_declaration(db: manent_testkit::Db) {
    let test = manent_testkit::TestDb::new(db).await;
    let store = SqlStore::connect(&test.url).await.expect("connect");
    store.migrate().await.expect("a fresh database migrates");
    let known = migrations::latest_version();
    with_writer!(store, pool => {
        sqlx::query("INSERT INTO manent_schema_migrations (version, name, applied_at, checksum) VALUES ($1, 'a newer release''s table', 0, 'x')")
            .bind(known + 1)
            .execute(pool)
            .await
            .expect("pretend a newer release migrated the database");
    });
    let error = store
        .migrate()
        .await
        .expect_err("a migration this build does not know, not declared compatible, stops it");
    assert!(
        matches!(error, StoreError::SchemaTooNew { database, known: k, .. } if database == known + 1 && k == known),
        "the refusal names the database's version and this build's: {error}"
    );
    with_writer!(store, pool => {
        sqlx::query("UPDATE manent_schema_migrations SET compatible_from = $1 WHERE version = $2")
            .bind(known)
            .bind(known + 1)
            .execute(pool)
            .await
            .expect("declare the newer migration compatible with this build's schema");
    });
    store
        .migrate()
        .await
        .expect("a newer migration declared compatible lets this build run beside it");
}

/// `admin copy` moves every table of the schema: a table a migration adds and the copy's
/// list leaves out would be lost in every copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_lists_every_table_of_the_schema_on_both_backends() {
    for backend in [manent_testkit::Db::Sqlite, manent_testkit::Db::Postgres] {
        let test = manent_testkit::TestDb::new(backend).await;
        let store = SqlStore::connect(&test.url).await.expect("connect");
        store.migrate().await.expect("migrate");
        let mut listed: Vec<String> = copy::TABLES.iter().map(|t| t.to_string()).collect();
        listed.sort();
        let tables = store
            .schema_tables()
            .await
            .expect("read the schema's tables");
        assert_eq!(
            tables, listed,
            "the tables of the schema on {backend:?} are the copy's"
        );
    }
}
