//! Owns an environment file's `templates`: their types, their validation, reading their
//! sources beside the environment file (bounded in size), the check of the names each one
//! uses against what a target has, and rendering one for a target with minijinja, strict
//! about undefined values (docs/environments.md, "Templates").

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{EnvironmentFile, SharedPaths};
use crate::source::Document;
use crate::{COMMAND_PLUGIN, DEFAULT_PLUGIN};

/// The largest template source read, in bytes: its text travels with each deploy request.
pub const MAX_TEMPLATE_BYTES: usize = 64 * 1024;

/// The most template text one environment file may have, in bytes, all sources together.
pub const MAX_TEMPLATES_BYTES: usize = 256 * 1024;

/// The most a template may render to, in bytes.
pub const MAX_RENDERED_BYTES: usize = 1024 * 1024;

/// A template as the environment file writes it: where its source is and where it goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateFile {
    /// The source, relative to the environment file's directory.
    pub src: String,
    /// Where it is written: relative to the release directory (`deploy.dest`), or absolute.
    pub dest: String,
    /// Its permission bits (default `0600`).
    #[serde(default)]
    pub mode: FileMode,
    /// The source's text, read with the environment file (never written in it).
    #[serde(skip)]
    pub text: Option<String>,
}

/// A template as a deploy carries it: its source's text with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Template {
    /// The source, as the environment file names it (for messages).
    pub src: String,
    /// Where it is written (see [`TemplateFile::dest`]).
    pub dest: String,
    /// Its permission bits.
    pub mode: FileMode,
    /// Its source's text.
    pub text: String,
}

/// Permission bits, written as octal text (`"0640"`); a number is read as its octal digits
/// (`640` is `0640`), since YAML reads `0640` as the decimal 640.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileMode(pub u32);

impl Default for FileMode {
    fn default() -> Self {
        FileMode(0o600)
    }
}

impl fmt::Display for FileMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

impl Serialize for FileMode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for FileMode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = serde_json::Value::deserialize(deserializer)?;
        let digits = match &raw {
            serde_json::Value::String(s) => s.trim().to_owned(),
            serde_json::Value::Number(n) => n.to_string(),
            _ => String::new(),
        };
        let refused = || {
            serde::de::Error::custom(format!(
                "`{raw}` is not a file mode; write octal permission bits such as \"0640\" (at \
                 most 0777)"
            ))
        };
        if digits.is_empty() || digits.len() > 4 {
            return Err(refused());
        }
        let mode = u32::from_str_radix(&digits, 8).map_err(|_| refused())?;
        if mode > 0o777 {
            return Err(refused());
        }
        Ok(FileMode(mode))
    }
}

/// Whether `path` is a relative path made of plain names (no `.`, `..` or empty part).
fn plain_relative(path: &str) -> bool {
    !path.starts_with('/')
        && !path.contains(['\n', '\0'])
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

/// Checks `templates`, pushing each issue to `doc`.
pub(super) fn validate(doc: &mut Document<'_>, env: &EnvironmentFile) {
    if !env.templates.is_empty()
        && ![DEFAULT_PLUGIN, COMMAND_PLUGIN].contains(&env.deploy.plugin.as_str())
    {
        doc.issue(
            "templates",
            format!(
                "are written by the {DEFAULT_PLUGIN} and {COMMAND_PLUGIN} plugins only (this \
                 environment's is `{}`); remove them, or render them in the plugin",
                env.deploy.plugin
            ),
        );
    }
    let mut dests = BTreeSet::new();
    for (i, template) in env.templates.iter().enumerate() {
        let at = |field: &str| format!("templates[{i}].{field}");
        if !plain_relative(&template.src) {
            doc.issue(
                at("src"),
                format!(
                    "`{}` must be a path relative to the environment file's directory, without \
                     `.`, `..` or empty parts (`templates/app.env.j2`)",
                    template.src
                ),
            );
        }
        let dest = template.dest.trim_end_matches('/');
        let absolute_ok = dest.starts_with('/') && plain_relative(&dest[1..]);
        if !(absolute_ok || plain_relative(dest)) || template.dest.ends_with('/') {
            doc.issue(
                at("dest"),
                format!(
                    "`{}` must be a file path relative to the release directory (`config/app.yml`) \
                     or absolute (`/etc/shop/app.env`), without `.`, `..` or empty parts",
                    template.dest
                ),
            );
        } else if !dests.insert(dest) {
            doc.issue(
                at("dest"),
                format!("`{dest}` is the dest of an earlier template; each file is written once"),
            );
        } else if let Some(shared) = &env.deploy.shared
            && let Some(path) = shared_path_over(shared, dest)
        {
            doc.issue(
                at("dest"),
                format!(
                    "`{dest}` is under the shared path `{path}` (deploy.shared), which links \
                     every release to one place; write it elsewhere in the release"
                ),
            );
        }
    }
}

/// The shared path `dest` (relative to a release) is, or is under, if any.
fn shared_path_over<'s>(shared: &'s SharedPaths, dest: &str) -> Option<&'s str> {
    shared.paths.iter().map(String::as_str).find(|path| {
        let path = path.trim_end_matches('/');
        dest == path || dest.starts_with(&format!("{path}/"))
    })
}

/// Reads the source of each template of `env` from `dir` (the environment file's
/// directory) into its `text`, each at most [`MAX_TEMPLATE_BYTES`] and all at most
/// [`MAX_TEMPLATES_BYTES`]; a source that cannot be read, lies outside `dir` (through a
/// symbolic link) or is not UTF-8 is an issue of `doc` naming it.
pub(super) fn read_sources(doc: &mut Document<'_>, env: &mut EnvironmentFile, dir: &Path) {
    let mut total = 0usize;
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    for (i, template) in env.templates.iter_mut().enumerate() {
        if !plain_relative(&template.src) {
            continue; // Refused by `validate`.
        }
        let at = format!("templates[{i}].src");
        let path = dir.join(&template.src);
        let read = path
            .canonicalize()
            .map_err(|e| format!("cannot read {}: {e}", path.display()))
            .and_then(|real| {
                if real.starts_with(&dir) {
                    Ok(real)
                } else {
                    Err(format!(
                        "{} leads outside the environment file's directory (a symbolic link); \
                         keep template sources beside the environment file",
                        path.display()
                    ))
                }
            })
            .and_then(|real| {
                let size = std::fs::metadata(&real)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?
                    .len();
                if size > MAX_TEMPLATE_BYTES as u64 {
                    return Err(format!(
                        "{} has {size} bytes, more than a template may ({MAX_TEMPLATE_BYTES}): \
                         its text travels with every deploy; split it or keep large files in \
                         an artifact",
                        path.display()
                    ));
                }
                std::fs::read_to_string(&real).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::InvalidData {
                        format!("{} is not UTF-8 text; save it as UTF-8", path.display())
                    } else {
                        format!("cannot read {}: {e}", path.display())
                    }
                })
            });
        match read {
            Ok(text) => {
                total += text.len();
                template.text = Some(text);
            }
            Err(message) => doc.issue(at, message),
        }
    }
    if total > MAX_TEMPLATES_BYTES {
        doc.issue(
            "templates",
            format!(
                "their sources have {total} bytes together, more than an environment's \
                 templates may ({MAX_TEMPLATES_BYTES}): their text travels with every deploy"
            ),
        );
    }
}

/// The minijinja environment every template is checked and rendered in: undefined values
/// are errors, nothing is escaped (these are configuration files, not HTML), a file's final
/// newline is kept, and a template's work is bounded (fuel), so that a loop cannot hold a
/// worker.
fn jinja() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .keep_trailing_newline(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_fuel(Some(5_000_000));
    env
}

/// Why a template was refused or could not be rendered. Its text names the template and the
/// line, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("template {src}{}: {message}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
pub struct TemplateError {
    /// The template's `src`.
    pub src: String,
    /// The line in its source, when known.
    pub line: Option<usize>,
    /// What is wrong and what to do.
    pub message: String,
}

impl TemplateFile {
    /// The template with its source's text, once read ([`read_sources`]).
    pub fn loaded(&self) -> Option<Template> {
        Some(Template {
            src: self.src.clone(),
            dest: self.dest.clone(),
            mode: self.mode,
            text: self.text.clone()?,
        })
    }
}

impl Template {
    fn error(&self, line: Option<usize>, message: impl Into<String>) -> TemplateError {
        TemplateError {
            src: self.src.clone(),
            line,
            message: message.into(),
        }
    }

    /// The names this template uses that `known` does not have, each with the first line
    /// using it; a syntax error is an error naming its line.
    pub fn unknown_names(
        &self,
        known: &BTreeSet<String>,
    ) -> Result<Vec<(String, Option<usize>)>, TemplateError> {
        let env = jinja();
        let template = env
            .template_from_named_str(&self.src, &self.text)
            .map_err(|e| self.error(e.line(), syntax_message(&e)))?;
        let globals: BTreeSet<&str> = env.globals().map(|(name, _)| name).collect();
        let mut unknown: Vec<(String, Option<usize>)> = template
            .undeclared_variables(false)
            .into_iter()
            .filter(|name| !known.contains(name) && !globals.contains(name.as_str()))
            .map(|name| {
                let line = line_of_name(&self.text, &name);
                (name, line)
            })
            .collect();
        unknown.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        Ok(unknown)
    }

    /// This template rendered with `values` (by name): its bytes. An undefined name, a
    /// failed filter or an output over [`MAX_RENDERED_BYTES`] is an error naming the
    /// template and the line; the message never quotes a value (the caller masks it all
    /// the same).
    pub fn render(
        &self,
        values: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<u8>, TemplateError> {
        let env = jinja();
        let template = env
            .template_from_named_str(&self.src, &self.text)
            .map_err(|e| self.error(e.line(), syntax_message(&e)))?;
        let rendered = template
            .render(minijinja::Value::from_pairs(
                values.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            ))
            .map_err(|e| {
                let message = match e.kind() {
                    minijinja::ErrorKind::UndefinedError => {
                        "uses a value that is not defined; `manent vars` lists what each target \
                         has"
                        .to_owned()
                    }
                    minijinja::ErrorKind::OutOfFuel => {
                        "does too much work (a loop too long); simplify it".to_owned()
                    }
                    _ => format!("cannot be rendered: {}", syntax_message(&e)),
                };
                self.error(e.line(), message)
            })?;
        if rendered.len() > MAX_RENDERED_BYTES {
            return Err(self.error(
                None,
                format!(
                    "renders to {} bytes, more than a template may ({MAX_RENDERED_BYTES})",
                    rendered.len()
                ),
            ));
        }
        Ok(rendered.into_bytes())
    }
}

/// The `MANENT_*` values every command and template of a target has, besides one
/// `MANENT_ARTIFACT_<NAME>` per artifact (docs/environments.md).
pub const MANENT_VALUES: [&str; 5] = [
    "MANENT_APPLICATION",
    "MANENT_ENVIRONMENT",
    "MANENT_VERSION",
    "MANENT_DEPLOY_ID",
    "MANENT_TARGET",
];

/// The variable holding artifact `name`'s path: `MANENT_ARTIFACT_` and the name upper-cased,
/// every character other than a letter or a digit made `_`.
pub fn artifact_variable(name: &str) -> String {
    let suffix: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("MANENT_ARTIFACT_{suffix}")
}

/// The first name a template uses that a target does not have, as an error naming the
/// template, the line, the name and the target; `known_for` gives a target's variables
/// and secrets. `artifacts`: the deploy's artifact names, or `None` when they are not known
/// (an environment file read alone): then any `MANENT_ARTIFACT_*` passes. The index of the
/// template comes with the error.
pub(crate) fn first_unknown<'t>(
    templates: impl IntoIterator<Item = &'t Template>,
    targets: &[super::Target],
    known_for: impl Fn(&super::Target) -> BTreeSet<String>,
    artifacts: Option<&[String]>,
) -> Option<(usize, TemplateError)> {
    let templates: Vec<&Template> = templates.into_iter().collect();
    for target in targets {
        let mut known = known_for(target);
        known.extend(MANENT_VALUES.iter().map(|n| n.to_string()));
        known.extend(
            artifacts
                .into_iter()
                .flatten()
                .map(|a| artifact_variable(a)),
        );
        for (i, template) in templates.iter().enumerate() {
            let unknown = match template.unknown_names(&known) {
                Ok(unknown) => unknown,
                Err(e) => return Some((i, e)),
            };
            let unknown = unknown
                .into_iter()
                .find(|(name, _)| artifacts.is_some() || !name.starts_with("MANENT_ARTIFACT_"));
            if let Some((name, line)) = unknown {
                return Some((
                    i,
                    template.error(
                        line,
                        format!(
                            "`{name}` is not set for target {}: it is no variable, secret or \
                             MANENT_* value of that target; set it in variables: (or in \
                             scoped_variables: for that target), or correct the name",
                            target.name
                        ),
                    ),
                ));
            }
        }
    }
    None
}

/// A minijinja error's own words, without its place (shown apart) or the template's text.
fn syntax_message(error: &minijinja::Error) -> String {
    match error.detail() {
        Some(detail) => format!("{}: {detail}", error.kind()),
        None => error.kind().to_string(),
    }
}

/// The first line (1-based) where `name` is used in a tag or an expression of `text` as a
/// whole name (not an attribute, not inside a string or a comment).
fn line_of_name(text: &str, name: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let ident = |b: u8| b == b'_' || b.is_ascii_alphanumeric();
    let (mut line, mut i) = (1, 0);
    let mut inside: Option<&[u8]> = None; // the closing delimiter of the tag we are in
    let mut quote: Option<u8> = None;
    while i < bytes.len() {
        let rest = &bytes[i..];
        match (inside, quote) {
            (_, Some(q)) => {
                if rest[0] == b'\\' {
                    i += 1;
                } else if rest[0] == q {
                    quote = None;
                }
            }
            (None, None) => {
                if rest.starts_with(b"{{") {
                    inside = Some(b"}}");
                    i += 1;
                } else if rest.starts_with(b"{%") {
                    inside = Some(b"%}");
                    i += 1;
                } else if rest.starts_with(b"{#") {
                    inside = Some(b"#}");
                    i += 1;
                }
            }
            (Some(close), None) => {
                if rest.starts_with(close) {
                    inside = None;
                    i += 1;
                } else if close != b"#}" && (rest[0] == b'"' || rest[0] == b'\'') {
                    quote = Some(rest[0]);
                } else if close != b"#}"
                    && rest.starts_with(name.as_bytes())
                    && (i == 0 || !(ident(bytes[i - 1]) || bytes[i - 1] == b'.'))
                    && !bytes.get(i + name.len()).copied().is_some_and(ident)
                {
                    return Some(line);
                }
            }
        }
        if bytes[i] == b'\n' {
            line += 1;
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests;
