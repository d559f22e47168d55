"""Integration-test fixtures: one throwaway PostgreSQL 15 cluster per test session, one fresh
database (with `CREATE EXTENSION pg_eventview`) per test.

The cluster is started with scripts/cluster.sh (initdb + pg_ctl as the `postgres` OS user) in
/tmp/pg_eventview_it_<port>, port 55432 unless PGEV_IT_PORT says otherwise, and stopped at the
end of the session. Tests connect over the unix socket in that directory as user postgres.
"""

import itertools
import os
import re
import subprocess
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

REPO = Path(__file__).resolve().parent.parent
CLUSTER_SH = REPO / "scripts" / "cluster.sh"


class Cluster:
    def __init__(self, directory: str, port: int):
        self.dir = directory
        self.port = port
        self._names = itertools.count(1)

    def conninfo(self, dbname: str = "postgres") -> str:
        return f"host={self.dir} port={self.port} user=postgres dbname={dbname}"

    def connect(self, dbname: str = "postgres", autocommit: bool = True, **kw) -> psycopg.Connection:
        return psycopg.connect(self.conninfo(dbname), autocommit=autocommit, **kw)

    def server_log_tail(self, lines: int = 60) -> str:
        try:
            text = Path(self.dir, "server.log").read_text(errors="replace")
        except OSError as e:
            return f"(no server log: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def create_database(self, hint: str = "t", version: str | None = None) -> str:
        """Creates a fresh database with the extension (at `version`, default the current one);
        returns its connection string."""
        base = re.sub(r"[^a-z0-9_]", "_", hint.lower())[:40]
        name = f"it_{next(self._names)}_{base}"
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        # Another engineer may be reinstalling the extension at this moment: retry a little.
        last = None
        for _ in range(30):
            try:
                with self.connect(name) as conn:
                    if version is None:
                        conn.execute("CREATE EXTENSION pg_eventview")
                    else:
                        conn.execute(sql.SQL("CREATE EXTENSION pg_eventview VERSION {}").format(sql.Literal(version)))
                return self.conninfo(name)
            except psycopg.Error as e:  # pragma: no cover - only while a reinstall is in flight
                last = e
                time.sleep(2)
        raise RuntimeError(f"CREATE EXTENSION pg_eventview kept failing: {last}")

    def drop_database(self, conninfo: str) -> None:
        name = conninfo.rsplit("dbname=", 1)[1]
        try:
            with self.connect() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except psycopg.Error:
            pass


@pytest.fixture(scope="session")
def cluster():
    port = int(os.environ.get("PGEV_IT_PORT", "55432"))
    directory = f"/tmp/pg_eventview_it_{port}"
    subprocess.run(["bash", str(CLUSTER_SH), "start", directory, str(port)], check=True)
    c = Cluster(directory, port)
    try:
        yield c
    finally:
        subprocess.run(["bash", str(CLUSTER_SH), "stop", directory], check=False)


@pytest.fixture
def new_db(cluster, request):
    """Factory: new_db() -> connection string of a fresh database with pg_eventview installed.
    The databases are dropped after the test."""
    made = []

    def make(suffix: str = "", version: str | None = None) -> str:
        info = cluster.create_database(request.node.name + suffix, version)
        made.append(info)
        return info

    yield make
    for info in made:
        cluster.drop_database(info)


@pytest.fixture
def db(new_db) -> str:
    """Connection string of a fresh database with pg_eventview installed."""
    return new_db()
