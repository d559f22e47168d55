WITH moved AS (DELETE FROM eventview._v3_m5_log RETURNING __k, bucket, g1, g1_null, g2, g2_null, v, n)
INSERT INTO eventview._v3_m5 AS t (__k, bucket, g1, g1_null, g2, g2_null, v, n)
SELECT __k, bucket, g1, g1_null, g2, g2_null, v, sum(n)::bigint FROM moved GROUP BY __k, bucket, g1, g1_null, g2, g2_null, v HAVING sum(n) <> 0
ON CONFLICT (__k, bucket, g1, g1_null, g2, g2_null, v) DO UPDATE SET n = t.n + EXCLUDED.n;

WITH moved AS (DELETE FROM eventview._v3_m6_log RETURNING __k, bucket, g1, g1_null, g2, g2_null, v, n)
INSERT INTO eventview._v3_m6 AS t (__k, bucket, g1, g1_null, g2, g2_null, v, n)
SELECT __k, bucket, g1, g1_null, g2, g2_null, v, sum(n)::bigint FROM moved GROUP BY __k, bucket, g1, g1_null, g2, g2_null, v HAVING sum(n) <> 0
ON CONFLICT (__k, bucket, g1, g1_null, g2, g2_null, v) DO UPDATE SET n = t.n + EXCLUDED.n;

UPDATE eventview._views SET extremes_logged = 0 WHERE view_id = 3;
