//! Tests of the deploy views that need no database: waiting_for, and a target outcome that cannot be read.

use super::*;

#[test]
fn a_deploy_is_never_said_to_wait_for_itself() {
    assert_eq!(
        waiting::others(["a3b2010e", "c0ffee12"].into_iter(), "a3b2010e"),
        ["c0ffee12"],
        "the deploy that just started is not the one it waits for"
    );
    assert!(
        waiting::others(["a3b2010e"].into_iter(), "a3b2010e").is_empty(),
        "alone in its environment, it waits for no deploy"
    );
}

#[test]
fn waiting_for_names_the_limit_that_is_full_and_none_on_an_idle_server() {
    let runs = |queue: &str, executor: &str, running: i64| manent_engine::RunningCount {
        queue: queue.into(),
        group: Some(crate::queues::DEPLOY_LIMIT_GROUP.into()),
        executor_id: Some(executor.into()),
        partition_key: format!("acme/{executor}:prod"),
        running,
    };
    let queue = |worker: i64, total: i64| manent_engine::QueueRecord {
        name: "default".into(),
        kind: "default".into(),
        worker_concurrency: Some(worker),
        partition_concurrency: None,
        global_concurrency: total,
        updated_at_ms: 0,
    };
    let live = ["vm1".to_string(), "vm2".to_string()];
    let cases = [
        (
            "idle",
            vec![],
            queue(2, 0),
            "a worker of queue default to take it: vm1, vm2 serve(s) it with free slots",
        ),
        (
            "every worker at its cap",
            vec![runs("default", "vm1", 2), runs("other", "vm2", 2)],
            queue(2, 0),
            "a free slot on queue default: every worker serving it is at its limit of 2 deploy(s) at once (dbos.concurrency, or the queue's concurrency): vm1 runs 2, vm2 runs 2",
        ),
        (
            "the queue's own cap",
            vec![runs("default", "vm1", 1), runs("default", "vm2", 1)],
            queue(5, 2),
            "a free slot on queue default: its limit of 2 deploy(s) at once (the queue's concurrency) is reached",
        ),
        (
            "the total",
            vec![runs("other", "vm1", 1), runs("default", "vm2", 1)],
            queue(5, 0),
            "a free slot on queue default: 2 deploy(s) run over all deploy queues and its workers (vm1, vm2) have room, so the limit on the total is full (dbos.global_concurrency; `manent queues` shows it)",
        ),
    ];
    for (what, running, registered, expected) in cases {
        assert_eq!(
            waiting::full_limit("default", &live, &running, Some(&registered)),
            expected,
            "{what}"
        );
    }
}

#[test]
fn a_target_outcome_that_cannot_be_read_is_shown_not_dropped() {
    let outcome = recorded_target("d1", "web-1", "{not json");
    assert_eq!(outcome.name, "web-1", "the target is named");
    assert_eq!(
        outcome.status,
        TargetState::Other("unreadable".into()),
        "an unreadable outcome is visible as such"
    );
    assert!(
        outcome
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("cannot be read")),
        "the detail says why: {outcome:?}"
    );
}
