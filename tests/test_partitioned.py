"""Partitioned event tables (API.md section 7): create_event_table(..., partition_interval).

- The table is partitioned by range on occurred_at, with its primary key (event_id, occurred_at),
  a default partition, and partitions from the present one through eventview.partition_premake
  ahead; run_maintenance keeps them made ahead, and a partition made for a range that holds
  events in the default partition takes them over, without a change for any view.
- Every event is stored whatever its occurred_at, and counted.
- event_key is unique across partitions: plain INSERTs and UPDATEs fail with 23505, ingest counts
  duplicates, also under concurrent producers; keys of deleted, truncated and dropped events can
  be sent again.
- Writes straight into a partition are captured, so are partitions made or attached by the user.
- prune drops partitions past retention once every view applied their events (never a
  retraction); DROP TABLE and DETACH PARTITION of a partition with events a view has not applied
  fail with 55000, so do a DROP SCHEMA ... CASCADE and a DROP OWNED that take one along.
"""

import threading

import psycopg
import pytest

VIEW = """SELECT eventview.create_view('per_sku', 'ev', group_by => '{"sku": "$.sku"}',
                                       measures => '{"n": "count(*)", "qty": "sum($.qty)", "top": "max($.qty)"}')"""
FROM_VIEW = "SELECT sku, n, qty, top FROM per_sku ORDER BY sku"
FROM_SCRATCH = """SELECT payload ->> 'sku', count(*), sum((payload -> 'qty')::numeric), max((payload -> 'qty')::numeric)
                  FROM ev GROUP BY 1 ORDER BY 1"""


def _one(conn, sql, params=None):
    return conn.execute(sql, params).fetchone()[0]


def _partitions(conn, table="ev"):
    """The partitions of `table` as (name, bound), in name order."""
    return conn.execute("""SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid)
                           FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                           WHERE i.inhparent = %s::regclass ORDER BY 1""", (table,)).fetchall()


def _matches_scratch(conn):
    conn.execute("SELECT eventview.refresh('per_sku')")
    assert conn.execute(FROM_VIEW).fetchall() == conn.execute(FROM_SCRATCH).fetchall()


def _insert(conn, occurred_at, sku="a", qty=1, key=None):
    """One event; `occurred_at` is an SQL expression of the test's own."""
    conn.execute(f"INSERT INTO ev (event_key, event_type, occurred_at, payload) VALUES (%s, 'order', {occurred_at}, %s)",
                 (key, psycopg.types.json.Jsonb({"sku": sku, "qty": qty})))


def test_a_partitioned_table_has_its_partitions_made_ahead(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SET TimeZone = 'Asia/Kathmandu'")
        assert _one(a, "SELECT eventview.create_event_table('ev', partition_interval => '1 hour')::text") == "ev"
        assert _one(a, "SELECT partstrat FROM pg_partitioned_table WHERE partrelid = 'ev'::regclass") == "r"
        assert _one(a, """SELECT string_agg(a.attname, ',' ORDER BY k.n) FROM pg_index x
                          CROSS JOIN LATERAL unnest(x.indkey) WITH ORDINALITY k(attnum, n)
                          JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
                          WHERE x.indrelid = 'ev'::regclass AND x.indisprimary""") == "event_id,occurred_at"
        parts = _partitions(a)
        assert ("ev_default", "DEFAULT") in parts
        hourly = [p for p in parts if p[0] != "ev_default"]
        # The present hour and the 4 after it (eventview.partition_premake), UTC-aligned.
        assert len(hourly) == 5
        expected = a.execute("""SELECT to_char(s AT TIME ZONE 'UTC', '"ev_p"YYYYMMDD"_"HH24MI'),
                                       format('FOR VALUES FROM (%L) TO (%L)', s, s + interval '1 hour')
                                FROM (SELECT date_bin('1 hour', now(), '2000-01-01 00:00:00+00') + n * interval '1 hour' AS s
                                      FROM generate_series(0, 4) n) b ORDER BY 1""").fetchall()
        assert hourly == expected
        # Every partition has the capture and key triggers (keys of all but INSERT, whose keys the
        # insert capture takes); the root all but TRUNCATE's.
        assert a.execute("""SELECT count(*) FILTER (WHERE tgrelid = 'ev'::regclass), count(DISTINCT tgrelid)
                            FROM pg_trigger WHERE tgname LIKE 'eventview_%'""").fetchone() == (5, 7)
        a.execute("SET eventview.partition_premake = 8")
        a.execute("SELECT eventview.run_maintenance()")
        assert len(_partitions(a)) == 10
        assert _one(a, "SELECT count(DISTINCT tgrelid) FROM pg_trigger WHERE tgname = 'eventview_capture_truncate'") == 10
        a.execute("SELECT eventview.run_maintenance()")
        assert len(_partitions(a)) == 10


@pytest.mark.parametrize("interval, message", [
    ("1 month", "invalid partition_interval: months and years have no fixed length"),
    ("1 year 2 days", "invalid partition_interval: months and years have no fixed length"),
    ("0 seconds", "invalid partition_interval: it must be a positive length of time"),
    ("-1 day", "invalid partition_interval: it must be a positive length of time"),
    ("1 day -25 hours", "invalid partition_interval: it must be a positive length of time"),
    ("30 seconds", "invalid partition_interval: it must be at least one minute"),
    ("59.9 seconds", "invalid partition_interval: it must be at least one minute"),
])
def test_a_partition_interval_without_a_fixed_positive_length_is_refused(db, interval, message):
    with psycopg.connect(db, autocommit=True) as a:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as e:
            a.execute("SELECT eventview.create_event_table('ev', partition_interval => %s::interval)", (interval,))
        assert message in str(e.value)
        assert _one(a, "SELECT to_regclass('ev') IS NULL AND NOT EXISTS (SELECT FROM eventview._sources)")


def test_a_table_named_to_the_identifier_limit_gets_every_partition_made(db):
    """Partition names keep their time whole within 62 bytes, so that each partition's array
    type gets a name of its own too, however long the table's name and however many
    partitions."""
    name = "p" * 63
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SET eventview.partition_premake = 100")
        a.execute("SELECT eventview.create_event_table(%s, partition_interval => '1 day')", (name,))
        warnings = []
        a.add_notice_handler(lambda d: warnings.append(d.message_primary))
        a.execute("SELECT eventview.run_maintenance()")
        assert warnings == []
        names = [r[0] for r in a.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = %s::regclass", (f'"{name}"',)).fetchall()]
        assert len(names) >= 101 and all(len(n) <= 62 for n in names)


def test_every_event_time_is_stored_and_counted(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev', retention => '1000 days', partition_interval => '1 day')")
        # Partitions of the user's own with infinite bounds: no bound, as MINVALUE and MAXVALUE
        # (an upper bound is exclusive: 'infinity' itself goes to the default partition).
        a.execute("CREATE TABLE ev_ancient PARTITION OF ev FOR VALUES FROM ('-infinity') TO ('1960-01-01')")
        a.execute("CREATE TABLE ev_future PARTITION OF ev FOR VALUES FROM ('2500-01-01') TO ('infinity')")
        a.execute(VIEW)
        for i, at in enumerate(["1970-01-01", "2026-01-01 10:00+00", "now()", "2400-06-01", "-infinity", "infinity",
                                "1950-01-01"]):
            a.execute(f"INSERT INTO ev (event_type, occurred_at, payload) VALUES ('order', '{at}'::timestamptz, '{{\"sku\": \"s{i}\", \"qty\": {i}}}')")
        a.execute("INSERT INTO ev (event_type, payload) SELECT 'order', '{\"sku\": \"bulk\", \"qty\": 1}' FROM generate_series(1, 100)")
        assert _one(a, "SELECT count(*) FROM ev") == 107
        assert a.execute("SELECT tableoid::regclass::text, count(*) FROM ev WHERE payload ->> 'sku' <> 'bulk' GROUP BY 1 ORDER BY 1").fetchall() \
            == [("ev_ancient", 2), ("ev_default", 4)] + \
               [(p, 1) for p in a.execute("SELECT tableoid::regclass::text FROM ev WHERE payload ->> 'sku' = 's2'").fetchone()]
        _matches_scratch(a)
        # run_maintenance prunes, past retention: the partition up to 1960 with its two events,
        # and the default partition's 1970 event; what has no upper bound stays. The view keeps
        # counting what went.
        a.execute("SELECT eventview.run_maintenance()")
        assert [p[0] for p in _partitions(a) if p[0] in ("ev_ancient", "ev_future")] == ["ev_future"]
        assert _one(a, "SELECT count(*) FROM ev") == 104
        a.execute("SELECT eventview.refresh('per_sku')")
        assert _one(a, "SELECT sum(n) FROM per_sku") == 107


def test_keys_are_unique_across_partitions(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev', partition_interval => '1 day')")
        a.execute(VIEW)
        _insert(a, "now()", key="k1")
        _insert(a, "'2020-01-01'", key="k2")
        for at, key in [("'2020-01-01'", "k1"), ("now()", "k2")]:
            with pytest.raises(psycopg.errors.UniqueViolation) as e:
                _insert(a, at, key=key)
            assert f"Key (event_key)=({key}) already exists" in str(e.value)
        with pytest.raises(psycopg.errors.UniqueViolation):
            a.execute("""INSERT INTO ev (event_key, event_type, occurred_at, payload)
                         VALUES ('k3', 'o', now(), '{}'), ('k3', 'o', '2020-01-01', '{}')""")
        with pytest.raises(psycopg.errors.UniqueViolation):
            a.execute("UPDATE ev SET event_key = 'k1' WHERE event_key = 'k2'")
        # A row moved to another partition keeps its key; keys swapped in one statement.
        a.execute("UPDATE ev SET occurred_at = '2019-05-05' WHERE event_key = 'k1'")
        a.execute("UPDATE ev SET event_key = CASE event_key WHEN 'k1' THEN 'k2' ELSE 'k1' END")
        with pytest.raises(psycopg.errors.UniqueViolation):
            _insert(a, "now()", key="k2")
        # Keys of deleted and truncated events may come again.
        a.execute("DELETE FROM ev WHERE event_key = 'k1'")
        _insert(a, "now()", key="k1")
        a.execute("TRUNCATE ev_default")
        _insert(a, "now()", key="k2")
        r = a.execute("""SELECT * FROM eventview.ingest('ev', '[
                           {"type": "order", "key": "k1", "payload": {"sku": "x", "qty": 1}},
                           {"type": "order", "key": "k4", "occurred_at": "2001-01-01T00:00:00Z", "payload": {"sku": "y", "qty": 2}},
                           {"type": "order", "key": "k4", "payload": {"sku": "y", "qty": 3}},
                           {"type": "order", "payload": {"sku": "z", "qty": 4}},
                           {"type": "order", "key": "k5", "payload": {"sku": "y", "qty": 5}}]')""").fetchone()
        assert r == (3, 2, 0)
        assert a.execute("SELECT event_key, count(*) FROM ev WHERE event_key IS NOT NULL GROUP BY 1 ORDER BY 1").fetchall() \
            == [("k1", 1), ("k2", 1), ("k4", 1), ("k5", 1)]
        assert _one(a, "SELECT payload ->> 'qty' FROM ev WHERE event_key = 'k4'") == "2"
        # The key table holds exactly the keys of the events, with their times.
        assert a.execute("SELECT event_key, occurred_at FROM eventview._keys_1 ORDER BY 1").fetchall() \
            == a.execute("SELECT event_key, occurred_at FROM ev WHERE event_key IS NOT NULL ORDER BY 1").fetchall()
        _matches_scratch(a)


def test_concurrent_producers_never_store_a_key_twice(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev', partition_interval => '1 day')")
        a.execute(VIEW)
    counts = {"inserted": 0, "duplicates": 0, "plain": 0, "refused": 0}
    lock = threading.Lock()
    errors = []

    def ingest(worker):
        try:
            with psycopg.connect(db, autocommit=True) as c:
                for batch in range(20):
                    events = [{"type": "order", "key": f"k{(batch * 7 + i * worker) % 60}",
                               "occurred_at": f"2026-0{1 + i % 3}-01T00:00:00Z", "payload": {"sku": "s", "qty": i}}
                              for i in range(12)]
                    r = c.execute("SELECT inserted, duplicates FROM eventview.ingest('ev', %s)",
                                  (psycopg.types.json.Jsonb(events),)).fetchone()
                    with lock:
                        counts["inserted"] += r[0]
                        counts["duplicates"] += r[1]
        except psycopg.Error as e:  # reported below
            errors.append(e)

    def plain(worker):
        try:
            with psycopg.connect(db, autocommit=True) as c:
                for i in range(60):
                    try:
                        _insert(c, "'2026-02-01'", key=f"k{(i * worker) % 60}")
                        with lock:
                            counts["plain"] += 1
                    except psycopg.errors.UniqueViolation:
                        with lock:
                            counts["refused"] += 1
        except psycopg.Error as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=ingest, args=(w,)) for w in (1, 5, 7)] + \
              [threading.Thread(target=plain, args=(w,)) for w in (1, 11)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    with psycopg.connect(db, autocommit=True) as a:
        assert _one(a, "SELECT count(*) FROM ev") == counts["inserted"] + counts["plain"]
        assert _one(a, "SELECT count(*) FROM ev") == _one(a, "SELECT count(DISTINCT event_key) FROM ev") == 60
        assert counts["inserted"] + counts["duplicates"] == 3 * 20 * 12
        assert counts["plain"] + counts["refused"] == 120
        assert a.execute("SELECT event_key, occurred_at FROM eventview._keys_1 ORDER BY 1").fetchall() \
            == a.execute("SELECT event_key, occurred_at FROM ev ORDER BY 1").fetchall()
        _matches_scratch(a)


def test_writes_into_partitions_and_partitions_of_the_users_are_captured(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev', partition_interval => '1 day')")
        a.execute(VIEW)
        a.execute("CREATE TABLE ev_2026_01 PARTITION OF ev FOR VALUES FROM ('2026-01-01') TO ('2026-02-01')")
        for day in range(1, 11):
            _insert(a, f"'2026-01-{day:02} 12:00+00'", sku="jan", qty=day)
        _matches_scratch(a)
        # Straight into a partition: an id from the table's identity, as the root would give.
        a.execute("""INSERT INTO ev_2026_01 (event_id, event_type, occurred_at, payload)
                     VALUES (nextval(pg_get_serial_sequence('ev', 'event_id')), 'order', '2026-01-20', '{"sku": "direct", "qty": 7}')""")
        a.execute("UPDATE ev_2026_01 SET payload = '{\"sku\": \"jan\", \"qty\": 100}' WHERE payload ->> 'qty' = '3'")
        a.execute("DELETE FROM ev_2026_01 WHERE payload ->> 'qty' = '4'")
        _matches_scratch(a)
        # A table attached with events in it: they count once.
        a.execute("CREATE TABLE feb (LIKE ev INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
        a.execute("""INSERT INTO feb (event_id, event_key, event_type, occurred_at, payload)
                     VALUES (1000, 'f1', 'order', '2026-02-03', '{"sku": "feb", "qty": 1}'),
                            (1001, 'f2', 'order', '2026-02-04', '{"sku": "feb", "qty": 2}')""")
        a.execute("ALTER TABLE ev ATTACH PARTITION feb FOR VALUES FROM ('2026-02-01') TO ('2026-03-01')")
        _matches_scratch(a)
        with pytest.raises(psycopg.errors.UniqueViolation):
            _insert(a, "now()", key="f1")
        # One whose keys are taken already is refused, and stays out.
        a.execute("CREATE TABLE mar (LIKE ev INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
        a.execute("""INSERT INTO mar (event_id, event_key, event_type, occurred_at, payload)
                     VALUES (2000, 'f2', 'order', '2026-03-03', '{"sku": "mar", "qty": 1}')""")
        with pytest.raises(psycopg.errors.UniqueViolation):
            a.execute("ALTER TABLE ev ATTACH PARTITION mar FOR VALUES FROM ('2026-03-01') TO ('2026-04-01')")
        assert ("mar",) not in [(p[0],) for p in _partitions(a)]
        # TRUNCATE of a partition retracts its events; of the table, all.
        a.execute("TRUNCATE ev_2026_01")
        _matches_scratch(a)
        assert _one(a, "SELECT sum(n) FROM per_sku") == 2
        a.execute("TRUNCATE ev")
        _matches_scratch(a)
        assert a.execute(FROM_VIEW).fetchall() == []


def test_a_partition_made_ahead_takes_over_its_events_from_the_default_partition(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev', partition_interval => '1 day')")
        a.execute(VIEW)
        for days in (6, 6, 7, 30):
            _insert(a, f"now() + interval '{days} days'", sku=f"d{days}", qty=days, key=f"k{days}-{_one(a, 'SELECT count(*) FROM ev')}")
        assert _one(a, "SELECT count(*) FROM ONLY ev_default") == 4
        _matches_scratch(a)
        # One more, which the view has not applied when the partitions are made.
        _insert(a, "now() + interval '7 days'", sku="d7", qty=70, key="pending")
        a.execute("SET eventview.partition_premake = 8")
        a.execute("SELECT eventview.run_maintenance()")
        assert _one(a, "SELECT count(*) FROM ONLY ev_default") == 1
        assert _one(a, "SELECT count(DISTINCT tableoid) FROM ev") == 3
        # The move is no change for any view: the refresh applies the pending insert only.
        assert _one(a, "SELECT eventview.refresh('per_sku')") == 1
        _matches_scratch(a)
        # Moved events keep their keys, and their partitions capture.
        with pytest.raises(psycopg.errors.UniqueViolation):
            _insert(a, "now()", key="k6-0")
        a.execute("UPDATE ev SET payload = payload || '{\"qty\": 60}' WHERE event_key = 'k6-0'")
        assert _one(a, "SELECT eventview.refresh('per_sku')") == 1
        _matches_scratch(a)
        assert _one(a, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'eventview_%' AND NOT tgenabled = 'O'") == 0


def test_prune_drops_partitions_past_retention_once_views_applied_them(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev', retention => '2 hours', partition_interval => '1 hour')")
        # Every partition and event from one instant: statements on both sides of an hour's turn
        # would otherwise put an event outside the partition made for it.
        base = _one(a, "SELECT now()::text")
        hour = "date_bin('1 hour', '{}'::timestamptz - interval '{} hours', '2000-01-01 00:00:00+00')"
        for hours in (5, 4, 3):
            a.execute(f"""CREATE TABLE ev_old{hours} PARTITION OF ev FOR VALUES
                          FROM ({hour.format(base, hours)}) TO ({hour.format(base, hours)} + interval '1 hour')""")
        for hours in (5, 5, 4, 3, 0):
            _insert(a, f"{hour.format(base, hours)} + interval '1 second'", sku=f"h{hours}", qty=hours, key=f"k{hours}-{_one(a, 'SELECT count(*) FROM ev')}")
        _insert(a, "now() - interval '10 days'", sku="old", qty=1)  # in the default partition
        a.execute(VIEW)
        a.execute("UPDATE ev SET payload = payload || '{\"qty\": 50}' WHERE payload ->> 'sku' = 'h5'")
        # An update of old4's event waits in the changelog: its partition stays for now.
        a.execute("UPDATE ev SET payload = payload || '{\"qty\": 40}' WHERE payload ->> 'sku' = 'h4'")
        a.execute("SELECT eventview.refresh('per_sku')")
        a.execute("UPDATE ev SET payload = payload || '{\"qty\": 41}' WHERE payload ->> 'sku' = 'h4'")
        before = a.execute(FROM_VIEW).fetchall()
        # old5's two events and old3's one, with their partitions; the default partition's old one.
        assert _one(a, "SELECT eventview.prune('ev')") == 4
        names = [p[0] for p in _partitions(a)]
        assert "ev_old5" not in names and "ev_old3" not in names and "ev_old4" in names
        # Not a retraction: the view keeps what it applied.
        a.execute("SELECT eventview.refresh('per_sku')")
        after = dict((r[0], r[1:]) for r in a.execute(FROM_VIEW).fetchall())
        assert after["h5"] == dict((r[0], r[1:]) for r in before)["h5"] and after["old"] == (1, 1, 1)
        assert after["h4"] == (1, 41, 41) and after["h3"] == (1, 3, 3)
        assert _one(a, "SELECT eventview.prune('ev')") == 1
        assert "ev_old4" not in [p[0] for p in _partitions(a)]
        # Keys of dropped events may come again.
        _insert(a, "now()", key="k5-0")
        assert _one(a, "SELECT count(*) FROM eventview._keys_1 WHERE event_key LIKE 'k5-%' OR event_key LIKE 'k4-%'") == 1


def test_a_partition_with_events_a_view_needs_cannot_be_dropped_or_detached(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev', partition_interval => '1 day')")
        a.execute("CREATE TABLE ev_jan PARTITION OF ev FOR VALUES FROM ('2026-01-01') TO ('2026-02-01')")
        a.execute(VIEW)
        _insert(a, "'2026-01-05'", sku="jan", qty=5, key="j1")
        _insert(a, "now()", sku="now", qty=1)
        for statement in ["DROP TABLE ev_jan", "ALTER TABLE ev DETACH PARTITION ev_jan"]:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
                a.execute(statement)
            assert "views have not applied all of its events" in str(e.value)
            assert "Refresh the views of" in (e.value.diag.message_hint or "")
        assert _one(a, "SELECT count(*) FROM ev_jan") == 1
        a.execute("SELECT eventview.refresh('per_sku')")
        a.execute("ALTER TABLE ev DETACH PARTITION ev_jan")
        # Detached: its capture is gone, its keys are free, the view keeps its events.
        assert _one(a, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'ev_jan'::regclass") == 0
        log = _one(a, "SELECT count(*) FROM eventview._changes_1")
        a.execute("INSERT INTO ev_jan (event_id, event_type, occurred_at, payload) VALUES (999, 'o', '2026-01-06', '{}')")
        assert _one(a, "SELECT count(*) FROM eventview._changes_1") == log
        _insert(a, "now()", sku="again", key="j1")
        a.execute("SELECT eventview.refresh('per_sku')")
        assert dict((r[0], r[1]) for r in a.execute(FROM_VIEW).fetchall()) == {"jan": 1, "now": 1, "again": 1}
        a.execute("DROP TABLE ev_jan")
        # A partition whose events the views have applied goes.
        part = _one(a, "SELECT tableoid::regclass::text FROM ev WHERE payload ->> 'sku' = 'now'")
        _insert(a, "now()", sku="late")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            a.execute(f"DROP TABLE {part}")
        a.execute("SELECT eventview.refresh('per_sku')")
        a.execute(f"DROP TABLE {part}")
        assert _one(a, "SELECT count(*) FROM eventview._keys_1") == 0


def test_a_partition_dropped_while_producers_write_it_and_views_refresh(db):
    """DROP TABLE of a partition while producers write into it (after writing another partition
    in the same transaction) and a view refreshes: no deadlock, no producer error, and every
    committed event counted once, the dropped partition's included (dropping is not a
    retraction). The drop is tried while the producer writes the partition (refused with 55000
    while the view lacks its newest events), then once the producer writes elsewhere only."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev', partition_interval => '1 day')")
        a.execute("CREATE TABLE ev_jan PARTITION OF ev FOR VALUES FROM ('2026-01-01') TO ('2026-02-01')")
        a.execute(VIEW)
    stop, jan_done = threading.Event(), threading.Event()
    errors = []
    produced = {"jan": 0, "now": 0}

    def produce():
        try:
            with psycopg.connect(db, autocommit=True) as p:
                while not stop.is_set():
                    jan = not jan_done.is_set()
                    with p.transaction():
                        _insert(p, "now()", sku="now")
                        p.execute("SELECT pg_sleep(0.005)")
                        if jan:
                            _insert(p, "'2026-01-05'", sku="jan")
                    produced["now"] += 1
                    produced["jan"] += jan
        except psycopg.Error as e:  # reported below
            errors.append(e)

    def refresh():
        try:
            with psycopg.connect(db, autocommit=True) as r:
                while not stop.is_set():
                    r.execute("SELECT eventview.refresh('per_sku')")
        except psycopg.Error as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=produce), threading.Thread(target=refresh)]
    for t in threads:
        t.start()
    attempts = {"while written": 0, "after": 0}
    try:
        with psycopg.connect(db, autocommit=True) as d:
            for phase, tries in (("while written", 30), ("after", 100)):
                if phase == "after":
                    jan_done.set()
                dropped = False
                for _ in range(tries):
                    attempts[phase] += 1
                    try:
                        with d.transaction():
                            d.execute("SELECT eventview.refresh('per_sku')")
                            d.execute("DROP TABLE ev_jan")
                        dropped = True
                        break
                    except psycopg.errors.ObjectNotInPrerequisiteState:
                        pass
                if dropped:
                    break
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert errors == []
    with psycopg.connect(db, autocommit=True) as a:
        assert _one(a, "SELECT to_regclass('ev_jan')") is None, attempts
        a.execute("SELECT eventview.refresh('per_sku')")
        assert dict((r[0], r[1]) for r in a.execute(FROM_VIEW).fetchall()) == produced
        assert _one(a, "SELECT count(*) FROM ev WHERE payload ->> 'sku' = 'now'") == produced["now"]


def test_a_drop_schema_or_drop_owned_that_takes_a_partition_along_is_checked_as_its_drop_table(db):
    """A partition kept apart from its table (its own schema, another owner, as pg_partman can set
    up) goes with DROP SCHEMA ... CASCADE or DROP OWNED: refused with 55000 while views have not
    applied its events, and its keys freed once it goes."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("DROP ROLE IF EXISTS partition_keeper")
        a.execute("CREATE ROLE partition_keeper")
        try:
            a.execute("SELECT eventview.create_event_table('ev', partition_interval => '1 day')")
            a.execute("CREATE SCHEMA old_parts")
            a.execute("CREATE TABLE old_parts.ev_jan PARTITION OF ev FOR VALUES FROM ('2026-01-01') TO ('2026-02-01')")
            a.execute("CREATE TABLE ev_feb PARTITION OF ev FOR VALUES FROM ('2026-02-01') TO ('2026-03-01')")
            a.execute("ALTER TABLE ev_feb OWNER TO partition_keeper")
            a.execute(VIEW)
            _insert(a, "'2026-01-05'", sku="jan", key="j1")
            _insert(a, "'2026-02-05'", sku="feb", key="f1")
            for statement in ["DROP SCHEMA old_parts CASCADE", "DROP OWNED BY partition_keeper"]:
                with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
                    a.execute(statement)
                assert "views have not applied all of its events" in str(e.value)
                assert "Refresh the views of" in (e.value.diag.message_hint or "")
            assert _one(a, "SELECT count(*) FROM ev") == 2
            # Without CASCADE the schema is not dropped: PostgreSQL's own refusal.
            with pytest.raises(psycopg.errors.DependentObjectsStillExist):
                a.execute("DROP SCHEMA old_parts")
            a.execute("SELECT eventview.refresh('per_sku')")
            a.execute("DROP SCHEMA old_parts CASCADE")
            a.execute("DROP OWNED BY partition_keeper")
            assert _one(a, "SELECT count(*) FROM ev") == 0
            assert _one(a, "SELECT count(*) FROM eventview._keys_1") == 0
            # Dropping is not a retraction; the keys can be sent again.
            _insert(a, "now()", sku="again", key="j1")
            a.execute("SELECT eventview.refresh('per_sku')")
            assert dict((r[0], r[1]) for r in a.execute(FROM_VIEW).fetchall()) == {"jan": 1, "feb": 1, "again": 1}
            # A schema holding the event table itself drops it as DROP TABLE does, unapplied
            # events or not.
            a.execute("CREATE SCHEMA shop")
            a.execute("SELECT eventview.create_event_table('shop.ev2', partition_interval => '1 day')")
            a.execute("""SELECT eventview.create_view('shop.per_type', 'shop.ev2', group_by => '{"t": "event_type"}',
                                                      measures => '{"n": "count(*)"}')""")
            a.execute("INSERT INTO shop.ev2 (event_type, occurred_at, payload) VALUES ('o', now(), '{}')")
            assert _one(a, "SELECT pending_changes FROM eventview.event_tables WHERE name = 'shop.ev2'::regclass") == 1
            a.execute("DROP SCHEMA shop CASCADE")
            assert _one(a, "SELECT count(*) FROM eventview.event_tables") == 1
        finally:
            a.execute("DROP OWNED BY partition_keeper")
            a.execute("DROP ROLE partition_keeper")


def test_a_sub_partitioned_partition_is_checked_leaf_by_leaf_by_prune_drop_table_and_drop_schema(db):
    """A partition partitioned itself: prune leaves it for a later run (NOTICE, no error) while
    a view needs an event of one of its partitions, and so do DROP TABLE and a DROP SCHEMA of the
    schema holding it (55000); a DROP TABLE naming the event table with a partition is the event
    table's drop."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev', retention => '2 hours', partition_interval => '1 hour')")
        a.execute("CREATE SCHEMA old_parts")
        a.execute("""CREATE TABLE old_parts.ev_2020 PARTITION OF ev FOR VALUES FROM ('2020-01-01') TO ('2021-01-01')
                     PARTITION BY RANGE (occurred_at)""")
        a.execute("CREATE TABLE public.ev_2020_h1 PARTITION OF old_parts.ev_2020 FOR VALUES FROM ('2020-01-01') TO ('2020-07-01')")
        a.execute("CREATE TABLE public.ev_2020_h2 PARTITION OF old_parts.ev_2020 FOR VALUES FROM ('2020-07-01') TO ('2021-01-01')")
        a.execute(VIEW)
        _insert(a, "'2020-03-01'", sku="old", qty=1, key="o1")
        _insert(a, "'2020-09-01'", sku="old", qty=2, key="o2")
        notices = []
        a.add_notice_handler(lambda d: notices.append(d.message_primary))
        assert _one(a, "SELECT eventview.prune('ev')") == 0
        assert any("not dropped yet: views have not applied all of its events" in n for n in notices), notices
        for statement in ["DROP TABLE old_parts.ev_2020", "DROP SCHEMA old_parts CASCADE"]:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
                a.execute(statement)
            assert "public.ev_2020_h1" in str(e.value)
        a.execute("SELECT eventview.refresh('per_sku')")
        assert _one(a, "SELECT eventview.prune('ev')") == 2
        assert _one(a, "SELECT to_regclass('public.ev_2020_h2')") is None
        assert _one(a, "SELECT count(*) FROM eventview._keys_1") == 0
        assert dict((r[0], r[1]) for r in a.execute(FROM_VIEW).fetchall()) == {"old": 2}
        # The event table and one of its partitions in one DROP TABLE, with a change pending.
        _insert(a, "now()", sku="new")
        part = _one(a, "SELECT tableoid::regclass::text FROM ev")
        a.execute(f"DROP TABLE ev, {part}")
        assert _one(a, "SELECT count(*) FROM eventview._sources WHERE relid::oid <> 0") == 0


def test_drop_event_table_takes_everything_of_a_partitioned_table(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev', partition_interval => '1 day')")
        a.execute(VIEW)
        _insert(a, "now()", key="k")
        a.execute("SELECT eventview.drop_event_table('ev', cascade => true)")
        assert a.execute("SELECT relname FROM pg_class WHERE relname ~ '^(ev_|_keys_|_changes_)' OR relname = 'ev'").fetchall() == []
        assert _one(a, "SELECT count(*) FROM pg_proc WHERE proname ~ '^_capture_'") == 0


PARTITIONED_ENVELOPE = """event_id bigint GENERATED BY DEFAULT AS IDENTITY,
                          event_key text,
                          event_type text NOT NULL,
                          event_version integer NOT NULL DEFAULT 1,
                          producer text NOT NULL DEFAULT current_user,
                          occurred_at timestamptz NOT NULL DEFAULT now(),
                          ingested_at timestamptz NOT NULL DEFAULT now(),
                          payload jsonb NOT NULL"""


def _has_partman(conn):
    return _one(conn, "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_partman'") == 1


def test_a_table_pg_partman_manages_is_registered_and_kept(db):
    """register_event_table of a table pg_partman partitions by day: rows already there count
    once, also while a producer writes during the registration; partitions pg_partman makes later
    are captured; its retention drops a partition only once the views applied its events (55000
    before), which is not a retraction."""
    with psycopg.connect(db, autocommit=True) as a, psycopg.connect(db, autocommit=True) as producer:
        if not _has_partman(a):
            pytest.skip("pg_partman is not installed for this PostgreSQL (Debian: postgresql-15-partman)")
        a.execute("CREATE SCHEMA partman")
        a.execute("CREATE EXTENSION pg_partman SCHEMA partman")
        a.execute(f"CREATE TABLE public.ev ({PARTITIONED_ENVELOPE}, PRIMARY KEY (event_id, occurred_at)) PARTITION BY RANGE (occurred_at)")
        a.execute("SELECT partman.create_parent('public.ev', 'occurred_at', 'native', 'daily', p_premake => 2)")
        a.execute("""INSERT INTO ev (event_key, event_type, occurred_at, payload)
                     SELECT 'old' || g, 'order', now() - (g % 3) * interval '1 day' - interval '1 minute',
                            jsonb_build_object('sku', 's' || g % 4, 'qty', g) FROM generate_series(1, 60) g""")
        stop = threading.Event()
        errors = []

        def produce():
            try:
                n = 0
                while not stop.is_set():
                    with producer.transaction():
                        for _ in range(3):
                            n += 1
                            _insert(producer, "now()", sku="p", qty=n, key=f"p{n}")
            except psycopg.Error as e:  # reported below
                errors.append(e)

        t = threading.Thread(target=produce)
        t.start()
        try:
            assert _one(a, "SELECT eventview.register_event_table('ev', retention => '1 day')::text") == "ev"
            a.execute(VIEW)
        finally:
            stop.set()
            t.join(30)
        assert errors == []
        _matches_scratch(a)
        with pytest.raises(psycopg.errors.UniqueViolation):
            _insert(a, "now()", key="old5")
        assert _one(a, """SELECT duplicates FROM eventview.ingest('ev', '[{"type": "order", "key": "old7", "payload": {}}]')""") == 1
        # pg_partman makes partitions ahead while views refresh; they are captured.
        a.execute("UPDATE partman.part_config SET premake = 6 WHERE parent_table = 'public.ev'")
        a.execute("SELECT partman.run_maintenance('public.ev')")
        _insert(a, "now() + interval '5 days'", sku="ahead", qty=5)
        part = _one(a, "SELECT tableoid::regclass::text FROM ev WHERE payload ->> 'sku' = 'ahead'")
        assert part != "ev_default"
        assert _one(a, "SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname LIKE 'eventview_%%'", (part,)) == 7
        _matches_scratch(a)
        # Its retention: a partition with an event the view has not applied stays (55000).
        a.execute("UPDATE partman.part_config SET retention = '1 day', retention_keep_table = false WHERE parent_table = 'public.ev'")
        a.execute("UPDATE ev SET payload = payload || '{\"qty\": 1000}' WHERE event_key = 'old2'")  # two days ago
        # (pg_partman catches the 55000 and raises its own error with the message.)
        with pytest.raises(psycopg.Error) as e:
            a.execute("SELECT partman.run_maintenance('public.ev')")
        assert "views have not applied all of its events" in str(e.value)
        a.execute("SELECT eventview.refresh('per_sku')")
        before = a.execute(FROM_VIEW).fetchall()
        events = _one(a, "SELECT count(*) FROM ev")
        a.execute("SELECT partman.run_maintenance('public.ev')")
        assert _one(a, "SELECT count(*) FROM ev") < events
        a.execute("SELECT eventview.refresh('per_sku')")
        assert a.execute(FROM_VIEW).fetchall() == before
        # The keys of the dropped events may come again.
        _insert(a, "now()", sku="again", key="old2")


@pytest.mark.parametrize("table, code, message", [
    (f"CREATE TABLE ev ({PARTITIONED_ENVELOPE}, PRIMARY KEY (event_id, event_type)) PARTITION BY LIST (event_type)", "22023",
     "cannot register public.ev as an event table: it is not partitioned by range on occurred_at"),
    (f"CREATE TABLE ev ({PARTITIONED_ENVELOPE}, PRIMARY KEY (event_id, ingested_at)) PARTITION BY RANGE (ingested_at)", "22023",
     "cannot register public.ev as an event table: it is not partitioned by range on occurred_at"),
    (f"CREATE TABLE ev ({PARTITIONED_ENVELOPE}, PRIMARY KEY (occurred_at, event_id)) PARTITION BY RANGE (occurred_at)", "22023",
     "cannot register public.ev as an event table: no unique index on (event_id, occurred_at)"),
    (f"CREATE TABLE ev ({PARTITIONED_ENVELOPE.replace('payload jsonb NOT NULL', 'payload json NOT NULL')}, "
     "PRIMARY KEY (event_id, occurred_at)) PARTITION BY RANGE (occurred_at)", "22023",
     "cannot register public.ev as an event table: its column payload is json, not jsonb"),
    (f"CREATE TABLE ev ({PARTITIONED_ENVELOPE}, PRIMARY KEY (event_id, occurred_at)) PARTITION BY RANGE (occurred_at); "
     "CREATE TABLE ev_d PARTITION OF ev DEFAULT; "
     "INSERT INTO ev (event_key, event_type, payload) VALUES ('twice', 'o', '{}'), ('twice', 'o', '{}')", "22023",
     "cannot register public.ev as an event table: its event_key 'twice' is not unique"),
])
def test_a_partitioned_table_outside_the_envelope_is_not_registered(db, table, code, message):
    with psycopg.connect(db, autocommit=True) as a:
        for statement in table.split("; "):
            a.execute(statement)
        with pytest.raises(psycopg.Error) as e:
            a.execute("SELECT eventview.register_event_table('ev')")
        assert e.value.sqlstate == code and str(e.value).startswith(message), str(e.value)
        assert _one(a, "SELECT count(*) FROM eventview._sources") == 0
        assert _one(a, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'eventview_%'") == 0


def test_a_partition_is_not_registered_on_its_own(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute(f"CREATE TABLE ev ({PARTITIONED_ENVELOPE}, PRIMARY KEY (event_id, occurred_at)) PARTITION BY RANGE (occurred_at)")
        a.execute("CREATE TABLE ev_d PARTITION OF ev DEFAULT")
        with pytest.raises(psycopg.errors.FeatureNotSupported) as e:
            a.execute("SELECT eventview.register_event_table('ev_d')")
        assert "cannot register public.ev_d: it is a partition of another table" in str(e.value)


def test_a_concurrent_detach_is_checked_before_it_takes_the_partition_away(db):
    """DETACH PARTITION ... CONCURRENTLY (of a table without a default partition) commits the
    partition out of the table's reads in its first step: it is refused before that step while a
    view has not applied the partition's events, and goes, capture and keys included, after."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute(f"CREATE TABLE ev ({PARTITIONED_ENVELOPE}, PRIMARY KEY (event_id, occurred_at)) PARTITION BY RANGE (occurred_at)")
        a.execute("CREATE TABLE ev_jan PARTITION OF ev FOR VALUES FROM ('2026-01-01') TO ('2026-02-01')")
        a.execute("CREATE TABLE ev_feb PARTITION OF ev FOR VALUES FROM ('2026-02-01') TO ('2026-03-01')")
        a.execute("SELECT eventview.register_event_table('ev')")
        a.execute(VIEW)
        _insert(a, "'2026-01-05'", sku="jan", key="j1")
        _insert(a, "'2026-02-05'", sku="feb", key="f1")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            a.execute("ALTER TABLE ev DETACH PARTITION ev_jan CONCURRENTLY")
        assert _one(a, "SELECT count(*) FROM pg_inherits WHERE inhrelid = 'ev_jan'::regclass AND NOT inhdetachpending") == 1
        _matches_scratch(a)
        a.execute("ALTER TABLE ev DETACH PARTITION ev_jan CONCURRENTLY")
        assert _one(a, "SELECT count(*) FROM pg_inherits WHERE inhrelid = 'ev_jan'::regclass") == 0
        assert _one(a, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'ev_jan'::regclass") == 0
        assert a.execute("SELECT event_key FROM eventview._keys_1").fetchall() == [("f1",)]
        a.execute("INSERT INTO ev_jan (event_id, event_type, occurred_at, payload) VALUES (999, 'o', '2026-01-06', '{}')")
        a.execute("SELECT eventview.refresh('per_sku')")
        assert dict((r[0], r[1]) for r in a.execute(FROM_VIEW).fetchall()) == {"jan": 1, "feb": 1}
