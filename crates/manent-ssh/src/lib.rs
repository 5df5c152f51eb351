//! How manent reaches a target: the `Connection` trait, its two transports (SSH in-process,
//! and `local` for the worker's own machine), `connect` and the per-pass `ConnectionPool`.
//!
//! SSH runs inside the process (russh, no `ssh` binary: the product image is distroless),
//! authenticates with a private key file and checks the host key strictly against an
//! OpenSSH `known_hosts` file. Commands run through `sh -c` on the target; files are
//! uploaded over SFTP to `<dest>.part`, fsynced, then renamed to `<dest>`.
//!
//! Secrets never appear in errors or logs: errors name key *paths*, never key contents,
//! and name commands without the values of the environment variables passed to them.

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
};

mod error;
mod known_hosts;
mod local;
mod pool;
mod shell;
mod ssh;

pub use error::TransportError;
pub use local::{LocalConnection, sha256_file};
pub use pool::{ConnectionPool, WarmConnections};
pub use shell::quote as shell_quote;

/// The host name that designates the worker's own machine.
pub const LOCAL_HOST: &str = "local";

/// Where a target is reached. A `host` of `local` means the worker's own machine
/// (port and user are then ignored).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    pub host: String,
    pub port: u16,
    pub user: String,
}

impl Address {
    pub fn new(host: impl Into<String>, port: u16, user: impl Into<String>) -> Self {
        Address {
            host: host.into(),
            port,
            user: user.into(),
        }
    }

    /// The worker's own machine.
    pub fn local() -> Self {
        Address::new(LOCAL_HOST, 0, "")
    }

    pub fn is_local(&self) -> bool {
        self.host == LOCAL_HOST
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_local() {
            f.write_str(LOCAL_HOST)
        } else {
            write!(f, "{}@{}:{}", self.user, self.host, self.port)
        }
    }
}

/// How to authenticate to SSH targets and how to recognise them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshAuth {
    /// The client's private key (OpenSSH format; ed25519, ECDSA or RSA; not encrypted).
    pub key_path: PathBuf,
    /// An OpenSSH `known_hosts` file (plain, `[host]:port` and hashed `|1|` entries).
    pub known_hosts_path: PathBuf,
    /// `true` (the default): a host whose key is not in `known_hosts` is refused.
    /// `false`: such a host is accepted, with a warning naming its fingerprint.
    /// A key that differs from the recorded one is refused either way.
    pub strict_host_key_checking: bool,
    /// How a verified upload checks the `.part` before the rename.
    pub verify: VerifyUploads,
}

/// How a verified upload checks what landed in the `.part` before renaming it into place.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum VerifyUploads {
    /// [`Sftp`](Self::Sftp) for a file of up to [`VerifyUploads::READ_BACK_UP_TO`] bytes,
    /// [`Command`](Self::Command) for a larger one. Reading back costs in proportion to the
    /// size (the bytes cross the link and both ends' encryption again); a command costs a
    /// session and three processes whatever the size. On loopback targets the two meet
    /// at about 10 MB (bench/README.md, "Fan-out over SSH").
    #[default]
    Auto,
    /// Read back over SFTP and hashed by the worker, renamed with
    /// `posix-rename@openssh.com`: no command runs on the target.
    Sftp,
    /// Hashed on the target (`openssl dgst -sha256`, else `sha256sum`) and renamed by the
    /// same command: no read-back traffic. A target with neither tool is read back.
    Command,
}

impl VerifyUploads {
    /// [`VerifyUploads::Auto`] reads back files up to this size (8 MiB).
    pub const READ_BACK_UP_TO: u64 = 8 * 1024 * 1024;

    /// Whether an upload of `size` bytes is read back over SFTP.
    pub fn reads_back(self, size: u64) -> bool {
        match self {
            VerifyUploads::Auto => size <= Self::READ_BACK_UP_TO,
            VerifyUploads::Sftp => true,
            VerifyUploads::Command => false,
        }
    }
}

impl SshAuth {
    /// Key auth with strict host-key checking, uploads verified the [`VerifyUploads::Auto`] way.
    pub fn new(key_path: impl Into<PathBuf>, known_hosts_path: impl Into<PathBuf>) -> Self {
        SshAuth {
            key_path: key_path.into(),
            known_hosts_path: known_hosts_path.into(),
            strict_host_key_checking: true,
            verify: VerifyUploads::Auto,
        }
    }
}

/// What a command printed and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// The exit status; 128 + the signal number when the command was killed by a signal.
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

impl ExecOutput {
    pub fn success(&self) -> bool {
        self.status == 0
    }
}

/// Which of a command's outputs a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Receives a command's output as it arrives: which stream, and the next bytes of it (any
/// size; a line, a character or a secret may be split over several calls).
pub type OnOutput<'a> = &'a (dyn Fn(Stream, &[u8]) + Send + Sync);

/// What [`Connection::exec`] keeps of a command's output: all of it (its own commands
/// print little; a deploy's go through [`Connection::exec_streaming`]).
#[derive(Default)]
pub(crate) struct Collected {
    stdout: std::sync::Mutex<Vec<u8>>,
    stderr: std::sync::Mutex<Vec<u8>>,
}

impl Collected {
    pub(crate) fn take(&self, stream: Stream, bytes: &[u8]) {
        let buffer = match stream {
            Stream::Stdout => &self.stdout,
            Stream::Stderr => &self.stderr,
        };
        buffer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(bytes);
    }

    pub(crate) fn into_output(self, status: i32) -> ExecOutput {
        let text = |buffer: std::sync::Mutex<Vec<u8>>| {
            let bytes = buffer.into_inner().unwrap_or_else(|e| e.into_inner());
            String::from_utf8_lossy(&bytes).into_owned()
        };
        ExecOutput {
            status,
            stdout: text(self.stdout),
            stderr: text(self.stderr),
        }
    }
}

/// `$HOME` as the target's shell says it, without its trailing `/` (empty for `/`).
pub(crate) async fn home_from_shell<C: Connection + ?Sized>(
    conn: &C,
) -> Result<String, TransportError> {
    const ASK: &str = "printf '%s\\n' \"$HOME\"";
    let out = conn.exec(ASK, &[]).await?;
    let printed = out.stdout.trim_end_matches('\n');
    if out.status != 0 || !printed.starts_with('/') {
        return Err(TransportError::Remote {
            command: ASK.to_string(),
            status: out.status,
            stderr: format!(
                "no home directory for the account on {} (printed {printed:?}): {}",
                conn.describe(),
                out.stderr.trim_end()
            ),
        });
    }
    Ok(printed.trim_end_matches('/').to_string())
}

/// A way to act on one target.
#[async_trait::async_trait]
pub trait Connection: Send + Sync {
    /// Runs `command` through the target's `sh -c` with the given environment variables
    /// (exported in the command line; sshd's `AcceptEnv` is not relied on). A non-zero
    /// exit status is returned in the output, not as an error.
    async fn exec(
        &self,
        command: &str,
        env: &[(String, String)],
    ) -> Result<ExecOutput, TransportError>;

    /// Runs `command` as [`Connection::exec`] does, handing its stdout and stderr to
    /// `on_output` as they arrive, and returns its exit status. Nothing is kept here: a
    /// command may print more than fits in memory. This default hands the output over
    /// at the end, for transports that cannot stream.
    async fn exec_streaming(
        &self,
        command: &str,
        env: &[(String, String)],
        on_output: OnOutput<'_>,
    ) -> Result<i32, TransportError> {
        let out = self.exec(command, env).await?;
        on_output(Stream::Stdout, out.stdout.as_bytes());
        on_output(Stream::Stderr, out.stderr.as_bytes());
        Ok(out.status)
    }

    /// Uploads `local` to `dest` atomically: creates the parent directory, writes
    /// `<dest>.part`, fsyncs it, renames it to `dest`. Idempotent, streamed, and the file
    /// keeps the permission bits of `local`.
    async fn put_file_atomic(&self, local: &Path, dest: &str) -> Result<(), TransportError>;

    /// Uploads `local` to `dest` like [`Connection::put_file_atomic`], and makes sure the
    /// file that lands there has the sha256 `sha256` (hex, either case). A mismatch is an
    /// error. Transports that can check `<dest>.part` before the rename (SSH, local) leave
    /// `dest` untouched and remove the `.part` on a mismatch; this default implementation
    /// checks after the rename.
    async fn put_file_verified(
        &self,
        local: &Path,
        dest: &str,
        sha256: &str,
    ) -> Result<(), TransportError> {
        self.put_file_atomic(local, dest).await?;
        match self.sha256(dest).await? {
            Some(sum) if sum.eq_ignore_ascii_case(sha256) => Ok(()),
            Some(sum) => Err(TransportError::Mismatch {
                path: dest.to_string(),
                target: self.describe(),
                expected: sha256.to_ascii_lowercase(),
                actual: Some(sum),
            }),
            None => Err(TransportError::Mismatch {
                path: dest.to_string(),
                target: self.describe(),
                expected: sha256.to_ascii_lowercase(),
                actual: None,
            }),
        }
    }

    /// The sha256 (lowercase hex) of a file on the target, `None` if it does not exist.
    async fn sha256(&self, path: &str) -> Result<Option<String>, TransportError>;

    /// The account's home directory on the target, as an absolute path without its
    /// trailing `/` (empty for `/`). This default asks the target's shell for `$HOME`.
    async fn home_dir(&self) -> Result<String, TransportError> {
        home_from_shell(self).await
    }

    /// Free bytes (for an unprivileged user) on the filesystem that holds `path`, or that
    /// would hold it: the nearest existing ancestor is measured.
    async fn free_space(&self, path: &str) -> Result<u64, TransportError>;

    /// `user@host:port`, or `local`.
    fn describe(&self) -> String;

    /// Whether the connection is known to be unusable (the pool then opens a new one).
    fn is_closed(&self) -> bool {
        false
    }
}

/// Opens a connection: the local transport for `host: local`, SSH otherwise.
pub async fn connect(
    addr: &Address,
    auth: &SshAuth,
) -> Result<Arc<dyn Connection>, TransportError> {
    if addr.is_local() {
        return Ok(Arc::new(LocalConnection::new()));
    }
    Ok(Arc::new(ssh::SshConnection::connect(addr, auth).await?))
}
