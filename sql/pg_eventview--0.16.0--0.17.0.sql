-- pg_eventview 0.16.0 -> 0.17.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.17.0'" to load this file. \quit
-- The insert capture is a native function: the first API call after the update
-- replaces each event table's PL/pgSQL insert capture by it (the extension may not replace
-- run-time objects here).

-- Before DROP EXTENSION pg_eventview, what the extension made at run time goes (see bootstrap.sql).
CREATE FUNCTION eventview._before_drop_extension() RETURNS event_trigger
LANGUAGE c AS 'MODULE_PATHNAME', 'before_drop_extension';
REVOKE EXECUTE ON FUNCTION eventview._before_drop_extension() FROM PUBLIC;

CREATE EVENT TRIGGER eventview_before_drop_extension ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION')
    EXECUTE FUNCTION eventview._before_drop_extension();

-- register_event_table (API.md section 7): adopts an existing table with the envelope.
CREATE FUNCTION eventview._register_event_table(name text, retention interval, delta_retention interval) RETURNS oid
LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'register_event_table_wrapper';

CREATE FUNCTION eventview.register_event_table(
    name            text,
    retention       interval DEFAULT NULL,
    delta_retention interval DEFAULT '7 days'
) RETURNS regclass
LANGUAGE sql VOLATILE
AS $$ SELECT eventview._register_event_table(name, retention, delta_retention)::regclass $$;
COMMENT ON FUNCTION eventview.register_event_table(text, interval, interval) IS
'Adopts an existing table with the pg_eventview envelope as an event table and starts capturing its changes';
