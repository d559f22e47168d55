"""Changelogs pruned by whole segments (src/changelog.rs): a changelog is partitioned by range on
its record number; prune makes the next segment ahead of the records, empties (TRUNCATE) a
complete segment once every view has applied it and it is past delta_retention, and drops it at
the next run. Records no whole segment takes along (a segment still filling, the default
partition) go by the batched DELETE.

Every test sets `eventview.changelog_segment_min` low so that a few hundred records fill
segments. `_changelog_segments.made_at` is moved back where a test needs a segment to be past
delta_retention without waiting for it (as the differential test ages changelog records).
"""

import threading
import time

import psycopg

SEGMENT_MIN = 10


def _one(conn, sql, params=None):
    return conn.execute(sql, params).fetchone()[0]


def _connect(db, **kw):
    conn = psycopg.connect(db, autocommit=True, **kw)
    conn.execute(f"SET eventview.changelog_segment_min = {SEGMENT_MIN}")
    return conn


def _segments(conn):
    """(name, bound, records) of every partition of the changelog of source 1, in bound order."""
    rows = conn.execute(
        """SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid)
           FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
           WHERE i.inhparent = 'eventview._changes_1'::regclass""").fetchall()
    out = []
    for name, bound in rows:
        records = _one(conn, f"SELECT count(*) FROM ONLY eventview.{name}")
        out.append((name, bound, records))
    return sorted(out, key=lambda r: (r[1] != "DEFAULT", int(r[1].split("'")[1]) if r[1] != "DEFAULT" else 0))


def _insert(conn, n, start=0):
    """n events, one changelog record each (one INSERT per event)."""
    conn.execute(f"""DO $$ BEGIN
                       FOR i IN {start + 1}..{start + n} LOOP
                         INSERT INTO ev (event_type, payload) VALUES ('t', jsonb_build_object('k', i % 3, 'x', i));
                       END LOOP; END $$""")


def _age_segments(conn, by="2 hours"):
    conn.execute(f"UPDATE eventview._changelog_segments SET made_at = made_at - interval '{by}'")


SCRATCH = "SELECT payload->>'k' AS k, count(*), sum((payload->>'x')::numeric) FROM ev GROUP BY 1 ORDER BY 1"
VIEW = "SELECT k, n, s FROM v ORDER BY k"


def _create(conn, delta_retention="1 hour"):
    conn.execute(f"SELECT eventview.create_event_table('ev', delta_retention => '{delta_retention}')")
    conn.execute("""SELECT eventview.create_view('v', 'ev', group_by => '{"k": "$.k"}',
                      measures => '{"n": "count(*)", "s": "sum($.x)"}')""")


def test_a_new_changelog_is_partitioned_with_a_default_partition_and_a_first_segment(db):
    with _connect(db) as a:
        _create(a)
        assert _one(a, "SELECT relkind::text FROM pg_class WHERE oid = 'eventview._changes_1'::regclass") == "p"
        assert _segments(a) == [
            ("_changes_1_default", "DEFAULT", 0),
            ("_changes_1_from_1", f"FOR VALUES FROM ('1') TO ('{1 + 10 * SEGMENT_MIN}')", 0),
        ]
        # Made at run time: none of them is a member of the extension (DROP EXTENSION keeps
        # them, pg_dump dumps them), and no one but the owner reads them.
        assert _one(a, """SELECT count(*) FROM pg_depend d JOIN pg_class c ON c.oid = d.objid
                          WHERE d.classid = 'pg_class'::regclass AND d.deptype = 'e'
                            AND c.relname LIKE '\\_changes\\_1%'""") == 0
        assert _one(a, """SELECT count(*) FROM pg_class c, aclexplode(c.relacl) x
                          WHERE c.relname LIKE '\\_changes\\_1%' AND x.grantee = 0""") == 0
        # The id arrays of inserts stay uncompressed in every partition.
        assert {r[0] for r in a.execute("""SELECT a.attstorage::text FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                                           WHERE c.relname LIKE '\\_changes\\_1%' AND a.attname = 'event_ids'""")} == {"e"}


def test_prune_makes_the_next_segment_ahead_of_the_records(db):
    with _connect(db) as a:
        _create(a, delta_retention="0 seconds")
        first_hi = 1 + 10 * SEGMENT_MIN
        _insert(a, 5)
        a.execute("SELECT eventview.prune('ev')")
        # One segment wholly ahead of the records: as wide as the one before (no rate known yet).
        assert [s[1] for s in _segments(a)][1:] == [
            f"FOR VALUES FROM ('1') TO ('{first_hi}')",
            f"FOR VALUES FROM ('{first_hi}') TO ('{2 * first_hi - 1}')"]
        a.execute("SELECT eventview.prune('ev')")
        assert len(_segments(a)) == 3
        # Records reach the last segment: the next one is sized for the rate since that segment
        # was made (150 records in 10 seconds, 300 seconds a segment at this delta_retention's
        # span (a quarter of it, at least five minutes): 4500).
        _insert(a, first_hi + 49 - 5, start=5)
        next_seq = first_hi + 50
        a.execute("UPDATE eventview._changelog_segments SET made_at = now() - interval '10 seconds', made_seq = %s WHERE lo = %s",
                  [next_seq - 150, first_hi])
        a.execute("SELECT eventview.prune('ev')")
        bound = _segments(a)[-1][1]
        lo, hi = (int(x) for x in bound.split("'")[1::2])
        # (The prune's clock runs a little past the 10 seconds. The segment starts past the
        # record numbers that the server's processes could hold on their way into the default
        # partition: with segments this narrow, not right after the last one.)
        assert lo >= 2 * first_hi - 1 and 4400 <= hi - lo <= 4500, bound
        a.execute("SELECT eventview.refresh('v')")
        assert a.execute(VIEW).fetchall() == a.execute(SCRATCH).fetchall()


def test_an_applied_segment_past_delta_retention_is_emptied_then_dropped(db):
    with _connect(db) as a:
        _create(a, delta_retention="1 hour")
        first_hi = 1 + 10 * SEGMENT_MIN
        _insert(a, 1)
        a.execute("SELECT eventview.prune('ev')")  # the second segment
        _insert(a, first_hi + 20 - 2, start=1)  # the first segment full, 20 records in the second
        a.execute("SELECT eventview.prune('ev')")  # the third
        assert _one(a, "SELECT eventview.refresh('v')") == first_hi + 19
        # Not past delta_retention yet: nothing goes.
        assert _one(a, "SELECT eventview.prune('ev')") == 0
        _age_segments(a)
        # The complete, applied segment is emptied (its storage too: no dead rows left); the
        # one filling keeps its records, younger than delta_retention.
        assert _one(a, "SELECT eventview.prune('ev')") == first_hi - 1
        segments = _segments(a)
        assert [(s[0], s[2]) for s in segments[:3]] == [
            ("_changes_1_default", 0), ("_changes_1_from_1", 0), (f"_changes_1_from_{first_hi}", 20)]
        assert _one(a, "SELECT pg_relation_size('eventview._changes_1_from_1')") == 0
        # Dropped at the next run.
        a.execute("SELECT eventview.prune('ev')")
        assert "_changes_1_from_1" not in [s[0] for s in _segments(a)]
        assert _one(a, "SELECT count(*) FROM eventview._changelog_segments WHERE lo = 1") == 0
        _insert(a, 7, start=first_hi + 19)
        a.execute("UPDATE ev SET payload = payload || '{\"x\": 1000}' WHERE event_id = 3")
        a.execute("DELETE FROM ev WHERE event_id = 4")
        a.execute("SELECT eventview.refresh('v')")
        assert a.execute(VIEW).fetchall() == a.execute(SCRATCH).fetchall()


def test_a_segment_some_view_has_not_applied_stays(db):
    with _connect(db) as a:
        _create(a, delta_retention="0 seconds")
        a.execute("SELECT eventview.create_view('w', 'ev')")
        first_hi = 1 + 10 * SEGMENT_MIN
        _insert(a, 1)
        a.execute("SELECT eventview.prune('ev')")
        _insert(a, first_hi + 3, start=1)
        a.execute("SELECT eventview.prune('ev')")
        a.execute("SELECT eventview.refresh('v')")
        # w has applied nothing: neither the segment nor a record goes.
        assert _one(a, "SELECT eventview.prune('ev')") == 0
        assert _segments(a)[1][2] == first_hi - 1
        assert _one(a, "SELECT eventview.refresh('w')") == first_hi + 4
        # The complete segment goes whole, the applied records of the one filling by DELETE.
        assert _one(a, "SELECT eventview.prune('ev')") == first_hi + 4
        assert a.execute(VIEW).fetchall() == a.execute(SCRATCH).fetchall()


def test_records_past_every_segment_go_to_the_default_partition(db):
    """Without a prune to make segments ahead, records land in the default partition: captured
    and applied like any, pruned by DELETE; the next segment starts at the next record."""
    with _connect(db) as a:
        _create(a, delta_retention="0 seconds")
        first_hi = 1 + 10 * SEGMENT_MIN
        _insert(a, first_hi + 30)
        assert _segments(a)[0] == ("_changes_1_default", "DEFAULT", 31)
        a.execute("SELECT eventview.refresh('v')")
        assert a.execute(VIEW).fetchall() == a.execute(SCRATCH).fetchall()
        assert _one(a, "SELECT eventview.prune('ev')") == first_hi + 30
        # From the next record number on (no record is on its way meanwhile: making a segment
        # holds captures back).
        assert _segments(a)[-1][1].startswith(f"FOR VALUES FROM ('{first_hi + 31}')")
        _insert(a, 3, start=first_hi + 30)
        a.execute("SELECT eventview.refresh('v')")
        assert a.execute(VIEW).fetchall() == a.execute(SCRATCH).fetchall()
        # The 3 records, in the new segment; the first segment, emptied by DELETE, is dropped.
        assert _one(a, "SELECT eventview.prune('ev')") == 3
        assert "_changes_1_from_1" not in [s[0] for s in _segments(a)]


def test_a_segment_another_session_reads_is_left_to_a_later_run(db):
    """Emptying a segment waits at most 100 ms for a session that holds it (here a reader with
    its transaction open), then leaves it to a later run with a NOTICE."""
    with _connect(db) as a, psycopg.connect(db) as b:
        _create(a, delta_retention="0 seconds")
        first_hi = 1 + 10 * SEGMENT_MIN
        _insert(a, 1)
        a.execute("SELECT eventview.prune('ev')")
        _insert(a, first_hi + 10, start=1)
        a.execute("SELECT eventview.prune('ev')")  # the segment after the next: the first is complete
        a.execute("SELECT eventview.refresh('v')")
        _age_segments(a)
        b.execute("SELECT count(*) FROM eventview._changes_1_from_1")  # B's transaction stays open
        notices = []
        a.add_notice_handler(lambda d: notices.append(d.message_primary))
        started = time.monotonic()
        assert _one(a, "SELECT eventview.prune('ev')") == 0
        assert time.monotonic() - started < 5
        assert any("not pruned: another session holds it" in n for n in notices), notices
        b.commit()
        assert _one(a, "SELECT eventview.prune('ev')") == first_hi + 11
        a.execute("SELECT eventview.prune('ev')")
        assert "_changes_1_from_1" not in [s[0] for s in _segments(a)]
        _insert(a, 5, start=first_hi + 11)
        a.execute("SELECT eventview.refresh('v')")
        assert a.execute(VIEW).fetchall() == a.execute(SCRATCH).fetchall()


def test_an_open_writer_delays_the_next_segment_and_loses_nothing(db):
    """Making a segment holds captures back (a statement that started before it is attached
    would route records of its range to the default partition): it waits at most 100 ms for the
    open writers, then leaves it to a later run; the records meanwhile go to the default
    partition."""
    with _connect(db) as a, psycopg.connect(db) as b:
        _create(a, delta_retention="0 seconds")
        first_hi = 1 + 10 * SEGMENT_MIN
        b.execute("""INSERT INTO ev (event_type, payload) VALUES ('t', '{"k": 1, "x": 500}')""")
        _insert(a, first_hi + 20)
        notices = []
        a.add_notice_handler(lambda d: notices.append(d.message_primary))
        a.execute("SELECT eventview.prune('ev')")
        assert any("no changelog segment made" in n for n in notices), notices
        assert [s[1] for s in _segments(a)] == ["DEFAULT", f"FOR VALUES FROM ('1') TO ('{first_hi}')"]
        b.commit()
        a.execute("SELECT eventview.prune('ev')")
        next_seq = first_hi + 22
        assert _segments(a)[-1][1].startswith(f"FOR VALUES FROM ('{next_seq}')")
        _insert(a, 3, start=first_hi + 20)
        assert _segments(a)[-1][2] == 3
        a.execute("SELECT eventview.refresh('v')")
        assert a.execute(VIEW).fetchall() == a.execute(SCRATCH).fetchall()
        a.execute("SELECT eventview.prune('ev')")
        a.execute("SELECT eventview.prune('ev')")
        assert _one(a, "SELECT count(*) FROM eventview._changes_1") == 0


def test_rotation_waits_for_a_read_committed_run(db):
    with _connect(db) as a:
        _create(a, delta_retention="0 seconds")
        _insert(a, 5)
        a.execute("SELECT eventview.refresh('v')")
        notices = []
        a.add_notice_handler(lambda d: notices.append(d.message_primary))
        with a.transaction():
            a.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            # The applied records go by DELETE; no segment is made or dropped.
            assert _one(a, "SELECT eventview.prune('ev')") == 5
        assert any("rotation runs in READ COMMITTED transactions only" in n for n in notices), notices
        assert len(_segments(a)) == 2


def test_producers_rotation_and_refreshes_at_once_lose_nothing(db):
    """Four producers write single-row and multi-row inserts, updates and deletes while one session
    prunes with segments of a few records and another refreshes: after the last refresh the view
    equals its aggregate from scratch, and every applied segment went."""
    stop = threading.Event()
    errors = []
    with _connect(db) as a:
        _create(a, delta_retention="0 seconds")

    def producer(n):
        try:
            with psycopg.connect(db, autocommit=True) as c:
                i = 0
                while not stop.is_set():
                    i += 1
                    if i % 7 == 0:
                        c.execute("""INSERT INTO ev (event_type, payload)
                                     SELECT 't', jsonb_build_object('k', g % 3, 'x', g) FROM generate_series(1, 5) g""")
                    elif i % 11 == 0:
                        c.execute("UPDATE ev SET payload = payload || '{\"x\": 1}' WHERE event_id = (SELECT max(event_id) - 3 FROM ev)")
                    elif i % 13 == 0:
                        c.execute("DELETE FROM ev WHERE event_id = (SELECT max(event_id) - 5 FROM ev)")
                    else:
                        c.execute("INSERT INTO ev (event_type, payload) VALUES ('t', jsonb_build_object('k', %s %% 3, 'x', %s))",
                                  [i, n])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"producer {n}: {e!r}")

    def maintainer(sql):
        try:
            with _connect(db) as c:
                while not stop.is_set():
                    c.execute(sql)
                    time.sleep(0.01)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"{sql}: {e!r}")

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=maintainer, args=("SELECT eventview.prune('ev')",)),
                threading.Thread(target=maintainer, args=("SELECT eventview.refresh('v')",))]
    for t in threads:
        t.start()
    time.sleep(6)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors
    with _connect(db) as a:
        a.execute("SELECT eventview.refresh('v')")
        assert a.execute(VIEW).fetchall() == a.execute(SCRATCH).fetchall()
        for _ in range(3):
            a.execute("SELECT eventview.prune('ev')")
        assert _one(a, "SELECT count(*) FROM eventview._changes_1") == 0
        # Segments were made and dropped along the way; only the filling ones remain.
        assert _one(a, "SELECT max(lo) FROM eventview._changelog_segments") > 1 + 10 * SEGMENT_MIN
        assert "_changes_1_from_1" not in [s[0] for s in _segments(a)]
        assert len(_segments(a)) <= 4


def test_delta_retention_keeps_a_complete_applied_segment_until_it_passes(db):
    with _connect(db) as a:
        _create(a, delta_retention="1 day")
        first_hi = 1 + 10 * SEGMENT_MIN
        _insert(a, first_hi + 2)
        a.execute("SELECT eventview.prune('ev')")
        a.execute("SELECT eventview.refresh('v')")
        _age_segments(a, "23 hours")
        assert _one(a, "SELECT eventview.prune('ev')") == 0
        _age_segments(a, "2 hours")
        assert _one(a, "SELECT eventview.prune('ev')") == first_hi - 1
