//! Queues and workflows: enqueueing, reading, listing, cancelling and resuming, and their counts.

use super::Pool;
use super::SqlStore;
use super::rows::WorkflowRow;
use super::rows::workflows;
use crate::error::StoreError;
use crate::store::EnqueueOutcome;
use crate::store::NewWorkflow;
use crate::store::QueueDepth;
use crate::store::QueueRecord;
use crate::store::TimeWindow;
use crate::store::Wakeup;
use crate::store::WorkflowFilter;
use crate::store::WorkflowRecord;
use crate::store::WorkflowStatus;
use std::collections::BTreeMap;
use std::collections::HashSet;
use std::sync::atomic::AtomicI64;
use std::sync::atomic::Ordering;

pub(super) fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.is_unique_violation())
}

/// Strictly increasing microsecond stamps for FIFO order within this process.
pub(super) fn next_seq(now_ms: i64) -> i64 {
    static LAST: AtomicI64 = AtomicI64::new(0);
    let now_us = now_ms.saturating_mul(1000);
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let next = now_us.max(last + 1);
        match LAST.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// The queued and running workflows of every queue. Each status on its own, so that each
/// count reads the partial index of that status (`manent_workflows_claimable`,
/// `manent_workflows_running`), not the table.
pub(super) const QUEUE_DEPTHS_SQL: &str = "SELECT queue_name, COUNT(*), CAST(0 AS BIGINT) FROM manent_workflows \
     WHERE status = 'ENQUEUED' GROUP BY queue_name \
     UNION ALL \
     SELECT queue_name, CAST(0 AS BIGINT), COUNT(*) FROM manent_workflows \
     WHERE status = 'PENDING' GROUP BY queue_name";

/// Rows per multi-row INSERT of `enqueue_many` (11 parameters each, well under both
/// backends' caps). SQLite's is small: binding parameter N looks its name up in a list
/// of all the statement's parameters (`sqlite3_bind_parameter_name`, called by sqlx for
/// each), so a statement's binding costs grow with the square of its parameters. At 500
/// rows (5,500 parameters) that lookup was a quarter of the CPU of a 100,000-workflow
/// enqueue, which took 11.9 s against PostgreSQL's 4.6–6.1 s.
pub(super) fn enqueue_chunk_rows(is_pg: bool) -> usize {
    if is_pg { 500 } else { 50 }
}

/// The query of [`Store::list_workflows`] for `f`: only the filters given are in its
/// `WHERE`, so the planner sees which columns are fixed and reads the index that serves
/// them (one partition's history through `manent_workflows_partition`, a workflow's
/// children through `manent_workflows_parent`). Written as `($n IS NULL OR column = $n)`
/// for every filter, SQLite cannot use any of them: it read the whole history newest
/// first to find one application's deploys. Returns the text and the filters' values,
/// bound in order before the limit and the offset.
pub(super) fn list_sql(f: &WorkflowFilter) -> (String, Vec<String>) {
    let (conditions, values) = list_where(f, 0);
    // The queued or running workflows of the whole history (`manent activity`): few, in the
    // partial index of their status. Ordered by `created_seq` itself, SQLite (without
    // statistics) would rather walk the whole history newest first to avoid sorting them; an
    // expression cannot come from an index, so the partial index is read and its few rows
    // sorted. A narrower filter keeps its own index's order.
    let few = matches!(
        f.status,
        Some(WorkflowStatus::Enqueued | WorkflowStatus::Pending)
    ) && f.queue.is_none()
        && f.executor_id.is_none()
        && f.parent_id.is_none()
        && f.partition_key.is_none()
        && f.partition_prefix.is_none()
        && f.before_id.is_none();
    let order = if few {
        "created_seq + 0"
    } else {
        "created_seq"
    };
    let sql = format!(
        concat!(
            "SELECT ",
            wf_cols!(),
            " FROM manent_workflows{} ORDER BY {} DESC LIMIT ${} OFFSET ${}"
        ),
        conditions,
        order,
        values.len() + 1,
        values.len() + 2
    );
    (sql, values)
}

/// The `WHERE` of `f` (empty without filters) and the values it binds, its placeholders
/// numbered after `before` others.
fn list_where(f: &WorkflowFilter, before: usize) -> (String, Vec<String>) {
    // A prefix is the range [prefix, prefix with its last character raised): a range of the
    // partition index on both backends, where LIKE would need a collation to use it.
    let upper = f.partition_prefix.as_deref().and_then(prefix_upper_bound);
    let filters = [
        ("queue_name", "=", f.queue.as_deref()),
        ("name", "=", f.name.as_deref()),
        ("executor_id", "=", f.executor_id.as_deref()),
        ("parent_id", "=", f.parent_id.as_deref()),
        ("partition_key", "=", f.partition_key.as_deref()),
        ("partition_key", ">=", f.partition_prefix.as_deref()),
        ("partition_key", "<", upper.as_deref()),
        // A cursor: the enqueue order of the workflow named, read by primary key.
        (
            "created_seq",
            "< (SELECT created_seq FROM manent_workflows WHERE id =",
            f.before_id.as_deref(),
        ),
    ];
    // The status is written into the text, not bound: it is one of a closed set
    // (`WorkflowStatus::as_str`), and only a literal lets the planners use the partial index
    // of that status (the backlog's, the running work's, the failed and cancelled deploys'),
    // where a parameter leaves them reading the whole history for a rare status.
    let mut conditions: Vec<String> = f
        .status
        .map(|status| format!("status = '{}'", status.as_str()))
        .into_iter()
        .collect();
    let mut values = Vec::new();
    for (column, op, value) in filters {
        if let Some(value) = value {
            values.push(value.to_string());
            let close = if op.starts_with("< (") { ")" } else { "" };
            conditions.push(format!("{column} {op} ${}{close}", before + values.len()));
        }
    }
    if conditions.is_empty() {
        return (String::new(), values);
    }
    (format!(" WHERE {}", conditions.join(" AND ")), values)
}

/// The most partitions under one prefix a list merges one by one ([`list_merged_sql`]);
/// past it, the prefix is read as one range of the partition index and sorted.
pub(super) const MAX_MERGED_PARTITIONS: usize = 32;

/// The partitions whose key starts with `prefix` (at most [`MAX_MERGED_PARTITIONS`] + 1),
/// found by seeking the partition index once per partition, not by reading its entries.
pub(super) const PARTITIONS_IN_RANGE_SQL: &str = "WITH RECURSIVE parts(k) AS ( \
     SELECT (SELECT MIN(partition_key) FROM manent_workflows \
             WHERE partition_key >= $1 AND partition_key < $2) \
     UNION ALL \
     SELECT (SELECT MIN(partition_key) FROM manent_workflows \
             WHERE partition_key > parts.k AND partition_key < $2) \
     FROM parts WHERE parts.k IS NOT NULL) \
     SELECT k FROM parts WHERE k IS NOT NULL LIMIT 33";

/// The list of `f` (which names a prefix) over `partitions`: each partition's newest
/// `limit + offset` rows read in order from the partition index, merged. Read as one range,
/// the whole application's history would be sorted to find its newest page (228 ms at
/// 1,000,000 deploys on SQLite, bench/history).
pub(super) fn list_merged_sql(f: &WorkflowFilter, partitions: &[String]) -> (String, Vec<String>) {
    let each = f
        .limit
        .unwrap_or(1000)
        .saturating_add(f.offset.unwrap_or(0))
        .max(0);
    let mut values = Vec::new();
    let mut arms = Vec::new();
    for partition in partitions {
        let one = WorkflowFilter {
            partition_key: Some(partition.clone()),
            partition_prefix: None,
            ..f.clone()
        };
        let (conditions, arm_values) = list_where(&one, values.len());
        values.extend(arm_values);
        // Each arm's own limit is a number: the page and what it passes over.
        arms.push(format!(
            "SELECT * FROM (SELECT * FROM manent_workflows{conditions} \
             ORDER BY created_seq DESC LIMIT {each}) AS p{}",
            arms.len()
        ));
    }
    let sql = format!(
        concat!(
            "SELECT ",
            wf_cols!(),
            " FROM ({}) AS merged ORDER BY created_seq DESC LIMIT ${} OFFSET ${}"
        ),
        arms.join(" UNION ALL "),
        values.len() + 1,
        values.len() + 2
    );
    (sql, values)
}

/// The smallest string above every string that starts with `prefix`: `prefix` with its last
/// character raised by one (`acme/web/` gives `acme/web0`). `None` when there is none (an
/// empty prefix, or one ending in the highest character): no upper bound then.
fn prefix_upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    let last = chars.pop()?;
    let raised = char::from_u32(u32::from(last) + 1)?;
    chars.push(raised);
    Some(chars.into_iter().collect())
}

/// `items` as a JSON array of strings: one bound parameter for a list of any length.
pub(super) fn json_list(items: &[&str]) -> String {
    serde_json::Value::from(items).to_string()
}

impl SqlStore {
    pub(super) async fn upsert_queue(&self, q: &QueueRecord) -> Result<(), StoreError> {
        with_writer!(self, pool => sqlx::query(
        "INSERT INTO manent_queues (name, kind, worker_concurrency, partition_concurrency, global_concurrency, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, \
         worker_concurrency = excluded.worker_concurrency, partition_concurrency = excluded.partition_concurrency, \
         global_concurrency = excluded.global_concurrency, updated_at = excluded.updated_at")
        .bind(&q.name)
        .bind(&q.kind)
        .bind(q.worker_concurrency)
        .bind(q.partition_concurrency)
        .bind(q.global_concurrency)
        .bind(q.updated_at_ms)
        .execute(pool)
        .await
        .map(|r| r.rows_affected())
        )?;
        Ok(())
    }

    // The row of one query, read once: a named type would say less than the SELECT.
    #[allow(clippy::type_complexity)]
    pub(super) async fn list_queues(&self) -> Result<Vec<QueueRecord>, StoreError> {
        let rows: Vec<(String, String, Option<i64>, Option<i64>, i64, i64)> = with_pool!(self, pool => sqlx::query_as(
        "SELECT name, kind, worker_concurrency, partition_concurrency, global_concurrency, updated_at \
         FROM manent_queues ORDER BY name")
        .fetch_all(pool)
        .await
        )?;
        Ok(rows
            .into_iter()
            .map(
                |(
                    name,
                    kind,
                    worker_concurrency,
                    partition_concurrency,
                    global_concurrency,
                    updated_at_ms,
                )| {
                    QueueRecord {
                        name,
                        kind,
                        worker_concurrency,
                        partition_concurrency,
                        global_concurrency,
                        updated_at_ms,
                    }
                },
            )
            .collect())
    }

    pub(super) async fn queue_depths(&self) -> Result<Vec<QueueDepth>, StoreError> {
        let rows: Vec<(String, i64, i64)> = with_pool!(self, pool => sqlx::query_as(QUEUE_DEPTHS_SQL)
        .fetch_all(pool)
        .await
        )?;
        let mut depths: BTreeMap<String, QueueDepth> = BTreeMap::new();
        for (queue, enqueued, running) in rows {
            let depth = depths.entry(queue.clone()).or_insert(QueueDepth {
                queue,
                enqueued: 0,
                running: 0,
            });
            depth.enqueued += enqueued;
            depth.running += running;
        }
        Ok(depths.into_values().collect())
    }

    pub(super) async fn enqueue(&self, wf: &NewWorkflow) -> Result<EnqueueOutcome, StoreError> {
        let seq = next_seq(wf.now_ms);
        let inserted = with_writer!(self, pool => sqlx::query(
            "INSERT INTO manent_workflows (id, name, status, queue_name, partition_key, priority, not_before, dedup_key, \
             input, parent_id, attempts, generation, created_at, created_seq, updated_at, workflow_version) \
             VALUES ($1, $2, 'ENQUEUED', $3, $4, $5, $6, $7, $8, $9, 0, 0, $10, $11, $10, $12) ON CONFLICT (id) DO NOTHING")
            .bind(&wf.id)
            .bind(&wf.name)
            .bind(&wf.queue)
            .bind(&wf.partition_key)
            .bind(wf.priority)
            .bind(wf.not_before_ms)
            .bind(&wf.dedup_key)
            .bind(&wf.input)
            .bind(&wf.parent_id)
            .bind(wf.now_ms)
            .bind(seq)
            .bind(i64::from(wf.workflow_version))
            .execute(pool)
            .await
            .map(|r| r.rows_affected()));
        match inserted {
            Ok(1) => {
                // The NOTIFY goes after the commit, in a statement of its own, not in the
                // insert's: a notifying commit serialises on PostgreSQL's notification
                // queue and measured 2-6 ms against 0.7-2 ms for the insert alone
                // (bench/README.md, "Full run with the peers"), while this process's
                // claimers, woken first, need not wait for the NOTIFY at all.
                self.wake(&[Wakeup::Queue(wf.queue.clone())]).await;
                Ok(EnqueueOutcome::Created)
            }
            Ok(_) => match self.get_workflow(&wf.id).await? {
                Some(existing) => Ok(EnqueueOutcome::Exists(Box::new(existing))),
                None => Err(StoreError::Database(format!(
                    "workflow {} vanished during enqueue",
                    wf.id
                ))),
            },
            Err(e) if is_unique_violation(&e) => {
                let key = wf.dedup_key.as_deref().unwrap_or_default();
                match self.lookup_dedup(&wf.queue, key).await? {
                    Some(existing_id) => Ok(EnqueueOutcome::Deduplicated { existing_id }),
                    None => Err(StoreError::Unavailable(
                        "deduplication conflict vanished; retry".into(),
                    )),
                }
            }
            Err(e) => Err(StoreError::from(e)),
        }
    }

    pub(super) async fn enqueue_many(
        &self,
        wfs: &[NewWorkflow],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        if wfs.is_empty() {
            return Ok(Vec::new());
        }
        let chunk_rows = enqueue_chunk_rows(matches!(self.pool, Pool::Postgres(_)));
        let inserted: HashSet<String> = write_tx!(self, tx => {
            let mut inserted = HashSet::new();
            for chunk in wfs.chunks(chunk_rows) {
                let values: Vec<String> = (0..chunk.len())
                    .map(|i| {
                        let b = i * 12;
                        format!(
                            "(${}, ${}, 'ENQUEUED', ${}, ${}, ${}, ${}, ${}, ${}, ${}, 0, 0, ${}, ${}, ${}, ${})",
                            b + 1, b + 2, b + 3, b + 4, b + 5, b + 6, b + 7, b + 8, b + 9, b + 10, b + 11, b + 10,
                            b + 12
                        )
                    })
                    .collect();
                // No conflict target: a taken id and a held deduplication key
                // both leave the row out; the outcome is sorted out below.
                let sql = format!(
                    "INSERT INTO manent_workflows (id, name, status, queue_name, partition_key, priority, not_before, \
                     dedup_key, input, parent_id, attempts, generation, created_at, created_seq, updated_at, \
                     workflow_version) VALUES {} ON CONFLICT DO NOTHING RETURNING id",
                    values.join(", ")
                );
                let mut query = sqlx::query_scalar::<_, String>(&sql).persistent(super::ONE_OFF);
                for wf in chunk {
                    query = query
                        .bind(wf.id.clone())
                        .bind(wf.name.clone())
                        .bind(wf.queue.clone())
                        .bind(wf.partition_key.clone())
                        .bind(wf.priority)
                        .bind(wf.not_before_ms)
                        .bind(wf.dedup_key.clone())
                        .bind(wf.input.clone())
                        .bind(wf.parent_id.clone())
                        .bind(wf.now_ms)
                        .bind(next_seq(wf.now_ms))
                        .bind(i64::from(wf.workflow_version));
                }
                inserted.extend(query.fetch_all(&mut *tx).await?);
            }
            inserted
        });
        let mut queues: Vec<String> = wfs
            .iter()
            .filter(|w| inserted.contains(&w.id))
            .map(|w| w.queue.clone())
            .collect();
        queues.sort();
        queues.dedup();
        self.wake(&queues.into_iter().map(Wakeup::Queue).collect::<Vec<_>>())
            .await;
        let mut outcomes = Vec::with_capacity(wfs.len());
        let mut reported: HashSet<&str> = HashSet::new();
        for wf in wfs {
            // A repeated id within the batch is created once; the repeat finds it.
            let first = reported.insert(wf.id.as_str());
            if first && inserted.contains(&wf.id) {
                outcomes.push(EnqueueOutcome::Created);
            } else if let Some(existing) = self.get_workflow(&wf.id).await? {
                outcomes.push(EnqueueOutcome::Exists(Box::new(existing)));
            } else {
                let key = wf.dedup_key.as_deref().unwrap_or_default();
                match self.lookup_dedup(&wf.queue, key).await? {
                    Some(existing_id) => {
                        outcomes.push(EnqueueOutcome::Deduplicated { existing_id })
                    }
                    None => {
                        return Err(StoreError::Unavailable(format!(
                            "workflow {} was neither written nor found; retry",
                            wf.id
                        )));
                    }
                }
            }
        }
        Ok(outcomes)
    }

    pub(super) async fn lookup_dedup(
        &self,
        queue: &str,
        dedup_key: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(with_pool!(self, pool => sqlx::query_scalar(
        "SELECT id FROM manent_workflows WHERE queue_name = $1 AND dedup_key = $2 AND status IN ('ENQUEUED', 'PENDING')")
        .bind(queue)
        .bind(dedup_key)
        .fetch_optional(pool)
        .await
        )?)
    }

    pub(super) async fn get_workflow(
        &self,
        id: &str,
    ) -> Result<Option<WorkflowRecord>, StoreError> {
        let row: Option<WorkflowRow> = with_pool!(self, pool => sqlx::query_as(
        concat!("SELECT ", wf_cols!(), " FROM manent_workflows WHERE id = $1"))
        .bind(id)
        .fetch_optional(pool)
        .await
        )?;
        row.map(WorkflowRecord::try_from).transpose()
    }

    pub(super) async fn list_workflows(
        &self,
        f: &WorkflowFilter,
    ) -> Result<Vec<WorkflowRecord>, StoreError> {
        let (sql, values) = match f.partition_prefix.as_deref() {
            Some(prefix) => {
                let upper =
                    prefix_upper_bound(prefix).unwrap_or_else(|| format!("{prefix}\u{10FFFF}"));
                let partitions: Vec<String> = with_pool!(self, pool => sqlx::query_scalar(PARTITIONS_IN_RANGE_SQL)
                    .bind(prefix)
                    .bind(&upper)
                    .fetch_all(pool)
                    .await)?;
                if partitions.is_empty() {
                    return Ok(Vec::new());
                }
                if partitions.len() <= MAX_MERGED_PARTITIONS {
                    list_merged_sql(f, &partitions)
                } else {
                    list_sql(f)
                }
            }
            None => list_sql(f),
        };
        let rows: Vec<WorkflowRow> = with_pool!(self, pool => {
            let mut query = sqlx::query_as(&sql);
            for value in &values {
                query = query.bind(value.as_str());
            }
            query
                .bind(f.limit.unwrap_or(1000))
                .bind(f.offset.unwrap_or(0))
                .fetch_all(pool)
                .await
        })?;
        workflows(rows)
    }

    pub(super) async fn cancel(
        &self,
        id: &str,
        now_ms: i64,
    ) -> Result<Option<WorkflowStatus>, StoreError> {
        // The workflow and, level by level, its active descendants (region
        // passes, children), in one transaction: nothing of a cancelled
        // workflow is claimed later.
        let cancelled: Vec<(String, String)> = write_tx!(self, tx => {
            let mut cancelled: Vec<(String, String)> = sqlx::query_as(
                "UPDATE manent_workflows SET status = 'CANCELLED', finished_at = $2, updated_at = $2 \
                 WHERE id = $1 AND status IN ('ENQUEUED', 'PENDING') RETURNING id, queue_name")
                .bind(id)
                .bind(now_ms)
                .fetch_all(&mut *tx)
                .await?;
            let mut parents: Vec<String> = if cancelled.is_empty() {
                Vec::new()
            } else {
                vec![id.to_string()]
            };
            while let Some(parent) = parents.pop() {
                let children: Vec<(String, String)> = sqlx::query_as(
                    "UPDATE manent_workflows SET status = 'CANCELLED', finished_at = $2, updated_at = $2 \
                     WHERE parent_id = $1 AND status IN ('ENQUEUED', 'PENDING') RETURNING id, queue_name")
                    .bind(&parent)
                    .bind(now_ms)
                    .fetch_all(&mut *tx)
                    .await?;
                parents.extend(children.iter().map(|(child, _)| child.clone()));
                cancelled.extend(children);
            }
            cancelled
        });
        let mut wakeups = Vec::new();
        for (workflow, queue) in cancelled {
            wakeups.push(Wakeup::Queue(queue));
            wakeups.push(Wakeup::Workflow(workflow));
        }
        self.wake(&wakeups).await;
        Ok(self.get_workflow(id).await?.map(|w| w.status))
    }

    pub(super) async fn resume(
        &self,
        id: &str,
        now_ms: i64,
    ) -> Result<Option<WorkflowStatus>, StoreError> {
        let queue: Option<String> = with_writer!(self, pool => sqlx::query_scalar(
        "UPDATE manent_workflows SET status = 'ENQUEUED', executor_id = NULL, generation = generation + 1, \
         finished_at = NULL, updated_at = $2 WHERE id = $1 AND status = 'CANCELLED' RETURNING queue_name")
        .bind(id)
        .bind(now_ms)
        .fetch_optional(pool)
        .await
        )?;
        if let Some(queue) = queue {
            self.wake(&[Wakeup::Queue(queue)]).await;
        }
        Ok(self.get_workflow(id).await?.map(|w| w.status))
    }

    pub(super) async fn count_enqueued_by_version(
        &self,
        name: &str,
    ) -> Result<Vec<(u32, i64)>, StoreError> {
        let rows: Vec<(i64, i64)> = with_pool!(self, pool => sqlx::query_as(
        "SELECT COALESCE(workflow_version, 1) AS v, COUNT(*) FROM manent_workflows \
         WHERE name = $1 AND status = 'ENQUEUED' GROUP BY COALESCE(workflow_version, 1) ORDER BY 1")
        .bind(name)
        .fetch_all(pool)
        .await
        )?;
        rows.into_iter()
            .map(|(version, n)| {
                let version = u32::try_from(version).map_err(|_| StoreError::Corrupt {
                    what: format!("queued workflows named {name}"),
                    reason: format!("workflow version {version} is out of range"),
                })?;
                Ok((version, n))
            })
            .collect()
    }

    pub(super) async fn count_by_status(
        &self,
        name: &str,
    ) -> Result<Vec<(WorkflowStatus, i64)>, StoreError> {
        let rows: Vec<(String, i64)> = with_pool!(self, pool => sqlx::query_as(
        "SELECT status, COUNT(*) FROM manent_workflows WHERE name = $1 GROUP BY status ORDER BY status")
        .bind(name)
        .fetch_all(pool)
        .await
        )?;
        rows.into_iter()
            .map(|(status, n)| Ok((status.parse()?, n)))
            .collect()
    }

    pub(super) async fn steps_finished_between(
        &self,
        w: TimeWindow,
    ) -> Result<Vec<(i64, i64)>, StoreError> {
        Ok(with_pool!(self, pool => sqlx::query_as(
        "SELECT finished_at, finished_at - started_at FROM manent_steps \
         WHERE finished_at > $1 AND finished_at <= $2 AND name NOT LIKE 'manent.%' \
         ORDER BY finished_at LIMIT $3")
        .bind(w.after_ms)
        .bind(w.until_ms)
        .bind(w.limit)
        .fetch_all(pool)
        .await
        )?)
    }

    pub(super) async fn workflows_started_between(
        &self,
        w: TimeWindow,
    ) -> Result<Vec<(i64, i64)>, StoreError> {
        Ok(with_pool!(self, pool => sqlx::query_as(
        "SELECT started_at, started_at - (CASE WHEN COALESCE(not_before, 0) > created_at \
         THEN not_before ELSE created_at END) \
         FROM manent_workflows WHERE started_at > $1 AND started_at <= $2 \
         ORDER BY started_at LIMIT $3")
        .bind(w.after_ms)
        .bind(w.until_ms)
        .bind(w.limit)
        .fetch_all(pool)
        .await
        )?)
    }

    pub(super) async fn workflows_finished_between(
        &self,
        name: &str,
        w: TimeWindow,
    ) -> Result<Vec<(i64, WorkflowStatus)>, StoreError> {
        let rows: Vec<(i64, String)> = with_pool!(self, pool => sqlx::query_as(
        "SELECT finished_at, status FROM manent_workflows \
         WHERE finished_at > $1 AND finished_at <= $2 AND name = $3 \
         ORDER BY finished_at LIMIT $4")
        .bind(w.after_ms)
        .bind(w.until_ms)
        .bind(name)
        .bind(w.limit)
        .fetch_all(pool)
        .await
        )?;
        rows.into_iter()
            .map(|(at, status)| Ok((at, status.parse()?)))
            .collect()
    }
}
