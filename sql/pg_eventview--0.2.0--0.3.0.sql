-- pg_eventview 0.2.0 -> 0.3.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.3.0'" to load this file. \quit

-- The field observer walks stored jsonb instead of its text: the walk takes the payloads as
-- they are stored (jsonb[], declared anyarray so they reach the library without conversion).
DROP FUNCTION eventview."_payload_shapes"(TEXT[], INT[], TEXT[]);
CREATE FUNCTION eventview."_payload_shapes"(
	"event_types" TEXT[],
	"event_versions" INT[],
	"payloads" anyarray
) RETURNS TABLE (
	"event_type" TEXT,
	"event_version" INT,
	"path" TEXT,
	"json_type" TEXT,
	"events" bigint
)
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'payload_shapes_wrapper';

-- Views know the name their quarantine rows carry, kept up to date on renames (below).
ALTER TABLE eventview._views ADD COLUMN known_name text;
UPDATE eventview._views SET known_name = eventview._view_name(view_id);

-- A view's owner reads the changelog of its event table only while it may SELECT the table (the
-- changelog holds the old contents of updated and deleted events). Called by the DDL trigger
-- below and by run_maintenance (role membership changes fire no event trigger). "Reads" is what
-- the owner was granted on the changelog directly, which is what GRANT and REVOKE change.
CREATE FUNCTION eventview._sync_changelog_readers() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
    following text := pg_catalog.current_setting('eventview.following_ddl', true);
BEGIN
    -- Its GRANTs and REVOKEs fire the DDL trigger, which has nothing to add.
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'on', true);
    FOR r IN
        SELECT DISTINCT v.source_id, o.rolname AS reader,
               pg_catalog.has_table_privilege(v.owner::oid, s.relid::oid, 'SELECT') AS may_read,
               EXISTS (SELECT 1 FROM pg_catalog.pg_class l, pg_catalog.aclexplode(l.relacl) a
                       WHERE l.oid OPERATOR(pg_catalog.=) log.oid
                         AND a.grantee OPERATOR(pg_catalog.=) v.owner::oid
                         AND a.privilege_type OPERATOR(pg_catalog.=) 'SELECT') AS reads
        FROM eventview._views v
        JOIN eventview._sources s ON s.source_id OPERATOR(pg_catalog.=) v.source_id
        JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) s.relid::oid
        JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) v.owner::oid
        CROSS JOIN LATERAL (SELECT pg_catalog.to_regclass(
                                pg_catalog.format('eventview._changes_%s', v.source_id))::oid AS oid) log
        WHERE c.relowner OPERATOR(pg_catalog.<>) v.owner::oid AND NOT o.rolsuper AND log.oid IS NOT NULL
    LOOP
        IF r.may_read AND NOT r.reads THEN
            EXECUTE pg_catalog.format('GRANT SELECT ON eventview._changes_%s TO %I', r.source_id, r.reader);
        ELSIF r.reads AND NOT r.may_read THEN
            EXECUTE pg_catalog.format('REVOKE SELECT ON eventview._changes_%s FROM %I', r.source_id, r.reader);
        END IF;
    END LOOP;
    PERFORM pg_catalog.set_config('eventview.following_ddl', coalesce(following, 'off'), true);
END
$$;

-- DDL that pg_eventview follows (an event trigger, as the extension owner):
-- - an event table given to another role (ALTER TABLE ... OWNER TO) takes its capture along: the
--   capture functions run as the table's owner and the changelog rights are the owner's, so both
--   move to the new owner;
-- - a view's owner reads the changelog of its event table only while it may read the table
--   (GRANT, REVOKE, ALTER TABLE ... OWNER TO): the changelog holds the old contents of updated
--   and deleted events;
-- - a view renamed or moved (ALTER VIEW/TABLE ... RENAME or SET SCHEMA, ALTER SCHEMA ... RENAME):
--   its quarantine rows take the new name, so its owner still sees them and drop_view and
--   rebuild still find them.
CREATE FUNCTION eventview._follow_ddl() RETURNS event_trigger
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
        FOREACH op IN ARRAY ARRAY['insert', 'update', 'delete', 'truncate'] LOOP
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
        RETURNING n.was, n.now
    )
    UPDATE eventview.quarantine q SET view_name = r2.now
    FROM renamed r2 WHERE q.view_name OPERATOR(pg_catalog.=) r2.was;
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'off', true);
END
$$;
CREATE EVENT TRIGGER eventview_follow_ddl ON ddl_command_end
    WHEN TAG IN ('ALTER TABLE', 'ALTER VIEW', 'ALTER SCHEMA', 'GRANT', 'REVOKE')
    EXECUTE FUNCTION eventview._follow_ddl();

-- run_maintenance also brings view owners' changelog rights in line with their table rights.
CREATE OR REPLACE FUNCTION eventview.run_maintenance() RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v record;
BEGIN
    FOR v IN
        SELECT view_id, relid, schedule, failures FROM eventview._views
        WHERE schedule IS NOT NULL
          AND (last_refresh_at IS NULL OR last_refresh_at + schedule <= clock_timestamp())
          AND (retry_at IS NULL OR retry_at <= clock_timestamp())
        ORDER BY coalesce(last_refresh_at, '-infinity'), view_id
    LOOP
        BEGIN
            PERFORM 1 FROM eventview._views WHERE view_id = v.view_id FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                PERFORM eventview._refresh(format('%I.%I', n.nspname, c.relname))
                FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE c.oid = v.relid;
            END IF;
        EXCEPTION WHEN others THEN
            UPDATE eventview._views
            SET last_error = SQLERRM,
                failures = v.failures + 1,
                retry_at = clock_timestamp()
                           + least(v.schedule * power(2, least(v.failures, 20)),
                                   greatest(v.schedule, interval '1 hour'))
            WHERE view_id = v.view_id;
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
    PERFORM eventview.prune();
END
$$;
