#!/usr/bin/env python3
"""pg_eventview at scale on one node (API.md section 7): a partitioned event table of 51.2M events
in 64 daily partitions feeding the benchmark's three views, against a plain event table of 1M
events feeding the same views.

Run through bench/scale.sh, which starts a throwaway cluster with the background worker preloaded
(switched off until the sustained run) and stops it afterwards:

    bash bench/scale.sh                        # 64 days x 800k events, 10-minute sustained run
    bash bench/scale.sh --per-day 50000 --sustain 60    # a smoke run

Set-up: the bench's generator (bench.bench_gen) with short payloads (pad_max => 0, about 250
bytes of JSON text) writes one day of events per INSERT into partitioned event tables made by
`create_event_table(..., partition_interval => '1 day')`, whose past partitions are made by
CREATE TABLE ... PARTITION OF (the capture follows); every view is refreshed after each day.
Tables: `big` (64 days, retention 63 days: its oldest partition is past retention), `mid` (6
days, retention 5 days), `low` (2 days, retention 1 day), and `small`, a plain event table of 1M
events over the same 64 days.

Measured (paired rounds, medians; nothing asserts on a time):
- refresh of the three views after 10k new events: `big` against `small` (target <= 1.3x);
- INSERT ... SELECT of 10k events into `big` against the same into `big` with its capture
  triggers disabled (the same table without capture; those rows are deleted again with the
  triggers still disabled, so the views stay exact) (target <= 1.2x);
- `eventview.prune()` dropping the one expired partition (800k events) of `low`, `mid` and
  `big`: under 1 s, the same at 1.6M, 4.8M and 51.2M events;
- a sustained run: the worker on (naptime 1 s), `big`'s views scheduled every 100 ms, a producer
  inserting batches at a fixed rate into `big` for --sustain seconds; per window of a minute:
  the producer's INSERT latency, commit-to-visible lag (the country/type view's event count
  reaching each batch), the changelog's and the views' storage sizes.
Each table's country/type view is compared with its aggregate from scratch at the end (every
group; the total count for a table prune dropped a partition of, which the view keeps). Results
go to bench/out/scale_results.md with the machine line.
"""

import argparse
import os
import statistics
import sys
import threading
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

DAY_INDEX = "date_bin('1 day', now(), '2000-01-01 00:00:00+00')"


def connect(args, dbname=None):
    return bench.connect_to(args, dbname)


def one(conn, sql, params=None):
    return conn.execute(sql, params).fetchone()[0]


class Table:
    def __init__(self, name, days, retention, partitioned=True, delta_retention="7 days"):
        self.name, self.days, self.retention = name, days, retention
        self.partitioned, self.delta_retention = partitioned, delta_retention
        self.views = []


def create(conn, t, fields):
    if t.partitioned:
        conn.execute("SELECT eventview.create_event_table(%s, retention => %s::interval, "
                     "delta_retention => %s::interval, partition_interval => '1 day')",
                     [t.name, t.retention, t.delta_retention])
    else:
        conn.execute("SELECT eventview.create_event_table(%s, retention => %s::interval, delta_retention => %s::interval)",
                     [t.name, t.retention, t.delta_retention])
    bench.source_setup(conn, t.name, fields)
    t.views = bench.create_views(conn, t.name, t.name, fields)


def insert_day(conn, t, d, n):
    """n events of day d back, one INSERT (one changelog record)."""
    conn.execute(f"""INSERT INTO {t.name} (event_type, event_version, producer, occurred_at, payload)
                     SELECT * FROM bench_gen(%s, {DAY_INDEX} - interval '{d} days',
                                             {DAY_INDEX} - interval '{d - 1} days' - interval '1 microsecond',
                                             0.35, true, 0)""", [n])


def refresh_all(conn, t):
    t0 = time.perf_counter()
    for v in t.views:
        conn.execute("SELECT eventview.refresh(%s)", [v])
    return time.perf_counter() - t0


def load(conn, t, per_day, total_days=None):
    """The days from the newest back, each refreshed and pruned as maintenance would (making
    changelog segments ahead, taking applied ones away), but the oldest: its partition, past
    retention, is the one the prune measurement drops."""
    t0 = time.perf_counter()
    days = total_days or t.days
    for d in range(1, days + 1):
        if t.partitioned:
            # Partition d covers [today - d days, today - d days + 1 day), made as its day comes
            # (an empty partition past retention would go at the first prune).
            conn.execute(f"""CREATE TABLE {t.name}_past{d} PARTITION OF {t.name} FOR VALUES
                             FROM ({DAY_INDEX} - interval '{d} days') TO ({DAY_INDEX} - interval '{d - 1} days')""")
        insert_day(conn, t, d, per_day)
        refresh_all(conn, t)
        if d < days:
            conn.execute("SELECT eventview.prune(%s)", [t.name])
    bench.log(f"scale: {t.name}: {days * per_day:,} events in {time.perf_counter() - t0:.0f} s")


def paired(rounds, a, b):
    """Alternates a() and b() (one warm-up each first); returns their median times."""
    a(), b()
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(a())
        tb.append(b())
    return statistics.median(ta), statistics.median(tb), ta, tb


def new_events(conn, table, n=10_000, ts="now()"):
    conn.execute(f"""INSERT INTO {table} (event_type, event_version, producer, occurred_at, payload)
                     SELECT * FROM bench_gen(%s, {ts} - interval '1 hour', {ts}, 0.35, true, 0)""", [n])


def timed_insert(conn, table):
    t0 = time.perf_counter()
    new_events(conn, table)
    return time.perf_counter() - t0


def measure_refresh(conn, big, small, rounds):
    def run(t):
        def f():
            new_events(conn, t.name)
            return refresh_all(conn, t)
        return f
    return paired(rounds, run(big), run(small))


def measure_insert(conn, big, rounds):
    def captured():
        return timed_insert(conn, big.name)

    def uncaptured():
        conn.execute(f"ALTER TABLE {big.name} DISABLE TRIGGER USER")
        first = one(conn, f"SELECT coalesce(max(event_id), 0) FROM {big.name}")
        took = timed_insert(conn, big.name)
        conn.execute(f"DELETE FROM {big.name} WHERE event_id > %s", [first])
        conn.execute(f"ALTER TABLE {big.name} ENABLE TRIGGER USER")
        return took
    result = paired(rounds, captured, uncaptured)
    refresh_all(conn, big)
    return result


def measure_prune(conn, t):
    expired = f"{t.name}_past{t.days}"
    events = one(conn, f"SELECT count(*) FROM {expired}")
    total = one(conn, f"SELECT count(*) FROM {t.name}")
    refresh_all(conn, t)
    t0 = time.perf_counter()
    conn.execute("SELECT eventview.prune(%s)", [t.name])
    took = time.perf_counter() - t0
    gone = one(conn, "SELECT to_regclass(%s) IS NULL", [expired])
    return total, events, took, gone


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def sustained(args, conn, big):
    """The worker refreshing and pruning while a producer writes at a fixed rate; a row per window."""
    conn.execute("ALTER SYSTEM SET eventview.worker = on")
    conn.execute("SELECT pg_reload_conf()")
    for v in big.views:
        conn.execute("SELECT eventview.schedule(%s, %s::interval)", [v, f"{args.schedule_ms} milliseconds"])
    count_view = next(v for v in big.views if v.endswith("_country_type"))
    base = one(conn, f"SELECT coalesce(sum(events), 0) FROM {count_view}")
    batch = args.batch
    interval = batch / args.rate
    batches = []  # (commit time, cumulative count, insert latency)
    visible = {}  # batch index -> time seen
    stop = threading.Event()

    def producer():
        with connect(args) as c:
            total, t_next = 0, time.perf_counter()
            while not stop.is_set():
                t0 = time.perf_counter()
                c.execute(f"""INSERT INTO {big.name} (event_type, event_version, producer, occurred_at, payload)
                              SELECT * FROM bench_gen(%s, now() - interval '1 second', now(), 0.35, true, 0)""", [batch])
                t1 = time.perf_counter()
                total += batch
                batches.append((t1, total, t1 - t0))
                t_next += interval
                time.sleep(max(0.0, t_next - time.perf_counter()))

    def poller():
        with connect(args) as c:
            seen = 0
            while not stop.is_set() or seen < len(batches):
                n = one(c, f"SELECT coalesce(sum(events), 0) FROM {count_view}") - base
                now = time.perf_counter()
                while seen < len(batches) and batches[seen][1] <= n:
                    visible[seen] = now
                    seen += 1
                if stop.is_set() and time.perf_counter() - stop_time[0] > 30:
                    break
                time.sleep(0.02)

    def sizes():
        log_size = one(conn, f"""SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree(
                                   (SELECT format('eventview._changes_%s', source_id) FROM eventview._sources
                                    WHERE relid = '{big.name}'::regclass)::regclass)""")
        view_size = one(conn, """SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c
                                 WHERE c.relnamespace = 'eventview'::regnamespace AND c.relkind = 'r'
                                   AND c.relname ~ ('^_v(' || (SELECT string_agg(view_id::text, '|') FROM eventview._views
                                                              WHERE source_id = (SELECT source_id FROM eventview._sources
                                                                                 WHERE relid = %s::regclass)) || ')_')""",
                        [big.name])
        return log_size, view_size

    stop_time = [0.0]
    threads = [threading.Thread(target=producer), threading.Thread(target=poller)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    samples = []
    while time.perf_counter() - start < args.sustain:
        time.sleep(min(args.window, args.sustain - (time.perf_counter() - start)))
        samples.append((time.perf_counter(), *sizes(), one(conn, "SELECT count(*) FROM eventview._changelog_segments")))
    stop.set()
    stop_time[0] = time.perf_counter()
    for t in threads:
        t.join()
    conn.execute("ALTER SYSTEM SET eventview.worker = off")
    conn.execute("SELECT pg_reload_conf()")
    rows = []
    lags_all, lat_all = [], []
    edges = [start] + [s[0] for s in samples]
    for w, (lo, hi) in enumerate(zip(edges, edges[1:])):
        idx = [i for i, b in enumerate(batches) if lo <= b[0] < hi]
        lats = [batches[i][2] for i in idx]
        lags = [visible[i] - batches[i][0] for i in idx if i in visible]
        lat_all += lats
        lags_all += lags
        _, log_size, view_size, segments = samples[w]
        rows.append(f"| {w + 1} | {len(idx) * batch:,} | {pct(lats, 50) * 1000:.1f} / {pct(lats, 99) * 1000:.1f} ms | "
                    f"{pct(lags, 50) * 1000:.0f} / {pct(lags, 99) * 1000:.0f} ms | {log_size / 2**20:.1f} MB ({segments} segments noted) | "
                    f"{view_size / 2**20:.0f} MB |")
    unseen = len(batches) - len(visible)
    produced = len(batches) * batch
    held = produced / args.sustain
    summary = (f"{produced:,} events in {args.sustain} s ({held:,.0f} events/s held, target {args.rate:,}); "
               f"INSERT p50 {pct(lat_all, 50) * 1000:.1f} ms, p99 {pct(lat_all, 99) * 1000:.1f} ms; "
               f"commit to visible p50 {pct(lags_all, 50) * 1000:.0f} ms, p99 {pct(lags_all, 99) * 1000:.0f} ms"
               + (f"; {unseen} batches never seen" if unseen else ""))
    return rows, summary


def check(conn, t):
    """t's country/type view against its aggregate from scratch: every group, or the total count
    for a table prune dropped a partition of (dropping is not a retraction)."""
    mismatches = []
    count_view = next(v for v in t.views if v.endswith("_country_type"))
    scratch = conn.execute(f"""SELECT payload->>'country', event_type, count(*), sum((payload->>'price')::numeric)
                              FROM {t.name} GROUP BY 1, 2 ORDER BY 1 NULLS FIRST, 2""").fetchall()
    got = conn.execute(f"SELECT country, event_type, events, revenue FROM {count_view} ORDER BY 1 NULLS FIRST, 2").fetchall()
    if t.retention_dropped:
        # Pruning is not a retraction: compare the count only where nothing was dropped.
        got_total, scratch_total = sum(r[2] for r in got), sum(r[2] for r in scratch)
        if got_total != scratch_total + t.retention_dropped:
            mismatches.append(f"{count_view}: {got_total} events, from scratch {scratch_total} + {t.retention_dropped} pruned")
    elif got != scratch:
        mismatches.append(f"{count_view} differs from its aggregate from scratch")
    return mismatches


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=55480)
    ap.add_argument("--dbname", default="scale")
    ap.add_argument("--per-day", type=int, default=800_000)
    ap.add_argument("--days", type=int, default=64)
    ap.add_argument("--small", type=int, default=1_000_000, help="events of the plain table")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--sustain", type=int, default=600, help="seconds of the sustained run (0: none)")
    ap.add_argument("--rate", type=int, default=2000, help="events/s of the sustained run")
    ap.add_argument("--batch", type=int, default=100, help="events per INSERT of the sustained run")
    ap.add_argument("--window", type=int, default=60, help="seconds per row of the sustained run")
    ap.add_argument("--schedule-ms", type=int, default=100, help="the views' schedule in the sustained run")
    ap.add_argument("--out", default=os.path.join(bench.OUT_DIR, "scale_results.md"))
    args = ap.parse_args()
    so_at_start, load_at_start = bench.so_info(), os.getloadavg()[0]
    with connect(args, "postgres") as c:
        c.execute(f'DROP DATABASE IF EXISTS "{args.dbname}"')
        c.execute(f'CREATE DATABASE "{args.dbname}"')
    conn = connect(args)
    conn.execute("CREATE EXTENSION pg_eventview")
    conn.execute(bench.GENERATOR_SQL)
    fields = bench.choose_fields(conn, "auto")
    # Changelog segments of 16 records: the loader writes a record a day (one INSERT of a day's
    # events, 6.4 MB of ids at 800k events), so that the load's records go by whole segments
    # as a steady producer's do, not by DELETE in the measured prune.
    conn.execute("SET eventview.changelog_segment_min = 16")
    conn.execute("SET eventview.changelog_segment_max = 16")
    big = Table("big", args.days, f"{args.days - 1} days", delta_retention="0 seconds")
    mid = Table("mid", 6, "5 days")
    low = Table("low", 2, "1 day")
    small = Table("small", args.days, None, partitioned=False)
    for t in (big, mid, low, small):
        t.retention_dropped = 0
        create(conn, t, fields)
    t0 = time.perf_counter()
    load(conn, low, args.per_day)
    load(conn, mid, args.per_day)
    load(conn, small, args.small // args.days)
    load(conn, big, args.per_day)
    conn.execute("VACUUM ANALYZE")
    setup_s = time.perf_counter() - t0
    partitions = one(conn, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'big'::regclass")
    size = one(conn, "SELECT pg_size_pretty(sum(pg_total_relation_size(relid))) FROM pg_partition_tree('big')")
    bench.log(f"scale: loaded in {setup_s:.0f} s; big: {partitions} partitions, {size}")

    r_big, r_small, r_big_all, r_small_all = measure_refresh(conn, big, small, args.rounds)
    i_cap, i_base, i_cap_all, i_base_all = measure_insert(conn, big, args.rounds)
    prunes = []
    for t in (low, mid, big):
        total, events, took, gone = measure_prune(conn, t)
        t.retention_dropped = events if gone else 0
        prunes.append(f"| {t.name} ({t.days} daily partitions) | {total:,} | {events:,} | {took:.2f} s | {'yes' if gone else 'NO'} |")
    sustained_rows, summary = sustained(args, conn, big) if args.sustain else ([], "not run")
    for t in (big, mid, low, small):
        refresh_all(conn, t)
    mismatches = sum((check(conn, t) for t in (big, mid, low, small)), [])

    notes = []
    machine, settings = bench.machine_line(conn, so_at_start, load_at_start, notes)
    total_big = one(conn, "SELECT count(*) FROM big")
    lines = [
        "# pg_eventview at scale on one node",
        "",
        f"Machine: {machine}",
        f"Settings: {settings}",
        "",
        f"`big`: {total_big:,} events now, {partitions} partitions ({size} after loading), three views; "
        f"`small`: plain, {args.small:,} events, the same views. Set-up {setup_s:.0f} s.",
        "",
        "| measure | big (partitioned) | baseline | ratio | target |",
        "|---|---:|---:|---:|---|",
        f"| refresh of the three views after 10k new events (baseline: `small`, plain, {args.small:,} events) | "
        f"{r_big * 1000:.1f} ms | {r_small * 1000:.1f} ms | {r_big / r_small:.2f}x | <= 1.3x |",
        f"| INSERT ... SELECT of 10k events (baseline: `big` with its capture disabled) | "
        f"{i_cap * 1000:.1f} ms | {i_base * 1000:.1f} ms | {i_cap / i_base:.2f}x | <= 1.2x |",
        "",
        "`eventview.prune()` dropping the one partition past retention:",
        "",
        "| table | events | events in the dropped partition | prune | dropped |",
        "|---|---:|---:|---:|---|",
        *prunes,
        "",
        f"Sustained run ({args.sustain} s, the worker on, views scheduled every {args.schedule_ms} ms, "
        f"batches of {args.batch}): {summary}.",
        "",
        f"| {args.window} s window | events | INSERT p50 / p99 | commit to visible p50 / p99 | changelog | view storage |",
        "|---:|---:|---|---|---|---:|",
        *sustained_rows,
        "",
        "Checks: " + ("each table's country/type view matches its aggregate from scratch (what prune dropped aside)" if not mismatches
                      else "; ".join(mismatches)),
        "",
        "Raw refresh timings (ms), big: " + ", ".join(f"{x * 1000:.1f}" for x in r_big_all)
        + "; small: " + ", ".join(f"{x * 1000:.1f}" for x in r_small_all),
        "Raw INSERT timings (ms), captured: " + ", ".join(f"{x * 1000:.1f}" for x in i_cap_all)
        + "; without capture: " + ", ".join(f"{x * 1000:.1f}" for x in i_base_all),
    ] + [f"- {x}" for x in notes]
    text = "\n".join(lines) + "\n"
    bench.write_out(args.out, text)
    print(text)
    if mismatches:
        sys.exit("scale: views differ from their aggregates from scratch")


if __name__ == "__main__":
    main()
