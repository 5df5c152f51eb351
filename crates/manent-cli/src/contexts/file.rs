//! The contexts file, `$XDG_CONFIG_HOME/manent/config.yml` (else `~/.config/manent/…`):
//! where it is, reading it (a problem names the file and line; a file others may write is
//! refused, since whoever writes it chooses where the token goes) and writing it (mode
//! 0600, a temporary file beside it renamed over it, so a reader never sees half of it).

use std::{
    collections::BTreeMap,
    fs::{DirBuilder, OpenOptions, Permissions},
    io::Write,
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::client::CliError;

/// What the file holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contexts {
    /// The context commands use when `--context` (`MANENT_CONTEXT`) names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    #[serde(default)]
    pub contexts: BTreeMap<String, Context>,
}

/// One context: a server, the CA it is trusted with, and where its token is.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Context {
    pub server: String,
    /// A PEM file of a private CA (`--ca`), an absolute path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// The file the token is read from at each command, an absolute path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// The token itself: only when `manent context add --token` asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

impl std::fmt::Debug for Context {
    // Never the token: a context may be printed in a test failure or a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("server", &self.server)
            .field("ca", &self.ca)
            .field("token_file", &self.token_file)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish()
    }
}

/// The first lines of the file as `manent context` writes it.
const HEADER: &str = "# manent's CLI contexts, written by `manent context add|use|remove` \
                      (docs/cli.md, \"Contexts\").\n";

/// Where the file is: under `$XDG_CONFIG_HOME` when it is an absolute path, else under
/// `$HOME/.config`; `None` without either.
pub fn path() -> Option<PathBuf> {
    let absolute = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    let base =
        absolute("XDG_CONFIG_HOME").or_else(|| absolute("HOME").map(|h| h.join(".config")))?;
    Some(base.join("manent").join("config.yml"))
}

/// Reads the file at `path`: no contexts when there is none.
pub fn load(path: &Path) -> Result<Contexts, CliError> {
    let shown = path.display();
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Contexts::default()),
        Err(e) => return Err(CliError::Usage(format!("{shown}: cannot read it: {e}"))),
    };
    let mode = metadata.mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(CliError::Usage(format!(
            "{shown}: others may write it (mode {mode:04o}), and whoever writes it chooses the \
             server your token is sent to; if its content is yours, `chmod 600 {shown}`"
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("{shown}: cannot read it: {e}")))?;
    parse(&text, path)
}

/// Reads the text of the file at `path`; every problem names the file and, where it can,
/// the line.
pub fn parse(text: &str, path: &Path) -> Result<Contexts, CliError> {
    let shown = path.display();
    let fix = "fix it, or remove the file and add the contexts again (`manent context add`)";
    let contexts: Contexts = if text.trim().is_empty() {
        Contexts::default()
    } else {
        yaml_serde::from_str(text).map_err(|e| {
            let message = e.to_string();
            match e.location() {
                Some(at) => {
                    let suffix = format!(" at line {} column {}", at.line(), at.column());
                    let message = message.strip_suffix(&suffix).unwrap_or(&message);
                    CliError::Usage(format!("{shown}:{}: {message}; {fix}", at.line()))
                }
                None => CliError::Usage(format!("{shown}: {message}; {fix}")),
            }
        })?
    };
    let at = |key: &str| match line_of(text, key) {
        Some(line) => format!("{shown}:{line}"),
        None => shown.to_string(),
    };
    for (name, context) in &contexts.contexts {
        if let Err(e) = check_name(name) {
            return Err(CliError::Usage(format!(
                "{}: context `{name}` {e}; {fix}",
                at(name)
            )));
        }
        if let Err(e) = check_server(&context.server) {
            return Err(CliError::Usage(format!(
                "{}: contexts.{name}.server: `{}` {e}; {fix}",
                at(name),
                context.server
            )));
        }
    }
    if let Some(current) = &contexts.current
        && !contexts.contexts.contains_key(current)
    {
        return Err(CliError::Usage(format!(
            "{}: current: there is no context `{current}` ({}); `manent context use NAME` \
             chooses one",
            at("current"),
            known(&contexts)
        )));
    }
    Ok(contexts)
}

/// The contexts there are, for a message.
pub fn known(contexts: &Contexts) -> String {
    if contexts.contexts.is_empty() {
        "there is none yet: `manent context add NAME --server URL`".to_string()
    } else {
        let names: Vec<&str> = contexts.contexts.keys().map(String::as_str).collect();
        format!("contexts: {}", names.join(", "))
    }
}

/// The first line (from 1) where `key:` is written, at any indentation.
fn line_of(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            let l = l.trim_start().trim_start_matches(['"', '\'']);
            l.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start_matches(['"', '\'']).starts_with(':'))
        })
        .map(|i| i + 1)
}

/// A context's name: letters, digits, `-`, `_`, `.`.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err("is not a name: use letters, digits, `-`, `_` and `.`".to_string());
    }
    Ok(())
}

/// A server: an `http://` or `https://` URL.
pub fn check_server(server: &str) -> Result<(), String> {
    let url = reqwest::Url::parse(server).map_err(|e| format!("is not a URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("is not an http:// or https:// URL with a host".to_string());
    }
    Ok(())
}

/// Writes `contexts` to `path`, mode 0600 from its creation: a temporary file in the same
/// directory (0700 when it is created), synced, then renamed over the file.
pub fn save(path: &Path, contexts: &Contexts) -> Result<(), CliError> {
    let shown = path.display();
    let failed = |what: &str, e: std::io::Error| CliError::Failed(format!("{shown}: {what}: {e}"));
    let dir = path.parent().unwrap_or(Path::new("."));
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| failed("cannot create its directory", e))?;
    let body = yaml_serde::to_string(contexts)
        .map_err(|e| CliError::Failed(format!("{shown}: cannot write the contexts: {e}")))?;
    let temporary = dir.join(format!(".config.yml.{}.tmp", std::process::id()));
    // A leftover of an earlier run under the same pid, killed mid-write.
    let _ = std::fs::remove_file(&temporary);
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temporary)?;
        // 0600 whatever the umask took away from it.
        file.set_permissions(Permissions::from_mode(0o600))?;
        file.write_all(format!("{HEADER}{body}").as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(failed("cannot write it", e));
    }
    // The rename itself is durable once the directory is synced.
    if let Ok(dir) = std::fs::File::open(dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<Contexts, String> {
        parse(text, Path::new("/home/u/.config/manent/config.yml")).map_err(|e| e.to_string())
    }

    #[test]
    fn a_broken_file_is_refused_naming_the_file_and_line() {
        let check = |text: &str, want: &str| {
            let error = parsed(text).expect_err(text);
            assert!(
                error.starts_with(want),
                "the error names the file and line: {error}"
            );
        };
        check(
            "current: prod\ncontexts:\n  prod:\n    server: \"https://m.example\n",
            "/home/u/.config/manent/config.yml:5: found unexpected end of stream",
        );
        check(
            "current: prod\ncontexts:\n  prod: {server: [a]}\n",
            "/home/u/.config/manent/config.yml:3: contexts.prod.server: invalid type: sequence",
        );
        check(
            "contexts:\n  prod:\n    server: https://m.example\n    colour: blue\n",
            "/home/u/.config/manent/config.yml:4: contexts.prod: unknown field `colour`",
        );
        check(
            "current: staging\ncontexts:\n  prod: {server: \"https://m.example\"}\n",
            "/home/u/.config/manent/config.yml:1: current: there is no context `staging` \
             (contexts: prod)",
        );
        check(
            "contexts:\n  prod: {server: \"https://m.example\"}\n  \"bad name\": {server: \"x\"}\n",
            "/home/u/.config/manent/config.yml:3: context `bad name` is not a name",
        );
        check(
            "contexts:\n  prod: {server: \"ftp://m.example\"}\n",
            "/home/u/.config/manent/config.yml:2: contexts.prod.server: `ftp://m.example`",
        );
    }

    #[test]
    fn an_empty_file_has_no_contexts() {
        assert_eq!(parsed("\n"), Ok(Contexts::default()), "nothing in it");
    }

    #[test]
    fn the_file_is_written_0600_in_a_0700_directory_and_read_back() {
        let home = tempfile::tempdir().expect("a temporary directory");
        let path = home.path().join("config/manent/config.yml");
        let mut contexts = Contexts::default();
        contexts.contexts.insert(
            "prod".into(),
            Context {
                server: "https://m.example".into(),
                token_file: Some("/home/u/prod.token".into()),
                ..Context::default()
            },
        );
        contexts.current = Some("prod".into());
        save(&path, &contexts).expect("write the contexts");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").mode() & 0o777;
        assert_eq!(mode(&path), 0o600, "the file is the user's alone");
        assert_eq!(mode(path.parent().unwrap()), 0o700, "its new directory too");
        assert_eq!(
            load(&path).expect("read it back"),
            contexts,
            "what was written"
        );
        let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .expect("list the directory")
            .map(|e| e.expect("an entry").file_name())
            .collect();
        assert_eq!(leftovers, ["config.yml"], "no temporary file is left");

        std::fs::set_permissions(&path, Permissions::from_mode(0o666)).expect("chmod");
        let refused = load(&path).expect_err("a file others may write is refused");
        assert!(
            refused
                .to_string()
                .contains("others may write it (mode 0666)")
                && refused.to_string().contains("chmod 600"),
            "the refusal says why and what to do: {refused}"
        );
    }
}
