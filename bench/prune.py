#!/usr/bin/env python3
"""pg_eventview pruning benchmark: prune a changelog of N records (4M by
default) that every view has applied, and show that it works in bounded transactions without
holding up producers.

Set-up: an event table of 10k events feeding one view; N/10k UPDATE statements of all 10k
events make N changelog records ('U' rows); one refresh applies them; delta_retention is one
second, so all of them may go. Twice:
- by DELETE: no prune runs while the records are written, so they outrun the changelog's first
  segment into its default partition, and go by the batched DELETE (as every changelog record
  went before changelog segments; as those of a segment still filling do);
- by segments: segments of 1M records (eventview.changelog_segment_min and _max), made ahead by
  a prune after each UPDATE, as run_maintenance makes them; complete and applied, each goes by
  one TRUNCATE, then a DROP.
Measured each time:
- `eventview.prune()` called until it returns 0: calls, time per call (each call is one
  transaction), total time, records/s and WAL written;
- meanwhile a producer inserting 10-row batches in its own connection: its latency p50/p99
  during pruning against the same producer right before (baseline, same run);
- for comparison, the naive way on an identical changelog: one `DELETE FROM` of every record
  in a single transaction, and `TRUNCATE` (what rotating changelog tables would cost).
Then raw events past retention (--events, 2M by default): the same events, four days old, in a
plain event table and in one partitioned by day (API.md section 7), each with an idempotency key
per event, and in a partitioned one without keys; each with `retention => '1 day'` and a view
that applied them. `eventview.prune()` until it returns 0 on each: calls, time, WAL written, and
the views unchanged (pruning is not a retraction).
Results go to bench/out/prune_results.md with the machine line."""

import argparse
import os
import statistics
import sys
import threading
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (machine line)

EVENTS = 10_000


def connect(args, dbname=None):
    return bench.connect_to(args, dbname)


def one(conn, sql, params=None):
    return conn.execute(sql, params).fetchone()[0]


def build_changelog(conn, table, records, segment=None):
    """An event table whose changelog holds `records` applied records; returns its changelog.
    With `segment`, in segments of that many records, made ahead as the records come."""
    if segment:
        conn.execute(f"SET eventview.changelog_segment_min = {segment}")
        conn.execute(f"SET eventview.changelog_segment_max = {segment}")
    conn.execute(f"SELECT eventview.create_event_table('{table}', delta_retention => '1 second')")
    conn.execute(f"""SELECT eventview.create_view('{table}_by_type', '{table}',
                     group_by => '{{"kind": "$.kind"}}', measures => '{{"n": "count(*)", "v": "sum($.v)"}}')""")
    conn.execute(f"""INSERT INTO {table} (event_type, payload)
                     SELECT 'e', jsonb_build_object('kind', i % 10, 'v', 0, 'pad', repeat('x', 300))
                     FROM generate_series(1, {EVENTS}) i""")
    rounds = records // EVENTS
    for r in range(rounds):
        conn.execute(f"UPDATE {table} SET payload = jsonb_set(payload, '{{v}}', to_jsonb({r + 1}))")
        if segment:
            conn.execute(f"SELECT eventview.prune('{table}')")
    conn.execute("RESET eventview.changelog_segment_min")
    conn.execute("RESET eventview.changelog_segment_max")
    conn.execute(f"SELECT eventview.refresh('{table}_by_type')")
    source_id = one(conn, f"SELECT source_id FROM eventview._sources WHERE relid = '{table}'::regclass")
    log = f"eventview._changes_{source_id}"
    time.sleep(1.1)  # past delta_retention
    return log, one(conn, f"SELECT count(*) FROM {log}")


class Producer(threading.Thread):
    """Inserts 10-row batches back to back and records each statement's latency."""

    def __init__(self, args, table):
        super().__init__(daemon=True)
        self.conn = connect(args)
        self.table = table
        self.lat = []
        self.phase = "baseline"
        self.stop = False

    def run(self):
        while not self.stop:
            t = time.perf_counter()
            self.conn.execute(f"""INSERT INTO {self.table} (event_type, payload)
                                  SELECT 'e', jsonb_build_object('kind', i, 'v', 1) FROM generate_series(1, 10) i""")
            self.lat.append((self.phase, time.perf_counter() - t))
            time.sleep(0.005)


def retention(conn, events):
    """Raw events past retention: DELETE from a plain event table against dropping the
    partitions of a partitioned one. Returns result rows."""
    rows = []
    for table, partitioned, keyed in [("rp", False, True), ("rq", True, True), ("rn", True, False)]:
        if partitioned:
            conn.execute(f"SELECT eventview.create_event_table('{table}', retention => '1 day', partition_interval => '1 day')")
            for d in range(2, 6):
                conn.execute(f"""CREATE TABLE {table}_old{d} PARTITION OF {table} FOR VALUES
                                 FROM (date_bin('1 day', now() - interval '{d} days', '2000-01-01 00:00:00+00'))
                                 TO (date_bin('1 day', now() - interval '{d} days', '2000-01-01 00:00:00+00') + interval '1 day')""")
        else:
            conn.execute(f"SELECT eventview.create_event_table('{table}', retention => '1 day')")
        key = "'k' || i" if keyed else "NULL"
        conn.execute(f"""INSERT INTO {table} (event_key, event_type, occurred_at, payload)
                         SELECT {key}, 'e', now() - interval '4 days' + (i % 86400) * interval '1 second',
                                jsonb_build_object('kind', i % 10, 'v', i % 7, 'pad', repeat('x', 300))
                         FROM generate_series(1, {events}) i""")
        conn.execute(f"""SELECT eventview.create_view('{table}_by_kind', '{table}',
                         group_by => '{{"kind": "$.kind"}}', measures => '{{"n": "count(*)", "v": "sum($.v)"}}')""")
        conn.execute("CHECKPOINT")
        before = conn.execute(f"SELECT * FROM {table}_by_kind ORDER BY 1").fetchall()
        size = one(conn, f"SELECT pg_size_pretty(sum(pg_total_relation_size(relid))) FROM pg_partition_tree('{table}')"
                         if partitioned else f"SELECT pg_size_pretty(pg_total_relation_size('{table}'))")
        lsn = one(conn, "SELECT pg_current_wal_lsn()")
        calls, t0 = 0, time.perf_counter()
        pruned = 0
        while True:
            got = one(conn, f"SELECT eventview.prune('{table}')")
            calls += 1
            pruned += got
            if got == 0:
                break
        took = time.perf_counter() - t0
        wal = one(conn, "SELECT pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), %s))", (lsn,))
        left = one(conn, f"SELECT count(*) FROM {table}")
        conn.execute(f"SELECT eventview.refresh('{table}_by_kind')")
        unchanged = conn.execute(f"SELECT * FROM {table}_by_kind ORDER BY 1").fetchall() == before
        kind = ("partitioned by day (drops 4 partitions)" if partitioned else "plain (deletes in batches)") \
            + (", with keys" if keyed else ", no keys")
        rows.append(f"| {events:,} events past retention ({size}), {kind} | {calls} calls, {took:.2f} s, "
                    f"{pruned:,} events, WAL {wal}; {left} left; view unchanged: {'yes' if unchanged else 'NO'} |")
        if left or not unchanged:
            sys.exit(f"retention on {table}: {left} events left, view unchanged: {unchanged}")
    return rows


def prune_until_done(args, conn, table, log):
    """`eventview.prune(table)` until it returns 0, with a producer writing the table meanwhile:
    calls (records, seconds), WAL, the producer's latencies before and during, records left."""
    last_seq = one(conn, f"SELECT max(seq) FROM {log}")
    producer = Producer(args, table)
    producer.start()
    time.sleep(3)
    conn.execute("CHECKPOINT")
    lsn = one(conn, "SELECT pg_current_wal_lsn()")
    producer.phase = "prune"
    calls = []
    while True:
        t = time.perf_counter()
        got = one(conn, f"SELECT eventview.prune('{table}')")
        calls.append((got, time.perf_counter() - t))
        if got == 0:
            break
    wal = one(conn, "SELECT pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), %s))", (lsn,))
    producer.phase = "after"
    time.sleep(1)
    producer.stop = True
    producer.join()
    # (The producer's own records are recent: they stay.)
    left = one(conn, f"SELECT count(*) FROM {log} WHERE seq <= %s", (last_seq,))
    return {"calls": calls, "wal": wal, "left": left,
            "base": [x for p, x in producer.lat if p == "baseline"],
            "during": [x for p, x in producer.lat if p == "prune"]}


def pruning_rows(what, r):
    calls = r["calls"]
    pruned = sum(g for g, _ in calls)
    total = sum(t for _, t in calls)
    working = [t for g, t in calls if g] or [0.0]
    return [
        f"| {what}: `eventview.prune()` until it returns 0 | {len(calls)} calls ({len(calls) - 1} pruning), "
        f"{total:.2f} s in total, {pruned / total:,.0f} records/s, WAL {r['wal']}; {r['left']} records left |",
        f"| {what}: time per pruning call (one transaction each) | median {statistics.median(working) * 1000:.0f} ms, "
        f"max {max(working) * 1000:.0f} ms |",
        f"| {what}: producer, 10-row INSERT, before pruning | p50 {pct(r['base'], 50) * 1000:.2f} ms, "
        f"p99 {pct(r['base'], 99) * 1000:.2f} ms ({len(r['base'])} statements) |",
        f"| {what}: producer, 10-row INSERT, while pruning | p50 {pct(r['during'], 50) * 1000:.2f} ms, "
        f"p99 {pct(r['during'], 99) * 1000:.2f} ms ({len(r['during'])} statements) |",
    ]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=55470)
    ap.add_argument("--dbname", default="prune")
    ap.add_argument("--records", type=int, default=4_000_000)
    ap.add_argument("--events", type=int, default=2_000_000, help="raw events past retention")
    ap.add_argument("--segment", type=int, default=1_000_000, help="records per changelog segment")
    ap.add_argument("--quick", action="store_true", help="400k records, 200k events")
    ap.add_argument("--out", default=os.path.join(bench.OUT_DIR, "prune_results.md"),
                    help="results file (default bench/out/prune_results.md)")
    args = ap.parse_args()
    if args.quick:
        args.records = 400_000
        args.events = 200_000
        args.segment = 100_000
    so_at_start, load_at_start = bench.so_info(), os.getloadavg()[0]
    with connect(args, "postgres") as c:
        c.execute(f'DROP DATABASE IF EXISTS "{args.dbname}"')
        c.execute(f'CREATE DATABASE "{args.dbname}"')
    conn = connect(args)
    conn.execute("CREATE EXTENSION pg_eventview")
    t0 = time.perf_counter()
    log, n = build_changelog(conn, "ev", args.records)
    size_before = one(conn, f"SELECT pg_size_pretty(sum(pg_total_relation_size(relid))) FROM pg_partition_tree('{log}')")
    print(f"prune: changelog {log} holds {n:,} applied records ({size_before}), built in "
          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)

    by_delete = prune_until_done(args, conn, "ev", log)
    log_s, n_s = build_changelog(conn, "evs", args.records, segment=args.segment)
    size_s = one(conn, f"SELECT pg_size_pretty(sum(pg_total_relation_size(relid))) FROM pg_partition_tree('{log_s}')")
    segments = one(conn, f"SELECT count(*) - 1 FROM pg_partition_tree('{log_s}') WHERE isleaf")
    print(f"prune: changelog {log_s} holds {n_s:,} applied records ({size_s}) in {segments} segments",
          file=sys.stderr)
    by_segments = prune_until_done(args, conn, "evs", log_s)
    left = by_delete["left"] + by_segments["left"]
    max_rows = one(conn, "SELECT current_setting('eventview.prune_max_rows')")

    # The naive ways, on an identical changelog.
    log2, n2 = build_changelog(conn, "ev2", args.records)
    t = time.perf_counter()
    conn.execute(f"DELETE FROM {log2}")
    one_delete = time.perf_counter() - t
    conn.execute(f"SELECT eventview.create_event_table('ev3')")
    log3 = f"eventview._changes_{one(conn, 'SELECT source_id FROM eventview._sources WHERE relid = ' + repr('ev3') + '::regclass')}"
    conn.execute(f"INSERT INTO {log3} (op, event_id) SELECT 'U', i FROM generate_series(1, {args.records}) i")
    t = time.perf_counter()
    conn.execute(f"TRUNCATE {log3}")
    truncate = time.perf_counter() - t

    print(f"prune: raw events past retention, {args.events:,} per table", file=sys.stderr)
    retention_rows = retention(conn, args.events)

    notes = []
    machine, settings = bench.machine_line(conn, so_at_start, load_at_start, notes)
    lines = [
        "# pg_eventview pruning benchmark",
        "",
        f"Machine: {machine}",
        f"Settings: {settings}",
        "",
        f"Changelogs of {n:,} records applied by every consumer, past delta_retention: by DELETE "
        f"({size_before}; prune_max_rows = {int(max_rows):,} a call), and by segments of {args.segment:,} "
        f"records ({size_s}, {segments} segments).",
        "",
        "| what | result |",
        "|---|---|",
        *pruning_rows("by DELETE", by_delete),
        *pruning_rows(f"by segments of {args.segment:,}", by_segments),
        f"| baseline: one `DELETE FROM` of all {n2:,} records, one transaction | {one_delete:.2f} s |",
        f"| baseline: `TRUNCATE` of a {args.records:,}-record changelog (rotation) | {truncate * 1000:.0f} ms |",
        "",
        "Raw events past retention, `eventview.prune()` until it returns 0:",
        "",
        "| what | result |",
        "|---|---|",
        *retention_rows,
        "",
        "Raw timings of the prune calls (records, seconds), by DELETE: "
        + ", ".join(f"({g}, {t:.3f})" for g, t in by_delete["calls"]),
        "",
        "By segments: " + ", ".join(f"({g}, {t:.3f})" for g, t in by_segments["calls"]),
    ] + [f"- {x}" for x in notes]
    text = "\n".join(lines) + "\n"
    bench.write_out(args.out, text)
    print(text)
    if left:
        sys.exit(f"prune left {left} records behind")


if __name__ == "__main__":
    main()
