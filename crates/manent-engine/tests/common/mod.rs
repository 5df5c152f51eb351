//! What the engine's test files share: the store and engine of a test database, and the
//! gate, ledger and waits their workflows use.
#![allow(dead_code)]

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use manent_engine::{
    Client, Database, Engine, EngineConfig, WorkflowStatus,
    store::{self, Store},
};
use manent_testkit::TestDb;

pub const WAIT: Duration = Duration::from_secs(60);

pub async fn open(db: &TestDb) -> Arc<dyn Store> {
    store::open(&db.url).await.expect("open the test database")
}

pub fn config(id: &str) -> EngineConfig {
    let mut c = EngineConfig::new(id);
    c.stale_after = Duration::from_secs(2);
    c.heartbeat_interval = Duration::from_millis(200);
    c
}

pub async fn engine(db: &TestDb, id: &str) -> Engine {
    Engine::new(Database::from(open(db).await), config(id))
}

/// A gate a workflow step waits on, opened by the test.
#[derive(Clone, Default)]
pub struct Gate {
    open: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Gate {
    pub fn new() -> Self {
        Gate {
            open: Arc::new(tokio::sync::watch::channel(false).0),
        }
    }
    pub fn open(&self) {
        self.open.send_replace(true);
    }
    pub async fn wait(&self) {
        let mut rx = self.open.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// Counts how often each named step body ran.
#[derive(Clone, Default)]
pub struct Ledger(Arc<Mutex<HashMap<String, usize>>>);

impl Ledger {
    pub fn hit(&self, name: &str) {
        *self.0.lock().unwrap().entry(name.to_string()).or_default() += 1;
    }
    pub fn count(&self, name: &str) -> usize {
        self.0.lock().unwrap().get(name).copied().unwrap_or(0)
    }
}

/// The recovery notes of workflow `id` (its `recovery:` events), which its log shows.
pub async fn recovery_notes(client: &Client, id: &str) -> Vec<String> {
    client
        .events(id)
        .await
        .unwrap()
        .into_iter()
        .filter(|ev| ev.key.starts_with("recovery:"))
        .map(|ev| ev.value)
        .collect()
}

pub async fn wait_success(client: &Client, id: &str) -> manent_engine::WorkflowRecord {
    let record = client.wait(id, WAIT).await.expect("workflow ends");
    assert_eq!(
        record.status,
        WorkflowStatus::Success,
        "workflow {id} should succeed; error: {:?}",
        record.error
    );
    record
}
