\set VERBOSITY terse
-- Every refusal: the SQLSTATE and the message, and nothing half-created.
SELECT eventview.create_event_table('err_events');

SELECT count(*) AS storage_before FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'eventview' AND c.relname ~ '^_v[0-9]' \gset
SELECT count(*) AS views_before FROM eventview._views \gset

-- Unknown relations: 42P01.
SELECT try($$SELECT eventview.create_view('v', 'no_such_table')$$);
SELECT try($$SELECT eventview.refresh('no_such_view')$$);
SELECT try($$SELECT eventview.drop_event_table('no_such_table')$$);
-- Named as PostgreSQL names them (a quoted name without its quotes, an unquoted one folded).
SELECT try($$SELECT eventview.refresh('"No Such View"')$$);
SELECT try($$SELECT eventview.refresh('Err.No_Such')$$);
-- Relations that are not ours: 22023.
CREATE TABLE plain_table (id int);
SELECT try($$SELECT eventview.create_view('v', 'plain_table')$$);
SELECT try($$SELECT eventview.refresh('plain_table')$$);
SELECT try($$SELECT eventview.drop_view('plain_table')$$);
SELECT try($$SELECT eventview.drop_event_table('plain_table')$$);

-- Definitions that cannot work: 22023, naming the offending part.
SELECT try($$SELECT eventview.create_view('v', 'err_events', measures => '{"x": "median($.a)"}')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', measures => '{"x": "sum"}')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', measures => '{"x": "sum()"}')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', measures => '{"x": "sum(producer)"}')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', measures => '{"x": 5}')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', group_by => '{"k": "$.a["}')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', group_by => '{"k": "sku"}')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', group_by => '{"k": "event_id"}')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', group_by => '{"k": "$.a", "k": "$.b"}')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', group_by => '{"n": "$.a"}', measures => '{"n": "count(*)"}')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', group_by => '{"bucket": "$.a"}', time_bucket => '1 hour')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', group_by => '["$.a"]')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', group_by => '{"": "$.a"}')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', event_types => '{}')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', event_types => ARRAY[NULL]::text[])$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', event_types => '{{a,b},{c,d}}')$$);
-- Required arguments given as NULL: 22004, naming the argument.
SELECT try($$SELECT eventview.create_view(NULL, 'err_events')$$);
SELECT try($$SELECT eventview.create_view('v', NULL)$$);
SELECT try($$SELECT eventview.create_event_table(NULL)$$);
SELECT try($$SELECT eventview.define_field('err_events', 'f', NULL)$$);
SELECT try($$SELECT eventview.rebuild(NULL)$$);
SELECT try($$SELECT eventview.alter_view(NULL, realtime => true)$$);
SELECT try($$SELECT eventview.create_event_table('e3', delta_retention => NULL)$$);
SELECT try($$SELECT * FROM eventview.ingest(NULL, '[]')$$);
SELECT try($$SELECT * FROM eventview.ingest('err_events', NULL)$$);
SELECT try($$SELECT * FROM eventview.ingest('err_events', 'null')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', on_type_error => 'ignore')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', time_bucket => '1 month')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', time_bucket => '-1 hour')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', time_bucket => '100000000 days')$$);
-- A member name no payload key can have (PostgreSQL text cannot hold U+0000).
SELECT try($$SELECT eventview.create_view('v', 'err_events', group_by => '{"ab": "$[\"a\\u0000b\"]"}')$$);
SELECT try($$SELECT eventview.define_field('err_events', 'nul', '$[''a\u0000b'']')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', filter => '{"$.a": []}')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', filter => '{"nope": 1}')$$);
-- Filter values are valid json that jsonb cannot hold: 22023 naming the filter.
SELECT try($$SELECT eventview.create_view('v', 'err_events', filter => '{"$.a": ["ok", "a\u0000b"]}')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', filter => '{"$.a": 1e200000}')$$);
SELECT try($$SELECT eventview.create_view('v', 'err_events', filter => '{"$.a": 1e-20000}')$$);
SELECT try($$SELECT eventview.create_event_table('e2', retention => '-1 day')$$);
SELECT try($$SELECT eventview.create_event_table('a.b.c')$$);
-- Not in the extension's own schema (DROP SCHEMA eventview CASCADE takes what is in it), nor
-- temporary (an event table or a view).
SELECT try($$SELECT eventview.create_event_table('eventview.mine')$$);
SELECT try($$SELECT eventview.create_event_table('pg_temp.mine')$$);
SELECT try($$SELECT eventview.create_view('pg_temp.mine_view', 'err_events')$$);
-- Names that are no identifier at all: 42602, as a cast to regclass says.
SELECT try($$SELECT eventview.create_event_table('')$$);
SELECT try($$SELECT eventview.create_event_table('My Events')$$);
SELECT try($$SELECT eventview.create_view('"bad"name', 'err_events')$$);
SELECT try($$SELECT eventview.refresh('')$$);

-- Nothing half-created by any of the refusals above.
SELECT count(*) = :views_before AS no_view_registered FROM eventview._views;
SELECT to_regclass('v') AS v, to_regclass('e2') AS e2, to_regclass('eventview.mine') AS mine;
SELECT count(*) = :storage_before AS no_storage_left FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'eventview' AND c.relname ~ '^_v[0-9]';

-- A name already taken: Postgres' own error, and the storage is rolled back too.
CREATE TABLE taken (x int);
SELECT try($$SELECT eventview.create_view('taken', 'err_events')$$);
SELECT count(*) = :storage_before AS no_storage_left FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'eventview' AND c.relname ~ '^_v[0-9]';
SELECT try($$SELECT eventview.create_event_table('taken')$$);

-- A view without time_bucket takes no rebuild window.
SELECT eventview.create_view('no_bucket', 'err_events');
SELECT try($$SELECT eventview.rebuild('no_bucket', now() - interval '1 day', now())$$);
-- An empty or reversed window recomputes nothing: refused.
SELECT try($$SELECT eventview.rebuild('no_bucket', '2026-11-08 00:00+00', '2026-11-01 00:00+00')$$);
SELECT try($$SELECT eventview.rebuild('no_bucket', '2026-11-08 00:00+00', '2026-11-08 00:00+00')$$);

-- How a user sees one of these errors, with its hint.
\set VERBOSITY default
SELECT eventview.create_view('v', 'err_events', measures => '{"x": "median($.a)"}');
SELECT eventview.drop_event_table('err_events');
-- Objects of the user's own on the table are named too, cascade or not (they are not views of
-- the extension's, which cascade => true drops).
CREATE VIEW reads_err_events AS SELECT event_id FROM err_events;
CREATE FUNCTION takes_err_event(e err_events) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint';
SELECT eventview.drop_event_table('err_events', cascade => true);
DROP VIEW reads_err_events;
DROP FUNCTION takes_err_event(err_events);
-- drop_view takes no CASCADE: what depends on an incremental view (anyone's) is named, not
-- "use CASCADE".
CREATE VIEW reads_no_bucket AS SELECT * FROM no_bucket;
CREATE FUNCTION counts_no_bucket() RETURNS bigint BEGIN ATOMIC SELECT count(*) FROM no_bucket; END;
SELECT eventview.drop_view('no_bucket');
\set VERBOSITY terse
DROP VIEW reads_no_bucket;
DROP FUNCTION counts_no_bucket();

-- An envelope column dropped by the table's owner: every refresh says so (55000),
-- and so does last_error, instead of failing on a bare "column does not exist".
SELECT eventview.create_event_table('altered_events');
SELECT eventview.create_view('altered_counts', 'altered_events', measures => '{"n": "count(*)"}');
ALTER TABLE altered_events DROP COLUMN payload;
INSERT INTO altered_events (event_type, event_version, producer, occurred_at) VALUES ('t', 1, 'p', now());
SELECT try($$SELECT eventview.refresh('altered_counts')$$);
SELECT try($$SELECT eventview.rebuild('altered_counts')$$);
SELECT last_error FROM eventview.views WHERE name = 'altered_counts'::regclass;
SELECT eventview.refresh_all();
SELECT eventview.drop_event_table('altered_events', cascade => true);
-- Retyped by the owner of the table and the view: the view refreshes (the owner's own casts),
-- the field observer does not read it, and says so with a WARNING once per session (the
-- worker runs maintenance every few seconds).
SELECT eventview.create_event_table('retyped_events');
SELECT eventview.create_view('retyped_counts', 'retyped_events', measures => '{"n": "count(*)"}');
ALTER TABLE retyped_events ALTER COLUMN producer TYPE varchar(50);
INSERT INTO retyped_events (event_type, event_version, producer, occurred_at, payload) VALUES ('t', 1, 'p', now(), '{"new": 1}');
SELECT eventview.refresh('retyped_counts');
INSERT INTO retyped_events (event_type, event_version, producer, occurred_at, payload) VALUES ('t', 1, 'p', now(), '{"new": 1}');
SELECT eventview.run_maintenance();
SELECT eventview.refresh_all();
SELECT count(*) AS observed FROM eventview.observed_fields WHERE source = 'retyped_events'::regclass;
SELECT eventview.drop_event_table('retyped_events', cascade => true);
