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

import contextlib
import datetime
import random
import re
import shutil
import subprocess
import threading
import time
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
    pg_eventview created in database postgres on each. The first worker preloads pg_eventview
    (with its background worker off, as docs/reference.md advises for workers), the other nodes
    do not: the tests run on both kinds of node."""
    nodes = []
    try:
        for i in range(3):
            port = BASE_PORT + i
            directory = f"/tmp/pg_eventview_citus_{port}"
            preload = (
                ["shared_preload_libraries = 'citus,pg_eventview'", "eventview.worker = off"]
                if i == 1
                else ["shared_preload_libraries = 'citus'"]
            )
            subprocess.run(
                [
                    "bash",
                    str(CLUSTER_SH),
                    "start",
                    directory,
                    str(port),
                    *preload,
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
        coordinator.workers = nodes[1:]
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
    '"top": "max($.price)", "low": "min($.price)", "priced": "count($.price)", '
    '"buyers": "count_distinct($.user)", "median_qty": "percentile($.qty, 0.5)", '
    '"p90_price": "approx_percentile($.price, 0.9)"}',
)

HANDED_MEASURES = (
    '{"n": "count(*)", "qty": "sum($.qty)", "avg_qty": "avg($.qty)", "top": "max($.price)", '
    '"low": "min($.price)", "p90_price": "approx_percentile($.price, 0.9)"}'
)
HANDED_READ = "SELECT bucket, sku, n, qty, round(avg_qty, 10), top, low, p90_price FROM dev_handed ORDER BY 1, 2 NULLS FIRST"
HANDED_FROM_SCRATCH = """
    SELECT pg_catalog.date_bin('1 day', occurred_at, '2000-01-01 00:00:00+00'), payload->>'sku',
           count(*), sum((payload->>'qty')::numeric), round(avg((payload->>'qty')::numeric), 10),
           max((payload->>'price')::numeric), min((payload->>'price')::numeric),
           percentile_disc(0.9) WITHIN GROUP (ORDER BY (payload->>'price')::numeric)
    FROM {table} WHERE event_type = 'order' GROUP BY 1, 2 ORDER BY 1, 2 NULLS FIRST"""

# The same aggregate from scratch over the distributed table.
SKU_FROM_SCRATCH = """
    SELECT pg_catalog.date_bin('1 day', occurred_at, '2000-01-01 00:00:00+00'), payload->>'sku',
           count(*), sum((payload->>'qty')::numeric), round(avg((payload->>'qty')::numeric), 10),
           max((payload->>'price')::numeric), min((payload->>'price')::numeric), count(payload->'price'),
           count(DISTINCT payload->'user'),
           percentile_disc(0.5) WITHIN GROUP (ORDER BY (payload->>'qty')::numeric),
           percentile_disc(0.9) WITHIN GROUP (ORDER BY (payload->>'price')::numeric)
    FROM {table} WHERE event_type = 'order' GROUP BY 1, 2 ORDER BY 1, 2 NULLS FIRST"""
SKU_READ = """
    SELECT bucket, sku, n, qty, round(avg_qty, 10), top, low, priced, buyers, median_qty, p90_price
    FROM {view} ORDER BY 1, 2 NULLS FIRST"""


def start_node(port: int) -> Cluster:
    """A new PostgreSQL cluster for a Citus node, with citus created (not yet in the cluster)."""
    directory = f"/tmp/pg_eventview_citus_{port}"
    subprocess.run(
        ["bash", str(CLUSTER_SH), "start", directory, str(port), "shared_preload_libraries = 'citus'",
         "wal_level = logical", "max_prepared_transactions = 50", "max_connections = 100"],
        check=True,
    )
    node = Cluster(directory, port)
    with node.connect() as conn:
        conn.execute("CREATE EXTENSION citus")
    return node


def worker_nodes(conn) -> list[tuple[int, int]]:
    """(nodeid, port) of every worker (the coordinator is group 0)."""
    return conn.execute(
        "SELECT nodeid, nodeport FROM pg_dist_node WHERE groupid <> 0 AND noderole = 'primary' ORDER BY nodeport"
    ).fetchall()


def move_a_shard(conn, table: str, rng: random.Random) -> None:
    """One shard of `table` (with its co-located shards) moved to another worker, by logical
    replication (Citus's default), and the placements it left dropped."""
    shard, port = rng.choice(
        conn.execute(
            "SELECT shardid, nodeport FROM citus_shards WHERE table_name = %s::regclass ORDER BY 1", (table,)
        ).fetchall()
    )
    to = rng.choice([p for _, p in worker_nodes(conn) if p != port])
    conn.execute("SELECT citus_move_shard_placement(%s, '127.0.0.1', %s, '127.0.0.1', %s)", (shard, port, to))
    conn.execute("CALL citus_cleanup_orphaned_resources()")


def split_a_shard(conn, table: str, rng: random.Random) -> None:
    """One shard of `table` (with its co-located shards) split in two at the middle of its
    range, the halves on the workers. (With writes blocked: a split by logical replication
    decodes with the output plugin `citus`, which this PostgreSQL allows only when
    `output_plugin_libraries` lists it.)"""
    shard, low, high = rng.choice(
        conn.execute(
            "SELECT shardid, shardminvalue::bigint, shardmaxvalue::bigint FROM pg_dist_shard "
            "WHERE logicalrelid = %s::regclass AND shardmaxvalue::bigint - shardminvalue::bigint > 1 ORDER BY 1",
            (table,),
        ).fetchall()
    )
    nodes = [n for n, _ in worker_nodes(conn)]
    conn.execute(
        "SELECT citus_split_shard_by_split_points(%s, ARRAY[%s], ARRAY[%s, %s], 'block_writes')",
        (shard, str((low + high) // 2), nodes[0], nodes[-1]),
    )
    conn.execute("CALL citus_cleanup_orphaned_resources()")


def insert_orders(conn, table: str, rng: random.Random, count: int) -> None:
    rows = [
        (
            rng.choice(["order", "order", "view"]),
            f"2026-03-0{rng.randint(1, 4)} {rng.randint(0, 23):02d}:00:00+00",
            psycopg.types.json.Jsonb(
                {
                    "sku": rng.choice(["A", "B", "C", None]),
                    "qty": rng.randint(1, 9),
                    # Users who buy on many days and skus, on every shard (1 and 1.0 are one),
                    # and users of one event, on one shard only.
                    **(
                        {"user": rng.choice(["u1", "u2", "u3", "u4", "u5", 1, 1.0, 2, f"solo{rng.randint(0, 10**9)}"])}
                        if rng.random() < 0.8
                        else {}
                    ),
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
            # A realtime view: equal to the aggregate from scratch before every refresh too.
            conn.execute(
                "SELECT eventview.create_view('dev_rt', 'dev', event_types => ARRAY['order'], "
                "group_by => %s, measures => %s, time_bucket => '1 day', realtime => true)",
                (SKU_VIEW["group_by"], SKU_VIEW["measures"]),
            )
            good_orders = "(SELECT * FROM dev WHERE jsonb_typeof(payload -> 'qty') IS DISTINCT FROM 'string') d"
            # A view without count_distinct or percentile: its shards' applies hand their group
            # changes back to the coordinator's refresh instead of writing them to their
            # group changelogs.
            conn.execute(
                "SELECT eventview.create_view('dev_handed', 'dev', event_types => ARRAY['order'], "
                "group_by => %s, measures => %s, time_bucket => '1 day')",
                (SKU_VIEW["group_by"], HANDED_MEASURES),
            )
            # A view without buckets or measures: one row per type, filtered.
            conn.execute(
                """SELECT eventview.create_view('dev_types', 'dev', group_by => '{"type": "event_type"}',
                     filter => '{"$.sku": "A"}')"""
            )

            spoiled_counts = []

            def check(step: str) -> None:
                # Orders whose qty is a string are left out of dev_sku and quarantined: the
                # coordinator's quarantine holds exactly those, under the view's name.
                sku_check(conn, "(SELECT * FROM dev WHERE jsonb_typeof(payload -> 'qty') IS DISTINCT FROM 'string') d",
                          "dev_sku", step)
                quarantined = conn.execute(
                    "SELECT event_id FROM eventview.quarantine WHERE view_name = 'public.dev_sku' ORDER BY 1"
                ).fetchall()
                spoiled = conn.execute(
                    "SELECT event_id FROM dev WHERE event_type = 'order' AND jsonb_typeof(payload -> 'qty') = 'string' ORDER BY 1"
                ).fetchall()
                assert quarantined == spoiled, step
                spoiled_counts.append(len(spoiled))
                assert_equal_but_the_sketch(
                    conn.execute(HANDED_READ).fetchall(),
                    conn.execute(HANDED_FROM_SCRATCH.format(table=good_orders)).fetchall(),
                    step,
                )
                got = conn.execute("SELECT type, events FROM dev_types ORDER BY 1").fetchall()
                want = conn.execute(
                    "SELECT event_type, count(*) FROM dev WHERE payload->>'sku' = 'A' GROUP BY 1 ORDER BY 1"
                ).fetchall()
                assert got == want, step

            check("after the first fill")
            for step in range(18):
                # A shard moved and a shard split, each with changes pending on it.
                op = {5: "move", 11: "split", 14: "rebuild"}.get(step) or rng.choice(
                    ["insert", "copy", "update", "delete", "rollback", "transaction", "single", "refresh_rolled_back"]
                )
                if op in ("move", "split"):
                    insert_orders(conn, "dev", rng, 120)
                    conn.execute("DELETE FROM dev WHERE event_id %% 7 = %s", (rng.randint(0, 6),))
                    conn.execute(
                        "UPDATE dev SET payload = payload || '{\"qty\": 50, \"price\": 101, \"user\": \"u9\"}' WHERE event_id %% 19 = %s",
                        (rng.randint(0, 18),),
                    )
                    (move_a_shard if op == "move" else split_a_shard)(conn, "dev", rng)
                elif op == "rebuild":
                    # Every shard's view made anew, with changes pending, and the coordinator's
                    # groups merged anew: a count put wrong there by hand comes out right.
                    insert_orders(conn, "dev", rng, 80)
                    conn.execute("DELETE FROM dev WHERE event_id % 10 = 4")
                    view_id = conn.execute(
                        "SELECT view_id FROM eventview._distributed_views WHERE relid = 'dev_sku'::regclass"
                    ).fetchone()[0]
                    conn.execute(f"UPDATE eventview._v{view_id}_data SET __count = __count + 1000")
                    shard_views = workers_count(conn, "SELECT sum(view_id) FROM eventview._views")
                    assert conn.execute("SELECT eventview.rebuild('dev_sku', now() - interval '1 day')").fetchone()[0] > 0
                    assert workers_count(conn, "SELECT sum(view_id) FROM eventview._views") != shard_views
                elif op == "insert":
                    insert_orders(conn, "dev", rng, rng.randint(1, 300))
                elif op == "copy":
                    with conn.cursor().copy("COPY dev (event_type, payload) FROM STDIN") as copy:
                        for _ in range(rng.randint(1, 50)):
                            copy.write_row(("order", f'{{"sku": "{rng.choice("ABC")}", "qty": {rng.randint(1, 9)}, "price": {rng.randint(1, 99)}}}'))
                elif op == "update":
                    conn.execute(
                        "UPDATE dev SET payload = payload || %s WHERE event_id %% 13 = %s",
                        (psycopg.types.json.Jsonb({"qty": rng.randint(100, 107), "price": 0.5, "user": rng.choice(["u1", "u6"])}), rng.randint(0, 12)),
                    )
                    # Some orders get a qty of the wrong type: quarantined until the next
                    # update of theirs.
                    conn.execute(
                        """UPDATE dev SET payload = payload || '{"qty": "many"}' WHERE event_id %% 31 = %s""",
                        (rng.randint(0, 30),),
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
                        conn.execute("UPDATE dev SET payload = payload - 'price' - 'user' WHERE event_id % 17 = 3")
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
                if op in ("move", "split"):
                    # The shard that arrived has no view of dev_rt on its node until a refresh.
                    state, got = refusal(conn, "SELECT count(*) FROM dev_rt")
                    assert state == "55000", (step, got)
                else:
                    sku_check(conn, good_orders, "dev_rt", f"step {step}: {op}, before the refresh")
                applied = conn.execute("SELECT eventview.refresh('dev_sku')").fetchone()[0]
                assert applied >= 0
                conn.execute("SELECT eventview.refresh('dev_types')")
                conn.execute("SELECT eventview.refresh('dev_rt')")
                conn.execute("SELECT eventview.refresh('dev_handed')")
                check(f"step {step}: {op}")
                sku_check(conn, good_orders, "dev_rt", f"step {step}: {op}, after the refresh")
            assert max(spoiled_counts) > 0, spoiled_counts
            # A point read is a read of the coordinator's merged groups through their index.
            plan = point_read_plan(conn, "dev_sku")
            assert "Index" in plan and "Citus" not in plan, plan
            # A refresh with nothing new applies nothing.
            assert conn.execute("SELECT eventview.refresh('dev_sku')").fetchone()[0] == 0
            # Every shard is an event table of its node, with one view per distributed view (the
            # node a shard left forgot it).
            shards = conn.execute("SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'dev'::regclass").fetchone()[0]
            assert shards == 5
            assert sum(workers_count(conn, "SELECT count(*) FROM eventview._sources")) == shards
            assert sum(workers_count(conn, "SELECT count(*) FROM eventview._views")) == 4 * shards
            # Every shard's view, also those the move, the split and the rebuild made anew,
            # keeps its partial groups with their key index and without a read index: users
            # read the merged groups, which have one.
            assert sum(workers_count(conn, SHARD_VIEW_INDEXES.format("key"))) == 4 * shards
            assert sum(workers_count(conn, SHARD_VIEW_INDEXES.format("read"))) == 0
            assert conn.execute(
                "SELECT to_regclass(format('eventview._v%s_data_read', view_id)) IS NOT NULL "
                "FROM eventview._distributed_views WHERE relid = 'dev_sku'::regclass"
            ).fetchone()[0]
            # Its shards' applies wrote no group change to their group changelogs.
            handed = conn.execute(
                "SELECT view_id FROM eventview._distributed_views WHERE relid = 'dev_handed'::regclass"
            ).fetchone()[0]
            shard_views_of_handed = f"FROM eventview._views WHERE data_relation::text LIKE 'eventview._v{handed}_groups%'"
            assert sum(workers_count(conn, f"SELECT count(*) {shard_views_of_handed}")) == shards
            assert sum(workers_count(
                conn,
                "SELECT coalesce(sum(pg_relation_size(format('eventview._v%s_changes', view_id)::regclass)), 0) "
                + shard_views_of_handed,
            )) == 0
            conn.execute("SELECT eventview.drop_view('dev_handed')")
            conn.execute("SELECT eventview.drop_view('dev_types')")
            assert conn.execute("SELECT to_regclass('dev_types')").fetchone()[0] is None
            assert sum(workers_count(conn, "SELECT count(*) FROM eventview._views")) == 2 * shards
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
            # Its owner schedules it; another role's run_maintenance leaves it alone.
            conn.execute("SELECT eventview.schedule('dpriv_v', '1 second')")
            conn.execute("RESET ROLE")
            conn.execute("SET ROLE dist_owner")
            conn.execute("SELECT eventview.run_maintenance()")
            state, _ = refusal(conn, "SELECT eventview.schedule('dpriv_v', NULL)")
            assert state == "42501"
            conn.execute("RESET ROLE")
            last_error = "SELECT last_error FROM eventview._distributed_views WHERE relid = 'dpriv_v'::regclass"
            assert conn.execute(last_error).fetchone() == (None,)
            # Its owner's refresh_all and run_maintenance record the failure and go on.
            conn.execute("SET ROLE dist_analyst")
            assert conn.execute("SELECT eventview.refresh_all()").fetchone()[0] == 0
            assert "permission denied" in conn.execute(last_error).fetchone()[0]
            conn.execute("UPDATE eventview._distributed_views SET last_error = NULL WHERE relid = 'dpriv_v'::regclass")
            conn.execute("SELECT eventview.run_maintenance()")
            assert "permission denied" in conn.execute(last_error).fetchone()[0]
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
            conn.execute("""SELECT eventview.create_view('dref_v', 'dref', measures => '{"n": "count(*)"}')""")
            # Every shard's view applies the type policy: it stays as the view was made.
            state, got = refusal(conn, "SELECT eventview.alter_view('dref_v', on_type_error => 'skip')")
            assert state == "0A000" and "on_type_error" in got, got
            assert conn.execute(
                "SELECT definition ->> 'on_type_error' FROM eventview.views WHERE name = 'dref_v'::regclass"
            ).fetchone() == ("quarantine",)
            state, got = refusal(conn, "SELECT eventview.drop_event_table('dref')")
            assert state == "2BP01", got
        finally:
            conn.execute("SELECT eventview.drop_event_table('dref', cascade => true)")


USER_TABLE = """CREATE TABLE {name} (
    event_id bigint NOT NULL, event_key text, event_type text NOT NULL,
    event_version integer NOT NULL DEFAULT 1, producer text NOT NULL DEFAULT current_user,
    occurred_at timestamptz NOT NULL DEFAULT now(),
    ingested_at timestamptz NOT NULL DEFAULT now(), payload jsonb NOT NULL, note text)"""


def test_register_adopts_a_table_the_user_distributed(citus):
    rng = random.Random(2690)
    with citus.connect() as conn:
        conn.execute(USER_TABLE.format(name="user_dist"))
        conn.execute("ALTER TABLE user_dist ADD PRIMARY KEY (event_id, producer)")
        conn.execute("CREATE SEQUENCE user_dist_ids")
        conn.execute("ALTER TABLE user_dist ALTER COLUMN event_id SET DEFAULT nextval('user_dist_ids')")
        conn.execute("ALTER TABLE user_dist ALTER COLUMN producer SET DEFAULT 'p' || floor(random() * 5)::int")
        conn.execute("SELECT create_distributed_table('user_dist', 'producer', shard_count => 4)")
        try:
            # Events before the registration: views read them, exactly once.
            insert_orders(conn, "user_dist", rng, 200)
            conn.execute("SELECT eventview.register_event_table('user_dist', delta_retention => '1 hour')")
            assert conn.execute(
                "SELECT distribute_by, delta_retention FROM eventview._distributed_sources WHERE relid = 'user_dist'::regclass"
            ).fetchone() == ("producer", datetime.timedelta(hours=1))
            state, _ = refusal(conn, "SELECT eventview.register_event_table('user_dist')")
            assert state == "42710"
            conn.execute(
                "SELECT eventview.create_view('user_sku', 'user_dist', event_types => ARRAY['order'], "
                "group_by => %s, measures => %s, time_bucket => '1 day')",
                (SKU_VIEW["group_by"], SKU_VIEW["measures"]),
            )
            sku_check(conn, "user_dist", "user_sku", "after the first fill")
            insert_orders(conn, "user_dist", rng, 100)
            conn.execute("DELETE FROM user_dist WHERE event_id % 7 = 0")
            conn.execute("UPDATE user_dist SET payload = payload || '{\"qty\": 3}' WHERE event_id % 5 = 0")
            conn.execute("SELECT eventview.refresh('user_sku')")
            sku_check(conn, "user_dist", "user_sku", "after a refresh")
            assert sum(workers_count(conn, "SELECT count(*) FROM eventview._sources")) == 4
        finally:
            conn.execute("SELECT eventview.drop_event_table('user_dist', cascade => true)")
            conn.execute("DROP SEQUENCE user_dist_ids")
        assert sum(workers_count(conn, "SELECT count(*) FROM eventview._sources")) == 0


def test_register_keeps_keys_unique_per_shard_and_takes_collations(citus):
    with citus.connect() as conn:
        # Distributed by a producer column with a collation of its own.
        conn.execute(USER_TABLE.format(name="user_coll").replace("producer text", 'producer text COLLATE "C"'))
        conn.execute("ALTER TABLE user_coll ADD PRIMARY KEY (event_id, producer)")
        conn.execute("SELECT create_distributed_table('user_coll', 'producer', shard_count => 4)")
        try:
            # Two producers on one shard, with one event_id: the table allows it.
            producers = {}
            for i in range(200):
                shard = conn.execute(
                    "SELECT get_shard_id_for_distribution_column('user_coll', %s::text)", (f"p{i}",)
                ).fetchone()[0]
                producers.setdefault(shard, []).append(f"p{i}")
            same = next(p for p in producers.values() if len(p) > 1)[:2]
            for producer in same:
                conn.execute(
                    "INSERT INTO user_coll (event_id, event_type, producer, payload) VALUES (7, 'order', %s, '{}')",
                    (producer,),
                )
            state, got = refusal(conn, "SELECT eventview.register_event_table('user_coll')")
            assert state == "23505" and "its event_id '7' is there twice" in got, got
            assert conn.execute("SELECT count(*) FROM eventview._distributed_sources").fetchone()[0] == 0
            conn.execute("DELETE FROM user_coll WHERE producer = %s", (same[1],))
            conn.execute("SELECT eventview.register_event_table('user_coll')")
            conn.execute("""SELECT eventview.create_view('user_coll_n', 'user_coll', group_by => '{"p": "producer"}', measures => '{"n": "count(*)"}')""")
            conn.execute(
                "INSERT INTO user_coll (event_id, event_type, producer, payload) SELECT g, 'order', 'p' || (g % 9), '{}' "
                "FROM generate_series(100, 199) g"
            )
            conn.execute("SELECT eventview.refresh('user_coll_n')")
            assert conn.execute("SELECT p, n FROM user_coll_n ORDER BY p").fetchall() == conn.execute(
                "SELECT producer, count(*) FROM user_coll GROUP BY 1 ORDER BY 1"
            ).fetchall()
        finally:
            conn.execute("DROP TABLE user_coll CASCADE")


def test_register_refuses_what_it_cannot_capture(citus):
    with citus.connect() as conn:
        keyed = "ALTER TABLE {t} ADD PRIMARY KEY (event_id); "
        cases = [
            # (how the table is distributed, the SQLSTATE, the start of the message)
            (keyed + "SELECT create_reference_table('{t}')", "0A000",
             "cannot register {t}: it is a Citus reference or local table"),
            ("SELECT create_distributed_table('{t}', 'note', shard_count => 4)", "22023",
             'cannot register {t} as an event table: it is distributed by column "note"'),
            (keyed + "SET citus.shard_replication_factor = 2; SELECT create_distributed_table('{t}', 'event_id', shard_count => 4)",
             "0A000", "cannot register {t}: its shards have more than one placement"),
        ]
        for distribute, sqlstate, message in cases:
            conn.execute(USER_TABLE.format(name="user_ref"))
            try:
                conn.execute(distribute.format(t="user_ref"))
                conn.execute("RESET citus.shard_replication_factor")
                state, got = refusal(conn, "SELECT eventview.register_event_table('user_ref')")
                assert state == sqlstate and got.startswith(message.format(t="public.user_ref")), got
                assert conn.execute("SELECT count(*) FROM eventview._distributed_sources").fetchone()[0] == 0
                assert conn.execute(
                    "SELECT count(*) FROM pg_class WHERE relnamespace = 'eventview'::regnamespace AND relname ~ '^_shards_'"
                ).fetchone()[0] == 0
            finally:
                conn.execute("DROP TABLE user_ref")
        # A distributed table whose unique key does not lead with event_id.
        conn.execute(USER_TABLE.format(name="user_nokey"))
        conn.execute("ALTER TABLE user_nokey ADD PRIMARY KEY (producer, event_id)")
        conn.execute("SELECT create_distributed_table('user_nokey', 'producer', shard_count => 4)")
        try:
            state, got = refusal(conn, "SELECT eventview.register_event_table('user_nokey')")
            assert state == "22023" and "no unique index on event_id" in got, got
            # With retention: refused as for create_event_table.
            conn.execute("ALTER TABLE user_nokey DROP CONSTRAINT user_nokey_pkey")
            conn.execute("ALTER TABLE user_nokey ADD PRIMARY KEY (event_id, producer)")
            state, got = refusal(conn, "SELECT eventview.register_event_table('user_nokey', retention => '1 day')")
            assert state == "0A000" and "retention" in got, got
            assert sum(workers_count(conn, "SELECT count(*) FROM eventview._sources")) == 0
        finally:
            conn.execute("DROP TABLE user_nokey")


def test_event_tables_on_the_coordinator_keep_working(citus):
    with citus.connect() as conn:
        conn.execute("SELECT eventview.create_event_table('local_ev')")
        warnings = []
        conn.add_notice_handler(lambda d: warnings.append(d.message_primary) if d.severity == "WARNING" else None)
        try:
            # Made, and made realtime, without Citus warning that it keeps the relation local.
            conn.execute(
                """SELECT eventview.create_view('local_by_sku', 'local_ev',
                     group_by => '{"sku": "$.sku"}', measures => '{"n": "count(*)", "amount": "sum($.amount)"}')"""
            )
            conn.execute("SELECT eventview.alter_view('local_by_sku', realtime => true)")
            assert warnings == []
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


def test_an_event_table_on_the_coordinator_leaves_the_capture_of_a_shard_of_the_same_number_alone(citus):
    """The coordinator and each worker number their event tables in their own catalogs: an
    event table on the coordinator whose number a shard on a worker has too keeps its capture
    functions on the coordinator (Citus propagates functions made there), so a shard's capture
    is neither taken over by the other table's owner nor dropped with it."""
    rng = random.Random(2701)
    with citus.connect() as conn:
        sku_table(conn, "dnum", rng, 100)
    worker = citus.workers[0]
    shard_capture = """SELECT s.source_id, p.proowner::regrole::text,
                              EXISTS (SELECT FROM pg_dist_object d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid)
                       FROM eventview._sources s
                       JOIN pg_proc p ON p.oid = format('eventview._capture_%s_insert', s.source_id)::regproc
                       WHERE s.relid::text ~ '^dnum_[0-9]+$' ORDER BY 1 LIMIT 1"""
    with worker.connect() as wconn:
        number, owner, marked = wconn.execute(shard_capture).fetchone()
        assert (owner, marked) == ("postgres", False)
    with citus.connect() as conn:
        conn.execute("DROP ROLE IF EXISTS dnum_other")
        conn.execute("CREATE ROLE dnum_other")
        try:
            # The coordinator's next event table takes the number of that shard's.
            conn.execute("SELECT setval(pg_get_serial_sequence('eventview._sources', 'source_id'), %s, false)", (number,))
            conn.execute("SELECT eventview.create_event_table('dnum_local')")
            conn.execute("ALTER TABLE dnum_local OWNER TO dnum_other")
            assert conn.execute("SELECT source_id FROM eventview._sources WHERE relid = 'dnum_local'::regclass").fetchone() == (number,)
            conn.execute("INSERT INTO dnum_local (event_type, payload) VALUES ('order', '{\"sku\": \"A\"}')")
            conn.execute("SELECT eventview._observe_all()")
            with worker.connect() as wconn:
                assert wconn.execute(shard_capture).fetchone() == (number, "postgres", False)
            insert_orders(conn, "dnum", rng, 100)
            conn.execute("SELECT eventview.refresh('dnum_sku')")
            sku_check(conn, "dnum", "dnum_sku", "with the coordinator's table")
            # Dropped, the coordinator's table takes only its own capture along.
            conn.execute("SELECT eventview.drop_event_table('dnum_local')")
            with worker.connect() as wconn:
                assert wconn.execute(shard_capture).fetchone() == (number, "postgres", False)
            insert_orders(conn, "dnum", rng, 100)
            conn.execute("DELETE FROM dnum WHERE event_id % 5 = 0")
            conn.execute("SELECT eventview.refresh('dnum_sku')")
            sku_check(conn, "dnum", "dnum_sku", "after the coordinator's table is dropped")
        finally:
            conn.execute("DROP TABLE IF EXISTS dnum_local")
            conn.execute("SELECT eventview.drop_event_table('dnum', cascade => true)")
            conn.execute("DROP ROLE IF EXISTS dnum_other")


def assert_equal_but_the_sketch(got: list, want: list, step: str) -> None:
    """Rows `got` equal rows `want`, but for the last column, an approx_percentile, within the
    sketch's 1% of the exact one."""
    assert [row[:-1] for row in got] == [row[:-1] for row in want], step
    for g, w in zip(got, want):
        assert (g[-1] is None) == (w[-1] is None), (step, g, w)
        if w[-1] is not None:
            assert abs(g[-1] - float(w[-1])) <= 0.0101 * abs(float(w[-1])), (step, g, w)


def sku_check(conn, table: str, view: str, step: str) -> None:
    """The view equals the aggregate from scratch; its approx_percentile (the last column) is
    within the sketch's 1% of the exact one."""
    got = conn.execute(SKU_READ.format(view=view)).fetchall()
    want = conn.execute(SKU_FROM_SCRATCH.format(table=table)).fetchall()
    assert_equal_but_the_sketch(got, want, step)


RT_READ = """
    SELECT bucket, sku, n, qty, round(avg_qty, 10), top, low, priced, buyers, median_qty, p90_price
    FROM {view} {where} ORDER BY 1, 2 NULLS FIRST"""


# On a node: how many of its shards' views have the storage index `_v<id>_data_<kind>`.
SHARD_VIEW_INDEXES = """
    SELECT count(*) FROM eventview._views v JOIN pg_catalog.pg_index i ON i.indrelid = v.data_relation
    WHERE i.indexrelid::regclass::text = 'eventview._v' || v.view_id || '_data_{}'"""


def point_read_plan(conn, view: str) -> str:
    """EXPLAIN of a point read of SKU view `view` (sequential scans off)."""
    conn.execute("SET enable_seqscan = off")
    try:
        return "\n".join(
            r[0] for r in conn.execute(
                f"EXPLAIN SELECT * FROM {view} WHERE sku = 'A' AND bucket = '2026-03-02'"
            ).fetchall()
        )
    finally:
        conn.execute("RESET enable_seqscan")


def rt_check(conn, table: str, view: str, step: str, where: str = "") -> None:
    """Realtime view `view` equals the aggregate from scratch over `table` now, refreshed or
    not; its approx_percentile (the last column) within the sketch's 1% of the exact one."""
    got = conn.execute(RT_READ.format(view=view, where=where)).fetchall()
    scratch = SKU_FROM_SCRATCH.format(table=table)
    if where:
        scratch = f"SELECT * FROM ({scratch}) s(bucket, sku) {where} ORDER BY 1, 2 NULLS FIRST"
    want = conn.execute(scratch).fetchall()
    assert_equal_but_the_sketch(got, want, step)


MERGED_FROM_PARTIAL_GROUPS = (
    "every touched group merged from the shards' partial groups: the shards' positions are not those recorded with the merged groups"
)
ADDED_ONTO_MERGED = "the pending changes added onto the merged groups"
BUT_INWARDS = ", but for the groups whose extremes moved inwards"


def merged_by(conn, step: str) -> list:
    """rt_check of drt_sku, with how its read merged the touched groups (the realtime read's
    DEBUG1 messages, without the view's id)."""
    seen = []

    def note(d):
        message = d.message_primary or ""
        if message.startswith("realtime read of distributed view"):
            seen.append(message.split(": ", 1)[1])

    conn.add_notice_handler(note)
    conn.execute("SET client_min_messages = debug1")
    try:
        rt_check(conn, "drt", "drt_sku", step)
    finally:
        conn.execute("RESET client_min_messages")
        conn.remove_notice_handler(note)
    return seen


def create_drt_sku(conn, realtime: bool) -> None:
    conn.execute(
        "SELECT eventview.create_view('drt_sku', 'drt', event_types => ARRAY['order'], "
        "group_by => %s, measures => %s, time_bucket => '1 day', realtime => %s)",
        (SKU_VIEW["group_by"], SKU_VIEW["measures"], realtime),
    )


def test_realtime_reads_add_the_pending_changes_onto_what_create_view_merged(citus):
    """create_view records where every shard's view stands, as a refresh does: a realtime read
    before the first refresh adds the pending changes onto the merged groups, writes of the
    creating transaction included, and so does a view made stored and altered to realtime.
    With no positions recorded (a node whose library answers none), a read merges every
    touched group from the shards' partial groups. Each read equals the aggregate from
    scratch."""
    rng = random.Random(2629)
    with citus.connect() as conn:
        conn.execute("SET citus.shard_count = 4")
        conn.execute("SELECT eventview.create_event_table('drt', distribute_by => 'event_id')")
        try:
            insert_orders(conn, "drt", rng, 120)
            with conn.transaction():
                insert_orders(conn, "drt", rng, 30)
                create_drt_sku(conn, realtime=True)
                insert_orders(conn, "drt", rng, 30)
                assert merged_by(conn, "in the creating transaction") == [ADDED_ONTO_MERGED]
            insert_orders(conn, "drt", rng, 40)
            assert merged_by(conn, "after the creating transaction") == [ADDED_ONTO_MERGED]
            conn.execute(
                "UPDATE eventview._distributed_views SET shard_positions = NULL WHERE relid = 'drt_sku'::regclass"
            )
            assert merged_by(conn, "no positions recorded") == [MERGED_FROM_PARTIAL_GROUPS]
            conn.execute("SELECT eventview.drop_view('drt_sku')")
            create_drt_sku(conn, realtime=False)
            insert_orders(conn, "drt", rng, 40)
            conn.execute("SELECT eventview.alter_view('drt_sku', realtime => true)")
            assert merged_by(conn, "made stored, then realtime") == [ADDED_ONTO_MERGED]
        finally:
            conn.execute("SELECT eventview.drop_event_table('drt', cascade => true)")


WHEN_READ = "SELECT sku, mid, users FROM drt_when ORDER BY 1 NULLS FIRST"
WHEN_FROM_SCRATCH = """
    SELECT payload->>'sku', percentile_disc(0.25) WITHIN GROUP (ORDER BY (payload->>'price')::numeric),
           count(DISTINCT payload->'user')
    FROM drt WHERE event_type = 'order' GROUP BY 1 ORDER BY 1 NULLS FIRST"""


@pytest.mark.parametrize("distribute_by", ["event_id", "occurred_at"])
def test_a_realtime_distributed_view_equals_the_aggregate_from_scratch_between_refreshes(citus, distribute_by):
    rng = random.Random(2626)
    with citus.connect() as conn:
        conn.execute("SET citus.shard_count = 4")
        conn.execute("SELECT eventview.create_event_table('drt', distribute_by => %s)", (distribute_by,))
        try:
            insert_orders(conn, "drt", rng, 150)
            create_drt_sku(conn, realtime=True)
            # Another percentile and distinct JSON values, without buckets.
            conn.execute(
                """SELECT eventview.create_view('drt_when', 'drt', event_types => ARRAY['order'],
                     group_by => '{"sku": "$.sku"}', realtime => true,
                     measures => '{"mid": "percentile($.price, 0.25)", "users": "count_distinct($.user)"}')"""
            )
            assert conn.execute("SELECT realtime FROM eventview.views WHERE name = 'drt_sku'::regclass").fetchone() == (True,)
            rt_check(conn, "drt", "drt_sku", "made")
            # How a read merges the touched groups: the pending changes added onto the merged
            # groups (create_view records the positions of the shards' views as made, as a
            # refresh records them), but a group whose maximum a change moved inwards from
            # every shard's partial groups.
            insert_orders(conn, "drt", rng, 40)
            assert merged_by(conn, "before the first refresh") == [ADDED_ONTO_MERGED]
            conn.execute("SELECT eventview.refresh('drt_sku')")
            conn.execute("SELECT eventview.refresh('drt_when')")
            insert_orders(conn, "drt", rng, 60)
            assert merged_by(conn, "inserts after a refresh") == [ADDED_ONTO_MERGED]
            assert conn.execute(WHEN_READ).fetchall() == conn.execute(WHEN_FROM_SCRATCH).fetchall()
            # A position other than the recorded one (here, one shard's record spoiled): every
            # touched group from the partial groups, until a refresh records them again.
            conn.execute(
                """UPDATE eventview._distributed_views
                   SET shard_positions = (shard_positions::jsonb || jsonb_build_object(
                       (SELECT min(key) FROM json_each_text(shard_positions)), 'elsewhere'))::json
                   WHERE relid = 'drt_sku'::regclass"""
            )
            assert merged_by(conn, "a position moved on") == [MERGED_FROM_PARTIAL_GROUPS]
            conn.execute("SELECT eventview.refresh('drt_sku')")
            # The maximum of every event, applied: the group's maximum moves inwards.
            conn.execute(
                """UPDATE drt SET payload = payload || '{"price": 0.25}' WHERE event_id = (
                     SELECT event_id FROM drt WHERE event_type = 'order' AND payload ? 'price'
                     ORDER BY (payload->>'price')::numeric DESC LIMIT 1)"""
            )
            assert merged_by(conn, "a maximum moved inwards") == [ADDED_ONTO_MERGED + BUT_INWARDS]
            for step in range(14):
                op = rng.choice(["insert", "update", "delete", "transaction", "refresh", "spoil"])
                if op == "insert":
                    insert_orders(conn, "drt", rng, rng.randint(1, 200))
                elif op == "update":
                    # Maxima and minima retracted and moved outwards.
                    conn.execute(
                        "UPDATE drt SET payload = payload || %s WHERE event_id %% 7 = %s",
                        (psycopg.types.json.Jsonb({"qty": rng.randint(1, 9), "price": rng.choice([0.5, 150, 42])}), rng.randint(0, 6)),
                    )
                elif op == "delete":
                    conn.execute("DELETE FROM drt WHERE event_id %% 5 = %s", (rng.randint(0, 4),))
                elif op == "spoil":
                    # A qty of the wrong type leaves the event out, as a refresh leaves it out.
                    conn.execute("""UPDATE drt SET payload = payload || '{"qty": "many"}' WHERE event_id % 23 = 1""")
                    conn.execute("DELETE FROM drt WHERE jsonb_typeof(payload -> 'qty') = 'string'")
                elif op == "transaction":
                    # The reader's own uncommitted writes, on every shard, are in its reads.
                    with conn.transaction():
                        insert_orders(conn, "drt", rng, 40)
                        conn.execute("DELETE FROM drt WHERE event_id % 9 = 4")
                        rt_check(conn, "drt", "drt_sku", f"step {step}: inside a transaction")
                else:
                    conn.execute("SELECT eventview.refresh('drt_sku')")
                rt_check(conn, "drt", "drt_sku", f"step {step}: {op}")
                # A point read: the touched groups merged anew, the rest from the storage.
                rt_check(conn, "drt", "drt_sku", f"step {step}: {op}, point read", "WHERE sku = 'A' AND bucket = '2026-03-02'")
                rt_check(conn, "drt", "drt_sku", f"step {step}: {op}, NULL key", "WHERE sku IS NULL")
                assert conn.execute(WHEN_READ).fetchall() == conn.execute(WHEN_FROM_SCRATCH).fetchall(), step
            # A point read of a realtime view reads the stored groups through their index too
            # (an index or bitmap index scan, as the planner weighs the groups touched so far).
            plan = point_read_plan(conn, "drt_sku")
            assert re.search(r"(Index Scan using|Bitmap Index Scan on) _v[0-9]+_data_", plan), plan
            assert "json_to_recordset" in plan, plan
            # Turned off, the view reads its stored groups; on again, the pending changes too.
            insert_orders(conn, "drt", rng, 50)
            conn.execute("SELECT eventview.alter_view('drt_sku', realtime => false)")
            stored = conn.execute("SELECT sum(n) FROM drt_sku").fetchone()[0]
            total = conn.execute("SELECT count(*) FROM drt WHERE event_type = 'order'").fetchone()[0]
            assert stored < total
            conn.execute("SELECT eventview.alter_view('drt_sku', realtime => true)")
            rt_check(conn, "drt", "drt_sku", "realtime again")
            # A rebuild makes the realtime read anew (here, of a view whose read is stored).
            view_id = conn.execute(
                "SELECT view_id FROM eventview._distributed_views WHERE relid = 'drt_sku'::regclass"
            ).fetchone()[0]
            conn.execute("SELECT eventview.alter_view('drt_sku', realtime => false)")
            conn.execute(f"UPDATE eventview._distributed_views SET realtime = true WHERE view_id = {view_id}")
            assert "_distributed_realtime" not in conn.execute("SELECT pg_get_viewdef('drt_sku')").fetchone()[0]
            conn.execute("SELECT eventview.rebuild('drt_sku')")
            assert "_distributed_realtime" in conn.execute("SELECT pg_get_viewdef('drt_sku')").fetchone()[0]
            insert_orders(conn, "drt", rng, 20)
            rt_check(conn, "drt", "drt_sku", "after a rebuild")
            # Someone without SELECT on the view cannot read it through the function it calls.
            conn.execute("DROP ROLE IF EXISTS drt_reader")
            conn.execute("CREATE ROLE drt_reader LOGIN")
            conn.execute("SET ROLE drt_reader")
            state, got = refusal(conn, f"SELECT eventview._distributed_realtime({view_id})")
            conn.execute("RESET ROLE")
            assert state == "42501" and "drt_sku" in got, got
            # Nor with SELECT on some columns: the function answers all of them.
            conn.execute("GRANT SELECT (sku, n) ON drt_sku TO drt_reader")
            conn.execute("SET ROLE drt_reader")
            state, got = refusal(conn, f"SELECT eventview._distributed_realtime({view_id})")
            conn.execute("RESET ROLE")
            assert state == "42501", got
            conn.execute("GRANT SELECT ON drt_sku TO drt_reader")
            orders = conn.execute("SELECT count(*) FROM drt WHERE event_type = 'order'").fetchone()[0]
            conn.execute("SET ROLE drt_reader")
            state, got = refusal(conn, "SELECT eventview.alter_view('drt_sku', realtime => false)")
            assert state == "42501", got
            assert conn.execute("SELECT sum(n) FROM drt_sku").fetchone()[0] == orders
            conn.execute("RESET ROLE")
            # A role that changed the table earlier in its transaction reads the view after the
            # commit: the per-shard calls run as the extension's owner, and Citus refuses to reach
            # placements a transaction changed as another role (documented).
            conn.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON drt TO drt_reader")
            conn.execute("SET ROLE drt_reader")
            with conn.transaction():
                conn.execute(
                    "INSERT INTO drt (event_type, occurred_at, payload) VALUES ('order', '2026-03-02', %s)",
                    (psycopg.types.json.Jsonb({"sku": "A", "qty": 5, "price": 1000, "user": "own"}),),
                )
                conn.execute("DELETE FROM drt WHERE event_id % 7 = 3")
                with pytest.raises(psycopg.errors.ActiveSqlTransaction, match="modified in this transaction by a different user"):
                    with conn.transaction():
                        conn.execute("SELECT * FROM drt_sku")
            assert conn.execute(
                "SELECT top, buyers > 0 FROM drt_sku WHERE sku = 'A' AND bucket = '2026-03-02'"
            ).fetchone() == (1000, True)
            conn.execute("RESET ROLE")
            rt_check(conn, "drt", "drt_sku", "a writer's events committed")
            # A shard moved since the last refresh: its pending changes are unknown until the
            # next refresh makes its view on the new node.
            insert_orders(conn, "drt", rng, 30)
            move_a_shard(conn, "drt", rng)
            state, got = refusal(conn, "SELECT count(*) FROM drt_sku")
            assert state == "55000" and "arrived on this node" in got, got
            conn.execute("SELECT eventview.refresh('drt_sku')")
            rt_check(conn, "drt", "drt_sku", "after a move and a refresh")
            insert_orders(conn, "drt", rng, 30)
            rt_check(conn, "drt", "drt_sku", "after a move, pending")
        finally:
            conn.execute("RESET ROLE")
            conn.execute("SELECT eventview.drop_event_table('drt', cascade => true)")
            conn.execute("DROP ROLE IF EXISTS drt_reader")


def test_views_follow_a_rebalance_onto_a_new_worker_and_a_drain(citus):
    rng = random.Random(264)
    node = None
    with citus.connect() as conn:
        conn.execute("SET citus.shard_count = 6")
        conn.execute("SELECT eventview.create_event_table('dreb', distribute_by => 'event_id')")
        try:
            conn.execute(
                "SELECT eventview.create_view('dreb_sku', 'dreb', event_types => ARRAY['order'], "
                "group_by => %s, measures => %s, time_bucket => '1 day')",
                (SKU_VIEW["group_by"], SKU_VIEW["measures"]),
            )
            insert_orders(conn, "dreb", rng, 400)
            conn.execute("SELECT eventview.refresh('dreb_sku')")
            # Changes pending on every shard when the shards move.
            insert_orders(conn, "dreb", rng, 200)
            conn.execute("DELETE FROM dreb WHERE event_id % 9 = 2")
            node = start_node(BASE_PORT + 3)
            conn.execute("SELECT citus_add_node('127.0.0.1', %s)", (node.port,))
            conn.execute("SELECT citus_rebalance_start()")
            conn.execute("SELECT citus_rebalance_wait()")
            conn.execute("CALL citus_cleanup_orphaned_resources()")
            arrived = conn.execute(
                "SELECT count(*) FROM citus_shards WHERE table_name = 'dreb'::regclass AND nodeport = %s", (node.port,)
            ).fetchone()[0]
            assert arrived > 0
            # Maintenance registers the shards that arrived, before any refresh; what is written
            # to them from then on is captured there.
            conn.execute("SELECT eventview.run_maintenance()")
            with node.connect() as worker:
                assert worker.execute("SELECT count(*) FROM eventview._sources").fetchone()[0] == arrived
                assert worker.execute("SELECT count(*) FROM eventview._views").fetchone()[0] == 0
            insert_orders(conn, "dreb", rng, 100)
            conn.execute("UPDATE dreb SET payload = payload || '{\"qty\": 40}' WHERE event_id % 5 = 1")
            conn.execute("SELECT eventview.refresh('dreb_sku')")
            sku_check(conn, "dreb", "dreb_sku", "after the rebalance")
            with node.connect() as worker:
                assert worker.execute("SELECT count(*) FROM eventview._views").fetchone()[0] == arrived
            # Drained, the node's shards move back to the others.
            insert_orders(conn, "dreb", rng, 100)
            conn.execute("SELECT citus_drain_node('127.0.0.1', %s)", (node.port,))
            conn.execute("CALL citus_cleanup_orphaned_resources()")
            conn.execute("SELECT eventview.refresh('dreb_sku')")
            sku_check(conn, "dreb", "dreb_sku", "after the drain")
            with node.connect() as worker:
                assert worker.execute("SELECT count(*) FROM eventview._sources").fetchone()[0] == 0
                assert worker.execute("SELECT count(*) FROM eventview._views").fetchone()[0] == 0
            conn.execute("SELECT citus_remove_node('127.0.0.1', %s)", (node.port,))
            shards = conn.execute("SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'dreb'::regclass").fetchone()[0]
            assert sum(workers_count(conn, "SELECT count(*) FROM eventview._views")) == shards
        finally:
            conn.execute("SELECT eventview.drop_event_table('dreb', cascade => true)")
            if node is not None:
                conn.execute(
                    "SELECT citus_remove_node('127.0.0.1', %s) FROM pg_dist_node WHERE nodeport = %s",
                    (node.port, node.port),
                )
                subprocess.run(["bash", str(CLUSTER_SH), "stop", node.dir], check=False)
                shutil.rmtree(node.dir, ignore_errors=True)


def test_concurrent_refreshes_and_writes_leave_views_exact(citus):
    rng = random.Random(2626)
    with citus.connect() as conn:
        conn.execute("SET citus.shard_count = 4")
        conn.execute("SELECT eventview.create_event_table('dconc', distribute_by => 'event_id')")
        try:
            for name in ("dconc_a", "dconc_b"):
                conn.execute(
                    f"SELECT eventview.create_view('{name}', 'dconc', event_types => ARRAY['order'], "
                    "group_by => %s, measures => %s, time_bucket => '1 day')",
                    (SKU_VIEW["group_by"], SKU_VIEW["measures"]),
                )
            errors = []

            def refresher(view: str, rounds: int) -> None:
                try:
                    with citus.connect() as c:
                        for _ in range(rounds):
                            c.execute("SELECT eventview.refresh(%s)", (view,))
                except Exception as e:  # reported below
                    errors.append(e)

            def writer(seed: int) -> None:
                try:
                    local = random.Random(seed)
                    with citus.connect() as c:
                        for _ in range(12):
                            insert_orders(c, "dconc", local, local.randint(1, 60))
                            c.execute("DELETE FROM dconc WHERE event_id %% 23 = %s", (local.randint(0, 22),))
                except Exception as e:  # reported below
                    errors.append(e)

            threads = [
                threading.Thread(target=refresher, args=("dconc_a", 10)),
                threading.Thread(target=refresher, args=("dconc_a", 10)),
                threading.Thread(target=refresher, args=("dconc_b", 10)),
                threading.Thread(target=writer, args=(rng.randint(0, 10**6),)),
                threading.Thread(target=writer, args=(rng.randint(0, 10**6),)),
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            for view in ("dconc_a", "dconc_b"):
                conn.execute("SELECT eventview.refresh(%s)", (view,))
                sku_check(conn, "dconc", view, view)
        finally:
            conn.execute("SELECT eventview.drop_event_table('dconc', cascade => true)")


@contextlib.contextmanager
def refreshing_and_writing(citus, view: str, table: str, seed: int, deletes_every: int | None = None):
    """While the block runs: one session refreshing `view` again and again, and one inserting
    orders into `table` (and, with `deletes_every`, deleting some); afterwards, neither failed."""
    errors = []
    running = threading.Event()
    running.set()

    def refresher() -> None:
        try:
            with citus.connect() as c:
                while running.is_set():
                    c.execute("SELECT eventview.refresh(%s)", (view,))
        except Exception as e:  # reported below
            errors.append(e)

    def writer() -> None:
        try:
            local = random.Random(seed)
            with citus.connect() as c:
                while running.is_set():
                    insert_orders(c, table, local, local.randint(1, 30))
                    if deletes_every:
                        c.execute(
                            f"DELETE FROM {table} WHERE event_id %% {deletes_every} = %s",
                            (local.randint(0, deletes_every - 1),),
                        )
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=refresher), threading.Thread(target=writer)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        running.clear()
        for t in threads:
            t.join()
    assert errors == []


def test_realtime_reads_during_refreshes_and_writes_never_count_an_event_twice(citus):
    """A realtime read while refreshes commit: a group a shard's pending changes touch comes from
    the shards as they are, so no read counts more events than are committed when it ends."""
    rng = random.Random(2628)
    with citus.connect() as conn:
        conn.execute("SET citus.shard_count = 4")
        conn.execute("SELECT eventview.create_event_table('drace', distribute_by => 'event_id')")
        try:
            conn.execute(
                "SELECT eventview.create_view('drace_sku', 'drace', group_by => %s, "
                """measures => '{"n": "count(*)"}', time_bucket => '1 day', realtime => true)""",
                (SKU_VIEW["group_by"],),
            )
            insert_orders(conn, "drace", rng, 200)
            view_id = conn.execute(
                "SELECT view_id FROM eventview._distributed_views WHERE relid = 'drace_sku'::regclass"
            ).fetchone()[0]
            reads = []
            with refreshing_and_writing(citus, "drace_sku", "drace", rng.randint(0, 10**6)):
                with citus.connect() as reader:
                    messages = []
                    reader.add_notice_handler(lambda d: messages.append(d.message_primary or ""))
                    merges = []  # how the reads that began after a refresh had committed merged
                    for _ in range(60):
                        refreshed = reader.execute(
                            "SELECT last_refresh_at IS NOT NULL FROM eventview._distributed_views WHERE view_id = %s",
                            (view_id,),
                        ).fetchone()[0]
                        messages.clear()
                        reader.execute("SET client_min_messages = debug1")
                        shown = reader.execute("SELECT coalesce(sum(n), 0) FROM drace_sku").fetchone()[0]
                        reader.execute("RESET client_min_messages")
                        if refreshed:
                            merges.extend(messages)
                        committed = reader.execute("SELECT count(*) FROM drace").fetchone()[0]
                        stored = reader.execute(
                            f"SELECT coalesce(sum(__count), 0) FROM eventview._v{view_id}_data"
                        ).fetchone()[0]
                        reads.append((shown, committed, stored))
            assert all(shown <= committed for shown, committed, _ in reads), reads
            # Reads added the pending changes onto the merged groups while refreshes committed
            # (onto what a refresh merged and recorded, not only what create_view recorded).
            assert any(m.endswith(ADDED_ONTO_MERGED) for m in merges), merges
            # Reads saw pending events: more than the refreshes had applied even after them.
            assert sum(shown > stored for shown, _, stored in reads) > 10, reads
            conn.execute("SELECT eventview.refresh('drace_sku')")
            assert conn.execute("SELECT sum(n) FROM drace_sku").fetchone()[0] == conn.execute(
                "SELECT count(*) FROM drace"
            ).fetchone()[0]
        finally:
            conn.execute("SELECT eventview.drop_event_table('drace', cascade => true)")


def test_shard_moves_while_refreshes_and_writes_run_leave_views_exact(citus):
    rng = random.Random(2627)
    with citus.connect() as conn:
        sku_table_with_pending_changes(conn, "dmov", rng)
        try:
            with refreshing_and_writing(citus, "dmov_sku", "dmov", rng.randint(0, 10**6), deletes_every=29):
                # Every shard moved once, by logical replication, while the others run.
                for shard, port in conn.execute(
                    "SELECT shardid, nodeport FROM citus_shards WHERE table_name = 'dmov'::regclass ORDER BY 1"
                ).fetchall():
                    to = next(p for _, p in worker_nodes(conn) if p != port)
                    conn.execute("SELECT citus_move_shard_placement(%s, '127.0.0.1', %s, '127.0.0.1', %s)", (shard, port, to))
                    conn.execute("CALL citus_cleanup_orphaned_resources()")
            conn.execute("SELECT eventview.refresh('dmov_sku')")
            sku_check(conn, "dmov", "dmov_sku", "after the moves")
            # Each node has the views of the shards it holds, and no other.
            shards = conn.execute("SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'dmov'::regclass").fetchone()[0]
            assert sum(workers_count(conn, "SELECT count(*) FROM eventview._views")) == shards
        finally:
            conn.execute("SELECT eventview.drop_event_table('dmov', cascade => true)")


def pg_ctl(node: Cluster, *args: str) -> None:
    subprocess.run(
        ["runuser", "-u", "postgres", "--", "/usr/lib/postgresql/15/bin/pg_ctl", "-D", node.dir, *args],
        check=True,
        capture_output=True,
    )


def sku_table(conn, table: str, rng: random.Random, orders: int) -> None:
    """Distributed event table `table` in 4 shards with a view `<table>_sku` of SKU_VIEW,
    `orders` orders inserted and refreshed."""
    conn.execute("SET citus.shard_count = 4")
    conn.execute("SELECT eventview.create_event_table(%s, distribute_by => 'event_id')", (table,))
    conn.execute(
        f"SELECT eventview.create_view('{table}_sku', '{table}', event_types => ARRAY['order'], "
        "group_by => %s, measures => %s, time_bucket => '1 day')",
        (SKU_VIEW["group_by"], SKU_VIEW["measures"]),
    )
    insert_orders(conn, table, rng, orders)
    conn.execute(f"SELECT eventview.refresh('{table}_sku')")


def sku_table_with_pending_changes(conn, table: str, rng: random.Random) -> None:
    """`sku_table` with 300 orders, then with inserts and deletes pending."""
    sku_table(conn, table, rng, 300)
    insert_orders(conn, table, rng, 200)
    conn.execute(f"DELETE FROM {table} WHERE event_id % 6 = 1")


def test_a_worker_crash_mid_refresh_leaves_views_consistent(citus):
    rng = random.Random(2662)
    worker = citus.workers[0]
    with citus.connect() as conn:
        sku_table_with_pending_changes(conn, "dcrash", rng)
        before = conn.execute(SKU_READ.format(view="dcrash_sku")).fetchall()
    failed = []

    def refresh() -> None:
        try:
            with citus.connect() as c:
                c.execute("SELECT eventview.refresh('dcrash_sku')")
        except psycopg.Error as e:
            failed.append(e)

    # The first worker's part of the refresh waits for its views' rows, held by a session there,
    # while the other worker's part is done; then the first worker crashes.
    holder = worker.connect(autocommit=False)
    try:
        holder.execute("SELECT 1 FROM eventview._views FOR UPDATE")
        refreshing = threading.Thread(target=refresh)
        refreshing.start()
        waiting = 0
        with worker.connect() as watcher:
            for _ in range(300):
                waiting = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE '%_refresh_shard_view%'"
                ).fetchone()[0]
                if waiting:
                    break
                time.sleep(0.05)
        assert waiting, "the refresh never waited on the first worker"
        pg_ctl(worker, "-m", "immediate", "stop")
        refreshing.join()
        assert len(failed) == 1, failed
    finally:
        with contextlib.suppress(psycopg.Error):
            holder.close()
        if not Path(worker.dir, "postmaster.pid").exists():
            pg_ctl(worker, "-l", f"{worker.dir}/server.log", "-w", "start")
    with citus.connect() as conn:
        try:
            # Nothing of the failed refresh stayed; the next one converges.
            conn.execute("SELECT recover_prepared_transactions()")
            assert conn.execute(SKU_READ.format(view="dcrash_sku")).fetchall() == before
            insert_orders(conn, "dcrash", rng, 50)
            conn.execute("SELECT eventview.refresh('dcrash_sku')")
            sku_check(conn, "dcrash", "dcrash_sku", "after the crash")
        finally:
            conn.execute("SELECT eventview.drop_event_table('dcrash', cascade => true)")


def shard_of(conn, table: str, event_id: int) -> int:
    return conn.execute(
        "SELECT get_shard_id_for_distribution_column(%s, %s)", (table, event_id)
    ).fetchone()[0]


def test_a_key_written_twice_on_a_shard_that_arrived_is_named(citus):
    with citus.connect() as conn:
        conn.execute("SET citus.shard_count = 4")
        conn.execute("SELECT eventview.create_event_table('ddup', distribute_by => 'event_id')")
        try:
            conn.execute("""SELECT eventview.create_view('ddup_n', 'ddup', measures => '{"n": "count(*)"}')""")
            conn.execute(
                "INSERT INTO ddup (event_key, event_type, payload) SELECT 'k' || g, 'order', '{}' FROM generate_series(1, 40) g"
            )
            conn.execute("SELECT eventview.refresh('ddup_n')")
            event_id = conn.execute("SELECT min(event_id) FROM ddup WHERE event_key = 'k1'").fetchone()[0]
            shard = shard_of(conn, "ddup", event_id)
            port = conn.execute("SELECT nodeport FROM citus_shards WHERE shardid = %s", (shard,)).fetchone()[0]
            to = [p for _, p in worker_nodes(conn) if p != port][0]
            conn.execute("SELECT citus_move_shard_placement(%s, '127.0.0.1', %s, '127.0.0.1', %s)", (shard, port, to))
            conn.execute("CALL citus_cleanup_orphaned_resources()")
            # Before any call reaches the shard's new node, its key index is not there.
            twin = next(
                i for i in range(10**6, 10**7) if shard_of(conn, "ddup", i) == shard
            )
            conn.execute(
                "INSERT INTO ddup (event_id, event_key, event_type, payload) OVERRIDING SYSTEM VALUE "
                "VALUES (%s, 'k1', 'order', '{}')",
                (twin,),
            )
            state, got = refusal(conn, "SELECT eventview.refresh('ddup_n')")
            assert state == "23505" and "its event_key 'k1' is there twice" in got, got
            conn.execute("DELETE FROM ddup WHERE event_id = %s", (twin,))
            assert conn.execute("SELECT eventview.refresh('ddup_n')").fetchone()[0] >= 0
            assert conn.execute("SELECT n FROM ddup_n").fetchone() == (40,)
            # Now the key is kept unique there again.
            with pytest.raises(psycopg.errors.UniqueViolation):
                conn.execute(
                    "INSERT INTO ddup (event_id, event_key, event_type, payload) OVERRIDING SYSTEM VALUE "
                    "VALUES (%s, 'k1', 'order', '{}')",
                    (twin,),
                )
        finally:
            conn.execute("SELECT eventview.drop_event_table('ddup', cascade => true)")


def test_refusals_of_isolation_levels_and_isolated_tenants(citus):
    with citus.connect() as conn:
        conn.execute("SET citus.shard_count = 4")
        conn.execute("SELECT eventview.create_event_table('diso', distribute_by => 'event_id')")
        try:
            conn.execute("""SELECT eventview.create_view('diso_n', 'diso', measures => '{"n": "count(*)"}')""")
            conn.execute("INSERT INTO diso (event_type, payload) SELECT 'order', '{}' FROM generate_series(1, 20)")
            for call in ("refresh('diso_n')", "rebuild('diso_n')"):
                with conn.transaction():
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    state, got = refusal(conn, f"SELECT eventview.{call}")
                assert state == "0A000" and "needs a READ COMMITTED transaction" in got, (call, got)
            # A window, where the view has no buckets.
            state, got = refusal(conn, "SELECT eventview.rebuild('diso_n', now() - interval '1 day')")
            assert state == "22023" and "has no time_bucket" in got, got
            # A tenant isolated to a shard of one hash value: refused with a hint, and the
            # table can still be dropped.
            conn.execute(
                "SELECT isolate_tenant_to_new_shard('diso', 1000000000000, 'CASCADE', shard_transfer_mode => 'block_writes')"
            )
            conn.execute("CALL citus_cleanup_orphaned_resources()")
            state, got = refusal(conn, "SELECT eventview.refresh('diso_n')")
            assert state == "55000" and "too narrow a hash range" in got, got
            # run_maintenance warns about it, and goes on with the other tables.
            # (Five shards: not co-located with the table whose tenant was isolated.)
            conn.execute("SET citus.shard_count = 5")
            conn.execute("SELECT eventview.create_event_table('diso_other', distribute_by => 'event_id')")
            try:
                conn.execute("""INSERT INTO diso_other (event_type, payload) SELECT 'order', '{"a": 1}' FROM generate_series(1, 20)""")
                conn.execute("SELECT eventview.run_maintenance()")
                assert conn.execute(
                    "SELECT path, seen FROM eventview.observed_fields WHERE source = 'diso_other'::regclass"
                ).fetchall() == [("$.a", 20)]
            finally:
                conn.execute("SELECT eventview.drop_event_table('diso_other')")
        finally:
            conn.execute("SELECT eventview.drop_event_table('diso', cascade => true)")
        assert sum(workers_count(conn, "SELECT count(*) FROM eventview._views")) == 0
        assert sum(workers_count(conn, "SELECT count(*) FROM eventview._sources")) == 0


def test_monitoring_shows_distributed_views_and_tables(citus):
    rng = random.Random(2699)
    with citus.connect() as conn:
        conn.execute("SET citus.shard_count = 4")
        conn.execute("SELECT eventview.create_event_table('dmon', distribute_by => 'event_id')")
        try:
            conn.execute(
                "SELECT eventview.create_view('dmon_sku', 'dmon', event_types => ARRAY['order'], "
                "group_by => %s, measures => %s, time_bucket => '1 day', on_type_error => 'skip')",
                (SKU_VIEW["group_by"], SKU_VIEW["measures"]),
            )
            insert_orders(conn, "dmon", rng, 300)
            figures = "SELECT source::text, realtime, pending_changes, lag > interval '0', groups, skipped, " \
                      "definition ->> 'time_bucket' FROM eventview.views WHERE name = 'dmon_sku'::regclass"
            assert conn.execute(figures).fetchone() == ("dmon", False, 300, True, 0, 0, "1 day")
            conn.execute("SELECT eventview.refresh('dmon_sku')")
            groups = conn.execute("SELECT count(*) FROM dmon_sku").fetchone()[0]
            assert conn.execute(figures).fetchone() == ("dmon", False, 0, False, groups, 0, "1 day")
            # A qty of the wrong JSON type, on one shard: skipped by the view, and drift that the
            # shard's observer records, once on the coordinator.
            conn.execute("""INSERT INTO dmon (event_type, payload) VALUES ('order', '{"sku": "A", "qty": "three"}')""")
            conn.execute("SELECT eventview.refresh('dmon_sku')")
            assert conn.execute(figures).fetchone()[2:] == (0, False, groups, 1, "1 day")
            drift = ("SELECT change, path, old_type, new_type FROM eventview.drift "
                     "WHERE source = 'dmon'::regclass AND change = 'type_changed' AND path = '$.qty'")
            assert conn.execute(drift).fetchall() == [("type_changed", "$.qty", "number", "string")]
            assert conn.execute(
                "SELECT count(*) = count(DISTINCT (event_type, event_version, path, change, old_type, new_type)) "
                "FROM eventview.drift WHERE source = 'dmon'::regclass"
            ).fetchone()[0]
            conn.execute("SELECT eventview.run_maintenance()")
            assert conn.execute(drift).fetchall() == [("type_changed", "$.qty", "number", "string")]
            # A shard's node answers each drift row once: every row is taken, and one deleted on
            # the coordinator is not put back.
            untaken = ("SELECT count(*) FROM eventview.drift d JOIN eventview._sources s ON s.relid = d.source "
                       "WHERE d.id > s.drift_taken AND d.source::text LIKE 'dmon\\_%'")
            assert workers_count(conn, untaken) == [0, 0]
            assert sum(workers_count(conn, "SELECT count(*) FROM eventview.drift")) > 0
            conn.execute("DELETE FROM eventview.drift WHERE source = 'dmon'::regclass AND change = 'type_changed'")
            conn.execute("SELECT eventview.refresh('dmon_sku')")
            conn.execute("SELECT eventview.run_maintenance()")
            assert conn.execute(drift).fetchall() == []
            # A row that a node's own observer recorded (not a coordinator's call) reaches the
            # coordinator with the next refresh.
            conn.execute("""INSERT INTO dmon (event_type, payload) VALUES ('order', '{"sku": "A", "qty": 1, "gift": true}')""")
            workers_count(conn, "SELECT count(*) FROM (SELECT eventview._observe_all()) o")
            assert sum(workers_count(conn, untaken)) == 1
            gift = "SELECT change, new_type FROM eventview.drift WHERE source = 'dmon'::regclass AND path = '$.gift'"
            assert conn.execute(gift).fetchall() == []
            conn.execute("SELECT eventview.refresh('dmon_sku')")
            assert conn.execute(gift).fetchall() == [("added", "boolean")]
            assert workers_count(conn, untaken) == [0, 0]
            # While another session on a shard's node holds the shard's catalog row (as its own
            # observer does while it runs), a refresh takes none of that shard's drift rows,
            # without waiting; the next refresh takes them.
            event_id = conn.execute(
                """INSERT INTO dmon (event_type, payload) VALUES ('order', '{"sku": "A", "qty": 1, "wrap": "red"}')
                   RETURNING event_id"""
            ).fetchone()[0]
            shard = shard_of(conn, "dmon", event_id)
            port = conn.execute("SELECT nodeport FROM citus_shards WHERE shardid = %s", (shard,)).fetchone()[0]
            workers_count(conn, "SELECT count(*) FROM (SELECT eventview._observe_all()) o")
            assert sum(workers_count(conn, untaken)) == 1
            wrap = "SELECT change FROM eventview.drift WHERE source = 'dmon'::regclass AND path = '$.wrap'"
            with Cluster(f"/tmp/pg_eventview_citus_{port}", port).connect(autocommit=False) as holder:
                holder.execute(
                    "SELECT 1 FROM eventview._sources WHERE relid::text = %s FOR NO KEY UPDATE",
                    (f"dmon_{shard}",),
                ).fetchone()
                conn.execute("SET statement_timeout = '20s'")
                conn.execute("SELECT eventview.refresh('dmon_sku')")
                conn.execute("RESET statement_timeout")
                assert conn.execute(wrap).fetchall() == []
                holder.rollback()
            assert sum(workers_count(conn, untaken)) == 1
            conn.execute("SELECT eventview.refresh('dmon_sku')")
            assert conn.execute(wrap).fetchall() == [("added",)]
            assert workers_count(conn, untaken) == [0, 0]
            # Every shard's observed paths, added up per path and JSON type.
            observed = dict(
                conn.execute(
                    "SELECT path || ' ' || json_type, seen FROM eventview.observed_fields "
                    "WHERE source = 'dmon'::regclass AND event_type = 'order'"
                ).fetchall()
            )
            want = dict(
                conn.execute(
                    """SELECT '$.' || k || ' ' || jsonb_typeof(payload -> k), count(*)
                       FROM dmon, jsonb_object_keys(payload) k WHERE event_type = 'order' GROUP BY 1"""
                ).fetchall()
            )
            assert observed == want
        finally:
            relid = conn.execute("SELECT 'dmon'::regclass::oid").fetchone()[0]
            conn.execute("SELECT eventview.drop_event_table('dmon', cascade => true)")
        assert conn.execute("SELECT count(*) FROM eventview.observed_fields WHERE source::oid = %s", (relid,)).fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM eventview.drift WHERE source::oid = %s", (relid,)).fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM eventview.views WHERE source::oid = %s", (relid,)).fetchone()[0] == 0


def test_monitoring_shows_what_it_knows_while_a_worker_is_down(citus):
    rng = random.Random(2700)
    with citus.connect() as conn:
        # A table of one shard, on the worker that stays up.
        conn.execute("SET citus.shard_count = 1")
        conn.execute("SELECT eventview.create_event_table('dup1', distribute_by => 'event_id')")
        conn.execute("INSERT INTO dup1 (event_type, payload) VALUES ('order', '{}')")
        up = conn.execute("""SELECT n.nodeport FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid)
                             JOIN pg_dist_node n USING (groupid) WHERE s.logicalrelid = 'dup1'::regclass""").fetchone()[0]
        worker = next(w for w in citus.workers if w.port != up)
        sku_table_with_pending_changes(conn, "ddown", rng)
        figures = ("SELECT pending_changes IS NULL, lag IS NULL, quarantined IS NULL, skipped IS NULL, groups "
                   "FROM eventview.views WHERE name = 'ddown_sku'::regclass")
        groups = conn.execute("SELECT count(*) FROM eventview._v{}_data".format(
            conn.execute("SELECT view_id FROM eventview._distributed_views WHERE relid = 'ddown_sku'::regclass").fetchone()[0]
        )).fetchone()[0]
        assert conn.execute(figures).fetchone() == (False, False, False, False, groups)
        # A table on the coordinator alone, observed as the distributed one is.
        conn.execute("SELECT eventview.create_event_table('ddown_local')")
        conn.execute("INSERT INTO ddown_local (event_type, payload) VALUES ('order', '{\"sku\": \"A\"}')")
        conn.execute("SELECT eventview._observe_all()")
        fields = ("SELECT source::text, count(*) FROM eventview.observed_fields "
                  "WHERE source IN ('ddown'::regclass, 'ddown_local'::regclass) GROUP BY 1 ORDER BY 1")
        observed = conn.execute(fields).fetchall()
        assert [t for t, _ in observed] == ["ddown", "ddown_local"], observed
        # A second view of the table, then one of the table on the other worker (after them in
        # eventview.views).
        conn.execute("SELECT eventview.create_view('ddown_n', 'ddown', measures => '{\"n\": \"count(*)\"}')")
        conn.execute("SELECT eventview.create_view('dup1_n', 'dup1', measures => '{\"n\": \"count(*)\"}')")
    pg_ctl(worker, "-m", "fast", "-w", "stop")
    try:
        with citus.connect() as conn:
            warnings = []
            conn.add_notice_handler(lambda d: warnings.append(d.message_primary or ""))
            # The figures the shards give are unknown, the coordinator's are shown, and the
            # monitoring view keeps answering (in a transaction too, which commits).
            with conn.transaction():
                assert conn.execute(figures).fetchone() == (True, True, True, True, groups)
                assert conn.execute("SELECT count(*) FROM eventview.views").fetchone()[0] >= 1
            assert any("ddown_sku are unknown: connection to the" in w for w in warnings), warnings
            # The observed fields of the distributed table are not shown (some shards' counts
            # alone would be wrong), the other tables' are.
            warnings.clear()
            assert conn.execute(fields).fetchall() == [row for row in observed if row[0] == "ddown_local"]
            assert any("observed fields of event table public.ddown are not shown: connection to the" in w
                       for w in warnings), warnings
            # Once a node could not be reached in a statement, the statement's other
            # distributed views with a shard there do not try again (each try may wait for
            # citus.node_connection_timeout), and show the same; a view with no shard there
            # answers; the next statement tries again.
            conn.execute("SET client_min_messages = debug1")
            for _ in range(2):
                warnings.clear()
                unknown_figures = conn.execute(
                    """SELECT name::text, pending_changes IS NULL AND lag IS NULL FROM eventview.views
                       WHERE name IN ('ddown_sku'::regclass, 'ddown_n'::regclass, 'dup1_n'::regclass) ORDER BY 1""").fetchall()
                assert unknown_figures == [("ddown_n", True), ("ddown_sku", True), ("dup1_n", False)]
                unknown = [w for w in warnings if " are unknown: connection to the" in w]
                assert len(unknown) == 2 and unknown[0].split(": ", 1)[1] == unknown[1].split(": ", 1)[1], warnings
                assert sum("not tried again" in w for w in warnings) == 1, warnings
            conn.execute("RESET client_min_messages")
            # Work that needs every shard still fails, with the connection error.
            with pytest.raises(psycopg.OperationalError, match="connection to the remote node"):
                conn.execute("SELECT eventview.refresh('ddown_sku')")
            # In a savepoint of the caller's, and in a PL/pgSQL exception block, too.
            with conn.transaction():
                conn.execute("SAVEPOINT s")
                assert conn.execute(figures).fetchone() == (True, True, True, True, groups)
                conn.execute("RELEASE SAVEPOINT s")
            assert conn.execute(
                """DO $$ BEGIN
                     PERFORM * FROM eventview.views WHERE name = 'ddown_sku'::regclass AND pending_changes IS NULL;
                     IF NOT FOUND THEN RAISE EXCEPTION 'figures known'; END IF;
                   EXCEPTION WHEN division_by_zero THEN NULL;
                   END $$"""
            ) is not None
    finally:
        pg_ctl(worker, "-l", f"{worker.dir}/server.log", "-w", "start")
    with citus.connect() as conn:
        try:
            assert conn.execute(figures).fetchone() == (False, False, False, False, groups)
            assert conn.execute(fields).fetchall() == observed
            conn.execute("SELECT eventview.refresh('ddown_sku')")
            assert conn.execute("SELECT pending_changes FROM eventview.views WHERE name = 'ddown_sku'::regclass").fetchone() == (0,)
        finally:
            conn.execute("SELECT eventview.drop_event_table('ddown', cascade => true)")
            conn.execute("SELECT eventview.drop_event_table('ddown_local')")
            conn.execute("SELECT eventview.drop_event_table('dup1', cascade => true)")


def test_quarantine_on_the_coordinator_holds_every_shards_entries(citus):
    rng = random.Random(2626)
    with citus.connect() as conn:
        conn.execute("SET citus.shard_count = 4")
        conn.execute("CREATE ROLE dq_owner LOGIN")
        conn.execute("CREATE ROLE dq_other LOGIN")
        conn.execute("SELECT eventview.create_event_table('dq', distribute_by => 'event_id')")
        try:
            conn.execute("GRANT CREATE ON SCHEMA public TO dq_owner")
            conn.execute("GRANT SELECT ON dq TO dq_owner")

            def bad(count: int) -> None:
                # Orders whose qty is a string: left out of the view and quarantined.
                conn.execute(
                    """INSERT INTO dq (event_type, payload)
                       SELECT 'order', jsonb_build_object('sku', 'A', 'qty', 'three', 'price', 5)
                       FROM generate_series(1, %s)""",
                    (count,),
                )

            insert_orders(conn, "dq", rng, 80)
            bad(3)
            conn.execute("SET ROLE dq_owner")
            conn.execute(
                "SELECT eventview.create_view('dq_sku', 'dq', event_types => ARRAY['order'], "
                "group_by => %s, measures => %s, time_bucket => '1 day')",
                (SKU_VIEW["group_by"], SKU_VIEW["measures"]),
            )
            conn.execute("RESET ROLE")

            def check(step: str, name: str = "public.dq_sku") -> None:
                got = conn.execute(
                    "SELECT event_id, source::text, view_name, reason ~ 'qty', event IS NOT NULL "
                    "FROM eventview.quarantine WHERE source = 'dq'::regclass ORDER BY event_id"
                ).fetchall()
                want = conn.execute(
                    "SELECT event_id, 'dq', %s, true, true FROM dq WHERE event_type = 'order' "
                    "AND jsonb_typeof(payload -> 'qty') = 'string' ORDER BY event_id",
                    (name,),
                ).fetchall()
                assert got == want, step
                # The view's owner sees them; a role that owns neither the table nor the view
                # does not.
                conn.execute("SET ROLE dq_owner")
                assert conn.execute("SELECT count(*) FROM eventview.quarantine").fetchone()[0] == len(want), step
                conn.execute("SET ROLE dq_other")
                assert conn.execute("SELECT count(*) FROM eventview.quarantine").fetchone()[0] == 0, step
                conn.execute("RESET ROLE")

            check("after the first fill")
            for step, op in enumerate(["insert", "correct", "spoil", "delete", "move", "split", "rebuild", "rename"]):
                if op == "insert":
                    bad(4)
                    insert_orders(conn, "dq", rng, 40)
                elif op == "correct":
                    conn.execute(
                        """UPDATE dq SET payload = payload || '{"qty": 3}' WHERE event_id IN
                           (SELECT event_id FROM dq WHERE payload ->> 'qty' = 'three' ORDER BY event_id LIMIT 2)"""
                    )
                elif op == "spoil":
                    conn.execute(
                        """UPDATE dq SET payload = payload || '{"qty": "nine"}' WHERE event_type = 'order'
                           AND event_id %% 9 = %s""",
                        (rng.randint(0, 8),),
                    )
                elif op == "delete":
                    conn.execute("DELETE FROM dq WHERE payload ->> 'qty' = 'nine' AND event_id % 2 = 0")
                elif op in ("move", "split"):
                    bad(2)
                    (move_a_shard if op == "move" else split_a_shard)(conn, "dq", rng)
                elif op == "rebuild":
                    bad(1)
                    conn.execute("SET ROLE dq_owner")
                    conn.execute("SELECT eventview.rebuild('dq_sku')")
                    conn.execute("RESET ROLE")
                else:
                    conn.execute("ALTER VIEW dq_sku RENAME TO dq_sku_renamed")
                conn.execute("SET ROLE dq_owner")
                conn.execute(f"SELECT eventview.refresh('{'dq_sku_renamed' if op == 'rename' else 'dq_sku'}')")
                conn.execute("RESET ROLE")
                sku_check(conn, "(SELECT * FROM dq WHERE jsonb_typeof(payload -> 'qty') IS DISTINCT FROM 'string') d",
                          "dq_sku_renamed" if op == "rename" else "dq_sku", op)
                check(f"step {step}: {op}", "public.dq_sku_renamed" if op == "rename" else "public.dq_sku")
            # Copies deleted by hand come back at the next refresh, whatever the shards did
            # meanwhile; the name follows a rename at once.
            conn.execute("DELETE FROM eventview.quarantine WHERE id IN (SELECT min(id) FROM eventview._distributed_quarantine)")
            conn.execute("""UPDATE dq SET payload = payload || '{"qty": 1}' WHERE event_id =
                              (SELECT max(event_id) FROM dq WHERE jsonb_typeof(payload -> 'qty') = 'string')""")
            bad(1)
            conn.execute("SELECT eventview.refresh('dq_sku_renamed')")
            check("after a copy was deleted", "public.dq_sku_renamed")
            # A copy deleted with its catalog row, of a shard with more copies.
            gone = conn.execute(
                """WITH victim AS (SELECT id FROM eventview._distributed_quarantine
                                   WHERE shard IN (SELECT shard FROM eventview._distributed_quarantine
                                                   GROUP BY shard HAVING count(*) >= 2)
                                   ORDER BY shard_entry LIMIT 1),
                        m AS (DELETE FROM eventview._distributed_quarantine WHERE id IN (SELECT id FROM victim) RETURNING id)
                   DELETE FROM eventview.quarantine WHERE id IN (SELECT id FROM m) RETURNING id"""
            ).fetchall()
            assert len(gone) == 1
            conn.execute("SELECT eventview.refresh('dq_sku_renamed')")
            check("after a copy and its catalog row were deleted", "public.dq_sku_renamed")
            conn.execute("ALTER VIEW dq_sku_renamed RENAME TO dq_sku_again")
            check("after a rename", "public.dq_sku_again")
            conn.execute("ALTER VIEW dq_sku_again RENAME TO dq_sku_renamed")
            conn.execute("DELETE FROM eventview.quarantine WHERE source = 'dq'::regclass")
            conn.execute("SELECT eventview.refresh('dq_sku_renamed')")
            check("after every copy was deleted", "public.dq_sku_renamed")
            # Copies that kept an old name (renamed while event triggers were off) are neither
            # seen nor deleted through a view of this node renamed to that name.
            conn.execute("SELECT eventview.create_event_table('dq_local')")
            conn.execute("GRANT CREATE ON SCHEMA public TO dq_other")
            conn.execute("GRANT SELECT ON dq_local TO dq_other")
            conn.execute("SET ROLE dq_other")
            conn.execute("""SELECT eventview.create_view('dq_lv', 'dq_local', measures => '{"n": "count(*)"}')""")
            conn.execute("RESET ROLE")
            conn.execute("ALTER EVENT TRIGGER eventview_follow_ddl DISABLE")
            try:
                conn.execute("ALTER VIEW dq_sku_renamed RENAME TO dq_sku_moved")
            finally:
                conn.execute("ALTER EVENT TRIGGER eventview_follow_ddl ENABLE")
            stale_names = "SELECT count(*) FROM eventview.quarantine WHERE view_name = 'public.dq_sku_renamed'"
            copies = conn.execute(stale_names).fetchone()[0]
            assert copies > 0
            conn.execute("SET ROLE dq_other")
            conn.execute("ALTER VIEW dq_lv RENAME TO dq_sku_renamed")
            assert conn.execute("SELECT count(*) FROM eventview.quarantine").fetchone()[0] == 0
            conn.execute("SELECT eventview.drop_view('dq_sku_renamed')")
            conn.execute("RESET ROLE")
            assert conn.execute(stale_names).fetchone()[0] == copies
            conn.execute("SELECT eventview.drop_event_table('dq_local', cascade => true)")
            conn.execute("REVOKE CREATE ON SCHEMA public FROM dq_other")
            conn.execute("ALTER VIEW dq_sku_moved RENAME TO dq_sku_renamed")
            check("after a view of this node took the old name and went", "public.dq_sku_renamed")
            # The view's owner may not delete its entries on the coordinator: they are copies.
            conn.execute("SET ROLE dq_owner")
            conn.execute("DELETE FROM eventview.quarantine")
            conn.execute("RESET ROLE")
            check("after its owner tried to delete them", "public.dq_sku_renamed")
            conn.execute("SELECT eventview.drop_view('dq_sku_renamed')")
            assert conn.execute("SELECT count(*) FROM eventview.quarantine WHERE source = 'dq'::regclass").fetchone()[0] == 0
            assert conn.execute("SELECT count(*) FROM eventview._distributed_quarantine").fetchone()[0] == 0
        finally:
            conn.execute("RESET ROLE")
            conn.execute("SELECT eventview.drop_event_table('dq', cascade => true)")
            conn.execute("REVOKE CREATE ON SCHEMA public FROM dq_owner")
            conn.execute("DROP TABLE IF EXISTS dq_local CASCADE")
            conn.execute("DROP OWNED BY dq_other")
            conn.execute("DROP ROLE dq_owner")
            conn.execute("DROP ROLE dq_other")
        assert conn.execute("SELECT count(*) FROM eventview._distributed_quarantine").fetchone()[0] == 0


def test_a_worker_crash_after_prepare_commits_on_recovery(citus):
    """The refresh's distributed transaction prepared on every worker, committed on the
    coordinator, and one worker crashed before COMMIT PREPARED reached it: Citus's recovery
    commits the worker's prepared part, and the view equals the aggregate from scratch."""
    rng = random.Random(2663)
    worker = citus.workers[0]
    with citus.connect() as conn:
        sku_table_with_pending_changes(conn, "dprep", rng)
    errors = []
    pid = []

    def refresh() -> None:
        try:
            with citus.connect() as c:
                pid.append(c.execute("SELECT pg_backend_pid()").fetchone()[0])
                c.execute("SELECT eventview.refresh('dprep_sku')")
        except psycopg.Error as e:
            errors.append(e)

    admin = citus.connect()
    try:
        # The coordinator's commit waits for a synchronous standby that never comes: after
        # every worker prepared, before COMMIT PREPARED is sent.
        admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        admin.execute("SELECT pg_reload_conf()")
        time.sleep(0.5)
        refreshing = threading.Thread(target=refresh)
        refreshing.start()
        waiting = False
        for _ in range(400):
            waiting = admin.execute(
                "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            ).fetchone()[0]
            if waiting:
                break
            time.sleep(0.05)
        assert waiting, "the refresh never reached its commit"
        with worker.connect() as w:
            assert w.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0] > 0
        pg_ctl(worker, "-m", "immediate", "stop")
        # Committed on the coordinator already: the wait is cancelled, COMMIT PREPARED reaches
        # the other worker only.
        admin.execute("SELECT pg_cancel_backend(%s::integer)", (pid[0],))
        refreshing.join()
    finally:
        admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
        admin.execute("SELECT pg_reload_conf()")
        admin.close()
        if not Path(worker.dir, "postmaster.pid").exists():
            pg_ctl(worker, "-l", f"{worker.dir}/server.log", "-w", "start")
    with citus.connect() as conn:
        try:
            conn.execute("SELECT recover_prepared_transactions()")
            with worker.connect() as w:
                assert w.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0] == 0
            sku_check(conn, "dprep", "dprep_sku", "after recovery")
            insert_orders(conn, "dprep", rng, 50)
            conn.execute("SELECT eventview.refresh('dprep_sku')")
            sku_check(conn, "dprep", "dprep_sku", "after the next refresh")
        finally:
            conn.execute("SELECT eventview.drop_event_table('dprep', cascade => true)")
