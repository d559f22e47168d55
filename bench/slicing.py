#!/usr/bin/env python3
"""pg_eventview benchmark of analysts' slicing (API.md sections 8 and 9, issue #25).

Percentiles: what percentile and approx_percentile keep per group, and what their refresh costs
against a max view.

- Storage per group: one group (one route) of latency-like values (milliseconds, log-normal,
  two decimals: nearly every value distinct) at 1k and at 1M events; the size of each view's
  value multiset (table and indexes) for percentile(ref, 0.99) and, for reference, max(ref);
  the size of the group's sketch (its storage array) for approx_percentile(ref, 0.99).
- Refresh of 10k new events (100 routes) into three views over the same table, each refreshed
  alone in alternating rounds, after a view counting events has run the table's field observer: max($.ms), percentile($.ms, 0.99), approx_percentile($.ms,
  0.99). Ratios to max (target: approx_percentile within 1.5x). A read of one route's p99 from
  each view, and every view's answers checked against percentile_disc from scratch (approx
  within 1%).

unnest: events of 5 order lines each; a view with unnest => '$.items' (per SKU: lines, units,
revenue) against the same view over events of one line each ($ references), both on tables of
the same number of lines (1M before). A refresh of 2k orders (10k lines) against a refresh of
10k one-line events, in alternating rounds: the cost per element against the cost per event
(target: within 1.5x); both views checked against their aggregates from scratch.

Rollups: a view per SKU and hour (count, sum, max) over sales events spread over ten days, and
its rollup per SKU and day. Each round inserts 10k new events, refreshes the hourly view, then
the daily rollup (whose refresh finds its source refreshed and applies its group changes): the
rollup's refresh against its source's (target: at most 1). The rollup is checked against the
same aggregate from scratch.
Results go to bench/out/slicing_results.md with the machine line."""

import argparse
import os
import statistics
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (machine line)

# Latency-like milliseconds: log-normal around 40 ms, two decimals.
VALUE = "round(exp(3.7 + 0.9 * sqrt(-2 * ln(random())) * cos(2 * pi() * random()))::numeric, 2)"


def connect(args, dbname=None):
    return bench.connect_to(args, dbname)


one = bench.q1
timed = bench.timed


def multiset_bytes(conn, view, measure):
    """Bytes of the value multiset (heap and indexes) of measure number `measure` of `view`."""
    vid = one(conn, "SELECT eventview._view_id(%s)", (view,))
    return one(conn, f"SELECT pg_total_relation_size('eventview._v{vid}_m{measure}')")


def storage(conn, events_list):
    conn.execute("SELECT eventview.create_event_table('one_route')")
    for name, measure in [("one_max", "max($.ms)"), ("one_exact", "percentile($.ms, 0.99)"),
                          ("one_approx", "approx_percentile($.ms, 0.99)")]:
        conn.execute(f"""SELECT eventview.create_view('{name}', 'one_route', group_by => '{{"route": "$.route"}}',
                         measures => '{{"m": "{measure}"}}')""")
    rows, loaded = [], 0
    for events in events_list:
        while loaded < events:
            n = min(200_000, events - loaded)
            conn.execute(f"""INSERT INTO one_route (event_type, payload)
                             SELECT 'req', jsonb_build_object('route', '/checkout', 'ms', {VALUE})
                             FROM generate_series(1, {n})""")
            loaded += n
        conn.execute("SELECT eventview.refresh_all()")
        # With nothing left to apply, a refresh merges max's value log into its multiset.
        conn.execute("SELECT eventview.refresh_all()")
        conn.execute("VACUUM ANALYZE")
        distinct = one(conn, "SELECT count(DISTINCT payload -> 'ms') FROM one_route")
        sizes = {name: multiset_bytes(conn, name, 1) for name in ("one_max", "one_exact")}
        vid = one(conn, "SELECT eventview._view_id('one_approx')")
        sizes["one_approx"], buckets = conn.execute(
            f"SELECT pg_column_size(m1_sk), cardinality(m1_sk) / 2 FROM eventview._v{vid}_data").fetchone()
        rows.append((events, distinct, sizes, buckets))
        print(f"percentile: {events:,} events in one group: {sizes}", file=sys.stderr)
    return rows


def refresh_rounds(conn, rounds, batch, base):
    conn.execute("SELECT eventview.create_event_table('lat')")
    conn.execute(f"""INSERT INTO lat (event_type, payload)
                     SELECT 'req', jsonb_build_object('route', '/r' || (g % 100), 'ms', {VALUE})
                     FROM generate_series(1, {base}) g""")
    views = [("by_max", "max($.ms)"), ("by_exact", "percentile($.ms, 0.99)"),
             ("by_approx", "approx_percentile($.ms, 0.99)")]
    for name, measure in views:
        conn.execute(f"""SELECT eventview.create_view('{name}', 'lat', group_by => '{{"route": "$.route"}}',
                         measures => '{{"n": "count(*)", "m": "{measure}"}}')""")
    # Refreshed first in every round, untimed: the table's field observer runs in the first
    # refresh after new events, which would otherwise be charged to whichever view goes first.
    conn.execute("SELECT eventview.create_view('by_nothing', 'lat')")
    conn.execute("VACUUM ANALYZE")
    times = {name: [] for name, _ in views}
    reads = {name: [] for name, _ in views}
    for r in range(rounds + 1):
        conn.execute(f"""INSERT INTO lat (event_type, payload)
                         SELECT 'req', jsonb_build_object('route', '/r' || (g % 100), 'ms', {VALUE})
                         FROM generate_series(1, {batch}) g""")
        conn.execute("SELECT eventview.refresh('by_nothing')")
        order = views if r % 2 == 0 else list(reversed(views))
        for name, _ in order:
            t = timed(conn, f"SELECT eventview.refresh('{name}')")
            rd = timed(conn, f"SELECT m FROM {name} WHERE route = '/r7'")
            if r > 0:
                times[name].append(t)
                reads[name].append(rd)
    exact = {row[0]: row[1] for row in conn.execute(
        """SELECT payload ->> 'route', percentile_disc(0.99) WITHIN GROUP (ORDER BY (payload -> 'ms')::numeric)
           FROM lat GROUP BY 1""").fetchall()}
    wrong = []
    for name, kind in [("by_exact", "exact"), ("by_approx", "approx")]:
        for route, m in conn.execute(f"SELECT route, m FROM {name}").fetchall():
            e = float(exact[route])
            ok = float(m) == e if kind == "exact" else abs(float(m) - e) <= 0.01 * abs(e) + 1e-12
            if not ok:
                wrong.append((name, route, m, exact[route]))
    return times, reads, wrong


def unnest_rounds(conn, rounds, lines, base_lines):
    """Refresh of `lines` order lines as 5-line orders through unnest, against `lines` one-line
    events without it; returns the medians and whether both views match their aggregates."""
    item = "jsonb_build_object('sku', 'S' || (random() * 500)::int, 'qty', 1 + (random() * 4)::int, 'amount', round((random() * 100)::numeric, 2))"
    conn.execute("SELECT eventview.create_event_table('orders')")
    conn.execute("SELECT eventview.create_event_table('lines')")
    conn.execute("""SELECT eventview.create_view('per_sku_unnest', 'orders', unnest => '$.items',
                     group_by => '{"sku": "@.sku"}',
                     measures => '{"lines": "count(*)", "units": "sum(@.qty)", "revenue": "sum(@.amount)"}')""")
    conn.execute("""SELECT eventview.create_view('per_sku_flat', 'lines', group_by => '{"sku": "$.sku"}',
                     measures => '{"lines": "count(*)", "units": "sum($.qty)", "revenue": "sum($.amount)"}')""")

    def add(n_lines):
        conn.execute(f"""INSERT INTO orders (event_type, payload)
                         SELECT 'purchase', jsonb_build_object('order_id', g, 'items',
                                jsonb_build_array({item}, {item}, {item}, {item}, {item}))
                         FROM generate_series(1, {n_lines // 5}) g""")
        conn.execute(f"""INSERT INTO lines (event_type, payload)
                         SELECT 'line', {item} || jsonb_build_object('order_id', g)
                         FROM generate_series(1, {n_lines}) g""")

    add(base_lines)
    conn.execute("SELECT eventview.refresh_all()")
    conn.execute("VACUUM ANALYZE")
    times = {"per_sku_unnest": [], "per_sku_flat": []}
    for r in range(rounds + 1):
        add(lines)
        order = list(times) if r % 2 == 0 else list(reversed(times))
        for name in order:
            t = timed(conn, f"SELECT eventview.refresh('{name}')")
            if r > 0:
                times[name].append(t)
    diff = one(conn, """SELECT count(*) FROM (
        (SELECT sku, lines, units, revenue FROM per_sku_unnest EXCEPT
         SELECT e.value ->> 'sku', count(*), sum((e.value -> 'qty')::numeric), sum((e.value -> 'amount')::numeric)
         FROM orders o CROSS JOIN LATERAL jsonb_array_elements(o.payload -> 'items') e GROUP BY 1)
        UNION ALL
        (SELECT sku, lines, units, revenue FROM per_sku_flat EXCEPT
         SELECT payload ->> 'sku', count(*), sum((payload -> 'qty')::numeric), sum((payload -> 'amount')::numeric)
         FROM lines GROUP BY 1)) d""")
    return {k: statistics.median(v) for k, v in times.items()}, diff


def rollup_rounds(conn, rounds, batch, base):
    """Refresh of a daily rollup after `batch` new events, against the refresh of its hourly
    source; returns the medians and the rollup's rows that differ from the aggregate from
    scratch."""
    event = """jsonb_build_object('sku', 'S' || (random() * 500)::int, 'qty', 1 + (random() * 4)::int,
                                 'price', round((random() * 100)::numeric, 2))"""
    at = "timestamptz '2026-06-01' + random() * interval '10 days'"
    conn.execute("SELECT eventview.create_event_table('sales')")

    def add(n):
        conn.execute(f"INSERT INTO sales (event_type, occurred_at, payload) SELECT 'sale', {at}, {event} "
                     f"FROM generate_series(1, {n})")

    add(base)
    conn.execute("""SELECT eventview.create_view('sales_hourly', 'sales', group_by => '{"sku": "$.sku"}',
                     measures => '{"n": "count(*)", "qty": "sum($.qty)", "top": "max($.price)"}',
                     time_bucket => '1 hour')""")
    conn.execute("""SELECT eventview.create_view('sales_daily', 'sales_hourly', group_by => '{"sku": "sku"}',
                     measures => '{"n": "n", "qty": "qty", "top": "top"}', time_bucket => '1 day')""")
    conn.execute("VACUUM ANALYZE")
    times = {"sales_hourly": [], "sales_daily": []}
    for r in range(rounds + 1):
        add(batch)
        for name in times:
            t = timed(conn, f"SELECT eventview.refresh('{name}')")
            if r > 0:
                times[name].append(t)
    diff = one(conn, """SELECT count(*) FROM (
        (SELECT * FROM sales_daily EXCEPT
         SELECT date_bin('1 day', occurred_at, '2000-01-01'), payload ->> 'sku', count(*),
                sum((payload -> 'qty')::numeric), max((payload -> 'price')::numeric) FROM sales GROUP BY 1, 2)
        UNION ALL
        (SELECT date_bin('1 day', occurred_at, '2000-01-01'), payload ->> 'sku', count(*),
                sum((payload -> 'qty')::numeric), max((payload -> 'price')::numeric) FROM sales GROUP BY 1, 2
         EXCEPT SELECT * FROM sales_daily)) d""")
    groups = one(conn, "SELECT count(*) FROM sales_hourly"), one(conn, "SELECT count(*) FROM sales_daily")
    return {k: statistics.median(v) for k, v in times.items()}, diff, groups


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=55460)
    ap.add_argument("--dbname", default="percentile")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--base", type=int, default=1_000_000, help="events before the refresh rounds")
    ap.add_argument("--quick", action="store_true", help="1k and 100k events in one group, 100k before 3 rounds")
    ap.add_argument("--only", choices=["percentile", "unnest", "rollup"], help="run one scenario")
    ap.add_argument("--out", default=os.path.join(bench.OUT_DIR, "slicing_results.md"))
    args = ap.parse_args()
    runs = {args.only} if args.only else {"percentile", "unnest", "rollup"}
    sizes = [1_000, 100_000] if args.quick else [1_000, 1_000_000]
    if args.quick:
        args.rounds = 3
        args.base = 100_000
    so_at_start, load_at_start = bench.so_info(), os.getloadavg()[0]
    with connect(args, "postgres") as c:
        c.execute(f'DROP DATABASE IF EXISTS "{args.dbname}"')
        c.execute(f'CREATE DATABASE "{args.dbname}"')
    conn = connect(args)
    conn.execute("CREATE EXTENSION pg_eventview")
    conn.execute("SELECT setseed(0.42)")
    wrong, unnest_diff, rollup_diff = [], 0, 0
    lines = []
    if "percentile" in runs:
        storage_rows = storage(conn, sizes)
        times, reads, wrong = refresh_rounds(conn, args.rounds, args.batch, args.base)
        lines += percentile_lines(args, storage_rows, times, reads, wrong)
    if "unnest" in runs:
        unnest_med, unnest_diff = unnest_rounds(conn, args.rounds, args.batch, args.base)
        lines += unnest_lines(args, unnest_med, unnest_diff)
    if "rollup" in runs:
        rollup_med, rollup_diff, groups = rollup_rounds(conn, args.rounds, args.batch, args.base)
        src, roll = rollup_med["sales_hourly"], rollup_med["sales_daily"]
        lines += [
            "",
            f"Rollups: after {args.batch:,} new events ({args.base:,} before, ten days, 500 SKUs), the refresh "
            f"of the view per SKU and hour ({groups[0]:,} groups), then of its rollup per SKU and day "
            f"({groups[1]:,} groups), which applies the hourly view's group changes; median of {args.rounds} rounds:",
            "",
            "| view | refresh | ratio |",
            "|---|---:|---:|",
            f"| per SKU and hour, from the events | {src * 1000:.1f} ms | 1.00x |",
            f"| its rollup per SKU and day | {roll * 1000:.1f} ms | {roll / src:.2f}x |",
            "",
            f"Target: the rollup at most its source's cost. The rollup checked against the aggregate from "
            f"scratch: {'equal' if rollup_diff == 0 else f'{rollup_diff} rows DIFFER'}.",
        ]
    notes = []
    machine, settings = bench.machine_line(conn, so_at_start, load_at_start, notes)
    lines = ["# pg_eventview benchmark of analysts' slicing", "", f"Machine: {machine}",
             f"Settings: {settings}"] + lines
    lines += [f"- {x}" for x in notes]
    text = "\n".join(lines) + "\n"
    bench.write_out(args.out, text)
    print(text)
    if wrong or unnest_diff or rollup_diff:
        sys.exit("a view differs from its aggregate from scratch")


def percentile_lines(args, storage_rows, times, reads, wrong):
    med = {k: statistics.median(v) for k, v in times.items()}
    rmed = {k: statistics.median(v) for k, v in reads.items()}
    lines = [
        "",
        "Storage per group: one group of log-normal milliseconds (two decimals); the value multiset "
        "of each view (heap and indexes), and the sketch array of approx_percentile (as stored).",
        "",
        "| events in the group | distinct values | max($.ms) | percentile($.ms, 0.99) | approx_percentile($.ms, 0.99) | sketch buckets |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for events, distinct, s, buckets in storage_rows:
        lines.append(f"| {events:,} | {distinct:,} | {s['one_max']:,} B | {s['one_exact']:,} B | "
                     f"{s['one_approx']:,} B | {buckets:,} |")
    lines += [
        "",
        f"Refresh of {args.batch:,} new events (100 groups; {args.base:,} events before), each view alone, "
        f"median of {args.rounds} alternating rounds; and a read of one group's value:",
        "",
        "| view | refresh | ratio to max | read of one group |",
        "|---|---:|---:|---:|",
    ]
    for name, label in [("by_max", "max($.ms)"), ("by_exact", "percentile($.ms, 0.99)"),
                        ("by_approx", "approx_percentile($.ms, 0.99)")]:
        lines.append(f"| {label} | {med[name] * 1000:.1f} ms | {med[name] / med['by_max']:.2f}x | "
                     f"{rmed[name] * 1000:.2f} ms |")
    lines += ["", f"Checked against percentile_disc from scratch (exact equal, approx within 1%): "
              f"{'all groups agree' if not wrong else f'{len(wrong)} groups DIFFER: {wrong[:5]}'}."]
    return lines


def unnest_lines(args, unnest_med, unnest_diff):
    u, f = unnest_med["per_sku_unnest"], unnest_med["per_sku_flat"]
    return [
        "",
        f"unnest: a refresh of {args.batch // 5:,} orders of 5 lines ({args.batch:,} elements) through "
        f"`unnest => '$.items'` against a refresh of {args.batch:,} one-line events ({args.base:,} lines "
        f"before in each table), per SKU: lines, units, revenue; median of {args.rounds} alternating rounds:",
        "",
        "| view | refresh | per line | ratio |",
        "|---|---:|---:|---:|",
        f"| one-line events, `$` references | {f * 1000:.1f} ms | {f / args.batch * 1e6:.2f} us | 1.00x |",
        f"| 5-line orders, `unnest` and `@` references | {u * 1000:.1f} ms | {u / args.batch * 1e6:.2f} us | {u / f:.2f}x |",
        "",
        f"Target: per element within 1.5x of per event. Both views checked against their aggregates "
        f"from scratch: {'equal' if unnest_diff == 0 else f'{unnest_diff} rows DIFFER'}.",
    ]


if __name__ == "__main__":
    main()
