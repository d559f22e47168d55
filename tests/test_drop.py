"""Views and event tables dropped with plain SQL: the catalog follows the DROP, and what could
get in its way does not. Each test builds one situation that could keep a DROP from going
through or leave the catalog behind:

- A plain DROP VIEW that meets a refresh of the view waits for it, instead of deadlocking with
  it over quarantine rows.
- No other role can make a view's storage undroppable with a column of its row type.
- A catalog row that outlived its relation (dropped while event triggers did not fire) does not
  stop drop_event_table(cascade), nor drop_view.
- A view created under a name a temporary relation also has is the one created, not the
  temporary one.
- A plain DROP TABLE of an event table is followed, also while views read it and in the order
  pg_restore --clean drops relations.
- DROP EXTENSION pg_eventview takes capture off every event table (the tables keep their rows)
  and leaves nothing it made at run time; incremental views need CASCADE.
"""

import threading
import time

import psycopg
import pytest


def _one(conn, sql, params=None):
    return conn.execute(sql, params).fetchone()[0]


def _views_and_storage(conn):
    """Catalog rows of views, and relations of their storage (tables and indexes)."""
    return (_one(conn, "SELECT count(*) FROM eventview._views"),
            _one(conn, "SELECT count(*) FROM pg_class WHERE relnamespace = 'eventview'::regnamespace AND relname ~ '^_v[0-9]'"))


def test_a_plain_drop_waits_for_a_refresh_of_the_view(db):
    with psycopg.connect(db, autocommit=True) as a, psycopg.connect(db, autocommit=True) as b:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("""INSERT INTO ev (event_type, payload) VALUES ('t', '{"q": "not a number"}'), ('t', '{"q": 2}')""")
        a.execute("""SELECT eventview.create_view('v', 'ev', measures => '{"s": "sum($.q)"}')""")
        assert _one(a, "SELECT count(*) FROM eventview.quarantine WHERE view_name IS NOT NULL") == 1
        # A refresh holds the view's row; the DROP comes meanwhile; then the refresh takes back
        # the quarantine entry of the event it retracts (the UPDATE below corrects that event).
        a.execute("BEGIN")
        a.execute("SELECT eventview.refresh('v')")
        dropped = {}

        def drop():
            try:
                b.execute("DROP VIEW v")
                dropped["ok"] = True
            except psycopg.Error as e:
                dropped["error"] = e

        t = threading.Thread(target=drop)
        t.start()
        time.sleep(0.5)
        assert t.is_alive(), dropped  # waiting for the refresh's row lock
        a.execute("""UPDATE ev SET payload = '{"q": 1}' WHERE payload ->> 'q' = 'not a number'""")
        assert _one(a, "SELECT eventview.refresh('v')") == 1
        a.execute("COMMIT")
        t.join(10)
        assert dropped == {"ok": True}
        assert _views_and_storage(a) == (0, 0)
        assert _one(a, "SELECT count(*) FROM eventview.quarantine WHERE view_name IS NOT NULL") == 0


def test_no_other_role_can_pin_a_views_storage(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("CREATE ROLE pin_owner LOGIN; CREATE ROLE pin_other LOGIN")
        a.execute("GRANT CREATE ON SCHEMA public TO pin_owner, pin_other")
        a.execute("SET ROLE pin_owner")
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("""SELECT eventview.create_view('v', 'ev', measures => '{"n": "count(*)", "hi": "max($.q)"}')""")
        view_id = _one(a, "SELECT view_id FROM eventview._views")
        a.execute("RESET ROLE")
        a.execute("SET ROLE pin_other")
        for table in (f"_v{view_id}_data", f"_v{view_id}_m2", f"_v{view_id}_m2_log"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                a.execute(f"CREATE TABLE pin_{table} (x eventview.{table})")
        a.execute("RESET ROLE")
        a.execute("SET ROLE pin_owner")
        a.execute("DROP VIEW v")
        a.execute("RESET ROLE")
        assert _views_and_storage(a) == (0, 0)


def test_a_catalog_row_that_outlived_its_relation_does_not_block_drops(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("INSERT INTO ev (event_type, payload) VALUES ('t', '{}')")
        a.execute("SELECT eventview.create_view('v1', 'ev')")
        a.execute("SELECT eventview.create_view('v2', 'ev')")
        # Event triggers do not fire in replica mode: the catalog keeps both rows.
        a.execute("SET session_replication_role = replica")
        a.execute("DROP VIEW v1")
        a.execute("DROP VIEW v2")
        a.execute("RESET session_replication_role")
        assert _one(a, "SELECT count(*) FROM eventview._views") == 2
        a.execute("SELECT eventview.drop_event_table('ev', cascade => true)")
        assert _views_and_storage(a) == (0, 0)


def test_a_view_named_like_a_temporary_relation_is_the_one_created(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("INSERT INTO ev (event_type, payload) VALUES ('t', '{}')")
        a.execute("CREATE TEMP VIEW tv AS SELECT 1 AS one")
        a.execute("SELECT eventview.create_view('tv', 'ev')")
        assert _one(a, "SELECT relid::oid = 'public.tv'::regclass::oid FROM eventview._views")
        assert _one(a, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.tv'::regclass AND tgname = 'eventview_read_only'") == 1
        assert _one(a, "SELECT events FROM public.tv") == 1


def _source_rows(conn):
    """Catalog rows of event tables, their changelogs and their capture functions."""
    return (_one(conn, "SELECT count(*) FROM eventview._sources"),
            _one(conn, "SELECT count(*) FROM pg_class WHERE relnamespace = 'eventview'::regnamespace AND relkind IN ('r', 'p') AND relname ~ '^_changes_[0-9]+$'"),
            _one(conn, "SELECT count(*) FROM pg_proc WHERE pronamespace = 'eventview'::regnamespace AND proname ~ '^_capture_'"))


def test_a_plain_drop_table_of_an_event_table_is_followed(db):
    """A plain DROP TABLE of an event table is followed as drop_event_table does: the table is
    forgotten at once when no view reads it, else with the last of its views. Until then those
    views say in last_error why they cannot be refreshed, drop_view still drops them, and
    refresh_all goes on with the other views instead of failing for all of them."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('kept')")
        a.execute("SELECT eventview.create_view('kept_view', 'kept')")
        a.execute("SELECT eventview.create_event_table('alone')")
        a.execute("INSERT INTO alone (event_type, payload) VALUES ('t', '{\"k\": 1}')")
        a.execute("SELECT eventview.refresh_all()")
        assert _source_rows(a) == (2, 2, 8)
        # Without views: forgotten with the DROP, observed fields and all.
        a.execute("DROP TABLE alone")
        assert _source_rows(a) == (1, 1, 4)
        assert _one(a, "SELECT count(*) FROM eventview._observed") == 0
        # With views: the views stay, saying why; the others still refresh.
        a.execute("SELECT eventview.create_event_table('gone')")
        a.execute("INSERT INTO gone (event_type, payload) VALUES ('t', '{}')")
        a.execute("SELECT eventview.create_view('gone_1', 'gone')")
        a.execute("SELECT eventview.create_view('gone_2', 'gone')")
        a.execute("INSERT INTO gone (event_type, payload) VALUES ('t', '{\"k\": 1}')")
        a.execute("SELECT eventview.refresh('gone_1')")
        a.execute("INSERT INTO gone (event_type, payload) VALUES ('t', '{}')")
        assert _one(a, "SELECT count(*) FROM eventview._observed o JOIN eventview._sources s USING (source_id) WHERE s.relid = 'gone'::regclass") > 0
        a.execute("DROP TABLE gone")
        assert _one(a, "SELECT last_error FROM eventview.views WHERE name = 'gone_1'::regclass") == \
            "the event table of view public.gone_1 was dropped"
        # Its OID names it no more (a later relation may get it), and its events are gone.
        gone_id = _one(a, "SELECT source_id FROM eventview._sources WHERE relid::oid = 0")
        assert _one(a, f"SELECT count(*) FROM eventview._changes_{gone_id}") == 0
        assert _one(a, "SELECT count(*) FROM eventview._observed WHERE source_id = %s", (gone_id,)) == 0
        a.execute("INSERT INTO kept (event_type, payload) VALUES ('t', '{}')")
        assert _one(a, "SELECT eventview.refresh_all()") == 1
        assert _one(a, "SELECT count(*) FROM kept_view") == 1
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
            a.execute("SELECT eventview.refresh('gone_1')")
        assert e.value.diag.message_primary == "the event table of view public.gone_1 was dropped"
        assert "drop_view" in e.value.diag.message_hint
        a.execute("SELECT eventview.drop_view('gone_1')")
        assert _source_rows(a) == (2, 2, 8)
        a.execute("SELECT eventview.drop_view('gone_2')")
        assert _source_rows(a) == (1, 1, 4)
        assert _views_and_storage(a)[0] == 1
        # drop_event_table goes through the same DROP: nothing left twice or behind.
        a.execute("SELECT eventview.drop_event_table('kept', cascade => true)")
        assert _source_rows(a) == (0, 0, 0)
        assert _views_and_storage(a) == (0, 0)
        # Only for a table that is gone, and only as the extension owner.
        a.execute("SELECT eventview.create_event_table('still_here')")
        with pytest.raises(psycopg.errors.ObjectInUse):
            a.execute("SELECT eventview._forget_source((SELECT source_id FROM eventview._sources))")
        assert _one(a, "SELECT has_function_privilege('public', 'eventview._forget_source(integer)', 'EXECUTE')") is False


def test_a_dropped_event_table_with_views_survives_a_dump_clean_order(db):
    """pg_restore --clean drops tables and views in name order: the event table may go first.
    The DROP is followed, not refused, and the view's drop then forgets the table."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('a_events')")
        a.execute("SELECT eventview.create_view('b_view', 'a_events')")
        a.execute("DROP TABLE a_events")
        a.execute("DROP VIEW b_view")
        assert _source_rows(a) == (0, 0, 0)
        assert _views_and_storage(a) == (0, 0)


def _capture_triggers(conn):
    return _one(conn, "SELECT count(*) FROM pg_trigger WHERE tgname ~ '^eventview_capture_'")


def _runtime_objects(conn):
    """What pg_eventview makes at run time in its schema: relations and functions that are not
    members of the extension."""
    return conn.execute("""SELECT c.relname::text FROM pg_class c
                           WHERE c.relnamespace = 'eventview'::regnamespace
                             AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                                             AND d.objid = c.oid AND d.deptype = 'e')
                             AND c.relkind IN ('r', 'v', 'p')
                           UNION ALL
                           SELECT p.proname::text FROM pg_proc p
                           WHERE p.pronamespace = 'eventview'::regnamespace
                             AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                                             AND d.objid = p.oid AND d.deptype = 'e')
                           ORDER BY 1""").fetchall()


def test_drop_extension_removes_capture_and_keeps_the_events(db):
    """DROP EXTENSION pg_eventview leaves no capture behind: event tables keep their rows and
    take every kind of write as plain tables; nothing the extension made at run time stays (a
    new installation starts clean). Incremental views refuse a drop without CASCADE (2BP01,
    naming them) and leave everything as it was; CASCADE drops them with what depends on them."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('orders')")
        a.execute("SELECT eventview.create_event_table('clicks')")
        a.execute("INSERT INTO orders (event_type, payload) SELECT 'o', jsonb_build_object('n', g) FROM generate_series(1, 5) g")
        a.execute("""SELECT eventview.create_view('by_n', 'orders', group_by => '{"n": "$.n"}',
                                                   measures => '{"top": "max($.n)"}')""")
        a.execute("SELECT eventview.create_view('clicks_n', 'clicks', realtime => true)")
        a.execute("CREATE VIEW mine AS SELECT * FROM by_n")
        assert _capture_triggers(a) == 8
        assert len(_runtime_objects(a)) > 8

        with pytest.raises(psycopg.errors.DependentObjectsStillExist) as refused:
            a.execute("DROP EXTENSION pg_eventview")
        assert refused.value.diag.message_primary == "cannot drop extension pg_eventview because incremental views exist"
        assert refused.value.diag.message_detail == "Incremental views: public.by_n, public.clicks_n."
        assert "CASCADE" in refused.value.diag.message_hint
        # Nothing changed: capture records, the views refresh.
        assert _capture_triggers(a) == 8
        a.execute("INSERT INTO orders (event_type, payload) VALUES ('o', '{\"n\": 6}')")
        assert _one(a, "SELECT eventview.refresh('by_n')") == 1
        assert _one(a, "SELECT max(top) FROM by_n") == 6

        a.execute("DROP EXTENSION pg_eventview CASCADE")
        assert _one(a, "SELECT count(*) FROM pg_extension WHERE extname = 'pg_eventview'") == 0
        assert _capture_triggers(a) == 0
        assert _runtime_objects(a) == []
        for gone in ("by_n", "clicks_n", "mine"):
            assert _one(a, "SELECT to_regclass(%s)", (gone,)) is None
        assert _one(a, "SELECT count(*) FROM orders") == 6
        # The former event tables take every kind of write.
        a.execute("INSERT INTO orders (event_type, payload) VALUES ('o', '{}')")
        with a.cursor().copy("COPY orders (event_type, payload) FROM STDIN") as copy:
            copy.write_row(("o", '{"n": 7}'))
        a.execute("UPDATE orders SET payload = '{\"n\": 0}' WHERE payload = '{}'")
        a.execute("DELETE FROM orders WHERE payload ->> 'n' = '1'")
        a.execute("TRUNCATE clicks")
        assert _one(a, "SELECT count(*) FROM orders") == 7

        # A new installation starts clean: same ids again, no collision with leftovers.
        a.execute("CREATE EXTENSION pg_eventview")
        a.execute("SELECT eventview.create_event_table('fresh')")
        a.execute("INSERT INTO fresh (event_type, payload) VALUES ('f', '{}')")
        a.execute("SELECT eventview.create_view('fresh_n', 'fresh')")
        a.execute("INSERT INTO fresh (event_type, payload) VALUES ('f', '{}')")
        assert _one(a, "SELECT eventview.refresh('fresh_n')") == 1
        assert _one(a, "SELECT events FROM fresh_n") == 2


def test_drop_extension_without_views_needs_no_cascade(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("INSERT INTO ev (event_type, payload) VALUES ('t', '{}')")
        # An object of one's own on a changelog refuses a drop without CASCADE, as any RESTRICT.
        a.execute("CREATE VIEW on_the_log AS SELECT * FROM eventview._changes_1")
        with pytest.raises(psycopg.errors.DependentObjectsStillExist) as refused:
            a.execute("DROP EXTENSION pg_eventview")
        assert refused.value.diag.message_detail == "Depending on it: view public.on_the_log."
        assert _capture_triggers(a) == 4
        a.execute("DROP VIEW on_the_log")
        # A role that may not drop the extension gets PostgreSQL's refusal, and nothing is touched.
        a.execute("DROP ROLE IF EXISTS drop_stranger")
        a.execute("CREATE ROLE drop_stranger")
        try:
            a.execute("SET ROLE drop_stranger")
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as not_owner:
                a.execute("DROP EXTENSION pg_eventview")
            assert not_owner.value.diag.message_primary == "must be owner of extension pg_eventview"
            a.execute("RESET ROLE")
            assert _capture_triggers(a) == 4
        finally:
            a.execute("RESET ROLE")
            a.execute("DROP ROLE drop_stranger")
        a.execute("DROP EXTENSION pg_eventview")
        assert _capture_triggers(a) == 0
        assert _runtime_objects(a) == []
        a.execute("UPDATE ev SET payload = '{\"x\": 1}'")
        a.execute("DELETE FROM ev")
        # A DROP EXTENSION of another extension leaves pg_eventview's objects alone.
        a.execute("CREATE EXTENSION pg_eventview")
        a.execute("SELECT eventview.create_event_table('ev2')")
        a.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        a.execute("DROP EXTENSION pg_trgm")
        a.execute("DROP EXTENSION IF EXISTS no_such_extension")
        assert _capture_triggers(a) == 4
