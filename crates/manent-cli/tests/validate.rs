//! `manent validate`: environment files checked without a server, every problem named by
//! file, line and key, and the exit code says whether all were valid.

use std::process::Command;

fn validate(files: &[&std::path::Path]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_manent"))
        .arg("validate")
        .args(files)
        // No server is asked: an unreachable one must not matter.
        .env("MANENT_SERVER", "http://127.0.0.1:9")
        .output()
        .expect("run manent validate")
}

#[test]
fn valid_files_pass_and_an_invalid_one_is_refused_naming_its_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let env_dir = dir.path().join("environments/acme/web");
    std::fs::create_dir_all(&env_dir).unwrap();
    let good = env_dir.join("prod.yml");
    std::fs::write(
        &good,
        "targets: [{name: t1, host: local}]\ndeploy:\n  plugin: command\n  commands: [\"true\"]\n",
    )
    .unwrap();
    let out = validate(&[&good]);
    assert_eq!(out.status.code(), Some(0), "a valid file: {out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("valid (acme/web, environment prod)"),
        "it says what it checked: {stdout}"
    );

    let bad = env_dir.join("staging.yml");
    std::fs::write(
        &bad,
        "targets: [{name: t1, host: local}]\nrollout:\n  max_paralel: 2\n",
    )
    .unwrap();
    let out = validate(&[&good, &bad]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "one invalid file makes the whole run fail: {out:?}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("staging.yml:3") && stderr.contains("max_paralel"),
        "the problem names the file, the line and the key: {stderr}"
    );
}
