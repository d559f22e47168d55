-- pg_eventview 0.23.0 -> 0.24.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.24.0'" to load this file. \quit
-- The coordinator's quarantine shows the entries of views over distributed event tables.

-- Copies of the entries each shard's view filed on its node, with the shard that filed each;
-- a view's next refresh makes them (src/citus/quarantine.rs).
CREATE TABLE eventview._distributed_quarantine (
    id          bigint PRIMARY KEY,
    view_id     integer NOT NULL,
    shard       text NOT NULL,
    shard_entry bigint NOT NULL
);
CREATE INDEX ON eventview._distributed_quarantine (view_id, shard, shard_entry);
COMMENT ON TABLE eventview._distributed_quarantine IS 'pg_eventview: quarantine entries of distributed views, with the shard that filed each';
SELECT pg_catalog.pg_extension_config_dump('eventview._distributed_quarantine', '');

-- The owners of a distributed view see its entries; a view of this node sees the entries of
-- its own event table only (a copy may carry the name a view of this node takes later).
CREATE OR REPLACE FUNCTION eventview._may_see_quarantine(source regclass, view_name text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = source), 'MEMBER')
        OR EXISTS (SELECT 1 FROM eventview._views v JOIN eventview._sources s USING (source_id)
                   WHERE view_name IS NOT NULL AND v.known_name = view_name AND s.relid = source
                     AND pg_catalog.pg_has_role(v.owner::oid, 'MEMBER'))
$$;
CREATE FUNCTION eventview._may_see_distributed_quarantine(entry bigint) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM eventview._distributed_quarantine m
                   JOIN eventview._distributed_views d ON d.view_id = m.view_id
                   WHERE m.id = entry AND pg_catalog.pg_has_role(d.owner::oid, 'MEMBER'))
$$;
CREATE POLICY distributed_view_owners_read ON eventview.quarantine FOR SELECT
    USING (eventview._may_see_distributed_quarantine(id));
GRANT SELECT ON eventview._distributed_quarantine TO PUBLIC;

-- A renamed distributed view's copies take its new name at once.
CREATE OR REPLACE FUNCTION eventview._follow_ddl() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
    op text;
    capture regprocedure;
BEGIN
    -- The GRANTs and REVOKEs below fire this trigger again: those nested runs have nothing to do.
    IF pg_catalog.current_setting('eventview.following_ddl', true) OPERATOR(pg_catalog.=) 'on' THEN
        RETURN;
    END IF;
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'on', true);
    FOR r IN
        SELECT DISTINCT s.source_id, now_owner.rolname AS now_owner, was.rolname AS was_owner
        FROM pg_catalog.pg_event_trigger_ddl_commands() d
        JOIN eventview._sources s ON s.relid::oid OPERATOR(pg_catalog.=) d.objid
        JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.objid
        JOIN pg_catalog.pg_roles now_owner ON now_owner.oid OPERATOR(pg_catalog.=) c.relowner
        -- (to_regprocedure, to_regclass: during a restore these may not exist yet)
        JOIN pg_catalog.pg_proc p
          ON p.oid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure(
                 pg_catalog.format('eventview._capture_%s_insert()', s.source_id))
        JOIN pg_catalog.pg_roles was ON was.oid OPERATOR(pg_catalog.=) p.proowner
        WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
          AND p.proowner OPERATOR(pg_catalog.<>) c.relowner
          AND pg_catalog.to_regclass(pg_catalog.format('eventview._changes_%s', s.source_id)) IS NOT NULL
    LOOP
        FOREACH op IN ARRAY ARRAY['insert', 'update', 'delete', 'truncate', 'keys'] LOOP
            capture := pg_catalog.to_regprocedure(pg_catalog.format('eventview._capture_%s_%s()', r.source_id, op));
            IF capture IS NOT NULL THEN
                EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO %I', capture, r.now_owner);
            END IF;
        END LOOP;
        EXECUTE pg_catalog.format('GRANT SELECT, INSERT, DELETE ON eventview._changes_%s TO %I',
                                  r.source_id, r.now_owner);
        -- (Its views may still need SELECT: the next loop grants it back if so.)
        EXECUTE pg_catalog.format('REVOKE ALL ON eventview._changes_%s FROM %I',
                                  r.source_id, r.was_owner);
        IF pg_catalog.to_regclass(pg_catalog.format('eventview._keys_%s', r.source_id)) IS NOT NULL THEN
            EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON eventview._keys_%s TO %I',
                                      r.source_id, r.now_owner);
            EXECUTE pg_catalog.format('REVOKE ALL ON eventview._keys_%s FROM %I', r.source_id, r.was_owner);
        END IF;
    END LOOP;
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

-- A shard's node answers with what the coordinator lacks of its view's entries.
CREATE FUNCTION eventview._shard_quarantine(registry_shard text, value text, shards json, copied json) RETURNS text
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'shard_quarantine_wrapper';
REVOKE EXECUTE ON FUNCTION eventview._shard_quarantine(text, text, json, json) FROM PUBLIC;
