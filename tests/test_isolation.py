"""REPEATABLE READ and SERIALIZABLE transactions read with the snapshot of their first statement,
and TRUNCATE is not MVCC-safe: each test builds an interleaving in which a snapshot older than
the table's contents would lose events or count them twice.

- TRUNCATE of an event table under REPEATABLE READ would log only the rows its snapshot sees
  and remove the others too, which the views would keep counting: it is refused there (0A000).
- A refresh under REPEATABLE READ whose snapshot predates a committed TRUNCATE would read the
  table as empty, consume the pending inserts without adding them, and later take the
  TRUNCATE's deletes back from rows it never had (negative counts): it fails with 40001, to be
  retried.
- create_view under REPEATABLE READ would read the existing events with a snapshot taken before
  it keeps prune off the table, and a prune in between could delete changes it needs: it is
  refused.
- rebuild's retention horizon comes from the clock, with prune held off, not from the
  transaction's start: a prune that started later could have deleted events between the two
  horizons, and the rebuild would recompute their buckets without them.
- Event tables created by a release up to 0.9.0 get the truncate capture that checks the
  isolation level at the first API call.
"""

import threading
from datetime import timedelta

import psycopg
import pytest


def _one(conn, sql, params=None):
    return conn.execute(sql, params).fetchone()[0]


def _setup(conn, retention=None):
    conn.execute("SELECT eventview.create_event_table('ev', retention => %s::interval)", (retention,))
    conn.execute("""INSERT INTO ev (event_type, payload) VALUES ('sale', '{"sku": "A"}')""")
    conn.execute("""SELECT eventview.create_view('v', 'ev', group_by => '{"sku": "$.sku"}',
                   measures => '{"n": "count(*)"}')""")


def test_truncate_is_refused_under_repeatable_read(db):
    with psycopg.connect(db, autocommit=True) as a, psycopg.connect(db, autocommit=True) as b:
        _setup(a)
        a.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        assert _one(a, "SELECT count(*) FROM ev") == 1
        b.execute("""INSERT INTO ev (event_type, payload) VALUES ('sale', '{"sku": "B"}')""")
        with pytest.raises(psycopg.errors.FeatureNotSupported) as e:
            a.execute("TRUNCATE ev")
        assert "TRUNCATE of event table public.ev needs a READ COMMITTED transaction, not repeatable read" in str(e.value)
        a.execute("ROLLBACK")
        assert _one(a, "SELECT eventview.refresh('v')") == 1
        assert a.execute("SELECT sku, n FROM v ORDER BY sku").fetchall() == [("A", 1), ("B", 1)]
        # Under READ COMMITTED it is captured and empties the views.
        a.execute("TRUNCATE ev")
        assert _one(a, "SELECT eventview.refresh('v')") == 2
        assert a.execute("SELECT count(*) FROM v").fetchone()[0] == 0


def test_refresh_under_repeatable_read_after_a_later_truncate_asks_for_a_retry(db):
    with psycopg.connect(db, autocommit=True) as a, psycopg.connect(db, autocommit=True) as b:
        _setup(a)
        b.execute("""INSERT INTO ev (event_type, payload) VALUES ('sale', '{"sku": "B"}')""")
        a.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        assert _one(a, "SELECT count(*) FROM eventview.quarantine") == 0  # the snapshot
        b.execute("TRUNCATE ev")
        with pytest.raises(psycopg.errors.SerializationFailure) as e:
            a.execute("SELECT eventview.refresh('v')")
        assert "event table public.ev was truncated or rewritten after this transaction's snapshot was taken" in str(e.value)
        a.execute("ROLLBACK")
        # Retried: the insert and the TRUNCATE, both applied.
        assert _one(a, "SELECT eventview.refresh('v')") == 3
        assert a.execute("SELECT count(*) FROM v").fetchone()[0] == 0
        a.execute("""INSERT INTO ev (event_type, payload) VALUES ('sale', '{"sku": "C"}')""")
        assert _one(a, "SELECT eventview.refresh('v')") == 1
        assert a.execute("SELECT sku, n FROM v").fetchall() == [("C", 1)]


def test_refresh_under_repeatable_read_works_without_a_truncate(db):
    with psycopg.connect(db, autocommit=True) as a, psycopg.connect(db, autocommit=True) as b:
        _setup(a)
        a.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        assert _one(a, "SELECT count(*) FROM ev") == 1
        b.execute("""INSERT INTO ev (event_type, payload) VALUES ('sale', '{"sku": "B"}')""")
        # Not visible to this snapshot: left for a later refresh.
        assert _one(a, "SELECT eventview.refresh('v')") == 0
        a.execute("COMMIT")
        assert _one(a, "SELECT eventview.refresh('v')") == 1
        assert a.execute("SELECT sku, n FROM v ORDER BY sku").fetchall() == [("A", 1), ("B", 1)]


def test_create_view_is_refused_under_repeatable_read(db):
    with psycopg.connect(db, autocommit=True) as a:
        _setup(a)
        for level in ("REPEATABLE READ", "SERIALIZABLE"):
            a.execute(f"BEGIN ISOLATION LEVEL {level}")
            with pytest.raises(psycopg.errors.FeatureNotSupported) as e:
                a.execute("SELECT eventview.create_view('w', 'ev')")
            assert f"create_view needs a READ COMMITTED transaction, not {level.lower()}" in str(e.value)
            a.execute("ROLLBACK")
        assert _one(a, "SELECT to_regclass('w')") is None
        assert _one(a, "SELECT count(*) FROM eventview.views") == 1


def test_rebuild_starts_at_a_horizon_no_older_than_any_prune_before_it(db):
    with psycopg.connect(db, autocommit=True) as a, psycopg.connect(db, autocommit=True) as b:
        a.execute("SELECT eventview.create_event_table('ev', retention => '1 hour')")
        a.execute("""SELECT eventview.create_view('v', 'ev', measures => '{"n": "count(*)"}',
                       time_bucket => '1 second')""")
        a.execute("BEGIN")
        started = _one(a, "SELECT now()")
        b.execute("SELECT pg_sleep(2)")
        # Past the retention seen from now, not from a's start: b's prune deletes it.
        b.execute("INSERT INTO ev (event_type, occurred_at, payload) VALUES ('sale', %s, '{}')",
                  (started - timedelta(hours=1) + timedelta(seconds=1),))
        assert _one(b, "SELECT eventview.refresh('v')") == 1
        assert _one(b, "SELECT eventview.prune('ev')") == 1
        assert _one(b, "SELECT count(*) FROM ev") == 0
        # a's rebuild must leave that bucket as aggregated.
        a.execute("SELECT eventview.rebuild('v')")
        a.execute("COMMIT")
        assert _one(a, "SELECT coalesce(sum(n), 0) FROM v") == 1


def test_an_older_truncate_capture_is_replaced_at_the_first_call(db):
    with psycopg.connect(db, autocommit=True) as a:
        _setup(a)
        sid = _one(a, "SELECT source_id FROM eventview._sources WHERE relid = 'ev'::regclass")
        # The truncate capture as releases up to 0.9.0 wrote it: no check of the isolation level.
        a.execute(f"""CREATE OR REPLACE FUNCTION eventview._capture_{sid}_truncate() RETURNS trigger
                      LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $capture$
                      BEGIN
                          EXECUTE pg_catalog.format('INSERT INTO eventview._changes_{sid} (op, event_id, old_event_type, old_event_version, old_producer, old_occurred_at, old_payload) SELECT ''D'', event_id, event_type, event_version, producer, occurred_at, payload FROM %s',
                                                    TG_RELID::pg_catalog.regclass);
                          RETURN NULL;
                      END
                      $capture$""")
    with psycopg.connect(db, autocommit=True) as a:
        assert "transaction_isolation" not in _one(a, f"SELECT prosrc FROM pg_proc WHERE proname = '_capture_{sid}_truncate'")
        a.execute("SELECT eventview.refresh('v')")
        assert "transaction_isolation" in _one(a, f"SELECT prosrc FROM pg_proc WHERE proname = '_capture_{sid}_truncate'")
        a.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            a.execute("TRUNCATE ev")
        a.execute("ROLLBACK")


def test_define_field_waits_for_a_view_being_created_that_reads_the_field(db):
    """A declaration checks the views that read the field (a type change is refused while any
    does) and points their reads at the new path, so it waits for a view whose creation has not
    committed yet: a view it missed could not be loaded at all after a type change."""
    with psycopg.connect(db, autocommit=True) as a, psycopg.connect(db, autocommit=True) as b:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("SELECT eventview.define_field('ev', 'qty', '$.qty', type => 'numeric')")
        a.execute("BEGIN")
        a.execute("""SELECT eventview.create_view('v', 'ev', measures => '{"q": "sum(qty)"}')""")
        outcome = {}

        def redeclare():
            try:
                b.execute("SELECT eventview.define_field('ev', 'qty', '$.qty', type => 'text')")
                outcome["done"] = True
            except psycopg.Error as e:
                outcome["error"] = e

        t = threading.Thread(target=redeclare)
        t.start()
        t.join(1.0)
        assert t.is_alive() and not outcome, "define_field must wait for the view being created"
        a.execute("COMMIT")
        t.join(10)
        assert isinstance(outcome.get("error"), psycopg.errors.InvalidParameterValue)
        assert 'cannot change the type of field "qty" while views read it: public.v' in str(outcome["error"])
        a.execute("""INSERT INTO ev (event_type, payload) VALUES ('t', '{"qty": 2}')""")
        assert _one(a, "SELECT eventview.refresh('v')") == 1
        assert _one(a, "SELECT q FROM v") == 2


@pytest.mark.parametrize("rebuild", ["SELECT eventview.rebuild('v')",
                                     "SELECT eventview.rebuild('v', now() - interval '1 day', NULL)"])
def test_rebuild_under_repeatable_read_asks_for_a_retry_when_a_truncate_commits_while_it_waits(db, rebuild):
    """A TRUNCATE still in progress when a REPEATABLE READ rebuild checks the table's file, and
    committed while the rebuild waits for its lock on the table, makes the rebuild fail with
    40001. Going on, it would read the new, empty file under its old snapshot and store that
    snapshot as its position, and the next refresh would take the TRUNCATE's records from groups
    never counted (counts below zero)."""
    with psycopg.connect(db, autocommit=True) as a, psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT eventview.create_event_table('ev')")
        c.execute("""INSERT INTO ev (event_type, payload) VALUES ('sale', '{"sku": "A"}')""")
        c.execute("""SELECT eventview.create_view('v', 'ev', group_by => '{"sku": "$.sku"}',
                     measures => '{"n": "count(*)"}', time_bucket => '1 hour')""")
        c.execute("BEGIN")
        c.execute("TRUNCATE ev")
        a.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        assert _one(a, "SELECT count(*) FROM eventview.quarantine") == 0  # the snapshot
        outcome = {}

        def run():
            try:
                outcome["result"] = _one(a, rebuild)
            except psycopg.Error as e:
                outcome["error"] = e

        t = threading.Thread(target=run)
        t.start()
        t.join(1.0)
        assert t.is_alive(), "the rebuild must wait for the TRUNCATE"
        c.execute("COMMIT")
        t.join(10)
        assert isinstance(outcome.get("error"), psycopg.errors.SerializationFailure), outcome
        assert "event table public.ev was truncated or rewritten after this transaction's snapshot was taken" \
            in str(outcome["error"])
        a.execute("ROLLBACK")
        # Retried, and refreshed: the view is what the table holds, nothing.
        _one(a, rebuild)
        _one(a, "SELECT eventview.refresh('v')")
        assert a.execute("SELECT sku, n FROM v").fetchall() == []
        c.execute("""INSERT INTO ev (event_type, payload) VALUES ('sale', '{"sku": "B"}')""")
        assert _one(a, "SELECT eventview.refresh('v')") == 1
        assert a.execute("SELECT sku, n FROM v").fetchall() == [("B", 1)]


# The statement's snapshot with the own transaction in progress, spelled in SQL: what
# eventview._snapshot_without_own computes, in the same statement.
_SNAPSHOT_WITHOUT_OWN_IN_SQL = """
    SELECT eventview._snapshot_without_own()::text,
           (SELECT CASE
               WHEN own IS NULL OR NOT pg_visible_in_snapshot(own, s) THEN s
               ELSE (least(pg_snapshot_xmin(s)::text::numeric, own::text::numeric)::text || ':' ||
                     pg_snapshot_xmax(s)::text || ':' ||
                     array_to_string(ARRAY(
                         SELECT x FROM (SELECT pg_snapshot_xip(s)::text::numeric AS x
                                        UNION SELECT own::text::numeric) xs
                         ORDER BY x), ','))::pg_snapshot
            END::text
            FROM (SELECT pg_current_snapshot() AS s, pg_current_xact_id_if_assigned() AS own) cur)
"""


def test_the_snapshot_without_the_own_transaction_leaves_it_in_progress(db):
    """_snapshot_without_own is the statement's snapshot with the caller's own transaction
    (when it has an id) among those in progress, as its SQL spelling gives it: with no
    transaction id, with other transactions open before and after it, and once it is the oldest
    one running."""
    conns = [psycopg.connect(db, autocommit=True) for _ in range(4)]
    a, older, newer, writer = conns
    try:
        writer.execute("CREATE TABLE t (x int)")

        def check(expect_own_in_progress):
            got, spelled = a.execute(_SNAPSHOT_WITHOUT_OWN_IN_SQL).fetchone()
            assert got == spelled
            own = _one(a, "SELECT pg_current_xact_id_if_assigned()::text")
            in_progress = got.split(":")[2].split(",")
            assert (own in in_progress) == expect_own_in_progress, got
            return got

        # No transaction id: the statement's snapshot as it is.
        assert check(False) == _one(a, "SELECT pg_current_snapshot()::text")
        older.execute("BEGIN")
        older.execute("INSERT INTO t VALUES (1)")
        a.execute("BEGIN")
        a.execute("INSERT INTO t VALUES (2)")
        newer.execute("BEGIN")
        newer.execute("INSERT INTO t VALUES (3)")
        writer.execute("INSERT INTO t VALUES (4)")
        # Between an older and a newer open transaction, after one that committed: the two
        # others are in progress too.
        between = check(True)
        for other in (older, newer):
            assert _one(other, "SELECT pg_current_xact_id()::text") in between.split(":")[2].split(","), between
        older.execute("COMMIT")
        newer.execute("COMMIT")
        writer.execute("INSERT INTO t VALUES (5)")
        check(True)
        assert _one(a, "SELECT pg_visible_in_snapshot(pg_current_xact_id(), eventview._snapshot_without_own())") is False
        a.execute("COMMIT")
        assert check(False) == _one(a, "SELECT pg_current_snapshot()::text")
    finally:
        for c in conns:
            c.close()
