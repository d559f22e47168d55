-- pg_eventview 0.3.0 -> 0.4.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.4.0'" to load this file. \quit

-- Changelogs store the id arrays of inserts uncompressed (compressing them was most of the
-- capture's cost on large inserts; see core::envelope_sql::create_changelog), and view storage
-- leaves room on its pages for updates in place (core::sqlgen::STORAGE_FILLFACTOR; it applies
-- to pages filled from now on, and VACUUM FULL rewrites a table to it).
-- (SET STORAGE changes only the catalog, no rewrite; its lock on each changelog, which
-- producers' captures write to, is held until the update commits. The DDL trigger has nothing
-- to follow here.)
DO $$
DECLARE
    r record;
BEGIN
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'on', true);
    FOR r IN SELECT source_id FROM eventview._sources
             WHERE pg_catalog.to_regclass(pg_catalog.format('eventview._changes_%s', source_id)) IS NOT NULL
    LOOP
        EXECUTE pg_catalog.format('ALTER TABLE eventview._changes_%s ALTER COLUMN event_ids SET STORAGE EXTERNAL', r.source_id);
    END LOOP;
    FOR r IN SELECT c.oid::pg_catalog.regclass AS storage FROM pg_catalog.pg_class c
             WHERE c.relnamespace = 'eventview'::pg_catalog.regnamespace AND c.relkind = 'r'
               AND c.relname OPERATOR(pg_catalog.~) '^_v[0-9]+_(data|m[0-9]+)$'
    LOOP
        EXECUTE pg_catalog.format('ALTER TABLE %s SET (fillfactor = 70)', r.storage);
    END LOOP;
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'off', true);
END
$$;

-- Refreshes find the runs of changed event ids in Rust.
CREATE FUNCTION eventview."_id_runs"(
	"ids" bigint[]
) RETURNS TABLE (
	"lo" bigint,
	"hi" bigint,
	"chunk" INT
)
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'id_runs_wrapper';

-- The ingest gate checks each envelope in one pass in Rust over the stored jsonb.
CREATE FUNCTION eventview."_envelope_problem"(
	"envelope" anyelement,
	"max_payload_bytes" bigint
) RETURNS INT
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'envelope_problem_wrapper';

-- The gate itself: the checks above, and JSON null in version, producer, occurred_at or key
-- taken as the default (0.3.0 refused the whole call on a null version).
CREATE OR REPLACE FUNCTION eventview.ingest(source text, events jsonb)
RETURNS TABLE(inserted bigint, duplicates bigint, quarantined bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_table text := eventview._event_table_sql(source);
    -- pg_settings.setting is in bytes whatever unit the user wrote ('64kB').
    v_limit bigint := (SELECT setting::bigint FROM pg_catalog.pg_settings WHERE name = 'eventview.max_payload_bytes');
BEGIN
    IF events IS NULL OR jsonb_typeof(events) <> 'array' THEN
        RAISE EXCEPTION 'invalid events: expected a JSON array of envelopes, found %',
            coalesce(jsonb_typeof(events), 'NULL')
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
COMMENT ON FUNCTION eventview.ingest(text, jsonb) IS
'Inserts a JSON array of envelopes through the validation gate; returns inserted, duplicates and quarantined counts';
