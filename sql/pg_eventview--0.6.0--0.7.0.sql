-- pg_eventview 0.6.0 -> 0.7.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.7.0'" to load this file. \quit

-- The snapshot every refresh takes twice (and every read of a realtime view once) is computed
-- by PL/pgSQL, which keeps its plan, instead of a SQL function with a SET clause, which is
-- parsed and planned at every call (0.2 ms against 0.03 ms). Same result.
CREATE OR REPLACE FUNCTION eventview._snapshot_without_own() RETURNS pg_snapshot
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN (SELECT CASE
        WHEN own IS NULL OR NOT pg_visible_in_snapshot(own, s) THEN s
        ELSE (least(pg_snapshot_xmin(s)::text::numeric, own::text::numeric)::text || ':' ||
              pg_snapshot_xmax(s)::text || ':' ||
              array_to_string(ARRAY(
                  SELECT x FROM (
                      SELECT pg_snapshot_xip(s)::text::numeric AS x
                      UNION
                      SELECT own::text::numeric
                  ) xs
                  ORDER BY x), ','))::pg_snapshot
    END
    FROM (SELECT pg_current_snapshot() AS s, pg_current_xact_id_if_assigned() AS own) cur);
END
$$;
