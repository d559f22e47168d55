\set VERBOSITY terse
-- Logical fields: one name across event versions, typed; count_distinct.
SET TimeZone = 'UTC';
SELECT eventview.create_event_table('carts');
-- sku is $.sku in v1 and $.item.sku in v2; qty is $.qty in v1 and $.item.quantity in v2.
SELECT eventview.define_field('carts', 'sku', '$.sku', 'add_to_cart', 1);
SELECT eventview.define_field('carts', 'sku', '$.item.sku', 'add_to_cart', 2);
SELECT eventview.define_field('carts', 'qty', '$.qty', 'add_to_cart', 1, 'bigint');
SELECT eventview.define_field('carts', 'qty', '$.item.quantity', 'add_to_cart', 2, 'bigint');
SELECT eventview.define_field('carts', 'shopper', '$.user', type => 'jsonb');
SELECT eventview.define_field('carts', 'seen_at', '$.at', type => 'timestamptz');
SELECT eventview.define_field('carts', 'gift', '$.gift', type => 'boolean');
-- Resolution order: type and version, then type alone, then version alone, then any.
SELECT eventview.define_field('carts', 'label', '$.any');
SELECT eventview.define_field('carts', 'label', '$.v2', version => 2);
SELECT eventview.define_field('carts', 'label', '$.t', 'add_to_cart');
SELECT eventview.define_field('carts', 'label', '$.tv', 'add_to_cart', 2);

INSERT INTO carts (event_type, event_version, payload) VALUES
  ('add_to_cart', 1, '{"sku": "A", "qty": 2, "user": 1, "at": "2026-11-30T10:00:00Z", "gift": true, "t": "t-only", "any": "a"}'),
  ('add_to_cart', 2, '{"item": {"sku": "A", "quantity": 3}, "user": 1.0, "at": "2026-11-30T12:00:00+02:00", "tv": "tv", "t": "t"}'),
  ('add_to_cart', 2, '{"item": {"sku": "B", "quantity": 1}, "user": "1", "gift": false}'),
  ('remove',      2, '{"sku": "B", "v2": "v2-only", "any": "a"}'),
  ('remove',      1, '{"any": "any-only"}');

SELECT eventview.create_view('cart_qty', 'carts',
  group_by => '{"sku": "sku"}',
  measures => '{"qty": "sum(qty)", "shoppers": "count_distinct(shopper)", "first_seen": "min(seen_at)", "gifts": "count(gift)"}',
  event_types => ARRAY['add_to_cart']);
SELECT * FROM cart_qty ORDER BY sku;
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = 'cart_qty'::regclass AND attnum > 0 ORDER BY attnum;
SELECT eventview.create_view('labels', 'carts', group_by => '{"label": "label", "t": "event_type", "v": "event_version"}');
SELECT * FROM labels ORDER BY t, v;

-- Declared types convert only the matching JSON kind; the rest is a type error.
INSERT INTO carts (event_type, event_version, payload) VALUES
  ('add_to_cart', 1, '{"sku": "C", "qty": 1.5}'),
  ('add_to_cart', 1, '{"sku": "C", "qty": "2"}'),
  ('add_to_cart', 1, '{"sku": "C", "qty": 1, "at": "yesterday"}'),
  ('add_to_cart', 1, '{"sku": "C", "qty": 1, "gift": "yes"}'),
  ('add_to_cart', 1, '{"sku": {"id": "C"}, "qty": 1}'),
  ('add_to_cart', 1, '{"sku": "C", "qty": 4, "user": {"id": 7}}');
SELECT eventview.refresh('cart_qty');
SELECT * FROM cart_qty ORDER BY sku;
SELECT reason FROM eventview.quarantine WHERE view_name = 'public.cart_qty' ORDER BY event_id;

-- count_distinct: a value leaves the count when its last occurrence goes.
DELETE FROM carts WHERE payload @> '{"user": 1}' AND event_version = 1;
SELECT eventview.refresh('cart_qty');
SELECT sku, shoppers FROM cart_qty WHERE sku = 'A';
DELETE FROM carts WHERE payload @> '{"user": 1.0}';
SELECT eventview.refresh('cart_qty');
SELECT * FROM cart_qty ORDER BY sku;

-- Redeclaring a field: new changes use it, the view says so, rebuild recomputes the past.
SELECT eventview.define_field('carts', 'sku', '$.code', 'add_to_cart', 2);
SELECT name, last_error FROM eventview.views WHERE name = 'cart_qty'::regclass;
INSERT INTO carts (event_type, event_version, payload) VALUES ('add_to_cart', 2, '{"code": "Z", "item": {"quantity": 9}}');
SELECT eventview.refresh('cart_qty');
SELECT * FROM cart_qty ORDER BY sku;
SELECT eventview.rebuild('cart_qty');
SELECT * FROM cart_qty ORDER BY sku;
SELECT name, last_error, quarantined FROM eventview.views WHERE name = 'cart_qty'::regclass;
-- The rebuild recorded each type error once again, not twice.
SELECT count(*) AS quarantined_rows FROM eventview.quarantine WHERE view_name = 'public.cart_qty';

-- Refusals: 22023 naming the problem.
SELECT try($$SELECT eventview.define_field('carts', 'Sku', '$.sku')$$);
SELECT try($$SELECT eventview.define_field('carts', 'sku-x', '$.sku')$$);
SELECT try($$SELECT eventview.define_field('carts', 'producer', '$.p')$$);
SELECT try($$SELECT eventview.define_field('carts', 'sku', '$.[')$$);
SELECT try($$SELECT eventview.define_field('carts', 'sku', '$.s', type => 'int')$$);
SELECT try($$SELECT eventview.define_field('carts', 'qty', '$.q', 'other', type => 'numeric')$$);
SELECT try($$SELECT eventview.define_field('carts', 'sku', '$.s', version => 0)$$);
SELECT try($$SELECT eventview.define_field('no_such', 'sku', '$.s')$$);
SELECT try($$SELECT eventview.create_view('v_bad', 'carts', group_by => '{"k": "nope"}')$$);
SELECT try($$SELECT eventview.create_view('v_bad', 'carts', measures => '{"s": "sum(sku)"}')$$);
SELECT try($$SELECT eventview.create_view('v_bad', 'carts', measures => '{"s": "max(gift)"}')$$);
SELECT try($$SELECT eventview.create_view('v_bad', 'carts', measures => '{"s": "count_distinct()"}')$$);

-- A field of several declarations read by no view changes its type when one of them is
-- declared again with another type: all of them take it. A new declaration must take the
-- field's type.
SELECT eventview.define_field('carts', 'amount', '$.amount', type => 'numeric');
SELECT eventview.define_field('carts', 'amount', '$.amt', 'cart', 2, 'numeric');
SELECT try($$SELECT eventview.define_field('carts', 'amount', '$.a', 'cart', 3, 'double precision')$$);
SET client_min_messages = notice;
SELECT eventview.define_field('carts', 'amount', '$.amt', 'cart', 2, 'double precision');
RESET client_min_messages;
SELECT event_type, event_version, path, field_type FROM eventview._fields
WHERE field = 'amount' ORDER BY event_type NULLS LAST, event_version;
-- Once a view reads it, its type stays.
SELECT eventview.create_view('by_amount', 'carts', measures => '{"m": "max(amount)"}');
SELECT try($$SELECT eventview.define_field('carts', 'amount', '$.amount', type => 'numeric')$$);
SELECT eventview.drop_view('by_amount');
