#!/usr/bin/env python3
"""pg_eventview against its peers, side by side in one run on one cluster with production settings
(`fsync = on`, `synchronous_commit = on`): the work users compare us on.

Run through bench/run.sh, which starts a throwaway cluster and stops it afterwards:

    bash bench/run.sh --peers            # 1M events, the aggregate per sku and hour (about 150k groups)
    bash bench/run.sh --peers --quick    # smoke run: 100k events
    bash bench/run.sh --peers --big-read-groups 10000000   # also reads at 10M groups

One aggregate everywhere: per sku and hour, count(*), sum(qty) and max(price), over events whose
payloads are ~480 bytes of JSON (bench.py's generator, version-1 payloads only so that every peer
reads the same paths). The subjects:

- plain: a table with the same columns and indexes, no capture (the write floor), and a plain
  table holding the view's rows with a btree index on (sku, bucket) (the read floor);
- pg_eventview: an event table and an incremental view (three views for the write scenarios);
- hand-written: a plain table with an AFTER INSERT statement trigger that logs the new event ids,
  and an apply (INSERT ... SELECT ... GROUP BY ... ON CONFLICT over the logged ids);
- pg_ivm (when installed; skipped with a message otherwise): an IMMV over a plain table, maintained
  in the writer's transaction;
- a materialized view with btree indexes (reads only).

The read floor and the materialized view have a btree index on (sku, bucket) and one on (bucket);
pg_ivm's IMMV has the unique index pg_ivm makes on its GROUP BY columns.

Every measurement alternates its subjects round by round (the order reversed every other round,
one untimed warm-up round first) and reports medians and ratios against the baseline measured in
the same rounds. Nothing asserts on a timing.
"""

import argparse
import os
import random
import statistics
import sys
import threading
import time

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import (GENERATOR_SQL, OUT_DIR, alternate_rounds, fmt, machine_line, q, q1, so_info,  # noqa: E402
                   timed, write_out)

COLS = "event_type, event_version, producer, occurred_at, payload"
END = "2026-06-30T00:00:00Z"
SKU = "payload ->> 'sku'"
BUCKET = "date_bin('1 hour', occurred_at, '2000-01-01 00:00:00+00')"
QTY = "(payload ->> 'qty')::numeric"
PRICE = "(payload ->> 'price')::numeric"
# The view, as pg_eventview, pg_ivm, the materialized view and the hand-written apply compute it.
# Suffix of a subject read with `plan_cache_mode = force_generic_plan` (see `Peers.reads`).
GENERIC = ", generic plan"
AGGREGATE = (f"SELECT {BUCKET} AS bucket, {SKU} AS sku, count(*) AS events, sum({QTY}) AS qty, "
             f"max({PRICE}) AS max_price FROM {{table}} GROUP BY {SKU}, {BUCKET}")
VIEW_ARGS = dict(group_by='{"sku": "$.sku"}',
                 measures='{"events": "count(*)", "qty": "sum($.qty)", "max_price": "max($.price)"}')


def us(seconds):
    return f"{seconds * 1e6:,.0f} us"


class Peers:
    def __init__(self, a):
        self.a = a
        self.conninfo = dict(host=a.host, port=a.port, user="postgres", dbname="postgres")
        self.conn = self.connect()
        self.rows = []      # (section, measure, subject, median, ratio text, target)
        self.notes = []
        self.raw = []       # (section, measure, {subject: [values]}, unit)
        self.ivm = False
        self.delta_at = 0   # next unused row of `deltas`

    def connect(self):
        return psycopg.connect(**self.conninfo, autocommit=True)

    def pairs(self, fns, rounds, between=None):
        return alternate_rounds(fns, rounds, between)

    def report(self, section, measure, times, baseline, targets, unit=fmt):
        """One row per subject of `times`: its median and its ratio to `baseline`'s."""
        base = statistics.median(times[baseline])
        self.raw.append((section, measure, times, unit))
        for label, values in times.items():
            m = statistics.median(values)
            ratio = "baseline" if label == baseline else f"{m / base:.2f}x"
            self.rows.append((section, measure, label, unit(m), ratio, targets.get(label, "")))

    # ------------------------------------------------------------------------------- set-up
    def setup(self):
        c, a = self.conn, self.a
        self.so_at_start, self.load_at_start = so_info(), os.getloadavg()[0]
        q(c, "CREATE EXTENSION IF NOT EXISTS pg_eventview")
        available = q1(c, "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_ivm'")
        preloaded = "pg_ivm" in q1(c, "SHOW shared_preload_libraries")
        if "pg_eventview" not in q1(c, "SHOW shared_preload_libraries"):
            self.notes.append("pg_eventview is not preloaded: writes do not pay for waking the worker.")
        if available and preloaded:
            q(c, "CREATE EXTENSION IF NOT EXISTS pg_ivm")
            self.ivm = True
        else:
            msg = ("pg_ivm is not installed: its columns are skipped (build it from its public source "
                   "and install it into PostgreSQL 15 to compare)") if not available else \
                  "pg_ivm is installed but not in shared_preload_libraries: its columns are skipped"
            print(f"peers: {msg}", file=sys.stderr)
            self.notes.append(msg + ".")
        q(c, GENERATOR_SQL)
        q(c, "SELECT setseed(0.23)")
        random.seed(23)
        log(f"set-up: {a.events:,} events and {a.delta_pool:,} delta events")
        q(c, f"CREATE TABLE stage AS SELECT * FROM bench_gen({a.events}, timestamptz '{END}' - interval '30 days', "
             f"timestamptz '{END}' - interval '1 day', 0.0, true)")
        q(c, f"CREATE TABLE deltas AS SELECT row_number() OVER () AS n, * FROM bench_gen({a.delta_pool}, "
             f"timestamptz '{END}' - interval '1 day', timestamptz '{END}', 0.0, true)")
        q(c, "CREATE UNIQUE INDEX ON deltas (n)")
        avg = q1(c, "SELECT avg(octet_length(payload::text))::int FROM stage")
        self.notes.append(f"Payloads: {avg} bytes of JSON text on average; {a.events:,} events over 29 days, "
                          "deltas in the day after.")
        # pg_eventview: one event table, one view.
        q(c, "SELECT eventview.create_event_table('ev')")
        q(c, f"INSERT INTO ev ({COLS}) SELECT {COLS} FROM stage")
        q(c, "SELECT eventview.create_view('v', 'ev', group_by => %s::json, measures => %s::json, "
             "time_bucket => '1 hour')", (VIEW_ARGS["group_by"], VIEW_ARGS["measures"]))
        q(c, "SELECT eventview.refresh_all()")
        # The write floor: the same columns, defaults and indexes, no capture.
        q(c, "CREATE TABLE plain_ev (LIKE ev INCLUDING ALL)")
        q(c, f"INSERT INTO plain_ev ({COLS}) SELECT {COLS} FROM stage")
        # Hand-written: the id-logging trigger and its summary table.
        q(c, "CREATE TABLE hand_ev (LIKE ev INCLUDING ALL)")
        q(c, "CREATE TABLE hand_log (event_id bigint NOT NULL)")
        q(c, """CREATE FUNCTION hand_log_ids() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN INSERT INTO hand_log SELECT event_id FROM new_rows; RETURN NULL; END $$""")
        q(c, f"INSERT INTO hand_ev ({COLS}) SELECT {COLS} FROM stage")
        q(c, "CREATE TRIGGER hand_log AFTER INSERT ON hand_ev REFERENCING NEW TABLE AS new_rows "
             "FOR EACH STATEMENT EXECUTE FUNCTION hand_log_ids()")
        q(c, "CREATE TABLE hand_summary (bucket timestamptz NOT NULL, sku text, events bigint NOT NULL, "
             "qty numeric, max_price numeric)")
        q(c, f"INSERT INTO hand_summary {AGGREGATE.format(table='hand_ev')}")
        q(c, "CREATE UNIQUE INDEX ON hand_summary (sku, bucket) NULLS NOT DISTINCT")
        # The read floor: the view's rows in a plain table with a btree index.
        q(c, "CREATE TABLE read_floor AS SELECT * FROM v")
        q(c, "CREATE INDEX ON read_floor (sku, bucket)")
        q(c, "CREATE INDEX ON read_floor (bucket)")
        q(c, f"CREATE MATERIALIZED VIEW mv AS {AGGREGATE.format(table='plain_ev')}")
        q(c, "CREATE INDEX ON mv (sku, bucket)")
        q(c, "CREATE INDEX ON mv (bucket)")
        if self.ivm:
            log("set-up: pg_ivm IMMV")
            q(c, "CREATE TABLE ivm_ev (LIKE ev INCLUDING ALL)")
            q(c, f"INSERT INTO ivm_ev ({COLS}) SELECT {COLS} FROM stage")
            # pg_ivm indexes the GROUP BY columns (sku, bucket); the (bucket) index as for the others.
            q(c, "SELECT pgivm.create_immv('immv', %s)", (AGGREGATE.format(table="ivm_ev"),))
            q(c, "CREATE INDEX ON immv (bucket)")
        q(c, "VACUUM ANALYZE")
        # The set-up's WAL becomes recycled segments (min_wal_size): an INSERT that crosses into a
        # new segment then reuses one instead of creating and zero-filling it, as on a server in
        # its steady state.
        q(c, "CHECKPOINT")
        self.groups = q1(c, "SELECT count(*) FROM v")
        self.notes.append(f"The view holds {self.groups:,} groups.")
        rows = q(c, "SELECT sku, bucket FROM read_floor WHERE sku IS NOT NULL ORDER BY random() LIMIT 2000")
        self.keys = rows

    # ------------------------------------------------------------------------------- reads
    def read_round(self, relation, sql, params_list, conn):
        """Median client round trip of one read, over `params_list`, on one connection (psycopg
        prepares a statement after its fifth execution, as an application's driver does)."""
        statement = sql.format(relation=relation)
        times = []
        for params in params_list:
            t0 = time.perf_counter()
            conn.execute(statement, params).fetchall()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def reads(self, label, subjects, keys, rounds):
        """The reads of #1 over `subjects` [(name, relation)]; the first is the baseline. A subject
        named with GENERIC reads on a connection of its own with `plan_cache_mode =
        force_generic_plan`: the tuning docs/reference.md suggests for prepared realtime reads."""
        self.reader = self.connect()
        generic_reader = None
        if any(name.endswith(GENERIC) for name, _ in subjects):
            generic_reader = self.connect()
            q(generic_reader, "SET plan_cache_mode = force_generic_plan")
        readers = {name: generic_reader if name.endswith(GENERIC) else self.reader for name, _ in subjects}
        sample = keys[:self.a.reads]
        kinds = [
            ("point read: sku = $1 AND bucket = $2",
             "SELECT * FROM {relation} WHERE sku = %s AND bucket = %s", sample),
            ("one sku, one day: sku = $1 AND bucket >= $2 AND bucket < $2 + 1 day",
             "SELECT * FROM {relation} WHERE sku = %s AND bucket >= %s AND bucket < %s::timestamptz + interval '1 day'",
             [(s, b, b) for s, b in sample]),
            ("one hour, every sku: bucket >= $1 AND bucket < $1 + 1 hour",
             "SELECT * FROM {relation} WHERE bucket >= %s AND bucket < %s::timestamptz + interval '1 hour'",
             [(b, b) for _, b in sample[: max(20, len(sample) // 10)]]),
        ]
        for measure, sql, params in kinds:
            log(f"reads ({label}): {measure}")
            fns = [(name, (lambda rel, conn: lambda i: self.read_round(rel, sql, params, conn))(rel, readers[name]))
                   for name, rel in subjects]
            t = self.pairs(fns, rounds)
            self.report(f"Reads, {label}", measure, t, subjects[0][0],
                        {"pg_eventview (stored)": "<= 1.5x", "pg_eventview (realtime, nothing pending)": "<= 2x"},
                        unit=us)
        relation = subjects[1][1]
        key = sample[0]
        plan = [r[0].strip() for r in q(self.conn, f"EXPLAIN SELECT * FROM {relation} WHERE sku = %s AND bucket = %s", key)]
        scans = [line for line in plan if "_data" in line and "Scan" in line]
        self.notes.append(f"Point read of {subjects[1][0]} ({label}), how it reads the storage: "
                          + ("; ".join(scans) if scans else " / ".join(plan)))
        self.reader.close()
        if generic_reader:
            generic_reader.close()

    def scenario_reads(self):
        subjects = [("plain table + btree", "read_floor"), ("pg_eventview (stored)", "v")]
        if self.ivm:
            subjects.append(("pg_ivm IMMV", "immv"))
        subjects.append(("materialized view + btree", "mv"))
        self.reads(f"{self.groups // 1000}k groups", subjects, self.keys, self.a.rounds)
        q(self.conn, "SELECT eventview.alter_view('v', realtime => true)")
        self.reads(f"{self.groups // 1000}k groups", [("plain table + btree", "read_floor"),
                                                      ("pg_eventview (realtime, nothing pending)", "v"),
                                                      ("pg_eventview (realtime, nothing pending)" + GENERIC, "v")],
                   self.keys, self.a.rounds)
        q(self.conn, "SELECT eventview.alter_view('v', realtime => false)")

    def scenario_big_reads(self):
        """Reads at `--big-read-groups` groups: one event per group (sku x hour), small payloads."""
        c, n = self.conn, self.a.big_read_groups
        log(f"big reads: {n:,} groups")
        q(c, "SELECT eventview.create_event_table('big_ev')")
        q(c, f"""INSERT INTO big_ev (event_type, occurred_at, payload)
                 SELECT 'view', timestamptz '{END}' - (i % 2000) * interval '1 hour',
                        jsonb_build_object('sku', 'SKU-' || lpad((i / 2000)::text, 7, '0'), 'qty', i % 7, 'price', i % 1000)
                 FROM generate_series(0, {n - 1}) i""")
        q(c, "SELECT eventview.create_view('big_v', 'big_ev', group_by => %s::json, measures => %s::json, "
             "time_bucket => '1 hour')", (VIEW_ARGS["group_by"], VIEW_ARGS["measures"]))
        q(c, "CREATE TABLE big_floor AS SELECT * FROM big_v")
        q(c, "CREATE INDEX ON big_floor (sku, bucket)")
        q(c, "CREATE INDEX ON big_floor (bucket)")
        q(c, "VACUUM ANALYZE big_floor")
        q(c, "ANALYZE")
        keys = q(c, "SELECT sku, bucket FROM big_floor ORDER BY random() LIMIT 2000")
        groups = q1(c, "SELECT count(*) FROM big_floor")
        label = f"{groups / 1e6:.0f}M groups" if groups >= 1_000_000 else f"{groups // 1000}k groups"
        self.reads(label, [("plain table + btree", "big_floor"), ("pg_eventview (stored)", "big_v")], keys, self.a.rounds)
        q(c, "SELECT eventview.alter_view('big_v', realtime => true)")
        self.reads(label, [("plain table + btree", "big_floor"), ("pg_eventview (realtime, nothing pending)", "big_v")],
                   keys, self.a.rounds)

    # ------------------------------------------------------------------------------- writes
    def scenario_writes(self):
        """Single-row autocommit INSERTs (4 sessions, and serial), INSERT ... SELECT and COPY of
        10k events into a table feeding three views, against the same into a plain table."""
        c, a = self.conn, self.a
        log("writes: set-up (three views)")
        q(c, "SELECT eventview.create_event_table('w_ev')")
        q(c, "CREATE TABLE w_plain (LIKE w_ev INCLUDING ALL)")
        q(c, "CREATE TABLE w_hand (LIKE w_ev INCLUDING ALL)")
        q(c, "CREATE TABLE w_hand_log (event_id bigint NOT NULL)")
        q(c, """CREATE FUNCTION w_hand_log_ids() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN INSERT INTO w_hand_log SELECT event_id FROM new_rows; RETURN NULL; END $$""")
        q(c, "CREATE TRIGGER hand_log AFTER INSERT ON w_hand REFERENCING NEW TABLE AS new_rows "
             "FOR EACH STATEMENT EXECUTE FUNCTION w_hand_log_ids()")
        tables = [("plain table", "w_plain"), ("pg_eventview, 3 views", "w_ev"),
                  ("hand-written id-logging trigger", "w_hand")]
        if self.ivm:
            q(c, "CREATE TABLE w_ivm (LIKE w_ev INCLUDING ALL)")
            tables.append(("pg_ivm, 1 IMMV", "w_ivm"))
        prefill = min(100_000, a.events)
        for _, table in tables:
            q(c, f"INSERT INTO {table} ({COLS}) SELECT {COLS} FROM stage LIMIT {prefill}")
        for name, group_by, measures in [
            ("w_sku_hourly", VIEW_ARGS["group_by"], VIEW_ARGS["measures"]),
            ("w_country_daily", '{"country": "$.country"}', '{"events": "count(*)", "revenue": "sum($.price)"}'),
            ("w_campaign_hourly", '{"campaign": "$.campaign"}', '{"events": "count(*)", "min_price": "min($.price)"}'),
        ]:
            q(c, "SELECT eventview.create_view(%s, 'w_ev', group_by => %s::json, measures => %s::json, "
                 "time_bucket => '1 hour')", (name, group_by, measures))
        if self.ivm:
            q(c, "SELECT pgivm.create_immv('w_immv', %s)", (AGGREGATE.format(table="w_ivm"),))
        q(c, "SELECT eventview.refresh_all()")
        q(c, "VACUUM ANALYZE")
        q(c, "CHECKPOINT")
        rows = q(c, f"SELECT {COLS.replace('payload', 'payload::text')} FROM deltas ORDER BY n LIMIT 20000")
        single = f"INSERT INTO {{table}} ({COLS}) VALUES (%s, %s, %s, %s, %s::jsonb)"

        def maintain(i):
            q(c, "SELECT eventview.refresh_all()")
            q(c, "TRUNCATE w_hand_log")

        # 4 sessions of single-row autocommit INSERTs.
        per, n_sessions = a.single_rows, 4
        conns = [self.connect() for _ in range(n_sessions)]

        def sessions(table):
            def run(i):
                barrier = threading.Barrier(n_sessions + 1)
                errors = []

                def worker(k):
                    my = rows[k * per:(k + 1) * per]
                    barrier.wait()
                    try:
                        for r in my:
                            conns[k].execute(single.format(table=table), r)
                    except Exception as e:  # reported below, never swallowed
                        errors.append(e)
                threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_sessions)]
                for th in threads:
                    th.start()
                barrier.wait()
                t0 = time.perf_counter()
                for th in threads:
                    th.join()
                if errors:
                    raise errors[0]
                return time.perf_counter() - t0
            return run

        log(f"writes: 4 sessions x {per} single-row autocommit INSERTs")
        t = self.pairs([(name, sessions(table)) for name, table in tables], a.write_rounds, maintain)
        self.report("Writes", f"4 sessions x {per:,} single-row autocommit INSERTs, wall time", t, "plain table",
                    {"pg_eventview, 3 views": "<= 1.25x"})

        def serial(table):
            def run(i):
                my = rows[:per]
                t0 = time.perf_counter()
                for r in my:
                    conns[0].execute(single.format(table=table), r)
                return (time.perf_counter() - t0) / len(my)
            return run

        log(f"writes: {per} serial single-row autocommit INSERTs")
        t = self.pairs([(name, serial(table)) for name, table in tables], a.write_rounds, maintain)
        self.report("Writes", "one session, single-row autocommit INSERT, time per row", t, "plain table",
                    {"pg_eventview, 3 views": "<= 1.10x"}, unit=us)
        base = statistics.median(t["plain table"])
        for name, values in t.items():
            if name != "plain table":
                self.notes.append(f"Single-row INSERT overhead per row, {name}: {us(statistics.median(values) - base)}.")
        for con in conns:
            con.close()

        batch = a.batch
        q(c, f"CREATE TABLE w_stage AS SELECT {COLS} FROM deltas ORDER BY n LIMIT {batch}")
        buf = bytearray()
        with c.cursor() as cur:
            with cur.copy(f"COPY w_stage ({COLS}) TO STDOUT") as cp:
                for chunk in cp:
                    buf += chunk
        copy_data = bytes(buf)

        def insert_select(table):
            return lambda i: timed(c, f"INSERT INTO {table} ({COLS}) SELECT {COLS} FROM w_stage")

        def copy(table):
            def run(i):
                t0 = time.perf_counter()
                with c.cursor() as cur:
                    with cur.copy(f"COPY {table} ({COLS}) FROM STDIN") as w:
                        w.write(copy_data)
                return time.perf_counter() - t0
            return run

        log(f"writes: INSERT ... SELECT and COPY of {batch:,}")
        t = self.pairs([(name, insert_select(table)) for name, table in tables], a.write_rounds, maintain)
        self.report("Writes", f"INSERT ... SELECT of {batch:,} events", t, "plain table",
                    {"pg_eventview, 3 views": "<= 1.15x"})
        t = self.pairs([(name, copy(table)) for name, table in tables], a.write_rounds, maintain)
        self.report("Writes", f"COPY of {batch:,} events", t, "plain table", {"pg_eventview, 3 views": "<= 1.15x"})

    def scenario_partitioned_writes(self):
        """Writes with idempotency keys into a table partitioned by day: a partitioned event table
        (three views; its keys unique across partitions, which the capture keeps in a key table)
        against a plain table with the same columns, partitions and primary key (whose keys
        nothing can keep unique across partitions)."""
        c, a = self.conn, self.a
        log("partitioned writes: set-up (31 daily partitions, three views)")
        q(c, "SELECT eventview.create_event_table('p_ev', partition_interval => '1 day')")
        q(c, "CREATE TABLE p_plain (LIKE p_ev INCLUDING ALL) PARTITION BY RANGE (occurred_at)")
        q(c, "CREATE TABLE p_plain_default PARTITION OF p_plain DEFAULT")
        for table in ("p_ev", "p_plain"):
            q(c, f"""DO $$ BEGIN FOR d IN 0..31 LOOP
                       EXECUTE format('CREATE TABLE %I PARTITION OF {table} FOR VALUES FROM (%L) TO (%L)',
                                      '{table}_' || d, timestamptz '{END}' - (d + 1) * interval '1 day',
                                      timestamptz '{END}' - d * interval '1 day');
                     END LOOP; END $$""")
            q(c, f"INSERT INTO {table} (event_key, {COLS}) SELECT 'pre-' || g, {COLS} "
                 f"FROM stage, LATERAL (SELECT ctid::text AS g) k LIMIT {min(100_000, a.events)}")
        for name, group_by, measures in [
            ("p_sku_hourly", VIEW_ARGS["group_by"], VIEW_ARGS["measures"]),
            ("p_country_daily", '{"country": "$.country"}', '{"events": "count(*)", "revenue": "sum($.price)"}'),
            ("p_campaign_hourly", '{"campaign": "$.campaign"}', '{"events": "count(*)", "min_price": "min($.price)"}'),
        ]:
            q(c, "SELECT eventview.create_view(%s, 'p_ev', group_by => %s::json, measures => %s::json, "
                 "time_bucket => '1 hour')", (name, group_by, measures))
        q(c, "SELECT eventview.refresh_all()")
        q(c, "VACUUM ANALYZE")
        q(c, "CHECKPOINT")
        tables = [("plain partitioned table", "p_plain"), ("pg_eventview, partitioned, 3 views", "p_ev")]
        rows = q(c, f"SELECT {COLS.replace('payload', 'payload::text')} FROM deltas ORDER BY n LIMIT {a.single_rows}")
        single = f"INSERT INTO {{table}} (event_key, {COLS}) VALUES (%s, %s, %s, %s, %s, %s::jsonb)"
        batch = a.batch
        q(c, f"CREATE TABLE p_stage AS SELECT n, {COLS} FROM deltas ORDER BY n LIMIT {batch}")
        calls = iter(range(10**9))

        def maintain(i):
            q(c, "SELECT eventview.refresh_all()")

        def serial(table):
            def run(i):
                tag = next(calls)
                t0 = time.perf_counter()
                for k, r in enumerate(rows):
                    c.execute(single.format(table=table), (f"s{tag}-{k}", *r))
                return (time.perf_counter() - t0) / len(rows)
            return run

        def insert_select(table):
            return lambda i: timed(c, f"INSERT INTO {table} (event_key, {COLS}) "
                                      f"SELECT 'b{next(calls)}-' || n, {COLS} FROM p_stage")

        def copy(table):
            def run(i):
                buf = bytearray()
                with c.cursor() as cur:
                    with cur.copy(f"COPY (SELECT 'c{next(calls)}-' || n, {COLS} FROM p_stage) TO STDOUT") as cp:
                        for chunk in cp:
                            buf += chunk
                t0 = time.perf_counter()
                with c.cursor() as cur:
                    with cur.copy(f"COPY {table} (event_key, {COLS}) FROM STDIN") as w:
                        w.write(bytes(buf))
                return time.perf_counter() - t0
            return run

        log(f"partitioned writes: {len(rows)} serial single-row autocommit INSERTs with keys")
        t = self.pairs([(name, serial(table)) for name, table in tables], a.write_rounds, maintain)
        self.report("Partitioned writes", "one session, single-row autocommit INSERT with a key, time per row", t,
                    "plain partitioned table", {}, unit=us)
        log(f"partitioned writes: INSERT ... SELECT and COPY of {batch:,} with keys")
        t = self.pairs([(name, insert_select(table)) for name, table in tables], a.write_rounds, maintain)
        self.report("Partitioned writes", f"INSERT ... SELECT of {batch:,} events with keys", t,
                    "plain partitioned table", {})
        t = self.pairs([(name, copy(table)) for name, table in tables], a.write_rounds, maintain)
        self.report("Partitioned writes", f"COPY of {batch:,} events with keys", t, "plain partitioned table", {})

    # ------------------------------------------------------------------------------- maintenance
    def next_delta(self, size):
        lo = self.delta_at
        self.delta_at += size
        if self.delta_at > self.a.delta_pool:
            raise SystemExit("peers: the delta pool is exhausted; raise --delta-pool")
        return lo, self.delta_at

    def hand_apply(self):
        """The hand-written apply: the logged ids' events, grouped, upserted; the log emptied."""
        return f"""WITH taken AS (DELETE FROM hand_log RETURNING event_id),
                        d AS ({AGGREGATE.format(table='hand_ev WHERE event_id = ANY (ARRAY(SELECT event_id FROM taken))')})
                   INSERT INTO hand_summary AS t SELECT * FROM d
                   ON CONFLICT (sku, bucket) DO UPDATE SET events = t.events + EXCLUDED.events,
                       qty = coalesce(t.qty + EXCLUDED.qty, t.qty, EXCLUDED.qty),
                       max_price = GREATEST(t.max_price, EXCLUDED.max_price)"""

    def scenario_maintenance(self):
        """A batch of events into each subject's table, then what keeps its view current: ingest
        overhead (the insert's time beyond the plain table's) plus the refresh or apply."""
        c, a = self.conn, self.a
        batch = a.batch
        tables = [("plain", "plain_ev"), ("pg_eventview", "ev"), ("hand-written", "hand_ev")]
        if self.ivm:
            tables.append(("pg_ivm", "ivm_ev"))
        state = {}

        def between(i):
            state["range"] = self.next_delta(batch)
            # The batch's rows in shared buffers before the first subject reads them.
            q(c, "SELECT sum(octet_length(payload::text)) FROM deltas WHERE n > %s AND n <= %s", state["range"])

        def ins(table):
            return lambda i: timed(c, f"INSERT INTO {table} ({COLS}) SELECT {COLS} FROM deltas "
                                      f"WHERE n > %s AND n <= %s", state["range"])

        log(f"maintenance: batches of {batch:,} events")
        times = {name: [] for name, _ in tables}
        times["pg_eventview refresh"], times["hand-written apply"] = [], []
        hand_sql = self.hand_apply()

        def logged():
            return q1(c, "SELECT extremes_logged FROM eventview._views WHERE relid = 'v'::regclass")

        logged_before = logged_last = None
        for i in range(a.maintenance_rounds + 1):
            between(i)
            if i == 1:
                logged_before = logged_last = logged()
            order = tables if i % 2 == 0 else list(reversed(tables))
            for name, table in order:
                t = ins(table)(i)
                if i > 0:
                    times[name].append(t)
            # What users and the worker run: refresh, the field observer included.
            keep_current = [("pg_eventview refresh", lambda: timed(c, "SELECT eventview.refresh('v')")),
                            ("hand-written apply", lambda: timed(c, hand_sql))]
            for name, fn in (keep_current if i % 2 == 0 else list(reversed(keep_current))):
                t = fn()
                if i > 0:
                    times[name].append(t)
            if i > 0:
                # Every measured refresh appends to the log; a merge would be timed in its round.
                now = logged()
                if now < logged_last:
                    raise SystemExit("peers: a measured refresh merged the value log; raise eventview.extreme_log_limit")
                logged_last = now
        # The min/max value log the measured refreshes appended to, merged into the view's value
        # multiset by the next refresh that finds nothing to apply (or once the log holds
        # eventview.extreme_log_limit values): a cost each batch leaves for later, amortized here
        # over the values each batch logged.
        logged_in_rounds = logged() - logged_before
        logged_total = logged()
        merge = timed(c, "SELECT eventview.refresh('v')")
        merge_per_batch = merge * (logged_in_rounds / a.maintenance_rounds) / logged_total if logged_total else 0.0
        med = {k: statistics.median(v) for k, v in times.items()}
        # Per round: the insert's time beyond the plain table's in the same round, plus what
        # keeps the view current; medians of those.
        rounds = range(len(times["plain"]))
        ev = [times["pg_eventview"][i] - times["plain"][i] + times["pg_eventview refresh"][i] for i in rounds]
        hand = [times["hand-written"][i] - times["plain"][i] + times["hand-written apply"][i] for i in rounds]
        totals = {"hand-written trigger + apply": hand, "pg_eventview": ev,
                  "pg_eventview, value log merge amortized": [t + merge_per_batch for t in ev]}
        if self.ivm:
            totals["pg_ivm (immediate)"] = [times["pg_ivm"][i] - times["plain"][i] for i in rounds]
        section = f"Maintenance per {batch // 1000}k batch, one view"
        self.rows.append((section, "plain INSERT ... SELECT (for reference)", "plain", fmt(med["plain"]), "", ""))
        self.report(section, "ingest overhead + refresh", totals, "hand-written trigger + apply",
                    {"pg_eventview": "<= 1.5x, below pg_ivm"})
        self.raw.append((section, "raw", times, fmt))

        # The field observer's share of a refresh: in rounds of their own, the observer run on
        # its own first, then the refresh (which finds the batch observed).
        log(f"maintenance: the field observer's share, batches of {batch:,} events")
        observer, rest = [], []
        for i in range(a.rounds + 1):
            between(i)
            for _, table in tables:
                ins(table)(i)
            t_observe = timed(c, "SELECT eventview._observe_all()")
            t_refresh = timed(c, "SELECT eventview.refresh('v')")
            q(c, hand_sql)
            if i > 0:
                observer.append(t_observe)
                rest.append(t_refresh)
        self.raw.append((section, "the observer's share", {"field observer": observer,
                                                           "refresh after it": rest}, fmt))
        plain = med["plain"]
        obs, after = statistics.median(observer), statistics.median(rest)
        self.notes.append(
            f"Maintenance per {batch:,}-event batch (medians): ingest overhead pg_eventview "
            f"{fmt(med['pg_eventview'] - plain)}, hand-written {fmt(med['hand-written'] - plain)}; "
            f"pg_eventview refresh {fmt(med['pg_eventview refresh'])}, hand-written apply "
            f"{fmt(med['hand-written apply'])}. Measured apart in rounds of their own: the field observer "
            f"{fmt(obs)}, the rest of the refresh {fmt(after)} ({100 * obs / (obs + after):.0f}% observer). "
            f"The value log of max_price: {logged_in_rounds / a.maintenance_rounds:,.0f} values logged per batch, "
            f"merged into the view's value multiset later ({logged_total:,} values in {fmt(merge)}, "
            f"{fmt(merge_per_batch)} per batch amortized).")

        log("maintenance: refresh of 10 events")
        small = {"pg_eventview refresh": [], "hand-written apply": []}
        for i in range(4 * a.rounds + 1):
            lo, hi = self.next_delta(10)
            for _, table in tables:
                q(c, f"INSERT INTO {table} ({COLS}) SELECT {COLS} FROM deltas WHERE n > %s AND n <= %s", (lo, hi))
            pair = [("pg_eventview refresh", lambda: timed(c, "SELECT eventview.refresh('v')")),
                    ("hand-written apply", lambda: timed(c, hand_sql))]
            for name, fn in (pair if i % 2 == 0 else list(reversed(pair))):
                t = fn()
                if i > 0:
                    small[name].append(t)
        self.report("Maintenance, 10 events", "refresh (observer included) / apply of 10 new events", small,
                    "hand-written apply", {"pg_eventview refresh": "< 3 ms"})
        # Correctness of what was compared: the view equals the hand-written summary.
        diff = q1(c, """SELECT count(*) FROM (
                          (SELECT bucket, sku, events, qty, max_price FROM v EXCEPT
                           SELECT bucket, sku, events, qty, max_price FROM hand_summary)
                          UNION ALL
                          (SELECT bucket, sku, events, qty, max_price FROM hand_summary EXCEPT
                           SELECT bucket, sku, events, qty, max_price FROM v)) d""")
        self.notes.append(f"Check after the maintenance rounds: the view and the hand-written summary differ "
                          f"in {diff} rows (0 expected).")
        if self.ivm:
            diff = q1(c, """SELECT count(*) FROM (
                              (SELECT bucket, sku, events, qty, max_price FROM v EXCEPT
                               SELECT bucket, sku, events, qty, max_price FROM immv)
                              UNION ALL
                              (SELECT bucket, sku, events, qty, max_price FROM immv EXCEPT
                               SELECT bucket, sku, events, qty, max_price FROM v)) d""")
            self.notes.append(f"Check: the view and the pg_ivm IMMV differ in {diff} rows (0 expected).")

    # ------------------------------------------------------------------------------- output
    def write(self, started):
        line, settings = machine_line(self.conn, self.so_at_start, self.load_at_start, self.notes,
                                      settings=("shared_buffers", "fsync", "synchronous_commit", "wal_level",
                                                "shared_preload_libraries", "eventview.worker", "jit"))
        out = ["# pg_eventview against its peers", "", f"Machine: {line}", "", f"Settings: {settings}", "",
               f"Run time: {time.perf_counter() - started:.0f} s", "",
               "| section | measure | subject | median | ratio | target |", "|---|---|---|---:|---:|---|"]
        out += [f"| {' | '.join(row)} |" for row in self.rows]
        out += ["", "Notes:", ""] + [f"- {n}" for n in self.notes]
        out += ["", "Every round (medians above are of these):", ""]
        for section, measure, times, unit in self.raw:
            for label, values in times.items():
                out.append(f"- {section}, {measure}, {label}: {', '.join(unit(v) for v in values)}")
        text = "\n".join(out) + "\n"
        write_out(self.a.out, text)
        print(text)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=55440)
    p.add_argument("--quick", action="store_true", help="smoke run: 100k events, 3 rounds")
    p.add_argument("--events", type=int, help="events in the table (default 1M, quick 100k)")
    p.add_argument("--rounds", type=int, help="timed rounds per measurement (default 7, quick 3)")
    p.add_argument("--reads", type=int, help="reads per round (default 1000, quick 200)")
    p.add_argument("--single-rows", type=int, help="single-row INSERTs per session and round (default 500, quick 100)")
    p.add_argument("--big-read-groups", type=int, default=0, help="also measure reads at this many groups (e.g. 10000000)")
    p.add_argument("--only", default="reads,writes,partitioned,maintenance",
                   help="comma-separated: reads, writes, partitioned, maintenance")
    p.add_argument("--out", default=os.path.join(OUT_DIR, "peers.md"))
    a = p.parse_args()
    a.events = a.events or (100_000 if a.quick else 1_000_000)
    a.rounds = a.rounds or (3 if a.quick else 7)
    # The write measures are short and move with the disk's flushes: more rounds.
    a.write_rounds = 2 * a.rounds + 1
    # So is maintenance, whose figure takes the plain insert's time from each side's insert.
    a.maintenance_rounds = a.write_rounds
    a.reads = a.reads or (200 if a.quick else 1000)
    a.single_rows = a.single_rows or (100 if a.quick else 500)
    a.batch = 10_000
    a.delta_pool = (a.maintenance_rounds + a.rounds + 2) * a.batch + (4 * a.rounds + 1) * 10 + 1000
    only = {s.strip() for s in a.only.split(",")}
    started = time.perf_counter()
    b = Peers(a)
    b.setup()
    if "reads" in only:
        b.scenario_reads()
    if "writes" in only:
        b.scenario_writes()
    if "partitioned" in only:
        b.scenario_partitioned_writes()
    if "maintenance" in only:
        b.scenario_maintenance()
    if a.big_read_groups:
        b.scenario_big_reads()
    b.write(started)


if __name__ == "__main__":
    main()
