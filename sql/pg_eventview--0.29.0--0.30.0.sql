-- pg_eventview 0.29.0 -> 0.30.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.30.0'" to load this file. \quit

-- prune's hold on an event table while a view of it is being made or rebuilt: a row of the
-- table's own in eventview._prune_guards, which create_view and rebuild lock FOR KEY SHARE and
-- prune tries FOR UPDATE SKIP LOCKED (catalog::hold_off_prune), where it was an advisory lock
-- of a known key that any role could take and hold. Locking a row takes UPDATE on its table,
-- which no role but the extension owner has here.
CREATE TABLE eventview._prune_guards (source_id integer PRIMARY KEY);
INSERT INTO eventview._prune_guards (source_id) SELECT source_id FROM eventview._sources;
SELECT pg_catalog.pg_extension_config_dump('eventview._prune_guards', '');

-- prune's try of that lock, in the library: for members of the table's owner role only.
CREATE OR REPLACE FUNCTION eventview."_lock_source_for_prune"(
	"p_source_id" INT
) RETURNS bool
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_source_for_prune_wrapper';

-- A view given to another role (ALTER VIEW ... OWNER TO) takes its storage and its refresh along
-- (views::follow_owner), which the DDL trigger calls for it.
CREATE FUNCTION eventview."_follow_view_owner"(
	"p_view_id" INT
) RETURNS VOID
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'follow_view_owner_wrapper';
REVOKE EXECUTE ON FUNCTION eventview._follow_view_owner(integer) FROM PUBLIC;

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
    -- Views given to another role (ALTER VIEW ... OWNER TO): their storage and their refresh
    -- go along (views::follow_owner); before the changelog readers are brought up to date. (The
    -- call is planned only when there is one: the install script's own DDL runs before the
    -- function exists.)
    FOR r IN
        SELECT v.view_id
        FROM eventview._views v
        JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) v.relid::oid
        WHERE c.relowner OPERATOR(pg_catalog.<>) v.owner::oid
          AND c.oid IN (SELECT d.objid FROM pg_catalog.pg_event_trigger_ddl_commands() d
                        WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass)
        ORDER BY v.view_id
    LOOP
        PERFORM eventview._follow_view_owner(r.view_id);
    END LOOP;
    IF EXISTS (SELECT 1 FROM eventview._distributed_views v
               JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) v.relid::oid
               WHERE c.relowner OPERATOR(pg_catalog.<>) v.owner::oid
                 AND c.oid IN (SELECT d.objid FROM pg_catalog.pg_event_trigger_ddl_commands() d
                               WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass)) THEN
        RAISE EXCEPTION 'a view over a distributed event table cannot be given to another role'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Give it back to the owner eventview._distributed_views records (ALTER VIEW ... OWNER TO), or create the view again as the new owner (eventview.create_view) and drop this one.';
    END IF;
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

-- A JSONPath index (`$.x[0]`, `$.x[-1]`) selects only array elements from 0.30.0 (0.29.0's
-- library took a scalar for an array of one): the views with an index in a path of theirs, or
-- of a logical field of their event table, are asked, in eventview.views.last_error, to be
-- rebuilt once (which also makes a realtime view's reads anew).
UPDATE eventview._views v
SET rebuild_note = 'pg_eventview 0.30.0 selects only array elements with a JSONPath index ($.x[0]); rebuild this view once (eventview.rebuild(name))'
WHERE v.rebuild_note IS NULL
  AND (v.definition::text ~ '\[\s*-?[0-9]+\s*\]'
       OR EXISTS (SELECT 1 FROM eventview._fields f
                  WHERE f.source_id = v.source_id AND f.path ~ '\[\s*-?[0-9]+\s*\]'));
