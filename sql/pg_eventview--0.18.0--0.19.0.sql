-- pg_eventview 0.18.0 -> 0.19.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.19.0'" to load this file. \quit
-- Changelogs pruned by whole segments (src/changelog.rs): a changelog is partitioned by range on
-- its record number, and applied segments are emptied and dropped, not deleted from. A changelog
-- made before is turned into the default partition of a partitioned one by the first prune after
-- this update (prune takes the locks it needs without holding captures back for long; this
-- script would hold every capture of every table until it commits).

-- When each changelog segment was made (src/changelog.rs), and the first record number not
-- given out then: the rate of records that sizes the next segment, and the time by which every
-- record of a segment was logged (one is made only once record numbers passed the segments
-- before it). Not dumped: a restored segment is noted when it is found, no earlier than it was
-- made, so no record goes before its delta_retention.
CREATE TABLE eventview._changelog_segments (
    source_id integer NOT NULL,
    lo        bigint NOT NULL,
    made_at   timestamptz NOT NULL DEFAULT now(),
    made_seq  bigint NOT NULL,
    PRIMARY KEY (source_id, lo)
);

CREATE FUNCTION eventview._make_changelog_segments(p_source_id integer) RETURNS integer
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'make_changelog_segments_wrapper';
CREATE FUNCTION eventview._prune_changelog_segments(p_source_id integer, p_delta_retention interval, p_max_rows bigint) RETURNS bigint
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'prune_changelog_segments_wrapper';

DROP FUNCTION eventview._prune_changelog(integer, interval, bigint);
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
                 SELECT applied_snapshot AS s FROM eventview._views WHERE source_id = $1
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
                FROM eventview._views WHERE source_id = $1
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
