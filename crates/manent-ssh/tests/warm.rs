//! Warm SSH connections between deploys, against OpenSSH's sshd: a later pool reuses
//! the connection an earlier one left, and never once the host's recorded key or the
//! client key changed.

use std::{sync::Arc, time::Duration};

use manent_ssh::{Address, Connection, ConnectionPool, SshAuth, WarmConnections};
use manent_testkit::sshd::SshHosts;

fn same(a: &Arc<dyn Connection>, b: &Arc<dyn Connection>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// Copies of the client key and known_hosts, so the test can change them in place.
fn own_auth(hosts: &SshHosts, name: &str) -> SshAuth {
    let key = hosts.path(&format!("{name}-key"));
    let known_hosts = hosts.path(&format!("{name}-known_hosts"));
    std::fs::copy(&hosts.client_key, &key).unwrap();
    std::fs::copy(&hosts.known_hosts, &known_hosts).unwrap();
    SshAuth::new(&key, &known_hosts)
}

/// Opens a connection through a pool over `warm`, runs a command on it, drops the pool.
async fn use_once(
    auth: &SshAuth,
    warm: &Arc<WarmConnections>,
    addr: &Address,
) -> Result<Arc<dyn Connection>, manent_ssh::TransportError> {
    let pool = ConnectionPool::with_warm(auth.clone(), warm.clone());
    let conn = pool.get(addr).await?;
    let out = conn.exec("echo ok", &[]).await?;
    assert_eq!(out.stdout.trim(), "ok", "the connection runs commands");
    Ok(conn)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_pool_reuses_a_warm_connection_and_never_after_a_key_changed() {
    let hosts = SshHosts::start(1).await;
    let addr = Address::new(
        hosts.hosts[0].addr.clone(),
        hosts.hosts[0].port,
        hosts.user.clone(),
    );
    let warm = WarmConnections::new(Duration::from_secs(600));
    let auth = own_auth(&hosts, "a");

    let first = use_once(&auth, &warm, &addr).await.expect("connect");
    assert_eq!(warm.len(), 1, "the dropped pool left its connection warm");
    let second = use_once(&auth, &warm, &addr).await.expect("reuse");
    assert!(same(&first, &second), "the next deploy's pool reuses it");

    // The host is re-keyed in known_hosts: the warm connection, verified against the
    // old key, must not be used; a fresh one is refused as the key differs.
    std::fs::copy(hosts.known_hosts_with_wrong_key(0), &auth.known_hosts_path).unwrap();
    let refused = use_once(&auth, &warm, &addr).await;
    assert!(
        refused.is_err(),
        "a changed host key is checked again, never skipped by a warm connection"
    );
    assert!(warm.is_empty(), "the stale connection was dropped");

    // The client key is replaced: same file, other key (one the target does not accept).
    let auth = own_auth(&hosts, "b");
    let kept = use_once(&auth, &warm, &addr).await.expect("connect");
    std::fs::copy(&hosts.unauthorized_key, &auth.key_path).unwrap();
    let refused = use_once(&auth, &warm, &addr).await;
    assert!(
        refused.is_err(),
        "a changed client key authenticates again, never skipped by a warm connection"
    );
    drop(kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_kept_warm_when_keeping_is_off() {
    let hosts = SshHosts::start(1).await;
    let addr = Address::new(
        hosts.hosts[0].addr.clone(),
        hosts.hosts[0].port,
        hosts.user.clone(),
    );
    let warm = WarmConnections::new(Duration::ZERO);
    let auth = own_auth(&hosts, "c");
    let first = use_once(&auth, &warm, &addr).await.expect("connect");
    assert!(warm.is_empty(), "keep 0s keeps nothing");
    let second = use_once(&auth, &warm, &addr).await.expect("connect again");
    assert!(!same(&first, &second), "each pool opens its own");
}
