CREATE TABLE eventview._v3_m5_log (LIKE eventview._v3_m5 INCLUDING DEFAULTS);

CREATE TABLE eventview._v3_m6_log (LIKE eventview._v3_m6 INCLUDING DEFAULTS);
