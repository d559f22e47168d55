CREATE VIEW "shop"."cart_daily" AS
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
FROM eventview._v3_data
WHERE __k;
