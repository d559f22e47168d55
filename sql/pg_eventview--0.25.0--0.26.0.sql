-- pg_eventview 0.25.0 -> 0.26.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.26.0'" to load this file. \quit
-- Realtime reads of distributed views add the shards' pending changes onto the merged groups
-- while every shard's view is where the last refresh merged it from (src/citus/realtime.rs).
-- NULL until the view's next refresh records the positions: reads merge from every shard's
-- partial groups until then.

ALTER TABLE eventview._distributed_views ADD COLUMN shard_positions json;
