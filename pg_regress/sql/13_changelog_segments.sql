\set VERBOSITY terse
-- Changelog segments (src/changelog.rs): a changelog is partitioned by record number; prune keeps
-- one segment made ahead of the records and takes applied segments away whole.
LOAD 'pg_eventview';
SET eventview.changelog_segment_min = 5;
SET eventview.changelog_segment_max = 0;
-- Segments of exactly 100 records (whatever the rate).
SET eventview.changelog_segment_min = 100;
SET eventview.changelog_segment_max = 100;
SELECT eventview.create_event_table('seg', delta_retention => '0 seconds');
SELECT eventview.create_view('seg_n', 'seg', measures => '{"n": "count(*)"}');
CREATE FUNCTION seg_partitions() RETURNS TABLE (partition text, bound text, records bigint)
LANGUAGE plpgsql AS $$
DECLARE r record;
BEGIN
    FOR r IN SELECT c.relname::text AS name, pg_get_expr(c.relpartbound, c.oid) AS b
             FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = (SELECT format('eventview._changes_%s', source_id)::regclass
                                  FROM eventview._sources WHERE relid = 'seg'::regclass)
             ORDER BY 2 LOOP
        partition := regexp_replace(r.name, '^_changes_[0-9]+_', '');
        bound := r.b;
        EXECUTE format('SELECT count(*) FROM ONLY eventview.%I', r.name) INTO records;
        RETURN NEXT;
    END LOOP;
END $$;
-- A new changelog: its default partition and a first segment.
SELECT * FROM seg_partitions();
DO $$ BEGIN FOR i IN 1..150 LOOP INSERT INTO seg (event_type, payload) VALUES ('t', '{}'); END LOOP; END $$;
-- Records past every segment go to the default partition.
SELECT * FROM seg_partitions();
SELECT eventview.refresh('seg_n');
-- Under REPEATABLE READ, applied records go by DELETE; no segment is made or dropped.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT eventview.prune('seg');
COMMIT;
SELECT * FROM seg_partitions();
-- The next segment starts at the next record number. The complete, emptied segment stays until
-- the next run (a capture that took its record number as it filled may still be on its way).
SELECT eventview.prune('seg');
SELECT * FROM seg_partitions();
SELECT eventview.prune('seg');
SELECT * FROM seg_partitions();
INSERT INTO seg (event_type, payload) VALUES ('t', '{}');
SELECT * FROM seg_partitions();
SELECT eventview.refresh('seg_n');
SELECT n FROM seg_n;
DROP FUNCTION seg_partitions();
SELECT eventview.drop_event_table('seg', cascade => true);
RESET eventview.changelog_segment_min;
RESET eventview.changelog_segment_max;
