//! Deploys over real SSH: the deploy workflow on an in-process engine, its targets real
//! OpenSSH servers on loopback addresses (the testkit's `SshHosts`, through `ssh_site`).
//! Waves, parallelism, checksums, strict host keys, failing checks with rollback, dry runs,
//! a deploy resumed on another worker that lacks the artifact, and a cancelled deploy's
//! commands and work directory. Release directories are in `ssh_releases.rs`.

mod ssh_site;

use std::{path::PathBuf, time::Duration};

use manent_deploy::{run::artifacts, views::deploy_views};
use manent_engine::WorkflowStatus;
use manent_testkit::{Db, process_gone};
use ssh_site::*;

// ---- the tests ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_targets_in_two_regions_are_deployed_wave_by_wave_on_sqlite() {
    four_targets_in_two_regions_are_deployed_wave_by_wave(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_targets_in_two_regions_are_deployed_wave_by_wave_on_postgres() {
    four_targets_in_two_regions_are_deployed_wave_by_wave(Db::Postgres).await;
}

async fn four_targets_in_two_regions_are_deployed_wave_by_wave(backend: Db) {
    let site = Site::new(backend, FOUR_TARGETS_TWO_REGIONS).await;
    site.write_environment(&site.hosts.known_hosts, "by_region", "");
    let worker = site.worker(&executor_id("w1")).await;
    let v1 = site.artifact("v1");

    let (record, status) = site.deploy(&worker, &v1, &v1.sha256, false).await;

    assert_eq!(
        record.status,
        WorkflowStatus::Success,
        "every target is reachable and accepts the artifact, so the deploy succeeds: {:?}\n{status:#?}",
        record.error
    );
    assert_eq!(
        status.status,
        WorkflowStatus::Success,
        "the status view agrees with the record"
    );
    for i in 0..4 {
        let name = target_name(i);
        let root = site.root(i);
        let placed = root.join("v1/app.bin");
        assert_eq!(
            file_sha256(&placed).as_deref(),
            Some(v1.sha256.as_str()),
            "{name} holds the artifact at <dest>/<name> with the submitted sha256"
        );
        let leftovers: Vec<_> = files_under(&root)
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "part"))
            .collect();
        assert!(
            leftovers.is_empty(),
            "the upload's .part file is renamed into place, none is left on {name}: {leftovers:?}"
        );
        assert_eq!(
            current_of(root),
            Some(PathBuf::from("v1")),
            "activate ran on {name} with MANENT_TARGET and MANENT_VERSION, switching current to v1"
        );
        assert_eq!(
            target(&status, &name).status,
            "deployed",
            "the status shows {name} deployed"
        );
        for s in [
            format!("{name}: upload app.bin"),
            format!("{name}: activate"),
        ] {
            assert_eq!(
                step(&status, &s).status,
                deploy_views::StepState::Success,
                "each target has its own durable upload and activate steps"
            );
        }
    }
    assert_eq!(
        step(&status, "fetch app.bin").attempts,
        1,
        "the artifact is fetched and verified once for all targets"
    );
    // by_region: t1 and t2 (eu) form the first wave, t3 and t4 (us) the second.
    let wave_one_done = ["t1", "t2"]
        .iter()
        .map(|t| {
            step(&status, &format!("{t}: activate"))
                .finished_at
                .clone()
                .expect("a finished step has its end time")
        })
        .max()
        .unwrap();
    for t in ["t3", "t4"] {
        let started = &step(&status, &format!("{t}: upload app.bin")).started_at;
        assert!(
            *started >= wave_one_done,
            "the us wave starts only after the eu wave is done: {t} started at {started}, \
             the eu wave ended at {wave_one_done}"
        );
    }
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_sha256_fails_the_deploy_before_anything_reaches_a_target() {
    let site = Site::new(Db::Sqlite, TWO_TARGETS_TWO_REGIONS).await;
    site.write_environment(&site.hosts.known_hosts, "by_region", "");
    let worker = site.worker(&executor_id("w1")).await;
    let v1 = site.artifact("v1");
    let wrong = sha256_hex(b"not the artifact");

    let (record, status) = site.deploy(&worker, &v1, &wrong, false).await;

    assert_eq!(
        record.status,
        WorkflowStatus::Error,
        "an artifact whose content does not match its sha256 fails the deploy: {status:#?}"
    );
    let error = record.error.clone().unwrap_or_default();
    assert!(
        error.contains("sha256 mismatch"),
        "the error says why: the checksum does not match, got {error:?}"
    );
    for i in 0..site.placements.len() {
        let files = files_under(&site.root(i));
        assert!(
            files.is_empty(),
            "the fetch fails before any upload, so nothing exists on {}: {files:?}",
            target_name(i)
        );
    }
    assert!(
        !status.steps.iter().any(|s| s.name.contains("upload")),
        "no upload step ever started: {:#?}",
        status.steps
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_with_an_unknown_host_key_fails_and_so_does_the_deploy() {
    let site = Site::new(Db::Sqlite, TWO_TARGETS_TWO_REGIONS).await;
    // t2's host is missing from known_hosts; both targets are in one wave.
    let known_hosts = site.hosts.known_hosts_without(1);
    site.write_environment(&known_hosts, "all", "");
    let worker = site.worker(&executor_id("w1")).await;
    let v1 = site.artifact("v1");

    let (record, status) = site.deploy(&worker, &v1, &v1.sha256, false).await;

    assert_eq!(
        record.status,
        WorkflowStatus::Error,
        "a target that cannot be reached safely fails the deploy: {status:#?}"
    );
    let t2 = target(&status, "t2");
    assert_eq!(
        t2.status, "failed",
        "strict host-key checking refuses t2, whose key is not in known_hosts"
    );
    let detail = t2.detail.clone().unwrap_or_default();
    assert!(
        detail.contains("host key") && detail.contains(&site.hosts.hosts[1].addr),
        "t2's outcome names the host and says its host key is unknown: {detail:?}"
    );
    assert!(
        record.error.as_deref().unwrap_or_default().contains("t2"),
        "the deploy's error names the failed target: {:?}",
        record.error
    );
    assert!(
        !site.root(1).join("v1").exists(),
        "nothing was written to the refused host"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_whose_activate_switched_then_failed_is_rolled_back_with_its_placeholders_and_a_first_deploy_has_nothing_to_return_to()
 {
    let site = Site::new(Db::Sqlite, TWO_TARGETS_TWO_REGIONS).await;
    let base = path_str(&site.base);
    // Switches `current`, then fails on t2 for any version but v1: t2 runs the new
    // version although its activate step failed. Written with placeholders, which the
    // rollback's activate must expand with the version it returns to (docs/environments.md,
    // "Placeholders in commands").
    let activate = format!(
        "ln -sfn {{version}} \"{base}\"/{{target}}/current && \
         {{ [ {{version}} = v1 ] || [ {{target}} != t2 ]; }}"
    );
    site.write_environment_activating(&site.hosts.known_hosts, "all", "", &activate);
    let worker = site.worker(&executor_id("w1")).await;

    let v2 = site.artifact("v2");
    let (first, status) = site.deploy(&worker, &v2, &v2.sha256, false).await;
    assert_eq!(
        first.status,
        WorkflowStatus::Error,
        "t2's activate fails: {status:#?}"
    );
    for name in ["t1", "t2"] {
        let t = target(&status, name);
        assert_ne!(
            t.status, "rolled_back",
            "a first deploy has nothing to roll {name} back to, so it is not called rolled back"
        );
        assert!(
            t.detail
                .as_deref()
                .unwrap_or_default()
                .contains("no earlier successful deploy"),
            "{name}'s outcome says there was nothing to return to: {:?}",
            t.detail
        );
    }
    let error = first.error.clone().unwrap_or_default();
    assert!(
        !error.contains("wave"),
        "with one wave, no later wave is said to be left out: {error}"
    );

    let v1 = site.artifact("v1");
    let (ok, status) = site.deploy(&worker, &v1, &v1.sha256, false).await;
    assert_eq!(
        ok.status,
        WorkflowStatus::Success,
        "v1 activates everywhere: {status:#?}"
    );

    let (again, status) = site.deploy(&worker, &v2, &v2.sha256, false).await;
    assert_eq!(
        again.status,
        WorkflowStatus::Error,
        "t2's activate fails again: {status:#?}"
    );
    for i in 0..2 {
        let name = target_name(i);
        let t = target(&status, &name);
        assert_eq!(
            t.status, "rolled_back",
            "{name} ran v2 (t2 although its activate failed), and went back to v1: {t:?}"
        );
        assert_eq!(
            current_of(site.root(i)),
            Some(PathBuf::from("v1")),
            "{name}'s current points at v1 again"
        );
    }
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_check_stops_the_rollout_and_rolls_the_first_wave_back() {
    let site = Site::new(Db::Sqlite, FOUR_TARGETS_TWO_REGIONS).await;
    // Passes for v1, fails for any other version: the check sees MANENT_VERSION.
    site.write_environment(
        &site.hosts.known_hosts,
        "by_region",
        "checks:\n  - {name: version-is-v1, type: command, command: 'test \"$MANENT_VERSION\" = v1', retries: 0}\n",
    );
    let worker = site.worker(&executor_id("w1")).await;
    let v1 = site.artifact("v1");
    let (first, status) = site.deploy(&worker, &v1, &v1.sha256, false).await;
    assert_eq!(
        first.status,
        WorkflowStatus::Success,
        "v1 passes its check everywhere, giving the next deploy a previous version: {status:#?}"
    );

    let v2 = site.artifact("v2");
    let (second, status) = site.deploy(&worker, &v2, &v2.sha256, false).await;

    assert_eq!(
        second.status,
        WorkflowStatus::Error,
        "v2 fails its check in the first wave, so the deploy fails: {status:#?}"
    );
    let error = second.error.clone().unwrap_or_default();
    assert!(
        error.contains("version-is-v1"),
        "the deploy's error names the failing check: {error:?}"
    );
    for i in 0..2 {
        let name = target_name(i);
        let t = target(&status, &name);
        assert_eq!(
            t.status, "rolled_back",
            "{name} was switched to v2 in wave 1, then the rollback re-activated v1"
        );
        assert!(
            t.detail
                .as_deref()
                .unwrap_or_default()
                .contains("re-activated v1"),
            "{name}'s outcome says which version it went back to: {:?}",
            t.detail
        );
        assert_eq!(
            current_of(site.root(i)),
            Some(PathBuf::from("v1")),
            "{name}'s current points at v1 again after the rollback"
        );
        assert_eq!(
            step(
                &status,
                &format!("{name}: check version-is-v1 after reactivating v1")
            )
            .status,
            deploy_views::StepState::Success,
            "the rollback checks {name} after reactivating v1 (workflow version 4)"
        );
    }
    for i in 2..4 {
        let name = target_name(i);
        assert!(
            !site.root(i).join("v2").exists(),
            "the rollout stopped after wave 1, so wave 2's {name} never received v2"
        );
        assert_eq!(
            current_of(site.root(i)),
            Some(PathBuf::from("v1")),
            "{name} keeps running v1"
        );
        assert_eq!(
            target(&status, &name).status,
            "pending",
            "{name} was never touched by the failed deploy"
        );
        assert!(
            !status
                .steps
                .iter()
                .any(|s| s.name.starts_with(&format!("{name}:"))),
            "no step ran for {name}: {:#?}",
            status.steps
        );
    }
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_plans_every_target_and_changes_nothing() {
    let site = Site::new(Db::Sqlite, TWO_TARGETS_TWO_REGIONS).await;
    site.write_environment(&site.hosts.known_hosts, "by_region", "");
    let worker = site.worker(&executor_id("w1")).await;
    let v1 = site.artifact("v1");

    let (record, status) = site.deploy(&worker, &v1, &v1.sha256, true).await;

    assert_eq!(
        record.status,
        WorkflowStatus::Success,
        "every target is reachable with room to spare, so the plan succeeds: {status:#?}"
    );
    assert!(status.dry_run, "the status says it was a dry run");
    for i in 0..site.placements.len() {
        let name = target_name(i);
        let t = target(&status, &name);
        assert_eq!(
            t.status, "planned",
            "a dry run plans {name}, it does not deploy it"
        );
        let expected = format!("would upload {}/{name}/v1/app.bin", site.base.display());
        let detail = t.detail.clone().unwrap_or_default();
        assert!(
            detail.contains(&expected),
            "{name}'s plan says what would change ({expected}): {detail:?}"
        );
        let files = files_under(&site.root(i));
        assert!(
            files.is_empty(),
            "a dry run creates nothing on {name}: {files:?}"
        );
    }
    assert!(
        !status
            .steps
            .iter()
            .any(|s| s.name.contains("upload") || s.name.contains("activate")),
        "a dry run has no upload or activate step: {:#?}",
        status.steps
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_resumed_on_another_worker_fetches_and_verifies_the_artifact_again() {
    let site = Site::new(Db::Sqlite, TWO_TARGETS_TWO_REGIONS).await;
    // Wave 1 is t1 (eu), wave 2 is t2 (us). t1's first check makes its mark and never ends,
    // which holds the deploy on worker A after the fetch and t1's upload; every later
    // check passes.
    let held = site.base.join("t1-check-held");
    site.write_environment(
        &site.hosts.known_hosts,
        "by_region",
        &format!(
            "checks:\n  - {{name: health, type: command, command: 'if [ \"$MANENT_TARGET\" = t1 ] \
             && mkdir {} 2>/dev/null; then exec sleep 3600; fi', retries: 0, timeout: 1h}}\n",
            held.display()
        ),
    );
    let a = site.worker(&executor_id("a")).await;
    let v1 = site.artifact("v1");
    let id = site.submit(&a, &v1, &v1.sha256, false).await;
    manent_testkit::eventually("worker A reaches t1's check", WAIT, || async {
        held.is_dir().then_some(())
    })
    .await;

    // Worker A goes away mid-deploy, and its copy of the artifact with it.
    let a_id = a.engine.executor_id().to_string();
    let a_dir = artifacts::deploy_dir(&a.workdir, &id);
    assert!(
        artifacts::artifacts_dir(&a_dir).join("app.bin").exists(),
        "worker A fetched the artifact before uploading it to t1"
    );
    let report = a.engine.shutdown(Duration::ZERO).await;
    assert_eq!(
        report.left_pending,
        vec![id.clone()],
        "the deploy held in t1's check is left pending when A stops"
    );
    std::fs::remove_dir_all(&a_dir).expect("remove worker A's copy of the artifact");

    let b = site.worker(&executor_id("b")).await;
    let b_dir = artifacts::deploy_dir(&b.workdir, &id);
    site.work_dirs.lock().unwrap().push(b_dir.clone());
    assert!(
        !b_dir.exists(),
        "worker B has no copy of the artifact before it takes the deploy over"
    );
    let recovered = b
        .engine
        .client()
        .recover_executor(&a_id, false, "test")
        .await
        .expect("recover worker A's deploys");
    assert_eq!(
        recovered,
        vec![id.clone()],
        "A's pending deploy is handed over"
    );
    let client = b.engine.client();
    let record = client
        .wait(&id, WAIT)
        .await
        .unwrap_or_else(|e| panic!("deploy {id} ends: {e}\n{}", site.hosts.logs()));
    let status = deploy_views::status(&client, &id).await.unwrap().unwrap();

    assert_eq!(
        record.status,
        WorkflowStatus::Success,
        "worker B finishes the deploy: {:?}\n{status:#?}",
        record.error
    );
    assert_eq!(
        record.executor_id.as_deref(),
        Some(b.engine.executor_id()),
        "the deploy ended on worker B"
    );
    let fetch = step(&status, "fetch app.bin");
    assert_eq!(
        (fetch.executor_id.as_str(), fetch.attempts),
        (a_id.as_str(), 1),
        "the recorded fetch step is not rerun by B"
    );
    assert_eq!(
        step(&status, "t1: upload app.bin").executor_id,
        a_id,
        "t1's upload, done by A, is not redone"
    );
    assert_eq!(
        step(&status, "t1: check health").attempts,
        2,
        "t1's check ran on A, cut short, and again on B: two attempts"
    );
    assert_eq!(
        step(&status, "t2: upload app.bin").executor_id,
        b.engine.executor_id(),
        "wave 2 ran on worker B"
    );
    // B uploaded t2's copy (verified below), so it fetched the artifact again; its
    // directory for the deploy is gone once the deploy ended.
    assert!(
        !b_dir.exists(),
        "worker B removes its working directory of the deploy when the deploy ends"
    );
    for i in 0..2 {
        assert_eq!(
            file_sha256(&site.root(i).join("v1/app.bin")).as_deref(),
            Some(v1.sha256.as_str()),
            "{} holds the verified artifact",
            target_name(i)
        );
        assert_eq!(
            target(&status, &target_name(i)).status,
            "deployed",
            "{} is deployed",
            target_name(i)
        );
    }
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_deploy_kills_its_local_and_remote_commands_on_sqlite() {
    cancelling_a_deploy_kills_its_local_and_remote_commands(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_deploy_kills_its_local_and_remote_commands_on_postgres() {
    cancelling_a_deploy_kills_its_local_and_remote_commands(Db::Postgres).await;
}

async fn cancelling_a_deploy_kills_its_local_and_remote_commands(backend: Db) {
    let site = Site::new(backend, TWO_TARGETS_TWO_REGIONS).await;
    let pids = site.db.path("pids");
    std::fs::create_dir_all(&pids).expect("create the pid directory");
    // t1 over SSH, t2 on the worker itself; each command starts a `sleep` it waits for.
    let h = &site.hosts.hosts[0];
    let text = format!(
        "targets:\n  - {{name: t1, host: {}, port: {}, user: {}}}\n  - {{name: t2, host: local}}\n\
         ssh: {{key: {}, known_hosts: {}}}\n\
         deploy:\n  plugin: command\n  commands:\n    - {}\n\
         rollout: {{max_parallel: 2}}\n",
        q(&h.addr),
        h.port,
        q(&site.hosts.user),
        q(path_str(&site.hosts.client_key)),
        q(path_str(&site.hosts.known_hosts)),
        q(format!(
            "sleep 600 & echo $! > {dir}/$MANENT_TARGET.tmp && mv {dir}/$MANENT_TARGET.tmp {dir}/$MANENT_TARGET.pid; wait",
            dir = path_str(&pids)
        )),
    );
    std::fs::write(site.source.join("acme/web/prod.yml"), text)
        .expect("write the environment file");
    let worker = site.worker(&executor_id("cancel")).await;
    let v1 = site.artifact("v1");
    let id = site.submit(&worker, &v1, &v1.sha256, false).await;

    let mut running = Vec::new();
    for target in ["t1", "t2"] {
        let file = pids.join(format!("{target}.pid"));
        let pid = manent_testkit::eventually(&format!("{target}'s command runs"), WAIT, || async {
            std::fs::read_to_string(&file)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
        })
        .await;
        assert!(
            !process_gone(pid),
            "{target}'s command runs before the cancel"
        );
        running.push((target, pid));
    }
    let client = worker.engine.client();
    let work_dir = artifacts::deploy_dir(&worker.workdir, &id);
    assert!(
        work_dir.is_dir(),
        "the running deploy has its work directory {}",
        work_dir.display()
    );
    assert_eq!(
        client.cancel(&id).await.expect("cancel the deploy"),
        WorkflowStatus::Cancelled,
        "the deploy is cancelled"
    );
    for (target, pid) in running {
        manent_testkit::eventually(
            &format!("{target}'s command is killed by the cancel"),
            WAIT,
            || async { process_gone(pid).then_some(()) },
        )
        .await;
    }
    manent_testkit::eventually("the worker stops the cancelled run", WAIT, || async {
        (worker.engine.running_count() == 0).then_some(())
    })
    .await;
    manent_testkit::eventually(
        "the cancelled deploy's work directory is removed",
        WAIT,
        || async { (!work_dir.exists()).then_some(()) },
    )
    .await;
    let status = deploy_views::status(&client, &id).await.unwrap().unwrap();
    for name in ["t1", "t2"] {
        assert_eq!(
            target(&status, name).status,
            "cancelled",
            "{name} is recorded as cancelled, not left deploying"
        );
    }
    worker.stop().await;
}
