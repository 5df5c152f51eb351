-- The claim's queries on PostgreSQL with a backlog of :n workflows over 5,000 partitions (bench/README.md, "Claims at any backlog").
DROP DATABASE IF EXISTS limits_explain;
CREATE DATABASE limits_explain;
\c limits_explain
CREATE TABLE manent_workflows (
  id TEXT PRIMARY KEY, name TEXT NOT NULL, status TEXT NOT NULL, queue_name TEXT NOT NULL,
  partition_key TEXT NOT NULL DEFAULT '', priority BIGINT NOT NULL DEFAULT 0, not_before BIGINT NOT NULL DEFAULT 0,
  dedup_key TEXT, executor_id TEXT, input TEXT NOT NULL, output TEXT, error TEXT, parent_id TEXT,
  attempts BIGINT NOT NULL DEFAULT 0, generation BIGINT NOT NULL DEFAULT 0, created_at BIGINT NOT NULL,
  created_seq BIGINT NOT NULL, updated_at BIGINT NOT NULL, started_at BIGINT, finished_at BIGINT, limit_group TEXT);
CREATE INDEX manent_workflows_running ON manent_workflows (queue_name, executor_id, partition_key) WHERE status = 'PENDING';
CREATE INDEX manent_workflows_partition ON manent_workflows (partition_key, created_seq);
CREATE INDEX manent_workflows_executor ON manent_workflows (executor_id, status);
CREATE INDEX manent_workflows_claimable ON manent_workflows (queue_name, priority, created_seq, id) WHERE status = 'ENQUEUED';
CREATE INDEX manent_workflows_scheduled ON manent_workflows (queue_name, not_before) WHERE status = 'ENQUEUED';
CREATE INDEX manent_workflows_group_running ON manent_workflows (limit_group, executor_id, partition_key) WHERE status = 'PENDING';
-- :n queued workflows over 5,000 partitions (i % 5000), then 40 of them running.
INSERT INTO manent_workflows (id, name, status, queue_name, partition_key, input, created_at, created_seq, updated_at)
SELECT 'wf-' || i, 'bench', 'ENQUEUED', 'bench', 'p' || (i % 5000), '{}', 0, i, 0 FROM generate_series(1, :n) AS i;
UPDATE manent_workflows SET status = 'PENDING', executor_id = 'w1', limit_group = 'g' WHERE created_seq <= 40;
ANALYZE manent_workflows;
\echo ==== counts of running work (queue and group)
EXPLAIN (ANALYZE, COSTS OFF, TIMING ON) SELECT 0, executor_id, partition_key, COUNT(*) FROM manent_workflows
 WHERE queue_name = 'bench' AND status = 'PENDING' GROUP BY executor_id, partition_key
 UNION ALL SELECT 1, executor_id, partition_key, COUNT(*) FROM manent_workflows
 WHERE limit_group = 'g' AND status = 'PENDING' GROUP BY executor_id, partition_key;
\echo ==== next claimable workflows (new claim: index scan, full partitions left out)
EXPLAIN (ANALYZE, COSTS OFF, TIMING ON) SELECT id, partition_key, priority, created_seq FROM manent_workflows
 WHERE queue_name = 'bench' AND status = 'ENQUEUED' AND not_before <= 9999999999999
 AND partition_key NOT IN ('p1','p2','p3','p4','p5','p6','p7','p8','p9','p10','p11','p12','p13','p14','p15','p16','p17','p18','p19','p20','p21','p22','p23','p24','p25','p26','p27','p28','p29','p30','p31','p32','p33','p34','p35','p36','p37','p38','p39','p40')
 ORDER BY priority, created_seq, id LIMIT 20;
\echo ==== old claim: ROW_NUMBER over every ENQUEUED row
EXPLAIN (ANALYZE, COSTS OFF, TIMING ON) WITH running AS (
  SELECT partition_key, COUNT(*) AS n FROM manent_workflows WHERE queue_name = 'bench' AND status = 'PENDING' GROUP BY partition_key),
 ranked AS (SELECT id, partition_key, priority, created_seq,
   ROW_NUMBER() OVER (PARTITION BY partition_key ORDER BY priority, created_seq, id) AS rn
   FROM manent_workflows WHERE queue_name = 'bench' AND status = 'ENQUEUED' AND not_before <= 9999999999999)
 SELECT r.id FROM ranked r LEFT JOIN running c ON c.partition_key = r.partition_key
 WHERE r.rn + COALESCE(c.n, 0) <= 1 ORDER BY r.priority, r.created_seq, r.id LIMIT 10;
\echo ==== earliest scheduled workflow
EXPLAIN (ANALYZE, COSTS OFF, TIMING ON) SELECT MIN(not_before) FROM manent_workflows WHERE queue_name = 'bench' AND status = 'ENQUEUED' AND not_before > 1000;
\c postgres
DROP DATABASE limits_explain;
