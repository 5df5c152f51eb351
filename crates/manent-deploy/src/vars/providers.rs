//! Reading one secret's value on the worker, from the provider its environment file names:
//! a file, a variable of the worker, a command (its stdout) or an age-encrypted file
//! (docs/environments.md, "Secret providers"). An error names the secret and where it was
//! looked for, never a value nor what a command printed.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use manent_model::SecretSource;
use manent_ssh::{Connection, LocalConnection, Stream};

/// How long a `command` provider may run when its `timeout` is not written.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// The most a `command` provider may print on stdout: a secret, not a file.
pub const MAX_COMMAND_OUTPUT: usize = 1024 * 1024;

/// Why a secret could not be read on this worker. It names the secret and where it was
/// looked for, never a value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("secret {name}: cannot read {} on this worker: {error}", file.display())]
    File {
        name: String,
        file: PathBuf,
        error: std::io::Error,
    },
    #[error("secret {name}: the worker has no variable {var} (or it is not UTF-8)")]
    Variable { name: String, var: String },
    #[error("secret {name}: names neither a file nor a variable")]
    NoSource { name: String },
    /// What a `command` provider did wrong; its output is never quoted (it may be the
    /// secret, or part of it).
    #[error(
        "secret {name}: its command {why} (its output is not shown: run the command on the \
         worker to see it)"
    )]
    Command { name: String, why: String },
    #[error("secret {name}: cannot decrypt {}: {why}", file.display())]
    Age {
        name: String,
        file: PathBuf,
        why: String,
    },
    #[error(
        "secret {name}: {} is relative to the environment file, whose directory this worker \
         does not know here",
        path.display()
    )]
    NoDirectory { name: String, path: PathBuf },
}

/// What a provider needs besides the source: where the environment file is on this worker
/// (relative paths, a command's working directory) and the worker variables a command may
/// see (`inherit_env`).
#[derive(Debug, Clone, Default)]
pub struct ProviderContext {
    /// The environment file's directory on this worker, if known.
    pub environment_dir: Option<PathBuf>,
    /// The environment file's `inherit_env`.
    pub inherit_env: Vec<String>,
}

impl ProviderContext {
    /// `path` as the worker opens it: absolute as written, else under the environment
    /// file's directory.
    fn locate(&self, name: &str, path: &Path) -> Result<PathBuf, SecretError> {
        if path.is_absolute() {
            return Ok(path.to_path_buf());
        }
        self.environment_dir
            .as_ref()
            .map(|dir| dir.join(path))
            .ok_or_else(|| SecretError::NoDirectory {
                name: name.to_owned(),
                path: path.to_path_buf(),
            })
    }
}

/// Reads the secret `name` from `source`. Each provider's value loses one final newline.
pub async fn read(
    name: &str,
    source: &SecretSource,
    context: &ProviderContext,
) -> Result<String, SecretError> {
    let value = if let Some(command) = &source.command {
        run_command(name, command, source.timeout, context).await?
    } else if let Some(age) = &source.age {
        let file = context.locate(name, age)?;
        let identity = match &source.identity {
            Some(identity) => context.locate(name, identity)?,
            None => {
                return Err(SecretError::Age {
                    name: name.to_owned(),
                    file,
                    why: "no identity file is named".to_owned(),
                });
            }
        };
        let (owned, at) = (name.to_owned(), file.clone());
        tokio::task::spawn_blocking(move || decrypt_age(&owned, &at, &identity))
            .await
            .map_err(|e| SecretError::Age {
                name: name.to_owned(),
                file,
                why: format!("the decryption stopped: {e}"),
            })??
    } else if let Some(file) = &source.file {
        tokio::fs::read_to_string(file)
            .await
            .map_err(|error| SecretError::File {
                name: name.to_owned(),
                file: file.clone(),
                error,
            })?
    } else if let Some(var) = &source.env {
        std::env::var(var).map_err(|_| SecretError::Variable {
            name: name.to_owned(),
            var: var.clone(),
        })?
    } else {
        return Err(SecretError::NoSource {
            name: name.to_owned(),
        });
    };
    Ok(match value.strip_suffix('\n') {
        Some(stripped) => stripped.to_owned(),
        None => value,
    })
}

/// Runs a `command` provider on the worker as a `host: local` command runs (`sh -c`, the
/// worker's `PATH`, `HOME` and `LANG` and the `inherit_env` variables, nothing else of its
/// environment; killed with its process group when it times out), in the environment file's
/// directory. Its stdout is the value: a failure, a timeout, nothing printed or too much
/// printed is an error that quotes none of it.
async fn run_command(
    name: &str,
    command: &str,
    timeout: Option<Duration>,
    context: &ProviderContext,
) -> Result<String, SecretError> {
    let refuse = |why: String| SecretError::Command {
        name: name.to_owned(),
        why,
    };
    let script = match &context.environment_dir {
        Some(dir) => format!(
            "cd -- {} || exit 125\n{command}",
            manent_ssh::shell_quote(&dir.display().to_string())
        ),
        None => command.to_owned(),
    };
    let env: Vec<(String, String)> = context
        .inherit_env
        .iter()
        .filter_map(|var| std::env::var(var).ok().map(|value| (var.clone(), value)))
        .collect();
    let stdout = Mutex::new(Vec::new());
    let too_much = std::sync::atomic::AtomicBool::new(false);
    let take = |stream: Stream, bytes: &[u8]| {
        if stream != Stream::Stdout {
            return;
        }
        let mut held = stdout.lock().unwrap_or_else(|e| e.into_inner());
        if held.len() + bytes.len() > MAX_COMMAND_OUTPUT {
            too_much.store(true, std::sync::atomic::Ordering::Relaxed);
        } else {
            held.extend_from_slice(bytes);
        }
    };
    let limit = timeout.unwrap_or(DEFAULT_COMMAND_TIMEOUT);
    // Dropped when the limit passes: the local transport then kills the command's group.
    let status = tokio::time::timeout(
        limit,
        LocalConnection::new().exec_streaming(&script, &env, &take),
    )
    .await
    .map_err(|_| {
        refuse(format!(
            "did not finish within {} (secrets.{name}.timeout); it was stopped",
            humantime::format_duration(limit)
        ))
    })?
    .map_err(|e| refuse(format!("could not be started: {e}")))?;
    if too_much.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(refuse(format!(
            "printed more than {MAX_COMMAND_OUTPUT} bytes; a secret is its whole stdout"
        )));
    }
    match status {
        0 => {}
        125 if context.environment_dir.is_some() => {
            return Err(refuse(format!(
                "could not run in the environment file's directory {} on this worker",
                context
                    .environment_dir
                    .as_deref()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default()
            )));
        }
        status => return Err(refuse(format!("exited with {status}"))),
    }
    let bytes = stdout.into_inner().unwrap_or_else(|e| e.into_inner());
    let value = String::from_utf8(bytes)
        .map_err(|_| refuse("printed text that is not UTF-8".to_owned()))?;
    if value.trim_end_matches(['\n', '\r']).is_empty() {
        return Err(refuse("printed nothing".to_owned()));
    }
    Ok(value)
}

/// Decrypts the age file `file` with the identities of `identity` (an age identity file:
/// `AGE-SECRET-KEY-1…` lines, comments allowed); armored (`age -a`) or binary.
fn decrypt_age(name: &str, file: &Path, identity: &Path) -> Result<String, SecretError> {
    let refuse = |why: String| SecretError::Age {
        name: name.to_owned(),
        file: file.to_path_buf(),
        why,
    };
    let identities = age::IdentityFile::from_file(identity.display().to_string())
        .map_err(|e| {
            refuse(format!(
                "cannot read the identity file {}: {e}",
                identity.display()
            ))
        })?
        .into_identities()
        .map_err(|e| {
            refuse(format!(
                "the identity file {} is not usable: {e}",
                identity.display()
            ))
        })?;
    let input = std::fs::File::open(file).map_err(|e| refuse(format!("cannot open it: {e}")))?;
    let reader = age::armor::ArmoredReader::new(std::io::BufReader::new(input));
    let decryptor = age::Decryptor::new(reader).map_err(|e| refuse(e.to_string()))?;
    let mut plain = decryptor
        .decrypt(identities.iter().map(|i| i.as_ref() as &dyn age::Identity))
        .map_err(|e| {
            refuse(format!(
                "{e} (with the identities of {}); encrypt it to this worker's recipient",
                identity.display()
            ))
        })?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut plain, &mut bytes)
        .map_err(|e| refuse(format!("its content is damaged: {e}")))?;
    String::from_utf8(bytes).map_err(|_| refuse("its content is not UTF-8 text".to_owned()))
}

#[cfg(test)]
mod tests;
