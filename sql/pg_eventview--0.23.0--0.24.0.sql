-- pg_eventview 0.23.0 -> 0.24.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.24.0'" to load this file. \quit
-- The coordinator's quarantine shows the entries of views over distributed event tables.

-- Copies of the entries each shard's view filed on its node, with the shard that filed each;
-- a view's next refresh makes them (src/citus/quarantine.rs).
CREATE TABLE eventview._distributed_quarantine (
    id          bigint PRIMARY KEY REFERENCES eventview.quarantine ON DELETE CASCADE,
    view_id     integer NOT NULL REFERENCES eventview._distributed_views ON DELETE CASCADE,
    shard       text NOT NULL,
    shard_entry bigint NOT NULL
);
CREATE INDEX ON eventview._distributed_quarantine (view_id, shard);
COMMENT ON TABLE eventview._distributed_quarantine IS 'pg_eventview: quarantine entries of distributed views, with the shard that filed each';
SELECT pg_catalog.pg_extension_config_dump('eventview._distributed_quarantine', '');

-- The owners of a distributed view see its entries.
CREATE FUNCTION eventview._may_see_distributed_quarantine(entry bigint) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM eventview._distributed_quarantine m
                   JOIN eventview._distributed_views d ON d.view_id = m.view_id
                   WHERE m.id = entry AND pg_catalog.pg_has_role(d.owner::oid, 'MEMBER'))
$$;
CREATE POLICY distributed_view_owners_read ON eventview.quarantine FOR SELECT
    USING (eventview._may_see_distributed_quarantine(id));
GRANT SELECT ON eventview._distributed_quarantine TO PUBLIC;

-- A shard's node answers with its view's entries.
CREATE FUNCTION eventview._shard_quarantine(registry_shard text, value text, shards json) RETURNS text
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'shard_quarantine_wrapper';
REVOKE EXECUTE ON FUNCTION eventview._shard_quarantine(text, text, json) FROM PUBLIC;
