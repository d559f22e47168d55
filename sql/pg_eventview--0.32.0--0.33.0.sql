-- pg_eventview 0.32.0 -> 0.33.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.33.0'" to load this file. \quit

-- The functions over changelog positions become C functions (crate::pg::snapshot): every
-- refresh, observation and realtime read calls eventview._snapshot_without_own, and a
-- PL/pgSQL function with a SET clause costs tens of microseconds at each statement's first
-- call. CREATE OR REPLACE keeps their OIDs, so the views and column defaults that call them
-- call the new ones; it also drops their SET clauses.
CREATE OR REPLACE FUNCTION eventview._snapshot_without_own() RETURNS pg_snapshot
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'snapshot_without_own';

CREATE OR REPLACE FUNCTION eventview._position_given_out(s pg_snapshot, own xid8) RETURNS boolean
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'position_given_out';

-- The position check moves into the trigger's WHEN clause: the PL/pgSQL trigger function runs
-- only for a position it refuses, to raise the error.
DROP TRIGGER _views_position_given_out ON eventview._views;
CREATE TRIGGER _views_position_given_out
    BEFORE UPDATE OF applied_snapshot, applied_own_xid ON eventview._views
    FOR EACH ROW
    WHEN ((NEW.applied_snapshot::text IS DISTINCT FROM OLD.applied_snapshot::text
           OR NEW.applied_own_xid IS DISTINCT FROM OLD.applied_own_xid)
          AND NOT eventview._position_given_out(NEW.applied_snapshot, NEW.applied_own_xid))
    EXECUTE FUNCTION eventview._check_position();
