\set VERBOSITY terse
-- unnest (API.md section 8): one input row per element of an array of the payload; @ reads the
-- element, $ the whole payload; count(*) counts elements; UPDATE and DELETE retract every element.
SET TimeZone = 'UTC';
SELECT eventview.create_event_table('un_orders');
-- Refused (22023): @ without unnest, an unnest that is no JSONPath or not one value per event,
-- and a reference to the element that is not names and indexes.
\set VERBOSITY default
SELECT eventview.create_view('bad', 'un_orders', group_by => '{"sku": "@.sku"}');
SELECT eventview.create_view('bad', 'un_orders', unnest => 'items');
SELECT eventview.create_view('bad', 'un_orders', unnest => '$.items[*]');
SELECT eventview.create_view('bad', 'un_orders', unnest => '$.items', group_by => '{"sku": "@..sku"}');
\set VERBOSITY terse
SELECT to_regclass('bad') IS NULL AS nothing_made;
SELECT eventview.create_view('sku_revenue', 'un_orders', event_types => ARRAY['purchase'],
  unnest => '$.items', group_by => '{"sku": "@.sku"}',
  measures => '{"lines": "count(*)", "units": "sum(@.qty)", "revenue": "sum(@.amount)", "orders": "count_distinct($.order_id)"}',
  time_bucket => '1 hour');
SELECT eventview.create_view('sku_live', 'un_orders', event_types => ARRAY['purchase'],
  unnest => '$.items', group_by => '{"sku": "@.sku", "channel": "$.channel"}',
  measures => '{"units": "sum(@.qty)"}', filter => '{"$.channel": "web"}', realtime => true);
SELECT eventview.create_view('tag_counts', 'un_orders', unnest => '$.tags', group_by => '{"tag": "@"}');
-- A filter on the element: an event whose items are no array is still a type error.
SELECT eventview.create_view('a_lines', 'un_orders', unnest => '$.items', filter => '{"@.sku": "A"}',
  measures => '{"lines": "count(*)"}');
SELECT definition -> 'unnest' AS unnest FROM eventview.views WHERE name = 'sku_revenue'::regclass;
INSERT INTO un_orders (event_key, event_type, occurred_at, payload) VALUES
  ('o1', 'purchase', '2026-11-01 10:05', '{"order_id": 1, "channel": "web", "tags": ["gift", "promo"],
     "items": [{"sku": "A", "qty": 2, "amount": 20.00}, {"sku": "B", "qty": 1, "amount": 5.50}, {"sku": "A", "qty": 1, "amount": 10.00}]}'),
  ('o2', 'purchase', '2026-11-01 10:30', '{"order_id": 2, "channel": "app", "items": [{"sku": "B", "qty": 3, "amount": 16.50}]}'),
  ('o3', 'purchase', '2026-11-01 10:40', '{"order_id": 3, "channel": "web", "items": []}'),
  ('o4', 'purchase', '2026-11-01 10:45', '{"order_id": 4, "channel": "web"}'),
  ('o5', 'purchase', '2026-11-01 10:50', '{"order_id": 5, "channel": "web", "items": "boxed", "tags": "x"}'),
  ('o6', 'purchase', '2026-11-01 10:55', '{"order_id": 6, "channel": "web", "items": [{"sku": "C", "qty": 1}, {"sku": "A", "qty": "two"}]}'),
  ('v1', 'page_view', '2026-11-01 10:56', '{"items": [{"sku": "Z", "qty": 9}], "tags": ["promo"]}');
SELECT * FROM sku_live ORDER BY sku;
SELECT eventview.refresh_all() > 0 AS applied;
SELECT * FROM sku_revenue ORDER BY sku;
SELECT * FROM tag_counts ORDER BY tag;
SELECT * FROM a_lines;
-- One entry per event left out, whichever of its elements was wrong.
SELECT view_name, event_id, reason FROM eventview.quarantine WHERE view_name IN ('public.sku_revenue', 'public.sku_live', 'public.tag_counts', 'public.a_lines') ORDER BY view_name, event_id;
-- An update retracts every element of the old version; a delete every element.
UPDATE un_orders SET payload = jsonb_set(payload, '{items}', '[{"sku": "A", "qty": 5, "amount": 50}]') WHERE event_key = 'o1';
DELETE FROM un_orders WHERE event_key = 'o2';
UPDATE un_orders SET payload = jsonb_set(payload, '{items,1,qty}', '2') WHERE event_key = 'o6';
SELECT * FROM sku_live ORDER BY sku;
SELECT eventview.refresh_all() > 0 AS applied;
SELECT * FROM sku_revenue ORDER BY sku;
SELECT view_name, event_id, reason FROM eventview.quarantine WHERE view_name IN ('public.sku_revenue', 'public.sku_live', 'public.tag_counts', 'public.a_lines') ORDER BY view_name, event_id;
-- Equal to the aggregate over jsonb_array_elements from scratch.
SELECT count(*) AS differences FROM (
  (SELECT sku, lines, units, revenue, orders FROM sku_revenue EXCEPT
   SELECT e.value ->> 'sku', count(*), sum((e.value -> 'qty')::numeric), sum((e.value -> 'amount')::numeric),
          count(DISTINCT o.payload -> 'order_id')
   FROM un_orders o CROSS JOIN LATERAL jsonb_array_elements(o.payload -> 'items') e
   WHERE o.event_type = 'purchase' AND jsonb_typeof(o.payload -> 'items') = 'array'
   GROUP BY 1)) d;
-- A full rebuild recomputes the same.
SELECT eventview.rebuild('sku_revenue');
SELECT * FROM sku_revenue ORDER BY sku;
SELECT eventview.drop_event_table('un_orders', cascade => true);
