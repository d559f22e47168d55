"""pg_dump -Fc of a database using pg_eventview, pg_restore into a new database: no errors, and
the restored database carries on (contract section 6, "Dump and restore")."""

import subprocess
from pathlib import Path

import psycopg
import pytest

BIN = "/usr/lib/postgresql/15/bin"
CLUSTER_SH = Path(__file__).resolve().parent.parent / "scripts" / "cluster.sh"


def rows(conn, sql):
    return conn.execute(sql).fetchall()


def run_client(cluster, *cmd):
    full = [*cmd, "-h", cluster.dir, "-p", str(cluster.port), "-U", "postgres"]
    return subprocess.run(full, capture_output=True, text=True)


@pytest.mark.parametrize("jobs", [1, 2])
def test_dump_restore_with_pending_changes(cluster, new_db, tmp_path, jobs):
    """Serially and in parallel (pg_restore -j loads the extension's tables in any order)."""
    src_info = new_db("_src")
    src_name = src_info.rsplit("dbname=", 1)[1]
    with cluster.connect(src_name) as c:
        c.execute("SET TimeZone = 'UTC'")
        c.execute("CREATE SCHEMA shop")
        c.execute("SELECT eventview.create_event_table('shop.events', retention => '400 days')")
        c.execute("SELECT eventview.define_field('shop.events', 'sku', '$.sku')")
        c.execute("SELECT eventview.define_field('shop.events', 'sku', '$.item.sku', version => 2)")
        c.execute("""SELECT eventview.create_view('shop.by_sku', 'shop.events', group_by => '{"sku": "sku"}',
                     measures => '{"n": "count(*)", "q": "sum($.qty)", "hi": "max($.qty)", "u": "count_distinct($.user)"}',
                     time_bucket => '1 day')""")
        c.execute("SELECT eventview.schedule('shop.by_sku', '5 minutes')")
        c.execute("""INSERT INTO shop.events (event_type, event_version, occurred_at, payload)
                     SELECT 'cart', 1 + i % 2, '2026-11-01'::timestamptz + i * interval '1 hour',
                            CASE WHEN i % 2 = 0 THEN jsonb_build_object('sku', 's' || i % 7, 'qty', i % 5, 'user', i % 3)
                                 ELSE jsonb_build_object('item', jsonb_build_object('sku', 's' || i % 7), 'qty', i % 5, 'user', i % 3) END
                     FROM generate_series(1, 300) i""")
        c.execute("INSERT INTO shop.events (event_type, payload) VALUES ('cart', '{\"sku\": \"bad\", \"qty\": \"x\"}')")
        c.execute("SELECT eventview.refresh('shop.by_sku')")
        # Pending at dump time: inserts, an update and a delete not yet applied.
        c.execute("""INSERT INTO shop.events (event_type, occurred_at, payload)
                     SELECT 'cart', '2026-11-20'::timestamptz + i * interval '1 hour', jsonb_build_object('sku', 'p' || i % 3, 'qty', i)
                     FROM generate_series(1, 40) i""")
        c.execute("UPDATE shop.events SET payload = payload || '{\"qty\": 100}' WHERE event_id = 5")
        c.execute("DELETE FROM shop.events WHERE event_id = 6")
        pending = rows(c, "SELECT pending_changes FROM eventview.views")[0][0]
        assert pending == 42
        before_view = rows(c, "SELECT * FROM shop.by_sku ORDER BY 1, 2")
        before_fields = rows(c, "SELECT field, event_type, event_version, path FROM eventview._fields ORDER BY 1, 2, 3")
        before_quarantine = rows(c, "SELECT view_name, event_id, reason FROM eventview.quarantine ORDER BY id")
        before_observed = rows(c, "SELECT event_type, event_version, path, json_type, seen FROM eventview.observed_fields ORDER BY 1, 2, 3, 4")
        before_drift = rows(c, "SELECT event_type, event_version, path, change FROM eventview.drift ORDER BY id")

    dump = tmp_path / "db.dump"
    r = run_client(cluster, f"{BIN}/pg_dump", "-Fc", "-f", str(dump), "-d", src_name)
    assert r.returncode == 0, r.stderr
    with cluster.connect() as c:
        c.execute(f'CREATE DATABASE "it_restored_{jobs}"')
    try:
        r = run_client(cluster, f"{BIN}/pg_restore", "--exit-on-error", "-j", str(jobs), "-d", f"it_restored_{jobs}", str(dump))
        assert r.returncode == 0 and r.stderr == "", r.stderr
        with cluster.connect(f"it_restored_{jobs}") as c:
            c.execute("SET TimeZone = 'UTC'")
            assert rows(c, "SELECT * FROM shop.by_sku ORDER BY 1, 2") == before_view
            assert rows(c, "SELECT pending_changes FROM eventview.views")[0][0] == 42
            assert rows(c, "SELECT field, event_type, event_version, path FROM eventview._fields ORDER BY 1, 2, 3") == before_fields
            assert rows(c, "SELECT view_name, event_id, reason FROM eventview.quarantine ORDER BY id") == before_quarantine
            assert rows(c, "SELECT event_type, event_version, path, json_type, seen FROM eventview.observed_fields ORDER BY 1, 2, 3, 4") == before_observed
            assert rows(c, "SELECT event_type, event_version, path, change FROM eventview.drift ORDER BY id") == before_drift
            assert rows(c, "SELECT schedule FROM eventview.views")[0][0] is not None
            # Pending changes are applied exactly once; capture continues.
            assert rows(c, "SELECT eventview.refresh('shop.by_sku')")[0][0] == 42
            assert rows(c, "SELECT eventview.refresh('shop.by_sku')")[0][0] == 0
            c.execute("INSERT INTO shop.events (event_type, payload) VALUES ('cart', '{\"sku\": \"new\", \"qty\": 1, \"user\": 9}')")
            assert rows(c, "SELECT eventview.refresh('shop.by_sku')")[0][0] == 1
            # New quarantine and drift rows take ids after the restored ones.
            c.execute("""INSERT INTO shop.events (event_type, payload) VALUES
                         ('cart', '{"sku": "bad2", "qty": "y"}'), ('cart', '{"sku": "n", "qty": 2, "brand_new": true}')""")
            assert rows(c, "SELECT eventview.refresh('shop.by_sku')")[0][0] == 2
            assert rows(c, "SELECT count(*), count(DISTINCT id) FROM eventview.quarantine")[0] == (len(before_quarantine) + 1,) * 2
            assert rows(c, "SELECT count(*) FROM eventview.drift WHERE path = '$.brand_new' AND change = 'added'")[0][0] == 1
            scratch = """
                SELECT date_bin('1 day', occurred_at, '2000-01-01 00:00:00+00'),
                       CASE WHEN event_version = 2 THEN payload #>> '{item,sku}' ELSE payload ->> 'sku' END,
                       count(*), sum((payload->'qty')::numeric), max((payload->'qty')::numeric),
                       count(DISTINCT payload->'user')
                FROM shop.events WHERE jsonb_typeof(payload->'qty') = 'number'
                GROUP BY 1, 2"""
            diff = rows(c, f"SELECT count(*) FROM ((SELECT * FROM shop.by_sku EXCEPT ALL {scratch}) UNION ALL ({scratch} EXCEPT ALL SELECT * FROM shop.by_sku)) d")
            assert diff[0][0] == 0
    finally:
        with cluster.connect() as c:
            c.execute(f'DROP DATABASE IF EXISTS "it_restored_{jobs}" WITH (FORCE)')


def test_restore_into_a_cluster_whose_transactions_are_behind(cluster, new_db, tmp_path):
    """A dump restored on a new server, whose transaction counter is far behind the old one's:
    the positions the dump carries are transaction ids of the old server, so without renumbering
    every new change would count as applied already. The restore renumbers them (the event
    trigger on the capture triggers' creation): views at different positions carry on exactly,
    pending inserts, updates and deletes are applied once, new changes too, and so does the
    field observer."""
    src_info = new_db("_ahead")
    src_name = src_info.rsplit("dbname=", 1)[1]
    scratch = """SELECT payload->>'k', count(*), max((payload->>'x')::numeric), count(DISTINCT payload->'x')
                 FROM ev GROUP BY 1"""
    with cluster.connect(src_name) as c:
        # Put the old server's counter well ahead of a new cluster's.
        c.execute("CREATE PROCEDURE burn(n int) LANGUAGE plpgsql AS $$ BEGIN FOR i IN 1..n LOOP "
                  "PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$")
        c.execute("CALL burn(4000)")
        c.execute("DROP PROCEDURE burn")
        c.execute("SELECT eventview.create_event_table('ev')")
        for v in ("va", "vb"):
            c.execute(f"""SELECT eventview.create_view('{v}', 'ev', group_by => '{{"k": "$.k"}}',
                          measures => '{{"n": "count(*)", "hi": "max($.x)", "d": "count_distinct($.x)"}}')""")
        add = "INSERT INTO ev (event_type, payload) SELECT 'a', jsonb_build_object('k', i %% 3, 'x', i) FROM generate_series(%s::int, %s::int) i"
        c.execute(add, (1, 20))
        c.execute("SELECT eventview.refresh('va')")
        c.execute(add, (21, 30))
        c.execute("UPDATE ev SET payload = payload || '{\"x\": 100}' WHERE payload @> '{\"x\": 2}'")
        c.execute("DELETE FROM ev WHERE payload @> '{\"x\": 29}'")
        c.execute("SELECT eventview.refresh('vb')")
        c.execute(add, (31, 35))
        pending = dict(rows(c, "SELECT name::text, pending_changes FROM eventview.views"))
        assert pending == {"va": 17, "vb": 5}
        src_xid = rows(c, "SELECT pg_current_xact_id()::text::bigint")[0][0]

    dump = tmp_path / "db.dump"
    r = run_client(cluster, f"{BIN}/pg_dump", "-Fc", "-f", str(dump), "-d", src_name)
    assert r.returncode == 0, r.stderr
    observed = "SELECT event_type, event_version, path, json_type, seen FROM eventview.observed_fields ORDER BY 1, 2, 3, 4"

    def carry_on(c, where):
        """The same changes after the dump, on the old server and on each restore."""
        assert dict(rows(c, "SELECT name::text, pending_changes FROM eventview.views")) == pending, where
        assert rows(c, "SELECT eventview.refresh('va')")[0][0] == 17, where
        assert rows(c, "SELECT eventview.refresh('vb')")[0][0] == 5, where
        c.execute(add, (36, 39))
        c.execute("DELETE FROM ev WHERE payload @> '{\"x\": 5}'")
        assert rows(c, "SELECT eventview.refresh_all()")[0][0] == 10, where
        for v in ("va", "vb"):
            diff = rows(c, f"SELECT count(*) FROM ((SELECT * FROM {v} EXCEPT ALL {scratch}) "
                           f"UNION ALL ({scratch} EXCEPT ALL SELECT * FROM {v})) d")
            assert diff[0][0] == 0, (where, v)
        assert rows(c, "SELECT sum(pending_changes) FROM eventview.views")[0][0] == 0, where
        return rows(c, observed)

    with psycopg.connect(src_info, autocommit=True) as c:
        want_observed = carry_on(c, "old server")
    assert want_observed

    new_dir, new_port = f"{cluster.dir}_behind", cluster.port + 17
    subprocess.run(["bash", str(CLUSTER_SH), "start", new_dir, str(new_port)], check=True)
    try:
        info = f"host={new_dir} port={new_port} user=postgres"

        def restore(db, *steps):
            with psycopg.connect(info + " dbname=postgres", autocommit=True) as c:
                c.execute(f"CREATE DATABASE {db}")
            warnings = []
            for step in steps:
                r = subprocess.run([f"{BIN}/pg_restore", "--exit-on-error", "-h", new_dir, "-p", str(new_port),
                                    "-U", "postgres", "-d", db, *step, str(dump)], capture_output=True, text=True)
                assert r.returncode == 0, r.stderr
                warnings += [line for line in r.stderr.splitlines() if line.strip()]
            return warnings

        # A serial restore: renumbered by the restore itself.
        assert restore("serial", []) == []
        with psycopg.connect(f"{info} dbname=serial", autocommit=True) as c:
            assert rows(c, "SELECT pg_current_xact_id()::text::bigint")[0][0] < src_xid - 2000
            assert carry_on(c, "serial") == want_observed
        # The triggers created by a parallel restore (several sessions: other tables may still be
        # loading) leave the positions alone (with a WARNING in the server log: pg_restore does
        # not show its workers' warnings); refresh refuses them; renumbered once the restore is
        # done, all carries on exactly.
        restore("parallel", ["-j", "2"])
        with psycopg.connect(f"{info} dbname=parallel", autocommit=True) as c:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
                c.execute("SELECT eventview.refresh('va')")
            assert rows(c, "SELECT eventview._rebase_positions(source_id) FROM eventview._sources")[0][0] is True
            assert carry_on(c, "parallel") == want_observed
    finally:
        subprocess.run(["bash", str(CLUSTER_SH), "stop", new_dir], check=False)
        subprocess.run(["rm", "-rf", new_dir], check=False)


def test_dump_restore_of_a_registered_table(cluster, new_db, tmp_path):
    """A table of the user's own, registered with events in it and changes pending at dump
    time: restored, its capture (the native insert capture included) and its view carry on."""
    src_name = new_db("_registered").rsplit("dbname=", 1)[1]
    with cluster.connect(src_name) as c:
        c.execute("""CREATE TABLE public.orders (
                         tenant integer DEFAULT 1,
                         event_id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
                         event_key text UNIQUE,
                         event_type text NOT NULL,
                         event_version integer NOT NULL DEFAULT 1,
                         producer text NOT NULL DEFAULT current_user,
                         occurred_at timestamptz NOT NULL DEFAULT now(),
                         ingested_at timestamptz NOT NULL DEFAULT now(),
                         payload jsonb NOT NULL)""")
        c.execute("""INSERT INTO orders (event_type, payload)
                     SELECT 'o', jsonb_build_object('sku', 's' || g % 4, 'qty', g) FROM generate_series(1, 50) g""")
        c.execute("SELECT eventview.register_event_table('orders')")
        c.execute("""SELECT eventview.create_view('per_sku', 'orders', group_by => '{"sku": "$.sku"}',
                                                   measures => '{"n": "count(*)", "top": "max($.qty)"}')""")
        c.execute("""INSERT INTO orders (event_type, payload)
                     SELECT 'o', jsonb_build_object('sku', 's' || g % 4, 'qty', 100 + g) FROM generate_series(1, 8) g""")
        c.execute("DELETE FROM orders WHERE event_id = 3")
    dump = tmp_path / "registered.dump"
    r = run_client(cluster, f"{BIN}/pg_dump", "-Fc", "-f", str(dump), "-d", src_name)
    assert r.returncode == 0, r.stderr
    with cluster.connect() as c:
        c.execute('CREATE DATABASE "it_restored_registered"')
    try:
        r = run_client(cluster, f"{BIN}/pg_restore", "--exit-on-error", "-d", "it_restored_registered", str(dump))
        assert r.returncode == 0 and r.stderr == "", r.stderr
        with cluster.connect("it_restored_registered") as c:
            assert rows(c, "SELECT l.lanname::text, p.prosrc FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
                           "WHERE p.proname ~ '^_capture_[0-9]+_insert$'") == [("c", "capture_inserted_rows")]
            assert rows(c, "SELECT eventview.refresh('per_sku')")[0][0] == 9
            c.execute("""INSERT INTO orders (event_type, payload) VALUES ('o', '{"sku": "s1", "qty": 1000}')""")
            assert rows(c, "SELECT eventview.refresh('per_sku')")[0][0] == 1
            scratch = """SELECT payload ->> 'sku', count(*), max((payload -> 'qty')::numeric) FROM orders GROUP BY 1"""
            assert rows(c, "SELECT sku, n, top FROM per_sku ORDER BY 1") == rows(c, scratch + " ORDER BY 1")
    finally:
        with cluster.connect() as c:
            c.execute('DROP DATABASE IF EXISTS "it_restored_registered" WITH (FORCE)')


@pytest.mark.parametrize("jobs", [1, 2])
def test_dump_restore_of_a_partitioned_table(cluster, new_db, tmp_path, jobs):
    """A partitioned event table with events in several partitions and its default one, keys,
    and changes pending at dump time: restored (serially and in parallel), the restore captures
    none of its own loading, its pending changes are applied once, capture goes on in every
    partition, keys stay unique across partitions and partitions are still made ahead."""
    src_name = new_db("_partitioned").rsplit("dbname=", 1)[1]
    restored = f"it_restored_partitioned_{jobs}"
    with cluster.connect(src_name) as c:
        c.execute("SELECT eventview.create_event_table('ev', partition_interval => '1 day')")
        c.execute("CREATE TABLE ev_old PARTITION OF ev FOR VALUES FROM ('2026-01-01') TO ('2026-01-02')")
        c.execute("""SELECT eventview.create_view('per_sku', 'ev', group_by => '{"sku": "$.sku"}',
                                                   measures => '{"n": "count(*)", "top": "max($.qty)"}')""")
        c.execute("""INSERT INTO ev (event_key, event_type, occurred_at, payload)
                     SELECT 'k' || g, 'o', CASE g % 3 WHEN 0 THEN now() WHEN 1 THEN '2026-01-01 12:00+00'
                                                      ELSE '2020-06-01' END,
                            jsonb_build_object('sku', 's' || g % 4, 'qty', g) FROM generate_series(1, 60) g""")
        c.execute("SELECT eventview.refresh('per_sku')")
        c.execute("UPDATE ev SET payload = payload || '{\"sku\": \"moved\"}' WHERE event_id % 7 = 0")
        c.execute("DELETE FROM ev WHERE event_id = 5")
    dump = tmp_path / "partitioned.dump"
    r = run_client(cluster, f"{BIN}/pg_dump", "-Fc", "-f", str(dump), "-d", src_name)
    assert r.returncode == 0, r.stderr
    with cluster.connect() as c:
        c.execute(f'CREATE DATABASE "{restored}"')
    try:
        r = run_client(cluster, f"{BIN}/pg_restore", "--exit-on-error", "-j", str(jobs), "-d", restored, str(dump))
        assert r.returncode == 0 and r.stderr == "", r.stderr
        with cluster.connect(restored) as c:
            # Every member has its seven triggers (capture of the four ops, keys of all but
            # INSERT, whose keys the insert capture takes), none twice.
            assert rows(c, """SELECT count(DISTINCT g.tgrelid), count(*) FROM pg_trigger g
                              WHERE g.tgname LIKE 'eventview_%'
                                AND g.tgrelid IN (SELECT relid FROM pg_partition_tree('ev') WHERE relid <> 'ev'::regclass)""") \
                == [(rows(c, "SELECT count(*) FROM pg_partition_tree('ev') WHERE relid <> 'ev'::regclass")[0][0],
                     7 * rows(c, "SELECT count(*) FROM pg_partition_tree('ev') WHERE relid <> 'ev'::regclass")[0][0])]
            changed = 1 + rows(c, "SELECT count(*) FROM ev WHERE event_id % 7 = 0")[0][0]
            assert rows(c, "SELECT eventview.refresh('per_sku')")[0][0] == changed
            c.execute("""INSERT INTO ev (event_key, event_type, occurred_at, payload)
                         VALUES ('new', 'o', '2026-01-01 13:00+00', '{"sku": "s1", "qty": 1000}')""")
            with pytest.raises(psycopg.errors.UniqueViolation):
                c.execute("""INSERT INTO ev (event_key, event_type, payload) VALUES ('k2', 'o', '{"sku": "s9"}')""")
            assert rows(c, "SELECT eventview.refresh('per_sku')")[0][0] == 1
            scratch = "SELECT payload ->> 'sku', count(*), max((payload -> 'qty')::numeric) FROM ev GROUP BY 1 ORDER BY 1"
            assert rows(c, "SELECT sku, n, top FROM per_sku ORDER BY 1") == rows(c, scratch)
            c.execute("SET eventview.partition_premake = 10")
            c.execute("SELECT eventview.run_maintenance()")
            assert rows(c, "SELECT count(*) FROM pg_partition_tree('ev') WHERE isleaf AND relid::text ~ '^ev_p'")[0][0] >= 11
    finally:
        with cluster.connect() as c:
            c.execute(f'DROP DATABASE IF EXISTS "{restored}" WITH (FORCE)')


def test_dump_restore_of_local_time_and_percentile_views(cluster, new_db, tmp_path):
    """Views with time_zone, percentile and approx_percentile (realtime and stored), changes
    pending at dump time: restored, they show what they showed and carry on (section 8 and 9)."""
    src_name = new_db("_zoned").rsplit("dbname=", 1)[1]
    view = """SELECT eventview.create_view('{name}', 'lat', group_by => '{{"route": "$.route"}}',
                  measures => '{{"n": "count(*)", "p50": "percentile($.ms, 0.5)", "a99": "approx_percentile($.ms, 0.99)"}}',
                  time_bucket => '1 day', time_zone => 'America/Santiago', realtime => {realtime})"""
    with cluster.connect(src_name) as c:
        c.execute("SELECT eventview.create_event_table('lat')")
        c.execute(view.format(name="daily", realtime="false"))
        c.execute(view.format(name="daily_live", realtime="true"))
        c.execute("""INSERT INTO lat (event_type, occurred_at, payload)
                     SELECT 'req', '2026-04-04 12:00+00'::timestamptz + g * interval '37 minutes',
                            jsonb_build_object('route', '/r' || g % 3, 'ms', g % 97) FROM generate_series(1, 200) g""")
        c.execute("SELECT eventview.refresh_all()")
        c.execute("DELETE FROM lat WHERE event_id % 10 = 0")
        c.execute("""INSERT INTO lat (event_type, occurred_at, payload)
                     VALUES ('req', '2026-04-05 03:30+00', '{"route": "/r1", "ms": 5000}')""")
        before = {v: rows(c, f"SELECT * FROM {v} ORDER BY 1, 2") for v in ("daily", "daily_live")}
        definition = rows(c, "SELECT definition::text FROM eventview.views ORDER BY name::text")
    dump = tmp_path / "zoned.dump"
    r = run_client(cluster, f"{BIN}/pg_dump", "-Fc", "-f", str(dump), "-d", src_name)
    assert r.returncode == 0, r.stderr
    with cluster.connect() as c:
        c.execute('CREATE DATABASE "it_restored_zoned"')
    try:
        r = run_client(cluster, f"{BIN}/pg_restore", "--exit-on-error", "-d", "it_restored_zoned", str(dump))
        assert r.returncode == 0 and r.stderr == "", r.stderr
        with cluster.connect("it_restored_zoned") as c:
            assert {v: rows(c, f"SELECT * FROM {v} ORDER BY 1, 2") for v in before} == before
            assert rows(c, "SELECT definition::text FROM eventview.views ORDER BY name::text") == definition
            assert '"time_zone" : "America/Santiago"' in definition[0][0]
            assert rows(c, "SELECT eventview.refresh('daily')")[0][0] == 21
            assert rows(c, "SELECT * FROM daily ORDER BY 1, 2") == before["daily_live"]
            scratch = """SELECT date_bin('1 day', occurred_at AT TIME ZONE 'America/Santiago', timestamp '2000-01-01')
                                AT TIME ZONE 'America/Santiago', payload ->> 'route', count(*),
                                percentile_disc(0.5) WITHIN GROUP (ORDER BY (payload -> 'ms')::numeric)
                         FROM lat GROUP BY 1, 2 ORDER BY 1, 2"""
            assert rows(c, "SELECT bucket, route, n, p50 FROM daily ORDER BY 1, 2") == rows(c, scratch)
    finally:
        with cluster.connect() as c:
            c.execute('DROP DATABASE IF EXISTS "it_restored_zoned" WITH (FORCE)')


@pytest.mark.parametrize("jobs", [1, 2])
def test_dump_restore_of_rollups(cluster, new_db, tmp_path, jobs):
    """A rollup with group changes of its source pending, and a realtime rollup of it, at dump
    time: restored, they show what they showed, refresh to the aggregate from scratch, and still
    keep their source from being dropped (section 9)."""
    src_name = new_db(f"_rollups{jobs}").rsplit("dbname=", 1)[1]
    restored = f"it_restored_rollups{jobs}"
    scratch = """SELECT date_bin('1 day', occurred_at, '2000-01-01') AS bucket, payload ->> 'sku', count(*),
                        max((payload -> 'ms')::numeric), count(DISTINCT payload -> 'user')
                 FROM ev GROUP BY 1, 2 ORDER BY 1, 2"""
    with cluster.connect(src_name) as c:
        c.execute("SELECT eventview.create_event_table('ev')")
        c.execute("""SELECT eventview.create_view('hourly', 'ev', group_by => '{"sku": "$.sku", "route": "$.route"}',
                         measures => '{"n": "count(*)", "top": "max($.ms)", "users": "count_distinct($.user)"}',
                         time_bucket => '1 hour')""")
        c.execute("""SELECT eventview.create_view('daily', 'hourly', group_by => '{"sku": "sku"}',
                         measures => '{"n": "n", "top": "top", "users": "users"}', time_bucket => '1 day')""")
        c.execute("""SELECT eventview.create_view('weekly_live', 'daily', measures => '{"n": "n", "top": "top"}',
                         time_bucket => '7 days', realtime => true)""")
        c.execute("""INSERT INTO ev (event_type, occurred_at, payload)
                     SELECT 'req', '2026-04-04 12:00+00'::timestamptz + g * interval '37 minutes',
                            jsonb_build_object('sku', 'S' || g % 4, 'route', '/r' || g % 3, 'ms', g % 97, 'user', g % 13)
                     FROM generate_series(1, 300) g""")
        c.execute("SELECT eventview.refresh('daily')")
        # Group changes written and not applied by the rollup, and raw changes pending below.
        c.execute("DELETE FROM ev WHERE event_id % 10 = 0")
        c.execute("SELECT eventview.refresh('hourly')")
        c.execute("UPDATE ev SET payload = payload || '{\"ms\": 500}' WHERE event_id % 7 = 0")
        before = {v: rows(c, f"SELECT * FROM {v} ORDER BY 1, 2") for v in ("daily", "weekly_live")}
    dump = tmp_path / "rollups.dump"
    r = run_client(cluster, f"{BIN}/pg_dump", "-Fc", "-f", str(dump), "-d", src_name)
    assert r.returncode == 0, r.stderr
    with cluster.connect() as c:
        c.execute(f'CREATE DATABASE "{restored}"')
    try:
        r = run_client(cluster, f"{BIN}/pg_restore", "--exit-on-error", "-j", str(jobs), "-d", restored, str(dump))
        assert r.returncode == 0 and r.stderr == "", r.stderr
        with cluster.connect(restored) as c:
            assert {v: rows(c, f"SELECT * FROM {v} ORDER BY 1, 2") for v in before} == before
            c.execute("SELECT eventview.refresh('weekly_live')")
            assert rows(c, "SELECT bucket, sku, n, top, users FROM daily ORDER BY 1, 2") == rows(c, scratch)
            assert rows(c, "SELECT sum(n)::bigint, max(top) FROM weekly_live") == rows(c, "SELECT count(*), max((payload -> 'ms')::numeric) FROM ev")
            with pytest.raises(psycopg.errors.DependentObjectsStillExist, match="rollups read it"):
                c.execute("SELECT eventview.drop_view('daily')")
    finally:
        with cluster.connect() as c:
            c.execute(f'DROP DATABASE IF EXISTS "{restored}" WITH (FORCE)')
