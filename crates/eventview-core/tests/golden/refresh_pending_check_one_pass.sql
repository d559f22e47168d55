WITH snap AS MATERIALIZED (
    SELECT eventview._snapshot_without_own() AS s, pg_catalog.pg_current_xact_id_if_assigned() AS own
),
applied AS MATERIALIZED (
    SELECT applied_snapshot AS s, applied_own_xid AS own, applied_own_seq AS own_seq
    FROM eventview._views WHERE view_id = 3
)
SELECT EXISTS (SELECT 1 FROM eventview._changes_2 c WHERE ((c.xid >= pg_catalog.pg_snapshot_xmin((SELECT s FROM applied))
            AND c.xid < pg_catalog.pg_snapshot_xmax((SELECT s FROM snap)))
           OR c.xid = (SELECT own FROM snap) OR c.xid = (SELECT own FROM applied))
      AND (pg_catalog.pg_visible_in_snapshot(c.xid, (SELECT s FROM snap))
           OR coalesce(c.xid = (SELECT own FROM snap), false))
      AND NOT eventview._applied(c.xid, c.seq, (SELECT s FROM applied), (SELECT own FROM applied), (SELECT own_seq FROM applied))) AS pending,
       (SELECT pg_catalog.pg_snapshot_xmax(s)::text::bigint FROM applied) AS applied_xmax,
       (SELECT extremes_logged FROM eventview._views WHERE view_id = 3) AS extremes_logged,
       (SELECT coalesce(pg_catalog.sum(CASE WHEN c.op = 'I' THEN pg_catalog.cardinality(c.event_ids) ELSE 1 END), 0)::bigint
        FROM (SELECT c.op, c.event_ids FROM eventview._changes_2 c WHERE ((c.xid >= pg_catalog.pg_snapshot_xmin((SELECT s FROM applied))
            AND c.xid < pg_catalog.pg_snapshot_xmax((SELECT s FROM snap)))
           OR c.xid = (SELECT own FROM snap) OR c.xid = (SELECT own FROM applied))
      AND (pg_catalog.pg_visible_in_snapshot(c.xid, (SELECT s FROM snap))
           OR coalesce(c.xid = (SELECT own FROM snap), false))
      AND NOT eventview._applied(c.xid, c.seq, (SELECT s FROM applied), (SELECT own FROM applied), (SELECT own_seq FROM applied)) LIMIT 500001) c) AS batch_rows;
