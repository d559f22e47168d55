DELETE FROM eventview._v3_m5 a USING eventview._v3_data t WHERE t.__dirty AND a.__k = t.__k AND a.bucket = t.bucket AND a.g1 = t.g1 AND a.g1_null = t.g1_null AND a.g2 = t.g2 AND a.g2_null = t.g2_null AND a.n = 0;

DELETE FROM eventview._v3_m6 a USING eventview._v3_data t WHERE t.__dirty AND a.__k = t.__k AND a.bucket = t.bucket AND a.g1 = t.g1 AND a.g1_null = t.g1_null AND a.g2 = t.g2 AND a.g2_null = t.g2_null AND a.n = 0;

DELETE FROM eventview._v3_m7 a USING eventview._v3_data t WHERE t.__dirty AND a.__k = t.__k AND a.bucket = t.bucket AND a.g1 = t.g1 AND a.g1_null = t.g1_null AND a.g2 = t.g2 AND a.g2_null = t.g2_null AND a.n = 0;

DELETE FROM eventview._v3_data WHERE __dirty AND __count = 0;

UPDATE eventview._v3_data AS t SET m5_val = (SELECT a.v FROM eventview._v3_m5 a WHERE a.__k = t.__k AND a.bucket = t.bucket AND a.g1 = t.g1 AND a.g1_null = t.g1_null AND a.g2 = t.g2 AND a.g2_null = t.g2_null ORDER BY a.v ASC LIMIT 1), m6_val = (SELECT a.v FROM eventview._v3_m6 a WHERE a.__k = t.__k AND a.bucket = t.bucket AND a.g1 = t.g1 AND a.g1_null = t.g1_null AND a.g2 = t.g2 AND a.g2_null = t.g2_null ORDER BY a.v DESC LIMIT 1), __dirty = false WHERE t.__dirty;
