"""Pruning and retention against what views have not applied yet, and event tables dropped
behind the extension's back: each test sets up changes some view still needs when prune runs,
or a table gone from under the catalog.

- Pruning raw events by retention is not a retraction: a view that has not applied an update of
  an event keeps the version it aggregated (prune leaves the event until every view has applied
  the update). Also when the update gave the row a new event_id (`SET event_id = DEFAULT`,
  logged as the old id updated and the new one inserted).
- A view being created is invisible to prune until its creation commits: prune skips the table
  meanwhile instead of deleting changes the new view still needs.
- A plain DROP TABLE of an event table does not break refresh_all or maintenance for the others.
"""

import threading
import time

import psycopg


def _one(conn, sql, params=None):
    return conn.execute(sql, params).fetchone()[0]


def test_prune_keeps_an_event_whose_update_a_view_has_not_applied(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev', retention => '1 day')")
        a.execute("""INSERT INTO ev (event_type, occurred_at, payload)
                     VALUES ('sale', now() - interval '3 days', '{"sku": "A", "qty": 5}'),
                            ('sale', now() - interval '3 days', '{"sku": "B", "qty": 1}')""")
        a.execute("""SELECT eventview.create_view('v', 'ev', group_by => '{"sku": "$.sku"}',
                       measures => '{"n": "count(*)", "qty": "sum($.qty)"}')""")
        assert a.execute("SELECT sku, n, qty FROM v ORDER BY sku").fetchall() == [("A", 1, 5), ("B", 1, 1)]
        a.execute("""UPDATE ev SET payload = '{"sku": "A", "qty": 7}' WHERE payload ->> 'sku' = 'A'""")
        # B has nothing pending and goes; A waits for the view to apply its update.
        assert _one(a, "SELECT eventview.prune('ev')") == 1
        assert _one(a, "SELECT count(*) FROM ev") == 1
        assert _one(a, "SELECT eventview.refresh('v')") == 1
        assert a.execute("SELECT sku, n, qty FROM v ORDER BY sku").fetchall() == [("A", 1, 7), ("B", 1, 1)]
        # Once applied, the event is pruned like any other; the view keeps what it aggregated.
        assert _one(a, "SELECT eventview.prune('ev')") == 1
        assert _one(a, "SELECT eventview.refresh('v')") == 0
        assert a.execute("SELECT sku, n, qty FROM v ORDER BY sku").fetchall() == [("A", 1, 7), ("B", 1, 1)]



def test_prune_keeps_an_event_an_update_moved_to_a_new_id_until_views_apply_it(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev', retention => '1 day')")
        a.execute("""INSERT INTO ev (event_type, occurred_at, payload)
                     VALUES ('sale', now() - interval '20 hours', '{"sku": "A", "qty": 5}')""")
        a.execute("""SELECT eventview.create_view('v', 'ev', group_by => '{"sku": "$.sku"}',
                       measures => '{"n": "count(*)", "qty": "sum($.qty)"}')""")
        assert a.execute("SELECT sku, n, qty FROM v").fetchall() == [("A", 1, 5)]
        # The row takes a new id and moves past retention: the view has applied neither.
        a.execute("""UPDATE ev SET event_id = DEFAULT, occurred_at = occurred_at - interval '5 hours',
                                   payload = '{"sku": "A", "qty": 7}'""")
        assert _one(a, "SELECT eventview.prune('ev')") == 0
        assert _one(a, "SELECT count(*) FROM ev") == 1
        # The old id's update record and the new id's insert record.
        assert _one(a, "SELECT eventview.refresh('v')") == 2
        assert a.execute("SELECT sku, n, qty FROM v").fetchall() == [("A", 1, 7)]
        assert _one(a, "SELECT eventview.prune('ev')") == 1
        assert _one(a, "SELECT eventview.refresh('v')") == 0
        assert a.execute("SELECT sku, n, qty FROM v").fetchall() == [("A", 1, 7)]

def test_prune_skips_a_table_while_a_view_on_it_is_created(db):
    """Session B creates a view (snapshot taken, not committed); A commits an event; another view
    applies it and prune runs with a tiny delta_retention. Prune skips the table until the
    creation commits: deleting the change record the new view still needs, it would leave B's
    view never counting the event."""
    with psycopg.connect(db, autocommit=True) as a, psycopg.connect(db) as b:
        a.execute("SELECT eventview.create_event_table('ev', delta_retention => '1 millisecond')")
        a.execute("SELECT eventview.create_view('va', 'ev')")
        a.execute("""INSERT INTO ev (event_type, payload) VALUES ('t', '{"k": 1}')""")
        assert _one(a, "SELECT eventview.refresh('va')") == 1
        b.execute("SELECT eventview.create_view('vb', 'ev')")  # B's transaction stays open
        a.execute("""INSERT INTO ev (event_type, payload) VALUES ('t', '{"k": 2}')""")
        assert _one(a, "SELECT eventview.refresh('va')") == 1
        time.sleep(0.01)
        assert _one(a, "SELECT eventview.prune('ev')") == 0
        b.commit()
        assert _one(a, "SELECT eventview.refresh('vb')") == 1
        assert a.execute("SELECT (SELECT events FROM va), (SELECT events FROM vb)").fetchone() == (2, 2)
        # With the creation committed, prune goes on.
        time.sleep(0.01)
        assert _one(a, "SELECT eventview.prune('ev')") == 2


def test_prune_and_create_view_under_concurrent_writes(db):
    """The same race without explicit transactions: a producer keeps inserting while a view is
    created over a table that prune keeps trimming; afterwards both views count every event."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev', delta_retention => '1 millisecond')")
        a.execute("SELECT eventview.create_view('va', 'ev')")
        a.execute("INSERT INTO ev (event_type, payload) SELECT 't', jsonb_build_object('i', i) FROM generate_series(1, 200000) i")
        stop = threading.Event()
        errors = []

        def produce():
            try:
                with psycopg.connect(db, autocommit=True) as p:
                    while not stop.is_set():
                        p.execute("INSERT INTO ev (event_type, payload) VALUES ('t', '{}'), ('t', '{}')")
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        def maintain():
            try:
                with psycopg.connect(db, autocommit=True) as m:
                    while not stop.is_set():
                        m.execute("SELECT eventview.refresh('va')")
                        m.execute("SELECT eventview.prune('ev')")
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=produce), threading.Thread(target=maintain)]
        for t in threads:
            t.start()
        try:
            a.execute("SELECT eventview.create_view('vb', 'ev')")
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not errors, errors
        a.execute("SELECT eventview.refresh('va')")
        a.execute("SELECT eventview.refresh('vb')")
        total = _one(a, "SELECT count(*) FROM ev")
        assert a.execute("SELECT (SELECT events FROM va), (SELECT events FROM vb)").fetchone() == (total, total)


def test_a_dropped_event_table_does_not_break_the_others(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('gone')")
        a.execute("SELECT eventview.create_event_table('kept', delta_retention => '1 millisecond')")
        a.execute("SELECT eventview.create_view('v', 'kept')")
        a.execute("""INSERT INTO kept (event_type, payload) VALUES ('t', '{"x": 1}')""")
        a.execute("DROP TABLE gone")
        assert _one(a, "SELECT eventview.refresh_all()") == 1
        assert _one(a, "SELECT events FROM v") == 1
        assert a.execute("SELECT path FROM eventview.observed_fields WHERE source = 'kept'::regclass").fetchall() == [("$.x",)]
        # Maintenance observes and prunes the other tables without a warning.
        a.execute("""INSERT INTO kept (event_type, payload) VALUES ('t', '{"y": 1}')""")
        with psycopg.connect(db, autocommit=True) as w:
            w.execute("SET client_min_messages = warning")
            notices = []
            w.add_notice_handler(lambda d: notices.append(d.message_primary))
            time.sleep(0.01)
            w.execute("SELECT eventview.run_maintenance()")
        assert notices == []
        assert _one(a, "SELECT count(*) FROM eventview.observed_fields WHERE source = 'kept'::regclass") == 2
