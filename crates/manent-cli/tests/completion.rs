//! `manent completion SHELL`: the scripts are printed and know the subcommands.

use std::process::Command;

fn completion(shell: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_manent"))
        .args(["completion", shell])
        // The completion needs no server: an unreachable one must not matter.
        .env("MANENT_SERVER", "http://127.0.0.1:9")
        .output()
        .expect("run manent completion")
}

#[test]
fn each_shell_gets_a_script_naming_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = completion(shell);
        assert!(
            out.status.success(),
            "manent completion {shell} must succeed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let script = String::from_utf8(out.stdout).expect("a completion script is text");
        for subcommand in ["deploy", "status", "workers", "recover", "completion"] {
            assert!(
                script.contains(subcommand),
                "the {shell} script must complete `{subcommand}`"
            );
        }
    }
}

#[test]
fn the_bash_script_registers_a_completion_for_manent() {
    let script = String::from_utf8(completion("bash").stdout).unwrap();
    assert!(
        script.contains("complete -F") && script.contains("manent"),
        "bash needs a `complete` registration for manent, got:\n{}",
        &script[..script.len().min(400)]
    );
}

#[test]
fn an_unknown_shell_is_a_usage_error() {
    let out = completion("cmd.exe");
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is refused with the usage exit code"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("bash"),
        "the error lists the shells that are possible"
    );
}
