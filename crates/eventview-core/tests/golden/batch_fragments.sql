-- applied_by
eventview._applied(c.xid, c.seq, k.s, k.own, k.own_seq)

-- touched_rows
(SELECT lo, hi FROM record_runs WHERE (SELECT yes FROM by_record)
     UNION ALL
     SELECT r.lo, r.hi
      FROM (SELECT pg_catalog.array_agg(event_id) AS ids
            FROM ids WHERE true GROUP BY event_id OPERATOR(pg_catalog.>>) 20) blocks
      CROSS JOIN LATERAL eventview._id_runs(blocks.ids) r
      WHERE NOT (SELECT yes FROM by_record)
     ORDER BY 1) runs
    CROSS JOIN LATERAL (SELECT * FROM ONLY "shop"."cart_events" x
                        WHERE x.event_id >= runs.lo AND x.event_id <= runs.hi
                        LIMIT runs.hi - runs.lo + 1) e

-- touched_rows_by_id
(SELECT DISTINCT event_id FROM ids) k JOIN ONLY "shop"."cart_events" e ON e.event_id = k.event_id

-- inserted_rows
(SELECT lo, hi FROM record_runs WHERE (SELECT yes FROM by_record)
     UNION ALL
     SELECT r.lo, r.hi
      FROM (SELECT pg_catalog.array_agg(event_id) AS ids
            FROM ids WHERE op = 'I' GROUP BY event_id OPERATOR(pg_catalog.>>) 20) blocks
      CROSS JOIN LATERAL eventview._id_runs(blocks.ids) r
      WHERE NOT (SELECT yes FROM by_record)
     ORDER BY 1) runs
    CROSS JOIN LATERAL (SELECT * FROM ONLY "shop"."cart_events" x
                        WHERE x.event_id >= runs.lo AND x.event_id <= runs.hi
                        LIMIT runs.hi - runs.lo + 1) e

-- consumed
(SELECT coalesce(sum(CASE WHEN op = 'I' THEN pg_catalog.cardinality(event_ids) ELSE 1 END), 0)::bigint FROM chg)
