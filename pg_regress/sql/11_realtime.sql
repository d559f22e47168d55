\set VERBOSITY terse
-- Realtime views: a read includes the changes not refreshed yet, and equals a refresh followed
-- by a read. A twin view without realtime, refreshed, is the reference.
SET TimeZone = 'UTC';
CREATE SCHEMA live;
SELECT eventview.create_event_table('live.events');
INSERT INTO live.events (event_type, occurred_at, payload) VALUES
  ('cart', '2026-11-01 10:05+00', '{"sku": "A", "qty": 2, "price": 9.5, "user": 1}'),
  ('cart', '2026-11-01 10:20+00', '{"sku": "A", "qty": 1, "price": 12, "user": 2}'),
  ('cart', '2026-11-01 11:00+00', '{"sku": "B", "qty": 5, "price": 3, "user": 1}');
SELECT eventview.create_view('live.by_sku', 'live.events',
  group_by => '{"sku": "$.sku"}',
  measures => '{"n": "count(*)", "qty": "sum($.qty)", "avg_price": "avg($.price)", "lo": "min($.price)",
                "hi": "max($.price)", "users": "count_distinct($.user)", "tags": "count($.tags[*])"}',
  time_bucket => '1 hour', realtime => true);
SELECT eventview.create_view('live.by_sku_stored', 'live.events',
  group_by => '{"sku": "$.sku"}',
  measures => '{"n": "count(*)", "qty": "sum($.qty)", "avg_price": "avg($.price)", "lo": "min($.price)",
                "hi": "max($.price)", "users": "count_distinct($.user)", "tags": "count($.tags[*])"}',
  time_bucket => '1 hour');
SELECT name, realtime FROM eventview.views WHERE source = 'live.events'::regclass ORDER BY 1;
CREATE FUNCTION live.differences() RETURNS bigint LANGUAGE sql AS $$
  SELECT count(*) FROM ((TABLE live.by_sku EXCEPT ALL TABLE live.by_sku_stored)
                        UNION ALL (TABLE live.by_sku_stored EXCEPT ALL TABLE live.by_sku)) d $$;

-- New events, a new group, an update, and the deletion of the group's maximum: visible at once.
INSERT INTO live.events (event_type, occurred_at, payload) VALUES
  ('cart', '2026-11-01 10:40+00', '{"sku": "A", "qty": 4, "price": 20, "user": 2, "tags": ["x"]}'),
  ('cart', '2026-11-01 12:00+00', '{"sku": "C", "qty": 1, "price": 1, "user": 3}');
UPDATE live.events SET payload = payload || '{"user": 9}' WHERE event_id = 1;
DELETE FROM live.events WHERE event_id = 2;
SELECT pending_changes FROM eventview.views WHERE name = 'live.by_sku'::regclass;
SELECT * FROM live.by_sku ORDER BY bucket, sku;
SELECT eventview.refresh('live.by_sku_stored');
SELECT live.differences() AS differences;
-- Refreshing the realtime view changes what it stores, not what it shows.
SELECT eventview.refresh('live.by_sku');
SELECT live.differences() AS differences;

-- A group whose events all go disappears; NULL keys group together.
DELETE FROM live.events WHERE payload->>'sku' = 'C';
INSERT INTO live.events (event_type, occurred_at, payload) VALUES
  ('cart', '2026-11-01 13:00+00', '{"qty": 1}'), ('cart', '2026-11-01 13:30+00', '{"sku": null, "qty": 2}');
SELECT * FROM live.by_sku WHERE sku IS NULL OR sku = 'C';

-- Inside a transaction, its own changes count too; rolled back, they are gone.
BEGIN;
INSERT INTO live.events (event_type, occurred_at, payload)
  VALUES ('cart', '2026-11-01 10:59+00', '{"sku": "A", "qty": 100, "price": 99}');
SELECT bucket, sku, n, qty, hi FROM live.by_sku WHERE sku = 'A';
ROLLBACK;
SELECT bucket, sku, n, qty, hi FROM live.by_sku WHERE sku = 'A';

-- Type errors are left out of a realtime read as a refresh leaves them out of the aggregate;
-- the quarantine is written by the refresh.
INSERT INTO live.events (event_type, occurred_at, payload) VALUES
  ('cart', '2026-11-01 10:30+00', '{"sku": "A", "qty": "many"}');
SELECT bucket, sku, n, qty FROM live.by_sku WHERE sku = 'A';
SELECT count(*) AS quarantined_before_refresh FROM eventview.quarantine WHERE view_name = 'live.by_sku';
SELECT eventview.refresh('live.by_sku');
SELECT count(*) AS quarantined_after_refresh FROM eventview.quarantine WHERE view_name = 'live.by_sku';
SELECT eventview.refresh('live.by_sku_stored');
SELECT live.differences() AS differences;

-- alter_view switches in place (same relation, grants kept).
GRANT SELECT ON live.by_sku TO PUBLIC;
SELECT eventview.alter_view('live.by_sku', realtime => false);
INSERT INTO live.events (event_type, occurred_at, payload) VALUES ('cart', '2026-11-01 10:00+00', '{"sku": "A", "qty": 1}');
SELECT bucket, sku, n FROM live.by_sku WHERE sku = 'A';
SELECT eventview.alter_view('live.by_sku', realtime => true);
SELECT bucket, sku, n FROM live.by_sku WHERE sku = 'A';
SELECT name, realtime FROM eventview.views WHERE name = 'live.by_sku'::regclass;
SELECT has_table_privilege('public', 'live.by_sku', 'SELECT') AS still_granted;

-- A realtime view over logical fields follows a redeclaration at once for pending changes, as
-- the next refresh would.
SELECT eventview.define_field('live.events', 'item', '$.sku');
SELECT eventview.create_view('live.by_item', 'live.events', group_by => '{"item": "item"}',
  measures => '{"n": "count(*)"}', realtime => true);
SELECT eventview.define_field('live.events', 'item', '$.item.sku', version => 2);
INSERT INTO live.events (event_type, event_version, payload) VALUES ('cart', 2, '{"item": {"sku": "Z"}}');
SELECT * FROM live.by_item WHERE item = 'Z';

-- A pending group's keys read as stored: a refresh keeps the stored spelling of equal keys
-- (numeric 1 and 1.0), and so does the realtime read.
SELECT eventview.create_event_table('live.amounts');
SELECT eventview.define_field('live.amounts', 'amt', '$.amt', type => 'numeric');
SELECT eventview.create_view('live.by_amt', 'live.amounts', group_by => '{"amt": "amt"}', realtime => true);
INSERT INTO live.amounts (event_type, payload) VALUES ('e', '{"amt": 1}');
SELECT eventview.refresh('live.by_amt');
INSERT INTO live.amounts (event_type, payload) VALUES ('e', '{"amt": 1.0}');
SELECT amt::text, events FROM live.by_amt;
SELECT eventview.refresh('live.by_amt');
SELECT amt::text, events FROM live.by_amt;
SELECT eventview.drop_event_table('live.amounts', cascade => true);

-- Dropping works as for any view.
SELECT eventview.drop_view('live.by_item');
SELECT eventview.drop_event_table('live.events', cascade => true);
SELECT count(*) AS left_behind FROM pg_class WHERE relnamespace = 'live'::regnamespace;
