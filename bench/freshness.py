#!/usr/bin/env python3
"""pg_eventview end-to-end freshness: how long after a producer's commit do its events show in
views that the background worker keeps fresh?

Run through bench/freshness.sh (or `bash bench/run.sh --freshness`), which starts a throwaway
cluster with the worker preloaded and stops it afterwards:

    bash bench/freshness.sh            # 60 s at 5,000 events/s
    bash bench/freshness.sh --quick    # 15 s

One producer thread inserts paced batches and records each batch's commit time; a poller thread
(own connection) reads each view's event count every few ms and records when each batch became
visible. The producer commits batches one after the other, so any snapshot sees a prefix of the
batches: batch k is visible in a view exactly when the view's count reaches the number of the
view's events in batches up to k. A third thread samples eventview.views to report how long the
worker's refreshes took. Nothing asserts on a timing; the target is reported, and the counts are
checked (and reported) at the end.
"""

import argparse
import math
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass


import bench
from bench import GENERATOR_SQL, T_END, fmt, log, q, q1

TABLE = "fresh_ev"
PREFIX = "fresh"
TARGET_P99 = 0.3   # seconds: the target commit -> visible p99 < 300 ms at 5,000 events/s
SWEEP_P99 = 1.0    # seconds: a sweep reports the highest rate whose p99 stays below this
SETTINGS = ("shared_buffers", "fsync", "synchronous_commit", "jit", "autovacuum",
            "eventview.databases", "eventview.naptime", "eventview.worker")


@dataclass
class Batch:
    k: int
    t_sched: float        # when the pacing schedule wanted it sent (time.monotonic())
    t_sent: float
    t_commit: float       # when the producer got the commit acknowledgement
    matches: tuple        # events of this batch that each view counts
    cum: tuple            # events each view counts in batches 0..k


class Run:
    """Shared state of one measurement: what the producer committed, what the poller saw."""

    def __init__(self, views, view_types):
        self.views = views
        self.view_types = view_types
        self.batches = []                          # appended by the producer only
        self.seen = [dict() for _ in views]        # per view: batch k -> time first seen visible
        self.producer_done = threading.Event()
        self.stop = threading.Event()
        self.errors = []
        self.poll_times = []                       # duration of each poll statement
        self.anomalies = [0] * len(views)          # counts that were no prefix of the batches
        self.final_counts = None
        self.refreshes = {v: {} for v in views}    # view -> {last_refresh_at: last_refresh_ms}
        self.refresh_errors = set()


# --------------------------------------------------------------------------------------------
# Setup
# --------------------------------------------------------------------------------------------
def connect(args, dbname=None):
    return bench.connect_to(args, dbname)


def ensure_database(args):
    with connect(args, "postgres") as c:
        if not q1(c, "SELECT count(*) FROM pg_database WHERE datname = %s", (args.dbname,)):
            q(c, f'CREATE DATABASE "{args.dbname}"')


def setup(conn, args):
    """The event table, its 3 views (the same as bench.py's) and the pool of events the producer
    sends. Returns (view names, event types each view counts, pool)."""
    q(conn, "CREATE EXTENSION IF NOT EXISTS pg_eventview")
    q(conn, GENERATOR_SQL)
    q(conn, "SELECT setseed(0.42)")
    fields = bench.choose_fields(conn, args.fields)
    log(f"fields: {fields.describe()}")
    q(conn, "SELECT eventview.create_event_table(%s)", (TABLE,))
    bench.source_setup(conn, TABLE, fields)
    if args.prefill:
        log(f"prefill: {args.prefill:,} events over 30 days")
        q(conn, f"INSERT INTO {TABLE} ({bench.COLS}) SELECT * FROM {bench.GEN}",
          (args.prefill, T_END, "30 days", T_END, True))
    views = bench.create_views(conn, TABLE, PREFIX, fields)
    view_types = [set(spec[3]) for spec in bench.view_specs(PREFIX, fields)]
    # Bring everything (the views and the field observer's per-source work) up to date, so the
    # worker's first ticks do not start with a backlog.
    q(conn, "SELECT eventview.refresh_all()")
    q(conn, f"VACUUM ANALYZE {TABLE}")
    # A pool of generated events, cycled by the producer; occurred_at is left to its default,
    # now(), as for live events (they land in the current hour and day buckets).
    pool_n = max(args.batch, min(args.pool, args.events) // args.batch * args.batch)
    pool = q(conn, "SELECT event_type, event_version, producer, payload::text FROM "
                   "bench_gen(%s, %s::timestamptz - '1 day'::interval, %s::timestamptz, 0.35, true)",
             (pool_n, T_END, T_END))
    return views, view_types, pool


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"freshness: timed out after {timeout} s waiting for {what}")


def worker_pid(conn, args):
    return q1(conn, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_eventview worker' "
                    "AND datname = %s", (args.dbname,))


def schedule_views(conn, views, args):
    """Schedules every view and waits until the worker has refreshed each of them once: from then
    on the worker owns the views' freshness and the measurement can start."""
    wait_for(lambda: worker_pid(conn, args), 30,
             f"the pg_eventview worker of database {args.dbname} (is it in eventview.databases?)")
    since = q1(conn, "SELECT clock_timestamp()")
    for v in views:
        q(conn, "SELECT eventview.schedule(%s, %s::interval)", (v, args.schedule))
    wait_for(lambda: q1(conn, "SELECT count(*) FROM eventview.views WHERE name = ANY(%s::regclass[]) "
                              "AND last_refresh_at > %s", (views, since)) == len(views),
             30, "the worker's first refresh of the scheduled views")


def view_counts(conn, views):
    """The number of events each view counts, all read in one statement (one snapshot)."""
    sql = "SELECT " + ", ".join(f"(SELECT coalesce(sum(events), 0) FROM {v})" for v in views)
    return [int(x) for x in q(conn, sql)[0]]


# --------------------------------------------------------------------------------------------
# The three threads
# --------------------------------------------------------------------------------------------
def produce(conn, run, pool, args):
    """Sends one multi-row INSERT (autocommit) per batch on a fixed schedule (batch k at t0 +
    k * interval, so a slow batch is caught up rather than shifting the rest), and records the
    commit acknowledgement time. Per-view match counts come from the event types each view reads."""
    interval = args.batch / args.rate
    values = ", ".join(["(%s, %s, %s, %s::jsonb)"] * args.batch)
    sql = f"INSERT INTO {TABLE} (event_type, event_version, producer, payload) VALUES {values}"
    cum = [0] * len(run.views)
    t0 = time.monotonic() + 0.1
    try:
        with conn.cursor() as cur:
            for k in range(args.batches):
                t_sched = t0 + k * interval
                delay = t_sched - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                start = (k * args.batch) % len(pool)
                rows = [pool[(start + i) % len(pool)] for i in range(args.batch)]
                params = [x for row in rows for x in row]
                t_sent = time.monotonic()
                cur.execute(sql, params)
                t_commit = time.monotonic()
                matches = tuple(sum(1 for r in rows if r[0] in types) for types in run.view_types)
                cum = [c + m for c, m in zip(cum, matches)]
                run.batches.append(Batch(k, t_sched, t_sent, t_commit, matches, tuple(cum)))
                if run.stop.is_set():
                    break
    except Exception as e:  # reported by main, never swallowed
        run.errors.append(e)
    finally:
        run.producer_done.set()


def poll(conn, run, base, args):
    """Reads the views' counts every poll interval until every batch is visible in every view
    (or the drain timeout after the producer finished). A batch counts as visible at the end of
    the first poll whose count covers it: that overstates the latency by at most one poll
    interval plus the poll's own duration, never understates it."""
    ptr = [0] * len(run.views)
    drain_deadline = None
    try:
        while not run.stop.is_set():
            t_start = time.monotonic()
            counts = view_counts(conn, run.views)
            t_seen = time.monotonic()
            run.poll_times.append(t_seen - t_start)
            n = len(run.batches)   # read after the poll: these were all committed before it ended
            for v, count in enumerate(counts):
                ptr[v] = advance(run, v, ptr[v], n, count - base[v], t_seen)
            if run.producer_done.is_set():
                if all(p == len(run.batches) for p in ptr):
                    break
                drain_deadline = drain_deadline or time.monotonic() + args.drain
                if time.monotonic() > drain_deadline:
                    break
            time.sleep(max(0.0, t_start + args.poll_ms / 1000 - time.monotonic()))
        run.final_counts = [c - b for c, b in zip(view_counts(conn, run.views), base)]
    except Exception as e:
        run.errors.append(e)
        run.stop.set()


def advance(run, v, p, n, observed, t_seen):
    """Marks the batches p.. whose events view v now shows as seen at t_seen; returns the new
    pointer. A count between two prefix sums (part of a batch, or events counted twice) is an
    anomaly; a count beyond the last recorded batch is a batch whose commit the producer thread
    has not recorded yet, picked up by the next poll."""
    while p < n and run.batches[p].cum[v] <= observed:
        b = run.batches[p]
        # A batch with no event for this view changes nothing it shows: nothing to time.
        if b.matches[v]:
            run.seen[v][b.k] = t_seen
        p += 1
    prev = run.batches[p - 1].cum[v] if p else 0
    if observed != prev and p < n:
        run.anomalies[v] += 1
    return p


def sample_refreshes(conn, run):
    """Every 250 ms, records each view's last refresh (time and duration) and error."""
    try:
        while not run.stop.wait(0.25):
            for name, at, ms, err in q(conn, "SELECT name::text, last_refresh_at, last_refresh_ms, last_error "
                                             "FROM eventview.views WHERE name = ANY(%s::regclass[])",
                                       (run.views,)):
                if at is not None:
                    run.refreshes[name][at] = ms
                if err:
                    run.refresh_errors.add(f"{name}: {err}")
    except Exception as e:
        run.errors.append(e)


def measure(args, views, view_types, pool, base):
    run = Run(views, view_types)
    conns = [connect(args) for _ in range(3)]
    threads = [threading.Thread(target=produce, args=(conns[0], run, pool, args), name="producer"),
               threading.Thread(target=poll, args=(conns[1], run, base, args), name="poller"),
               threading.Thread(target=sample_refreshes, args=(conns[2], run), name="sampler")]
    for t in threads:
        t.start()
    try:
        threads[1].join()          # the poller ends once everything is visible (or drained)
    finally:
        run.stop.set()
        for t in threads:
            t.join()
        for c in conns:
            c.close()
    if run.errors:
        raise run.errors[0]
    return run


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------
def percentile(xs, p):
    """Nearest-rank percentile: the smallest value with at least p% of the values at or below it."""
    s = sorted(xs)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def latency_row(label, lats, expected):
    if not lats:
        return f"| {label} | 0 of {expected:,} | - | - | - | - | p99 < {TARGET_P99:g} s | misses |"
    p99 = percentile(lats, 99)
    met = p99 < TARGET_P99 and len(lats) == expected
    cells = [fmt(percentile(lats, p)) for p in (50, 95)] + [fmt(p99), fmt(max(lats))]
    return (f"| {label} | {len(lats):,} of {expected:,} | " + " | ".join(cells)
            + f" | p99 < {TARGET_P99:g} s | {'meets' if met else 'misses'} |")


def latencies(run):
    """Per view: commit -> visible latency of each batch the view counts events of; and per batch
    the latency until it was visible in every view."""
    per_view = []
    for v in range(len(run.views)):
        per_view.append([run.seen[v][b.k] - b.t_commit for b in run.batches if b.k in run.seen[v]])
    everywhere = []
    for b in run.batches:
        times = [run.seen[v].get(b.k) for v in range(len(run.views)) if b.matches[v]]
        if times and None not in times:
            everywhere.append(max(times) - b.t_commit)
    return per_view, everywhere


def refresh_lines(run, t_from):
    """What the worker did during the run: per view, refreshes, their duration and spacing."""
    lines = []
    for v in run.views:
        times = sorted(at for at in run.refreshes[v])
        during = [at for at in times if at >= t_from]
        ms = [run.refreshes[v][at] for at in during if run.refreshes[v][at] is not None]
        gaps = [(b - a).total_seconds() for a, b in zip(during, during[1:])]
        if not ms:
            lines.append(f"- {v}: no refresh seen during the run")
            continue
        gap_s = (f"; time between refreshes median {fmt(statistics.median(gaps))}, max {fmt(max(gaps))}"
                 if gaps else "")
        lines.append(f"- {v}: {len(ms)} refreshes seen (sampled every 250 ms, so very short gaps may hide "
                     f"one); last_refresh_ms median {statistics.median(ms):.0f} ms, p95 "
                     f"{percentile(ms, 95):.0f} ms, max {max(ms):.0f} ms{gap_s}")
    return lines


def checks(conn, run, args):
    """Counts after the run (informational): the table, each view, the prefix property."""
    lines = []
    events = len(run.batches) * args.batch
    rows = q1(conn, f"SELECT count(*) FROM {TABLE}") - args.prefill
    lines.append(f"Table {TABLE}: {rows:,} events inserted by the producer, {events:,} expected: "
                 f"{'OK' if rows == events else 'MISMATCH'}.")
    final = run.final_counts or []
    for v, name in enumerate(run.views):
        want = run.batches[-1].cum[v] if run.batches else 0
        got = final[v] if v < len(final) else None
        unseen = sum(1 for b in run.batches if b.matches[v] and b.k not in run.seen[v])
        ok = got == want and unseen == 0 and run.anomalies[v] == 0
        lines.append(f"View {name}: counts {got if got is None else format(got, ',')} of the producer's events "
                     f"at the end, {want:,} expected; "
                     f"{unseen} batches never seen within the {args.drain:g} s drain; {run.anomalies[v]} polls "
                     f"saw a count that was not a prefix of the committed batches: {'OK' if ok else 'MISMATCH'}.")
    if run.refresh_errors:
        lines.append("Refresh errors seen in eventview.views.last_error: " + "; ".join(sorted(run.refresh_errors)))
    pid = worker_pid(conn, args)
    lines.append(f"Worker at the end: {'running (pid ' + str(pid) + ')' if pid else 'NOT RUNNING'}.")
    return lines


def producer_lines(run, args):
    b = run.batches
    if not b:
        return ["- no batch was committed"]
    took = b[-1].t_commit - b[0].t_sent
    rate = len(b) * args.batch / took if took > 0 else float("nan")
    ins = [x.t_commit - x.t_sent for x in b]
    late = max(x.t_sent - x.t_sched for x in b)
    return [f"- {len(b):,} batches of {args.batch} events in {took:.1f} s: {rate:,.0f} events/s "
            f"achieved (target {args.rate:,})",
            f"- INSERT + commit per batch: median {fmt(statistics.median(ins))}, p99 {fmt(percentile(ins, 99))}, "
            f"max {fmt(max(ins))}; furthest behind the pacing schedule: {fmt(max(0.0, late))}"]


def report(conn, run, args, so_at_start, load_at_start, t_from, setup_s):
    notes = []
    machine, settings = bench.machine_line(conn, so_at_start, load_at_start, notes, SETTINGS)
    per_view, everywhere = latencies(run)
    lines = [f"# pg_eventview end-to-end freshness{' (--quick)' if args.quick else ''}\n",
             f"Machine: {machine}\n", f"Cluster settings: {settings}\n"]
    lines.append(
        f"Method: one producer inserted {args.rate:,} events/s ({args.rate // args.batch} batches of {args.batch} "
        f"events per second, one multi-row INSERT per batch, autocommit, on a fixed pacing schedule) for "
        f"{args.duration:g} s into `{TABLE}` ({args.prefill:,} events before the run), an event table feeding the "
        f"3 views of bench.py, each with `eventview.schedule(view, '{args.schedule}')` and refreshed by the "
        f"background worker only. A poller on its own connection read the event count of every view, in one "
        f"statement, every {args.poll_ms:g} ms (median poll statement {fmt(statistics.median(run.poll_times))}, "
        f"{len(run.poll_times):,} polls). Batches commit one after the other, so every snapshot sees a prefix "
        f"of them: a batch is visible in a view once the view's count reaches the number of its events in all "
        f"batches up to that one. Latency = end of the first poll that saw the batch minus the producer's "
        f"commit acknowledgement (overstated by at most one poll interval plus one poll statement). "
        f"Setup took {setup_s:.0f} s. The target is informational.\n")
    if "DEBUG" in machine:
        lines.append("**The extension under test is a debug build**: its Rust code (refresh, field observer) "
                     "runs unoptimized, so refreshes, and with them the latencies, are slower than with a "
                     "release build.\n")
    lines.append("| View | Batches measured | p50 | p95 | p99 | max | Target | Status |")
    lines.append("|---|---:|---:|---:|---:|---:|---|---|")
    for v, name in enumerate(run.views):
        expected = sum(1 for b in run.batches if b.matches[v])
        lines.append(latency_row(name, per_view[v], expected))
    lines.append(latency_row("all 3 views (batch visible in every view)", everywhere, len(run.batches)))
    lines.append("\n## Producer\n")
    lines += producer_lines(run, args)
    lines.append("\n## Worker refreshes during the run\n")
    lines += refresh_lines(run, t_from)
    lines.append("\n## Checks and notes\n")
    lines += [f"- {x}" for x in checks(conn, run, args) + notes]
    text = "\n".join(lines) + "\n"
    print(text)
    bench.write_out(args.out, text)
    log(f"wrote {os.path.relpath(args.out)}")


def sweep(args):
    """Rates one after the other on one table, its 3 views scheduled as in a single run: for each,
    the p50/p99/max of the batch -> visible-in-every-view latency. Reports the highest rate whose
    p99 stays under SWEEP_P99."""
    so_at_start, load_at_start = bench.so_info(), os.getloadavg()[0]
    ensure_database(args)
    args.events = args.pool
    rows = []
    with connect(args) as conn:
        views, view_types, pool = setup(conn, args)
        schedule_views(conn, views, args)
        for rate in [int(r) for r in args.sweep.split(",")]:
            args.rate = rate
            args.batch = max(args.batch, rate // 50)
            args.rate -= args.rate % args.batch
            args.batches = round(args.duration * args.rate / args.batch)
            args.events = args.batches * args.batch
            base = view_counts(conn, views)
            log(f"sweep: {args.rate:,} events/s for {args.duration:g} s in batches of {args.batch}")
            run = measure(args, views, view_types, pool, base)
            _, everywhere = latencies(run)
            b = run.batches
            took = b[-1].t_commit - b[0].t_sent if b else float("nan")
            achieved = len(b) * args.batch / took if took > 0 else float("nan")
            complete = len(everywhere) == len(b)
            p99 = percentile(everywhere, 99) if everywhere else float("inf")
            rows.append((args.rate, achieved, everywhere, complete, p99))
        notes = []
        machine, settings = bench.machine_line(conn, so_at_start, load_at_start, notes, SETTINGS)
    lines = [f"# pg_eventview freshness sweep\n", f"Machine: {machine}\n", f"Cluster settings: {settings}\n",
             f"Method: as the single run (one producer, batches committed one after the other in autocommit, a "
             f"poller every {args.poll_ms:g} ms, 3 views each scheduled every {args.schedule}, the background "
             f"worker refreshing them), at each rate for {args.duration:g} s, one rate after the other on the same "
             f"table. Latency: commit acknowledgement -> first poll that sees the batch in all 3 views.\n",
             "| producer rate (events/s) | achieved | batches seen | p50 | p99 | max | p99 < 1 s |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    best = None
    for rate, achieved, lats, complete, p99 in rows:
        ok = complete and p99 < SWEEP_P99 and achieved >= 0.95 * rate
        if ok:
            best = max(best or 0, rate)
        cells = [fmt(percentile(lats, 50)), fmt(p99), fmt(max(lats))] if lats else ["-", "-", "-"]
        lines.append(f"| {rate:,} | {achieved:,.0f} | {len(lats):,}{'' if complete else ' (not all)'} | "
                     + " | ".join(cells) + f" | {'yes' if ok else 'no'} |")
    lines.append(f"\nHighest rate with p99 under 1 s (and at least 95% of it achieved by the producer): "
                 f"{f'{best:,} events/s' if best else 'none of those measured'}.")
    lines += [f"- {n}" for n in notes]
    text = "\n".join(lines) + "\n"
    print(text)
    bench.write_out(args.out, text)
    log(f"wrote {os.path.relpath(args.out)}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=55460)
    p.add_argument("--dbname", default="freshness", help="database (must be in eventview.databases)")
    p.add_argument("--quick", action="store_true", help="15 s instead of 60 s")
    p.add_argument("--duration", type=float, help="seconds of producing (default 60, quick 15)")
    p.add_argument("--rate", type=int, default=5000, help="events per second (default 5000)")
    p.add_argument("--batch", type=int, default=100, help="events per batch (default 100)")
    p.add_argument("--schedule", default="100 ms", help="eventview.schedule interval of every view (default 100 ms)")
    p.add_argument("--sweep", help="comma-separated producer rates (events/s) measured one after the other, each for "
                                   "--duration seconds in batches of at least --batch events (50 batches/s): reports the "
                                   "highest rate whose p99 stays under 1 s")
    p.add_argument("--poll-ms", type=float, default=25, help="poll interval in ms (default 25)")
    p.add_argument("--drain", type=float, default=30,
                   help="seconds to wait after the producer stops for the last batches to show (default 30)")
    p.add_argument("--prefill", type=int, default=0, help="events in the table before the run (default 0)")
    p.add_argument("--pool", type=int, default=50_000, help="distinct generated events the producer cycles through")
    p.add_argument("--fields", choices=["auto", "logical", "paths"], default="auto",
                   help="as in bench.py: logical fields (define_field) or plain JSONPaths")
    p.add_argument("--out", default=os.path.join(bench.OUT_DIR, "freshness_results.md"),
                   help="results file (default bench/out/freshness_results.md)")
    args = p.parse_args()
    args.duration = args.duration or (15 if args.quick else 60)
    if args.sweep:
        return sweep(args)
    if args.rate % args.batch:
        raise SystemExit("--rate must be a multiple of --batch")
    args.batches = round(args.duration * args.rate / args.batch)
    args.events = args.batches * args.batch

    so_at_start, load_at_start = bench.so_info(), os.getloadavg()[0]
    ensure_database(args)
    with connect(args) as conn:
        views, view_types, pool = setup(conn, args)
        schedule_views(conn, views, args)
        base = view_counts(conn, views)
        setup_s = time.perf_counter() - bench.START
        t_from = q1(conn, "SELECT clock_timestamp()")
        log(f"producing {args.rate:,} events/s for {args.duration:g} s ({args.batches:,} batches of {args.batch}); "
            f"polling every {args.poll_ms:g} ms")
        run = measure(args, views, view_types, pool, base)
        log("done; writing the report")
        report(conn, run, args, so_at_start, load_at_start, t_from, setup_s)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:   # the threads are stopped by measure(); the runner stops the cluster
        sys.exit(130)
