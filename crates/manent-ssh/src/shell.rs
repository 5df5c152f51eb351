//! POSIX shell quoting and the `sh -c` command line that carries environment variables.

use crate::TransportError;

/// Quotes `s` as one word for a POSIX shell.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// Refuses names a shell cannot export, so a bad name fails loudly instead of running a
/// different command.
pub(crate) fn check_env_names(env: &[(String, String)]) -> Result<(), TransportError> {
    for (name, _) in env {
        let mut chars = name.chars();
        let valid = chars
            .next()
            .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
            && chars.all(|c| c == '_' || c.is_ascii_alphanumeric());
        if !valid {
            return Err(TransportError::Protocol(format!(
                "invalid environment variable name {name:?}: use letters, digits and `_`, \
                 not starting with a digit"
            )));
        }
    }
    Ok(())
}

/// The command line sent to sshd: `sh -c '<exports>; <command>'`, so the command runs under
/// `sh` whatever the user's login shell, with the variables set.
pub(crate) fn sh_command_line(
    command: &str,
    env: &[(String, String)],
) -> Result<String, TransportError> {
    Ok(format!("sh -c {}", quote(&sh_script(command, env)?)))
}

/// The script that exports `env` and runs `command`.
pub(crate) fn sh_script(command: &str, env: &[(String, String)]) -> Result<String, TransportError> {
    check_env_names(env)?;
    let mut script = String::new();
    for (name, value) in env {
        script.push_str("export ");
        script.push_str(name);
        script.push('=');
        script.push_str(&quote(value));
        script.push('\n');
    }
    script.push_str(command);
    Ok(script)
}

/// Runs `$1` (a script) so that it lives only as long as whoever started it may act on
/// it: the script runs in the background of this supervisor, which keeps the original
/// stdin (a pipe from the worker, or the SSH channel) on fd 3 in a watcher. With `$2` (a
/// timeout in seconds, the worker's dead-man's switch: `manent_guard`), the worker sends a
/// pulse on that stdin while it holds the step, and silence for `$2` seconds ends the
/// command (a frozen worker); without it, only the stdin's close does. When the watcher
/// returns (silence, or the stdin closed: the worker died, the channel closed, the deploy
/// was cancelled) or the supervisor gets SIGTERM/SIGHUP (the worker's death signal
/// locally), the whole process group is killed: the script and everything it started.
/// When the script ends by itself, the watcher is stopped and the script's exit status
/// returned; what the script left in the background on purpose is left alone.
pub(crate) static SUPERVISOR: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "t=$2
exec 3<&0 </dev/null
trap 'kill -KILL 0' TERM HUP
{check}
( {watch}
kill -KILL 0 ) >/dev/null 2>&1 &
w=$!
exec 3<&-
sh -c \"$1\" &
wait $!
rc=$?
kill $w 2>/dev/null
exit $rc",
        check = manent_guard::CHECK_TOOLS,
        watch = manent_guard::WATCH_PULSES,
    )
});

/// `command` under [`SUPERVISOR`], as one `sh -c` command line; `timeout` is the
/// dead-man's switch's, if the command runs under one.
pub(crate) fn supervised(command_line: &str, timeout: Option<&str>) -> String {
    format!(
        "sh -c {} manent {} {}",
        quote(&SUPERVISOR),
        quote(command_line),
        quote(timeout.unwrap_or(""))
    )
}

/// The parent directory of a `/`-separated path, `None` when it has none worth creating.
pub(crate) fn parent_dir(path: &str) -> Option<&str> {
    let trimmed = path.trim_end_matches('/');
    let (parent, _) = trimmed.rsplit_once('/')?;
    if parent.is_empty() {
        None // the root directory
    } else {
        Some(parent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_single_quotes_and_dollars() {
        assert_eq!(
            quote("it's $HOME"),
            r#"'it'\''s $HOME'"#,
            "a single quote must close, escape and reopen the quoted word"
        );
    }

    #[test]
    fn environment_names_that_a_shell_cannot_export_are_refused() {
        let bad = [("A-B".to_string(), "x".to_string())];
        assert!(
            sh_command_line("true", &bad).is_err(),
            "a dash in a name would change the command, so it must be refused"
        );
        let good = [("_A1".to_string(), "x y".to_string())];
        assert_eq!(
            sh_command_line("echo $_A1", &good).unwrap(),
            "sh -c 'export _A1='\\''x y'\\''\necho $_A1'",
            "values are quoted inside the quoted script"
        );
    }

    #[test]
    fn parent_dir_of_nested_relative_and_root_paths() {
        assert_eq!(parent_dir("/srv/app/x.tar"), Some("/srv/app"), "nested");
        assert_eq!(
            parent_dir("x.tar"),
            None,
            "a bare name has no parent to create"
        );
        assert_eq!(parent_dir("/x.tar"), None, "the root always exists");
        assert_eq!(parent_dir("a/b"), Some("a"), "relative");
    }
}
