-- pg_eventview 0.16.0 -> 0.17.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.17.0'" to load this file. \quit
-- The library's insert capture is a native function: the first API call after the update
-- replaces each event table's PL/pgSQL insert capture by it (the extension may not replace
-- run-time objects here).

-- Before DROP EXTENSION pg_eventview, what the extension made at run time goes (see bootstrap.sql).
CREATE FUNCTION eventview._before_drop_extension() RETURNS event_trigger
LANGUAGE c AS 'MODULE_PATHNAME', 'before_drop_extension';
REVOKE EXECUTE ON FUNCTION eventview._before_drop_extension() FROM PUBLIC;

CREATE EVENT TRIGGER eventview_before_drop_extension ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION')
    EXECUTE FUNCTION eventview._before_drop_extension();
