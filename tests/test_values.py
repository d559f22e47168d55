"""Values at the edges of their types, through a view's refresh: each test feeds values a
conversion could round, refuse although they are valid, or fail the whole refresh on."""

import psycopg


def _one(conn, sql, params=None):
    return conn.execute(sql, params).fetchone()[0]


def test_double_precision_fields_sum_exactly_and_take_subnormal_numbers(db):
    """sum/avg of a field declared double precision add the values exactly, none rounded to 15
    significant digits (as PostgreSQL 15's float8 -> numeric rounds); numbers below DBL_MIN but
    representable (subnormal) are values, not out of range. A number that rounds to zero is out
    of range: quarantined."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("SELECT eventview.define_field('ev', 'p', '$.p', type => 'double precision')")
        a.execute("""SELECT eventview.create_view('v', 'ev',
                       measures => '{"n": "count(p)", "s": "sum(p)", "a": "avg(p)", "hi": "max(p)", "lo": "min(p)"}')""")
        a.execute("""INSERT INTO ev (event_type, payload) VALUES
                       ('t', '{"p": 0.30000000000000004}'), ('t', '{"p": 1.2345678901234567}'),
                       ('t', '{"p": 1e-310}'), ('t', '{"p": 2e-324}')""")
        assert _one(a, "SELECT eventview.refresh('v')") == 4
        n, s, avg, hi, lo = a.execute("SELECT n, s, a, hi, lo FROM v").fetchone()
        assert n == 3
        exact = "SELECT {}(x) FROM (VALUES (0.30000000000000004), (1.2345678901234567), (1e-310)) v(x)"
        assert s == _one(a, exact.format("sum"))
        assert str(s).startswith("1.5345678901234567")
        assert avg == _one(a, exact.format("avg"))
        assert (hi, lo) == (1.2345678901234567, 1e-310)
        assert a.execute("SELECT (event->'payload'->>'p')::numeric = 2e-324, reason FROM eventview.quarantine").fetchall() == [
            (True, 'measure "n": count(p): field "p" is declared double precision and cannot take an out-of-range number')
        ]


def test_a_leap_second_with_a_fraction_is_a_type_error_not_a_stuck_view(db):
    """PostgreSQL takes 23:59:60 (the next minute) but no fraction of it: the RFC 3339 check makes
    23:59:60.5 a type error of its event, so that no cast of it fails every refresh of the view
    (and every read of a realtime one), whatever its type policy."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("SELECT eventview.define_field('ev', 'at', '$.at', type => 'timestamptz')")
        a.execute("""SELECT eventview.create_view('v', 'ev', measures => '{"n": "count(*)", "last": "max(at)"}', realtime => true)""")
        a.execute("""INSERT INTO ev (event_type, payload) VALUES
                       ('t', '{"at": "2026-12-31T23:59:60Z"}'), ('t', '{"at": "2026-12-31T23:59:60.5Z"}')""")
        assert _one(a, "SELECT n FROM v") == 1
        assert _one(a, "SELECT eventview.refresh('v')") == 2
        assert a.execute("SELECT n, last = '2027-01-01T00:00:00Z'::timestamptz FROM v").fetchone() == (1, True)
        assert _one(a, "SELECT count(*) FROM eventview.quarantine") == 1


def test_count_distinct_of_a_timestamptz_field_counts_instants(db):
    """One instant written with three offsets: one group under group_by, and one value under
    count_distinct too, as for occurred_at, whatever the session's TimeZone."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("SELECT eventview.define_field('ev', 'at', '$.at', type => 'timestamptz')")
        a.execute("""SELECT eventview.create_view('v', 'ev', group_by => '{"at": "at"}',
                       measures => '{"n": "count(*)", "instants": "count_distinct(at)"}')""")
        a.execute("""SELECT eventview.create_view('w', 'ev', measures => '{"instants": "count_distinct(at)"}')""")
        a.execute("""INSERT INTO ev (event_type, payload) VALUES ('t', '{"at": "2026-12-01T10:00:00Z"}'),
                       ('t', '{"at": "2026-12-01T11:00:00+01:00"}'), ('t', '{"at": "2026-12-01 05:00:00-05:00"}'),
                       ('t', '{"at": "2026-12-01T10:00:01Z"}')""")
        for tz in ["UTC", "Asia/Kolkata"]:
            a.execute(f"SET TimeZone = '{tz}'")
            a.execute("SELECT eventview.refresh('v'), eventview.refresh('w')")
            a.execute("""INSERT INTO ev (event_type, payload) VALUES ('t', '{"at": "2026-12-01T12:30:00+02:30"}')""")
        a.execute("SELECT eventview.refresh('v'), eventview.refresh('w')")
        assert a.execute("SELECT n, instants FROM v ORDER BY at").fetchall() == [(5, 1), (1, 1)]
        assert a.execute("SELECT instants FROM w").fetchall() == [(2,)]


def test_a_filter_value_that_spells_generated_sql_is_compared_as_written(db):
    """The statement takes each value's JSON type once, by rewriting `jsonb_typeof(j1)` into a
    column name; that rewrite leaves the filter's literal alone, so the filter compares `$.a`
    with the text the user gave, not with "t1"."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("""SELECT eventview.create_view('v', 'ev', group_by => '{"a": "$.a"}',
                       measures => '{"n": "count(*)"}', filter => '{"$.a": "jsonb_typeof(j1)"}')""")
        a.execute("""INSERT INTO ev (event_type, payload) VALUES
                       ('t', '{"a": "t1"}'), ('t', '{"a": "jsonb_typeof(j1)"}'), ('t', '{"a": "x"}')""")
        assert _one(a, "SELECT eventview.refresh('v')") == 3
        assert a.execute("SELECT a, n FROM v").fetchall() == [("jsonb_typeof(j1)", 1)]


def test_an_index_selects_only_array_elements(db):
    """`$.x[0]` and `$.x[-1]` select an element of an array and nothing from a scalar or an
    object (RFC 9535, as `eventview.jsonpath_first` evaluates them), in group keys, measures
    and filters, stored and realtime: jsonb's `->` with an integer would take a scalar for an
    array of one."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        for name, realtime in (("v", False), ("rt", True)):
            a.execute(f"""SELECT eventview.create_view('{name}', 'ev',
                            group_by => '{{"first": "$.x[0]", "last": "$.x[-1]"}}',
                            measures => '{{"n": "count(*)", "s": "sum($.y[0])"}}',
                            realtime => {realtime})""")
        a.execute("""SELECT eventview.create_view('f', 'ev', filter => '{"$.x[0]": "str"}',
                       measures => '{"n": "count(*)"}')""")
        payloads = ['{"x": "str", "y": 5}', '{"x": 7, "y": "s"}', '{"x": {"0": "o"}, "y": {"0": 1}}',
                    '{"x": ["a", "b"], "y": [2]}', '{"x": ["str"], "y": [3, 4]}', '{"x": [], "y": []}']
        a.execute("INSERT INTO ev (event_type, payload) SELECT 't', p::jsonb FROM unnest(%s::text[]) p",
                  [payloads])
        expected = sorted(
            a.execute("""SELECT eventview.jsonpath_first(payload, '$.x[0]') #>> '{}',
                                eventview.jsonpath_first(payload, '$.x[-1]') #>> '{}',
                                count(*), sum((eventview.jsonpath_first(payload, '$.y[0]'))::numeric)
                         FROM ev GROUP BY 1, 2""").fetchall(),
            key=repr)
        assert expected == sorted(
            [(None, None, 4, None), ("a", "b", 1, 2), ("str", "str", 1, 3)], key=repr)
        assert _one(a, "SELECT eventview.refresh('v')") == 6
        for name in ("v", "rt"):
            got = a.execute(f'SELECT first, last, n, s FROM {name}').fetchall()
            assert sorted(got, key=repr) == expected, name
        assert _one(a, "SELECT count(*) FROM eventview.quarantine") == 0
        a.execute("SELECT eventview.refresh('f')")
        assert _one(a, "SELECT n FROM f") == 1


def test_the_refresh_pass_in_rust_gives_what_the_sql_stages_give(db):
    """Two views of one definition the refresh pass in Rust covers, one refreshed through it and
    one through the SQL stages (eventview.one_pass_refresh off): the same groups, sums (scales
    included), extremes, counts and quarantine entries (reasons included), after additions,
    changes and deletions of events with every kind of key, number and type error, and keys and
    values at the size limit. The pass is seen to run: its row function is called."""
    views = ("v_pass", "v_sql")
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("SELECT eventview.define_field('ev', 'region', '$.region', version => 1)")
        a.execute("SELECT eventview.define_field('ev', 'region', '$.ship.region', version => 2)")
        a.execute("SELECT eventview.define_field('ev', 'amount', '$.amount', type => 'numeric')")
        for view in views:
            a.execute(f"""SELECT eventview.create_view('{view}', 'ev',
                group_by => '{{"sku": "$.item.sku", "region": "region"}}',
                measures => '{{"n": "count(*)", "qty": "sum($.qty)", "avg_qty": "avg($.qty)",
                              "lo": "min(amount)", "hi": "max(amount)", "priced": "count(amount)",
                              "tagged": "count($.tag)", "regions": "count(region)"}}',
                time_bucket => '1 hour', on_type_error => 'quarantine')""")
        payloads = [
            '{"item": {"sku": "A"}, "region": "EU", "qty": 2, "amount": 1.50, "tag": null}',
            '{"item": {"sku": "A"}, "region": "EU", "qty": 2.250, "amount": 1.5, "tag": [1]}',
            '{"item": {"sku": 12.50}, "ship": {"region": "US"}, "qty": -3, "amount": 100}',
            '{"item": {"sku": true}, "qty": 1e3, "amount": -0.001}',
            '{"item": {"sku": "ünï \\"q\\""}, "region": null, "qty": null}',
            '{"item": {}, "amount": 7}',
            '{"item": "A", "region": "EU"}',
            '{"item": {"sku": {"x": 1}}, "qty": 1}',
            '{"item": {"sku": "B"}, "qty": "4"}',
            '{"item": {"sku": "B"}, "amount": true}',
            '{"item": {"sku": "B"}, "region": ["EU"]}',
            '{"item": {"sku": "B"}, "ship": {"region": {"r": 1}}}',
            '{"item": {"sku": "%s"}, "amount": 1}' % ("k" * 1988),
            '{"item": {"sku": "%s"}, "amount": 1}' % ("k" * 1989),
            '{"item": {"sku": "%s"}}' % ("k" * 1996),
            '{"item": {"sku": "%s"}}' % ("k" * 1997),
        ]
        for i, p in enumerate(payloads):
            a.execute("INSERT INTO ev (event_type, event_version, occurred_at, payload) VALUES ('t', %s, %s, %s)",
                      [1 + i % 2, f"2026-01-01 {i % 3:02}:30+00", p])

        def refresh_both():
            for view, one_pass in zip(views, ("on", "off")):
                with a.transaction():
                    a.execute("SET LOCAL track_functions = 'all'")
                    a.execute(f"SET LOCAL eventview.one_pass_refresh = {one_pass}")
                    # Calls counted and not yet reported (of this transaction and earlier ones).
                    calls = ("SELECT coalesce(pg_stat_get_xact_function_calls("
                             "'eventview._group_delta_rows(bytea, integer)'::regprocedure), 0)")
                    before = _one(a, calls)
                    a.execute("SELECT eventview.refresh(%s)", [view])
                    called = _one(a, calls) - before
                    assert (called > 0) == (one_pass == "on"), (view, called)
            rows = [a.execute(f"SELECT bucket, sku, region, n, qty::text, avg_qty::text, lo::text, hi::text, "
                              f"priced, tagged, regions FROM {view} ORDER BY 1, 2, 3").fetchall() for view in views]
            assert rows[0] == rows[1]
            quarantined = [a.execute("SELECT event_id, reason FROM eventview.quarantine "
                                     "WHERE view_name = %s ORDER BY 1", [f"public.{view}"]).fetchall()
                           for view in views]
            assert quarantined[0] == quarantined[1]
            return rows[0], quarantined[0]

        rows, quarantined = refresh_both()
        assert len(quarantined) == 7 and len(rows) == 9, (rows, quarantined)
        assert ("12.50" in [r[1] for r in rows]) and ("true" in [r[1] for r in rows])
        # Changes and deletions retract what the views hold, corrections leave the quarantine.
        a.execute("""UPDATE ev SET payload = jsonb_set(payload, '{qty}', '5.0') WHERE event_id IN (1, 3, 9)""")
        a.execute("DELETE FROM ev WHERE event_id IN (2, 8)")
        a.execute("""INSERT INTO ev (event_type, event_version, occurred_at, payload)
                     VALUES ('t', 1, '2026-01-01 00:10+00', '{"item": {"sku": "A"}, "region": "EU", "amount": 0.50}')""")
        rows, quarantined = refresh_both()
        assert len(quarantined) == 5, quarantined


def test_a_refresh_reads_its_batch_of_inserts_once_when_the_field_observer_reads_it(db):
    """Committed inserts into a table with a view the refresh pass in Rust covers: the table's
    field observer runs the view's pass over the rows it reads, and the view's apply takes that
    result (a DEBUG1 message says so) when the view's batch is the observer's: not when another
    view of the table was refreshed since (the observer has read those events already), nor for
    a batch with an update or a delete. Batch after batch, the view equals the same view
    refreshed through the SQL stages, quarantine entries included."""
    views = ("v_pass", "v_sql")
    with psycopg.connect(db, autocommit=True) as a, psycopg.connect(db, autocommit=True) as b:
        messages = []
        a.add_notice_handler(lambda d: messages.append(d.message_primary))
        a.execute("SET client_min_messages = debug1")
        b.execute("SET eventview.one_pass_refresh = off")
        a.execute("SELECT eventview.create_event_table('ev')")
        taken = "the refresh of view public.v_pass takes the pass the field observer ran over its batch"

        def insert(i):
            for k in range(3):
                qty = '"x"' if (i, k) == (2, 1) else str(i + k)
                a.execute("INSERT INTO ev (event_type, occurred_at, payload) VALUES ('t', %s, %s)",
                          [f"2026-01-01 {(i + k) % 4:02}:15+00", f'{{"sku": "s{k}", "qty": {qty}, "p": {i * k}}}'])

        insert(9)
        for view in views:
            a.execute(f"""SELECT eventview.create_view('{view}', 'ev', group_by => '{{"sku": "$.sku"}}',
                measures => '{{"n": "count(*)", "qty": "sum($.qty)", "hi": "max($.p)"}}',
                time_bucket => '1 hour')""")

        def refresh(first):
            messages.clear()
            order = views if first == "v_pass" else tuple(reversed(views))
            for view in order:
                (a if view == "v_pass" else b).execute("SELECT eventview.refresh(%s)", [view])
            rows = [a.execute(f"SELECT bucket, sku, n, qty::text, hi::text FROM {view} ORDER BY 1, 2").fetchall()
                    for view in views]
            assert rows[0] == rows[1]
            quarantined = [a.execute("SELECT event_id, reason FROM eventview.quarantine WHERE view_name = %s ORDER BY 1",
                                     [f"public.{view}"]).fetchall() for view in views]
            assert quarantined[0] == quarantined[1]
            return any(taken in m for m in messages)

        shared = []
        for i in range(6):
            insert(i)
            if i == 4:
                a.execute("UPDATE ev SET payload = payload || '{\"p\": 99}' WHERE event_id = 2")
            if i == 5:
                a.execute("DELETE FROM ev WHERE event_id = 3")
            shared.append(refresh("v_sql" if i == 3 else "v_pass"))
        # The observer's first batch also holds the events the views were made over: not the
        # view's. Batch 3: v_sql's refresh ran the observer first. Batches 4 and 5
        # hold an update or a delete.
        assert shared == [False, True, True, False, False, False], shared
        assert _one(a, "SELECT count(*) FROM eventview.quarantine WHERE view_name = 'public.v_pass'") == 1
        insert(6)
        assert refresh("v_pass")
        # run_maintenance refreshes a due view the same way.
        a.execute("SELECT eventview.schedule('v_pass', '1 hour')")
        a.execute("UPDATE eventview._views SET last_refresh_at = NULL WHERE relid = 'v_pass'::regclass")
        insert(7)
        messages.clear()
        a.execute("SELECT eventview.run_maintenance()")
        assert any(taken in m for m in messages), messages
        b.execute("SELECT eventview.refresh('v_sql')")
        rows = [a.execute(f"SELECT bucket, sku, n, qty::text, hi::text FROM {view} ORDER BY 1, 2").fetchall()
                for view in views]
        assert rows[0] == rows[1]


def test_the_rows_of_the_refresh_pass_are_read_in_the_statement_that_made_them(db):
    """eventview._group_delta_rows reads a result of the pass by its token during the statement
    that made it, into columns of the types its cells have; any other token (a made-up one, or
    one of a statement that ended) finds nothing and says so."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("""INSERT INTO ev (event_type, payload) VALUES ('t', '{"k": "a"}'), ('t', '{"k": "b"}')""")
        plan = ('{"bucketed":false,"references":[[{"event_type":null,"version":null,"members":["k"]}]],'
                '"keys":[0],"measures":["CountStar"],"in_row":[]}')
        deltas = ("SELECT eventview._group_deltas(%s, NULL, 1, event_id, event_type, event_version, producer, "
                  "occurred_at, payload) FROM ev")
        rows = a.execute(f"SELECT g1, __count FROM eventview._group_delta_rows(({deltas}), 0) "
                         "AS t(__k boolean, g1 text, g1_null boolean, __count bigint, __dirty boolean) ORDER BY 1",
                         [plan]).fetchall()
        assert rows == [("a", 1), ("b", 1)]
        # Its columns are checked against what each part holds: a key read as jsonb is refused.
        try:
            a.execute(f"SELECT * FROM eventview._group_delta_rows(({deltas}), 0) "
                      "AS t(__k boolean, g1 jsonb, g1_null boolean, __count bigint, __dirty boolean)", [plan])
            raise AssertionError("a text was read as jsonb")
        except psycopg.errors.DatatypeMismatch as e:
            assert "column 2 of eventview._group_delta_rows is of type" in str(e)
        token = _one(a, deltas, [plan])
        for stale in (token, b"\x00" * 16, b"short"):
            try:
                a.execute("SELECT * FROM eventview._group_delta_rows(%s, 0) AS t(__k boolean)", [stale])
                raise AssertionError("a token outside its statement was read")
            except psycopg.errors.ObjectNotInPrerequisiteState as e:
                assert "no result of eventview._group_deltas has this token" in str(e)
