\set VERBOSITY terse
-- Hostile names and values: every user value is quoted, nothing is executed.
SET TimeZone = 'UTC';
CREATE SCHEMA "we'ird; schema";
SELECT eventview.create_event_table('"we''ird; schema"."Ev$$ents; DROP TABLE x"');
INSERT INTO "we'ird; schema"."Ev$$ents; DROP TABLE x" (event_type, occurred_at, payload) VALUES
  ('it''s; --', '2026-11-30 10:00+00', '{"k\"ey": "v''1", "a b": {"c''d": 2}, "ünï": "ü"}'),
  ('it''s; --', '2026-11-30 10:00+00', '{"k\"ey": "$$; SELECT 1; $$", "a b": {"c''d": 3}, "ünï": "ü"}'),
  ('other',     '2026-11-30 10:00+00', '{"k\"ey": "x", "a b": {"c''d": 4}}');
SELECT eventview.create_view('"we''ird; schema"."Vi""ew; --"',
  '"we''ird; schema"."Ev$$ents; DROP TABLE x"',
  group_by => '{"Key \"1\"; DROP": "$[''k\"ey'']", "ünï": "$.ünï"}',
  measures => '{"Sum ''$$''": "sum($[''a b''][\"c''d\"])", "n; --": "count(*)"}',
  event_types => ARRAY['it''s; --', 'O''Brien\'],
  filter => '{"$.ünï": ["ü", "it''s \\ ok"]}');
SELECT * FROM "we'ird; schema"."Vi""ew; --" ORDER BY 1;
INSERT INTO "we'ird; schema"."Ev$$ents; DROP TABLE x" (event_type, payload) VALUES
  ('O''Brien\', '{"k\"ey": "\\", "a b": {"c''d": 10}, "ünï": "ü"}');
SELECT eventview.refresh('"we''ird; schema"."Vi""ew; --"');
SELECT * FROM "we'ird; schema"."Vi""ew; --" ORDER BY 1;
SELECT attname FROM pg_attribute WHERE attrelid = '"we''ird; schema"."Vi""ew; --"'::regclass AND attnum > 0 ORDER BY attnum;
SELECT eventview.drop_view('"we''ird; schema"."Vi""ew; --"');
SELECT eventview.drop_event_table('"we''ird; schema"."Ev$$ents; DROP TABLE x"');
-- Unquoted names are case-folded exactly as Postgres does.
SELECT eventview.create_event_table('MixedCase');
SELECT to_regclass('mixedcase') IS NOT NULL AS folded;
SELECT eventview.drop_event_table('MIXEDCASE');
