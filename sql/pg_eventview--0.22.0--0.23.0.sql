-- pg_eventview 0.22.0 -> 0.23.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.23.0'" to load this file. \quit
-- Views over event tables distributed by Citus follow shard moves, splits and rebalancing.

-- The delta retention a shard that Citus moved or split onto a node is registered there with.
-- (Tables distributed by 0.22.0 kept it only on each shard's node: theirs is the default.)
ALTER TABLE eventview._distributed_sources
    ADD COLUMN delta_retention interval NOT NULL DEFAULT '7 days';

-- Every per-shard call on a view or a shard carries what its node needs to register a shard
-- that arrived there since, and to make that shard's view.
DROP FUNCTION eventview._attach_shard_view(text, text, json, integer, text);
DROP FUNCTION eventview._refresh_shard_view(text, json);
DROP FUNCTION eventview._maintain_shard(text, json);
CREATE FUNCTION eventview._attach_shard_view(registry_shard text, value text, shards json, view_id integer, arguments text, delta_retention interval) RETURNS text
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'attach_shard_view_wrapper';
CREATE FUNCTION eventview._refresh_shard_view(registry_shard text, value text, shards json, view_id integer, arguments text, delta_retention interval) RETURNS text
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'refresh_shard_view_wrapper';
CREATE FUNCTION eventview._maintain_shard(registry_shard text, shards json, delta_retention interval) RETURNS text
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'maintain_shard_wrapper';
REVOKE EXECUTE ON FUNCTION eventview._attach_shard_view(text, text, json, integer, text, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._refresh_shard_view(text, text, json, integer, text, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._maintain_shard(text, json, interval) FROM PUBLIC;

-- eventview.views and eventview.observed_fields show distributed views and event tables, with
-- figures that every shard's node reads (src/citus.rs).
CREATE FUNCTION eventview._distributed_view_stats(view_id integer) RETURNS json
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'distributed_view_stats_wrapper';
CREATE FUNCTION eventview._shard_view_stats(registry_shard text, shards json) RETURNS text
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'shard_view_stats_wrapper';
CREATE FUNCTION eventview._distributed_observed(relid oid) RETURNS json
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'distributed_observed_wrapper';
CREATE FUNCTION eventview._shard_observed(registry_shard text, shards json) RETURNS text
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'shard_observed_wrapper';
REVOKE EXECUTE ON FUNCTION eventview._shard_view_stats(text, json) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._shard_observed(text, json) FROM PUBLIC;
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
       false,
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

CREATE OR REPLACE VIEW eventview.observed_fields AS
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

-- run_maintenance maintains each distributed event table on its own: one that fails (a shard
-- it cannot reach) does not hold back the others.
DROP FUNCTION eventview._maintain_distributed();
CREATE FUNCTION eventview._maintain_distributed(relid oid) RETURNS bigint
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'maintain_distributed_wrapper';
CREATE OR REPLACE FUNCTION eventview.run_maintenance() RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v record;
    v_skipped boolean;
    t record;
BEGIN
    -- Partitions ahead of time, for each partitioned event table of the caller's roles (as
    -- prune), before the refreshes: a table that cannot get its partitions made (a lock wait
    -- past lock_timeout, say) takes its events in its default partition meanwhile.
    FOR t IN
        SELECT s.source_id, s.relid FROM eventview._sources s
        WHERE s.partition_interval IS NOT NULL
          AND pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = s.relid::oid), 'MEMBER')
        ORDER BY s.source_id
    LOOP
        BEGIN
            PERFORM eventview._make_partitions(t.source_id);
        EXCEPTION WHEN others THEN
            RAISE WARNING 'pg_eventview: making partitions of % failed: %', t.relid, SQLERRM;
        END;
    END LOOP;
    FOR v IN
        SELECT view_id, relid, schedule, failures FROM eventview._views
        WHERE schedule IS NOT NULL
          AND (last_refresh_at IS NULL OR clock_timestamp() - last_refresh_at >= schedule)
          AND (retry_at IS NULL OR retry_at <= clock_timestamp())
        ORDER BY coalesce(last_refresh_at, '-infinity'), view_id
    LOOP
        BEGIN
            PERFORM 1 FROM eventview._views WHERE view_id = v.view_id FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                SELECT eventview._refresh_unless_locked(format('%I.%I', n.nspname, c.relname)) IS NULL INTO v_skipped
                FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE c.oid = v.relid;
                IF v_skipped THEN
                    UPDATE eventview._views w
                    SET last_error = format('scheduled refresh skipped: event table %s was locked by another session',
                                            (SELECT s.relid::regclass FROM eventview._sources s WHERE s.source_id = w.source_id))
                    WHERE w.view_id = v.view_id AND w.failures = 0;
                END IF;
            END IF;
        EXCEPTION WHEN others THEN
            -- (The failed refresh let go of the view's row: a manual refresh may hold it now.
            -- Under a lock_timeout, a wait for it that times out skips the record, not the run.)
            BEGIN
                UPDATE eventview._views
                SET last_error = SQLERRM,
                    failures = least(greatest(v.failures, 0), 1000000000) + 1,
                    retry_at = CASE WHEN v.schedule >= interval '100 years' THEN 'infinity'::timestamptz
                                    ELSE clock_timestamp()
                                         + CASE WHEN v.schedule >= interval '1 hour' THEN v.schedule
                                                ELSE least(v.schedule * power(2, least(greatest(v.failures, 0), 20)),
                                                           interval '1 hour') END
                               END
                WHERE view_id = v.view_id;
            EXCEPTION WHEN lock_not_available THEN
                RAISE WARNING 'pg_eventview: refresh of view % failed and could not be recorded: %', v.relid, SQLERRM;
            END;
        END;
    END LOOP;
    -- Views over event tables distributed by Citus of the caller's roles, whose schedule is due
    -- (each shard's view refreshed on its node, see src/citus.rs).
    FOR v IN
        SELECT d.view_id, d.relid FROM eventview._distributed_views d
        WHERE d.schedule IS NOT NULL
          AND (d.last_refresh_at IS NULL OR clock_timestamp() - d.last_refresh_at >= d.schedule)
          AND pg_catalog.pg_has_role(d.owner::oid, 'MEMBER')
        ORDER BY coalesce(d.last_refresh_at, '-infinity'), d.view_id
    LOOP
        BEGIN
            PERFORM eventview._refresh(format('%I.%I', n.nspname, c.relname))
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE c.oid = v.relid;
        EXCEPTION WHEN others THEN
            UPDATE eventview._distributed_views SET last_error = SQLERRM WHERE view_id = v.view_id;
            RAISE WARNING 'pg_eventview: refresh of view % failed: %', v.relid, SQLERRM;
        END;
    END LOOP;
    -- View owners' changelog rights follow their rights on the tables, also where a change of
    -- role membership changed those (no event trigger sees that).
    BEGIN
        PERFORM eventview._sync_changelog_readers();
    EXCEPTION WHEN others THEN
        RAISE WARNING 'pg_eventview: syncing changelog rights failed: %', SQLERRM;
    END;
    -- Every table's field observer moves on, also where no view was due (or exists): it is a
    -- consumer of the changelog, and prune waits for every consumer.
    BEGIN
        PERFORM eventview._observe_all();
    EXCEPTION WHEN others THEN
        RAISE WARNING 'pg_eventview: observing fields failed: %', SQLERRM;
    END;
    -- A failed prune (a lock wait past lock_timeout, say) must not take back the refreshes.
    BEGIN
        PERFORM eventview.prune();
    EXCEPTION WHEN others THEN
        RAISE WARNING 'pg_eventview: pruning failed: %', SQLERRM;
    END;
    -- The shards of event tables distributed by Citus of the caller's roles: observed and
    -- pruned on their nodes, each table on its own (one that fails does not hold back the
    -- others).
    FOR t IN
        SELECT d.relid FROM eventview._distributed_sources d
        WHERE pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = d.relid::oid), 'MEMBER')
        ORDER BY d.relid::oid
    LOOP
        BEGIN
            PERFORM eventview._maintain_distributed(t.relid::oid);
        EXCEPTION WHEN others THEN
            RAISE WARNING 'pg_eventview: maintaining distributed event table % failed: %', t.relid, SQLERRM;
        END;
    END LOOP;
EXCEPTION WHEN undefined_table OR undefined_function OR invalid_schema_name THEN
    -- A DROP EXTENSION pg_eventview that committed while this run went on (waiting for a lock it
    -- held, say) leaves nothing to maintain: the run ends quietly, as the next one would find no
    -- extension (the background worker must not fail over it).
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'pg_eventview') THEN
        RAISE;
    END IF;
END
$$;

-- The owners of views over distributed event tables schedule them and record their refreshes'
-- errors (refresh_all, run_maintenance), as for any view.
GRANT UPDATE (schedule, last_error) ON eventview._distributed_views TO PUBLIC;
ALTER TABLE eventview._distributed_views ENABLE ROW LEVEL SECURITY;
CREATE POLICY everyone_reads ON eventview._distributed_views FOR SELECT USING (true);
CREATE POLICY owners_update ON eventview._distributed_views FOR UPDATE
    USING (pg_catalog.pg_has_role(owner::oid, 'MEMBER'));
