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
    version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)";

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
                let applied: Vec<i64> =
                    sqlx::query_scalar("SELECT version FROM manent_schema_migrations")
                        .fetch_all(&mut *tx)
                        .await?;
                for m in migrations::MIGRATIONS
                    .iter()
                    .filter(|m| !applied.contains(&m.version))
                {
                    for statement in m.statements(backend) {
                        sqlx::query(&statement).execute(&mut *tx).await?;
                    }
                    sqlx::query("INSERT INTO manent_schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)")
                        .bind(m.version)
                        .bind(m.name)
                        .bind(crate::now_ms())
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
                    let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM manent_schema_migrations")
                        .fetch_all(&mut *conn)
                        .await?;
                    for m in migrations::MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
                        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                        for statement in m.statements(backend) {
                            sqlx::query(&statement).execute(&mut *tx).await?;
                        }
                        sqlx::query(
                            "INSERT INTO manent_schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
                        )
                        .bind(m.version)
                        .bind(m.name)
                        .bind(crate::now_ms())
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
