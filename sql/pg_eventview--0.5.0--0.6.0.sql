-- pg_eventview 0.5.0 -> 0.6.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.6.0'" to load this file. \quit

-- Row estimate of the refresh's set-returning function (see core::batch::touched_rows): the
-- default of 1000 rows made every hash aggregate above it allocate and scan tables sized for
-- millions of groups, a quarter of the time of a small refresh.
ALTER FUNCTION eventview._id_runs(bigint[]) ROWS 10;

-- The field observer's payload walk becomes an aggregate (one call per event, walking the
-- stored payload in place) instead of a function over arrays of payloads.
DROP FUNCTION eventview."_payload_shapes"(TEXT[], INT[], anyarray);
CREATE FUNCTION eventview."_shapes_step"(
	"state" internal,
	"event_type" TEXT,
	"event_version" INT,
	"payload" anyelement
) RETURNS internal
IMMUTABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'shapes_step_wrapper';
CREATE FUNCTION eventview."_shapes_final"(
	"state" internal
) RETURNS TEXT
IMMUTABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'shapes_final_wrapper';
CREATE AGGREGATE eventview._shapes_agg(text, integer, anyelement) (
    SFUNC = eventview._shapes_step,
    STYPE = internal,
    FINALFUNC = eventview._shapes_final,
    FINALFUNC_MODIFY = READ_WRITE
);
