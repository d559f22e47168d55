"""Privileges, with non-superuser roles:
- the API runs with the caller's rights: creating a view needs SELECT on its event table; only
  (members of) a view's owner refresh, rebuild, alter, schedule or drop it; only the table's
  owner drops it, declares its fields or prunes it (42501 otherwise);
- refreshes run as the view's owner, also from run_maintenance (the worker and pg_cron);
- changelogs and view storage are not readable or writable by other roles, the catalog not
  writable; producers need nothing but their privileges on the event table;
- quarantined events are visible only to the owners of their event table or view;
- every SECURITY DEFINER function pins search_path; the capture can't be switched off by a
  producer.
Roles are cluster-wide: the test creates its own, uniquely named, and drops them at the end."""

import re

import psycopg
import pytest

ROLES = ["alice", "bob", "pat", "rita", "mallory"]


def role(name):
    return f"pgev_{name}"


@pytest.fixture
def roles(cluster, db):
    dbname = db.rsplit("dbname=", 1)[1]
    with cluster.connect(dbname) as c:
        for r in ROLES:
            c.execute(f"DROP ROLE IF EXISTS {role(r)}")
            c.execute(f"CREATE ROLE {role(r)}")
        c.execute(f"GRANT CREATE ON SCHEMA public TO {role('alice')}, {role('bob')}")
    yield dbname
    with cluster.connect(dbname) as c:
        for r in ROLES:
            c.execute(f"DROP OWNED BY {role(r)} CASCADE")
    cluster.drop_database(db)
    with cluster.connect() as c:
        for r in ROLES:
            c.execute(f"DROP ROLE IF EXISTS {role(r)}")


class As:
    """A connection acting as one role (SET ROLE from the test superuser)."""

    def __init__(self, cluster, dbname, name):
        self.conn = cluster.connect(dbname)
        self.conn.execute("SET TimeZone = 'UTC'")
        if name != "postgres":
            self.conn.execute(f"SET ROLE {role(name)}")

    def q(self, sql, params=None):
        cur = self.conn.execute(sql, params)
        return cur.fetchall() if cur.description else cur.rowcount

    def one(self, sql, params=None):
        return self.q(sql, params)[0][0]

    def denied(self, sql, params=None):
        """Runs sql, which must fail with insufficient_privilege; returns the message."""
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
            self.conn.execute(sql, params)
        return e.value.diag.message_primary


def test_roles_get_exactly_their_rights(cluster, roles):
    admin = As(cluster, roles, "postgres")
    alice, bob, pat, rita, mallory = (As(cluster, roles, r) for r in ROLES)

    # The table owner creates the event table and hands out rights.
    assert alice.one("SELECT eventview.create_event_table('ev')::text") == "ev"
    assert alice.one("SELECT tableowner FROM pg_tables WHERE tablename = 'ev'") == role("alice")
    source_id = alice.one("SELECT source_id FROM eventview._sources WHERE relid = 'ev'::regclass")
    log = f"eventview._changes_{source_id}"
    alice.q(f"GRANT INSERT ON ev TO {role('pat')}")
    # The gate's duplicate check (ON CONFLICT on event_key) reads the key column.
    alice.q(f"GRANT SELECT (event_key) ON ev TO {role('pat')}")
    alice.q(f"GRANT SELECT ON ev TO {role('bob')}")
    alice.q("SELECT eventview.define_field('ev', 'sku', '$.sku')")
    alice.q("INSERT INTO ev (event_type, payload) VALUES ('cart', '{\"sku\": \"A\", \"qty\": 1}')")

    # Creating a view needs SELECT on the source.
    msg = mallory.denied("SELECT eventview.create_view('mv', 'ev')")
    assert msg == "permission denied for table public.ev: creating a view over it needs SELECT on it"
    bob.q("""SELECT eventview.create_view('bv', 'ev', group_by => '{"sku": "sku"}',
             measures => '{"n": "count(*)", "qty": "sum($.qty)", "hi": "max($.qty)"}')""")
    bob.q("""SELECT eventview.create_view('brt', 'ev', group_by => '{"sku": "sku"}',
             measures => '{"n": "count(*)", "qty": "sum($.qty)"}', realtime => true)""")
    assert bob.one("SELECT viewowner FROM pg_views WHERE viewname = 'bv'") == role("bob")
    view_id = bob.one("SELECT view_id FROM eventview._views WHERE relid = 'bv'::regclass")
    storage = f"eventview._v{view_id}_data"
    assert admin.one(f"SELECT tableowner FROM pg_tables WHERE schemaname || '.' || tablename = '{storage}'") == role("bob")

    # Producers need nothing but INSERT on the table: INSERT and COPY are captured.
    pat.q("INSERT INTO ev (event_type, payload) VALUES ('cart', '{\"sku\": \"A\", \"qty\": 2}')")
    with pat.conn.cursor().copy("COPY ev (event_type, payload) FROM STDIN") as cp:
        cp.write_row(("cart", '{"sku": "B", "qty": 5}'))
    assert bob.one("SELECT eventview.refresh('bv')") == 2
    assert bob.q("SELECT sku, n, qty, hi FROM bv ORDER BY sku") == [("A", 2, 3, 2), ("B", 1, 5, 5)]
    # The capture writes the changelog with the table owner's right to insert into it: without
    # it a producer's INSERT fails as that owner's INSERT into the changelog would.
    admin.q(f"REVOKE INSERT ON {log} FROM {role('alice')}")
    msg = pat.denied("INSERT INTO ev (event_type, payload) VALUES ('cart', '{\"sku\": \"C\"}')")
    assert msg == f"permission denied for table _changes_{source_id}"
    admin.q(f"GRANT INSERT ON {log} TO {role('alice')}")

    # Nobody else reads or writes the changelog or the storage; the catalog is read-only.
    for who in (pat, rita, mallory):
        who.denied(f"SELECT * FROM {log}")
        who.denied(f"INSERT INTO {log} (op, event_ids) VALUES ('I', ARRAY[1])")
        who.denied(f"DELETE FROM {log}")
        who.denied(f"SELECT * FROM {storage}")
        who.denied(f"UPDATE {storage} SET __count = 0")
        who.denied("DELETE FROM eventview._views")
        who.denied("UPDATE eventview._sources SET retention = '1 day'")
        who.denied("UPDATE eventview._views SET definition = '{}'")
        # Columns a view's own refresh records: only the owner's rows (row-level security).
        assert who.q("UPDATE eventview._views SET applied_snapshot = pg_current_snapshot()") == 0
    bob.denied(f"DELETE FROM {log}")

    # Only the owner's role refreshes, rebuilds, alters, schedules or drops a view.
    for sql in ["SELECT eventview.refresh('bv')", "SELECT eventview.rebuild('bv')",
                "SELECT eventview.alter_view('bv', on_type_error => 'skip')",
                "SELECT eventview.schedule('bv', '1 minute')", "SELECT eventview.drop_view('bv')"]:
        msg = mallory.denied(sql)
        assert re.search(r"view (public\.)?bv: it belongs to role pgev_bob", msg), msg
    # ... only the table's owner drops it, declares its fields, prunes it.
    for sql in ["SELECT eventview.drop_event_table('ev', cascade => true)",
                "SELECT eventview.define_field('ev', 'x', '$.x')", "SELECT eventview.prune('ev')"]:
        mallory.denied(sql)
        assert f"belongs to role {role('alice')}" in bob.denied(sql), sql
    # refresh_all and run_maintenance act on the caller's views only.
    pat.q("INSERT INTO ev (event_type, payload) VALUES ('cart', '{\"sku\": \"C\", \"qty\": 7}')")
    assert mallory.one("SELECT eventview.refresh_all()") == 0
    mallory.q("SELECT eventview.run_maintenance()")
    assert admin.one("SELECT pending_changes FROM eventview.views WHERE name = 'bv'::regclass") == 1

    # Readers of a view need SELECT on it only, realtime included.
    bob.q(f"GRANT SELECT ON bv, brt TO {role('rita')}")
    assert rita.q("SELECT sku, n FROM bv ORDER BY sku") == [("A", 2), ("B", 1)]
    assert rita.q("SELECT sku, n, qty FROM brt ORDER BY sku") == [("A", 2, 3), ("B", 1, 5), ("C", 1, 7)]
    mallory.denied("SELECT * FROM bv")

    # Quarantine: a view's rejects are seen by the view's and the table's owners only; the
    # gate's rejects by the table's owner (a producer may file them, not read them).
    pat.q("INSERT INTO ev (event_type, payload) VALUES ('cart', '{\"sku\": \"A\", \"qty\": \"two\"}')")
    assert pat.q("SELECT * FROM eventview.ingest('ev', '[{\"type\": \"cart\", \"payload\": [1]}]')") == [(0, 0, 1)]
    bob.q("SELECT eventview.refresh('bv')")
    reasons = "SELECT coalesce(view_name, '(gate)') FROM eventview.quarantine ORDER BY id"
    assert bob.q(reasons) == [("public.bv",)]
    assert sorted(alice.q(reasons)) == [("(gate)",), ("public.bv",)]
    for who in (pat, rita, mallory):
        assert who.q(reasons) == []
    mallory.q("SELECT 1 FROM eventview.quarantine")  # readable table, empty for them
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        mallory.q("""INSERT INTO eventview.quarantine (source, view_name, reason, event)
                     VALUES ('ev', 'public.bv', 'forged', '{}')""")
    # Entries are taken back by the view's refresh, as its owner: nobody else may delete them
    # (the table's producer and readers included); the gate's rejects, only the table's owner.
    for who in (pat, rita, mallory):
        assert who.q("DELETE FROM eventview.quarantine") == 0
    assert bob.q("DELETE FROM eventview.quarantine WHERE view_name IS NULL") == 0
    assert sorted(alice.q(reasons)) == [("(gate)",), ("public.bv",)]
    assert alice.q("DELETE FROM eventview.quarantine") == 1  # her gate's reject, not bob's entry
    assert bob.q(reasons) == [("public.bv",)]
    # A producer without INSERT is told which table and which grant, by ingest itself.
    msg = rita.denied("SELECT * FROM eventview.ingest('ev', '[]')")
    assert msg == "permission denied to ingest into event table ev: INSERT on it is needed", msg

    # run_maintenance (the worker, pg_cron) refreshes each view as its owner: once bob may no
    # longer read the table, his view's refresh fails, even when a superuser runs maintenance.
    bob.q("SELECT eventview.schedule('bv', '1 second')")
    alice.q(f"REVOKE SELECT ON ev FROM {role('bob')}")
    pat.q("INSERT INTO ev (event_type, payload) VALUES ('cart', '{\"sku\": \"D\", \"qty\": 1}')")
    admin.q("UPDATE eventview._views SET last_refresh_at = now() - interval '1 hour' WHERE relid = 'bv'::regclass")
    admin.q("SELECT eventview.run_maintenance()")
    err = admin.one("SELECT last_error FROM eventview.views WHERE name = 'bv'::regclass")
    assert err is not None and "permission denied for table public.ev: view public.bv belongs to role pgev_bob" in err, err
    bob.denied("SELECT eventview.refresh('bv')")
    # refresh_all run by a superuser: his view fails on its own, with the error in last_error,
    # and the others are refreshed.
    admin.q("UPDATE eventview._views SET last_error = NULL WHERE relid = 'bv'::regclass")
    admin.q("SELECT eventview.refresh_all()")
    err = admin.one("SELECT last_error FROM eventview.views WHERE name = 'bv'::regclass")
    assert err is not None and "permission denied for table public.ev: view public.bv belongs to role pgev_bob" in err, err
    left = admin.q("SELECT name::text, last_error FROM eventview.views WHERE pending_changes > 0 ORDER BY 1")
    assert [name for name, _ in left] == ["brt", "bv"], left  # bob's two views, nothing else
    assert all(f"belongs to role {role('bob')}" in error for _, error in left), left
    alice.q(f"GRANT SELECT ON ev TO {role('bob')}")
    assert bob.one("SELECT eventview.refresh('bv')") >= 1

    # A producer can't switch capture off: with eventview.pruning on, only rows past the
    # table's retention go unlogged (prune's own deletes); this one is recent and is retracted.
    alice.q(f"GRANT SELECT, DELETE ON ev TO {role('pat')}")
    pat.q("SET eventview.pruning = on")
    assert pat.q("DELETE FROM ev WHERE payload->>'sku' = 'B'") == 1
    assert bob.one("SELECT eventview.refresh('bv')") == 1
    assert bob.q("SELECT sku FROM bv ORDER BY sku") == [("A",), ("C",), ("D",)]

    # Every SECURITY DEFINER function in the extension's schema written in SQL or PL/pgSQL pins
    # search_path; the native ones are the insert captures, whose statement resolves nothing
    # through it.
    assert admin.q("""SELECT p.oid::regprocedure::text FROM pg_proc p
                      WHERE p.pronamespace = 'eventview'::regnamespace AND p.prosecdef
                        AND p.prolang <> (SELECT oid FROM pg_language WHERE lanname = 'c')
                        AND NOT coalesce(p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp'], false)""") == []
    assert admin.q("""SELECT p.proname::text, p.prosrc, p.proconfig FROM pg_proc p
                      WHERE p.pronamespace = 'eventview'::regnamespace AND p.prosecdef
                        AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'c')
                      ORDER BY 1""") == [
        ("_capture_1_insert", "capture_inserted_rows", None),
    ]

    # The owners drop what is theirs; the table's owner may drop views of others by cascade.
    bob.q("SELECT eventview.drop_view('brt')")
    alice.q("SELECT eventview.drop_event_table('ev', cascade => true)")
    assert admin.one("SELECT count(*) FROM eventview._views") == 0
    for who in (admin, alice, bob, pat, rita, mallory):
        who.conn.close()


TRAP_TYPES = ["regclass", "integer", "bigint", "oid", "text", "name", "jsonb", "regrole", "xid8", "boolean"]


def test_a_callers_search_path_and_tables_give_no_rights(cluster, roles):
    """Statements that run as someone else than the caller (the extension owner's bookkeeping,
    a view owner's refresh) pin search_path: operators and functions a caller puts ahead of
    pg_catalog are never picked up with more rights. An event table altered by its owner is not
    read with more rights either."""
    admin = As(cluster, roles, "postgres")
    mallory = As(cluster, roles, "mallory")
    admin.q(f"CREATE SCHEMA evil AUTHORIZATION {role('mallory')}")
    escalate = f"ALTER ROLE {role('mallory')} SUPERUSER"
    for t in TRAP_TYPES:
        mallory.q(f"""CREATE FUNCTION evil.trap_eq(a {t}, b {t}) RETURNS boolean LANGUAGE plpgsql AS $$
                      BEGIN
                          IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) current_user) THEN
                              EXECUTE '{escalate}';
                          END IF;
                          RETURN a OPERATOR(pg_catalog.=) b;
                      END $$""")
        mallory.q(f"CREATE OPERATOR evil.= (LEFTARG = {t}, RIGHTARG = {t}, FUNCTION = evil.trap_eq)")
    for fn, args, ret in [("jsonb_typeof", "jsonb", "text"), ("now", "", "timestamptz"),
                          ("pg_current_snapshot", "", "pg_snapshot"), ("format", "text", "text")]:
        params = ", ".join(f"a{i} {a}" for i, a in enumerate(args.split(", ")) if a)
        call = ", ".join(f"a{i}" for i, a in enumerate(args.split(", ")) if a)
        mallory.q(f"""CREATE FUNCTION evil.{fn}({params}) RETURNS {ret} LANGUAGE plpgsql AS $$
                      BEGIN
                          IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) current_user) THEN
                              EXECUTE '{escalate}';
                          END IF;
                          RETURN pg_catalog.{fn}({call});
                      END $$""")
    mallory.q("SET search_path = evil, pg_catalog")

    mallory.q("SELECT eventview.create_event_table('evil.mev', retention => '1 day', delta_retention => '1 second')")
    mallory.q("""INSERT INTO evil.mev (event_type, payload)
                 SELECT 'e', jsonb_build_object('k', i % 3, 'v', i) FROM generate_series(1, 20) i""")
    mallory.q("""SELECT eventview.create_view('evil.mv', 'evil.mev', group_by => '{"k": "$.k"}',
                 measures => '{"n": "count(*)", "hi": "max($.v)", "d": "count_distinct($.v)"}')""")
    mallory.q("""SELECT eventview.create_view('evil.mrt', 'evil.mev', group_by => '{"k": "$..k"}',
                 measures => '{"n": "count(*)"}', realtime => true)""")
    mallory.q("DELETE FROM evil.mev WHERE payload->>'v' = '20'")
    mallory.q("SELECT eventview.define_field('evil.mev', 'kk', '$.k')")
    for sql in ["SELECT eventview.refresh('evil.mv')", "SELECT eventview.refresh_all()",
                "SELECT eventview.rebuild('evil.mv')", "SELECT * FROM evil.mrt",
                "SELECT eventview.alter_view('evil.mrt', realtime => false)",
                "SELECT eventview.schedule('evil.mv', '1 second')", "SELECT eventview.run_maintenance()",
                "SELECT eventview.prune('evil.mev')",
                "SELECT * FROM eventview.ingest('evil.mev', '[{\"type\": \"e\", \"payload\": {\"k\": 1}}]')",
                "SELECT * FROM eventview.views", "SELECT * FROM eventview.quarantine"]:
        mallory.q(sql)
    # What a superuser runs on her objects runs with her rights, or pinned.
    admin.q("SELECT eventview.run_maintenance()")
    admin.q("SELECT eventview.refresh_all()")
    assert admin.one(f"SELECT rolsuper FROM pg_roles WHERE rolname = '{role('mallory')}'") is False

    # The capture functions of her table are hers: her table's types and casts run as her.
    assert admin.q("""SELECT DISTINCT pg_get_userbyid(proowner)::text FROM pg_proc
                      WHERE proname ~ '^_capture_' AND pronamespace = 'eventview'::regnamespace""") == [(role("mallory"),)]
    # An envelope column changed to another type: the extension owner (the field observer) does
    # not read a table so altered.
    mallory.q("ALTER TABLE evil.mev ALTER COLUMN producer TYPE varchar(100)")
    warnings = []
    mallory.conn.add_notice_handler(lambda d: warnings.append(d.message_primary))
    mallory.q("INSERT INTO evil.mev (event_type, payload) VALUES ('e', '{\"k\": 1, \"new\": true}')")
    assert mallory.one("SELECT eventview.refresh('evil.mv')") == 1  # the view refreshes, as her
    assert warnings == ["event table evil.mev was altered: producer is character varying(100); "
                        "observed_fields and drift are not updated for it"]
    assert admin.one("SELECT count(*) FROM eventview.observed_fields WHERE path = '$.new'") == 0
    admin.q("SELECT eventview.refresh_all()")  # her altered table is not in the way of others
    for who in (admin, mallory):
        who.conn.close()


def test_a_producers_search_path_runs_nothing_as_the_tables_owner(cluster, roles):
    """The insert capture runs as the event table's owner under the producer's search_path: the
    operators a producer puts ahead of pg_catalog are never picked up by it, from the first
    insert of a connection (nothing of the table known yet) on."""
    admin = As(cluster, roles, "postgres")
    alice = As(cluster, roles, "alice")
    admin.q(f"CREATE SCHEMA trap AUTHORIZATION {role('pat')}")
    alice.q("SELECT eventview.create_event_table('guarded_ev')")
    alice.q(f"GRANT INSERT ON guarded_ev TO {role('pat')}")
    pat = As(cluster, roles, "pat")
    pat.q("GRANT USAGE ON SCHEMA trap TO PUBLIC")
    pat.q("CREATE TABLE trap.ran_as (who text)")
    pat.q("GRANT INSERT ON trap.ran_as TO PUBLIC")
    for i, t in enumerate(TRAP_TYPES + ['"char"']):
        for op, name in (("=", "eq"), ("<>", "ne")):
            pat.q(f"""CREATE FUNCTION trap.{name}_{i}(a {t}, b {t}) RETURNS boolean LANGUAGE plpgsql AS $$
                      BEGIN
                          INSERT INTO trap.ran_as VALUES (current_user);
                          RETURN a OPERATOR(pg_catalog.{op}) b;
                      END $$""")
            pat.q(f"CREATE OPERATOR trap.{op} (LEFTARG = {t}, RIGHTARG = {t}, FUNCTION = trap.{name}_{i})")
    producer = As(cluster, roles, "pat")
    producer.q("SET search_path = trap, pg_catalog")
    producer.q("INSERT INTO public.guarded_ev (event_type, payload) VALUES ('e', '{}')")
    producer.q("INSERT INTO public.guarded_ev (event_type, payload) VALUES ('e', '{}')")
    assert admin.q(f"SELECT count(*) FROM trap.ran_as WHERE who <> '{role('pat')}'") == [(0,)]
    assert alice.one("SELECT count(*) FROM guarded_ev") == 2


def test_pruning_checks_the_tables_owner_whatever_operators_the_callers_path_holds(cluster, roles):
    """prune's internal calls, callable by anyone (prune runs in its caller's rights), decide who
    may prune a table with search_path pinned: an `=` of the caller's own on their path, which
    would make the owner lookup find a table of theirs, does not pass the check."""
    alice, bob = As(cluster, roles, "alice"), As(cluster, roles, "bob")
    alice.q("SELECT eventview.create_event_table('ev')")
    alice.q("INSERT INTO ev (event_type, payload) SELECT 'e', '{}' FROM generate_series(1, 5)")
    victim = alice.one("SELECT 'ev'::regclass::oid")
    bob.q("SELECT eventview.create_event_table('bobs')")
    own = bob.one("SELECT 'bobs'::regclass::oid")
    # Any lookup of alice's table by oid finds bob's table instead.
    bob.q(f"""CREATE FUNCTION public.steer_eq(a oid, b oid) RETURNS boolean LANGUAGE sql
              SET search_path = pg_catalog AS
              $$ SELECT CASE WHEN b = {victim} THEN a = {own} ELSE a = b END $$""")
    bob.q("CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = public.steer_eq)")
    bob.q("SET search_path = public, pg_catalog")
    for call in ("eventview._lock_for_pruning_if_free(%s)",
                 "eventview._prune_events(%s, interval '-100 years', 1000)"):
        msg = bob.denied(f"SELECT {call}", [victim])
        assert msg == f"permission denied to prune event table public.ev: it belongs to role {role('alice')}"
    assert alice.one("SELECT count(*) FROM ev") == 5
    for who in (alice, bob):
        who.conn.close()


def _view_whose_storage_runs(owner, statement):
    """`owner`'s event table `bobs` and view `bv` over it, with one pending event, and a trigger
    of theirs on the view's storage that runs `statement` (PL/pgSQL) at every write of it."""
    owner.q("SELECT eventview.create_event_table('bobs')")
    owner.q("SELECT eventview.create_view('bv', 'bobs')")
    storage = "eventview._v{}_data".format(
        owner.one("SELECT view_id FROM eventview._views WHERE relid = 'bv'::regclass"))
    owner.q(f"""CREATE FUNCTION public.on_storage() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    {statement};
                    RETURN NULL;
                END $$""")
    owner.q(f"CREATE TRIGGER on_storage AFTER INSERT OR UPDATE ON {storage} "
            "FOR EACH STATEMENT EXECUTE FUNCTION public.on_storage()")
    owner.q("INSERT INTO bobs (event_type, payload) VALUES ('e', '{}')")


def test_code_a_view_owner_runs_during_a_refresh_acts_with_the_owners_rights(cluster, roles):
    """A refresh applies as the view's owner, whoever refreshes (a superuser, the worker): a
    trigger the owner put on the view's storage that calls into the library acts with the
    owner's rights, not with those of the role that refreshed."""
    admin, alice, bob = (As(cluster, roles, r) for r in ("postgres", "alice", "bob"))
    alice.q("SELECT eventview.create_event_table('ev')")
    alice.q("INSERT INTO ev (event_type, payload) SELECT 'e', '{}' FROM generate_series(1, 5)")
    _view_whose_storage_runs(bob, "PERFORM eventview._prune_events('public.ev'::regclass, interval '-100 years', 1000)")
    msg = admin.denied("SELECT eventview.refresh('bv')")
    assert msg == f"permission denied to prune event table public.ev: it belongs to role {role('alice')}"
    assert alice.one("SELECT count(*) FROM ev") == 5
    for who in (admin, alice, bob):
        who.conn.close()


def test_code_a_view_owner_runs_during_a_refresh_resolves_names_as_the_owner(cluster, roles):
    """A name that such code asks the library to resolve is resolved with the view owner's
    rights, not with those of the superuser who refreshed: a table in a schema the owner may not
    use stays out of its reach."""
    admin, bob = As(cluster, roles, "postgres"), As(cluster, roles, "bob")
    admin.q("CREATE SCHEMA hidden")
    admin.q("SELECT eventview.create_event_table('hidden.secret')")
    _view_whose_storage_runs(bob, "PERFORM eventview._event_table_sql('hidden.secret')")
    with pytest.raises((psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedTable)) as e:
        admin.q("SELECT eventview.refresh('bv')")
    assert "hidden" in str(e.value)
    for who in (admin, bob):
        who.conn.close()


def test_a_partition_drop_that_will_be_refused_locks_nothing(cluster, roles):
    """A DROP or DETACH of an event table's partition by a role PostgreSQL refuses it to fails at
    once (42501), taking no lock on the event table first: queued behind a reader, its lock would
    hold up every producer until granted."""
    admin, alice, mallory = (As(cluster, roles, r) for r in ("postgres", "alice", "mallory"))
    alice.q("SELECT eventview.create_event_table('pev', partition_interval => '1 day')")
    alice.q("INSERT INTO pev (event_type, payload) VALUES ('e', '{}')")
    partition = alice.one("""SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                             WHERE i.inhparent = 'pev'::regclass ORDER BY c.relname LIMIT 1""")
    admin.q("BEGIN")
    admin.q("SELECT count(*) FROM pev")  # a reader's ACCESS SHARE, held
    mallory.q("SET lock_timeout = '5s'")
    try:
        for ddl in (f"DROP TABLE {partition}", f"ALTER TABLE pev DETACH PARTITION {partition}"):
            mallory.denied(ddl)
    finally:
        admin.q("ROLLBACK")
    assert alice.one("SELECT count(*) FROM pev") == 1
    for who in (admin, alice, mallory):
        who.conn.close()


def test_no_role_holds_prune_or_a_views_creation_off_another_roles_table(cluster, roles):
    """create_view, rebuild and prune keep each other off a table with a row lock that only the
    extension owner can take: another role holds none of them off the table, as anyone could
    with an advisory lock of a known key."""
    admin, alice, mallory = (As(cluster, roles, r) for r in ("postgres", "alice", "mallory"))
    alice.q("SELECT eventview.create_event_table('ev')")
    source_id = alice.one("SELECT source_id FROM eventview._sources WHERE relid = 'ev'::regclass")
    assert admin.q("SELECT source_id FROM eventview._prune_guards") == [(source_id,)]
    mallory.denied("SELECT * FROM eventview._prune_guards FOR UPDATE")
    msg = mallory.denied("SELECT eventview._lock_source_for_prune(%s)", [source_id])
    assert msg == f"permission denied to prune event table public.ev: it belongs to role {role('alice')}"
    # An advisory lock of the table's source id (any role may take any advisory lock).
    mallory.q("SELECT pg_advisory_lock(1885828709, %s)", [source_id])
    mallory.q("SELECT pg_advisory_lock_shared(1885828709, %s)", [source_id])
    alice.q("SET lock_timeout = '5s'")
    alice.q("INSERT INTO ev (event_type, payload) VALUES ('e', '{}')")
    alice.q("SELECT eventview.create_view('v', 'ev')")
    assert alice.one("SELECT eventview.rebuild('v')") == 1
    assert alice.one("SELECT eventview.prune('ev')") == 0
    # A table without its row (a catalog restored from a release without them) gets one.
    admin.q("DELETE FROM eventview._prune_guards")
    assert alice.one("SELECT eventview.prune('ev')") == 0
    assert admin.q("SELECT source_id FROM eventview._prune_guards") == [(source_id,)]
    alice.q("SELECT eventview.drop_event_table('ev', cascade => true)")
    assert admin.q("SELECT source_id FROM eventview._prune_guards") == []
    for who in (admin, alice, mallory):
        who.conn.close()


def test_a_table_given_to_another_role_takes_its_capture_along(cluster, roles):
    """ALTER TABLE ... OWNER TO moves the capture functions and the changelog rights to the new
    owner; the old owner keeps only the changelog SELECT its own views need, and capture goes on."""
    admin = As(cluster, roles, "postgres")
    alice, bob, rita = (As(cluster, roles, r) for r in ("alice", "bob", "rita"))
    alice.q("SELECT eventview.create_event_table('handed')")
    source_id = alice.one("SELECT source_id FROM eventview._sources WHERE relid = 'handed'::regclass")
    log = f"eventview._changes_{source_id}"
    alice.q("""SELECT eventview.create_view('alices_view', 'handed', group_by => '{"k": "$.k"}',
               measures => '{"n": "count(*)"}')""")
    alice.q("INSERT INTO handed (event_type, payload) VALUES ('e', '{\"k\": 1}')")
    # (By a superuser: alice would need membership in rita, which would let her read the table.)
    admin.q(f"ALTER TABLE handed OWNER TO {role('rita')}")

    owners = admin.q(f"""SELECT DISTINCT pg_get_userbyid(proowner)::text FROM pg_proc
                         WHERE proname ~ '^_capture_{source_id}_' AND pronamespace = 'eventview'::regnamespace""")
    assert owners == [(role("rita"),)]
    privileges = lambda who: admin.q(f"""SELECT has_table_privilege('{role(who)}', '{log}', 'SELECT'),
                                                has_table_privilege('{role(who)}', '{log}', 'INSERT'),
                                                has_table_privilege('{role(who)}', '{log}', 'DELETE')""")[0]
    assert privileges("rita") == (True, True, True)
    # Alice no longer reads the table, nor its changelog (which holds old contents of events),
    # until she is granted SELECT on the table: then her view reads the changelog again.
    assert privileges("alice") == (False, False, False)
    rita.q("INSERT INTO handed (event_type, payload) VALUES ('e', '{\"k\": 1}')")
    rita.q(f"GRANT SELECT ON handed TO {role('alice')}")
    assert privileges("alice") == (True, False, False)
    assert alice.one("SELECT eventview.refresh('alices_view')") == 2
    assert alice.q("SELECT k, n FROM alices_view") == [("1", 2)]
    rita.q("SELECT eventview.prune('handed')")
    rita.q("SELECT eventview.define_field('handed', 'k', '$.k')")
    alice.denied("SELECT eventview.prune('handed')")

    # Given on again, from a role without views of it: nothing of the changelog stays with her.
    bob_has_nothing = privileges("bob")
    assert bob_has_nothing == (False, False, False)
    admin.q(f"ALTER TABLE handed OWNER TO {role('bob')}")
    assert privileges("rita") == (False, False, False)
    assert privileges("bob") == (True, True, True)
    bob.q("INSERT INTO handed (event_type, payload) VALUES ('e', '{\"k\": 2}')")
    assert alice.one("SELECT eventview.refresh('alices_view')") == 1
    # Revoked SELECT on the table takes the changelog's along; granted again, it comes back.
    bob.q(f"REVOKE SELECT ON handed FROM {role('alice')}")
    assert privileges("alice") == (False, False, False)
    alice.denied(f"SELECT * FROM {log}")
    bob.q(f"GRANT SELECT ON handed TO {role('alice')}")
    assert privileges("alice") == (True, False, False)
    # Rights that come with role membership fire no event trigger: run_maintenance catches up.
    bob.q(f"REVOKE SELECT ON handed FROM {role('alice')}")
    bob.q(f"GRANT SELECT ON handed TO {role('pat')}")
    admin.q(f"GRANT {role('pat')} TO {role('alice')}")  # alice reads the table as a member of pat
    assert privileges("alice") == (False, False, False)
    alice.q("SELECT eventview.run_maintenance()")
    assert privileges("alice") == (True, False, False)
    admin.q(f"REVOKE {role('pat')} FROM {role('alice')}")
    mallory = As(cluster, roles, "mallory")
    mallory.q("SELECT eventview.run_maintenance()")  # anyone's run brings every view in line
    assert privileges("alice") == (False, False, False)
    mallory.conn.close()
    for who in (admin, alice, bob, rita):
        who.conn.close()


def test_no_other_table_borrows_a_capture_function(cluster, roles):
    """A capture function writes its event table's changelog with the table owner's rights, from
    the transition table of whatever trigger fires it. Attached to another table, it would log
    that table's rows as changes of the event table: PUBLIC may not execute it (EXECUTE is
    checked when a trigger is created), producers need no EXECUTE, and a function an earlier
    library left executable is repaired by the next API call."""
    admin = As(cluster, roles, "postgres")
    alice, bob, pat = (As(cluster, roles, r) for r in ("alice", "bob", "pat"))
    alice.q("SELECT eventview.create_event_table('guarded')")
    source_id = alice.one("SELECT source_id FROM eventview._sources WHERE relid = 'guarded'::regclass")
    alice.q(f"GRANT INSERT ON guarded TO {role('pat')}")
    alice.q("""SELECT eventview.create_view('guarded_view', 'guarded', measures => '{"n": "count(*)"}')""")
    pat.q("INSERT INTO guarded (event_type, payload) VALUES ('e', '{}')")
    assert alice.one("SELECT eventview.refresh('guarded_view')") == 1

    functions = [f"eventview._capture_{source_id}_{op}()" for op in ("insert", "update", "delete", "truncate")]
    executable = lambda who: [admin.one(f"SELECT has_function_privilege('{role(who)}', '{f}', 'EXECUTE')")
                              for f in functions]
    assert executable("bob") == [False] * 4 and executable("pat") == [False] * 4
    assert executable("alice") == [True] * 4
    bob.q("""CREATE TABLE fake (event_id bigint, event_type text, event_version int, producer text,
                                occurred_at timestamptz, payload jsonb)""")
    attach = {
        "insert": "AFTER INSERT ON fake REFERENCING NEW TABLE AS new_rows",
        "update": "AFTER UPDATE ON fake REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows",
        "delete": "AFTER DELETE ON fake REFERENCING OLD TABLE AS old_rows",
        "truncate": "BEFORE TRUNCATE ON fake",
    }
    for (op, when), function in zip(attach.items(), functions):
        msg = bob.denied(f"CREATE TRIGGER borrowed_{op} {when} FOR EACH STATEMENT EXECUTE FUNCTION {function}")
        assert msg == f"permission denied for function eventview._capture_{source_id}_{op}", msg

    # As an earlier library left them: executable by PUBLIC, and then borrowed.
    for f in functions:
        admin.q(f"GRANT EXECUTE ON FUNCTION {f} TO PUBLIC")
    bob.q(f"CREATE TRIGGER borrowed AFTER INSERT ON fake REFERENCING NEW TABLE AS new_rows "
          f"FOR EACH STATEMENT EXECUTE FUNCTION {functions[0]}")
    # The query of docs/reference.md (the extension's own objects) finds such a trigger, and only it.
    borrowed = admin.q("""SELECT t.tgrelid::regclass::text, t.tgname FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
                          JOIN eventview._sources s ON p.proname ~ ('^_capture_' || s.source_id || '_')
                          WHERE p.pronamespace = 'eventview'::regnamespace AND t.tgrelid <> s.relid""")
    assert borrowed == [("fake", "borrowed")], borrowed
    bob.q("DROP TRIGGER borrowed ON fake")
    # The first API call of a new session takes EXECUTE back; rolled back with its transaction,
    # the session's next call does.
    fresh = As(cluster, roles, "alice")
    fresh.q("BEGIN")
    assert fresh.one("SELECT eventview.refresh('guarded_view')") == 0
    fresh.q("ROLLBACK")
    assert executable("bob") == [True] * 4
    assert fresh.one("SELECT eventview.refresh('guarded_view')") == 0
    fresh.conn.close()
    assert executable("bob") == [False] * 4 and executable("alice") == [True] * 4
    bob.denied(f"CREATE TRIGGER borrowed AFTER INSERT ON fake REFERENCING NEW TABLE AS new_rows "
               f"FOR EACH STATEMENT EXECUTE FUNCTION {functions[0]}")

    # Producers go on without EXECUTE; only the event table's own changes reach the view.
    pat.q("INSERT INTO guarded (event_type, payload) VALUES ('e', '{}')")
    bob.q("INSERT INTO fake VALUES (1, 'e', 1, 'x', now(), '{}')")
    assert alice.one("SELECT eventview.refresh('guarded_view')") == 1
    assert alice.q("SELECT n FROM guarded_view") == [(2,)]
    for who in (admin, alice, bob, pat):
        who.conn.close()


def test_a_renamed_view_keeps_its_quarantine(cluster, roles):
    """Quarantine rows name their view; renaming the view or its schema (or moving it) renames
    them, so the view's owner still sees them and rebuild and drop_view still find them."""
    admin = As(cluster, roles, "postgres")
    alice, bob = As(cluster, roles, "alice"), As(cluster, roles, "bob")
    alice.q("SELECT eventview.create_event_table('qev')")
    alice.q(f"GRANT SELECT ON qev TO {role('bob')}")
    admin.q(f"CREATE SCHEMA bobs AUTHORIZATION {role('bob')}")
    bob.q("""SELECT eventview.create_view('bobs.q1', 'qev', group_by => '{"k": "$.k"}',
             measures => '{"s": "sum($.v)"}')""")
    alice.q("INSERT INTO qev (event_type, payload) VALUES ('e', '{\"k\": 1, \"v\": \"x\"}'), ('e', '{\"k\": 1, \"v\": 2}')")
    bob.q("SELECT eventview.refresh('bobs.q1')")
    assert bob.q("SELECT view_name FROM eventview.quarantine") == [("bobs.q1",)]
    bob.q("ALTER VIEW bobs.q1 RENAME TO q2")
    assert bob.q("SELECT view_name FROM eventview.quarantine") == [("bobs.q2",)]
    admin.q("ALTER SCHEMA bobs RENAME TO \"Bob's\"")
    assert bob.q("SELECT view_name FROM eventview.quarantine") == [('"Bob\'s".q2',)]
    bob.q("ALTER TABLE \"Bob's\".q2 SET SCHEMA public")
    assert bob.q("SELECT view_name FROM eventview.quarantine") == [("public.q2",)]
    # rebuild re-files the view's quarantine (the old rows go first), drop_view removes them.
    bob.q("SELECT eventview.rebuild('q2')")
    assert bob.one("SELECT count(*) FROM eventview.quarantine") == 1
    bob.q("SELECT eventview.drop_view('q2')")
    assert admin.one("SELECT count(*) FROM eventview.quarantine") == 0
    for who in (admin, alice, bob):
        who.conn.close()


def test_row_level_security_keeps_restricted_roles_from_views_and_the_changelog(cluster, roles):
    """A role the event table's row-level policies restrict could read what they hide through a
    view (which aggregates every row) and through the changelog (old versions of updated rows):
    such a role may neither create nor refresh a view of the table, and loses the right to read
    its changelog. The table's owner, not subject to its policies unless they are forced, may."""
    alice, bob = As(cluster, roles, "alice"), As(cluster, roles, "bob")
    alice.q("SELECT eventview.create_event_table('ev')")
    source_id = alice.one("SELECT source_id FROM eventview._sources WHERE relid = 'ev'::regclass")
    alice.q(f"GRANT SELECT ON ev TO {role('bob')}")
    alice.q("INSERT INTO ev (event_type, payload) VALUES ('t', '{\"tenant\": \"alice\", \"secret\": \"x\"}')")
    bob.q("""SELECT eventview.create_view('bv', 'ev', measures => '{"n": "count(*)"}')""")
    assert bob.one("SELECT n FROM bv") == 1
    assert bob.one(f"SELECT count(*) FROM eventview._changes_{source_id}") == 1
    alice.q("ALTER TABLE ev ENABLE ROW LEVEL SECURITY")
    alice.q("CREATE POLICY own ON ev FOR SELECT USING (payload ->> 'tenant' = current_user)")
    alice.q("UPDATE ev SET payload = payload || '{\"secret\": \"y\"}'")
    # The ALTER TABLE took bob's right to read the changelog; his view refuses to refresh.
    bob.denied(f"SELECT old_payload FROM eventview._changes_{source_id}")
    refused = (f"event table public.ev has row-level security that applies to role {role('bob')}: "
               "an incremental view aggregates every row")
    assert bob.denied("SELECT eventview.refresh('bv')") == refused
    msg = bob.denied("SELECT eventview.create_view('bv2', 'ev')")
    assert msg.startswith("event table public.ev has row-level security that applies to role")
    # row_security = off makes PostgreSQL refuse such a role's reads rather than filter them: the
    # policies still apply to bob, and his view still refuses.
    bob.q("SET row_security = off")
    assert bob.denied("SELECT eventview.refresh('bv')") == refused
    bob.q("RESET row_security")
    # A role with BYPASSRLS reads every row: its view refreshes (once run_maintenance, here its
    # step that follows role changes, gives the changelog back), and then refuses again.
    admin = As(cluster, roles, "postgres")
    admin.q(f"ALTER ROLE {role('bob')} BYPASSRLS")
    admin.q("SELECT eventview._sync_changelog_readers()")
    assert bob.one("SELECT eventview.refresh('bv')") == 1
    assert bob.one("SELECT n FROM bv") == 1
    admin.q(f"ALTER ROLE {role('bob')} NOBYPASSRLS")
    alice.q("UPDATE ev SET payload = payload || '{\"secret\": \"z\"}'")
    assert bob.denied("SELECT eventview.refresh('bv')") == refused
    # The table's owner is not subject to its policies (unless forced), and still may.
    alice.q("""SELECT eventview.create_view('av', 'ev', measures => '{"n": "count(*)"}')""")
    assert alice.one("SELECT eventview.refresh('av')") == 0
    assert alice.one("SELECT n FROM av") == 1
    alice.q("ALTER TABLE ev FORCE ROW LEVEL SECURITY")
    alice.denied("SELECT eventview.refresh('av')")
    alice.q("ALTER TABLE ev NO FORCE ROW LEVEL SECURITY")
    alice.q("ALTER TABLE ev DISABLE ROW LEVEL SECURITY")
    assert bob.one("SELECT eventview.refresh('bv')") == 1
    assert bob.one(f"SELECT count(*) FROM eventview._changes_{source_id}") >= 1
    admin.conn.close()


def test_one_owners_schedule_or_failure_count_does_not_stop_the_others(cluster, roles):
    """View owners may write their views' schedule and failure count: neither a schedule of
    300,000 years (past the range of run_maintenance's due time) nor a failure count at the
    largest integer (past the range of its error handler's count) makes run_maintenance fail
    for every view."""
    admin = As(cluster, roles, "postgres")
    alice, bob = As(cluster, roles, "alice"), As(cluster, roles, "bob")
    alice.q("SELECT eventview.create_event_table('ev')")
    alice.q(f"GRANT SELECT ON ev TO {role('bob')}")
    alice.q("""SELECT eventview.create_view('av', 'ev', measures => '{"n": "count(*)"}')""")
    bob.q("""SELECT eventview.create_view('bv', 'ev', measures => '{"s": "sum($.v)"}', on_type_error => 'fail')""")
    bob.q("SELECT eventview.schedule('bv', '300000 years')")
    bob.q("UPDATE eventview._views SET failures = 2147483647 WHERE relid = 'bv'::regclass")
    alice.q("SELECT eventview.schedule('av', '1 second')")
    alice.q("INSERT INTO ev (event_type, payload) VALUES ('t', '{\"v\": \"not a number\"}')")
    # bv is due (never refreshed) and fails; av refreshes all the same.
    admin.q("SELECT eventview.run_maintenance()")
    assert alice.one("SELECT n FROM av") == 1
    failures, retry_at, error = admin.q(
        "SELECT failures, retry_at::text, last_error FROM eventview._views WHERE relid = 'bv'::regclass")[0]
    assert (failures, retry_at) == (1000000001, "infinity")
    assert "type error in view public.bv" in error
    # Refreshed once, bv is not due for 300,000 years: maintenance goes on for the others.
    bob.q("UPDATE eventview._views SET retry_at = NULL WHERE relid = 'bv'::regclass")
    admin.q("UPDATE eventview._views SET last_refresh_at = now() WHERE relid = 'bv'::regclass")
    alice.q("INSERT INTO ev (event_type, payload) VALUES ('t', '{\"v\": 1}')")
    admin.q("SELECT pg_sleep(1.1)")
    admin.q("SELECT eventview.run_maintenance()")
    assert alice.one("SELECT n FROM av") == 2


def test_a_views_owner_runs_nothing_as_whoever_reads_the_catalog(cluster, roles):
    """eventview.views counts a view's groups as the view's owner, not as the extension owner:
    the storage table the count reads belongs to the view's owner, who in PostgreSQL 15 can turn
    it into a view of their own functions (a "_RETURN" rule). Counted with more rights, those
    functions would run as a superuser, and any role able to create a view could make itself
    superuser. Nor does a policy on a view's storage make the catalog unreadable for all."""
    admin, mallory = As(cluster, roles, "postgres"), As(cluster, roles, "mallory")
    admin.q(f"CREATE SCHEMA mal AUTHORIZATION {role('mallory')}")
    mallory.q("SELECT eventview.create_event_table('mal.ev')")
    mallory.q("SELECT eventview.create_view('mal.v', 'mal.ev')")
    vid = admin.one("SELECT view_id FROM eventview._views WHERE relid = 'mal.v'::regclass")
    data = f"eventview._v{vid}_data"
    mallory.q(f"""CREATE FUNCTION mal.evil() RETURNS boolean LANGUAGE plpgsql AS $$
        BEGIN
            IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
                EXECUTE 'ALTER ROLE {role('mallory')} SUPERUSER';
            END IF;
            RETURN true;
        END $$""")
    mallory.q(f"DELETE FROM {data}")
    for (index,) in admin.q("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass", (data,)):
        mallory.q(f"DROP INDEX {index}")
    mallory.q(f"VACUUM {data}")
    columns = ", ".join(
        f"CASE WHEN mal.evil() THEN NULL END::{typ} AS {name}"
        for name, typ in admin.q("""SELECT quote_ident(attname), format_type(atttypid, atttypmod) FROM pg_attribute
                                    WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum""", (data,)))
    mallory.q(f'CREATE RULE "_RETURN" AS ON SELECT TO {data} DO INSTEAD SELECT {columns}')
    assert admin.one("SELECT relkind FROM pg_class WHERE oid = %s::regclass", (data,)) == "v"
    # The superuser reads the catalog, and calls the function directly: not counted (a plain
    # table no more), nothing of hers run.
    assert admin.one("SELECT groups FROM eventview.views WHERE name = 'mal.v'::regclass") is None
    assert admin.one("SELECT eventview._group_count(%s)", (vid,)) is None
    assert admin.one(f"SELECT rolsuper FROM pg_roles WHERE rolname = '{role('mallory')}'") is False
    # Nor can a policy of hers (on another view's storage) make the catalog unreadable for all.
    mallory.q("SELECT eventview.create_view('mal.v2', 'mal.ev')")
    data2 = f"eventview._v{vid + 1}_data"
    mallory.q("CREATE FUNCTION mal.boom() RETURNS boolean LANGUAGE plpgsql AS $$BEGIN RAISE 'boom'; END$$")
    mallory.q(f"ALTER TABLE {data2} ENABLE ROW LEVEL SECURITY")
    mallory.q(f"ALTER TABLE {data2} FORCE ROW LEVEL SECURITY")
    mallory.q(f"CREATE POLICY boom ON {data2} USING (mal.boom())")
    assert admin.one("SELECT count(*) FROM eventview.views WHERE groups IS NULL") == 2
    for who in (admin, mallory):
        who.conn.close()


def test_the_quarantine_of_views_in_schemas_a_reader_cannot_use(cluster, roles):
    """The quarantine's row-level policy finds each row's view without looking its name up in its
    schema, which would give a reader without USAGE on that schema "permission denied for
    schema" for the whole table. And a view's owner files rows only under the view's own event
    table: under another, that table's owner would see them as the view's."""
    admin, mallory, alice = (As(cluster, roles, r) for r in ("postgres", "mallory", "alice"))
    admin.q(f"CREATE SCHEMA priv AUTHORIZATION {role('mallory')}")
    mallory.q("SELECT eventview.create_event_table('priv.ev')")
    mallory.q("""SELECT eventview.create_view('priv.vq', 'priv.ev', measures => '{"s": "sum($.v)"}')""")
    mallory.q("INSERT INTO priv.ev (event_type, payload) VALUES ('e', '{\"v\": \"x\"}')")
    mallory.q("SELECT eventview.refresh('priv.vq')")
    assert mallory.one("SELECT count(*) FROM eventview.quarantine") == 1
    alice.q("SELECT eventview.create_event_table('aev')")
    alice.q("INSERT INTO aev (event_type, payload) VALUES ('e', '{}')")
    assert alice.one("SELECT count(*) FROM eventview.quarantine") == 0
    # Filing a row of mallory's view under alice's table: refused (not its event table).
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        mallory.q("""INSERT INTO eventview.quarantine (source, view_name, reason, event)
                     VALUES ('public.aev', 'priv.vq', 'forged', '{}')""")
    # Under its own table, as its refresh files them: allowed.
    mallory.q("""INSERT INTO eventview.quarantine (source, view_name, reason, event)
                 VALUES ('priv.ev', 'priv.vq', 'by hand', '{}')""")
    assert alice.one("SELECT count(*) FROM eventview.quarantine") == 0
    assert mallory.one("SELECT quarantined FROM eventview.views WHERE name = 'priv.vq'::regclass") == 2
    for who in (admin, mallory, alice):
        who.conn.close()


def test_the_owner_of_an_event_table_drops_the_views_of_others_over_it(cluster, roles):
    """The table's owner may drop any view over the table, and what others built on the
    extension's internal tables (storage, changelog) goes with it; objects that depend on the
    view itself are named, never dropped. Otherwise a role that could once read the table could,
    with a view over it and a view of its own over that view's storage, keep the table's owner
    from dropping the view (and the table: the storage's drop would fail on the dependent view)
    while that view holds back the pruning of the table's changelog."""
    admin, mallory, alice = (As(cluster, roles, r) for r in ("postgres", "mallory", "alice"))
    admin.q(f"CREATE SCHEMA mal AUTHORIZATION {role('mallory')}")
    admin.q(f"GRANT USAGE ON SCHEMA mal TO {role('alice')}, {role('bob')}")
    alice.q("SELECT eventview.create_event_table('shared')")
    alice.q(f"GRANT SELECT ON shared TO {role('mallory')}")
    mallory.q("SELECT eventview.create_view('mal.onshared', 'shared')")
    vid = admin.one("SELECT view_id FROM eventview._views WHERE relid = 'mal.onshared'::regclass")
    mallory.q(f"CREATE VIEW mal.pin AS SELECT * FROM eventview._v{vid}_data")
    mallory.q("CREATE VIEW mal.on_top AS SELECT * FROM mal.onshared")
    source_id = admin.one("SELECT source_id FROM eventview._sources")
    mallory.q(f"CREATE VIEW mal.peek AS SELECT * FROM eventview._changes_{source_id}")
    alice.q(f"REVOKE SELECT ON shared FROM {role('mallory')}")
    # Nobody else: 42501.
    assert "belongs to role" in As(cluster, roles, "bob").denied("SELECT eventview.drop_view('mal.onshared')")
    # What depends on the view's relation is anyone's: never dropped with it, named instead.
    with pytest.raises(psycopg.errors.DependentObjectsStillExist) as e:
        alice.q("SELECT eventview.drop_view('mal.onshared')")
    assert e.value.diag.message_detail == "Depending on it: view mal.on_top."
    mallory.q("DROP VIEW mal.on_top")
    # USAGE on the view's schema is not needed to name it: her right comes from her table.
    admin.q(f"REVOKE USAGE ON SCHEMA mal FROM {role('alice')}")
    alice.q("SELECT eventview.drop_view('mal.onshared')")
    assert admin.one("SELECT count(*) FROM eventview._views") == 0
    # (What she built on its storage, internal, went with it.)
    assert admin.one("SELECT to_regclass('mal.pin')") is None
    # And so drop_event_table(cascade) of a table others' views read.
    mallory_view = "mal.again"
    alice.q(f"GRANT SELECT ON shared TO {role('mallory')}")
    mallory.q(f"SELECT eventview.create_view('{mallory_view}', 'shared')")
    vid = admin.one(f"SELECT view_id FROM eventview._views WHERE relid = '{mallory_view}'::regclass")
    mallory.q(f"CREATE VIEW mal.pin2 AS SELECT * FROM eventview._v{vid}_data")
    alice.q("SELECT eventview.drop_event_table('shared', cascade => true)")
    assert admin.one("SELECT count(*) FROM eventview._sources") == 0
    # (mal.peek, built on the changelog, went with it.)
    assert admin.one("SELECT to_regclass('mal.peek')") is None
    for who in (admin, mallory, alice):
        who.conn.close()


def test_last_error_says_why_a_view_cannot_be_refreshed_whoever_refreshed_it(cluster, roles):
    """API.md: refresh by anyone runs with the owner's rights; if the owner loses SELECT on the
    source, refresh fails for that view with the error in last_error, also when the failing
    refresh is a direct call, whose transaction rolls back, and not run_maintenance."""
    admin, alice, bob = (As(cluster, roles, r) for r in ("postgres", "alice", "bob"))
    bob.q("SELECT eventview.create_event_table('bobs_events')")
    bob.q(f"GRANT SELECT ON bobs_events TO {role('alice')}")
    alice.q("SELECT eventview.create_view('alices_view', 'bobs_events')")
    bob.q(f"REVOKE SELECT ON bobs_events FROM {role('alice')}")
    bob.q("INSERT INTO bobs_events (event_type, payload) VALUES ('e', '{}')")
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
        admin.q("SELECT eventview.refresh('alices_view')")
    message = e.value.diag.message_primary
    assert message == (f"permission denied for table public.bobs_events: view public.alices_view belongs to role "
                       f"{role('alice')}, which may no longer read it")
    # Read by anyone, the view's owner and the table's owner among them.
    for who in (admin, alice, bob):
        assert who.one("SELECT last_error FROM eventview.views WHERE name = 'alices_view'::regclass") == message
    assert alice.one("SELECT count(*) FROM alices_view") == 0
    # Granted again: nothing keeps it from refreshing, and nothing was recorded.
    bob.q(f"GRANT SELECT ON bobs_events TO {role('alice')}")
    assert bob.one("SELECT last_error FROM eventview.views WHERE name = 'alices_view'::regclass") is None
    assert admin.one("SELECT eventview.refresh('alices_view')") == 1
    assert alice.one("SELECT count(*) FROM alices_view") == 1
    for who in (admin, alice, bob):
        who.conn.close()


def test_a_refresh_does_not_read_an_event_table_whose_envelope_its_owner_retyped(cluster, roles):
    """A refresh reads the event table as the view's owner, who may be a superuser reading an
    application role's table. That table's owner can give an envelope column a type of their
    own, whose casts (an implicit cast to jsonb under `payload`, a cast to json when the
    quarantine copies `event_key`) would then run their functions with the view owner's rights.
    So a refresh, like the field observer, refuses such a table."""
    admin, bob = As(cluster, roles, "postgres"), As(cluster, roles, "bob")
    bob.q("SELECT eventview.create_event_table('apps_events')")
    admin.q("""SELECT eventview.create_view('dba_view', 'apps_events', measures => '{"s": "sum($.v)"}')""")
    bob.q("INSERT INTO apps_events (event_type, event_key, payload) VALUES ('e', 'k1', '{\"v\": 1}')")
    assert admin.one("SELECT eventview.refresh('dba_view')") == 1
    bob.q("ALTER TABLE apps_events ALTER COLUMN event_key TYPE varchar(200)")
    bob.q("INSERT INTO apps_events (event_type, event_key, payload) VALUES ('e', 'k2', '{\"v\": \"x\"}')")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
        admin.q("SELECT eventview.refresh('dba_view')")
    assert e.value.diag.message_primary == "event table public.apps_events was altered: event_key is character varying(200)"
    assert admin.one("SELECT count(*) FROM eventview.quarantine") == 0
    bob.q("ALTER TABLE apps_events ALTER COLUMN event_key TYPE text")
    assert admin.one("SELECT eventview.refresh('dba_view')") == 1
    assert admin.one("SELECT s FROM dba_view") == 1
    for who in (admin, bob):
        who.conn.close()


def test_a_refresh_under_repeatable_read_refuses_an_envelope_retyped_after_its_snapshot(cluster, roles):
    """The envelope check answers from the table as the refresh reads it, under its lock: a
    REPEATABLE READ transaction whose snapshot predates the ALTER TABLE (and whose catalog
    reads would still see the old type) is refused as well, with 55000 saying so, and applies
    nothing."""
    admin, bob = As(cluster, roles, "postgres"), As(cluster, roles, "bob")
    bob.q("SELECT eventview.create_event_table('rr_events')")
    admin.q("""SELECT eventview.create_view('rr_view', 'rr_events', measures => '{"s": "sum($.v)"}')""")
    bob.q("INSERT INTO rr_events (event_type, payload) VALUES ('e', '{\"v\": 1}')")
    admin.q("BEGIN ISOLATION LEVEL REPEATABLE READ")
    assert admin.one("SELECT count(*) FROM eventview.views") == 1
    bob.q("ALTER TABLE rr_events ALTER COLUMN producer TYPE varchar(50)")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
        admin.q("SELECT eventview.refresh('rr_view')")
    assert e.value.diag.message_primary == (
        "event table public.rr_events was altered: its envelope columns changed after this transaction's snapshot")
    admin.q("ROLLBACK")
    # Outside that snapshot, the catalog names the column.
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
        admin.q("SELECT eventview.refresh('rr_view')")
    assert e.value.diag.message_primary == "event table public.rr_events was altered: producer is character varying(50)"
    bob.q("ALTER TABLE rr_events ALTER COLUMN producer TYPE text")
    assert admin.one("SELECT eventview.refresh('rr_view')") == 1
    assert admin.one("SELECT s FROM rr_view") == 1
    for who in (admin, bob):
        who.conn.close()


def test_a_view_renamed_where_event_triggers_do_not_fire_still_files_its_quarantine(cluster, roles):
    """The quarantine's policies find a view by the name its catalog row keeps (known_name),
    which a rename updates through an event trigger. Renamed where event triggers do not fire
    (session_replication_role = replica), the view's refresh still files and finds its entries
    under that kept name: it files by known_name too, not by the relation's current name."""
    admin, bob = As(cluster, roles, "postgres"), As(cluster, roles, "bob")
    bob.q("SELECT eventview.create_event_table('bev')")
    bob.q("""SELECT eventview.create_view('bq', 'bev', measures => '{"s": "sum($.v)"}')""")
    admin.q("SET session_replication_role = replica")
    admin.q("ALTER VIEW bq RENAME TO bq2")
    admin.q("RESET session_replication_role")
    bob.q("INSERT INTO bev (event_type, payload) VALUES ('e', '{\"v\": \"x\"}'), ('e', '{\"v\": 2}')")
    assert bob.one("SELECT eventview.refresh('bq2')") == 2
    assert bob.q("SELECT view_name FROM eventview.quarantine") == [("public.bq",)]
    assert bob.one("SELECT quarantined FROM eventview.views WHERE name = 'bq2'::regclass") == 1
    # The next DDL the event trigger sees brings the name up to date.
    bob.q("ALTER VIEW bq2 RENAME TO bq3")
    assert bob.q("SELECT view_name FROM eventview.quarantine") == [("public.bq3",)]
    for who in (admin, bob):
        who.conn.close()


def test_ingest_takes_insert_on_the_envelope_columns_only(cluster, roles):
    """ingest checks INSERT before its statement, to say which table and grant: on the columns it
    inserts, so a producer granted INSERT on those only (not on the table) still ingests."""
    alice, pat = As(cluster, roles, "alice"), As(cluster, roles, "pat")
    alice.q("SELECT eventview.create_event_table('colgrant')")
    alice.q(f"""GRANT INSERT (event_key, event_type, event_version, producer, occurred_at, payload),
                      SELECT (event_key) ON colgrant TO {role('pat')}""")
    ok = '[{"type": "e", "key": "k1", "payload": {"v": 1}}]'
    assert pat.q(f"SELECT * FROM eventview.ingest('colgrant', '{ok}')") == [(1, 0, 0)]
    alice.q(f"REVOKE INSERT (payload) ON colgrant FROM {role('pat')}")
    msg = pat.denied(f"SELECT * FROM eventview.ingest('colgrant', '{ok}')")
    assert msg == "permission denied to ingest into event table colgrant: INSERT on it is needed", msg
    # INSERT without the read of event_key that finds duplicates: that is named too.
    alice.q(f"GRANT INSERT ON colgrant TO {role('pat')}")
    alice.q(f"REVOKE SELECT (event_key) ON colgrant FROM {role('pat')}")
    msg = pat.denied(f"SELECT * FROM eventview.ingest('colgrant', '{ok}')")
    assert msg == ("permission denied to ingest into event table colgrant: "
                   "SELECT on its event_key column is needed to find duplicates"), msg
    alice.q(f"GRANT SELECT (event_key) ON colgrant TO {role('pat')}")
    assert pat.q(f"SELECT * FROM eventview.ingest('colgrant', '{ok}')") == [(0, 1, 0)]
    for who in (alice, pat):
        who.conn.close()


def test_a_position_is_given_out_as_its_sql_spelling_says(cluster, roles):
    """_position_given_out(s, own): pg_snapshot_xmax(s) and own (when not NULL) are at most the
    next transaction id (the later of the statement's snapshot's xmax and the caller's own
    xid + 1), or the current user is a superuser; NULL for a NULL snapshot unless own refuses
    it, as SQL's AND and OR give. Compared with that spelling for a user and a superuser, in and
    out of a transaction with an id."""
    admin, alice = (As(cluster, roles, r) for r in ("postgres", "alice"))
    spelled = """
        SELECT eventview._position_given_out(s, own),
               (pg_snapshot_xmax(s) <= next_xid AND (own IS NULL OR own < next_xid))
               OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
        FROM (SELECT %(s)s::pg_snapshot AS s, %(own)s::xid8 AS own,
                     greatest(pg_snapshot_xmax(pg_current_snapshot()),
                              (pg_current_xact_id_if_assigned()::text::numeric + 1)::text::xid8) AS next_xid) p
    """
    answers = set()
    for who in (alice, admin):
        for in_transaction in (False, True):
            if in_transaction:
                who.q("BEGIN")
                who.q("SELECT pg_current_xact_id()")
            nxt = int(who.one("SELECT pg_snapshot_xmax(pg_current_snapshot())::text"))
            if in_transaction:
                nxt = max(nxt, int(who.one("SELECT pg_current_xact_id()::text")) + 1)
            for s in (None, f"{nxt - 1}:{nxt - 1}:", f"{nxt}:{nxt}:", f"{nxt + 1}:{nxt + 1}:", f"3:{nxt + 5}:4"):
                for own in (None, "3", str(nxt - 1), str(nxt), str(nxt + 7)):
                    got, expected = who.q(spelled, {"s": s, "own": own})[0]
                    assert got == expected, (who, in_transaction, s, own)
                    answers.add(got)
            if in_transaction:
                who.q("ROLLBACK")
    assert answers == {True, False, None}


def test_a_views_owner_writes_only_positions_a_refresh_could_have_written(cluster, roles):
    """A refresh records its view's position with the owner's rights, so the owner may write the
    row; a new position naming transactions this cluster has not given out (which would make the
    next capture trigger made on the table renumber its changelog, as a superuser) is refused
    with 23514, and the view goes on refreshing. A superuser writes any (a restore does)."""
    admin, alice, bob = (As(cluster, roles, r) for r in ("postgres", "alice", "bob"))
    alice.q("SELECT eventview.create_event_table('ev')")
    alice.q(f"GRANT SELECT ON ev TO {role('bob')}")
    bob.q("SELECT eventview.create_view('bv', 'ev')")
    view_id = bob.one("SELECT view_id FROM eventview._views WHERE relid = 'bv'::regclass")
    ahead = """(SELECT (x || ':' || x || ':')::pg_snapshot
              FROM (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint + 1000000 AS x) n)"""
    for column, value in (("applied_snapshot", ahead),
                          ("applied_own_xid", f"pg_snapshot_xmax({ahead})")):
        with pytest.raises(psycopg.errors.CheckViolation) as e:
            bob.q(f"UPDATE eventview._views SET {column} = {value} WHERE view_id = %s", [view_id])
        assert "names transactions this cluster has not given out" in e.value.diag.message_primary
    # What a refresh writes passes, also inside the transaction that wrote the events.
    alice.q("INSERT INTO ev (event_type, payload) VALUES ('e', '{}')")
    assert bob.one("SELECT eventview.refresh('bv')") == 1
    alice.q(f"GRANT INSERT ON ev TO {role('bob')}")
    with bob.conn.transaction():
        bob.q("INSERT INTO ev (event_type, payload) VALUES ('e', '{}')")
        assert bob.one("SELECT eventview.refresh('bv')") == 1
    assert bob.one("SELECT events FROM bv") == 2
    before = admin.one("SELECT applied_snapshot::text FROM eventview._views WHERE view_id = %s", [view_id])
    admin.q(f"UPDATE eventview._views SET applied_snapshot = {ahead} WHERE view_id = %s", [view_id])
    # (The row's other columns stay the owner's to write, as on a row restored from another
    # cluster and not renumbered yet: only a change of position is checked.)
    assert bob.q("UPDATE eventview._views SET schedule = '1 hour' WHERE view_id = %s", [view_id]) == 1
    admin.q("UPDATE eventview._views SET applied_snapshot = %s::pg_snapshot WHERE view_id = %s", [before, view_id])
    for who in (admin, alice, bob):
        who.conn.close()


def test_a_realtime_read_whose_owner_lost_the_table_names_the_table(cluster, roles):
    """A realtime view reads the changelog with its owner's rights; once the table's owner
    revokes the view owner's SELECT (which takes their changelog read along), a read of the view
    is refused naming the event table and the owner who lost it, not the changelog behind it."""
    alice, bob, rita = (As(cluster, roles, r) for r in ("alice", "bob", "rita"))
    alice.q("SELECT eventview.create_event_table('ev')")
    alice.q(f"GRANT SELECT ON ev TO {role('bob')}")
    bob.q("SELECT eventview.create_view('brt', 'ev', realtime => true)")
    bob.q(f"GRANT SELECT ON brt TO {role('rita')}")
    alice.q("INSERT INTO ev (event_type, payload) VALUES ('e', '{}')")
    assert rita.one("SELECT events FROM brt") == 1
    alice.q(f"REVOKE SELECT ON ev FROM {role('bob')}")
    for who in (bob, rita):
        assert who.denied("SELECT * FROM brt") == (
            f"permission denied for table public.ev: view public.brt belongs to role {role('bob')}, which may no longer read it")
    for who in (alice, bob, rita):
        who.conn.close()


def test_a_view_owner_reads_the_changelog_while_a_view_of_theirs_reads_the_table(cluster, roles):
    """Forgetting a view takes its owner's SELECT on the changelog (which holds old contents of
    events) once no other view of theirs reads the table, whether the view goes by drop_view or
    by a plain DROP VIEW; the table's owner keeps the changelog rights that come with the table."""
    admin = As(cluster, roles, "postgres")
    alice, bob = As(cluster, roles, "alice"), As(cluster, roles, "bob")
    alice.q("SELECT eventview.create_event_table('shared')")
    source_id = alice.one("SELECT source_id FROM eventview._sources WHERE relid = 'shared'::regclass")
    log = f"eventview._changes_{source_id}"
    reads_log = lambda who: admin.one(f"SELECT has_table_privilege('{role(who)}', '{log}', 'SELECT')")
    alice.q(f"GRANT SELECT ON shared TO {role('bob')}")
    assert not reads_log("bob")
    bob.q("SELECT eventview.create_view('bob_one', 'shared')")
    bob.q("SELECT eventview.create_view('bob_two', 'shared')")
    alice.q("SELECT eventview.create_view('alice_one', 'shared')")
    assert reads_log("bob") and reads_log("alice")
    bob.q("SELECT eventview.drop_view('bob_one')")
    assert reads_log("bob")
    bob.q("DROP VIEW bob_two")
    assert not reads_log("bob")
    assert admin.one("SELECT count(*) FROM eventview._views WHERE owner = %s::regrole", (role("bob"),)) == 0
    alice.q("SELECT eventview.drop_view('alice_one')")
    assert reads_log("alice")
    for who in (admin, alice, bob):
        who.conn.close()


def test_a_rollup_is_made_by_a_role_whose_rights_its_sources_owner_has(cluster, roles):
    """A rollup reads its source view's storage as the rollup's owner: only a role whose rights
    the source's owner has may make one (42501 otherwise). Its owner reads the source's storage
    while the rollup exists, not after it is dropped."""
    alice = As(cluster, roles, "alice")
    bob = As(cluster, roles, "bob")
    alice.q("SELECT eventview.create_event_table('ev')")
    alice.q("""SELECT eventview.create_view('hourly', 'ev', group_by => '{"k": "$.k"}',
               measures => '{"n": "count(*)", "top": "max($.x)"}', time_bucket => '1 hour')""")
    alice.q(f"GRANT SELECT ON ev, hourly TO {role('bob')}")
    alice.q("""INSERT INTO ev (event_type, occurred_at, payload) VALUES ('t', '2026-01-01 10:00+00', '{"k": "a", "x": 3}')""")
    rollup = """SELECT eventview.create_view('daily', 'hourly', group_by => '{"k": "k"}',
                measures => '{"n": "n", "top": "top"}', time_bucket => '1 day')"""
    message = bob.denied(rollup)
    assert "its owner pgev_alice does not have the rights of role pgev_bob" in message
    alice.conn.execute("RESET ROLE")
    alice.q(f"GRANT {role('bob')} TO {role('alice')}")
    alice.q(f"SET ROLE {role('alice')}")
    bob.q(rollup)
    alice.q("SELECT eventview.refresh('hourly')")
    assert bob.one("SELECT eventview.refresh('daily')") == 0
    assert bob.q("SELECT k, n, top FROM daily") == [("a", 1, 3)]
    storage = alice.one("SELECT format('eventview._v%s_data', eventview._view_id('hourly'))")
    assert bob.one(f"SELECT count(*) FROM {storage}") == 1
    bob.q("SELECT eventview.drop_view('daily')")
    bob.denied(f"SELECT count(*) FROM {storage}")


def test_a_view_given_to_another_role_takes_its_storage_and_refresh_along(cluster, roles):
    """ALTER VIEW ... OWNER TO gives the view to its new owner: they read (realtime too) and
    refresh it, its storage is theirs, and the former owner keeps no right on it or on the
    changelog; a view that rollups read, and a rollup, are refused (0A000), nothing changed."""
    admin, alice, bob, rita = (As(cluster, roles, r) for r in ("postgres", "alice", "bob", "rita"))
    alice.q("SELECT eventview.create_event_table('ev')")
    alice.q(f"GRANT SELECT ON ev TO {role('bob')}, {role('rita')}")
    bob.q("""SELECT eventview.create_view('bv', 'ev', group_by => '{"k": "$.k"}',
             measures => '{"n": "count(*)", "hi": "max($.v)"}', realtime => true)""")
    alice.q("""INSERT INTO ev (event_type, payload) VALUES ('e', '{"k": "a", "v": 1}'), ('e', '{"k": "a", "v": 5}')""")
    view_id = admin.one("SELECT eventview._view_id('bv')")
    source_id = admin.one("SELECT source_id FROM eventview._sources")
    log = f"eventview._changes_{source_id}"
    admin.q(f"ALTER VIEW bv OWNER TO {role('rita')}")
    assert admin.one(f"SELECT owner::text FROM eventview._views WHERE view_id = {view_id}") == role("rita")
    assert admin.q(f"""SELECT DISTINCT tableowner::text FROM pg_tables
                       WHERE schemaname = 'eventview' AND tablename ~ '^_v{view_id}_'""") == [(role("rita"),)]
    assert rita.q("SELECT k, n, hi FROM bv") == [("a", 2, 5)]  # realtime: from the changelog
    assert rita.one("SELECT eventview.refresh('bv')") == 2
    assert rita.q("SELECT k, n, hi FROM bv") == [("a", 2, 5)]
    bob.denied("SELECT * FROM bv")
    bob.denied("SELECT eventview.refresh('bv')")
    bob.denied(f"SELECT * FROM eventview._v{view_id}_data")
    assert admin.one(f"SELECT has_table_privilege('{role('bob')}', '{log}', 'SELECT')") is False
    assert admin.one(f"SELECT has_table_privilege('{role('rita')}', '{log}', 'SELECT')") is True
    # Not to a role that may not read the event table (the quarantine would show it its events).
    msg = admin.denied(f"ALTER VIEW bv OWNER TO {role('mallory')}")
    assert msg == f"view public.bv cannot be given to role {role('mallory')}: it may not read event table public.ev"
    assert admin.one("SELECT viewowner::text FROM pg_views WHERE viewname = 'bv'") == role("rita")
    admin.q("ALTER VIEW bv RENAME TO bv2")
    assert rita.one("SELECT eventview.refresh('bv2')") == 0

    # A view that rollups read, and a rollup: the rights between them are their owners'.
    alice.q("""SELECT eventview.create_view('hourly', 'ev', group_by => '{"k": "$.k"}',
               measures => '{"n": "count(*)"}', time_bucket => '1 hour')""")
    alice.q("""SELECT eventview.create_view('daily', 'hourly', group_by => '{"k": "k"}',
               measures => '{"n": "n"}', time_bucket => '1 day')""")
    for name in ("hourly", "daily"):
        with pytest.raises(psycopg.errors.FeatureNotSupported) as e:
            admin.q(f"ALTER VIEW {name} OWNER TO {role('rita')}")
        assert "cannot be given to another role: it is a rollup or rollups read it" in str(e.value)
        assert admin.one(f"SELECT viewowner::text FROM pg_views WHERE viewname = '{name}'") == role("alice")
    for who in (admin, alice, bob, rita):
        who.conn.close()


def test_a_realtime_views_pending_groups_are_served_only_to_its_readers(cluster, roles):
    """A realtime view's relation reads the groups of its pending changes from
    eventview._realtime_pending, which runs as the view's owner. It serves a call made on
    behalf of a role with SELECT on the whole view: inside the view's own query (whose reader
    PostgreSQL checks as for any view, column privileges included), or a call written by such a
    role (directly, or in a view of theirs). Anyone else is refused with 42501, whatever else
    the query reads."""
    alice, bob, rita, mallory, pat = (As(cluster, roles, r) for r in ("alice", "bob", "rita", "mallory", "pat"))
    alice.q("SELECT eventview.create_event_table('ev')")
    alice.q(f"GRANT SELECT ON ev TO {role('bob')}")
    bob.q("""SELECT eventview.create_view('brt', 'ev', group_by => '{"k": "$.k"}',
             measures => '{"n": "count(*)"}', realtime => true)""")
    view_id = bob.one("SELECT view_id FROM eventview._views WHERE relid = 'brt'::regclass")
    alice.q("""INSERT INTO ev (event_type, payload) VALUES ('e', '{"k": "a"}'), ('e', '{"k": "a"}'),
                                                          ('e', '{"k": "b"}')""")
    pending = (f"SELECT g1, __count FROM eventview._realtime_pending({view_id}) "
               "AS t(__k boolean, g1 text, g1_null boolean, __count bigint) ORDER BY 1")
    refused = f"permission denied for the pending groups of view {view_id}"

    # The owner, and a reader the owner granted SELECT: through the view, or calling it.
    bob.q(f"GRANT SELECT ON brt TO {role('rita')}")
    for who in (bob, rita):
        assert who.q("SELECT k, n FROM brt ORDER BY k") == [("a", 2), ("b", 1)]
        assert who.q(pending) == [("a", 2), ("b", 1)]
    # No SELECT on the view: refused, also in a query that reads a view over it they may read.
    mallory.denied("SELECT * FROM brt")
    assert mallory.denied(pending).startswith(refused)
    # SELECT on some columns: the view reads as for any view; the call itself is refused.
    bob.q(f"GRANT SELECT (k) ON brt TO {role('mallory')}")
    assert mallory.q("SELECT k FROM brt ORDER BY k") == [("a",), ("b",)]
    mallory.denied("SELECT n FROM brt")
    assert mallory.denied(pending).startswith(refused)

    # A view of another role over it reads with its owner's right on brt, as PostgreSQL reads
    # views: pat needs SELECT on that view only, and sees what it shows, not brt's groups.
    alice.q("CREATE VIEW av AS SELECT k, n FROM brt WHERE k = 'a'")
    alice.q(f"GRANT SELECT ON av TO {role('pat')}")
    pat.denied("SELECT * FROM av")  # alice may not read brt (yet)
    bob.q(f"GRANT SELECT ON brt TO {role('alice')}")
    assert pat.q("SELECT k, n FROM av") == [("a", 2)]
    pat.denied("SELECT * FROM brt")
    assert pat.denied(pending.replace(" ORDER BY 1", " WHERE EXISTS (SELECT FROM av) ORDER BY 1")).startswith(refused)
    # A view that calls it is its owner's call: alice may read brt, so her view serves pat.
    alice.q(f"CREATE VIEW apending AS {pending}")
    alice.q(f"GRANT SELECT ON apending TO {role('pat')}")
    assert pat.q("SELECT * FROM apending") == [("a", 2), ("b", 1)]
    bob.q(f"REVOKE SELECT ON brt FROM {role('alice')}")
    assert pat.denied("SELECT * FROM apending").startswith(refused)
    for who in (alice, bob, rita, mallory, pat):
        who.conn.close()
