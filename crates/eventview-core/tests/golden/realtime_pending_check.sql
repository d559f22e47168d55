SELECT EXISTS (SELECT 1 FROM eventview._changes_2 c WHERE ((c.xid >= pg_catalog.pg_snapshot_xmin(a.s)
            AND c.xid < pg_catalog.pg_snapshot_xmax(n.s))
           OR c.xid = n.own OR c.xid = a.own)
      AND (pg_catalog.pg_visible_in_snapshot(c.xid, n.s)
           OR coalesce(c.xid = n.own, false))
      AND NOT eventview._applied(c.xid, c.seq, a.s, a.own, a.own_seq))
FROM (SELECT applied_snapshot AS s, applied_own_xid AS own, applied_own_seq AS own_seq
    FROM eventview._views WHERE view_id = 3) a,
     (SELECT eventview._snapshot_without_own() AS s, pg_catalog.pg_current_xact_id_if_assigned() AS own OFFSET 0) n;
