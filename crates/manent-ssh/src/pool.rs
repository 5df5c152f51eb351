//! `ConnectionPool`: one connection per (user, host, port) for the life of the pool (one
//! deploy pass), opened once even when many tasks ask for it at the same moment.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use tokio::sync::OnceCell;

use crate::{Address, Connection, LocalConnection, SshAuth, TransportError, connect};

type Slot = Arc<OnceCell<Arc<dyn Connection>>>;

/// Reuses one connection per (user, host, port). A connection found closed is replaced
/// by a new one; a failed connect is not remembered (the next `get` tries again).
pub struct ConnectionPool {
    auth: SshAuth,
    local: Arc<dyn Connection>,
    slots: Mutex<HashMap<(String, String, u16), Slot>>,
}

impl ConnectionPool {
    pub fn new(auth: SshAuth) -> Self {
        ConnectionPool {
            auth,
            local: Arc::new(LocalConnection::new()),
            slots: Mutex::new(HashMap::new()),
        }
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
            if let Some(conn) = slot.get() {
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
                .get_or_try_init(|| connect(addr, &self.auth))
                .await
                .cloned();
        }
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
