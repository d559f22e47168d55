CREATE FUNCTION eventview._capture_2_insert() RETURNS trigger LANGUAGE c SECURITY DEFINER AS '$libdir/pg_eventview', 'capture_inserted_rows';

CREATE FUNCTION eventview._capture_2_update() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $capture$
BEGIN
    PERFORM eventview._wake_worker_on_commit();
    INSERT INTO eventview._changes_2 (op, event_id, old_event_type, old_event_version, old_producer, old_occurred_at, old_payload)
    SELECT 'U', event_id, event_type, event_version, producer, occurred_at, payload FROM old_rows;
    INSERT INTO eventview._changes_2 (op, event_ids)
    SELECT 'I', pg_catalog.array_agg(event_id)
      FROM (SELECT event_id FROM new_rows EXCEPT SELECT event_id FROM old_rows) moved
    HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 0;
    RETURN NULL;
END
$capture$;

CREATE FUNCTION eventview._capture_2_delete() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $capture$
BEGIN
    PERFORM eventview._wake_worker_on_commit();
    INSERT INTO eventview._changes_2 (op, event_id, old_event_type, old_event_version, old_producer, old_occurred_at, old_payload)
    SELECT 'D', event_id, event_type, event_version, producer, occurred_at, payload FROM old_rows
    WHERE NOT coalesce(pg_catalog.current_setting('eventview.pruning', true) OPERATOR(pg_catalog.=) 'on'
                       AND old_rows.occurred_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-)
                           (SELECT s.retention FROM eventview._sources s WHERE s.source_id OPERATOR(pg_catalog.=) 2)),
                       false);
    RETURN NULL;
END
$capture$;

CREATE FUNCTION eventview._capture_2_truncate() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $capture$
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        RAISE EXCEPTION USING ERRCODE = 'feature_not_supported',
            MESSAGE = pg_catalog.format('TRUNCATE of event table %s needs a READ COMMITTED transaction, not %s',
                                        TG_RELID::pg_catalog.regclass, pg_catalog.current_setting('transaction_isolation')),
            HINT = 'Its views retract every row it removes; in this transaction it cannot see the rows committed after its snapshot. Run it in a READ COMMITTED transaction.';
    END IF;
    PERFORM eventview._wake_worker_on_commit();
    EXECUTE pg_catalog.format('INSERT INTO eventview._changes_2 (op, event_id, old_event_type, old_event_version, old_producer, old_occurred_at, old_payload) SELECT ''D'', event_id, event_type, event_version, producer, occurred_at, payload FROM %s',
                   TG_RELID::pg_catalog.regclass);
    RETURN NULL;
END
$capture$;

CREATE TABLE eventview._keys_2 (event_key text PRIMARY KEY, claimed_by xid8, occurred_at timestamptz);

CREATE INDEX ON eventview._keys_2 USING brin (occurred_at);

REVOKE ALL ON eventview._keys_2 FROM PUBLIC;

CREATE FUNCTION eventview._capture_2_keys() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $capture$
BEGIN
    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
        IF EXISTS (SELECT FROM old_rows o FULL JOIN new_rows n ON n.event_id OPERATOR(pg_catalog.=) o.event_id
                   WHERE o.event_key IS DISTINCT FROM n.event_key
                      OR (n.event_key IS NOT NULL AND o.occurred_at IS DISTINCT FROM n.occurred_at)) THEN
            DELETE FROM eventview._keys_2 WHERE event_key IN (SELECT event_key FROM old_rows);
            INSERT INTO eventview._keys_2 (event_key, occurred_at)
            SELECT event_key, occurred_at FROM new_rows WHERE event_key IS NOT NULL;
        END IF;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        DELETE FROM eventview._keys_2 WHERE event_key IN (SELECT event_key FROM old_rows);
    ELSE
        EXECUTE pg_catalog.format('DELETE FROM eventview._keys_2 WHERE event_key IN (SELECT event_key FROM %s)',
                                  TG_RELID::pg_catalog.regclass);
    END IF;
    RETURN NULL;
END
$capture$;

CREATE TRIGGER eventview_capture_insert AFTER INSERT ON "shop"."cart_events" REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION eventview._capture_2_insert();

CREATE TRIGGER eventview_capture_update AFTER UPDATE ON "shop"."cart_events" REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION eventview._capture_2_update();

CREATE TRIGGER eventview_capture_delete AFTER DELETE ON "shop"."cart_events" REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION eventview._capture_2_delete();

CREATE TRIGGER eventview_keys_update AFTER UPDATE ON "shop"."cart_events" REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION eventview._capture_2_keys();

CREATE TRIGGER eventview_keys_delete AFTER DELETE ON "shop"."cart_events" REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION eventview._capture_2_keys();
