//! Claims: taking a queue's next workflows within its limits, and what a claim counts.

use super::SqlStore;
use super::rows::WorkflowRow;
use super::rows::workflows;
use super::workflows::json_list;
use crate::error::StoreError;
use crate::store::Backend;
use crate::store::ClaimLimits;
use crate::store::RunningCount;
use crate::store::Store;
use crate::store::WorkflowRecord;
use crate::store::WorkflowVersions;
use crate::store::claim;
use crate::store::postgres;

/// Opens a claim transaction on PostgreSQL, in one round trip (a simple query:
/// `BEGIN` and the statement after it): the queue's (or group's) advisory lock,
/// and `enable_sort = off` for this transaction only.
/// Without statistics (a burst enqueued since the last autovacuum ANALYZE)
/// the planner estimates one ENQUEUED row and reads the page through
/// `manent_workflows_scheduled` (or `manent_workflows_queue`), then sorts:
/// every queued row, on every claim (121 ms per claim at 100,000 queued in
/// bench/README.md, "Claims at any backlog"). With sorting priced out, the
/// only plan left for `ORDER BY priority, created_seq, id` is the ordered
/// scan of `manent_workflows_claimable`, which stops at the page's LIMIT.
/// The claim's other statements have no ORDER BY; their GROUP BY hashes.
///
/// The lock key (a queue or group name) is written as an escaped literal
/// (`E'…'`: backslashes and quotes doubled, whatever
/// `standard_conforming_strings` says): the same `hashtext` lock as a bound
/// parameter gives, so workers of an earlier version still take turns with these.
pub(super) fn pg_claim_begin(lock_key: &str) -> String {
    let literal = lock_key.replace('\\', "\\\\").replace('\'', "''");
    format!(
        "BEGIN; SELECT pg_advisory_xact_lock({}, hashtext(E'{literal}')), \
         set_config('enable_sort', 'off', true)",
        postgres::LOCK_NAMESPACE_QUEUE
    )
}

/// What a claim counts before it takes anything: the running workflows of queue `$1`
/// and of limit group `$2`, per executor and partition (`0` and `1` tell which).
/// Each half reads a partial index of running rows (`manent_workflows_running`,
/// `manent_workflows_group_running`), whatever the history holds.
pub(super) const CLAIM_RUNNING_SQL: &str = "SELECT CAST(0 AS BIGINT), executor_id, partition_key, COUNT(*) FROM manent_workflows \
     WHERE queue_name = $1 AND status = 'PENDING' GROUP BY executor_id, partition_key \
     UNION ALL \
     SELECT CAST(1 AS BIGINT), executor_id, partition_key, COUNT(*) FROM manent_workflows \
     WHERE limit_group = $2 AND status = 'PENDING' GROUP BY executor_id, partition_key";

/// One page of a queue's claimable backlog in claim order, with each row's workflow
/// version (read from the row the scan visits anyway): `$1` queue, `$2`
/// now, `$3` the page's size, `$4` the full partitions to leave out (a JSON
/// array), then (`keyset`) `$5..$7` the last row read. One text per shape, so
/// the prepared statement is reused whatever the page holds. On SQLite the
/// index is named: without `ANALYZE` statistics (manent never runs it) SQLite
/// prefers `manent_workflows_scheduled` for its `not_before` range and sorts
/// every queued row in a temporary B-tree.
pub(super) fn claim_page_sql(is_pg: bool, keyset: bool) -> &'static str {
    macro_rules! page {
        ($from:literal, $excluded:literal, $keyset:literal) => {
            concat!(
                "SELECT id, partition_key, priority, created_seq, COALESCE(workflow_version, 1) FROM manent_workflows",
                $from,
                " WHERE queue_name = $1 AND status = 'ENQUEUED' AND not_before <= $2 AND ",
                $excluded,
                $keyset,
                " ORDER BY priority, created_seq, id LIMIT $3"
            )
        };
    }
    match (is_pg, keyset) {
        (true, false) => page!(
            "",
            "partition_key <> ALL (ARRAY(SELECT json_array_elements_text($4::json)))",
            ""
        ),
        (true, true) => page!(
            "",
            "partition_key <> ALL (ARRAY(SELECT json_array_elements_text($4::json)))",
            " AND (priority, created_seq, id) > ($5, $6, $7)"
        ),
        (false, false) => page!(
            " INDEXED BY manent_workflows_claimable",
            "partition_key NOT IN (SELECT value FROM json_each($4))",
            ""
        ),
        (false, true) => page!(
            " INDEXED BY manent_workflows_claimable",
            "partition_key NOT IN (SELECT value FROM json_each($4))",
            " AND (priority, created_seq, id) > ($5, $6, $7)"
        ),
    }
}

/// The claim's update of the workflows it picked (`$4`, a JSON array of ids).
///
/// On PostgreSQL the status is compared as `status || ''`, an expression no index's
/// predicate matches, so the rows are reached through the primary key whatever the
/// table's statistics say. Written as `status = 'ENQUEUED'`, it made the partial indexes
/// (`WHERE status = 'ENQUEUED'`) candidates, and on a table not analyzed since a burst of
/// enqueues the planner read the whole of `manent_workflows_claimable` (its dead entries
/// included) to find the few picked ids, or intersected a bitmap of every queued row:
/// 3 ms instead of 0.2 ms per claim at 10,000 queued, and at a constant backlog of
/// 10,000 that statement was running in 97 of 150 samples of `pg_stat_activity`, at
/// half the throughput of 1,000 or 100,000 (bench/README.md, "Constant backlog").
/// SQLite already reaches them through the primary key.
pub(super) fn claim_update_sql(is_pg: bool) -> &'static str {
    macro_rules! update {
        ($enqueued:literal, $picked:literal) => {
            concat!(
                "UPDATE manent_workflows SET status = 'PENDING', executor_id = $1, limit_group = $2, \
                 generation = generation + 1, attempts = attempts + 1, started_at = COALESCE(started_at, $3), \
                 updated_at = $3 WHERE ",
                $enqueued,
                " AND id ",
                $picked,
                " RETURNING ",
                wf_cols!()
            )
        };
    }
    if is_pg {
        update!(
            "status || '' = 'ENQUEUED'",
            "= ANY (ARRAY(SELECT json_array_elements_text($4::json)))"
        )
    } else {
        update!(
            "status = 'ENQUEUED'",
            "IN (SELECT value FROM json_each($4))"
        )
    }
}

impl SqlStore {
    pub(super) async fn claim(
        &self,
        queue: &str,
        executor_id: &str,
        versions: WorkflowVersions,
        limits: ClaimLimits,
        now_ms: i64,
        max: u32,
    ) -> Result<Vec<WorkflowRecord>, StoreError> {
        let is_pg = self.backend() == Backend::Postgres;
        let group = limits.group.as_ref().map(|g| g.name.clone());
        // Claimers of one queue, or of any queue of one group, take turns, so
        // the counts below stay true until this transaction commits (no write skew).
        let lock_key = match &group {
            Some(g) => format!("group:{g}"),
            None => queue.to_string(),
        };
        // On SQLite the claim's commit is not synced: a power cut that undoes it
        // stops this process too, and the workflow is queued again, its first step
        // never recorded (docs/scaling-and-recovery.md, "What a power cut may undo").
        // Workflows of versions this executor cannot run, passed over by the scan.
        let mut left: Vec<(String, i64)> = Vec::new();
        let claimed: Vec<WorkflowRow> = write_tx!(self, claim_begin = pg_claim_begin(&lock_key), tx => {
            let running: Vec<(i64, Option<String>, String, i64)> = sqlx::query_as(CLAIM_RUNNING_SQL)
                .bind(queue)
                .bind(&group)
                .fetch_all(&mut *tx)
                .await?;
            let running: Vec<claim::Running> = running
                .into_iter()
                .map(|(scope, executor_id, partition_key, count)| claim::Running {
                    in_group: scope == 1,
                    executor_id,
                    partition_key,
                    count,
                })
                .collect();
            let mut plan = claim::ClaimPlan::new(&limits, executor_id, max, &running);
            let mut picked: Vec<String> = Vec::new();
            // Read the backlog in claim order through `manent_workflows_claimable`,
            // a page at a time, leaving out the partitions that are full: the
            // rows read follow what can be taken, not how much is queued.
            let mut after: Option<(i64, i64, String)> = None;
            left.clear();
            while plan.free > 0 {
                let full: Vec<&str> = plan.full_partitions().collect();
                // Past this many, the partitions are skipped here rather than in SQL.
                let exclude = if full.len() <= 500 { full.as_slice() } else { &[] };
                let page = (plan.free * 2).max(16);
                let sql = claim_page_sql(is_pg, after.is_some());
                let mut query = sqlx::query_as::<_, (String, String, i64, i64, i64)>(sql)
                    .bind(queue)
                    .bind(now_ms)
                    .bind(page)
                    .bind(json_list(exclude));
                if let Some((priority, seq, id)) = &after {
                    query = query.bind(*priority).bind(*seq).bind(id.clone());
                }
                let rows = query.fetch_all(&mut *tx).await?;
                let exhausted = (rows.len() as i64) < page;
                for (id, partition, priority, seq, version) in rows {
                    // A version this executor cannot run waits for one that can; so does
                    // the rest of its partition, which must start after it.
                    let runnable = u32::try_from(version).is_ok_and(|v| versions.contains(v));
                    if !runnable {
                        plan.block(&partition);
                        left.push((id.clone(), version));
                    } else if plan.take(&partition) {
                        picked.push(id.clone());
                    }
                    after = Some((priority, seq, id));
                    if plan.free == 0 {
                        break;
                    }
                }
                if exhausted {
                    break;
                }
            }
            if picked.is_empty() {
                Vec::new()
            } else {
                let picked_list = picked.iter().map(String::as_str).collect::<Vec<_>>();
                let mut rows = sqlx::query_as::<_, WorkflowRow>(claim_update_sql(is_pg))
                    .bind(executor_id)
                    .bind(&group)
                    .bind(now_ms)
                    .bind(json_list(&picked_list))
                    .fetch_all(&mut *tx)
                    .await?;
                // In claim order (RETURNING has none).
                rows.sort_by_key(|r| picked.iter().position(|id| *id == r.id));
                rows
            }
        });
        self.report_left_for_other_versions(queue, executor_id, versions, &left);
        workflows(claimed)
    }

    /// Says once per workflow (in this process) that a claim left it for a worker that
    /// runs its version: a deploy waiting for a release that is not running anywhere is
    /// in the log, not only in `waiting_for` and the metrics (docs/upgrading.md).
    fn report_left_for_other_versions(
        &self,
        queue: &str,
        executor_id: &str,
        versions: WorkflowVersions,
        left: &[(String, i64)],
    ) {
        if left.is_empty() {
            return;
        }
        let mut reported = self
            .left_for_other_versions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if reported.len() > 10_000 {
            reported.clear();
        }
        for (id, version) in left {
            if reported.insert(id.clone()) {
                tracing::warn!(
                    workflow_id = %id,
                    workflow_version = version,
                    %queue,
                    %executor_id,
                    runs = %versions,
                    "left on its queue for a worker that runs its workflow version"
                );
            }
        }
    }

    // The row of one query, read once: a named type would say less than the SELECT.
    #[allow(clippy::type_complexity)]
    pub(super) async fn running_counts(&self) -> Result<Vec<RunningCount>, StoreError> {
        let rows: Vec<(String, Option<String>, Option<String>, String, i64)> = with_pool!(self, pool => sqlx::query_as(
        "SELECT queue_name, limit_group, executor_id, partition_key, COUNT(*) FROM manent_workflows \
         WHERE status = 'PENDING' GROUP BY queue_name, limit_group, executor_id, partition_key \
         ORDER BY queue_name, limit_group, executor_id, partition_key")
        .fetch_all(pool)
        .await
        )?;
        Ok(rows
            .into_iter()
            .map(
                |(queue, group, executor_id, partition_key, running)| RunningCount {
                    queue,
                    group,
                    executor_id,
                    partition_key,
                    running,
                },
            )
            .collect())
    }

    pub(super) async fn next_not_before(
        &self,
        queue: &str,
        now_ms: i64,
    ) -> Result<Option<i64>, StoreError> {
        Ok(with_pool!(self, pool => sqlx::query_scalar(
        "SELECT MIN(not_before) FROM manent_workflows WHERE queue_name = $1 AND status = 'ENQUEUED' AND not_before > $2")
        .bind(queue)
        .bind(now_ms)
        .fetch_one(pool)
        .await
        )?)
    }
}
