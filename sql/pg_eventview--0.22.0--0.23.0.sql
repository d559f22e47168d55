-- pg_eventview 0.22.0 -> 0.23.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.23.0'" to load this file. \quit
-- Views over event tables distributed by Citus follow shard moves, splits and rebalancing.

-- The delta retention a shard that Citus moved or split onto a node is registered there with.
-- (Tables distributed by 0.22.0 kept it only on each shard's node: theirs is the default.)
ALTER TABLE eventview._distributed_sources
    ADD COLUMN delta_retention interval NOT NULL DEFAULT '7 days';

-- Every per-shard call on a view or a shard carries what its node needs to register a shard
-- that arrived there since, and to make that shard's view.
DROP FUNCTION eventview._attach_shard_view(text, text, json, integer, text);
DROP FUNCTION eventview._refresh_shard_view(text, json);
DROP FUNCTION eventview._maintain_shard(text, json);
CREATE FUNCTION eventview._attach_shard_view(registry_shard text, value text, shards json, view_id integer, arguments text, delta_retention interval) RETURNS text
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'attach_shard_view_wrapper';
CREATE FUNCTION eventview._refresh_shard_view(registry_shard text, value text, shards json, view_id integer, arguments text, delta_retention interval) RETURNS text
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'refresh_shard_view_wrapper';
CREATE FUNCTION eventview._maintain_shard(registry_shard text, shards json, delta_retention interval) RETURNS bigint
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'maintain_shard_wrapper';
REVOKE EXECUTE ON FUNCTION eventview._attach_shard_view(text, text, json, integer, text, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._refresh_shard_view(text, text, json, integer, text, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._maintain_shard(text, json, interval) FROM PUBLIC;
