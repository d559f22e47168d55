-- pg_eventview 0.19.0 -> 0.20.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.20.0'" to load this file. \quit
-- A DROP SCHEMA ... CASCADE or DROP OWNED that takes a partition of an event table along while
-- the table stays is checked as a DROP TABLE of that partition is (partitions::before_removal).
DROP EVENT TRIGGER eventview_before_partition_removal;
CREATE EVENT TRIGGER eventview_before_partition_removal ON ddl_command_start
    WHEN TAG IN ('DROP TABLE', 'ALTER TABLE', 'DROP SCHEMA', 'DROP OWNED')
    EXECUTE FUNCTION eventview._before_partition_removal();

-- create_view takes time_zone (buckets in local wall-clock time) and unnest (API.md section 8);
-- _create_view passes them on. The definition of eventview.views shows both.
DROP FUNCTION eventview.create_view(text, text, json, json, text[], interval, json, boolean, text);
DROP FUNCTION eventview._create_view(text, text, text, text, text[], interval, text, boolean, text);
CREATE FUNCTION eventview._create_view(
	"name" TEXT,
	"source" TEXT,
	"group_by" TEXT,
	"measures" TEXT,
	"event_types" TEXT[],
	"time_bucket" interval,
	"filter" TEXT,
	"realtime" bool,
	"on_type_error" TEXT,
	"time_zone" TEXT,
	"unnest" TEXT
) RETURNS oid
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'create_view_wrapper';
CREATE FUNCTION eventview.create_view(
    name          text,
    source        text,
    group_by      json     DEFAULT '{}',
    measures      json     DEFAULT '{"events": "count(*)"}',
    event_types   text[]   DEFAULT NULL,
    time_bucket   interval DEFAULT NULL,
    filter        json     DEFAULT NULL,
    realtime      boolean  DEFAULT false,
    on_type_error text     DEFAULT 'quarantine',
    time_zone     text     DEFAULT NULL,
    unnest        text     DEFAULT NULL
) RETURNS regclass
LANGUAGE sql VOLATILE
AS $$
    SELECT eventview._create_view(name, source, coalesce(group_by, '{}')::text,
                                  coalesce(measures, '{"events": "count(*)"}')::text, event_types,
                                  time_bucket, filter::text, coalesce(realtime, false),
                                  coalesce(on_type_error, 'quarantine'), time_zone, unnest)::regclass
$$;
COMMENT ON FUNCTION eventview.create_view(text, text, json, json, text[], interval, json, boolean, text, text, text) IS
'Creates an incremental aggregate view over an event table and populates it';

CREATE OR REPLACE VIEW eventview.views AS
SELECT v.relid                                  AS name,
       s.relid                                  AS source,
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
CROSS JOIN LATERAL eventview._pending(v.view_id) p;
