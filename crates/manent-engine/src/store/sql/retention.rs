//! Retention's SQL: which finished workflows may go, their removal with everything recorded
//! under them, old output lines and audit entries, in bounded batches, and giving the space
//! back (docs/configuration.md, `retention`).

use super::{Pool, SqlStore};
use crate::error::StoreError;
use crate::store::{Deleted, PruneQuery};

/// The statuses of a finished workflow, as SQL.
const FINISHED: &str = "('SUCCESS', 'ERROR', 'CANCELLED')";

/// The ids a query over `chunk` returns, inside transaction `tx` (of either driver): the
/// query's first `{}` gets `chunk`'s placeholders, its second `rest`.
macro_rules! select_ids {
    ($tx:ident, $chunk:expr, $sql:literal, $rest:expr) => {{
        let sql = format!($sql, placeholders(1, $chunk.len()), $rest);
        // One text per chunk length: not kept in the connection's statement cache
        // (`ONE_OFF`, mod.rs).
        let mut q = sqlx::query_scalar::<_, String>(&sql).persistent(super::ONE_OFF);
        for id in $chunk {
            q = q.bind(id);
        }
        q.fetch_all(&mut *$tx).await?
    }};
}

/// Walks the finished workflows of `$ids` (read again on `$tx`: one resumed since it was
/// chosen is left alone) and their descendants, level by level, and removes them with
/// everything recorded under them, or (`$count`) counts what would go. Evaluates to the
/// [`Deleted`] figures and, with `$old_output` (a time, ms), how many of their output lines
/// are older than it and of finished workflows.
macro_rules! remove_tree {
    ($tx:ident, $ids:expr, $count:expr, $old_output:expr) => {{
        let mut roots: Vec<String> = Vec::new();
        for chunk in $ids.chunks(200) {
            roots.extend(select_ids!(
                $tx,
                chunk,
                "SELECT id FROM manent_workflows WHERE id IN ({}) AND status IN {}",
                FINISHED
            ));
        }
        let mut all = roots.clone();
        let mut level = roots.clone();
        while !level.is_empty() {
            let mut next = Vec::new();
            for chunk in level.chunks(200) {
                next.extend(select_ids!(
                    $tx,
                    chunk,
                    "SELECT id FROM manent_workflows WHERE parent_id IN ({}){}",
                    ""
                ));
            }
            all.extend(next.iter().cloned());
            level = next;
        }
        let mut counts = Deleted {
            workflows: roots.len() as u64,
            children: (all.len() - roots.len()) as u64,
            ..Deleted::default()
        };
        let mut old_output = 0u64;
        for chunk in all.chunks(200) {
            let list = placeholders(1, chunk.len());
            for (table, column) in [
                ("manent_steps", "workflow_id"),
                ("manent_events", "workflow_id"),
                ("manent_messages", "workflow_id"),
                ("manent_output", "workflow_id"),
                ("manent_workflows", "id"),
            ] {
                let n = if $count {
                    let sql = format!("SELECT COUNT(*) FROM {table} WHERE {column} IN ({list})");
                    let mut q = sqlx::query_scalar::<_, i64>(&sql).persistent(super::ONE_OFF);
                    for id in chunk {
                        q = q.bind(id);
                    }
                    u64::try_from(q.fetch_one(&mut *$tx).await?).unwrap_or(0)
                } else {
                    let sql = format!("DELETE FROM {table} WHERE {column} IN ({list})");
                    let mut q = sqlx::query(&sql).persistent(super::ONE_OFF);
                    for id in chunk {
                        q = q.bind(id);
                    }
                    q.execute(&mut *$tx).await?.rows_affected()
                };
                match table {
                    "manent_steps" => counts.steps += n,
                    "manent_output" => counts.output_lines += n,
                    _ => {}
                }
            }
            if let Some(before) = $old_output {
                let sql = format!(
                    "SELECT COUNT(*) FROM manent_output o JOIN manent_workflows w \
                     ON w.id = o.workflow_id WHERE o.workflow_id IN ({list}) \
                     AND o.at < ${} AND w.status IN {FINISHED}",
                    chunk.len() + 1
                );
                let mut q = sqlx::query_scalar::<_, i64>(&sql).persistent(super::ONE_OFF);
                for id in chunk {
                    q = q.bind(id);
                }
                old_output +=
                    u64::try_from(q.bind(before).fetch_one(&mut *$tx).await?).unwrap_or(0);
            }
        }
        (counts, old_output)
    }};
}

impl SqlStore {
    pub(super) async fn prunable_workflows(
        &self,
        query: &PruneQuery,
    ) -> Result<Vec<String>, StoreError> {
        // Oldest end first from `manent_workflows_finished` (a range of `finished_at`); a successful one is chosen only
        // when `keep_successful` newer successful ones of its partition exist (counted from
        // the partition index, never more than that many rows).
        let sql = format!(
            "SELECT w.id FROM manent_workflows w \
             WHERE w.name = $1 AND w.finished_at < $2 AND w.parent_id IS NULL \
             AND w.status IN {FINISHED} \
             AND (w.status <> 'SUCCESS' OR ( \
                 SELECT COUNT(*) FROM (SELECT 1 FROM manent_workflows n \
                     WHERE n.partition_key = w.partition_key AND n.created_seq > w.created_seq \
                     AND n.name = w.name AND n.status = 'SUCCESS' AND n.parent_id IS NULL \
                     LIMIT $3) AS newer) >= $3) \
             ORDER BY w.finished_at, w.id LIMIT $4"
        );
        Ok(with_pool!(self, pool => sqlx::query_scalar(&sql)
            .bind(&query.name)
            .bind(query.finished_before_ms)
            .bind(query.keep_successful.max(0))
            .bind(query.limit.max(0))
            .fetch_all(pool)
            .await)?)
    }

    pub(super) async fn delete_workflows(&self, ids: &[String]) -> Result<Deleted, StoreError> {
        if ids.is_empty() {
            return Ok(Deleted::default());
        }
        let (deleted, _) = write_tx!(self, tx => remove_tree!(tx, ids, false, None::<i64>));
        Ok(deleted)
    }

    /// What `delete_workflows(ids)` would remove now, counted by the same walk (a dry
    /// run's figures are the real run's), and how many of those output lines are older
    /// than `old_output_before` and of finished workflows: lines `prune_output` counts too.
    pub(super) async fn count_workflows_removal(
        &self,
        ids: &[String],
        old_output_before: Option<i64>,
    ) -> Result<(Deleted, u64), StoreError> {
        if ids.is_empty() {
            return Ok((Deleted::default(), 0));
        }
        // Reads only: no write transaction, nothing for a writer to wait for.
        Ok(with_pool!(self, pool => {
            let mut conn = pool.acquire().await?;
            remove_tree!(conn, ids, true, old_output_before)
        }))
    }

    pub(super) async fn prune_output(
        &self,
        before_ms: i64,
        limit: i64,
        dry_run: bool,
    ) -> Result<u64, StoreError> {
        // Oldest first from `manent_output_at`; only lines of finished workflows (a running
        // deploy's output is what `manent logs -f` follows).
        let chosen = format!(
            "SELECT o.id FROM manent_output o JOIN manent_workflows w ON w.id = o.workflow_id \
             WHERE o.at < $1 AND w.status IN {FINISHED} ORDER BY o.at LIMIT $2"
        );
        self.remove_chosen("manent_output", &chosen, before_ms, limit, dry_run)
            .await
    }

    pub(super) async fn prune_audit(
        &self,
        before_ms: i64,
        limit: i64,
        dry_run: bool,
    ) -> Result<u64, StoreError> {
        let chosen = "SELECT id FROM manent_audit WHERE at < $1 ORDER BY at LIMIT $2";
        self.remove_chosen("manent_audit", chosen, before_ms, limit, dry_run)
            .await
    }

    /// Removes (or counts) the rows of `table` whose ids `chosen` selects, given `$1` =
    /// `before_ms` and `$2` = `limit`.
    async fn remove_chosen(
        &self,
        table: &str,
        chosen: &str,
        before_ms: i64,
        limit: i64,
        dry_run: bool,
    ) -> Result<u64, StoreError> {
        if dry_run {
            let sql = format!("SELECT COUNT(*) FROM ({chosen}) AS chosen");
            let n: i64 = with_pool!(self, pool => sqlx::query_scalar(&sql)
                .bind(before_ms)
                .bind(limit.max(0))
                .fetch_one(pool)
                .await)?;
            return Ok(u64::try_from(n).unwrap_or(0));
        }
        let sql = format!("DELETE FROM {table} WHERE id IN ({chosen})");
        Ok(with_writer!(self, pool => sqlx::query(&sql)
            .bind(before_ms)
            .bind(limit.max(0))
            .execute(pool)
            .await
            .map(|r| r.rows_affected()))?)
    }

    pub(super) async fn reclaim_space(&self, full: bool) -> Result<(), StoreError> {
        if let Pool::Postgres(pool) = &self.pool {
            // Autovacuum does this where it is on and keeps up; a cluster with it off (some
            // are, for bulk loads) or behind on these small, churning tables would grow
            // without bound, every update of a deploy's row leaving a dead one. A plain
            // VACUUM takes no lock writers wait for; SKIP_LOCKED passes over a table
            // another worker's (or autovacuum's) VACUUM holds. Simple protocol: VACUUM
            // cannot run in the implicit transaction of a prepared statement.
            sqlx::raw_sql(PG_VACUUM).execute(pool).await?;
            return Ok(());
        }
        if let Pool::Sqlite { write, .. } = &self.pool {
            if full {
                // The mode takes effect for a file that had none at the rewrite.
                sqlx::query("PRAGMA auto_vacuum = INCREMENTAL")
                    .execute(write)
                    .await?;
                sqlx::query("VACUUM").execute(write).await?;
            } else {
                // Frees the pages removals left empty when the file was created with
                // `auto_vacuum = INCREMENTAL` (every file manent creates); a no-op otherwise.
                sqlx::query("PRAGMA incremental_vacuum")
                    .execute(write)
                    .await?;
                // The file shrinks when a checkpoint has copied every page of the log back;
                // the automatic one waits for 1,000 pages, which a quiet installation may not
                // write for days. A passive checkpoint waits for no reader and blocks no
                // writer: where a reader holds it back, the next pass finishes it.
                sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                    .execute(write)
                    .await?;
            }
        }
        Ok(())
    }
}

/// The tables retention removes from and deploys churn, vacuumed after each retention pass
/// on PostgreSQL (`Store::reclaim_space`).
const PG_VACUUM: &str = "VACUUM (SKIP_LOCKED) manent_workflows, manent_steps, manent_events, \
     manent_output, manent_messages, manent_audit";

/// `$from, $from+1, …`: `count` placeholders.
fn placeholders(from: usize, count: usize) -> String {
    (from..from + count)
        .map(|n| format!("${n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
