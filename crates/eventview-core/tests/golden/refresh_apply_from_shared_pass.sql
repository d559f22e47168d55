WITH snap AS MATERIALIZED (
    SELECT observed_snapshot AS s, observed_own_xid AS own, observed_own_seq AS own_seq
    FROM eventview._sources WHERE source_id = 2
),
applied AS MATERIALIZED (
    SELECT applied_snapshot AS s, applied_own_xid AS own, applied_own_seq AS own_seq
    FROM eventview._views WHERE view_id = 3
),
chg AS MATERIALIZED (
    SELECT c.seq, c.xid, c.op, c.event_ids
    FROM eventview._changes_2 c
    WHERE ((c.xid >= pg_catalog.pg_snapshot_xmin((SELECT s FROM applied))
            AND c.xid < pg_catalog.pg_snapshot_xmax((SELECT s FROM snap)))
           OR c.xid = (SELECT own FROM snap) OR c.xid = (SELECT own FROM applied))
      AND (pg_catalog.pg_visible_in_snapshot(c.xid, (SELECT s FROM snap))
           OR coalesce(c.xid = (SELECT own FROM snap), false))
      AND NOT eventview._applied(c.xid, c.seq, (SELECT s FROM applied), (SELECT own FROM applied), (SELECT own_seq FROM applied))
),
gd AS MATERIALIZED (SELECT $4::bytea AS rows),
type_error_rows AS (SELECT * FROM eventview._group_delta_rows((SELECT rows FROM gd), -1) AS t(sign integer, from_delta boolean, event_id bigint, event_type text, event_version integer, producer text, occurred_at timestamptz, payload jsonb)),
f AS (
    SELECT r.sign, r.from_delta, r.event_id, r.event_type, r.event_version, r.producer, r.occurred_at,
           (r.payload -> 'item' -> 'sku') AS j1,
           CASE WHEN r.event_version = 1 THEN (r.payload -> 'region') WHEN r.event_version = 2 THEN (r.payload -> 'shipping' -> 'region') END AS j2,
           (r.payload -> 'qty') AS j3,
           (r.payload -> 'price') AS j4
    FROM type_error_rows r
    WHERE r.event_type = ANY (ARRAY['cart_add', 'cart_remove']::text[])
    OFFSET 0
),
ft AS (
    SELECT f.*, jsonb_typeof(j1) AS t1, jsonb_typeof(j2) AS t2, jsonb_typeof(j3) AS t3, jsonb_typeof(j4) AS t4
    FROM f
    OFFSET 0
),
c0 AS (
    SELECT sign,
           event_id,
           pg_catalog.date_bin($1::interval, occurred_at, '2000-01-01 00:00:00+00'::timestamptz) AS bucket,
           CASE WHEN t1 IN ('string', 'number', 'boolean') THEN j1 #>> '{}' END AS g1,
           CASE WHEN t2 IN ('string', 'number', 'boolean') THEN j2 #>> '{}' END AS g2,
           CASE WHEN t3 = 'number' THEN j3::numeric END AS m2,
           CASE WHEN t4 = 'number' THEN j4::numeric END AS m3,
           CASE WHEN t4 = 'number' THEN j4::numeric END AS m4,
           CASE WHEN t4 = 'number' THEN j4::numeric END AS m5,
           CASE WHEN t1 IN ('object', 'array') THEN 'group column "sku": $.item.sku is a JSON ' || t1 || ', not a scalar' WHEN t2 IN ('object', 'array') THEN 'group column "region": field "region" is declared text and cannot take ' || 'a JSON ' || t2 WHEN t3 NOT IN ('number', 'null') THEN 'measure "quantity": sum($.qty) needs a JSON number, found ' || t3 WHEN t4 NOT IN ('number', 'null') THEN 'measure "avg_price": avg($.price) needs a JSON number, found ' || t4 END AS bad0
    FROM ft
    OFFSET 0
),
c AS MATERIALIZED (
    SELECT c0.*, coalesce(c0.bad0, CASE WHEN coalesce(pg_catalog.pg_column_size(c0.g1), 0) + coalesce(pg_catalog.pg_column_size(c0.g2), 0) > 2000 THEN 'group columns "sku", "region" take ' || (coalesce(pg_catalog.pg_column_size(c0.g1), 0) + coalesce(pg_catalog.pg_column_size(c0.g2), 0)) || ' bytes, more than the 2000 a group key may take' WHEN coalesce(pg_catalog.pg_column_size(c0.g1), 0) + coalesce(pg_catalog.pg_column_size(c0.g2), 0) + coalesce(pg_catalog.pg_column_size(c0.m4), 0) > 2000 THEN 'measure "lowest": min($.price) takes, with the group columns, ' || (coalesce(pg_catalog.pg_column_size(c0.g1), 0) + coalesce(pg_catalog.pg_column_size(c0.g2), 0) + coalesce(pg_catalog.pg_column_size(c0.m4), 0)) || ' bytes, more than the 2000 a stored value may take' WHEN coalesce(pg_catalog.pg_column_size(c0.g1), 0) + coalesce(pg_catalog.pg_column_size(c0.g2), 0) + coalesce(pg_catalog.pg_column_size(c0.m5), 0) > 2000 THEN 'measure "highest": max($.price) takes, with the group columns, ' || (coalesce(pg_catalog.pg_column_size(c0.g1), 0) + coalesce(pg_catalog.pg_column_size(c0.g2), 0) + coalesce(pg_catalog.pg_column_size(c0.m5), 0)) || ' bytes, more than the 2000 a stored value may take' END) AS bad
    FROM c0
),
bad_rows AS (SELECT event_id, coalesce(bad, 'the refresh pass in Rust found a type error the SQL stages do not find: a defect of pg_eventview (eventview.one_pass_refresh = off reads the event in SQL)') AS bad FROM c WHERE sign > 0),
d0 AS (SELECT * FROM eventview._group_delta_rows((SELECT rows FROM gd), 0) AS t(__k boolean, bucket timestamptz, g1 text, g1_null boolean, g2 text, g2_null boolean, __count bigint, m2_n bigint, m2_sum numeric, m3_n bigint, m3_sum numeric, m4_val numeric, m5_val numeric, m4_vals numeric[], m5_vals numeric[], __dirty boolean)),
d AS (SELECT d0.* FROM d0),
up AS (
    INSERT INTO eventview._v3_data AS t (__k, bucket, g1, g1_null, g2, g2_null, __count, m2_n, m2_sum, m3_n, m3_sum, m4_val, m5_val, m4_vals, m5_vals, __dirty)
    SELECT __k, bucket, g1, g1_null, g2, g2_null, __count, m2_n, m2_sum, m3_n, m3_sum, m4_val, m5_val, CASE WHEN __dirty THEN NULL ELSE m4_vals END, CASE WHEN __dirty THEN NULL ELSE m5_vals END, __dirty OR cardinality(m4_vals) > 8 OR cardinality(m5_vals) > 8 FROM d
    ON CONFLICT (__k, bucket, g1, g1_null, g2, g2_null) DO UPDATE SET
        __count = t.__count + EXCLUDED.__count,
        m2_n = t.m2_n + EXCLUDED.m2_n,
        m2_sum = t.m2_sum + EXCLUDED.m2_sum,
        m3_n = t.m3_n + EXCLUDED.m3_n,
        m3_sum = t.m3_sum + EXCLUDED.m3_sum,
        m4_val = CASE WHEN EXCLUDED.m4_vals IS NULL THEN t.m4_val ELSE LEAST(t.m4_val, EXCLUDED.m4_val) END,
        m5_val = CASE WHEN EXCLUDED.m4_vals IS NULL THEN t.m5_val ELSE GREATEST(t.m5_val, EXCLUDED.m5_val) END,
        m4_vals = CASE WHEN t.m4_vals IS NULL OR EXCLUDED.m4_vals IS NULL THEN t.m4_vals ELSE t.m4_vals || EXCLUDED.m4_vals END,
        m5_vals = CASE WHEN t.m5_vals IS NULL OR EXCLUDED.m4_vals IS NULL THEN t.m5_vals ELSE t.m5_vals || EXCLUDED.m5_vals END,
        __dirty = EXCLUDED.m4_vals IS NULL OR (t.m4_vals IS NOT NULL AND cardinality(t.m4_vals) + cardinality(EXCLUDED.m4_vals) > 8) OR (t.m5_vals IS NOT NULL AND cardinality(t.m5_vals) + cardinality(EXCLUDED.m5_vals) > 8)
    RETURNING t.__dirty, t.__k, t.bucket, t.g1, t.g1_null, t.g2, t.g2_null, t.__dirty AND coalesce(cardinality(t.m4_vals), 0) <= 8 AND coalesce(cardinality(t.m5_vals), 0) <= 8 AS __retracted, t.m4_vals IS NULL AS m4_out, t.m5_vals IS NULL AS m5_out
),
a4 AS (
    INSERT INTO eventview._v3_m4_log (__k, bucket, g1, g1_null, g2, g2_null, v, n)
    SELECT * FROM (SELECT * FROM eventview._group_delta_rows((SELECT rows FROM gd), 4) AS t(__k boolean, bucket timestamptz, g1 text, g1_null boolean, g2 text, g2_null boolean, v numeric, n bigint)) w
    WHERE EXISTS (SELECT 1 FROM up WHERE up.__k = w.__k AND up.bucket = w.bucket AND up.g1 = w.g1 AND up.g1_null = w.g1_null AND up.g2 = w.g2 AND up.g2_null = w.g2_null AND (up.__retracted OR up.m4_out))
    RETURNING 1
),
a5 AS (
    INSERT INTO eventview._v3_m5_log (__k, bucket, g1, g1_null, g2, g2_null, v, n)
    SELECT * FROM (SELECT * FROM eventview._group_delta_rows((SELECT rows FROM gd), 5) AS t(__k boolean, bucket timestamptz, g1 text, g1_null boolean, g2 text, g2_null boolean, v numeric, n bigint)) w
    WHERE EXISTS (SELECT 1 FROM up WHERE up.__k = w.__k AND up.bucket = w.bucket AND up.g1 = w.g1 AND up.g1_null = w.g1_null AND up.g2 = w.g2 AND up.g2_null = w.g2_null AND (up.__retracted OR up.m5_out))
    RETURNING 1
),
q AS (
    INSERT INTO eventview.quarantine (source, view_name, event_id, reason, event)
    SELECT (SELECT relid FROM eventview._sources WHERE source_id = 2),
           coalesce((SELECT known_name FROM eventview._views WHERE view_id = 3), eventview._view_name(3)),
           b.event_id, b.bad,
           jsonb_build_object('event_id', e.event_id, 'event_key', e.event_key,
                              'event_type', e.event_type, 'event_version', e.event_version,
                              'producer', e.producer, 'occurred_at', e.occurred_at,
                              'payload', e.payload)
    FROM bad_rows b LEFT JOIN ONLY "shop"."cart_events" e ON e.event_id = b.event_id
),
st AS (
    UPDATE eventview._views
    SET applied_snapshot = (SELECT s FROM snap),
        applied_own_xid = (SELECT own FROM snap),
        applied_own_seq = CASE WHEN (SELECT own FROM snap) IS NOT NULL THEN greatest((SELECT max(seq) FROM chg WHERE xid = (SELECT own FROM snap)),
                          (SELECT own_seq FROM applied WHERE own = (SELECT own FROM snap))) END,
        extremes_logged = extremes_logged + (SELECT count(*) FROM a4) + (SELECT count(*) FROM a5)
    WHERE view_id = 3
    RETURNING extremes_logged
)
SELECT (SELECT coalesce(sum(CASE WHEN op = 'I' THEN pg_catalog.cardinality(event_ids) ELSE 1 END), 0)::bigint FROM chg) AS consumed,
       (SELECT count(*) FROM up) AS groups_written,
       (SELECT count(*) FROM up WHERE __dirty) AS dirty_groups,
       (SELECT bad || ' (event_id ' || event_id || ')' FROM bad_rows ORDER BY event_id LIMIT 1) AS first_error,
       (SELECT extremes_logged FROM st) AS extremes_logged,
       (SELECT count(*) FROM up WHERE __retracted) AS retracted_groups;
