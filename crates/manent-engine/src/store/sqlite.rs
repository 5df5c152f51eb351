//! What only SQLite does: connection options, the one writer connection and its
//! group commit, the process-wide wake-up bus per database file, and the OS file
//! lock that proves an executor is alive.

use std::{
    collections::HashMap,
    fs::File,
    path::{Path, PathBuf},
    str::FromStr,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::future::BoxFuture;
use sqlx::{
    Connection, Sqlite, Transaction, TransactionManager,
    sqlite::{
        SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
        SqliteSynchronous, SqliteTransactionManager,
    },
};
use tokio::sync::{broadcast, mpsc};

use super::{
    Liveness, Wakeup,
    grouped::{Grouped, Pending, answer_alone, answer_together, take_queued, writes},
};
use crate::error::StoreError;

/// The fallback poll: what neither a wake-up of this process nor [`ExternalWrites`] told
/// (a lease that came back, a bug's missing wake-up) is seen within this, as on PostgreSQL.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(1000);

/// How often [`ExternalWrites`] asks whether another process wrote: how late a worker
/// sees a deploy an API process enqueued, or a waiter its end in another process.
pub(crate) const EXTERNAL_WRITES_EVERY: Duration = Duration::from_millis(50);

/// The connections of one SQLite store.
pub(crate) struct Pools {
    /// Reads only (read-only connections on a file): WAL lets them run beside the writer.
    pub(crate) read: SqlitePool,
    /// Every write of this process, on one connection. SQLite lets one writer at a time
    /// into the file; with several connections writing, the losers sleep in the busy
    /// handler (steps of up to 100 ms, not woken when the lock frees: waits of seconds
    /// under load). One connection makes this process's writers queue in the pool
    /// instead, in order, and each goes in as soon as the one before is done. Other
    /// processes on the same file still meet the busy handler.
    pub(crate) write: SqlitePool,
    /// Whether the writer connection runs a transaction whose commit is not synced.
    pub(crate) unsynced: UnsyncedCommit,
    pub(crate) path: Option<PathBuf>,
}

/// A transaction of the writer connection committed without its own WAL sync
/// (`synchronous=NORMAL` for that transaction only), for writes a power cut may
/// undo without harm: a claim (docs/scaling-and-recovery.md, "What a power cut
/// may undo").
///
/// In WAL mode every synced commit syncs the whole log, so what survives a power
/// cut is always a prefix of the commits: an unsynced commit is durable once any
/// later commit of the file is (a run's first checkpoint, say), and a power cut can
/// only discard it together with everything after it. A crash of the process loses
/// nothing: the commit is in the OS's page cache.
///
/// SQLite refuses to change the level inside a transaction, so it is lowered in the
/// statement that begins the transaction, and the pool's release check raises it
/// again (`after_release`, which runs before the connection can be taken again),
/// however the transaction ended: no other write ever runs unsynced.
#[derive(Clone, Default)]
pub(crate) struct UnsyncedCommit(Arc<AtomicBool>);

/// Begins a transaction whose commit is not synced (one trip to the connection's thread).
const BEGIN_UNSYNCED: &str = "PRAGMA synchronous = NORMAL; BEGIN IMMEDIATE";
/// Every other write's level (see [`connect`]).
const SYNCED: &str = "PRAGMA synchronous = FULL";

impl UnsyncedCommit {
    /// Begins `BEGIN IMMEDIATE` on the writer connection `conn`, its commit unsynced.
    pub(crate) async fn begin<'c>(
        &self,
        conn: &'c mut SqliteConnection,
    ) -> Result<Transaction<'c, Sqlite>, sqlx::Error> {
        self.0.store(true, Ordering::SeqCst);
        conn.begin_with(BEGIN_UNSYNCED).await
    }

    /// Puts `conn` back to `synchronous=FULL` if a transaction lowered it. On an
    /// error the pool closes the connection; a new one starts at FULL.
    async fn restore(&self, conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
        if self.0.load(Ordering::SeqCst) {
            sqlx::query(SYNCED).execute(&mut *conn).await?;
            self.0.store(false, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// The size (bytes) the WAL is cut back to after a checkpoint (`PRAGMA journal_size_limit`):
/// what SQLite's automatic checkpoint lets it reach (1,000 pages of 4 KiB) and a little more.
pub(crate) const WAL_SIZE_LIMIT: i64 = 4 * 1024 * 1024 + 512 * 1024;

pub(crate) async fn connect(url: &str) -> Result<Pools, sqlx::Error> {
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
    let unsynced = UnsyncedCommit::default();
    let Some(_) = &path else {
        // An in-memory database lives as long as its one connection: it reads and writes.
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .after_release({
                let unsynced = unsynced.clone();
                move |conn, _meta| Box::pin(release_writer(conn, unsynced.clone()))
            })
            .connect_with(options)
            .await?;
        return Ok(Pools {
            read: pool.clone(),
            write: pool,
            unsynced,
            path,
        });
    };
    // The writer first: it creates the file and sets WAL mode, which the readers rely on.
    // No ping before each use (sqlx's default): a connection to a local file does not
    // go away while idle, and every released connection is checked (pinged, its
    // transaction ended) anyway; the ping is one more trip to the connection's
    // thread on every write.
    let write = SqlitePoolOptions::new()
        .test_before_acquire(false)
        .max_connections(1)
        .min_connections(0)
        .idle_timeout(Some(Duration::from_secs(600)))
        .max_lifetime(Some(Duration::from_secs(1800)))
        // A run stopped by its executor (fenced, cancelled, drained) is dropped wherever it
        // is, possibly after `BEGIN IMMEDIATE` ran but before the `Transaction` that would
        // roll it back was made (sqlx answers the begin through a channel, then checks the
        // handle: two awaits). The connection would go back to the pool inside a
        // transaction, holding the database's write lock, and sqlx would count it as one
        // level deep, refusing the next `begin_with`. So a released connection is rolled
        // back through sqlx's own transaction manager, which keeps its count right.
        .after_release({
            let unsynced = unsynced.clone();
            move |conn, _meta| Box::pin(release_writer(conn, unsynced.clone()))
        })
        // The writer only (a read-only connection cannot set it): a new file gives the pages
        // retention empties back on `PRAGMA incremental_vacuum` (`Store::reclaim_space`); a
        // file made before keeps them for reuse until a `VACUUM`
        // (`manent-server admin prune --vacuum`).
        .connect_with(
            options
                .clone()
                .auto_vacuum(sqlx::sqlite::SqliteAutoVacuum::Incremental)
                // SQLite reuses its WAL file rather than shrinking it: one long read (a
                // large export, a stalled reader) that held checkpoints back would leave a
                // WAL of that size for the file's lifetime. With a limit, the writer cuts
                // the WAL back to it each time it starts the log over after a checkpoint.
                .pragma("journal_size_limit", WAL_SIZE_LIMIT.to_string()),
        )
        .await?;
    let read = SqlitePoolOptions::new()
        .test_before_acquire(false)
        .max_connections(8)
        .min_connections(0)
        .idle_timeout(Some(Duration::from_secs(600)))
        .max_lifetime(Some(Duration::from_secs(1800)))
        .after_release(|conn, _meta| Box::pin(end_abandoned_transactions(conn)))
        // A write that strays onto a reader fails loudly instead of contending.
        .connect_with(options.read_only(true))
        .await?;
    Ok(Pools {
        read,
        write,
        unsynced,
        path,
    })
}

/// What one batched write did: rows it changed, and the value it returned, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Written {
    pub(crate) rows: u64,
    pub(crate) returned: Option<String>,
}

/// One write statement for the group commit, run on the writer connection inside the
/// batch's transaction. It may run twice (the batch, then alone if the batch failed):
/// only the committed run counts.
pub(crate) type BatchedWrite = Box<
    dyn for<'c> Fn(&'c mut SqliteConnection) -> BoxFuture<'c, Result<Written, sqlx::Error>>
        + Send
        + Sync,
>;

type Request = Pending<BatchedWrite, Written>;

/// Most writes committed together.
const MAX_BATCH: usize = 128;

/// Group commit for the writes a workflow makes as it runs (step checkpoints, its
/// outcome): they queue here and a task commits whatever is queued in one transaction,
/// so many runs share one WAL sync (`synchronous=FULL` syncs at every commit). A
/// caller is answered only after the commit that holds its write: a checkpoint is
/// durable before the workflow goes on.
pub(crate) type GroupCommit = Grouped<BatchedWrite, Written>;

pub(crate) fn spawn_group_commit(write: SqlitePool) -> GroupCommit {
    Grouped::spawn("SQLite writer", move |queued| commit_loop(write, queued))
}

async fn commit_loop(pool: SqlitePool, mut queued: mpsc::UnboundedReceiver<Request>) {
    while let Some(first) = queued.recv().await {
        // Whatever queued while the previous batch committed goes in this one.
        let batch = take_queued(first, &mut queued, MAX_BATCH);
        let mut conn = match pool.acquire().await {
            Ok(conn) => conn,
            Err(e) => {
                let message = e.to_string();
                for request in batch {
                    let _ = request
                        .reply
                        .send(Err(StoreError::Unavailable(message.clone())));
                }
                continue;
            }
        };
        let together = commit_together(&mut conn, &writes(&batch)).await;
        for pending in answer_together(batch, together) {
            let alone = commit_together(&mut conn, &[&pending.write]).await;
            answer_alone(pending, alone);
        }
    }
}

/// Runs `batch` in one `BEGIN IMMEDIATE` transaction and commits it; all or nothing.
async fn commit_together(
    conn: &mut SqliteConnection,
    batch: &[&BatchedWrite],
) -> Result<Vec<Written>, sqlx::Error> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    let mut written = Vec::with_capacity(batch.len());
    for write in batch {
        written.push(write(&mut tx).await?);
    }
    tx.commit().await?;
    Ok(written)
}

/// Rolls back whatever transaction a released connection is still in. The ping goes
/// through the connection's command queue behind any rollback a dropped `Transaction`
/// asked for, so the depth read after it is the connection's real state.
/// The writer's release check: no transaction left open, and its commits synced again
/// if a transaction of [`UnsyncedCommit`] was dropped before it could say so.
async fn release_writer(
    conn: &mut SqliteConnection,
    unsynced: UnsyncedCommit,
) -> Result<bool, sqlx::Error> {
    end_abandoned_transactions(conn).await?;
    unsynced.restore(conn).await?;
    Ok(true)
}

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

/// SQLite has no notifications: a process learns of other processes' writes by asking.
/// This task asks `PRAGMA data_version` of the store's writer connection every
/// [`EXTERNAL_WRITES_EVERY`]: the number changes when another connection committed, never
/// for the connection's own commits, and every write of this process goes through that
/// connection (its readers are read-only). On a change it sends [`Wakeup::Elsewhere`], and
/// the claim loops and waiters look again. An idle process so costs one statement each
/// time instead of a claim (a write transaction) per queue and a read per waiter; its own
/// writes wake its waiters directly. Aborted when the store is dropped.
pub(crate) struct ExternalWrites(tokio::task::JoinHandle<()>);

impl ExternalWrites {
    pub(crate) fn spawn(write: SqlitePool, bus: broadcast::Sender<Wakeup>) -> ExternalWrites {
        ExternalWrites(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(EXTERNAL_WRITES_EVERY);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut seen = None;
            loop {
                ticker.tick().await;
                if Self::written_since(&write, &mut seen).await {
                    let _ = bus.send(Wakeup::Elsewhere);
                }
            }
        }))
    }

    /// Whether a connection other than `write`'s committed since the last call (`seen`:
    /// the number it last read). The first call has nothing to compare with; a failed read
    /// says yes (look again, as a poll would have). When the pool replaces its connection
    /// (`max_lifetime`), the new one's number may differ (a needless look) or, by chance,
    /// not (a write seen at the fallback poll).
    async fn written_since(write: &SqlitePool, seen: &mut Option<i64>) -> bool {
        match sqlx::query_scalar::<_, i64>("PRAGMA data_version")
            .fetch_one(write)
            .await
        {
            Ok(now) => seen.replace(now).is_some_and(|before| before != now),
            Err(e) => {
                tracing::debug!(error = %e, "PRAGMA data_version failed");
                *seen = None;
                true
            }
        }
    }
}

impl Drop for ExternalWrites {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The directory of the executors' lock files beside the database file.
fn lock_dir(db_path: &Path) -> PathBuf {
    let mut dir = db_path.as_os_str().to_owned();
    dir.push(".executors");
    PathBuf::from(dir)
}

/// The lock file of `executor_id` in `dir` (characters a file name cannot hold as `_`).
fn lock_path(dir: &Path, executor_id: &str) -> PathBuf {
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
    dir.join(format!("{file_name}.lock"))
}

/// Whether the OS lock of `executor_id` is free now: `None` when it cannot be told (an
/// in-memory database, file locks unsupported). Tried and let go at once; a worker taking
/// its id at that very moment waits for its lease as it would for any holder.
pub(crate) fn liveness_free(
    db_path: Option<&Path>,
    executor_id: &str,
) -> Result<Option<bool>, StoreError> {
    let Some(db_path) = db_path else {
        return Ok(None);
    };
    let path = lock_path(&lock_dir(db_path), executor_id);
    let file = match File::options().write(true).open(&path) {
        Ok(file) => file,
        // No process ever took the id on this database: nobody holds its lock.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Some(true)),
        Err(e) => {
            return Err(StoreError::Database(format!(
                "cannot open lock file {}: {e}",
                path.display()
            )));
        }
    };
    match file.try_lock_shared() {
        Ok(()) => Ok(Some(true)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(Some(false)),
        Err(std::fs::TryLockError::Error(_)) => Ok(None),
    }
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
    let dir = lock_dir(db_path);
    std::fs::create_dir_all(&dir).map_err(|e| {
        StoreError::Database(format!(
            "cannot create lock directory {}: {e}",
            dir.display()
        ))
    })?;
    let path = lock_path(&dir, executor_id);
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
    async fn database_with_a_table() -> (tempfile::TempDir, PathBuf, Pools) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manent.db");
        let pools = connect(&format!("sqlite://{}", path.display()))
            .await
            .expect("open a new database");
        sqlx::query("CREATE TABLE t (x INTEGER)")
            .execute(&pools.write)
            .await
            .expect("a write (it creates the WAL)");
        (dir, path, pools)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn another_connections_commit_is_news_and_the_writers_own_are_not() {
        let (_dir, path, ours) = database_with_a_table().await;
        let theirs = connect(&format!("sqlite://{}", path.display()))
            .await
            .expect("a second store's connections: another process's");
        let mut seen = None;
        let mut written = async || ExternalWrites::written_since(&ours.write, &mut seen).await;
        assert!(
            !written().await,
            "the first look has nothing to compare with"
        );
        write_afresh(&ours.write, 1).await;
        assert!(
            !written().await,
            "this process's own commit is not news: its writes wake its waiters directly"
        );
        write_afresh(&theirs.write, 2).await;
        assert!(written().await, "another connection's commit is news");
        assert!(!written().await, "and only once");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn another_processs_commit_wakes_this_processs_waiters() {
        let (_dir, path, ours) = database_with_a_table().await;
        let theirs = connect(&format!("sqlite://{}", path.display()))
            .await
            .expect("a second store's connections: another process's");
        let bus = broadcast::channel(16).0;
        let mut heard = bus.subscribe();
        let _watch = ExternalWrites::spawn(ours.write.clone(), bus);
        // Once the watcher has a number to compare with, every later commit is news; one
        // made before it is not, so commit until one is heard.
        let mut x = 10;
        let heard = loop {
            write_afresh(&theirs.write, x).await;
            x += 1;
            match tokio::time::timeout(EXTERNAL_WRITES_EVERY * 4, heard.recv()).await {
                Ok(wakeup) => break wakeup,
                Err(_) => assert!(x < 1_000, "no wake-up after {x} commits of another process"),
            }
        };
        assert_eq!(
            heard.expect("the bus is open"),
            Wakeup::Elsewhere,
            "the watcher tells this process that another wrote"
        );
    }

    /// The values of table `t`, in order, as a reader sees them.
    async fn values_in_t(pools: &Pools) -> Vec<i64> {
        sqlx::query_scalar("SELECT x FROM t ORDER BY x")
            .fetch_all(&pools.read)
            .await
            .expect("read t")
    }

    /// Inserts `x` into `t` in a transaction of its own on the writer, which must be free.
    async fn write_afresh(pool: &SqlitePool, x: i64) {
        let mut conn = pool.acquire().await.unwrap();
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .unwrap_or_else(|e| panic!("the writer must begin afresh: {e}"));
        sqlx::query("INSERT INTO t VALUES ($1)")
            .bind(x)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }

    #[tokio::test]
    async fn a_connection_released_inside_an_unowned_transaction_is_rolled_back_and_reusable() {
        let (_dir, _, pools) = database_with_a_table().await;
        let pool = &pools.write;
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
        // The writer is the pool's one connection: it must begin, write and commit afresh.
        write_afresh(pool, 2).await;
        assert_eq!(
            values_in_t(&pools).await,
            vec![2],
            "the abandoned transaction's write is rolled back"
        );
        pools.read.close().await;
        pools.write.close().await;
    }

    /// The writer's `synchronous` level: 2 is FULL (every commit synced), 1 NORMAL.
    async fn writer_sync_level(conn: &mut SqliteConnection) -> i64 {
        sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&mut *conn)
            .await
            .expect("read the level")
    }

    #[tokio::test]
    async fn an_unsynced_commit_leaves_every_later_write_of_the_writer_synced() {
        let (_dir, _, pools) = database_with_a_table().await;
        let mut conn = pools.write.acquire().await.unwrap();
        assert_eq!(
            writer_sync_level(&mut conn).await,
            2,
            "the writer opens at FULL"
        );
        let mut tx = pools
            .unsynced
            .begin(&mut conn)
            .await
            .expect("begin unsynced");
        assert_eq!(
            writer_sync_level(&mut tx).await,
            1,
            "inside its transaction the commit is not synced"
        );
        sqlx::query("INSERT INTO t VALUES (1)")
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        drop(conn);
        // The one writer connection again, once its release check has run.
        let mut conn = pools.write.acquire().await.unwrap();
        assert_eq!(
            writer_sync_level(&mut conn).await,
            2,
            "the release check put the writer back to FULL before anyone could write"
        );
        drop(conn);
        assert_eq!(
            values_in_t(&pools).await,
            vec![1],
            "the unsynced commit is a commit"
        );
    }

    #[tokio::test]
    async fn an_unsynced_transaction_dropped_unfinished_leaves_the_writer_synced_and_free() {
        let (_dir, _, pools) = database_with_a_table().await;
        let mut conn = pools.write.acquire().await.unwrap();
        let mut tx = pools
            .unsynced
            .begin(&mut conn)
            .await
            .expect("begin unsynced");
        sqlx::query("INSERT INTO t VALUES (1)")
            .execute(&mut *tx)
            .await
            .unwrap();
        // A claim stopped mid-way (its run fenced, the process draining).
        drop(tx);
        drop(conn);
        let mut conn = pools.write.acquire().await.unwrap();
        assert_eq!(
            writer_sync_level(&mut conn).await,
            2,
            "a dropped transaction must not leave the writer unsynced"
        );
        drop(conn);
        write_afresh(&pools.write, 2).await;
        assert_eq!(
            values_in_t(&pools).await,
            vec![2],
            "the dropped transaction wrote nothing"
        );
    }

    #[tokio::test]
    async fn a_write_on_a_reading_connection_is_refused() {
        let (_dir, _, pools) = database_with_a_table().await;
        let refused = sqlx::query("INSERT INTO t VALUES (3)")
            .execute(&pools.read)
            .await
            .expect_err("readers are read-only: every write goes through the writer");
        assert!(
            refused.to_string().contains("readonly"),
            "SQLite says why: {refused}"
        );
    }

    /// A batched insert of `x` into `table`.
    fn insert_into(table: &'static str, x: i64) -> BatchedWrite {
        Box::new(move |conn| {
            Box::pin(async move {
                let done = sqlx::query(&format!("INSERT INTO {table} VALUES ($1)"))
                    .bind(x)
                    .execute(conn)
                    .await?;
                Ok(Written {
                    rows: done.rows_affected(),
                    returned: None,
                })
            })
        })
    }

    #[tokio::test]
    async fn concurrent_writes_are_all_committed_and_one_failing_write_fails_alone() {
        let (_dir, _, pools) = database_with_a_table().await;
        let group = std::sync::Arc::new(spawn_group_commit(pools.write.clone()));
        let mut writes = Vec::new();
        for x in 0..200 {
            let group = group.clone();
            writes.push(tokio::spawn(async move {
                let write = if x == 100 {
                    insert_into("no_such_table", x)
                } else {
                    insert_into("t", x)
                };
                group.write(write).await
            }));
        }
        let mut failed = Vec::new();
        for (x, write) in writes.into_iter().enumerate() {
            match write.await.unwrap() {
                Ok(written) => assert_eq!(written.rows, 1, "write {x} inserted its row"),
                Err(e) => failed.push((x, e.to_string())),
            }
        }
        assert_eq!(failed.len(), 1, "only the bad write fails: {failed:?}");
        assert_eq!(failed[0].0, 100, "the bad write is the one that fails");
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM t")
            .fetch_one(&pools.read)
            .await
            .unwrap();
        assert_eq!(rows, 199, "every other write is committed once");
    }

    #[tokio::test]
    async fn the_database_file_and_its_wal_are_readable_by_their_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, path, pools) = database_with_a_table().await;
        let wal = dir.path().join("manent.db-wal");
        assert!(wal.exists(), "WAL mode writes a -wal file");
        for file in [&path, &wal] {
            let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{} holds token hashes: 0600", file.display());
        }
        pools.read.close().await;
        pools.write.close().await;
        // An existing database with looser modes is tightened when opened.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let pools = connect(&format!("sqlite://{}", path.display()))
            .await
            .expect("open it again");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "reopening restores 0600");
        pools.write.close().await;
    }
}
