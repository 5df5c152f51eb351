//! A frozen worker's command cannot outlive its hold on the step: a worker frozen with
//! SIGSTOP mid-command, past `recovery.stale_after`, has its command killed by the
//! command's guardian (the dead-man's switch, docs/scaling-and-recovery.md) before a
//! successor runs the step again, and the frozen worker records nothing once continued.
//! Shown from a ledger both commands append to, on both backends.

mod common;

use common::{Site, WAIT};
use manent_testkit::{Db, eventually, on_both_backends, pause_outside_transactions, signal};

on_both_backends!(
    a_frozen_workers_command_stops_before_its_successor_runs_the_step_again_and_never_overlaps,
);

/// How many lines one full run of the command appends.
const LINES: usize = 30;

async fn a_frozen_workers_command_stops_before_its_successor_runs_the_step_again_and_never_overlaps(
    db: Db,
) {
    manent_testkit::init_tracing();
    let mut site = Site::new(db, &[]).await;
    let ledger = common::ledger_path(&site.dir);
    // Six seconds of lines, each naming the shell that wrote it: one run per pid.
    let command = format!(
        "i=0; while [ $i -lt {LINES} ]; do echo \"$$ $i\" >> {ledger}; i=$((i+1)); sleep 0.2; done"
    );
    site.write_command_environment(&command);
    let token = site.token();
    site.start("api", "api");
    let recovering = [("MANENT__RECOVERY__AUTOMATIC", "true")];
    let first = site.start_with("worker", "w1", &recovering);
    site.wait_api().await;
    let (id, _) = site.submit(&token, "acme/web");
    eventually("w1's command runs", WAIT, || async {
        (!site.ledger().is_empty()).then_some(())
    })
    .await;

    // Frozen mid-command (outside a transaction, so the others can go on), past
    // stale_after (3 s): w2 recovers the deploy and runs the step again.
    pause_outside_transactions(&site.children.0[first], &site.db.url).await;
    let frozen_pid = common::ledger_runs(&site.ledger())[0].0.clone();
    site.start_with("worker", "w2", &recovering);
    site.wait_status(&token, &id, "SUCCESS").await;
    signal(&site.children.0[first], "CONT");

    // Each line is `<pid of the command's shell> <n>`: one pid per run.
    let runs = common::ledger_runs(&site.ledger());
    assert!(
        runs.iter().any(|(pid, _)| *pid == frozen_pid),
        "the frozen worker's command wrote first: {runs:?}"
    );
    common::assert_stopped_then_run_once(&runs, LINES, "a frozen worker's command");
    let (_, status) = site.cli(&token, &["status", &id]);
    assert_eq!(
        status["status"], "SUCCESS",
        "the continued worker records nothing over the successor's outcome: {status}"
    );
}
