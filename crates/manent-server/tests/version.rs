//! `manent-server --version` says what the binary can run beside others during a rolling
//! upgrade: the release, the schema version it migrates to and the deploy workflow versions.

use std::process::Command;

#[test]
fn the_version_names_the_release_the_schema_and_the_workflow_versions() {
    let out = Command::new(env!("CARGO_BIN_EXE_manent-server"))
        .arg("--version")
        .env("MANENT_CONFIG", "/nonexistent/manent.yml")
        .output()
        .expect("run manent-server --version");
    assert!(
        out.status.success(),
        "--version needs no configuration: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).expect("the version is text");
    let expected = format!(
        "manent-server {} (schema {}, workflows 1-8)\n",
        env!("CARGO_PKG_VERSION"),
        manent_engine::Database::expected_schema_version()
    );
    assert_eq!(
        printed, expected,
        "the release, the schema and the workflow versions"
    );
    assert_eq!(
        expected.trim_start_matches("manent-server ").trim_end(),
        manent_deploy::build_version(),
        "what workers record as their version is the same text"
    );
}
