//! `manent-server admin copy`: a whole manent database into an empty one, SQLite to
//! PostgreSQL or back (docs/scaling-and-recovery.md, "From one machine to many"). Every
//! table of the schema but the migrations' own is copied row by row, columns read from
//! the source's catalogue (so a column a later migration adds is copied too), in one
//! transaction on the destination: a copy that fails leaves it empty. Refused into a
//! destination that holds anything, and from a source a live process still writes.

use futures::TryStreamExt;
use sqlx::{Row, postgres::PgRow, sqlite::SqliteRow};

use super::{Pool, SqlStore};
use crate::error::StoreError;

/// The tables a copy moves, in this order: every table of the schema but
/// `manent_schema_migrations`, which the destination's own migrations wrote. A table a
/// migration adds is added here (a test compares this list with the schema).
pub(crate) const TABLES: &[&str] = &[
    "manent_queues",
    "manent_workflows",
    "manent_steps",
    "manent_messages",
    "manent_events",
    "manent_executors",
    "manent_executor_leases",
    "manent_records",
    "manent_audit",
    "manent_output",
];

/// The most values one `INSERT` binds (under SQLite's 32,766 and PostgreSQL's 65,535).
const VALUES_PER_INSERT: usize = 20_000;

/// How many rows of each table a copy moved, in the order of the copy (`TABLES`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyReport {
    pub tables: Vec<(String, u64)>,
}

/// One column as the source's catalogue declares it: every column of the schema is an
/// integer or text.
#[derive(Debug, Clone)]
struct Col {
    name: String,
    integer: bool,
}

/// One value read from the source.
#[derive(Debug, Clone)]
enum Value {
    Int(Option<i64>),
    Text(Option<String>),
}

/// Copies one table from the pool `$src` (rows decoded by `$decode`) into the transaction
/// `$tx`, in batches of multi-row `INSERT`s; evaluates to the number of rows. A macro, not a
/// function: the pool's and the transaction's types are each backend's own.
macro_rules! copy_table {
    ($src:expr, $decode:ident, $tx:ident, $table:expr, $cols:expr) => {{
        let cols: &[Col] = $cols;
        let names: Vec<&str> = cols.iter().map(|c| c.name.as_str()).collect();
        let select = format!("SELECT {} FROM {}", names.join(", "), $table);
        let per_batch = (VALUES_PER_INSERT / cols.len()).max(1);
        let mut rows = sqlx::query(&select).fetch($src);
        let mut batch: Vec<Vec<Value>> = Vec::with_capacity(per_batch);
        let mut count = 0u64;
        loop {
            let row = rows.try_next().await?;
            let end = row.is_none();
            if let Some(row) = row {
                batch.push($decode(&row, cols)?);
            }
            if !batch.is_empty() && (end || batch.len() == per_batch) {
                count += batch.len() as u64;
                let sql = insert_sql($table, cols, batch.len());
                let mut insert = sqlx::query(&sql).persistent(super::ONE_OFF);
                for value in std::mem::take(&mut batch).into_iter().flatten() {
                    insert = match value {
                        Value::Int(v) => insert.bind(v),
                        Value::Text(v) => insert.bind(v),
                    };
                }
                insert.execute(&mut *$tx).await?;
            }
            if end {
                break;
            }
        }
        count
    }};
}

impl SqlStore {
    /// The tables of this database's schema (the migrations' own left out), sorted.
    pub(crate) async fn schema_tables(&self) -> Result<Vec<String>, StoreError> {
        let mut tables: Vec<String> = match &self.pool {
            Pool::Sqlite { read, .. } => {
                sqlx::query_scalar(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'manent\\_%' ESCAPE '\\'",
                )
                .fetch_all(read)
                .await?
            }
            Pool::Postgres(main) => {
                sqlx::query_scalar(
                    "SELECT table_name::text FROM information_schema.tables \
                     WHERE table_schema = current_schema() AND table_name LIKE 'manent\\_%'",
                )
                .fetch_all(main)
                .await?
            }
        };
        tables.retain(|t| t != "manent_schema_migrations");
        tables.sort();
        Ok(tables)
    }

    /// The columns of `table`, in their order.
    async fn columns(&self, table: &str) -> Result<Vec<Col>, StoreError> {
        let rows: Vec<(String, String)> = match &self.pool {
            Pool::Sqlite { read, .. } => {
                sqlx::query_as("SELECT name, type FROM pragma_table_info($1) ORDER BY cid")
                    .bind(table)
                    .fetch_all(read)
                    .await?
            }
            Pool::Postgres(main) => {
                sqlx::query_as(
                    "SELECT column_name::text, data_type::text FROM information_schema.columns \
                     WHERE table_schema = current_schema() AND table_name = $1 \
                     ORDER BY ordinal_position",
                )
                .bind(table)
                .fetch_all(main)
                .await?
            }
        };
        if rows.is_empty() {
            return Err(StoreError::Database(format!(
                "table {table} has no columns here: is the schema manent's?"
            )));
        }
        Ok(rows
            .into_iter()
            .map(|(name, kind)| Col {
                integer: kind.to_ascii_uppercase().contains("INT"),
                name,
            })
            .collect())
    }

    /// The tables of [`TABLES`] that hold a row, with one row's worth of proof each.
    pub(crate) async fn non_empty_tables(&self) -> Result<Vec<String>, StoreError> {
        let mut found = Vec::new();
        for table in TABLES {
            let sql = format!("SELECT EXISTS (SELECT 1 FROM {table})");
            let any: bool =
                with_pool!(self, pool => sqlx::query_scalar(&sql).fetch_one(pool).await)?;
            if any {
                found.push((*table).to_string());
            }
        }
        Ok(found)
    }

    /// The executors whose lease is live at `now_ms`: `id (host H, pid P)`.
    pub(crate) async fn live_holders(&self, now_ms: i64) -> Result<Vec<String>, StoreError> {
        let rows: Vec<(String, String, i64)> = with_pool!(self, pool => sqlx::query_as(
            "SELECT executor_id, host, pid FROM manent_executor_leases WHERE expires_at > $1 \
             ORDER BY executor_id")
        .bind(now_ms)
        .fetch_all(pool)
        .await)?;
        Ok(rows
            .into_iter()
            .map(|(id, host, pid)| format!("{id} (host {host}, pid {pid})"))
            .collect())
    }

    /// Copies every table of [`TABLES`] from `self` into `dest`, in one transaction on
    /// `dest`. The caller checked that `dest` is empty and `self` still.
    pub(crate) async fn copy_into(&self, dest: &SqlStore) -> Result<CopyReport, StoreError> {
        let mut report = CopyReport { tables: Vec::new() };
        match &dest.pool {
            Pool::Sqlite { write, .. } => {
                let mut conn = write.acquire().await?;
                let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
                for table in TABLES {
                    let cols = self.columns(table).await?;
                    let rows = match &self.pool {
                        Pool::Sqlite { read, .. } => {
                            copy_table!(read, sqlite_values, tx, table, &cols)
                        }
                        Pool::Postgres(main) => copy_table!(main, pg_values, tx, table, &cols),
                    };
                    report.tables.push(((*table).to_string(), rows));
                }
                tx.commit().await?;
            }
            Pool::Postgres(main) => {
                let mut tx = main.begin().await?;
                for table in TABLES {
                    let cols = self.columns(table).await?;
                    let rows = match &self.pool {
                        Pool::Sqlite { read, .. } => {
                            copy_table!(read, sqlite_values, tx, table, &cols)
                        }
                        Pool::Postgres(main) => copy_table!(main, pg_values, tx, table, &cols),
                    };
                    report.tables.push(((*table).to_string(), rows));
                    // A serial key's sequence goes on after the copied ids.
                    if cols.iter().any(|c| c.name == "id" && c.integer) {
                        let sql = format!(
                            "SELECT setval(pg_get_serial_sequence('{table}', 'id'), \
                             (SELECT COALESCE(MAX(id), 0) + 1 FROM {table}), false)"
                        );
                        sqlx::query(&sql).execute(&mut *tx).await?;
                    }
                }
                tx.commit().await?;
            }
        }
        Ok(report)
    }
}

fn corrupt(col: &Col, e: sqlx::Error) -> StoreError {
    StoreError::Corrupt {
        what: format!("column {}", col.name),
        reason: e.to_string(),
    }
}

fn sqlite_values(row: &SqliteRow, cols: &[Col]) -> Result<Vec<Value>, StoreError> {
    cols.iter()
        .enumerate()
        .map(|(i, col)| {
            Ok(if col.integer {
                Value::Int(row.try_get(i).map_err(|e| corrupt(col, e))?)
            } else {
                Value::Text(row.try_get(i).map_err(|e| corrupt(col, e))?)
            })
        })
        .collect()
}

fn pg_values(row: &PgRow, cols: &[Col]) -> Result<Vec<Value>, StoreError> {
    cols.iter()
        .enumerate()
        .map(|(i, col)| {
            Ok(if col.integer {
                Value::Int(row.try_get(i).map_err(|e| corrupt(col, e))?)
            } else {
                Value::Text(row.try_get(i).map_err(|e| corrupt(col, e))?)
            })
        })
        .collect()
}

/// The text of one multi-row `INSERT` of `rows` rows into `table`.
fn insert_sql(table: &str, cols: &[Col], rows: usize) -> String {
    let names: Vec<&str> = cols.iter().map(|c| c.name.as_str()).collect();
    let tuples: Vec<String> = (0..rows)
        .map(|r| {
            let marks: Vec<String> = (1..=cols.len())
                .map(|c| format!("${}", r * cols.len() + c))
                .collect();
            format!("({})", marks.join(", "))
        })
        .collect();
    format!(
        "INSERT INTO {table} ({}) VALUES {}",
        names.join(", "),
        tuples.join(", ")
    )
}
