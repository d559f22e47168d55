-- pg_eventview 0.16.0 -> 0.17.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.17.0'" to load this file. \quit
-- No catalog change. The library's insert capture is a native function: the first API call
-- after the update replaces each event table's PL/pgSQL insert capture by it (the extension may
-- not replace run-time objects here).
