//! The SSH transport: one russh session per target (key auth, strict host-key checking),
//! commands on session channels, files over one SFTP channel opened on first use.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use russh::{
    ChannelMsg, Sig,
    client::{self, AuthResult},
    keys::{PrivateKeyWithHashAlg, PublicKeyOrCertificate, load_secret_key},
};
use russh_sftp::{
    client::{RawSftpSession, SftpSession, error::Error as SftpError},
    protocol::{FileAttributes, OpenFlags, Packet, StatusCode},
};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{
    Address, Collected, Connection, ExecOutput, OnOutput, SshAuth, Stream, TransportError,
    VerifyUploads, known_hosts,
    shell::{parent_dir, quote, sh_command_line, sh_script, supervised},
};

/// TCP connect, SSH handshake and authentication together.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// A silent server is probed this often; three unanswered probes close the connection.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);
/// One SFTP request (a write, the fsync of a large file) may take this long.
const SFTP_REQUEST_TIMEOUT_SECS: u64 = 120;
/// The size of one SFTP write to a server that announces `limits@openssh.com` (OpenSSH 8.6
/// and later; the server's own maximum wins when smaller): OpenSSH's sftp-server takes up to
/// 255 KiB per write. Eight times fewer requests and acknowledgements than 32 KiB writes, for
/// the same bytes in flight: 50 MB to 20 loopback targets cost 9–22 % less CPU (all
/// processes, the targets' sshd and sftp-server included), see bench/README.md.
const SFTP_LARGE_WRITE: u32 = 255 * 1024;
/// The size of one SFTP write packet otherwise: 32 KiB, what every SFTP server accepts.
const SFTP_SMALL_WRITE: u32 = 32 * 1024;
/// Bytes of SFTP writes sent before waiting for the oldest acknowledgement (2 MiB: OpenSSH's
/// channel window).
const SFTP_BYTES_IN_FLIGHT: usize = 2 * 1024 * 1024;
/// Bytes read from the local file per SFTP write burst: whole large writes.
const UPLOAD_CHUNK: usize = 4 * SFTP_LARGE_WRITE as usize;
/// The SFTP extension for an atomic rename that replaces the destination (plain SFTP rename
/// refuses an existing destination on OpenSSH).
const POSIX_RENAME: &str = "posix-rename@openssh.com";
/// The SFTP extension by which a server states its largest read and write.
const LIMITS: &str = "limits@openssh.com";
/// Room for an SFTP write request's header (length, type, id, handle, offset, data length)
/// in the packet size russh-sftp is given: handles of OpenSSH's sftp-server are 4 bytes.
const SFTP_WRITE_HEADER: u32 = 64;

/// The SFTP extensions this transport uses, as the server announced them.
#[derive(Debug, Clone, Copy)]
struct SftpExtensions {
    posix_rename: bool,
    limits: bool,
}

/// The ciphers offered, most preferred first: russh's defaults with AES-GCM moved ahead,
/// 128-bit first (10 AES rounds instead of 14: ~25% faster on the fan-out benchmark).
const PREFERRED_CIPHERS: &[russh::cipher::Name] = &[
    russh::cipher::AES_128_GCM,
    russh::cipher::AES_256_GCM,
    russh::cipher::CHACHA20_POLY1305,
    russh::cipher::AES_256_CTR,
    russh::cipher::AES_192_CTR,
    russh::cipher::AES_128_CTR,
];

/// Why the handshake stopped: russh's own errors, or our verdict on the host key.
#[derive(Debug)]
enum HandlerError {
    Russh(russh::Error),
    HostKey(TransportError),
}

impl From<russh::Error> for HandlerError {
    fn from(e: russh::Error) -> Self {
        HandlerError::Russh(e)
    }
}

struct Client {
    host: String,
    port: u16,
    known_hosts: PathBuf,
    /// The keys `known_hosts` records for the host, read before connecting.
    recorded: Vec<russh::keys::PublicKey>,
    strict: bool,
}

impl client::Handler for Client {
    type Error = HandlerError;

    async fn check_server_key(
        &mut self,
        server_key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        match server_key {
            PublicKeyOrCertificate::PublicKey { key, .. } => known_hosts::check_recorded(
                &self.host,
                self.port,
                key,
                &self.recorded,
                &self.known_hosts,
                self.strict,
            )
            .map(|()| true)
            .map_err(HandlerError::HostKey),
            // Never asked for (no certificate algorithms are advertised).
            PublicKeyOrCertificate::Certificate(_) => Err(HandlerError::HostKey(
                TransportError::Protocol("the server presented a host certificate".into()),
            )),
        }
    }
}

pub(crate) struct SshConnection {
    addr: Address,
    handle: client::Handle<Client>,
    sftp: tokio::sync::OnceCell<SftpSession>,
    /// A second SFTP channel, low-level, opened first: its `init` tells which extensions the
    /// server has (russh-sftp's `SftpSession` keeps that to itself), and it sends
    /// `posix-rename@openssh.com` (which `SftpSession` does not expose).
    raw_sftp: tokio::sync::OnceCell<(RawSftpSession, SftpExtensions)>,
    /// [`SshAuth::verify`].
    verify: VerifyUploads,
}

fn connect_error(addr: &Address, message: impl ToString) -> TransportError {
    TransportError::Connect {
        host: addr.host.clone(),
        port: addr.port,
        message: message.to_string(),
    }
}

fn sftp_error(what: String, e: SftpError) -> TransportError {
    TransportError::io(what, e)
}

fn is_not_found(e: &SftpError) -> bool {
    matches!(e, SftpError::Status(s) if s.status_code == StatusCode::NoSuchFile)
}

fn signal_number(sig: &Sig) -> i32 {
    match sig {
        Sig::HUP => 1,
        Sig::INT => 2,
        Sig::QUIT => 3,
        Sig::ILL => 4,
        Sig::ABRT => 6,
        Sig::FPE => 8,
        Sig::KILL => 9,
        Sig::USR1 => 10,
        Sig::SEGV => 11,
        Sig::PIPE => 13,
        Sig::ALRM => 14,
        Sig::TERM => 15,
        Sig::Custom(_) => 127,
    }
}

impl SshConnection {
    pub(crate) async fn connect(addr: &Address, auth: &SshAuth) -> Result<Self, TransportError> {
        // Read the key and known_hosts first, on a blocking thread (files, and the key's
        // decryption): a missing or unusable key is reported as such, not as a
        // connection problem, and costs no round trip.
        let (key_path, known_hosts) = (auth.key_path.clone(), auth.known_hosts_path.clone());
        let (host, port) = (addr.host.clone(), addr.port);
        let (key, recorded) = tokio::task::spawn_blocking(move || {
            let key = load_secret_key(&key_path, None).map_err(|e| TransportError::Key {
                path: key_path.clone(),
                message: e.to_string(),
            });
            (key, known_hosts::recorded_keys(&host, port, &known_hosts))
        })
        .await
        .map_err(|e| TransportError::Protocol(format!("reading the SSH key: {e}")))?;
        let (key, recorded) = (key?, recorded?);
        tokio::time::timeout(CONNECT_TIMEOUT, Self::handshake(addr, auth, key, recorded))
            .await
            .map_err(|_| {
                connect_error(
                    addr,
                    format!("no answer within {}s", CONNECT_TIMEOUT.as_secs()),
                )
            })?
    }

    async fn handshake(
        addr: &Address,
        auth: &SshAuth,
        key: russh::keys::PrivateKey,
        recorded: Vec<russh::keys::PublicKey>,
    ) -> Result<Self, TransportError> {
        let preferred = russh::Preferred {
            key: known_hosts::preferred_for(&recorded).into(),
            // AES-GCM first: hardware-accelerated on both ends (ring here, OpenSSL in sshd),
            // far cheaper per byte than ChaCha20-Poly1305 where AES-NI exists; both AEADs.
            cipher: PREFERRED_CIPHERS.into(),
            ..Default::default()
        };
        let config = Arc::new(client::Config {
            preferred,
            keepalive_interval: Some(KEEPALIVE_INTERVAL),
            keepalive_max: 3,
            nodelay: true,
            ..Default::default()
        });
        let client = Client {
            host: addr.host.clone(),
            port: addr.port,
            known_hosts: auth.known_hosts_path.clone(),
            recorded,
            strict: auth.strict_host_key_checking,
        };
        let mut handle = client::connect(config, (addr.host.as_str(), addr.port), client)
            .await
            .map_err(|e| match e {
                HandlerError::HostKey(e) => e,
                HandlerError::Russh(e) => connect_error(addr, e),
            })?;

        let hash_alg = handle
            .best_supported_rsa_hash()
            .await
            .map_err(|e| connect_error(addr, e))?
            .flatten();
        let result = handle
            .authenticate_publickey(
                &addr.user,
                PrivateKeyWithHashAlg::new(Arc::new(key), hash_alg),
            )
            .await
            .map_err(|e| connect_error(addr, e))?;
        match result {
            AuthResult::Success => Ok(SshConnection {
                addr: addr.clone(),
                handle,
                sftp: tokio::sync::OnceCell::new(),
                raw_sftp: tokio::sync::OnceCell::new(),
                verify: auth.verify,
            }),
            AuthResult::Failure { .. } => Err(TransportError::Auth {
                user: addr.user.clone(),
                host: addr.host.clone(),
                port: addr.port,
                key: auth.key_path.clone(),
            }),
        }
    }

    fn protocol(&self, what: &str, e: impl std::fmt::Display) -> TransportError {
        TransportError::Protocol(format!("{what} on {}: {e}", self.describe()))
    }

    /// Runs an exact command line (already quoted) and collects its output.
    async fn run(&self, command_line: String) -> Result<ExecOutput, TransportError> {
        let collected = Collected::default();
        let status = self
            .run_streaming(command_line, None, &|stream, bytes| {
                collected.take(stream, bytes)
            })
            .await?;
        Ok(collected.into_output(status))
    }

    /// Runs a command line, handing its output to `on_output` as it arrives; returns its
    /// exit status. Under `switch`, a pulse goes down the channel's stdin at each of its
    /// ticks while the worker may still act (the command line is [`supervised`] with the
    /// switch's timeout).
    async fn run_streaming(
        &self,
        command_line: String,
        switch: Option<&manent_guard::DeadMansSwitch>,
        on_output: OnOutput<'_>,
    ) -> Result<i32, TransportError> {
        let channel = self
            .handle
            .channel_open_session()
            .await
            .map_err(|e| self.protocol("opening a session channel", e))?;
        channel
            .exec(true, command_line)
            .await
            .map_err(|e| self.protocol("starting a command", e))?;
        let (mut reader, writer) = channel.split();
        let close = CloseOnDrop(Some(writer));
        let mut status = None;
        let mut pulses = switch.map(|s| (s, s.ticker()));
        loop {
            let msg = match &mut pulses {
                None => reader.wait().await,
                Some((switch, ticker)) => tokio::select! {
                    msg = reader.wait() => msg,
                    _ = ticker.tick() => {
                        if switch.may_pulse()
                            && let Some(writer) = &close.0
                        {
                            // A failed pulse is a closed channel: the next read says so.
                            let _ = writer.data_bytes(manent_guard::PULSE).await;
                        }
                        continue;
                    }
                },
            };
            let Some(msg) = msg else { break };
            match msg {
                ChannelMsg::Data { data } => on_output(Stream::Stdout, &data),
                ChannelMsg::ExtendedData { data, ext: 1 } => on_output(Stream::Stderr, &data),
                ChannelMsg::ExitStatus { exit_status } => {
                    status = Some(i32::try_from(exit_status).unwrap_or(i32::MAX));
                }
                ChannelMsg::ExitSignal { signal_name, .. } => {
                    status = Some(128 + signal_number(&signal_name));
                }
                ChannelMsg::Failure => {
                    return Err(self.protocol("running a command", "the server refused it"));
                }
                _ => {}
            }
        }
        close.disarm();
        status.ok_or_else(|| {
            self.protocol(
                "running a command",
                "the channel closed without an exit status (connection lost?)",
            )
        })
    }

    /// Runs one of our own commands, whose failure is an error.
    async fn run_checked(&self, script: String) -> Result<ExecOutput, TransportError> {
        let out = self.run(sh_command_line(&script, &[])?).await?;
        if out.success() {
            Ok(out)
        } else {
            Err(TransportError::Remote {
                command: script,
                status: out.status,
                stderr: out.stderr.trim_end().to_string(),
            })
        }
    }

    /// A new session channel running the `sftp` subsystem, as a byte stream.
    async fn sftp_channel(&self) -> Result<russh::ChannelStream<client::Msg>, TransportError> {
        let channel = self
            .handle
            .channel_open_session()
            .await
            .map_err(|e| self.protocol("opening an SFTP channel", e))?;
        channel
            .request_subsystem(true, "sftp")
            .await
            .map_err(|e| self.protocol("starting the SFTP subsystem", e))?;
        Ok(channel.into_stream())
    }

    /// The low-level SFTP channel and the server's extensions, opened on first use.
    async fn raw_sftp(&self) -> Result<&(RawSftpSession, SftpExtensions), TransportError> {
        self.raw_sftp
            .get_or_try_init(|| async {
                let raw = RawSftpSession::new_with_config(
                    self.sftp_channel().await?,
                    russh_sftp::client::Config {
                        request_timeout_secs: SFTP_REQUEST_TIMEOUT_SECS,
                        ..Default::default()
                    },
                );
                let version = raw
                    .init()
                    .await
                    .map_err(|e| self.protocol("starting SFTP", e))?;
                let has = |name: &str| version.extensions.get(name).is_some_and(|v| v == "1");
                let extensions = SftpExtensions {
                    posix_rename: has(POSIX_RENAME),
                    limits: has(LIMITS),
                };
                Ok::<_, TransportError>((raw, extensions))
            })
            .await
    }

    /// Renames `from` to `to` atomically, replacing `to`, with `posix-rename@openssh.com`.
    /// `Ok(false)` when the server does not offer it.
    async fn posix_rename(&self, from: &str, to: &str) -> Result<bool, TransportError> {
        let (raw, extensions) = self.raw_sftp().await?;
        if !extensions.posix_rename {
            return Ok(false);
        }
        // The request's data: two SSH strings (u32 length, then the bytes).
        let mut data = Vec::with_capacity(8 + from.len() + to.len());
        for path in [from, to] {
            let len = u32::try_from(path.len())
                .map_err(|_| self.protocol("posix-rename", "path too long"))?;
            data.extend_from_slice(&len.to_be_bytes());
            data.extend_from_slice(path.as_bytes());
        }
        let what = || format!("cannot rename {from} to {to} on {}", self.describe());
        match raw.extended(POSIX_RENAME, data).await {
            Ok(Packet::Status(status)) if status.status_code == StatusCode::Ok => Ok(true),
            Ok(Packet::Status(status)) => Err(TransportError::io(
                what(),
                format!("{:?}: {}", status.status_code, status.error_message),
            )),
            Ok(other) => Err(self.protocol("posix-rename", format!("unexpected {other:?}"))),
            Err(e) => Err(sftp_error(what(), e)),
        }
    }

    async fn sftp(&self) -> Result<&SftpSession, TransportError> {
        self.sftp
            .get_or_try_init(|| async {
                // A server that states its limits gets large writes, capped by russh-sftp at
                // the limits it states; any other gets the size every server accepts.
                // (russh-sftp is given the whole packet: the data and the request's header.)
                let (write, packet) = if self.raw_sftp().await?.1.limits {
                    (SFTP_LARGE_WRITE, SFTP_LARGE_WRITE + SFTP_WRITE_HEADER)
                } else {
                    (SFTP_SMALL_WRITE, SFTP_SMALL_WRITE)
                };
                let config = russh_sftp::client::Config {
                    request_timeout_secs: SFTP_REQUEST_TIMEOUT_SECS,
                    max_concurrent_writes: SFTP_BYTES_IN_FLIGHT / write as usize,
                    max_write_packet_len: packet,
                    ..Default::default()
                };
                SftpSession::new_with_config(self.sftp_channel().await?, config)
                    .await
                    .map_err(|e| self.protocol("starting SFTP", e))
            })
            .await
    }

    /// Writes `local` to `part` over SFTP (writes pipelined by russh-sftp, up to
    /// `SFTP_BYTES_IN_FLIGHT` in flight), fsyncs and closes it; returns the bytes written.
    /// `remove_leftover`: remove an existing `part` first (the caller has not done it already).
    async fn upload(
        &self,
        local: &Path,
        part: &str,
        remove_leftover: bool,
    ) -> Result<u64, TransportError> {
        let what = |action: &str| format!("{action} {part} on {}", self.describe());
        let mut file = tokio::fs::File::open(local)
            .await
            .map_err(|e| TransportError::io(format!("cannot open {}", local.display()), e))?;
        let mode = {
            use std::os::unix::fs::PermissionsExt;
            let meta = file
                .metadata()
                .await
                .map_err(|e| TransportError::io(format!("cannot stat {}", local.display()), e))?;
            meta.permissions().mode() & 0o7777
        };
        let sftp = self.sftp().await?;
        // A `.part` left by an interrupted upload may be read-only: start afresh.
        if remove_leftover {
            match sftp.remove_file(part).await {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(sftp_error(what("cannot remove the leftover"), e)),
            }
        }
        let attrs = FileAttributes {
            permissions: Some(mode),
            ..FileAttributes::empty()
        };
        let mut remote = sftp
            .open_with_flags_and_attributes(
                part,
                OpenFlags::CREATE | OpenFlags::TRUNCATE | OpenFlags::WRITE,
                attrs,
            )
            .await
            .map_err(|e| sftp_error(what("cannot create"), e))?;
        let mut buf = vec![0u8; UPLOAD_CHUNK];
        let mut written = 0u64;
        loop {
            let n = file
                .read(&mut buf)
                .await
                .map_err(|e| TransportError::io(format!("cannot read {}", local.display()), e))?;
            if n == 0 {
                break;
            }
            written += n as u64;
            remote
                .write_all(&buf[..n])
                .await
                .map_err(|e| TransportError::io(what("cannot write"), e))?;
        }
        // Waits for every pending write, then fsyncs (fsync@openssh.com).
        remote
            .flush()
            .await
            .map_err(|e| TransportError::io(what("cannot fsync"), e))?;
        remote
            .shutdown()
            .await
            .map_err(|e| TransportError::io(what("cannot close"), e))?;
        Ok(written)
    }

    /// `mkdir -p` over SFTP, with no process on the target: finds the nearest existing
    /// ancestor (stat, following symlinks), then creates the missing directories downwards.
    async fn mkdir_p(&self, dir: &str) -> Result<(), TransportError> {
        let sftp = self.sftp().await?;
        let mut missing = Vec::new();
        let mut current = Some(dir.trim_end_matches('/'));
        while let Some(path) = current.filter(|p| !p.is_empty() && *p != ".") {
            match sftp.metadata(path).await {
                Ok(m) if m.is_dir() => break,
                Ok(_) => {
                    return Err(TransportError::io(
                        format!("cannot create the directory {dir} on {}", self.describe()),
                        format!("{path} is not a directory"),
                    ));
                }
                Err(e) if is_not_found(&e) => {
                    missing.push(path);
                    current = parent_dir(path);
                }
                Err(e) => {
                    return Err(sftp_error(
                        format!("cannot stat {path} on {}", self.describe()),
                        e,
                    ));
                }
            }
        }
        for path in missing.into_iter().rev() {
            if let Err(e) = sftp.create_dir(path).await {
                // Another upload may have created it meanwhile.
                if !matches!(sftp.metadata(path).await, Ok(m) if m.is_dir()) {
                    return Err(sftp_error(
                        format!("cannot create the directory {path} on {}", self.describe()),
                        e,
                    ));
                }
            }
        }
        Ok(())
    }

    async fn sha256_over_sftp(&self, path: &str) -> Result<Option<String>, TransportError> {
        let what = |action: &str| format!("{action} {path} on {}", self.describe());
        let sftp = self.sftp().await?;
        let mut file = match sftp.open(path).await {
            Ok(f) => f,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(sftp_error(what("cannot open"), e)),
        };
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; UPLOAD_CHUNK];
        loop {
            let n = file
                .read(&mut buf)
                .await
                .map_err(|e| TransportError::io(what("cannot read"), e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        Ok(Some(format!("{:x}", hasher.finalize())))
    }
}

/// A script fragment that leaves the sha256 of the file `path_q` (already quoted) in `$d`, as
/// 64 lowercase hex digits. `openssl dgst` first: it uses the CPU's SHA instructions where they
/// exist, about five times faster than coreutils' `sha256sum` on these machines (50 MB: 0.04 s
/// against 0.2 s of CPU), which matters when 20 targets share a host's cores. An `openssl` that
/// is missing, fails or prints something else falls back to `sha256sum`; with neither, the
/// script exits [`NO_HASHING_TOOL`] and the caller hashes over SFTP. A file that cannot be read
/// exits 1 with `sha256sum`'s message.
fn digest_into_d(path_q: &str) -> String {
    format!(
        "d=; \
         if command -v openssl >/dev/null 2>&1; then \
         d=$(openssl dgst -sha256 -r < {path_q} 2>/dev/null) && d=${{d%% *}} || d=; \
         case $d in *[!0-9a-f]*) d= ;; esac; fi; \
         if [ ${{#d}} -ne 64 ]; then \
         command -v sha256sum >/dev/null 2>&1 || exit {NO_HASHING_TOOL}; \
         d=$(sha256sum < {path_q}) || exit 1; d=${{d%% *}}; fi"
    )
}

/// `sha256sum`'s digest from its output line (`\` first when it escaped the file name).
fn parse_sha256sum(stdout: &str) -> Option<String> {
    let digest = stdout.split_whitespace().next()?.trim_start_matches('\\');
    (digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| digest.to_ascii_lowercase())
}

/// Exit status of the sha256 script when the file does not exist.
const ABSENT: i32 = 3;
/// Exit status of the verified rename when the `.part` has another sha256.
const MISMATCH: i32 = 4;
/// Exit status of the sha256 script when the target has neither `openssl` nor `sha256sum`.
const NO_HASHING_TOOL: i32 = 127;
/// What the verified rename prints last when it renamed.
const RENAMED: &str = "RENAMED";

#[async_trait::async_trait]
impl Connection for SshConnection {
    async fn exec(
        &self,
        command: &str,
        env: &[(String, String)],
    ) -> Result<ExecOutput, TransportError> {
        let collected = Collected::default();
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
        tracing::debug!(target = %self.describe(), command, "exec");
        // Supervised: the command and all it started are killed when this channel closes
        // (a cancelled or stopped run drops it) or, under the run's dead-man's switch,
        // when its pulses stop (a frozen worker), see `SUPERVISOR`.
        let switch = manent_guard::current();
        let line = supervised(
            &sh_script(command, env)?,
            switch.as_ref().map(|s| s.timeout_arg()).as_deref(),
        );
        self.run_streaming(line, switch.as_ref(), on_output).await
    }

    async fn put_file_atomic(&self, local: &Path, dest: &str) -> Result<(), TransportError> {
        let part = format!("{dest}.part");
        if let Some(parent) = parent_dir(dest) {
            self.run_checked(format!("mkdir -p -- {}", quote(parent)))
                .await?;
        }
        self.upload(local, &part, true).await?;
        // rename(2) by `mv` on the same directory: atomic, and it replaces an existing
        // file (SFTP's own rename refuses to).
        let (part_q, dest_q) = (quote(&part), quote(dest));
        self.run_checked(format!(
            "if [ -d {dest_q} ]; then echo {dest_q} is a directory >&2; exit 1; fi; \
             mv -f -- {part_q} {dest_q}"
        ))
        .await?;
        Ok(())
    }

    /// The directory is created and a leftover `.part` removed over SFTP, the `.part` written
    /// and fsynced over SFTP, then checked the [`SshAuth::verify`] way: read back and renamed
    /// over SFTP, or hashed and renamed by one command on the target, only if it matches. A
    /// mismatch removes the `.part` and leaves `dest` as it was. A target with no hashing
    /// tool has the `.part` hashed over SFTP and renamed by a second command.
    async fn put_file_verified(
        &self,
        local: &Path,
        dest: &str,
        sha256: &str,
    ) -> Result<(), TransportError> {
        let expected = sha256.to_ascii_lowercase();
        if expected.len() != 64 || !expected.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(TransportError::Protocol(format!(
                "{sha256:?} is not a sha256 (64 hex digits)"
            )));
        }
        let part = format!("{dest}.part");
        let (part_q, dest_q) = (quote(&part), quote(dest));
        // The directory and the removal of a leftover `.part` go over SFTP: no process runs
        // on the target before the write.
        if let Some(parent) = parent_dir(dest) {
            self.mkdir_p(parent).await?;
        }
        let size = self.upload(local, &part, true).await?;
        let mismatch = |actual: Option<String>| TransportError::Mismatch {
            path: part.clone(),
            target: self.describe(),
            expected: expected.clone(),
            actual,
        };
        // Hashes the `.part` over SFTP; one with another sha256 is removed.
        let read_back = async || match self.sha256_over_sftp(&part).await? {
            Some(sum) if sum == expected => Ok(()),
            actual => {
                let _ = self.sftp().await?.remove_file(part.as_str()).await;
                Err(mismatch(actual))
            }
        };
        if self.verify.reads_back(size) {
            // Verified by reading the fsynced `.part` back, renamed without a command: a
            // command costs the target a session and three processes (sh, openssl, mv),
            // more than reading back a small file.
            read_back().await?;
            if self.posix_rename(&part, dest).await? {
                return Ok(());
            }
        }

        let not_a_dir =
            format!("if [ -d {dest_q} ]; then echo {dest_q} is a directory >&2; exit 1; fi");
        // Hashes through stdin, so no file name ever needs escaping. The last line it prints
        // on success is `RENAMED`: an exit status of 0 without it (an account whose commands
        // the server replaces, `ForceCommand internal-sftp`) renamed nothing.
        let script = format!(
            "{not_a_dir}; {digest}; \
             if [ \"$d\" != {expected} ]; then \
             rm -f -- {part_q}; echo \"$d\"; exit {MISMATCH}; fi; \
             mv -f -- {part_q} {dest_q} && echo {RENAMED}",
            digest = digest_into_d(&part_q),
        );
        let command = format!("sha256 of {part_q} && mv -f -- {part_q} {dest_q}");
        let out = self.run(sh_command_line(&script, &[])?).await?;
        match out.status {
            0 if out.stdout.trim_end().ends_with(RENAMED) => Ok(()),
            0 => Err(TransportError::Remote {
                command,
                status: 0,
                stderr: format!(
                    "the command ended without renaming (its output: {:?}); does the account \
                     run commands? ssh.verify: sftp needs none",
                    out.stdout.trim_end()
                ),
            }),
            MISMATCH => Err(mismatch(parse_sha256sum(&out.stdout))),
            NO_HASHING_TOOL => {
                read_back().await?;
                self.run_checked(format!("{not_a_dir}; mv -f -- {part_q} {dest_q}"))
                    .await?;
                Ok(())
            }
            status => Err(TransportError::Remote {
                command,
                status,
                stderr: out.stderr.trim_end().to_string(),
            }),
        }
    }

    /// A file that is not there is learnt over SFTP, without a process on the target (a
    /// cold target, a new version's archive); one that is there is hashed by a command.
    async fn sha256(&self, path: &str) -> Result<Option<String>, TransportError> {
        if let Ok(sftp) = self.sftp().await
            && let Err(e) = sftp.metadata(path).await
            && is_not_found(&e)
        {
            return Ok(None);
        }
        let p = quote(path);
        let script = format!(
            "[ -e {p} ] || exit {ABSENT}; {digest}; echo \"$d\"",
            digest = digest_into_d(&p)
        );
        let out = self.run(sh_command_line(&script, &[])?).await?;
        match out.status {
            0 => parse_sha256sum(&out.stdout).map(Some).ok_or_else(|| {
                self.protocol(
                    "reading sha256sum's output",
                    format!("unexpected {:?}", out.stdout),
                )
            }),
            ABSENT => Ok(None),
            NO_HASHING_TOOL => self.sha256_over_sftp(path).await,
            status => Err(TransportError::Remote {
                command: format!("sha256 of {p}"),
                status,
                stderr: out.stderr.trim_end().to_string(),
            }),
        }
    }

    /// Where SFTP starts (`realpath .`: the home directory, unless the server's SFTP is
    /// set to start elsewhere, which then serves as well), without a process on the target;
    /// asked of the shell when SFTP cannot say.
    async fn home_dir(&self) -> Result<String, TransportError> {
        if let Ok(sftp) = self.sftp().await
            && let Ok(dir) = sftp.canonicalize(".").await
            && dir.starts_with('/')
        {
            return Ok(dir.trim_end_matches('/').to_string());
        }
        crate::home_from_shell(self).await
    }

    async fn free_space(&self, path: &str) -> Result<u64, TransportError> {
        let sftp = self.sftp().await?;
        let mut current = path.trim_end_matches('/').to_string();
        loop {
            let probe = if current.is_empty() { "/" } else { &current };
            match sftp.fs_info(probe).await {
                Ok(Some(st)) => return Ok(st.blocks_avail.saturating_mul(st.fragment_size)),
                Ok(None) => {
                    return Err(self.protocol(
                        "measuring free space",
                        "the SFTP server lacks the statvfs@openssh.com extension",
                    ));
                }
                Err(e) if is_not_found(&e) && current != "." && !current.is_empty() => {
                    current = match parent_dir(&current) {
                        Some(parent) => parent.to_string(),
                        // An absolute path's base is `/`, a relative one's the home directory.
                        None if current.starts_with('/') => String::new(),
                        None => ".".to_string(),
                    };
                }
                Err(e) => {
                    return Err(sftp_error(
                        format!(
                            "cannot measure free space at {probe} on {}",
                            self.describe()
                        ),
                        e,
                    ));
                }
            }
        }
    }

    fn describe(&self) -> String {
        self.addr.to_string()
    }

    fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }
}

/// Closes a command's channel when dropped armed (the run was stopped while
/// the command ran): the target sees its stdin end, and a supervised command
/// is killed with everything it started. russh leaves a dropped channel open.
struct CloseOnDrop(Option<russh::ChannelWriteHalf<client::Msg>>);

impl CloseOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        let Some(writer) = self.0.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = writer.eof().await;
                let _ = writer.close().await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256sum_output_with_and_without_an_escaped_name() {
        let d = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(
            parse_sha256sum(&format!("{d}  /srv/a\n")).as_deref(),
            Some(d),
            "plain line"
        );
        assert_eq!(
            parse_sha256sum(&format!("\\{d}  /srv/a\\nb\n")).as_deref(),
            Some(d),
            "a name with a newline makes sha256sum prefix the line with a backslash"
        );
        assert_eq!(parse_sha256sum("garbage"), None, "not a digest");
    }
}
