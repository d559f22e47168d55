-- pg_eventview 0.30.0 -> 0.31.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.31.0'" to load this file. \quit

-- A view's owner may write the position of their own views (a refresh records it with the
-- owner's rights); from this release only positions a refresh could have written: one naming
-- transactions this cluster has not given out would have the next capture trigger made on the
-- table renumber its changelog as a superuser (eventview._rebase_positions). A superuser (a
-- restore) writes any; only a change of position is checked.
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
CREATE FUNCTION eventview._check_position() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT eventview._position_given_out(NEW.applied_snapshot, NEW.applied_own_xid) THEN
        RAISE EXCEPTION 'position % of view % names transactions this cluster has not given out',
            NEW.applied_snapshot, NEW.relid
            USING ERRCODE = 'check_violation',
                  HINT = 'A view''s position is written by its refresh; a superuser may write another one (a restore does).';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER _views_position_given_out
    BEFORE UPDATE OF applied_snapshot, applied_own_xid ON eventview._views
    FOR EACH ROW
    WHEN (NEW.applied_snapshot::text IS DISTINCT FROM OLD.applied_snapshot::text
          OR NEW.applied_own_xid IS DISTINCT FROM OLD.applied_own_xid)
    EXECUTE FUNCTION eventview._check_position();
