-- pg_eventview 0.7.0 -> 0.8.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.8.0'" to load this file. \quit

-- A view's refresh takes back the quarantine entry of an event version it retracts (an update
-- or delete, an erasure request among them); it runs as the view's owner.
CREATE POLICY filers_take_back ON eventview.quarantine FOR DELETE
    USING (view_name IS NOT NULL AND eventview._may_file_quarantine(source, view_name));
GRANT DELETE ON eventview.quarantine TO PUBLIC;

-- prune skips an event table while a view on it is being created (it could not see which
-- changes the new view still needs, and deleted them); the rest of _prune is unchanged.
-- A view being created is not in eventview._views until its creation commits, so prune cannot
-- see which changes it still needs (those committed after its starting snapshot): create_view
-- holds a shared advisory lock on the table until it commits (catalog::hold_off_prune), and prune
-- skips the table while it cannot take the lock exclusively. An advisory lock, not a lock on the
-- table's catalog row: refreshes lock that row (the field observer), and prune must not wait for
-- them nor make them wait. (Key: 1885828709, 'pgve', and the table's source id.)
CREATE FUNCTION eventview._lock_source_for_prune(p_source_id integer) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_try_advisory_xact_lock(1885828709, p_source_id)
$$;

CREATE OR REPLACE FUNCTION eventview._prune(source regclass) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s record;
    n bigint;
    m bigint;
    done bigint;
    below xid8;
    lo_xid xid8;
    lo_seq bigint;
    hi_xid xid8;
    hi_seq bigint;
    oldest timestamptz;
    total bigint := 0;
    batch_size constant integer := 10000;
    -- (The setting exists once the library is loaded; the same default otherwise.)
    max_rows constant bigint := coalesce(nullif(pg_catalog.current_setting('eventview.prune_max_rows', true), ''), '200000')::bigint;
BEGIN
    IF source IS NOT NULL AND NOT pg_catalog.pg_has_role(
            (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = source::oid), 'MEMBER') THEN
        RAISE EXCEPTION 'permission denied to prune event table %', source
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
        -- Walk the (xid, seq) index upwards in windows of batch_size records below the
        -- smallest xmax of the consumers: each window is found by an index scan that starts
        -- where the previous one ended, then its applied records older than delta_retention
        -- are deleted. Work is linear in the records walked, whatever the transaction sizes.
        done := 0;
        lo_xid := '0'::xid8;
        lo_seq := 0;
        EXECUTE 'SELECT min(pg_snapshot_xmax(s)) FROM (
                     SELECT applied_snapshot AS s FROM eventview._views WHERE source_id = $1
                     UNION ALL SELECT observed_snapshot FROM eventview._sources WHERE source_id = $1) k'
            INTO below USING s.source_id;
        LOOP
            EXECUTE format('SELECT count(*), (array_agg(xid ORDER BY xid DESC, seq DESC))[1],
                                   (array_agg(seq ORDER BY xid DESC, seq DESC))[1], min(logged_at)
                            FROM (SELECT xid, seq, logged_at FROM eventview._changes_%s
                                  WHERE (xid, seq) > ($1, $2) AND xid < $3
                                  ORDER BY xid, seq LIMIT $4) w', s.source_id)
                INTO n, hi_xid, hi_seq, oldest USING lo_xid, lo_seq, below, least(batch_size, max_rows - done);
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
                      AND NOT EXISTS (
                          SELECT 1 FROM consumers k
                          WHERE NOT (pg_visible_in_snapshot(c.xid, k.s)
                                     OR coalesce(c.xid = k.own AND c.seq <= k.own_seq, false)))
                    RETURNING 1
                )
                SELECT count(*) FROM gone
            $q$, s.source_id)
            INTO m USING s.source_id, s.delta_retention, lo_xid, lo_seq, hi_xid, hi_seq;
            done := done + m;
            lo_xid := hi_xid;
            lo_seq := hi_seq;
            -- Records come in (roughly) the order they were logged: once a whole window is
            -- younger than delta_retention, so is what follows.
            EXIT WHEN n < least(batch_size, max_rows - done + m) OR done >= max_rows
                      OR oldest >= now() - s.delta_retention;
        END LOOP;
        total := total + done;
        IF s.retention IS NOT NULL THEN
            -- As the table's owner (its triggers must not run with the maintainer's rights).
            -- Its triggers may also fail: when pruning every table, that one is skipped with a
            -- WARNING and the others (and the rest of run_maintenance) go on.
            BEGIN
                PERFORM set_config('eventview.pruning', 'on', true);
                total := total + eventview._prune_events(s.relid::oid, s.retention, max_rows);
                PERFORM set_config('eventview.pruning', 'off', true);
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

-- sum and avg of a logical field declared double precision add the JSON numbers exactly since
-- 0.8.0 (before, each was rounded to 15 significant digits on its way to numeric): views with
-- such a measure are asked, in eventview.views.last_error, to be rebuilt once.
UPDATE eventview._views v
SET rebuild_note = 'pg_eventview 0.8.0 sums double precision fields exactly; rebuild this view once (eventview.rebuild(name))'
WHERE EXISTS (
    SELECT 1
    FROM json_each_text(CASE WHEN json_typeof(v.definition -> 'measures') = 'object' THEN v.definition -> 'measures' END) m,
         eventview._fields f
    WHERE f.source_id = v.source_id AND f.field_type = 'double precision'
      AND m.value ~* ('^\s*(sum|avg)\s*\(\s*' || f.field || '\s*\)\s*$'));

-- count_distinct of a logical field declared timestamptz counts instants since 0.8.0, in the UTC
-- form occurred_at uses (before, the strings as written: one instant written with two offsets
-- counted twice): views with such a measure are asked to be rebuilt once.
UPDATE eventview._views v
SET rebuild_note = 'pg_eventview 0.8.0 counts distinct timestamptz fields as instants; rebuild this view once (eventview.rebuild(name))'
WHERE EXISTS (
    SELECT 1
    FROM json_each_text(CASE WHEN json_typeof(v.definition -> 'measures') = 'object' THEN v.definition -> 'measures' END) m,
         eventview._fields f
    WHERE f.source_id = v.source_id AND f.field_type = 'timestamptz'
      AND m.value ~* ('^\s*count_distinct\s*\(\s*' || f.field || '\s*\)\s*$'));

-- Since 0.8.0 an event whose group key (or key and min/max/count_distinct value) takes more than
-- 2,000 bytes is a type error (before, it was stored while its index entry fit, and failed every
-- refresh when it did not), and a subnormal number in a field declared double precision is a
-- number (before, a type error). A later update or delete of an event stored under the old rule
-- would be retracted under the new one: views that may hold such events are asked to be rebuilt
-- once. The update reads each view's storage once for this.
DO $oversize$
DECLARE
    t record;
    sizes text;
    found boolean;
BEGIN
    FOR t IN
        SELECT v.view_id, c.oid::regclass AS tab
        FROM eventview._views v
        JOIN pg_catalog.pg_class c
          ON c.relnamespace = 'eventview'::regnamespace
         AND c.relname ~ ('^_v' || v.view_id || '_(data|m[0-9]+(_log)?)$')
        ORDER BY v.view_id, c.relname
    LOOP
        SELECT string_agg(pg_catalog.format('coalesce(octet_length(%I::text), 0)', a.attname), ' + ')
        INTO sizes
        FROM pg_catalog.pg_attribute a
        WHERE a.attrelid = t.tab AND a.attnum > 0 AND NOT a.attisdropped
          AND (a.attname ~ '^g[0-9]+$' OR a.attname = 'v');
        IF sizes IS NULL THEN
            CONTINUE;
        END IF;
        EXECUTE pg_catalog.format('SELECT EXISTS (SELECT 1 FROM %s WHERE %s > 1900)', t.tab, sizes) INTO found;
        IF found THEN
            UPDATE eventview._views
            SET rebuild_note = 'pg_eventview 0.8.0 leaves out events whose group key takes more than 2000 bytes; rebuild this view once (eventview.rebuild(name))'
            WHERE view_id = t.view_id;
        END IF;
    END LOOP;
END
$oversize$;

UPDATE eventview._views v
SET rebuild_note = 'pg_eventview 0.8.0 takes subnormal numbers in double precision fields; rebuild this view once (eventview.rebuild(name))'
WHERE (v.quarantined > 0 OR v.skipped > 0)
  AND EXISTS (
    SELECT 1 FROM eventview._fields f
    WHERE f.source_id = v.source_id AND f.field_type = 'double precision'
      AND v.definition::text ~ ('\m' || f.field || '\M'));
