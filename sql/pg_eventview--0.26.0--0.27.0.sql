-- pg_eventview 0.26.0 -> 0.27.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.27.0'" to load this file. \quit

-- Gives the capture of event table p_source_id to the table's owner, from whichever roles
-- own its capture functions (after ALTER TABLE ... OWNER TO, see _follow_ddl): the capture
-- functions run as their owner, and the changelog's (and key table's) rights are the owner's,
-- so all of them move to the table's owner. A former owner keeps no right on those tables
-- unless it owns them; the caller brings the changelog's readers up to date afterwards
-- (_sync_changelog_readers), which gives a former owner's views back what they read.
CREATE FUNCTION eventview._move_capture(p_source_id integer) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now_owner name;
    was_owner name;
    former name[] := '{}';
    op text;
    capture regprocedure;
    logged regclass;
    keys regclass;
BEGIN
    -- (to_regprocedure, to_regclass: during a restore these may not exist yet)
    logged := pg_catalog.to_regclass(pg_catalog.format('eventview._changes_%s', p_source_id));
    keys := pg_catalog.to_regclass(pg_catalog.format('eventview._keys_%s', p_source_id));
    SELECT n.rolname INTO now_owner
    FROM eventview._sources s
    JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) s.relid::oid
    JOIN pg_catalog.pg_roles n ON n.oid OPERATOR(pg_catalog.=) c.relowner
    WHERE s.source_id OPERATOR(pg_catalog.=) p_source_id;
    IF now_owner IS NULL OR logged IS NULL THEN
        RETURN;
    END IF;
    FOREACH op IN ARRAY ARRAY['insert', 'update', 'delete', 'truncate', 'keys'] LOOP
        capture := pg_catalog.to_regprocedure(pg_catalog.format('eventview._capture_%s_%s()', p_source_id, op));
        was_owner := (SELECT r.rolname FROM pg_catalog.pg_proc p
                      JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) p.proowner
                      WHERE p.oid OPERATOR(pg_catalog.=) capture);
        IF was_owner OPERATOR(pg_catalog.<>) now_owner THEN
            EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO %I', capture, now_owner);
            IF NOT was_owner OPERATOR(pg_catalog.=) ANY (former) THEN
                former := former OPERATOR(pg_catalog.||) was_owner;
            END IF;
        END IF;
    END LOOP;
    IF pg_catalog.cardinality(former) OPERATOR(pg_catalog.=) 0 THEN
        RETURN;
    END IF;
    EXECUTE pg_catalog.format('GRANT SELECT, INSERT, DELETE ON %s TO %I', logged, now_owner);
    IF keys IS NOT NULL THEN
        EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %I', keys, now_owner);
    END IF;
    FOREACH was_owner IN ARRAY former LOOP
        IF was_owner OPERATOR(pg_catalog.<>) (SELECT r.rolname FROM pg_catalog.pg_class c
                                              JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) c.relowner
                                              WHERE c.oid OPERATOR(pg_catalog.=) logged) THEN
            EXECUTE pg_catalog.format('REVOKE ALL ON %s FROM %I', logged, was_owner);
        END IF;
        IF keys IS NOT NULL AND was_owner OPERATOR(pg_catalog.<>) (SELECT r.rolname FROM pg_catalog.pg_class c
                                                               JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) c.relowner
                                                               WHERE c.oid OPERATOR(pg_catalog.=) keys) THEN
            EXECUTE pg_catalog.format('REVOKE ALL ON %s FROM %I', keys, was_owner);
        END IF;
    END LOOP;
END
$$;
REVOKE EXECUTE ON FUNCTION eventview._move_capture(integer) FROM PUBLIC;

-- _follow_ddl moves an event table's capture to its new owner through _move_capture.
CREATE OR REPLACE FUNCTION eventview._follow_ddl() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    -- The GRANTs and REVOKEs below fire this trigger again: those nested runs have nothing to do.
    IF pg_catalog.current_setting('eventview.following_ddl', true) OPERATOR(pg_catalog.=) 'on' THEN
        RETURN;
    END IF;
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'on', true);
    PERFORM eventview._move_capture(altered.source_id)
    FROM (SELECT DISTINCT s.source_id
          FROM pg_catalog.pg_event_trigger_ddl_commands() d
          JOIN eventview._sources s ON s.relid::oid OPERATOR(pg_catalog.=) d.objid
          WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass) altered;
    PERFORM eventview._sync_changelog_readers();
    -- Renamed views: one statement maps old names to new ones (renames may have crossed); the
    -- view's row first, which waits for a refresh of it filing quarantine rows meanwhile. A view
    -- whose relation is gone (dropped behind the API's back) keeps its name.
    WITH renamed AS (
        UPDATE eventview._views v SET known_name = n.now
        FROM (SELECT view_id, known_name AS was, eventview._view_name(view_id) AS now FROM eventview._views) n
        WHERE v.view_id OPERATOR(pg_catalog.=) n.view_id AND n.now IS NOT NULL
          AND NOT coalesce(n.was OPERATOR(pg_catalog.=) n.now, false)
        RETURNING n.was, n.now, v.source_id
    )
    UPDATE eventview.quarantine q SET view_name = r2.now
    FROM renamed r2 JOIN eventview._sources s ON s.source_id OPERATOR(pg_catalog.=) r2.source_id
    WHERE q.view_name OPERATOR(pg_catalog.=) r2.was AND q.source OPERATOR(pg_catalog.=) s.relid;
    -- Renamed views over distributed event tables (or their schemas): the coordinator's copies
    -- of their quarantine entries take the new name, once the view's refresh running now (which
    -- holds its row, and copies under the name it read) is done.
    FOR r IN
        SELECT d.view_id, pg_catalog.format('%I.%I', n.nspname, c.relname) AS now
        FROM eventview._distributed_views d
        JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.relid::oid
        JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
        WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger_ddl_commands() x
                      WHERE x.objid OPERATOR(pg_catalog.=) d.relid::oid
                         OR x.objid OPERATOR(pg_catalog.=) c.relnamespace)
        ORDER BY d.view_id
    LOOP
        PERFORM 1 FROM eventview._distributed_views WHERE view_id OPERATOR(pg_catalog.=) r.view_id FOR UPDATE;
        UPDATE eventview.quarantine q SET view_name = r.now
        FROM eventview._distributed_quarantine m
        WHERE m.view_id OPERATOR(pg_catalog.=) r.view_id AND q.id OPERATOR(pg_catalog.=) m.id
          AND NOT coalesce(q.view_name OPERATOR(pg_catalog.=) r.now, false);
    END LOOP;
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'off', true);
END
$$;

-- Capture functions are each node's own (src/pg/node_local.rs). Where Citus is installed
-- (Citus runs this update on every node of a cluster whose pg_eventview it manages; elsewhere
-- it is run on each node), each node keeps only its own: Citus's marks on capture functions
-- go; capture functions of no event table of the node (a number with no event table, or the
-- key function of a table that is not partitioned), used by no trigger, are dropped; capture
-- owned by another role than its table moves to the table's owner; an event table of the node
-- without capture functions is named in a WARNING. (What earlier releases left behind on a
-- Citus cluster: CHANGELOG.md, 0.27.0.)
DO $$
DECLARE
    f record;
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_object') IS NULL THEN
        RETURN;
    END IF;
    -- The GRANTs, REVOKEs and ALTER FUNCTIONs below would each run _follow_ddl again.
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'on', true);
    DELETE FROM pg_catalog.pg_dist_object d USING pg_catalog.pg_proc p
    WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
      AND d.objid OPERATOR(pg_catalog.=) p.oid
      AND p.pronamespace OPERATOR(pg_catalog.=) 'eventview'::pg_catalog.regnamespace
      AND p.proname OPERATOR(pg_catalog.~) '^_capture_[0-9]+_';
    FOR f IN
        SELECT p.oid::pg_catalog.regprocedure AS capture
        FROM pg_catalog.pg_proc p
        CROSS JOIN LATERAL (SELECT pg_catalog.substring(p.proname, '^_capture_([0-9]+)_')::integer AS source_id,
                                   p.proname OPERATOR(pg_catalog.~) '_keys$' AS keys) n
        WHERE p.pronamespace OPERATOR(pg_catalog.=) 'eventview'::pg_catalog.regnamespace
          AND p.proname OPERATOR(pg_catalog.~) '^_capture_[0-9]+_'
          AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t WHERE t.tgfoid OPERATOR(pg_catalog.=) p.oid)
          AND (NOT EXISTS (SELECT 1 FROM eventview._sources s WHERE s.source_id OPERATOR(pg_catalog.=) n.source_id)
               OR (n.keys AND pg_catalog.to_regclass(pg_catalog.format('eventview._keys_%s', n.source_id)) IS NULL))
    LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s', f.capture);
    END LOOP;
    PERFORM eventview._move_capture(s.source_id) FROM eventview._sources s;
    PERFORM eventview._sync_changelog_readers();
    FOR f IN
        SELECT s.relid
        FROM eventview._sources s
        JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) s.relid::oid
        WHERE pg_catalog.to_regprocedure(pg_catalog.format('eventview._capture_%s_insert()', s.source_id)) IS NULL
    LOOP
        RAISE WARNING USING
            MESSAGE = pg_catalog.format('event table %s has no capture: its changes are not captured', f.relid),
            DETAIL = 'Its capture functions may have been dropped with an event table of the same number on the Citus coordinator.',
            HINT = 'Copy its events aside, drop it (a shard: its distributed table) with eventview.drop_event_table, create it again, and put the events back.';
    END LOOP;
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'off', true);
END
$$;
