\set VERBOSITY terse
-- Partitioned event tables (API.md section 7).
SET TimeZone = 'UTC';
SELECT eventview.create_event_table('pev', partition_interval => '1 month');
SELECT eventview.create_event_table('pev', partition_interval => '0 hours');
SELECT eventview.create_event_table('pev', partition_interval => '30 seconds');
SELECT to_regclass('pev') IS NULL AS nothing_made;
SELECT eventview.create_event_table('pev', retention => '90 days', partition_interval => '1 day');
-- The default partition, and the present day's with 4 after it.
SELECT count(*) FILTER (WHERE pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT') AS default_partitions,
       count(*) FILTER (WHERE c.relname ~ '^pev_p[0-9]{8}$') AS daily_partitions
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'pev'::regclass;
CREATE TABLE pev_jan PARTITION OF pev FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
SELECT eventview.create_view('pev_daily', 'pev', group_by => '{"sku": "$.sku"}',
                             measures => '{"n": "count(*)"}', time_bucket => '1 day');
INSERT INTO pev (event_key, event_type, occurred_at, payload) VALUES
  ('k1', 'order', '2026-01-05 10:00', '{"sku": "a"}'),
  ('k2', 'order', '1999-12-31 23:59', '{"sku": "b"}');
-- Keys are unique across partitions.
INSERT INTO pev (event_key, event_type, occurred_at, payload) VALUES ('k2', 'order', '2026-01-06', '{"sku": "c"}');
UPDATE pev SET event_key = 'k1' WHERE event_key = 'k2';
SELECT * FROM eventview.ingest('pev', '[{"type": "order", "key": "k1", "payload": {"sku": "d"}},
                                        {"type": "order", "key": "k3", "occurred_at": "2026-01-07T00:00:00Z", "payload": {"sku": "d"}}]');
SELECT tableoid::regclass AS partition, event_key, payload ->> 'sku' AS sku FROM pev ORDER BY event_key;
-- A partition with events the view has not applied is neither dropped nor detached.
DROP TABLE pev_jan;
ALTER TABLE pev DETACH PARTITION pev_jan;
-- Nor taken along by a DROP SCHEMA ... CASCADE (a partition kept in a schema of its own).
CREATE SCHEMA pev_old;
CREATE TABLE pev_old.pev_2025 PARTITION OF pev FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
INSERT INTO pev (event_key, event_type, occurred_at, payload) VALUES ('k4', 'order', '2025-06-01', '{"sku": "e"}');
DROP SCHEMA pev_old CASCADE;
SELECT eventview.refresh('pev_daily');
SELECT * FROM pev_daily ORDER BY bucket;
ALTER TABLE pev DETACH PARTITION pev_jan;
SELECT count(*) AS capture_triggers_left FROM pg_trigger WHERE tgrelid = 'pev_jan'::regclass;
DROP TABLE pev_jan;
DROP SCHEMA pev_old CASCADE;
SELECT * FROM pev_daily ORDER BY bucket;
SELECT eventview.drop_event_table('pev', cascade => true);
