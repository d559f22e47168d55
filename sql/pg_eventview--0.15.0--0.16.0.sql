-- pg_eventview 0.15.0 -> 0.16.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.16.0'" to load this file. \quit
-- Capture wakes the background worker at commit. (Existing capture functions are replaced by
-- the first API call after the update, as the extension may not replace run-time objects here;
-- existing views get their read index at their next refresh.)

CREATE FUNCTION eventview._wake_worker_on_commit() RETURNS boolean
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'wake_worker_on_commit_wrapper';
