-- The claim's queries on SQLite with a backlog of 100,000 over 5,000 partitions: sqlite3 /tmp/x.db < bench/explain-claim-sqlite.sql
CREATE TABLE manent_workflows (
  id TEXT PRIMARY KEY, name TEXT NOT NULL, status TEXT NOT NULL, queue_name TEXT NOT NULL,
  partition_key TEXT NOT NULL DEFAULT '', priority BIGINT NOT NULL DEFAULT 0, not_before BIGINT NOT NULL DEFAULT 0,
  executor_id TEXT, input TEXT NOT NULL, created_seq BIGINT NOT NULL, limit_group TEXT);
CREATE INDEX manent_workflows_running ON manent_workflows (queue_name, executor_id, partition_key) WHERE status = 'PENDING';
CREATE INDEX manent_workflows_partition ON manent_workflows (partition_key, created_seq);
CREATE INDEX manent_workflows_claimable ON manent_workflows (queue_name, priority, created_seq, id) WHERE status = 'ENQUEUED';
CREATE INDEX manent_workflows_scheduled ON manent_workflows (queue_name, not_before) WHERE status = 'ENQUEUED';
CREATE INDEX manent_workflows_group_running ON manent_workflows (limit_group, executor_id, partition_key) WHERE status = 'PENDING';
WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 100000)
INSERT INTO manent_workflows (id, name, status, queue_name, partition_key, input, created_seq)
SELECT 'wf-' || i, 'bench', 'ENQUEUED', 'bench', 'p' || (i % 5000), '{}', i FROM s;
UPDATE manent_workflows SET status = 'PENDING', executor_id = 'w1', limit_group = 'g' WHERE created_seq <= 40;
ANALYZE;
.timer on
.print ==== next claimable workflows (first page)
EXPLAIN QUERY PLAN SELECT id, partition_key, priority, created_seq FROM manent_workflows
 WHERE queue_name = 'bench' AND status = 'ENQUEUED' AND not_before <= 9999999999999
 AND partition_key NOT IN ('p1','p2','p3') ORDER BY priority, created_seq, id LIMIT 20;
SELECT count(*) FROM (SELECT id FROM manent_workflows
 WHERE queue_name = 'bench' AND status = 'ENQUEUED' AND not_before <= 9999999999999
 AND partition_key NOT IN ('p1','p2','p3') ORDER BY priority, created_seq, id LIMIT 20);
.print ==== next page (keyset)
EXPLAIN QUERY PLAN SELECT id, partition_key, priority, created_seq FROM manent_workflows
 WHERE queue_name = 'bench' AND status = 'ENQUEUED' AND not_before <= 9999999999999
 AND (priority, created_seq, id) > (0, 50000, 'wf-50000') ORDER BY priority, created_seq, id LIMIT 20;
SELECT count(*) FROM (SELECT id FROM manent_workflows
 WHERE queue_name = 'bench' AND status = 'ENQUEUED' AND not_before <= 9999999999999
 AND (priority, created_seq, id) > (0, 50000, 'wf-50000') ORDER BY priority, created_seq, id LIMIT 20);
.print ==== running counts
EXPLAIN QUERY PLAN SELECT CAST(0 AS BIGINT), executor_id, partition_key, COUNT(*) FROM manent_workflows
 WHERE queue_name = 'bench' AND status = 'PENDING' GROUP BY executor_id, partition_key
 UNION ALL SELECT CAST(1 AS BIGINT), executor_id, partition_key, COUNT(*) FROM manent_workflows
 WHERE limit_group = 'g' AND status = 'PENDING' GROUP BY executor_id, partition_key;
.print ==== earliest scheduled
EXPLAIN QUERY PLAN SELECT MIN(not_before) FROM manent_workflows WHERE queue_name = 'bench' AND status = 'ENQUEUED' AND not_before > 1000;
