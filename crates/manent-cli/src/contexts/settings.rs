//! The server, token and CA a command uses, and where each came from: a flag over a
//! `MANENT_*` variable over the context in use over the default (docs/cli.md,
//! "Contexts"). A context's token and CA go only to its own server: with another server
//! named by a flag or a variable, they are not used.

use std::path::{Path, PathBuf};

use clap::{ArgMatches, parser::ValueSource};
use serde_json::{Value, json};

use super::file::{self, Context, Contexts};
use crate::client::{ApiClient, CliError};

/// The server when nothing names one.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8080";

/// A value given on the command line or in the environment, and which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GivenValue<T> {
    pub value: T,
    /// `--server` or `MANENT_SERVER`.
    pub from: String,
}

/// What the command line and the environment give (clap reads both).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Given {
    pub server: Option<GivenValue<String>>,
    pub token: Option<GivenValue<String>>,
    pub ca: Option<GivenValue<PathBuf>>,
    pub context: Option<GivenValue<String>>,
}

impl Given {
    /// Read from the parsed arguments `matches`: each global argument with where clap
    /// found it.
    pub fn of(matches: &ArgMatches) -> Given {
        fn given<T: Clone + Send + Sync + 'static>(
            matches: &ArgMatches,
            id: &str,
            variable: &str,
        ) -> Option<GivenValue<T>> {
            let value = matches.try_get_one::<T>(id).ok().flatten()?.clone();
            let from = match matches.value_source(id)? {
                ValueSource::CommandLine => format!("--{id}"),
                ValueSource::EnvVariable => variable.to_string(),
                _ => return None,
            };
            Some(GivenValue { value, from })
        }
        Given {
            server: given(matches, "server", "MANENT_SERVER"),
            token: given(matches, "token", "MANENT_TOKEN"),
            ca: given(matches, "ca", "MANENT_CA"),
            context: given(matches, "context", "MANENT_CONTEXT"),
        }
    }
}

/// A setting in use and where it came from (`--server`, `MANENT_SERVER`, `context prod`,
/// `default`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting<T> {
    pub value: T,
    pub from: String,
}

/// What a command talks to the API with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The contexts file, when there is a place for one.
    pub file: Option<PathBuf>,
    /// The context in use, and why (`--context`, `MANENT_CONTEXT`, `current`).
    pub context: Option<Setting<String>>,
    /// Why the context's token and CA are not used, when they are not.
    pub context_unused: Option<String>,
    pub server: Setting<String>,
    /// The token (never printed); `from` says where it was read.
    pub token: Option<Setting<String>>,
    pub ca: Option<Setting<PathBuf>>,
}

/// The settings of a command given `given`, over the contexts file at `path` (if any).
pub fn resolve(given: &Given, path: Option<&Path>) -> Result<Settings, CliError> {
    let contexts = match path {
        Some(path) => file::load(path)?,
        None => Contexts::default(),
    };
    let shown = path.map_or_else(
        || "the contexts file".to_string(),
        |p| p.display().to_string(),
    );
    let context = match &given.context {
        Some(GivenValue { value, from }) => {
            if !contexts.contexts.contains_key(value) {
                return Err(CliError::Usage(format!(
                    "{from}: there is no context `{value}` in {shown} ({})",
                    file::known(&contexts)
                )));
            }
            Some(Setting {
                value: value.clone(),
                from: from.clone(),
            })
        }
        None => contexts.current.clone().map(|value| Setting {
            value,
            from: format!("current in {shown}"),
        }),
    };
    let in_use: Option<(&str, &Context)> = context
        .as_ref()
        .and_then(|c| contexts.contexts.get_key_value(&c.value))
        .map(|(name, c)| (name.as_str(), c));
    let server = match (&given.server, in_use) {
        (Some(g), _) => Setting {
            value: g.value.clone(),
            from: g.from.clone(),
        },
        (None, Some((name, c))) => Setting {
            value: c.server.clone(),
            from: format!("context {name}"),
        },
        (None, None) => Setting {
            value: DEFAULT_SERVER.to_string(),
            from: "default".to_string(),
        },
    };
    // A context's token goes to its own server only.
    let (applied, context_unused) = match in_use {
        Some((name, c)) if same_server(&c.server, &server.value) => (Some((name, c)), None),
        Some((name, c)) => (
            None,
            Some(format!(
                "{} names {}, not context {name}'s server {}: its token and CA are not used",
                server.from, server.value, c.server
            )),
        ),
        None => (None, None),
    };
    let token = match (&given.token, applied) {
        (Some(g), _) => Some(Setting {
            value: g.value.clone(),
            from: g.from.clone(),
        }),
        (None, Some((name, c))) => context_token(name, c, &shown)?,
        (None, None) => None,
    };
    let ca = match (&given.ca, applied) {
        (Some(g), _) => Some(Setting {
            value: g.value.clone(),
            from: g.from.clone(),
        }),
        (None, Some((name, c))) => c.ca.clone().map(|value| Setting {
            value,
            from: format!("context {name}"),
        }),
        (None, None) => None,
    };
    Ok(Settings {
        file: path.map(Path::to_path_buf),
        context,
        context_unused,
        server,
        token,
        ca,
    })
}

/// Whether two server URLs are the same server (a trailing `/` aside).
fn same_server(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// Context `name`'s token: the one stored in the file, else its token file's first line.
fn context_token(
    name: &str,
    context: &Context,
    shown: &str,
) -> Result<Option<Setting<String>>, CliError> {
    if let Some(token) = &context.token {
        return Ok(Some(Setting {
            value: token.clone(),
            from: format!("context {name} (stored in {shown})"),
        }));
    }
    let Some(token_file) = &context.token_file else {
        return Ok(None);
    };
    let path = token_file.display();
    let read = std::fs::read_to_string(token_file).map_err(|e| {
        CliError::Usage(format!(
            "context {name} ({shown}): its token file {path} cannot be read: {e}; create it \
             (`chmod 600`), or add the context again with the right --token-file"
        ))
    })?;
    let token = read.lines().next().unwrap_or_default().trim().to_string();
    if token.is_empty() {
        return Err(CliError::Usage(format!(
            "context {name} ({shown}): its token file {path} is empty; write the token in it"
        )));
    }
    warn_if_others_may_read(token_file);
    Ok(Some(Setting {
        value: token,
        from: format!("context {name} (token file {path})"),
    }))
}

/// Says on stderr that a token file others may read should not be.
fn warn_if_others_may_read(path: &Path) {
    use std::os::unix::fs::MetadataExt;
    if let Ok(metadata) = std::fs::metadata(path)
        && metadata.mode() & 0o077 != 0
    {
        eprintln!(
            "manent: warning: the token file {} may be read by others (mode {:04o}): `chmod 600 {}`",
            path.display(),
            metadata.mode() & 0o777,
            path.display()
        );
    }
}

impl Settings {
    /// A client of the API with these settings.
    pub fn client(&self) -> Result<ApiClient, CliError> {
        ApiClient::new(
            &self.server.value,
            self.token.as_ref().map(|t| t.value.clone()),
            self.ca.as_ref().map(|c| c.value.as_path()),
        )
        .map_err(|e| match &self.ca {
            Some(ca) => CliError::Usage(format!("{e} (the CA from {})", ca.from)),
            None => e,
        })
    }

    /// The settings as `manent whoami -o json` adds them: each with where it came from,
    /// never the token itself.
    pub fn to_json(&self) -> Value {
        let setting = |value: Value, from: &str| json!({"value": value, "from": from});
        json!({
            "context": self.context.as_ref().map(|c| c.value.clone()),
            "settings": {
                "context": self.context.as_ref().map(|c| setting(json!(c.value), &c.from)),
                "server": setting(json!(self.server.value), &self.server.from),
                "token": self.token.as_ref().map(|t| setting(json!("***"), &t.from)),
                "ca": self.ca.as_ref().map(|c| setting(json!(c.value), &c.from)),
                "context_unused": self.context_unused,
                "file": self.file,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A contexts file with `prod` (current, its token in a file) and `lab` (a stored token).
    fn site() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let token_file = dir.path().join("prod.token");
        std::fs::write(&token_file, "mnt_prod\n").expect("write the token file");
        let path = dir.path().join("config.yml");
        let mut contexts = Contexts {
            current: Some("prod".into()),
            ..Contexts::default()
        };
        contexts.contexts.insert(
            "prod".into(),
            Context {
                server: "https://prod.example".into(),
                ca: Some("/etc/prod-ca.pem".into()),
                token_file: Some(token_file),
                token: None,
            },
        );
        contexts.contexts.insert(
            "lab".into(),
            Context {
                server: "http://lab.example:8080".into(),
                token: Some("mnt_lab".into()),
                ..Context::default()
            },
        );
        file::save(&path, &contexts).expect("write the contexts");
        (dir, path)
    }

    fn given(from: &str, value: &str) -> Option<GivenValue<String>> {
        Some(GivenValue {
            value: value.into(),
            from: from.into(),
        })
    }

    /// (server, its origin, token, its origin) of `given` over the site's file.
    fn used(given: &Given, path: &Path) -> (String, String, Option<String>, Option<String>) {
        let s = resolve(given, Some(path)).expect("settings");
        let from_dir = |t: &str| t.replace(&*path.parent().unwrap().to_string_lossy(), "DIR");
        (
            s.server.value,
            s.server.from,
            s.token.as_ref().map(|t| t.value.clone()),
            s.token.map(|t| from_dir(&t.from)),
        )
    }

    #[test]
    fn a_flag_wins_over_a_variable_which_wins_over_the_context() {
        let (_dir, path) = site();
        let some = |v: &str| Some(v.to_string());
        assert_eq!(
            used(&Given::default(), &path),
            (
                "https://prod.example".into(),
                "context prod".into(),
                some("mnt_prod"),
                some("context prod (token file DIR/prod.token)")
            ),
            "the current context"
        );
        let variable = Given {
            token: given("MANENT_TOKEN", "mnt_env"),
            ..Given::default()
        };
        assert_eq!(
            used(&variable, &path).2.as_deref(),
            Some("mnt_env"),
            "a variable wins over the context"
        );
        let chosen = Given {
            context: given("--context", "lab"),
            ..Given::default()
        };
        assert_eq!(
            used(&chosen, &path),
            (
                "http://lab.example:8080".into(),
                "context lab".into(),
                some("mnt_lab"),
                some("context lab (stored in DIR/config.yml)")
            ),
            "--context chooses another context"
        );
        let elsewhere = Given {
            server: given("--server", "https://other.example"),
            ..Given::default()
        };
        let s = resolve(&elsewhere, Some(&path)).expect("settings");
        assert_eq!(
            (s.server.from.as_str(), s.token.is_none(), s.ca.is_none()),
            ("--server", true, true),
            "another server from a flag gets neither the context's token nor its CA: {s:?}"
        );
        assert!(
            s.context_unused.is_some_and(|why| why.contains("not used")),
            "and whoami can say why"
        );
    }

    #[test]
    fn without_a_file_or_a_context_the_default_server_and_no_token() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let s = resolve(&Given::default(), Some(&dir.path().join("config.yml"))).expect("settings");
        assert_eq!(
            (
                s.server.value.as_str(),
                s.server.from.as_str(),
                s.token,
                s.context
            ),
            (DEFAULT_SERVER, "default", None, None),
            "no file, no context"
        );
    }

    #[test]
    fn a_missing_token_file_is_named_in_the_error() {
        let (dir, path) = site();
        std::fs::remove_file(dir.path().join("prod.token")).expect("remove the token file");
        let error = resolve(&Given::default(), Some(&path)).expect_err("no token file");
        assert!(
            error.to_string().contains("context prod")
                && error.to_string().contains("prod.token cannot be read"),
            "the error names the context and its token file: {error}"
        );
        let unknown = Given {
            context: given("MANENT_CONTEXT", "nope"),
            ..Given::default()
        };
        let error = resolve(&unknown, Some(&path)).expect_err("an unknown context");
        assert!(
            error
                .to_string()
                .starts_with("MANENT_CONTEXT: there is no context `nope`")
                && error.to_string().contains("contexts: lab, prod"),
            "an unknown context is refused, naming the ones there are: {error}"
        );
    }
}
