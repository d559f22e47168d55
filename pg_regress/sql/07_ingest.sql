\set VERBOSITY terse
-- The ingest gate: good envelopes in, bad ones to quarantine with a reason, keys deduplicated.
SET TimeZone = 'UTC';
SELECT eventview.create_event_table('gate');
SELECT eventview.create_view('gate_counts', 'gate', group_by => '{"type": "event_type"}');
SELECT * FROM eventview.ingest('gate', '[
  {"type": "a", "payload": {"x": 1}, "key": "k1", "occurred_at": "2026-11-30T10:00:00Z"},
  {"type": "a", "payload": {"x": 2}, "key": "k1", "occurred_at": "2026-11-30T10:00:00Z"},
  {"type": "", "payload": {}},
  {"payload": {}},
  {"type": "b", "payload": [1]},
  {"type": "b"},
  {"type": "b", "payload": {}, "occurred_at": "yesterday"},
  {"type": "b", "payload": {}, "occurred_at": "now"},
  {"type": "b", "payload": {}, "occurred_at": "2026-11-30 10:00:00"},
  {"type": "b", "payload": {}, "occurred_at": "2026-01-01T24:00:00Z"},
  {"type": "b", "payload": {}, "occurred_at": "2026-11-30T10:00:00+02:00", "version": 2, "producer": "ios"},
  {"type": "b", "payload": {}, "version": 1.5},
  {"type": "b", "payload": {}, "version": 0},
  {"type": "b", "payload": {}, "version": 2147483648},
  {"type": "b", "payload": {}, "key": 5},
  {"type": "b", "payload": {}, "producer": ["x"]},
  {"type": "c", "payload": {}, "version": null, "producer": null, "occurred_at": null, "key": null},
  {"type": "c", "payload": {"n": 1}, "version": 2.0},
  7]');
-- A key seen before is a duplicate, not an error.
SELECT * FROM eventview.ingest('gate', '[{"type": "a", "payload": {"x": 1}, "key": "k1"}]');
SELECT event_key, event_type, event_version, producer = current_user AS default_producer,
       CASE WHEN occurred_at = ingested_at THEN 'default (now)' ELSE occurred_at::text END AS occurred_at, payload
FROM gate ORDER BY event_id;
SELECT source, view_name, event_id, reason, event FROM eventview.quarantine WHERE source = 'gate'::regclass ORDER BY id;
-- Oversized payloads, by a user-settable limit.
SET eventview.max_payload_bytes = '16B';
SELECT * FROM eventview.ingest('gate', '[{"type": "a", "payload": {"x": "a long string"}}, {"type": "a", "payload": {"x": 1}}]');
RESET eventview.max_payload_bytes;
SELECT reason FROM eventview.quarantine ORDER BY id DESC LIMIT 1;
-- A leap second is a time (the next minute's first); with a fraction, PostgreSQL has no such
-- time: a bad envelope, not a failed batch.
SELECT * FROM eventview.ingest('gate', '[
  {"type": "leap", "payload": {}, "occurred_at": "2026-12-31T23:59:60Z"},
  {"type": "leap", "payload": {}, "occurred_at": "2026-12-31T23:59:60.5Z"}]');
SELECT occurred_at FROM gate WHERE event_type = 'leap';
SELECT reason FROM eventview.quarantine ORDER BY id DESC LIMIT 1;
-- Ingested events flow into views like any insert.
SELECT eventview.refresh('gate_counts');
SELECT * FROM gate_counts ORDER BY type;
-- A key too long for the unique index on event_key (entries of at most 2704 bytes) is a bad
-- envelope, not a failed batch: up to 2000 bytes are taken.
SELECT * FROM eventview.ingest('gate', jsonb_build_array(
  jsonb_build_object('type', 'long', 'payload', '{}'::jsonb, 'key', repeat('k', 2000)),
  jsonb_build_object('type', 'long', 'payload', '{}'::jsonb,
                     'key', (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 100) i))));
SELECT reason FROM eventview.quarantine ORDER BY id DESC LIMIT 1;
SELECT count(*) AS long_keys_in FROM gate WHERE event_type = 'long';
-- A "type" that is there but not a non-empty string says what it is.
SELECT * FROM eventview.ingest('gate', '[{"type": 5, "payload": {}}, {"type": null, "payload": {}}]');
SELECT reason FROM eventview.quarantine ORDER BY id DESC LIMIT 2;
-- Errors.
SELECT try($$SELECT * FROM eventview.ingest('gate', '{"type": "a"}')$$);
SELECT try($$SELECT * FROM eventview.ingest('no_such', '[]')$$);
CREATE TABLE not_events (x int);
SELECT try($$SELECT * FROM eventview.ingest('not_events', '[]')$$);
SELECT * FROM eventview.ingest('gate', '[]');
