"""pg_eventview beside Citus (API.md section 10): a coordinator and two workers of our own on
loopback ports, when Citus is installed for this PostgreSQL; skipped otherwise.

Citus is in no package registry this project installs from: to run this module, build Citus
13.0 by hand from its public source against /usr/lib/postgresql/15/bin/pg_config on the machine
that runs the tests (nothing of Citus is kept in this repository).

Distributed event tables are not supported by this version: these tests hold that every way to
get one is refused with 0A000 and leaves nothing behind, and that event tables on the
coordinator keep working in a database with Citus.
"""

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


def test_distribute_by_is_refused_and_nothing_is_made(citus):
    with citus.connect() as conn:
        for column in ("event_id", "event_key", "EVENT_TYPE"):
            state, message = refusal(
                conn, "SELECT eventview.create_event_table('dist_ev', distribute_by => %s)", column
            )
            assert (state, message) == (
                "0A000",
                "event tables distributed by Citus are not supported by this version of pg_eventview",
            )
        state, message = refusal(conn, "SELECT eventview.create_event_table('dist_ev', distribute_by => 'payload')")
        assert state == "22023" and "distribute_by" in message
        assert conn.execute("SELECT to_regclass('dist_ev')").fetchone()[0] is None
        assert conn.execute("SELECT count(*) FROM pg_dist_partition").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM eventview._sources").fetchone()[0] == 0


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
