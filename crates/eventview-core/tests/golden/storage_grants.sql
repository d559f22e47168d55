ALTER TABLE eventview._v3_data OWNER TO "shop_owner";

REVOKE USAGE ON TYPE eventview._v3_data FROM PUBLIC;

ALTER TABLE eventview._v3_m5 OWNER TO "shop_owner";

REVOKE USAGE ON TYPE eventview._v3_m5 FROM PUBLIC;

ALTER TABLE eventview._v3_m6 OWNER TO "shop_owner";

REVOKE USAGE ON TYPE eventview._v3_m6 FROM PUBLIC;

ALTER TABLE eventview._v3_m7 OWNER TO "shop_owner";

REVOKE USAGE ON TYPE eventview._v3_m7 FROM PUBLIC;

ALTER TABLE eventview._v3_m5_log OWNER TO "shop_owner";

REVOKE USAGE ON TYPE eventview._v3_m5_log FROM PUBLIC;

ALTER TABLE eventview._v3_m6_log OWNER TO "shop_owner";

REVOKE USAGE ON TYPE eventview._v3_m6_log FROM PUBLIC;
