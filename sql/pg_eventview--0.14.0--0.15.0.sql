-- pg_eventview 0.14.0 -> 0.15.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.15.0'" to load this file. \quit
-- "Applied" spelled once (eventview._applied); forgetting a view in Rust; changelog pruning in a
-- function of its own; ingest says when a producer lacks SELECT on event_key.

-- As in sql/bootstrap.sql:
CREATE FUNCTION eventview._applied(xid xid8, seq bigint, s pg_snapshot, own xid8, own_seq bigint)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.pg_visible_in_snapshot(xid, s)
           OR coalesce(xid OPERATOR(pg_catalog.=) own AND seq OPERATOR(pg_catalog.<=) own_seq, false)
$$;

-- As in sql/bootstrap.sql:
CREATE OR REPLACE FUNCTION eventview._pending(p_view_id integer, OUT changes bigint, OUT oldest timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_source integer;
    v_applied pg_snapshot;
    v_own xid8;
    v_own_seq bigint;
BEGIN
    SELECT source_id, applied_snapshot, applied_own_xid, applied_own_seq
    INTO v_source, v_applied, v_own, v_own_seq
    FROM eventview._views WHERE view_id = p_view_id;
    IF NOT FOUND OR to_regclass(format('eventview._changes_%s', v_source)) IS NULL THEN
        changes := 0;
        RETURN;
    END IF;
    -- Unknown (NULL) while another session holds the changelog: not a wait for every reader.
    IF NOT eventview._changelog_free(v_source) THEN
        RETURN;
    END IF;
    EXECUTE format(
        'SELECT coalesce(sum(CASE WHEN op = ''I'' THEN cardinality(event_ids) ELSE 1 END), 0)::bigint,
                min(logged_at)
         FROM eventview._changes_%s
         WHERE (xid >= pg_snapshot_xmin($1) OR xid = $2)
           AND NOT eventview._applied(xid, seq, $1, $2, $3)', v_source)
    INTO changes, oldest USING v_applied, v_own, v_own_seq;
END
$$;

-- As in sql/bootstrap.sql:
CREATE OR REPLACE FUNCTION eventview._rebase_positions(p_source_id integer) RETURNS boolean
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
             SELECT r.seq, string_agg(CASE WHEN eventview._applied(r.xid, r.seq, c.s, c.own, c.own_seq)
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

-- Forgetting a view is Rust (views::forget_view); eventview._follow_drop calls it by the same
-- name, and it stays revoked from PUBLIC.
CREATE OR REPLACE FUNCTION eventview."_forget_view"(
	"p_view_id" INT /* i32 */
) RETURNS void /* Result < (), ErrorReport > */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'forget_view_wrapper';

-- As in sql/maintenance.sql:
CREATE FUNCTION eventview._prune_changelog(p_source_id integer, p_delta_retention interval, p_max_rows bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n bigint;
    m bigint;
    done bigint := 0;
    below xid8;
    lo_xid xid8 := '0'::xid8;
    lo_seq bigint := 0;
    hi_xid xid8;
    hi_seq bigint;
    oldest timestamptz;
    batch_size constant integer := 10000;
BEGIN
    EXECUTE 'SELECT min(pg_snapshot_xmax(s)) FROM (
                 SELECT applied_snapshot AS s FROM eventview._views WHERE source_id = $1
                 UNION ALL SELECT observed_snapshot FROM eventview._sources WHERE source_id = $1) k'
        INTO below USING p_source_id;
    LOOP
        EXECUTE format('SELECT count(*), (array_agg(xid ORDER BY xid DESC, seq DESC))[1],
                               (array_agg(seq ORDER BY xid DESC, seq DESC))[1], min(logged_at)
                        FROM (SELECT xid, seq, logged_at FROM eventview._changes_%s
                              WHERE (xid, seq) > ($1, $2) AND xid < $3
                              ORDER BY xid, seq LIMIT $4) w', p_source_id)
            INTO n, hi_xid, hi_seq, oldest USING lo_xid, lo_seq, below, least(batch_size, p_max_rows - done);
        EXIT WHEN n = 0;
        EXECUTE format($q$
            WITH consumers AS (
                SELECT applied_snapshot AS s, applied_own_xid AS own, applied_own_seq AS own_seq
                FROM eventview._views WHERE source_id = $1
                UNION ALL
                SELECT observed_snapshot, observed_own_xid, observed_own_seq
                FROM eventview._sources WHERE source_id = $1
            ),
            gone AS (
                DELETE FROM eventview._changes_%s c
                WHERE (c.xid, c.seq) > ($3, $4) AND (c.xid, c.seq) <= ($5, $6)
                  AND c.logged_at < now() - $2
                  AND NOT EXISTS (SELECT 1 FROM consumers k
                                  WHERE NOT eventview._applied(c.xid, c.seq, k.s, k.own, k.own_seq))
                RETURNING 1
            )
            SELECT count(*) FROM gone
        $q$, p_source_id)
        INTO m USING p_source_id, p_delta_retention, lo_xid, lo_seq, hi_xid, hi_seq;
        done := done + m;
        lo_xid := hi_xid;
        lo_seq := hi_seq;
        -- Records come in (roughly) the order they were logged: once a whole window is
        -- younger than delta_retention, so is what follows.
        EXIT WHEN n < least(batch_size, p_max_rows - done + m) OR done >= p_max_rows
                  OR oldest >= now() - p_delta_retention;
    END LOOP;
    RETURN done;
END
$$;

-- As in sql/maintenance.sql:
CREATE OR REPLACE FUNCTION eventview._prune(source regclass) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s record;
    total bigint := 0;
    -- (The setting exists once the library is loaded; the same default otherwise.)
    max_rows constant bigint := coalesce(nullif(pg_catalog.current_setting('eventview.prune_max_rows', true), ''), '200000')::bigint;
BEGIN
    IF source IS NOT NULL AND NOT pg_catalog.pg_has_role(
            (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = source::oid), 'MEMBER') THEN
        RAISE EXCEPTION 'permission denied to prune event table %: it belongs to role %', source,
                (SELECT c.relowner::regrole FROM pg_catalog.pg_class c WHERE c.oid = source::oid)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Only members of the table''s owner role (and superusers) may prune it.';
    END IF;
    FOR s IN
        SELECT src.source_id, src.relid, src.retention, src.delta_retention,
               eventview._event_table_sql(src.relid::text) AS table_sql
        FROM eventview._sources src
        WHERE (source IS NULL OR src.relid::oid = source::oid)
          AND pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = src.relid::oid), 'MEMBER')
        ORDER BY src.source_id
    LOOP
        -- A view being created on the table: next time.
        CONTINUE WHEN NOT eventview._lock_source_for_prune(s.source_id);
        -- Pruning every table (run_maintenance's): a changelog another session holds (a VACUUM
        -- FULL or LOCK TABLE of it) is left to a later run, not waited for up to the worker's
        -- lock_timeout at every run with every other table's pruning after it.
        IF source IS NULL THEN
            BEGIN
                EXECUTE format('LOCK TABLE eventview._changes_%s IN ROW EXCLUSIVE MODE NOWAIT', s.source_id);
            EXCEPTION WHEN lock_not_available THEN
                RAISE NOTICE 'pg_eventview: changelog of % not pruned: another session holds it locked', s.relid;
                CONTINUE;
            END;
        END IF;
        total := total + eventview._prune_changelog(s.source_id, s.delta_retention, max_rows);
        IF s.retention IS NOT NULL THEN
            -- As the table's owner (its triggers must not run with the maintainer's rights).
            -- Its triggers may also fail: when pruning every table, that one is skipped with a
            -- WARNING and the others (and the rest of run_maintenance) go on. Pruning every
            -- table (run_maintenance's, every naptime) leaves a table another session holds
            -- locked to a later run rather than wait for it (up to the worker's lock_timeout,
            -- at every run, holding up every view's refresh).
            BEGIN
                IF source IS NULL AND NOT eventview._lock_for_pruning_if_free(s.relid::oid) THEN
                    RAISE NOTICE 'pg_eventview: events of % not pruned: another session holds the table locked', s.relid;
                ELSE
                    PERFORM set_config('eventview.pruning', 'on', true);
                    total := total + eventview._prune_events(s.relid::oid, s.retention, max_rows);
                    PERFORM set_config('eventview.pruning', 'off', true);
                END IF;
            EXCEPTION WHEN others THEN
                IF source IS NOT NULL THEN
                    RAISE;
                END IF;
                RAISE WARNING 'pg_eventview: pruning the events of % failed: %', s.relid, SQLERRM;
            END;
        END IF;
    END LOOP;
    RETURN total;
END
$$;

-- As in sql/ingest.sql:
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
            -- In key order (bytewise), then envelope order. Two calls inserting the same keys
            -- wait for each other's uncommitted keys, so they must take keys in one order: in
            -- envelope order, batches of the same keys in opposite orders deadlocked. Within a
            -- key, the first occurrence goes in and the later ones are duplicates: DO NOTHING
            -- also skips a row that conflicts with one this statement inserted. (Event ids of
            -- keyed envelopes follow key order; envelopes without a key come last, in order.)
            ORDER BY envelope->>'key' COLLATE "C", ord
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

-- As in sql/bootstrap.sql:
COMMENT ON TABLE eventview.quarantine IS 'pg_eventview: envelopes the ingest gate refused (view_name NULL) and events left out of a view because a value had the wrong JSON type';
