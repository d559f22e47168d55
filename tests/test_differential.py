"""Differential test of incremental refresh: seeded random workloads against one event table that
feeds several views; at random points (and at the end) every view is refreshed and must EQUAL the
same aggregate computed from scratch with plain SQL over the event table (API.md section 6).

The from-scratch queries below are written by hand from the contract, independently of the
extension's generated SQL:
  - group keys are `payload #>> path` text (JSON null / missing => NULL key; NULLs group together);
  - sum/avg/min/max only over JSON numbers; count(ref) counts non-null JSON values;
  - an event whose group key is an object/array, or whose sum/avg/min/max input is present and not
    a JSON number (nor JSON null), is a type error and is left out of that view entirely
    (on_type_error 'skip' and 'quarantine'); filters are applied before type checks;
  - bucket = date_bin(interval, occurred_at, '2000-01-01 00:00:00+00'); with time_zone,
    date_bin(interval, occurred_at AT TIME ZONE zone, timestamp '2000-01-01') AT TIME ZONE zone
    (API.md section 8), over event times that include the hours around DST changes;
  - a view without group_by has one row while any event counts, none otherwise;
  - rich JSONPaths yield the first match in document order, as jsonb_path_query_first does.

The event table is made by create_event_table, or (for some seeds) is a table of the test's own,
with events in it already, adopted by register_event_table. Either is partitioned by day for some
seeds, with partitions for part of the workload's times (made by the test) and the rest in the
default partition; updates move events between partitions.

Operations (random mix, fixed seeds): INSERT ... VALUES and COPY batches with payloads in two
versions and with missing / JSON null / mistyped values; UPDATEs of payload, single fields,
occurred_at, event_type; DELETEs; rolled-back transactions; savepoints rolled back; multi-statement
transactions touching the same rows twice; up to two transactions held open on other connections
across refreshes and committed (or rolled back) later, out of order; refreshes inside a writing
transaction followed by more writes; TRUNCATE; a view created part-way while another transaction
holds uncommitted changes; the same view refreshed from two connections at once (and refresh_all
racing refresh); refreshes while another connection keeps committing.

Besides the contents, every refresh's return value is checked against the number of changed event
rows committed since that view's previous refresh (tracked from statement row counts), and
eventview.views.pending_changes against the same number; for 'quarantine' views the events in
eventview.quarantine must be exactly the current events with a type error, once each, and
`quarantined` their number; for 'skip' views `skipped` must be at least their number. A windowed
rebuild of a bucketed view (at random windows) leaves it equal to the aggregate too.

A failure names the seed, the operation and the last steps. The deterministic tests at the end
check, in a few statements each, cases a random workload meets rarely or not at all.

Logical fields (define_field, declared in a shuffled order before the views): three views group,
filter and aggregate by fields declared per type and version (sku, qty bigint, country) and by
fields of every declared type (vip boolean, amount double precision, at timestamptz, price numeric,
doc jsonb). Their reference resolves the declaration per event with a CASE on event_type and
event_version, most specific first (type and version, type, version, any; no match is NULL; a
missing path is NULL), and converts by the declared type by hand: bigint only from integral
numbers within int8 (1.5, "2", 10^19 are type errors, 2.0 is 2), double precision from numbers
within its range, numeric from numbers, boolean from booleans, timestamptz from RFC 3339 strings
(every generated string is labelled by hand), text from strings, numbers and booleans, jsonb from
anything. A conversion failure is a type error under every use of the field (keys, sum/avg/min/max,
count, count_distinct); a filter on a logical field compares its raw jsonb.

count_distinct: $.user takes values from a small domain (1, 1.0, 1.00, "1", 2, 2.00, "2", ...,
objects, null, missing), so values collide and retractions take counts across zero; compared as
jsonb (1 and 1.0 one value, 1 and "1" two; JSON null and missing do not count). Of a logical
field, the raw jsonb of the events whose value converts.

Pruning: the event table has a delta_retention of 1 microsecond, 300 milliseconds or 7 days (per
seed); eventview.prune() and run_maintenance() (which also refreshes a scheduled view when due) run
at random points, also inside a writing transaction that refreshed, and concurrently with refreshes
and writes; the changelog (records and segments) is aged by 8 days now and then, so that records past
delta_retention exist whatever it is. Changelog segments hold a few dozen records for most seeds,
so that prune makes, empties and drops them between refreshes. Pruning must never drop a change some view has not applied: pending_changes
and the next refresh must still match. At the end, once every view applied everything, an aged
changelog must prune to empty.

Environment knobs: PGEV_IT_OPS (operations per seed, default 750); PGEV_IT_SEEDS (comma-separated
seeds instead of the fixed ones, to hunt with new workloads).
"""

import json
import os
import random
import re
import threading
import time
import traceback
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import psycopg
import pytest

SEEDS = [int(s) for s in os.environ["PGEV_IT_SEEDS"].split(",")] if os.environ.get("PGEV_IT_SEEDS") \
    else [11, 23, 37, 41, 59]
N_OPS = int(os.environ.get("PGEV_IT_OPS", "750"))
BASE_TIME = datetime(2026, 1, 1, tzinfo=timezone.utc)

# --------------------------------------------------------------------------------------------
# Reference SQL snippets (hand-written semantics of the contract)


def NUM(x):
    """The numeric value of a jsonb expression when it is a JSON number, else NULL."""
    return f"(CASE WHEN jsonb_typeof({x}) = 'number' THEN ({x})::numeric END)"


def KEYBAD(x):
    """A group key that is an object or an array is a type error."""
    return f"coalesce(jsonb_typeof({x}) IN ('object', 'array'), false)"


def NUMBAD(x):
    """A sum/avg/min/max input that is present and neither a number nor JSON null."""
    return f"coalesce(jsonb_typeof({x}) NOT IN ('number', 'null'), false)"


def NONNULL_COUNT(x):
    """count(ref): non-null values (JSON null and missing do not count)."""
    return f"count(NULLIF({x}, 'null'::jsonb))"


def DISTINCT_JSON(x):
    """count_distinct(ref) of a JSONPath: distinct non-null values compared as jsonb (1 and 1.0
    are one value, 1 and "1" two; objects and arrays are values too)."""
    return f"count(DISTINCT NULLIF({x}, 'null'::jsonb))"


def BUCKET(width):
    return f"date_bin('{width}'::interval, occurred_at, '2000-01-01 00:00:00+00'::timestamptz)"


def LOCAL_BUCKET(width, zone):
    """A bucket in the wall-clock time of `zone` (API.md section 8)."""
    return (f"(date_bin('{width}'::interval, occurred_at AT TIME ZONE '{zone}', timestamp '2000-01-01') "
            f"AT TIME ZONE '{zone}')")


P_SKU = "payload -> 'sku'"
P_QTY = "payload -> 'qty'"
P_PRICE = "payload -> 'price'"
P_ITEM_SKU = "payload -> 'item' -> 'sku'"
P_ITEM_QTY = "payload -> 'item' -> 'quantity'"
P_COUNTRY = "payload -> 'country'"
TAG = "jsonb_path_query_first(payload, 'lax $.tags[*]')"
DESC_SKU = "jsonb_path_query_first(payload, 'lax $.**.sku')"


class ViewSpec:
    def __init__(self, name, create_sql, scope, bad, select, group, policy, source=None, approx=None,
                 base=None):
        self.name = name
        # A rollup: the view over the event table at the bottom of its chain (a rollup's
        # refresh refreshes its sources first; it files no quarantine entries of its own).
        self.base = base
        # approx_percentile columns: (group columns, {column: exact column of the reference}),
        # each within 1% of its exact percentile_disc.
        self.approx = approx
        self.source = source  # FROM clause when not the bare event table
        self.create_sql = create_sql
        self.scope = scope  # which events the view reads (event_types and filter)
        self.bad = bad  # the type-error condition
        self.select = select
        self.group = group  # GROUP BY positions, or None for a view without group_by
        self.policy = policy

    def reference(self, table="ev"):
        tail = f"GROUP BY {self.group}" if self.group else "HAVING count(*) > 0"
        return f"SELECT {self.select}\nFROM {self.source or table}\nWHERE ({self.scope}) AND NOT ({self.bad})\n{tail}"

    def bad_events(self, table="ev"):
        return f"SELECT event_id FROM {self.source or table} WHERE ({self.scope}) AND ({self.bad})"


VIEWS = [
    ViewSpec(
        "v_sku",
        """SELECT eventview.create_view('v_sku', 'ev',
             group_by => '{"sku": "$.sku"}',
             measures => '{"n": "count(*)", "qty": "sum($.qty)", "avg_price": "avg($.price)",
                           "min_price": "min($.price)", "max_price": "max($.price)", "qty_n": "count($.qty)"}',
             event_types => ARRAY['add_to_cart', 'purchase'],
             time_bucket => '1 hour')""",
        scope="event_type IN ('add_to_cart', 'purchase')",
        bad=f"{KEYBAD(P_SKU)} OR {NUMBAD(P_QTY)} OR {NUMBAD(P_PRICE)}",
        select=f"""{BUCKET('1 hour')} AS bucket,
       payload #>> '{{sku}}' AS sku,
       count(*) AS n,
       sum({NUM("payload -> 'qty'")}) AS qty,
       avg({NUM("payload -> 'price'")}) AS avg_price,
       min({NUM("payload -> 'price'")}) AS min_price,
       max({NUM("payload -> 'price'")}) AS max_price,
       {NONNULL_COUNT("payload -> 'qty'")} AS qty_n""",
        group="1, 2",
        policy="quarantine",
    ),
    ViewSpec(
        "v_total",
        """SELECT eventview.create_view('v_total', 'ev',
             measures => '{"n": "count(*)", "qty": "sum($.qty)", "last": "max(occurred_at)",
                           "users": "count_distinct($.user)", "moments": "count_distinct(occurred_at)"}',
             on_type_error => 'skip')""",
        scope="true",
        bad=NUMBAD("payload -> 'qty'"),
        select=f"""count(*) AS n, sum({NUM("payload -> 'qty'")}) AS qty, max(occurred_at) AS last,
       {DISTINCT_JSON("payload -> 'user'")} AS users, count(DISTINCT occurred_at) AS moments""",
        group=None,
        policy="skip",
    ),
    ViewSpec(
        "v_env",
        """SELECT eventview.create_view('v_env', 'ev',
             group_by => '{"event_type": "event_type", "event_version": "event_version", "item_sku": "$.item.sku"}',
             measures => '{"n": "count(*)", "q": "sum($.item.quantity)", "lo": "min($.price)",
                           "first_at": "min(occurred_at)", "sv": "sum(event_version)", "nv": "count(event_version)"}',
             on_type_error => 'quarantine')""",
        scope="true",
        bad=f"{KEYBAD(P_ITEM_SKU)} OR {NUMBAD(P_ITEM_QTY)} OR {NUMBAD(P_PRICE)}",
        select=f"""event_type, event_version,
       payload #>> '{{item,sku}}' AS item_sku,
       count(*) AS n,
       sum({NUM("payload -> 'item' -> 'quantity'")}) AS q,
       min({NUM("payload -> 'price'")}) AS lo,
       min(occurred_at) AS first_at,
       sum(event_version::numeric) AS sv,
       count(event_version) AS nv""",
        group="1, 2, 3",
        policy="quarantine",
    ),
    ViewSpec(
        "v_de_fr",
        """SELECT eventview.create_view('v_de_fr', 'ev',
             group_by => '{"country": "$.country", "Sku": "$.sku"}',
             measures => '{"n": "count(*)", "revenue": "sum($.price)", "avg_qty": "avg($.qty)"}',
             event_types => ARRAY['purchase'],
             time_bucket => '1 day',
             filter => '{"$.country": ["DE", "FR"]}',
             on_type_error => 'skip')""",
        scope="""event_type = 'purchase' AND payload -> 'country' IN ('"DE"'::jsonb, '"FR"'::jsonb)""",
        bad=f"{KEYBAD(P_COUNTRY)} OR {KEYBAD(P_SKU)} OR {NUMBAD(P_PRICE)} OR {NUMBAD(P_QTY)}",
        select=f"""{BUCKET('1 day')} AS bucket,
       payload #>> '{{country}}' AS country,
       payload #>> '{{sku}}' AS "Sku",
       count(*) AS n,
       sum({NUM("payload -> 'price'")}) AS revenue,
       avg({NUM("payload -> 'qty'")}) AS avg_qty""",
        group="1, 2, 3",
        policy="skip",
    ),
    ViewSpec(
        "v_tags",
        """SELECT eventview.create_view('v_tags', 'ev',
             group_by => '{"tag": "$.tags[*]"}',
             measures => '{"n": "count(*)", "mx": "max($.price)", "cq": "count($.qty)"}',
             time_bucket => '15 minutes',
             on_type_error => 'quarantine')""",
        scope="true",
        bad=f"{KEYBAD(TAG)} OR {NUMBAD(P_PRICE)}",
        select=f"""{BUCKET('15 minutes')} AS bucket,
       {TAG} #>> '{{}}' AS tag,
       count(*) AS n,
       max({NUM("payload -> 'price'")}) AS mx,
       {NONNULL_COUNT("payload -> 'qty'")} AS cq""",
        group="1, 2",
        policy="quarantine",
    ),
    ViewSpec(
        "v_vip",
        """SELECT eventview.create_view('v_vip', 'ev',
             group_by => '{"country": "$.country"}',
             measures => '{"n": "count(*)", "hi": "max($.item.quantity)"}',
             filter => '{"event_version": 2, "$.vip": true}')""",
        scope="""event_version = 2 AND payload -> 'vip' = 'true'::jsonb""",
        bad=f"{KEYBAD(P_COUNTRY)} OR {NUMBAD(P_ITEM_QTY)}",
        select=f"""payload #>> '{{country}}' AS country,
       count(*) AS n,
       max({NUM("payload -> 'item' -> 'quantity'")}) AS hi""",
        group="1",
        policy="quarantine",
    ),
    # Buckets in local time: days in Berlin (23 and 25 hours long around its DST changes),
    # hours in Sydney (southern hemisphere; a repeated local hour is one bucket).
    ViewSpec(
        "v_local_day",
        """SELECT eventview.create_view('v_local_day', 'ev',
             group_by => '{"sku": "$.sku"}',
             measures => '{"n": "count(*)", "qty": "sum($.qty)", "max_price": "max($.price)", "last": "max(occurred_at)"}',
             time_bucket => '1 day', time_zone => 'Europe/Berlin',
             on_type_error => 'skip')""",
        scope="true",
        bad=f"{KEYBAD(P_SKU)} OR {NUMBAD(P_QTY)} OR {NUMBAD(P_PRICE)}",
        select=f"""{LOCAL_BUCKET('1 day', 'Europe/Berlin')} AS bucket,
       payload #>> '{{sku}}' AS sku,
       count(*) AS n,
       sum({NUM("payload -> 'qty'")}) AS qty,
       max({NUM("payload -> 'price'")}) AS max_price,
       max(occurred_at) AS last""",
        group="1, 2",
        policy="skip",
    ),
    ViewSpec(
        "v_local_hour",
        """SELECT eventview.create_view('v_local_hour', 'ev',
             measures => '{"n": "count(*)", "first_at": "min(occurred_at)"}',
             event_types => ARRAY['page_view', 'purchase'],
             time_bucket => '1 hour', time_zone => 'Australia/Sydney')""",
        scope="event_type IN ('page_view', 'purchase')",
        bad="false",
        select=f"""{LOCAL_BUCKET('1 hour', 'Australia/Sydney')} AS bucket,
       count(*) AS n,
       min(occurred_at) AS first_at""",
        group="1",
        policy="quarantine",
    ),
    # Percentiles (API.md section 9): percentile_disc over the group's numbers, under retraction.
    ViewSpec(
        "v_pct",
        """SELECT eventview.create_view('v_pct', 'ev',
             group_by => '{"sku": "$.sku"}',
             measures => '{"n": "count(*)", "p50": "percentile($.price, 0.5)", "p90": "percentile($.qty, 0.9)",
                           "p0": "percentile($.price, 0)", "p100": "percentile($.price, 1)",
                           "pv": "percentile(event_version, 0.25)"}',
             time_bucket => '1 day')""",
        scope="true",
        bad=f"{KEYBAD(P_SKU)} OR {NUMBAD(P_PRICE)} OR {NUMBAD(P_QTY)}",
        select=f"""{BUCKET('1 day')} AS bucket,
       payload #>> '{{sku}}' AS sku,
       count(*) AS n,
       percentile_disc(0.5) WITHIN GROUP (ORDER BY {NUM(P_PRICE)}) AS p50,
       percentile_disc(0.9) WITHIN GROUP (ORDER BY {NUM(P_QTY)}) AS p90,
       percentile_disc(0) WITHIN GROUP (ORDER BY {NUM(P_PRICE)}) AS p0,
       percentile_disc(1) WITHIN GROUP (ORDER BY {NUM(P_PRICE)}) AS p100,
       percentile_disc(0.25) WITHIN GROUP (ORDER BY event_version) AS pv""",
        group="1, 2",
        policy="quarantine",
    ),
    # approx_percentile: within 1% of percentile_disc (the reference's exact columns e50, e90).
    ViewSpec(
        "v_apct",
        """SELECT eventview.create_view('v_apct', 'ev',
             group_by => '{"sku": "$.sku"}',
             measures => '{"n": "count(*)", "a50": "approx_percentile($.price, 0.5)", "a90": "approx_percentile($.qty, 0.9)"}',
             on_type_error => 'skip')""",
        scope="true",
        bad=f"{KEYBAD(P_SKU)} OR {NUMBAD(P_PRICE)} OR {NUMBAD(P_QTY)}",
        select=f"""payload #>> '{{sku}}' AS sku,
       count(*) AS n,
       percentile_disc(0.5) WITHIN GROUP (ORDER BY {NUM(P_PRICE)}) AS e50,
       percentile_disc(0.9) WITHIN GROUP (ORDER BY {NUM(P_QTY)}) AS e90""",
        group="1",
        policy="skip",
        approx=(["sku"], {"a50": "e50", "a90": "e90"}),
    ),
    # unnest (API.md section 8): one input row per element of $.tags; a type error in any
    # element (an object or array as the key) or in the payload (price) leaves the whole event out.
    ViewSpec(
        "v_unnest",
        """SELECT eventview.create_view('v_unnest', 'ev',
             unnest => '$.tags', group_by => '{"tag": "@"}',
             measures => '{"n": "count(*)", "users": "count_distinct($.user)", "top": "max($.price)"}')""",
        scope="true",
        bad="""EXISTS (SELECT 1 FROM jsonb_array_elements(
                        CASE WHEN jsonb_typeof(payload -> 'tags') = 'array' THEN payload -> 'tags' END) x
                    WHERE jsonb_typeof(x) IN ('object', 'array')) OR """ + NUMBAD(P_PRICE),
        select=f"""el.value #>> '{{}}' AS tag,
       count(*) AS n,
       {DISTINCT_JSON("payload -> 'user'")} AS users,
       max({NUM(P_PRICE)}) AS top""",
        group="1",
        policy="quarantine",
        source="""ev CROSS JOIN LATERAL jsonb_array_elements(
                      CASE WHEN jsonb_typeof(payload -> 'tags') = 'array' THEN payload -> 'tags' END) el""",
    ),
]

# Created part-way through the workload, while another transaction holds uncommitted changes.
LATE_VIEW = ViewSpec(
    "v_desc",
    """SELECT eventview.create_view('v_desc', 'ev',
         group_by => '{"sku": "$..sku"}',
         measures => '{"n": "count(*)", "s": "sum($.price)"}',
         on_type_error => 'skip')""",
    scope="true",
    bad=f"{KEYBAD(DESC_SKU)} OR {NUMBAD(P_PRICE)}",
    select=f"""{DESC_SKU} #>> '{{}}' AS sku, count(*) AS n, sum({NUM("payload -> 'price'")}) AS s""",
    group="1",
    policy="skip",
)


# --------------------------------------------------------------------------------------------
# Logical fields (API.md sections 2 and 6): declared before the views are created, in an order
# shuffled per seed (resolution must not depend on it). Every resolution tier is observable:
#   sku:     add_to_cart v1 $.sku, add_to_cart v2 $.item.sku (type and version), purchase $.sku
#            (type alone: purchase v2 takes it over the version-2 declaration), version 2
#            $.meta.sku (version alone: page_view/refund v2), any $.sku (v1 and v3 of the others);
#   qty:     bigint; add_to_cart v1 $.qty, add_to_cart v2 $.item.quantity, purchase $.qty,
#            version 2 $.item.quantity, no declaration for any type/version: page_view and
#            refund v1, every v3 but purchase, give NULL;
#   country: any $.country, refund v1 $.tags[0] (a number or an object/array there too);
#   vip boolean, amount double precision, at timestamptz, price numeric, doc jsonb: any type.
# (field, path, event_type, version, type)
FIELD_DECLS = [
    ("sku", "$.sku", "add_to_cart", 1, None),
    ("sku", "$.item.sku", "add_to_cart", 2, None),
    ("sku", "$.sku", "purchase", None, None),
    ("sku", "$.meta.sku", None, 2, None),
    ("sku", "$.sku", None, None, None),
    ("qty", "$.qty", "add_to_cart", 1, "bigint"),
    ("qty", "$.item.quantity", "add_to_cart", 2, "bigint"),
    ("qty", "$.qty", "purchase", None, "bigint"),
    ("qty", "$.item.quantity", None, 2, "bigint"),
    ("country", "$.country", None, None, None),
    ("country", "$.tags[0]", "refund", 1, "text"),
    ("vip", "$.vip", None, None, "boolean"),
    ("amount", "$.amount", None, None, "double precision"),
    ("at", "$.at", None, None, "timestamptz"),
    ("price", "$.price", None, None, "numeric"),
    ("doc", "$.doc", None, None, "jsonb"),
]


def define_field_sql(decl):
    field, path, etype, version, type_ = decl
    args = ["'ev'", f"'{field}'", f"'{path}'"]
    args.append(f"event_type => '{etype}'" if etype else "event_type => NULL")
    args.append(f"version => {version}" if version else "version => NULL")
    if type_:
        args.append(f"type => '{type_}'")
    return f"SELECT eventview.define_field({', '.join(args)})"


# The resolved raw jsonb of each logical field, written by hand, most specific first.
R_SKU = """(CASE WHEN event_type = 'add_to_cart' AND event_version = 1 THEN payload -> 'sku'
       WHEN event_type = 'add_to_cart' AND event_version = 2 THEN payload -> 'item' -> 'sku'
       WHEN event_type = 'purchase' THEN payload -> 'sku'
       WHEN event_version = 2 THEN payload -> 'meta' -> 'sku'
       ELSE payload -> 'sku' END)"""
R_QTY = """(CASE WHEN event_type = 'add_to_cart' AND event_version = 1 THEN payload -> 'qty'
       WHEN event_type = 'add_to_cart' AND event_version = 2 THEN payload -> 'item' -> 'quantity'
       WHEN event_type = 'purchase' THEN payload -> 'qty'
       WHEN event_version = 2 THEN payload -> 'item' -> 'quantity' END)"""
R_COUNTRY = """(CASE WHEN event_type = 'refund' AND event_version = 1 THEN payload -> 'tags' -> 0
       ELSE payload -> 'country' END)"""
R_VIP = "(payload -> 'vip')"
R_AMOUNT = "(payload -> 'amount')"
R_AT = "(payload -> 'at')"
R_PRICE = "(payload -> 'price')"
R_DOC = "(payload -> 'doc')"

# Declared-type conversions (section 6). Each returns (value expression, type-error condition).
# Nested CASEs so that no cast is evaluated on a value of the wrong kind.
INT8_MIN, INT8_MAX = -(2**63), 2**63 - 1
DBL_MAX = "1.7976931348623157e308"


def T_TEXT(x):
    return (f"(CASE WHEN jsonb_typeof({x}) IN ('string', 'number', 'boolean') THEN {x} #>> '{{}}' END)",
            f"coalesce(jsonb_typeof({x}) IN ('object', 'array'), false)")


def T_BIGINT(x):
    fits = f"(({x})::numeric % 1 = 0 AND ({x})::numeric BETWEEN {INT8_MIN} AND {INT8_MAX})"
    return (f"(CASE WHEN jsonb_typeof({x}) = 'number' THEN CASE WHEN {fits} THEN ({x})::numeric::bigint END END)",
            f"(CASE WHEN {x} IS NULL OR jsonb_typeof({x}) = 'null' THEN false "
            f"WHEN jsonb_typeof({x}) <> 'number' THEN true ELSE NOT {fits} END)")


def T_NUMERIC(x):
    return NUM(x), NUMBAD(x)


def T_DOUBLE(x):
    # A JSON number beyond the double range (1E+400) is a type error. Numbers too small for a
    # double (1E-400) are not generated: their cast below would fail this reference query, and
    # the extension may take them as a type error or as 0 (see
    # test_a_double_field_underflow_does_not_break_refresh).
    fits = f"(abs(({x})::numeric) <= {DBL_MAX})"
    return (f"(CASE WHEN jsonb_typeof({x}) = 'number' THEN CASE WHEN {fits} THEN ({x})::numeric::float8 END END)",
            f"(CASE WHEN {x} IS NULL OR jsonb_typeof({x}) = 'null' THEN false "
            f"WHEN jsonb_typeof({x}) <> 'number' THEN true ELSE NOT {fits} END)")


def T_BOOL(x):
    return (f"(CASE WHEN jsonb_typeof({x}) = 'boolean' THEN ({x})::boolean END)",
            f"coalesce(jsonb_typeof({x}) NOT IN ('boolean', 'null'), false)")


# Every string the generator puts in "at", labelled by hand: RFC 3339 date-times with their
# instant, and strings that are not RFC 3339 (no offset, date only, words, impossible dates).
AT_VALID = {
    "2026-01-01T10:00:00Z": "2026-01-01 10:00:00+00",
    "2026-01-01T12:00:00+02:00": "2026-01-01 10:00:00+00",
    "2026-01-02T03:04:05.123456Z": "2026-01-02 03:04:05.123456+00",
    "2025-12-31T23:59:59.5-03:30": "2026-01-01 03:29:59.5+00",
    "2026-01-03t08:00:00z": "2026-01-03 08:00:00+00",  # RFC 3339 5.6: t and z may be lower case
}
AT_INVALID = ["yesterday", "now", "2026-01-01", "2026-01-01T10:00:00", "2026-02-30T00:00:00Z",
              "2026-01-01T25:00:00Z", "", "10:00:00Z", "2026-01-01T10:00Z"]


def T_TS(x):
    whens = " ".join(f"WHEN '{s}' THEN '{t}'::timestamptz" for s, t in AT_VALID.items())
    valid = ", ".join(f"'{s}'" for s in AT_VALID)
    return (f"(CASE WHEN jsonb_typeof({x}) = 'string' THEN CASE {x} #>> '{{}}' {whens} END END)",
            f"(CASE WHEN {x} IS NULL OR jsonb_typeof({x}) = 'null' THEN false "
            f"WHEN jsonb_typeof({x}) <> 'string' THEN true ELSE ({x} #>> '{{}}') NOT IN ({valid}) END)")


def T_JSONB(x):
    return f"NULLIF({x}, 'null'::jsonb)", "false"


# The logical views read the event table with the resolved raw values of sku, qty and country
# computed once per event (OFFSET 0 keeps the subquery from being pulled up into every use).
LOGICAL_EV = f"""(SELECT e.*, {R_SKU} AS r_sku, {R_QTY} AS r_qty, {R_COUNTRY} AS r_country
FROM ev e OFFSET 0) ev"""
L_SKU, L_SKU_BAD = T_TEXT("r_sku")
L_QTY, L_QTY_BAD = T_BIGINT("r_qty")
L_COUNTRY, L_COUNTRY_BAD = T_TEXT("r_country")
L_VIP, L_VIP_BAD = T_BOOL(R_VIP)
L_AMOUNT, L_AMOUNT_BAD = T_DOUBLE(R_AMOUNT)
L_AT, L_AT_BAD = T_TS(R_AT)
L_PRICE, L_PRICE_BAD = T_NUMERIC(R_PRICE)
L_DOC, _ = T_JSONB(R_DOC)


def L_DISTINCT(value, raw):
    """count_distinct(logical field): the raw jsonb of the events whose value converts."""
    return f"count(DISTINCT CASE WHEN {value} IS NOT NULL THEN {raw} END)"


LOGICAL_VIEWS = [
    ViewSpec(
        "v_lsku",
        """SELECT eventview.create_view('v_lsku', 'ev',
             group_by => '{"sku": "sku", "country": "country"}',
             measures => '{"n": "count(*)", "qty": "sum(qty)", "avg_qty": "avg(qty)", "lo": "min(qty)",
                           "hi": "max(qty)", "users": "count_distinct($.user)"}',
             time_bucket => '1 day',
             on_type_error => 'quarantine')""",
        scope="true",
        bad=f"{L_SKU_BAD} OR {L_COUNTRY_BAD} OR {L_QTY_BAD}",
        select=f"""{BUCKET('1 day')} AS bucket,
       {L_SKU} AS sku,
       {L_COUNTRY} AS country,
       count(*) AS n,
       sum({L_QTY}::numeric) AS qty,
       avg({L_QTY}::numeric) AS avg_qty,
       min({L_QTY}) AS lo,
       max({L_QTY}) AS hi,
       {DISTINCT_JSON("payload -> 'user'")} AS users""",
        group="1, 2, 3",
        policy="quarantine",
        source=LOGICAL_EV,
    ),
    ViewSpec(
        "v_lqty",
        """SELECT eventview.create_view('v_lqty', 'ev',
             group_by => '{"qty": "qty"}',
             measures => '{"n": "count(*)", "amt": "sum(amount)", "top": "max(amount)", "first_at": "min(at)",
                           "last_at": "max(at)", "skus": "count_distinct(sku)", "min_sku": "min(sku)"}',
             event_types => ARRAY['add_to_cart', 'purchase', 'refund'],
             filter => '{"country": ["DE", "FR", "US", 1]}',
             on_type_error => 'skip')""",
        scope=f"""event_type IN ('add_to_cart', 'purchase', 'refund')
       AND r_country IN ('"DE"'::jsonb, '"FR"'::jsonb, '"US"'::jsonb, '1'::jsonb)""",
        bad=f"{L_QTY_BAD} OR {L_AMOUNT_BAD} OR {L_AT_BAD} OR {L_SKU_BAD}",
        select=f"""{L_QTY} AS qty,
       count(*) AS n,
       sum({L_AMOUNT}::numeric) AS amt,
       max({L_AMOUNT}) AS top,
       min({L_AT}) AS first_at,
       max({L_AT}) AS last_at,
       {L_DISTINCT(L_SKU, "r_sku")} AS skus,
       min({L_SKU}) AS min_sku""",
        group="1",
        policy="skip",
        source=LOGICAL_EV,
    ),
    ViewSpec(
        "v_ldist",
        """SELECT eventview.create_view('v_ldist', 'ev',
             group_by => '{"vip": "vip"}',
             measures => '{"n": "count(*)", "users": "count_distinct($.user)", "qtys": "count_distinct(qty)",
                           "docs": "count_distinct(doc)", "price": "sum(price)", "lo_price": "min(price)",
                           "skus": "count_distinct(sku)", "vips": "count(vip)"}',
             time_bucket => '1 hour',
             on_type_error => 'quarantine')""",
        scope="true",
        bad=f"{L_VIP_BAD} OR {L_QTY_BAD} OR {L_PRICE_BAD} OR {L_SKU_BAD}",
        select=f"""{BUCKET('1 hour')} AS bucket,
       {L_VIP} AS vip,
       count(*) AS n,
       {DISTINCT_JSON("payload -> 'user'")} AS users,
       {L_DISTINCT(L_QTY, "r_qty")} AS qtys,
       count(DISTINCT {L_DOC}) AS docs,
       sum({L_PRICE}) AS price,
       min({L_PRICE}) AS lo_price,
       {L_DISTINCT(L_SKU, "r_sku")} AS skus,
       count({L_VIP}) AS vips""",
        group="1, 2",
        policy="quarantine",
        source=LOGICAL_EV,
    ),
    # Views the refresh pass in Rust covers (eventview_core::group_deltas): keys and measures of
    # member paths and of logical fields declared per type and version, text and numeric.
    ViewSpec(
        "v_lpass",
        """SELECT eventview.create_view('v_lpass', 'ev',
             group_by => '{"sku": "sku", "item": "$.item.sku"}',
             measures => '{"n": "count(*)", "revenue": "sum(price)", "avg_price": "avg(price)",
                           "lo": "min(price)", "hi": "max(price)", "priced": "count(price)",
                           "qty_n": "count($.qty)", "skus": "count(sku)"}',
             time_bucket => '1 day',
             on_type_error => 'quarantine')""",
        scope="true",
        bad=f"{L_SKU_BAD} OR {KEYBAD(P_ITEM_SKU)} OR {L_PRICE_BAD}",
        select=f"""{BUCKET('1 day')} AS bucket,
       {L_SKU} AS sku,
       payload #>> '{{item,sku}}' AS item,
       count(*) AS n,
       sum({L_PRICE}) AS revenue,
       avg({L_PRICE}) AS avg_price,
       min({L_PRICE}) AS lo,
       max({L_PRICE}) AS hi,
       count({L_PRICE}) AS priced,
       {NONNULL_COUNT("payload -> 'qty'")} AS qty_n,
       count({L_SKU}) AS skus""",
        group="1, 2, 3",
        policy="quarantine",
        source=LOGICAL_EV,
    ),
    ViewSpec(
        "v_pass_all",
        """SELECT eventview.create_view('v_pass_all', 'ev',
             measures => '{"n": "count(*)", "top": "max($.price)", "q": "sum($.item.quantity)"}',
             event_types => ARRAY['purchase', 'refund'],
             on_type_error => 'skip')""",
        scope="event_type IN ('purchase', 'refund')",
        bad=f"{NUMBAD(P_PRICE)} OR {NUMBAD(P_ITEM_QTY)}",
        select=f"""count(*) AS n, max({NUM(P_PRICE)}) AS top, sum({NUM(P_ITEM_QTY)}) AS q""",
        group=None,
        policy="skip",
    ),
]
# Scheduled, so that run_maintenance() refreshes it when due.
SCHEDULED_VIEW = "v_ldist"


def realtime_twin(spec):
    """The same view with realtime => true: it must equal the same reference at any moment, not
    only after a refresh (it reads the stored groups plus the changes not yet applied)."""
    name = spec.name + "_rt"
    sql = spec.create_sql.replace(f"create_view('{spec.name}'", f"create_view('{name}'", 1).rstrip()
    assert sql.endswith(")") and name in sql
    sql = sql[:-1] + ",\n             realtime => true)"
    return ViewSpec(name, sql, spec.scope, spec.bad, spec.select, spec.group, spec.policy, spec.source,
                    spec.approx, spec.base)


# Rollups (API.md section 9), each equal to the same view defined directly over the events: a
# two-level chain over v_sku (daily, filtered on a source group column, then every 2 days with
# no group column) with a realtime twin at depth 3, and rollups of a percentile view, an
# approx_percentile view, a local-time view and an unnest view.
ROLL_FILTER = "(payload #>> '{sku}' IN ('A-1', 'B-2', '12.50') OR payload #>> '{sku}' IS NULL)"
ROLLUP_VIEWS = [
    ViewSpec(
        "v_roll_day",
        """SELECT eventview.create_view('v_roll_day', 'v_sku',
             group_by => '{"sku": "sku"}',
             measures => '{"n": "n", "qty": "qty", "avg_price": "avg_price", "min_price": "min_price",
                           "max_price": "max_price", "qty_n": "qty_n"}',
             filter => '{"sku": ["A-1", "B-2", "12.50", null]}',
             time_bucket => '1 day')""",
        scope=f"event_type IN ('add_to_cart', 'purchase') AND {ROLL_FILTER}",
        bad=f"{KEYBAD(P_SKU)} OR {NUMBAD(P_QTY)} OR {NUMBAD(P_PRICE)}",
        select=next(v for v in VIEWS if v.name == "v_sku").select.replace(BUCKET('1 hour'), BUCKET('1 day')),
        group="1, 2",
        policy="quarantine",
        base="v_sku",
    ),
    ViewSpec(
        "v_roll_2day",
        """SELECT eventview.create_view('v_roll_2day', 'v_roll_day',
             measures => '{"n": "n", "qty": "qty", "low": "min_price", "high": "max_price"}',
             time_bucket => '2 days')""",
        scope=f"event_type IN ('add_to_cart', 'purchase') AND {ROLL_FILTER}",
        bad=f"{KEYBAD(P_SKU)} OR {NUMBAD(P_QTY)} OR {NUMBAD(P_PRICE)}",
        select=f"""{BUCKET('2 days')} AS bucket,
       count(*) AS n,
       sum({NUM("payload -> 'qty'")}) AS qty,
       min({NUM("payload -> 'price'")}) AS low,
       max({NUM("payload -> 'price'")}) AS high""",
        group="1",
        policy="quarantine",
        base="v_sku",
    ),
    ViewSpec(
        "v_roll_pct",
        """SELECT eventview.create_view('v_roll_pct', 'v_pct',
             measures => '{"n": "n", "p50": "p50", "p90": "p90", "p100": "p100"}',
             time_bucket => '7 days')""",
        scope="true",
        bad=f"{KEYBAD(P_SKU)} OR {NUMBAD(P_PRICE)} OR {NUMBAD(P_QTY)}",
        select=f"""{BUCKET('7 days')} AS bucket,
       count(*) AS n,
       percentile_disc(0.5) WITHIN GROUP (ORDER BY {NUM(P_PRICE)}) AS p50,
       percentile_disc(0.9) WITHIN GROUP (ORDER BY {NUM(P_QTY)}) AS p90,
       percentile_disc(1) WITHIN GROUP (ORDER BY {NUM(P_PRICE)}) AS p100""",
        group="1",
        policy="quarantine",
        base="v_pct",
    ),
    ViewSpec(
        "v_roll_apct",
        """SELECT eventview.create_view('v_roll_apct', 'v_apct', measures => '{"n": "n", "a50": "a50"}')""",
        scope="true",
        bad=f"{KEYBAD(P_SKU)} OR {NUMBAD(P_PRICE)} OR {NUMBAD(P_QTY)}",
        select=f"""count(*) AS n,
       percentile_disc(0.5) WITHIN GROUP (ORDER BY {NUM(P_PRICE)}) AS e50""",
        group=None,
        policy="skip",
        approx=([], {"a50": "e50"}),
        base="v_apct",
    ),
    ViewSpec(
        "v_roll_local",
        """SELECT eventview.create_view('v_roll_local', 'v_local_day',
             group_by => '{"sku": "sku"}',
             measures => '{"n": "n", "qty": "qty", "max_price": "max_price"}',
             time_bucket => '7 days')""",
        scope="true",
        bad=f"{KEYBAD(P_SKU)} OR {NUMBAD(P_QTY)} OR {NUMBAD(P_PRICE)}",
        select=f"""{LOCAL_BUCKET('7 days', 'Europe/Berlin')} AS bucket,
       payload #>> '{{sku}}' AS sku,
       count(*) AS n,
       sum({NUM(P_QTY)}) AS qty,
       max({NUM(P_PRICE)}) AS max_price""",
        group="1, 2",
        policy="skip",
        base="v_local_day",
    ),
    ViewSpec(
        "v_roll_unnest",
        """SELECT eventview.create_view('v_roll_unnest', 'v_unnest',
             measures => '{"n": "n", "users": "users", "top": "top"}')""",
        scope="true",
        bad="""EXISTS (SELECT 1 FROM jsonb_array_elements(
                        CASE WHEN jsonb_typeof(payload -> 'tags') = 'array' THEN payload -> 'tags' END) x
                    WHERE jsonb_typeof(x) IN ('object', 'array')) OR """ + NUMBAD(P_PRICE),
        select=f"""count(*) AS n,
       {DISTINCT_JSON("payload -> 'user'")} AS users,
       max({NUM(P_PRICE)}) AS top""",
        group=None,
        policy="quarantine",
        source="""ev CROSS JOIN LATERAL jsonb_array_elements(
                      CASE WHEN jsonb_typeof(payload -> 'tags') = 'array' THEN payload -> 'tags' END) el""",
        base="v_unnest",
    ),
]


# min/max under retraction (v_sku, v_env, v_lsku), count_distinct (v_total, v_lsku), a rich path
# (v_tags), logical fields (v_lsku), filters and buckets.
REALTIME_VIEWS = [realtime_twin(v) for v in VIEWS + LOGICAL_VIEWS
                  if v.name in ("v_sku", "v_total", "v_env", "v_tags", "v_lsku", "v_local_hour", "v_pct", "v_apct", "v_unnest",
                                "v_lpass")]
ROLLUP_VIEWS += [realtime_twin(v) for v in ROLLUP_VIEWS if v.name in ("v_roll_2day", "v_roll_unnest")]

# --------------------------------------------------------------------------------------------
# Payload generation

MISSING = object()
SKUS = ["A-1", "B-2", "C-3", "D-4", "12.50", "ünï 'q'"]
PRICES = [Decimal("9.99"), Decimal("12.50"), Decimal("3"), Decimal("100"), Decimal("0.5"),
          Decimal("7.125"), Decimal("-2.25"), Decimal("0")]


def jdump(v):
    """JSON text that keeps numbers exactly as written (Decimal('12.50') stays 12.50)."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, (int, Decimal)):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(jdump(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {jdump(x)}" for k, x in v.items() if x is not MISSING) + "}"
    raise TypeError(v)


def gen_key(rng):
    r = rng.random()
    if r < 0.80:
        return rng.choice(SKUS)
    if r < 0.85:
        return MISSING
    if r < 0.89:
        return None
    if r < 0.92:
        # Numbers are valid text keys. (Not 12.50 here: the rich-path views also read sku, and
        # how a rich path spells such a number is checked on its own by
        # test_rich_path_keeps_numbers_as_written.)
        return rng.choice([42, Decimal("-0.5"), 7])
    if r < 0.94:
        return rng.choice([True, False])
    if r < 0.97:
        return {"id": rng.randint(1, 3)}  # type error
    return ["x", 1]  # type error


def gen_num(rng, good):
    r = rng.random()
    if r < 0.84:
        return good()
    if r < 0.88:
        return MISSING
    if r < 0.91:
        return None
    if r < 0.95:
        return str(good())  # "3": a string is never a number
    if r < 0.97:
        return {"amount": good()}
    if r < 0.98:
        return True
    return [good()]


def gen_tags(rng):
    # Only arrays, JSON null or missing: for those RFC 9535 `[*]` and jsonb's lax `[*]` agree.
    r = rng.random()
    if r < 0.15:
        return MISSING
    if r < 0.20:
        return None
    if r < 0.25:
        return []
    if r < 0.78:
        return rng.sample(["red", "blue", "green", "ünï"], rng.randint(1, 3))
    if r < 0.84:
        return [1, "x"]
    if r < 0.88:
        return [None, "y"]
    if r < 0.90:
        return [True]
    if r < 0.95:
        return [{"t": 1}, "z"]  # type error
    return [["n"], "z"]  # type error


def gen_qty(rng, big=False):
    """qty/item.quantity: mostly integers; sometimes numbers a bigint field cannot take (1.5,
    and with `big` one beyond int8) or can (2.0, 1E+1: integral), besides gen_num's strings,
    objects, null... (`big` only where no view takes avg of the path: an avg of 16 digits or
    more after retractions is checked on its own by
    test_avg_does_not_depend_on_the_scale_of_retracted_values.)"""
    if rng.random() < 0.07:
        return rng.choice([Decimal("1.5"), Decimal("2.0"), Decimal("-0.5"), Decimal("1E+1"), -3] + ([10**19] if big else []))
    return gen_num(rng, lambda: rng.randint(0, 9))


# A small domain of users so that count_distinct values collide often and retractions take
# values in and out of their groups: 1, 1.0 and 1.00 are one jsonb value, "1" another.
USERS = [1, Decimal("1.0"), "1", 2, Decimal("2.00"), "2", 3, "u", True, {"id": 1}, {"id": Decimal("1.0")}, [1]]
USER_WEIGHTS = [12, 8, 8, 8, 5, 5, 4, 3, 2, 2, 2, 1]


def gen_user(rng):
    r = rng.random()
    if r < 0.12:
        return None
    if r < 0.18:
        return MISSING
    return rng.choices(USERS, USER_WEIGHTS)[0]


def gen_amount(rng):
    r = rng.random()
    if r < 0.84:
        return rng.choice([Decimal("0.1"), Decimal("19.99"), Decimal("-3.5"), 7, Decimal("1E+10"),
                           Decimal("2.5E-3"), 0, Decimal("1E-300")])
    if r < 0.90:
        return MISSING
    if r < 0.94:
        return None
    if r < 0.96:
        return "5"
    if r < 0.98:
        return {"v": 1}
    if r < 0.99:
        return True
    # A JSON number beyond double precision: a type error for a double field. (Not 1E-400, which
    # underflows: see test_a_double_field_underflow_does_not_break_refresh.)
    return Decimal("1E+400")


def gen_at(rng):
    r = rng.random()
    if r < 0.62:
        return rng.choice(list(AT_VALID))
    if r < 0.76:
        return rng.choice(AT_INVALID)
    if r < 0.84:
        return None
    return rng.choice([1767261600, True, {"t": "2026-01-01T10:00:00Z"}, ["2026-01-01T10:00:00Z"]])


def gen_doc(rng):
    # No "sku" member anywhere: v_desc reads $..sku.
    return rng.choice([{"a": 1}, {"a": Decimal("1.0")}, [1, 2], "x", 1, Decimal("1.0"), True, False, None,
                       {"b": [1, {"c": "d"}]}, [], {}, "1"])


def gen_country(rng):
    return rng.choices(["DE", "FR", "US", "GB", MISSING, None, "de", 1], [25, 20, 20, 10, 8, 5, 3, 2])[0]


def gen_payload(rng, version):
    price = lambda: rng.choice(PRICES)  # noqa: E731
    p = {}
    if version == 1:
        p["sku"] = gen_key(rng)
        p["qty"] = gen_qty(rng)
    else:
        r = rng.random()
        if r < 0.90:
            p["item"] = {"sku": gen_key(rng), "quantity": gen_qty(rng, big=True)}
        elif r < 0.94:
            p["item"] = MISSING
        elif r < 0.97:
            p["item"] = "boxed"
        else:
            p["item"] = None
        # `$..sku` sees these too; "meta" sorts after "item" both by jsonb's order and by name,
        # and a top-level sku comes before any nested one, so the first match is well defined.
        if rng.random() < 0.1:
            p["meta"] = {"sku": rng.choice(SKUS)}
        if rng.random() < 0.1:
            p["sku"] = rng.choice(SKUS)
        if rng.random() < 0.1:
            p["qty"] = gen_qty(rng)
        p["vip"] = rng.choice([True, True, False, MISSING, "true"])
    p["price"] = gen_num(rng, price)
    p["country"] = gen_country(rng)
    p["tags"] = gen_tags(rng)
    if rng.random() < 0.8:
        p["user"] = gen_user(rng)
    if rng.random() < 0.5:
        p["amount"] = gen_amount(rng)
    if rng.random() < 0.4:
        p["at"] = gen_at(rng)
    if rng.random() < 0.35:
        p["doc"] = gen_doc(rng)
    keys = list(p)
    rng.shuffle(keys)
    return jdump({k: p[k] for k in keys})


# The UTC instants of DST changes of the local-time views' zones in 2026: Berlin's (spring and
# autumn) and Sydney's (autumn and spring there).
DST_CHANGES = [datetime(2026, 3, 29, 1, tzinfo=timezone.utc), datetime(2026, 10, 25, 1, tzinfo=timezone.utc),
               datetime(2026, 4, 4, 16, tzinfo=timezone.utc), datetime(2026, 10, 3, 16, tzinfo=timezone.utc)]


def gen_time(rng):
    if rng.random() < 0.1:  # exactly on a bucket edge
        return BASE_TIME + timedelta(minutes=15 * rng.randint(0, 4 * 72))
    if rng.random() < 0.06:  # within a day of a DST change, on the hour or anywhere
        change = rng.choice(DST_CHANGES)
        if rng.random() < 0.3:
            return change + timedelta(hours=rng.randint(-24, 24))
        return change + timedelta(microseconds=rng.randint(-86400 * 10**6, 86400 * 10**6))
    return BASE_TIME + timedelta(microseconds=rng.randint(0, 3 * 86400 * 10**6))


def gen_version(rng):
    # Version 3 has no declaration of its own (laid out as version 2).
    return rng.choices([1, 2, 3], [55, 40, 5])[0]


def gen_event(rng):
    version = gen_version(rng)
    etype = rng.choices(["add_to_cart", "purchase", "page_view", "refund"], [40, 35, 20, 5])[0]
    producer = rng.choice(["web", "app"])
    return (etype, version, producer, gen_time(rng), gen_payload(rng, version))


# --------------------------------------------------------------------------------------------
# The workload


class Mismatch(AssertionError):
    pass


class Workload:
    def __init__(self, conninfo, seed):
        self.seed = seed
        self.rng = random.Random(seed)
        # Some seeds register a table of their own instead of creating one (decided without
        # drawing from rng).
        self.registered = (seed // 2) % 2 == 1
        # Some of either kind are partitioned by day (API.md section 7).
        self.partitioned = (seed // 4) % 2 == 1
        self.conninfo = conninfo
        self.log = []
        # Min/max values wait in the views' logs until a merge (a retraction, an idle refresh, or
        # this many logged): merged at every refresh, now and then, or (nearly) only when needed.
        self.extreme_log_limit = self.rng.choice([0, 7, 100000])
        # Changelog segments of a few dozen records for most seeds (segments made, emptied and
        # dropped between refreshes), of thousands for the others (decided without drawing
        # from rng).
        self.segment_min = 1000 if seed % 3 == 2 else 10
        opts = (f"-c statement_timeout=120s -c lock_timeout=60s -c eventview.extreme_log_limit={self.extreme_log_limit}"
                f" -c eventview.changelog_segment_min={self.segment_min}")
        self.a = psycopg.connect(conninfo, autocommit=True, options=opts + " -c TimeZone=America/St_Johns")
        self.c = psycopg.connect(conninfo, autocommit=True, options=opts + " -c TimeZone=Asia/Kathmandu")
        # Two connections that hold transactions open across refreshes.
        self.holders = {
            "b": psycopg.connect(conninfo, autocommit=True, options=opts + " -c TimeZone=UTC"),
            "d": psycopg.connect(conninfo, autocommit=True, options=opts + " -c TimeZone=Europe/Berlin"),
        }
        self.held = {"b": None, "d": None}  # slot -> {"count": n, "locked": set(ids)}
        self.views = []
        self.rollups = []
        self.pending = {}
        self.checks = 0
        self.refreshes = 0
        self.current = "setup"
        self.source_id = None
        self.pruned = 0  # changelog records pruned, in total
        self.prunes = 0
        self.agings = 0
        self.maintenance_refreshes = 0

    def close(self):
        for conn in [self.a, self.c, *self.holders.values()]:
            try:
                conn.close()
            except Exception:
                pass

    def note(self, msg):
        self.log.append(msg)

    # ---- bookkeeping -------------------------------------------------------------------------

    def committed(self, n):
        """n changed event rows just became visible (committed)."""
        for v in self.views:
            self.pending[v.name] += n

    def locked_ids(self):
        out = set()
        for h in self.held.values():
            if h:
                out |= h["locked"]
        return out

    def pick_ids(self, conn, k, exclude=frozenset()):
        ids = [r[0] for r in conn.execute("SELECT event_id FROM ev ORDER BY event_id").fetchall()]
        ids = [i for i in ids if i not in exclude]
        if not ids:
            return []
        return self.rng.sample(ids, min(k, len(ids)))

    # ---- writes (each returns how many changed event rows it made) ---------------------------

    def insert_values(self, conn, n, rng=None):
        rng = rng or self.rng
        rows = [gen_event(rng) for _ in range(n)]
        placeholders = ", ".join(["(%s, %s, %s, %s, %s::jsonb)"] * n)
        args = [x for row in rows for x in row]
        cur = conn.execute(
            f"INSERT INTO ev (event_type, event_version, producer, occurred_at, payload) VALUES {placeholders} "
            "RETURNING event_id",
            args,
        )
        ids = [r[0] for r in cur.fetchall()]
        assert len(ids) == n
        return n, ids

    def insert_copy(self, conn, n, rng=None):
        rng = rng or self.rng
        cur = conn.cursor()
        with cur.copy("COPY ev (event_type, event_version, producer, occurred_at, payload) FROM STDIN") as cp:
            for _ in range(n):
                cp.write_row(gen_event(rng))
        assert cur.rowcount == n
        return n

    def update_rows(self, conn, ids, rng=None):
        """One of several kinds of UPDATE of the rows `ids`; returns the rows changed."""
        rng = rng or self.rng
        if not ids:
            return 0
        kind = rng.choice(["payload", "payload", "field", "drop", "time", "type", "noop"])
        if kind == "payload":
            values = []
            for i in ids:
                version = gen_version(rng)
                values += [i, gen_payload(rng, version), version]
            ph = ", ".join(["(%s::bigint, %s::jsonb, %s::int)"] * len(ids))
            cur = conn.execute(
                f"UPDATE ev SET payload = v.p, event_version = v.ver FROM (VALUES {ph}) v(id, p, ver) "
                "WHERE ev.event_id = v.id",
                values,
            )
        elif kind == "field":
            field = rng.choice(["qty", "price", "sku", "country", "tags", "vip", "user", "amount", "at", "doc"])
            if field in ("qty", "price"):
                val = gen_num(rng, lambda: rng.choice(PRICES)) if rng.random() < 0.6 else gen_qty(rng)
            elif field == "sku":
                val = gen_key(rng)
            elif field == "country":
                val = gen_country(rng)
            elif field == "tags":
                val = gen_tags(rng)
            elif field == "user":
                val = gen_user(rng)
            elif field == "amount":
                val = gen_amount(rng)
            elif field == "at":
                val = gen_at(rng)
            elif field == "doc":
                val = gen_doc(rng)
            else:
                val = rng.choice([True, False, None])
            if val is MISSING:
                cur = conn.execute("UPDATE ev SET payload = payload - %s WHERE event_id = ANY(%s)", [field, ids])
            else:
                cur = conn.execute(
                    "UPDATE ev SET payload = jsonb_set(payload, ARRAY[%s], %s::jsonb) WHERE event_id = ANY(%s)",
                    [field, jdump(val), ids],
                )
        elif kind == "drop":
            cur = conn.execute(
                "UPDATE ev SET payload = payload - 'price' - 'item' WHERE event_id = ANY(%s)", [ids]
            )
        elif kind == "time":
            shift = timedelta(minutes=rng.choice([-90, -15, -1, 7, 45, 60, 24 * 60]))
            cur = conn.execute(
                "UPDATE ev SET occurred_at = occurred_at + %s WHERE event_id = ANY(%s)", [shift, ids]
            )
        elif kind == "type":
            t = rng.choice(["add_to_cart", "purchase", "page_view", "refund"])
            cur = conn.execute("UPDATE ev SET event_type = %s WHERE event_id = ANY(%s)", [t, ids])
        else:
            cur = conn.execute("UPDATE ev SET producer = producer WHERE event_id = ANY(%s)", [ids])
        return cur.rowcount

    def delete_rows(self, conn, ids):
        if not ids:
            return 0
        return conn.execute("DELETE FROM ev WHERE event_id = ANY(%s)", [ids]).rowcount

    def random_write(self, conn, exclude, own_ids=()):
        """A random write on `conn`; returns (changed rows, ids it touched or made)."""
        r = self.rng.random()
        if r < 0.35:
            n, ids = self.insert_values(conn, self.rng.randint(1, 20))
            return n, set(ids)
        if r < 0.5:
            return self.insert_copy(conn, self.rng.randint(5, 60)), set()
        pool_ids = self.pick_ids(conn, self.rng.randint(1, 8), exclude)
        if own_ids and self.rng.random() < 0.5:
            pool_ids = self.rng.sample(sorted(own_ids), min(len(own_ids), 3))
        if r < 0.85:
            return self.update_rows(conn, pool_ids), set(pool_ids)
        return self.delete_rows(conn, pool_ids), set(pool_ids)

    # ---- operations --------------------------------------------------------------------------

    def op_insert_values(self):
        n, _ = self.insert_values(self.a, self.rng.randint(1, 30))
        self.committed(n)
        self.note(f"insert values {n}")

    def op_insert_copy(self):
        n = self.insert_copy(self.a, self.rng.randint(5, 100))
        self.committed(n)
        self.note(f"copy {n}")

    def op_update(self):
        ids = self.pick_ids(self.a, self.rng.randint(1, 10), self.locked_ids())
        n = self.update_rows(self.a, ids)
        self.committed(n)
        self.note(f"update {n}")

    def op_bulk_update(self):
        locked = sorted(self.locked_ids())
        m = self.rng.randint(3, 9)
        cur = self.a.execute(
            "UPDATE ev SET occurred_at = occurred_at + interval '20 minutes', "
            "payload = jsonb_set(payload, '{qty}', to_jsonb((event_id %% 5)::int)) "
            "WHERE event_id %% %s = %s AND NOT (event_id = ANY(%s))",
            [m, self.rng.randrange(m), locked],
        )
        self.committed(cur.rowcount)
        self.note(f"bulk update {cur.rowcount}")

    def op_delete(self):
        ids = self.pick_ids(self.a, self.rng.randint(1, 10), self.locked_ids())
        n = self.delete_rows(self.a, ids)
        self.committed(n)
        self.note(f"delete {n}")

    def op_rollback_txn(self):
        a = self.a
        a.execute("BEGIN")
        for _ in range(self.rng.randint(1, 4)):
            self.random_write(a, self.locked_ids())
        a.execute("ROLLBACK")
        self.note("rolled back txn")

    def op_savepoint_txn(self):
        a = self.a
        a.execute("BEGIN")
        kept, _ = self.random_write(a, self.locked_ids())
        a.execute("SAVEPOINT s1")
        for _ in range(self.rng.randint(1, 3)):
            self.random_write(a, self.locked_ids())
        a.execute("ROLLBACK TO SAVEPOINT s1")
        a.execute("SAVEPOINT s2")
        n, _ = self.random_write(a, self.locked_ids())
        kept += n
        a.execute("RELEASE SAVEPOINT s2")
        if self.rng.random() < 0.5:
            a.execute("SAVEPOINT s3")
            self.random_write(a, self.locked_ids())
            a.execute("ROLLBACK TO SAVEPOINT s3")
        a.execute("COMMIT")
        self.committed(kept)
        self.note(f"savepoint txn kept {kept}")

    def op_multi_txn(self):
        """Insert rows, then update some of them (twice), delete one, touch old rows; commit."""
        a = self.a
        a.execute("BEGIN")
        n, ids = self.insert_values(a, self.rng.randint(2, 10))
        total = n
        total += self.update_rows(a, ids[: max(1, len(ids) // 2)])
        total += self.update_rows(a, ids[:1])
        total += self.delete_rows(a, ids[-1:])
        old = self.pick_ids(a, 3, self.locked_ids() | set(ids))
        total += self.update_rows(a, old)
        total += self.update_rows(a, old[:1])
        a.execute("COMMIT")
        self.committed(total)
        self.note(f"multi-statement txn {total}")

    def op_held_open(self, slot=None, writes=None):
        free = [s for s, h in self.held.items() if h is None]
        if slot is None:
            if not free:
                return
            slot = self.rng.choice(free)
        conn = self.holders[slot]
        conn.execute("BEGIN")
        h = self.held[slot] = {"count": 0, "locked": set(), "own": set()}
        for _ in range(writes or self.rng.randint(1, 3)):
            self._held_write(slot)
        self.note(f"held txn {slot} opened ({h['count']} so far)")

    def _held_write(self, slot):
        h = self.held[slot]
        others = set()
        for s, o in self.held.items():
            if s != slot and o:
                others |= o["locked"]
        n, touched = self.random_write(self.holders[slot], others, own_ids=h["own"])
        h["count"] += n
        h["locked"] |= touched
        h["own"] |= touched

    def op_held_add(self):
        open_ = [s for s, h in self.held.items() if h]
        if open_:
            slot = self.rng.choice(open_)
            self._held_write(slot)
            self.note(f"held txn {slot} wrote ({self.held[slot]['count']} so far)")

    def op_held_end(self, commit=True, slot=None):
        open_ = [s for s, h in self.held.items() if h]
        if slot is None:
            if not open_:
                return
            slot = self.rng.choice(open_)
        h = self.held[slot]
        self.holders[slot].execute("COMMIT" if commit else "ROLLBACK")
        self.held[slot] = None
        if commit:
            self.committed(h["count"])
        self.note(f"held txn {slot} {'committed' if commit else 'rolled back'} ({h['count']})")

    def op_held_commit(self):
        self.op_held_end(commit=True)

    def op_held_rollback(self):
        self.op_held_end(commit=False)

    def op_truncate(self):
        # TRUNCATE waits for every open transaction on the table: end the held ones first.
        for slot in ("b", "d"):
            if self.held[slot]:
                self.op_held_end(commit=self.rng.random() < 0.8, slot=slot)
        a = self.a
        if self.rng.random() < 0.5:
            n = a.execute("SELECT count(*) FROM ev").fetchone()[0]
            a.execute("TRUNCATE ev")
            self.committed(n)
            self.note(f"truncate ({n})")
        else:
            a.execute("BEGIN")
            n = a.execute("SELECT count(*) FROM ev").fetchone()[0]
            a.execute("TRUNCATE ev")
            m, _ = self.insert_values(a, self.rng.randint(1, 10))
            a.execute("COMMIT")
            self.committed(n + m)
            self.note(f"truncate ({n}) + insert {m} in one txn")

    def refresh(self, conn, view):
        # The views the refresh pass in Rust covers are refreshed through it or through the SQL
        # stages, in turn at random: both must give the same view.
        one_pass = self.rng.random() < 0.7
        conn.execute(f"SET eventview.one_pass_refresh = {'on' if one_pass else 'off'}")
        got = conn.execute("SELECT eventview.refresh(%s)", [view.name]).fetchone()[0]
        self.refreshes += 1
        exp = self.pending[view.name]
        self.pending[view.name] = 0
        self.note(f"refresh {view.name} -> {got}")
        if got != exp:
            raise Mismatch(f"refresh('{view.name}') returned {got}, expected {exp} changed event rows")

    def refresh_all(self, conn):
        got = conn.execute("SELECT eventview.refresh_all()").fetchone()[0]
        self.refreshes += 1
        exp = sum(self.pending.values())
        for k in self.pending:
            self.pending[k] = 0
        self.note(f"refresh_all -> {got}")
        if got != exp:
            raise Mismatch(f"refresh_all() returned {got}, expected {exp}")

    def op_refresh_one(self):
        self.refresh(self.rng.choice([self.a, self.c]), self.rng.choice(self.views))

    def op_refresh_all(self):
        self.refresh_all(self.a)

    def op_refresh_concurrent(self):
        """The same view refreshed from two connections at once: nothing double-applied, the
        second waits and returns 0."""
        view = self.rng.choice(self.views)
        exp = self.pending[view.name]
        variant = self.rng.choice(["race", "hold", "all"])
        self.current += f" ({variant}, {view.name})"
        results, errors = {}, []
        barrier = threading.Barrier(2)

        def first():
            try:
                barrier.wait()
                if variant == "hold":
                    self.a.execute("BEGIN")
                    results["a"] = self.a.execute("SELECT eventview.refresh(%s)", [view.name]).fetchone()[0]
                    time.sleep(0.05)
                    self.a.execute("COMMIT")
                elif variant == "all":
                    results["a"] = self.a.execute("SELECT eventview.refresh_all()").fetchone()[0]
                else:
                    results["a"] = self.a.execute("SELECT eventview.refresh(%s)", [view.name]).fetchone()[0]
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        def second():
            try:
                barrier.wait()
                if variant == "hold":
                    time.sleep(0.01)
                results["c"] = self.c.execute("SELECT eventview.refresh(%s)", [view.name]).fetchone()[0]
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(150)
        if errors:
            raise errors[0]
        self.refreshes += 2
        self.note(f"concurrent refresh ({variant}) of {view.name}: {results}")
        if variant == "all":
            others = sum(v for k, v in self.pending.items() if k != view.name)
            total = results["a"] + results["c"]
            if total != exp + others:
                raise Mismatch(f"concurrent refresh_all/refresh of {view.name}: {results}, expected "
                               f"{exp} for the view and {others} for the others")
            if results["c"] not in (0, exp):
                raise Mismatch(f"concurrent refresh of {view.name} returned {results['c']}, expected 0 or {exp}")
            for k in self.pending:
                self.pending[k] = 0
        else:
            if sorted(results.values()) != sorted([0, exp]):
                raise Mismatch(f"concurrent refreshes of {view.name} returned {results}; expected one {exp} and one 0")
            self.pending[view.name] = 0

    def op_refresh_inside_writer_txn(self):
        """A transaction that writes, refreshes some views, writes more, maybe refreshes again,
        then commits or rolls back. A refresh applies its own transaction's changes made so far;
        the ones made after it must still be applied by a later refresh."""
        a = self.a
        before = dict(self.pending)
        own_total = 0
        own_applied = {v.name: 0 for v in self.views}
        a.execute("BEGIN")
        for round_ in range(self.rng.randint(1, 3)):
            n, _ = self.random_write(a, self.locked_ids())
            own_total += n
            for view in self.rng.sample(self.views, self.rng.randint(1, 3)):
                got = a.execute("SELECT eventview.refresh(%s)", [view.name]).fetchone()[0]
                self.refreshes += 1
                exp = self.pending[view.name] + own_total - own_applied[view.name]
                if got != exp:
                    raise Mismatch(f"refresh('{view.name}') inside a writing transaction returned {got}, expected {exp}")
                self.pending[view.name] = 0
                own_applied[view.name] = own_total
        if self.rng.random() < 0.3:
            # Inside the writing transaction: its own changes that every view has applied may
            # go, the ones some view has not (and the writes below) must stay. Sometimes every
            # view has applied them (refresh_all first), so that some can go.
            if self.rng.random() < 0.5:
                got = a.execute("SELECT eventview.refresh_all()").fetchone()[0]
                self.refreshes += 1
                exp = sum(self.pending[v.name] + own_total - own_applied[v.name] for v in self.views)
                if got != exp:
                    raise Mismatch(f"refresh_all() inside a writing transaction returned {got}, expected {exp}")
                for view in self.views:
                    self.pending[view.name] = 0
                    own_applied[view.name] = own_total
            self.age_changelog(a)
            self.note(f"prune inside the writing transaction -> {self.prune(a)}")
        n, _ = self.random_write(a, self.locked_ids())
        own_total += n
        if self.rng.random() < 0.8:
            a.execute("COMMIT")
            for view in self.views:
                self.pending[view.name] += own_total - own_applied[view.name]
            self.note(f"writing txn with refreshes committed ({own_total})")
        else:
            a.execute("ROLLBACK")
            self.pending = before
            self.note("writing txn with refreshes rolled back")

    def op_refresh_during_writes(self):
        """Refreshes while another connection keeps committing changes. Each refresh consumes
        everything committed before it started plus some part of the concurrent changes; the
        rest stays pending for the next one (exact accounting, whatever the timing)."""
        free = [s for s, h in self.held.items() if h is None]
        if not free:
            return
        conn = self.holders[self.rng.choice(free)]
        wrng = random.Random(self.rng.random())
        pool = self.pick_ids(self.a, 20, self.locked_ids())
        steps = self.rng.randint(3, 8)
        order = list(self.views)
        self.rng.shuffle(order)
        written, errors = [0], []
        done = threading.Event()

        def writer():
            try:
                for _ in range(steps):
                    r = wrng.random()
                    if r < 0.5:
                        written[0] += self.insert_values(conn, wrng.randint(1, 40), rng=wrng)[0]
                    elif r < 0.65:
                        written[0] += self.insert_copy(conn, wrng.randint(5, 50), rng=wrng)
                    elif r < 0.9:
                        written[0] += self.update_rows(conn, wrng.sample(pool, min(3, len(pool))), rng=wrng)
                    else:
                        written[0] += self.delete_rows(conn, wrng.sample(pool, min(2, len(pool))))
            except Exception as e:  # noqa: BLE001
                errors.append(e)
            finally:
                done.set()

        prunes = self.rng.randint(0, 3)
        pruned = [0]

        def pruner():
            # Prunes from a third connection while views refresh and rows are written.
            try:
                for _ in range(prunes):
                    pruned[0] += self.c.execute("SELECT eventview.prune()").fetchone()[0]
                    time.sleep(0.005)
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        if prunes:
            self.age_changelog(self.c)
        before = dict(self.pending)
        got = {}
        t = threading.Thread(target=writer)
        t.start()
        tp = threading.Thread(target=pruner)
        tp.start()
        for view in order:
            got[view.name] = self.a.execute("SELECT eventview.refresh(%s)", [view.name]).fetchone()[0]
            self.refreshes += 1
        t.join(150)
        tp.join(150)
        self.pruned += pruned[0]
        self.prunes += prunes
        if errors:
            raise errors[0]
        w = written[0]
        self.note(f"refreshes during {w} concurrent writes: {got}")
        for view in self.views:
            r = got.get(view.name, 0)
            if not before[view.name] <= r <= before[view.name] + w:
                raise Mismatch(f"refresh('{view.name}') during concurrent writes returned {r}; "
                               f"{before[view.name]} were pending before and {w} were written meanwhile")
            self.pending[view.name] = before[view.name] + w - r

    def op_create_late_view(self):
        if any(v.name == LATE_VIEW.name for v in self.views):
            return
        # While a transaction holds uncommitted inserts/updates: creation must include every
        # committed event exactly once and leave the uncommitted ones to a later refresh.
        if not any(self.held.values()):
            self.op_held_open()
        if self.rng.random() < 0.5:
            self.a.execute(LATE_VIEW.create_sql)
            self.views.append(LATE_VIEW)
            self.pending[LATE_VIEW.name] = 0
            self.note("created late view v_desc")
        else:
            # Inside a transaction that writes before and after the creation: the writes before
            # are part of the initial contents, the ones after are pending for the new view.
            a = self.a
            a.execute("BEGIN")
            n1, _ = self.random_write(a, self.locked_ids())
            a.execute(LATE_VIEW.create_sql)
            n2, _ = self.random_write(a, self.locked_ids())
            a.execute("COMMIT")
            self.committed(n1 + n2)
            self.views.append(LATE_VIEW)
            self.pending[LATE_VIEW.name] = n2
            self.note(f"created late view v_desc inside a writing transaction ({n1} before, {n2} after)")
            self.refresh(a, LATE_VIEW)
        self.check_view(LATE_VIEW)

    # ---- pruning -----------------------------------------------------------------------------

    def changelog(self):
        return f"eventview._changes_{self.source_id}"

    def prune(self, conn):
        """eventview.prune(): only records every view has applied may go (then the next refresh
        must still match from scratch and pending_changes stay exact)."""
        if self.rng.random() < 0.5:
            n = conn.execute("SELECT eventview.prune()").fetchone()[0]
        else:
            n = conn.execute("SELECT eventview.prune('ev')").fetchone()[0]
        self.prunes += 1
        self.pruned += n
        return n

    def age_changelog(self, conn):
        """Changelog records are pruned only once older than delta_retention: make the records
        visible to `conn` look 8 days old."""
        cur = conn.execute(f"UPDATE {self.changelog()} SET logged_at = logged_at - interval '8 days'")
        # Segments made so far, as if made 8 days ago too (their records' age for prune).
        conn.execute("UPDATE eventview._changelog_segments SET made_at = made_at - interval '8 days'")
        self.agings += 1
        return cur.rowcount

    def op_prune(self):
        n = self.prune(self.rng.choice([self.a, self.c]))
        self.note(f"prune -> {n}")

    def op_age_and_prune(self):
        aged = self.age_changelog(self.a)
        n = self.prune(self.rng.choice([self.a, self.c])) if self.rng.random() < 0.7 else None
        self.note(f"aged {aged} changelog records, prune -> {n}")

    def op_run_maintenance(self):
        """run_maintenance(): refreshes the scheduled view when it is due, then prunes."""
        q = "SELECT last_refresh_at, last_error FROM eventview.views WHERE name = %s::regclass"
        before = self.a.execute(q, [SCHEDULED_VIEW]).fetchone()[0]
        self.a.execute("SELECT eventview.run_maintenance()")
        after, error = self.a.execute(q, [SCHEDULED_VIEW]).fetchone()
        refreshed = after != before
        if refreshed:
            if error:
                raise Mismatch(f"run_maintenance() failed to refresh {SCHEDULED_VIEW}: {error}")
            self.pending[SCHEDULED_VIEW] = 0
            self.refreshes += 1
            self.maintenance_refreshes += 1
        self.note(f"run_maintenance (refreshed {SCHEDULED_VIEW}: {refreshed})")

    # ---- checks ------------------------------------------------------------------------------

    def check_view(self, view):
        self.check_contents(view)
        if not view.base:
            self.check_type_errors(view)

    def check_contents(self, view):
        if view.approx:
            return self.check_approx_contents(view)
        a = self.a
        ref = view.reference()
        # Both differences in one statement, the reference computed once.
        diff = a.execute(
            f"WITH q AS MATERIALIZED (SELECT * FROM {view.name}), r AS MATERIALIZED ({ref})\n"
            "SELECT true, x.* FROM (TABLE q EXCEPT ALL TABLE r) x\n"
            "UNION ALL SELECT false, y.* FROM (TABLE r EXCEPT ALL TABLE q) y"
        ).fetchall()
        extra = [r[1:] for r in diff if r[0]]
        missing = [r[1:] for r in diff if not r[0]]
        if extra or missing:
            raise Mismatch(
                f"view {view.name} differs from the from-scratch aggregate\n"
                f"  rows in the view but not in the reference ({len(extra)}): {extra[:15]}\n"
                f"  rows in the reference but not in the view ({len(missing)}): {missing[:15]}\n"
                f"  reference query:\n{ref}"
            )

    def check_approx_contents(self, view):
        """The same groups and exact columns as the reference; each approx_percentile within 1%
        of the reference's percentile_disc."""
        keys, approx = view.approx
        ref = view.reference()
        exact = [c for c in self.a.execute(f"SELECT * FROM {view.name} LIMIT 0").description
                 if c.name not in approx]
        cols = ", ".join(f'"{c.name}"' for c in exact)
        diff = self.a.execute(
            f"WITH q AS MATERIALIZED (SELECT * FROM {view.name}), r AS MATERIALIZED ({ref})\n"
            f"SELECT true, x.* FROM (SELECT {cols} FROM q EXCEPT ALL SELECT {cols} FROM r) x\n"
            f"UNION ALL SELECT false, y.* FROM (SELECT {cols} FROM r EXCEPT ALL SELECT {cols} FROM q) y"
        ).fetchall()
        if diff:
            raise Mismatch(f"view {view.name} differs from the from-scratch aggregate: {diff[:15]}\n  reference query:\n{ref}")
        on = " AND ".join(f'q."{k}" IS NOT DISTINCT FROM r."{k}"' for k in keys) or "true"
        off = " OR ".join(
            f'NOT coalesce((q."{c}" IS NULL AND r."{e}" IS NULL) OR abs(q."{c}" - r."{e}") <= 0.01 * abs(r."{e}") + 1e-12, false)'
            for c, e in approx.items())
        bad = self.a.execute(
            f"WITH q AS MATERIALIZED (SELECT * FROM {view.name}), r AS MATERIALIZED ({ref})\n"
            f"SELECT q.*, r.* FROM q JOIN r ON {on} WHERE {off}").fetchall()
        if bad:
            raise Mismatch(f"view {view.name}: approx_percentile more than 1% from percentile_disc: {bad[:5]}")

    def check_type_errors(self, view):
        a = self.a
        bad = {r[0] for r in a.execute(view.bad_events()).fetchall()}
        if view.policy == "quarantine":
            q_ids = {
                r[0]
                for r in a.execute(
                    "SELECT event_id FROM eventview.quarantine WHERE to_regclass(view_name) = %s::regclass", [view.name]
                ).fetchall()
            }
            if not bad <= q_ids:
                raise Mismatch(f"view {view.name}: events with type errors not in quarantine: {sorted(bad - q_ids)[:20]}")
            # Entries of versions since updated or deleted are taken back: the quarantine holds
            # exactly the current events the view leaves out, once each, and so does the counter.
            if q_ids - bad:
                raise Mismatch(f"view {view.name}: quarantine entries of events without type errors: {sorted(q_ids - bad)[:20]}")
            entries, counted = a.execute(
                """SELECT (SELECT count(*) FROM eventview.quarantine WHERE to_regclass(view_name) = %s::regclass),
                          (SELECT quarantined FROM eventview.views WHERE name = %s::regclass)""",
                [view.name, view.name],
            ).fetchone()
            if not entries == counted == len(bad):
                raise Mismatch(f"view {view.name}: {entries} quarantine entries, quarantined = {counted}, {len(bad)} events with type errors")
        else:
            skipped = a.execute(
                "SELECT skipped FROM eventview.views WHERE name = %s::regclass", [view.name]
            ).fetchone()[0]
            if skipped < len(bad):
                raise Mismatch(f"view {view.name}: skipped = {skipped}, but {len(bad)} current events have type errors")

    def op_check(self):
        # pending_changes (before refreshing) must count exactly the committed changes not applied.
        for view in self.views:
            got = self.a.execute(
                "SELECT pending_changes FROM eventview.views WHERE name = %s::regclass", [view.name]
            ).fetchone()[0]
            if got != self.pending[view.name]:
                raise Mismatch(f"eventview.views.pending_changes of {view.name} is {got}, expected {self.pending[view.name]}")
        if self.rng.random() < 0.3:
            self.refresh_all(self.a)
        else:
            order = list(self.views)
            self.rng.shuffle(order)
            for view in order:
                self.refresh(self.rng.choice([self.a, self.c]), view)
        for view in self.views:
            self.check_view(view)
        for view in self.rollups:
            self.refresh_rollup(self.rng.choice([self.a, self.c]), view)
            self.check_view(view)
        self.checks += 1
        self.note(f"check #{self.checks} ok")

    def op_rebuild_window(self):
        """A windowed rebuild of a bucketed view (local-time ones included): the buckets that
        start in the window are recomputed from the events, the other committed changes applied
        as a refresh would; the view then equals the from-scratch aggregate."""
        view = self.rng.choice([v for v in self.views if "time_bucket" in v.create_sql])
        lo = gen_time(self.rng)
        hi = lo + timedelta(hours=self.rng.choice([1, 5, 26, 75]))
        self.current += f" ({view.name}, [{lo.isoformat()}, {hi.isoformat()}))"
        self.a.execute("SELECT eventview.rebuild(%s, %s, %s)", [view.name, lo, hi])
        self.pending[view.name] = 0
        self.note(f"rebuild {view.name} [{lo.isoformat()}, {hi.isoformat()})")
        self.check_view(view)

    def refresh_rollup(self, conn, view):
        """A rollup's refresh refreshes the views it reads through first: it returns the event
        rows its base view's refresh consumed."""
        got = conn.execute("SELECT eventview.refresh(%s)", [view.name]).fetchone()[0]
        self.refreshes += 1
        exp = self.pending[view.base]
        self.pending[view.base] = 0
        self.note(f"refresh rollup {view.name} -> {got}")
        if got != exp:
            raise Mismatch(f"refresh('{view.name}') returned {got}, expected {exp} (the pending changes of {view.base})")

    def op_refresh_rollup(self):
        """A rollup refreshed (its sources first), then equal to the view defined directly over
        the events; sometimes inside a transaction that writes before and after, whose own
        changes the rollup then includes."""
        view = self.rng.choice(self.rollups)
        self.current += f" ({view.name})"
        if self.rng.random() < 0.7:
            self.refresh_rollup(self.rng.choice([self.a, self.c]), view)
            self.check_view(view)
            return
        a = self.a
        before = dict(self.pending)
        a.execute("BEGIN")
        try:
            n1, _ = self.random_write(a, self.locked_ids())
            got = a.execute("SELECT eventview.refresh(%s)", [view.name]).fetchone()[0]
            exp = self.pending[view.base] + n1
            if got != exp:
                raise Mismatch(f"refresh('{view.name}') inside a writing transaction returned {got}, expected {exp}")
            self.check_contents(view)
            n2, _ = self.random_write(a, self.locked_ids())
        except Exception:
            a.execute("ROLLBACK")
            raise
        if self.rng.random() < 0.8:
            a.execute("COMMIT")
            self.committed(n1 + n2)
            self.pending[view.base] = n2
            self.note(f"rollup {view.name} refreshed inside a writing transaction, committed ({n1} + {n2})")
        else:
            a.execute("ROLLBACK")
            self.pending = before
            self.note(f"rollup {view.name} refreshed inside a writing transaction, rolled back")

    def op_rebuild_rollup(self):
        """A rollup rebuilt from its source's stored groups, whole or in a window of buckets."""
        view = self.rng.choice(self.rollups)
        if "time_bucket" in view.create_sql and self.rng.random() < 0.6:
            lo = gen_time(self.rng)
            hi = lo + timedelta(days=self.rng.choice([1, 3, 8]))
            self.a.execute("SELECT eventview.rebuild(%s, %s, %s)", [view.name, lo, hi])
            self.note(f"rebuild rollup {view.name} [{lo.isoformat()}, {hi.isoformat()})")
        else:
            self.a.execute("SELECT eventview.rebuild(%s)", [view.name])
            self.note(f"rebuild rollup {view.name}")
        self.pending[view.base] = 0
        self.check_view(view)

    def op_check_realtime(self):
        """Realtime views, unrefreshed, equal the from-scratch aggregate at any moment: with
        committed changes pending, and inside a writing transaction, its own changes included
        (the transaction is then rolled back)."""
        views = [v for v in self.views + self.rollups if v.name.endswith("_rt")]
        if self.rng.random() < 0.5:
            for view in views:
                self.check_contents(view)
            self.note("realtime check ok")
            return
        a = self.a
        a.execute("BEGIN")
        try:
            for _ in range(self.rng.randint(1, 3)):
                self.random_write(a, self.locked_ids())
            for view in self.rng.sample(views, 2):
                self.check_contents(view)
        finally:
            a.execute("ROLLBACK")
        self.note("realtime check inside a writing transaction ok")

    def out_of_order_commit(self):
        """begin T1, insert; begin T2, insert; commit T2; refresh; commit T1; refresh."""
        for slot in ("b", "d"):
            if self.held[slot]:
                self.op_held_end(commit=True, slot=slot)
        self.holders["b"].execute("BEGIN")
        self.held["b"] = {"count": 0, "locked": set(), "own": set()}
        n1, _ = self.insert_values(self.holders["b"], 5)
        self.held["b"]["count"] += n1
        self.holders["d"].execute("BEGIN")
        self.held["d"] = {"count": 0, "locked": set(), "own": set()}
        n2, _ = self.insert_values(self.holders["d"], 7)
        self.held["d"]["count"] += n2
        self.note("out-of-order: T1 (b) and T2 (d) inserted")
        self.op_held_end(commit=True, slot="d")
        self.op_check()
        self.op_held_end(commit=True, slot="b")
        self.op_check()

    def run(self, n_ops):
        a = self.a
        # A delta_retention small enough that prune() removes applied records as it goes, or the
        # default one, where only records aged by op_age_and_prune can go. (No `retention`: pruning
        # raw events is meant to make views differ from the table.)
        self.delta_retention = self.rng.choice(["1 microsecond", "300 milliseconds", "7 days"])
        if self.registered and self.partitioned:
            # A partitioned table of the user's own, with events in it before it is registered:
            # a default partition and two days' partitions; an extra column, no CHECK constraints.
            a.execute("""CREATE TABLE ev (
                             tenant integer DEFAULT 7,
                             payload jsonb NOT NULL,
                             event_id bigint GENERATED BY DEFAULT AS IDENTITY,
                             occurred_at timestamptz NOT NULL DEFAULT now(),
                             event_type text NOT NULL,
                             event_key text,
                             producer text NOT NULL DEFAULT current_user,
                             event_version integer NOT NULL DEFAULT 1,
                             ingested_at timestamptz NOT NULL DEFAULT now(),
                             PRIMARY KEY (event_id, occurred_at)) PARTITION BY RANGE (occurred_at)""")
            a.execute("CREATE TABLE ev_rest PARTITION OF ev DEFAULT")
            for day in (0, 1):
                lo = BASE_TIME + timedelta(days=day)
                a.execute(f"CREATE TABLE ev_jan{day} PARTITION OF ev FOR VALUES FROM ('{lo.isoformat()}') TO ('{(lo + timedelta(days=1)).isoformat()}')")
            self.insert_copy(a, 40)
            a.execute("SELECT eventview.register_event_table('ev', delta_retention => %s::interval)", [self.delta_retention])
        elif self.registered:
            # A table of the user's own, with events in it before it is registered: the envelope
            # columns in another order, an extra column, no CHECK constraints.
            a.execute("""CREATE TABLE ev (
                             tenant integer DEFAULT 7,
                             payload jsonb NOT NULL,
                             event_id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
                             occurred_at timestamptz NOT NULL DEFAULT now(),
                             event_type text NOT NULL,
                             event_key text UNIQUE,
                             producer text NOT NULL DEFAULT current_user,
                             event_version integer NOT NULL DEFAULT 1,
                             ingested_at timestamptz NOT NULL DEFAULT now())""")
            self.insert_copy(a, 40)
            a.execute("SELECT eventview.register_event_table('ev', delta_retention => %s::interval)", [self.delta_retention])
        elif self.partitioned:
            # Partitions for the first two days of the workload's times, made by the user (the
            # capture follows them); later times and updates moving events past them land in the
            # default partition.
            a.execute("SELECT eventview.create_event_table('ev', delta_retention => %s::interval, partition_interval => '1 day')",
                      [self.delta_retention])
            for day in (0, 1):
                lo = BASE_TIME + timedelta(days=day)
                a.execute(f"CREATE TABLE ev_jan{day} PARTITION OF ev FOR VALUES FROM ('{lo.isoformat()}') TO ('{(lo + timedelta(days=1)).isoformat()}')")
        else:
            a.execute("SELECT eventview.create_event_table('ev', delta_retention => %s::interval)", [self.delta_retention])
        self.source_id = a.execute(
            "SELECT source_id FROM eventview._sources WHERE relid = 'ev'::regclass").fetchone()[0]
        decls = list(FIELD_DECLS)
        self.rng.shuffle(decls)
        for decl in decls:
            a.execute(define_field_sql(decl))
        # Some events exist before the views: creation must include them exactly once.
        self.insert_copy(a, 50)
        for view in VIEWS + LOGICAL_VIEWS + REALTIME_VIEWS:
            a.execute(view.create_sql)
            self.views.append(view)
            self.pending[view.name] = 0
        # Rollups are refreshed and checked by their own operations (a rollup's refresh counts
        # the event rows its sources' refreshes consumed).
        for view in ROLLUP_VIEWS:
            a.execute(view.create_sql)
            self.rollups.append(view)
            self.check_view(view)
        # Due at (nearly) every run_maintenance() call.
        a.execute("SELECT eventview.schedule(%s, '10 milliseconds')", [SCHEDULED_VIEW])
        for view in self.views:
            self.check_view(view)
        self.out_of_order_commit()

        ops = [
            (self.op_insert_values, 16), (self.op_insert_copy, 6), (self.op_update, 10),
            (self.op_bulk_update, 2), (self.op_delete, 6), (self.op_rollback_txn, 4),
            (self.op_savepoint_txn, 4), (self.op_multi_txn, 4), (self.op_held_open, 4),
            (self.op_held_add, 4), (self.op_held_commit, 4), (self.op_held_rollback, 1),
            (self.op_refresh_one, 8), (self.op_refresh_all, 2), (self.op_refresh_concurrent, 3),
            (self.op_refresh_during_writes, 2), (self.op_refresh_inside_writer_txn, 3), (self.op_truncate, 0.4), (self.op_check, 3),
            (self.op_prune, 3), (self.op_age_and_prune, 1.5), (self.op_run_maintenance, 1),
            (self.op_check_realtime, 3), (self.op_rebuild_window, 1),
            (self.op_refresh_rollup, 4), (self.op_rebuild_rollup, 0.7),
        ]
        funcs, weights = zip(*ops)
        late_at = n_ops // 3
        for i in range(n_ops):
            if i == late_at:
                self.current = f"op #{i}: op_create_late_view"
                self.op_create_late_view()
            func = self.rng.choices(funcs, weights)[0]
            self.current = f"op #{i}: {getattr(func, '__name__', 'op')}"
            func()
        self.current = "final check"
        for slot in ("b", "d"):
            if self.held[slot]:
                self.op_held_end(commit=True, slot=slot)
        self.op_check()
        # Everything applied: a refresh now has nothing to do.
        for view in self.views:
            self.refresh(self.a, view)
            self.check_view(view)
        for view in self.rollups:
            self.refresh_rollup(self.a, view)
            self.check_view(view)
        # Every view has applied everything: once old enough, every record can be pruned, and
        # the views stay as they are.
        self.age_changelog(self.a)
        self.prune(self.a)
        for view in self.views:
            self.refresh(self.a, view)
            self.check_view(view)
        left = self.a.execute(f"SELECT count(*) FROM {self.changelog()}").fetchone()[0]
        if left:
            raise Mismatch(f"{left} changelog records left after every view applied everything and prune()")
        if self.pruned == 0:
            raise Mismatch("prune() never pruned anything")


def short_error(e):
    """The message of e without the Rust backtrace that pgrx appends to error details."""
    if not isinstance(e, psycopg.Error):
        return f"{type(e).__name__}: {e}"
    lines = [ln for ln in str(e).splitlines() if not re.match(r"^\s+(\d+: |at )", ln)]
    return f"{type(e).__name__}: " + "\n".join(lines[:8])


@pytest.mark.parametrize("seed", SEEDS)
def test_random_workload_matches_from_scratch(new_db, seed):
    conninfo = new_db(f"_s{seed}")
    w = Workload(conninfo, seed)
    started = time.time()
    try:
        w.run(N_OPS)
    except Exception as e:
        tail = "\n".join(f"    {m}" for m in w.log[-40:])
        raise AssertionError(
            f"seed {seed}, in {w.current}, after {len(w.log)} logged steps: {short_error(e)}\n"
            f"  last steps:\n{tail}\n"
            f"  raised at:\n{''.join(traceback.format_tb(e.__traceback__)[-3:])}"
        ) from None
    finally:
        w.close()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        events = conn.execute("SELECT count(*) FROM ev").fetchone()[0]
        where = conn.execute("SELECT string_agg(format('%s: %s', p, n), ', ' ORDER BY p) FROM "
                             "(SELECT tableoid::regclass::text AS p, count(*) AS n FROM ev GROUP BY 1) t").fetchone()[0]
    kind = ("registered" if w.registered else "created") + (" partitioned" if w.partitioned else "")
    print(f"seed {seed} ({kind} event table; events in {where}): {N_OPS} ops, {w.checks} checks, {w.refreshes} refreshes "
          f"({w.maintenance_refreshes} by run_maintenance), {w.prunes} prunes ({w.pruned} records, "
          f"delta_retention {w.delta_retention}, {w.agings} agings, extreme_log_limit "
          f"{w.extreme_log_limit}), {events} events at the end, "
          f"{time.time() - started:.1f}s")


# --------------------------------------------------------------------------------------------
# Deterministic sub-tests


def _refresh(conn, view):
    return conn.execute("SELECT eventview.refresh(%s)", [view]).fetchone()[0]


def test_refresh_returns_changed_event_rows(db):
    """refresh returns the number of changed event rows it consumed: each INSERT, UPDATE or
    DELETE of one event row counts once, whether or not the view keeps it; aborted work counts
    nothing; refresh_all returns the sum over views."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("SELECT eventview.create_view('v_all', 'ev')")
        a.execute("""SELECT eventview.create_view('v_de', 'ev', group_by => '{"c": "$.country"}',
                       event_types => ARRAY['purchase'], filter => '{"$.country": "DE"}')""")

        def both():
            return (_refresh(a, "v_all"), _refresh(a, "v_de"))

        def contents():
            return (
                a.execute("SELECT events FROM v_all").fetchall(),
                a.execute("SELECT c, events FROM v_de").fetchall(),
            )

        assert both() == (0, 0)
        a.execute("""INSERT INTO ev (event_type, payload) VALUES
                       ('purchase', '{"country": "DE"}'), ('purchase', '{"country": "FR"}'),
                       ('page_view', '{"country": "DE"}'), ('purchase', '{}'),
                       ('purchase', '{"country": "DE"}')""")
        assert both() == (5, 5)
        assert contents() == ([(5,)], [("DE", 2)])

        cur = a.cursor()
        with cur.copy("COPY ev (event_type, payload) FROM STDIN") as cp:
            for row in [("purchase", '{"country": "DE"}'), ("refund", "{}"), ("purchase", '{"country": "GB"}')]:
                cp.write_row(row)
        assert both() == (3, 3)
        assert contents() == ([(8,)], [("DE", 3)])

        assert a.execute("""UPDATE ev SET payload = '{"country": "FR"}'
                            WHERE event_id IN (SELECT min(event_id) FROM ev UNION SELECT max(event_id) FROM ev)""").rowcount == 2
        assert both() == (2, 2)
        assert contents() == ([(8,)], [("DE", 2)])

        assert a.execute("DELETE FROM ev WHERE event_type = 'page_view'").rowcount == 1
        assert both() == (1, 1)

        a.execute("BEGIN")
        a.execute("""INSERT INTO ev (event_type, payload) VALUES ('purchase', '{"country": "DE"}'), ('x', '{}')""")
        a.execute("ROLLBACK")
        assert both() == (0, 0)

        a.execute("BEGIN")
        a.execute("""INSERT INTO ev (event_type, payload) VALUES ('purchase', '{"country": "DE"}'), ('x', '{}')""")
        a.execute("SAVEPOINT s")
        a.execute("INSERT INTO ev (event_type, payload) SELECT 'purchase', '{\"country\": \"DE\"}' FROM generate_series(1, 4)")
        a.execute("ROLLBACK TO SAVEPOINT s")
        a.execute("UPDATE ev SET producer = 'fix' WHERE event_id = (SELECT min(event_id) FROM ev)")
        a.execute("COMMIT")
        assert both() == (3, 3)
        assert contents() == ([(9,)], [("DE", 3)])

        # One row inserted, updated and deleted by three statements: three changes, no trace.
        (eid,) = a.execute("""INSERT INTO ev (event_type, payload) VALUES ('purchase', '{"country": "DE"}')
                              RETURNING event_id""").fetchone()
        a.execute("UPDATE ev SET payload = '{\"country\": \"FR\"}' WHERE event_id = %s", [eid])
        a.execute("DELETE FROM ev WHERE event_id = %s", [eid])
        assert both() == (3, 3)
        assert contents() == ([(9,)], [("DE", 3)])

        assert both() == (0, 0)
        a.execute("INSERT INTO ev (event_type, payload) SELECT 'purchase', '{\"country\": \"DE\"}' FROM generate_series(1, 4)")
        assert a.execute("SELECT eventview.refresh_all()").fetchone()[0] == 8
        assert contents() == ([(13,)], [("DE", 7)])

        # TRUNCATE: every row is retracted; the views empty.
        n = a.execute("SELECT count(*) FROM ev").fetchone()[0]
        a.execute("TRUNCATE ev")
        assert a.execute("SELECT eventview.refresh_all()").fetchone()[0] == 2 * n
        assert contents() == ([], [])
        assert a.execute("SELECT eventview.refresh_all()").fetchone()[0] == 0


def test_fail_policy_aborts_the_refresh_and_applies_nothing(db):
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("""SELECT eventview.create_view('v', 'ev', group_by => '{"sku": "$.sku"}',
                       measures => '{"n": "count(*)", "q": "sum($.qty)"}', on_type_error => 'fail')""")
        a.execute("""INSERT INTO ev (event_type, payload) VALUES ('a', '{"sku": "x", "qty": 1}')""")
        assert _refresh(a, "v") == 1
        a.execute("""INSERT INTO ev (event_type, payload) VALUES ('a', '{"sku": "x", "qty": 2}'),
                       ('a', '{"sku": "y", "qty": "3"}')""")
        with pytest.raises(psycopg.Error):
            _refresh(a, "v")
        assert a.execute("SELECT sku, n, q FROM v").fetchall() == [("x", 1, Decimal(1))]
        assert a.execute("SELECT pending_changes FROM eventview.views WHERE name = 'v'::regclass").fetchone()[0] == 2
        a.execute("""DELETE FROM ev WHERE payload ->> 'sku' = 'y'""")
        assert _refresh(a, "v") == 3
        assert a.execute("SELECT sku, n, q FROM v").fetchall() == [("x", 2, Decimal(3))]


def test_writes_after_refresh_in_the_same_transaction_are_applied(db):
    """A refresh applies its own open transaction's changes so far; the changes that transaction
    makes after the refresh must still be applied: the refresh does not count them as applied."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("SELECT eventview.create_view('v', 'ev')")
        a.execute("BEGIN")
        a.execute("INSERT INTO ev (event_type, payload) VALUES ('a', '{}')")
        a.execute("SELECT eventview.refresh('v')")
        a.execute("INSERT INTO ev (event_type, payload) VALUES ('a', '{}')")
        a.execute("COMMIT")
        assert _refresh(a, "v") == 1, "the insert made after the refresh is not pending"
        assert a.execute("SELECT events FROM v").fetchall() == [(2,)]


def test_writes_after_create_view_in_the_same_transaction_are_applied(db):
    """Same for create_view: events that the creating transaction inserts afterwards (a setup
    script run with psql -1) must reach the view."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("BEGIN")
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("SELECT eventview.create_view('v', 'ev')")
        a.execute("INSERT INTO ev (event_type, payload) VALUES ('a', '{}'), ('b', '{}')")
        a.execute("COMMIT")
        assert _refresh(a, "v") == 2
        assert a.execute("SELECT events FROM v").fetchall() == [(2,)]


def test_concurrent_refreshes_of_two_views_of_one_source_do_not_deadlock(cluster, db):
    """One transaction refreshes v1 and then v2 (as refresh_all does) while another refreshes
    v2: the second waits or returns 0, never fails (no lock-order deadlock)."""
    with psycopg.connect(db, autocommit=True) as a, psycopg.connect(db, autocommit=True) as c:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("SELECT eventview.create_view('v1', 'ev')")
        a.execute("""SELECT eventview.create_view('v2', 'ev', group_by => '{"t": "event_type"}')""")
        a.execute("INSERT INTO ev (event_type, payload) VALUES ('a', '{\"x\": 1}'), ('b', '{}')")
        c_pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
        a.execute("BEGIN")
        assert _refresh(a, "v1") == 2
        out = {}

        def other():
            try:
                out["r"] = _refresh(c, "v2")
            except Exception as e:  # noqa: BLE001
                out["e"] = e

        t = threading.Thread(target=other)
        t.start()
        with cluster.connect() as mon:  # let the other refresh start and, if it must, wait
            for _ in range(100):
                row = mon.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [c_pid]).fetchone()
                if not t.is_alive() or (row and row[0] == "Lock"):
                    break
                time.sleep(0.02)
        errors = []
        try:
            mine = _refresh(a, "v2")
            a.execute("COMMIT")
        except psycopg.Error as e:
            errors.append(e)
            a.execute("ROLLBACK")
            mine = None
        t.join(60)
        if "e" in out:
            errors.append(out["e"])
        assert not errors, f"concurrent refreshes failed: {[str(e).splitlines()[0] for e in errors]}"
        assert sorted([mine, out["r"]]) == [0, 2]
        assert a.execute("SELECT t, events FROM v2 ORDER BY t").fetchall() == [("a", 1), ("b", 1)]


# --------------------------------------------------------------------------------------------
# Edge cases in their smallest form: rich paths, numbers at the edges of their types, and a
# reader whose snapshot is older than a view's definition.


def test_rich_path_first_match_follows_jsonb_order(db):
    """The first match of a rich path is jsonb_path_query_first's: jsonb keeps object keys
    shorter-first, so "item" comes before "details"; a walk of the keys in alphabetical order
    (as a serde_json map keeps them) would pick details.sku."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("""SELECT eventview.create_view('v', 'ev', group_by => '{"sku": "$..sku"}')""")
        a.execute("""INSERT INTO ev (event_type, payload)
                     VALUES ('a', '{"details": {"sku": "d"}, "item": {"sku": "i"}}')""")
        _refresh(a, "v")
        expected = a.execute("SELECT jsonb_path_query_first(payload, '$.**.sku') #>> '{}' FROM ev").fetchone()[0]
        assert expected == "i"
        assert a.execute("SELECT sku FROM v").fetchall() == [(expected,)]


def test_rich_path_keeps_numbers_as_written(db):
    """A text group column holds what `payload #>> path` gives (12.50 stays 12.50), also through a
    rich path: a value taken through an f64 would lose its spelling (12.50 would become 12.5,
    1.000000000000000001 would become 1.0)."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("""SELECT eventview.create_view('v', 'ev', group_by => '{"t": "$.tags[*]"}')""")
        a.execute("""INSERT INTO ev (event_type, payload) VALUES
                     ('a', '{"tags": [12.50]}'), ('a', '{"tags": [1.000000000000000001]}')""")
        _refresh(a, "v")
        assert sorted(a.execute("SELECT t FROM v").fetchall()) == [("1.000000000000000001",), ("12.50",)]


def test_a_rich_path_view_takes_a_number_beyond_f64(db):
    """jsonb holds numbers of any size: one event with 1e400 anywhere in its payload is read by a
    view with a rich path. Read through an f64 (pgrx: "a text version of jsonb must be a valid
    json: number out of range"), it would fail every refresh of the view, whatever on_type_error
    says, and leave the view stuck."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("""SELECT eventview.create_view('v', 'ev', group_by => '{"t": "$.tags[*]"}', on_type_error => 'skip')""")
        a.execute("""INSERT INTO ev (event_type, payload) VALUES ('a', '{"tags": ["x"], "big": 1e400}')""")
        assert _refresh(a, "v") == 1
        assert a.execute("SELECT t, events FROM v").fetchall() == [("x", 1)]


def test_a_double_field_underflow_does_not_break_refresh(db):
    """A JSON number too small for a double (1e-400) in a field declared double precision: the
    conversion payload::numeric::double precision raises 'is out of range for type double
    precision', which a range check of abs() <= DBL_MAX alone does not foresee; raised in the
    refresh, it would fail every refresh of the view whatever on_type_error says (here 'skip')
    and leave the view stuck. Either a type error or 0 will do; an error of the refresh will
    not."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("SELECT eventview.define_field('ev', 'amount', '$.amount', type => 'double precision')")
        a.execute("""SELECT eventview.create_view('v', 'ev', measures => '{"n": "count(*)", "s": "sum(amount)"}',
                       on_type_error => 'skip')""")
        a.execute("""INSERT INTO ev (event_type, payload) VALUES ('a', '{"amount": 1.5}'), ('a', '{"amount": 1e-400}')""")
        assert _refresh(a, "v") == 2
        assert a.execute("SELECT n, s FROM v").fetchone() in [(1, Decimal("1.5")), (2, Decimal("1.5"))]


def test_avg_does_not_depend_on_the_scale_of_retracted_values(db):
    """avg is shown as stored sum / stored count, and numeric division takes its result scale
    from its operands. A stored sum that kept the largest scale of every value ever added, also
    after that value is retracted, would show avg of (1, 0, 0) after 1e-21 came and went with
    21 digits, 0.333333333333333333333, where avg() from scratch gives 0.33333333333333333333
    (20). The same with large magnitudes ($.qty = 10^19 and a retracted 1.5:
    200000000000000002.6 against 200000000000000003)."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("""SELECT eventview.create_view('v', 'ev', measures => '{"a": "avg($.p)"}')""")
        a.execute("""INSERT INTO ev (event_type, payload) VALUES ('a', '{"p": 1}'), ('a', '{"p": 0}'), ('a', '{"p": 0}'),
                       ('a', '{"p": 0.000000000000000000001}')""")
        _refresh(a, "v")
        a.execute("DELETE FROM ev WHERE payload ->> 'p' = '0.000000000000000000001'")
        _refresh(a, "v")
        expected = a.execute("SELECT avg((payload ->> 'p')::numeric) FROM ev").fetchone()[0]
        assert a.execute("SELECT a FROM v").fetchone()[0] == expected


def test_realtime_read_with_a_snapshot_older_than_turning_realtime(db):
    """alter_view(realtime => true) moves the min/max values in the storage rows and in the value
    log into the multiset and installs the realtime definition in one transaction. A REPEATABLE
    READ reader whose snapshot is older reads the new definition (view definitions are not
    versioned by snapshot) with the old rows, multiset and log: its read must still equal the
    aggregate as of its snapshot."""
    with psycopg.connect(db, autocommit=True) as a, psycopg.connect(db, autocommit=True) as r:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("""SELECT eventview.create_view('v', 'ev', group_by => '{"k": "$.k"}',
                       measures => '{"hi": "max($.p)", "n": "count(*)"}')""")
        vid = a.execute("SELECT view_id FROM eventview._views WHERE relid = 'v'::regclass").fetchone()[0]
        a.execute("""INSERT INTO ev (event_type, payload)
                     SELECT 'e', jsonb_build_object('k', CASE WHEN i <= 10 THEN i % 2 ELSE 2 END, 'p', i)
                     FROM generate_series(1, 20) i""")
        assert _refresh(a, "v") == 20
        # Groups 0 and 1 keep their five values in their rows; group 2 (ten values, then two
        # more) its values in the log.
        a.execute("""INSERT INTO ev (event_type, payload)
                     SELECT 'e', jsonb_build_object('k', 2, 'p', i) FROM generate_series(21, 22) i""")
        assert _refresh(a, "v") == 2
        assert a.execute(f"SELECT g1, cardinality(m1_vals) FROM eventview._v{vid}_data ORDER BY 1").fetchall() == [
            ("0", 5), ("1", 5), ("2", None)]
        assert a.execute("SELECT extremes_logged FROM eventview._views WHERE relid = 'v'::regclass").fetchone()[0] > 0
        # Pending: the maximum of every group retracted.
        a.execute("DELETE FROM ev WHERE (payload->>'p')::int IN (9, 10, 22)")
        scratch = "SELECT (payload->>'k'), max((payload->>'p')::numeric), count(*) FROM ev GROUP BY 1 ORDER BY 1"
        r.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        expected = r.execute(scratch).fetchall()
        assert expected == [("0", 8, 4), ("1", 7, 4), ("2", 21, 11)]
        a.execute("SELECT eventview.alter_view('v', realtime => true)")
        assert r.execute("SELECT k, hi, n FROM v ORDER BY 1").fetchall() == expected
        r.execute("COMMIT")
        assert r.execute("SELECT k, hi, n FROM v ORDER BY 1").fetchall() == expected


def test_min_max_values_move_from_the_row_to_the_multiset_and_stay_exact(db):
    """A small group keeps its min/max values in its storage row; past eight values, or on a
    retraction, they move to the multiset (through the value log), for good; a view turning
    realtime, or read by a new rollup, moves every group's first. At every step the view equals
    the aggregate from scratch, and each value of a group is in exactly one place: its row, its
    multiset or its log."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("""SELECT eventview.create_view('v', 'ev', group_by => '{"k": "$.k"}',
                       measures => '{"hi": "max($.p)", "lo": "min($.p)", "n": "count(*)"}',
                       time_bucket => '1 day')""")
        vid = a.execute("SELECT view_id FROM eventview._views WHERE relid = 'v'::regclass").fetchone()[0]
        scratch = """SELECT payload->>'k', max((payload->>'p')::numeric), min((payload->>'p')::numeric), count(*)
                     FROM ev GROUP BY 1 ORDER BY 1"""

        def add(k, *ps):
            a.execute("INSERT INTO ev (event_type, occurred_at, payload) SELECT 'e', '2026-12-01 10:00+00', "
                      "jsonb_build_object('k', %s::text, 'p', p) FROM unnest(%s::int[]) p", [k, list(ps)])

        def in_row(k):
            """The group's values in its row, per measure (None: outside the row)."""
            row = a.execute(f"SELECT m1_vals, m2_vals FROM eventview._v{vid}_data WHERE g1 = %s", [k]).fetchone()
            return tuple(None if vals is None else sorted(int(v) for v in vals) for vals in row)

        def exact():
            assert a.execute("SELECT k, hi, lo, n FROM v ORDER BY 1").fetchall() == a.execute(scratch).fetchall()
            for n in (1, 2):
                held = a.execute(f"""
                    SELECT g1, v, sum(c) FROM (
                        SELECT g1, v, n AS c FROM eventview._v{vid}_m{n}
                        UNION ALL SELECT g1, v, n FROM eventview._v{vid}_m{n}_log
                        UNION ALL SELECT g1, r.v, 1 FROM eventview._v{vid}_data, unnest(m{n}_vals) AS r(v)) u
                    GROUP BY 1, 2 HAVING sum(c) <> 0 ORDER BY 1, 2""").fetchall()
                events = a.execute("""SELECT payload->>'k', (payload->>'p')::numeric, count(*) FROM ev
                                      GROUP BY 1, 2 ORDER BY 1, 2""").fetchall()
                assert held == events, n

        add("a", 1, 2, 3)
        add("b", 5, 6)
        assert _refresh(a, "v") == 5
        assert in_row("a") == ([1, 2, 3], [1, 2, 3]) and in_row("b") == ([5, 6], [5, 6])
        assert a.execute(f"SELECT count(*) FROM eventview._v{vid}_m1_log").fetchone()[0] == 0
        exact()
        # Additions join the row up to eight values; the ninth moves all of them out.
        add("a", 4, 5, 6, 7, 8)
        assert _refresh(a, "v") == 5
        assert in_row("a") == ([1, 2, 3, 4, 5, 6, 7, 8],) * 2
        add("a", 9)
        assert _refresh(a, "v") == 1
        assert in_row("a") == (None, None)
        exact()
        # Out of the row for good: later values go to the log, then the multiset.
        add("a", 0)
        assert _refresh(a, "v") == 1
        assert in_row("a") == (None, None)
        exact()
        # A retraction (of the maximum) moves the group's values out too.
        a.execute("DELETE FROM ev WHERE payload->>'k' = 'b' AND payload->>'p' = '6'")
        assert _refresh(a, "v") == 1
        assert in_row("b") == (None, None)
        exact()
        # More values than a row keeps in one batch, for a new group.
        add("c", *range(20, 30))
        assert _refresh(a, "v") == 10
        assert in_row("c") == (None, None)
        exact()
        # Turning realtime moves every group's values out of the row; reads stay exact.
        add("d", 40, 41)
        assert _refresh(a, "v") == 2
        assert in_row("d") == ([40, 41], [40, 41])
        a.execute("SELECT eventview.alter_view('v', realtime => true)")
        assert in_row("d") == (None, None)
        exact()
        a.execute("DELETE FROM ev WHERE payload->>'p' = '41'")
        assert a.execute("SELECT k, hi, lo, n FROM v ORDER BY 1").fetchall() == a.execute(scratch).fetchall()
        assert _refresh(a, "v") == 1
        add("e", 50)
        assert _refresh(a, "v") == 1
        assert in_row("e") == (None, None)
        exact()
        # Stored again: new groups keep their values in the row, until a rollup reads the view.
        a.execute("SELECT eventview.alter_view('v', realtime => false)")
        add("f", 60, 61)
        assert _refresh(a, "v") == 2
        assert in_row("f") == ([60, 61], [60, 61])
        a.execute("""SELECT eventview.create_view('r', 'v', group_by => '{"k": "k"}',
                       measures => '{"hi": "hi", "lo": "lo", "n": "n"}', time_bucket => '7 days')""")
        assert in_row("f") == (None, None)
        exact()
        assert a.execute("SELECT k, hi, lo, n FROM r ORDER BY 1").fetchall() == a.execute(scratch).fetchall()
        a.execute("DELETE FROM ev WHERE payload->>'p' = '61'")
        assert _refresh(a, "v") == 1
        _refresh(a, "r")
        assert in_row("f") == (None, None)
        exact()
        assert a.execute("SELECT k, hi, lo, n FROM r ORDER BY 1").fetchall() == a.execute(scratch).fetchall()
