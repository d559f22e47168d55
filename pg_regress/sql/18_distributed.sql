\set VERBOSITY terse
-- create_event_table's distribute_by (API.md section 10). This database has no Citus: every
-- distribution is refused, with 22023 for what is no distribution column whatever is installed
-- and 0A000 for the missing extension, and nothing is made.
SELECT try($$SELECT eventview.create_event_table('dist_events', distribute_by => 'event_id')$$);
-- Folded as PostgreSQL folds a column name: the same refusal.
SELECT try($$SELECT eventview.create_event_table('dist_events', distribute_by => 'EVENT_KEY')$$);
SELECT try($$SELECT eventview.create_event_table('dist_events', distribute_by => '"occurred_at"')$$);
-- No distribution column: the payload, a payload field, a quoted name of other case, two names.
SELECT try($$SELECT eventview.create_event_table('dist_events', distribute_by => 'payload')$$);
SELECT try($$SELECT eventview.create_event_table('dist_events', distribute_by => 'sku')$$);
SELECT try($$SELECT eventview.create_event_table('dist_events', distribute_by => '"Event_Id"')$$);
SELECT try($$SELECT eventview.create_event_table('dist_events', distribute_by => 'dist_events.event_id')$$);
SELECT try($$SELECT eventview.create_event_table('dist_events', distribute_by => '')$$);
-- The other arguments are checked first, as for any event table.
SELECT try($$SELECT eventview.create_event_table('dist_events', retention => '-1 day', distribute_by => 'event_id')$$);
SELECT try($$SELECT eventview.create_event_table('dist_events', partition_interval => '1 month', distribute_by => 'event_id')$$);
SELECT to_regclass('dist_events') IS NULL AS nothing_made,
       NOT EXISTS (SELECT 1 FROM eventview._sources WHERE relid::text = 'dist_events') AS nothing_registered;
-- NULL is the default: an event table on this node.
SELECT eventview.create_event_table('dist_events', distribute_by => NULL);
SELECT name FROM eventview.event_tables WHERE name = 'dist_events'::regclass;
SELECT eventview.drop_event_table('dist_events');
