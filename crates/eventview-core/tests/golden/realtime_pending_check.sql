SELECT (WITH snap AS MATERIALIZED (
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
      AND NOT eventview._applied(c.xid, c.seq, (SELECT s FROM applied), (SELECT own FROM applied), (SELECT own_seq FROM applied)))) AS pending;
