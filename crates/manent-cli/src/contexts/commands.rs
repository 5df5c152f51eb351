//! `manent context add|use|list|remove` (no server needed), and `manent whoami` with the
//! context in use and where each setting came from (docs/cli.md, "Contexts").

use std::path::{Path, PathBuf};

use clap::Subcommand;
use manent_contract::WhoAmI;
use serde_json::{Value, json};

use super::{
    file::{self, Context},
    settings::{Given, GivenValue, Settings},
};
use crate::{
    client::{Answer, ApiClient, CliError},
    render::{self, Names, Style},
};

#[derive(Subcommand)]
pub enum ContextCommand {
    /// Adds a context, or replaces the one of that name: the server (`--server`, required),
    /// its CA (`--ca`) and a file holding the token (`--token-file`). Only what is given
    /// on the command line is kept; `--token T` keeps the token itself in the file, which
    /// is less safe than a token file. The first context added becomes the current one.
    Add {
        /// The context's name: letters, digits, `-`, `_`, `.`.
        name: String,
        /// A file holding the token (its first line), read at each command.
        #[arg(long)]
        token_file: Option<PathBuf>,
    },
    /// Makes NAME the current context: commands use its server, CA and token unless a
    /// flag or a `MANENT_*` variable says otherwise.
    Use {
        /// The context's name (`manent context list`).
        name: String,
    },
    /// The contexts, the current one marked `*`.
    List,
    /// Removes a context (the token file stays where it is).
    Remove {
        /// The context's name (`manent context list`).
        name: String,
    },
}

/// Runs `command` on the contexts file at `path`, with the global flags `given`.
pub fn run(
    command: ContextCommand,
    given: &Given,
    path: Option<&Path>,
    style: &Style,
) -> Result<u8, CliError> {
    let path = path.ok_or_else(|| {
        CliError::Usage(
            "contexts need a place to be kept: set HOME or XDG_CONFIG_HOME to an absolute path"
                .to_string(),
        )
    })?;
    let mut contexts = file::load(path)?;
    let shown = path.display();
    match command {
        ContextCommand::Add { name, token_file } => {
            file::check_name(&name)
                .map_err(|e| CliError::Usage(format!("context `{name}` {e}")))?;
            let context = new_context(given, token_file)?;
            if context.token.is_some() {
                eprintln!(
                    "manent: the token is kept in {shown} (mode 0600): anyone who can read \
                     that file can use it; a --token-file can be kept elsewhere and rotated"
                );
            }
            let replaced = contexts.contexts.insert(name.clone(), context).is_some();
            if contexts.current.is_none() {
                contexts.current = Some(name.clone());
            }
            file::save(path, &contexts)?;
            let what = if replaced { "replaced" } else { "added" };
            let current = if contexts.current.as_deref() == Some(name.as_str()) {
                " (current)"
            } else {
                ""
            };
            eprintln!("context {name} {what}{current} in {shown}");
        }
        ContextCommand::Use { name } => {
            if !contexts.contexts.contains_key(&name) {
                return Err(CliError::Usage(format!(
                    "there is no context `{name}` in {shown} ({})",
                    file::known(&contexts)
                )));
            }
            contexts.current = Some(name.clone());
            file::save(path, &contexts)?;
            eprintln!("context {name} is current");
        }
        ContextCommand::List => list(&contexts, style),
        ContextCommand::Remove { name } => {
            if contexts.contexts.remove(&name).is_none() {
                return Err(CliError::Usage(format!(
                    "there is no context `{name}` in {shown} ({})",
                    file::known(&contexts)
                )));
            }
            let was_current = contexts.current.as_deref() == Some(name.as_str());
            if was_current {
                contexts.current = None;
            }
            file::save(path, &contexts)?;
            let note = if was_current {
                "; no context is current now (`manent context use NAME`)"
            } else {
                ""
            };
            eprintln!("context {name} removed{note}");
        }
    }
    Ok(0)
}

/// The context `manent context add` keeps: what the command line gave, paths made
/// absolute (a context is used from any directory).
fn new_context(given: &Given, token_file: Option<PathBuf>) -> Result<Context, CliError> {
    let on_command_line = |from: &str| from.starts_with("--");
    let server = match &given.server {
        Some(GivenValue { value, from }) if on_command_line(from) => value.clone(),
        _ => {
            return Err(CliError::Usage(
                "context add: give the server with --server URL (MANENT_SERVER is not kept)"
                    .to_string(),
            ));
        }
    };
    file::check_server(&server).map_err(|e| CliError::Usage(format!("--server `{server}` {e}")))?;
    let token = given
        .token
        .as_ref()
        .filter(|t| on_command_line(&t.from))
        .map(|t| t.value.clone());
    if token.is_some() && token_file.is_some() {
        return Err(CliError::Usage(
            "context add: give --token-file or --token, not both".to_string(),
        ));
    }
    let absolute = |flag: &str, path: &Path| {
        std::path::absolute(path)
            .map_err(|e| CliError::Usage(format!("{flag} {}: {e}", path.display())))
    };
    let token_file = token_file
        .map(|f| absolute("--token-file", &f))
        .transpose()?;
    if let Some(f) = &token_file
        && !f.is_file()
    {
        eprintln!(
            "manent: warning: the token file {} does not exist yet; commands in this context \
             will refuse to run until it does",
            f.display()
        );
    }
    let ca = match &given.ca {
        Some(GivenValue { value, from }) if on_command_line(from) => Some(absolute("--ca", value)?),
        _ => None,
    };
    Ok(Context {
        server,
        ca,
        token_file,
        token,
    })
}

/// One row of `manent context list`.
struct Row {
    name: String,
    current: bool,
    context: Context,
}

impl Names for Row {
    fn names(&self) -> Vec<String> {
        vec![self.name.clone()]
    }
}

/// `manent context list`: a table with the current context marked `*`; the token never.
fn list(contexts: &file::Contexts, style: &Style) {
    let rows: Vec<Row> = contexts
        .contexts
        .iter()
        .map(|(name, context)| Row {
            name: name.clone(),
            current: contexts.current.as_deref() == Some(name.as_str()),
            context: context.clone(),
        })
        .collect();
    let json = Value::Array(
        rows.iter()
            .map(|r| {
                json!({
                    "name": r.name,
                    "current": r.current,
                    "server": r.context.server,
                    "ca": r.context.ca,
                    "token_file": r.context.token_file,
                    "token_stored": r.context.token.is_some(),
                })
            })
            .collect(),
    );
    let answer = Answer { body: rows, json };
    render::print(style, &answer, |style, rows: &[Row]| {
        render::table(
            style,
            rows,
            &["current", "name", "server", "token", "ca"],
            |r| {
                let token = match (&r.context.token_file, &r.context.token) {
                    (Some(f), _) => format!("file {}", f.display()),
                    (None, Some(_)) => "stored".to_string(),
                    (None, None) => "-".to_string(),
                };
                let ca = r.context.ca.as_ref().map(|c| c.display().to_string());
                vec![
                    if r.current { "*" } else { "" }.to_string(),
                    r.name.clone(),
                    r.context.server.clone(),
                    token,
                    ca.unwrap_or_else(|| "-".to_string()),
                ]
            },
        )
    });
}

/// `manent whoami`: the token's name, role and scope as the server knows it, then the
/// context in use and where the server, the token and the CA came from (`-o json`: the
/// server's answer with `context` and `settings` added).
pub async fn whoami(api: &ApiClient, settings: &Settings, style: &Style) -> Result<u8, CliError> {
    let mut me: Answer<WhoAmI> = api
        .get("/api/v1/whoami")
        .await
        .map_err(|e| explained(e, settings))?;
    if let (Value::Object(answer), Value::Object(local)) = (&mut me.json, settings.to_json()) {
        answer.extend(local);
    }
    render::print(style, &me, |style, who: &WhoAmI| {
        let mut rows = vec![[
            "context".to_string(),
            settings
                .context
                .as_ref()
                .map_or("-".into(), |c| c.value.clone()),
            settings
                .context
                .as_ref()
                .map_or("-".into(), |c| c.from.clone()),
        ]];
        rows.push([
            "server".into(),
            settings.server.value.clone(),
            settings.server.from.clone(),
        ]);
        if let Some(token) = &settings.token {
            rows.push(["token".into(), "***".into(), token.from.clone()]);
        }
        if let Some(ca) = &settings.ca {
            rows.push(["ca".into(), ca.value.display().to_string(), ca.from.clone()]);
        }
        let mut text = format!(
            "{}\n\n{}",
            render::whoami(style, who),
            render::table(style, &rows, &["setting", "value", "from"], |r| r.to_vec())
        );
        if let Some(why) = &settings.context_unused {
            text.push_str(&format!("\n\n{why}"));
        }
        text
    });
    Ok(0)
}

/// `error` of a server that cannot be reached or refused the token, with where the server
/// and the token came from: what `whoami` is asked to tell.
fn explained(error: CliError, settings: &Settings) -> CliError {
    let token = settings.token.as_ref().map_or("none", |t| t.from.as_str());
    let note = format!(
        " (server from {}; token from {token})",
        settings.server.from
    );
    match error {
        CliError::Transient(m) => CliError::Transient(m + &note),
        CliError::Unreachable(m) => CliError::Unreachable(m + &note),
        other => other,
    }
}
