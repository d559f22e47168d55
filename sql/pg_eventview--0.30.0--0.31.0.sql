-- pg_eventview 0.30.0 -> 0.31.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.31.0'" to load this file. \quit

-- A view's owner may write the position of their own views (a refresh records it with the
-- owner's rights); from this release only positions a refresh could have written: one naming
-- transactions this cluster has not given out would have the next capture trigger made on the
-- table renumber its changelog as a superuser (eventview._rebase_positions). A superuser (a
-- restore) writes any, so the rows there pass the check as the update (run by a superuser) makes
-- it, a catalog restored from another cluster and not renumbered yet included.
CREATE FUNCTION eventview._position_given_out(s pg_snapshot, own xid8) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    next_xid xid8 := greatest(pg_snapshot_xmax(pg_current_snapshot()),
                              (pg_current_xact_id_if_assigned()::text::numeric + 1)::text::xid8);
BEGIN
    RETURN (pg_snapshot_xmax(s) <= next_xid AND (own IS NULL OR own < next_xid))
        OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user);
END
$$;
ALTER TABLE eventview._views ADD CONSTRAINT _views_position_given_out
    CHECK (eventview._position_given_out(applied_snapshot, applied_own_xid));
