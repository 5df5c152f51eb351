//! Host-key checking against an OpenSSH `known_hosts` file (russh's reader: plain,
//! `[host]:port` and hashed `|1|` entries), and the host-key algorithms to ask for first.

use std::path::Path;

use russh::keys::{Algorithm, HashAlg, PublicKey, known_hosts::known_host_keys_path};

use crate::TransportError;

/// The keys `known_hosts` records for `host:port`. It reads the file: call it off the
/// async threads.
pub(crate) fn recorded_keys(
    host: &str,
    port: u16,
    known_hosts: &Path,
) -> Result<Vec<PublicKey>, TransportError> {
    known_host_keys_path(host, port, known_hosts)
        .map(|found| found.into_iter().map(|(_, key)| key).collect())
        .map_err(|e| {
            TransportError::io(
                format!("cannot read the known_hosts file {}", known_hosts.display()),
                e,
            )
        })
}

pub(crate) fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

/// Accepts `key` for `host:port` only if `known_hosts` records it. A host recorded with
/// other keys is a changed key (refused even when not strict); a host not recorded at all
/// is refused when `strict`, accepted with a warning otherwise.
#[cfg(test)]
pub(crate) fn check_host_key(
    host: &str,
    port: u16,
    key: &PublicKey,
    known_hosts: &Path,
    strict: bool,
) -> Result<(), TransportError> {
    let recorded = recorded_keys(host, port, known_hosts)?;
    check_recorded(host, port, key, &recorded, known_hosts, strict)
}

/// [`check_host_key`] against keys already read from `known_hosts` (the handshake runs
/// on the async threads; the file is read before it).
pub(crate) fn check_recorded(
    host: &str,
    port: u16,
    key: &PublicKey,
    recorded: &[PublicKey],
    known_hosts: &Path,
    strict: bool,
) -> Result<(), TransportError> {
    if recorded.iter().any(|r| r.key_data() == key.key_data()) {
        return Ok(());
    }
    let fingerprint = fingerprint(key);
    if !recorded.is_empty() {
        return Err(TransportError::ChangedHostKey {
            host: host.to_string(),
            port,
            fingerprint,
            known_hosts: known_hosts.to_path_buf(),
        });
    }
    if strict {
        return Err(TransportError::UnknownHostKey {
            host: host.to_string(),
            port,
            fingerprint,
            known_hosts: known_hosts.to_path_buf(),
        });
    }
    tracing::warn!(
        host,
        port,
        %fingerprint,
        known_hosts = %known_hosts.display(),
        "host key not in known_hosts; accepted because strict host-key checking is off"
    );
    Ok(())
}

fn same_family(a: &Algorithm, b: &Algorithm) -> bool {
    match (a, b) {
        (Algorithm::Rsa { .. }, Algorithm::Rsa { .. }) => true,
        _ => a == b,
    }
}

/// russh's host-key algorithms, those of the keys recorded for the host first, as OpenSSH
/// does: a host with an RSA and an ed25519 key, known by its RSA key, is asked for that one.
pub(crate) fn preferred_for(recorded: &[PublicKey]) -> Vec<Algorithm> {
    let defaults = russh::Preferred::DEFAULT.key.to_vec();
    let known: Vec<Algorithm> = recorded.iter().map(PublicKey::algorithm).collect();
    let (mut first, rest): (Vec<_>, Vec<_>) = defaults
        .into_iter()
        .partition(|a| known.iter().any(|k| same_family(a, k)));
    first.extend(rest);
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    // Public keys only (generated with ssh-keygen for these tests).
    const KEY_A: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPSO3OJ21W4stzqPT111exJCN8AmPrUIP2SmO7whTvE9";
    const KEY_B: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBfzzzZonHZzMWepbTUEcz+GfNSdMkIe/9qvlNHsfxXE";

    fn key(line: &str) -> PublicKey {
        PublicKey::from_openssh(line).expect("a valid test key")
    }

    fn known_hosts(content: &str) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(file.path(), content).expect("write known_hosts");
        file
    }

    #[test]
    fn a_recorded_key_on_a_non_default_port_is_accepted() {
        let file = known_hosts(&format!("# comment\n[web1]:2222 {KEY_A}\n"));
        check_host_key("web1", 2222, &key(KEY_A), file.path(), true)
            .expect("the key recorded as [web1]:2222 must be accepted");
    }

    #[test]
    fn a_key_recorded_for_another_port_is_unknown() {
        let file = known_hosts(&format!("web1 {KEY_A}\n"));
        let err = check_host_key("web1", 2222, &key(KEY_A), file.path(), true).unwrap_err();
        assert!(
            matches!(err, TransportError::UnknownHostKey { .. }),
            "an entry for port 22 says nothing about port 2222, got {err}"
        );
    }

    #[test]
    fn a_different_key_for_a_recorded_host_is_a_changed_key_even_when_not_strict() {
        let file = known_hosts(&format!("web1 {KEY_A}\n"));
        let err = check_host_key("web1", 22, &key(KEY_B), file.path(), false).unwrap_err();
        assert!(
            matches!(err, TransportError::ChangedHostKey { .. }),
            "a changed key must never be accepted, got {err}"
        );
        assert!(
            err.to_string().contains("man-in-the-middle"),
            "the message must warn of an attack: {err}"
        );
    }

    #[test]
    fn an_unknown_host_is_accepted_only_when_not_strict() {
        let file = known_hosts("");
        assert!(
            check_host_key("web1", 22, &key(KEY_A), file.path(), true).is_err(),
            "strict checking refuses an unknown host"
        );
        check_host_key("web1", 22, &key(KEY_A), file.path(), false)
            .expect("non-strict checking accepts an unknown host");
    }

    #[test]
    fn a_missing_known_hosts_file_makes_every_host_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent");
        let err = check_host_key("web1", 22, &key(KEY_A), &path, true).unwrap_err();
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "the message must name the file to add the key to: {err}"
        );
    }
}
