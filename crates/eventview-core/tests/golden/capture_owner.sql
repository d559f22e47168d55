ALTER FUNCTION eventview._capture_2_insert() OWNER TO "shop_owner";

REVOKE EXECUTE ON FUNCTION eventview._capture_2_insert() FROM PUBLIC;

ALTER FUNCTION eventview._capture_2_update() OWNER TO "shop_owner";

REVOKE EXECUTE ON FUNCTION eventview._capture_2_update() FROM PUBLIC;

ALTER FUNCTION eventview._capture_2_delete() OWNER TO "shop_owner";

REVOKE EXECUTE ON FUNCTION eventview._capture_2_delete() FROM PUBLIC;

ALTER FUNCTION eventview._capture_2_truncate() OWNER TO "shop_owner";

REVOKE EXECUTE ON FUNCTION eventview._capture_2_truncate() FROM PUBLIC;
