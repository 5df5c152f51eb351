//! What happens on one target: the built-in plugins (`remote-copy`, `command`),
//! their dry-run plans, the checks (an HTTP one through the port, `crate::http`), and
//! re-activating the previous version.
//! Each operation is idempotent, so rerunning it after a crash gives the same
//! result (docs/scaling-and-recovery.md: steps and plugins must be safe to run twice).

use std::{sync::Arc, time::Duration};

use manent_engine::OutputWriter;
use manent_model::{CheckKind, EffectiveDescriptor, Target};
use manent_ssh::{Address, Connection, ConnectionPool, TransportError};
use serde::{Deserialize, Serialize};

use crate::http::HttpFetch;
use crate::run::artifacts::{ArtifactError, LocalArtifact};
use crate::run::printed::Printed;
use crate::run::release_scripts;
use crate::run::secrets::{SecretError, Secrets};

/// Why an operation on one target failed. Its text is recorded and shown, so every field
/// that may quote a target's output holds it with the deploy's secrets already masked
/// (docs/security.md, "Secrets").
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// Shown beside the target's name (status, logs, the page): the text does not repeat it.
    #[error("{error}")]
    Connect {
        target: String,
        error: TransportError,
    },
    #[error("remote-copy needs deploy.dest in the environment file")]
    NoDest,
    #[error("upload to {remote}: {error}")]
    Upload {
        remote: String,
        error: TransportError,
    },
    #[error("`{command}` exited with {status}: {stderr}")]
    Exited {
        command: String,
        status: i32,
        /// The end of its stderr (at most 2,000 bytes), secrets masked.
        stderr: String,
    },
    /// A transport failure while running a command or reading the target; the text is
    /// masked, as a remote command's failure quotes its stderr.
    #[error("{0}")]
    Transport(String),
    #[error("{dest}: {free} bytes free, {needed} needed")]
    NoSpace {
        dest: String,
        free: u64,
        needed: u64,
    },
    #[error("a check failed: {0}")]
    Check(String),
    #[error("timed out after {0:?}")]
    TimedOut(Duration),
    /// A fast rollback found a release it cannot vouch for (docs/cli.md, "Releases").
    #[error(
        "{found} is in the release directory {dest} and manent did not write it: a fast \
         rollback reactivates only a release that holds what manent wrote there (its \
         artifacts, its shared links); remove it on the target, or remove the release \
         directory (the rollback then uploads the release again), and roll back again"
    )]
    ReleaseAltered { dest: String, found: String },
    #[error(
        "{0} is a symbolic link where a directory is expected; nothing was done through it: \
         make it a directory on the target"
    )]
    LinkedDirectory(String),
    /// One of manent's own scripts on the target failed (`release_scripts`): why, in the
    /// sentences it said, never the script itself.
    #[error("{0}")]
    Script(String),
    #[error("artifact {0} is missing from the work directory after its fetch")]
    ArtifactMissing(String),
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
}

impl TargetError {
    /// Whether another attempt may succeed: a connection or transport failure may pass; a
    /// missing `dest`, a full disk, a refused or corrupt artifact or a missing secret
    /// will not.
    pub fn is_transient(&self) -> bool {
        match self {
            TargetError::Connect { .. }
            | TargetError::Upload { .. }
            | TargetError::Transport(_)
            | TargetError::TimedOut(_)
            | TargetError::Check(_)
            | TargetError::Exited { .. } => true,
            TargetError::Artifact(e) => e.is_transient(),
            TargetError::NoDest
            | TargetError::NoSpace { .. }
            | TargetError::ArtifactMissing(_)
            | TargetError::ReleaseAltered { .. }
            | TargetError::LinkedDirectory(_)
            | TargetError::Script(_)
            | TargetError::Secret(_) => false,
        }
    }

    /// This error of [`run`] when what ran was one of manent's own scripts
    /// (`release_scripts`): a non-zero exit says why in the script's own sentence, never
    /// by quoting the script.
    pub fn of_own_script(self) -> TargetError {
        match self {
            TargetError::Exited { status, stderr, .. } => {
                TargetError::Script(release_scripts::failure(&stderr, status))
            }
            other => other,
        }
    }
}

/// One target's state in a deploy. Recorded (in `target:<name>` events and in the steps
/// and results of deploys and region passes) as its text, `deployed`, `rolled_back`, …, the
/// names the API shows; a text this build does not know (a newer worker's) is kept as
/// written (`Other`), never refused, so every recorded deploy replays and reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TargetState {
    Pending,
    Deploying,
    Deployed,
    Failed,
    RolledBack,
    /// What a dry run found it would do.
    Planned,
    /// Its deploy was cancelled before it finished.
    Cancelled,
    /// A state this build does not know, kept as written.
    Other(String),
}

impl TargetState {
    pub fn as_str(&self) -> &str {
        match self {
            TargetState::Pending => "pending",
            TargetState::Deploying => "deploying",
            TargetState::Deployed => "deployed",
            TargetState::Failed => "failed",
            TargetState::RolledBack => "rolled_back",
            TargetState::Planned => "planned",
            TargetState::Cancelled => "cancelled",
            TargetState::Other(text) => text,
        }
    }

    /// The state `text` names, or `Other(text)`.
    pub fn parse(text: &str) -> Self {
        match text {
            "pending" => TargetState::Pending,
            "deploying" => TargetState::Deploying,
            "deployed" => TargetState::Deployed,
            "failed" => TargetState::Failed,
            "rolled_back" => TargetState::RolledBack,
            "planned" => TargetState::Planned,
            "cancelled" => TargetState::Cancelled,
            other => TargetState::Other(other.to_string()),
        }
    }
}

impl std::fmt::Display for TargetState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for TargetState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for TargetState {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for TargetState {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(|text| TargetState::parse(&text))
    }
}

/// The outcome of one target, published as the event `target:<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetOutcome {
    pub name: String,
    /// Persisted as its text (`deployed`, `failed`, …); a value this build does not know
    /// is kept as written (`TargetState::Other`).
    pub status: TargetState,
    pub detail: Option<String>,
    /// Whether this deploy switched the target to the new version.
    #[serde(default)]
    pub switched: bool,
    /// The `once` tasks that succeeded on this target after its activate (docs/environments.md,
    /// "Irreversible deploys"). Left out when none, so outcomes read and write as before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub once_tasks: Vec<String>,
    /// Under the `container` plugin, what the target runs behind its proxy (docs/containers.md).
    /// Left out otherwise, so outcomes read and write as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<manent_model::RunningContainer>,
}

impl TargetOutcome {
    pub fn new(name: &str, status: TargetState, detail: Option<String>) -> Self {
        TargetOutcome {
            name: name.to_string(),
            status,
            detail,
            switched: false,
            once_tasks: Vec::new(),
            container: None,
        }
    }
}

/// How the rollback of one switched target went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RollbackResult {
    /// The previous version runs again.
    Restored { version: String },
    /// The rollback itself failed: the target still runs the new version.
    Failed(String),
    /// No earlier successful deploy to return to (a first deploy), or it has no way
    /// back (no `activate`): the target is left as it is.
    NothingToRestore(String),
}

impl TargetOutcome {
    /// This target's outcome after its rollback: `rolled_back` only when the previous
    /// version runs again; a failed rollback is `failed`, and a target with nothing to
    /// return to keeps its status. The deploy's own detail comes first.
    pub fn after_rollback(&self, result: &RollbackResult) -> TargetOutcome {
        let before = self.detail.clone().unwrap_or_default();
        let (status, note, switched) = match result {
            RollbackResult::Restored { version } => (
                TargetState::RolledBack,
                format!("re-activated {version}"),
                false,
            ),
            RollbackResult::Failed(why) => {
                (TargetState::Failed, format!("rollback failed: {why}"), true)
            }
            RollbackResult::NothingToRestore(why) => (
                self.status.clone(),
                format!("not rolled back: {why}"),
                self.switched,
            ),
        };
        TargetOutcome {
            name: self.name.clone(),
            status,
            detail: Some(if before.is_empty() {
                note
            } else {
                format!("{before}; {note}")
            }),
            switched,
            once_tasks: self.once_tasks.clone(),
            container: self.container.clone(),
        }
    }
}

/// The address of a target for the transport.
pub fn address(eff: &EffectiveDescriptor, target: &Target) -> Address {
    if target.is_local() {
        return Address::local();
    }
    let user = eff
        .ssh_user_for(target)
        .map(str::to_string)
        .unwrap_or_else(current_user);
    Address::new(&target.host, target.port, user)
}

fn current_user() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "root".into())
}

/// The environment every command on a target sees (docs/environments.md).
pub fn command_env(
    eff: &EffectiveDescriptor,
    deploy_id: &str,
    target: &Target,
    artifacts: &[LocalArtifact],
) -> Vec<(String, String)> {
    let mut env = vec![
        ("MANENT_APPLICATION".to_string(), eff.application.clone()),
        ("MANENT_ENVIRONMENT".to_string(), eff.environment.clone()),
        ("MANENT_VERSION".to_string(), eff.version.clone()),
        ("MANENT_DEPLOY_ID".to_string(), deploy_id.to_string()),
        ("MANENT_TARGET".to_string(), target.name.clone()),
    ];
    for a in artifacts {
        // Where the artifact is for the command: its place on the target for
        // remote-copy, the worker's copy otherwise.
        let path = match eff.dest_for(target) {
            Some(dest) if eff.plugin == manent_model::DEFAULT_PLUGIN => {
                format!("{}/{}", dest.trim_end_matches('/'), a.name)
            }
            _ => a.path.display().to_string(),
        };
        env.push((manent_model::artifact_variable(&a.name), path));
    }
    env
}

pub async fn connection(
    pool: &ConnectionPool,
    eff: &EffectiveDescriptor,
    target: &Target,
) -> Result<Arc<dyn Connection>, TargetError> {
    pool.get(&address(eff, target))
        .await
        .map_err(|error| TargetError::Connect {
            target: target.name.clone(),
            error,
        })
}

/// remote-copy: puts one artifact at `<dest>/<name>` (via `.part` and rename).
pub async fn upload(
    pool: &ConnectionPool,
    eff: &EffectiveDescriptor,
    target: &Target,
    artifact: &LocalArtifact,
) -> Result<String, TargetError> {
    let dest = eff.dest_for(target).ok_or(TargetError::NoDest)?;
    let remote = format!("{}/{}", dest.trim_end_matches('/'), artifact.name);
    let conn = connection(pool, eff, target).await?;
    // Never written through a link where the release's directory belongs: a release
    // directory made a link to `/etc` would otherwise receive the artifact there. The
    // release directory is made with the target user's umask, or `deploy.mode`.
    let directories = release_scripts::release_directories(eff, target);
    let prepared = conn
        .exec(
            &release_scripts::prepare_release(&directories, &dest, eff.mode),
            &[],
        )
        .await
        .map_err(transport)?;
    match prepared.status {
        0 => {}
        release_scripts::RELEASE_LINKED => {
            return Err(TargetError::LinkedDirectory(
                prepared.stdout.trim_end_matches('\n').to_string(),
            ));
        }
        status => {
            return Err(TargetError::Exited {
                command: format!("the preparation of the release directory {dest}"),
                status,
                stderr: prepared.stderr.trim_end().to_string(),
            });
        }
    }
    let mode = release_scripts::artifact_mode(&prepared.stdout, eff.mode).ok_or_else(|| {
        TargetError::Transport(format!(
            "the target's umask could not be read (its shell printed {:?}); a POSIX shell \
             prints it with `umask`",
            prepared.stdout.trim_end()
        ))
    })?;
    // The `.part` is verified against the artifact's sha256 before the rename, so a bad
    // copy never lands under the real name; it keeps the mode of the worker's private copy
    // (0600) until then.
    conn.put_file_verified(&artifact.path, &remote, &artifact.sha256)
        .await
        .map_err(|error| TargetError::Upload {
            remote: remote.clone(),
            error,
        })?;
    let chmod = format!("chmod {mode:04o} -- {}", manent_ssh::shell_quote(&remote));
    let changed = conn.exec(&chmod, &[]).await.map_err(transport)?;
    if changed.status != 0 {
        return Err(TargetError::Exited {
            command: chmod,
            status: changed.status,
            stderr: changed.stderr.trim_end().to_string(),
        });
    }
    Ok(remote)
}

/// Whether `target` still holds this deploy's release: every artifact at `<dest>/<name>`
/// with its sha256 (a fast rollback reactivates it in place). A release that holds
/// anything else manent did not write there ([`release_scripts::release_check`]) is refused: a fast
/// rollback vouches for every file it makes live again, and an upload would leave that
/// file in place (docs/cli.md, "Releases: rollback and redeploy").
pub async fn release_in_place(
    pool: &ConnectionPool,
    eff: &EffectiveDescriptor,
    target: &Target,
) -> Result<bool, TargetError> {
    let dest = eff.dest_for(target).ok_or(TargetError::NoDest)?;
    let conn = connection(pool, eff, target).await?;
    // What manent writes in a release: the artifacts and the templates under it.
    let names: Vec<&str> = eff
        .artifact_names()
        .chain(
            eff.templates
                .iter()
                .map(|t| t.dest.as_str())
                .filter(|dest| !dest.starts_with('/')),
        )
        .collect();
    let shared = eff
        .shared_for(target)
        .map(|(_, paths)| paths)
        .unwrap_or_default();
    let script = release_scripts::release_check(
        &release_scripts::release_directories(eff, target),
        &dest,
        &names,
        &shared,
    );
    let checked = conn
        .exec(&script, &[])
        .await
        .map_err(|e| TargetError::Transport(e.to_string()))?;
    let named = || {
        let found = checked.stdout.strip_suffix('\n').unwrap_or(&checked.stdout);
        let found = found.strip_prefix("./").map_or_else(
            || found.to_string(),
            |inside| format!("{}/{inside}", dest.trim_end_matches('/')),
        );
        // A name may hold a newline or another control character: shown escaped.
        found
            .chars()
            .flat_map(|c| {
                let escaped: Vec<char> = if c.is_control() {
                    c.escape_default().collect()
                } else {
                    vec![c]
                };
                escaped
            })
            .collect::<String>()
    };
    match checked.status {
        0 => {}
        release_scripts::RELEASE_ALTERED => {
            return Err(TargetError::ReleaseAltered {
                found: named(),
                dest,
            });
        }
        release_scripts::RELEASE_LINKED => return Err(TargetError::LinkedDirectory(named())),
        status => {
            return Err(TargetError::Exited {
                command: format!("the check of the release in {dest}"),
                status,
                stderr: checked.stderr.trim_end().to_string(),
            });
        }
    }
    for artifact in &eff.artifacts {
        let remote = format!("{}/{}", dest.trim_end_matches('/'), artifact.name);
        let held = conn
            .sha256(&remote)
            .await
            .map_err(|e| TargetError::Transport(e.to_string()))?;
        if !held.is_some_and(|sum| sum.eq_ignore_ascii_case(&artifact.sha256)) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Runs a shell command on the target; a non-zero exit is an error with its stderr.
pub async fn run(
    pool: &ConnectionPool,
    eff: &EffectiveDescriptor,
    target: &Target,
    command: &str,
    env: &[(String, String)],
    output: &OutputWriter,
) -> Result<String, TargetError> {
    let secrets = Secrets::read(eff).await?;
    let env = command_vars(eff, target, env, &secrets);
    let conn = connection(pool, eff, target).await?;
    // Every line as it is printed, secrets masked on the stream before it is cut into
    // lines: `manent logs -f` and the page show it. What a step returns is recorded and
    // shown too: never a secret's value.
    let printed = Printed::new(secrets.masker(), Some(output));
    let status = conn
        .exec_streaming(command, &env, &|stream, bytes| printed.take(stream, bytes))
        .await;
    let quoted = printed.finish();
    match status {
        Ok(0) => Ok(quoted.summary),
        Ok(status) => Err(TargetError::Exited {
            command: secrets.redact(command),
            status,
            stderr: quoted.stderr_tail,
        }),
        Err(e) => Err(TargetError::Transport(secrets.redact(&e.to_string()))),
    }
}

/// The variables a command gets: `env` (the `MANENT_*` ones), on a `host: local` target the
/// worker's variables its environment file lists in `inherit_env` (those the worker has),
/// the target's variables (`variables`, `scoped_variables`, a descriptor's; docs/
/// environments.md, "Variables") and the deploy's secrets. The local transport gives a command nothing else of the
/// worker's environment but `PATH`, `HOME` and `LANG` (docs/security.md, "What a local
/// command sees").
fn command_vars(
    eff: &EffectiveDescriptor,
    target: &Target,
    env: &[(String, String)],
    secrets: &Secrets,
) -> Vec<(String, String)> {
    let inherited = target
        .is_local()
        .then(|| {
            eff.inherit_env
                .iter()
                .filter_map(|name| std::env::var(name).ok().map(|value| (name.clone(), value)))
        })
        .into_iter()
        .flatten();
    env.iter()
        .cloned()
        .chain(inherited)
        .chain(
            eff.variables_for(target)
                .into_iter()
                .map(|v| (v.name, v.value)),
        )
        .chain(secrets.env())
        .collect()
}

/// The dry-run plan of a target: connects, checks paths, space and
/// checksums, and says what would change. Changes nothing.
pub async fn plan(
    pool: &ConnectionPool,
    eff: &EffectiveDescriptor,
    target: &Target,
    artifacts: &[LocalArtifact],
) -> Result<Vec<String>, TargetError> {
    let conn = connection(pool, eff, target).await?;
    let mut lines = Vec::new();
    if eff.plugin == manent_model::COMMAND_PLUGIN {
        for (i, c) in eff.commands.iter().enumerate() {
            let c = eff.command_for(c, target, manent_ssh::shell_quote);
            lines.push(format!("would run command {}: {c}", i + 1));
        }
    } else {
        let dest = eff.dest_for(target).ok_or(TargetError::NoDest)?;
        let needed: u64 = artifacts.iter().map(|a| a.size).sum();
        let free = conn.free_space(&dest).await.map_err(transport)?;
        if free < needed {
            return Err(TargetError::NoSpace { dest, free, needed });
        }
        if let Some((shared, paths)) = eff.shared_for(target) {
            // What the deploy's `link shared` step would refuse, found now.
            let script = release_scripts::shared_files_check(&shared, &paths);
            let checked = conn.exec(&script, &[]).await.map_err(transport)?;
            if !checked.success() {
                let why = release_scripts::failure(&checked.stderr, checked.status);
                return Err(TargetError::Script(why));
            }
            lines.push(format!(
                "would link {} shared path(s) from {shared}",
                paths.len()
            ));
        }
        for a in artifacts {
            let remote = format!("{}/{}", dest.trim_end_matches('/'), a.name);
            match conn.sha256(&remote).await.map_err(transport)? {
                Some(sum) if sum == a.sha256 => lines.push(format!("{remote} unchanged")),
                Some(_) => lines.push(format!("would replace {remote}")),
                None => lines.push(format!("would upload {remote}")),
            }
        }
        if let Some(activate) = &eff.activate {
            let activate = eff.command_for(activate, target, manent_ssh::shell_quote);
            lines.push(format!("would run activate: {activate}"));
        }
    }
    for check in eff.checks.iter().filter(|c| c.applies_to(target)) {
        lines.push(format!("would check {}", check.label()));
    }
    Ok(lines)
}

/// One attempt of a check; the caller retries. `http` sends an HTTP check's GET, which
/// follows redirects (`crate::http::get_following_redirects`).
pub async fn check_once(
    pool: &ConnectionPool,
    http: &dyn HttpFetch,
    eff: &EffectiveDescriptor,
    target: &Target,
    kind: &CheckKind,
    timeout: Duration,
    env: &[(String, String)],
) -> Result<String, TargetError> {
    let attempt = async {
        match kind {
            CheckKind::Http { url, expect_status } => {
                let response = crate::http::get_following_redirects(http, url)
                    .await
                    .map_err(|e| TargetError::Check(format!("GET {url}: {e}")))?;
                let status = response.status_text();
                if response.status == *expect_status {
                    Ok(format!("GET {url}: {status}"))
                } else {
                    Err(TargetError::Check(format!(
                        "GET {url}: {status}, expected {expect_status}"
                    )))
                }
            }
            CheckKind::Tcp { host, port } => {
                tokio::net::TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(|e| TargetError::Check(format!("tcp {host}:{port}: {e}")))?;
                Ok(format!("tcp {host}:{port} open"))
            }
            CheckKind::Command {
                command,
                expect_exit,
            } => {
                let secrets = Secrets::read(eff).await?;
                let env = command_vars(eff, target, env, &secrets);
                let conn = connection(pool, eff, target).await?;
                // Masked on the stream, then cut, as a deploy's commands.
                let printed = Printed::new(secrets.masker(), None);
                let status = conn
                    .exec_streaming(command, &env, &|stream, bytes| printed.take(stream, bytes))
                    .await;
                let quoted = printed.finish();
                let status =
                    status.map_err(|e| TargetError::Transport(secrets.redact(&e.to_string())))?;
                let command = secrets.redact(command);
                if status == *expect_exit {
                    Ok(format!("`{command}` exited {status}"))
                } else {
                    Err(TargetError::Check(format!(
                        "`{command}` exited {status}, expected {expect_exit}: {}",
                        quoted.stderr_tail
                    )))
                }
            }
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or(Err(TargetError::TimedOut(timeout)))
}

/// A transport error reading the target (free space, a checksum): it quotes no output.
fn transport(error: TransportError) -> TargetError {
    TargetError::Transport(error.to_string())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An environment of two local targets, deployed by a descriptor of version 7 (the
    /// analysis' provider tests use it too).
    pub(crate) fn local_environment() -> EffectiveDescriptor {
        let env = manent_model::parse_environment(
            "targets: [{name: t1, host: local}, {name: t2, host: local}]\ndeploy: {dest: /srv}\n",
            "prod.yml",
            "ml/web",
            "prod",
        )
        .expect("an environment");
        let descriptor = manent_model::parse_descriptor(
            &format!(
                "application: ml/web\nenvironment: prod\nartifacts: [{{name: a, type: t, \
                 version: \"7\", url: \"file:///a\", sha256: {}}}]\n",
                "0".repeat(64)
            ),
            "d.yml",
        )
        .expect("a descriptor");
        EffectiveDescriptor::build(&descriptor, &env).expect("effective")
    }

    /// What a check did with `answer` to every request, and the URLs it asked.
    async fn http_check(
        expect_status: u16,
        answer: impl Fn(&str) -> crate::http::canned::Answer + Send + Sync + 'static,
    ) -> (Result<String, String>, Vec<String>) {
        let http = crate::http::canned::Canned::new(answer);
        let pool = ConnectionPool::new(manent_ssh::SshAuth::new(
            std::path::PathBuf::from("/none"),
            std::path::PathBuf::from("/none"),
        ));
        let eff = local_environment();
        let kind = CheckKind::Http {
            url: "http://app.test/health".into(),
            expect_status,
        };
        let timeout = Duration::from_secs(5);
        let said = check_once(&pool, &http, &eff, &eff.targets[0], &kind, timeout, &[]).await;
        (said.map_err(|e| e.to_string()), http.urls())
    }

    #[tokio::test]
    async fn an_http_check_follows_redirects_and_compares_the_final_status() {
        use crate::http::canned::Answer;
        let (said, asked) = http_check(200, |url| match url {
            "http://app.test/health" => Answer::redirect("/health/"),
            _ => Answer::ok("up"),
        })
        .await;
        assert_eq!(
            (said, asked),
            (
                Ok("GET http://app.test/health: 200 OK".to_string()),
                vec![
                    "http://app.test/health".to_string(),
                    "http://app.test/health/".to_string()
                ]
            ),
            "the redirect is followed to the page that answers"
        );
        let (said, _) = http_check(200, |_| Answer::status(503)).await;
        assert_eq!(
            said,
            Err(
                "a check failed: GET http://app.test/health: 503 Service Unavailable, expected 200"
                    .to_string()
            ),
            "another status fails the check, both named"
        );
        let (said, asked) = http_check(200, |_| Answer::redirect("/again")).await;
        assert!(
            said.as_ref()
                .is_err_and(|e| e.contains("more than 10 redirects"))
                && asked.len() == 11,
            "a redirect loop ends: {said:?} after {} requests",
            asked.len()
        );
    }

    #[test]
    fn a_connection_error_does_not_repeat_the_target_it_is_shown_beside() {
        let error = TargetError::Connect {
            target: "web1".into(),
            error: TransportError::Protocol("the host key changed".into()),
        };
        assert!(
            !error.to_string().contains("web1"),
            "the target's name is shown beside its error, once: {error}"
        );
    }

    #[test]
    fn a_target_outcome_is_recorded_as_before_and_an_unknown_state_is_kept() {
        let failed = TargetOutcome::new("t1", TargetState::Failed, Some("why".into()));
        let json = serde_json::to_value(&failed).unwrap();
        assert_eq!(
            json["status"], "failed",
            "recorded outcomes keep their text, so older deploys read the same"
        );
        let later: TargetOutcome = serde_json::from_str(
            r#"{"name":"t1","status":"quarantined","detail":null,"switched":false}"#,
        )
        .expect("an outcome written by a later version still reads");
        assert_eq!(
            later.status,
            TargetState::Other("quarantined".into()),
            "a state this build does not know is kept as written, not lost"
        );
    }

    /// Every state as recorded in a target's outcome (events, step results, a deploy's
    /// result); each reads back as itself.
    #[test]
    fn every_target_state_is_recorded_as_before_and_reads_back() {
        let states = [
            TargetState::Pending,
            TargetState::Deploying,
            TargetState::Deployed,
            TargetState::Failed,
            TargetState::RolledBack,
            TargetState::Planned,
            TargetState::Cancelled,
            TargetState::Other("quarantined".into()),
        ];
        let written: Vec<String> = states
            .iter()
            .map(|s| {
                serde_json::to_string(&TargetOutcome::new("t1", s.clone(), None))
                    .expect("an outcome serialises")
            })
            .collect();
        expect_test::expect![[r#"
            {"name":"t1","status":"pending","detail":null,"switched":false}
            {"name":"t1","status":"deploying","detail":null,"switched":false}
            {"name":"t1","status":"deployed","detail":null,"switched":false}
            {"name":"t1","status":"failed","detail":null,"switched":false}
            {"name":"t1","status":"rolled_back","detail":null,"switched":false}
            {"name":"t1","status":"planned","detail":null,"switched":false}
            {"name":"t1","status":"cancelled","detail":null,"switched":false}
            {"name":"t1","status":"quarantined","detail":null,"switched":false}"#]]
        .assert_eq(&written.join("\n"));
        for (state, json) in states.iter().zip(&written) {
            let read: TargetOutcome = serde_json::from_str(json).expect("a recorded outcome reads");
            assert_eq!(
                &read.status, state,
                "{json} reads back as the state that wrote it"
            );
        }
    }

    #[test]
    fn only_failures_that_may_pass_are_retried() {
        let check = |error: TargetError, transient: bool| {
            assert_eq!(
                error.is_transient(),
                transient,
                "{error}: retried {} (a retry must have a chance to succeed)",
                error.is_transient()
            );
        };
        check(TargetError::Transport("connection reset".into()), true);
        check(TargetError::TimedOut(Duration::from_secs(5)), true);
        check(TargetError::NoDest, false);
        check(
            TargetError::NoSpace {
                dest: "/srv".into(),
                free: 1,
                needed: 2,
            },
            false,
        );
        check(TargetError::ArtifactMissing("app.tar".into()), false);
        check(
            TargetError::Secret(SecretError::NoSource {
                name: "DB_PASSWORD".into(),
            }),
            false,
        );
        check(
            TargetError::Artifact(ArtifactError::Mismatch {
                name: "app.tar".into(),
                url: "file:///srv/releases/app.tar".into(),
                expected: "a".repeat(64),
            }),
            false,
        );
    }
}
