\set VERBOSITY terse
-- Rollups (API.md section 9): a view maintained from the group changes of another incremental
-- view. Each measure is re-aggregated by its own kind; a rollup equals, at every refresh, the
-- same view defined directly over the events with the coarser grouping.
SET TimeZone = 'UTC';
SELECT eventview.create_event_table('shop');
SELECT eventview.create_view('shop_hourly', 'shop', event_types => ARRAY['purchase'],
  group_by => '{"sku": "$.sku", "country": "$.country"}',
  measures => '{"orders": "count(*)", "revenue": "sum($.amount)", "avg_amount": "avg($.amount)",
                "top": "max($.amount)", "low": "min($.amount)", "buyers": "count_distinct($.user)",
                "p50": "percentile($.amount, 0.5)", "p90": "approx_percentile($.amount, 0.9)"}',
  time_bucket => '1 hour');
INSERT INTO shop (event_type, occurred_at, payload)
SELECT 'purchase', timestamptz '2026-03-01' + i * interval '37 minutes',
       jsonb_build_object('sku', 'S' || (i % 3), 'country', CASE WHEN i % 4 = 0 THEN NULL ELSE 'DE' END,
                          'amount', (i * 7) % 50, 'user', 'u' || (i % 5))
FROM generate_series(1, 120) i;
-- Refused (22023), nothing made: a group column, measure or filter column the source does not
-- have (a JSONPath among them), a bucket that is no whole multiple of the source's, a time zone
-- other than the source's, event types, unnest.
\set VERBOSITY default
SELECT eventview.create_view('bad', 'shop_hourly', group_by => '{"sku": "$.sku"}');
SELECT eventview.create_view('bad', 'shop_hourly', measures => '{"r": "sum($.amount)"}');
SELECT eventview.create_view('bad', 'shop_hourly', filter => '{"region": "EU"}');
SELECT eventview.create_view('bad', 'shop_hourly', time_bucket => '90 minutes');
SELECT eventview.create_view('bad', 'shop_hourly', time_bucket => '1 day', time_zone => 'Europe/Berlin');
SELECT eventview.create_view('bad', 'shop_hourly', event_types => ARRAY['purchase']);
SELECT eventview.create_view('bad', 'shop_hourly', unnest => '$.items');
\set VERBOSITY terse
SELECT to_regclass('bad') IS NULL AS nothing_made;
-- Daily per sku (the NULL country and 'DE' kept), then weekly over everything, realtime.
SELECT eventview.create_view('shop_daily', 'shop_hourly', group_by => '{"sku": "sku"}',
  measures => '{"orders": "orders", "revenue": "revenue", "avg_amount": "avg_amount", "top": "top",
                "low": "low", "buyers": "buyers", "p50": "p50", "p90": "p90"}',
  filter => '{"country": ["DE", null]}', time_bucket => '1 day');
SELECT eventview.create_view('shop_weekly', 'shop_daily',
  measures => '{"orders": "orders", "top": "top", "buyers": "buyers", "p50": "p50"}',
  time_bucket => '7 days', realtime => true);
-- The direct views, for comparison.
SELECT eventview.create_view('shop_daily_direct', 'shop', event_types => ARRAY['purchase'],
  group_by => '{"sku": "$.sku"}',
  measures => '{"orders": "count(*)", "revenue": "sum($.amount)", "avg_amount": "avg($.amount)",
                "top": "max($.amount)", "low": "min($.amount)", "buyers": "count_distinct($.user)",
                "p50": "percentile($.amount, 0.5)", "p90": "approx_percentile($.amount, 0.9)"}',
  time_bucket => '1 day');
SELECT * FROM shop_daily ORDER BY bucket, sku;
SELECT * FROM shop_weekly ORDER BY bucket;
SELECT name, source, realtime FROM eventview.views WHERE name::text LIKE 'shop%' ORDER BY name::text;
-- Corrections and erasures flow through every level.
UPDATE shop SET payload = payload || '{"amount": 49}' WHERE event_id % 10 = 0;
DELETE FROM shop WHERE event_id % 9 = 0;
INSERT INTO shop (event_type, occurred_at, payload)
VALUES ('purchase', '2026-03-02 10:00+00', '{"sku": "S9", "country": "FR", "amount": 1000, "user": "x"}');
-- Realtime at depth 3 before any refresh: equal to the aggregate from scratch.
SELECT w.* IS NOT DISTINCT FROM d.* AS weekly_matches
FROM shop_weekly w FULL JOIN (
  SELECT date_bin('7 days', occurred_at, '2000-01-01') AS bucket, count(*) AS orders,
         max((payload->>'amount')::numeric) AS top, count(DISTINCT payload->'user') AS buyers,
         percentile_disc(0.5) WITHIN GROUP (ORDER BY (payload->>'amount')::numeric) AS p50
  FROM shop WHERE coalesce(payload->>'country', 'DE') = 'DE' GROUP BY 1) d USING (bucket)
ORDER BY 1;
-- A rollup's refresh refreshes its sources first and returns the event rows they consumed.
SELECT eventview.refresh('shop_daily') AS consumed;
SELECT eventview.refresh('shop_daily_direct') > 0 AS applied;
SELECT count(*) AS differences FROM (
  (SELECT * FROM shop_daily EXCEPT SELECT * FROM shop_daily_direct WHERE sku <> 'S9')
  UNION ALL (SELECT * FROM shop_daily_direct WHERE sku <> 'S9' EXCEPT SELECT * FROM shop_daily)) x;
-- rebuild of a rollup (whole, and a window) recomputes it from its source's stored groups.
SELECT eventview.rebuild('shop_daily', '2026-03-02', '2026-03-03') >= 0 AS rebuilt_window;
SELECT eventview.rebuild('shop_weekly') > 0 AS rebuilt;
SELECT count(*) AS differences FROM (
  (SELECT * FROM shop_daily EXCEPT SELECT * FROM shop_daily_direct WHERE sku <> 'S9')
  UNION ALL (SELECT * FROM shop_daily_direct WHERE sku <> 'S9' EXCEPT SELECT * FROM shop_daily)) x;
-- Rollups are read-only like every incremental view.
DELETE FROM shop_daily;
-- drop_view (and DROP VIEW) of a view that rollups read refuses (2BP01) and names them.
\set VERBOSITY default
SELECT eventview.drop_view('shop_hourly');
DROP VIEW shop_daily;
\set VERBOSITY terse
-- Rollups dropped first, a view's group changelog goes with its last rollup.
SELECT eventview.drop_view('shop_weekly');
SELECT count(*) AS group_changelogs FROM pg_class
WHERE relnamespace = 'eventview'::regnamespace AND relname ~ '^_v[0-9]+_changes$';
-- drop_event_table with cascade drops the rollups before the views they read.
SELECT eventview.drop_event_table('shop', cascade => true);
SELECT count(*) AS views_left FROM eventview.views WHERE name::text LIKE 'shop%';
SELECT count(*) AS group_changelogs FROM pg_class
WHERE relnamespace = 'eventview'::regnamespace AND relname ~ '^_v[0-9]+_changes$';
