-- pg_eventview 0.21.0 -> 0.22.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.22.0'" to load this file. \quit
-- Event tables distributed by Citus (API.md section 10).

ALTER TABLE eventview._views ADD COLUMN data_relation regclass;

CREATE TABLE eventview._distributed_sources (
    relid         regclass PRIMARY KEY,
    distribute_by text NOT NULL,
    shards        regclass NOT NULL
);
COMMENT ON TABLE eventview._distributed_sources IS 'pg_eventview: event tables distributed by Citus';
CREATE TABLE eventview._distributed_views (
    view_id   integer PRIMARY KEY,
    relid     regclass NOT NULL UNIQUE,
    source    regclass NOT NULL REFERENCES eventview._distributed_sources,
    groups    regclass NOT NULL,
    arguments json NOT NULL,
    owner     regrole NOT NULL DEFAULT current_user::regrole
);
COMMENT ON TABLE eventview._distributed_views IS 'pg_eventview: views over event tables distributed by Citus';
GRANT SELECT ON eventview._distributed_sources, eventview._distributed_views TO PUBLIC;

CREATE FUNCTION eventview._create_distributed_event_table(name text, retention interval, delta_retention interval, partition_interval interval, distribute_by text) RETURNS oid
LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'create_distributed_event_table_wrapper';
CREATE FUNCTION eventview._attach_shard_capture(registry_shard text, shards json, delta_retention interval) RETURNS integer
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'attach_shard_capture_wrapper';
CREATE FUNCTION eventview._attach_shard_view(registry_shard text, value text, shards json, view_id integer, arguments text) RETURNS integer
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'attach_shard_view_wrapper';
CREATE FUNCTION eventview._refresh_shard_view(registry_shard text, shards json) RETURNS bigint
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'refresh_shard_view_wrapper';
CREATE FUNCTION eventview._detach_shard_view(registry_shard text, shards json) RETURNS integer
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'detach_shard_view_wrapper';
-- Run on every shard's node by the coordinator's queries over a shard registry (src/citus.rs).
REVOKE EXECUTE ON FUNCTION eventview._attach_shard_capture(text, json, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._attach_shard_view(text, text, json, integer, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._refresh_shard_view(text, json) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._detach_shard_view(text, json) FROM PUBLIC;

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
