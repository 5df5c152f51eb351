//! What commands print, end to end through a real `manent-server serve` and the CLI:
//! secrets masked on the stream (a PEM key whole and line by line, a value printed in two
//! writes, a value straddling the cut of a failed command's stderr) in the recorded
//! output, the step's error and the server's log; a line of 100 MB without a newline cut
//! and the deploy's output capped (docs/security.md, "Secrets" and "Output bounds").

mod common;

use common::Site;
use manent_testkit::{Db, on_both_backends};

on_both_backends!(
    secrets_printed_whole_line_by_line_in_pieces_or_at_the_cut_of_stderr_are_never_shown,
    a_line_without_end_is_cut_and_the_output_of_a_deploy_stops_at_its_cap,
);

/// A private key as a tool prints it: five lines, each long enough to be masked alone.
const KEY: &str = "-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
QyNTUxOQAAACCf0qSZ2xH1Zx3VsCx4kq4Yb5u2cTQpXcq8hJ0bLqgIYwAAAJg2i9ZpNovW
AAAEC2pZ
-----END OPENSSH PRIVATE KEY-----";
const PASSWORD: &str = "hunter2";

/// `commands` as the `commands:` of acme/web's prod environment on a local target, with
/// `extra` (YAML) after them.
fn environment(commands: &[String], extra: &str) -> String {
    let commands: String = commands
        .iter()
        .map(|c| format!("    - {}\n", serde_json::to_string(c).unwrap()))
        .collect();
    format!(
        "targets: [{{name: t1, host: local}}]\ndeploy:\n  plugin: command\n  commands:\n{commands}{extra}"
    )
}

/// The lines of `manent logs ID` (steps, outcomes and the commands' output).
fn log_lines(site: &Site, token: &str, id: &str) -> Vec<String> {
    let (code, logs) = site.cli(token, &["logs", id]);
    assert_eq!(code, 0, "manent logs answers: {logs}");
    logs["lines"]
        .as_array()
        .unwrap_or_else(|| panic!("logs have lines: {logs}"))
        .iter()
        .map(|l| l.as_str().unwrap_or_default().to_owned())
        .collect()
}

async fn secrets_printed_whole_line_by_line_in_pieces_or_at_the_cut_of_stderr_are_never_shown(
    db: Db,
) {
    let mut site = Site::new(db, &[]).await;
    let key_file = site.dir.join("key");
    let password_file = site.dir.join("password");
    std::fs::write(&key_file, format!("{KEY}\n")).unwrap();
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let commands = [
        // The key whole, then line by line, indented: no line of it is shown.
        r#"printf 'key:\n%s\n' "$SSH_KEY""#.to_owned(),
        r#"printf '%s\n' "$SSH_KEY" | sed 's/^/  key> /'"#.to_owned(),
        // The password in two writes, apart in time: two reads of the command's stdout.
        // (`ter%s` 2: the command's own text, quoted in errors, holds no piece of it.)
        "printf 'password: hun'; sleep 0.2; printf 'ter%s\\n' 2".to_owned(),
        // Fails; the last 2,000 bytes of its stderr begin inside the password.
        "printf 'stderr: hun' >&2; sleep 0.2; printf 'ter%s ' 2 >&2; \
         head -c 1995 /dev/zero | tr '\\0' e >&2; exit 3"
            .to_owned(),
    ];
    site.write_environment(
        "acme/web",
        "prod",
        &environment(
            &commands,
            &format!(
                "secrets:\n  SSH_KEY: {{file: {}}}\n  PASSWORD: {{file: {}}}\n",
                key_file.display(),
                password_file.display()
            ),
        ),
    );
    let token = site.token();
    site.start("serve", "s1");
    site.wait_api().await;
    let (id, _) = site.submit(&token, "acme/web");
    let status = site.wait_status(&token, &id, "ERROR").await;

    let lines = log_lines(&site, &token, &id);
    let logs = lines.join("\n");
    assert!(
        lines.iter().any(|l| l.ends_with("| ***")),
        "the key printed whole is one mask: {logs}"
    );
    assert_eq!(
        lines.iter().filter(|l| l.ends_with("|   key> ***")).count(),
        5,
        "each line of the key printed alone is masked: {logs}"
    );
    assert!(
        lines.iter().any(|l| l.ends_with("| password: ***")),
        "the password printed in two writes is masked whole: {logs}"
    );
    let error = status.to_string();
    assert!(
        error.contains("exited with 3: …") && error.contains("***"),
        "the failed command's error quotes the end of its stderr, masked first: {error}"
    );
    let server_log = std::fs::read_to_string(site.dir.join("serve-s1.log")).unwrap();
    // No piece of a secret anywhere: the password's end, any line of the key.
    let pieces: Vec<&str> = ["ter2"]
        .into_iter()
        .chain(KEY.lines().map(|l| l.trim_start_matches('-')))
        .collect();
    for (what, text) in [
        ("manent logs", &logs),
        ("manent status", &error),
        ("the server's log", &server_log),
    ] {
        for piece in &pieces {
            assert!(
                !text.contains(piece),
                "{what} shows {piece:?} of a secret:\n{text}"
            );
        }
    }
}

async fn a_line_without_end_is_cut_and_the_output_of_a_deploy_stops_at_its_cap(db: Db) {
    let mut site = Site::new(db, &[]).await;
    site.set_config("worker: {max_output_mib: 1}");
    // 100 MB without a newline, then five commands of 300 lines of 1,000 bytes: each keeps
    // its 256 KiB, and the fourth reaches the deploy's 1 MiB.
    let mut commands = vec!["head -c 100000000 /dev/zero | tr '\\0' x".to_owned()];
    for n in 1..=5 {
        commands.push(format!(
            "yes \"{n}$(head -c 999 /dev/zero | tr '\\0' y)\" | head -n 300"
        ));
    }
    site.write_environment("acme/web", "prod", &environment(&commands, ""));
    let token = site.token();
    site.start("serve", "s1");
    site.wait_api().await;
    let (id, _) = site.submit(&token, "acme/web");
    site.wait_status(&token, &id, "SUCCESS").await;

    let lines = log_lines(&site, &token, &id);
    let long = lines
        .iter()
        .find(|l| l.contains("t1: command 1 | x"))
        .unwrap_or_else(|| panic!("the long line is shown: {:?}", summary(&lines)));
    assert!(
        long.contains(&"x".repeat(16 * 1024))
            && !long.contains(&"x".repeat(16 * 1024 + 1))
            && long.ends_with(&format!(
                "… [manent: line cut, {} more bytes not kept]",
                100_000_000 - 16 * 1024
            )),
        "the line keeps its first 16 KiB and says how much was cut: {}",
        &long[long.len().saturating_sub(120)..]
    );
    let capped = lines
        .iter()
        .position(|l| l.contains("output capped at 1 MiB for this run"))
        .unwrap_or_else(|| panic!("the cap is said: {:?}", summary(&lines)));
    let kept: usize = lines
        .iter()
        .filter(|l| l.contains(": command ") && l.contains(" | "))
        .map(String::len)
        .sum();
    assert!(
        kept <= 1024 * 1024 + 64 * 1024,
        "about 1 MiB of output is kept, not more ({kept} bytes with the line prefixes)"
    );
    assert!(
        !lines[capped..]
            .iter()
            .any(|l| l.contains("t1: command 6 | 6yyy")),
        "nothing of the last command is recorded once the cap is reached: {:?}",
        summary(&lines)
    );
}

/// The start of each line, enough to see which is which.
fn summary(lines: &[String]) -> Vec<String> {
    lines.iter().map(|l| l.chars().take(60).collect()).collect()
}
