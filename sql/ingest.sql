-- An RFC 3339 timestamp ("2026-11-30T10:00:00Z", "...+02:00") from a JSON string, or NULL when
-- the value is anything else. Postgres-only inputs such as 'now' or 'yesterday' are not RFC 3339.
-- The check (Rust, core::rfc3339) guarantees the cast cannot fail; plain SQL so that it is
-- inlined into the ingest statement and into refreshes (STABLE because the cast is, though the
-- offset is always explicit and the session TimeZone does not matter).
CREATE FUNCTION eventview._rfc3339(j jsonb) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN pg_catalog.jsonb_typeof(j) = 'string' AND eventview._rfc3339_valid(j #>> '{}')
                THEN (j #>> '{}')::pg_catalog.timestamptz END
$$;

-- The ingest gate: validates envelopes, inserts the good ones in one statement, quarantines the
-- bad ones with a reason, and counts duplicates of the idempotency key. Plain SQL on purpose:
-- thousands of envelopes per call run at INSERT ... SELECT speed, with no per-row round trip.
CREATE FUNCTION eventview.ingest(source text, events jsonb)
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
        WITH env AS (
            -- occurred_at is parsed once here, for the check and for the insert (written out
            -- rather than through eventview._rfc3339, which is not inlined on an argument
            -- like this one and would cost a SQL function call per envelope).
            SELECT e AS envelope, ord,
                   CASE WHEN jsonb_typeof(e->'occurred_at') = 'string' AND eventview._rfc3339_valid(e->>'occurred_at')
                        THEN (e->>'occurred_at')::timestamptz END AS ts
            FROM jsonb_array_elements($1) WITH ORDINALITY AS t(e, ord)
        ),
        checked AS (
            SELECT envelope, ord, ts, CASE
                WHEN jsonb_typeof(envelope) <> 'object' THEN
                    'envelope is a JSON ' || jsonb_typeof(envelope) || ', not an object'
                WHEN jsonb_typeof(envelope->'type') IS DISTINCT FROM 'string' OR envelope->>'type' = '' THEN
                    'envelope has no "type" (a non-empty string)'
                WHEN envelope ? 'version' AND envelope->'version' <> 'null'::jsonb AND NOT (
                         jsonb_typeof(envelope->'version') = 'number'
                         AND (envelope->'version')::numeric = trunc((envelope->'version')::numeric)
                         AND (envelope->'version')::numeric BETWEEN 1 AND 2147483647) THEN
                    'bad "version": ' || left((envelope->'version')::text, 100) || ' is not an integer >= 1'
                WHEN envelope ? 'producer' AND envelope->'producer' <> 'null'::jsonb
                     AND jsonb_typeof(envelope->'producer') <> 'string' THEN
                    'bad "producer": a JSON ' || jsonb_typeof(envelope->'producer') || ', not a string'
                WHEN envelope ? 'occurred_at' AND envelope->'occurred_at' <> 'null'::jsonb
                     AND ts IS NULL THEN
                    'unparsable "occurred_at": ' || left((envelope->'occurred_at')::text, 100) || ' is not an RFC 3339 timestamp'
                WHEN envelope ? 'key' AND envelope->'key' <> 'null'::jsonb
                     AND jsonb_typeof(envelope->'key') <> 'string' THEN
                    'bad "key": a JSON ' || jsonb_typeof(envelope->'key') || ', not a string'
                WHEN jsonb_typeof(envelope->'payload') IS DISTINCT FROM 'object' THEN
                    'payload is ' || coalesce('a JSON ' || jsonb_typeof(envelope->'payload'), 'missing') || ', not a JSON object'
                WHEN octet_length((envelope->'payload')::text) > $2 THEN
                    'payload has ' || octet_length((envelope->'payload')::text) || ' bytes, more than eventview.max_payload_bytes (' || $2 || ')'
            END AS reason
            FROM env
        ),
        rejected AS (
            INSERT INTO eventview.quarantine (source, view_name, event_id, reason, event)
            SELECT %2$L::regclass, NULL, NULL, reason, envelope
            FROM checked WHERE reason IS NOT NULL
            ORDER BY ord
        ),
        good AS (
            SELECT envelope, ord, ts FROM checked WHERE reason IS NULL
        ),
        added AS (
            INSERT INTO %1$s (event_key, event_type, event_version, producer, occurred_at, payload)
            SELECT envelope->>'key', envelope->>'type',
                   coalesce((envelope->'version')::numeric::integer, 1),
                   coalesce(envelope->>'producer', current_user),
                   coalesce(ts, now()),
                   envelope->'payload'
            FROM good
            -- In envelope order, so a key repeated within the batch (or seen before) is a
            -- duplicate after its first occurrence: DO NOTHING also skips a row that conflicts
            -- with one this statement inserted.
            ORDER BY ord
            ON CONFLICT (event_key) DO NOTHING
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM added),
               (SELECT count(*) FROM good) - (SELECT count(*) FROM added),
               -- (Counted from the input: a producer may file rejects but not read them back.)
               (SELECT count(*) FROM checked WHERE reason IS NOT NULL)
    $sql$, v_table, v_table) USING events, v_limit;
END
$$;
COMMENT ON FUNCTION eventview.ingest(text, jsonb) IS
'Inserts a JSON array of envelopes through the validation gate; returns inserted, duplicates and quarantined counts';
