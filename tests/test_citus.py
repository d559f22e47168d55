"""pg_eventview beside Citus (API.md section 10): a coordinator and two workers of our own on
loopback ports, when Citus is installed for this PostgreSQL; skipped otherwise.

Citus is in no package registry this project installs from: to run this module, build Citus
13.0 by hand from its public source against /usr/lib/postgresql/15/bin/pg_config on the machine
that runs the tests (nothing of Citus is kept in this repository).

On that cluster: an event table distributed by Citus with capture on every shard, views over
it that equal the aggregate from scratch after every refresh (random inserts, COPY, updates,
deletes, rolled back and multi-statement transactions), the refusals of what is not
distributed yet, the cleanup of every node, and event tables on the coordinator beside them.
"""

import random

import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

from conftest import CLUSTER_SH, Cluster

PG_LIB = Path("/usr/lib/postgresql/15/lib")
BASE_PORT = 55611

pytestmark = pytest.mark.skipif(
    not (PG_LIB / "citus.so").exists(),
    reason=f"Citus is not installed for PostgreSQL 15 ({PG_LIB / 'citus.so'} is missing)",
)


@pytest.fixture(scope="module")
def citus():
    """The coordinator (the first node) of a Citus cluster of three nodes, with citus and
    pg_eventview created in database postgres on each."""
    nodes = []
    try:
        for i in range(3):
            port = BASE_PORT + i
            directory = f"/tmp/pg_eventview_citus_{port}"
            subprocess.run(
                [
                    "bash",
                    str(CLUSTER_SH),
                    "start",
                    directory,
                    str(port),
                    "shared_preload_libraries = 'citus'",
                    "wal_level = logical",
                    "max_prepared_transactions = 50",
                    "max_connections = 100",
                ],
                check=True,
            )
            nodes.append(Cluster(directory, port))
        for node in nodes[1:]:
            with node.connect() as conn:
                conn.execute("CREATE EXTENSION citus")
        coordinator = nodes[0]
        with coordinator.connect() as conn:
            conn.execute("CREATE EXTENSION citus")
            conn.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", (coordinator.port,))
            for node in nodes[1:]:
                conn.execute("SELECT citus_add_node('127.0.0.1', %s)", (node.port,))
            # Propagated to the workers by Citus.
            conn.execute("CREATE EXTENSION pg_eventview")
        yield coordinator
    finally:
        for node in nodes:
            subprocess.run(["bash", str(CLUSTER_SH), "stop", node.dir], check=False)
            shutil.rmtree(node.dir, ignore_errors=True)


def refusal(conn, statement: str, *args) -> tuple[str, str]:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(statement, args)
    return caught.value.sqlstate, caught.value.diag.message_primary


def test_pg_eventview_is_on_every_node(citus):
    with citus.connect() as conn:
        rows = conn.execute(
            "SELECT success, result FROM run_command_on_workers("
            "$$SELECT extversion FROM pg_extension WHERE extname = 'pg_eventview'$$)"
        ).fetchall()
        version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_eventview'").fetchone()[0]
    assert rows == [(True, version), (True, version)]


def workers_count(conn, query: str) -> list[int]:
    rows = conn.execute("SELECT success, result FROM run_command_on_workers(%s)", (query,)).fetchall()
    assert all(ok for ok, _ in rows), rows
    return [int(result) for _, result in rows]


SKU_VIEW = dict(
    group_by='{"sku": "$.sku"}',
    measures='{"n": "count(*)", "qty": "sum($.qty)", "avg_qty": "avg($.qty)", '
    '"top": "max($.price)", "low": "min($.price)", "priced": "count($.price)"}',
)

# The same aggregate from scratch over the distributed table.
SKU_FROM_SCRATCH = """
    SELECT pg_catalog.date_bin('1 day', occurred_at, '2000-01-01 00:00:00+00'), payload->>'sku',
           count(*), sum((payload->>'qty')::numeric), round(avg((payload->>'qty')::numeric), 10),
           max((payload->>'price')::numeric), min((payload->>'price')::numeric), count(payload->'price')
    FROM {table} WHERE event_type = 'order' GROUP BY 1, 2 ORDER BY 1, 2 NULLS FIRST"""
SKU_READ = """
    SELECT bucket, sku, n, qty, round(avg_qty, 10), top, low, priced
    FROM {view} ORDER BY 1, 2 NULLS FIRST"""


def insert_orders(conn, table: str, rng: random.Random, count: int) -> None:
    rows = [
        (
            rng.choice(["order", "order", "view"]),
            f"2026-03-0{rng.randint(1, 4)} {rng.randint(0, 23):02d}:00:00+00",
            psycopg.types.json.Jsonb(
                {
                    "sku": rng.choice(["A", "B", "C", None]),
                    "qty": rng.randint(1, 9),
                    **({"price": round(rng.uniform(1, 100), 2)} if rng.random() < 0.9 else {}),
                }
            ),
        )
        for _ in range(count)
    ]
    conn.execute(
        f"INSERT INTO {table} (event_type, occurred_at, payload) SELECT * FROM unnest(%s::text[], %s::timestamptz[], %s::jsonb[])",
        ([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]),
    )


def test_a_distributed_view_equals_the_aggregate_from_scratch(citus):
    rng = random.Random(26)
    with citus.connect() as conn:
        conn.execute("SET citus.shard_count = 4")
        conn.execute("SELECT eventview.create_event_table('dev', distribute_by => 'event_id')")
        try:
            # Events before the view: its first fill reads them on every shard.
            insert_orders(conn, "dev", rng, 200)
            conn.execute(
                "SELECT eventview.create_view('dev_sku', 'dev', event_types => ARRAY['order'], "
                "group_by => %s, measures => %s, time_bucket => '1 day')",
                (SKU_VIEW["group_by"], SKU_VIEW["measures"]),
            )
            # A view without buckets or measures: one row per type, filtered.
            conn.execute(
                """SELECT eventview.create_view('dev_types', 'dev', group_by => '{"type": "event_type"}',
                     filter => '{"$.sku": "A"}')"""
            )

            def check(step: str) -> None:
                got = conn.execute(SKU_READ.format(view="dev_sku")).fetchall()
                want = conn.execute(SKU_FROM_SCRATCH.format(table="dev")).fetchall()
                assert got == want, step
                got = conn.execute("SELECT type, events FROM dev_types ORDER BY 1").fetchall()
                want = conn.execute(
                    "SELECT event_type, count(*) FROM dev WHERE payload->>'sku' = 'A' GROUP BY 1 ORDER BY 1"
                ).fetchall()
                assert got == want, step

            check("after the first fill")
            for step in range(16):
                op = rng.choice(
                    ["insert", "copy", "update", "delete", "rollback", "transaction", "single", "refresh_rolled_back"]
                )
                if op == "insert":
                    insert_orders(conn, "dev", rng, rng.randint(1, 300))
                elif op == "copy":
                    with conn.cursor().copy("COPY dev (event_type, payload) FROM STDIN") as copy:
                        for _ in range(rng.randint(1, 50)):
                            copy.write_row(("order", f'{{"sku": "{rng.choice("ABC")}", "qty": {rng.randint(1, 9)}, "price": {rng.randint(1, 99)}}}'))
                elif op == "update":
                    conn.execute(
                        "UPDATE dev SET payload = payload || %s WHERE event_id %% 13 = %s",
                        (psycopg.types.json.Jsonb({"qty": rng.randint(100, 107), "price": 0.5}), rng.randint(0, 12)),
                    )
                elif op == "delete":
                    conn.execute("DELETE FROM dev WHERE event_id %% 11 = %s", (rng.randint(0, 10),))
                elif op == "rollback":
                    with pytest.raises(psycopg.errors.RaiseException):
                        with conn.transaction():
                            insert_orders(conn, "dev", rng, 40)
                            conn.execute("DELETE FROM dev WHERE event_id % 5 = 0")
                            conn.execute("DO $$ BEGIN RAISE EXCEPTION 'roll back'; END $$")
                elif op == "transaction":
                    with conn.transaction():
                        insert_orders(conn, "dev", rng, 30)
                        conn.execute("UPDATE dev SET payload = payload - 'price' WHERE event_id % 17 = 3")
                elif op == "refresh_rolled_back":
                    # A refresh whose transaction rolls back takes nothing from any shard.
                    insert_orders(conn, "dev", rng, 60)
                    with pytest.raises(psycopg.errors.RaiseException):
                        with conn.transaction():
                            conn.execute("SELECT eventview.refresh('dev_sku')")
                            conn.execute("DO $$ BEGIN RAISE EXCEPTION 'roll back'; END $$")
                else:
                    for _ in range(5):
                        conn.execute(
                            "INSERT INTO dev (event_type, payload) VALUES ('order', %s)",
                            (psycopg.types.json.Jsonb({"sku": rng.choice("ABC"), "qty": 1, "price": 7}),),
                        )
                applied = conn.execute("SELECT eventview.refresh('dev_sku')").fetchone()[0]
                assert applied >= 0
                conn.execute("SELECT eventview.refresh('dev_types')")
                check(f"step {step}: {op}")
            # A point read is a read of the coordinator's merged groups through their index.
            conn.execute("SET enable_seqscan = off")
            plan = "\n".join(
                r[0] for r in conn.execute(
                    "EXPLAIN SELECT * FROM dev_sku WHERE sku = 'A' AND bucket = '2026-03-02'"
                ).fetchall()
            )
            conn.execute("RESET enable_seqscan")
            assert "Index" in plan and "Citus" not in plan, plan
            # A refresh with nothing new applies nothing.
            assert conn.execute("SELECT eventview.refresh('dev_sku')").fetchone()[0] == 0
            # Every shard is an event table of its node, with one view per distributed view.
            assert sum(workers_count(conn, "SELECT count(*) FROM eventview._sources")) == 4
            assert sum(workers_count(conn, "SELECT count(*) FROM eventview._views")) == 8
            conn.execute("SELECT eventview.drop_view('dev_types')")
            assert conn.execute("SELECT to_regclass('dev_types')").fetchone()[0] is None
            assert sum(workers_count(conn, "SELECT count(*) FROM eventview._views")) == 4
        finally:
            conn.execute("SELECT eventview.drop_event_table('dev', cascade => true)")
        assert conn.execute("SELECT to_regclass('dev_sku')").fetchone()[0] is None
        assert conn.execute("SELECT count(*) FROM eventview._distributed_sources").fetchone()[0] == 0
        assert sum(workers_count(conn, "SELECT count(*) FROM eventview._sources")) == 0
        assert sum(workers_count(conn, "SELECT count(*) FROM eventview._views")) == 0
        left = conn.execute(
            "SELECT result FROM run_command_on_workers($$SELECT coalesce(string_agg(relname, ' '), '') FROM pg_class "
            "WHERE relnamespace = 'eventview'::regnamespace AND relname ~ '^_(v[0-9]|changes_|shards_)'$$)"
        ).fetchall()
        assert left == [("",), ("",)]


def test_distributed_by_key_keeps_keys_unique_across_shards(citus):
    with citus.connect() as conn:
        conn.execute("SET citus.shard_count = 4")
        conn.execute("SELECT eventview.create_event_table('dkey', distribute_by => 'event_key')")
        try:
            conn.execute(
                "INSERT INTO dkey (event_key, event_type, payload) "
                "SELECT 'k' || g, 'order', jsonb_build_object('qty', g) FROM generate_series(1, 40) g"
            )
            with pytest.raises(psycopg.errors.UniqueViolation):
                conn.execute("INSERT INTO dkey (event_key, event_type, payload) VALUES ('k7', 'order', '{}')")
            with pytest.raises(psycopg.Error):
                conn.execute("INSERT INTO dkey (event_type, payload) VALUES ('order', '{}')")
            conn.execute(
                """SELECT eventview.create_view('dkey_all', 'dkey', measures => '{"n": "count(*)", "qty": "sum($.qty)"}')"""
            )
            conn.execute("DELETE FROM dkey WHERE event_key IN ('k1', 'k2')")
            conn.execute("SELECT eventview.refresh('dkey_all')")
            assert conn.execute("SELECT n, qty FROM dkey_all").fetchone() == (38, 817)
        finally:
            conn.execute("SELECT eventview.drop_event_table('dkey', cascade => true)")


CHANGELOG_RECORDS = (
    "SELECT coalesce(sum((xpath('/row/c/text()', query_to_xml(format('SELECT count(*) AS c FROM eventview.%I', relname), "
    "false, true, '')))[1]::text::bigint), 0) FROM pg_class WHERE relname ~ '^_changes_[0-9]+$' AND relkind = 'p'"
)


def test_run_maintenance_refreshes_scheduled_views_and_prunes_every_shard(citus):
    with citus.connect() as conn:
        conn.execute("SET citus.shard_count = 4")
        conn.execute(
            "SELECT eventview.create_event_table('dmaint', delta_retention => '0 seconds', distribute_by => 'event_id')"
        )
        try:
            conn.execute("""SELECT eventview.create_view('dmaint_n', 'dmaint', measures => '{"n": "count(*)"}')""")
            conn.execute("""SELECT eventview.create_view('dmaint_other', 'dmaint', measures => '{"n": "count(*)"}')""")
            conn.execute(
                "INSERT INTO dmaint (event_type, payload) SELECT 'order', '{}' FROM generate_series(1, 50)"
            )
            assert sum(workers_count(conn, CHANGELOG_RECORDS)) > 0
            state, _ = refusal(conn, "SELECT eventview.schedule('dmaint_n', '-1 second')")
            assert state == "22023"
            conn.execute("SELECT eventview.schedule('dmaint_n', '1 second')")
            conn.execute("SELECT eventview.run_maintenance()")
            assert conn.execute("SELECT n FROM dmaint_n").fetchone() == (50,)
            # The unscheduled view is not refreshed, and holds back the prune.
            assert conn.execute("SELECT n FROM dmaint_other").fetchall() == []
            assert sum(workers_count(conn, CHANGELOG_RECORDS)) > 0
            assert conn.execute(
                "SELECT last_refresh_at IS NOT NULL, last_error FROM eventview._distributed_views v "
                "WHERE relid = 'dmaint_n'::regclass"
            ).fetchone() == (True, None)
            # refresh_all takes the other; then every shard's changelog is pruned.
            assert conn.execute("SELECT eventview.refresh_all()").fetchone()[0] == 50
            conn.execute("SELECT eventview.run_maintenance()")
            assert sum(workers_count(conn, CHANGELOG_RECORDS)) == 0
            assert conn.execute("SELECT n FROM dmaint_other").fetchone() == (50,)
        finally:
            conn.execute("SELECT eventview.drop_event_table('dmaint', cascade => true)")


def test_a_plain_drop_forgets_distributed_views_and_tables(citus):
    with citus.connect() as conn:
        conn.execute("SET citus.shard_count = 4")
        conn.execute("SELECT eventview.create_event_table('ddrop', distribute_by => 'event_id')")
        conn.execute("INSERT INTO ddrop (event_type, payload) SELECT 'order', '{\"qty\": 1}' FROM generate_series(1, 20)")
        for name in ("ddrop_a", "ddrop_b"):
            conn.execute(f"""SELECT eventview.create_view('{name}', 'ddrop', measures => '{{"n": "count(*)"}}')""")
        conn.execute("DROP VIEW ddrop_a")
        assert conn.execute("SELECT count(*) FROM eventview._distributed_views").fetchone()[0] == 1
        assert sum(workers_count(conn, "SELECT count(*) FROM eventview._views")) == 4
        conn.execute("SELECT eventview.refresh('ddrop_b')")
        conn.execute("DROP TABLE ddrop CASCADE")
        assert conn.execute("SELECT to_regclass('ddrop_b')").fetchone()[0] is None
        assert conn.execute("SELECT count(*) FROM eventview._distributed_views").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM eventview._distributed_sources").fetchone()[0] == 0
        assert conn.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'eventview'::regnamespace AND relname ~ '^_(v[0-9]|shards_)'"
        ).fetchone()[0] == 0
        assert sum(workers_count(conn, "SELECT count(*) FROM eventview._views")) == 0
        assert sum(workers_count(conn, "SELECT count(*) FROM eventview._sources")) == 0


def test_rights_on_distributed_views(citus):
    with citus.connect() as conn:
        conn.execute("SET citus.shard_count = 4")
        conn.execute("CREATE ROLE dist_owner LOGIN")
        conn.execute("CREATE ROLE dist_analyst LOGIN")
        try:
            conn.execute("GRANT CREATE ON SCHEMA public TO dist_owner, dist_analyst")
            conn.execute("SET ROLE dist_owner")
            conn.execute("SELECT eventview.create_event_table('dpriv', distribute_by => 'event_id')")
            conn.execute("GRANT SELECT ON dpriv TO dist_analyst")
            conn.execute("RESET ROLE")
            assert conn.execute("SELECT relowner::regrole::text FROM pg_class WHERE oid = 'dpriv'::regclass").fetchone() == ("dist_owner",)
            conn.execute(
                """INSERT INTO dpriv (event_type, payload)
                   SELECT 'order', jsonb_build_object('tag', CASE WHEN g % 3 = 0 THEN '{value}' ELSE '{shards}' END)
                   FROM generate_series(1, 30) g"""
            )
            conn.execute("SET ROLE dist_analyst")
            # Text that looks like the placeholders of the per-shard calls is the user's own.
            conn.execute(
                """SELECT eventview.create_view('dpriv_v', 'dpriv', filter => '{"$.tag": "{value}"}',
                     measures => '{"n": "count(*)"}')"""
            )
            assert conn.execute("SELECT n FROM dpriv_v").fetchone() == (10,)
            conn.execute("RESET ROLE")
            conn.execute("ALTER TABLE dpriv ENABLE ROW LEVEL SECURITY")
            conn.execute("SET ROLE dist_analyst")
            state, _ = refusal(conn, """SELECT eventview.create_view('dpriv_w', 'dpriv', measures => '{"n": "count(*)"}')""")
            assert state == "42501"
            conn.execute("RESET ROLE")
            conn.execute("ALTER TABLE dpriv DISABLE ROW LEVEL SECURITY")
            conn.execute("REVOKE SELECT ON dpriv FROM dist_analyst")
            conn.execute("SET ROLE dist_analyst")
            state, _ = refusal(conn, "SELECT eventview.refresh('dpriv_v')")
            assert state == "42501"
            conn.execute("RESET ROLE")
            # Another role may not drop it; the table's owner may.
            conn.execute("SET ROLE dist_owner")
            conn.execute("SELECT eventview.drop_event_table('dpriv', cascade => true)")
            conn.execute("RESET ROLE")
            assert conn.execute("SELECT count(*) FROM eventview._distributed_views").fetchone()[0] == 0
        finally:
            conn.execute("RESET ROLE")
            conn.execute("DROP TABLE IF EXISTS dpriv CASCADE")
            conn.execute("REVOKE CREATE ON SCHEMA public FROM dist_owner, dist_analyst")
            conn.execute("DROP ROLE dist_analyst")
            conn.execute("DROP ROLE dist_owner")


def test_more_than_one_placement_per_shard_is_refused(citus):
    with citus.connect() as conn:
        conn.execute("SET citus.shard_replication_factor = 2")
        state, got = refusal(conn, "SELECT eventview.create_event_table('drep', distribute_by => 'event_id')")
        assert state == "0A000" and "more than one placement" in got
        assert conn.execute("SELECT to_regclass('drep')").fetchone()[0] is None


def test_what_is_not_distributed_yet_is_refused(citus):
    with citus.connect() as conn:
        conn.execute("SET citus.shard_count = 4")
        for arguments, message in [
            ("retention => '30 days'", "retention of an event table distributed by Citus is not supported"),
            ("partition_interval => '1 day'", "an event table distributed by Citus cannot be partitioned"),
        ]:
            state, got = refusal(
                conn, f"SELECT eventview.create_event_table('dref', {arguments}, distribute_by => 'event_id')"
            )
            assert state == "0A000" and got.startswith(message), got
            assert conn.execute("SELECT to_regclass('dref')").fetchone()[0] is None
        state, got = refusal(conn, "SELECT eventview.create_event_table('dref', distribute_by => 'payload')")
        assert state == "22023" and "distribute_by" in got
        conn.execute("SELECT eventview.create_event_table('dref', distribute_by => 'event_id')")
        try:
            for arguments in [
                """measures => '{"users": "count_distinct($.user)"}'""",
                """measures => '{"p": "percentile($.qty, 0.5)"}'""",
                "realtime => true",
            ]:
                state, got = refusal(conn, f"SELECT eventview.create_view('dref_v', 'dref', {arguments})")
                assert state == "0A000" and "distributed by Citus is not supported" in got, got
                assert conn.execute("SELECT to_regclass('dref_v')").fetchone()[0] is None
            assert conn.execute("SELECT count(*) FROM eventview._distributed_views").fetchone()[0] == 0
            conn.execute("""SELECT eventview.create_view('dref_v', 'dref', measures => '{"n": "count(*)"}')""")
            state, got = refusal(conn, "SELECT eventview.drop_event_table('dref')")
            assert state == "2BP01", got
        finally:
            conn.execute("SELECT eventview.drop_event_table('dref', cascade => true)")


def test_register_refuses_a_table_citus_manages(citus):
    with citus.connect() as conn:
        conn.execute(
            """CREATE TABLE user_dist (
                 event_id bigint PRIMARY KEY, event_key text, event_type text NOT NULL,
                 event_version integer NOT NULL DEFAULT 1, producer text NOT NULL DEFAULT current_user,
                 occurred_at timestamptz NOT NULL DEFAULT now(),
                 ingested_at timestamptz NOT NULL DEFAULT now(), payload jsonb NOT NULL)"""
        )
        conn.execute("CREATE UNIQUE INDEX ON user_dist (event_key, event_id)")
        conn.execute("SELECT create_distributed_table('user_dist', 'event_id', shard_count => 4)")
        try:
            state, message = refusal(conn, "SELECT eventview.register_event_table('user_dist')")
            assert state == "0A000"
            assert "user_dist: it is a Citus table" in message
            assert conn.execute("SELECT count(*) FROM eventview._sources").fetchone()[0] == 0
            # No capture trigger on the table or its shards.
            assert conn.execute(
                "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'user_dist'::regclass AND NOT tgisinternal"
            ).fetchone()[0] == 0
        finally:
            conn.execute("DROP TABLE user_dist")


def test_event_tables_on_the_coordinator_keep_working(citus):
    with citus.connect() as conn:
        conn.execute("SELECT eventview.create_event_table('local_ev')")
        try:
            conn.execute(
                """SELECT eventview.create_view('local_by_sku', 'local_ev',
                     group_by => '{"sku": "$.sku"}', measures => '{"n": "count(*)", "amount": "sum($.amount)"}')"""
            )
            conn.execute(
                """INSERT INTO local_ev (event_type, payload)
                   SELECT 'order', jsonb_build_object('sku', 'S' || (g % 3), 'amount', g)
                   FROM generate_series(1, 30) g"""
            )
            conn.execute("DELETE FROM local_ev WHERE (payload->>'amount')::int > 27")
            conn.execute("SELECT eventview.refresh('local_by_sku')")
            got = conn.execute("SELECT sku, n, amount FROM local_by_sku ORDER BY sku").fetchall()
            want = conn.execute(
                """SELECT payload->>'sku', count(*), sum((payload->>'amount')::numeric)
                   FROM local_ev GROUP BY 1 ORDER BY 1"""
            ).fetchall()
            assert got == want and len(got) == 3
        finally:
            conn.execute("SELECT eventview.drop_event_table('local_ev', cascade => true)")
