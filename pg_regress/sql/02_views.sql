\set VERBOSITY terse
-- Incremental views: cart adds by SKU and hour, retractions, NULL keys, filters, rebuild.
SET TimeZone = 'UTC';
CREATE SCHEMA store;
SELECT eventview.create_event_table('store.events');
INSERT INTO store.events (event_type, event_version, producer, occurred_at, payload) VALUES
  ('add_to_cart', 1, 'web', '2026-11-30 10:05+00', '{"sku": "A-1", "qty": 2, "price": 9.5}'),
  ('add_to_cart', 1, 'web', '2026-11-30 10:15+00', '{"sku": "A-1", "qty": 1, "price": 12.50}'),
  ('add_to_cart', 2, 'ios', '2026-11-30 11:15+00', '{"sku": "B-2", "qty": 3, "price": 1}'),
  ('page_view',   1, 'web', '2026-11-30 11:20+00', '{"url": "/"}');

-- A view over a table that already holds events includes them all.
SELECT eventview.create_view('store.cart_by_sku', 'store.events',
  group_by    => '{"sku": "$.sku"}',
  measures    => '{"adds": "count(*)", "qty": "sum($.qty)", "avg_price": "avg($.price)", "top_price": "max($.price)"}',
  event_types => ARRAY['add_to_cart'],
  time_bucket => '1 hour');
SELECT * FROM store.cart_by_sku ORDER BY bucket, sku;

-- Column order and types follow the contract.
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = 'store.cart_by_sku'::regclass AND attnum > 0 ORDER BY attnum;

-- New events wait for refresh; refresh returns the number of changed event rows.
INSERT INTO store.events (event_type, occurred_at, payload) VALUES
  ('add_to_cart', '2026-11-30 10:30+00', '{"sku": "A-1", "qty": 5, "price": 20}'),
  ('add_to_cart', '2026-11-30 12:00+00', '{"sku": "C-3", "qty": 1, "price": 4}'),
  ('page_view',   '2026-11-30 12:00+00', '{"url": "/cart"}');
SELECT pending_changes FROM eventview.views WHERE name = 'store.cart_by_sku'::regclass;
SELECT * FROM store.cart_by_sku ORDER BY bucket, sku;
SELECT eventview.refresh('store.cart_by_sku');
SELECT * FROM store.cart_by_sku ORDER BY bucket, sku;
SELECT eventview.refresh('store.cart_by_sku') AS nothing_left;

-- Deleting the current maximum retracts it: max falls back to the next value.
DELETE FROM store.events WHERE payload @> '{"price": 20}';
SELECT eventview.refresh('store.cart_by_sku');
SELECT * FROM store.cart_by_sku ORDER BY bucket, sku;

-- An UPDATE retracts the old row and adds the new one; moving an event empties its old group,
-- which disappears.
UPDATE store.events SET payload = '{"sku": "D-4", "qty": 7, "price": 2}' WHERE payload @> '{"sku": "C-3"}';
SELECT eventview.refresh('store.cart_by_sku');
SELECT * FROM store.cart_by_sku ORDER BY bucket, sku;

-- Changes in one transaction, several statements on one row: applied once, net.
BEGIN;
INSERT INTO store.events (event_type, occurred_at, payload) VALUES ('add_to_cart', '2026-11-30 13:00+00', '{"sku": "E-5", "qty": 1, "price": 1}');
UPDATE store.events SET payload = payload || '{"qty": 2}' WHERE payload @> '{"sku": "E-5"}';
UPDATE store.events SET payload = payload || '{"qty": 3}' WHERE payload @> '{"sku": "E-5"}';
COMMIT;
DELETE FROM store.events WHERE payload @> '{"sku": "D-4"}';
SELECT eventview.refresh('store.cart_by_sku');
SELECT * FROM store.cart_by_sku ORDER BY bucket, sku;

-- An aborted transaction leaves no trace.
BEGIN;
INSERT INTO store.events (event_type, payload) VALUES ('add_to_cart', '{"sku": "ZZZ", "qty": 100}');
ROLLBACK;
SELECT eventview.refresh('store.cart_by_sku') AS after_rollback;
SELECT count(*) FROM store.cart_by_sku WHERE sku = 'ZZZ';

-- NULL keys (missing path and JSON null) group together; sum of only NULLs is NULL.
SELECT eventview.create_view('by_campaign', 'store.events',
  group_by => '{"campaign": "$.campaign"}',
  measures => '{"n": "count(*)", "qty": "sum($.qty)", "priced": "count($.price)", "cheapest": "min($.price)"}');
INSERT INTO store.events (event_type, payload) VALUES
  ('add_to_cart', '{"campaign": null, "qty": null}'),
  ('add_to_cart', '{"campaign": "bf", "price": 3}'),
  ('add_to_cart', '{"campaign": 12.50}'),
  ('add_to_cart', '{"campaign": true}');
SELECT eventview.refresh('by_campaign');
SELECT * FROM by_campaign ORDER BY campaign NULLS FIRST;

-- A view without group_by has one row while any event counts, and none otherwise.
SELECT eventview.create_view('purchases', 'store.events',
  measures => '{"n": "count(*)", "revenue": "sum($.amount)", "last_at": "max(occurred_at)"}',
  event_types => ARRAY['purchase']);
SELECT * FROM purchases;
INSERT INTO store.events (event_type, occurred_at, payload) VALUES ('purchase', '2026-11-30 09:00+00', '{"amount": 10.25}');
SELECT eventview.refresh('purchases');
SELECT * FROM purchases;
DELETE FROM store.events WHERE event_type = 'purchase';
SELECT eventview.refresh('purchases');
SELECT * FROM purchases;

-- Envelope columns as keys keep their types; filter compares as jsonb.
SELECT eventview.create_view('by_type_version', 'store.events',
  group_by => '{"type": "event_type", "v": "event_version"}',
  filter => '{"producer": ["web", "ios"]}');
SELECT * FROM by_type_version ORDER BY 1, 2;
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = 'by_type_version'::regclass AND attnum > 0 ORDER BY attnum;
SELECT eventview.create_view('web_skus', 'store.events',
  group_by => '{"sku": "$.sku"}', filter => '{"producer": "web", "$.qty": [1, 2]}');
SELECT * FROM web_skus ORDER BY sku;
-- A filter value null matches JSON null, not a missing path (jsonb equality).
SELECT eventview.create_event_table('coupons');
INSERT INTO coupons (event_type, payload) VALUES
  ('order', '{"coupon": null}'), ('order', '{}'), ('order', '{"coupon": "X"}');
SELECT eventview.create_view('without_coupon', 'coupons', filter => '{"$.coupon": null}');
SELECT * FROM without_coupon;
SELECT eventview.drop_event_table('coupons', cascade => true);

-- JSONPaths beyond member/index steps: first match in document order.
SELECT eventview.create_view('first_tag', 'store.events',
  group_by => '{"tag": "$.tags[*]", "second": "$.tags[1]", "deep": "$..code"}');
INSERT INTO store.events (event_type, payload) VALUES
  ('tagged', '{"tags": ["red", "blue"], "x": {"y": {"code": 7}}}'),
  ('tagged', '{"tags": ["red"], "code": 1}');
SELECT eventview.refresh('first_tag');
SELECT * FROM first_tag WHERE tag IS NOT NULL ORDER BY tag, second;

-- TRUNCATE empties views at their next refresh.
SELECT eventview.create_view('everything', 'store.events');
SELECT * FROM everything;
TRUNCATE store.events;
SELECT eventview.refresh('everything');
SELECT * FROM everything;

-- rebuild recomputes from raw events: whole view, or only the buckets starting in a window.
INSERT INTO store.events (event_type, occurred_at, payload) VALUES
  ('add_to_cart', '2026-11-29 23:30+00', '{"sku": "A-1", "qty": 1}'),
  ('add_to_cart', '2026-11-30 00:30+00', '{"sku": "A-1", "qty": 2}'),
  ('add_to_cart', '2026-11-30 01:30+00', '{"sku": "A-1", "qty": 4}');
SELECT eventview.refresh_all() > 0 AS refreshed_all;
SELECT * FROM store.cart_by_sku ORDER BY bucket;
-- Tamper with stored state, then rebuild a window that covers only the middle bucket.
DO $$ BEGIN
  EXECUTE format('UPDATE eventview._v%s_data SET __count = 99',
                 (SELECT view_id FROM eventview._views WHERE relid = 'store.cart_by_sku'::regclass));
END $$;
SELECT eventview.rebuild('store.cart_by_sku', '2026-11-30 00:00+00', '2026-11-30 01:00+00');
SELECT bucket, adds FROM store.cart_by_sku ORDER BY bucket;
SELECT eventview.rebuild('store.cart_by_sku');
SELECT bucket, adds FROM store.cart_by_sku ORDER BY bucket;
-- Windows need not be aligned to bucket edges; buckets are UTC whatever the session TimeZone.
SET TimeZone = 'Asia/Kolkata';
SELECT eventview.rebuild('store.cart_by_sku', '2026-11-30 00:10+00', '2026-11-30 02:00+00');
RESET TimeZone;
SET TimeZone = 'UTC';
SELECT bucket, adds, qty FROM store.cart_by_sku ORDER BY bucket;

-- The catalog.
SELECT name, source, realtime, pending_changes, lag, groups, quarantined, skipped, last_error
FROM eventview.views ORDER BY name::text;

-- drop_view removes the relation and its storage.
SELECT view_id AS dropped_id FROM eventview._views WHERE relid = 'by_campaign'::regclass \gset
SELECT eventview.drop_view('by_campaign');
SELECT to_regclass('by_campaign') AS view_after, to_regclass(format('eventview._v%s_data', :dropped_id)) AS storage_after;

-- Views are read-only: a write through one would be added to by every later refresh.
SELECT try($$UPDATE store.cart_by_sku SET adds = 100$$);
SELECT try($$DELETE FROM store.cart_by_sku$$);
SELECT try($$INSERT INTO store.cart_by_sku (adds) VALUES (1)$$);
SELECT sum(adds) AS adds_unchanged FROM store.cart_by_sku;

-- A plain DROP VIEW takes the view's catalog row and storage with it, as drop_view does.
SELECT eventview.create_view('store.dropped_plainly', 'store.events', measures => '{"n": "count(*)", "top": "max($.price)"}');
SELECT view_id AS plain_id FROM eventview._views WHERE relid = 'store.dropped_plainly'::regclass \gset
SELECT count(*) AS storage_tables FROM pg_class WHERE relnamespace = 'eventview'::regnamespace AND relname ~ format('^_v%s_', :plain_id);
DROP VIEW store.dropped_plainly;
SELECT count(*) AS catalog_rows FROM eventview._views WHERE view_id = :plain_id;
SELECT count(*) AS storage_tables FROM pg_class WHERE relnamespace = 'eventview'::regnamespace AND relname ~ format('^_v%s_', :plain_id);
-- So does dropping the schema it is in.
CREATE SCHEMA doomed;
SELECT eventview.create_view('doomed.by_type', 'store.events', group_by => '{"event_type": "event_type"}');
DROP SCHEMA doomed CASCADE;
SELECT count(*) AS doomed_views FROM eventview.views WHERE name::text LIKE 'doomed.%' OR name::text ~ '^[0-9]+$';

-- Rows of a child table are neither captured nor read: views, rebuilds, realtime reads and the
-- field observer read the event table itself (FROM ONLY). The child's row takes the id the
-- parent's next event gets, so a read by id range without ONLY would count it.
CREATE SCHEMA inh;
SELECT eventview.create_event_table('inh.events');
INSERT INTO inh.events (event_type, event_version, producer, occurred_at, payload) VALUES
  ('click', 1, 'web', '2026-11-30 10:00+00', '{"n": 1}'),
  ('click', 1, 'web', '2026-11-30 10:05+00', '{"n": 2}');
CREATE TABLE inh.events_child () INHERITS (inh.events);
INSERT INTO inh.events_child (event_id, event_type, event_version, producer, occurred_at, payload)
VALUES (3, 'click', 1, 'web', '2026-11-30 10:10+00', '{"n": 100, "child_only": true}');
SELECT eventview.create_view('inh.clicks', 'inh.events', measures => '{"events": "count(*)", "n": "sum($.n)"}');
SELECT eventview.create_view('inh.clicks_now', 'inh.events', measures => '{"events": "count(*)", "n": "sum($.n)"}', realtime => true);
SELECT * FROM inh.clicks;
INSERT INTO inh.events (event_type, event_version, producer, occurred_at, payload) VALUES
  ('click', 1, 'web', '2026-11-30 10:15+00', '{"n": 3}');
SELECT event_id, payload FROM inh.events ORDER BY event_id, payload::text;
SELECT * FROM inh.clicks_now;
SELECT eventview.refresh('inh.clicks');
SELECT * FROM inh.clicks;
SELECT eventview.rebuild('inh.clicks');
SELECT * FROM inh.clicks;
SELECT path FROM eventview.observed_fields WHERE source = 'inh.events'::regclass ORDER BY path;
DROP SCHEMA inh CASCADE;
SELECT count(*) AS inh_left FROM eventview._sources WHERE relid::oid = 0 OR relid::oid NOT IN (SELECT oid FROM pg_class);
