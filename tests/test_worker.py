"""The background worker and the pg_cron path, on real clusters with preloaded libraries.

Each test module starts its own cluster (scripts/cluster.sh) with the settings it needs. Time
is only ever waited for with a deadline and polling: the assertions are about what happened,
not about how fast.
"""

import subprocess
import time
from pathlib import Path

import psycopg
import pytest

REPO = Path(__file__).resolve().parent.parent
CLUSTER_SH = REPO / "scripts" / "cluster.sh"


class PreloadedCluster:
    def __init__(self, directory, port, *conf):
        self.dir, self.port = directory, port
        subprocess.run(["bash", str(CLUSTER_SH), "start", directory, str(port), *conf], check=True)

    def connect(self, dbname="postgres"):
        return psycopg.connect(f"host={self.dir} port={self.port} user=postgres dbname={dbname}", autocommit=True)

    def log(self):
        return Path(self.dir, "server.log").read_text(errors="replace")

    def stop(self):
        subprocess.run(["bash", str(CLUSTER_SH), "stop", self.dir], check=False)


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def one(conn, sql, *args):
    row = conn.execute(sql, args).fetchone()
    return None if row is None else row[0]


@pytest.fixture(scope="module")
def worker_cluster():
    c = PreloadedCluster(
        "/tmp/pg_eventview_it_worker", 55451,
        "shared_preload_libraries = 'pg_eventview'",
        "eventview.databases = 'postgres, evw'",
        "eventview.naptime = '200ms'",
    )
    with c.connect() as conn:
        conn.execute("CREATE DATABASE evw")
    yield c
    c.stop()


@pytest.fixture
def evw(worker_cluster):
    with worker_cluster.connect("evw") as conn:
        # The previous test's views may be scheduled every 100 ms: the worker's refreshes lock
        # what DROP EXTENSION drops, in another order, and PostgreSQL may end either side as a
        # deadlock. Unscheduled, the worker leaves them alone after its current run; a DROP
        # chosen as the victim meanwhile is tried again.
        conn.execute("""DO $$ BEGIN
                            IF to_regclass('eventview._views') IS NOT NULL THEN
                                UPDATE eventview._views SET schedule = NULL;
                            END IF;
                        END $$""")
        for attempt in range(5):
            try:
                conn.execute("DROP EXTENSION IF EXISTS pg_eventview CASCADE")
                break
            except psycopg.errors.DeadlockDetected:
                if attempt == 4:
                    raise
                time.sleep(0.5)
        conn.execute("DROP SCHEMA IF EXISTS eventview CASCADE")
        conn.execute("DROP TABLE IF EXISTS ev, ev2, ev3 CASCADE")
        conn.execute("CREATE EXTENSION pg_eventview")
        yield conn


def worker_pid(conn):
    return one(conn, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_eventview worker' AND datname = 'evw'")


def test_scheduled_view_catches_up_without_a_manual_call(evw):
    evw.execute("SELECT eventview.create_event_table('ev')")
    evw.execute("SELECT eventview.create_view('v', 'ev', measures => '{\"n\": \"count(*)\"}')")
    evw.execute("SELECT eventview.schedule('v', '200 milliseconds')")
    evw.execute("INSERT INTO ev (event_type, payload) SELECT 'a', '{}' FROM generate_series(1, 500)")
    wait_for(lambda: one(evw, "SELECT coalesce(sum(n), 0) FROM v") == 500, 10, "the worker to refresh v")
    assert one(evw, "SELECT pending_changes FROM eventview.views WHERE name = 'v'::regclass") == 0
    # Unscheduled views are left alone.
    evw.execute("SELECT eventview.create_view('manual', 'ev')")
    evw.execute("INSERT INTO ev (event_type, payload) VALUES ('a', '{}')")
    wait_for(lambda: one(evw, "SELECT sum(n) FROM v") == 501, 10, "the worker to refresh v again")
    assert one(evw, "SELECT pending_changes FROM eventview.views WHERE name = 'manual'::regclass") == 1


def test_a_commit_wakes_the_worker_before_its_naptime(worker_cluster, evw):
    """With a naptime of 10 minutes, a view scheduled every 100 ms shows committed inserts within
    seconds: a transaction that captured changes wakes the worker when it commits, and the
    worker refreshes the views that are due."""
    evw.execute("ALTER SYSTEM SET eventview.naptime = '10min'")
    evw.execute("SELECT pg_reload_conf()")
    try:
        time.sleep(1)  # the worker takes the new naptime at its next wake-up
        evw.execute("SELECT eventview.create_event_table('ev')")
        evw.execute("SELECT eventview.create_view('v', 'ev', measures => '{\"n\": \"count(*)\"}')")
        evw.execute("SELECT eventview.schedule('v', '100 ms')")
        evw.execute("INSERT INTO ev (event_type, payload) VALUES ('t', '{}')")
        wait_for(lambda: one(evw, "SELECT n FROM v") == 1, 20, "the first commit to show")
        # Refreshed a moment ago: the next commit waits for the schedule, not for the naptime.
        evw.execute("INSERT INTO ev (event_type, payload) VALUES ('t', '{}'), ('t', '{}')")
        wait_for(lambda: one(evw, "SELECT n FROM v") == 3, 20, "the second commit to show")
    finally:
        evw.execute("ALTER SYSTEM RESET eventview.naptime")
        evw.execute("SELECT pg_reload_conf()")


def test_a_schedule_at_the_edge_of_the_interval_range_does_not_stop_the_worker(worker_cluster, evw):
    """A schedule whose fields nearly cancel out (accepted: it is positive) makes interval
    arithmetic overflow; the worker's own due-time computation does none, so it keeps
    refreshing the other views after commits, in the same process."""
    evw.execute("SELECT eventview.create_event_table('ev')")
    evw.execute("SELECT eventview.create_view('edge', 'ev', measures => '{\"n\": \"count(*)\"}')")
    evw.execute("SELECT eventview.create_view('v', 'ev', measures => '{\"n\": \"count(*)\"}')")
    evw.execute("""SELECT eventview.schedule('edge', interval '300000 years'
                                                     + (interval '-2562047788 hours' - interval '54 s'))""")
    evw.execute("SELECT eventview.schedule('v', '100 ms')")
    pid = wait_for(lambda: worker_pid(evw), 10, "the worker")
    for n in (1, 2, 3):
        evw.execute("INSERT INTO ev (event_type, payload) VALUES ('t', '{}')")
        wait_for(lambda: one(evw, "SELECT n FROM v") == n, 10, f"commit {n} to show in v")
    assert worker_pid(evw) == pid


def test_a_failing_view_does_not_stop_the_others(evw):
    evw.execute("SELECT eventview.create_event_table('ev')")
    evw.execute("SELECT eventview.create_view('bad', 'ev', measures => '{\"s\": \"sum($.v)\"}', on_type_error => 'fail')")
    evw.execute("SELECT eventview.create_view('good', 'ev')")
    evw.execute("SELECT eventview.schedule('bad', '100 milliseconds')")
    evw.execute("SELECT eventview.schedule('good', '100 milliseconds')")
    evw.execute("INSERT INTO ev (event_type, payload) VALUES ('a', '{\"v\": \"oops\"}'), ('a', '{\"v\": 1}')")
    wait_for(lambda: one(evw, "SELECT coalesce(sum(events), 0) FROM good") == 2, 10, "good to refresh")
    wait_for(lambda: one(evw, "SELECT last_error FROM eventview.views WHERE name = 'bad'::regclass"), 10, "bad's error")
    assert "needs a JSON number" in one(evw, "SELECT last_error FROM eventview.views WHERE name = 'bad'::regclass")
    assert one(evw, "SELECT count(*) FROM bad") == 0
    # Later events keep flowing into the healthy view.
    evw.execute("INSERT INTO ev (event_type, payload) VALUES ('a', '{}')")
    wait_for(lambda: one(evw, "SELECT sum(events) FROM good") == 3, 10, "good to keep refreshing")


def test_worker_restarts_after_sigterm_and_carries_on(worker_cluster, evw):
    evw.execute("SELECT eventview.create_event_table('ev')")
    evw.execute("SELECT eventview.create_view('v', 'ev')")
    evw.execute("SELECT eventview.schedule('v', '100 milliseconds')")
    old = wait_for(lambda: worker_pid(evw), 15, "the worker of evw")
    assert one(evw, "SELECT pg_terminate_backend(%s)", old)
    wait_for(lambda: one(evw, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", old) == 0, 5, "the worker to stop")
    new = wait_for(lambda: worker_pid(evw), 20, "the worker to be restarted")
    assert new != old
    evw.execute("INSERT INTO ev (event_type, payload) VALUES ('a', '{}')")
    wait_for(lambda: one(evw, "SELECT coalesce(sum(events), 0) FROM v") == 1, 10, "the restarted worker to refresh")


def test_drop_extension_with_the_worker_running(worker_cluster, evw):
    evw.execute("SELECT eventview.create_event_table('ev')")
    evw.execute("SELECT eventview.create_view('v', 'ev')")
    evw.execute("SELECT eventview.schedule('v', '100 milliseconds')")
    pid = wait_for(lambda: worker_pid(evw), 15, "the worker of evw")
    evw.execute("DROP EXTENSION pg_eventview CASCADE")
    time.sleep(1)  # several naptimes: the worker must idle, not fail, in a database without the extension
    assert worker_pid(evw) == pid
    # Re-creating over the leftovers of the first installation: new ids do not collide.
    evw.execute("CREATE EXTENSION pg_eventview")
    evw.execute("SELECT eventview.create_event_table('ev2')")
    evw.execute("SELECT eventview.create_view('v2', 'ev2')")
    evw.execute("SELECT eventview.schedule('v2', '100 milliseconds')")
    evw.execute("INSERT INTO ev2 (event_type, payload) VALUES ('a', '{}')")
    wait_for(lambda: one(evw, "SELECT coalesce(sum(events), 0) FROM v2") == 1, 10, "maintenance after re-creating the extension")


def test_worker_off_on_reload(worker_cluster, evw):
    evw.execute("SELECT eventview.create_event_table('ev')")
    evw.execute("SELECT eventview.create_view('v', 'ev')")
    evw.execute("SELECT eventview.schedule('v', '100 milliseconds')")
    with worker_cluster.connect() as admin:
        admin.execute("ALTER SYSTEM SET eventview.worker = off")
        admin.execute("SELECT pg_reload_conf()")
        try:
            time.sleep(1)
            evw.execute("INSERT INTO ev (event_type, payload) VALUES ('a', '{}')")
            time.sleep(1.5)
            assert one(evw, "SELECT count(*) FROM v") == 0, "the worker refreshed while eventview.worker = off"
        finally:
            admin.execute("ALTER SYSTEM RESET eventview.worker")
            admin.execute("SELECT pg_reload_conf()")
    wait_for(lambda: one(evw, "SELECT coalesce(sum(events), 0) FROM v") == 1, 10, "the worker to resume after reload")


def test_a_locked_event_table_does_not_stall_the_other_views(worker_cluster, evw):
    evw.execute("SET lock_timeout = '5s'")  # this test's own reads must never hang on the lock
    evw.execute("SELECT eventview.create_event_table('ev')")
    evw.execute("SELECT eventview.create_event_table('ev2')")
    evw.execute("SELECT eventview.create_event_table('ev3')")
    evw.execute("SELECT eventview.create_view('v', 'ev')")
    evw.execute("SELECT eventview.create_view('v2', 'ev2')")
    evw.execute("INSERT INTO ev (event_type, payload) VALUES ('a', '{\"x\": 1}')")
    error = "SELECT last_error FROM eventview.views WHERE name = 'v'::regclass"
    with worker_cluster.connect() as admin, worker_cluster.connect("evw") as holder:
        admin.execute("ALTER SYSTEM SET eventview.maintenance_lock_timeout = '300ms'")
        admin.execute("SELECT pg_reload_conf()")
        try:
            holder.execute("BEGIN")
            holder.execute("LOCK TABLE ev IN ACCESS EXCLUSIVE MODE")
            # Scheduled only now: v's first scheduled refresh meets the lock.
            evw.execute("SELECT eventview.schedule('v', '100 milliseconds')")
            evw.execute("SELECT eventview.schedule('v2', '100 milliseconds')")
            # v's scheduled refresh is skipped, and says why; not counted as a failure.
            wait_for(lambda: one(evw, error), 15, "v's refresh to be skipped on the locked table")
            assert one(evw, error).startswith("scheduled refresh skipped: event table ")
            assert one(evw, error).endswith("ev was locked by another session")
            assert one(evw, "SELECT failures FROM eventview._views WHERE relid = 'v'::regclass") == 0
            # Meanwhile the other table's view and field observer carry on.
            evw.execute("INSERT INTO ev2 (event_type, payload) VALUES ('a', '{\"y\": 1}')")
            wait_for(lambda: one(evw, "SELECT coalesce(sum(events), 0) FROM v2") == 1, 15, "v2 to refresh")
            # So does the field observer of a table no view reads (run_maintenance observes it
            # after the views, every table in turn, ev first).
            evw.execute("INSERT INTO ev3 (event_type, payload) VALUES ('a', '{\"z\": 1}')")
            wait_for(lambda: one(evw, "SELECT count(*) FROM eventview.observed_fields WHERE source = 'ev3'::regclass") == 1,
                     15, "ev3's fields to be observed")
            holder.execute("ROLLBACK")
            # Released: v and the observer of ev catch up (at the next run: no backoff).
            wait_for(lambda: one(evw, "SELECT coalesce(sum(events), 0) FROM v") == 1, 30, "v to catch up")
            wait_for(lambda: one(evw, error) is None, 30, "v's error to be cleared by its successful refresh")
            wait_for(lambda: one(evw, "SELECT count(*) FROM eventview.observed_fields WHERE source = 'ev'::regclass") == 1,
                     15, "ev's fields to be observed")
        finally:
            holder.execute("ROLLBACK")
            admin.execute("ALTER SYSTEM RESET eventview.maintenance_lock_timeout")
            admin.execute("SELECT pg_reload_conf()")


def test_a_locked_changelog_does_not_stall_the_other_tables(worker_cluster, evw):
    """A changelog another session holds (a VACUUM FULL or LOCK TABLE of it) is left to a later
    run by run_maintenance's field observer and pruning, not waited for: with no lock_timeout at
    all, the other tables are still observed and pruned."""
    evw.execute("SET lock_timeout = '5s'")  # this test's own reads must never hang on the lock
    evw.execute("SELECT eventview.create_event_table('ev')")
    evw.execute("SELECT eventview.create_event_table('ev2')")
    evw.execute("SELECT eventview.create_event_table('ev3', delta_retention => '100 milliseconds')")
    evw.execute("SELECT eventview.create_view('v2', 'ev2')")
    evw.execute("SELECT eventview.create_view('v', 'ev')")  # not scheduled
    evw.execute("INSERT INTO ev (event_type, payload) VALUES ('a', '{\"x\": 1}')")
    source_id = "SELECT source_id FROM eventview._sources WHERE relid = %s::regclass"
    locked = f"eventview._changes_{one(evw, source_id, 'ev')}"
    ev3_log = f"eventview._changes_{one(evw, source_id, 'ev3')}"
    with worker_cluster.connect() as admin, worker_cluster.connect("evw") as holder:
        admin.execute("ALTER SYSTEM SET eventview.maintenance_lock_timeout = 0")  # waits for ever
        admin.execute("SELECT pg_reload_conf()")
        try:
            holder.execute("BEGIN")
            holder.execute(f"LOCK TABLE {locked} IN ACCESS EXCLUSIVE MODE")
            evw.execute("SELECT eventview.schedule('v2', '100 milliseconds')")
            evw.execute("INSERT INTO ev2 (event_type, payload) VALUES ('a', '{\"y\": 1}')")
            evw.execute("INSERT INTO ev3 (event_type, payload) VALUES ('a', '{\"z\": 1}')")
            wait_for(lambda: one(evw, "SELECT coalesce(sum(events), 0) FROM v2") == 1, 15, "v2 to refresh")
            wait_for(lambda: one(evw, "SELECT count(*) FROM eventview.observed_fields WHERE source = 'ev3'::regclass") == 1,
                     15, "ev3's fields to be observed past ev's locked changelog")
            wait_for(lambda: one(evw, f"SELECT count(*) FROM {ev3_log}") == 0, 15, "ev3's changelog to be pruned")
            # The catalog views do not wait for it either (lock_timeout 5s above): unknown, NULL.
            assert evw.execute("SELECT pending_changes, lag FROM eventview.views WHERE name = 'v'::regclass").fetchone() \
                == (None, None)
            assert one(evw, "SELECT pending_changes FROM eventview.event_tables WHERE name = 'ev'::regclass") is None
            assert one(evw, "SELECT pending_changes FROM eventview.views WHERE name = 'v2'::regclass") == 0
            holder.execute("ROLLBACK")
            assert one(evw, "SELECT pending_changes FROM eventview.views WHERE name = 'v'::regclass") == 1
            wait_for(lambda: one(evw, "SELECT count(*) FROM eventview.observed_fields WHERE source = 'ev'::regclass") == 1,
                     15, "ev's fields to be observed once its changelog is free")
        finally:
            holder.execute("ROLLBACK")
            admin.execute("ALTER SYSTEM RESET eventview.maintenance_lock_timeout")
            admin.execute("SELECT pg_reload_conf()")


def test_a_database_not_updated_yet_is_said_once(worker_cluster, evw):
    """A new library over a database still at the older version: the worker says once that
    maintenance waits for ALTER EXTENSION ... UPDATE, rather than an error such as "observing
    fields failed" at every naptime, and maintains it again once updated."""
    evw.execute("DROP EXTENSION pg_eventview CASCADE")
    evw.execute("DROP SCHEMA IF EXISTS eventview CASCADE")
    evw.execute("CREATE EXTENSION pg_eventview VERSION '0.13.0'")
    said = "database \"evw\" has pg_eventview 0.13.0"
    wait_for(lambda: said in worker_cluster.log(), 15, "the worker to say the database is behind")
    time.sleep(1)  # five more naptimes
    assert worker_cluster.log().count(said) == 1
    assert "observing fields failed" not in worker_cluster.log()
    evw.execute("ALTER EXTENSION pg_eventview UPDATE")
    evw.execute("SELECT eventview.create_event_table('ev')")
    evw.execute("SELECT eventview.create_view('v', 'ev')")
    evw.execute("SELECT eventview.schedule('v', '100 milliseconds')")
    evw.execute("INSERT INTO ev (event_type, payload) VALUES ('a', '{}')")
    wait_for(lambda: one(evw, "SELECT coalesce(sum(events), 0) FROM v") == 1, 15, "maintenance after the update")


def test_pg_cron_keeps_views_fresh_without_the_worker():
    c = PreloadedCluster(
        "/tmp/pg_eventview_it_cron", 55452,
        "shared_preload_libraries = 'pg_cron'",
        "cron.database_name = 'postgres'",
    )
    try:
        with c.connect() as conn:
            conn.execute("CREATE EXTENSION pg_cron")
            conn.execute("CREATE EXTENSION pg_eventview")
            conn.execute("SELECT eventview.create_event_table('ev')")
            conn.execute("SELECT eventview.create_view('v', 'ev')")
            conn.execute("SELECT eventview.schedule('v', '1 second')")
            # The README's job: a table locked for long must not stall it (as the worker's
            # eventview.maintenance_lock_timeout).
            conn.execute("SELECT cron.schedule('eventview', '* * * * *', "
                         "$$SET LOCAL lock_timeout = '10s'; SELECT eventview.run_maintenance()$$)")
            conn.execute("INSERT INTO ev (event_type, payload) VALUES ('a', '{}'), ('b', '{}')")
            # pg_cron 1.4 runs jobs on minute boundaries: wait for the next one.
            wait_for(lambda: one(conn, "SELECT coalesce(sum(events), 0) FROM v") == 2, 75, "pg_cron to run run_maintenance")
            assert one(conn, "SELECT count(*) FROM cron.job_run_details WHERE status = 'succeeded'") >= 1
            assert one(conn, "SELECT count(*) FROM cron.job_run_details WHERE status = 'failed'") == 0
    finally:
        c.stop()
