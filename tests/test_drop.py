"""Views dropped with plain SQL (0.9.0): the catalog follows the DROP, and what could get in its
way does not. Each test reproduces a defect found in a review (session 9) and fails without its
fix.

- A plain DROP VIEW that meets a refresh of the view waits for it, instead of deadlocking with
  it over quarantine rows.
- No other role can make a view's storage undroppable with a column of its row type.
- A catalog row that outlived its relation (dropped while event triggers did not fire) does not
  stop drop_event_table(cascade), nor drop_view.
- A view created under a name a temporary relation also has is the one created, not the
  temporary one.
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
        # the quarantine entry of the event it retracts (the fix of that event).
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
