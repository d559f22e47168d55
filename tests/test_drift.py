"""Drift does not depend on how changes were split into refreshes: the same events give the same
`eventview.drift` rows whether each is refreshed on its own or many at once. A batch is not
compared with the state before it as a whole (which would give no `type_changed` to a path new
in a batch with two JSON types, and no `missing` to a path that goes missing within the batch
that first brings its type and version). The type a path had last is that of its latest
observation, not the one with the latest last_seen: every observation in one transaction shares
that timestamp."""

import random

import psycopg

DRIFT = """SELECT event_type, event_version, path, change, old_type, new_type FROM eventview.drift
           ORDER BY 1, 2, 3, 4, 5, 6"""


def _drift_after(db, events, splits, one_transaction=False):
    """Inserts `events` ((version, payload) pairs) into a fresh table, refreshing after each
    index in `splits` and at the end (with `one_transaction`, all in one transaction); returns
    the drift rows."""
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("SELECT eventview.drop_view('v') FROM eventview.views WHERE name::text = 'v'")
        a.execute("SELECT eventview.drop_event_table('ev') FROM eventview.event_tables WHERE name::text = 'ev'")
        a.execute("DELETE FROM eventview.drift")
        a.execute("SELECT eventview.create_event_table('ev')")
        a.execute("""SELECT eventview.create_view('v', 'ev', group_by => '{"x": "$.path_x"}', measures => '{"y": "count($.path_y)"}')""")
        if one_transaction:
            a.execute("BEGIN")
        for i, (version, payload) in enumerate(events):
            a.execute("INSERT INTO ev (event_type, event_version, payload) VALUES ('t', %s, %s::jsonb)", (version, payload))
            if i in splits:
                a.execute("SELECT eventview.refresh('v')")
        a.execute("SELECT eventview.refresh('v')")
        if one_transaction:
            a.execute("COMMIT")
        return a.execute(DRIFT).fetchall()


def test_a_new_path_with_two_types_in_one_batch(db):
    events = [(1, '{"path_x": "s"}'), (1, '{"path_x": 1}')]
    expected = [("t", 1, "$.path_x", "added", None, "string"), ("t", 1, "$.path_x", "type_changed", "string", "number")]
    assert _drift_after(db, events, splits={0}) == expected
    assert _drift_after(db, events, splits=set()) == expected


def test_a_path_missing_within_the_batch_that_brings_its_version(db):
    events = [(1, '{"path_x": "s"}'), (1, '{"path_y": 1}')]
    expected = [("t", 1, "$.path_x", "added", None, "string"), ("t", 1, "$.path_x", "missing", "string", None),
                ("t", 1, "$.path_y", "added", None, "number")]
    assert _drift_after(db, events, splits={0}) == expected
    assert _drift_after(db, events, splits=set()) == expected


def test_drift_is_the_same_however_changes_are_batched(db):
    """Random sequences over two versions and three paths ($.path_x and $.path_y read by a
    view), each path's JSON type changing now and then, back and forth (a producer changing a
    field's type, and back): one refresh per event, one for all, random splits, and random
    splits in one transaction give the same drift."""
    rng = random.Random(8)
    kinds = {"s": '"s"', "n": "1", "b": "true", "o": '{"k": 1}'}
    for _ in range(20):
        n = rng.randint(2, 12)
        current = {p: rng.choice(list(kinds)) for p in ("path_x", "path_y", "path_z")}
        events = []
        for i in range(n):
            members = []
            for p in current:
                if rng.random() < 0.25:
                    current[p] = rng.choice(list(kinds))
                if rng.random() < 0.8:
                    members.append(f'"{p}": {kinds[current[p]]}')
            events.append((rng.choice([1, 2]), "{" + ", ".join(members) + "}"))
        one_by_one = _drift_after(db, events, splits=set(range(n)))
        assert _drift_after(db, events, splits=set()) == one_by_one, events
        some = {i for i in range(n) if rng.random() < 0.3}
        assert _drift_after(db, events, splits=some) == one_by_one, (events, some)
        assert _drift_after(db, events, splits=some, one_transaction=True) == one_by_one, (events, some)
