//! What the backends and the shared SQL both take from the driver: its errors as
//! [`StoreError`]s, transient failures told from permanent ones. `sqlite.rs`,
//! `postgres.rs`, `grouped.rs` and `sql/` rely on it (`?` on a driver call); it
//! depends on none of them, so no import runs in a circle.

use crate::error::StoreError;

/// Maps a driver error to a [`StoreError`], telling transient failures
/// (connection lost, server restarting, lock contention) from permanent ones.
impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        use sqlx::Error as E;
        match &e {
            E::Io(_)
            | E::Tls(_)
            | E::PoolTimedOut
            | E::PoolClosed
            | E::WorkerCrashed
            | E::Protocol(_) => StoreError::Unavailable(e.to_string()),
            E::Database(db) => {
                let code = db.code().map(|c| c.to_string()).unwrap_or_default();
                // PostgreSQL: 08xxx connection, 57Pxx shutdown, 40001/40P01 serialization/deadlock,
                // 55P03 lock not available. SQLite: 5 BUSY, 6 LOCKED and their extended codes.
                let transient = code.starts_with("08")
                    || code.starts_with("57P")
                    || code == "40001"
                    || code == "40P01"
                    || code == "55P03"
                    || code
                        .parse::<i32>()
                        .is_ok_and(|n| n & 0xff == 5 || n & 0xff == 6);
                if transient {
                    StoreError::Unavailable(e.to_string())
                } else {
                    StoreError::Database(e.to_string())
                }
            }
            _ => StoreError::Database(e.to_string()),
        }
    }
}
