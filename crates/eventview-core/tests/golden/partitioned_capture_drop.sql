DROP FUNCTION IF EXISTS eventview._capture_2_insert() CASCADE;

DROP FUNCTION IF EXISTS eventview._capture_2_update() CASCADE;

DROP FUNCTION IF EXISTS eventview._capture_2_delete() CASCADE;

DROP FUNCTION IF EXISTS eventview._capture_2_truncate() CASCADE;

DROP FUNCTION IF EXISTS eventview._capture_2_keys() CASCADE;

DROP TABLE IF EXISTS eventview._changes_2 CASCADE;

DROP TABLE IF EXISTS eventview._keys_2 CASCADE;
