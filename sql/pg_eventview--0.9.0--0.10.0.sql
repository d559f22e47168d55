-- pg_eventview 0.9.0 -> 0.10.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.10.0'" to load this file. \quit

-- run_maintenance: nothing one view's owner can set stops the other views' maintenance (a
-- schedule of 300,000 years overflowed the due time and failed every run; a failure count set
-- to the largest integer overflowed in the error handler). Same body as in sql/maintenance.sql.
CREATE OR REPLACE FUNCTION eventview.run_maintenance() RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v record;
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
                PERFORM eventview._refresh(format('%I.%I', n.nspname, c.relname))
                FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE c.oid = v.relid;
            END IF;
        EXCEPTION WHEN others THEN
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
    PERFORM eventview.prune();
END
$$;

-- A view's owner reads its event table's changelog only while no row-level security of the
-- table applies to it (the changelog holds rows the policies hide). Same body as in
-- sql/bootstrap.sql.
CREATE OR REPLACE FUNCTION eventview._sync_changelog_readers() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
    following text := pg_catalog.current_setting('eventview.following_ddl', true);
BEGIN
    -- Its GRANTs and REVOKEs fire the DDL trigger, which has nothing to add.
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'on', true);
    FOR r IN
        SELECT DISTINCT v.source_id, o.rolname AS reader,
               pg_catalog.has_table_privilege(v.owner::oid, s.relid::oid, 'SELECT')
               -- Not where the table's row-level security applies to the owner: the changelog
               -- holds rows its policies hide (privileges::require_no_row_security).
               AND NOT (c.relrowsecurity AND NOT o.rolbypassrls
                        AND (c.relforcerowsecurity OR NOT pg_catalog.pg_has_role(v.owner::oid, c.relowner, 'USAGE')))
                   AS may_read,
               EXISTS (SELECT 1 FROM pg_catalog.pg_class l, pg_catalog.aclexplode(l.relacl) a
                       WHERE l.oid OPERATOR(pg_catalog.=) log.oid
                         AND a.grantee OPERATOR(pg_catalog.=) v.owner::oid
                         AND a.privilege_type OPERATOR(pg_catalog.=) 'SELECT') AS reads
        FROM eventview._views v
        JOIN eventview._sources s ON s.source_id OPERATOR(pg_catalog.=) v.source_id
        JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) s.relid::oid
        JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) v.owner::oid
        CROSS JOIN LATERAL (SELECT pg_catalog.to_regclass(
                                pg_catalog.format('eventview._changes_%s', v.source_id))::oid AS oid) log
        WHERE c.relowner OPERATOR(pg_catalog.<>) v.owner::oid AND NOT o.rolsuper AND log.oid IS NOT NULL
    LOOP
        IF r.may_read AND NOT r.reads THEN
            EXECUTE pg_catalog.format('GRANT SELECT ON eventview._changes_%s TO %I', r.source_id, r.reader);
        ELSIF r.reads AND NOT r.may_read THEN
            EXECUTE pg_catalog.format('REVOKE SELECT ON eventview._changes_%s FROM %I', r.source_id, r.reader);
        END IF;
    END LOOP;
    PERFORM pg_catalog.set_config('eventview.following_ddl', coalesce(following, 'off'), true);
END
$$;

-- Views whose owners the table's policies restrict lose the changelog now.
SELECT eventview._sync_changelog_readers();
