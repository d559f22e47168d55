-- pg_eventview 0.24.0 -> 0.25.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.25.0'" to load this file. \quit
-- Realtime views over event tables distributed by Citus.

ALTER TABLE eventview._distributed_views ADD COLUMN realtime boolean NOT NULL DEFAULT false;

-- A shard's node answers the groups its view's pending changes touch; the coordinator merges
-- them across shards for a realtime read (src/citus/realtime.rs).
CREATE FUNCTION eventview._shard_pending_groups(registry_shard text, value text, shards json, view_id integer, arguments text, delta_retention interval) RETURNS text
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'shard_pending_groups_wrapper';
REVOKE EXECUTE ON FUNCTION eventview._shard_pending_groups(text, text, json, integer, text, interval) FROM PUBLIC;
CREATE FUNCTION eventview._distributed_realtime(view_id integer) RETURNS text
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'distributed_realtime_wrapper';

-- eventview.views shows whether a distributed view is realtime.
CREATE OR REPLACE VIEW eventview.views AS
SELECT v.relid                                  AS name,
       coalesce((SELECT r.relid FROM eventview._views r WHERE r.view_id = v.source_view), s.relid) AS source,
       -- With the type policy as it is now (alter_view changes it).
       pg_catalog.json_build_object('group_by', v.definition -> 'group_by', 'measures', v.definition -> 'measures',
                                    'event_types', v.definition -> 'event_types', 'time_bucket', v.definition -> 'time_bucket',
                                    'time_zone', v.definition -> 'time_zone', 'unnest', v.definition -> 'unnest',
                                    'filter', v.definition -> 'filter', 'on_type_error', v.on_type_error) AS definition,
       v.realtime,
       v.schedule,
       v.last_refresh_at,
       v.last_refresh_ms,
       p.changes                                AS pending_changes,
       CASE WHEN p.changes IS NULL THEN NULL
            WHEN p.oldest IS NULL THEN interval '0'
            ELSE greatest(now() - p.oldest, interval '0') END AS lag,
       eventview._group_count(v.view_id)        AS groups,
       eventview._quarantined(v.view_id)        AS quarantined,
       v.skipped,
       coalesce(eventview._refresh_problem(v.view_id), v.last_error, v.rebuild_note) AS last_error
FROM eventview._views v
JOIN eventview._sources s USING (source_id)
CROSS JOIN LATERAL eventview._pending(v.view_id) p
UNION ALL
-- Views over event tables distributed by Citus: their figures over every shard's view.
SELECT d.relid,
       d.source,
       pg_catalog.json_build_object('group_by', d.arguments -> 'group_by', 'measures', d.arguments -> 'measures',
                                    'event_types', d.arguments -> 'event_types', 'time_bucket', d.arguments -> 'time_bucket',
                                    'time_zone', d.arguments -> 'time_zone', 'unnest', d.arguments -> 'unnest',
                                    'filter', d.arguments -> 'filter', 'on_type_error', d.arguments -> 'on_type_error'),
       d.realtime,
       d.schedule,
       d.last_refresh_at,
       NULL::double precision,
       (f.figures ->> 'pending_changes')::bigint,
       (f.figures ->> 'lag')::interval,
       (f.figures ->> 'groups')::bigint,
       (f.figures ->> 'quarantined')::bigint,
       (f.figures ->> 'skipped')::bigint,
       d.last_error
FROM eventview._distributed_views d
CROSS JOIN LATERAL eventview._distributed_view_stats(d.view_id) AS f(figures);
COMMENT ON VIEW eventview.views IS 'pg_eventview: incremental views, their freshness and counters';
