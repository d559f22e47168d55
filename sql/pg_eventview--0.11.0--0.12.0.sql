-- pg_eventview 0.11.0 -> 0.12.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.12.0'" to load this file. \quit

-- run_maintenance's refresh of a view: skipped, without waiting, while another session holds
-- the view's event table locked against reading (tried again at the next run, with a note in
-- last_error), instead of waiting up to lock_timeout and backing off as after a failure.
-- As cargo pgrx schema declares it.
CREATE  FUNCTION eventview."_refresh_unless_locked"(
	"name" TEXT /* & str */
) RETURNS bigint /* Result < Option < i64 >, ErrorReport > */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'refresh_view_unless_locked_wrapper';

-- run_maintenance: skips a view whose event table is locked (above).
-- Same body as in sql/maintenance.sql.
CREATE OR REPLACE FUNCTION eventview.run_maintenance() RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v record;
    v_skipped boolean;
BEGIN
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
                    SET last_error = format('refresh skipped: event table %s is locked by another session; tried again at the next run',
                                            (SELECT s.relid::regclass FROM eventview._sources s WHERE s.source_id = w.source_id))
                    WHERE w.view_id = v.view_id;
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
END
$$;
