-- pg_eventview demo: producers write events in two payload versions; views stay incremental.
\set ON_ERROR_STOP 1
\pset footer off
SET TimeZone = 'UTC';
CREATE EXTENSION IF NOT EXISTS pg_eventview;
CREATE SCHEMA shop;

\echo '== 1. An event table: a stable envelope around a free-form payload'
SELECT eventview.create_event_table('shop.events');

\echo '== 2. Version 1 producers put the SKU at $.sku and the quantity at $.qty'
INSERT INTO shop.events (event_type, event_version, producer, occurred_at, payload) VALUES
  ('add_to_cart', 1, 'web', '2026-11-30 10:05Z', '{"sku": "A-1", "qty": 2, "price": 9.5}'),
  ('add_to_cart', 1, 'web', '2026-11-30 10:20Z', '{"sku": "B-2", "qty": 1, "price": 20}'),
  ('purchase',    1, 'web', '2026-11-30 10:40Z', '{"sku": "A-1", "qty": 2, "price": 9.5}');

\echo '== 3. An incremental view: adds per SKU per hour, over the events already there'
SELECT eventview.create_view('shop.cart_by_sku', 'shop.events',
  group_by    => '{"sku": "$.sku"}',
  measures    => '{"adds": "count(*)", "qty": "sum($.qty)", "avg_price": "avg($.price)", "top_price": "max($.price)"}',
  event_types => ARRAY['add_to_cart'],
  time_bucket => '1 hour');
SELECT * FROM shop.cart_by_sku ORDER BY bucket, sku;

\echo '== 4. A mobile producer ships version 2: the SKU moved to $.item.sku, qty to $.item.quantity'
INSERT INTO shop.events (event_type, event_version, producer, occurred_at, payload) VALUES
  ('add_to_cart', 2, 'ios', '2026-11-30 10:50Z', '{"item": {"sku": "A-1", "quantity": 3}, "price": 8}'),
  ('add_to_cart', 2, 'ios', '2026-11-30 11:10Z', '{"item": {"sku": "C-3", "quantity": 1}, "price": 4, "coupon": "BF"}');
\echo 'Declare the logical fields once, per version; views written against them keep working:'
SELECT eventview.define_field('shop.events', 'sku', '$.sku', 'add_to_cart', 1);
SELECT eventview.define_field('shop.events', 'sku', '$.item.sku', 'add_to_cart', 2);
SELECT eventview.define_field('shop.events', 'qty', '$.qty', 'add_to_cart', 1, 'bigint');
SELECT eventview.define_field('shop.events', 'qty', '$.item.quantity', 'add_to_cart', 2, 'bigint');
SELECT eventview.create_view('shop.qty_by_sku', 'shop.events',
  group_by    => '{"sku": "sku"}',
  measures    => '{"adds": "count(*)", "qty": "sum(qty)", "versions": "count_distinct(event_version)"}',
  event_types => ARRAY['add_to_cart']);
SELECT eventview.create_view('shop.by_version', 'shop.events',
  group_by => '{"type": "event_type", "version": "event_version", "producer": "producer"}');

\echo '== 5. Refresh applies only the new changes, exactly once'
SELECT name, pending_changes FROM eventview.views ORDER BY name::text;
SELECT eventview.refresh_all() AS changes_applied;
\echo 'cart_by_sku reads $.sku, so version-2 events land under a NULL sku there; qty_by_sku reads the logical fields:'
SELECT * FROM shop.cart_by_sku ORDER BY bucket, sku;
SELECT * FROM shop.qty_by_sku ORDER BY sku;
SELECT * FROM shop.by_version ORDER BY 1, 2, 3;

\echo '== 6. Corrections retract: deleting the top price brings the max back down'
DELETE FROM shop.events WHERE payload @> '{"sku": "B-2"}';
UPDATE shop.events SET payload = jsonb_set(payload, '{price}', '11') WHERE payload @> '{"sku": "A-1", "qty": 2}' AND event_type = 'add_to_cart';
SELECT eventview.refresh('shop.cart_by_sku') AS changes_applied;
SELECT * FROM shop.cart_by_sku ORDER BY bucket, sku;

\echo '== 7. Through the ingest gate, one producer sends a string where a number belongs, another a bad envelope'
SELECT * FROM eventview.ingest('shop.events', '[
  {"type": "add_to_cart", "version": 1, "producer": "legacy", "occurred_at": "2026-11-30T11:30:00Z", "key": "l-1",
   "payload": {"sku": "A-1", "qty": "two", "price": 9}},
  {"type": "add_to_cart", "version": 2, "producer": "ios", "occurred_at": "2026-11-30T11:40:00Z", "key": "i-7",
   "payload": {"item": {"sku": "A-1", "quantity": 2}, "price": 8}},
  {"type": "add_to_cart", "version": 2, "producer": "ios", "occurred_at": "2026-11-30T11:40:00Z", "key": "i-7",
   "payload": {"item": {"sku": "A-1", "quantity": 2}, "price": 8}},
  {"type": "add_to_cart", "occurred_at": "yesterday", "payload": {"sku": "B-2"}}]');
SELECT eventview.refresh_all() AS changes_applied;
SELECT * FROM shop.qty_by_sku ORDER BY sku;
\echo 'The bad events are in quarantine with their reasons, not silently NULL:'
SELECT view_name, event_id, reason FROM eventview.quarantine ORDER BY id;
SELECT name, groups, quarantined, pending_changes, lag FROM eventview.views ORDER BY name::text;

\echo '== 8. The check that matters: the view equals the aggregate computed from scratch'
SELECT count(*) AS differences FROM (
  (SELECT * FROM shop.cart_by_sku
   EXCEPT ALL
   SELECT date_bin('1 hour', occurred_at, '2000-01-01 00:00:00+00'), payload->>'sku', count(*),
          sum((payload->'qty')::numeric), avg((payload->'price')::numeric), max((payload->'price')::numeric)
   FROM shop.events WHERE event_type = 'add_to_cart' AND jsonb_typeof(payload->'qty') IS DISTINCT FROM 'string'
   GROUP BY 1, 2)
) d;
SELECT count(*) AS differences FROM (
  (SELECT sku, adds, qty FROM shop.qty_by_sku
   EXCEPT ALL
   SELECT CASE event_version WHEN 1 THEN payload->>'sku' ELSE payload#>>'{item,sku}' END, count(*),
          sum(CASE event_version WHEN 1 THEN (payload->'qty')::numeric ELSE (payload#>'{item,quantity}')::numeric END)
   FROM shop.events WHERE event_type = 'add_to_cart' AND jsonb_typeof(payload->'qty') IS DISTINCT FROM 'string'
   GROUP BY 1)
) d;
