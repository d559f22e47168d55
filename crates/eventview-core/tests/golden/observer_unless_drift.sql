WITH snap AS MATERIALIZED (
    SELECT eventview._snapshot_without_own() AS s, pg_catalog.pg_current_xact_id_if_assigned() AS own
),
applied AS MATERIALIZED (
    SELECT observed_snapshot AS s, observed_own_xid AS own, observed_own_seq AS own_seq
    FROM eventview._sources WHERE source_id = 2
),
chg AS MATERIALIZED (
    SELECT c.seq, c.xid, c.op, c.event_ids, c.event_id, c.old_event_type, c.old_event_version,
           c.old_producer, c.old_occurred_at, c.old_payload
    FROM eventview._changes_2 c
    WHERE ((c.xid >= pg_catalog.pg_snapshot_xmin((SELECT s FROM applied))
            AND c.xid < pg_catalog.pg_snapshot_xmax((SELECT s FROM snap)))
           OR c.xid = (SELECT own FROM snap) OR c.xid = (SELECT own FROM applied))
      AND (pg_catalog.pg_visible_in_snapshot(c.xid, (SELECT s FROM snap))
           OR coalesce(c.xid = (SELECT own FROM snap), false))
      AND NOT eventview._applied(c.xid, c.seq, (SELECT s FROM applied), (SELECT own FROM applied), (SELECT own_seq FROM applied))
),
ids AS MATERIALIZED (
    SELECT seq, op, unnest(event_ids) AS event_id FROM chg WHERE op = 'I'
    UNION ALL
    SELECT seq, op, event_id FROM chg WHERE op <> 'I'
),
record_runs AS MATERIALIZED (
    SELECT r.lo, r.hi
    FROM chg CROSS JOIN LATERAL eventview._id_runs(chg.event_ids) r
    WHERE (SELECT count(*) <= 64 AND coalesce(pg_catalog.bool_and(op = 'I'), true) FROM chg)
),
by_record AS MATERIALIZED (
    SELECT (SELECT count(*) <= 64 AND coalesce(pg_catalog.bool_and(op = 'I'), true) FROM chg)
           AND NOT EXISTS (SELECT 1 FROM (SELECT lo, lag(hi) OVER (ORDER BY lo) AS before FROM record_runs) o
                           WHERE o.lo <= o.before) AS yes
),
view_applied AS MATERIALIZED (
    SELECT applied_snapshot AS s, applied_own_xid AS own, applied_own_seq AS own_seq
    FROM eventview._views WHERE view_id = $9::integer
),
shared AS MATERIALIZED (
    SELECT CASE WHEN $6::text IS NULL THEN false
                ELSE (SELECT coalesce(pg_catalog.bool_and(op = 'I'), true)
                             AND coalesce(pg_catalog.sum(pg_catalog.cardinality(event_ids)), 0) <= 500000
                      FROM chg)
                     AND (SELECT coalesce(pg_catalog.array_agg(seq ORDER BY seq), '{}') FROM chg) = (SELECT coalesce(pg_catalog.array_agg(c.seq ORDER BY c.seq), '{}') FROM eventview._changes_2 c WHERE ((c.xid >= pg_catalog.pg_snapshot_xmin((SELECT s FROM view_applied))
            AND c.xid < pg_catalog.pg_snapshot_xmax((SELECT s FROM snap)))
           OR c.xid = (SELECT own FROM snap) OR c.xid = (SELECT own FROM view_applied))
      AND (pg_catalog.pg_visible_in_snapshot(c.xid, (SELECT s FROM snap))
           OR coalesce(c.xid = (SELECT own FROM snap), false))
      AND NOT eventview._applied(c.xid, c.seq, (SELECT s FROM view_applied), (SELECT own FROM view_applied), (SELECT own_seq FROM view_applied))) END AS yes
),
-- The walk is an aggregate over the rows, read once: one call per event, walking its payload
-- in place, and at the end the counts as JSON (besides the paths, per type and version, how
-- many events it walked: path ''), with, in the order walked, the first and the last event
-- with each path and type and the first event without each path.
walk AS MATERIALIZED (
    SELECT eventview._shapes_agg(e.event_type, e.event_version, e.payload) AS shapes,
           eventview._group_deltas($6::text, $7::interval, 1, e.event_id, e.event_type, e.event_version,
                                   e.producer, e.occurred_at, e.payload)
               FILTER (WHERE (SELECT yes FROM shared)
                         AND ($8::text[] IS NULL OR e.event_type = ANY ($8::text[]))) AS pass
    FROM (SELECT lo, hi FROM record_runs WHERE (SELECT yes FROM by_record)
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
),
walked AS MATERIALIZED (
    SELECT r.value ->> 0 AS event_type, (r.value ->> 1)::integer AS event_version,
           r.value ->> 2 AS path, r.value ->> 3 AS json_type, (r.value ->> 4)::bigint AS events,
           (r.value ->> 5)::bigint AS first, (r.value ->> 6)::bigint AS first_without,
           (r.value ->> 7)::bigint AS last, nullif(r.value ->> 8, '') AS before, nullif(r.value ->> 9, '') AS before_without
    FROM walk f
    CROSS JOIN LATERAL pg_catalog.jsonb_array_elements(f.shapes::jsonb) r
),
vers AS (
    SELECT event_type, event_version, sum(events)::bigint AS n FROM walked WHERE path = '' GROUP BY 1, 2
),
obs AS (
    SELECT event_type, event_version, path, json_type, sum(events)::bigint AS n,
           min(first) AS first, max(first_without) AS first_without, max(last) AS last,
           max(before) AS before, max(before_without) AS before_without
    FROM walked WHERE path <> ''
    GROUP BY 1, 2, 3, 4
),
-- The declarations of the paths views read, with the event type and version each is for (NULL:
-- any), numbered per field reference, most specific first.
declared AS (
    SELECT r.path, r.event_type, r.event_version, r.field, r.rank
    FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::integer[]),
                    pg_catalog.unnest($4::integer[]), pg_catalog.unnest($5::integer[]))
         AS r(path, event_type, event_version, field, rank)
),
-- Per type and version with events in the batch, the paths read: of each field reference, the
-- most specific declaration that applies (as resolution picks it).
read_paths AS (
    SELECT DISTINCT ON (v.event_type, v.event_version, d.field) d.path, v.event_type, v.event_version
    FROM vers v JOIN declared d
      ON (d.event_type IS NULL OR d.event_type = v.event_type)
     AND (d.event_version IS NULL OR d.event_version = v.event_version)
    ORDER BY v.event_type, v.event_version, d.field, d.rank
),
prev_vers AS (
    SELECT v.event_type, v.event_version, coalesce(o.events, 0) AS events
    FROM vers v LEFT JOIN eventview._observed_versions o
      ON o.source_id = 2 AND o.event_type = v.event_type AND o.event_version = v.event_version
),
may_drift AS (
    SELECT EXISTS (SELECT 1 FROM obs o
                   WHERE NOT EXISTS (SELECT 1 FROM eventview._observed x
                                     WHERE x.source_id = 2 AND x.event_type = o.event_type
                                       AND x.event_version = o.event_version AND x.path = o.path
                                       AND x.json_type = o.json_type))
        OR EXISTS (SELECT 1 FROM read_paths r JOIN vers v USING (event_type, event_version)
                                            JOIN prev_vers pv USING (event_type, event_version)
                   WHERE r.path IS NOT NULL AND pv.events > 0
                     AND coalesce((SELECT sum(o.n) FROM obs o
                                   WHERE o.event_type = r.event_type AND o.event_version = r.event_version
                                     AND o.path = r.path), 0) < v.n
                     AND (SELECT coalesce(sum(x.seen), 0) FROM eventview._observed x
                          WHERE x.source_id = 2 AND x.event_type = r.event_type
                            AND x.event_version = r.event_version AND x.path = r.path) >= pv.events)
        OR EXISTS (SELECT 1 FROM prev_vers WHERE events = 0) AS yes
),
seen_paths AS (
    INSERT INTO eventview._observed AS t (source_id, event_type, event_version, path, json_type, first_seen, last_seen, seen, last_event)
    SELECT 2, o.event_type, o.event_version, o.path, o.json_type, now(), now(), o.n, pv.events + o.last
    FROM obs o JOIN prev_vers pv USING (event_type, event_version)
    WHERE NOT (SELECT yes FROM may_drift)
    ON CONFLICT (source_id, event_type, event_version, path, json_type)
    DO UPDATE SET last_seen = EXCLUDED.last_seen, seen = t.seen + EXCLUDED.seen, last_event = EXCLUDED.last_event
    RETURNING 1
),
seen_versions AS (
    INSERT INTO eventview._observed_versions AS t (source_id, event_type, event_version, events)
    SELECT 2, event_type, event_version, n FROM vers
    WHERE NOT (SELECT yes FROM may_drift)
    ON CONFLICT (source_id, event_type, event_version) DO UPDATE SET events = t.events + EXCLUDED.events
    RETURNING 1
),
st AS (
    UPDATE eventview._sources
    SET observed_snapshot = (SELECT s FROM snap),
        observed_own_xid = (SELECT own FROM snap),
        observed_own_seq = CASE WHEN (SELECT own FROM snap) IS NOT NULL THEN greatest((SELECT max(seq) FROM chg WHERE xid = (SELECT own FROM snap)),
                          (SELECT own_seq FROM applied WHERE own = (SELECT own FROM snap))) END
    WHERE source_id = 2
    AND NOT (SELECT yes FROM may_drift)
    RETURNING 1
)
SELECT (SELECT coalesce(sum(n), 0)::bigint FROM vers) AS observed, 0::bigint AS drift_rows,
       (SELECT pass FROM walk) AS pass,
       (SELECT coalesce(sum(CASE WHEN op = 'I' THEN pg_catalog.cardinality(event_ids) ELSE 1 END), 0)::bigint FROM chg) AS batch_rows,
       (SELECT yes FROM may_drift) AS may_drift;
