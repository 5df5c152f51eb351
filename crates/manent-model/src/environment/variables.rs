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
    let valid_name = name
        .chars()
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_uppercase())
        && name
            .chars()
            .all(|c| c == '_' || c.is_ascii_uppercase() || c.is_ascii_digit());
    if !valid_name || name.starts_with("MANENT_") {
        doc.issue(
            at.clone(),
            format!(
                "`{name}` is not a secret's variable name; use upper-case letters, digits \
                 and `_`, not starting with a digit or MANENT_"
            ),
        );
    }
    match (&source.file, &source.env) {
        (Some(file), None) if file.is_absolute() => {}
        (Some(file), None) => doc.issue(
            format!("{at}.file"),
            format!(
                "`{}` is relative; write the absolute path of the file on the worker",
                file.display()
            ),
        ),
        (None, Some(var)) if !var.trim().is_empty() => {}
        _ => doc.issue(
            at,
            "write exactly one of file (a path on the worker) or env (a variable of the \
             worker process)",
        ),
    }
}
