//! What the crates above the engine keep in its database beside workflows: records (JSON
//! values by kind and key: schedules, tokens, gate waiters) and the audit trail. The
//! narrow way in, so that no caller outside the engine holds the whole `Store`.

use std::sync::Arc;

use crate::{
    error::StoreError,
    store::{AuditFilter, AuditRecord, RecordEntry, Store},
};

/// The records of the engine's database, by kind and key. Cheap to clone.
#[derive(Clone)]
pub struct Records {
    store: Arc<dyn Store>,
}

impl Records {
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        Records { store }
    }

    /// The value of `kind`/`key`, if there is one.
    pub async fn get(&self, kind: &str, key: &str) -> Result<Option<String>, StoreError> {
        self.store.get_record(kind, key).await
    }

    /// Every `(key, value)` of `kind`, by key.
    pub async fn list(&self, kind: &str) -> Result<Vec<(String, String)>, StoreError> {
        self.store.list_records(kind).await
    }

    /// Writes `kind`/`key`, replacing any value it had.
    pub async fn put(
        &self,
        kind: &str,
        key: &str,
        value: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.store.put_record(kind, key, value, now_ms).await
    }

    /// Writes `kind`/`key` unless it exists; returns whether it was written.
    pub async fn insert(
        &self,
        kind: &str,
        key: &str,
        value: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.store.insert_record(kind, key, value, now_ms).await
    }

    /// Writes all of `records` in one transaction unless one of them exists; returns
    /// whether they were written.
    pub async fn insert_all(
        &self,
        records: &[RecordEntry<'_>],
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.store.insert_records(records, now_ms).await
    }

    /// Removes `kind`/`key`; returns whether it was there.
    pub async fn delete(&self, kind: &str, key: &str) -> Result<bool, StoreError> {
        self.store.delete_record(kind, key).await
    }

    /// Removes every `(kind, key)` of `keys` in one transaction; returns how many were there.
    pub async fn delete_all(&self, keys: &[(&str, &str)]) -> Result<u64, StoreError> {
        self.store.delete_records(keys).await
    }

    /// Appends an entry to the audit trail.
    pub async fn append_audit(&self, entry: &AuditRecord) -> Result<(), StoreError> {
        self.store.append_audit(entry).await
    }

    /// The newest entries of the audit trail `filter` admits, newest first.
    pub async fn audit(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>, StoreError> {
        self.store.list_audit(filter).await
    }
}
