CREATE TRIGGER eventview_capture_insert AFTER INSERT ON "shop"."cart_events_p20261205" REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION eventview._capture_2_insert();

CREATE TRIGGER eventview_capture_update AFTER UPDATE ON "shop"."cart_events_p20261205" REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION eventview._capture_2_update();

CREATE TRIGGER eventview_capture_delete AFTER DELETE ON "shop"."cart_events_p20261205" REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION eventview._capture_2_delete();

CREATE TRIGGER eventview_capture_truncate BEFORE TRUNCATE ON "shop"."cart_events_p20261205"  FOR EACH STATEMENT EXECUTE FUNCTION eventview._capture_2_truncate();

CREATE TRIGGER eventview_keys_update AFTER UPDATE ON "shop"."cart_events_p20261205" REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION eventview._capture_2_keys();

CREATE TRIGGER eventview_keys_delete AFTER DELETE ON "shop"."cart_events_p20261205" REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION eventview._capture_2_keys();

CREATE TRIGGER eventview_keys_truncate BEFORE TRUNCATE ON "shop"."cart_events_p20261205"  FOR EACH STATEMENT EXECUTE FUNCTION eventview._capture_2_keys();
