"""A refresh interrupted in the middle (pg_terminate_backend, pg_cancel_backend, or the backend
process killed with SIGKILL, which makes the postmaster crash-restart the whole cluster) leaves
the view, its counters and the quarantine exactly as they were, and the next refresh applies the
whole delta once and converges to the from-scratch aggregate.

The refresh is interrupted after it has been running for 250 ms; if it finishes before that,
the delta is doubled and the attempt repeated, so the test can never pass without an actual
interruption."""

import os
import signal
import threading
import time

import psycopg
import pytest

KILL_AFTER = 0.25  # seconds the refresh must have been running before it is interrupted
FIRST_DELTA = 200_000

VIEW_SQL = """SELECT eventview.create_view('v', 'ev',
    group_by => '{"sku": "$.sku"}',
    measures => '{"n": "count(*)", "qty": "sum($.qty)", "hi": "max($.price)", "lo": "min($.price)"}',
    event_types => ARRAY['purchase', 'add_to_cart'],
    time_bucket => '1 hour',
    on_type_error => 'quarantine')"""

# Hand-written from-scratch aggregate (API.md section 6): qty/price must be JSON numbers, an
# event with a mistyped one is left out of the view entirely.
REFERENCE = """
SELECT date_bin('1 hour', occurred_at, '2000-01-01 00:00:00+00') AS bucket,
       payload #>> '{sku}' AS sku,
       count(*) AS n,
       sum(CASE WHEN jsonb_typeof(payload -> 'qty') = 'number' THEN (payload -> 'qty')::numeric END) AS qty,
       max(CASE WHEN jsonb_typeof(payload -> 'price') = 'number' THEN (payload -> 'price')::numeric END) AS hi,
       min(CASE WHEN jsonb_typeof(payload -> 'price') = 'number' THEN (payload -> 'price')::numeric END) AS lo
FROM ev
WHERE event_type IN ('purchase', 'add_to_cart')
  AND NOT coalesce(jsonb_typeof(payload -> 'sku') IN ('object', 'array'), false)
  AND NOT coalesce(jsonb_typeof(payload -> 'qty') NOT IN ('number', 'null'), false)
  AND NOT coalesce(jsonb_typeof(payload -> 'price') NOT IN ('number', 'null'), false)
GROUP BY 1, 2"""


def insert_events(conn, n, salt):
    """n events in one statement; about 0.1% have qty as a string (quarantined)."""
    conn.execute(
        """INSERT INTO ev (event_type, event_version, occurred_at, payload)
           SELECT CASE WHEN g %% 10 = 0 THEN 'page_view' WHEN g %% 3 = 0 THEN 'add_to_cart' ELSE 'purchase' END,
                  1,
                  timestamptz '2026-01-01 00:00:00+00' + ((g * 7 + %(salt)s) %% 700000) * interval '1 second',
                  jsonb_build_object(
                      'sku', 'S' || ((g + %(salt)s) %% 499),
                      'qty', CASE WHEN g %% 997 = 0 THEN to_jsonb('3'::text) ELSE to_jsonb(g %% 7) END,
                      'price', ((g * 13 + %(salt)s) %% 10000) / 100.0)
           FROM generate_series(1, %(n)s) g""",
        {"n": n, "salt": salt},
    )


def snapshot(conn):
    """Everything a refresh may change, as plain values."""
    rows = conn.execute("SELECT * FROM v ORDER BY bucket, sku").fetchall()
    meta = conn.execute(
        """SELECT last_refresh_at, pending_changes, quarantined, skipped, groups
           FROM eventview.views WHERE name = 'v'::regclass"""
    ).fetchone()
    quarantine = conn.execute("SELECT count(*), max(id) FROM eventview.quarantine").fetchone()
    return rows, meta, quarantine


def assert_from_scratch(conn):
    extra = conn.execute(f"(SELECT * FROM v) EXCEPT ALL ({REFERENCE})").fetchall()
    missing = conn.execute(f"({REFERENCE}) EXCEPT ALL (SELECT * FROM v)").fetchall()
    assert not extra and not missing, (
        f"view differs from the from-scratch aggregate: {len(extra)} extra rows {extra[:10]}, "
        f"{len(missing)} missing rows {missing[:10]}"
    )


def wait_for_server(cluster, timeout=60):
    deadline = time.time() + timeout
    while True:
        try:
            with cluster.connect() as c:
                c.execute("SELECT 1")
            return
        except psycopg.OperationalError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def connect_retry(cluster, conninfo, timeout=60):
    deadline = time.time() + timeout
    while True:
        try:
            return psycopg.connect(conninfo, autocommit=True)
        except psycopg.OperationalError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.parametrize("how", ["terminate", "cancel", "sigkill"])
def test_interrupted_refresh_leaves_view_unchanged_and_next_refresh_converges(cluster, db, how):
    setup = psycopg.connect(db, autocommit=True)
    setup.execute("SELECT eventview.create_event_table('ev')")
    setup.execute(VIEW_SQL)
    insert_events(setup, 20_000, salt=1)
    assert setup.execute("SELECT eventview.refresh('v')").fetchone()[0] == 20_000
    assert_from_scratch(setup)

    delta = FIRST_DELTA
    salt = 2
    interrupted = False
    for attempt in range(4):
        # The delta: many inserts, plus updates and deletes of older events (retractions,
        # min/max fix-ups) and a few mistyped values (quarantine inserts).
        insert_events(setup, delta, salt=salt)
        upd = setup.execute(
            """UPDATE ev SET payload = payload || jsonb_build_object('qty', 1, 'price', 0.01)
               WHERE event_id %% 10 = %s""",
            [salt % 10],
        ).rowcount
        dele = setup.execute("DELETE FROM ev WHERE event_id %% 50 = %s", [salt % 50]).rowcount
        changes = delta + upd + dele
        salt += 1
        before = snapshot(setup)
        assert before[1][1] == changes, "pending_changes before the refresh"

        a = psycopg.connect(db, autocommit=True)
        pid = a.execute("SELECT pg_backend_pid()").fetchone()[0]
        outcome = {}

        def run_refresh():
            try:
                outcome["result"] = a.execute("SELECT eventview.refresh('v')").fetchone()[0]
            except Exception as e:  # noqa: BLE001
                outcome["error"] = e

        t = threading.Thread(target=run_refresh)
        t.start()
        killed_at = None
        with cluster.connect() as b:
            deadline = time.time() + 120
            while time.time() < deadline and t.is_alive():
                row = b.execute(
                    """SELECT state, extract(epoch FROM clock_timestamp() - query_start)
                       FROM pg_stat_activity WHERE pid = %s""",
                    [pid],
                ).fetchone()
                if row and row[0] == "active" and row[1] >= KILL_AFTER:
                    killed_at = row[1]
                    if how == "terminate":
                        assert b.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
                    elif how == "cancel":
                        assert b.execute("SELECT pg_cancel_backend(%s)", [pid]).fetchone()[0]
                    else:
                        os.kill(pid, signal.SIGKILL)
                    break
                time.sleep(0.02)
        t.join(180)
        assert not t.is_alive(), "the refresh did not return"

        if "result" in outcome:
            # It finished before we could interrupt it: it must have applied everything.
            assert outcome["result"] == changes
            assert_from_scratch(setup)
            a.close()
            delta *= 2
            continue

        assert killed_at is not None, f"the refresh failed without being interrupted: {outcome['error']!r}"
        err = outcome["error"]
        if how == "cancel":
            assert isinstance(err, psycopg.errors.QueryCanceled), repr(err)
        else:
            assert isinstance(err, psycopg.OperationalError), repr(err)
        interrupted = True
        a.close()
        break

    assert interrupted, f"the refresh kept finishing in under {KILL_AFTER}s, even with a delta of {delta // 2}"

    if how == "sigkill":
        setup.close()
        wait_for_server(cluster)
        setup = connect_retry(cluster, db)
    else:
        # Wait until the interrupted backend has gone, or has left its transaction.
        with cluster.connect() as b:
            for _ in range(300):
                row = b.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
                if row is None or row[0] == "idle":
                    break
                time.sleep(0.05)

    after = snapshot(setup)
    assert after[0] == before[0], "the view changed although its refresh was interrupted"
    assert after[1] == before[1], f"view counters changed: {before[1]} -> {after[1]}"
    assert after[2] == before[2], f"quarantine changed: {before[2]} -> {after[2]}"

    # The next refresh, from a new connection, applies the whole delta exactly once.
    with psycopg.connect(db, autocommit=True) as c:
        assert c.execute("SELECT eventview.refresh('v')").fetchone()[0] == changes
        assert_from_scratch(c)
        assert c.execute("SELECT eventview.refresh('v')").fetchone()[0] == 0
        assert c.execute("SELECT pending_changes FROM eventview.views WHERE name = 'v'::regclass").fetchone()[0] == 0
        # Every current event with a mistyped qty is in quarantine.
        missing = c.execute(
            """SELECT count(*) FROM ev
               WHERE event_type IN ('purchase', 'add_to_cart') AND jsonb_typeof(payload -> 'qty') = 'string'
                 AND event_id NOT IN (SELECT event_id FROM eventview.quarantine WHERE to_regclass(view_name) = 'v'::regclass)"""
        ).fetchone()[0]
        assert missing == 0
    setup.close()
