-- pg_eventview 0.17.0 -> 0.18.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.18.0'" to load this file. \quit
-- Partitioned event tables (API.md section 7): create_event_table's partition_interval, the
-- partitions made ahead by run_maintenance, the capture of every partition, event keys unique
-- across partitions, and prune dropping whole partitions.

ALTER TABLE eventview._sources ADD COLUMN partition_interval interval;

CREATE FUNCTION eventview._create_partitioned_event_table(name text, retention interval, delta_retention interval, partition_interval interval) RETURNS oid
LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'create_partitioned_event_table_wrapper';
CREATE FUNCTION eventview._make_partitions(p_source_id integer) RETURNS integer
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'make_partitions_wrapper';
CREATE FUNCTION eventview._follow_partition_tree(p_source_id integer) RETURNS void
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'follow_partition_tree_wrapper';
-- Called by the event trigger eventview_follow_partitions (as the extension owner); nobody else.
REVOKE EXECUTE ON FUNCTION eventview._follow_partition_tree(integer) FROM PUBLIC;
CREATE FUNCTION eventview._claim_event_keys(source oid, keys text[]) RETURNS text[]
LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'claim_event_keys_wrapper';

DROP FUNCTION eventview.create_event_table(text, interval, interval);
CREATE FUNCTION eventview.create_event_table(
    name               text,
    retention          interval DEFAULT NULL,
    delta_retention    interval DEFAULT '7 days',
    partition_interval interval DEFAULT NULL
) RETURNS regclass
LANGUAGE sql VOLATILE
AS $$ SELECT (CASE WHEN partition_interval IS NULL
                   THEN eventview._create_event_table(name, retention, delta_retention)
                   ELSE eventview._create_partitioned_event_table(name, retention, delta_retention, partition_interval)
              END)::regclass $$;
COMMENT ON FUNCTION eventview.create_event_table(text, interval, interval, interval) IS
'Creates an event table with the pg_eventview envelope (partitioned by occurred_at with a partition_interval) and starts capturing its changes';

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
        RETURNING n.was, n.now
    )
    UPDATE eventview.quarantine q SET view_name = r2.now
    FROM renamed r2 WHERE q.view_name OPERATOR(pg_catalog.=) r2.was;
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'off', true);
END
$$;

-- Partitions of partitioned event tables, made by anyone (CREATE TABLE ... PARTITION OF, ALTER
-- TABLE ... ATTACH PARTITION, pg_partman, pg_eventview itself), get the capture triggers: a
-- statement that writes a partition directly fires that partition's triggers, not the root's.
-- A partition detached loses them, once views have applied its events (else 55000). See
-- partitions::follow_partitions (which leaves a tree alone while its root has no capture yet, as
-- during a restore).
CREATE FUNCTION eventview._follow_partitions() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM eventview._follow_partition_tree(s.source_id)
    FROM eventview._sources s
    WHERE s.relid::oid OPERATOR(pg_catalog.<>) 0
      AND s.relid::oid IN (SELECT pg_catalog.pg_partition_root(d.objid)
                           FROM pg_catalog.pg_event_trigger_ddl_commands() d
                           WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass)
    ORDER BY s.source_id;
END
$$;
CREATE EVENT TRIGGER eventview_follow_partitions ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE')
    EXECUTE FUNCTION eventview._follow_partitions();

-- Before DROP TABLE or ALTER TABLE ... DETACH PARTITION of a partition of an event table:
-- refused (55000) while views have not applied its events (see partitions::before_removal).
CREATE FUNCTION eventview._before_partition_removal() RETURNS event_trigger
LANGUAGE c AS 'MODULE_PATHNAME', 'before_partition_removal';
REVOKE EXECUTE ON FUNCTION eventview._before_partition_removal() FROM PUBLIC;

CREATE EVENT TRIGGER eventview_before_partition_removal ON ddl_command_start
    WHEN TAG IN ('DROP TABLE', 'ALTER TABLE')
    EXECUTE FUNCTION eventview._before_partition_removal();

CREATE OR REPLACE FUNCTION eventview.ingest(source text, events jsonb)
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

CREATE OR REPLACE FUNCTION eventview.run_maintenance() RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v record;
    v_skipped boolean;
    t record;
BEGIN
    -- Partitions ahead of time, for each partitioned event table of the caller's roles (as
    -- prune), before the refreshes: a table that cannot get its partitions made (a lock wait
    -- past lock_timeout, say) takes its events in its default partition meanwhile.
    FOR t IN
        SELECT s.source_id, s.relid FROM eventview._sources s
        WHERE s.partition_interval IS NOT NULL
          AND pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = s.relid::oid), 'MEMBER')
        ORDER BY s.source_id
    LOOP
        BEGIN
            PERFORM eventview._make_partitions(t.source_id);
        EXCEPTION WHEN others THEN
            RAISE WARNING 'pg_eventview: making partitions of % failed: %', t.relid, SQLERRM;
        END;
    END LOOP;
    FOR v IN
        SELECT view_id, relid, schedule, failures FROM eventview._views
        WHERE schedule IS NOT NULL
          AND (last_refresh_at IS NULL OR clock_timestamp() - last_refresh_at >= schedule)
          AND (retry_at IS NULL OR retry_at <= clock_timestamp())
        ORDER BY coalesce(last_refresh_at, '-infinity'), view_id
    LOOP
        BEGIN
            PERFORM 1 FROM eventview._views WHERE view_id = v.view_id FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                SELECT eventview._refresh_unless_locked(format('%I.%I', n.nspname, c.relname)) IS NULL INTO v_skipped
                FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE c.oid = v.relid;
                IF v_skipped THEN
                    UPDATE eventview._views w
                    SET last_error = format('scheduled refresh skipped: event table %s was locked by another session',
                                            (SELECT s.relid::regclass FROM eventview._sources s WHERE s.source_id = w.source_id))
                    WHERE w.view_id = v.view_id AND w.failures = 0;
                END IF;
            END IF;
        EXCEPTION WHEN others THEN
            -- (The failed refresh let go of the view's row: a manual refresh may hold it now.
            -- Under a lock_timeout, a wait for it that times out skips the record, not the run.)
            BEGIN
                UPDATE eventview._views
                SET last_error = SQLERRM,
                    failures = least(greatest(v.failures, 0), 1000000000) + 1,
                    retry_at = CASE WHEN v.schedule >= interval '100 years' THEN 'infinity'::timestamptz
                                    ELSE clock_timestamp()
                                         + CASE WHEN v.schedule >= interval '1 hour' THEN v.schedule
                                                ELSE least(v.schedule * power(2, least(greatest(v.failures, 0), 20)),
                                                           interval '1 hour') END
                               END
                WHERE view_id = v.view_id;
            EXCEPTION WHEN lock_not_available THEN
                RAISE WARNING 'pg_eventview: refresh of view % failed and could not be recorded: %', v.relid, SQLERRM;
            END;
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
    -- A failed prune (a lock wait past lock_timeout, say) must not take back the refreshes.
    BEGIN
        PERFORM eventview.prune();
    EXCEPTION WHEN others THEN
        RAISE WARNING 'pg_eventview: pruning failed: %', SQLERRM;
    END;
EXCEPTION WHEN undefined_table OR undefined_function OR invalid_schema_name THEN
    -- A DROP EXTENSION pg_eventview that committed while this run went on (waiting for a lock it
    -- held, say) leaves nothing to maintain: the run ends quietly, as the next one would find no
    -- extension (the background worker must not fail over it).
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'pg_eventview') THEN
        RAISE;
    END IF;
END
$$;
