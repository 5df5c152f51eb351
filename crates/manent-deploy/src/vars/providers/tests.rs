//! Tests of the secret providers: each reads its value, and each failure names the secret
//! without quoting what it printed.

use std::time::Duration;

use super::*;

/// A source with only `command` (and `timeout`).
fn command(command: &str, timeout: Option<Duration>) -> SecretSource {
    SecretSource {
        command: Some(command.to_owned()),
        timeout,
        ..SecretSource::default()
    }
}

/// A context whose environment file lies in `dir`, passing `inherit_env`.
fn context(dir: &Path, inherit_env: &[&str]) -> ProviderContext {
    ProviderContext {
        environment_dir: Some(dir.to_path_buf()),
        inherit_env: inherit_env.iter().map(|s| s.to_string()).collect(),
    }
}

#[tokio::test]
async fn a_command_provider_gives_its_stdout_without_the_final_newline_run_in_the_environment_directory()
 {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token.txt"), "from-file").unwrap();
    let value = read(
        "TOKEN",
        &command("printf '%s-' \"$(cat token.txt)\"; echo done", None),
        &context(dir.path(), &[]),
    )
    .await
    .expect("the command succeeds");
    assert_eq!(
        value, "from-file-done",
        "stdout, read from the environment file's directory, its final newline dropped"
    );
}

#[tokio::test]
async fn a_command_provider_sees_only_the_inherited_variables_of_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    // Both are variables cargo gives the test process, as the worker's own would be.
    let names = ["CARGO_PKG_NAME", "CARGO_MANIFEST_DIR"];
    assert!(
        names.iter().all(|n| std::env::var(n).is_ok()),
        "the test runs under cargo, which sets both"
    );
    let value = read(
        "SEEN",
        &command(
            "echo \"passed=${CARGO_PKG_NAME:-absent} withheld=${CARGO_MANIFEST_DIR:-absent}\"",
            None,
        ),
        &context(dir.path(), &[names[0]]),
    )
    .await
    .expect("the command succeeds");
    assert_eq!(
        value, "passed=manent-deploy withheld=absent",
        "a command provider gets inherit_env's variables and no other of the worker's"
    );
}

/// The error of `source`, which must fail; asserts it names the secret and hides `hidden`.
async fn refused(source: &SecretSource, hidden: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let error = read("DB_PASSWORD", source, &context(dir.path(), &[]))
        .await
        .expect_err("the provider fails")
        .to_string();
    assert!(
        error.contains("DB_PASSWORD"),
        "the error names the secret: {error}"
    );
    assert!(
        !error.contains(hidden),
        "the error never quotes what the command printed: {error}"
    );
    error
}

#[tokio::test]
async fn a_command_that_fails_times_out_or_prints_nothing_fails_naming_the_secret_and_quoting_nothing()
 {
    let failed = refused(
        &command("echo hunter2; echo hunter2 >&2; exit 3", None),
        "hunter2",
    )
    .await;
    assert!(failed.contains("exited with 3"), "{failed}");
    let silent = refused(&command("true", None), "hunter2").await;
    assert!(silent.contains("printed nothing"), "{silent}");
    let blank = refused(&command("echo", None), "hunter2").await;
    assert!(blank.contains("printed nothing"), "{blank}");
    let slow = refused(
        &command("echo hunter2; sleep 60", Some(Duration::from_millis(300))),
        "hunter2",
    )
    .await;
    assert!(
        slow.contains("did not finish within 300ms") && slow.contains("stopped"),
        "{slow}"
    );
}

#[tokio::test]
async fn a_command_whose_directory_is_gone_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("gone");
    let error = read("X", &command("echo x", None), &context(&gone, &[]))
        .await
        .expect_err("the directory is missing")
        .to_string();
    assert!(
        error.contains("environment file's directory") && error.contains("gone"),
        "{error}"
    );
}

/// An age identity made for the test, written to `dir/name`; its recipient.
fn identity(dir: &Path, name: &str) -> age::x25519::Recipient {
    use age::secrecy::ExposeSecret;
    let identity = age::x25519::Identity::generate();
    std::fs::write(
        dir.join(name),
        format!("# test key\n{}\n", identity.to_string().expose_secret()),
    )
    .unwrap();
    identity.to_public()
}

/// `plain` encrypted to `recipient`, armored or binary.
fn encrypt(recipient: &age::x25519::Recipient, plain: &str, armored: bool) -> Vec<u8> {
    use std::io::Write;
    let encryptor =
        age::Encryptor::with_recipients(std::iter::once(recipient as &dyn age::Recipient))
            .expect("one recipient");
    let mut out = Vec::new();
    let format = if armored {
        age::armor::Format::AsciiArmor
    } else {
        age::armor::Format::Binary
    };
    let armor = age::armor::ArmoredWriter::wrap_output(&mut out, format).unwrap();
    let mut writer = encryptor.wrap_output(armor).unwrap();
    writer.write_all(plain.as_bytes()).unwrap();
    writer.finish().unwrap().finish().unwrap();
    out
}

fn age_source(file: &str, identity: &str) -> SecretSource {
    SecretSource {
        age: Some(file.into()),
        identity: Some(identity.into()),
        ..SecretSource::default()
    }
}

#[tokio::test]
async fn an_age_file_beside_the_environment_file_is_decrypted_with_the_workers_identity() {
    let dir = tempfile::tempdir().unwrap();
    let recipient = identity(dir.path(), "worker.key");
    std::fs::write(
        dir.path().join("db.age"),
        encrypt(&recipient, "s3cret\n", true),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("api.age"),
        encrypt(&recipient, "multi\nline", false),
    )
    .unwrap();
    let absolute_key = dir.path().join("worker.key").display().to_string();
    let ctx = context(dir.path(), &[]);
    let db = read("DB", &age_source("db.age", "worker.key"), &ctx)
        .await
        .expect("an armored file decrypts");
    assert_eq!(db, "s3cret", "the plaintext, its final newline dropped");
    let api = read("API", &age_source("api.age", &absolute_key), &ctx)
        .await
        .expect("a binary file decrypts, the identity given absolute");
    assert_eq!(api, "multi\nline", "a multi-line value is kept whole");

    identity(dir.path(), "other.key");
    let wrong = read("DB", &age_source("db.age", "other.key"), &ctx)
        .await
        .expect_err("another identity cannot decrypt it")
        .to_string();
    assert!(
        wrong.contains("secret DB") && wrong.contains("db.age") && wrong.contains("other.key"),
        "the error names the secret, the file and the identity: {wrong}"
    );
    let missing = read("DB", &age_source("nope.age", "worker.key"), &ctx)
        .await
        .expect_err("a missing file")
        .to_string();
    assert!(missing.contains("nope.age"), "{missing}");
    let unknown_dir = read(
        "DB",
        &age_source("db.age", "worker.key"),
        &ProviderContext::default(),
    )
    .await
    .expect_err("a relative path with no environment directory known")
    .to_string();
    assert!(unknown_dir.contains("relative"), "{unknown_dir}");
}
