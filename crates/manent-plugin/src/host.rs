//! The host side of an external plugin: verifies the executable's sha256, starts it on the
//! first request, shakes hands, sends one request at a time and reads its replies, restarts
//! it after it died or broke the protocol, and stops it at shutdown. Nothing here can hang: a
//! request has a timeout, and shutdown interrupts a request in flight.
//!
//! Unconfined (`confinement: none`), one long-lived process serves every pass, one at a
//! time. Confined (`bwrap`, the default), each pass gets a process of its own inside a
//! sandbox made for that pass (its working directory, its environment's key), which is
//! gone when the pass has its answer; passes of one plugin then run side by side.

use std::{
    collections::VecDeque,
    io::Read,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex as StdMutex},
    time::Duration,
};

use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines},
    process::{Child, ChildStdin, ChildStdout, Command},
    sync::{Mutex, watch},
    task::JoinHandle,
};

use crate::{
    PluginError,
    protocol::{
        LogLevel, Operation, PROTOCOL_VERSION, Pass, PassResult, PluginInfo, Reply, Request,
        RequestBody,
    },
    sandbox::{self, Bwrap, Confinement, PassScope},
};

/// How long a pass may take by default before the process is stopped.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How long the handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// At shutdown, how long the plugin has to exit after its stdin is closed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Lines of the plugin's stderr kept for error messages.
const STDERR_TAIL_LINES: usize = 20;
/// A bad line is quoted up to this many characters.
const QUOTE_CHARS: usize = 200;

/// An external plugin (`plugins.<name>.external`) on a worker that runs it.
/// Receives a plugin's `progress` lines: the target it is about (if any) and the message.
/// The host does not log them: the receiver records them (masked) and logs them if it will.
pub type OnProgress<'a> = &'a (dyn Fn(Option<&str>, &str) + Send + Sync);

/// What the plugin's log lines and stderr go through on their way to the server's log
/// during a request: the caller's masking of the secrets the plugin may have printed.
pub type Redact = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// Lines logged as they are.
pub fn no_redaction() -> Redact {
    Arc::new(str::to_owned)
}

pub struct ExternalPlugin {
    name: String,
    command: PathBuf,
    sha256: String,
    /// The variables the operator gives the process (set, or passed from the worker).
    env: Vec<(String, String)>,
    confinement: Confinement,
    /// Where the unconfined process's private `HOME` and `TMPDIR` are.
    private_dir: PathBuf,
    timeout: Duration,
    grace: Duration,
    /// The running process, if any; held for the whole of a request (one at a time).
    process: Mutex<Option<Process>>,
    /// Set at shutdown: interrupts a request in flight and refuses new ones.
    stopping: watch::Sender<bool>,
    pid: StdMutex<Option<u32>>,
    info: StdMutex<Option<PluginInfo>>,
    /// Confined processes running now (each pass its own), waited for at shutdown.
    active: watch::Sender<usize>,
}

impl std::fmt::Debug for ExternalPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalPlugin")
            .field("name", &self.name)
            .field("command", &self.command)
            .field("pid", &self.pid())
            .finish_non_exhaustive()
    }
}

struct Process {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr_tail: Arc<StdMutex<VecDeque<String>>>,
    stderr_task: JoinHandle<()>,
    /// The redaction of the request in flight, applied to stderr lines as they are logged.
    redact: Arc<StdMutex<Redact>>,
    next_id: u64,
    /// Whether the process leads a process group of its own (unconfined), killed with it.
    group: bool,
    /// The dead-man's switch's watcher and its pulses, stopped with the process.
    _watcher: Option<PulseWatcher>,
    /// Set while a request waits for its answer. Still set at the next request: the caller
    /// of the last one gave up (a cancelled deploy), and its answer may still come.
    in_flight: bool,
}

impl ExternalPlugin {
    /// A plugin named `name` run from `command`, whose sha256 must be `sha256` (hex). Nothing
    /// is read or started until the first request.
    /// It runs unconfined unless [`ExternalPlugin::confinement`] says otherwise.
    pub fn new(name: impl Into<String>, command: impl Into<PathBuf>, sha256: &str) -> Self {
        let name = name.into();
        ExternalPlugin {
            private_dir: std::env::temp_dir().join(format!("manent-plugin-{name}")),
            name,
            command: command.into(),
            sha256: sha256.trim().to_ascii_lowercase(),
            env: Vec::new(),
            confinement: Confinement::None,
            timeout: DEFAULT_TIMEOUT,
            grace: SHUTDOWN_GRACE,
            process: Mutex::new(None),
            stopping: watch::channel(false).0,
            pid: StdMutex::new(None),
            info: StdMutex::new(None),
            active: watch::channel(0).0,
        }
    }

    /// An environment variable for the plugin's process. The process gets nothing of the
    /// worker's environment but these (see [`sandbox::environment`]).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// How the process is confined (default: not at all).
    pub fn confinement(mut self, confinement: Confinement) -> Self {
        self.confinement = confinement;
        self
    }

    /// Where an unconfined process keeps its private `HOME` and `TMPDIR` (default: a
    /// directory of the plugin's name in the system's temporary directory).
    pub fn private_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.private_dir = dir.into();
        self
    }

    /// How long one request may take (default [`DEFAULT_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn command(&self) -> &Path {
        &self.command
    }

    /// The pid of the running process, if one runs.
    pub fn pid(&self) -> Option<u32> {
        *self.pid.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the running process said at its handshake.
    pub fn info(&self) -> Option<PluginInfo> {
        self.info.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Runs `operation` on `pass`: starts the process if none runs (verifying it first), then
    /// sends the request and waits for its result.
    pub async fn call(&self, operation: Operation, pass: &Pass) -> Result<PassResult, PluginError> {
        self.call_for_pass(operation, pass, None, &|_, _| {}, no_redaction())
            .await
    }

    /// As [`ExternalPlugin::call`], for a pass whose files are `scope` (a confined plugin
    /// needs it: its sandbox is made of it; an unconfined one ignores it), handing each
    /// `progress` line (its target, if any, and message) to `on_progress` as it arrives; the
    /// plugin's log lines and stderr go to the server's log through `redact`, their control
    /// characters escaped.
    pub async fn call_for_pass(
        &self,
        operation: Operation,
        pass: &Pass,
        scope: Option<&PassScope>,
        on_progress: OnProgress<'_>,
        redact: Redact,
    ) -> Result<PassResult, PluginError> {
        let value = self
            .request(
                operation.as_str(),
                operation.request(pass.clone()),
                scope,
                on_progress,
                redact,
            )
            .await?;
        serde_json::from_value(value.clone()).map_err(|e| PluginError::Protocol {
            plugin: self.name.clone(),
            operation: operation.to_string(),
            reason: format!("the result is not a pass result ({e})"),
            line: quote(&value.to_string()),
        })
    }

    /// Starts the process now if none runs (verify, spawn, handshake). A confined plugin
    /// has no process outside a pass: for it this is an error.
    pub async fn start(&self) -> Result<PluginInfo, PluginError> {
        if let Confinement::Bwrap(_) = &self.confinement {
            return Err(self.no_scope());
        }
        let mut guard = self.process.lock().await;
        if guard.is_none() {
            *guard = Some(self.spawn(None).await?);
        }
        Ok(self.info().expect("a running process has shaken hands"))
    }

    async fn request(
        &self,
        operation: &str,
        body: RequestBody,
        scope: Option<&PassScope>,
        on_progress: OnProgress<'_>,
        redact: Redact,
    ) -> Result<Value, PluginError> {
        if *self.stopping.borrow() {
            return Err(self.shutting_down());
        }
        if let Confinement::Bwrap(bwrap) = &self.confinement {
            let scope = scope.ok_or_else(|| self.no_scope())?;
            return self
                .request_confined(bwrap, scope, operation, body, on_progress, redact)
                .await;
        }
        let mut guard = self.process.lock().await;
        if guard.as_ref().is_some_and(|p| p.in_flight)
            && let Some(abandoned) = guard.take()
        {
            self.discard(abandoned).await;
        }
        if guard.is_none() {
            *guard = Some(self.spawn(None).await?);
        }
        let process = guard.as_mut().expect("started above");
        // The stderr of this request is masked with its secrets, and so is what it writes
        // after it (read later); the next request brings its own.
        *process.redact.lock().unwrap_or_else(|e| e.into_inner()) = redact;
        let result = self
            .exchange(process, operation, body, self.timeout, on_progress)
            .await;
        if let Err(e) = &result
            && !matches!(e, PluginError::Plugin { .. })
        {
            // Dead, silent, confused or stopping: this process is done; the next request
            // starts a fresh one.
            if let Some(process) = guard.take() {
                self.discard(process).await;
            }
        }
        result
    }

    /// One pass in a sandbox of its own: a process started for it, asked once, and stopped.
    async fn request_confined(
        &self,
        bwrap: &Bwrap,
        scope: &PassScope,
        operation: &str,
        body: RequestBody,
        on_progress: OnProgress<'_>,
        redact: Redact,
    ) -> Result<Value, PluginError> {
        self.active.send_modify(|n| *n += 1);
        let _active = ActiveGuard(&self.active);
        let mut process = self.spawn(Some((bwrap, scope))).await?;
        // Its stderr is masked with this pass's secrets: the process serves this pass only.
        *process.redact.lock().unwrap_or_else(|e| e.into_inner()) = redact;
        let result = self
            .exchange(&mut process, operation, body, self.timeout, on_progress)
            .await;
        match &result {
            Ok(_) | Err(PluginError::Plugin { .. }) => {
                let status = self.finish(process).await;
                tracing::debug!(plugin = %self.name, %status, "pass process stopped");
            }
            Err(_) => self.discard(process).await,
        }
        result
    }

    fn no_scope(&self) -> PluginError {
        PluginError::Confinement {
            plugin: self.name.clone(),
            reason: "a confined plugin runs only for a pass, in a sandbox made of the pass's \
                     working directory, and none was given"
                .into(),
        }
    }

    fn confinement_error(&self, reason: impl Into<String>) -> PluginError {
        PluginError::Confinement {
            plugin: self.name.clone(),
            reason: reason.into(),
        }
    }

    fn shutting_down(&self) -> PluginError {
        PluginError::ShuttingDown {
            plugin: self.name.clone(),
        }
    }

    /// Verifies the executable, starts it (in a sandbox for `confined`'s pass) and shakes
    /// hands.
    async fn spawn(&self, confined: Option<(&Bwrap, &PassScope)>) -> Result<Process, PluginError> {
        let start_error = |reason: String| PluginError::Start {
            plugin: self.name.clone(),
            path: self.command.clone(),
            reason,
        };
        let path = self.command.clone();
        let actual = tokio::task::spawn_blocking(move || file_sha256(&path))
            .await
            .map_err(|e| start_error(e.to_string()))?
            .map_err(|e| start_error(e.to_string()))?;
        if actual != self.sha256 {
            return Err(PluginError::Checksum {
                plugin: self.name.clone(),
                path: self.command.clone(),
                expected: self.sha256.clone(),
                actual,
            });
        }
        let (base, home, tmp) = match confined {
            Some((_, scope)) => (scope.work_dir.as_path(), scope.home(), scope.tmp()),
            None => (
                self.private_dir.as_path(),
                self.private_dir.join("home"),
                self.private_dir.join("tmp"),
            ),
        };
        // The pass's working directory is the plugin's to write: a process of an earlier
        // attempt may have left a link where `HOME` goes (docs/security.md, "What the worker
        // never trusts").
        for dir in [&home, &tmp] {
            let relative = dir.strip_prefix(base).unwrap_or(dir);
            crate::files::private_dir(base, relative)
                .map_err(|e| start_error(format!("cannot create {}: {e}", dir.display())))?;
        }
        let mut command = match confined {
            Some((bwrap, scope)) => {
                let path =
                    sandbox::locate_bwrap(&bwrap.bwrap).map_err(|e| self.confinement_error(e))?;
                let mut command = Command::new(path);
                command
                    .args(sandbox::bwrap_args(bwrap, &self.command, scope))
                    .arg(&self.command)
                    .current_dir(&scope.work_dir);
                command
            }
            None => {
                let mut command = Command::new(&self.command);
                // A group of its own: a stopped process takes its children with it.
                command.process_group(0);
                command
            }
        };
        let mut child = command
            .env_clear()
            .envs(sandbox::environment(&self.env, &home, &tmp))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| match confined {
                Some((bwrap, _)) => {
                    self.confinement_error(format!("cannot run {}: {e}", bwrap.bwrap.display()))
                }
                None => start_error(e.to_string()),
            })?;
        // Under the run's dead-man's switch (`manent_guard`), a watcher beside the process
        // stops it when this worker's pulses stop (frozen, fenced): the plugin and what it
        // started never outlive the worker's hold on the pass.
        let watcher = match (manent_guard::current(), child.id()) {
            (Some(switch), Some(pid)) => {
                match PulseWatcher::start(switch, pid, confined.is_none()) {
                    Ok(watcher) => Some(watcher),
                    Err(e) => {
                        let _ = child.start_kill();
                        return Err(start_error(format!(
                            "cannot start the dead-man's switch's watcher (sh): {e}"
                        )));
                    }
                }
            }
            _ => None,
        };
        let pid = child.id();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
        let stderr = child.stderr.take().expect("piped");
        let stderr_tail = Arc::new(StdMutex::new(VecDeque::new()));
        let redact = Arc::new(StdMutex::new(no_redaction()));
        let stderr_task = tokio::spawn(forward_stderr(
            self.name.clone(),
            stderr,
            stderr_tail.clone(),
            redact.clone(),
        ));
        let mut process = Process {
            child,
            stdin,
            stdout,
            stderr_tail,
            stderr_task,
            redact,
            next_id: 1,
            in_flight: false,
            group: confined.is_none(),
            _watcher: watcher,
        };
        match self.handshake(&mut process).await {
            Ok(info) => {
                tracing::info!(plugin = %self.name, pid, version = %info.version, "plugin started");
                *self.pid.lock().unwrap_or_else(|e| e.into_inner()) = pid;
                *self.info.lock().unwrap_or_else(|e| e.into_inner()) = Some(info);
                Ok(process)
            }
            Err(e) => {
                self.discard(process).await;
                // bwrap says why it could not make the sandbox on its stderr, then exits.
                match e {
                    PluginError::Exited { stderr, .. }
                        if confined.is_some() && stderr.contains("bwrap:") =>
                    {
                        let line = stderr
                            .split(" | ")
                            .find(|l| l.contains("bwrap:"))
                            .unwrap_or(&stderr)
                            .to_string();
                        Err(self
                            .confinement_error(format!("bwrap cannot make the sandbox: {line}")))
                    }
                    e => Err(e),
                }
            }
        }
    }

    async fn handshake(&self, process: &mut Process) -> Result<PluginInfo, PluginError> {
        let body = RequestBody::Handshake {
            protocol: PROTOCOL_VERSION,
        };
        let value = match self
            .exchange(
                process,
                "handshake",
                body,
                HANDSHAKE_TIMEOUT.min(self.timeout),
                &|_, _| {},
            )
            .await
        {
            Ok(value) => value,
            Err(PluginError::Plugin { code, message, .. }) if code == "unsupported_protocol" => {
                return Err(PluginError::Version {
                    plugin: self.name.clone(),
                    ours: PROTOCOL_VERSION,
                    theirs: format!("another ({message})"),
                });
            }
            Err(e) => return Err(e),
        };
        let protocol = value.get("protocol").and_then(Value::as_u64);
        if protocol != Some(u64::from(PROTOCOL_VERSION)) {
            return Err(PluginError::Version {
                plugin: self.name.clone(),
                ours: PROTOCOL_VERSION,
                theirs: value
                    .get("protocol")
                    .map_or_else(|| "none".to_string(), Value::to_string),
            });
        }
        let info: PluginInfo =
            serde_json::from_value(value.clone()).map_err(|e| PluginError::Protocol {
                plugin: self.name.clone(),
                operation: "handshake".into(),
                reason: format!("the handshake result is malformed ({e})"),
                line: quote(&value.to_string()),
            })?;
        if info.name != self.name {
            return Err(PluginError::Name {
                plugin: self.name.clone(),
                reported: info.name,
            });
        }
        Ok(info)
    }

    /// Sends one request and reads its replies up to the result or error.
    async fn exchange(
        &self,
        process: &mut Process,
        operation: &str,
        body: RequestBody,
        timeout: Duration,
        on_progress: OnProgress<'_>,
    ) -> Result<Value, PluginError> {
        let id = process.next_id;
        process.next_id += 1;
        process.in_flight = true;
        let result = self
            .exchange_inner(process, id, operation, body, timeout, on_progress)
            .await;
        process.in_flight = false;
        result
    }

    async fn exchange_inner(
        &self,
        process: &mut Process,
        id: u64,
        operation: &str,
        body: RequestBody,
        timeout: Duration,
        on_progress: OnProgress<'_>,
    ) -> Result<Value, PluginError> {
        let mut line = serde_json::to_string(&Request { id, body }).expect("requests serialize");
        line.push('\n');
        let written = match process.stdin.as_mut() {
            Some(stdin) => async {
                stdin.write_all(line.as_bytes()).await?;
                stdin.flush().await
            }
            .await
            .is_ok(),
            None => false,
        };
        if !written {
            return Err(self.exited(process, operation).await);
        }
        let protocol_error = |reason: String, line: &str| PluginError::Protocol {
            plugin: self.name.clone(),
            operation: operation.to_string(),
            reason,
            line: quote(line),
        };
        let mut stopping = self.stopping.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let next = tokio::select! {
                next = process.stdout.next_line() => next,
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(PluginError::Timeout {
                        plugin: self.name.clone(),
                        operation: operation.to_string(),
                        timeout,
                    });
                }
                _ = stopping.wait_for(|s| *s) => return Err(self.shutting_down()),
            };
            let Ok(Some(line)) = next else {
                return Err(self.exited(process, operation).await);
            };
            if line.trim().is_empty() {
                continue;
            }
            let reply: Reply = crate::protocol::decode_reply(&line).map_err(|e| {
                protocol_error(
                    format!("a line that is not a protocol {PROTOCOL_VERSION} reply ({e})"),
                    &line,
                )
            })?;
            if reply.id() != id {
                return Err(protocol_error(
                    format!(
                        "a reply to request {} while request {id} is in flight",
                        reply.id()
                    ),
                    &line,
                ));
            }
            match reply {
                Reply::Progress {
                    target, message, ..
                } => on_progress(target.as_deref(), &message),
                Reply::Log { level, message, .. } => {
                    let redact = process
                        .redact
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone();
                    // A plugin's text cannot forge a line of the server's log.
                    let message = redact(&message);
                    let message = message.escape_debug();
                    match level {
                        LogLevel::Debug => tracing::debug!(plugin = %self.name, "{message}"),
                        LogLevel::Info => tracing::info!(plugin = %self.name, "{message}"),
                        LogLevel::Warn => tracing::warn!(plugin = %self.name, "{message}"),
                        LogLevel::Error => tracing::error!(plugin = %self.name, "{message}"),
                    }
                }
                Reply::Result { result, .. } => return Ok(result),
                Reply::Error { error, .. } => {
                    return Err(PluginError::Plugin {
                        plugin: self.name.clone(),
                        operation: operation.to_string(),
                        code: error.code,
                        message: error.message,
                        retryable: error.retryable,
                    });
                }
            }
        }
    }

    /// The error for a process whose stdout ended: its exit status and the tail of its stderr.
    async fn exited(&self, process: &mut Process, operation: &str) -> PluginError {
        process.stdin = None;
        // Its stdout is closed; a process still alive after that is not answering anyway.
        let status = match tokio::time::timeout(self.grace, process.child.wait()).await {
            Ok(Ok(status)) => status.to_string(),
            Ok(Err(e)) => format!("an unknown status ({e})"),
            Err(_) => {
                let _ = process.child.kill().await;
                "its stdout closed (killed)".to_string()
            }
        };
        // The stderr reader ends at EOF, once the process is gone.
        let _ = tokio::time::timeout(self.grace, &mut process.stderr_task).await;
        let tail: Vec<String> = process
            .stderr_tail
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        PluginError::Exited {
            plugin: self.name.clone(),
            operation: operation.to_string(),
            status,
            stderr: if tail.is_empty() {
                "(empty)".to_string()
            } else {
                tail.join(" | ")
            },
        }
    }

    /// Stops a process that is no longer trusted, with its process group.
    async fn discard(&self, mut process: Process) {
        kill_group(process.group.then(|| process.child.id()).flatten());
        let _ = process.child.kill().await;
        process.stderr_task.abort();
        *self.pid.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Stops a process that answered: closes its stdin, waits for it to exit for a grace
    /// period, then kills it. Returns how it ended.
    async fn finish(&self, mut process: Process) -> String {
        process.stdin = None;
        let status = match tokio::time::timeout(self.grace, process.child.wait()).await {
            Ok(Ok(status)) => status.to_string(),
            _ => {
                kill_group(process.group.then(|| process.child.id()).flatten());
                let _ = process.child.kill().await;
                "killed after the grace period".to_string()
            }
        };
        let _ = tokio::time::timeout(self.grace, &mut process.stderr_task).await;
        *self.pid.lock().unwrap_or_else(|e| e.into_inner()) = None;
        status
    }

    /// Stops the process: interrupts a request in flight, closes its stdin, waits for it to
    /// exit for a grace period, then kills it. Later requests are refused. Confined
    /// processes (one per pass) are interrupted and waited for.
    pub async fn shutdown(&self) {
        self.stopping.send_replace(true);
        let mut active = self.active.subscribe();
        // Each interrupted pass stops its own process (killed at once).
        let _ = tokio::time::timeout(self.grace * 2, active.wait_for(|n| *n == 0)).await;
        let Some(process) = self.process.lock().await.take() else {
            if let Confinement::Bwrap(_) = &self.confinement {
                tracing::info!(plugin = %self.name, "plugin stopped");
            }
            return;
        };
        let status = self.finish(process).await;
        tracing::info!(plugin = %self.name, %status, "plugin stopped");
    }
}

/// Counts a confined process as running while it lives.
struct ActiveGuard<'a>(&'a watch::Sender<usize>);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Kills the process group led by `pid` (an unconfined plugin and what it started); a
/// confined plugin's children die with its sandbox instead.
/// The watcher of a plugin process's dead-man's switch: a shell beside it
/// ([`manent_guard::PLUGIN_WATCHER`]) that reads the pulses this worker sends and stops the
/// process once they stop. Dropped with the process: the watcher is killed and the pulses
/// stop.
struct PulseWatcher {
    _watcher: Child,
    pulses: JoinHandle<()>,
}

impl PulseWatcher {
    /// Watches `pid`: its process group (`group`, an unconfined plugin leading one), or the
    /// process alone (bwrap, whose sandbox dies with it).
    fn start(
        switch: manent_guard::DeadMansSwitch,
        pid: u32,
        group: bool,
    ) -> std::io::Result<PulseWatcher> {
        let mut watcher = Command::new("sh")
            .arg("-c")
            .arg(manent_guard::PLUGIN_WATCHER)
            .arg("manent")
            .arg(switch.timeout_arg())
            .arg(pid.to_string())
            .arg(if group { "group" } else { "process" })
            .env_clear()
            .env("PATH", sandbox::DEFAULT_PATH)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let mut stdin = watcher.stdin.take().expect("piped");
        let pulses = tokio::spawn(async move {
            let mut ticker = switch.ticker();
            loop {
                ticker.tick().await;
                if switch.may_pulse() && stdin.write_all(manent_guard::PULSE).await.is_err() {
                    return;
                }
            }
        });
        Ok(PulseWatcher {
            _watcher: watcher,
            pulses,
        })
    }
}

impl Drop for PulseWatcher {
    fn drop(&mut self) {
        self.pulses.abort();
    }
}

fn kill_group(pid: Option<u32>) {
    let Some(pid) = pid
        .and_then(|p| i32::try_from(p).ok())
        .and_then(rustix::process::Pid::from_raw)
    else {
        return;
    };
    match rustix::process::kill_process_group(pid, rustix::process::Signal::KILL) {
        Ok(()) | Err(rustix::io::Errno::SRCH) | Err(rustix::io::Errno::PERM) => {}
        Err(e) => {
            tracing::warn!(pgid = pid.as_raw_nonzero().get(), error = %e, "cannot kill a plugin's process group")
        }
    }
}

/// Forwards the plugin's stderr (its log) to `tracing`, keeping the last lines.
async fn forward_stderr(
    plugin: String,
    stderr: tokio::process::ChildStderr,
    tail: Arc<StdMutex<VecDeque<String>>>,
    redact: Arc<StdMutex<Redact>>,
) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let redact = redact.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // Masked, and escaped: a plugin's text cannot forge a line of the server's log.
        tracing::info!(plugin = %plugin, stream = "stderr", "{}", redact(&line).escape_debug());
        let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
        if tail.len() == STDERR_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }
}

/// Hex sha256 of a file, streamed.
pub fn file_sha256(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// `line`, cut to a readable length.
fn quote(line: &str) -> String {
    let mut chars = line.chars();
    let head: String = chars.by_ref().take(QUOTE_CHARS).collect();
    if chars.next().is_some() {
        format!("{head}…")
    } else {
        head
    }
}
