//! A fresh database per measurement for the backlog and workers modes (created, opened as a
//! manent store, removed afterwards), a connection of the benchmark's own beside the engine's
//! pool, and the machine's load average as every result line records it.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use manent_engine::store::{self, Store};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

use crate::{Backend, admin_exec, remove_sqlite_files, with_database};

/// The 1/5/15-minute load averages, as `/proc/loadavg` has them.
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// CPU time (user + system) a process has used so far, in ms, from `/proc/<pid>/stat`
/// (clock ticks of 10 ms, the Linux default `CLK_TCK` of 100).
pub(crate) fn cpu_ms(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces: count fields after it.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) * 10.0)
}

pub(crate) enum FreshDb {
    Postgres {
        admin: PgPool,
        db: String,
        url: String,
    },
    Sqlite {
        path: PathBuf,
        url: String,
    },
}

impl FreshDb {
    /// `bench_manent_<pid>_<tag>`: a new PostgreSQL database made through `database_url`, or a
    /// new SQLite file in the temp directory.
    pub(crate) async fn create(database_url: &str, backend: Backend, tag: &str) -> Result<Self> {
        let name = format!("bench_manent_{}_{tag}", std::process::id());
        match backend {
            Backend::Postgres => {
                let admin = PgPoolOptions::new()
                    .max_connections(1)
                    .connect(database_url)
                    .await
                    .with_context(|| format!("connecting to {database_url}"))?;
                admin_exec(
                    &admin,
                    format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
                )
                .await?;
                admin_exec(&admin, format!("CREATE DATABASE {name}")).await?;
                let url = with_database(database_url, &name)?;
                Ok(FreshDb::Postgres {
                    admin,
                    db: name,
                    url,
                })
            }
            Backend::Sqlite => {
                let path = std::env::temp_dir().join(format!("{name}.db"));
                remove_sqlite_files(&path);
                let url = format!("sqlite://{}", path.display());
                Ok(FreshDb::Sqlite { path, url })
            }
        }
    }

    pub(crate) fn url(&self) -> &str {
        match self {
            FreshDb::Postgres { url, .. } | FreshDb::Sqlite { url, .. } => url,
        }
    }

    /// The manent store on this database, its schema migrated.
    pub(crate) async fn open_store(&self) -> Result<Arc<dyn Store>> {
        store::open(self.url())
            .await
            .map_err(|e| anyhow!("opening the manent store: {e}"))
    }

    /// One connection of our own (read-only on SQLite); open it after [`FreshDb::open_store`],
    /// which creates the schema.
    pub(crate) async fn probe(&self) -> Result<Probe> {
        Ok(match self {
            FreshDb::Postgres { url, .. } => Probe::Postgres(
                PgPoolOptions::new()
                    .max_connections(1)
                    .connect(url)
                    .await
                    .context("connecting the benchmark's own connection")?,
            ),
            FreshDb::Sqlite { url, .. } => Probe::Sqlite(
                SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect_with(SqliteConnectOptions::from_str(url)?.read_only(true))
                    .await
                    .context("connecting the benchmark's own connection")?,
            ),
        })
    }

    pub(crate) async fn remove(self) -> Result<()> {
        match self {
            FreshDb::Postgres { admin, db, .. } => {
                admin_exec(&admin, format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")).await?;
                admin.close().await;
            }
            FreshDb::Sqlite { path, .. } => remove_sqlite_files(&path),
        }
        Ok(())
    }
}

/// The benchmark's own connection: counts rows and explains the claim's queries.
pub(crate) enum Probe {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

impl Probe {
    pub(crate) async fn count(&self, sql: &str) -> Result<i64> {
        match self {
            Probe::Postgres(pool) => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await,
            Probe::Sqlite(pool) => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await,
        }
        .with_context(|| format!("running `{sql}`"))
    }

    pub(crate) async fn strings(&self, sql: &str) -> Result<Vec<String>> {
        match self {
            Probe::Postgres(pool) => sqlx::query_scalar::<_, String>(sql).fetch_all(pool).await,
            Probe::Sqlite(pool) => sqlx::query_scalar::<_, String>(sql).fetch_all(pool).await,
        }
        .with_context(|| format!("running `{sql}`"))
    }

    /// (text, count) rows, e.g. workflows per executor.
    pub(crate) async fn pairs(&self, sql: &str) -> Result<Vec<(Option<String>, i64)>> {
        match self {
            Probe::Postgres(pool) => sqlx::query_as(sql).fetch_all(pool).await,
            Probe::Sqlite(pool) => sqlx::query_as(sql).fetch_all(pool).await,
        }
        .with_context(|| format!("running `{sql}`"))
    }

    /// The plan of `sql` as the database executes it now inside a claim: `EXPLAIN (ANALYZE,
    /// BUFFERS)` on PostgreSQL, in a transaction with `enable_sort` off as the engine's claim
    /// transaction has it (`pg_claim_begin` in crates/manent-engine/src/store/sql.rs); on
    /// SQLite, which has no EXPLAIN ANALYZE, `EXPLAIN QUERY PLAN` and the mean wall time of 20
    /// executions.
    pub(crate) async fn explain(&self, sql: &str) -> Result<String> {
        match self {
            Probe::Postgres(pool) => {
                let mut tx = pool.begin().await?;
                sqlx::query("SELECT set_config('enable_sort', 'off', true)")
                    .execute(&mut *tx)
                    .await?;
                let lines: Vec<String> =
                    sqlx::query_scalar(&format!("EXPLAIN (ANALYZE, BUFFERS) {sql}"))
                        .fetch_all(&mut *tx)
                        .await
                        .with_context(|| format!("explaining `{sql}`"))?;
                tx.rollback().await?;
                Ok(lines.join("\n"))
            }
            Probe::Sqlite(pool) => {
                let rows: Vec<(i64, i64, i64, String)> =
                    sqlx::query_as(&format!("EXPLAIN QUERY PLAN {sql}"))
                        .fetch_all(pool)
                        .await
                        .with_context(|| format!("explaining `{sql}`"))?;
                let mut text: Vec<String> = rows
                    .into_iter()
                    .map(|(id, parent, _, detail)| format!("{id} {parent} {detail}"))
                    .collect();
                const RUNS: u32 = 20;
                let started = std::time::Instant::now();
                let mut returned = 0;
                for _ in 0..RUNS {
                    returned = sqlx::query(sql).fetch_all(pool).await?.len();
                }
                text.push(format!(
                    "executed {RUNS} times: {:.3} ms each on average, {returned} rows",
                    started.elapsed().as_secs_f64() * 1000.0 / f64::from(RUNS)
                ));
                Ok(text.join("\n"))
            }
        }
    }

    pub(crate) async fn close(&self) {
        match self {
            Probe::Postgres(pool) => pool.close().await,
            Probe::Sqlite(pool) => pool.close().await,
        }
    }
}
