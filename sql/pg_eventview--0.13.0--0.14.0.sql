-- pg_eventview 0.13.0 -> 0.14.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.14.0'" to load this file. \quit
-- Definitions marked "as in sql/..." are copies of that file's.

-- ingest: a caller without INSERT on the event table gets a message naming the table and the
-- grant (before: the statement's own "permission denied for table", unqualified, under the
-- whole statement as context); an envelope whose "type" is not a string says so (before:
-- "has no type"). As in sql/ingest.sql:
CREATE OR REPLACE FUNCTION eventview.ingest(source text, events jsonb)
RETURNS TABLE(inserted bigint, duplicates bigint, quarantined bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_table text := eventview._event_table_sql(source);
    -- pg_settings.setting is in bytes whatever unit the user wrote ('64kB').
    v_limit bigint := (SELECT setting::bigint FROM pg_catalog.pg_settings WHERE name = 'eventview.max_payload_bytes');
BEGIN
    IF source IS NULL OR events IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be NULL', CASE WHEN source IS NULL THEN 'source' ELSE 'events' END
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- Before the statement: its own "permission denied for table" names the table unqualified,
    -- under the whole statement as context. (The columns the statement inserts: a producer may
    -- have been granted INSERT on those only.)
    IF NOT (SELECT pg_catalog.bool_and(pg_catalog.has_column_privilege(v_table, c, 'INSERT'))
            FROM pg_catalog.unnest(ARRAY['event_key', 'event_type', 'event_version', 'producer',
                                         'occurred_at', 'payload']) c) THEN
        RAISE EXCEPTION 'permission denied to ingest into event table %: INSERT on it is needed', v_table::regclass
            USING ERRCODE = 'insufficient_privilege',
                  HINT = pg_catalog.format('Its owner, role %s, may grant it: GRANT INSERT ON %s TO %I.',
                                           (SELECT c.relowner::regrole FROM pg_catalog.pg_class c WHERE c.oid = v_table::regclass),
                                           v_table::regclass, current_user);
    END IF;
    IF jsonb_typeof(events) <> 'array' THEN
        RAISE EXCEPTION 'invalid events: expected a JSON array of envelopes, found %', jsonb_typeof(events)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass [{"type": ..., "payload": {...}}, ...].';
    END IF;
    RETURN QUERY EXECUTE format($sql$
        WITH checked AS (
            SELECT e AS envelope, ord, eventview._envelope_problem(e, $2) AS problem
            FROM jsonb_array_elements($1) WITH ORDINALITY AS t(e, ord)
        ),
        rejected AS (
            INSERT INTO eventview.quarantine (source, view_name, event_id, reason, event)
            SELECT %2$L::regclass, NULL, NULL, CASE problem
                WHEN 1 THEN 'envelope is a JSON ' || jsonb_typeof(envelope) || ', not an object'
                WHEN 2 THEN CASE WHEN NOT envelope ? 'type' THEN 'envelope has no "type" (a non-empty string)'
                                 WHEN jsonb_typeof(envelope->'type') = 'string' THEN '"type" is an empty string'
                                 ELSE 'bad "type": a JSON ' || jsonb_typeof(envelope->'type') || ', not a string' END
                WHEN 3 THEN 'bad "version": ' || left((envelope->'version')::text, 100) || ' is not an integer from 1 to 2147483647'
                WHEN 4 THEN 'bad "producer": a JSON ' || jsonb_typeof(envelope->'producer') || ', not a string'
                WHEN 5 THEN 'unparsable "occurred_at": ' || left((envelope->'occurred_at')::text, 100) || ' is not an RFC 3339 timestamp'
                WHEN 6 THEN CASE WHEN jsonb_typeof(envelope->'key') = 'string'
                                 THEN '"key" has ' || octet_length(envelope->>'key') || ' bytes, more than 2000'
                                 ELSE 'bad "key": a JSON ' || jsonb_typeof(envelope->'key') || ', not a string' END
                WHEN 7 THEN 'payload is ' || coalesce('a JSON ' || jsonb_typeof(envelope->'payload'), 'missing') || ', not a JSON object'
                WHEN 8 THEN 'payload has ' || octet_length((envelope->'payload')::text) || ' bytes, more than eventview.max_payload_bytes (' || $2 || ')'
            END, envelope
            FROM checked WHERE problem IS NOT NULL
            ORDER BY ord
        ),
        added AS (
            -- JSON null in version, producer, occurred_at or key means the default (->> gives
            -- NULL); occurred_at was checked to be RFC 3339, so its cast cannot fail.
            INSERT INTO %1$s (event_key, event_type, event_version, producer, occurred_at, payload)
            SELECT envelope->>'key', envelope->>'type',
                   coalesce((envelope->>'version')::numeric::integer, 1),
                   coalesce(envelope->>'producer', current_user),
                   coalesce((envelope->>'occurred_at')::timestamptz, now()),
                   envelope->'payload'
            FROM checked WHERE problem IS NULL
            -- In key order (bytewise), then envelope order. Two calls inserting the same keys
            -- wait for each other's uncommitted keys, so they must take keys in one order: in
            -- envelope order, batches of the same keys in opposite orders deadlocked. Within a
            -- key, the first occurrence goes in and the later ones are duplicates: DO NOTHING
            -- also skips a row that conflicts with one this statement inserted. (Event ids of
            -- keyed envelopes follow key order; envelopes without a key come last, in order.)
            ORDER BY envelope->>'key' COLLATE "C", ord
            ON CONFLICT (event_key) DO NOTHING
            RETURNING 1
        ),
        -- (Counted from the input: a producer may file rejects but not read them back.)
        refused AS (SELECT count(*) AS n FROM checked WHERE problem IS NOT NULL)
        SELECT (SELECT count(*) FROM added),
               jsonb_array_length($1) - (SELECT n FROM refused) - (SELECT count(*) FROM added),
               (SELECT n FROM refused)
    $sql$, v_table, v_table) USING events, v_limit;
END
$$;

-- prune: a refusal names the role that owns the table; pruning every table skips a changelog
-- another session holds locked instead of waiting for it. As in sql/maintenance.sql:
CREATE OR REPLACE FUNCTION eventview._prune(source regclass) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s record;
    n bigint;
    m bigint;
    done bigint;
    below xid8;
    lo_xid xid8;
    lo_seq bigint;
    hi_xid xid8;
    hi_seq bigint;
    oldest timestamptz;
    total bigint := 0;
    batch_size constant integer := 10000;
    -- (The setting exists once the library is loaded; the same default otherwise.)
    max_rows constant bigint := coalesce(nullif(pg_catalog.current_setting('eventview.prune_max_rows', true), ''), '200000')::bigint;
BEGIN
    IF source IS NOT NULL AND NOT pg_catalog.pg_has_role(
            (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = source::oid), 'MEMBER') THEN
        RAISE EXCEPTION 'permission denied to prune event table %: it belongs to role %', source,
                (SELECT c.relowner::regrole FROM pg_catalog.pg_class c WHERE c.oid = source::oid)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Only members of the table''s owner role (and superusers) may prune it.';
    END IF;
    FOR s IN
        SELECT src.source_id, src.relid, src.retention, src.delta_retention,
               eventview._event_table_sql(src.relid::text) AS table_sql
        FROM eventview._sources src
        WHERE (source IS NULL OR src.relid::oid = source::oid)
          AND pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = src.relid::oid), 'MEMBER')
        ORDER BY src.source_id
    LOOP
        -- A view being created on the table: next time.
        CONTINUE WHEN NOT eventview._lock_source_for_prune(s.source_id);
        -- Pruning every table (run_maintenance's): a changelog another session holds (a VACUUM
        -- FULL or LOCK TABLE of it) is left to a later run, not waited for up to the worker's
        -- lock_timeout at every run with every other table's pruning after it.
        IF source IS NULL THEN
            BEGIN
                EXECUTE format('LOCK TABLE eventview._changes_%s IN ROW EXCLUSIVE MODE NOWAIT', s.source_id);
            EXCEPTION WHEN lock_not_available THEN
                RAISE NOTICE 'pg_eventview: changelog of % not pruned: another session holds it locked', s.relid;
                CONTINUE;
            END;
        END IF;
        -- Walk the (xid, seq) index upwards in windows of batch_size records below the
        -- smallest xmax of the consumers: each window is found by an index scan that starts
        -- where the previous one ended, then its applied records older than delta_retention
        -- are deleted. Work is linear in the records walked, whatever the transaction sizes.
        done := 0;
        lo_xid := '0'::xid8;
        lo_seq := 0;
        EXECUTE 'SELECT min(pg_snapshot_xmax(s)) FROM (
                     SELECT applied_snapshot AS s FROM eventview._views WHERE source_id = $1
                     UNION ALL SELECT observed_snapshot FROM eventview._sources WHERE source_id = $1) k'
            INTO below USING s.source_id;
        LOOP
            EXECUTE format('SELECT count(*), (array_agg(xid ORDER BY xid DESC, seq DESC))[1],
                                   (array_agg(seq ORDER BY xid DESC, seq DESC))[1], min(logged_at)
                            FROM (SELECT xid, seq, logged_at FROM eventview._changes_%s
                                  WHERE (xid, seq) > ($1, $2) AND xid < $3
                                  ORDER BY xid, seq LIMIT $4) w', s.source_id)
                INTO n, hi_xid, hi_seq, oldest USING lo_xid, lo_seq, below, least(batch_size, max_rows - done);
            EXIT WHEN n = 0;
            EXECUTE format($q$
                WITH consumers AS (
                    SELECT applied_snapshot AS s, applied_own_xid AS own, applied_own_seq AS own_seq
                    FROM eventview._views WHERE source_id = $1
                    UNION ALL
                    SELECT observed_snapshot, observed_own_xid, observed_own_seq
                    FROM eventview._sources WHERE source_id = $1
                ),
                gone AS (
                    DELETE FROM eventview._changes_%s c
                    WHERE (c.xid, c.seq) > ($3, $4) AND (c.xid, c.seq) <= ($5, $6)
                      AND c.logged_at < now() - $2
                      AND NOT EXISTS (
                          SELECT 1 FROM consumers k
                          WHERE NOT (pg_visible_in_snapshot(c.xid, k.s)
                                     OR coalesce(c.xid = k.own AND c.seq <= k.own_seq, false)))
                    RETURNING 1
                )
                SELECT count(*) FROM gone
            $q$, s.source_id)
            INTO m USING s.source_id, s.delta_retention, lo_xid, lo_seq, hi_xid, hi_seq;
            done := done + m;
            lo_xid := hi_xid;
            lo_seq := hi_seq;
            -- Records come in (roughly) the order they were logged: once a whole window is
            -- younger than delta_retention, so is what follows.
            EXIT WHEN n < least(batch_size, max_rows - done + m) OR done >= max_rows
                      OR oldest >= now() - s.delta_retention;
        END LOOP;
        total := total + done;
        IF s.retention IS NOT NULL THEN
            -- As the table's owner (its triggers must not run with the maintainer's rights).
            -- Its triggers may also fail: when pruning every table, that one is skipped with a
            -- WARNING and the others (and the rest of run_maintenance) go on. Pruning every
            -- table (run_maintenance's, every naptime) leaves a table another session holds
            -- locked to a later run rather than wait for it (up to the worker's lock_timeout,
            -- at every run, holding up every view's refresh).
            BEGIN
                IF source IS NULL AND NOT eventview._lock_for_pruning_if_free(s.relid::oid) THEN
                    RAISE NOTICE 'pg_eventview: events of % not pruned: another session holds the table locked', s.relid;
                ELSE
                    PERFORM set_config('eventview.pruning', 'on', true);
                    total := total + eventview._prune_events(s.relid::oid, s.retention, max_rows);
                    PERFORM set_config('eventview.pruning', 'off', true);
                END IF;
            EXCEPTION WHEN others THEN
                IF source IS NOT NULL THEN
                    RAISE;
                END IF;
                RAISE WARNING 'pg_eventview: pruning the events of % failed: %', s.relid, SQLERRM;
            END;
        END IF;
    END LOOP;
    RETURN total;
END
$$;

-- The ingest gate's rejects can be deleted by the event table's owner (before: only a superuser
-- could). As in sql/bootstrap.sql:
CREATE POLICY table_owners_clear_rejects ON eventview.quarantine FOR DELETE
    USING (view_name IS NULL
           AND pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = source), 'MEMBER'));

-- eventview.views.definition shows the view's type policy too (on_type_error, which alter_view
-- changes); pending_changes and lag are NULL while another session holds the changelog locked.
-- As in sql/bootstrap.sql:
CREATE OR REPLACE VIEW eventview.views AS
SELECT v.relid                                  AS name,
       s.relid                                  AS source,
       -- With the type policy as it is now (alter_view changes it).
       pg_catalog.json_build_object('group_by', v.definition -> 'group_by', 'measures', v.definition -> 'measures',
                                    'event_types', v.definition -> 'event_types', 'time_bucket', v.definition -> 'time_bucket',
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
COMMENT ON VIEW eventview.views IS 'pg_eventview: incremental views, their freshness and counters';

-- Reading eventview.views or event_tables no longer waits for a session holding a changelog
-- locked (a VACUUM FULL or LOCK TABLE of it): its pending changes are NULL, unknown, meanwhile.
-- As generated by pgrx and in sql/api.sql:
CREATE  FUNCTION "_changelog_free"(
	"p_source_id" INT /* i32 */
) RETURNS bool /* Result < bool, ErrorReport > */
STRICT STABLE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'changelog_free_wrapper';
REVOKE EXECUTE ON FUNCTION eventview._changelog_free(integer) FROM PUBLIC;
-- As in sql/bootstrap.sql:
CREATE OR REPLACE FUNCTION eventview._pending(p_view_id integer, OUT changes bigint, OUT oldest timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_source integer;
    v_applied pg_snapshot;
    v_own xid8;
    v_own_seq bigint;
BEGIN
    SELECT source_id, applied_snapshot, applied_own_xid, applied_own_seq
    INTO v_source, v_applied, v_own, v_own_seq
    FROM eventview._views WHERE view_id = p_view_id;
    IF NOT FOUND OR to_regclass(format('eventview._changes_%s', v_source)) IS NULL THEN
        changes := 0;
        RETURN;
    END IF;
    -- Unknown (NULL) while another session holds the changelog: not a wait for every reader.
    IF NOT eventview._changelog_free(v_source) THEN
        RETURN;
    END IF;
    EXECUTE format(
        'SELECT coalesce(sum(CASE WHEN op = ''I'' THEN cardinality(event_ids) ELSE 1 END), 0)::bigint,
                min(logged_at)
         FROM eventview._changes_%s
         WHERE (xid >= pg_snapshot_xmin($1) OR xid = $2)
           AND NOT (pg_visible_in_snapshot(xid, $1) OR coalesce(xid = $2 AND seq <= $3, false))', v_source)
    INTO changes, oldest USING v_applied, v_own, v_own_seq;
END
$$;

CREATE OR REPLACE VIEW eventview.event_tables AS
SELECT s.relid AS name,
       s.retention,
       s.delta_retention,
       CASE WHEN bool_or(v.view_id IS NOT NULL AND p.changes IS NULL) THEN NULL
            ELSE coalesce(max(p.changes), 0) END::bigint AS pending_changes,
       min(p.oldest)                       AS oldest_pending
FROM eventview._sources s
LEFT JOIN eventview._views v USING (source_id)
LEFT JOIN LATERAL eventview._pending(v.view_id) p ON true
GROUP BY s.source_id, s.relid, s.retention, s.delta_retention;
COMMENT ON VIEW eventview.event_tables IS 'pg_eventview: event tables and the changes their views have not applied yet';
