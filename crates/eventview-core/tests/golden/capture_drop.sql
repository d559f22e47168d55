DROP FUNCTION IF EXISTS eventview._capture_2_insert() CASCADE;

DROP FUNCTION IF EXISTS eventview._capture_2_update() CASCADE;

DROP FUNCTION IF EXISTS eventview._capture_2_delete() CASCADE;

DROP FUNCTION IF EXISTS eventview._capture_2_truncate() CASCADE;

DROP TABLE IF EXISTS eventview._changes_2 CASCADE;
