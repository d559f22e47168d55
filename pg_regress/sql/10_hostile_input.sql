\set VERBOSITY terse
-- Hostile input: clear errors or quarantine, never a crash or unbounded memory.
SET TimeZone = 'UTC';
SELECT eventview.create_event_table('hostile');
SELECT eventview.create_view('hostile_keys', 'hostile',
  group_by => $j${"k": "$.k", "last": "$.arr[-1]", "empty": "$['']", "uni": "$.ключ"}$j$);
-- Rich JSONPaths (descendants, wildcards, filters) evaluate payloads nested at most 127 levels
-- deep; on a deeper one the event is a type error under the view's policy, never a silent NULL.
SELECT eventview.create_view('hostile_rich', 'hostile', group_by => '{"k": "$..k"}',
  measures => '{"n": "count(*)"}');
SELECT eventview.create_view('hostile_rich_skip', 'hostile', event_types => ARRAY['deep_rich', 'flat'],
  measures => '{"n": "count(*)", "top": "max($..k)"}', on_type_error => 'skip');
SELECT eventview.create_view('hostile_rich_fail', 'hostile', filter => '{"$..k": 5}',
  measures => '{"n": "count(*)"}', on_type_error => 'fail');
-- Deeply nested payload (10,000 levels) through the gate, then through a view.
SELECT * FROM eventview.ingest('hostile', jsonb_build_array(jsonb_build_object(
  'type', 'deep', 'payload', (repeat('{"k":', 10000) || '1' || repeat('}', 10000))::jsonb)));
-- 100,000 keys (1.6 MB: over the default payload limit, so raise it for this one).
SET eventview.max_payload_bytes = '16MB';
SELECT * FROM eventview.ingest('hostile', jsonb_build_array(jsonb_build_object(
  'type', 'wide', 'payload', (SELECT jsonb_object_agg('k' || i, i) FROM generate_series(1, 100000) i))));
RESET eventview.max_payload_bytes;
-- A huge string: over the payload limit it goes to quarantine, not into the table.
SELECT * FROM eventview.ingest('hostile', jsonb_build_array(jsonb_build_object(
  'type', 'huge', 'payload', jsonb_build_object('k', repeat('x', 2 * 1024 * 1024)))));
SELECT reason FROM eventview.quarantine WHERE source = 'hostile'::regclass;
-- 300 levels with the path's target at the bottom, and a flat one.
INSERT INTO hostile (event_type, payload) VALUES
  ('deep_rich', (repeat('{"a":', 300) || '{"k": 5}' || repeat('}', 300))::jsonb),
  ('flat', '{"k": 5}');
SELECT eventview.refresh('hostile_rich');
SELECT * FROM hostile_rich ORDER BY k NULLS FIRST;
SELECT q.event->>'event_type' AS event_type, q.reason FROM eventview.quarantine q
WHERE q.view_name = 'public.hostile_rich' ORDER BY q.event_id;
SELECT eventview.refresh('hostile_rich_skip');
SELECT * FROM hostile_rich_skip;
SELECT skipped FROM eventview.views WHERE name::text = 'hostile_rich_skip';
SELECT try($$SELECT eventview.refresh('hostile_rich_fail')$$);
SELECT * FROM hostile_rich_fail;
SELECT eventview.drop_view(v) FROM unnest(ARRAY['hostile_rich', 'hostile_rich_skip', 'hostile_rich_fail']) v;
-- Odd but valid paths.
INSERT INTO hostile (event_type, payload) VALUES
  ('odd', '{"k": "a", "arr": [1, 2, 3], "": "empty-key", "ключ": "значение"}');
SELECT eventview.refresh('hostile_keys');
SELECT * FROM hostile_keys WHERE k IS NULL OR k = 'a' ORDER BY k NULLS FIRST, last;
SELECT event_type, count(*) AS paths FROM eventview.observed_fields
WHERE source = 'hostile'::regclass GROUP BY 1 ORDER BY 1;
-- JSON text Postgres cannot take (a lone surrogate escape) fails before the gate, clearly.
SELECT try($$SELECT * FROM eventview.ingest('hostile', '[{"type": "a", "payload": {"x": "\ud800"}}]')$$);
-- JSONPath edge cases: refused with 22023 naming the path, or accepted.
SELECT try($q$SELECT eventview.create_view('p1', 'hostile', group_by => '{"k": "$"}')$q$);
SELECT try($q$SELECT eventview.create_view('p2', 'hostile', group_by => '{"k": "$.a[99999999999]"}')$q$);
SELECT try($q$SELECT eventview.create_view('p3', 'hostile', group_by => '{"k": "$..*"}')$q$);
SELECT try($q$SELECT eventview.create_view('p4', 'hostile', group_by => '{"k": "$.a[?@.b == ]"}')$q$);
SELECT try($q$SELECT eventview.create_view('p5', 'hostile', group_by => '{"k": "$[\"unterminated]"}')$q$);
SELECT try(format($f$SELECT eventview.create_view('p6', 'hostile', group_by => '{"k": "%s"}')$f$, '$' || repeat('.a', 5000)));
SELECT try($q$SELECT eventview.create_view('p7', 'hostile', group_by => '{"k": "$.a[1:2:0]"}')$q$);
