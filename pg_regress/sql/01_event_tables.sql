\set VERBOSITY terse
-- Event tables: exactly the envelope of the contract, and capture of every kind of change.
SET TimeZone = 'UTC';
CREATE SCHEMA shop;
SELECT eventview.create_event_table('shop.events');

SELECT column_name, data_type, is_nullable, column_default, is_identity, identity_generation
FROM information_schema.columns
WHERE table_schema = 'shop' AND table_name = 'events'
ORDER BY ordinal_position;

SELECT pg_get_constraintdef(oid) AS constraint
FROM pg_constraint WHERE conrelid = 'shop.events'::regclass ORDER BY 1;

SELECT * FROM eventview.event_tables;

-- The envelope rules hold.
SELECT try($$INSERT INTO shop.events (event_type, payload) VALUES ('', '{}')$$);
SELECT try($$INSERT INTO shop.events (event_type, event_version, payload) VALUES ('a', 0, '{}')$$);
SELECT try($$INSERT INTO shop.events (event_type, payload) VALUES ('a', '[1]')$$);
SELECT try($$INSERT INTO shop.events (event_type, payload) VALUES ('a', NULL)$$);
SELECT try($$INSERT INTO shop.events (event_id, event_type, payload) VALUES (1, 'a', '{}')$$);
SELECT try($$INSERT INTO shop.events (event_key, event_type, payload) VALUES ('k1', 'a', '{}'), ('k1', 'a', '{}')$$);

-- Defaults fill the envelope.
INSERT INTO shop.events (event_type, payload) VALUES ('signup', '{"plan": "free"}');
SELECT event_id, event_key, event_type, event_version, producer = current_user AS producer_is_me,
       occurred_at IS NOT NULL AS has_time, payload
FROM shop.events;

-- COPY is captured like INSERT.
COPY shop.events (event_type, occurred_at, payload) FROM STDIN;
signup	2026-11-30 10:00:00+00	{"plan": "pro"}
signup	2026-11-30 10:01:00+00	{"plan": "free"}
\.
SELECT eventview.create_view('signups', 'shop.events', group_by => '{"plan": "$.plan"}');
SELECT * FROM signups ORDER BY plan;
COPY shop.events (event_type, occurred_at, payload) FROM STDIN;
signup	2026-11-30 11:00:00+00	{"plan": "pro"}
\.
SELECT eventview.refresh('signups');
SELECT * FROM signups ORDER BY plan;

-- drop_event_table refuses while a view reads the table, and cascades when asked.
SELECT try($$SELECT eventview.drop_event_table('shop.events')$$);
SELECT eventview.drop_event_table('shop.events', cascade => true);
SELECT to_regclass('shop.events') AS table_after, to_regclass('signups') AS view_after;
SELECT count(*) AS catalog_rows FROM eventview._sources;
SELECT count(*) AS leftover_internal_tables FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'eventview' AND c.relname ~ '^_(changes|v)[0-9_]';

-- Unqualified names are created in the first schema of search_path.
SET search_path = shop, public;
SELECT eventview.create_event_table('clicks');
SELECT 'shop.clicks'::regclass;
-- Quietly: no "does not exist, skipping" notices for what the DROP TABLE already took along.
SET client_min_messages = notice;
SELECT eventview.drop_event_table('clicks');
RESET client_min_messages;
RESET search_path;

-- The insert capture logs one record per statement that inserts rows, holding every new id,
-- also when other AFTER statement triggers read the same transition table before and after it;
-- a statement that inserts nothing logs nothing.
SELECT eventview.create_event_table('shop.orders');
SELECT 'eventview._changes_' || source_id AS orders_log,
       'eventview._capture_' || source_id || '_insert' AS orders_capture
FROM eventview._sources WHERE relid = 'shop.orders'::regclass \gset
CREATE TABLE shop.seen (trigger_name text, rows bigint, ids bigint);
CREATE FUNCTION shop.see_new_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO shop.seen SELECT TG_NAME, count(*), sum(event_id) FROM new_rows;
    RETURN NULL;
END $$;
CREATE TRIGGER a_before_capture AFTER INSERT ON shop.orders REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION shop.see_new_rows();
CREATE TRIGGER z_after_capture AFTER INSERT ON shop.orders REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION shop.see_new_rows();
INSERT INTO shop.orders (event_type, payload) SELECT 'order', jsonb_build_object('n', g) FROM generate_series(1, 5) g;
INSERT INTO shop.orders (event_type, payload) SELECT 'order', '{}' WHERE false;
INSERT INTO shop.orders (event_type, payload) VALUES ('order', '{}');
SELECT op, event_ids FROM :orders_log ORDER BY seq;
SELECT * FROM shop.seen ORDER BY ids, trigger_name;

-- The native insert capture refuses to run for anything but its event table's AFTER INSERT
-- statement trigger (SQLSTATE 09000), and under any other name than an event table's capture.
CREATE TABLE shop.other (event_id bigint);
CREATE TRIGGER borrowed_per_row AFTER INSERT ON shop.other FOR EACH ROW EXECUTE FUNCTION :orders_capture();
SELECT try('INSERT INTO shop.other VALUES (1)');
DROP TRIGGER borrowed_per_row ON shop.other;
CREATE TRIGGER borrowed_per_statement AFTER INSERT ON shop.other REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION :orders_capture();
SELECT try('INSERT INTO shop.other VALUES (1)');
DROP TRIGGER borrowed_per_statement ON shop.other;
CREATE FUNCTION shop._capture_1_insert() RETURNS trigger LANGUAGE c AS '$libdir/pg_eventview', 'capture_inserted_rows';
CREATE TRIGGER borrowed AFTER INSERT ON shop.other REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION shop._capture_1_insert();
SELECT try('INSERT INTO shop.other VALUES (1)');
SELECT count(*) AS logged_by_others FROM :orders_log;
DROP TABLE shop.other, shop.seen;
DROP FUNCTION shop._capture_1_insert(), shop.see_new_rows() CASCADE;
SELECT eventview.drop_event_table('shop.orders');
