\set VERBOSITY terse
-- A value of the wrong JSON type is never silently NULL: quarantine, skip or fail.
SET TimeZone = 'UTC';
SELECT eventview.create_event_table('orders');
INSERT INTO orders (event_type, event_key, occurred_at, payload) VALUES
  ('order', 'o1', '2026-11-30 10:00+00', '{"sku": "A", "qty": 2}'),
  ('order', 'o2', '2026-11-30 10:00+00', '{"sku": "A", "qty": "3"}'),
  ('order', 'o3', '2026-11-30 10:00+00', '{"sku": {"id": "B"}, "qty": 1}'),
  ('order', 'o4', '2026-11-30 10:00+00', '{"sku": "A", "qty": null}'),
  ('order', 'o5', '2026-11-30 10:00+00', '{"sku": ["A"], "qty": "x"}');

SELECT eventview.create_view('q_view', 'orders',
  group_by => '{"sku": "$.sku"}', measures => '{"n": "count(*)", "qty": "sum($.qty)"}');
SELECT * FROM q_view ORDER BY sku;
SELECT view_name, event_id, reason, event->>'event_key' AS key, event->'payload' AS payload
FROM eventview.quarantine ORDER BY id;

SELECT eventview.create_view('s_view', 'orders',
  group_by => '{"sku": "$.sku"}', measures => '{"n": "count(*)", "qty": "sum($.qty)"}',
  on_type_error => 'skip');
SELECT * FROM s_view ORDER BY sku;
SELECT name, quarantined, skipped FROM eventview.views ORDER BY name::text;
SELECT count(*) AS quarantine_rows FROM eventview.quarantine;

-- The filter runs first: events it leaves out are not type-checked.
SELECT eventview.create_view('f_view', 'orders',
  measures => '{"qty": "sum($.qty)"}', filter => '{"$.qty": [2, null]}', on_type_error => 'fail');
SELECT * FROM f_view;
-- Without the filter, the first population meets o2's string and fails: nothing is created.
SELECT try($$SELECT eventview.create_view('f_view2', 'orders', measures => '{"qty": "sum($.qty)"}', on_type_error => 'fail')$$);
SELECT to_regclass('f_view2') AS nothing_created;

-- fail aborts the refresh with 22023 and leaves the view unchanged.
SELECT eventview.create_view('strict_view', 'orders',
  measures => '{"n": "count(*)", "qty": "sum($.qty)"}',
  filter => '{"$.lane": "strict"}', on_type_error => 'fail');
SELECT * FROM strict_view;
INSERT INTO orders (event_type, event_key, payload) VALUES
  ('order', 'o6', '{"lane": "strict", "qty": 5}'),
  ('order', 'o7', '{"lane": "strict", "qty": "seven"}');
\set VERBOSITY default
SELECT eventview.refresh('strict_view');
\set VERBOSITY terse
SELECT * FROM strict_view;
SELECT pending_changes FROM eventview.views WHERE name = 'strict_view'::regclass;
-- alter_view changes the policy in place; the bad event then goes to quarantine.
SELECT eventview.alter_view('strict_view', on_type_error => 'quarantine');
SELECT definition FROM eventview.views WHERE name = 'strict_view'::regclass;
SELECT eventview.refresh('strict_view');
SELECT * FROM strict_view;
SELECT reason FROM eventview.quarantine WHERE view_name = 'public.strict_view';
SELECT try($$SELECT eventview.alter_view('strict_view', on_type_error => 'ignore')$$);

-- A quarantine entry describes the version of an event the view left out: correcting the event
-- (UPDATE) or erasing it (DELETE) takes the entry back at the next refresh, and the counter.
UPDATE orders SET payload = '{"lane": "strict", "qty": 7}' WHERE event_key = 'o7';
SELECT eventview.refresh('strict_view');
SELECT * FROM strict_view;
SELECT count(*) AS entries FROM eventview.quarantine WHERE view_name = 'public.strict_view';
SELECT quarantined FROM eventview.views WHERE name = 'strict_view'::regclass;
SELECT event_id, reason FROM eventview.quarantine WHERE view_name = 'public.q_view' ORDER BY id;
DELETE FROM orders WHERE event_key = 'o2';
SELECT eventview.refresh('q_view');
SELECT event_id, reason FROM eventview.quarantine WHERE view_name = 'public.q_view' ORDER BY id;
SELECT name, quarantined FROM eventview.views WHERE name = 'q_view'::regclass;
-- The owner deletes an entry by hand (an event already looked at): `quarantined` is the number
-- of entries, so it follows, and stays right when that event is corrected later.
SELECT count(*) AS entries FROM eventview.quarantine WHERE view_name = 'public.q_view';
DELETE FROM eventview.quarantine
WHERE id = (SELECT min(id) FROM eventview.quarantine WHERE view_name = 'public.q_view')
RETURNING event->>'event_key' AS looked_at \gset
SELECT :'looked_at' AS looked_at;
SELECT name, quarantined FROM eventview.views WHERE name = 'q_view'::regclass;
UPDATE orders SET payload = '{"sku": "B", "qty": 1}' WHERE event_key = :'looked_at';
SELECT eventview.refresh('q_view');
SELECT * FROM q_view ORDER BY sku;
SELECT name, quarantined, (SELECT count(*) FROM eventview.quarantine WHERE view_name = 'public.q_view') AS entries
FROM eventview.views WHERE name = 'q_view'::regclass;

-- A group key too large to store in the view's index is a type error too, not a refresh that
-- fails for ever (a btree entry takes at most 2.7 kB).
SELECT eventview.create_view('wide_keys', 'orders',
  group_by => '{"note": "$.note"}', measures => '{"n": "count(*)", "notes": "count_distinct($.note)"}');
INSERT INTO orders (event_type, event_key, payload) VALUES
  ('order', 'w1', jsonb_build_object('note', 'short')),
  ('order', 'w2', jsonb_build_object('note', (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 100) i)));
SELECT eventview.refresh('wide_keys');
SELECT note, n, notes FROM wide_keys ORDER BY note;
SELECT reason FROM eventview.quarantine WHERE view_name = 'public.wide_keys';
-- (Every view up to date, for the files after this one.)
SELECT eventview.refresh_all() > 0 AS refreshed;
