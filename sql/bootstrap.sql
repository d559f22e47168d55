-- pg_eventview catalog: the extension's own tables, created before any function.
-- Every table is keyed by our own serial ids and by regclass (which pg_dump writes as a name),
-- never by raw OIDs, so a dump restored into a new database keeps working.

-- The statement's snapshot, with the calling transaction's own xid marked as in progress.
-- Postgres leaves our own xid out of a snapshot's in-progress list, so it may read as visible;
-- but our own changes are not committed and more may follow in this transaction. A refresh
-- therefore tracks its own transaction's changes apart, by changelog position
-- (_views.applied_own_xid / applied_own_seq), and this snapshot must not cover them.
-- STABLE: it runs under the caller's statement snapshot. A C function (crate::pg::snapshot):
-- every refresh, observation and realtime read calls it, and an interpreted function with a
-- SET clause would cost tens of microseconds at each statement's first call.
CREATE FUNCTION eventview._snapshot_without_own() RETURNS pg_snapshot
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'snapshot_without_own';

-- The groups the changes pending for a realtime view's reader touch, each as the view's next
-- refresh would store it (crate::realtime): what the view's relation reads in place of those
-- stored groups. A C function, so that a read with nothing pending pays a short check, not the
-- set-up of the pending groups' statement. It serves only a query that reads the view, for a
-- role that may read all of it, and reads as the view's owner. ROWS: a read has few pending
-- groups; the default estimate of 1000 would make the planner hash the stored groups it reads.
CREATE FUNCTION eventview._realtime_pending(view_id integer) RETURNS SETOF record
LANGUAGE c STABLE STRICT ROWS 10
AS 'MODULE_PATHNAME', 'realtime_pending';

-- Whether a position (an applied snapshot, an own xid) names only transactions this cluster has
-- given out: pg_snapshot_xmax(s) is at most the next transaction id (the later of the current
-- snapshot's xmax and the caller's own xid + 1), and so is own, if any. The opposite of what
-- eventview._positions_from_elsewhere finds in positions restored from another cluster, under
-- the same bound (a later check runs under a later snapshot, so a position this accepts never
-- reads as from elsewhere). A superuser writes any: a restore does. NULL for a NULL snapshot
-- the own xid does not refuse. See eventview._check_position. A C function
-- (crate::pg::snapshot): the trigger's WHEN clause calls it at every refresh.
CREATE FUNCTION eventview._position_given_out(s pg_snapshot, own xid8) RETURNS boolean
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'position_given_out';

-- Whether a consumer (a view, or a table's field observer) has applied the changelog record
-- (xid, seq): its transaction is visible in the consumer's applied snapshot s, or it is the
-- consumer's own transaction own up to changelog position own_seq (a refresh inside the writing
-- transaction). The one spelling of "applied": refreshes, the observer, prune, _pending and
-- position renumbering all call it. A SQL function the planner inlines (IMMUTABLE, no SET
-- clause, every name schema-qualified), so it costs nothing per row and index conditions next
-- to it stay usable; EXECUTE stays granted to PUBLIC, as inlining needs.
CREATE FUNCTION eventview._applied(xid xid8, seq bigint, s pg_snapshot, own xid8, own_seq bigint)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.pg_visible_in_snapshot(xid, s)
           OR coalesce(xid OPERATOR(pg_catalog.=) own AND seq OPERATOR(pg_catalog.<=) own_seq, false)
$$;

-- No foreign keys between these tables (the source_id of views, fields and observations): a
-- parallel restore (pg_restore -j) loads the data of extension tables in any order and would fail
-- on them; eventview.drop_event_table removes a table's rows from each (catalog::delete_source).
-- One row per event table.
CREATE TABLE eventview._sources (
    source_id       serial PRIMARY KEY,
    -- 0 (printed '-') once the table was dropped while views still read it: its OID must not
    -- name it any more, as a later relation may get that OID (a restore, a wraparound).
    relid           regclass NOT NULL,
    retention       interval,
    delta_retention interval NOT NULL DEFAULT '7 days',
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- The field observer's cursor over the changelog (same meaning as in _views).
    observed_snapshot pg_snapshot NOT NULL DEFAULT eventview._snapshot_without_own(),
    observed_own_xid  xid8 DEFAULT pg_current_xact_id_if_assigned(),
    observed_own_seq  bigint,
    -- The length of the partitions pg_eventview makes for the table (create_event_table's
    -- partition_interval); NULL for a plain table, or one whose partitions are made by others.
    partition_interval interval,
    -- For a shard of an event table distributed by Citus: the largest id of the table's drift
    -- rows on this node that a coordinator has taken (the calls that refresh and maintain the
    -- shard answer the rows above it, once each); 0 for any other table.
    drift_taken     bigint NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX _sources_relid_key ON eventview._sources (relid) WHERE relid::oid <> 0;
COMMENT ON TABLE eventview._sources IS 'pg_eventview: registered event tables (see eventview.event_tables)';

-- One row per incremental view.
CREATE TABLE eventview._views (
    view_id          serial PRIMARY KEY,
    relid            regclass NOT NULL UNIQUE,
    source_id        integer NOT NULL,
    definition       json NOT NULL,
    time_bucket      interval,
    realtime         boolean NOT NULL DEFAULT false,
    on_type_error    text NOT NULL CHECK (on_type_error IN ('quarantine', 'skip', 'fail')),
    schedule         interval,
    owner            regrole NOT NULL DEFAULT current_user::regrole,
    -- Applied so far: every change whose transaction is visible in applied_snapshot, plus the
    -- changes of transaction applied_own_xid up to changelog position applied_own_seq (a
    -- refresh that ran inside the transaction that wrote them); no other.
    applied_snapshot pg_snapshot NOT NULL,
    applied_own_xid  xid8,
    applied_own_seq  bigint,
    last_refresh_at  timestamptz,
    last_refresh_ms  double precision,
    skipped          bigint NOT NULL DEFAULT 0,
    last_error       text,
    -- Set when a field the view reads is redeclared; cleared by a full rebuild.
    rebuild_note     text,
    -- Scheduled refreshes that failed in a row, and when run_maintenance may try again
    -- (exponential backoff); both cleared by a successful refresh.
    failures         integer NOT NULL DEFAULT 0,
    retry_at         timestamptz,
    -- The view's qualified name as its quarantine rows carry it (kept up to date when the view
    -- or its schema is renamed, see eventview._follow_ddl).
    known_name       text,
    -- Rows in the view's min/max value logs, not yet merged into its multisets (see
    -- eventview_core::sqlgen; a refresh merges them when they pass
    -- eventview.extreme_log_limit).
    extremes_logged  bigint NOT NULL DEFAULT 0,
    -- A rollup: the view whose group changes it reads (source_id is then that view's event
    -- table). Its applied_* position is in that view's group changelog, not the changelog.
    source_view      integer,
    -- Rollups read this view: its applies write their group changes to eventview._v<id>_changes.
    feeds_rollups    boolean NOT NULL DEFAULT false,
    -- The storage table when it is not eventview._v<view_id>_data: on a Citus node, the shard
    -- of a distributed view's partial groups that this view keeps (see src/citus.rs).
    data_relation    regclass
);
COMMENT ON TABLE eventview._views IS 'pg_eventview: incremental views (see eventview.views)';

-- A view's refresh records its position with its owner's rights, so each owner may write the
-- position of their own views (row-level security keeps them to those); this keeps them to
-- positions a refresh could have written. One from the future would read as restored from
-- another cluster, and the next capture trigger made on the table, by whichever role, would have
-- a superuser renumber its changelog (eventview._rebase_positions). Only a change of position is
-- checked: the other columns of a row restored from another cluster (and not renumbered yet)
-- stay writable. The trigger's WHEN clause makes the check; the function, run only for a
-- position the check refuses, raises the error.
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
    WHEN ((NEW.applied_snapshot::text IS DISTINCT FROM OLD.applied_snapshot::text
           OR NEW.applied_own_xid IS DISTINCT FROM OLD.applied_own_xid)
          AND NOT eventview._position_given_out(NEW.applied_snapshot, NEW.applied_own_xid))
    EXECUTE FUNCTION eventview._check_position();

-- Event tables distributed by Citus (API.md section 10), on the coordinator. Each shard is an
-- event table of its own node, with that node's capture, changelog and views (src/citus.rs);
-- `shards` is a distributed table co-located with the event table, one row per shard, through
-- which the coordinator runs the work of each shard on the shard's node, inside its own
-- distributed transaction.
CREATE TABLE eventview._distributed_sources (
    relid           regclass PRIMARY KEY,
    distribute_by   text NOT NULL,
    shards          regclass NOT NULL,
    -- create_event_table's delta_retention, with which a shard Citus moved or split onto a
    -- node is registered there.
    delta_retention interval NOT NULL DEFAULT '7 days'
);
COMMENT ON TABLE eventview._distributed_sources IS 'pg_eventview: event tables distributed by Citus';

-- Views over a distributed event table, on the coordinator: the user relation reads `groups`,
-- the distributed table of every shard's partial groups, merged.
CREATE TABLE eventview._distributed_views (
    view_id   integer PRIMARY KEY,
    relid     regclass NOT NULL UNIQUE,
    source    regclass NOT NULL REFERENCES eventview._distributed_sources,
    groups    regclass NOT NULL,
    -- create_view's arguments, with which each shard's view is made.
    arguments json NOT NULL,
    owner     regrole NOT NULL DEFAULT current_user::regrole,
    -- As in _views: refreshed by run_maintenance every `schedule`; the last refresh, and the
    -- error of the last scheduled refresh that failed.
    schedule        interval,
    last_refresh_at timestamptz,
    last_error      text,
    -- Read realtime (src/citus/realtime.rs).
    realtime        boolean NOT NULL DEFAULT false,
    -- The position of every shard's view the merged groups were last merged from, shard to
    -- position, recorded by create_view and every refresh (NULL when some shard's node
    -- answered none): a realtime read whose shards are all still there adds their pending
    -- changes onto the merged groups.
    shard_positions json
);
COMMENT ON TABLE eventview._distributed_views IS 'pg_eventview: views over event tables distributed by Citus';

-- Logical fields: one row per declaration (event type and/or version, or any).
CREATE TABLE eventview._fields (
    source_id     integer NOT NULL,
    field         text NOT NULL CHECK (field ~ '^[a-z_][a-z0-9_]*$'),
    event_type    text,
    event_version integer,
    path          text NOT NULL,
    field_type    text NOT NULL,
    defined_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE NULLS NOT DISTINCT (source_id, field, event_type, event_version)
);
COMMENT ON TABLE eventview._fields IS 'pg_eventview: logical fields declared with define_field';

-- Observed payload shapes, per event type and version.
CREATE TABLE eventview._observed (
    source_id     integer NOT NULL,
    event_type    text NOT NULL,
    event_version integer NOT NULL,
    path          text NOT NULL,
    json_type     text NOT NULL,
    first_seen    timestamptz NOT NULL,
    last_seen     timestamptz NOT NULL,
    seen          bigint NOT NULL,
    -- The number of the last event with the path and type among the events of its type and
    -- version ever observed (_observed_versions.events): which type a path had last, also
    -- between observations in one transaction, which share last_seen (NULL in rows observed by
    -- a release older than 0.12.0, which did not count events per path).
    last_event    bigint,
    PRIMARY KEY (source_id, event_type, event_version, path, json_type)
);
CREATE TABLE eventview._observed_versions (
    source_id     integer NOT NULL,
    event_type    text NOT NULL,
    event_version integer NOT NULL,
    events        bigint NOT NULL,
    PRIMARY KEY (source_id, event_type, event_version)
);
CREATE TABLE eventview.drift (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source        regclass,
    event_type    text NOT NULL,
    event_version integer NOT NULL,
    path          text NOT NULL,
    change        text NOT NULL CHECK (change IN ('added', 'type_changed', 'missing')),
    old_type      text,
    new_type      text,
    detected_at   timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE eventview.drift IS 'pg_eventview: payload paths that appeared, changed JSON type, or went missing';
-- A table's rows in id order: on a Citus node, each refresh of a shard reads its rows above what
-- a coordinator has taken (`_sources.drift_taken`).
CREATE INDEX drift_source_id_idx ON eventview.drift (source, id);

-- Events refused by a view's type policy or by the ingest gate.
CREATE TABLE eventview.quarantine (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source         regclass,
    view_name      text,
    event_id       bigint,
    reason         text NOT NULL,
    event          jsonb,
    quarantined_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON eventview.quarantine (view_name, event_id);
COMMENT ON TABLE eventview.quarantine IS 'pg_eventview: envelopes the ingest gate refused (view_name NULL) and events left out of a view because a value had the wrong JSON type';

-- The quarantine entries of views over distributed event tables, on the coordinator: each row
-- names a copy (`id`, in eventview.quarantine) of an entry that the view of one shard filed on
-- that shard's node; `shard` is the shard's tag (as `__shard` of the partial groups holds it),
-- `shard_entry` the entry's id there. A refresh makes the copies follow the entries of the
-- shards whose entries changed (src/citus/quarantine.rs). No foreign keys, as between the
-- other tables here (a parallel restore); a copy deleted by hand leaves its row, and the next
-- refresh copies that shard's entries anew.
CREATE TABLE eventview._distributed_quarantine (
    id          bigint PRIMARY KEY,
    view_id     integer NOT NULL,
    shard       text NOT NULL,
    shard_entry bigint NOT NULL
);
CREATE INDEX ON eventview._distributed_quarantine (view_id, shard, shard_entry);
COMMENT ON TABLE eventview._distributed_quarantine IS 'pg_eventview: quarantine entries of distributed views, with the shard that filed each';

-- When each changelog segment was made (src/changelog.rs), and the first record number not
-- given out then: the rate of records that sizes the next segment, and the time by which every
-- record of a segment was logged (one is made only once record numbers passed the segments
-- before it). Not dumped: a restored segment is noted when it is found, no earlier than it was
-- made, so no record goes before its delta_retention.
CREATE TABLE eventview._changelog_segments (
    source_id integer NOT NULL,
    lo        bigint NOT NULL,
    made_at   timestamptz NOT NULL DEFAULT now(),
    made_seq  bigint NOT NULL,
    PRIMARY KEY (source_id, lo)
);

SELECT pg_catalog.pg_extension_config_dump('eventview._sources', '');
SELECT pg_catalog.pg_extension_config_dump('eventview._sources_source_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('eventview._views', '');
SELECT pg_catalog.pg_extension_config_dump('eventview._views_view_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('eventview.quarantine', '');
SELECT pg_catalog.pg_extension_config_dump('eventview._fields', '');
SELECT pg_catalog.pg_extension_config_dump('eventview._observed', '');
SELECT pg_catalog.pg_extension_config_dump('eventview._observed_versions', '');
SELECT pg_catalog.pg_extension_config_dump('eventview.drift', '');
-- The identity sequences last, in the order the update script to 0.7.0 registers them: an
-- updated database and a fresh install then have the same pg_extension.extconfig.
SELECT pg_catalog.pg_extension_config_dump('eventview.quarantine_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('eventview.drift_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('eventview._distributed_sources', '');
SELECT pg_catalog.pg_extension_config_dump('eventview._distributed_views', '');
SELECT pg_catalog.pg_extension_config_dump('eventview._distributed_quarantine', '');

-- One row per event table, locked while a view of it is being made (create_view and rebuild
-- hold it FOR KEY SHARE until they commit) and tried by prune (FOR UPDATE SKIP LOCKED), which
-- leaves the table to a later run while it is held: see catalog::hold_off_prune. Locking a row
-- takes UPDATE on its table, which no role but the extension owner has here. Dumped, as the
-- event tables' rows are (registered last, as the update to 0.30.0 registers it: the same
-- pg_extension.extconfig as an updated database).
CREATE TABLE eventview._prune_guards (source_id integer PRIMARY KEY);
SELECT pg_catalog.pg_extension_config_dump('eventview._prune_guards', '');


-- The schema-qualified name of a view's relation, as eventview.quarantine.view_name records it
-- (qualified, so it does not depend on the search_path of whoever refreshed).
CREATE FUNCTION eventview._view_name(p_view_id integer) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT format('%I.%I', n.nspname, c.relname)
    FROM eventview._views v
    JOIN pg_class c ON c.oid = v.relid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE v.view_id = p_view_id
$$;

-- Change records of one source that the view has not applied yet, as (event rows, oldest time).
-- Counts only what this transaction can see: an uncommitted producer's changes are not pending yet.
-- NULL while another session holds the changelog locked.
-- SECURITY DEFINER (pinned search_path): counts for eventview.views, which everyone may read,
-- over changelogs and storage that only their owners may. "Applied" is eventview._applied.
CREATE FUNCTION eventview._pending(p_view_id integer, OUT changes bigint, OUT oldest timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_source integer;
    v_source_view integer;
    v_applied pg_snapshot;
    v_own xid8;
    v_own_seq bigint;
    below_changes bigint;
    below_oldest timestamptz;
BEGIN
    SELECT source_id, source_view, applied_snapshot, applied_own_xid, applied_own_seq
    INTO v_source, v_source_view, v_applied, v_own, v_own_seq
    FROM eventview._views WHERE view_id = p_view_id;
    IF FOUND AND v_source_view IS NOT NULL THEN
        -- A rollup: what its source has not applied, plus the group changes of its source it
        -- has not applied.
        SELECT p.changes, p.oldest INTO below_changes, below_oldest FROM eventview._pending(v_source_view) p;
        IF to_regclass(format('eventview._v%s_changes', v_source_view)) IS NULL THEN
            changes := below_changes;
            oldest := below_oldest;
            RETURN;
        END IF;
        EXECUTE format(
            'SELECT count(*), min(logged_at) FROM eventview._v%s_changes
             WHERE (xid >= pg_snapshot_xmin($1) OR xid = $2)
               AND NOT eventview._applied(xid, seq, $1, $2, $3)', v_source_view)
        INTO changes, oldest USING v_applied, v_own, v_own_seq;
        changes := changes + below_changes;
        oldest := least(oldest, below_oldest);
        RETURN;
    END IF;
    IF NOT FOUND OR to_regclass(format('eventview._changes_%s', v_source)) IS NULL THEN
        changes := 0;
        RETURN;
    END IF;
    -- Unknown (NULL) while another session holds the changelog: not a wait for every reader.
    IF NOT eventview._changelog_free(v_source) THEN
        RETURN;
    END IF;
    EXECUTE format(
        'SELECT coalesce(sum(CASE WHEN op = ''I'' THEN cardinality(event_ids) ELSE 1 END), 0)::bigint,
                min(logged_at)
         FROM eventview._changes_%s
         WHERE (xid >= pg_snapshot_xmin($1) OR xid = $2)
           AND NOT eventview._applied(xid, seq, $1, $2, $3)', v_source)
    INTO changes, oldest USING v_applied, v_own, v_own_seq;
END
$$;

-- Number of groups a view holds now: counted in Rust (views::group_count) as the view's owner,
-- whose table the storage is; never with the rights of whoever reads eventview.views.
CREATE FUNCTION eventview._group_count(p_view_id integer) RETURNS bigint
LANGUAGE c STABLE STRICT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'group_count_wrapper';

-- What keeps a view from being refreshed now, as its refresh would say (NULL: nothing): its
-- owner may no longer read its event table, or the table was dropped or altered. Checked in Rust
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

CREATE VIEW eventview.event_tables AS
SELECT s.relid AS name,
       s.retention,
       s.delta_retention,
       CASE WHEN bool_or(v.view_id IS NOT NULL AND p.changes IS NULL) THEN NULL
            ELSE coalesce(max(p.changes), 0) END::bigint AS pending_changes,
       min(p.oldest)                       AS oldest_pending
FROM eventview._sources s
-- The views over the table's events (a rollup's pending changes include its source's).
LEFT JOIN eventview._views v ON v.source_id = s.source_id AND v.source_view IS NULL
LEFT JOIN LATERAL eventview._pending(v.view_id) p ON true
GROUP BY s.source_id, s.relid, s.retention, s.delta_retention;
COMMENT ON VIEW eventview.event_tables IS 'pg_eventview: event tables and the changes their views have not applied yet';

-- DROP EXTENSION keeps what it does not own: the changelogs, capture functions and view storage
-- created at run time stay in schema eventview (they hold user data). When the extension is
-- created again over them, new ids start past every leftover name so nothing collides.
SELECT pg_catalog.setval('eventview._sources_source_id_seq',
    coalesce((SELECT max(substring(relname FROM '^_changes_([0-9]+)$')::int)
              FROM pg_catalog.pg_class WHERE relnamespace = 'eventview'::regnamespace), 0) + 1, false);
SELECT pg_catalog.setval('eventview._views_view_id_seq',
    coalesce((SELECT max(substring(relname FROM '^_v([0-9]+)_data$')::int)
              FROM pg_catalog.pg_class WHERE relnamespace = 'eventview'::regnamespace), 0) + 1, false);

-- Privileges (see src/privileges.rs). Everyone may read the definitions (as pg_views shows
-- everyone the definition of every view) and call the API, which checks rights itself. Writes
-- to the catalog go through the API, running as the extension owner, except what a view's apply
-- statement records, which runs as the view's owner: its position and counters, its schedule
-- and failures; row-level security keeps each role to the views it owns.
GRANT USAGE ON SCHEMA eventview TO PUBLIC;
GRANT SELECT ON eventview._sources, eventview._views, eventview._fields, eventview._observed,
                eventview._distributed_sources, eventview._distributed_views,
                eventview._observed_versions, eventview.drift, eventview.event_tables TO PUBLIC;
GRANT UPDATE (applied_snapshot, applied_own_xid, applied_own_seq, skipped,
              schedule, last_error, failures, retry_at, extremes_logged) ON eventview._views TO PUBLIC;
ALTER TABLE eventview._views ENABLE ROW LEVEL SECURITY;
CREATE POLICY everyone_reads ON eventview._views FOR SELECT USING (true);
CREATE POLICY owners_update ON eventview._views FOR UPDATE
    USING (pg_catalog.pg_has_role(owner::oid, 'MEMBER'));
-- The same for views over distributed event tables: their owners schedule them, and record the
-- errors of their scheduled refreshes.
GRANT UPDATE (schedule, last_error) ON eventview._distributed_views TO PUBLIC;
ALTER TABLE eventview._distributed_views ENABLE ROW LEVEL SECURITY;
CREATE POLICY everyone_reads ON eventview._distributed_views FOR SELECT USING (true);
CREATE POLICY owners_update ON eventview._distributed_views FOR UPDATE
    USING (pg_catalog.pg_has_role(owner::oid, 'MEMBER'));

-- Quarantined events are user data: visible only to members of the owner role of their event
-- table or of their view. Rejects of the ingest gate (no view) may be filed by whoever may
-- insert into the table; a view's rejects only by its owner (its refresh runs as the owner), and
-- only under the view's own event table. A view is found by the name its rows carry
-- (`known_name`, kept up to date on renames), never by looking the name up: a lookup fails with
-- "permission denied for schema" for a reader without USAGE on the view's schema, which would
-- make the whole table unreadable to everyone else once such a view has entries.
CREATE FUNCTION eventview._may_see_quarantine(source regclass, view_name text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = source), 'MEMBER')
        OR EXISTS (SELECT 1 FROM eventview._views v JOIN eventview._sources s USING (source_id)
                   WHERE view_name IS NOT NULL AND v.known_name = view_name AND s.relid = source
                     AND pg_catalog.pg_has_role(v.owner::oid, 'MEMBER'))
$$;
CREATE FUNCTION eventview._may_file_quarantine(source regclass, view_name text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN view_name IS NULL THEN pg_catalog.has_table_privilege(source, 'INSERT')
                ELSE EXISTS (SELECT 1 FROM eventview._views v JOIN eventview._sources s USING (source_id)
                             WHERE v.known_name = view_name AND s.relid = source
                               AND pg_catalog.pg_has_role(v.owner::oid, 'MEMBER')) END
$$;
ALTER TABLE eventview.quarantine ENABLE ROW LEVEL SECURITY;
CREATE POLICY owners_read ON eventview.quarantine FOR SELECT
    USING (eventview._may_see_quarantine(source, view_name));
-- The entries of a view over a distributed event table (copied from its shards' nodes, filed
-- and taken back by its refreshes only): visible to members of the view's owner role too.
CREATE FUNCTION eventview._may_see_distributed_quarantine(entry bigint) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM eventview._distributed_quarantine m
                   JOIN eventview._distributed_views d ON d.view_id = m.view_id
                   WHERE m.id = entry AND pg_catalog.pg_has_role(d.owner::oid, 'MEMBER'))
$$;
CREATE POLICY distributed_view_owners_read ON eventview.quarantine FOR SELECT
    USING (eventview._may_see_distributed_quarantine(id));
GRANT SELECT ON eventview._distributed_quarantine TO PUBLIC;
CREATE POLICY filers_insert ON eventview.quarantine FOR INSERT
    WITH CHECK (eventview._may_file_quarantine(source, view_name));
GRANT SELECT, INSERT ON eventview.quarantine TO PUBLIC;
-- A view's refresh takes back the entry of an event version it retracts (an update or delete,
-- an erasure request among them); it runs as the view's owner.
CREATE POLICY filers_take_back ON eventview.quarantine FOR DELETE
    USING (view_name IS NOT NULL AND eventview._may_file_quarantine(source, view_name));
GRANT DELETE ON eventview.quarantine TO PUBLIC;
-- The ingest gate's rejects stay until the event table's owner deletes them (once the producer
-- has sent them again, corrected).
CREATE POLICY table_owners_clear_rejects ON eventview.quarantine FOR DELETE
    USING (view_name IS NULL
           AND pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = source), 'MEMBER'));

-- A view's owner reads the changelog of its event table only while it may SELECT the table (the
-- changelog holds the old contents of updated and deleted events). Called by the DDL trigger
-- below and by run_maintenance (role membership changes fire no event trigger). "Reads" is what
-- the owner was granted on the changelog directly, which is what GRANT and REVOKE change.
CREATE FUNCTION eventview._sync_changelog_readers() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
    following text := pg_catalog.current_setting('eventview.following_ddl', true);
BEGIN
    -- Its GRANTs and REVOKEs fire the DDL trigger, which has nothing to add.
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'on', true);
    FOR r IN
        SELECT DISTINCT v.source_id, o.rolname AS reader,
               pg_catalog.has_table_privilege(v.owner::oid, s.relid::oid, 'SELECT')
               -- Not where the table's row-level security applies to the owner: the changelog
               -- holds rows its policies hide (privileges::require_no_row_security).
               AND NOT (c.relrowsecurity AND NOT o.rolbypassrls
                        AND (c.relforcerowsecurity OR NOT pg_catalog.pg_has_role(v.owner::oid, c.relowner, 'USAGE')))
                   AS may_read,
               EXISTS (SELECT 1 FROM pg_catalog.pg_class l, pg_catalog.aclexplode(l.relacl) a
                       WHERE l.oid OPERATOR(pg_catalog.=) log.oid
                         AND a.grantee OPERATOR(pg_catalog.=) v.owner::oid
                         AND a.privilege_type OPERATOR(pg_catalog.=) 'SELECT') AS reads
        FROM eventview._views v
        JOIN eventview._sources s ON s.source_id OPERATOR(pg_catalog.=) v.source_id
        JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) s.relid::oid
        JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) v.owner::oid
        CROSS JOIN LATERAL (SELECT pg_catalog.to_regclass(
                                pg_catalog.format('eventview._changes_%s', v.source_id))::oid AS oid) log
        WHERE c.relowner OPERATOR(pg_catalog.<>) v.owner::oid AND NOT o.rolsuper AND log.oid IS NOT NULL
    LOOP
        IF r.may_read AND NOT r.reads THEN
            EXECUTE pg_catalog.format('GRANT SELECT ON eventview._changes_%s TO %I', r.source_id, r.reader);
        ELSIF r.reads AND NOT r.may_read THEN
            EXECUTE pg_catalog.format('REVOKE SELECT ON eventview._changes_%s FROM %I', r.source_id, r.reader);
        END IF;
    END LOOP;
    PERFORM pg_catalog.set_config('eventview.following_ddl', coalesce(following, 'off'), true);
END
$$;

-- Gives the capture of event table p_source_id to the table's owner, from whichever roles
-- own its capture functions (after ALTER TABLE ... OWNER TO, see _follow_ddl): the capture
-- functions run as their owner, and the changelog's (and key table's) rights are the owner's,
-- so all of them move to the table's owner. A former owner keeps no right on those tables
-- unless it owns them; the caller brings the changelog's readers up to date afterwards
-- (_sync_changelog_readers), which gives a former owner's views back what they read.
CREATE FUNCTION eventview._move_capture(p_source_id integer) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now_owner name;
    was_owner name;
    former name[] := '{}';
    op text;
    capture regprocedure;
    logged regclass;
    keys regclass;
BEGIN
    -- (to_regprocedure, to_regclass: during a restore these may not exist yet)
    logged := pg_catalog.to_regclass(pg_catalog.format('eventview._changes_%s', p_source_id));
    keys := pg_catalog.to_regclass(pg_catalog.format('eventview._keys_%s', p_source_id));
    SELECT n.rolname INTO now_owner
    FROM eventview._sources s
    JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) s.relid::oid
    JOIN pg_catalog.pg_roles n ON n.oid OPERATOR(pg_catalog.=) c.relowner
    WHERE s.source_id OPERATOR(pg_catalog.=) p_source_id;
    IF now_owner IS NULL OR logged IS NULL THEN
        RETURN;
    END IF;
    FOREACH op IN ARRAY ARRAY['insert', 'update', 'delete', 'truncate', 'keys'] LOOP
        capture := pg_catalog.to_regprocedure(pg_catalog.format('eventview._capture_%s_%s()', p_source_id, op));
        was_owner := (SELECT r.rolname FROM pg_catalog.pg_proc p
                      JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) p.proowner
                      WHERE p.oid OPERATOR(pg_catalog.=) capture);
        IF was_owner OPERATOR(pg_catalog.<>) now_owner THEN
            EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO %I', capture, now_owner);
            IF NOT was_owner OPERATOR(pg_catalog.=) ANY (former) THEN
                former := former OPERATOR(pg_catalog.||) was_owner;
            END IF;
        END IF;
    END LOOP;
    IF pg_catalog.cardinality(former) OPERATOR(pg_catalog.=) 0 THEN
        RETURN;
    END IF;
    EXECUTE pg_catalog.format('GRANT SELECT, INSERT, DELETE ON %s TO %I', logged, now_owner);
    IF keys IS NOT NULL THEN
        EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %I', keys, now_owner);
    END IF;
    FOREACH was_owner IN ARRAY former LOOP
        IF was_owner OPERATOR(pg_catalog.<>) (SELECT r.rolname FROM pg_catalog.pg_class c
                                              JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) c.relowner
                                              WHERE c.oid OPERATOR(pg_catalog.=) logged) THEN
            EXECUTE pg_catalog.format('REVOKE ALL ON %s FROM %I', logged, was_owner);
        END IF;
        IF keys IS NOT NULL AND was_owner OPERATOR(pg_catalog.<>) (SELECT r.rolname FROM pg_catalog.pg_class c
                                                               JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) c.relowner
                                                               WHERE c.oid OPERATOR(pg_catalog.=) keys) THEN
            EXECUTE pg_catalog.format('REVOKE ALL ON %s FROM %I', keys, was_owner);
        END IF;
    END LOOP;
END
$$;
REVOKE EXECUTE ON FUNCTION eventview._move_capture(integer) FROM PUBLIC;

-- DDL that pg_eventview follows (an event trigger, as the extension owner):
-- - an event table given to another role (ALTER TABLE ... OWNER TO) takes its capture along: the
--   capture functions run as the table's owner and the changelog rights are the owner's, so both
--   move to the new owner;
-- - a view's owner reads the changelog of its event table only while it may read the table
--   (GRANT, REVOKE, ALTER TABLE ... OWNER TO): the changelog holds the old contents of updated
--   and deleted events;
-- - a view given to another role (ALTER VIEW ... OWNER TO) takes its storage and its refresh
--   along (refused for a view over a distributed event table);
-- - a view renamed or moved (ALTER VIEW/TABLE ... RENAME or SET SCHEMA, ALTER SCHEMA ... RENAME):
--   its quarantine rows take the new name, so its owner still sees them and drop_view and
--   rebuild still find them.
CREATE FUNCTION eventview._follow_ddl() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    -- The GRANTs and REVOKEs below fire this trigger again: those nested runs have nothing to do.
    IF pg_catalog.current_setting('eventview.following_ddl', true) OPERATOR(pg_catalog.=) 'on' THEN
        RETURN;
    END IF;
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'on', true);
    PERFORM eventview._move_capture(altered.source_id)
    FROM (SELECT DISTINCT s.source_id
          FROM pg_catalog.pg_event_trigger_ddl_commands() d
          JOIN eventview._sources s ON s.relid::oid OPERATOR(pg_catalog.=) d.objid
          WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass) altered;
    -- Views given to another role (ALTER VIEW ... OWNER TO): their storage and their refresh
    -- go along (views::follow_owner); before the changelog readers are brought up to date. (The
    -- call is planned only when there is one: the install script's own DDL runs before the
    -- function exists.)
    FOR r IN
        SELECT v.view_id
        FROM eventview._views v
        JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) v.relid::oid
        WHERE c.relowner OPERATOR(pg_catalog.<>) v.owner::oid
          AND c.oid IN (SELECT d.objid FROM pg_catalog.pg_event_trigger_ddl_commands() d
                        WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass)
        ORDER BY v.view_id
    LOOP
        PERFORM eventview._follow_view_owner(r.view_id);
    END LOOP;
    IF EXISTS (SELECT 1 FROM eventview._distributed_views v
               JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) v.relid::oid
               WHERE c.relowner OPERATOR(pg_catalog.<>) v.owner::oid
                 AND c.oid IN (SELECT d.objid FROM pg_catalog.pg_event_trigger_ddl_commands() d
                               WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass)) THEN
        RAISE EXCEPTION 'a view over a distributed event table cannot be given to another role'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Give it back to the owner eventview._distributed_views records (ALTER VIEW ... OWNER TO), or create the view again as the new owner (eventview.create_view) and drop this one.';
    END IF;
    PERFORM eventview._sync_changelog_readers();
    -- Renamed views: one statement maps old names to new ones (renames may have crossed); the
    -- view's row first, which waits for a refresh of it filing quarantine rows meanwhile. A view
    -- whose relation is gone (dropped behind the API's back) keeps its name.
    WITH renamed AS (
        UPDATE eventview._views v SET known_name = n.now
        FROM (SELECT view_id, known_name AS was, eventview._view_name(view_id) AS now FROM eventview._views) n
        WHERE v.view_id OPERATOR(pg_catalog.=) n.view_id AND n.now IS NOT NULL
          AND NOT coalesce(n.was OPERATOR(pg_catalog.=) n.now, false)
        RETURNING n.was, n.now, v.source_id
    )
    UPDATE eventview.quarantine q SET view_name = r2.now
    FROM renamed r2 JOIN eventview._sources s ON s.source_id OPERATOR(pg_catalog.=) r2.source_id
    WHERE q.view_name OPERATOR(pg_catalog.=) r2.was AND q.source OPERATOR(pg_catalog.=) s.relid;
    -- Renamed views over distributed event tables (or their schemas): the coordinator's copies
    -- of their quarantine entries take the new name, once the view's refresh running now (which
    -- holds its row, and copies under the name it read) is done.
    FOR r IN
        SELECT d.view_id, pg_catalog.format('%I.%I', n.nspname, c.relname) AS now
        FROM eventview._distributed_views d
        JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.relid::oid
        JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
        WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger_ddl_commands() x
                      WHERE x.objid OPERATOR(pg_catalog.=) d.relid::oid
                         OR x.objid OPERATOR(pg_catalog.=) c.relnamespace)
        ORDER BY d.view_id
    LOOP
        PERFORM 1 FROM eventview._distributed_views WHERE view_id OPERATOR(pg_catalog.=) r.view_id FOR UPDATE;
        UPDATE eventview.quarantine q SET view_name = r.now
        FROM eventview._distributed_quarantine m
        WHERE m.view_id OPERATOR(pg_catalog.=) r.view_id AND q.id OPERATOR(pg_catalog.=) m.id
          AND NOT coalesce(q.view_name OPERATOR(pg_catalog.=) r.now, false);
    END LOOP;
    PERFORM pg_catalog.set_config('eventview.following_ddl', 'off', true);
END
$$;
CREATE EVENT TRIGGER eventview_follow_ddl ON ddl_command_end
    WHEN TAG IN ('ALTER TABLE', 'ALTER VIEW', 'ALTER SCHEMA', 'GRANT', 'REVOKE')
    EXECUTE FUNCTION eventview._follow_ddl();

-- Partitions of partitioned event tables, made by anyone (CREATE TABLE ... PARTITION OF, ALTER
-- TABLE ... ATTACH PARTITION, pg_partman, pg_eventview itself), get the capture triggers: a
-- statement that writes a partition directly fires that partition's triggers, not the root's.
-- A partition detached loses them, once views have applied its events (else 55000). See
-- partitions::follow_partitions (which leaves a tree alone while its root has no capture yet, as
-- during a restore).
CREATE FUNCTION eventview._follow_partitions() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM eventview._follow_partition_tree(s.source_id)
    FROM eventview._sources s
    WHERE s.relid::oid OPERATOR(pg_catalog.<>) 0
      AND s.relid::oid IN (SELECT pg_catalog.pg_partition_root(d.objid)
                           FROM pg_catalog.pg_event_trigger_ddl_commands() d
                           WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass)
    ORDER BY s.source_id;
END
$$;
CREATE EVENT TRIGGER eventview_follow_partitions ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE')
    EXECUTE FUNCTION eventview._follow_partitions();

-- Before DROP TABLE or ALTER TABLE ... DETACH PARTITION of a partition of an event table, or a
-- DROP SCHEMA ... CASCADE or DROP OWNED that takes one along while its table stays: refused
-- (55000) while views have not applied its events (see partitions::before_removal).
CREATE FUNCTION eventview._before_partition_removal() RETURNS event_trigger
LANGUAGE c AS 'MODULE_PATHNAME', 'before_partition_removal';
REVOKE EXECUTE ON FUNCTION eventview._before_partition_removal() FROM PUBLIC;

CREATE EVENT TRIGGER eventview_before_partition_removal ON ddl_command_start
    WHEN TAG IN ('DROP TABLE', 'ALTER TABLE', 'DROP SCHEMA', 'DROP OWNED')
    EXECUTE FUNCTION eventview._before_partition_removal();

-- Whether the view's catalog row still names its relation: a view that reads the view's storage.
-- A row can outlive its relation (dropped while event triggers did not fire, or under a release
-- older than 0.9.0, which did not follow plain DROPs); after a dump and restore, its old OID may
-- then name an unrelated relation.
CREATE FUNCTION eventview._names_its_relation(p_view_id integer) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (
        SELECT 1
        FROM eventview._views v
        JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) v.relid::oid
                                  AND c.relkind OPERATOR(pg_catalog.=) 'v'
        JOIN pg_catalog.pg_rewrite r ON r.ev_class OPERATOR(pg_catalog.=) c.oid
        JOIN pg_catalog.pg_depend d ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_rewrite'::pg_catalog.regclass
                                   AND d.objid OPERATOR(pg_catalog.=) r.oid
        WHERE v.view_id OPERATOR(pg_catalog.=) p_view_id
          AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
          AND d.refobjid OPERATOR(pg_catalog.=)
              coalesce(v.data_relation::oid,
                       pg_catalog.to_regclass(pg_catalog.format('eventview._v%s_data', p_view_id))::oid))
$$;

-- Follows plain DROPs. A view's relation dropped with plain SQL (DROP VIEW, DROP SCHEMA ...
-- CASCADE, DROP OWNED) forgets the view as drop_view does: a catalog row left behind would hold
-- the changelog back from pruning for good with its position, and drop_event_table would refuse
-- to go past it. An event table dropped is forgotten as drop_event_table does (its changelog,
-- capture functions and what was recorded about it) once no view reads it: at once when the
-- same statement dropped its views too, else when the last of them is dropped (_forget_view);
-- those views keep their contents, and eventview.views.last_error says why they can no longer be
-- refreshed (eventview._refresh_problem).
-- (Not refused: pg_restore --clean drops tables and views in name order.)
CREATE FUNCTION eventview._follow_drop() RETURNS event_trigger
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
        -- Rollups before the views they read (a rollup is made after its source).
        ORDER BY w.view_id DESC
    LOOP
        PERFORM eventview._forget_view(dropped);
    END LOOP;
    -- Views over event tables distributed by Citus, and such tables (src/citus.rs): a view
    -- before the table it reads.
    FOR t IN
        SELECT d.objid
        FROM pg_catalog.pg_event_trigger_dropped_objects() d
        LEFT JOIN eventview._distributed_views w ON w.relid::oid OPERATOR(pg_catalog.=) d.objid
        WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
          AND d.objsubid OPERATOR(pg_catalog.=) 0
          AND (w.view_id IS NOT NULL
               OR EXISTS (SELECT 1 FROM eventview._distributed_sources s
                          WHERE s.relid::oid OPERATOR(pg_catalog.=) d.objid))
        ORDER BY w.view_id IS NULL, w.view_id DESC
    LOOP
        PERFORM eventview._forget_distributed(t.objid);
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
CREATE EVENT TRIGGER eventview_follow_drop ON sql_drop
    EXECUTE FUNCTION eventview._follow_drop();

-- Before DROP EXTENSION pg_eventview: what the extension made at run time is not a member of it
-- (views, their storage, changelogs, capture functions and their triggers on event tables), so
-- it goes first; event tables keep their rows. Without CASCADE, incremental views refuse the
-- drop (2BP01). See teardown::before_drop_extension.
CREATE FUNCTION eventview._before_drop_extension() RETURNS event_trigger
LANGUAGE c AS 'MODULE_PATHNAME', 'before_drop_extension';
REVOKE EXECUTE ON FUNCTION eventview._before_drop_extension() FROM PUBLIC;

CREATE EVENT TRIGGER eventview_before_drop_extension ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION')
    EXECUTE FUNCTION eventview._before_drop_extension();

-- Incremental views are read-only, as materialized views are: their rows are what refresh made
-- of the events. A stored view would otherwise be a simple auto-updatable view over its storage,
-- and a write through it would be added to by every later refresh (only a rebuild repairs it).
-- Each view gets an INSTEAD OF trigger running this
-- (eventview_core::sqlgen::ViewSql::read_only_trigger).
CREATE FUNCTION eventview._refuse_change() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'cannot change incremental view %', TG_RELID::pg_catalog.regclass
        USING ERRCODE = 'wrong_object_type',
              HINT = 'Its rows are aggregated from its event table by eventview.refresh: change the events instead.';
END
$$;

-- Positions restored into another cluster. A consumer's position (a view's applied snapshot, an
-- event table's observed snapshot) and the changelog's xids are transaction ids of the cluster
-- that wrote them. Restored from a dump into a cluster whose transaction counter is behind (a new
-- server), they would count the new cluster's transactions as applied already: their changes
-- would never reach the views. A position from the future gives such a restore away.
CREATE FUNCTION eventview._positions_from_elsewhere(p_source_id integer) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- The first id this cluster has not given out (our own, given out after the statement's
    -- snapshot was taken, is not from elsewhere).
    next_xid xid8 := greatest(pg_snapshot_xmax(pg_current_snapshot()),
                              (pg_current_xact_id_if_assigned()::text::numeric + 1)::text::xid8);
    log regclass := to_regclass(format('eventview._changes_%s', p_source_id));
    newest xid8;
BEGIN
    IF EXISTS (SELECT 1 FROM eventview._sources
               WHERE source_id = p_source_id
                 AND (pg_snapshot_xmax(observed_snapshot) > next_xid OR observed_own_xid >= next_xid))
       OR EXISTS (SELECT 1 FROM eventview._views
                  WHERE source_id = p_source_id AND source_view IS NULL
                    AND (pg_snapshot_xmax(applied_snapshot) > next_xid OR applied_own_xid >= next_xid)) THEN
        RETURN true;
    END IF;
    IF log IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('SELECT max(xid) FROM %s', log) INTO newest;
    RETURN coalesce(newest >= next_xid, false);
END
$$;

-- Renumbers the positions of one event table restored from another cluster (see above), before
-- anything is captured in this one: records that exactly the same consumers had applied share
-- one new xid, numbered from 3 (below every transaction of this cluster, so every record reads as
-- committed), and each consumer's snapshot becomes one that sees exactly the records it had
-- applied and no transaction of this cluster. Refreshes only ever ask whether a record's xid is
-- visible in a snapshot, so every consumer goes on where it was, exactly once. Returns whether it
-- had anything to do. Run by the event trigger below when a restore creates the capture triggers
-- (after the data: no record of this cluster can exist yet).
CREATE FUNCTION eventview._rebase_positions(p_source_id integer) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    log regclass := to_regclass(format('eventview._changes_%s', p_source_id));
    snaps pg_snapshot[];
    owns xid8[];
    own_seqs bigint[];
    keys integer[];
    classes text[];
    xip text;
    j integer;
BEGIN
    IF log IS NULL OR NOT eventview._positions_from_elsewhere(p_source_id) THEN
        RETURN false;
    END IF;
    -- The consumers' rows, as refreshes and the observer take them: none moves meanwhile.
    PERFORM 1 FROM eventview._sources WHERE source_id = p_source_id FOR NO KEY UPDATE;
    PERFORM 1 FROM eventview._views WHERE source_id = p_source_id ORDER BY view_id FOR UPDATE;
    -- Again under the locks: another session may have renumbered them meanwhile.
    IF NOT eventview._positions_from_elsewhere(p_source_id) THEN
        RETURN false;
    END IF;
    -- Consumers in a fixed order: the observer (key 0), then the views.
    SELECT array_agg(k ORDER BY k), array_agg(s ORDER BY k), array_agg(own ORDER BY k), array_agg(own_seq ORDER BY k)
    INTO keys, snaps, owns, own_seqs
    FROM (SELECT 0 AS k, observed_snapshot AS s, observed_own_xid AS own, observed_own_seq AS own_seq
          FROM eventview._sources WHERE source_id = p_source_id
          UNION ALL
          SELECT view_id, applied_snapshot, applied_own_xid, applied_own_seq
          FROM eventview._views WHERE source_id = p_source_id AND source_view IS NULL) c;
    -- A record's class: for each consumer in order, '1' if it had applied the record, else '0'.
    -- The new xid of the class at position n (in text order) is n + 2.
    EXECUTE format(
        'WITH applied AS (
             SELECT r.seq, string_agg(CASE WHEN eventview._applied(r.xid, r.seq, c.s, c.own, c.own_seq)
                                           THEN ''1'' ELSE ''0'' END, '''' ORDER BY c.n) AS class
             FROM %1$s r CROSS JOIN unnest($1, $2, $3) WITH ORDINALITY AS c(s, own, own_seq, n)
             GROUP BY r.seq),
         numbered AS (
             SELECT class, row_number() OVER (ORDER BY class) + 2 AS xid FROM (SELECT DISTINCT class FROM applied) d),
         renumbered AS (
             UPDATE %1$s r SET xid = numbered.xid::text::xid8
             FROM applied JOIN numbered USING (class)
             WHERE r.seq = applied.seq
             RETURNING 1)
         SELECT coalesce(array_agg(class ORDER BY xid), ''{}'') FROM numbered',
        log) INTO classes USING snaps, owns, own_seqs;
    IF cardinality(classes) + 3 > pg_snapshot_xmin(pg_current_snapshot())::text::bigint THEN
        RAISE EXCEPTION 'cannot renumber the changelog of event table %: this cluster has run fewer transactions than the changelog has classes of records',
            (SELECT relid FROM eventview._sources WHERE source_id = p_source_id);
    END IF;
    FOR j IN 1 .. cardinality(keys) LOOP
        SELECT string_agg((n + 2)::text, ',' ORDER BY n) INTO xip
        FROM unnest(classes) WITH ORDINALITY AS u(class, n)
        WHERE substr(class, j, 1) = '0';
        IF keys[j] = 0 THEN
            UPDATE eventview._sources
            SET observed_snapshot = format('3:%s:%s', cardinality(classes) + 3, coalesce(xip, ''))::pg_snapshot,
                observed_own_xid = NULL, observed_own_seq = NULL
            WHERE source_id = p_source_id;
        ELSE
            UPDATE eventview._views
            SET applied_snapshot = format('3:%s:%s', cardinality(classes) + 3, coalesce(xip, ''))::pg_snapshot,
                applied_own_xid = NULL, applied_own_seq = NULL
            WHERE view_id = keys[j];
        END IF;
    END LOOP;
    RETURN true;
END
$$;

-- A serial restore creates the capture triggers of each event table after all data is in (the
-- extension's tables, the changelogs) and before anything can be captured: the moment to
-- renumber positions restored from another cluster. A parallel restore (pg_restore -j, several
-- sessions) may create them while other tables are still loading: then it only warns, and
-- eventview._rebase_positions is to be run once the restore is done.
CREATE FUNCTION eventview._rebase_after_restore() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
    parallel_restore boolean :=
        current_setting('application_name') = 'pg_restore'
        AND (SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'pg_restore') > 1;
BEGIN
    FOR r IN
        SELECT DISTINCT s.source_id
        FROM pg_event_trigger_ddl_commands() d
        JOIN pg_trigger t ON t.oid = d.objid
        JOIN eventview._sources s ON s.relid::oid = t.tgrelid
        WHERE d.classid = 'pg_catalog.pg_trigger'::regclass
    LOOP
        IF parallel_restore THEN
            IF eventview._positions_from_elsewhere(r.source_id) THEN
                RAISE WARNING 'pg_eventview: positions of event table % come from another cluster; once this parallel restore is done, and before new events are written, run: SELECT eventview._rebase_positions(%)',
                    (SELECT relid FROM eventview._sources WHERE source_id = r.source_id), r.source_id;
            END IF;
        ELSIF eventview._rebase_positions(r.source_id) THEN
            RAISE NOTICE 'pg_eventview: positions of event table % renumbered for this cluster (restored from another one)',
                (SELECT relid FROM eventview._sources WHERE source_id = r.source_id);
        END IF;
    END LOOP;
END
$$;
CREATE EVENT TRIGGER eventview_rebase_after_restore ON ddl_command_end
    WHEN TAG IN ('CREATE TRIGGER')
    EXECUTE FUNCTION eventview._rebase_after_restore();
-- Rewriting positions is for the restore and for superusers (it locks every view of the table).
REVOKE EXECUTE ON FUNCTION eventview._rebase_positions(integer) FROM PUBLIC;
