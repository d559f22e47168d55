CREATE VIEW "shop"."cart_daily" AS
WITH t AS MATERIALIZED (
    SELECT * FROM eventview._realtime_pending(3) AS t(__k boolean, bucket timestamptz, g1 text, g1_null boolean, g2 text, g2_null boolean, __count bigint, m2_n bigint, m3_n bigint, m3_sum numeric, m4_n bigint, m4_sum numeric, m5_val numeric, m6_val numeric, m7_val bigint)
),
merged AS (
    SELECT s.__k, s.bucket, s.g1, s.g1_null, s.g2, s.g2_null, s.__count, s.m2_n, s.m3_n, s.m3_sum, s.m4_n, s.m4_sum, s.m5_val, s.m6_val, s.m7_val
    FROM eventview._v3_data s
    WHERE s.__k AND NOT EXISTS (SELECT 1 FROM t WHERE t.__k = s.__k AND t.bucket = s.bucket AND t.g1 = s.g1 AND t.g1_null = s.g1_null AND t.g2 = s.g2 AND t.g2_null = s.g2_null)
    UNION ALL
    SELECT __k, bucket, g1, g1_null, g2, g2_null, __count, m2_n, m3_n, m3_sum, m4_n, m4_sum, m5_val, m6_val, m7_val
    FROM t
)
SELECT bucket,
       CASE WHEN g1_null THEN NULL ELSE g1 END AS "sku",
       CASE WHEN g2_null THEN NULL ELSE g2 END AS "region",
       __count AS "events",
       m2_n AS "coupons",
       CASE WHEN m3_n > 0 THEN m3_sum END AS "quantity",
       CASE WHEN m4_n > 0 THEN trim_scale(m4_sum) / m4_n END AS "avg_price",
       m5_val AS "lowest",
       m6_val AS "highest",
       m7_val AS "buyers"
FROM merged
WHERE __count > 0;
