"""Lock order between concurrent calls: each test builds, step by step, an interleaving in which
two calls taking the same locks in different orders would deadlock (40P01 in one of the calls),
and checks that both finish. Sessions are told apart by application_name; a step waits until
the session before it is blocked on a lock, so nothing depends on timing.

- Two `ingest` calls with the same keys in different orders: each inserts its keys in one
  (bytewise) order, not in envelope order, in which each would hold a key the other waits for
  while waiting for one of the other's uncommitted keys.
- `drop_event_table(cascade)` takes a view's row, then its event table. So `refresh` takes its
  view's row before it observes (locks) its event table, and `refresh_all` refreshes the views
  (row, then table) before it observes the remaining tables: holding a table while waiting for a
  view's row the drop holds would deadlock.
- Under a lock_timeout (the worker's), a prune that times out only warns: failing
  `run_maintenance` as a whole would take back the refreshes of the run.
"""

import threading
import time

import psycopg


def _connect(db, name):
    return psycopg.connect(db, autocommit=True, application_name=name)


def _wait_until_blocked(conn, name, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
            (name,),
        ).fetchone()[0]
        if waiting:
            return
        time.sleep(0.05)
    raise AssertionError(f"{name} never blocked on a lock")


class _Call(threading.Thread):
    """Runs one statement in its own session; keeps its first row (if it returns rows) or its error."""

    def __init__(self, db, name, sql, params=None):
        super().__init__(daemon=True)
        self.db, self.name, self.sql, self.params = db, name, sql, params
        self.row, self.error = None, None

    def run(self):
        try:
            with _connect(self.db, self.name) as conn:
                cur = conn.execute(self.sql, self.params)
                self.row = cur.fetchone() if cur.description else None
        except Exception as e:  # reported by the test
            self.error = e

    def result(self, timeout=60):
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} did not finish"
        assert self.error is None, f"{self.name} failed: {self.error!r}"
        return self.row


def _envelopes(*keys):
    return psycopg.types.json.Jsonb([{"type": "t", "key": k, "payload": {}} for k in keys])


def test_ingests_of_the_same_keys_in_different_orders_do_not_deadlock(db):
    with _connect(db, "holder") as holder, _connect(db, "watch") as watch:
        holder.execute("SELECT eventview.create_event_table('ev')")
        # The holder's uncommitted 'm' makes the first ingest wait, holding 'a' (key order); in
        # envelope order it would hold 'z'.
        holder.execute("BEGIN")
        holder.execute("INSERT INTO ev (event_type, event_key, payload) VALUES ('t', 'm', '{}')")
        first = _Call(db, "first", "SELECT * FROM eventview.ingest('ev', %s)", (_envelopes("z", "m", "a"),))
        first.start()
        _wait_until_blocked(watch, "first")
        # The second waits for the first's 'a' (key order); in envelope order it would take 'a'
        # and wait for the first's 'z'.
        second = _Call(db, "second", "SELECT * FROM eventview.ingest('ev', %s)", (_envelopes("a", "z"),))
        second.start()
        _wait_until_blocked(watch, "second")
        # Released: the first takes 'm' and 'z'. In envelope order it would now need the
        # second's 'a' while the second waits for its 'z'.
        holder.execute("ROLLBACK")
        assert first.result() == (3, 0, 0)
        assert second.result() == (0, 2, 0)
        assert watch.execute("SELECT string_agg(event_key, ',' ORDER BY event_key) FROM ev").fetchone()[0] == "a,m,z"


def test_refresh_all_and_drop_event_table_cascade_do_not_deadlock(db):
    with _connect(db, "holder") as holder, _connect(db, "watch") as watch:
        holder.execute("SELECT eventview.create_event_table('ev0')")
        holder.execute("SELECT eventview.create_event_table('ev')")
        holder.execute("SELECT eventview.create_view('v0', 'ev0')")
        holder.execute("SELECT eventview.create_view('v', 'ev')")
        holder.execute("INSERT INTO ev0 (event_type, payload) VALUES ('t', '{}')")
        holder.execute("INSERT INTO ev (event_type, payload) VALUES ('t', '{}')")
        # ev's field observer has nothing left to do: it only locks the table (with pending
        # changes it would also lock ev's catalog row, which drop_event_table waits for first).
        holder.execute("SELECT eventview.refresh('v')")
        # The holder refreshes v0 in an open transaction: refresh_all waits for v0's row.
        holder.execute("BEGIN")
        holder.execute("SELECT eventview.refresh('v0')")
        everything = _Call(db, "refresh_all", "SELECT eventview.refresh_all()")
        everything.start()
        _wait_until_blocked(watch, "refresh_all")
        # drop_event_table takes v's row, then needs ev itself (dropping its capture triggers).
        # refresh_all does not hold ev meanwhile: it observes the tables left over only after
        # the views, so it never waits for v's row while holding ev.
        drop = _Call(db, "drop", "SELECT eventview.drop_event_table('ev', cascade => true)")
        drop.start()
        time.sleep(0.5)  # (it may finish at once, or block on the table: both are fine)
        holder.execute("COMMIT")
        drop.result()
        # v0 was refreshed by the holder; v went with its table.
        assert everything.result() == (0,)
        assert watch.execute("SELECT to_regclass('ev'), to_regclass('v')").fetchone() == (None, None)
        assert watch.execute("SELECT events FROM v0").fetchone() == (1,)


def test_refresh_waits_for_its_view_before_holding_the_event_table(db):
    with _connect(db, "dropper") as dropper, _connect(db, "watch") as watch:
        dropper.execute("SELECT eventview.create_event_table('ev')")
        dropper.execute("SELECT eventview.create_view('v', 'ev')")
        dropper.execute("INSERT INTO ev (event_type, payload) VALUES ('t', '{}')")
        dropper.execute("SELECT eventview.refresh('v')")
        # The dropper holds v's row (alter_view locks it), then drops the table in the same
        # transaction. The refresh waits for the row before it observes ev: holding ev while
        # waiting for the row, it would deadlock with the drop.
        dropper.execute("BEGIN")
        dropper.execute("SELECT eventview.alter_view('v', on_type_error => 'skip')")
        refresh = _Call(db, "refresh", "SELECT eventview.refresh('v')")
        refresh.start()
        _wait_until_blocked(watch, "refresh")
        dropper.execute("SELECT eventview.drop_event_table('ev', cascade => true)")
        dropper.execute("COMMIT")
        refresh.join(60)
        assert isinstance(refresh.error, psycopg.errors.UndefinedTable), repr(refresh.error)
        assert 'view "v" was dropped by another transaction' in str(refresh.error)


def test_run_maintenance_keeps_its_refreshes_when_pruning_times_out(db):
    with _connect(db, "holder") as holder, _connect(db, "maint") as maint:
        holder.execute("SELECT eventview.create_event_table('ev')")
        holder.execute("SELECT eventview.create_event_table('ev2')")
        holder.execute("SELECT eventview.create_view('v2', 'ev2')")
        holder.execute("SELECT eventview.schedule('v2', '1 second')")
        holder.execute("INSERT INTO ev2 (event_type, payload) VALUES ('t', '{}')")
        changelog = holder.execute(
            "SELECT format('eventview._changes_%s', source_id) FROM eventview._sources WHERE relid = 'ev'::regclass"
        ).fetchone()[0]
        # Someone holds ev's changelog: pruning it waits, up to the lock_timeout.
        holder.execute("BEGIN")
        holder.execute(f"LOCK TABLE {changelog} IN ACCESS EXCLUSIVE MODE")
        maint.execute("SET lock_timeout = '200ms'")
        maint.execute("SELECT eventview.run_maintenance()")
        holder.execute("ROLLBACK")
        # The refresh of v2 in the same run stays.
        assert maint.execute("SELECT coalesce(sum(events), 0) FROM v2").fetchone() == (1,)


def test_run_maintenance_skips_a_view_whose_event_table_is_locked_without_waiting(db):
    """A scheduled view whose event table another session holds, or waits to hold, against
    reading (the table, or one of its indexes as REINDEX holds them) is skipped at once: no wait
    up to the lock_timeout, which here is none, so without the skip run_maintenance would hang
    until statement_timeout. Noted in last_error without counting as a failure, and refreshed at
    the first run that finds the table free. A lock of the caller's own transaction is no reason
    to skip, and a view in backoff keeps its error."""
    state = "SELECT last_error, failures, retry_at FROM eventview._views WHERE relid = 'v'::regclass"
    with _connect(db, "holder") as holder, _connect(db, "reader") as reader, _connect(db, "maint") as maint:
        holder.execute("SELECT eventview.create_event_table('ev')")
        holder.execute("SELECT eventview.create_event_table('ev2')")
        holder.execute("SELECT eventview.create_view('v', 'ev')")
        holder.execute("SELECT eventview.create_view('v2', 'ev2')")
        holder.execute("SELECT eventview.schedule('v', '1 millisecond')")
        holder.execute("SELECT eventview.schedule('v2', '1 millisecond')")
        holder.execute("INSERT INTO ev (event_type, payload) VALUES ('t', '{}')")
        maint.execute("SET lock_timeout = 0")
        maint.execute("SET statement_timeout = '20s'")
        skipped = ("scheduled refresh skipped: event table public.ev was locked by another session", 0, None)

        def events(view):
            return maint.execute(f"SELECT coalesce(sum(events), 0)::int FROM {view}").fetchone()[0]

        # Held: ALTER TABLE's lock, as LOCK TABLE takes it; REINDEX's on an index. The other
        # table's view goes on.
        for lock in ("LOCK TABLE ev IN ACCESS EXCLUSIVE MODE", "REINDEX INDEX ev_pkey", "REINDEX TABLE ev"):
            v2_before = events("v2")
            holder.execute("INSERT INTO ev2 (event_type, payload) VALUES ('t', '{}')")
            holder.execute("BEGIN")
            holder.execute(lock)
            maint.execute("SELECT eventview.run_maintenance()")
            holder.execute("ROLLBACK")
            assert maint.execute(state).fetchone() == skipped, lock
            assert events("v") == 0 and events("v2") == v2_before + 1, lock

        # Waited for: a reader holds the table and a VACUUM FULL queues behind it. A refresh
        # would queue behind the VACUUM FULL in turn.
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM ev")
        vacuum = _Call(db, "vacuum", "VACUUM FULL ev")
        vacuum.start()
        _wait_until_blocked(maint, "vacuum")
        maint.execute("SELECT eventview.run_maintenance()")
        assert maint.execute(state).fetchone() == skipped
        reader.execute("ROLLBACK")
        vacuum.result()

        # Free: the next run refreshes it and clears the note.
        maint.execute("SELECT eventview.run_maintenance()")
        assert maint.execute(state).fetchone() == (None, 0, None)
        assert events("v") == 1

        # Queued behind the caller's own transaction: its own lock lets it read, as a plain
        # refresh would.
        maint.execute("BEGIN")
        maint.execute("INSERT INTO ev (event_type, payload) VALUES ('t', '{}')")
        vacuum = _Call(db, "vacuum", "VACUUM FULL ev")
        vacuum.start()
        _wait_until_blocked(holder, "vacuum")  # (maint's transaction sees pg_stat_activity as it was)
        maint.execute("SELECT eventview.run_maintenance()")
        assert maint.execute(state).fetchone() == (None, 0, None)
        assert events("v") == 2
        maint.execute("COMMIT")
        vacuum.result()

        # In backoff: the error stays, the skip is not noted over it.
        maint.execute("UPDATE eventview._views SET last_error = 'earlier failure', failures = 2 WHERE relid = 'v'::regclass")
        holder.execute("INSERT INTO ev (event_type, payload) VALUES ('t', '{}')")
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE ev IN ACCESS EXCLUSIVE MODE")
        maint.execute("SELECT eventview.run_maintenance()")
        holder.execute("ROLLBACK")
        assert maint.execute(state).fetchone() == ("earlier failure", 2, None)
        assert events("v") == 2


def test_run_maintenance_leaves_a_locked_table_to_a_later_prune_without_waiting(db):
    """Pruning every table (run_maintenance's) skips the raw events of a table another session
    holds locked instead of waiting for it: with lock_timeout 0 it would hang until
    statement_timeout. A later run prunes them; prune of that one table still waits, as asked."""
    old = "SELECT count(*) FROM ev WHERE occurred_at < now() - interval '1 day'"
    with _connect(db, "holder") as holder, _connect(db, "maint") as maint:
        holder.execute("SELECT eventview.create_event_table('ev', retention => '1 day')")
        holder.execute("SELECT eventview.create_event_table('ev2', retention => '1 day')")
        for table in ("ev", "ev2"):
            holder.execute(f"INSERT INTO {table} (event_type, occurred_at, payload) VALUES ('t', now() - interval '2 days', '{{}}')")
        maint.execute("SET lock_timeout = 0")
        maint.execute("SET statement_timeout = '20s'")
        notices = []
        maint.add_notice_handler(lambda d: notices.append(d.message_primary))
        for lock in ("LOCK TABLE ev IN SHARE MODE", "REINDEX INDEX ev_pkey"):
            holder.execute("BEGIN")
            holder.execute(lock)
            maint.execute("SELECT eventview.run_maintenance()")
            holder.execute("ROLLBACK")
            assert maint.execute(old).fetchone() == (1,), lock
            assert "pg_eventview: events of public.ev not pruned: another session holds the table locked" in notices, (lock, notices)
            notices.clear()
        # The caller's own SHARE lock does not shut out another session's SHARE: still skipped.
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE ev IN SHARE MODE")
        maint.execute("BEGIN")
        maint.execute("LOCK TABLE ev IN SHARE MODE")
        maint.execute("SELECT eventview.run_maintenance()")
        maint.execute("ROLLBACK")
        holder.execute("ROLLBACK")
        assert maint.execute(old).fetchone() == (1,)
        assert "pg_eventview: events of public.ev not pruned: another session holds the table locked" in notices, notices
        notices.clear()
        # The other table was pruned meanwhile; ev is at the next run.
        assert maint.execute(old.replace("FROM ev", "FROM ev2")).fetchone() == (0,)
        maint.execute("SELECT eventview.run_maintenance()")
        assert maint.execute(old).fetchone() == (0,)
        assert notices == []
        # prune of one named table waits for its lock: the caller asked for that table.
        holder.execute(f"INSERT INTO ev (event_type, occurred_at, payload) VALUES ('t', now() - interval '2 days', '{{}}')")
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE ev IN SHARE MODE")
        pruning = _Call(db, "prune_one", "SELECT eventview.prune('ev')")
        pruning.start()
        _wait_until_blocked(maint, "prune_one")
        holder.execute("ROLLBACK")
        assert pruning.result()[0] >= 1


def test_run_maintenance_refreshes_a_rollup_without_waiting_for_its_source(db):
    """A scheduled rollup's refresh refreshes its source first, but never waits for the source's
    row: a refresh of the rollup in another session holds the source's row while it waits for the
    rollup's, which run_maintenance holds. The rollup applies what its source has written, and
    its next run refreshes the source too."""
    with _connect(db, "holder") as holder, _connect(db, "maint") as maint:
        holder.execute("SELECT eventview.create_event_table('ev')")
        holder.execute("""SELECT eventview.create_view('hourly', 'ev', group_by => '{"k": "$.k"}', time_bucket => '1 hour')""")
        holder.execute("""SELECT eventview.create_view('daily', 'hourly', group_by => '{"k": "k"}', time_bucket => '1 day')""")
        holder.execute("SELECT eventview.schedule('daily', '1 millisecond')")
        holder.execute("""INSERT INTO ev (event_type, occurred_at, payload) VALUES ('t', '2026-01-01 10:00+00', '{"k": "a"}')""")
        maint.execute("SET lock_timeout = 0")
        maint.execute("SET statement_timeout = '20s'")
        holder.execute("BEGIN")
        holder.execute("SELECT view_id FROM eventview._views WHERE relid = 'hourly'::regclass FOR UPDATE")
        maint.execute("SELECT eventview.run_maintenance()")
        holder.execute("ROLLBACK")
        assert maint.execute("SELECT count(*) FROM daily").fetchone()[0] == 0
        time.sleep(0.01)
        maint.execute("SELECT eventview.run_maintenance()")
        assert maint.execute("SELECT k, events FROM daily").fetchall() == [("a", 1)]
