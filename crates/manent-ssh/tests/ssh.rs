//! The transports against real targets: OpenSSH's sshd started by the testkit on loopback
//! addresses, and the worker's own machine. The same behaviour suite runs on both.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use manent_ssh::{
    Address, Connection, ConnectionPool, SshAuth, TransportError, VerifyUploads, connect,
    sha256_file,
};
use manent_testkit::sshd::SshHosts;

fn address(hosts: &SshHosts, index: usize) -> Address {
    let host = &hosts.hosts[index];
    Address::new(host.addr.clone(), host.port, hosts.user.clone())
}

fn auth(hosts: &SshHosts) -> SshAuth {
    SshAuth::new(&hosts.client_key, &hosts.known_hosts)
}

async fn ssh(hosts: &SshHosts) -> Arc<dyn Connection> {
    ssh_with(hosts, auth(hosts)).await
}

async fn ssh_with(hosts: &SshHosts, auth: SshAuth) -> Arc<dyn Connection> {
    connect(&address(hosts, 0), &auth)
        .await
        .unwrap_or_else(|e| panic!("connect to sshd: {e}\n{}", hosts.logs()))
}

/// Uploads verified by a command on the target instead of an SFTP read-back.
fn verify_by_command(hosts: &SshHosts) -> SshAuth {
    SshAuth {
        verify: VerifyUploads::Command,
        ..auth(hosts)
    }
}

/// A directory for a target's PATH holding links to the real `tools`, and `scripts`
/// (name, body) written as executable files.
fn target_path(tools: &[&str], scripts: &[(&str, String)]) -> tempfile::TempDir {
    let bin = tempfile::tempdir().unwrap();
    for tool in tools {
        let real = ["/bin", "/usr/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{tool} is installed"));
        std::os::unix::fs::symlink(real, bin.path().join(tool)).unwrap();
    }
    for (name, body) in scripts {
        let path = bin.path().join(name);
        std::fs::write(&path, body).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // The login account must reach the scripts (the testkit's sshd runs as root here, but
    // not every machine does).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// An `openssl` that appends a line to `log` each time it runs, then runs the real one.
fn recording_openssl(log: &Path) -> (&'static str, String) {
    (
        "openssl",
        format!(
            "#!/bin/sh\necho ran >> '{}'\nexec /usr/bin/openssl \"$@\"\n",
            log.display()
        ),
    )
}

fn times_run(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A file of `len` bytes that does not compress (so the transfer is really `len` bytes).
fn random_file(path: &Path, len: usize) -> PathBuf {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let bytes: Vec<u8> = (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    std::fs::write(path, bytes).expect("write the test file");
    path.to_path_buf()
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}

// ---- the behaviour suite, for any transport ----

async fn exec_passes_variables_and_reports_exit_codes(conn: &dyn Connection) {
    let tricky = "it's a \"test\" with $HOME, `backticks`\nand a second line";
    let out = conn
        .exec(
            r#"printf '%s|%s' "$MANENT_VERSION" "$TRICKY"; echo oops >&2; exit 3"#,
            &env(&[("MANENT_VERSION", "1.2.3"), ("TRICKY", tricky)]),
        )
        .await
        .expect("run a command");
    assert_eq!(
        out.stdout,
        format!("1.2.3|{tricky}"),
        "variables must reach the command exactly, quotes, dollars and newlines included"
    );
    assert_eq!(
        out.stderr, "oops\n",
        "stderr is collected apart from stdout"
    );
    assert_eq!(out.status, 3, "the command's exit status is reported");

    let ok = conn.exec("true", &[]).await.expect("run true");
    assert!(ok.success(), "`true` exits 0, got {ok:?}");

    let killed = conn
        .exec("kill -9 $$", &[])
        .await
        .expect("run a command that is killed");
    assert_eq!(
        killed.status, 137,
        "a command killed by SIGKILL reports 128 + 9, as a shell would: {killed:?}"
    );

    let err = conn
        .exec("true", &env(&[("NOT-A-NAME", "x")]))
        .await
        .expect_err("a variable name a shell cannot export is refused");
    assert!(
        err.to_string().contains("NOT-A-NAME"),
        "the error names the variable: {err}"
    );
}

async fn put_file_atomic_uploads_and_rewrites_idempotently(
    conn: &dyn Connection,
    local_dir: &Path,
    dest_dir: &Path,
) {
    let local = random_file(&local_dir.join("artifact.bin"), 5 * 1024 * 1024);
    let expected = sha256_file(&local).unwrap().expect("the local file exists");
    // A directory that does not exist yet, and a name that needs quoting.
    let dest = dest_dir.join("releases/v 1/it's.bin");
    let part = PathBuf::from(format!("{}.part", dest.display()));

    conn.put_file_atomic(&local, path_str(&dest))
        .await
        .expect("upload a 5 MB file");
    assert_eq!(
        sha256_file(&dest).unwrap().as_deref(),
        Some(expected.as_str()),
        "the uploaded file has the local file's content"
    );
    assert!(!part.exists(), "no `.part` is left behind after the rename");

    conn.put_file_atomic(&local, path_str(&dest))
        .await
        .expect("upload the same file again");
    assert_eq!(
        sha256_file(&dest).unwrap().as_deref(),
        Some(expected.as_str()),
        "rewriting the same file gives the same result"
    );
    assert!(!part.exists(), "no `.part` is left after a rewrite either");

    // An interrupted earlier upload left a read-only `.part`: it must not stop the next one.
    std::fs::write(&part, b"half").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&part, std::fs::Permissions::from_mode(0o444)).unwrap();
    }
    let small = local_dir.join("small.txt");
    std::fs::write(&small, b"version 2\n").unwrap();
    conn.put_file_atomic(&small, path_str(&dest))
        .await
        .expect("upload over a leftover read-only .part");
    assert_eq!(
        std::fs::read(&dest).unwrap(),
        b"version 2\n",
        "the new content replaced the old file"
    );
    assert!(!part.exists(), "the leftover `.part` was consumed");
}

async fn put_file_verified_renames_only_a_matching_copy(
    conn: &dyn Connection,
    local_dir: &Path,
    dest_dir: &Path,
) {
    let local = random_file(&local_dir.join("verified.bin"), 3 * 1024 * 1024 + 17);
    let expected = sha256_file(&local).unwrap().expect("the local file exists");
    let dest = dest_dir.join("verified/v 1/it's.bin");
    let part = PathBuf::from(format!("{}.part", dest.display()));

    conn.put_file_verified(&local, path_str(&dest), &expected.to_ascii_uppercase())
        .await
        .expect("upload with the right sha256 (either case)");
    assert_eq!(
        sha256_file(&dest).unwrap().as_deref(),
        Some(expected.as_str()),
        "the file is in place with the local file's content"
    );
    assert!(!part.exists(), "no `.part` is left after a verified upload");

    // Again over a leftover read-only `.part`.
    std::fs::write(&part, b"half").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&part, std::fs::Permissions::from_mode(0o444)).unwrap();
    }
    conn.put_file_verified(&local, path_str(&dest), &expected)
        .await
        .expect("a verified upload over a leftover read-only .part");
    assert!(!part.exists(), "the leftover `.part` was consumed");

    // A wrong sha256: an error, the old file stays, no `.part`.
    let other = local_dir.join("other.txt");
    std::fs::write(&other, b"version 2\n").unwrap();
    let wrong = "0".repeat(64);
    let err = conn
        .put_file_verified(&other, path_str(&dest), &wrong)
        .await
        .expect_err("a copy with another sha256 is refused");
    assert!(
        matches!(&err, TransportError::Mismatch { expected: e, actual: Some(_), .. } if *e == wrong),
        "the error is a sha256 mismatch: {err}"
    );
    assert_eq!(
        sha256_file(&dest).unwrap().as_deref(),
        Some(expected.as_str()),
        "the file in place is unchanged"
    );
    assert!(!part.exists(), "the bad `.part` was removed");

    // A small file (verified over SFTP, not by a command) replaces the big one in place.
    let small = sha256_file(&other).unwrap().expect("the local file exists");
    conn.put_file_verified(&other, path_str(&dest), &small)
        .await
        .expect("a small verified upload over an existing file");
    assert_eq!(
        std::fs::read(&dest).unwrap(),
        b"version 2\n",
        "the small file replaced the existing one atomically"
    );
    assert!(
        !part.exists(),
        "no `.part` is left after a small verified upload"
    );

    // A wrong sha256 for a file not there yet: nothing lands.
    let fresh = dest_dir.join("verified/fresh.bin");
    let err = conn
        .put_file_verified(&other, path_str(&fresh), &wrong)
        .await
        .expect_err("a copy with another sha256 is refused");
    assert!(matches!(err, TransportError::Mismatch { .. }), "{err}");
    assert!(!fresh.exists(), "no file lands under the real name");
    assert!(
        !PathBuf::from(format!("{}.part", fresh.display())).exists(),
        "and no `.part` is left"
    );
}

/// [`put_file_verified_renames_only_a_matching_copy`] into the first host's directory.
async fn verified_uploads_rename_only_matching_copies_on(conn: &dyn Connection, hosts: &SshHosts) {
    let local_dir = tempfile::tempdir().unwrap();
    put_file_verified_renames_only_a_matching_copy(
        conn,
        local_dir.path(),
        &hosts.hosts[0].root_dir,
    )
    .await;
}

async fn sha256_of_existing_and_missing_files(conn: &dyn Connection, dir: &Path) {
    let file = dir.join("hello.txt");
    std::fs::write(&file, b"hello\n").unwrap();
    assert_eq!(
        conn.sha256(path_str(&file))
            .await
            .expect("hash an existing file"),
        Some("5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03".to_string()),
        "sha256 of `hello\\n`"
    );
    assert_eq!(
        conn.sha256(path_str(&dir.join("absent.txt")))
            .await
            .expect("hash a missing file"),
        None,
        "a missing file has no checksum, and that is not an error"
    );
}

async fn free_space_of_existing_and_future_paths(conn: &dyn Connection, dir: &Path) {
    let here = conn
        .free_space(path_str(dir))
        .await
        .expect("free space of a directory");
    assert!(here > 0, "the test filesystem has free space, got {here}");
    let future = dir.join("not/yet/created");
    let there = conn
        .free_space(path_str(&future))
        .await
        .expect("free space where a deploy will create directories");
    assert!(
        there > 0,
        "a path that does not exist yet is measured at its nearest existing ancestor"
    );
}

// ---- SSH ----

#[tokio::test]
async fn ssh_exec_passes_environment_variables_and_returns_exit_codes() {
    let hosts = SshHosts::start(1).await;
    let conn = ssh(&hosts).await;
    exec_passes_variables_and_reports_exit_codes(conn.as_ref()).await;
    assert_eq!(
        conn.describe(),
        format!(
            "{}@{}:{}",
            hosts.user, hosts.hosts[0].addr, hosts.hosts[0].port
        ),
        "describe names user, host and port"
    );
}

#[tokio::test]
async fn ssh_put_file_atomic_streams_a_5_mb_file_and_rewriting_is_idempotent() {
    let hosts = SshHosts::start(1).await;
    let conn = ssh(&hosts).await;
    let local_dir = tempfile::tempdir().unwrap();
    put_file_atomic_uploads_and_rewrites_idempotently(
        conn.as_ref(),
        local_dir.path(),
        &hosts.hosts[0].root_dir,
    )
    .await;
}

#[tokio::test]
async fn ssh_put_file_verified_renames_only_a_matching_copy() {
    let hosts = SshHosts::start(1).await;
    let conn = ssh(&hosts).await;
    verified_uploads_rename_only_matching_copies_on(conn.as_ref(), &hosts).await;
}

#[tokio::test]
async fn ssh_put_file_verified_by_command_renames_only_a_matching_copy() {
    let hosts = SshHosts::start(1).await;
    let conn = ssh_with(&hosts, verify_by_command(&hosts)).await;
    verified_uploads_rename_only_matching_copies_on(conn.as_ref(), &hosts).await;
}

#[tokio::test]
async fn auto_verification_reads_small_files_back_and_hashes_large_ones_on_the_target() {
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("openssl.log");
    let bin = target_path(&["sh", "rm", "mv"], &[recording_openssl(&log)]);
    let hosts =
        SshHosts::start_with_config(1, &format!("SetEnv PATH={}", bin.path().display())).await;
    let conn = ssh(&hosts).await;
    assert_eq!(
        auth(&hosts).verify,
        VerifyUploads::Auto,
        "auto is the default"
    );
    let local_dir = tempfile::tempdir().unwrap();
    let root = &hosts.hosts[0].root_dir;

    let small = random_file(&local_dir.path().join("small.bin"), 1024 * 1024);
    let small_sum = sha256_file(&small).unwrap().unwrap();
    conn.put_file_verified(&small, path_str(&root.join("small.bin")), &small_sum)
        .await
        .expect("a small verified upload");
    assert_eq!(
        times_run(&log),
        0,
        "a file of 1 MiB is read back over SFTP: no command hashes it on the target"
    );

    let large_len = VerifyUploads::READ_BACK_UP_TO as usize + 1;
    let large = random_file(&local_dir.path().join("large.bin"), large_len);
    let large_sum = sha256_file(&large).unwrap().unwrap();
    let dest = root.join("large.bin");
    conn.put_file_verified(&large, path_str(&dest), &large_sum)
        .await
        .expect("a large verified upload");
    assert_eq!(
        times_run(&log),
        1,
        "a file over the read-back size is hashed once by openssl on the target"
    );
    assert_eq!(
        sha256_file(&dest).unwrap().as_deref(),
        Some(large_sum.as_str()),
        "the large file is in place"
    );
    assert!(!root.join("large.bin.part").exists(), "no `.part` is left");
}

#[tokio::test]
async fn verification_on_the_target_uses_sha256sum_when_openssl_prints_no_digest() {
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("openssl.log");
    let broken = format!(
        "#!/bin/sh\necho ran >> '{}'\necho 'not-a-digest *stdin'\n",
        log.display()
    );
    let bin = target_path(&["sh", "rm", "mv", "sha256sum"], &[("openssl", broken)]);
    let hosts =
        SshHosts::start_with_config(1, &format!("SetEnv PATH={}", bin.path().display())).await;
    let conn = ssh_with(&hosts, verify_by_command(&hosts)).await;
    verified_uploads_rename_only_matching_copies_on(conn.as_ref(), &hosts).await;
    assert!(
        times_run(&log) > 0,
        "the broken openssl was tried first, so sha256sum was the fallback"
    );
}

#[tokio::test]
async fn a_verifying_command_that_renames_nothing_is_an_error_not_a_success() {
    // `sh` on the target's PATH exits 0 and does nothing, as a server that replaces
    // commands would.
    let bin = target_path(&[], &[("sh", "#!/bin/sh\nexit 0\n".to_string())]);
    let hosts =
        SshHosts::start_with_config(1, &format!("SetEnv PATH={}", bin.path().display())).await;
    let conn = ssh_with(&hosts, verify_by_command(&hosts)).await;
    let local_dir = tempfile::tempdir().unwrap();
    let local = random_file(&local_dir.path().join("a.bin"), 4096);
    let sum = sha256_file(&local).unwrap().unwrap();
    let dest = hosts.hosts[0].root_dir.join("a.bin");
    let err = conn
        .put_file_verified(&local, path_str(&dest), &sum)
        .await
        .expect_err("a command that ends well without renaming is not a verified upload");
    assert!(
        matches!(&err, TransportError::Remote { status: 0, stderr, .. } if stderr.contains("without renaming")),
        "the error says the command renamed nothing: {err}"
    );
    assert!(!dest.exists(), "nothing landed under the real name");
}

#[tokio::test]
async fn ssh_put_file_verified_by_command_hashes_over_sftp_when_the_target_has_no_hashing_tool() {
    // The target's PATH holds `sh`, `mkdir`, `rm` and `mv`: no `openssl`, no `sha256sum`.
    let bin = target_path(&["sh", "mkdir", "rm", "mv"], &[]);
    let hosts =
        SshHosts::start_with_config(1, &format!("SetEnv PATH={}", bin.path().display())).await;
    let conn = ssh_with(&hosts, verify_by_command(&hosts)).await;
    let probe = conn
        .exec("command -v sha256sum || command -v openssl", &[])
        .await
        .unwrap();
    assert_ne!(
        probe.status, 0,
        "the test needs a target without sha256sum and openssl: {probe:?}"
    );
    verified_uploads_rename_only_matching_copies_on(conn.as_ref(), &hosts).await;
}

#[tokio::test]
async fn ssh_put_file_atomic_keeps_the_permission_bits_of_the_local_file() {
    use std::os::unix::fs::PermissionsExt;
    let hosts = SshHosts::start(1).await;
    let conn = ssh(&hosts).await;
    let local = hosts.path("tool.sh");
    std::fs::write(&local, b"#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(&local, std::fs::Permissions::from_mode(0o755)).unwrap();
    let dest = hosts.hosts[0].root_dir.join("bin/tool.sh");
    conn.put_file_atomic(&local, path_str(&dest))
        .await
        .expect("upload an executable");
    let out = conn
        .exec(&format!("'{}'", dest.display()), &[])
        .await
        .unwrap();
    assert_eq!(
        (out.status, out.stdout.as_str()),
        (0, "ran\n"),
        "an executable artifact stays executable once uploaded: {out:?}"
    );
}

#[tokio::test]
async fn ssh_sha256_hashes_an_existing_file_and_reports_a_missing_one_as_none() {
    let hosts = SshHosts::start(1).await;
    let conn = ssh(&hosts).await;
    sha256_of_existing_and_missing_files(conn.as_ref(), &hosts.hosts[0].root_dir).await;
}

#[tokio::test]
async fn ssh_sha256_reads_the_file_over_sftp_when_the_target_has_no_sha256sum() {
    // The target's PATH holds `sh` and nothing else.
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/bin/sh", bin.path().join("sh")).unwrap();
    let hosts =
        SshHosts::start_with_config(1, &format!("SetEnv PATH={}", bin.path().display())).await;
    let conn = ssh(&hosts).await;
    let probe = conn.exec("command -v sha256sum", &[]).await.unwrap();
    assert_ne!(
        probe.status, 0,
        "the test needs a target without sha256sum: {probe:?}"
    );
    sha256_of_existing_and_missing_files(conn.as_ref(), &hosts.hosts[0].root_dir).await;
}

#[tokio::test]
async fn ssh_home_dir_is_the_home_the_shell_names() {
    let hosts = SshHosts::start(1).await;
    let conn = ssh(&hosts).await;
    let shell = conn
        .exec("printf '%s' \"$HOME\"", &[])
        .await
        .expect("ask the shell");
    assert_eq!(
        conn.home_dir().await.expect("the home directory"),
        shell.stdout.trim_end_matches('/'),
        "SFTP's start directory is the account's home"
    );
}

#[tokio::test]
async fn ssh_a_missing_file_and_the_home_dir_are_learnt_without_running_a_command() {
    // Every command of this account is replaced by the SFTP server: only SFTP answers.
    let hosts = SshHosts::start_with_config(1, "ForceCommand internal-sftp").await;
    let conn = ssh(&hosts).await;
    let missing = hosts.hosts[0].root_dir.join("absent.tar");
    assert_eq!(
        conn.sha256(path_str(&missing))
            .await
            .expect("a missing file is learnt over SFTP"),
        None,
        "no command ran, yet the file is known to be missing"
    );
    let home = conn.home_dir().await.expect("the home directory over SFTP");
    assert!(
        home.starts_with('/') && !home.ends_with('/'),
        "an absolute path without its trailing slash: {home}"
    );
}

#[tokio::test]
async fn ssh_free_space_is_positive_even_for_a_path_not_created_yet() {
    let hosts = SshHosts::start(1).await;
    let conn = ssh(&hosts).await;
    free_space_of_existing_and_future_paths(conn.as_ref(), &hosts.hosts[0].root_dir).await;
}

#[tokio::test]
async fn ssh_refuses_a_host_whose_key_is_not_in_known_hosts() {
    let hosts = SshHosts::start(2).await;
    let known_hosts = hosts.known_hosts_without(1);
    let auth = SshAuth::new(&hosts.client_key, &known_hosts);
    connect(&address(&hosts, 0), &auth)
        .await
        .expect("the host still listed is accepted");
    let err = connect(&address(&hosts, 1), &auth)
        .await
        .err()
        .expect("a host missing from known_hosts must be refused");
    let host = &hosts.hosts[1];
    match &err {
        TransportError::UnknownHostKey {
            host: h,
            port,
            fingerprint,
            known_hosts: path,
        } => {
            assert_eq!(
                (h.as_str(), *port),
                (host.addr.as_str(), host.port),
                "the error names the host"
            );
            assert_eq!(path, &known_hosts, "the error names the known_hosts file");
            assert!(
                fingerprint.starts_with("SHA256:"),
                "the fingerprint is given in OpenSSH's format to check it: {fingerprint}"
            );
        }
        other => panic!("expected UnknownHostKey, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains(&format!("{}:{}", host.addr, host.port))
            && message.contains(&known_hosts.display().to_string())
            && message.contains("ssh-keyscan"),
        "the message says which key is missing where, and how to add it: {message}"
    );
}

#[tokio::test]
async fn ssh_accepts_a_host_recorded_in_a_hashed_known_hosts_file() {
    let hosts = SshHosts::start(1).await;
    let hashed = hosts.path("hashed_known_hosts");
    std::fs::copy(&hosts.known_hosts, &hashed).unwrap();
    let status = std::process::Command::new("ssh-keygen")
        .args(["-q", "-H", "-f"])
        .arg(&hashed)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run ssh-keygen -H");
    assert!(status.success(), "ssh-keygen -H hashes the file");
    let content = std::fs::read_to_string(&hashed).unwrap();
    assert!(
        content.starts_with("|1|") && !content.contains(&hosts.hosts[0].addr),
        "the entry is hashed, so the host's address is not in the file: {content}"
    );
    let conn = connect(
        &address(&hosts, 0),
        &SshAuth::new(&hosts.client_key, &hashed),
    )
    .await
    .expect("a host recorded by its hashed `[host]:port` is accepted");
    assert!(
        conn.exec("true", &[]).await.unwrap().success(),
        "and reachable"
    );
}

#[tokio::test]
async fn ssh_refuses_a_host_whose_key_changed_even_without_strict_checking() {
    let hosts = SshHosts::start(1).await;
    let known_hosts = hosts.known_hosts_with_wrong_key(0);
    let mut auth = SshAuth::new(&hosts.client_key, &known_hosts);
    for strict in [true, false] {
        auth.strict_host_key_checking = strict;
        let err = connect(&address(&hosts, 0), &auth)
            .await
            .err()
            .expect("a changed host key must be refused");
        assert!(
            matches!(err, TransportError::ChangedHostKey { .. }),
            "expected ChangedHostKey (strict = {strict}), got {err:?}"
        );
        assert!(
            err.to_string().contains("man-in-the-middle"),
            "the message warns of a possible attack: {err}"
        );
    }
}

#[tokio::test]
async fn ssh_accepts_an_unknown_host_only_when_strict_checking_is_off() {
    let hosts = SshHosts::start(1).await;
    let mut auth = SshAuth::new(&hosts.client_key, hosts.path("empty_known_hosts"));
    auth.strict_host_key_checking = false;
    let conn = connect(&address(&hosts, 0), &auth)
        .await
        .expect("an unknown host is accepted when strict checking is off");
    assert!(
        conn.exec("true", &[]).await.unwrap().success(),
        "and the connection works"
    );
}

#[tokio::test]
async fn ssh_with_a_key_the_host_does_not_accept_fails_with_an_auth_error() {
    let hosts = SshHosts::start(1).await;
    let auth = SshAuth::new(&hosts.unauthorized_key, &hosts.known_hosts);
    let err = connect(&address(&hosts, 0), &auth)
        .await
        .err()
        .expect("an unauthorized key must be refused");
    match &err {
        TransportError::Auth { user, key, .. } => {
            assert_eq!(user, &hosts.user, "the error names the user");
            assert_eq!(
                key, &hosts.unauthorized_key,
                "the error names the key's path"
            );
        }
        other => panic!("expected Auth, got {other:?}"),
    }
    let secret = std::fs::read_to_string(&hosts.unauthorized_key).unwrap();
    let secret_body = secret.lines().nth(1).expect("a key body line");
    assert!(
        !err.to_string().contains(secret_body) && !format!("{err:?}").contains(secret_body),
        "the private key's content never appears in an error"
    );
}

#[tokio::test]
async fn ssh_with_a_missing_key_file_fails_with_a_key_error_naming_it() {
    let hosts = SshHosts::start(1).await;
    let missing = hosts.path("no_such_key");
    let err = connect(
        &address(&hosts, 0),
        &SshAuth::new(&missing, &hosts.known_hosts),
    )
    .await
    .err()
    .expect("a missing key file is an error");
    assert!(
        matches!(&err, TransportError::Key { path, .. } if path == &missing),
        "expected a Key error naming the file, got {err:?}"
    );
}

#[tokio::test]
async fn ssh_to_a_port_nobody_listens_on_fails_with_a_connect_error() {
    let hosts = SshHosts::start(1).await;
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let err = connect(
        &Address::new("127.0.0.1", port, hosts.user.clone()),
        &auth(&hosts),
    )
    .await
    .err()
    .expect("nobody listens there");
    assert!(
        matches!(&err, TransportError::Connect { port: p, .. } if *p == port),
        "expected a Connect error naming the port, got {err:?}"
    );
}

#[tokio::test]
async fn the_connection_pool_reuses_one_connection_per_user_host_and_port() {
    let hosts = SshHosts::start(2).await;
    let pool = ConnectionPool::new(auth(&hosts));
    let first = address(&hosts, 0);
    let (a, b) = tokio::join!(pool.get(&first), pool.get(&first));
    let (a, b) = (a.expect("connect"), b.expect("connect"));
    assert!(
        Arc::ptr_eq(&a, &b),
        "two concurrent requests for the same target share one connection"
    );
    let again = pool.get(&address(&hosts, 0)).await.unwrap();
    assert!(Arc::ptr_eq(&a, &again), "a later request reuses it too");
    let other = pool.get(&address(&hosts, 1)).await.unwrap();
    assert!(
        !Arc::ptr_eq(&a, &other),
        "another host gets a connection of its own"
    );
    assert_eq!(pool.len(), 2, "one connection per target, no more");

    // Concurrent commands share the connection (each on its own channel).
    let (x, y) = tokio::join!(a.exec("echo x", &[]), a.exec("echo y", &[]));
    assert_eq!(
        (x.unwrap().stdout, y.unwrap().stdout),
        ("x\n".to_string(), "y\n".to_string()),
        "commands running at once on one connection keep their outputs apart"
    );

    let local = pool.get(&Address::local()).await.unwrap();
    assert_eq!(
        local.describe(),
        "local",
        "host `local` is the worker's own machine"
    );
}

#[tokio::test]
async fn the_connection_pool_does_not_remember_a_failed_connect() {
    let hosts = SshHosts::start(1).await;
    let mut auth = auth(&hosts);
    auth.known_hosts_path = hosts.known_hosts_without(0);
    let pool = ConnectionPool::new(auth);
    assert!(
        pool.get(&address(&hosts, 0)).await.is_err(),
        "an unknown host is refused"
    );
    assert!(
        pool.is_empty(),
        "a failed connect leaves no connection in the pool"
    );
}

// ---- local ----

#[tokio::test]
async fn local_exec_passes_environment_variables_and_returns_exit_codes() {
    let conn = connect(&Address::local(), &SshAuth::new("unused", "unused"))
        .await
        .expect("the local transport needs no key");
    exec_passes_variables_and_reports_exit_codes(conn.as_ref()).await;
}

#[tokio::test]
async fn local_put_file_atomic_copies_a_5_mb_file_and_rewriting_is_idempotent() {
    let local_dir = tempfile::tempdir().unwrap();
    let dest_dir = tempfile::tempdir().unwrap();
    let conn = connect(&Address::local(), &SshAuth::new("unused", "unused"))
        .await
        .unwrap();
    put_file_atomic_uploads_and_rewrites_idempotently(
        conn.as_ref(),
        local_dir.path(),
        dest_dir.path(),
    )
    .await;
}

#[tokio::test]
async fn local_put_file_verified_renames_only_a_matching_copy() {
    let local_dir = tempfile::tempdir().unwrap();
    let dest_dir = tempfile::tempdir().unwrap();
    let conn = connect(&Address::local(), &SshAuth::new("unused", "unused"))
        .await
        .unwrap();
    put_file_verified_renames_only_a_matching_copy(
        conn.as_ref(),
        local_dir.path(),
        dest_dir.path(),
    )
    .await;
}

#[tokio::test]
async fn local_sha256_hashes_an_existing_file_and_reports_a_missing_one_as_none() {
    let dir = tempfile::tempdir().unwrap();
    let conn = connect(&Address::local(), &SshAuth::new("unused", "unused"))
        .await
        .unwrap();
    sha256_of_existing_and_missing_files(conn.as_ref(), dir.path()).await;
}

#[tokio::test]
async fn local_free_space_is_positive_even_for_a_path_not_created_yet() {
    let dir = tempfile::tempdir().unwrap();
    let conn = connect(&Address::local(), &SshAuth::new("unused", "unused"))
        .await
        .unwrap();
    free_space_of_existing_and_future_paths(conn.as_ref(), dir.path()).await;
}
