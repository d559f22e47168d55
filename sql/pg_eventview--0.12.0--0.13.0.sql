-- pg_eventview 0.12.0 -> 0.13.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.13.0'" to load this file. \quit
-- Definitions marked "as in sql/bootstrap.sql" are copies of that file's.

-- Security: the groups of a view were counted by a SECURITY DEFINER function, as the extension
-- owner, from the storage table the view's owner owns; an owner who turned that table into a
-- view of their own functions (a "_RETURN" rule) had them run as a superuser. Now counted in
-- Rust as the view's owner. (CREATE OR REPLACE: the catalog view depends on it; SECURITY
-- DEFINER and the search_path setting go with the replacement.) As in sql/bootstrap.sql:
-- Number of groups a view holds now: counted in Rust (views::group_count) as the view's owner,
-- whose table the storage is; never with the rights of whoever reads eventview.views.
CREATE OR REPLACE FUNCTION eventview._group_count(p_view_id integer) RETURNS bigint
LANGUAGE c STABLE STRICT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'group_count_wrapper';

-- eventview.views.last_error shows what keeps a view from being refreshed now, also after a
-- direct refresh failed and rolled back; .quarantined counts the view's quarantine entries
-- instead of keeping a counter (which an entry the owner deleted by hand left too high). As in
-- sql/bootstrap.sql:
-- What keeps a view from being refreshed now, as its refresh would say (NULL: nothing): its
-- owner may no longer read its event table, or the table was dropped. Checked in Rust
-- (views::refresh_problem) with the refresh's own checks, so that eventview.views.last_error
-- shows it also after a refresh called directly failed (its transaction, and whatever it
-- would have recorded, rolled back).
CREATE FUNCTION eventview._refresh_problem(p_view_id integer) RETURNS text
LANGUAGE c STABLE STRICT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'refresh_problem_wrapper';

-- Quarantine entries a view has now. Counted, not kept as a counter, so that it stays equal to
-- the entries whoever deletes them (the view's refresh when an event is corrected or erased, a
-- rebuild, or the owner by hand). SECURITY DEFINER: everyone reads eventview.views, while the
-- entries themselves are visible to their owners only.
CREATE FUNCTION eventview._quarantined(p_view_id integer) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT count(*) FROM eventview.quarantine
    WHERE view_name = (SELECT known_name FROM eventview._views WHERE view_id = p_view_id)
$$;

CREATE OR REPLACE VIEW eventview.views AS
SELECT v.relid                                  AS name,
       s.relid                                  AS source,
       v.definition,
       v.realtime,
       v.schedule,
       v.last_refresh_at,
       v.last_refresh_ms,
       p.changes                                AS pending_changes,
       CASE WHEN p.oldest IS NULL THEN interval '0'
            ELSE greatest(now() - p.oldest, interval '0') END AS lag,
       eventview._group_count(v.view_id)        AS groups,
       eventview._quarantined(v.view_id)        AS quarantined,
       v.skipped,
       coalesce(eventview._refresh_problem(v.view_id), v.last_error, v.rebuild_note) AS last_error
FROM eventview._views v
JOIN eventview._sources s USING (source_id)
CROSS JOIN LATERAL eventview._pending(v.view_id) p;
-- The counter it replaces (the library of 0.13.0 no longer writes it; its column privilege goes
-- with it).
ALTER TABLE eventview._views DROP COLUMN quarantined;

-- The quarantine's row-level policies: a view found by its known name instead of looked up (a
-- lookup failed for readers without USAGE on the view's schema, for the whole table), and a
-- view's rows filed only under its own event table. As in sql/bootstrap.sql:
-- Quarantined events are user data: visible only to members of the owner role of their event
-- table or of their view. Rejects of the ingest gate (no view) may be filed by whoever may
-- insert into the table; a view's rejects only by its owner (its refresh runs as the owner), and
-- only under the view's own event table. A view is found by the name its rows carry
-- (`known_name`, kept up to date on renames), never by looking the name up: a lookup fails with
-- "permission denied for schema" for a reader without USAGE on the view's schema, which would
-- make the whole table unreadable to everyone else once such a view has entries.
CREATE OR REPLACE FUNCTION eventview._may_see_quarantine(source regclass, view_name text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = source), 'MEMBER')
        OR EXISTS (SELECT 1 FROM eventview._views v
                   WHERE view_name IS NOT NULL AND v.known_name = view_name
                     AND pg_catalog.pg_has_role(v.owner::oid, 'MEMBER'))
$$;
CREATE OR REPLACE FUNCTION eventview._may_file_quarantine(source regclass, view_name text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN view_name IS NULL THEN pg_catalog.has_table_privilege(source, 'INSERT')
                ELSE EXISTS (SELECT 1 FROM eventview._views v JOIN eventview._sources s USING (source_id)
                             WHERE v.known_name = view_name AND s.relid = source
                               AND pg_catalog.pg_has_role(v.owner::oid, 'MEMBER')) END
$$;

-- A plain DROP TABLE of an event table is followed: the table is forgotten once no view reads
-- it. Before, its catalog row stayed, and a view reading it made refresh_all fail for every view.
-- _forget_view also drops what others built on a view's storage (CASCADE), and forgets a
-- dropped event table with the last of its views. As cargo pgrx schema declares it:
CREATE  FUNCTION eventview."_forget_source"(
	"p_source_id" INT /* i32 */
) RETURNS VOID /* Result < (), ErrorReport > */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'forget_source_wrapper';
REVOKE EXECUTE ON FUNCTION eventview._forget_source(integer) FROM PUBLIC;
-- As in sql/bootstrap.sql:
CREATE OR REPLACE FUNCTION eventview._forget_view(p_view_id integer) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v record;
    t regclass;
    following text := pg_catalog.current_setting('eventview.following_ddl', true);
BEGIN
    SELECT w.view_id, w.source_id, w.known_name, w.owner::oid AS owner, o.rolname AS owner_name,
           s.relid::oid AS source_relid
    INTO v
    FROM eventview._views w
    JOIN eventview._sources s ON s.source_id OPERATOR(pg_catalog.=) w.source_id
    LEFT JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) w.owner::oid
    WHERE w.view_id OPERATOR(pg_catalog.=) p_view_id
    FOR UPDATE OF w;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    DELETE FROM eventview.quarantine
    WHERE view_name OPERATOR(pg_catalog.=) v.known_name
      AND NOT EXISTS (SELECT 1 FROM eventview._views o
                      WHERE o.known_name OPERATOR(pg_catalog.=) v.known_name
                        AND o.view_id OPERATOR(pg_catalog.<>) v.view_id);
    DELETE FROM eventview._views WHERE view_id OPERATOR(pg_catalog.=) v.view_id;
    FOR t IN
        SELECT c.oid::pg_catalog.regclass FROM pg_catalog.pg_class c
        WHERE c.relnamespace OPERATOR(pg_catalog.=) 'eventview'::pg_catalog.regnamespace
          AND c.relkind OPERATOR(pg_catalog.=) 'r'
          AND c.relname OPERATOR(pg_catalog.~) pg_catalog.format('^_v%s_(data|m[0-9]+(_log)?)$', v.view_id)
        -- The logs and multisets before the data (none depends on another; the same order
        -- every time keeps two drops from waiting on each other).
        ORDER BY c.relname OPERATOR(pg_catalog.~) '_data$', c.relname
    LOOP
        -- CASCADE: storage is internal; what a role built on it (a view of its own) goes too,
        -- rather than keep the view from being dropped (by the event table's owner among others).
        EXECUTE pg_catalog.format('DROP TABLE IF EXISTS %s CASCADE', t);
    END LOOP;
    IF v.owner_name IS NOT NULL
       AND pg_catalog.to_regclass(pg_catalog.format('eventview._changes_%s', v.source_id)) IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM eventview._views w
                       WHERE w.source_id OPERATOR(pg_catalog.=) v.source_id
                         AND w.owner::oid OPERATOR(pg_catalog.=) v.owner)
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                       WHERE c.oid OPERATOR(pg_catalog.=) v.source_relid
                         AND c.relowner OPERATOR(pg_catalog.=) v.owner) THEN
        -- (Its REVOKE fires eventview._follow_ddl, which has nothing to add.)
        PERFORM pg_catalog.set_config('eventview.following_ddl', 'on', true);
        EXECUTE pg_catalog.format('REVOKE SELECT ON eventview._changes_%s FROM %I', v.source_id, v.owner_name);
        PERFORM pg_catalog.set_config('eventview.following_ddl', coalesce(following, 'off'), true);
    END IF;
    -- Its event table was dropped while the view read it (see _follow_drop): the table is
    -- forgotten with the last of its views.
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) v.source_relid)
       AND NOT EXISTS (SELECT 1 FROM eventview._views w WHERE w.source_id OPERATOR(pg_catalog.=) v.source_id) THEN
        PERFORM eventview._forget_source(v.source_id);
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION eventview._follow_drop() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    dropped integer;
    t record;
BEGIN
    FOR dropped IN
        SELECT w.view_id
        FROM pg_catalog.pg_event_trigger_dropped_objects() d
        JOIN eventview._views w ON w.relid::oid OPERATOR(pg_catalog.=) d.objid
        WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
          AND d.objsubid OPERATOR(pg_catalog.=) 0
        ORDER BY w.view_id
    LOOP
        PERFORM eventview._forget_view(dropped);
    END LOOP;
    FOR t IN
        SELECT s.source_id, s.relid
        FROM pg_catalog.pg_event_trigger_dropped_objects() d
        JOIN eventview._sources s ON s.relid::oid OPERATOR(pg_catalog.=) d.objid
        WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
          AND d.objsubid OPERATOR(pg_catalog.=) 0
        ORDER BY s.source_id
    LOOP
        IF NOT EXISTS (SELECT 1 FROM eventview._views w WHERE w.source_id OPERATOR(pg_catalog.=) t.source_id) THEN
            PERFORM eventview._forget_source(t.source_id);
        ELSE
            -- The views go on failing their refreshes until they are dropped; what was kept of
            -- the table's events (changelog, quarantine) and about them (drift, observed fields)
            -- goes now, and nothing names the table by its OID any more: a later relation may
            -- get that OID (a restore, a wraparound), which must not pass for the table, nor
            -- its owner see the table's events. (Its field declarations stay: the views' own
            -- definitions read them until they are dropped.)
            DELETE FROM eventview.quarantine WHERE source OPERATOR(pg_catalog.=) t.relid;
            DELETE FROM eventview.drift WHERE source OPERATOR(pg_catalog.=) t.relid;
            DELETE FROM eventview._observed WHERE source_id OPERATOR(pg_catalog.=) t.source_id;
            DELETE FROM eventview._observed_versions WHERE source_id OPERATOR(pg_catalog.=) t.source_id;
            IF pg_catalog.to_regclass(pg_catalog.format('eventview._changes_%s', t.source_id)) IS NOT NULL THEN
                EXECUTE pg_catalog.format('TRUNCATE eventview._changes_%s', t.source_id);
            END IF;
            UPDATE eventview._sources SET relid = 0 WHERE source_id OPERATOR(pg_catalog.=) t.source_id;
        END IF;
    END LOOP;
END
$$;
-- A table dropped while views still read it keeps its catalog row with relid 0 (see
-- _follow_drop): only live tables need a unique relid.
ALTER TABLE eventview._sources DROP CONSTRAINT _sources_relid_key;
CREATE UNIQUE INDEX _sources_relid_key ON eventview._sources (relid) WHERE relid::oid <> 0;

-- Event tables dropped before this update: forgotten when no view reads them (else by drop_view
-- with the last of their views), as _follow_drop does now. What envelope::forget_source does,
-- spelled out: the library refuses to run inside an update.
DO $$
DECLARE
    gone record;
BEGIN
    FOR gone IN
        SELECT s.source_id, s.relid,
               EXISTS (SELECT 1 FROM eventview._views v WHERE v.source_id = s.source_id) AS read
        FROM eventview._sources s
        WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = s.relid::oid)
        ORDER BY s.source_id
    LOOP
        DELETE FROM eventview.drift WHERE source = gone.relid;
        DELETE FROM eventview.quarantine WHERE source = gone.relid;
        DELETE FROM eventview._observed WHERE source_id = gone.source_id;
        DELETE FROM eventview._observed_versions WHERE source_id = gone.source_id;
        IF gone.read THEN
            IF to_regclass(format('eventview._changes_%s', gone.source_id)) IS NOT NULL THEN
                EXECUTE format('TRUNCATE eventview._changes_%s', gone.source_id);
            END IF;
            UPDATE eventview._sources SET relid = 0 WHERE source_id = gone.source_id;
            CONTINUE;
        END IF;
        EXECUTE format('DROP FUNCTION IF EXISTS eventview._capture_%s_insert() CASCADE', gone.source_id);
        EXECUTE format('DROP FUNCTION IF EXISTS eventview._capture_%s_update() CASCADE', gone.source_id);
        EXECUTE format('DROP FUNCTION IF EXISTS eventview._capture_%s_delete() CASCADE', gone.source_id);
        EXECUTE format('DROP FUNCTION IF EXISTS eventview._capture_%s_truncate() CASCADE', gone.source_id);
        EXECUTE format('DROP TABLE IF EXISTS eventview._changes_%s CASCADE', gone.source_id);
        DELETE FROM eventview._fields WHERE source_id = gone.source_id;
        DELETE FROM eventview._observed WHERE source_id = gone.source_id;
        DELETE FROM eventview._observed_versions WHERE source_id = gone.source_id;
        DELETE FROM eventview._sources WHERE source_id = gone.source_id;
    END LOOP;
END
$$;
