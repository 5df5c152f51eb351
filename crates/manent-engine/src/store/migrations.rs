//! The versioned schema of both backends. A migration is never edited once
//! released: a change is a new version appended to [`MIGRATIONS`]. Each applied
//! migration's checksum is recorded, and a database whose recorded checksum differs
//! from this build's is refused at start ([`plan`]).

use sha2::{Digest, Sha256};

use super::Backend;
use crate::error::StoreError;

#[derive(Debug)]
pub(crate) struct Migration {
    pub version: i64,
    pub name: &'static str,
    /// The oldest schema version whose binaries may keep running once this migration is
    /// applied (it only adds what they ignore: a table, a nullable column, an index), so
    /// that old and new workers run side by side through a rolling upgrade. `None`: a
    /// binary that does not know this migration must not run on it. Recorded with the
    /// migration when it is applied; an older binary reads it there (docs/upgrading.md).
    pub compatible_from: Option<i64>,
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

    /// SHA-256 (hex) of the statements as written, before the dialect's substitution:
    /// one checksum for both backends. Statements are joined with NUL, which no statement
    /// contains, so moving text from one statement to the next changes the checksum.
    pub fn checksum(&self) -> String {
        let mut hasher = Sha256::new();
        for (i, statement) in self.statements.iter().enumerate() {
            if i > 0 {
                hasher.update([0u8]);
            }
            hasher.update(statement.as_bytes());
        }
        hex::encode(hasher.finalize())
    }
}

/// A row of `manent_schema_migrations`: a version applied to this database, with the
/// checksum recorded when it was applied (`None` when a release before checksums applied it).
#[derive(Debug, Clone)]
pub(crate) struct Applied {
    pub version: i64,
    pub name: String,
    pub checksum: Option<String>,
    /// What the migration declared when it was applied ([`Migration::compatible_from`]).
    pub compatible_from: Option<i64>,
}

/// What a migrator does to a database, decided from what it has applied.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Migrations to apply, in order.
    pub pending: Vec<&'static Migration>,
    /// Applied migrations whose checksum was never recorded: stamped with this build's.
    pub unstamped: Vec<&'static Migration>,
}

/// Decides what to apply, refusing a database one of whose applied migrations was edited
/// since, or that a newer release migrated beyond what this build may run on: a version
/// this build does not know is accepted only when it was declared compatible with this
/// build's schema (and is then left alone).
pub(crate) fn plan(applied: &[Applied]) -> Result<Plan, StoreError> {
    let known = latest_version();
    if let Some(newer) = applied
        .iter()
        .filter(|a| a.version > known)
        .filter(|a| a.compatible_from.is_none_or(|from| from > known))
        .min_by_key(|a| a.version)
    {
        return Err(StoreError::SchemaTooNew {
            database: applied
                .iter()
                .map(|a| a.version)
                .max()
                .unwrap_or(newer.version),
            known,
            version: newer.version,
            name: newer.name.clone(),
            compatible_from: newer.compatible_from,
        });
    }
    let mut plan = Plan::default();
    for migration in MIGRATIONS {
        match applied.iter().find(|a| a.version == migration.version) {
            None => plan.pending.push(migration),
            Some(Applied { checksum: None, .. }) => plan.unstamped.push(migration),
            Some(Applied {
                checksum: Some(recorded),
                ..
            }) => {
                let expected = migration.checksum();
                if *recorded != expected {
                    return Err(StoreError::MigrationEdited {
                        version: migration.version,
                        name: migration.name.to_string(),
                        recorded: recorded.clone(),
                        expected,
                    });
                }
            }
        }
    }
    Ok(plan)
}

pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        compatible_from: None,
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
        compatible_from: None,
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
        compatible_from: None,
        name: "indexes for the metrics of recent steps and claims",
        statements: &[
            "CREATE INDEX manent_steps_finished ON manent_steps (finished_at)",
            "CREATE INDEX manent_workflows_started ON manent_workflows (started_at)",
        ],
    },
    Migration {
        version: 4,
        compatible_from: None,
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
        compatible_from: None,
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
        compatible_from: None,
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
        compatible_from: None,
        name: "one partition's history, newest first, by index",
        // What ran last on an application/environment (dependencies, rollback,
        // approvals) is read by partition, however much else has run since.
        statements: &["CREATE INDEX manent_workflows_partition_history \
             ON manent_workflows (partition_key, status, created_seq)"],
    },
    Migration {
        version: 8,
        compatible_from: None,
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
        compatible_from: None,
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
    Migration {
        version: 10,
        // Two nullable columns: a binary of schema 9 ignores them, and everything it
        // starts or runs is version 1, which NULL means (docs/upgrading.md).
        compatible_from: Some(9),
        name: "workflow versions: the one a workflow started under, the ones an executor runs",
        statements: &[
            // NULL: version 1, what every workflow before this migration started under.
            "ALTER TABLE manent_workflows ADD COLUMN workflow_version BIGINT",
            // The versions this executor can run; NULL: 1 to 1 (a binary before this one).
            "ALTER TABLE manent_executors ADD COLUMN workflow_min BIGINT",
            "ALTER TABLE manent_executors ADD COLUMN workflow_max BIGINT",
        ],
    },
    Migration {
        version: 11,
        // Indexes only: a binary of version 9 or 10 reads and writes the table as before.
        compatible_from: Some(9),
        name: "audit: filters by actor, action and time, paged by id",
        // `GET /api/v1/audit?actor=…&before=…` reads one actor's entries newest first
        // from its index, however many entries of others are newer (docs/api.md).
        statements: &[
            "CREATE INDEX manent_audit_actor ON manent_audit (actor, id)",
            "CREATE INDEX manent_audit_action ON manent_audit (action, id)",
            "CREATE INDEX manent_audit_at ON manent_audit (at)",
        ],
    },
    Migration {
        version: 12,
        // Indexes only: older binaries read and write the tables as before.
        compatible_from: Some(9),
        name: "retention: finished workflows by name and end, output lines by time",
        // What retention removes is found oldest first from an index, in bounded batches,
        // however long the history (docs/configuration.md, `retention`).
        statements: &[
            // `finished_at` alone: with `name` first, SQLite would take it for any read by
            // name (a list by application) over the partition index.
            "CREATE INDEX manent_workflows_finished ON manent_workflows (finished_at)",
            "CREATE INDEX manent_output_at ON manent_output (at)",
        ],
    },
    Migration {
        version: 13,
        // Indexes only: older binaries read and write the tables as before.
        compatible_from: Some(9),
        name: "the failed and the cancelled, newest first, however long the history",
        // `manent list --status ERROR` read the whole history to find the few failed
        // deploys among a million successes (bench/history). Partial: an entry is written
        // once, when a workflow ends so, and never moves.
        statements: &[
            "CREATE INDEX manent_workflows_failed ON manent_workflows (created_seq) \
             WHERE status = 'ERROR'",
            "CREATE INDEX manent_workflows_cancelled ON manent_workflows (created_seq) \
             WHERE status = 'CANCELLED'",
        ],
    },
];

/// The version a fully migrated schema has.
pub fn latest_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(version: i64, checksum: Option<&str>) -> Applied {
        Applied {
            version,
            name: format!("migration {version}"),
            checksum: checksum.map(str::to_string),
            compatible_from: None,
        }
    }

    /// Every migration of this build, applied with its checksum.
    fn all_applied() -> Vec<Applied> {
        MIGRATIONS
            .iter()
            .map(|m| applied(m.version, Some(&m.checksum())))
            .collect()
    }

    /// A migration a newer release applied, declaring `compatible_from`.
    fn newer(offset: i64, compatible_from: Option<i64>) -> Applied {
        Applied {
            compatible_from,
            ..applied(latest_version() + offset, Some("newer"))
        }
    }

    fn versions(migrations: &[&Migration]) -> Vec<i64> {
        migrations.iter().map(|m| m.version).collect()
    }

    #[test]
    fn released_migrations_keep_their_checksums() {
        // A change here means a released migration was edited: append a new one instead.
        let sums: Vec<String> = MIGRATIONS
            .iter()
            .map(|m| format!("{} {}", m.version, m.checksum()))
            .collect();
        expect_test::expect![[r#"
            1 a4113f2073499967d5fbb32b7dcd9020bc8fc91dc58ab5256f0a125ea5c648f6
            2 8e18ae1a03941795a0382e995f3e034ff39f74ad626542fb056e4b966fe45217
            3 b031056bad1d5dcee6450daf1655f58cf50eee642964d28a52d72a59b4e6801b
            4 89a22b27e3d141adbd16416674d5d6d8809191ebfc66c632ba0e841537284328
            5 6332885275119db8d2d4574d9d7dca9c96bdcbb9e1f62fee7d1e578678c4d268
            6 43f2c0f2ffa02395a216f1507539baab31e54a5806a357bbc4082038750c39cd
            7 e33c4a0c665b7c0e6a9431630a19308105023b493ecb8e426a42246c69187e47
            8 bb6c1d55e2999cada39f125ab2d49d9f130682e4efb962c567e53e586be267ea
            9 80a1dd186d723e4e58e9d6eb5dbe5d6402359fc8ebda0420abf2b8dd513b14e4
            10 209fbad30f8890ae1595028507c7e40c7344dcb598412d292ca4a47545e92c33
            11 35eede3303ce805020700980e85c51748f1d98a8202bc9004ab434e6b7d0403c
            12 79f63b23d148f32c59bfa44cbde8bb96ad111f2a3c037d0f9086bc4a348df791
            13 1520db3511c29cc602f71dfb33ad3b67336796c99ece75067865ec83f21b161f"#]]
        .assert_eq(&sums.join("\n"));
    }

    #[test]
    fn versions_are_strictly_increasing() {
        let all: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
        assert!(
            all.windows(2).all(|w| w[0] < w[1]),
            "migrations must be appended in version order: {all:?}"
        );
    }

    #[test]
    fn a_fresh_database_takes_every_migration() {
        let plan = plan(&[]).expect("nothing applied, nothing to refuse");
        assert_eq!(
            versions(&plan.pending),
            versions(&MIGRATIONS.iter().collect::<Vec<_>>()),
            "a new database applies every migration"
        );
        assert!(
            plan.unstamped.is_empty(),
            "nothing applied, nothing to stamp"
        );
    }

    #[test]
    fn migrations_applied_before_checksums_are_stamped_not_reapplied() {
        let before: Vec<Applied> = MIGRATIONS
            .iter()
            .filter(|m| m.version <= 8)
            .map(|m| applied(m.version, None))
            .collect();
        let plan = plan(&before).expect("unstamped rows are not refused");
        assert_eq!(
            versions(&plan.pending),
            (9..=latest_version()).collect::<Vec<_>>(),
            "only the missing versions are applied"
        );
        assert_eq!(
            versions(&plan.unstamped),
            (1..=8).collect::<Vec<_>>(),
            "migrations applied before checksums are stamped, not applied again"
        );
    }

    #[test]
    fn an_edited_migration_is_refused_with_its_version_and_both_checksums() {
        let mut rows = all_applied();
        rows[2].checksum = Some("0".repeat(64));
        let error = plan(&rows).expect_err("an edited migration must be refused");
        let message = error.to_string();
        assert!(
            matches!(error, StoreError::MigrationEdited { version: 3, .. }),
            "the refusal names version 3: {message}"
        );
        assert!(
            message.contains(&"0".repeat(64)) && message.contains(&MIGRATIONS[2].checksum()),
            "the refusal shows the recorded and the expected checksum: {message}"
        );
    }

    #[test]
    fn newer_migrations_declared_compatible_with_this_build_are_left_alone() {
        let known = latest_version();
        let mut rows = all_applied();
        rows.push(newer(1, Some(known)));
        rows.push(newer(2, Some(known - 1)));
        let plan = plan(&rows).expect("compatible newer migrations let this build run");
        assert!(
            plan.pending.is_empty() && plan.unstamped.is_empty(),
            "nothing to apply or stamp: {plan:?}"
        );
    }

    #[test]
    fn a_newer_migration_not_declared_compatible_refuses_naming_both_versions() {
        let known = latest_version();
        let mut rows = all_applied();
        rows.push(newer(1, Some(known)));
        rows.push(newer(2, None));
        rows.push(newer(3, Some(known)));
        let error = plan(&rows).expect_err("an undeclared newer migration must stop this build");
        let message = error.to_string();
        assert!(
            matches!(error, StoreError::SchemaTooNew { database, known: k, version, .. }
                if database == known + 3 && k == known && version == known + 2),
            "the refusal names the database's version, this build's and the first migration it may not run on: {message}"
        );
        assert!(
            message.contains("was not declared compatible"),
            "and says why: {message}"
        );
    }

    #[test]
    fn a_newer_migration_compatible_only_with_newer_releases_refuses() {
        let known = latest_version();
        let mut rows = all_applied();
        rows.push(newer(1, Some(known + 1)));
        let error =
            plan(&rows).expect_err("a migration compatible from a later schema stops this build");
        assert!(
            error
                .to_string()
                .contains(&format!("schema {} or newer only", known + 1)),
            "the refusal says from which schema it is compatible: {error}"
        );
    }
}
