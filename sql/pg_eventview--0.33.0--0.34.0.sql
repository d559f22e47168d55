-- pg_eventview 0.33.0 -> 0.34.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.34.0'" to load this file. \quit

-- The groups the changes pending for a realtime view's reader touch (crate::realtime), which a
-- realtime view's relation made by 0.34.0 reads in place of those stored groups. A realtime
-- view made before reads as it did (its relation holds the whole pending part) until it is
-- made anew: eventview.alter_view(name, realtime => true) does it. (An extension script may
-- not replace the views, which are their owners' objects.)
CREATE FUNCTION eventview._realtime_pending(view_id integer) RETURNS SETOF record
LANGUAGE c STABLE STRICT ROWS 10
AS 'MODULE_PATHNAME', 'realtime_pending';
