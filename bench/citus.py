#!/usr/bin/env python3
"""pg_eventview benchmark on Citus (API.md section 10, issue #26).

A coordinator and two workers (bench/citus.sh starts them); the event table `ev_dist` is
distributed by event_id in 32 shards and feeds three views (per SKU and day: count, sum, avg,
max; per country: count; per event type and hour: count, sum). On the coordinator, the same
three views over a single-node event table `ev_local` are the baseline of refresh and reads.

- Ingest: an `INSERT ... SELECT` of 10k events through the coordinator into `ev_dist`, against
  the same insert into `plain_dist`, the same table distributed the same way without capture
  (target: at most 1.3x).
- Refresh: after 10k new events in each table, the refresh of the per-SKU view over `ev_dist`
  (every shard on its node) against the same view's refresh over `ev_local` (target: at most
  2x).
- Refresh with a drift history: the same refresh after events with 600 new payload paths,
  most of them on every shard, which each shard's observer records as drift, against the
  refresh before them (no target: a refresh hands the coordinator only new drift rows).
- Point read: one SKU and day from the per-SKU view over `ev_dist` (the coordinator's storage
  of the groups merged from every shard's) against the same read of the view over `ev_local`
  (target: at most 3x).

Every node preloads pg_eventview, with its background worker off (the benchmark calls refresh
itself), as docs/reference.md advises for the nodes of a Citus cluster. Paired rounds,
alternating, after an untimed warm-up; medians. Every view is checked against
its aggregate from scratch at the end. Results go to bench/out/citus_results.md with the
machine line."""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (machine line, timing helpers)

one = bench.q1
timed = bench.timed

ENVELOPE = """(
    event_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_key     text,
    event_type    text NOT NULL CHECK (event_type <> ''),
    event_version integer NOT NULL DEFAULT 1 CHECK (event_version >= 1),
    producer      text NOT NULL DEFAULT current_user,
    occurred_at   timestamptz NOT NULL DEFAULT now(),
    ingested_at   timestamptz NOT NULL DEFAULT now(),
    payload       jsonb NOT NULL CHECK (jsonb_typeof(payload) = 'object'))"""

# n events over ten days, 500 SKUs, 20 countries, three event types.
EVENTS = """SELECT (ARRAY['view', 'cart', 'purchase'])[1 + floor(random() * 3)::int],
       timestamptz '2026-11-01' + random() * interval '10 days',
       jsonb_build_object('sku', 'SKU-' || lpad((random() * 499)::int::text, 3, '0'),
                          'qty', 1 + (random() * 9)::int,
                          'price', round((1 + random() * 99)::numeric, 2),
                          'country', 'C' || (random() * 19)::int,
                          'note', repeat('x', 200))
FROM generate_series(1, %s)"""

# Events of as many payload paths as WIDE_PATHS, enough of them for every shard to see most.
WIDE_PATHS = 600
WIDE_EVENTS = f"""SELECT 'view', timestamptz '2026-11-01' + random() * interval '10 days',
       jsonb_build_object('sku', 'SKU-' || lpad((random() * 499)::int::text, 3, '0'),
                          'qty', 1, 'price', 1.0, 'country', 'C1', 'attr_' || (i % {WIDE_PATHS}), i)
FROM generate_series(1, {WIDE_PATHS * 64}) i"""

VIEWS = [
    ("sku_daily", """group_by => '{"sku": "$.sku"}',
        measures => '{"n": "count(*)", "qty": "sum($.qty)", "avg_price": "avg($.price)", "top": "max($.price)"}',
        time_bucket => '1 day'"""),
    ("by_country", """group_by => '{"country": "$.country"}', measures => '{"n": "count(*)"}'"""),
    ("type_hourly", """group_by => '{"type": "event_type"}',
        measures => '{"n": "count(*)", "qty": "sum($.qty)"}', time_bucket => '1 hour'"""),
]

FROM_SCRATCH = """SELECT date_bin('1 day', occurred_at, '2000-01-01 00:00:00+00'), payload->>'sku', count(*),
       sum((payload->>'qty')::numeric), round(avg((payload->>'price')::numeric), 8), max((payload->>'price')::numeric)
FROM {table} GROUP BY 1, 2 ORDER BY 1, 2"""
READ_ALL = "SELECT bucket, sku, n, qty, round(avg_price, 8), top FROM {view} ORDER BY 1, 2"
POINT_READ = "SELECT * FROM {view} WHERE sku = %s AND bucket = %s"


def insert(conn, table, n):
    conn.execute(f"INSERT INTO {table} (event_type, occurred_at, payload) {EVENTS % n}")


def setup(conn, base, shards):
    conn.execute(f"SET citus.shard_count = {shards}")
    conn.execute("SELECT eventview.create_event_table('ev_dist', distribute_by => 'event_id')")
    conn.execute(f"CREATE TABLE plain_dist {ENVELOPE}")
    conn.execute("SELECT create_distributed_table('plain_dist', 'event_id')")
    conn.execute("SELECT eventview.create_event_table('ev_local')")
    for table in ("ev_dist", "plain_dist", "ev_local"):
        insert(conn, table, base)
    for name, definition in VIEWS:
        for table, prefix in (("ev_dist", "d"), ("ev_local", "l")):
            conn.execute(f"SELECT eventview.create_view('{prefix}_{name}', '{table}', {definition})")
    conn.execute("ANALYZE")


def analyze_every_node(args):
    """ANALYZE on every node, as autovacuum does within a minute or so of a burst of writes.
    While autovacuum analyzes the shards' tables, each analyze makes the workers prepare the
    statements of a realtime read over those tables again (see BENCHMARKS.md); after this,
    nothing is left for it to analyze."""
    for i in (0, 1, 2):
        with bench.connect_to(argparse.Namespace(host=args.host, port=args.port + i, dbname=args.dbname)) as c:
            c.execute("ANALYZE")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=55470, help="the coordinator's; the workers' follow it")
    ap.add_argument("--dbname", default="postgres")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--base", type=int, default=200_000, help="events in each table before the rounds")
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="20k events before 3 rounds")
    ap.add_argument("--out", default=os.path.join(bench.OUT_DIR, "citus_results.md"))
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.base = 3, 20_000
    so_at_start, load_at_start = bench.so_info(), os.getloadavg()[0]
    for i in (1, 2):
        with bench.connect_to(argparse.Namespace(host=args.host, port=args.port + i, dbname="postgres")) as w:
            w.execute("CREATE EXTENSION citus")
    conn = bench.connect_to(args)
    conn.execute("CREATE EXTENSION citus")
    conn.execute("SELECT citus_set_coordinator_host(%s, %s)", (args.host, args.port))
    for i in (1, 2):
        conn.execute("SELECT citus_add_node(%s, %s)", (args.host, args.port + i))
    conn.execute("CREATE EXTENSION pg_eventview")
    conn.execute("SELECT setseed(0.26)")
    bench.log(f"citus: {args.base:,} events in each table, {args.shards} shards, 3 views each")
    setup(conn, args.base, args.shards)

    bench.log(f"citus: ingest, {args.rounds} rounds of {args.batch:,} events")
    sql = f"INSERT INTO {{}} (event_type, occurred_at, payload) {EVENTS % args.batch}"
    ingest = bench.alternate_rounds(
        [("captured", lambda i: timed(conn, sql.format("ev_dist"))),
         ("plain", lambda i: timed(conn, sql.format("plain_dist")))], args.rounds)

    bench.log(f"citus: refresh, {args.rounds} rounds of {args.batch:,} events")

    def refresh_both(views):
        for name, _ in views:
            conn.execute(f"SELECT eventview.refresh('d_{name}')")
            conn.execute(f"SELECT eventview.refresh('l_{name}')")

    def new_events(i):
        insert(conn, "ev_dist", args.batch)
        insert(conn, "ev_local", args.batch)
        # The other views take their part first (each view's refresh alone is timed).
        refresh_both(VIEWS[1:])

    def refresh_rounds():
        return bench.alternate_rounds(
            [("distributed", lambda i: timed(conn, "SELECT eventview.refresh('d_sku_daily')")),
             ("single node", lambda i: timed(conn, "SELECT eventview.refresh('l_sku_daily')"))],
            args.rounds, between=new_events)

    refresh = refresh_rounds()

    bench.log(f"citus: refresh, {args.rounds} rounds, after {WIDE_PATHS} new payload paths")
    # A payload schema of some hundred paths, most of them on every shard, where each shard's
    # observer records them as drift: a refresh answers only the drift rows recorded since the
    # last one.
    for table in ("ev_dist", "ev_local"):
        conn.execute(f"INSERT INTO {table} (event_type, occurred_at, payload) {WIDE_EVENTS}")
    refresh_both(VIEWS)
    refresh_wide = refresh_rounds()

    bench.log("citus: point reads")
    keys = conn.execute("SELECT sku, bucket FROM l_sku_daily ORDER BY random() LIMIT 200").fetchall()
    reads = bench.alternate_rounds(
        [("distributed", lambda i: timed(conn, POINT_READ.format(view="d_sku_daily"), keys[i % len(keys)])),
         ("single node", lambda i: timed(conn, POINT_READ.format(view="l_sku_daily"), keys[i % len(keys)]))],
        max(args.rounds, 29))

    bench.log("citus: realtime point reads, 1,000 events pending")
    for prefix in ("d", "l"):
        conn.execute(f"SELECT eventview.alter_view('{prefix}_sku_daily', realtime => true)")
    insert(conn, "ev_dist", 1_000)
    insert(conn, "ev_local", 1_000)
    realtime_reads = bench.alternate_rounds(
        [("distributed", lambda i: timed(conn, POINT_READ.format(view="d_sku_daily"), keys[i % len(keys)])),
         ("single node", lambda i: timed(conn, POINT_READ.format(view="l_sku_daily"), keys[i % len(keys)]))],
        max(args.rounds, 29))
    bench.log("citus: realtime point reads again, after ANALYZE on every node")
    analyze_every_node(args)
    realtime_analyzed = bench.alternate_rounds(
        [("distributed", lambda i: timed(conn, POINT_READ.format(view="d_sku_daily"), keys[i % len(keys)])),
         ("single node", lambda i: timed(conn, POINT_READ.format(view="l_sku_daily"), keys[i % len(keys)]))],
        max(args.rounds, 29))
    # The realtime read equals the aggregate from scratch before the refresh too.
    wrong_realtime = (conn.execute(READ_ALL.format(view="d_sku_daily")).fetchall()
                      != conn.execute(FROM_SCRATCH.format(table="ev_dist")).fetchall())

    for name, _ in VIEWS:
        conn.execute(f"SELECT eventview.refresh('d_{name}')")
    got = conn.execute(READ_ALL.format(view="d_sku_daily")).fetchall()
    want = conn.execute(FROM_SCRATCH.format(table="ev_dist")).fetchall()
    wrong = got != want or wrong_realtime
    machine, settings = bench.machine_line(
        conn, so_at_start, load_at_start, [],
        settings=(*bench.REPORTED_SETTINGS, "shared_preload_libraries", "eventview.worker"))

    def med(times, label):
        return statistics.median(times[label])

    rows = [
        ("ingest: `INSERT ... SELECT` of 10k events through the coordinator into a table with 3 views",
         "the same insert into the same distributed table without capture",
         med(ingest, "captured"), med(ingest, "plain"), "<= 1.3x"),
        (f"refresh of 10k new events, {args.shards} shards on 2 workers",
         "the same view's refresh over a single-node event table",
         med(refresh, "distributed"), med(refresh, "single node"), "<= 2x"),
        (f"the same refresh after {WIDE_PATHS} new payload paths, most of them on every shard, recorded as drift there",
         "the same refresh before them",
         med(refresh_wide, "distributed"), med(refresh, "distributed"), "none set"),
        ("point read of one SKU and day, from the groups merged on the coordinator",
         "the same read of the single-node view",
         med(reads, "distributed"), med(reads, "single node"), "<= 3x"),
        (f"realtime point read of one SKU and day, 1,000 events pending over {args.shards} shards",
         "the same read of the single-node realtime view",
         med(realtime_reads, "distributed"), med(realtime_reads, "single node"), "none set"),
        ("the same realtime read after ANALYZE on every node",
         "the same read of the single-node realtime view",
         med(realtime_analyzed, "distributed"), med(realtime_analyzed, "single node"), "none set"),
    ]
    lines = [
        "| measure | baseline | ratio | target |",
        "|---|---|---:|---|",
    ]
    for what, baseline, ours, theirs, target in rows:
        lines.append(f"| {what}: {bench.fmt(ours)} | {baseline}: {bench.fmt(theirs)} | {ours / theirs:.2f}x | {target} |")
    lines += [
        "",
        f"Every view against its aggregate from scratch: {'WRONG' if wrong else 'equal'}.",
        "",
        f"Machine: {machine}",
        f"Settings (each node): {settings}",
    ]
    text = "\n".join(lines) + "\n"
    bench.write_out(args.out, text)
    print(text)
    if wrong:
        sys.exit(1)


if __name__ == "__main__":
    main()
