-- The public SQL surface of pg_eventview (the contract in API.md). Each function is a thin,
-- SECURITY INVOKER wrapper: it runs with the caller's rights and resolves names through the
-- caller's search_path, and gives the exact argument names, defaults and result types.

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

CREATE FUNCTION eventview.register_event_table(
    name            text,
    retention       interval DEFAULT NULL,
    delta_retention interval DEFAULT '7 days'
) RETURNS regclass
LANGUAGE sql VOLATILE
AS $$ SELECT eventview._register_event_table(name, retention, delta_retention)::regclass $$;
COMMENT ON FUNCTION eventview.register_event_table(text, interval, interval) IS
'Adopts an existing table with the pg_eventview envelope as an event table and starts capturing its changes';

CREATE FUNCTION eventview.drop_event_table(name text, cascade boolean DEFAULT false) RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT eventview._drop_event_table(name, coalesce(cascade, false)) $$;
COMMENT ON FUNCTION eventview.drop_event_table(text, boolean) IS
'Drops an event table and its changelog; refuses while views read it, unless cascade';

CREATE FUNCTION eventview.define_field(
    source     text,
    field      text,
    path       text,
    event_type text    DEFAULT NULL,
    version    integer DEFAULT NULL,
    type       text    DEFAULT 'text'
) RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT eventview._define_field(source, field, path, event_type, version, coalesce(type, 'text')) $$;
COMMENT ON FUNCTION eventview.define_field(text, text, text, text, integer, text) IS
'Declares where a logical field is in the payload, per event type and version (most specific wins)';

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

CREATE FUNCTION eventview.refresh(name text) RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT eventview._refresh(name) $$;
COMMENT ON FUNCTION eventview.refresh(text) IS
'Applies the pending changes of one view exactly once; returns the number of changed event rows consumed';

CREATE FUNCTION eventview.refresh_all() RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v record;
    total bigint := 0;
BEGIN
    -- The caller's views (those over event tables distributed by Citus too), each in its own
    -- subtransaction: one that fails (its owner may no longer read the table, its type policy
    -- is 'fail') keeps its error in last_error, applies nothing, and the others go on.
    FOR v IN
        SELECT w.view_id, false AS distributed, format('%I.%I', n.nspname, c.relname) AS name
        FROM eventview._views w
        JOIN pg_class c ON c.oid = w.relid::oid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE pg_has_role(w.owner::oid, 'MEMBER')
        UNION ALL
        SELECT d.view_id, true, format('%I.%I', n.nspname, c.relname)
        FROM eventview._distributed_views d
        JOIN pg_class c ON c.oid = d.relid::oid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE pg_has_role(d.owner::oid, 'MEMBER')
        ORDER BY 2, 1
    LOOP
        BEGIN
            total := total + eventview._refresh(v.name);
        EXCEPTION WHEN undefined_table THEN
            -- Dropped or renamed since the list was read: not a failure of the view.
            NULL;
        WHEN others THEN
            IF v.distributed THEN
                UPDATE eventview._distributed_views SET last_error = SQLERRM WHERE view_id = v.view_id;
            ELSE
                UPDATE eventview._views SET last_error = SQLERRM WHERE view_id = v.view_id;
            END IF;
            RAISE WARNING 'refresh of view % failed: %', v.name, SQLERRM;
        END;
    END LOOP;
    -- Then the field observers of the caller's tables (those its views read were observed by
    -- their refreshes and have nothing left). Last: each refresh takes its view's row before its
    -- event table, as drop_event_table does; observing every table first held them all while
    -- waiting for view rows, a deadlock with drop_event_table.
    PERFORM eventview._observe_all();
    RETURN total;
END
$$;
COMMENT ON FUNCTION eventview.refresh_all() IS 'Refreshes every view of the caller; returns the sum of refresh(); a view that fails keeps its error in last_error and the others go on';

CREATE FUNCTION eventview.rebuild(
    name      text,
    from_time timestamptz DEFAULT NULL,
    to_time   timestamptz DEFAULT NULL
) RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT eventview._rebuild(name, from_time, to_time) $$;
COMMENT ON FUNCTION eventview.rebuild(text, timestamptz, timestamptz) IS
'Recomputes the buckets in [from_time, to_time) (or the whole view) from the raw events; returns groups written';

CREATE FUNCTION eventview.drop_view(name text) RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT eventview._drop_view(name) $$;
COMMENT ON FUNCTION eventview.drop_view(text) IS 'Drops an incremental view and its storage';

CREATE FUNCTION eventview.alter_view(
    name          text,
    realtime      boolean DEFAULT NULL,
    on_type_error text    DEFAULT NULL
) RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT eventview._alter_view(name, realtime, on_type_error) $$;
COMMENT ON FUNCTION eventview.alter_view(text, boolean, text) IS
'Changes a view''s settings in place; NULL leaves a setting as it is';


CREATE FUNCTION eventview.jsonpath_first(doc jsonb, path text) RETURNS jsonb
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT eventview._jsonpath_first(doc::text, path) $$;
COMMENT ON FUNCTION eventview.jsonpath_first(jsonb, text) IS
'First value an RFC 9535 JSONPath selects in doc, in document order (NULL when none), as views evaluate rich paths';

-- Row estimate of the refresh's set-returning function (see
-- eventview_core::batch::touched_rows): a batch has few runs of ids; with the default estimate
-- of 1000 rows every hash aggregate above it would allocate and scan tables sized for millions
-- of groups.
ALTER FUNCTION eventview._id_runs(bigint[]) ROWS 10;

-- The field observer's payload walk (see eventview_core::observe_sql): one transition call per
-- event, the counts as JSON at the end. READ_WRITE: the final function takes the state.
CREATE AGGREGATE eventview._shapes_agg(text, integer, anyelement) (
    SFUNC = eventview._shapes_step,
    STYPE = internal,
    FINALFUNC = eventview._shapes_final,
    FINALFUNC_MODIFY = READ_WRITE
);

-- The refresh pass in Rust (see eventview_core::group_deltas): one transition call per signed
-- event row of a batch; its value is a token under which eventview._group_delta_rows reads the
-- result, in parts, in the same statement (or, for the pass a field observer runs for a view, in
-- that view's apply after it). READ_WRITE: the final function takes the state.
CREATE AGGREGATE eventview._group_deltas(text, interval, integer, bigint, text, integer, text,
                                         timestamptz, anyelement) (
    SFUNC = eventview._group_deltas_step,
    STYPE = internal,
    FINALFUNC = eventview._group_deltas_final,
    FINALFUNC_MODIFY = READ_WRITE
);

-- The rows of one part of the refresh pass's result (crate::pg::group_deltas), in the columns
-- of the call's column definition list.
CREATE FUNCTION eventview._group_delta_rows(token bytea, part integer) RETURNS SETOF record
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'group_delta_rows';

-- The sum of sketches of approx_percentile (eventview_core::sketch): a rollup adds up the sketch
-- changes of the source groups that make one of its groups.
CREATE AGGREGATE eventview._sketch_sum(bigint[]) (
    SFUNC = eventview._sketch_merge,
    STYPE = bigint[],
    COMBINEFUNC = eventview._sketch_merge,
    PARALLEL = SAFE
);

-- Called by eventview._follow_drop (as the extension owner) for an event table a plain DROP
-- TABLE took; nobody else.
REVOKE EXECUTE ON FUNCTION eventview._forget_source(integer) FROM PUBLIC;
-- Called by eventview._follow_drop (as the extension owner) after a DROP took a view's
-- relation; nobody else.
REVOKE EXECUTE ON FUNCTION eventview._forget_view(integer) FROM PUBLIC;
-- Called by eventview._follow_ddl (as the extension owner) for a view given to another role;
-- nobody else.
REVOKE EXECUTE ON FUNCTION eventview._follow_view_owner(integer) FROM PUBLIC;
-- Called by eventview._pending (as the extension owner); nobody else.
REVOKE EXECUTE ON FUNCTION eventview._changelog_free(integer) FROM PUBLIC;
-- Called by the event trigger eventview_follow_partitions (as the extension owner); nobody else.
REVOKE EXECUTE ON FUNCTION eventview._follow_partition_tree(integer) FROM PUBLIC;
-- Run on every shard's node by the coordinator's queries over a shard registry (src/citus.rs).
REVOKE EXECUTE ON FUNCTION eventview._attach_shard_capture(text, json, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._attach_shard_view(text, text, json, integer, text, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._refresh_shard_view(text, text, json, integer, text, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._detach_shard_view(text, json) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._shard_quarantine(text, text, json, json) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._shard_pending_groups(text, text, json, integer, text, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._maintain_shard(text, json, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._shard_view_stats(text, json) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._shard_observed(text, json) FROM PUBLIC;
-- Called by eventview._follow_drop (as the extension owner); nobody else.
REVOKE EXECUTE ON FUNCTION eventview._forget_distributed(oid) FROM PUBLIC;

-- The monitoring views (API.md section 5), made last: their rows of distributed event tables
-- and views come from functions of the library (src/citus.rs).
CREATE VIEW eventview.views AS
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

CREATE VIEW eventview.observed_fields AS
SELECT s.relid AS source, o.event_type, o.event_version, o.path, o.json_type,
       o.first_seen, o.last_seen, o.seen
FROM eventview._observed o JOIN eventview._sources s USING (source_id)
UNION ALL
-- Event tables distributed by Citus: every shard's observations, added up.
SELECT d.relid, o.event_type, o.event_version, o.path, o.json_type,
       min(o.first_seen), max(o.last_seen), sum(o.seen)::bigint
FROM eventview._distributed_sources d
CROSS JOIN LATERAL pg_catalog.json_to_recordset(eventview._distributed_observed(d.relid::oid))
     AS o(event_type text, event_version integer, path text, json_type text,
          first_seen timestamptz, last_seen timestamptz, seen bigint)
GROUP BY d.relid, o.event_type, o.event_version, o.path, o.json_type;
COMMENT ON VIEW eventview.observed_fields IS 'pg_eventview: payload paths and JSON types seen, per event type and version';
GRANT SELECT ON eventview.views, eventview.observed_fields TO PUBLIC;
