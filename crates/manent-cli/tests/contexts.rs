//! `manent context add|use|list|remove` in a clean home directory, without a server
//! (docs/cli.md, "Contexts"): the file and its mode, the current context, a stored token
//! never shown, the precedence of a flag over a `MANENT_*` variable over the context (told
//! by which unreachable server a command names), and the errors that name a file.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::{Command, Output},
};

/// A clean home: no `MANENT_*` variable, no contexts yet.
struct Home {
    dir: tempfile::TempDir,
    /// `XDG_CONFIG_HOME`, when set.
    xdg: Option<PathBuf>,
}

impl Home {
    fn new() -> Home {
        Home {
            dir: tempfile::tempdir().expect("a temporary home"),
            xdg: None,
        }
    }

    /// `manent ARGS` in this home, with the variables `env`; its exit code, stdout, stderr.
    fn manent(&self, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_manent"));
        command.env_clear().env("HOME", self.dir.path()).args(args);
        if let Some(xdg) = &self.xdg {
            command.env("XDG_CONFIG_HOME", xdg);
        }
        command.envs(env.iter().copied());
        let Output {
            status,
            stdout,
            stderr,
        } = command.output().expect("run manent");
        (
            status.code().unwrap_or(-1),
            String::from_utf8_lossy(&stdout).into_owned(),
            String::from_utf8_lossy(&stderr).into_owned(),
        )
    }

    /// `manent ARGS` expected to succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.manent(args, &[]);
        assert_eq!(code, 0, "manent {}: {out}{err}", args.join(" "));
        out
    }

    fn file(&self) -> PathBuf {
        match &self.xdg {
            Some(xdg) => xdg.join("manent/config.yml"),
            None => self.dir.path().join(".config/manent/config.yml"),
        }
    }

    /// A token file holding `token`, mode 0600.
    fn token_file(&self, name: &str, token: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = self.dir.path().join(name);
        std::fs::write(&path, format!("{token}\n")).expect("write the token file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        path
    }
}

/// `manent context add prod` with the server http://127.0.0.1:1 and `token_file`.
fn add_prod(home: &Home, token_file: &Path) {
    home.ok(&[
        "context",
        "add",
        "prod",
        "--server",
        "http://127.0.0.1:1",
        "--token-file",
        token_file.to_str().unwrap(),
    ]);
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").mode() & 0o777
}

#[test]
fn contexts_are_added_used_listed_and_removed_in_a_0600_file_never_showing_a_token() {
    let home = Home::new();
    assert_eq!(
        home.ok(&["context", "list", "-o", "json"]).trim(),
        "[]",
        "none yet"
    );
    let token_file = home.token_file("prod.token", "mnt_prod");
    add_prod(&home, &token_file);
    assert_eq!(mode(&home.file()), 0o600, "the file is the user's alone");
    let (code, _, err) = home.manent(
        &[
            "context",
            "add",
            "lab",
            "--server",
            "http://127.0.0.1:2",
            "--token",
            "mnt_lab_secret",
        ],
        &[],
    );
    assert!(
        code == 0 && err.contains("anyone who can read"),
        "storing the token itself says what that means: {err}"
    );
    let text = std::fs::read_to_string(home.file()).expect("read the file");
    assert!(
        text.contains("current: prod") && text.contains(&token_file.display().to_string()),
        "the first context is current, its token file's path kept (not its token): {text}"
    );
    assert!(
        !text.contains("mnt_prod"),
        "a token file's token is never copied: {text}"
    );
    let table = home.ok(&["context", "list"]);
    let current: Vec<&str> = table.lines().filter(|l| l.starts_with('*')).collect();
    assert!(
        current.len() == 1 && current[0].contains("prod") && !table.contains("mnt_lab_secret"),
        "the current context is marked, and a stored token is never shown:\n{table}"
    );
    let listed = home.ok(&["context", "list", "-o", "json"]);
    assert!(
        listed.contains("\"token_stored\": true") && !listed.contains("mnt_lab_secret"),
        "the JSON says a token is stored, never which: {listed}"
    );

    home.ok(&["context", "use", "lab"]);
    assert_eq!(
        home.ok(&["context", "list", "-o", "name"]),
        "lab\nprod\n",
        "both, by name"
    );
    assert!(
        std::fs::read_to_string(home.file())
            .unwrap()
            .contains("current: lab"),
        "use changes the current context"
    );
    let (code, _, err) = home.manent(&["context", "use", "nope"], &[]);
    assert!(
        code == 2 && err.contains("no context `nope`") && err.contains("contexts: lab, prod"),
        "an unknown context is refused naming those there are: {err}"
    );
    home.ok(&["context", "remove", "lab"]);
    let listed = home.ok(&["context", "list", "-o", "json"]);
    assert!(
        !listed.contains("\"lab\"") && listed.contains("\"current\": false"),
        "lab is gone, and no context is current any more: {listed}"
    );
    assert_eq!(
        mode(&home.file()),
        0o600,
        "still the user's alone after each write"
    );
}

/// The server `manent list` tried to reach, as its error names it (exit 3).
fn reached(home: &Home, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut all = vec!["list"];
    all.extend_from_slice(args);
    let (code, _, err) = home.manent(&all, env);
    assert_eq!(code, 3, "nothing listens there: {err}");
    let at = err
        .split("cannot reach the server at ")
        .nth(1)
        .unwrap_or_else(|| panic!("the error names the server: {err}"));
    at.split(':').take(3).collect::<Vec<_>>().join(":")
}

#[test]
fn a_flag_wins_over_a_manent_variable_which_wins_over_the_context() {
    let mut home = Home::new();
    home.xdg = Some(home.dir.path().join("xdg"));
    let token_file = home.token_file("prod.token", "mnt_prod");
    add_prod(&home, &token_file);
    assert!(
        home.file().exists(),
        "under XDG_CONFIG_HOME: {}",
        home.file().display()
    );
    let variable = [("MANENT_SERVER", "http://127.0.0.1:2")];
    assert_eq!(
        reached(&home, &[], &[]),
        "http://127.0.0.1:1",
        "the context's"
    );
    assert_eq!(
        reached(&home, &[], &variable),
        "http://127.0.0.1:2",
        "the variable's"
    );
    assert_eq!(
        reached(&home, &["--server", "http://127.0.0.1:3"], &variable),
        "http://127.0.0.1:3",
        "the flag's"
    );

    std::fs::remove_file(&token_file).expect("remove the token file");
    let (code, _, err) = home.manent(&["list"], &[]);
    assert!(
        code == 2
            && err.contains(&token_file.display().to_string())
            && err.contains("context prod"),
        "a missing token file is named, with its context: {err}"
    );
    let (code, _, err) = home.manent(&["list"], &[("MANENT_TOKEN", "mnt_env")]);
    assert_eq!(
        code, 3,
        "a token from a variable needs no token file: {err}"
    );

    std::fs::write(
        home.file(),
        "current: prod\ncontexts:\n  prod: {server: [a]}\n",
    )
    .unwrap();
    let (code, _, err) = home.manent(&["list"], &[]);
    assert!(
        code == 2 && err.contains(&format!("{}:3:", home.file().display())),
        "a broken file is named with its line: {err}"
    );
}
