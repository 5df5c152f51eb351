//! The versioned schema of both backends. A migration is never edited once
//! released: a change is a new version appended to [`MIGRATIONS`].

use super::Backend;

pub(crate) struct Migration {
    pub version: i64,
    pub name: &'static str,
    /// Statements with `{ID}` standing for the dialect's auto-increment key.
    statements: &'static [&'static str],
}

impl Migration {
    pub fn statements(&self, backend: Backend) -> impl Iterator<Item = String> + '_ {
        let id = match backend {
            Backend::Sqlite => "INTEGER PRIMARY KEY AUTOINCREMENT",
            Backend::Postgres => "BIGSERIAL PRIMARY KEY",
        };
        self.statements.iter().map(move |s| s.replace("{ID}", id))
    }
}

pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "workflows, steps, queues, messages, events, executors",
        statements: &[
            "CREATE TABLE manent_queues (
            name TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            worker_concurrency BIGINT,
            partition_concurrency BIGINT,
            global_concurrency BIGINT NOT NULL DEFAULT 0,
            updated_at BIGINT NOT NULL)",
            "CREATE TABLE manent_workflows (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            status TEXT NOT NULL,
            queue_name TEXT NOT NULL,
            partition_key TEXT NOT NULL DEFAULT '',
            priority BIGINT NOT NULL DEFAULT 0,
            not_before BIGINT NOT NULL DEFAULT 0,
            dedup_key TEXT,
            executor_id TEXT,
            input TEXT NOT NULL,
            output TEXT,
            error TEXT,
            parent_id TEXT,
            attempts BIGINT NOT NULL DEFAULT 0,
            generation BIGINT NOT NULL DEFAULT 0,
            created_at BIGINT NOT NULL,
            created_seq BIGINT NOT NULL,
            updated_at BIGINT NOT NULL,
            started_at BIGINT,
            finished_at BIGINT)",
            "CREATE INDEX manent_workflows_queue ON manent_workflows (queue_name, status, partition_key)",
            "CREATE INDEX manent_workflows_executor ON manent_workflows (executor_id, status)",
            "CREATE INDEX manent_workflows_parent ON manent_workflows (parent_id)",
            "CREATE INDEX manent_workflows_created ON manent_workflows (created_seq)",
            "CREATE UNIQUE INDEX manent_workflows_dedup ON manent_workflows (queue_name, dedup_key)
            WHERE dedup_key IS NOT NULL AND status IN ('ENQUEUED', 'PENDING')",
            "CREATE TABLE manent_steps (
            workflow_id TEXT NOT NULL,
            step_index BIGINT NOT NULL,
            name TEXT NOT NULL,
            status TEXT NOT NULL,
            output TEXT,
            error TEXT,
            attempts BIGINT NOT NULL,
            started_at BIGINT NOT NULL,
            finished_at BIGINT,
            executor_id TEXT NOT NULL,
            PRIMARY KEY (workflow_id, step_index))",
            "CREATE TABLE manent_messages (
            id {ID},
            workflow_id TEXT NOT NULL,
            topic TEXT NOT NULL,
            payload TEXT NOT NULL,
            created_at BIGINT NOT NULL)",
            "CREATE INDEX manent_messages_destination ON manent_messages (workflow_id, topic, id)",
            "CREATE TABLE manent_events (
            workflow_id TEXT NOT NULL,
            event_key TEXT NOT NULL,
            value TEXT NOT NULL,
            updated_at BIGINT NOT NULL,
            PRIMARY KEY (workflow_id, event_key))",
            "CREATE TABLE manent_executors (
            id TEXT PRIMARY KEY,
            host TEXT NOT NULL,
            pid BIGINT NOT NULL,
            region TEXT,
            queues TEXT NOT NULL,
            state TEXT NOT NULL,
            started_at BIGINT NOT NULL,
            heartbeat_at BIGINT NOT NULL,
            stopped_at BIGINT,
            version TEXT NOT NULL)",
        ],
    },
    Migration {
        version: 2,
        name: "records: small documents kept for the engine's users",
        statements: &["CREATE TABLE manent_records (
            kind TEXT NOT NULL,
            record_key TEXT NOT NULL,
            value TEXT NOT NULL,
            updated_at BIGINT NOT NULL,
            PRIMARY KEY (kind, record_key))"],
    },
    Migration {
        version: 3,
        name: "indexes for the metrics of recent steps and claims",
        statements: &[
            "CREATE INDEX manent_steps_finished ON manent_steps (finished_at)",
            "CREATE INDEX manent_workflows_started ON manent_workflows (started_at)",
        ],
    },
    Migration {
        version: 4,
        name: "limit groups; claims find each partition's next workflows by index",
        statements: &[
            // The group a running workflow was claimed under (limits shared by queues).
            "ALTER TABLE manent_workflows ADD COLUMN limit_group TEXT",
            // The claim reads the backlog in this order and stops at what it can take.
            "CREATE INDEX manent_workflows_claimable ON manent_workflows (queue_name, priority, created_seq, id) \
             WHERE status = 'ENQUEUED'",
            // The earliest scheduled workflow, without reading the backlog.
            "CREATE INDEX manent_workflows_scheduled ON manent_workflows (queue_name, not_before) \
             WHERE status = 'ENQUEUED'",
            // A group's running workflows, per executor and partition.
            "CREATE INDEX manent_workflows_group_running ON manent_workflows (limit_group, executor_id, partition_key) \
             WHERE status = 'PENDING'",
        ],
    },
    Migration {
        version: 5,
        name: "executor leases: one live holder per executor id",
        statements: &["CREATE TABLE manent_executor_leases (
            executor_id TEXT PRIMARY KEY,
            holder TEXT NOT NULL,
            host TEXT NOT NULL,
            pid BIGINT NOT NULL,
            acquired_at BIGINT NOT NULL,
            renewed_at BIGINT NOT NULL,
            expires_at BIGINT NOT NULL)"],
    },
    Migration {
        version: 6,
        name: "audit: who changed what, and every refused request",
        statements: &["CREATE TABLE manent_audit (
            id {ID},
            at BIGINT NOT NULL,
            actor TEXT NOT NULL,
            actor_id TEXT NOT NULL,
            action TEXT NOT NULL,
            target TEXT NOT NULL,
            outcome BIGINT NOT NULL,
            detail TEXT NOT NULL)"],
    },
    Migration {
        version: 7,
        name: "one partition's history, newest first, by index",
        // What ran last on an application/environment (dependencies, rollback,
        // approvals) is read by partition, however much else has run since.
        statements: &["CREATE INDEX manent_workflows_partition_history \
             ON manent_workflows (partition_key, status, created_seq)"],
    },
    Migration {
        version: 8,
        name: "output: what a workflow's commands print, line by line, as they print it",
        statements: &[
            "CREATE TABLE manent_output (
            id {ID},
            workflow_id TEXT NOT NULL,
            at BIGINT NOT NULL,
            generation BIGINT NOT NULL,
            source TEXT NOT NULL,
            stream TEXT NOT NULL,
            line TEXT NOT NULL)",
            "CREATE INDEX manent_output_workflow ON manent_output (workflow_id, id)",
        ],
    },
    Migration {
        version: 9,
        name: "indexes that a workflow's changes of status leave in place",
        // An index with `status` in its key and `partition_key` after it moved each
        // workflow's entry to another place of a large tree at its claim and again at its
        // end: pages written all over the file at every commit, more the larger the
        // history (bench/README.md, "Indexes that status changes leave in place").
        statements: &[
            // What every claim counts: a queue's running workflows, per executor and
            // partition. Only running rows are in it.
            "CREATE INDEX manent_workflows_running ON manent_workflows (queue_name, executor_id, partition_key) \
             WHERE status = 'PENDING'",
            // One partition's history, newest first; the status is read from the rows.
            // Written once, when the workflow is enqueued.
            "CREATE INDEX manent_workflows_partition ON manent_workflows (partition_key, created_seq)",
            "DROP INDEX manent_workflows_queue",
            "DROP INDEX manent_workflows_partition_history",
        ],
    },
];

/// The version a fully migrated schema has.
pub fn latest_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}
