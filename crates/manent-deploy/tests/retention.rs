//! Retention on both backends (docs/configuration.md, `retention`): what goes (finished
//! deploys past their age with their passes, steps and output; old output lines of kept
//! deploys; old audit entries), what stays (the newest `keep_last` successful deploys of
//! each environment, anything in flight and its output), what a dry run reports (and that
//! it removes nothing), and that a second application finds nothing more.

use std::{sync::Arc, time::Duration};

use manent_config::RetentionConfig;
use manent_deploy::background::retention::{PruneReport, prune};
use manent_engine::{
    AuditRecord, Client, Database, OutputLine, StepRecord, StepStatus, WorkflowStatus,
    WorkflowVersions,
    store::{self, ClaimLimits, NewWorkflow, Store},
};
use manent_testkit::{Db, TestDb, on_both_backends};

on_both_backends!(
    retention_removes_old_history_and_keeps_the_newest_successful_deploys_and_everything_in_flight,
    a_dry_run_counts_exactly_what_the_real_run_then_removes,
);

const DAY: i64 = 86_400_000;
/// When the history was written: long before the prune's "now".
const THEN: i64 = 1_700_000_000_000;
const LIMITS: ClaimLimits = ClaimLimits {
    worker: 10,
    partition: None,
    global: 0,
    group: None,
};

/// Writes workflow `id` (a deploy, or with `parent` a pass of one) of `partition`, with one
/// step and two output lines, and ends it with `status` at `ended` (ms), or leaves it
/// queued with `None`.
async fn history(
    store: &Arc<dyn Store>,
    id: &str,
    partition: &str,
    parent: Option<&str>,
    status: Option<WorkflowStatus>,
    ended: i64,
) {
    let name = if parent.is_some() {
        "manent.deploy.pass"
    } else {
        "manent.deploy"
    };
    // A queue of its own, so that a claim takes exactly this one.
    store
        .enqueue(&NewWorkflow {
            id: id.into(),
            name: name.into(),
            queue: format!("q-{id}"),
            partition_key: partition.into(),
            priority: 0,
            not_before_ms: 0,
            dedup_key: None,
            input: "null".into(),
            parent_id: parent.map(str::to_string),
            now_ms: THEN,
            workflow_version: 1,
        })
        .await
        .expect("enqueue");
    let line = |n: i64| OutputLine {
        seq: 0,
        at_ms: THEN + n,
        generation: 1,
        source: "t1: command 1".into(),
        stream: "stdout".into(),
        line: format!("line {n} of {id}"),
    };
    store
        .append_output(id, &[line(1), line(2)])
        .await
        .expect("append output");
    let Some(status) = status else { return };
    let record = store
        .claim(
            &format!("q-{id}"),
            "w",
            WorkflowVersions::FIRST,
            LIMITS,
            THEN,
            1,
        )
        .await
        .expect("claim")
        .remove(0);
    let lease = record.lease().expect("a lease");
    store
        .record_step(
            &lease,
            &StepRecord {
                workflow_id: id.into(),
                index: 0,
                name: "fetch".into(),
                status: StepStatus::Success,
                output: Some("null".into()),
                error: None,
                attempts: 1,
                started_at_ms: THEN,
                finished_at_ms: Some(THEN),
                executor_id: "w".into(),
            },
        )
        .await
        .expect("record a step");
    store
        .finish(&lease, status, Some("null"), None, ended)
        .await
        .expect("finish");
}

async fn audit(store: &Arc<dyn Store>, at_ms: i64) {
    store
        .append_audit(&AuditRecord {
            seq: 0,
            at_ms,
            actor: "ci".into(),
            actor_id: "t".into(),
            action: "deploy.submit".into(),
            target: "acme/web".into(),
            outcome: 201,
            detail: String::new(),
        })
        .await
        .expect("append audit");
}

async fn exists(client: &Client, id: &str) -> bool {
    client.get(id).await.expect("read a workflow").is_some()
}

async fn output_of(store: &Arc<dyn Store>, id: &str) -> usize {
    store
        .list_output(id, 0, 100)
        .await
        .expect("read output")
        .len()
}

/// Five successful deploys of one environment (s1 with a region pass), a failed one, one
/// still queued; one successful deploy of another environment; three old audit entries.
async fn write_history(store: &Arc<dyn Store>) {
    let store = store.clone();
    let web = "acme/web/prod";
    for n in 1..=5 {
        history(
            &store,
            &format!("s{n}"),
            web,
            None,
            Some(WorkflowStatus::Success),
            THEN + n * 1000,
        )
        .await;
    }
    history(
        &store,
        "s1-pass",
        web,
        Some("s1"),
        Some(WorkflowStatus::Success),
        THEN,
    )
    .await;
    history(
        &store,
        "f1",
        web,
        None,
        Some(WorkflowStatus::Error),
        THEN + 6000,
    )
    .await;
    history(&store, "queued", web, None, None, THEN).await;
    history(
        &store,
        "db-live",
        "acme/db/prod",
        None,
        Some(WorkflowStatus::Success),
        THEN,
    )
    .await;
    for at in [THEN, THEN + 1, THEN + 2] {
        audit(&store, at).await;
    }
}

/// A fresh database on `db` holding [`write_history`]'s history (kept while the first
/// value lives), its store and a client.
async fn with_history(db: Db) -> (TestDb, Arc<dyn Store>, Client) {
    let test = TestDb::new(db).await;
    let store = store::open(&test.url)
        .await
        .expect("open the test database");
    write_history(&store).await;
    let client = Client::new(Database::from(store.clone()));
    (test, store, client)
}

async fn retention_removes_old_history_and_keeps_the_newest_successful_deploys_and_everything_in_flight(
    db: Db,
) {
    let (_test, store, client) = with_history(db).await;
    let now = THEN + 10 * DAY;
    audit(&store, now).await;

    let retention = RetentionConfig {
        keep_last: 2,
        deploys: Duration::from_secs(86_400),
        output: Duration::from_secs(86_400),
        audit: Duration::from_secs(86_400),
        batch: 2, // several batches of each kind
        ..RetentionConfig::default()
    };
    let dry = prune(&client, &retention, now, true)
        .await
        .expect("dry run");
    assert_eq!(
        dry,
        PruneReport {
            dry_run: true,
            deploys: 4,
            passes: 1,
            steps: 5,
            output_lines: 16,
            audit_entries: 3,
        },
        "a dry run counts s1-s3 and f1 with s1's pass and their steps, every old line of a \
         finished workflow and the old audit entries: what the real run removes"
    );
    assert!(exists(&client, "s1").await, "a dry run removes nothing");

    let report = prune(&client, &retention, now, false).await.expect("prune");
    assert_eq!(
        report,
        PruneReport {
            dry_run: false,
            deploys: 4,
            passes: 1,
            steps: 5,
            output_lines: 16,
            audit_entries: 3,
        },
        "the four deploys with s1's pass, their steps and output, then the old lines of the \
         kept finished deploys, and the old audit entries"
    );
    for id in ["s1", "s1-pass", "s2", "s3", "f1"] {
        assert!(
            !exists(&client, id).await,
            "{id} is past its age and not kept: removed"
        );
    }
    for id in ["s4", "s5", "db-live", "queued"] {
        assert!(
            exists(&client, id).await,
            "{id} stays: the newest two successful deploys of each environment and anything \
             in flight"
        );
    }
    assert_eq!(
        store.load_steps("s5").await.expect("steps").len(),
        1,
        "a kept deploy keeps its steps (rollback and history read them)"
    );
    assert_eq!(
        output_of(&store, "s5").await,
        0,
        "a kept deploy's old output goes"
    );
    assert_eq!(
        output_of(&store, "queued").await,
        2,
        "the output of a deploy in flight stays, however old"
    );
    let left = client
        .records()
        .audit(&manent_engine::AuditFilter::newest(10))
        .await
        .expect("read the audit trail");
    assert_eq!(
        left.iter().map(|a| a.at_ms).collect::<Vec<_>>(),
        [now],
        "only the recent audit entry stays"
    );

    let again = prune(&client, &retention, now, false)
        .await
        .expect("prune again");
    assert!(
        again.is_empty(),
        "a second application finds nothing more: {again:?}"
    );
}

/// `admin prune --dry-run` once said "steps 0" where the real run removed 167: under every
/// mix of ages, the dry run's figures are the real run's.
async fn a_dry_run_counts_exactly_what_the_real_run_then_removes(db: Db) {
    let day = Duration::from_secs(86_400);
    let cases = [
        ("everything old", day, day),
        ("the removed deploys' output is recent", day, 30 * day),
        (
            "deploys kept for ever, old output goes",
            Duration::ZERO,
            day,
        ),
        ("output kept for ever", day, Duration::ZERO),
    ];
    for (what, deploys, output) in cases {
        let (_test, _, client) = with_history(db).await;
        let retention = RetentionConfig {
            keep_last: 2,
            deploys,
            output,
            audit: day,
            batch: 2,
            ..RetentionConfig::default()
        };
        let now = THEN + 10 * DAY;
        let dry = prune(&client, &retention, now, true)
            .await
            .expect("dry run");
        let real = prune(&client, &retention, now, false).await.expect("prune");
        assert!(!real.is_empty(), "{what}: the real run removes something");
        assert_eq!(
            PruneReport {
                dry_run: false,
                ..dry
            },
            real,
            "{what}: the dry run counted what the real run removed"
        );
    }
}
