INSERT INTO eventview._v3_m5 AS a (__k, bucket, g1, g1_null, g2, g2_null, v, n)
SELECT t.__k, t.bucket, t.g1, t.g1_null, t.g2, t.g2_null, u.v, count(*)
FROM eventview._v3_data t CROSS JOIN LATERAL pg_catalog.unnest(t.m5_vals) AS u(v) WHERE t.__dirty
GROUP BY t.__k, t.bucket, t.g1, t.g1_null, t.g2, t.g2_null, u.v
ON CONFLICT (__k, bucket, g1, g1_null, g2, g2_null, v) DO UPDATE SET n = a.n + EXCLUDED.n;

INSERT INTO eventview._v3_m6 AS a (__k, bucket, g1, g1_null, g2, g2_null, v, n)
SELECT t.__k, t.bucket, t.g1, t.g1_null, t.g2, t.g2_null, u.v, count(*)
FROM eventview._v3_data t CROSS JOIN LATERAL pg_catalog.unnest(t.m6_vals) AS u(v) WHERE t.__dirty
GROUP BY t.__k, t.bucket, t.g1, t.g1_null, t.g2, t.g2_null, u.v
ON CONFLICT (__k, bucket, g1, g1_null, g2, g2_null, v) DO UPDATE SET n = a.n + EXCLUDED.n;

DELETE FROM eventview._v3_m5 a USING eventview._v3_data t WHERE t.__dirty AND a.__k = t.__k AND a.bucket = t.bucket AND a.g1 = t.g1 AND a.g1_null = t.g1_null AND a.g2 = t.g2 AND a.g2_null = t.g2_null AND a.n = 0;

DELETE FROM eventview._v3_m6 a USING eventview._v3_data t WHERE t.__dirty AND a.__k = t.__k AND a.bucket = t.bucket AND a.g1 = t.g1 AND a.g1_null = t.g1_null AND a.g2 = t.g2 AND a.g2_null = t.g2_null AND a.n = 0;

DELETE FROM eventview._v3_m7 a USING eventview._v3_data t WHERE t.__dirty AND a.__k = t.__k AND a.bucket = t.bucket AND a.g1 = t.g1 AND a.g1_null = t.g1_null AND a.g2 = t.g2 AND a.g2_null = t.g2_null AND a.n = 0;

DELETE FROM eventview._v3_data WHERE __dirty AND __count = 0;

UPDATE eventview._v3_data AS t SET m5_val = (SELECT a.v FROM eventview._v3_m5 a WHERE a.__k = t.__k AND a.bucket = t.bucket AND a.g1 = t.g1 AND a.g1_null = t.g1_null AND a.g2 = t.g2 AND a.g2_null = t.g2_null ORDER BY a.v ASC LIMIT 1), m6_val = (SELECT a.v FROM eventview._v3_m6 a WHERE a.__k = t.__k AND a.bucket = t.bucket AND a.g1 = t.g1 AND a.g1_null = t.g1_null AND a.g2 = t.g2 AND a.g2_null = t.g2_null ORDER BY a.v DESC LIMIT 1), m5_vals = NULL, m6_vals = NULL, __dirty = false WHERE t.__dirty;
