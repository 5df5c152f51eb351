//! Record-like tables: the generic records, the workflows' output lines and the audit.

use super::SqlStore;
use crate::error::StoreError;
use crate::store::OutputLine;
use crate::store::RecordEntry;
use crate::store::{AuditFilter, AuditRecord};

/// A record's writes, binding kind, key, value and the time (`DELETE_RECORD`: kind, key).
pub(super) const INSERT_RECORD_IF_FREE: &str = "INSERT INTO manent_records (kind, record_key, value, updated_at) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (kind, record_key) DO NOTHING";

pub(super) const PUT_RECORD: &str = "INSERT INTO manent_records (kind, record_key, value, updated_at) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (kind, record_key) \
     DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at";

pub(super) const DELETE_RECORD: &str =
    "DELETE FROM manent_records WHERE kind = $1 AND record_key = $2";

impl SqlStore {
    /// Inserts a record, replacing an existing one only if `replace`;
    /// returns whether a row was written.
    pub(super) async fn write_record(
        &self,
        kind: &str,
        key: &str,
        value: &str,
        now_ms: i64,
        replace: bool,
    ) -> Result<bool, StoreError> {
        let sql = if replace {
            PUT_RECORD
        } else {
            INSERT_RECORD_IF_FREE
        };
        let written = with_writer!(self, pool => sqlx::query(sql)
        .bind(kind)
        .bind(key)
        .bind(value)
        .bind(now_ms)
        .execute(pool)
        .await
        .map(|r| r.rows_affected())
        )?;
        Ok(written == 1)
    }

    pub(super) async fn put_record(
        &self,
        kind: &str,
        key: &str,
        value: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.write_record(kind, key, value, now_ms, true)
            .await
            .map(|_| ())
    }

    pub(super) async fn insert_record(
        &self,
        kind: &str,
        key: &str,
        value: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.write_record(kind, key, value, now_ms, false).await
    }

    pub(super) async fn insert_records(
        &self,
        records: &[RecordEntry<'_>],
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        write_tx!(self, tx => {
            for record in records {
                let inserted = sqlx::query(INSERT_RECORD_IF_FREE)
                    .bind(record.kind)
                    .bind(record.key)
                    .bind(record.value)
                    .bind(now_ms)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if inserted == 0 {
                    // Dropping the transaction rolls back what this call wrote so far.
                    return Ok(false);
                }
            }
        });
        Ok(true)
    }

    pub(super) async fn get_record(
        &self,
        kind: &str,
        key: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(
            with_pool!(self, pool => sqlx::query_scalar("SELECT value FROM manent_records WHERE kind = $1 AND record_key = $2")
            .bind(kind)
            .bind(key)
            .fetch_optional(pool)
            .await
            )?,
        )
    }

    pub(super) async fn list_records(
        &self,
        kind: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        Ok(with_pool!(self, pool => sqlx::query_as(
        "SELECT record_key, value FROM manent_records WHERE kind = $1 ORDER BY record_key")
        .bind(kind)
        .fetch_all(pool)
        .await
        )?)
    }

    pub(super) async fn delete_record(&self, kind: &str, key: &str) -> Result<bool, StoreError> {
        let deleted = with_writer!(self, pool => sqlx::query(DELETE_RECORD)
        .bind(kind)
        .bind(key)
        .execute(pool)
        .await
        .map(|r| r.rows_affected())
        )?;
        Ok(deleted == 1)
    }

    pub(super) async fn delete_records(&self, keys: &[(&str, &str)]) -> Result<u64, StoreError> {
        let deleted = write_tx!(self, tx => {
            let mut deleted = 0;
            for (kind, key) in keys {
                deleted += sqlx::query(DELETE_RECORD)
                    .bind(*kind)
                    .bind(*key)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
            }
            deleted
        });
        Ok(deleted)
    }

    pub(super) async fn append_output(
        &self,
        workflow_id: &str,
        lines: &[OutputLine],
    ) -> Result<(), StoreError> {
        if lines.is_empty() {
            return Ok(());
        }
        // One statement per batch; batches are small (what a step printed in a moment).
        let mut sql = String::from(
            "INSERT INTO manent_output (workflow_id, at, generation, source, stream, line) VALUES ",
        );
        let rows: Vec<String> = (0..lines.len())
            .map(|i| {
                let b = i * 6;
                format!(
                    "(${}, ${}, ${}, ${}, ${}, ${})",
                    b + 1,
                    b + 2,
                    b + 3,
                    b + 4,
                    b + 5,
                    b + 6
                )
            })
            .collect();
        sql.push_str(&rows.join(", "));
        with_writer!(self, pool => {
            let mut query = sqlx::query(&sql).persistent(super::ONE_OFF);
            for l in lines {
                query = query
                    .bind(workflow_id)
                    .bind(l.at_ms)
                    .bind(l.generation)
                    .bind(&l.source)
                    .bind(&l.stream)
                    .bind(&l.line);
            }
            query.execute(pool).await.map(|_| ())
        })?;
        Ok(())
    }

    pub(super) async fn list_output(
        &self,
        workflow_id: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<OutputLine>, StoreError> {
        type Row = (i64, i64, i64, String, String, String);
        let rows: Vec<Row> = with_pool!(self, pool => sqlx::query_as(
        "SELECT id, at, generation, source, stream, line FROM manent_output \
         WHERE workflow_id = $1 AND id > $2 ORDER BY id LIMIT $3")
        .bind(workflow_id)
        .bind(after)
        .bind(limit.max(0))
        .fetch_all(pool)
        .await
        )?;
        Ok(rows
            .into_iter()
            .map(
                |(seq, at_ms, generation, source, stream, line)| OutputLine {
                    seq,
                    at_ms,
                    generation,
                    source,
                    stream,
                    line,
                },
            )
            .collect())
    }

    pub(super) async fn append_audit(&self, entry: &AuditRecord) -> Result<(), StoreError> {
        Ok(with_writer!(self, pool => sqlx::query(
        "INSERT INTO manent_audit (at, actor, actor_id, action, target, outcome, detail) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)")
        .bind(entry.at_ms)
        .bind(&entry.actor)
        .bind(&entry.actor_id)
        .bind(&entry.action)
        .bind(&entry.target)
        .bind(entry.outcome)
        .bind(&entry.detail)
        .execute(pool)
        .await
        .map(|_| ())
        )?)
    }

    pub(super) async fn list_audit(
        &self,
        filter: &AuditFilter,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        type Row = (i64, i64, String, String, String, String, i64, String);
        // Only the filters given become conditions, so each shape of query has a plan
        // that uses its index (migration 11): `actor` and `action` lead theirs with `id`
        // after, `at` has its own, and `id` (the key) orders and pages.
        let mut conditions: Vec<String> = Vec::new();
        let mut next = 0;
        let mut placeholder = |column: &str, op: &str| {
            next += 1;
            conditions.push(format!("{column} {op} ${next}"));
        };
        if filter.since_ms.is_some() {
            placeholder("at", ">=");
        }
        if filter.until_ms.is_some() {
            placeholder("at", "<");
        }
        if filter.actor.is_some() {
            placeholder("actor", "=");
        }
        if filter.action.is_some() {
            placeholder("action", "=");
        }
        if filter.before_seq.is_some() {
            placeholder("id", "<");
        }
        let sql = format!(
            "SELECT id, at, actor, actor_id, action, target, outcome, detail FROM manent_audit \
             {} ORDER BY id DESC LIMIT ${}",
            if conditions.is_empty() {
                String::new()
            } else {
                format!("WHERE {}", conditions.join(" AND "))
            },
            next + 1
        );
        let rows: Vec<Row> = with_pool!(self, pool => {
            let mut query = sqlx::query_as(&sql);
            for value in [filter.since_ms, filter.until_ms].into_iter().flatten() {
                query = query.bind(value);
            }
            for value in [&filter.actor, &filter.action].into_iter().flatten() {
                query = query.bind(value.as_str());
            }
            if let Some(before) = filter.before_seq {
                query = query.bind(before);
            }
            query.bind(filter.limit.max(0)).fetch_all(pool).await
        })?;
        Ok(rows
            .into_iter()
            .map(
                |(seq, at_ms, actor, actor_id, action, target, outcome, detail)| AuditRecord {
                    seq,
                    at_ms,
                    actor,
                    actor_id,
                    action,
                    target,
                    outcome,
                    detail,
                },
            )
            .collect())
    }
}
