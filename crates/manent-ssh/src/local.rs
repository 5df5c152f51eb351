//! The local transport (`host: local`): the worker's own machine, with the same semantics
//! as SSH (commands through `sh -c` with a cleared environment, uploads as `.part` + fsync +
//! rename).

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Read},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    process::Stdio,
};

use sha2::{Digest, Sha256};

use crate::{
    Connection, ExecOutput, OnOutput, Stream, TransportError,
    shell::{SUPERVISOR, check_env_names},
};

/// Kills a command's whole process group when dropped armed: a run stopped
/// mid-command (cancel, fence, drain timeout) drops its future, and with it
/// the command and everything the command started.
struct ProcessGroupGuard(Option<u32>);

impl ProcessGroupGuard {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for ProcessGroupGuard {
    fn drop(&mut self) {
        let Some(pid) = self
            .0
            .and_then(|p| i32::try_from(p).ok())
            .and_then(rustix::process::Pid::from_raw)
        else {
            return;
        };
        match rustix::process::kill_process_group(pid, rustix::process::Signal::KILL) {
            Ok(()) => tracing::info!(
                pgid = pid.as_raw_nonzero().get(),
                "killed a stopped run's command and its process group"
            ),
            Err(rustix::io::Errno::SRCH) => {}
            Err(e) => {
                tracing::warn!(pgid = pid.as_raw_nonzero().get(), error = %e, "cannot kill a stopped run's command")
            }
        }
    }
}

/// The worker's variables every local command gets, as a login on a target would have
/// its own; every other variable of the worker is withheld.
pub const KEPT_VARIABLES: [&str; 3] = ["PATH", "HOME", "LANG"];

/// The worker's own machine. Relative paths are relative to the worker's directory.
#[derive(Debug, Default, Clone)]
pub struct LocalConnection;

impl LocalConnection {
    pub fn new() -> Self {
        LocalConnection
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, TransportError> + Send + 'static,
) -> Result<T, TransportError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| TransportError::io("a file task of the local transport", e))?
}

/// `expected`: the sha256 the `.part` must have before it is renamed; on a mismatch the
/// `.part` is removed and `dest` left as it was.
fn put_file_atomic(
    local: &Path,
    dest: &Path,
    expected: Option<&str>,
) -> Result<(), TransportError> {
    let part = PathBuf::from(format!("{}.part", dest.display()));
    let err = |what: String| move |e: io::Error| TransportError::io(what, e);
    if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(err(format!(
            "cannot create the directory {}",
            parent.display()
        )))?;
    }
    let mut src = File::open(local).map_err(err(format!("cannot open {}", local.display())))?;
    let mode = src
        .metadata()
        .map_err(err(format!("cannot stat {}", local.display())))?
        .permissions()
        .mode()
        & 0o7777;
    // A `.part` left by an interrupted upload may be read-only: start afresh.
    match fs::remove_file(&part) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(err(format!(
                "cannot remove the leftover {}",
                part.display()
            ))(e));
        }
        _ => {}
    }
    // A new file, never one reached through a link left at that name: something other than
    // manent (a command of the deploy) may have written the destination's directory.
    let mut out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&part)
        .map_err(err(format!("cannot create {}", part.display())))?;
    // Streams (copy_file_range / sendfile on Linux), never the whole file in memory.
    io::copy(&mut src, &mut out).map_err(err(format!(
        "cannot copy {} to {}",
        local.display(),
        part.display()
    )))?;
    out.sync_all()
        .map_err(err(format!("cannot fsync {}", part.display())))?;
    drop(out);
    if let Some(expected) = expected {
        let actual = sha256_file(&part)?;
        if !actual
            .as_deref()
            .is_some_and(|a| a.eq_ignore_ascii_case(expected))
        {
            let _ = fs::remove_file(&part);
            return Err(TransportError::Mismatch {
                path: part.display().to_string(),
                target: crate::LOCAL_HOST.to_string(),
                expected: expected.to_ascii_lowercase(),
                actual,
            });
        }
    }
    if dest.is_dir() {
        return Err(TransportError::io(
            format!("cannot replace {}", dest.display()),
            "it is a directory",
        ));
    }
    fs::rename(&part, dest).map_err(err(format!(
        "cannot rename {} to {}",
        part.display(),
        dest.display()
    )))?;
    // Makes the rename itself durable.
    if let Some(parent) = dest.parent() {
        let dir = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(err(format!("cannot fsync the directory {}", dir.display())))?;
    }
    Ok(())
}

/// The sha256 (lowercase hex) of a local file, streamed; `None` if it does not exist.
pub fn sha256_file(path: &Path) -> Result<Option<String>, TransportError> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(TransportError::io(
                format!("cannot open {}", path.display()),
                e,
            ));
        }
    };
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| TransportError::io(format!("cannot read {}", path.display()), e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(Some(format!("{:x}", hasher.finalize())))
}

fn free_space(path: &Path) -> Result<u64, TransportError> {
    let mut current = path;
    loop {
        let probe = if current.as_os_str().is_empty() {
            Path::new(".")
        } else {
            current
        };
        match rustix::fs::statvfs(probe) {
            Ok(st) => return Ok(st.f_bavail.saturating_mul(st.f_frsize)),
            Err(rustix::io::Errno::NOENT) => match current.parent() {
                Some(parent) => current = parent,
                None => {
                    return Err(TransportError::io(
                        format!("cannot measure free space at {}", path.display()),
                        "no ancestor exists",
                    ));
                }
            },
            Err(e) => {
                return Err(TransportError::io(
                    format!("cannot measure free space at {}", probe.display()),
                    e,
                ));
            }
        }
    }
}

/// Reads one of a command's outputs to its end, handing each piece to `on_output` as it
/// comes.
async fn pump(
    reader: Option<impl tokio::io::AsyncRead + Unpin>,
    stream: Stream,
    on_output: OnOutput<'_>,
) -> Result<(), TransportError> {
    use tokio::io::AsyncReadExt;
    let Some(mut reader) = reader else {
        return Ok(());
    };
    let mut chunk = vec![0u8; 8192];
    loop {
        let n = reader.read(&mut chunk).await.map_err(|e| {
            TransportError::io(format!("cannot read the command's {}", stream.as_str()), e)
        })?;
        if n == 0 {
            return Ok(());
        }
        on_output(stream, &chunk[..n]);
    }
}

#[async_trait::async_trait]
impl Connection for LocalConnection {
    async fn exec(
        &self,
        command: &str,
        env: &[(String, String)],
    ) -> Result<ExecOutput, TransportError> {
        let collected = crate::Collected::default();
        let status = self
            .exec_streaming(command, env, &|stream, bytes| collected.take(stream, bytes))
            .await?;
        Ok(collected.into_output(status))
    }

    async fn exec_streaming(
        &self,
        command: &str,
        env: &[(String, String)],
        on_output: OnOutput<'_>,
    ) -> Result<i32, TransportError> {
        check_env_names(env)?;
        tracing::debug!(target = "local", command, "exec");
        // Under the run's dead-man's switch, the supervisor ends the command when the
        // pulses on its stdin stop (this worker frozen), see `SUPERVISOR`.
        let switch = manent_guard::current();
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c")
            .arg(&*SUPERVISOR)
            .arg("manent")
            .arg(command)
            .arg(switch.as_ref().map(|s| s.timeout_arg()).unwrap_or_default())
            // What an SSH command gets, no more: the worker's own variables (its cloud
            // credentials, its database URL) stay out (docs/security.md, "What a local
            // command sees"); the caller adds what the environment file lets through.
            .env_clear()
            .envs(
                KEPT_VARIABLES
                    .iter()
                    .filter_map(|name| std::env::var_os(name).map(|value| (name, value))),
            )
            .envs(env.iter().map(|(k, v)| (k, v)))
            // Held open by this process only: its end (the worker's death) ends the command.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // A group of its own, so the command and all it started are killed together.
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: the closure runs in the child between fork and exec, where only
        // async-signal-safe calls are allowed; it makes one prctl(2) system call
        // (rustix calls the kernel directly) and allocates nothing.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(|| {
                // The worker's death (even SIGKILL) sends the supervisor SIGTERM, on
                // which it kills its group. Linux ties this to the spawning thread:
                // commands are spawned from the runtime's worker threads, which live as
                // long as the worker process.
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::TERM,
                ))
                .map_err(io::Error::from)
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| TransportError::io("cannot start sh", e))?;
        let group = ProcessGroupGuard(child.id());
        let mut stdin = child.stdin.take();
        let pumps = async {
            tokio::join!(
                pump(child.stdout.take(), Stream::Stdout, on_output),
                pump(child.stderr.take(), Stream::Stderr, on_output),
            )
        };
        let (stdout, stderr) = match (&switch, &mut stdin) {
            (Some(switch), Some(pipe)) => {
                use tokio::io::AsyncWriteExt;
                tokio::pin!(pumps);
                let mut ticker = switch.ticker();
                loop {
                    tokio::select! {
                        done = &mut pumps => break done,
                        _ = ticker.tick() => {
                            if switch.may_pulse() {
                                // A failed pulse is a supervisor gone: the pumps end too.
                                let _ = pipe.write_all(manent_guard::PULSE).await;
                            }
                        }
                    }
                }
            }
            _ => pumps.await,
        };
        let exit = child
            .wait()
            .await
            .map_err(|e| TransportError::io("cannot wait for sh", e))?;
        // Ended by itself: what it left in the background on purpose stays.
        group.disarm();
        drop(stdin);
        stdout?;
        stderr?;
        use std::os::unix::process::ExitStatusExt;
        Ok(exit
            .code()
            .or_else(|| exit.signal().map(|s| 128 + s))
            .unwrap_or(-1))
    }

    async fn put_file_atomic(&self, local: &Path, dest: &str) -> Result<(), TransportError> {
        let (local, dest) = (local.to_path_buf(), PathBuf::from(dest));
        blocking(move || put_file_atomic(&local, &dest, None)).await
    }

    async fn put_file_verified(
        &self,
        local: &Path,
        dest: &str,
        sha256: &str,
    ) -> Result<(), TransportError> {
        let (local, dest, sha256) = (local.to_path_buf(), PathBuf::from(dest), sha256.to_string());
        blocking(move || put_file_atomic(&local, &dest, Some(&sha256))).await
    }

    async fn sha256(&self, path: &str) -> Result<Option<String>, TransportError> {
        let path = PathBuf::from(path);
        blocking(move || sha256_file(&path)).await
    }

    async fn free_space(&self, path: &str) -> Result<u64, TransportError> {
        let path = PathBuf::from(path);
        blocking(move || free_space(&path)).await
    }

    fn describe(&self) -> String {
        crate::LOCAL_HOST.to_string()
    }
}
