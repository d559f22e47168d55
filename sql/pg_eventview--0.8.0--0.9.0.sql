-- pg_eventview 0.8.0 -> 0.9.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.9.0'" to load this file. \quit

-- Forgets an incremental view: its quarantine rows, its catalog row, its storage (the tables
-- eventview._v<id>_data, _v<id>_m<n> and _v<id>_m<n>_log, named as in the Rust core::names), and
-- its owner's right to read the changelog when no other view of theirs reads it. Run by
-- eventview._follow_drop after a DROP took the view's relation (drop_view's DROP VIEW too; it runs
-- it again, a no-op unless event triggers did not fire). Takes the view's row first, as a refresh
-- does before it touches quarantine rows (the other order deadlocks with one). Quarantine rows go
-- only if no other view has the same name (a view dropped behind the API's back before 0.9.0
-- and created again under its name shares it). Internal (no EXECUTE for PUBLIC): it runs as the
-- extension owner.
CREATE FUNCTION eventview._forget_view(p_view_id integer) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v record;
    t regclass;
    following text := pg_catalog.current_setting('eventview.following_ddl', true);
BEGIN
    SELECT w.view_id, w.source_id, w.known_name, w.owner::oid AS owner, o.rolname AS owner_name,
           s.relid::oid AS source_relid
    INTO v
    FROM eventview._views w
    JOIN eventview._sources s ON s.source_id OPERATOR(pg_catalog.=) w.source_id
    LEFT JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) w.owner::oid
    WHERE w.view_id OPERATOR(pg_catalog.=) p_view_id
    FOR UPDATE OF w;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    DELETE FROM eventview.quarantine
    WHERE view_name OPERATOR(pg_catalog.=) v.known_name
      AND NOT EXISTS (SELECT 1 FROM eventview._views o
                      WHERE o.known_name OPERATOR(pg_catalog.=) v.known_name
                        AND o.view_id OPERATOR(pg_catalog.<>) v.view_id);
    DELETE FROM eventview._views WHERE view_id OPERATOR(pg_catalog.=) v.view_id;
    FOR t IN
        SELECT c.oid::pg_catalog.regclass FROM pg_catalog.pg_class c
        WHERE c.relnamespace OPERATOR(pg_catalog.=) 'eventview'::pg_catalog.regnamespace
          AND c.relkind OPERATOR(pg_catalog.=) 'r'
          AND c.relname OPERATOR(pg_catalog.~) pg_catalog.format('^_v%s_(data|m[0-9]+(_log)?)$', v.view_id)
        -- The logs and multisets before the data (none depends on another; the same order
        -- every time keeps two drops from waiting on each other).
        ORDER BY c.relname OPERATOR(pg_catalog.~) '_data$', c.relname
    LOOP
        EXECUTE pg_catalog.format('DROP TABLE IF EXISTS %s', t);
    END LOOP;
    IF v.owner_name IS NOT NULL
       AND pg_catalog.to_regclass(pg_catalog.format('eventview._changes_%s', v.source_id)) IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM eventview._views w
                       WHERE w.source_id OPERATOR(pg_catalog.=) v.source_id
                         AND w.owner::oid OPERATOR(pg_catalog.=) v.owner)
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                       WHERE c.oid OPERATOR(pg_catalog.=) v.source_relid
                         AND c.relowner OPERATOR(pg_catalog.=) v.owner) THEN
        -- (Its REVOKE fires eventview._follow_ddl, which has nothing to add.)
        PERFORM pg_catalog.set_config('eventview.following_ddl', 'on', true);
        EXECUTE pg_catalog.format('REVOKE SELECT ON eventview._changes_%s FROM %I', v.source_id, v.owner_name);
        PERFORM pg_catalog.set_config('eventview.following_ddl', coalesce(following, 'off'), true);
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION eventview._forget_view(integer) FROM PUBLIC;

-- Whether the view's catalog row still names its relation: a view that reads the view's storage.
-- A row can outlive its relation (dropped while event triggers did not fire, or before 0.9.0);
-- after a dump and restore, its old OID may then name an unrelated relation.
CREATE FUNCTION eventview._names_its_relation(p_view_id integer) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (
        SELECT 1
        FROM eventview._views v
        JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) v.relid::oid
                                  AND c.relkind OPERATOR(pg_catalog.=) 'v'
        JOIN pg_catalog.pg_rewrite r ON r.ev_class OPERATOR(pg_catalog.=) c.oid
        JOIN pg_catalog.pg_depend d ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_rewrite'::pg_catalog.regclass
                                   AND d.objid OPERATOR(pg_catalog.=) r.oid
        WHERE v.view_id OPERATOR(pg_catalog.=) p_view_id
          AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
          AND d.refobjid OPERATOR(pg_catalog.=)
              pg_catalog.to_regclass(pg_catalog.format('eventview._v%s_data', p_view_id))::oid)
$$;

-- An incremental view dropped with plain SQL (DROP VIEW, DROP SCHEMA ... CASCADE, DROP OWNED)
-- goes as with drop_view. Before, the catalog kept it: its position held the changelog back
-- from pruning for good, and drop_event_table refused to go past it.
CREATE FUNCTION eventview._follow_drop() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    dropped integer;
BEGIN
    FOR dropped IN
        SELECT w.view_id
        FROM pg_catalog.pg_event_trigger_dropped_objects() d
        JOIN eventview._views w ON w.relid::oid OPERATOR(pg_catalog.=) d.objid
        WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
          AND d.objsubid OPERATOR(pg_catalog.=) 0
        ORDER BY w.view_id
    LOOP
        PERFORM eventview._forget_view(dropped);
    END LOOP;
END
$$;
CREATE EVENT TRIGGER eventview_follow_drop ON sql_drop
    EXECUTE FUNCTION eventview._follow_drop();

-- Incremental views are read-only, as materialized views are: their rows are what refresh made
-- of the events. A stored view would otherwise be a simple auto-updatable view over its storage,
-- and a write through it would be added to by every later refresh (only a rebuild repairs it).
-- Each view gets an INSTEAD OF trigger running this (core::sqlgen::read_only_trigger).
CREATE FUNCTION eventview._refuse_change() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'cannot change incremental view %', TG_RELID::pg_catalog.regclass
        USING ERRCODE = 'wrong_object_type',
              HINT = 'Its rows are aggregated from its event table by eventview.refresh: change the events instead.';
END
$$;

-- ingest refuses a NULL source or events with SQLSTATE 22004 naming the argument (before: a
-- syntax error quoting its own SQL, and 22023).
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
                WHEN 2 THEN 'envelope has no "type" (a non-empty string)'
                WHEN 3 THEN 'bad "version": ' || left((envelope->'version')::text, 100) || ' is not an integer >= 1'
                WHEN 4 THEN 'bad "producer": a JSON ' || jsonb_typeof(envelope->'producer') || ', not a string'
                WHEN 5 THEN 'unparsable "occurred_at": ' || left((envelope->'occurred_at')::text, 100) || ' is not an RFC 3339 timestamp'
                WHEN 6 THEN 'bad "key": a JSON ' || jsonb_typeof(envelope->'key') || ', not a string'
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
            -- In envelope order, so a key repeated within the batch (or seen before) is a
            -- duplicate after its first occurrence: DO NOTHING also skips a row that conflicts
            -- with one this statement inserted.
            ORDER BY ord
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

-- Views created before 0.9.0 get their read-only trigger, and the row types of their storage
-- tables are their owners' alone (see core::sqlgen::storage_grants). Catalog rows that no longer
-- name their view (dropped with plain SQL before 0.9.0, whose rows stayed behind and held their
-- changelog back from pruning) are forgotten.
DO $upgrade$
DECLARE
    v record;
    t regclass;
BEGIN
    -- (Its REVOKEs would fire eventview._follow_ddl, which has nothing to add.)
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'on', true);
    FOR v IN SELECT view_id, relid::oid AS relid FROM eventview._views ORDER BY view_id LOOP
        IF NOT eventview._names_its_relation(v.view_id) THEN
            PERFORM eventview._forget_view(v.view_id);
            CONTINUE;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger tg
                       WHERE tg.tgrelid OPERATOR(pg_catalog.=) v.relid
                         AND tg.tgname OPERATOR(pg_catalog.=) 'eventview_read_only') THEN
            EXECUTE pg_catalog.format(
                'CREATE TRIGGER eventview_read_only INSTEAD OF INSERT OR UPDATE OR DELETE ON %s
    FOR EACH ROW EXECUTE FUNCTION eventview._refuse_change()', v.relid::pg_catalog.regclass);
        END IF;
        FOR t IN
            SELECT c.oid::pg_catalog.regclass FROM pg_catalog.pg_class c
            WHERE c.relnamespace OPERATOR(pg_catalog.=) 'eventview'::pg_catalog.regnamespace
              AND c.relkind OPERATOR(pg_catalog.=) 'r'
              AND c.relname OPERATOR(pg_catalog.~) pg_catalog.format('^_v%s_(data|m[0-9]+(_log)?)$', v.view_id)
        LOOP
            EXECUTE pg_catalog.format('REVOKE USAGE ON TYPE %s FROM PUBLIC', t);
        END LOOP;
    END LOOP;
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'off', true);
END
$upgrade$;
