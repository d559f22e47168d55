-- pg_eventview 0.5.0 -> 0.6.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.6.0'" to load this file. \quit

-- Row estimates of the refresh's set-returning functions (see core::batch::touched_rows): the
-- default of 1000 rows made every hash aggregate above them allocate and scan tables sized for
-- millions of groups, a quarter of the time of a small refresh.
ALTER FUNCTION eventview._id_runs(bigint[]) ROWS 10;
ALTER FUNCTION eventview._payload_shapes(text[], integer[], anyarray) ROWS 100;
