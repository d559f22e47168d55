WITH gone AS (DELETE FROM eventview.quarantine WHERE view_name = coalesce((SELECT known_name FROM eventview._views WHERE view_id = 3), eventview._view_name(3)))
UPDATE eventview._views SET skipped = 0 WHERE view_id = 3;

DELETE FROM eventview._v3_data;

DELETE FROM eventview._v3_m5;

DELETE FROM eventview._v3_m6;

DELETE FROM eventview._v3_m7;

DELETE FROM eventview._v3_m5_log;

DELETE FROM eventview._v3_m6_log;
