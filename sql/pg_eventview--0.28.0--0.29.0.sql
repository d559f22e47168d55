-- pg_eventview 0.28.0 -> 0.29.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.29.0'" to load this file. \quit

-- A shard's view of a view over an event table distributed by Citus (a view whose storage is a
-- shard of the view's partial groups, `_views.data_relation`) has no read index: its groups are
-- read by their keys, never by users (`ViewSql::create_read_index`). The shards' views made
-- before drop theirs here, on each node the update runs on, with the settings under which
-- pg_eventview changes a shard itself (`with_shard_access` in src/citus.rs).
DO $$
DECLARE
    read_index regclass;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    PERFORM pg_catalog.set_config('citus.show_shards_for_app_name_prefixes', '*', true);
    PERFORM pg_catalog.set_config('citus.enable_manual_changes_to_shards', 'on', true);
    PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', 'off', true);
    FOR read_index IN
        SELECT i.indexrelid::regclass
        FROM eventview._views v
        JOIN pg_catalog.pg_index i ON i.indrelid = v.data_relation
        JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
        WHERE c.relname = '_v' || v.view_id || '_data_read'
    LOOP
        EXECUTE pg_catalog.format('DROP INDEX %s', read_index);
    END LOOP;
END $$;
