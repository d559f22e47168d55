-- An RFC 3339 timestamp ("2026-11-30T10:00:00Z", "...+02:00") from a JSON string, or NULL when
-- the value is anything else. Postgres-only inputs such as 'now' or 'yesterday' are not RFC 3339.
-- The check (Rust, eventview_core::rfc3339) guarantees the cast cannot fail; plain SQL so that
-- it is inlined into refreshes (STABLE because the cast is, though the offset is always explicit
-- and the session TimeZone does not matter). The ingest gate checks occurred_at in its own pass.
-- Inlined, its body is parsed with the search_path of the query it is inlined into (a realtime
-- view's reader's): every operator is spelled with its schema, so none of theirs can match.
CREATE FUNCTION eventview._rfc3339(j jsonb) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN pg_catalog.jsonb_typeof(j) OPERATOR(pg_catalog.=) 'string'
                     AND eventview._rfc3339_valid(j OPERATOR(pg_catalog.#>>) '{}'::pg_catalog.text[])
                THEN (j OPERATOR(pg_catalog.#>>) '{}'::pg_catalog.text[])::pg_catalog.timestamptz END
$$;

-- The ingest gate: validates envelopes, inserts the good ones in one statement, quarantines the
-- bad ones with a reason, and counts duplicates of the idempotency key. Thousands of envelopes
-- per call at INSERT ... SELECT speed, with no per-row round trip: each envelope is checked by
-- one pass in Rust over the stored jsonb (eventview._envelope_problem,
-- eventview_core::envelope_check), which returns the number of its first problem; the reason
-- text is written here, only for the envelopes refused.
CREATE FUNCTION eventview.ingest(source text, events jsonb)
RETURNS TABLE(inserted bigint, duplicates bigint, quarantined bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_table text := eventview._event_table_sql(source);
    -- pg_settings.setting is in bytes whatever unit the user wrote ('64kB').
    v_limit bigint := (SELECT setting::bigint FROM pg_catalog.pg_settings WHERE name = 'eventview.max_payload_bytes');
    -- A partitioned event table has no unique index on event_key for ON CONFLICT: its keys are
    -- claimed in its key table first (eventview._claim_event_keys, in key order), and only the
    -- first envelope of each claimed key goes in.
    v_partitioned boolean := (SELECT c.relkind OPERATOR(pg_catalog.=) 'p' FROM pg_catalog.pg_class c
                              WHERE c.oid OPERATOR(pg_catalog.=) v_table::regclass::oid);
    v_claims text := CASE WHEN v_partitioned THEN $claims$
        claimed AS (
            -- (The key function takes the claims over in this transaction, as it knows from
            -- the setting.)
            SELECT eventview._claim_event_keys($3, ARRAY(SELECT envelope->>'key' FROM checked WHERE problem IS NULL)) AS keys,
                   pg_catalog.set_config('eventview.keys_claimed', 'on', true) AS marked
        ),
        first_of_key AS (
            SELECT pg_catalog.min(ord) AS ord FROM checked
            WHERE problem IS NULL AND envelope->>'key' = ANY ((SELECT keys FROM claimed)::text[])
            GROUP BY envelope->>'key'
        ),$claims$ ELSE '' END;
    v_claimed text := CASE WHEN v_partitioned
                           THEN 'AND (envelope->>''key'' IS NULL OR ord IN (SELECT ord FROM first_of_key))'
                           ELSE '' END;
    v_on_conflict text := CASE WHEN v_partitioned THEN '' ELSE 'ON CONFLICT (event_key) DO NOTHING' END;
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
                  HINT = pg_catalog.format('Its owner, role %s, may grant it with the read of event_key ingest also needs: GRANT INSERT, SELECT (event_key) ON %s TO %I.',
                                           (SELECT c.relowner::regrole FROM pg_catalog.pg_class c WHERE c.oid = v_table::regclass),
                                           v_table::regclass, current_user);
    END IF;
    -- Duplicates are found by ON CONFLICT (event_key), which reads that column.
    IF NOT pg_catalog.has_column_privilege(v_table, 'event_key', 'SELECT') THEN
        RAISE EXCEPTION 'permission denied to ingest into event table %: SELECT on its event_key column is needed to find duplicates', v_table::regclass
            USING ERRCODE = 'insufficient_privilege',
                  HINT = pg_catalog.format('Its owner, role %s, may grant it: GRANT SELECT (event_key) ON %s TO %I.',
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
        ),%3$s
        added AS (
            -- JSON null in version, producer, occurred_at or key means the default (->> gives
            -- NULL); occurred_at was checked to be RFC 3339, so its cast cannot fail.
            INSERT INTO %1$s (event_key, event_type, event_version, producer, occurred_at, payload)
            SELECT envelope->>'key', envelope->>'type',
                   coalesce((envelope->>'version')::numeric::integer, 1),
                   coalesce(envelope->>'producer', current_user),
                   coalesce((envelope->>'occurred_at')::timestamptz, now()),
                   envelope->'payload'
            FROM checked WHERE problem IS NULL %4$s
            -- In key order (bytewise), then envelope order. Two calls inserting the same keys
            -- wait for each other's uncommitted keys, so they must take keys in one order: in
            -- envelope order, batches of the same keys in opposite orders deadlocked. Within a
            -- key, the first occurrence goes in and the later ones are duplicates: DO NOTHING
            -- also skips a row that conflicts with one this statement inserted. (Event ids of
            -- keyed envelopes follow key order; envelopes without a key come last, in order.)
            ORDER BY envelope->>'key' COLLATE "C", ord
            %5$s
            RETURNING 1
        ),
        -- (Counted from the input: a producer may file rejects but not read them back.)
        refused AS (SELECT count(*) AS n FROM checked WHERE problem IS NOT NULL)
        SELECT (SELECT count(*) FROM added),
               jsonb_array_length($1) - (SELECT n FROM refused) - (SELECT count(*) FROM added),
               (SELECT n FROM refused)
    $sql$, v_table, v_table, v_claims, v_claimed, v_on_conflict) USING events, v_limit, v_table::regclass::oid;
END
$$;
COMMENT ON FUNCTION eventview.ingest(text, jsonb) IS
'Inserts a JSON array of envelopes through the validation gate; returns inserted, duplicates and quarantined counts';
