//! Tasks and roles over real SSH (docs/environments.md, "Tasks and roles", "Release
//! directories", "Irreversible deploys"): tasks before and after activate on the targets of
//! their roles, a `once` task on one target before any is switched, checks by role, what a
//! dry run says, a failing `once` task that switches nothing, the modes of release
//! directories and artifacts, and an irreversible deploy's automatic rollback. Each task and
//! command appends a line to a ledger, which says what ran, where and in which order.

mod ssh_site;

use std::{os::unix::fs::PermissionsExt, path::PathBuf};

use manent_deploy::views::deploy_views;
use manent_engine::WorkflowStatus;
use manent_testkit::Db;
use ssh_site::*;

/// The ledger's path on this machine (every target shares its filesystem).
fn ledger(site: &Site) -> PathBuf {
    site.db.path("ledger")
}

fn ledger_lines(site: &Site) -> Vec<String> {
    std::fs::read_to_string(ledger(site))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Writes the environment: four targets, eu (t1, t2) then us (t3, t4) in waves by region;
/// t1 has the roles db and web, t3 web, the others none. `activate` switches `current` and
/// writes `activate <target>`; `tasks` (YAML list items, indented for `deploy:`) and
/// `extra` (top-level YAML) are added.
fn environment(site: &Site, tasks: &str, extra: &str) {
    let base = path_str(&site.base);
    let ledger = ledger(site);
    let activate = format!(
        "ln -sfn \"$MANENT_VERSION\" \"{base}/$MANENT_TARGET/current\" && echo \"activate \
         $MANENT_TARGET\" >> {}",
        path_str(&ledger)
    );
    environment_activating(site, tasks, extra, &activate);
}

/// As [`environment`], with `activate` as the activate command.
fn environment_activating(site: &Site, tasks: &str, extra: &str, activate: &str) {
    site.write_environment_activating(&site.hosts.known_hosts, "by_region", extra, activate);
    site.edit_environment("{name: t1, ", "{name: t1, roles: [db, web], ");
    site.edit_environment("{name: t3, ", "{name: t3, roles: [web], ");
    site.edit_environment("  activate: ", &format!("  tasks:\n{tasks}  activate: "));
}

/// Submits a deploy of `artifact` to acme/web prod, `irreversible` if given, and waits for
/// its end.
async fn deploy(
    site: &Site,
    worker: &Worker,
    artifact: &Artifact,
    irreversible: Option<&str>,
) -> (manent_engine::WorkflowRecord, deploy_views::DeployStatus) {
    let text = format!(
        "application: acme/web\nenvironment: prod\nartifacts:\n  - {{name: app.bin, type: \
         binary, version: {}, url: {}, sha256: {}}}\n{}",
        q(&artifact.version),
        q(&artifact.url),
        q(&artifact.sha256),
        irreversible
            .map(|reason| format!("irreversible: {}\n", q(reason)))
            .unwrap_or_default(),
    );
    let id = site.submit_text(worker, text).await;
    site.wait_for(worker, &id).await
}

/// The position of the first ledger line equal to `line`.
fn at(lines: &[String], line: &str) -> usize {
    lines
        .iter()
        .position(|l| l == line)
        .unwrap_or_else(|| panic!("`{line}` is in the ledger: {lines:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_run_on_their_roles_around_activate_and_a_once_task_before_any_switch_on_sqlite() {
    tasks_run_on_their_roles_around_activate_and_a_once_task_before_any_switch(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_run_on_their_roles_around_activate_and_a_once_task_before_any_switch_on_postgres() {
    tasks_run_on_their_roles_around_activate_and_a_once_task_before_any_switch(Db::Postgres).await;
}

async fn tasks_run_on_their_roles_around_activate_and_a_once_task_before_any_switch(backend: Db) {
    let site = Site::new(backend, FOUR_TARGETS_TWO_REGIONS).await;
    let ledger = ledger(&site);
    let ledger = path_str(&ledger);
    let base = path_str(&site.base);
    let tasks = format!(
        "    - {{name: migrate, when: before_activate, once: true, roles: [web], run: {}}}\n    \
         - {{name: assets, when: before_activate, roles: [web], run: {}}}\n    - {{name: warm, \
         when: after_activate, run: {}}}\n",
        q(format!(
            "echo \"migrate $MANENT_TARGET $(ls {base}/*/current 2>/dev/null | wc -l)\" >> {ledger}"
        )),
        q(format!(
            "test -f app.bin && echo \"assets $MANENT_TARGET $(pwd) $MANENT_RELEASE\" >> {ledger}"
        )),
        q(format!(
            "echo \"warm $MANENT_TARGET $(readlink {base}/$MANENT_TARGET/current)\" >> {ledger}"
        )),
    );
    let checks = format!(
        "checks:\n  - {{type: command, roles: [db], command: {}}}\n",
        q(format!("echo \"check {{target}}\" >> {ledger}"))
    );
    environment(&site, &tasks, &checks);
    let worker = site.worker(&executor_id("w1")).await;
    let v1 = site.artifact("v1");
    let (record, status) = deploy(&site, &worker, &v1, None).await;
    assert_eq!(
        record.status,
        WorkflowStatus::Success,
        "the deploy succeeds: {:?}\n{status:#?}",
        record.error
    );
    let lines = ledger_lines(&site);
    // The once task: on t1 (the first web target in rollout order), once, with no
    // target switched yet (no `current` link anywhere).
    let migrations: Vec<&String> = lines.iter().filter(|l| l.starts_with("migrate")).collect();
    assert_eq!(
        migrations,
        ["migrate t1 0"],
        "the once task ran once, on t1, before any target had a current release: {lines:#?}"
    );
    let first_activate = lines
        .iter()
        .position(|l| l.starts_with("activate"))
        .unwrap();
    assert!(
        at(&lines, "migrate t1 0") < first_activate,
        "the once task ran before any activate: {lines:#?}"
    );
    // Before activate, from the release: only on the web targets.
    for (t, runs) in [("t1", true), ("t2", false), ("t3", true), ("t4", false)] {
        let release = site.base.join(t).join("v1");
        let release = path_str(&release);
        let assets = format!("assets {t} {release} {release}");
        assert_eq!(
            lines.contains(&assets),
            runs,
            "assets runs from the release directory (cwd and MANENT_RELEASE, its files in \
             place) on the web targets only; {t}: {lines:#?}"
        );
        if runs {
            assert!(
                at(&lines, &assets) < at(&lines, &format!("activate {t}")),
                "before activate on {t}: {lines:#?}"
            );
        }
        // After activate, on every target, seeing the new release live, before the checks.
        let warm = format!("warm {t} v1");
        assert!(
            at(&lines, &format!("activate {t}")) < at(&lines, &warm),
            "after activate on {t}: {lines:#?}"
        );
        assert_eq!(
            lines.contains(&format!("check {t}")),
            t == "t1",
            "the check of role db runs on t1 only; {t}: {lines:#?}"
        );
        if t == "t1" {
            assert!(
                at(&lines, &warm) < at(&lines, "check t1"),
                "a task after activate runs before the checks: {lines:#?}"
            );
        }
    }
    assert_eq!(
        step(&status, "t1: task migrate").status,
        deploy_views::StepState::Success,
        "the once task is a step of its own, named after its target"
    );
    assert_eq!(
        status
            .steps
            .iter()
            .filter(|s| s.name.starts_with("t1: upload"))
            .count(),
        1,
        "t1's release was put in place once, before the once task, not again in its wave: \
         {:#?}",
        status.steps
    );
    assert_eq!(
        target(&status, "t1").roles,
        ["db", "web"],
        "status shows each target's roles"
    );

    // A second deploy runs the once task again (once per deploy, not once ever).
    let v2 = site.artifact("v2");
    let (record, _) = deploy(&site, &worker, &v2, None).await;
    assert_eq!(record.status, WorkflowStatus::Success, "{:?}", record.error);
    let migrations = ledger_lines(&site)
        .iter()
        .filter(|l| l.starts_with("migrate"))
        .count();
    assert_eq!(migrations, 2, "each deploy runs its once task once");
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_lists_the_tasks_each_target_would_run_and_runs_none() {
    let site = Site::new(Db::Sqlite, FOUR_TARGETS_TWO_REGIONS).await;
    let ledger = ledger(&site);
    let tasks = format!(
        "    - {{name: migrate, when: before_activate, once: true, roles: [db], run: {}}}\n    \
         - {{name: warm, when: after_activate, roles: [web], run: {}}}\n",
        q(format!("echo migrate >> {}", path_str(&ledger))),
        q(format!("echo warm >> {}", path_str(&ledger))),
    );
    environment(&site, &tasks, "");
    let worker = site.worker(&executor_id("w1")).await;
    let v1 = site.artifact("v1");
    let (record, status) = site.deploy(&worker, &v1, &v1.sha256, true).await;
    assert_eq!(record.status, WorkflowStatus::Success, "{:?}", record.error);
    assert!(
        ledger_lines(&site).is_empty(),
        "a dry run runs no task: {:?}",
        ledger_lines(&site)
    );
    let detail = |t: &str| target(&status, t).detail.clone().unwrap_or_default();
    let release = site.base.join("t1/v1");
    assert!(
        detail("t1").contains(&format!(
            "would run task migrate once before any target is switched, from {}",
            path_str(&release)
        )) && detail("t1").contains("would run task warm after activate"),
        "t1 (db, web) would run both: {}",
        detail("t1")
    );
    assert!(
        !detail("t3").contains("migrate") && detail("t3").contains("would run task warm"),
        "t3 (web) would run warm only: {}",
        detail("t3")
    );
    assert!(
        !detail("t2").contains("would run task"),
        "t2 has no role: {}",
        detail("t2")
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_once_task_fails_the_deploy_with_no_target_switched() {
    let site = Site::new(Db::Sqlite, FOUR_TARGETS_TWO_REGIONS).await;
    let tasks = format!(
        "    - {{name: migrate, when: before_activate, once: true, roles: [db], run: {}}}\n",
        q("echo 'relation users is locked' >&2; exit 3")
    );
    environment(&site, &tasks, "");
    let worker = site.worker(&executor_id("w1")).await;
    let v1 = site.artifact("v1");
    let (record, status) = deploy(&site, &worker, &v1, None).await;
    assert_eq!(record.status, WorkflowStatus::Error, "{status:#?}");
    let error = record.error.clone().unwrap_or_default();
    assert!(
        error.contains("task migrate") && error.contains("relation users is locked"),
        "the error names the task and what it printed: {error}"
    );
    assert!(
        !ledger_lines(&site)
            .iter()
            .any(|l| l.starts_with("activate")),
        "no activate ran: {:?}",
        ledger_lines(&site)
    );
    for i in 0..4 {
        assert_eq!(
            current_of(site.root(i)),
            None,
            "{} was never switched",
            target_name(i)
        );
    }
    assert_eq!(
        target(&status, "t1").status,
        "failed",
        "the once task's target failed: {status:#?}"
    );
    assert_eq!(
        target(&status, "t3").status,
        "pending",
        "the others were never deployed"
    );
    worker.stop().await;
}

/// The permission bits of `path`.
fn mode_of(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_directories_follow_the_umask_unless_deploy_mode_sets_them() {
    let site = Site::new(Db::Sqlite, TWO_TARGETS_TWO_REGIONS).await;
    site.write_environment(&site.hosts.known_hosts, "all", "");
    // The sshd (and so the target user's commands) has this process's umask.
    let umask = std::process::Command::new("sh")
        .args(["-c", "umask"])
        .output()
        .expect("run sh");
    let umask = u32::from_str_radix(String::from_utf8_lossy(&umask.stdout).trim(), 8).unwrap();
    let worker = site.worker(&executor_id("w1")).await;
    let v1 = site.artifact("v1");
    let (record, _) = site.deploy(&worker, &v1, &v1.sha256, false).await;
    assert_eq!(record.status, WorkflowStatus::Success, "{:?}", record.error);
    let release = site.root(0).join("v1");
    assert_eq!(
        (mode_of(&release), mode_of(&release.join("app.bin"))),
        (0o777 & !umask, 0o666 & !umask),
        "the release directory and its artifact follow the umask {umask:04o} (0755 and 0644 \
         under 022), not the worker's private copy (0600)"
    );

    site.edit_environment("  activate: ", "  mode: \"0750\"\n  activate: ");
    let v2 = site.artifact("v2");
    let (record, _) = site.deploy(&worker, &v2, &v2.sha256, false).await;
    assert_eq!(record.status, WorkflowStatus::Success, "{:?}", record.error);
    let release = site.root(0).join("v2");
    assert_eq!(
        (mode_of(&release), mode_of(&release.join("app.bin"))),
        (0o750, 0o640),
        "deploy.mode sets the release directory, and its artifact reads alike"
    );
    assert_eq!(
        mode_of(&site.root(0)),
        0o755,
        "the directory holding the releases keeps its own mode"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_irreversible_deploy_whose_once_task_succeeded_is_not_rolled_back_unless_allowed()
{
    let site = Site::new(Db::Sqlite, FOUR_TARGETS_TWO_REGIONS).await;
    let base = path_str(&site.base);
    let tasks = format!(
        "    - {{name: migrate, when: before_activate, once: true, roles: [db], run: {}}}\n",
        q(format!("echo migrate >> {}", path_str(&ledger(&site))))
    );
    // Version `bad` fails its activate, after switching `current`, on every target.
    let activate = format!(
        "ln -sfn \"$MANENT_VERSION\" \"{base}/$MANENT_TARGET/current\" && [ \"$MANENT_VERSION\" != bad ]"
    );
    environment_activating(&site, &tasks, "", &activate);
    let worker = site.worker(&executor_id("w1")).await;
    let good = site.artifact("good");
    let (record, _) = deploy(&site, &worker, &good, None).await;
    assert_eq!(record.status, WorkflowStatus::Success, "{:?}", record.error);

    let bad = site.artifact("bad");
    let (record, status) = deploy(&site, &worker, &bad, Some("drops the column users.name")).await;
    assert_eq!(record.status, WorkflowStatus::Error, "{status:#?}");
    let error = record.error.clone().unwrap_or_default();
    assert!(
        error.contains("not rolled back")
            && error.contains("drops the column users.name")
            && error.contains("migrate on t1"),
        "the error says why the old code was not put back: {error}"
    );
    for i in 0..2 {
        assert_eq!(
            current_of(site.root(i)),
            Some(PathBuf::from("bad")),
            "{} is left as it is",
            target_name(i)
        );
        let detail = target(&status, &target_name(i)).detail.clone();
        assert!(
            detail
                .as_deref()
                .is_some_and(|d| d.contains("not rolled back")),
            "each switched target says why: {detail:?}"
        );
    }

    site.edit_environment("rollout:", "rollback: {past_irreversible: true}\nrollout:");
    let (record, _) = deploy(&site, &worker, &bad, Some("drops the column users.name")).await;
    assert_eq!(
        record.status,
        WorkflowStatus::Error,
        "the deploy failed: {:?}",
        record.error
    );
    for i in 0..2 {
        assert_eq!(
            current_of(site.root(i)),
            Some(PathBuf::from("good")),
            "past_irreversible: the rollback reactivates the previous version on {}",
            target_name(i)
        );
    }
    worker.stop().await;
}
