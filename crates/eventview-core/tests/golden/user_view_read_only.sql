CREATE TRIGGER eventview_read_only INSTEAD OF INSERT OR UPDATE OR DELETE ON "shop"."cart_daily"
    FOR EACH ROW EXECUTE FUNCTION eventview._refuse_change();
