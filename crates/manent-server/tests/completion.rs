//! `manent-server completion SHELL`: the scripts are printed, need no configuration, and
//! know the roles and admin commands.

use std::process::Command;

#[test]
fn each_shell_gets_a_script_naming_the_roles_and_admin_commands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(env!("CARGO_BIN_EXE_manent-server"))
            .args(["completion", shell])
            // No configuration is read: a missing file must not matter.
            .env("MANENT_CONFIG", "/nonexistent/manent.yml")
            .output()
            .expect("run manent-server completion");
        assert!(
            out.status.success(),
            "manent-server completion {shell} must succeed without a configuration: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let script = String::from_utf8(out.stdout).expect("a completion script is text");
        for word in ["serve", "worker", "admin", "token", "check-config"] {
            assert!(
                script.contains(word),
                "the {shell} script must complete `{word}`"
            );
        }
    }
}
