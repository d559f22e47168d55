"""Reads of a view by its group columns and bucket: the rows they return (NULL keys, empty strings
and keys that look like NULL included) and the index that serves them, stored and realtime."""

import json

import psycopg
import pytest

# Group keys a read must tell apart: a JSON null and a missing path are both SQL NULL; the empty
# string is the placeholder NULL keys are stored under; the rest only look like NULL.
SKUS = [None, "MISSING", "", "null", "NULL", "<NULL>", " ", "a"]
REGIONS = [None, 0, -1, 7]


def _payload(sku, region, i):
    payload = {"qty": i % 5, "price": i % 13}
    if sku != "MISSING":
        payload["sku"] = sku
    payload["region"] = region
    return json.dumps(payload)


def _fill(conn, events, start=0):
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO ev (event_type, occurred_at, payload) VALUES ('t', %s, %s)",
            [
                (f"2026-01-01T{(i % 6):02d}:30:00Z", _payload(SKUS[i % len(SKUS)], REGIONS[(i // 3) % len(REGIONS)], i))
                for i in range(start, start + events)
            ],
        )


def _rows(conn, where="true", params=None, plan="any"):
    """The view's rows matching `where`, read with the planner forced to a sequential scan
    ("seq"), kept off it ("index"), or left alone ("any")."""
    with conn.transaction():
        if plan == "seq":
            conn.execute("SET LOCAL enable_indexscan = off")
            conn.execute("SET LOCAL enable_bitmapscan = off")
        elif plan == "index":
            conn.execute("SET LOCAL enable_seqscan = off")
        return sorted(
            conn.execute(f"SELECT bucket, sku, region, n, q, hi FROM v WHERE {where}", params).fetchall(),
            key=repr,
        )


def _check_reads_by_key(conn):
    everything = _rows(conn)
    assert everything, "the view must hold rows"
    for sku in {row[1] for row in everything}:
        expected = sorted((r for r in everything if r[1] == sku), key=repr)
        where, params = ("sku IS NULL", None) if sku is None else ("sku = %s", (sku,))
        for plan in ("seq", "index"):
            assert _rows(conn, where, params, plan) == expected, (sku, plan)
        for region in {row[2] for row in expected}:
            exact = [r for r in expected if r[2] == region]
            rwhere = "region IS NULL" if region is None else "region = %s"
            rparams = (params or ()) + (() if region is None else (region,))
            for plan in ("seq", "index"):
                assert _rows(conn, f"{where} AND {rwhere}", rparams, plan) == exact, (sku, region, plan)
    # NULL keys are apart from the empty string and from every key that looks like NULL.
    assert _rows(conn, "sku = ''", plan="index") == sorted((r for r in everything if r[1] == ""), key=repr)
    assert all(r[1] is None for r in _rows(conn, "sku IS NULL", plan="index"))
    lo, hi = "2026-01-01T01:00:00Z", "2026-01-01T03:00:00Z"
    in_range = sorted((r for r in everything if lo <= r[0].isoformat().replace("+00:00", "Z") < hi), key=repr)
    for plan in ("seq", "index"):
        assert _rows(conn, "bucket >= %s AND bucket < %s", (lo, hi), plan) == in_range


def _create(conn, realtime):
    conn.execute("SELECT eventview.create_event_table('ev')")
    conn.execute("SELECT eventview.define_field('ev', 'region', '$.region', type => 'bigint')")
    conn.execute(
        """SELECT eventview.create_view('v', 'ev', group_by => '{"sku": "$.sku", "region": "region"}',
               measures => '{"n": "count(*)", "q": "sum($.qty)", "hi": "max($.price)"}',
               time_bucket => '1 hour', realtime => %s)""",
        (realtime,),
    )


@pytest.mark.parametrize("realtime", [False, True], ids=["stored", "realtime"])
def test_a_read_by_group_key_returns_the_rows_of_that_key_for_null_empty_and_null_looking_keys(db, realtime):
    """Filters on the group columns (`= key`, `IS NULL`) and on a range of buckets return the same
    rows through the read index as through a sequential scan, and the same rows as the whole view
    filtered by the client: a NULL key matches `IS NULL` only, the empty string and 'null' match
    themselves. A realtime view is read with changes pending (new groups, existing groups,
    retractions) and after they are applied."""
    with psycopg.connect(db, autocommit=True) as a:
        _create(a, realtime)
        _fill(a, 400)
        a.execute("SELECT eventview.refresh('v')")
        _check_reads_by_key(a)
        if realtime:
            _fill(a, 100, start=400)
            a.execute("DELETE FROM ev WHERE event_id % 7 = 0")
            a.execute("UPDATE ev SET payload = payload || '{\"sku\": null}' WHERE event_id % 11 = 0")
            assert a.execute("SELECT pending_changes FROM eventview.views WHERE name = 'v'::regclass").fetchone()[0] > 0
            _check_reads_by_key(a)
            a.execute("SELECT eventview.refresh('v')")
            _check_reads_by_key(a)


def _plan(conn, sql, params=None):
    plan = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()[0]
    return json.dumps(plan)


@pytest.mark.parametrize("realtime", [False, True], ids=["stored", "realtime"])
def test_reads_by_group_key_and_bucket_range_are_index_scans(db, realtime):
    """With the planner left alone, on a view of 20k groups: equality on the group columns (with
    or without a bucket range, and `IS NULL`) scans the read index; a bucket range alone scans
    the key index. A realtime view with nothing pending reads its storage the same way."""
    with psycopg.connect(db, autocommit=True) as a:
        _create(a, realtime)
        a.execute(
            """INSERT INTO ev (event_type, occurred_at, payload)
               SELECT 't', timestamptz '2026-01-01' + (i % 500) * interval '1 hour',
                      jsonb_build_object('sku', 's' || (i / 500), 'region', i % 3, 'qty', 1, 'price', i)
               FROM generate_series(1, 20000) i"""
        )
        a.execute("SELECT eventview.refresh('v')")
        view_id = a.execute("SELECT view_id FROM eventview._views").fetchone()[0]
        a.execute(f"ANALYZE eventview._v{view_id}_data")
        read_index, key_index = f"_v{view_id}_data_read", f"_v{view_id}_data_key"
        reads = [
            ("SELECT * FROM v WHERE sku = 's7' AND region = 1 AND bucket = '2026-01-02 03:00+00'", read_index),
            ("SELECT * FROM v WHERE sku = 's7' AND region = 1 AND bucket >= '2026-01-02' AND bucket < '2026-01-03'", read_index),
            ("SELECT * FROM v WHERE sku = 's7'", read_index),
            ("SELECT * FROM v WHERE sku IS NULL", read_index),
            ("SELECT * FROM v WHERE bucket >= '2026-01-02' AND bucket < '2026-01-02 06:00'", key_index),
        ]
        for sql, index in reads:
            plan = _plan(a, sql)
            assert f'"Index Name": "{index}"' in plan, (sql, plan)


def test_a_view_without_its_read_index_gets_it_and_its_read_form_at_its_next_refresh(db):
    """Storage made by a version without the read index (or restored from a dump of one): the next
    refresh creates the index and reinstalls the user relation in the form the index serves;
    grants on the relation and views over it stay."""
    with psycopg.connect(db, autocommit=True) as a:
        _create(a, False)
        _fill(a, 50)
        a.execute("SELECT eventview.refresh('v')")
        view_id = a.execute("SELECT view_id FROM eventview._views").fetchone()[0]
        before = _rows(a)
        a.execute("CREATE VIEW over_v AS SELECT sku, n FROM v")
        a.execute("GRANT SELECT ON v TO PUBLIC")
        a.execute(f"DROP INDEX eventview._v{view_id}_data_read")
        definition = a.execute("SELECT pg_get_viewdef('v'::regclass)").fetchone()[0]
        a.execute("CREATE OR REPLACE VIEW v AS " + definition.replace("WHERE _v", "WHERE NOT _v").rstrip(";"))
        assert a.execute("SELECT count(*) FROM v").fetchone()[0] == 0
        a.execute("SELECT eventview.refresh('v')")
        assert a.execute("SELECT to_regclass(%s) IS NOT NULL", (f"eventview._v{view_id}_data_read",)).fetchone()[0]
        assert _rows(a) == before
        assert a.execute("SELECT count(*) FROM over_v").fetchone()[0] == len(before)
        assert a.execute("SELECT relacl::text LIKE '%=r/%' FROM pg_class WHERE oid = 'v'::regclass").fetchone()[0]
