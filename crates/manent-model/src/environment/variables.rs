//! The variables an environment file hands its commands beside the `MANENT_*` ones, and
//! their validation: `secrets` (read on the worker, masked) and `inherit_env` (variables of
//! the worker process passed through to `host: local` commands, docs/environments.md).

use super::{EnvironmentFile, SecretSource};
use crate::source::Document;

/// What `inherit_env` lists: names of the worker's own variables that a `host: local`
/// command gets, read at each command. Every other variable of the worker is withheld
/// (docs/security.md, "What a local command sees").
pub type InheritEnv = Vec<String>;

/// Whether `name` is a variable name a shell accepts: letters, digits and `_`, not
/// starting with a digit.
fn is_variable_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && name.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Checks `secrets` and `inherit_env`, pushing each issue to `doc`.
pub(super) fn validate(doc: &mut Document<'_>, env: &EnvironmentFile) {
    for (name, source) in &env.secrets {
        validate_secret(doc, name, source);
    }
    for (i, name) in env.inherit_env.iter().enumerate() {
        let at = format!("inherit_env[{i}]");
        if !is_variable_name(name) || name.starts_with("MANENT_") {
            doc.issue(
                at,
                format!(
                    "`{name}` is not a variable name manent passes through; use letters, \
                     digits and `_`, not starting with a digit or MANENT_"
                ),
            );
        } else if env.secrets.contains_key(name) {
            doc.issue(
                at,
                format!(
                    "`{name}` is also a secret, which sets it (masked); remove it from one of \
                     the two"
                ),
            );
        } else if env.inherit_env[..i].contains(name) {
            doc.issue(at, format!("`{name}` is listed twice; keep one"));
        }
    }
}

fn validate_secret(doc: &mut Document<'_>, name: &str, source: &SecretSource) {
    let at = format!("secrets.{name}");
    if !super::scoped::is_upper_variable_name(name) {
        doc.issue(
            at.clone(),
            format!(
                "`{name}` is not a secret's variable name; use upper-case letters, digits \
                 and `_`, not starting with a digit or MANENT_"
            ),
        );
    }
    let written = [
        source.file.is_some(),
        source.env.is_some(),
        source.command.is_some(),
        source.age.is_some(),
    ];
    if written.iter().filter(|w| **w).count() != 1 {
        doc.issue(
            at,
            "write exactly one of file (a path on the worker), env (a variable of the worker \
             process), command (run on the worker; its output) or age (an age-encrypted file, \
             with identity)",
        );
        return;
    }
    if source.timeout.is_some() && source.command.is_none() {
        doc.issue(
            format!("{at}.timeout"),
            "applies to command only; remove it",
        );
    }
    if source.identity.is_some() && source.age.is_none() {
        doc.issue(format!("{at}.identity"), "applies to age only; remove it");
    }
    let relative_plain = |path: &std::path::Path| {
        path.components().all(|c| {
            matches!(
                c,
                std::path::Component::Normal(_) | std::path::Component::RootDir
            )
        }) && !path.as_os_str().is_empty()
    };
    if let Some(file) = &source.file
        && !file.is_absolute()
    {
        doc.issue(
            format!("{at}.file"),
            format!(
                "`{}` is relative; write the absolute path of the file on the worker",
                file.display()
            ),
        );
    }
    if let Some(var) = &source.env
        && var.trim().is_empty()
    {
        doc.issue(format!("{at}.env"), "is empty; write the variable's name");
    }
    if let Some(command) = &source.command
        && command.trim().is_empty()
    {
        doc.issue(
            format!("{at}.command"),
            "is empty; write the command to run",
        );
    }
    if source.timeout.is_some_and(|t| t.is_zero()) {
        doc.issue(format!("{at}.timeout"), "is 0; write a limit such as 30s");
    }
    if let Some(age) = &source.age {
        for (field, path) in [("age", Some(age)), ("identity", source.identity.as_ref())] {
            match path {
                None => doc.issue(
                    format!("{at}.identity"),
                    "is missing; write the age identity file on the worker that decrypts it",
                ),
                Some(path) if !relative_plain(path) => doc.issue(
                    format!("{at}.{field}"),
                    format!(
                        "`{}` must be absolute, or relative to the environment file without \
                         `.` or `..`",
                        path.display()
                    ),
                ),
                Some(_) => {}
            }
        }
    }
}
