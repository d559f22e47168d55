-- pg_eventview 0.27.0 -> 0.28.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.28.0'" to load this file. \quit

-- For a shard of an event table distributed by Citus: the largest id of the table's drift rows
-- on this node that a coordinator has taken (see sql/bootstrap.sql). 0 at the update: the first
-- refresh or maintenance after it answers every row once more, and the coordinator adds those
-- it does not hold (also any deleted there).
ALTER TABLE eventview._sources ADD COLUMN drift_taken bigint NOT NULL DEFAULT 0;
CREATE INDEX drift_source_id_idx ON eventview.drift (source, id);
