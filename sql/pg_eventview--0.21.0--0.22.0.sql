-- pg_eventview 0.21.0 -> 0.22.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.22.0'" to load this file. \quit
-- create_event_table's distribute_by (API.md section 10).

CREATE FUNCTION eventview._create_distributed_event_table(name text, retention interval, delta_retention interval, partition_interval interval, distribute_by text) RETURNS oid
LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'create_distributed_event_table_wrapper';

DROP FUNCTION eventview.create_event_table(text, interval, interval, interval);
CREATE FUNCTION eventview.create_event_table(
    name               text,
    retention          interval DEFAULT NULL,
    delta_retention    interval DEFAULT '7 days',
    partition_interval interval DEFAULT NULL,
    distribute_by      text DEFAULT NULL
) RETURNS regclass
LANGUAGE sql VOLATILE
AS $$ SELECT (CASE WHEN distribute_by IS NOT NULL
                   THEN eventview._create_distributed_event_table(name, retention, delta_retention, partition_interval, distribute_by)
                   WHEN partition_interval IS NULL
                   THEN eventview._create_event_table(name, retention, delta_retention)
                   ELSE eventview._create_partitioned_event_table(name, retention, delta_retention, partition_interval)
              END)::regclass $$;
COMMENT ON FUNCTION eventview.create_event_table(text, interval, interval, interval, text) IS
'Creates an event table with the pg_eventview envelope (partitioned by occurred_at with a partition_interval) and starts capturing its changes';
