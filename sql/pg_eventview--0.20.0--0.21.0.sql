-- pg_eventview 0.20.0 -> 0.21.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.21.0'" to load this file. \quit
-- Rollups (API.md section 9): a view may read the group changes of another incremental view.
ALTER TABLE eventview._views ADD COLUMN source_view integer;
ALTER TABLE eventview._views ADD COLUMN feeds_rollups boolean NOT NULL DEFAULT false;

-- A rollup's pending changes are its source's plus the group changes it has not applied.
CREATE OR REPLACE FUNCTION eventview._pending(p_view_id integer, OUT changes bigint, OUT oldest timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_source integer;
    v_source_view integer;
    v_applied pg_snapshot;
    v_own xid8;
    v_own_seq bigint;
    below_changes bigint;
    below_oldest timestamptz;
BEGIN
    SELECT source_id, source_view, applied_snapshot, applied_own_xid, applied_own_seq
    INTO v_source, v_source_view, v_applied, v_own, v_own_seq
    FROM eventview._views WHERE view_id = p_view_id;
    IF FOUND AND v_source_view IS NOT NULL THEN
        -- A rollup: what its source has not applied, plus the group changes of its source it
        -- has not applied.
        SELECT p.changes, p.oldest INTO below_changes, below_oldest FROM eventview._pending(v_source_view) p;
        IF to_regclass(format('eventview._v%s_changes', v_source_view)) IS NULL THEN
            changes := below_changes;
            oldest := below_oldest;
            RETURN;
        END IF;
        EXECUTE format(
            'SELECT count(*), min(logged_at) FROM eventview._v%s_changes
             WHERE (xid >= pg_snapshot_xmin($1) OR xid = $2)
               AND NOT eventview._applied(xid, seq, $1, $2, $3)', v_source_view)
        INTO changes, oldest USING v_applied, v_own, v_own_seq;
        changes := changes + below_changes;
        oldest := least(oldest, below_oldest);
        RETURN;
    END IF;
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
           AND NOT eventview._applied(xid, seq, $1, $2, $3)', v_source)
    INTO changes, oldest USING v_applied, v_own, v_own_seq;
END
$$;

-- eventview.views shows the view a rollup reads as its source.
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
CROSS JOIN LATERAL eventview._pending(v.view_id) p;

-- eventview.event_tables counts the pending changes of the views over each table's events.
CREATE OR REPLACE VIEW eventview.event_tables AS
SELECT s.relid AS name,
       s.retention,
       s.delta_retention,
       CASE WHEN bool_or(v.view_id IS NOT NULL AND p.changes IS NULL) THEN NULL
            ELSE coalesce(max(p.changes), 0) END::bigint AS pending_changes,
       min(p.oldest)                       AS oldest_pending
FROM eventview._sources s
-- The views over the table's events (a rollup's pending changes include its source's).
LEFT JOIN eventview._views v ON v.source_id = s.source_id AND v.source_view IS NULL
LEFT JOIN LATERAL eventview._pending(v.view_id) p ON true
GROUP BY s.source_id, s.relid, s.retention, s.delta_retention;

-- Rollups are forgotten before the views they read.
CREATE OR REPLACE FUNCTION eventview._follow_drop() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    dropped integer;
    t record;
BEGIN
    FOR dropped IN
        SELECT w.view_id
        FROM pg_catalog.pg_event_trigger_dropped_objects() d
        JOIN eventview._views w ON w.relid::oid OPERATOR(pg_catalog.=) d.objid
        WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
          AND d.objsubid OPERATOR(pg_catalog.=) 0
        -- Rollups before the views they read (a rollup is made after its source).
        ORDER BY w.view_id DESC
    LOOP
        PERFORM eventview._forget_view(dropped);
    END LOOP;
    FOR t IN
        SELECT s.source_id, s.relid
        FROM pg_catalog.pg_event_trigger_dropped_objects() d
        JOIN eventview._sources s ON s.relid::oid OPERATOR(pg_catalog.=) d.objid
        WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
          AND d.objsubid OPERATOR(pg_catalog.=) 0
        ORDER BY s.source_id
    LOOP
        IF NOT EXISTS (SELECT 1 FROM eventview._views w WHERE w.source_id OPERATOR(pg_catalog.=) t.source_id) THEN
            PERFORM eventview._forget_source(t.source_id);
        ELSE
            -- The views go on failing their refreshes until they are dropped; what was kept of
            -- the table's events (changelog, quarantine) and about them (drift, observed fields)
            -- goes now, and nothing names the table by its OID any more: a later relation may
            -- get that OID (a restore, a wraparound), which must not pass for the table, nor
            -- its owner see the table's events. (Its field declarations stay: the views' own
            -- definitions read them until they are dropped.)
            DELETE FROM eventview.quarantine WHERE source OPERATOR(pg_catalog.=) t.relid;
            DELETE FROM eventview.drift WHERE source OPERATOR(pg_catalog.=) t.relid;
            DELETE FROM eventview._observed WHERE source_id OPERATOR(pg_catalog.=) t.source_id;
            DELETE FROM eventview._observed_versions WHERE source_id OPERATOR(pg_catalog.=) t.source_id;
            IF pg_catalog.to_regclass(pg_catalog.format('eventview._changes_%s', t.source_id)) IS NOT NULL THEN
                EXECUTE pg_catalog.format('TRUNCATE eventview._changes_%s', t.source_id);
            END IF;
            UPDATE eventview._sources SET relid = 0 WHERE source_id OPERATOR(pg_catalog.=) t.source_id;
        END IF;
    END LOOP;
END
$$;

-- Positions in an event table's changelog are those of the views over it, not of rollups.
CREATE OR REPLACE FUNCTION eventview._positions_from_elsewhere(p_source_id integer) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- The first id this cluster has not given out (our own, given out after the statement's
    -- snapshot was taken, is not from elsewhere).
    next_xid xid8 := greatest(pg_snapshot_xmax(pg_current_snapshot()),
                              (pg_current_xact_id_if_assigned()::text::numeric + 1)::text::xid8);
    log regclass := to_regclass(format('eventview._changes_%s', p_source_id));
    newest xid8;
BEGIN
    IF EXISTS (SELECT 1 FROM eventview._sources
               WHERE source_id = p_source_id
                 AND (pg_snapshot_xmax(observed_snapshot) > next_xid OR observed_own_xid >= next_xid))
       OR EXISTS (SELECT 1 FROM eventview._views
                  WHERE source_id = p_source_id AND source_view IS NULL
                    AND (pg_snapshot_xmax(applied_snapshot) > next_xid OR applied_own_xid >= next_xid)) THEN
        RETURN true;
    END IF;
    IF log IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('SELECT max(xid) FROM %s', log) INTO newest;
    RETURN coalesce(newest >= next_xid, false);
END
$$;

CREATE OR REPLACE FUNCTION eventview._rebase_positions(p_source_id integer) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    log regclass := to_regclass(format('eventview._changes_%s', p_source_id));
    snaps pg_snapshot[];
    owns xid8[];
    own_seqs bigint[];
    keys integer[];
    classes text[];
    xip text;
    j integer;
BEGIN
    IF log IS NULL OR NOT eventview._positions_from_elsewhere(p_source_id) THEN
        RETURN false;
    END IF;
    -- The consumers' rows, as refreshes and the observer take them: none moves meanwhile.
    PERFORM 1 FROM eventview._sources WHERE source_id = p_source_id FOR NO KEY UPDATE;
    PERFORM 1 FROM eventview._views WHERE source_id = p_source_id ORDER BY view_id FOR UPDATE;
    -- Again under the locks: another session may have renumbered them meanwhile.
    IF NOT eventview._positions_from_elsewhere(p_source_id) THEN
        RETURN false;
    END IF;
    -- Consumers in a fixed order: the observer (key 0), then the views.
    SELECT array_agg(k ORDER BY k), array_agg(s ORDER BY k), array_agg(own ORDER BY k), array_agg(own_seq ORDER BY k)
    INTO keys, snaps, owns, own_seqs
    FROM (SELECT 0 AS k, observed_snapshot AS s, observed_own_xid AS own, observed_own_seq AS own_seq
          FROM eventview._sources WHERE source_id = p_source_id
          UNION ALL
          SELECT view_id, applied_snapshot, applied_own_xid, applied_own_seq
          FROM eventview._views WHERE source_id = p_source_id AND source_view IS NULL) c;
    -- A record's class: for each consumer in order, '1' if it had applied the record, else '0'.
    -- The new xid of the class at position n (in text order) is n + 2.
    EXECUTE format(
        'WITH applied AS (
             SELECT r.seq, string_agg(CASE WHEN eventview._applied(r.xid, r.seq, c.s, c.own, c.own_seq)
                                           THEN ''1'' ELSE ''0'' END, '''' ORDER BY c.n) AS class
             FROM %1$s r CROSS JOIN unnest($1, $2, $3) WITH ORDINALITY AS c(s, own, own_seq, n)
             GROUP BY r.seq),
         numbered AS (
             SELECT class, row_number() OVER (ORDER BY class) + 2 AS xid FROM (SELECT DISTINCT class FROM applied) d),
         renumbered AS (
             UPDATE %1$s r SET xid = numbered.xid::text::xid8
             FROM applied JOIN numbered USING (class)
             WHERE r.seq = applied.seq
             RETURNING 1)
         SELECT coalesce(array_agg(class ORDER BY xid), ''{}'') FROM numbered',
        log) INTO classes USING snaps, owns, own_seqs;
    IF cardinality(classes) + 3 > pg_snapshot_xmin(pg_current_snapshot())::text::bigint THEN
        RAISE EXCEPTION 'cannot renumber the changelog of event table %: this cluster has run fewer transactions than the changelog has classes of records',
            (SELECT relid FROM eventview._sources WHERE source_id = p_source_id);
    END IF;
    FOR j IN 1 .. cardinality(keys) LOOP
        SELECT string_agg((n + 2)::text, ',' ORDER BY n) INTO xip
        FROM unnest(classes) WITH ORDINALITY AS u(class, n)
        WHERE substr(class, j, 1) = '0';
        IF keys[j] = 0 THEN
            UPDATE eventview._sources
            SET observed_snapshot = format('3:%s:%s', cardinality(classes) + 3, coalesce(xip, ''))::pg_snapshot,
                observed_own_xid = NULL, observed_own_seq = NULL
            WHERE source_id = p_source_id;
        ELSE
            UPDATE eventview._views
            SET applied_snapshot = format('3:%s:%s', cardinality(classes) + 3, coalesce(xip, ''))::pg_snapshot,
                applied_own_xid = NULL, applied_own_seq = NULL
            WHERE view_id = keys[j];
        END IF;
    END LOOP;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION eventview._prune_changelog(p_source_id integer, p_log regclass, p_delta_retention interval, p_max_rows bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n bigint;
    m bigint;
    done bigint := 0;
    below xid8;
    lo_xid xid8 := '0'::xid8;
    lo_seq bigint := 0;
    hi_xid xid8;
    hi_seq bigint;
    oldest timestamptz;
    batch_size constant integer := 10000;
BEGIN
    EXECUTE 'SELECT min(pg_snapshot_xmax(s)) FROM (
                 SELECT applied_snapshot AS s FROM eventview._views WHERE source_id = $1 AND source_view IS NULL
                 UNION ALL SELECT observed_snapshot FROM eventview._sources WHERE source_id = $1) k'
        INTO below USING p_source_id;
    LOOP
        EXECUTE format('SELECT count(*), (array_agg(xid ORDER BY xid DESC, seq DESC))[1],
                               (array_agg(seq ORDER BY xid DESC, seq DESC))[1], min(logged_at)
                        FROM (SELECT xid, seq, logged_at FROM %s
                              WHERE (xid, seq) > ($1, $2) AND xid < $3
                              ORDER BY xid, seq LIMIT $4) w', p_log)
            INTO n, hi_xid, hi_seq, oldest USING lo_xid, lo_seq, below, least(batch_size, p_max_rows - done);
        EXIT WHEN n = 0;
        EXECUTE format($q$
            WITH consumers AS (
                SELECT applied_snapshot AS s, applied_own_xid AS own, applied_own_seq AS own_seq
                FROM eventview._views WHERE source_id = $1 AND source_view IS NULL
                UNION ALL
                SELECT observed_snapshot, observed_own_xid, observed_own_seq
                FROM eventview._sources WHERE source_id = $1
            ),
            gone AS (
                DELETE FROM %s c
                WHERE (c.xid, c.seq) > ($3, $4) AND (c.xid, c.seq) <= ($5, $6)
                  AND c.logged_at < now() - $2
                  AND NOT EXISTS (SELECT 1 FROM consumers k
                                  WHERE NOT eventview._applied(c.xid, c.seq, k.s, k.own, k.own_seq))
                RETURNING 1
            )
            SELECT count(*) FROM gone
        $q$, p_log)
        INTO m USING p_source_id, p_delta_retention, lo_xid, lo_seq, hi_xid, hi_seq;
        done := done + m;
        lo_xid := hi_xid;
        lo_seq := hi_seq;
        -- Records come in (roughly) the order they were logged: once a whole window is
        -- younger than delta_retention, so is what follows.
        EXIT WHEN n < least(batch_size, p_max_rows - done + m) OR done >= p_max_rows
                  OR oldest >= now() - p_delta_retention;
    END LOOP;
    RETURN done;
END
$$;

-- approx_percentile keeps each group's sketch as an array in its storage row
-- (eventview_core::sketch); a view made by 0.20.0 moves its sketch multiset into that column at
-- its first refresh (view_objects::sketches_into_storage).
CREATE FUNCTION eventview."_sketch_add"(
	"sketch_array" bigint[],
	"buckets" bigint[],
	"counts" bigint[]
) RETURNS bigint[]
IMMUTABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'sketch_add_wrapper';
CREATE FUNCTION eventview."_sketch_merge"(
	"a" bigint[],
	"b" bigint[]
) RETURNS bigint[]
IMMUTABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'sketch_merge_wrapper';
CREATE FUNCTION eventview."_sketch_negate"(
	"sketch_array" bigint[]
) RETURNS bigint[]
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'sketch_negate_wrapper';
CREATE FUNCTION eventview."_sketch_quantile"(
	"sketch_array" bigint[],
	"p" double precision
) RETURNS double precision
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'sketch_quantile_wrapper';
CREATE AGGREGATE eventview._sketch_sum(bigint[]) (
    SFUNC = eventview._sketch_merge,
    STYPE = bigint[],
    COMBINEFUNC = eventview._sketch_merge,
    PARALLEL = SAFE
);
