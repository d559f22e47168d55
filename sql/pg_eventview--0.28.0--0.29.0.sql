-- pg_eventview 0.28.0 -> 0.29.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.29.0'" to load this file. \quit

-- A shard's view of a view over an event table distributed by Citus (a view whose storage is a
-- shard of the view's partial groups, `_views.data_relation`) has no read index: its groups are
-- read by their keys, never by users (`ViewSql::create_read_index`). The shards' views made
-- before drop theirs here, on each node the update runs on, under the settings with which
-- pg_eventview changes a shard itself (`with_shard_access` in src/citus.rs), put back as they
-- were afterwards: the update may run in a transaction that goes on.
DO $$
DECLARE
    settings constant text[] := ARRAY['citus.show_shards_for_app_name_prefixes',
                                      'citus.enable_manual_changes_to_shards',
                                      'citus.enable_ddl_propagation'];
    shard_access constant text[] := ARRAY['*', 'on', 'off'];
    before text[] := '{}';
    read_index regclass;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus')
       OR NOT EXISTS (SELECT FROM eventview._views WHERE data_relation IS NOT NULL) THEN
        RETURN;
    END IF;
    FOR i IN 1 .. pg_catalog.array_length(settings, 1) LOOP
        before := before || pg_catalog.current_setting(settings[i]);
        PERFORM pg_catalog.set_config(settings[i], shard_access[i], true);
    END LOOP;
    FOR read_index IN
        SELECT i.indexrelid::regclass
        FROM eventview._views v
        JOIN pg_catalog.pg_index i ON i.indrelid = v.data_relation
        JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
        WHERE c.relname = '_v' || v.view_id || '_data_read'
    LOOP
        EXECUTE pg_catalog.format('DROP INDEX %s', read_index);
    END LOOP;
    FOR i IN 1 .. pg_catalog.array_length(settings, 1) LOOP
        PERFORM pg_catalog.set_config(settings[i], before[i], true);
    END LOOP;
END $$;
