//! The migrations runner: applies [`migrations::MIGRATIONS`] in order, one migrator at a time.

use super::Pool;
use super::SqlStore;
use super::retry_transient;
use crate::error::StoreError;
use crate::store::Store;
use crate::store::migrations;
use crate::store::postgres;

/// The record of applied migrations (`migrations.rs`), made by the first migrator.
pub(super) const CREATE_MIGRATIONS_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS manent_schema_migrations (
    version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL, checksum TEXT,
    compatible_from BIGINT)";

/// The columns releases before migration checksums did not make, added in place.
const ADDED_COLUMNS: &[(&str, &str)] = &[("checksum", "TEXT"), ("compatible_from", "BIGINT")];

/// The table as releases before migration checksums made it: the column is added in place.
#[cfg(test)]
pub(super) const LEGACY_MIGRATIONS_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS manent_schema_migrations (
    version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)";

const SELECT_APPLIED: &str =
    "SELECT version, name, checksum, compatible_from FROM manent_schema_migrations";
const INSERT_APPLIED: &str = "INSERT INTO manent_schema_migrations (version, name, applied_at, checksum, compatible_from) VALUES ($1, $2, $3, $4, $5)";
const STAMP_APPLIED: &str =
    "UPDATE manent_schema_migrations SET checksum = $1 WHERE version = $2 AND checksum IS NULL";

type AppliedRow = (i64, String, Option<String>, Option<i64>);

fn applied_rows(rows: Vec<AppliedRow>) -> Vec<migrations::Applied> {
    rows.into_iter()
        .map(
            |(version, name, checksum, compatible_from)| migrations::Applied {
                version,
                name,
                checksum,
                compatible_from,
            },
        )
        .collect()
}

impl SqlStore {
    pub(super) async fn migrate_once(&self) -> Result<(), StoreError> {
        let backend = self.backend();
        match &self.pool {
            Pool::Sqlite { write: pool, .. } => {
                // BEGIN IMMEDIATE makes concurrent starters queue up on the write lock.
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                sqlx::query(CREATE_MIGRATIONS_TABLE)
                    .execute(&mut *tx)
                    .await?;
                for (column, kind) in ADDED_COLUMNS {
                    let present: i64 = sqlx::query_scalar(
                        "SELECT COUNT(*) FROM pragma_table_info('manent_schema_migrations') WHERE name = $1",
                    )
                    .bind(column)
                    .fetch_one(&mut *tx)
                    .await?;
                    if present == 0 {
                        sqlx::query(&format!(
                            "ALTER TABLE manent_schema_migrations ADD COLUMN {column} {kind}"
                        ))
                        .execute(&mut *tx)
                        .await?;
                    }
                }
                let applied =
                    applied_rows(sqlx::query_as(SELECT_APPLIED).fetch_all(&mut *tx).await?);
                let plan = migrations::plan(&applied)?;
                for m in &plan.unstamped {
                    sqlx::query(STAMP_APPLIED)
                        .bind(m.checksum())
                        .bind(m.version)
                        .execute(&mut *tx)
                        .await?;
                }
                for m in &plan.pending {
                    for statement in m.statements(backend) {
                        sqlx::query(&statement).execute(&mut *tx).await?;
                    }
                    sqlx::query(INSERT_APPLIED)
                        .bind(m.version)
                        .bind(m.name)
                        .bind(crate::now_ms())
                        .bind(m.checksum())
                        .bind(m.compatible_from)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
            }
            Pool::Postgres(pool) => {
                let mut conn = pool.acquire().await?;
                // A session lock serialises migrators across processes; it is
                // released on unlock, or by the server if this process dies.
                sqlx::query("SELECT pg_advisory_lock($1)")
                    .bind(postgres::LOCK_MIGRATIONS)
                    .execute(&mut *conn)
                    .await?;
                let result = async {
                    sqlx::query(CREATE_MIGRATIONS_TABLE).execute(&mut *conn).await?;
                    for (column, kind) in ADDED_COLUMNS {
                        sqlx::query(&format!(
                            "ALTER TABLE manent_schema_migrations ADD COLUMN IF NOT EXISTS {column} {kind}"
                        ))
                        .execute(&mut *conn)
                        .await?;
                    }
                    let applied = applied_rows(sqlx::query_as(SELECT_APPLIED).fetch_all(&mut *conn).await?);
                    let plan = migrations::plan(&applied)?;
                    for m in &plan.unstamped {
                        sqlx::query(STAMP_APPLIED)
                            .bind(m.checksum())
                            .bind(m.version)
                            .execute(&mut *conn)
                            .await?;
                    }
                    for m in &plan.pending {
                        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                        for statement in m.statements(backend) {
                            sqlx::query(&statement).execute(&mut *tx).await?;
                        }
                        sqlx::query(INSERT_APPLIED)
                            .bind(m.version)
                            .bind(m.name)
                            .bind(crate::now_ms())
                            .bind(m.checksum())
                            .bind(m.compatible_from)
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                    }
                    Ok::<_, StoreError>(())
                }
                .await;
                let unlock = sqlx::query("SELECT pg_advisory_unlock($1)")
                    .bind(postgres::LOCK_MIGRATIONS)
                    .execute(&mut *conn)
                    .await;
                if unlock.is_err() {
                    // Never return a connection that may still hold the lock to the pool.
                    conn.detach();
                }
                result?;
            }
        }
        Ok(())
    }

    pub(super) async fn migrate(&self) -> Result<(), StoreError> {
        retry_transient("create or update the schema", || self.migrate_once()).await
    }

    pub(super) async fn schema_version(&self) -> Result<i64, StoreError> {
        Ok(
            with_pool!(self, pool => sqlx::query_scalar::<_, i64>("SELECT COALESCE(MAX(version), 0) FROM manent_schema_migrations")
            .fetch_one(pool)
            .await
            )?,
        )
    }
}
