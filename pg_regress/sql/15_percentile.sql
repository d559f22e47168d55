\set VERBOSITY terse
-- percentile(ref, p) (API.md section 9): exactly percentile_disc(p) WITHIN GROUP (ORDER BY value)
-- over the group's non-null numbers, kept exact under retraction, read from the group's value
-- multiset.
SET TimeZone = 'UTC';
SELECT eventview.create_event_table('lat');
-- Refused (22023): no fraction, a fraction outside [0, 1] or not a number, a reference that is
-- not a number.
\set VERBOSITY default
SELECT eventview.create_view('lat_bad', 'lat', measures => '{"p": "percentile($.ms)"}');
SELECT eventview.create_view('lat_bad', 'lat', measures => '{"p": "percentile($.ms, 1.01)"}');
SELECT eventview.create_view('lat_bad', 'lat', measures => '{"p": "percentile($.ms, fifty)"}');
SELECT eventview.create_view('lat_bad', 'lat', measures => '{"p": "percentile(occurred_at, 0.5)"}');
\set VERBOSITY terse
SELECT to_regclass('lat_bad') IS NULL AS nothing_made;
SELECT eventview.create_view('lat_route', 'lat', group_by => '{"route": "$.route"}',
  measures => '{"n": "count(*)", "p0": "percentile($.ms, 0)", "p50": "percentile($.ms, 0.5)",
                "p90": "percentile($.ms, 0.9)", "p100": "percentile($.ms, 1)"}');
SELECT eventview.create_view('lat_live', 'lat', group_by => '{"route": "$.route"}',
  measures => '{"p50": "percentile($.ms, 0.5)"}', realtime => true);
INSERT INTO lat (event_type, payload)
SELECT 'req', jsonb_build_object('route', r, 'ms', ms)
FROM (VALUES ('/a', 5), ('/a', 1), ('/a', 3), ('/a', 3), ('/a', 100), ('/b', 7), ('/b', 2.5), ('/c', NULL)) v(r, ms);
-- Realtime, before any refresh.
SELECT * FROM lat_live ORDER BY route;
SELECT eventview.refresh_all() > 0 AS applied;
SELECT * FROM lat_route ORDER BY route;
-- A retraction moves every percentile; a group's last value gone leaves NULL.
DELETE FROM lat WHERE payload @> '{"ms": 100}';
UPDATE lat SET payload = '{"route": "/b", "ms": null}' WHERE payload @> '{"ms": 7}';
SELECT * FROM lat_live ORDER BY route;
SELECT eventview.refresh_all() > 0 AS applied;
SELECT * FROM lat_route ORDER BY route;
-- Equal to percentile_disc from scratch.
SELECT count(*) AS differences FROM (
  (SELECT route, p0, p50, p90, p100 FROM lat_route EXCEPT
   SELECT route, percentile_disc(0) WITHIN GROUP (ORDER BY ms), percentile_disc(0.5) WITHIN GROUP (ORDER BY ms),
          percentile_disc(0.9) WITHIN GROUP (ORDER BY ms), percentile_disc(1) WITHIN GROUP (ORDER BY ms)
   FROM (SELECT payload ->> 'route' AS route,
                CASE WHEN jsonb_typeof(payload -> 'ms') = 'number' THEN (payload -> 'ms')::numeric END AS ms
         FROM lat) e
   GROUP BY 1)) d;
-- A point read by group key uses the read index, and the group's multiset by its key index.
CREATE FUNCTION plan_of(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE l text; r text := '';
BEGIN
    FOR l IN EXECUTE 'EXPLAIN (COSTS OFF) ' || q LOOP r := r || l || E'\n'; END LOOP;
    RETURN r;
END $$;
SELECT plan_of($$SELECT p50 FROM lat_route WHERE route = '/a'$$) ~ 'Index Scan on _v[0-9]+_data_read' AS read_index,
       plan_of($$SELECT p50 FROM lat_route WHERE route = '/a'$$) ~ 'Index Scan using _v[0-9]+_m[0-9]+_key' AS multiset_key_index;
DROP FUNCTION plan_of(text);
-- A full rebuild recomputes the multisets.
SELECT eventview.rebuild('lat_route');
SELECT * FROM lat_route ORDER BY route;
-- approx_percentile: within 1% of percentile_disc, from a sketch of log-spaced buckets whose
-- counts add and subtract exactly (retraction included), negative numbers and 0 too.
SELECT eventview.create_view('lat_approx', 'lat', group_by => '{"route": "$.route"}',
  measures => '{"n": "count(*)", "p0": "approx_percentile($.ms, 0)", "p50": "approx_percentile($.ms, 0.5)",
                "p99": "approx_percentile($.ms, 0.99)", "p100": "approx_percentile($.ms, 1)"}', realtime => true);
INSERT INTO lat (event_type, payload)
SELECT 'req', jsonb_build_object('route', '/d', 'ms', round((g * 1.37 - 300)::numeric, 2)) FROM generate_series(1, 1000) g
UNION ALL SELECT 'req', '{"route": "/d", "ms": 0}';
CREATE FUNCTION approx_errors() RETURNS TABLE (route text, within_one_percent boolean) LANGUAGE sql AS $$
  SELECT a.route,
         bool_and(coalesce(abs(x.approx - x.exact) <= 0.01 * abs(x.exact) + 1e-12, x.approx IS NULL AND x.exact IS NULL))
  FROM lat_approx a
  JOIN (SELECT payload ->> 'route' AS route,
               percentile_disc(0) WITHIN GROUP (ORDER BY (payload -> 'ms')::numeric) AS e0,
               percentile_disc(0.5) WITHIN GROUP (ORDER BY (payload -> 'ms')::numeric) AS e50,
               percentile_disc(0.99) WITHIN GROUP (ORDER BY (payload -> 'ms')::numeric) AS e99,
               percentile_disc(1) WITHIN GROUP (ORDER BY (payload -> 'ms')::numeric) AS e100
        FROM lat WHERE jsonb_typeof(payload -> 'ms') = 'number' GROUP BY 1) e USING (route)
  CROSS JOIN LATERAL (VALUES (a.p0, e.e0), (a.p50, e.e50), (a.p99, e.e99), (a.p100, e.e100)) x(approx, exact)
  GROUP BY a.route ORDER BY a.route
$$;
SELECT * FROM approx_errors();
SELECT eventview.refresh('lat_approx') > 0 AS applied;
DELETE FROM lat WHERE payload ->> 'route' = '/d' AND (payload ->> 'ms')::numeric > 500;
SELECT * FROM approx_errors();
SELECT eventview.refresh('lat_approx') > 0 AS applied;
SELECT * FROM approx_errors();
SELECT route, n, round(p100::numeric, 1) AS p100 FROM lat_approx WHERE route = '/d';
DROP FUNCTION approx_errors();
SELECT eventview.drop_event_table('lat', cascade => true);
-- The sketch functions the views call take NULL as the empty sketch (or, for a fraction, give
-- NULL), and leave out a (bucket, count) pair with a NULL half without shifting the others.
SELECT eventview._sketch_quantile(NULL, 0.5) AS of_null,
       eventview._sketch_quantile('{40100, 1}', NULL) AS null_fraction,
       eventview._sketch_merge('{5, NULL, 7, 2}', NULL) AS pair_left_out,
       eventview._sketch_merge('{1, 2}', '{1, -2}') AS emptied;
