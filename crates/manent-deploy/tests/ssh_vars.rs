//! Variables, secrets and templates over real SSH (docs/environments.md, "Variables",
//! "Secret providers", "Templates"): scoped values per region reaching `activate`, a
//! `command` secret and an `age` secret rendered into templates written with their modes,
//! the secret masked in output, errors and events, a secret that cannot be read failing the
//! deploy before any target changes, and a template naming an unknown variable refused at
//! submission.

mod ssh_site;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use manent_deploy::views::deploy_views;
use manent_engine::WorkflowStatus;
use manent_testkit::Db;
use ssh_site::*;

/// The secret a `command` provider prints (it reads it from a file beside the environment
/// file), and the one an age file holds.
const COMMAND_SECRET: &str = "cmd-s3cret-value";
const AGE_SECRET: &str = "age-s3cret-value";

const TEMPLATE: &str = "DB_HOST={{ DB_HOST }}\nTOKEN={{ TOKEN }}\nAPI_KEY={{ API_KEY }}\n\
                        TARGET={{ MANENT_TARGET }} VERSION={{ MANENT_VERSION }}\n";

/// Writes beside the environment file: the template, the file the `command` provider
/// reads, and `api.age` encrypted to an identity made here (written outside the source).
/// Returns the `secrets:` and `templates:` YAML.
fn write_vars_files(site: &Site, token_command: &str) -> String {
    use age::secrecy::ExposeSecret;
    use std::io::Write;
    let dir = site.source.join("acme/web");
    std::fs::write(dir.join("app.env.j2"), TEMPLATE).unwrap();
    std::fs::write(dir.join("token.txt"), format!("{COMMAND_SECRET}\n")).unwrap();
    let identity = age::x25519::Identity::generate();
    let key = site.db.path("worker-age.key");
    std::fs::write(&key, format!("{}\n", identity.to_string().expose_secret())).unwrap();
    let recipient = identity.to_public();
    let encryptor =
        age::Encryptor::with_recipients(std::iter::once(&recipient as &dyn age::Recipient))
            .unwrap();
    let mut sealed = Vec::new();
    let armor = age::armor::ArmoredWriter::wrap_output(&mut sealed, age::armor::Format::AsciiArmor)
        .unwrap();
    let mut writer = encryptor.wrap_output(armor).unwrap();
    writer
        .write_all(format!("{AGE_SECRET}\n").as_bytes())
        .unwrap();
    writer.finish().unwrap().finish().unwrap();
    std::fs::write(dir.join("api.age"), sealed).unwrap();
    format!(
        "variables: {{DB_HOST: db.internal, GREETING: hello}}\n\
         scoped_variables:\n  - {{match: {{region: us}}, variables: {{DB_HOST: db.us.internal}}}}\n\
         secrets:\n  TOKEN: {{command: {}}}\n  API_KEY: {{age: api.age, identity: {}}}\n\
         templates:\n  - {{src: app.env.j2, dest: config/app.env, mode: \"0640\"}}\n  \
         - {{src: app.env.j2, dest: app.env}}\n",
        q(token_command),
        q(path_str(&key)),
    )
}

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{} exists: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Everything a user is shown of a deploy: its status (targets, steps, error) and its logs
/// with what its commands printed.
async fn everything_shown(worker: &Worker, id: &str) -> String {
    let client = worker.engine.client();
    let status = deploy_views::status(&client, id)
        .await
        .expect("read the status")
        .expect("the deploy exists");
    let logs = deploy_views::logs(&client, id, true)
        .await
        .expect("read the logs")
        .expect("the deploy has logs");
    format!("{status:#?}\n{}", logs.lines.join("\n"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variables_secrets_and_templates_reach_each_target_masked_everywhere_on_sqlite() {
    variables_secrets_and_templates_reach_each_target_masked_everywhere(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variables_secrets_and_templates_reach_each_target_masked_everywhere_on_postgres() {
    variables_secrets_and_templates_reach_each_target_masked_everywhere(Db::Postgres).await;
}

async fn variables_secrets_and_templates_reach_each_target_masked_everywhere(backend: Db) {
    let site = Site::new(backend, TWO_TARGETS_TWO_REGIONS).await;
    let extra = write_vars_files(&site, "cat token.txt");
    let base = path_str(&site.base).to_owned();
    let activate = format!(
        "ln -sfn \"$MANENT_VERSION\" \"{base}/$MANENT_TARGET/current\" && echo \"token $TOKEN \
         on $MANENT_TARGET\" && printf '%s' \"$DB_HOST $GREETING\" > \"{base}/$MANENT_TARGET/seen\""
    );
    site.write_environment_activating(&site.hosts.known_hosts, "all", &extra, &activate);
    let worker = site.worker(&executor_id("vars")).await;
    let v1 = site.artifact("v1");

    let (record, status) = site.deploy(&worker, &v1, &v1.sha256, false).await;
    assert_eq!(
        record.status,
        WorkflowStatus::Success,
        "the secrets are readable and the templates render: {:?}\n{status:#?}",
        record.error
    );
    for (i, db_host) in [(0, "db.internal"), (1, "db.us.internal")] {
        let name = target_name(i);
        let release = site.root(i).join("v1");
        let expected = format!(
            "DB_HOST={db_host}\nTOKEN={COMMAND_SECRET}\nAPI_KEY={AGE_SECRET}\nTARGET={name} \
             VERSION=v1\n"
        );
        for file in ["config/app.env", "app.env"] {
            assert_eq!(
                std::fs::read_to_string(release.join(file)).ok().as_deref(),
                Some(expected.as_str()),
                "{name}'s {file} is rendered with its region's DB_HOST, both secrets and its \
                 MANENT_* values"
            );
        }
        assert_eq!(
            mode_of(&release.join("config/app.env")),
            0o640,
            "{name}: the mode written"
        );
        assert_eq!(
            mode_of(&release.join("app.env")),
            0o600,
            "{name}: the default mode"
        );
        assert_eq!(
            std::fs::read_to_string(site.root(i).join("seen"))
                .ok()
                .as_deref(),
            Some(format!("{db_host} hello").as_str()),
            "activate on {name} sees its variables as environment variables"
        );
        let leftovers: Vec<_> = files_under(&site.root(i))
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "part"))
            .collect();
        assert!(
            leftovers.is_empty(),
            "no .part is left on {name}: {leftovers:?}"
        );
        let written = step(&status, &format!("{name}: template config/app.env"));
        assert_eq!(
            written.status,
            deploy_views::StepState::Success,
            "each template is a step of its own: {written:?}"
        );
    }
    let resolved = step(&status, "resolve secrets and templates");
    assert!(
        resolved.status == deploy_views::StepState::Success,
        "the resolution is a step, recorded without values: {resolved:?}"
    );
    let shown = everything_shown(&worker, &status.id).await;
    assert!(
        shown.contains("token *** on t1"),
        "activate's output shows the secret masked:\n{shown}"
    );
    for secret in [COMMAND_SECRET, AGE_SECRET] {
        assert!(
            !shown.contains(secret),
            "nothing shown holds the secret {secret}:\n{shown}"
        );
    }

    // A failing activate that prints the secret on stderr: the error, the target's detail
    // and its event quote stderr, masked.
    site.edit_environment(
        "&& echo \\\"token $TOKEN on $MANENT_TARGET\\\"",
        "&& echo \\\"token $TOKEN\\\" >&2 && exit 7",
    );
    let v2 = site.artifact("v2");
    let (record, status) = site.deploy(&worker, &v2, &v2.sha256, false).await;
    assert_eq!(
        record.status,
        WorkflowStatus::Error,
        "activate fails on purpose: {status:#?}"
    );
    let shown = everything_shown(&worker, &status.id).await;
    assert!(
        shown.contains("token ***"),
        "the failure quotes stderr with the secret masked:\n{shown}"
    );
    assert!(
        !shown.contains(COMMAND_SECRET) && !shown.contains(AGE_SECRET),
        "no error or event holds a secret:\n{shown}"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_that_cannot_be_read_fails_the_deploy_before_any_target_changes_on_sqlite() {
    a_secret_that_cannot_be_read_fails_the_deploy_before_any_target_changes(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_that_cannot_be_read_fails_the_deploy_before_any_target_changes_on_postgres() {
    a_secret_that_cannot_be_read_fails_the_deploy_before_any_target_changes(Db::Postgres).await;
}

async fn a_secret_that_cannot_be_read_fails_the_deploy_before_any_target_changes(backend: Db) {
    let site = Site::new(backend, TWO_TARGETS_TWO_REGIONS).await;
    let extra = write_vars_files(&site, "echo partial; exit 3");
    site.write_environment(&site.hosts.known_hosts, "[[t1], [t2]]", &extra);
    let worker = site.worker(&executor_id("unreadable")).await;
    let v1 = site.artifact("v1");

    let (record, status) = site.deploy(&worker, &v1, &v1.sha256, false).await;
    assert_eq!(
        record.status,
        WorkflowStatus::Error,
        "a secret that cannot be read fails the deploy: {status:#?}"
    );
    let error = status.error.clone().unwrap_or_default();
    assert!(
        error.contains("secret TOKEN") && error.contains("exited with 3"),
        "the error names the secret and why: {error}"
    );
    assert!(
        !error.contains("partial"),
        "the error quotes nothing the command printed: {error}"
    );
    for i in 0..2 {
        assert!(
            files_under(&site.root(i)).is_empty(),
            "{} got nothing, not even the first wave's: {:?}",
            target_name(i),
            files_under(&site.root(i))
        );
    }
    let resolved = step(&status, "resolve secrets and templates");
    assert_eq!(
        resolved.status,
        deploy_views::StepState::Error,
        "the failed resolution is the deploy's first step after the start: {resolved:?}"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_naming_an_unknown_variable_is_refused_at_submission_naming_template_line_and_variable()
 {
    let site = Site::new(Db::Sqlite, TWO_TARGETS_TWO_REGIONS).await;
    let extra = write_vars_files(&site, "cat token.txt");
    std::fs::write(
        site.source.join("acme/web/app.env.j2"),
        "DB_HOST={{ DB_HOST }}\nPOOL={{ POOL_SIZE }}\n",
    )
    .unwrap();
    site.write_environment(&site.hosts.known_hosts, "all", &extra);
    let worker = site.worker(&executor_id("refused")).await;
    let v1 = site.artifact("v1");
    let refused = site
        .try_submit(&worker, &v1, &v1.sha256, false)
        .await
        .expect_err("an unknown variable is refused at submission")
        .to_string();
    assert!(
        refused.contains("app.env.j2")
            && refused.contains("line 2")
            && refused.contains("`POOL_SIZE`"),
        "the refusal names the template, the line and the variable: {refused}"
    );
    assert!(
        files_under(&site.root(0)).is_empty(),
        "nothing was deployed"
    );
    worker.stop().await;
}
