-- pg_eventview 0.4.0 -> 0.5.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.5.0'" to load this file. \quit

-- Min/max values of stored views go to an append-only log per measure, merged into the value
-- multiset lazily (see core::sqlgen); the view's row counts the rows logged.
ALTER TABLE eventview._views ADD COLUMN extremes_logged bigint NOT NULL DEFAULT 0;
GRANT UPDATE (extremes_logged) ON eventview._views TO PUBLIC;

-- The logs of existing views: one per min/max multiset (count_distinct multisets, which have
-- prev_n, keep none), with the multiset's columns and owner. (Created empty: every value so
-- far is in the multisets. A refresh also creates a missing log, as after restoring a dump of
-- an earlier version.)
DO $$
DECLARE
    r record;
BEGIN
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'on', true);
    FOR r IN SELECT c.relname, c.relowner::pg_catalog.regrole AS owner FROM pg_catalog.pg_class c
             WHERE c.relnamespace = 'eventview'::pg_catalog.regnamespace AND c.relkind = 'r'
               AND c.relname OPERATOR(pg_catalog.~) '^_v[0-9]+_m[0-9]+$'
               -- (not the storage of a view dropped with the extension and left behind)
               AND EXISTS (SELECT 1 FROM eventview._views v
                           WHERE v.view_id OPERATOR(pg_catalog.=) pg_catalog.substring(c.relname, '^_v([0-9]+)_')::integer)
               AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                               WHERE a.attrelid = c.oid AND a.attname = 'prev_n' AND NOT a.attisdropped)
               AND pg_catalog.to_regclass(pg_catalog.format('eventview.%I', c.relname OPERATOR(pg_catalog.||) '_log')) IS NULL
    LOOP
        EXECUTE pg_catalog.format('CREATE TABLE eventview.%I (LIKE eventview.%I INCLUDING DEFAULTS)',
                                  r.relname OPERATOR(pg_catalog.||) '_log', r.relname);
        EXECUTE pg_catalog.format('ALTER TABLE eventview.%I OWNER TO %s', r.relname OPERATOR(pg_catalog.||) '_log', r.owner);
        -- Made by this script, it would be a member of the extension; view storage is not (DROP
        -- EXTENSION keeps it, pg_dump dumps it).
        EXECUTE pg_catalog.format('ALTER EXTENSION pg_eventview DROP TABLE eventview.%I', r.relname OPERATOR(pg_catalog.||) '_log');
    END LOOP;
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'off', true);
END
$$;
