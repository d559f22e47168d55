WITH snap AS MATERIALIZED (
    SELECT eventview._snapshot_without_own() AS s, pg_catalog.pg_current_xact_id_if_assigned() AS own
    WHERE NOT EXISTS (SELECT FROM ONLY "shop"."cart_events" WHERE false)
),
applied AS MATERIALIZED (
    SELECT applied_snapshot AS s, applied_own_xid AS own, applied_own_seq AS own_seq
    FROM eventview._views WHERE view_id = 3
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
firsts AS (SELECT DISTINCT ON (event_id) event_id, seq, op FROM ids ORDER BY event_id, seq),
delta_rows AS (
    SELECT -1 AS sign, true AS from_delta, c.event_id, c.old_event_type AS event_type,
           c.old_event_version AS event_version, c.old_producer AS producer,
           c.old_occurred_at AS occurred_at, c.old_payload AS payload
    FROM firsts f JOIN chg c ON c.seq = f.seq AND c.op <> 'I'
    WHERE f.op <> 'I'
    UNION ALL
    SELECT 1, true, e.event_id, e.event_type, e.event_version, e.producer, e.occurred_at, e.payload
    FROM (SELECT DISTINCT event_id FROM ids) k JOIN ONLY "shop"."cart_events" e ON e.event_id = k.event_id
),
f AS (
    SELECT r.sign, r.from_delta, r.event_id, r.event_type, r.event_version, r.producer, r.occurred_at,
           (r.payload -> 'item' -> 'sku') AS j1,
           CASE WHEN r.event_version = 1 THEN (r.payload -> 'region') WHEN r.event_version = 2 THEN (r.payload -> 'shipping' -> 'region') END AS j2,
           eventview._jsonpath_match(r.payload::text, '$..coupon') AS j3,
           (r.payload -> 'qty') AS j4,
           (r.payload -> 'price') AS j5,
           (r.payload -> 'user_id') AS j6,
           (r.payload -> 'channel') AS j7,
           r.payload
    FROM delta_rows r
    WHERE r.event_type = ANY (ARRAY['cart_add', 'cart_remove']::text[])
    OFFSET 0
),
ft AS (
    SELECT f.*, jsonb_typeof(j1) AS t1, jsonb_typeof(j2) AS t2, jsonb_typeof(j3) AS t3, jsonb_typeof(j4) AS t4, jsonb_typeof(j5) AS t5, jsonb_typeof(j6) AS t6
    FROM f
    OFFSET 0
),
c0 AS (
    SELECT sign,
           event_id,
           pg_catalog.date_bin('1 hour'::interval, occurred_at, '2000-01-01 00:00:00+00'::timestamptz) AS bucket,
           CASE WHEN t1 IN ('string', 'number', 'boolean') THEN j1 #>> '{}' END AS g1,
           CASE WHEN t2 IN ('string', 'number', 'boolean') THEN j2 #>> '{}' END AS g2,
           coalesce(t3 <> 'null', false) AS m2,
           CASE WHEN t4 = 'number' THEN j4::numeric END AS m3,
           CASE WHEN t5 = 'number' THEN j5::numeric END AS m4,
           CASE WHEN t5 = 'number' THEN j5::numeric END AS m5,
           CASE WHEN t5 = 'number' THEN j5::numeric END AS m6,
           CASE WHEN t6 <> 'null' THEN j6 END AS m7,
           CASE WHEN (j3 IS NULL AND true AND eventview._jsonpath_too_deep(payload::text)) THEN 'JSONPath $..coupon cannot be evaluated: the payload is nested deeper than 127 levels' WHEN t1 IN ('object', 'array') THEN 'group column "sku": $.item.sku is a JSON ' || t1 || ', not a scalar' WHEN t2 IN ('object', 'array') THEN 'group column "region": field "region" is declared text and cannot take ' || 'a JSON ' || t2 WHEN t4 NOT IN ('number', 'null') THEN 'measure "quantity": sum($.qty) needs a JSON number, found ' || t4 WHEN t5 NOT IN ('number', 'null') THEN 'measure "avg_price": avg($.price) needs a JSON number, found ' || t5 END AS bad0
    FROM ft
    WHERE j7 IN ('"web"'::jsonb, '"app"'::jsonb)
    OFFSET 0
),
c AS MATERIALIZED (
    SELECT c0.*, coalesce(c0.bad0, CASE WHEN coalesce(pg_catalog.pg_column_size(c0.g1), 0) + coalesce(pg_catalog.pg_column_size(c0.g2), 0) > 2000 THEN 'group columns "sku", "region" take ' || (coalesce(pg_catalog.pg_column_size(c0.g1), 0) + coalesce(pg_catalog.pg_column_size(c0.g2), 0)) || ' bytes, more than the 2000 a group key may take' WHEN coalesce(pg_catalog.pg_column_size(c0.g1), 0) + coalesce(pg_catalog.pg_column_size(c0.g2), 0) + coalesce(pg_catalog.pg_column_size(c0.m5), 0) > 2000 THEN 'measure "lowest": min($.price) takes, with the group columns, ' || (coalesce(pg_catalog.pg_column_size(c0.g1), 0) + coalesce(pg_catalog.pg_column_size(c0.g2), 0) + coalesce(pg_catalog.pg_column_size(c0.m5), 0)) || ' bytes, more than the 2000 a stored value may take' WHEN coalesce(pg_catalog.pg_column_size(c0.g1), 0) + coalesce(pg_catalog.pg_column_size(c0.g2), 0) + coalesce(pg_catalog.pg_column_size(c0.m6), 0) > 2000 THEN 'measure "highest": max($.price) takes, with the group columns, ' || (coalesce(pg_catalog.pg_column_size(c0.g1), 0) + coalesce(pg_catalog.pg_column_size(c0.g2), 0) + coalesce(pg_catalog.pg_column_size(c0.m6), 0)) || ' bytes, more than the 2000 a stored value may take' WHEN coalesce(pg_catalog.pg_column_size(c0.g1), 0) + coalesce(pg_catalog.pg_column_size(c0.g2), 0) + coalesce(pg_catalog.pg_column_size(c0.m7), 0) > 2000 THEN 'measure "buyers": count_distinct($.user_id) takes, with the group columns, ' || (coalesce(pg_catalog.pg_column_size(c0.g1), 0) + coalesce(pg_catalog.pg_column_size(c0.g2), 0) + coalesce(pg_catalog.pg_column_size(c0.m7), 0)) || ' bytes, more than the 2000 a stored value may take' END) AS bad
    FROM c0
),
bad_rows AS (SELECT event_id, bad FROM c WHERE bad IS NOT NULL AND sign > 0),
good AS NOT MATERIALIZED (SELECT * FROM c WHERE bad IS NULL),
d0 AS (
    SELECT true AS __k,
           bucket,
           coalesce(g1, ''::text) AS g1,
           (g1 IS NULL) AS g1_null,
           coalesce(g2, ''::text) AS g2,
           (g2 IS NULL) AS g2_null,
           sum(sign)::bigint AS __count,
           sum(CASE WHEN m2 THEN sign ELSE 0 END)::bigint AS m2_n,
           sum(CASE WHEN m3 IS NOT NULL THEN sign ELSE 0 END)::bigint AS m3_n,
           coalesce(sum(sign * m3), 0) AS m3_sum,
           sum(CASE WHEN m4 IS NOT NULL THEN sign ELSE 0 END)::bigint AS m4_n,
           coalesce(sum(sign * m4), 0) AS m4_sum,
           min(m5) FILTER (WHERE sign > 0) AS m5_val,
           max(m6) FILTER (WHERE sign > 0) AS m6_val,
           bool_or(sign < 0) AS __dirty,
           array_agg(m5) FILTER (WHERE m5 IS NOT NULL) AS m5_vs, array_agg(sign) FILTER (WHERE m5 IS NOT NULL) AS m5_signs,
           array_agg(m6) FILTER (WHERE m6 IS NOT NULL) AS m6_vs, array_agg(sign) FILTER (WHERE m6 IS NOT NULL) AS m6_signs,
           array_agg(m7) FILTER (WHERE m7 IS NOT NULL) AS m7_vs, array_agg(sign) FILTER (WHERE m7 IS NOT NULL) AS m7_signs
    FROM good
    GROUP BY 1, 2, 3, 4, 5, 6
),
lg5 AS MATERIALIZED (SELECT * FROM eventview._v3_m5_log),
lg6 AS MATERIALIZED (SELECT * FROM eventview._v3_m6_log)
SELECT coalesce(s.__k, d0.__k) AS __k,
       coalesce(s.bucket, d0.bucket) AS bucket,
       coalesce(s.g1, d0.g1) AS g1,
       coalesce(s.g1_null, d0.g1_null) AS g1_null,
       coalesce(s.g2, d0.g2) AS g2,
       coalesce(s.g2_null, d0.g2_null) AS g2_null,
       coalesce(s.__count, 0) + d0.__count AS __count,
       coalesce(s.m2_n, 0) + d0.m2_n AS m2_n,
       coalesce(s.m3_n, 0) + d0.m3_n AS m3_n,
       coalesce(s.m3_sum, 0) + d0.m3_sum AS m3_sum,
       coalesce(s.m4_n, 0) + d0.m4_n AS m4_n,
       coalesce(s.m4_sum, 0) + d0.m4_sum AS m4_sum,
       CASE WHEN d0.__dirty THEN (
               SELECT min(w.v) FROM (
                   SELECT u.v FROM (SELECT ms.v, ms.n FROM eventview._v3_m5 ms WHERE ms.__k = d0.__k AND ms.bucket = d0.bucket AND ms.g1 = d0.g1 AND ms.g1_null = d0.g1_null AND ms.g2 = d0.g2 AND ms.g2_null = d0.g2_null
                                    UNION ALL
                                    SELECT l.v, l.n FROM lg5 l WHERE l.__k = d0.__k AND l.bucket = d0.bucket AND l.g1 = d0.g1 AND l.g1_null = d0.g1_null AND l.g2 = d0.g2 AND l.g2_null = d0.g2_null
                                    UNION ALL
                                    SELECT r.v, 1 FROM unnest(s.m5_vals) AS r(v)
                                    UNION ALL
                                    SELECT p.v, p.s FROM unnest(d0.m5_vs, d0.m5_signs) AS p(v, s)) u
                   GROUP BY u.v HAVING sum(u.n) > 0) w)
           ELSE LEAST(s.m5_val, d0.m5_val) END AS m5_val,
       CASE WHEN d0.__dirty THEN (
               SELECT max(w.v) FROM (
                   SELECT u.v FROM (SELECT ms.v, ms.n FROM eventview._v3_m6 ms WHERE ms.__k = d0.__k AND ms.bucket = d0.bucket AND ms.g1 = d0.g1 AND ms.g1_null = d0.g1_null AND ms.g2 = d0.g2 AND ms.g2_null = d0.g2_null
                                    UNION ALL
                                    SELECT l.v, l.n FROM lg6 l WHERE l.__k = d0.__k AND l.bucket = d0.bucket AND l.g1 = d0.g1 AND l.g1_null = d0.g1_null AND l.g2 = d0.g2 AND l.g2_null = d0.g2_null
                                    UNION ALL
                                    SELECT r.v, 1 FROM unnest(s.m6_vals) AS r(v)
                                    UNION ALL
                                    SELECT p.v, p.s FROM unnest(d0.m6_vs, d0.m6_signs) AS p(v, s)) u
                   GROUP BY u.v HAVING sum(u.n) > 0) w)
           ELSE GREATEST(s.m6_val, d0.m6_val) END AS m6_val,
       coalesce(s.m7_val, 0) + (
               SELECT coalesce(sum(CASE WHEN o.n <= 0 AND o.n + p.dn > 0 THEN 1
                                        WHEN o.n > 0 AND o.n + p.dn <= 0 THEN -1 ELSE 0 END), 0)::bigint
               FROM (SELECT x.v, sum(x.s) AS dn FROM unnest(d0.m7_vs, d0.m7_signs) AS x(v, s) GROUP BY x.v) p
               CROSS JOIN LATERAL (SELECT coalesce((SELECT ms.n FROM eventview._v3_m7 ms WHERE ms.__k = d0.__k AND ms.bucket = d0.bucket AND ms.g1 = d0.g1 AND ms.g1_null = d0.g1_null AND ms.g2 = d0.g2 AND ms.g2_null = d0.g2_null AND ms.v = p.v), 0) AS n) o)
           AS m7_val
FROM d0 LEFT JOIN eventview._v3_data s USING (__k, bucket, g1, g1_null, g2, g2_null);
