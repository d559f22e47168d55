DELETE FROM eventview.quarantine
WHERE view_name = coalesce((SELECT known_name FROM eventview._views WHERE view_id = 3), eventview._view_name(3))
  AND pg_catalog.date_bin($1::interval, (event->>'occurred_at')::timestamptz, '2000-01-01 00:00:00+00'::timestamptz) >= $2
  AND pg_catalog.date_bin($1::interval, (event->>'occurred_at')::timestamptz, '2000-01-01 00:00:00+00'::timestamptz) < $3;

DELETE FROM eventview._v3_data WHERE bucket >= $2 AND bucket < $3;

DELETE FROM eventview._v3_m5 WHERE bucket >= $2 AND bucket < $3;

DELETE FROM eventview._v3_m6 WHERE bucket >= $2 AND bucket < $3;

DELETE FROM eventview._v3_m7 WHERE bucket >= $2 AND bucket < $3;

WITH gone AS (DELETE FROM eventview._v3_m5_log WHERE bucket >= $2 AND bucket < $3 RETURNING 1)
UPDATE eventview._views SET extremes_logged = greatest(extremes_logged - (SELECT count(*) FROM gone), 0)
WHERE view_id = 3;

WITH gone AS (DELETE FROM eventview._v3_m6_log WHERE bucket >= $2 AND bucket < $3 RETURNING 1)
UPDATE eventview._views SET extremes_logged = greatest(extremes_logged - (SELECT count(*) FROM gone), 0)
WHERE view_id = 3;
