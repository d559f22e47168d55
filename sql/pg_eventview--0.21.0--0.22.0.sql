-- pg_eventview 0.21.0 -> 0.22.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.22.0'" to load this file. \quit
-- Event tables distributed by Citus (API.md section 10).

ALTER TABLE eventview._views ADD COLUMN data_relation regclass;

CREATE TABLE eventview._distributed_sources (
    relid         regclass PRIMARY KEY,
    distribute_by text NOT NULL,
    shards        regclass NOT NULL
);
COMMENT ON TABLE eventview._distributed_sources IS 'pg_eventview: event tables distributed by Citus';
CREATE TABLE eventview._distributed_views (
    view_id   integer PRIMARY KEY,
    relid     regclass NOT NULL UNIQUE,
    source    regclass NOT NULL REFERENCES eventview._distributed_sources,
    groups    regclass NOT NULL,
    arguments json NOT NULL,
    owner     regrole NOT NULL DEFAULT current_user::regrole,
    -- As in _views: refreshed by run_maintenance every `schedule`; the last refresh, and the
    -- error of the last scheduled refresh that failed.
    schedule        interval,
    last_refresh_at timestamptz,
    last_error      text
);
COMMENT ON TABLE eventview._distributed_views IS 'pg_eventview: views over event tables distributed by Citus';
GRANT SELECT ON eventview._distributed_sources, eventview._distributed_views TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('eventview._distributed_sources', '');
SELECT pg_catalog.pg_extension_config_dump('eventview._distributed_views', '');

CREATE FUNCTION eventview._create_distributed_event_table(name text, retention interval, delta_retention interval, partition_interval interval, distribute_by text) RETURNS oid
LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'create_distributed_event_table_wrapper';
CREATE FUNCTION eventview._attach_shard_capture(registry_shard text, shards json, delta_retention interval) RETURNS integer
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'attach_shard_capture_wrapper';
CREATE FUNCTION eventview._attach_shard_view(registry_shard text, value text, shards json, view_id integer, arguments text) RETURNS integer
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'attach_shard_view_wrapper';
CREATE FUNCTION eventview._refresh_shard_view(registry_shard text, shards json) RETURNS text
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'refresh_shard_view_wrapper';
CREATE FUNCTION eventview._detach_shard_view(registry_shard text, shards json) RETURNS integer
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'detach_shard_view_wrapper';
-- Run on every shard's node by the coordinator's queries over a shard registry (src/citus.rs).
REVOKE EXECUTE ON FUNCTION eventview._attach_shard_capture(text, json, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._attach_shard_view(text, text, json, integer, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._refresh_shard_view(text, json) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventview._detach_shard_view(text, json) FROM PUBLIC;

DROP FUNCTION eventview.create_event_table(text, interval, interval, interval);
CREATE FUNCTION eventview.create_event_table(
    name               text,
    retention          interval DEFAULT NULL,
    delta_retention    interval DEFAULT '7 days',
    partition_interval interval DEFAULT NULL,
    distribute_by      text DEFAULT NULL
) RETURNS regclass
LANGUAGE sql VOLATILE
AS $$ SELECT (CASE WHEN distribute_by IS NOT NULL
                   THEN eventview._create_distributed_event_table(name, retention, delta_retention, partition_interval, distribute_by)
                   WHEN partition_interval IS NULL
                   THEN eventview._create_event_table(name, retention, delta_retention)
                   ELSE eventview._create_partitioned_event_table(name, retention, delta_retention, partition_interval)
              END)::regclass $$;
COMMENT ON FUNCTION eventview.create_event_table(text, interval, interval, interval, text) IS
'Creates an event table with the pg_eventview envelope (partitioned by occurred_at with a partition_interval) and starts capturing its changes';
CREATE FUNCTION eventview._maintain_shard(registry_shard text, shards json) RETURNS bigint
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'maintain_shard_wrapper';
REVOKE EXECUTE ON FUNCTION eventview._maintain_shard(text, json) FROM PUBLIC;
CREATE FUNCTION eventview._maintain_distributed() RETURNS bigint
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'maintain_distributed_wrapper';
CREATE FUNCTION eventview._distributed_view_id(name text) RETURNS integer
LANGUAGE c STRICT STABLE PARALLEL SAFE AS 'MODULE_PATHNAME', 'distributed_view_id_wrapper';

-- refresh_all, schedule and run_maintenance take the views over distributed event tables too.
CREATE OR REPLACE FUNCTION eventview.refresh_all() RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v record;
    total bigint := 0;
BEGIN
    -- The caller's views (those over event tables distributed by Citus too), each in its own
    -- subtransaction: one that fails (its owner may no longer read the table, its type policy
    -- is 'fail') keeps its error in last_error, applies nothing, and the others go on.
    FOR v IN
        SELECT w.view_id, false AS distributed, format('%I.%I', n.nspname, c.relname) AS name
        FROM eventview._views w
        JOIN pg_class c ON c.oid = w.relid::oid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE pg_has_role(w.owner::oid, 'MEMBER')
        UNION ALL
        SELECT d.view_id, true, format('%I.%I', n.nspname, c.relname)
        FROM eventview._distributed_views d
        JOIN pg_class c ON c.oid = d.relid::oid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE pg_has_role(d.owner::oid, 'MEMBER')
        ORDER BY 2, 1
    LOOP
        BEGIN
            total := total + eventview._refresh(v.name);
        EXCEPTION WHEN undefined_table THEN
            -- Dropped or renamed since the list was read: not a failure of the view.
            NULL;
        WHEN others THEN
            IF v.distributed THEN
                UPDATE eventview._distributed_views SET last_error = SQLERRM WHERE view_id = v.view_id;
            ELSE
                UPDATE eventview._views SET last_error = SQLERRM WHERE view_id = v.view_id;
            END IF;
            RAISE WARNING 'refresh of view % failed: %', v.name, SQLERRM;
        END;
    END LOOP;
    -- Then the field observers of the caller's tables (those its views read were observed by
    -- their refreshes and have nothing left). Last: each refresh takes its view's row before its
    -- event table, as drop_event_table does; observing every table first held them all while
    -- waiting for view rows, a deadlock with drop_event_table.
    PERFORM eventview._observe_all();
    RETURN total;
END
$$;

CREATE OR REPLACE FUNCTION eventview.schedule(name text, every interval) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    -- A view over an event table distributed by Citus, or a view of this node.
    v_distributed integer := eventview._distributed_view_id(name);
    v_view_id integer := CASE WHEN v_distributed IS NULL THEN eventview._view_id(name) END;
    v_owner regrole := coalesce(
        (SELECT owner FROM eventview._distributed_views WHERE view_id = v_distributed),
        (SELECT owner FROM eventview._views WHERE view_id = v_view_id));
BEGIN
    IF NOT pg_catalog.pg_has_role(v_owner::oid, 'MEMBER') THEN
        RAISE EXCEPTION 'permission denied to schedule view %: it belongs to role %', name, v_owner
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Only members of the view''s owner role (and superusers) may do this.';
    END IF;
    IF every IS NOT NULL AND every <= interval '0' THEN
        RAISE EXCEPTION 'invalid schedule: % is not a positive interval', every
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Pass NULL to unschedule.';
    END IF;
    IF v_distributed IS NOT NULL THEN
        UPDATE eventview._distributed_views SET schedule = every WHERE view_id = v_distributed;
        RETURN;
    END IF;
    -- A new schedule starts afresh: no backoff left from failures under the old one (a retry
    -- time of 'infinity' from a schedule of 100 years or more would outlive it).
    UPDATE eventview._views SET schedule = every, failures = 0, retry_at = NULL WHERE view_id = v_view_id;
END
$$;

CREATE OR REPLACE FUNCTION eventview.run_maintenance() RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v record;
    v_skipped boolean;
    t record;
BEGIN
    -- Partitions ahead of time, for each partitioned event table of the caller's roles (as
    -- prune), before the refreshes: a table that cannot get its partitions made (a lock wait
    -- past lock_timeout, say) takes its events in its default partition meanwhile.
    FOR t IN
        SELECT s.source_id, s.relid FROM eventview._sources s
        WHERE s.partition_interval IS NOT NULL
          AND pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = s.relid::oid), 'MEMBER')
        ORDER BY s.source_id
    LOOP
        BEGIN
            PERFORM eventview._make_partitions(t.source_id);
        EXCEPTION WHEN others THEN
            RAISE WARNING 'pg_eventview: making partitions of % failed: %', t.relid, SQLERRM;
        END;
    END LOOP;
    FOR v IN
        SELECT view_id, relid, schedule, failures FROM eventview._views
        WHERE schedule IS NOT NULL
          AND (last_refresh_at IS NULL OR clock_timestamp() - last_refresh_at >= schedule)
          AND (retry_at IS NULL OR retry_at <= clock_timestamp())
        ORDER BY coalesce(last_refresh_at, '-infinity'), view_id
    LOOP
        BEGIN
            PERFORM 1 FROM eventview._views WHERE view_id = v.view_id FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                SELECT eventview._refresh_unless_locked(format('%I.%I', n.nspname, c.relname)) IS NULL INTO v_skipped
                FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE c.oid = v.relid;
                IF v_skipped THEN
                    UPDATE eventview._views w
                    SET last_error = format('scheduled refresh skipped: event table %s was locked by another session',
                                            (SELECT s.relid::regclass FROM eventview._sources s WHERE s.source_id = w.source_id))
                    WHERE w.view_id = v.view_id AND w.failures = 0;
                END IF;
            END IF;
        EXCEPTION WHEN others THEN
            -- (The failed refresh let go of the view's row: a manual refresh may hold it now.
            -- Under a lock_timeout, a wait for it that times out skips the record, not the run.)
            BEGIN
                UPDATE eventview._views
                SET last_error = SQLERRM,
                    failures = least(greatest(v.failures, 0), 1000000000) + 1,
                    retry_at = CASE WHEN v.schedule >= interval '100 years' THEN 'infinity'::timestamptz
                                    ELSE clock_timestamp()
                                         + CASE WHEN v.schedule >= interval '1 hour' THEN v.schedule
                                                ELSE least(v.schedule * power(2, least(greatest(v.failures, 0), 20)),
                                                           interval '1 hour') END
                               END
                WHERE view_id = v.view_id;
            EXCEPTION WHEN lock_not_available THEN
                RAISE WARNING 'pg_eventview: refresh of view % failed and could not be recorded: %', v.relid, SQLERRM;
            END;
        END;
    END LOOP;
    -- Views over event tables distributed by Citus, whose schedule is due (each shard's view
    -- refreshed on its node, see src/citus.rs).
    FOR v IN
        SELECT d.view_id, d.relid FROM eventview._distributed_views d
        WHERE d.schedule IS NOT NULL
          AND (d.last_refresh_at IS NULL OR clock_timestamp() - d.last_refresh_at >= d.schedule)
        ORDER BY coalesce(d.last_refresh_at, '-infinity'), d.view_id
    LOOP
        BEGIN
            PERFORM eventview._refresh(format('%I.%I', n.nspname, c.relname))
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE c.oid = v.relid;
        EXCEPTION WHEN others THEN
            UPDATE eventview._distributed_views SET last_error = SQLERRM WHERE view_id = v.view_id;
            RAISE WARNING 'pg_eventview: refresh of view % failed: %', v.relid, SQLERRM;
        END;
    END LOOP;
    -- View owners' changelog rights follow their rights on the tables, also where a change of
    -- role membership changed those (no event trigger sees that).
    BEGIN
        PERFORM eventview._sync_changelog_readers();
    EXCEPTION WHEN others THEN
        RAISE WARNING 'pg_eventview: syncing changelog rights failed: %', SQLERRM;
    END;
    -- Every table's field observer moves on, also where no view was due (or exists): it is a
    -- consumer of the changelog, and prune waits for every consumer.
    BEGIN
        PERFORM eventview._observe_all();
    EXCEPTION WHEN others THEN
        RAISE WARNING 'pg_eventview: observing fields failed: %', SQLERRM;
    END;
    -- A failed prune (a lock wait past lock_timeout, say) must not take back the refreshes.
    BEGIN
        PERFORM eventview.prune();
    EXCEPTION WHEN others THEN
        RAISE WARNING 'pg_eventview: pruning failed: %', SQLERRM;
    END;
    -- The shards of event tables distributed by Citus: observed and pruned on their nodes.
    IF EXISTS (SELECT 1 FROM eventview._distributed_sources) THEN
        BEGIN
            PERFORM eventview._maintain_distributed();
        EXCEPTION WHEN others THEN
            RAISE WARNING 'pg_eventview: maintaining distributed event tables failed: %', SQLERRM;
        END;
    END IF;
EXCEPTION WHEN undefined_table OR undefined_function OR invalid_schema_name THEN
    -- A DROP EXTENSION pg_eventview that committed while this run went on (waiting for a lock it
    -- held, say) leaves nothing to maintain: the run ends quietly, as the next one would find no
    -- extension (the background worker must not fail over it).
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'pg_eventview') THEN
        RAISE;
    END IF;
END
$$;

CREATE FUNCTION eventview._forget_distributed(relid oid) RETURNS void
LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'forget_distributed_wrapper';
REVOKE EXECUTE ON FUNCTION eventview._forget_distributed(oid) FROM PUBLIC;

-- A DROP of a view over a distributed event table, or of such a table, forgets it.
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

-- A view's relation reads its storage where that is not eventview._v<id>_data too.
CREATE OR REPLACE FUNCTION eventview._names_its_relation(p_view_id integer) RETURNS boolean
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
