\set VERBOSITY terse
-- Observed fields and drift: recorded when changes are processed, never on insert.
SET TimeZone = 'UTC';
SELECT eventview.create_event_table('shapes');
SELECT eventview.create_view('shape_qty', 'shapes', group_by => '{"sku": "$.sku"}', measures => '{"q": "sum($.qty)"}');
INSERT INTO shapes (event_type, event_version, payload) VALUES
  ('cart', 1, '{"sku": "A", "qty": 1, "items": [{"id": 1}, {"id": 2}], "odd key": {"it''s": true}}'),
  ('cart', 1, '{"sku": "B", "qty": 2, "items": []}');
-- Nothing is observed on the insert path.
SELECT count(*) AS observed_before_refresh FROM eventview.observed_fields WHERE source = 'shapes'::regclass;
SELECT eventview.refresh('shape_qty');
SELECT source, event_type, event_version, path, json_type, seen FROM eventview.observed_fields
WHERE source = 'shapes'::regclass ORDER BY path, json_type;
SELECT source, event_type, event_version, path, change, old_type, new_type FROM eventview.drift
WHERE source = 'shapes'::regclass ORDER BY id;
SELECT max(id) AS last_drift FROM eventview.drift \gset
-- A new version adds a field; a producer changes a type; a path views read goes missing.
INSERT INTO shapes (event_type, event_version, payload) VALUES
  ('cart', 2, '{"sku": "A", "qty": 1, "coupon": "BF"}'),
  ('cart', 1, '{"sku": "C", "qty": "3", "items": []}'),
  ('cart', 1, '{"qty": 4, "items": []}');
SELECT eventview.refresh_all();
SELECT event_type, event_version, path, change, old_type, new_type FROM eventview.drift
WHERE source = 'shapes'::regclass AND id > :last_drift ORDER BY id;
SELECT path, json_type, seen FROM eventview.observed_fields
WHERE source = 'shapes'::regclass AND event_version = 1 ORDER BY path, json_type;
-- Refreshing again observes nothing twice.
SELECT eventview.refresh('shape_qty');
SELECT sum(seen) AS total_seen FROM eventview.observed_fields WHERE source = 'shapes'::regclass;
-- Wide and deep payloads cost a bounded amount: at most 1000 members per object or array and
-- 32 levels are walked, however deep the payload nests.
INSERT INTO shapes (event_type, payload)
SELECT 'wide', jsonb_object_agg('k' || i, i) FROM generate_series(1, 5000) i;
INSERT INTO shapes (event_type, payload)
SELECT 'deep', (repeat('{"a":', 5000) || '1' || repeat('}', 5000))::jsonb;
SELECT eventview.refresh('shape_qty');
SELECT event_type, count(*) AS paths, max(length(path)) AS longest FROM eventview.observed_fields
WHERE source = 'shapes'::regclass AND event_type IN ('wide', 'deep') GROUP BY 1 ORDER BY 1;
-- old_type is the type the path had last, also when that was decided in an earlier refresh of
-- the same transaction (which observes at the same now()), or earlier in a batch with two types.
SELECT eventview.create_event_table('retyped');
SELECT eventview.create_view('retyped_n', 'retyped');
BEGIN;
INSERT INTO retyped (event_type, payload) VALUES ('a', '{"x": 1}');
SELECT eventview.refresh('retyped_n');
INSERT INTO retyped (event_type, payload) VALUES ('a', '{"x": "s"}');
SELECT eventview.refresh('retyped_n');
INSERT INTO retyped (event_type, payload) VALUES ('a', '{"x": true}');
SELECT eventview.refresh('retyped_n');
COMMIT;
INSERT INTO retyped (event_type, payload) VALUES ('b', '{"y": 1}'), ('b', '{"y": "s"}');
SELECT eventview.refresh('retyped_n');
INSERT INTO retyped (event_type, payload) VALUES ('b', '{"y": [1]}');
SELECT eventview.refresh('retyped_n');
SELECT event_type, path, change, old_type, new_type FROM eventview.drift
WHERE source = 'retyped'::regclass ORDER BY id;
SELECT eventview.drop_event_table('retyped', cascade => true);
-- missing is about the types and versions a view reads a path for: its event_types, and the
-- type and version of the logical field declaration the path comes from.
SELECT eventview.create_event_table('scoped');
SELECT eventview.create_view('scoped_a', 'scoped', group_by => '{"x": "$.x"}', event_types => ARRAY['a']);
SELECT eventview.define_field('scoped', 'sku', '$.sku', 'b', 1);
SELECT eventview.define_field('scoped', 'sku', '$.item.sku', 'b', 2);
SELECT eventview.create_view('scoped_sku', 'scoped', group_by => '{"sku": "sku"}', event_types => ARRAY['b']);
INSERT INTO scoped (event_type, event_version, payload) VALUES
  ('a', 1, '{"x": 1, "sku": "A"}'), ('b', 1, '{"x": 1, "sku": "A"}'),
  ('b', 2, '{"x": 1, "sku": "A", "item": {"sku": "A"}}'), ('c', 1, '{"x": 1, "sku": "A"}');
SELECT eventview.refresh('scoped_a');
INSERT INTO scoped (event_type, event_version, payload) VALUES
  ('a', 1, '{"sku": "A"}'), ('b', 1, '{"x": 1}'), ('b', 2, '{"x": 1, "item": {"sku": "A"}}'), ('c', 1, '{}');
SELECT eventview.refresh('scoped_a');
SELECT event_type, event_version, path, change FROM eventview.drift
WHERE source = 'scoped'::regclass AND change = 'missing' ORDER BY 1, 2, 3;
SELECT eventview.drop_event_table('scoped', cascade => true);
-- Where a more specific declaration of a field overrides a generic one, the view reads only the
-- specific path there: $.price going missing from version 2 (read as $.cost.amount) is not drift,
-- from version 1 it is.
SELECT eventview.create_event_table('overridden');
SELECT eventview.define_field('overridden', 'price', '$.price', type => 'numeric');
SELECT eventview.define_field('overridden', 'price', '$.cost.amount', 'b', 2, 'numeric');
SELECT eventview.create_view('overridden_price', 'overridden', measures => '{"p": "sum(price)"}', event_types => ARRAY['b']);
INSERT INTO overridden (event_type, event_version, payload) VALUES
  ('b', 1, '{"price": 1, "cost": {"amount": 1}}'), ('b', 2, '{"price": 1, "cost": {"amount": 1}}');
SELECT eventview.refresh('overridden_price');
INSERT INTO overridden (event_type, event_version, payload) VALUES
  ('b', 1, '{"cost": {"amount": 1}}'), ('b', 2, '{"cost": {"amount": 1}}');
SELECT eventview.refresh('overridden_price');
SELECT event_type, event_version, path, change FROM eventview.drift
WHERE source = 'overridden'::regclass AND change = 'missing' ORDER BY 1, 2, 3;
SELECT eventview.drop_event_table('overridden', cascade => true);
-- Dropping the event table forgets its observations and drift.
SELECT eventview.drop_event_table('shapes', cascade => true);
SELECT count(*) AS dangling FROM eventview.drift WHERE source::oid NOT IN (SELECT oid FROM pg_class);
