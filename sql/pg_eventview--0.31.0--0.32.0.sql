-- pg_eventview 0.31.0 -> 0.32.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.32.0'" to load this file. \quit

-- The refresh pass in Rust (eventview_core::group_deltas): a refresh of a view it covers reads
-- each event's group key, measure inputs and type checks from the stored jsonb in one pass and
-- gathers the group deltas there, instead of in the SQL stages of the apply statement.
CREATE FUNCTION eventview."_group_deltas_step"(
	"state" internal,
	"plan" TEXT,
	"width" interval,
	"sign" INT,
	"event_id" bigint,
	"event_type" TEXT,
	"event_version" INT,
	"producer" TEXT,
	"occurred_at" timestamp with time zone,
	"payload" anyelement
) RETURNS internal
PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'group_deltas_step_wrapper';
CREATE FUNCTION eventview."_group_deltas_final"(
	"state" internal
) RETURNS bytea
PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'group_deltas_final_wrapper';
CREATE AGGREGATE eventview._group_deltas(text, interval, integer, bigint, text, integer, text,
                                         timestamptz, anyelement) (
    SFUNC = eventview._group_deltas_step,
    STYPE = internal,
    FINALFUNC = eventview._group_deltas_final,
    FINALFUNC_MODIFY = READ_WRITE
);
CREATE FUNCTION eventview._group_delta_rows(token bytea, part integer) RETURNS SETOF record
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'group_delta_rows';
