//! `TransportError`: every way reaching a target can fail, each message saying what to do.
//! Messages name hosts, users, key *paths* and commands, never key contents or the values
//! of environment variables.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error(
        "the host key of {host}:{port} ({fingerprint}) is not in {known_hosts}; \
         add it (ssh-keyscan -p {port} {host}) after checking the fingerprint \
         {fingerprint} with the host's administrator"
    )]
    UnknownHostKey {
        host: String,
        port: u16,
        fingerprint: String,
        known_hosts: PathBuf,
    },
    #[error(
        "the host key of {host}:{port} changed: it is now {fingerprint}, which differs \
         from the key recorded in {known_hosts}. Someone may be intercepting the connection \
         (man-in-the-middle attack), or the host was reinstalled; refusing to connect. \
         Check the new key with the host's administrator before replacing the line in \
         {known_hosts}"
    )]
    ChangedHostKey {
        host: String,
        port: u16,
        fingerprint: String,
        known_hosts: PathBuf,
    },
    #[error(
        "{user}@{host}:{port} refused the key {}: is its public key in the authorized_keys \
         of {user} on {host}?",
        key.display()
    )]
    Auth {
        user: String,
        host: String,
        port: u16,
        key: PathBuf,
    },
    #[error("cannot connect to {host}:{port}: {message}")]
    Connect {
        host: String,
        port: u16,
        message: String,
    },
    #[error("cannot use the private key {}: {message}", path.display())]
    Key { path: PathBuf, message: String },
    #[error("{what}: {message}")]
    Io { what: String, message: String },
    #[error("`{command}` failed with exit status {status}: {stderr}")]
    Remote {
        command: String,
        status: i32,
        stderr: String,
    },
    #[error(
        "{path} on {target}: sha256 {}, expected {expected}",
        actual.as_deref().unwrap_or("(missing)")
    )]
    Mismatch {
        path: String,
        target: String,
        expected: String,
        /// `None` when the file is missing.
        actual: Option<String>,
    },
    #[error("SSH protocol error: {0}")]
    Protocol(String),
}

impl TransportError {
    pub(crate) fn io(what: impl Into<String>, err: impl std::fmt::Display) -> Self {
        TransportError::Io {
            what: what.into(),
            message: err.to_string(),
        }
    }
}
