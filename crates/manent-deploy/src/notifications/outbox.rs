//! The outbox an older manent wrote (records of kind `notification`, delivered by a loop
//! on each worker), moved onto the notifications queue when a worker of this build starts:
//! each entry becomes its delivery's workflow (the same key, its tries so far counted),
//! then leaves the outbox. An entry that cannot be read is kept as failed with why, never
//! dropped. The older build's bookkeeping (the keys of recorded events, the claims of
//! deliveries in progress) goes with it; while an older worker still runs beside this one,
//! an entry both deliver is sent twice (at least once: receivers drop repeats by
//! `X-Manent-Delivery`).

use std::time::Duration;

use manent_engine::{Client, EngineError, now_ms};

use super::{Entry, FAILED_KIND, OUTBOX_KIND, enqueue};

/// The keys of events an older manent recorded, so that a replay recorded none twice.
const RECORDED_KIND: &str = "notification-recorded";
/// An older manent's claim of a delivery in progress.
const CLAIM_KIND: &str = "notification-claim";
/// The wait before trying again after the database refused.
const RETRY_EVERY: Duration = Duration::from_secs(30);

/// What [`adopt`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Entries now on the queue.
    pub queued: usize,
    /// Entries that could not be read, kept as failed.
    pub unreadable: usize,
}

/// Moves every entry of the old outbox onto the notifications queue, and drops the old
/// bookkeeping.
pub async fn adopt(client: &Client) -> Result<Adopted, EngineError> {
    let records = client.records();
    let mut adopted = Adopted::default();
    for (key, value) in records.list(OUTBOX_KIND).await? {
        match serde_json::from_str::<Entry>(&value) {
            Ok(entry) => {
                enqueue(client, &entry).await?;
                adopted.queued += 1;
            }
            Err(e) => {
                tracing::error!(key, error = %e, "an outbox entry of an older manent cannot be read; it is kept as failed");
                records.put(FAILED_KIND, &key, &value, now_ms()).await?;
                adopted.unreadable += 1;
            }
        }
        records.delete(OUTBOX_KIND, &key).await?;
    }
    for kind in [RECORDED_KIND, CLAIM_KIND] {
        let keys = records.list(kind).await?;
        let keys: Vec<(&str, &str)> = keys.iter().map(|(k, _)| (kind, k.as_str())).collect();
        for chunk in keys.chunks(500) {
            records.delete_all(chunk).await?;
        }
    }
    Ok(adopted)
}

/// Runs [`adopt`] on this worker until it succeeds once.
pub fn spawn_adopter(client: Client) {
    tokio::spawn(async move {
        loop {
            match adopt(&client).await {
                Ok(adopted) => {
                    if adopted != Adopted::default() {
                        tracing::info!(
                            queued = adopted.queued,
                            unreadable = adopted.unreadable,
                            "the notifications an older manent left in its outbox are queued"
                        );
                    }
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot move the old notification outbox onto the queue now; trying again");
                    tokio::time::sleep(RETRY_EVERY).await;
                }
            }
        }
    });
}
