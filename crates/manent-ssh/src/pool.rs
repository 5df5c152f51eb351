//! `ConnectionPool`: one connection per (user, host, port) for the life of the pool (one
//! deploy pass), opened once even when many tasks ask for it at the same moment; and
//! `WarmConnections`: the pools' SSH connections kept open for a bounded time between
//! deploys (as OpenSSH's `ControlPersist`), never reused once the host's recorded keys
//! or the client key changed.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex, Weak},
    time::{Duration, Instant},
};

use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

use crate::{Address, Connection, LocalConnection, SshAuth, TransportError, connect, known_hosts};

/// What a connection was verified with: the client key's bytes and the host's keys in
/// `known_hosts`, read when it was opened. A warm connection is reused only while both
/// are unchanged: a rotated key or a re-keyed host gets a fresh, fully verified one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Credentials {
    client_key_sha256: Vec<u8>,
    host_keys: Vec<String>,
}

impl Credentials {
    async fn read(addr: &Address, auth: &SshAuth) -> Result<Self, TransportError> {
        let (key_path, known_hosts_path) = (auth.key_path.clone(), auth.known_hosts_path.clone());
        let (host, port) = (addr.host.clone(), addr.port);
        tokio::task::spawn_blocking(move || {
            let key = std::fs::read(&key_path).map_err(|e| TransportError::Key {
                path: key_path.clone(),
                message: e.to_string(),
            })?;
            let mut host_keys: Vec<String> =
                known_hosts::recorded_keys(&host, port, &known_hosts_path)?
                    .iter()
                    .map(|k| k.to_openssh().unwrap_or_default())
                    .collect();
            host_keys.sort();
            Ok(Credentials {
                client_key_sha256: Sha256::digest(&key).to_vec(),
                host_keys,
            })
        })
        .await
        .map_err(|e| TransportError::Protocol(format!("reading the SSH credentials: {e}")))?
    }
}

/// Who a warm connection is for: the same target reached the same way.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct WarmKey {
    user: String,
    host: String,
    port: u16,
    key_path: PathBuf,
    known_hosts_path: PathBuf,
    strict: bool,
    verify: crate::VerifyUploads,
}

impl WarmKey {
    fn new(addr: &Address, auth: &SshAuth) -> Self {
        WarmKey {
            user: addr.user.clone(),
            host: addr.host.clone(),
            port: addr.port,
            key_path: auth.key_path.clone(),
            known_hosts_path: auth.known_hosts_path.clone(),
            strict: auth.strict_host_key_checking,
            verify: auth.verify,
        }
    }
}

struct Idle {
    conn: Arc<dyn Connection>,
    credentials: Credentials,
    since: Instant,
}

/// SSH connections left by finished pools, kept for `keep` at most. Shared by the
/// pools of one worker; `keep` zero keeps nothing.
pub struct WarmConnections {
    keep: Duration,
    idle: Mutex<HashMap<WarmKey, Vec<Idle>>>,
}

/// At most this many idle connections per target: a fan-out's concurrency, not more.
const MAX_IDLE_PER_TARGET: usize = 4;

impl WarmConnections {
    pub fn new(keep: Duration) -> Arc<Self> {
        Arc::new(WarmConnections {
            keep,
            idle: Mutex::new(HashMap::new()),
        })
    }

    /// How many idle connections are kept now.
    pub fn len(&self) -> usize {
        self.idle
            .lock()
            .map(|m| m.values().map(Vec::len).sum())
            .unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An idle connection to `key` verified with `credentials`, still open and kept for
    /// less than `keep`. Others found on the way (expired, closed, other credentials)
    /// are dropped, which closes them.
    fn take(&self, key: &WarmKey, credentials: &Credentials) -> Option<Arc<dyn Connection>> {
        let mut idle = self.idle.lock().ok()?;
        let list = idle.get_mut(key)?;
        let now = Instant::now();
        list.retain(|i| {
            now.duration_since(i.since) < self.keep
                && !i.conn.is_closed()
                && i.credentials == *credentials
        });
        let found = list.pop().map(|i| i.conn);
        if list.is_empty() {
            idle.remove(key);
        }
        found
    }

    fn put(self: &Arc<Self>, key: WarmKey, conn: Arc<dyn Connection>, credentials: Credentials) {
        if self.keep.is_zero() || conn.is_closed() {
            return;
        }
        let Ok(mut idle) = self.idle.lock() else {
            return;
        };
        let list = idle.entry(key).or_default();
        if list.len() >= MAX_IDLE_PER_TARGET {
            return;
        }
        list.push(Idle {
            conn,
            credentials,
            since: Instant::now(),
        });
        drop(idle);
        // Closed when its time is up, even if no deploy comes to ask for it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let this: Weak<Self> = Arc::downgrade(self);
            let keep = self.keep;
            runtime.spawn(async move {
                tokio::time::sleep(keep).await;
                if let Some(this) = this.upgrade() {
                    this.expire();
                }
            });
        }
    }

    /// Drops (closes) the connections idle for `keep` or more.
    fn expire(&self) {
        if let Ok(mut idle) = self.idle.lock() {
            let now = Instant::now();
            for list in idle.values_mut() {
                list.retain(|i| now.duration_since(i.since) < self.keep);
            }
            idle.retain(|_, list| !list.is_empty());
        }
    }
}

type Slot = Arc<OnceCell<(Arc<dyn Connection>, Credentials)>>;

/// Reuses one connection per (user, host, port). A connection found closed is replaced
/// by a new one; a failed connect is not remembered (the next `get` tries again). With
/// [`WarmConnections`], a new pool starts from the connections earlier pools left, and
/// leaves its own there when dropped.
pub struct ConnectionPool {
    auth: SshAuth,
    local: Arc<dyn Connection>,
    slots: Mutex<HashMap<(String, String, u16), Slot>>,
    warm: Option<Arc<WarmConnections>>,
}

impl ConnectionPool {
    pub fn new(auth: SshAuth) -> Self {
        ConnectionPool {
            auth,
            local: Arc::new(LocalConnection::new()),
            slots: Mutex::new(HashMap::new()),
            warm: None,
        }
    }

    /// A pool that takes from and gives back to `warm`.
    pub fn with_warm(auth: SshAuth, warm: Arc<WarmConnections>) -> Self {
        let mut pool = ConnectionPool::new(auth);
        pool.warm = Some(warm);
        pool
    }

    pub fn auth(&self) -> &SshAuth {
        &self.auth
    }

    pub async fn get(&self, addr: &Address) -> Result<Arc<dyn Connection>, TransportError> {
        if addr.is_local() {
            return Ok(self.local.clone());
        }
        let key = (addr.user.clone(), addr.host.clone(), addr.port);
        loop {
            let slot = self
                .slots
                .lock()
                .expect("connection pool lock")
                .entry(key.clone())
                .or_default()
                .clone();
            if let Some((conn, _)) = slot.get() {
                if !conn.is_closed() {
                    return Ok(conn.clone());
                }
                // Replace the dead connection's slot, unless another task already did.
                let mut slots = self.slots.lock().expect("connection pool lock");
                if slots.get(&key).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
                    slots.insert(key.clone(), Slot::default());
                }
                continue;
            }
            return slot
                .get_or_try_init(|| self.open(addr))
                .await
                .map(|(conn, _)| conn.clone());
        }
    }

    /// A warm connection verified with the credentials as they are now, or a new one.
    async fn open(
        &self,
        addr: &Address,
    ) -> Result<(Arc<dyn Connection>, Credentials), TransportError> {
        let Some(warm) = &self.warm else {
            // Not kept afterwards: no need to know what it was verified with.
            let empty = Credentials {
                client_key_sha256: Vec::new(),
                host_keys: Vec::new(),
            };
            return Ok((connect(addr, &self.auth).await?, empty));
        };
        let credentials = Credentials::read(addr, &self.auth).await?;
        if let Some(conn) = warm.take(&WarmKey::new(addr, &self.auth), &credentials) {
            tracing::debug!(target = %addr.host, "reusing a warm SSH connection");
            return Ok((conn, credentials));
        }
        Ok((connect(addr, &self.auth).await?, credentials))
    }

    /// How many SSH connections the pool holds (the local one is not counted).
    pub fn len(&self) -> usize {
        self.slots
            .lock()
            .expect("connection pool lock")
            .values()
            .filter(|s| s.initialized())
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for ConnectionPool {
    fn drop(&mut self) {
        let Some(warm) = &self.warm else {
            return;
        };
        let Ok(slots) = self.slots.lock() else {
            return;
        };
        for ((user, host, port), slot) in slots.iter() {
            if let Some((conn, credentials)) = slot.get() {
                let addr = Address::new(host.clone(), *port, user.clone());
                warm.put(
                    WarmKey::new(&addr, &self.auth),
                    conn.clone(),
                    credentials.clone(),
                );
            }
        }
    }
}
