-- pg_eventview 0.6.0 -> 0.7.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.7.0'" to load this file. \quit

-- The snapshot every refresh takes twice (and every read of a realtime view once) is computed
-- by PL/pgSQL, which keeps its plan, instead of a SQL function with a SET clause, which is
-- parsed and planned at every call (0.2 ms against 0.03 ms). Same result.
CREATE OR REPLACE FUNCTION eventview._snapshot_without_own() RETURNS pg_snapshot
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN (SELECT CASE
        WHEN own IS NULL OR NOT pg_visible_in_snapshot(own, s) THEN s
        ELSE (least(pg_snapshot_xmin(s)::text::numeric, own::text::numeric)::text || ':' ||
              pg_snapshot_xmax(s)::text || ':' ||
              array_to_string(ARRAY(
                  SELECT x FROM (
                      SELECT pg_snapshot_xip(s)::text::numeric AS x
                      UNION
                      SELECT own::text::numeric
                  ) xs
                  ORDER BY x), ','))::pg_snapshot
    END
    FROM (SELECT pg_current_snapshot() AS s, pg_current_xact_id_if_assigned() AS own) cur);
END
$$;

-- The ids of quarantine and drift rows go on where they were after a dump and restore (their
-- sequences were not in the dump: the first new row after a restore collided with a restored one).
SELECT pg_catalog.pg_extension_config_dump('eventview.quarantine_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('eventview.drift_id_seq', '');

-- Positions restored into another cluster. A consumer's position (a view's applied snapshot, an
-- event table's observed snapshot) and the changelog's xids are transaction ids of the cluster
-- that wrote them. Restored from a dump into a cluster whose transaction counter is behind (a new
-- server), they would count the new cluster's transactions as applied already: their changes
-- would never reach the views. A position from the future gives such a restore away.
CREATE FUNCTION eventview._positions_from_elsewhere(p_source_id integer) RETURNS boolean
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
                  WHERE source_id = p_source_id
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

-- Renumbers the positions of one event table restored from another cluster (see above), before
-- anything is captured in this one: records that exactly the same consumers had applied share
-- one new xid, numbered from 3 (below every transaction of this cluster, so every record reads as
-- committed), and each consumer's snapshot becomes one that sees exactly the records it had
-- applied and no transaction of this cluster. Refreshes only ever ask whether a record's xid is
-- visible in a snapshot, so every consumer goes on where it was, exactly once. Returns whether it
-- had anything to do. Run by the event trigger below when a restore creates the capture triggers
-- (after the data: no record of this cluster can exist yet).
CREATE FUNCTION eventview._rebase_positions(p_source_id integer) RETURNS boolean
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
          FROM eventview._views WHERE source_id = p_source_id) c;
    -- A record's class: for each consumer in order, '1' if it had applied the record, else '0'.
    -- The new xid of the class at position n (in text order) is n + 2.
    EXECUTE format(
        'WITH applied AS (
             SELECT r.seq, string_agg(CASE WHEN pg_visible_in_snapshot(r.xid, c.s)
                                                OR coalesce(r.xid = c.own AND r.seq <= c.own_seq, false)
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

-- A serial restore creates the capture triggers of each event table after all data is in (the
-- extension's tables, the changelogs) and before anything can be captured: the moment to
-- renumber positions restored from another cluster. A parallel restore (pg_restore -j, several
-- sessions) may create them while other tables are still loading: then it only warns, and
-- eventview._rebase_positions is to be run once the restore is done.
CREATE FUNCTION eventview._rebase_after_restore() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
    parallel_restore boolean :=
        current_setting('application_name') = 'pg_restore'
        AND (SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'pg_restore') > 1;
BEGIN
    FOR r IN
        SELECT DISTINCT s.source_id
        FROM pg_event_trigger_ddl_commands() d
        JOIN pg_trigger t ON t.oid = d.objid
        JOIN eventview._sources s ON s.relid::oid = t.tgrelid
        WHERE d.classid = 'pg_catalog.pg_trigger'::regclass
    LOOP
        IF parallel_restore THEN
            IF eventview._positions_from_elsewhere(r.source_id) THEN
                RAISE WARNING 'pg_eventview: positions of event table % come from another cluster; once this parallel restore is done, and before new events are written, run: SELECT eventview._rebase_positions(%)',
                    (SELECT relid FROM eventview._sources WHERE source_id = r.source_id), r.source_id;
            END IF;
        ELSIF eventview._rebase_positions(r.source_id) THEN
            RAISE NOTICE 'pg_eventview: positions of event table % renumbered for this cluster (restored from another one)',
                (SELECT relid FROM eventview._sources WHERE source_id = r.source_id);
        END IF;
    END LOOP;
END
$$;
CREATE EVENT TRIGGER eventview_rebase_after_restore ON ddl_command_end
    WHEN TAG IN ('CREATE TRIGGER')
    EXECUTE FUNCTION eventview._rebase_after_restore();
-- Rewriting positions is for the restore and for superusers (it locks every view of the table).
REVOKE EXECUTE ON FUNCTION eventview._rebase_positions(integer) FROM PUBLIC;

-- refresh_all refreshes each view in its own subtransaction: one that fails keeps its error in
-- last_error (with a WARNING) and the others go on; before, the first failure aborted them all.
CREATE OR REPLACE FUNCTION eventview.refresh_all() RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v record;
    total bigint := 0;
BEGIN
    -- Observed first, as refresh does.
    PERFORM eventview._observe_all();
    -- The caller's views, each in its own subtransaction: one that fails (its owner may no
    -- longer read the table, its type policy is 'fail') keeps its error in last_error, applies
    -- nothing, and the others go on.
    FOR v IN
        SELECT w.view_id, format('%I.%I', n.nspname, c.relname) AS name
        FROM eventview._views w
        JOIN pg_class c ON c.oid = w.relid::oid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE pg_has_role(w.owner::oid, 'MEMBER')
        ORDER BY w.view_id
    LOOP
        BEGIN
            total := total + eventview._refresh(v.name);
        EXCEPTION WHEN undefined_table THEN
            -- Dropped or renamed since the list was read: not a failure of the view.
            NULL;
        WHEN others THEN
            UPDATE eventview._views SET last_error = SQLERRM WHERE view_id = v.view_id;
            RAISE WARNING 'refresh of view % failed: %', v.name, SQLERRM;
        END;
    END LOOP;
    RETURN total;
END
$$;
COMMENT ON FUNCTION eventview.refresh_all() IS 'Refreshes every view of the caller; returns the sum of refresh(); a view that fails keeps its error in last_error and the others go on';
DROP FUNCTION eventview._refresh_all();

-- No foreign keys between the extension's tables: a parallel restore (pg_restore -j) loads their
-- data in any order and failed on them; drop_event_table deletes the rows they cascaded to.
ALTER TABLE eventview._views DROP CONSTRAINT _views_source_id_fkey;
ALTER TABLE eventview._fields DROP CONSTRAINT _fields_source_id_fkey;
ALTER TABLE eventview._observed DROP CONSTRAINT _observed_source_id_fkey;
ALTER TABLE eventview._observed_versions DROP CONSTRAINT _observed_versions_source_id_fkey;

-- count_distinct(occurred_at) and filters on occurred_at compare the UTC form of the timestamp
-- since 0.7.0 (before, the refreshing session's TimeZone): views using either are asked, in
-- eventview.views.last_error, to be rebuilt once (which also regenerates a realtime view's reads).
UPDATE eventview._views
SET rebuild_note = 'pg_eventview 0.7.0 compares occurred_at in UTC; rebuild this view once (eventview.rebuild(name))'
WHERE definition::text ~* 'count_distinct\(\s*occurred_at\s*\)'
   OR (json_typeof(definition -> 'filter') = 'object' AND (definition -> 'filter') ->> 'occurred_at' IS NOT NULL);
