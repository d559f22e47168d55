-- Scheduling and retention: schedule(), run_maintenance(), prune().
-- run_maintenance is what the background worker and pg_cron call.

CREATE FUNCTION eventview.schedule(name text, every interval) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    -- A view over an event table distributed by Citus, or a view of this node.
    v_distributed integer := eventview._distributed_view_id(name);
    v_view_id integer := CASE WHEN v_distributed IS NULL THEN eventview._view_id(name) END;
    v_owner regrole := coalesce(
        (SELECT owner FROM eventview._distributed_views WHERE view_id = v_distributed),
        (SELECT owner FROM eventview._views WHERE view_id = v_view_id));
BEGIN
    IF NOT pg_catalog.pg_has_role(v_owner::oid, 'MEMBER') THEN
        RAISE EXCEPTION 'permission denied to schedule view %: it belongs to role %', name, v_owner
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Only members of the view''s owner role (and superusers) may do this.';
    END IF;
    IF every IS NOT NULL AND every <= interval '0' THEN
        RAISE EXCEPTION 'invalid schedule: % is not a positive interval', every
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Pass NULL to unschedule.';
    END IF;
    IF v_distributed IS NOT NULL THEN
        UPDATE eventview._distributed_views SET schedule = every WHERE view_id = v_distributed;
        RETURN;
    END IF;
    -- A new schedule starts afresh: no backoff left from failures under the old one (a retry
    -- time of 'infinity' from a schedule of 100 years or more would outlive it).
    UPDATE eventview._views SET schedule = every, failures = 0, retry_at = NULL WHERE view_id = v_view_id;
END
$$;
COMMENT ON FUNCTION eventview.schedule(text, interval) IS
'Refreshes the view every interval from run_maintenance (the background worker or pg_cron); NULL unschedules';

-- Algorithm (pruning the changelog): a record can go once every consumer of its source (each
-- view and the field observer) has applied it, and it is older than delta_retention. Applied
-- means eventview._applied: its transaction is visible in the consumer's applied snapshot, or
-- it is the consumer's own transaction's record up to own_seq. Deleting works in batches of at most batch_size
-- records per statement, walking the (xid, seq) index upwards from where the previous batch
-- ended (so a backlog of millions costs one pass, not one rescan of the deleted rows per
-- batch), and at most about eventview.prune_max_rows rows per source per call: one call is one
-- bounded transaction (the worker and pg_cron call it every cycle; call it again while it
-- returns a full count).
-- Raw events older than retention are deleted with capture switched off for this transaction
-- only: pruning history is not a retraction, views keep what they aggregated.
-- Privileges: each source is pruned by (a member of) its owner role, who may delete its rows
-- and its changelog records; prune() without a source skips the tables of other roles.
-- A view being created is not in eventview._views until its creation commits, so prune cannot
-- see which changes it still needs (those committed after its starting snapshot): create_view
-- and rebuild hold the table's row in eventview._prune_guards until they commit
-- (catalog::hold_off_prune), and prune skips the table while it cannot lock that row
-- (eventview._lock_source_for_prune). A row of its own, not the table's catalog row: refreshes
-- lock that row (the field observer), and prune must not wait for them nor make them wait.

-- Deletes the applied changelog records of one event table older than delta_retention, at most
-- max_rows, from its changelog p_log: what whole segments did not take along (src/changelog.rs).
-- Walks the (xid, seq) index upwards in windows of at most 10,000 records below the
-- smallest xmax of the consumers, each window found by an index scan that starts where the
-- previous one ended, and deletes the window's records every consumer has applied
-- (eventview._applied). Work is linear in the records walked, whatever the transaction sizes.
-- Run by the changelog's owner (eventview._prune_changelog_segments).
CREATE FUNCTION eventview._prune_changelog(p_source_id integer, p_log regclass, p_delta_retention interval, p_max_rows bigint)
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
                 SELECT applied_snapshot AS s FROM eventview._views WHERE source_id = $1 AND source_view IS NULL
                 UNION ALL SELECT observed_snapshot FROM eventview._sources WHERE source_id = $1) k'
        INTO below USING p_source_id;
    LOOP
        EXECUTE format('SELECT count(*), (array_agg(xid ORDER BY xid DESC, seq DESC))[1],
                               (array_agg(seq ORDER BY xid DESC, seq DESC))[1], min(logged_at)
                        FROM (SELECT xid, seq, logged_at FROM %s
                              WHERE (xid, seq) > ($1, $2) AND xid < $3
                              ORDER BY xid, seq LIMIT $4) w', p_log)
            INTO n, hi_xid, hi_seq, oldest USING lo_xid, lo_seq, below, least(batch_size, p_max_rows - done);
        EXIT WHEN n = 0;
        EXECUTE format($q$
            WITH consumers AS (
                SELECT applied_snapshot AS s, applied_own_xid AS own, applied_own_seq AS own_seq
                FROM eventview._views WHERE source_id = $1 AND source_view IS NULL
                UNION ALL
                SELECT observed_snapshot, observed_own_xid, observed_own_seq
                FROM eventview._sources WHERE source_id = $1
            ),
            gone AS (
                DELETE FROM %s c
                WHERE (c.xid, c.seq) > ($3, $4) AND (c.xid, c.seq) <= ($5, $6)
                  AND c.logged_at < now() - $2
                  AND NOT EXISTS (SELECT 1 FROM consumers k
                                  WHERE NOT eventview._applied(c.xid, c.seq, k.s, k.own, k.own_seq))
                RETURNING 1
            )
            SELECT count(*) FROM gone
        $q$, p_log)
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

REVOKE EXECUTE ON FUNCTION eventview._prune_changelog(integer, regclass, interval, bigint) FROM PUBLIC;

-- Rotates the changelog of one event table (src/changelog.rs): drops the segments emptied
-- before, empties the applied ones past delta_retention, deletes the applied records past it
-- that remain (eventview._prune_changelog), and makes the next segment ahead of the records. Each lock it needs is
-- waited for at most lock_timeout (100 ms here): a changelog that others hold for longer is left
-- to a later run, with a NOTICE, while a drop that waits for the captures of the moment holds
-- new ones back for no longer than that. Returns the records pruned.
CREATE FUNCTION eventview._rotate_changelog(p_source_id integer, p_delta_retention interval, p_max_rows bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET lock_timeout = '100ms' AS $$
DECLARE
    pruned bigint := 0;
BEGIN
    BEGIN
        pruned := eventview._prune_changelog_segments(p_source_id, p_delta_retention, p_max_rows);
    EXCEPTION WHEN lock_not_available THEN
        RAISE NOTICE 'pg_eventview: changelog of % not pruned: another session holds it',
            (SELECT relid FROM eventview._sources WHERE source_id = p_source_id);
    END;
    BEGIN
        PERFORM eventview._make_changelog_segments(p_source_id);
    EXCEPTION WHEN lock_not_available THEN
        RAISE NOTICE 'pg_eventview: no changelog segment made for %: another session holds the changelog',
            (SELECT relid FROM eventview._sources WHERE source_id = p_source_id);
    END;
    RETURN pruned;
END
$$;

-- Prunes one event table (source) or every table of the caller's roles (NULL): the changelog
-- of each (eventview._rotate_changelog), then its raw events past retention.
CREATE FUNCTION eventview._prune(source regclass) RETURNS bigint
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
        total := total + eventview._rotate_changelog(s.source_id, s.delta_retention, max_rows);
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

-- The name is resolved with the caller's search_path; the work runs with a pinned one (the
-- worker runs it as a superuser, whatever operators a schema on its path may hold).
CREATE FUNCTION eventview.prune(source text DEFAULT NULL) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT eventview._prune(eventview._event_table_sql(source)::regclass)
$$;
COMMENT ON FUNCTION eventview.prune(text) IS
'Deletes changelog records every view has applied (older than delta_retention) and raw events older than retention; returns rows pruned';

-- Refreshes every view whose schedule is due, each in its own subtransaction so that one
-- failing view records its error in last_error and the others go on; then prunes. A view that
-- another session is refreshing right now is skipped, never waited for.
--
-- A view whose event table another session holds locked against reading (an open ALTER TABLE,
-- VACUUM FULL, LOCK TABLE, REINDEX, or one of them waiting for its lock) is skipped without
-- waiting and tried again at the next run: not a failure, so no backoff keeps it stale after the
-- lock is gone, and its refresh does not wait up to lock_timeout while the other views wait
-- their turn. A view not in backoff says so in last_error (one in backoff keeps its error).
--
-- Backoff: after n scheduled refreshes failed in a row, the next try waits
-- schedule * 2^(n-1), at most max(schedule, 1 hour); a view that keeps failing (a producer
-- sending what its type policy 'fail' refuses, a dropped dependency) costs little and its
-- error stays in last_error. Any successful refresh, manual ones included, ends the backoff.
-- Nothing one view's owner can set stops the others: the owner may write schedule and failures
-- (see the grants in bootstrap.sql), so due-ness compares intervals (no timestamp arithmetic to
-- overflow on a schedule of 300,000 years), and the retry time and failure count saturate.
CREATE FUNCTION eventview.run_maintenance() RETURNS void
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
    -- Views over event tables distributed by Citus of the caller's roles, whose schedule is due
    -- (each shard's view refreshed on its node, see src/citus.rs).
    FOR v IN
        SELECT d.view_id, d.relid FROM eventview._distributed_views d
        WHERE d.schedule IS NOT NULL
          AND (d.last_refresh_at IS NULL OR clock_timestamp() - d.last_refresh_at >= d.schedule)
          AND pg_catalog.pg_has_role(d.owner::oid, 'MEMBER')
        ORDER BY coalesce(d.last_refresh_at, '-infinity'), d.view_id
    LOOP
        BEGIN
            PERFORM eventview._refresh(format('%I.%I', n.nspname, c.relname))
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE c.oid = v.relid;
        EXCEPTION WHEN others THEN
            UPDATE eventview._distributed_views SET last_error = SQLERRM WHERE view_id = v.view_id;
            RAISE WARNING 'pg_eventview: refresh of view % failed: %', v.relid, SQLERRM;
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
    -- The shards of event tables distributed by Citus of the caller's roles: observed and
    -- pruned on their nodes, each table on its own (one that fails does not hold back the
    -- others).
    FOR t IN
        SELECT d.relid FROM eventview._distributed_sources d
        WHERE pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = d.relid::oid), 'MEMBER')
        ORDER BY d.relid::oid
    LOOP
        BEGIN
            PERFORM eventview._maintain_distributed(t.relid::oid);
        EXCEPTION WHEN others THEN
            RAISE WARNING 'pg_eventview: maintaining distributed event table % failed: %', t.relid, SQLERRM;
        END;
    END LOOP;
EXCEPTION WHEN undefined_table OR undefined_function OR invalid_schema_name THEN
    -- A DROP EXTENSION pg_eventview that committed while this run went on (waiting for a lock it
    -- held, say) leaves nothing to maintain: the run ends quietly, as the next one would find no
    -- extension (the background worker must not fail over it).
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'pg_eventview') THEN
        RAISE;
    END IF;
END
$$;
COMMENT ON FUNCTION eventview.run_maintenance() IS
'Refreshes every view whose schedule is due, then prunes; called by the background worker and by pg_cron';
