"""Drift does not depend on how changes were split into refreshes: the same events give the same
`eventview.drift` rows whether each is refreshed on its own or many at once (defect found in an
audit, session 8: a batch was compared with the state before it as a whole, so a path new in a
batch with two JSON types got no `type_changed`, and a path that went missing within the batch
that first brought its type and version got no `missing`)."""

import random

import psycopg

DRIFT = """SELECT event_type, event_version, path, change, old_type, new_type FROM eventview.drift
           ORDER BY 1, 2, 3, 4, 5, 6"""


def _drift_after(db, events, splits):
    """Inserts `events` ((version, payload) pairs) into a fresh table, refreshing after each
    index in `splits` and at the end; returns the drift rows."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.drop_view('v') FROM eventview.views WHERE name::text = 'v'")
        a.execute("SELECT eventview.drop_event_table('ev') FROM eventview.event_tables WHERE name::text = 'ev'")
        a.execute("DELETE FROM eventview.drift")
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("""SELECT eventview.create_view('v', 'ev', group_by => '{"x": "$.x"}', measures => '{"y": "count($.y)"}')""")
        for i, (version, payload) in enumerate(events):
            a.execute("INSERT INTO ev (event_type, event_version, payload) VALUES ('t', %s, %s::jsonb)", (version, payload))
            if i in splits:
                a.execute("SELECT eventview.refresh('v')")
        a.execute("SELECT eventview.refresh('v')")
        return a.execute(DRIFT).fetchall()


def test_a_new_path_with_two_types_in_one_batch(db):
    events = [(1, '{"x": "s"}'), (1, '{"x": 1}')]
    expected = [("t", 1, "$.x", "added", None, "string"), ("t", 1, "$.x", "type_changed", "string", "number")]
    assert _drift_after(db, events, splits={0}) == expected
    assert _drift_after(db, events, splits=set()) == expected


def test_a_path_missing_within_the_batch_that_brings_its_version(db):
    events = [(1, '{"x": "s"}'), (1, '{"y": 1}')]
    expected = [("t", 1, "$.x", "added", None, "string"), ("t", 1, "$.x", "missing", "string", None),
                ("t", 1, "$.y", "added", None, "number")]
    assert _drift_after(db, events, splits={0}) == expected
    assert _drift_after(db, events, splits=set()) == expected


def test_drift_is_the_same_however_changes_are_batched(db):
    """Random sequences over two versions and three paths ($.x and $.y read by a view), each
    path switching its JSON type at most once (a producer changing a field's type): one refresh
    per event, one for all, and random splits give the same drift."""
    rng = random.Random(8)
    kinds = {"s": '"s"', "n": "1", "b": "true", "o": '{"k": 1}'}
    for _ in range(12):
        n = rng.randint(2, 12)
        switch = {p: (rng.choice(list(kinds)), rng.choice(list(kinds)), rng.randint(0, n)) for p in "xyz"}
        events = []
        for i in range(n):
            members = []
            for p, (before, after, at) in switch.items():
                if rng.random() < 0.8:
                    members.append(f'"{p}": {kinds[before if i < at else after]}')
            events.append((rng.choice([1, 2]), "{" + ", ".join(members) + "}"))
        one_by_one = _drift_after(db, events, splits=set(range(n)))
        assert _drift_after(db, events, splits=set()) == one_by_one, events
        some = {i for i in range(n) if rng.random() < 0.3}
        assert _drift_after(db, events, splits=some) == one_by_one, (events, some)
