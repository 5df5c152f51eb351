//! What only SQLite does: connection options, the process-wide wake-up bus
//! per database file, and the OS file lock that proves an executor is alive.

use std::{
    collections::HashMap,
    fs::File,
    path::{Path, PathBuf},
    str::FromStr,
    sync::{Mutex, OnceLock},
    time::Duration,
};

use sqlx::{
    Connection, TransactionManager,
    sqlite::{
        SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
        SqliteSynchronous, SqliteTransactionManager,
    },
};
use tokio::sync::broadcast;

use super::{Liveness, Wakeup};
use crate::error::StoreError;

/// Without a notification channel, a process learns of other processes' work
/// by polling this often; workers in the same process are woken at once.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(50);

pub(crate) async fn connect(url: &str) -> Result<(SqlitePool, Option<PathBuf>), sqlx::Error> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // FULL: a committed checkpoint survives a power cut, not only a crash.
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(30))
        .foreign_keys(false);
    let path = file_path(&options);
    if let Some(path) = &path {
        owner_only(path).map_err(sqlx::Error::Io)?;
    }
    let pool = SqlitePoolOptions::new()
        .max_connections(if path.is_some() { 8 } else { 1 })
        .min_connections(if path.is_some() { 0 } else { 1 })
        // An in-memory database lives as long as its one connection.
        .idle_timeout(if path.is_some() {
            Some(Duration::from_secs(600))
        } else {
            None
        })
        .max_lifetime(if path.is_some() {
            Some(Duration::from_secs(1800))
        } else {
            None
        })
        // A run stopped by its executor (fenced, cancelled, drained) is dropped wherever it
        // is, possibly after `BEGIN IMMEDIATE` ran but before the `Transaction` that would
        // roll it back was made (sqlx answers the begin through a channel, then checks the
        // handle: two awaits). The connection would go back to the pool inside a
        // transaction, holding the database's write lock, and sqlx would count it as one
        // level deep, refusing the next `begin_with`. So a released connection is rolled
        // back through sqlx's own transaction manager, which keeps its count right.
        .after_release(|conn, _meta| Box::pin(end_abandoned_transactions(conn)))
        .connect_with(options)
        .await?;
    Ok((pool, path))
}

/// Rolls back whatever transaction a released connection is still in. The ping goes
/// through the connection's command queue behind any rollback a dropped `Transaction`
/// asked for, so the depth read after it is the connection's real state.
async fn end_abandoned_transactions(conn: &mut SqliteConnection) -> Result<bool, sqlx::Error> {
    conn.ping().await?;
    while conn.is_in_transaction() {
        SqliteTransactionManager::rollback(conn).await?;
    }
    Ok(true)
}

/// Makes the database file readable by its owner only (0600), creating it so if missing,
/// and its WAL and shared-memory files too: they hold the same records (tokens' hashes,
/// deploy inputs), and SQLite gives new ones the database file's mode.
fn owner_only(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    let mut names = vec![path.to_path_buf()];
    for suffix in ["-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        names.push(PathBuf::from(name));
    }
    for name in names.iter().filter(|n| n.exists()) {
        std::fs::set_permissions(name, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

fn file_path(options: &SqliteConnectOptions) -> Option<PathBuf> {
    let name = options.get_filename();
    let text = name.to_string_lossy();
    if text.is_empty() || text == ":memory:" || text.starts_with("file:") {
        return None;
    }
    Some(std::path::absolute(name).unwrap_or_else(|_| name.to_path_buf()))
}

/// One wake-up bus per database file, shared by every store of this process
/// that opens it, so engines in one process wake each other at once.
pub(crate) fn wakeup_bus(path: Option<&Path>) -> broadcast::Sender<Wakeup> {
    static BUSES: OnceLock<Mutex<HashMap<PathBuf, broadcast::Sender<Wakeup>>>> = OnceLock::new();
    let Some(path) = path else {
        return broadcast::channel(1024).0;
    };
    let mut buses = BUSES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    buses
        .entry(path.to_path_buf())
        .or_insert_with(|| broadcast::channel(1024).0)
        .clone()
}

/// An exclusive OS lock on `<database>.executors/<id>.lock`, held for the
/// executor's life: the kernel drops it when the process dies, however it dies.
pub(crate) fn acquire_liveness(
    db_path: Option<&Path>,
    executor_id: &str,
) -> Result<Liveness, StoreError> {
    let Some(db_path) = db_path else {
        return Ok(Liveness::Unprovable);
    };
    let mut dir = db_path.as_os_str().to_owned();
    dir.push(".executors");
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(&dir).map_err(|e| {
        StoreError::Database(format!(
            "cannot create lock directory {}: {e}",
            dir.display()
        ))
    })?;
    let file_name: String = executor_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let path = dir.join(format!("{file_name}.lock"));
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| {
            StoreError::Database(format!("cannot open lock file {}: {e}", path.display()))
        })?;
    match file.try_lock() {
        Ok(()) => Ok(Liveness::Acquired(Box::new(file))),
        Err(std::fs::TryLockError::WouldBlock) => Ok(Liveness::HeldElsewhere),
        Err(std::fs::TryLockError::Error(e)) => {
            tracing::warn!(path = %path.display(), error = %e, "file locks unsupported here; falling back to heartbeats");
            Ok(Liveness::Unprovable)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new database file in a temporary directory, with one table `t` written.
    async fn database_with_a_table() -> (tempfile::TempDir, PathBuf, SqlitePool) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manent.db");
        let (pool, _) = connect(&format!("sqlite://{}", path.display()))
            .await
            .expect("open a new database");
        sqlx::query("CREATE TABLE t (x INTEGER)")
            .execute(&pool)
            .await
            .expect("a write (it creates the WAL)");
        (dir, path, pool)
    }

    #[tokio::test]
    async fn a_connection_released_inside_an_unowned_transaction_is_rolled_back_and_reusable() {
        let (_dir, _, pool) = database_with_a_table().await;
        // The state a run aborted between BEGIN and its `Transaction` leaves: sqlx counts
        // one level, SQLite holds the write lock, and nobody owns a rollback.
        let mut abandoned = pool.acquire().await.unwrap();
        SqliteTransactionManager::begin(&mut abandoned, Some("BEGIN IMMEDIATE".into()))
            .await
            .expect("begin without a Transaction");
        sqlx::query("INSERT INTO t VALUES (1)")
            .execute(&mut *abandoned)
            .await
            .unwrap();
        drop(abandoned);
        // Every connection the pool may hand out must begin, write and commit: held at
        // once, so the released one is among them whichever the pool picks.
        let mut held = Vec::new();
        for _ in 0..8 {
            held.push(pool.acquire().await.unwrap());
        }
        for (n, conn) in held.iter_mut().enumerate() {
            let mut tx = conn
                .begin_with("BEGIN IMMEDIATE")
                .await
                .unwrap_or_else(|e| panic!("connection {n} must begin afresh: {e}"));
            sqlx::query("INSERT INTO t VALUES (2)")
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
        drop(held);
        let ones: i64 = sqlx::query_scalar("SELECT count(*) FROM t WHERE x = 1")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(ones, 0, "the abandoned transaction's write is rolled back");
        pool.close().await;
    }

    #[tokio::test]
    async fn the_database_file_and_its_wal_are_readable_by_their_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, path, pool) = database_with_a_table().await;
        let wal = dir.path().join("manent.db-wal");
        assert!(wal.exists(), "WAL mode writes a -wal file");
        for file in [&path, &wal] {
            let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{} holds token hashes: 0600", file.display());
        }
        pool.close().await;
        // An existing database with looser modes is tightened when opened.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (pool, _) = connect(&format!("sqlite://{}", path.display()))
            .await
            .expect("open it again");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "reopening restores 0600");
        pool.close().await;
    }
}
