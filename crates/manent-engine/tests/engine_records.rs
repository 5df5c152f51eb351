//! What the store keeps and reads back on both backends: migrations, records, the
//! audit log, the events of many workflows and what ran in a window.

use manent_engine::{
    EnqueueRequest, QueueSpec, RecordEntry, TimeWindow, WorkflowContext, WorkflowError,
    WorkflowStatus, now_ms, store,
};
use manent_testkit::{Db, TestDb, on_both_backends};

mod common;
use common::{WAIT, engine, open, wait_success};

on_both_backends!(
    concurrent_migrations_on_an_empty_database_all_succeed,
    records_are_kept_replaced_listed_and_deleted,
    records_written_together_are_inserted_all_or_none_and_deleted_together,
    audit_entries_are_appended_and_listed_newest_first,
    audit_filters_and_the_cursor_reach_past_thousands_of_newer_entries,
    the_events_of_many_workflows_are_read_at_once,
    what_finished_or_started_in_a_window_is_read_oldest_first,
);

async fn concurrent_migrations_on_an_empty_database_all_succeed(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let url = db.url.clone();
        tasks.push(tokio::spawn(
            async move { store::open(&url).await.map(|_| ()) },
        ));
    }
    for t in tasks {
        t.await.unwrap().expect("every concurrent start succeeds");
    }
    let s = open(&db).await;
    assert_eq!(
        s.schema_version().await.unwrap(),
        store::expected_schema_version(),
        "schema complete once"
    );
}

async fn records_are_kept_replaced_listed_and_deleted(db: Db) {
    let db = TestDb::new(db).await;
    let s = open(&db).await;
    assert!(
        s.insert_record("token", "a", "1", 1).await.unwrap(),
        "a free key is inserted"
    );
    assert!(
        !s.insert_record("token", "a", "2", 2).await.unwrap(),
        "insert never replaces"
    );
    s.put_record("token", "b", "3", 3).await.unwrap();
    s.put_record("token", "b", "4", 4).await.unwrap();
    s.put_record("other", "a", "5", 5).await.unwrap();
    assert_eq!(
        s.get_record("token", "a").await.unwrap().as_deref(),
        Some("1"),
        "the record written is the record read"
    );
    assert_eq!(
        s.list_records("token").await.unwrap(),
        vec![
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), "4".to_string())
        ],
        "put replaces; kinds are separate"
    );
    assert!(
        s.delete_record("token", "a").await.unwrap(),
        "an existing record is deleted"
    );
    assert!(
        !s.delete_record("token", "a").await.unwrap(),
        "deleting twice reports nothing deleted"
    );
    assert_eq!(
        s.get_record("token", "a").await.unwrap(),
        None,
        "a deleted record is gone"
    );
}

async fn records_written_together_are_inserted_all_or_none_and_deleted_together(db: Db) {
    let db = TestDb::new(db).await;
    let s = open(&db).await;
    let entry = |kind, key, value| RecordEntry { kind, key, value };
    assert!(
        s.insert_records(&[entry("name", "ci", "h1"), entry("token", "h1", "{}")], 1)
            .await
            .unwrap(),
        "free keys are all inserted"
    );
    assert!(
        !s.insert_records(&[entry("token", "h2", "{}"), entry("name", "ci", "h2")], 2)
            .await
            .unwrap(),
        "a taken key refuses the whole write"
    );
    assert_eq!(
        s.get_record("token", "h2").await.unwrap(),
        None,
        "the record before the taken key was rolled back with it"
    );
    assert_eq!(
        s.get_record("name", "ci").await.unwrap().as_deref(),
        Some("h1"),
        "the taken key keeps its value"
    );
    assert_eq!(
        s.delete_records(&[("name", "ci"), ("token", "h1"), ("token", "absent")])
            .await
            .unwrap(),
        2,
        "deleting counts the records that existed"
    );
    assert_eq!(
        s.list_records("name").await.unwrap().len() + s.list_records("token").await.unwrap().len(),
        0,
        "both records are gone"
    );
}

async fn audit_entries_are_appended_and_listed_newest_first(db: Db) {
    let db = TestDb::new(db).await;
    let s = open(&db).await;
    for (n, action) in ["deploy.submit", "deploy.cancel", "token.revoke"]
        .into_iter()
        .enumerate()
    {
        s.append_audit(&manent_engine::AuditRecord {
            seq: 0,
            at_ms: 1000 + n as i64,
            actor: "ci".into(),
            actor_id: "tok_1".into(),
            action: action.into(),
            target: format!("d{n}"),
            outcome: 200,
            detail: String::new(),
        })
        .await
        .unwrap();
    }
    let newest_two = s
        .list_audit(&manent_engine::AuditFilter {
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    let actions: Vec<&str> = newest_two.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(
        actions,
        ["token.revoke", "deploy.cancel"],
        "the newest entries come first and the limit holds"
    );
    assert!(
        newest_two[0].seq > newest_two[1].seq,
        "the store numbers entries in the order they were appended"
    );
    assert_eq!(
        (
            newest_two[0].actor_id.as_str(),
            newest_two[0].target.as_str()
        ),
        ("tok_1", "d2"),
        "every field is kept"
    );
}

async fn the_events_of_many_workflows_are_read_at_once(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let e = engine(&db, "w").await;
    e.register("tag", |ctx: WorkflowContext, n: u32| async move {
        ctx.set_event("n", &n).await?;
        ctx.set_event("phase", &"done").await?;
        Ok::<_, WorkflowError>(())
    });
    e.listen(QueueSpec::new("q"));
    e.launch().await.unwrap();
    let client = e.client();
    let mut ids = Vec::new();
    for n in 0..3u32 {
        let wf = client
            .enqueue(EnqueueRequest::new("tag", "q", n))
            .await
            .unwrap();
        wait_success(&client, &wf.id).await;
        ids.push(wf.id);
    }
    ids.push("no-such-workflow".to_string());
    let by_id = client.events_of(&ids).await.unwrap();
    for (n, id) in ids.iter().take(3).enumerate() {
        let events = &by_id[id];
        let keys: Vec<&str> = events.iter().map(|ev| ev.key.as_str()).collect();
        assert_eq!(keys, ["n", "phase"], "each workflow's own events, by key");
        assert_eq!(events[0].value, n.to_string(), "not another workflow's");
    }
    assert!(
        !by_id.contains_key("no-such-workflow"),
        "an id without events has no entry"
    );
    assert!(
        client.events_of(&[]).await.unwrap().is_empty(),
        "no ids, no query, nothing"
    );
    e.shutdown(WAIT).await;
}

async fn what_finished_or_started_in_a_window_is_read_oldest_first(db: Db) {
    let db = TestDb::new(db).await;
    let e = engine(&db, "w").await;
    e.register("two-steps", |ctx: WorkflowContext, fail: bool| async move {
        ctx.step("first", || async { Ok::<_, String>(1) }).await?;
        ctx.step("second", || async { Ok::<_, String>(2) }).await?;
        if fail {
            return Err(WorkflowError::failed("as asked"));
        }
        Ok::<_, WorkflowError>(())
    });
    e.listen(QueueSpec::new("q"));
    e.launch().await.unwrap();
    let client = e.client();
    let before = now_ms() - 1;
    for fail in [false, true] {
        let wf = client
            .enqueue(EnqueueRequest::new("two-steps", "q", fail))
            .await
            .unwrap();
        client.wait(&wf.id, WAIT).await.unwrap();
    }
    let all = TimeWindow {
        after_ms: before,
        until_ms: now_ms() + 1,
        limit: 100,
    };
    let steps = client.steps_finished_between(all).await.unwrap();
    assert_eq!(
        steps.len(),
        4,
        "two steps of each workflow, none of the engine's own: {steps:?}"
    );
    assert!(
        steps.windows(2).all(|w| w[0].0 <= w[1].0) && steps.iter().all(|(_, ms)| *ms >= 0),
        "oldest first, with their durations: {steps:?}"
    );
    let started = client.workflows_started_between(all).await.unwrap();
    assert_eq!(started.len(), 2, "both workflows were claimed: {started:?}");
    let ended = client
        .workflows_finished_between("two-steps", all)
        .await
        .unwrap();
    let statuses: Vec<WorkflowStatus> = ended.iter().map(|(_, s)| *s).collect();
    assert_eq!(
        statuses,
        [WorkflowStatus::Success, WorkflowStatus::Error],
        "each ended workflow once, in the order they ended: {ended:?}"
    );
    let first_only = TimeWindow { limit: 1, ..all };
    assert_eq!(
        client
            .workflows_finished_between("two-steps", first_only)
            .await
            .unwrap()
            .len(),
        1,
        "the limit holds"
    );
    let later = TimeWindow {
        after_ms: ended[1].0,
        ..all
    };
    assert!(
        client
            .workflows_finished_between("two-steps", later)
            .await
            .unwrap()
            .is_empty(),
        "the window's start is exclusive"
    );
    assert!(
        client
            .workflows_finished_between("another-name", all)
            .await
            .unwrap()
            .is_empty(),
        "only workflows of the name asked for"
    );
    e.shutdown(WAIT).await;
}

async fn audit_filters_and_the_cursor_reach_past_thousands_of_newer_entries(db: Db) {
    use manent_engine::{AuditFilter, AuditRecord};
    let db = TestDb::new(db).await;
    let s = open(&db).await;
    let entry = |at_ms: i64, actor: &str, action: &str| AuditRecord {
        seq: 0,
        at_ms,
        actor: actor.into(),
        actor_id: String::new(),
        action: action.into(),
        target: format!("t{at_ms}"),
        outcome: 200,
        detail: String::new(),
    };
    // Five entries of `alice`, old, then 3,000 newer ones of `-` (anonymous refusals).
    for n in 0..5 {
        let action = if n % 2 == 0 {
            "deploy.submit"
        } else {
            "token.revoke"
        };
        s.append_audit(&entry(1_000 + n, "alice", action))
            .await
            .unwrap();
    }
    for n in 0..3_000 {
        s.append_audit(&entry(10_000 + n, "-", "GET /api/v1/deploys"))
            .await
            .unwrap();
    }
    let alice = s
        .list_audit(&AuditFilter {
            actor: Some("alice".into()),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    let times: Vec<i64> = alice.iter().map(|e| e.at_ms).collect();
    assert_eq!(
        times,
        [1_004, 1_003, 1_002, 1_001, 1_000],
        "an actor's entries are found behind 3,000 newer entries of others, newest first"
    );
    let submits = s
        .list_audit(&AuditFilter {
            actor: Some("alice".into()),
            action: Some("deploy.submit".into()),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        submits.iter().map(|e| e.at_ms).collect::<Vec<_>>(),
        [1_004, 1_002, 1_000],
        "actor and action filters combine"
    );
    let window = s
        .list_audit(&AuditFilter {
            since_ms: Some(1_001),
            until_ms: Some(1_003),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        window.iter().map(|e| e.at_ms).collect::<Vec<_>>(),
        [1_002, 1_001],
        "since is inclusive, until exclusive"
    );
    // Paging through everything, 700 at a time, with the cursor of each answer.
    let mut seen = 0;
    let mut before = None;
    let mut pages = 0;
    loop {
        let page = s
            .list_audit(&AuditFilter {
                before_seq: before,
                limit: 700,
                ..Default::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        assert!(
            page.windows(2).all(|w| w[0].seq > w[1].seq),
            "each page is newest first"
        );
        if let Some(before) = before {
            assert!(
                page[0].seq < before,
                "a page starts below the cursor it was asked with"
            );
        }
        before = Some(last.seq);
        seen += page.len();
        pages += 1;
    }
    assert_eq!(
        (seen, pages),
        (3_005, 5),
        "the cursor reaches every entry once, the oldest included"
    );
}
