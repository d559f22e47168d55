-- pg_eventview 0.26.0 -> 0.27.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.27.0'" to load this file. \quit
-- Capture functions are each node's own (src/pg/node_local.rs). Citus marks a function made on
-- a coordinator as a distributed object and makes it on every worker, where a shard's event
-- table of the same number has a capture function of the same name: a later ALTER or DROP of
-- the coordinator's function would reach the worker's, and a node added to the cluster would
-- get the coordinator's. Those marks are removed (on every node the update runs on; the
-- library gives a capture function owned by another role than its table back to the table's
-- owner at the first call of each backend).
DO $$
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_object') IS NOT NULL THEN
        DELETE FROM pg_catalog.pg_dist_object d USING pg_catalog.pg_proc p
        WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
          AND d.objid OPERATOR(pg_catalog.=) p.oid
          AND p.pronamespace OPERATOR(pg_catalog.=) 'eventview'::pg_catalog.regnamespace
          AND p.proname OPERATOR(pg_catalog.~) '^_capture_[0-9]+_';
    END IF;
END
$$;
