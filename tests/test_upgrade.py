"""`ALTER EXTENSION pg_eventview UPDATE` from every released version to the current one.

Each release is rebuilt from the commit it was cut from (RELEASE_COMMITS, the one list of
releases): its library, to create data as that release did, and its install script, generated
by `cargo pgrx schema` as at release time. The install scripts are put next to the current
build's, with the upgrade scripts of sql/, so an old release can be created as a user has it.
Two properties:
- the updated extension is the same as a fresh install of the current version: same functions
  (with bodies), tables and columns, views, constraints, indexes, comments, grants and extension
  members;
- a database with event tables, views and pending changes created under the old version keeps
  going after the update: views refresh to the same result as an aggregate from scratch, capture
  continues, declarations and schedules survive.
"""

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest

REPO = Path(__file__).resolve().parent.parent
PG_CONFIG = "/usr/lib/postgresql/15/bin/pg_config"
EXTENSION_DIR = Path(subprocess.check_output([PG_CONFIG, "--sharedir"], text=True).strip()) / "extension"
LIBRARY = Path(subprocess.check_output([PG_CONFIG, "--pkglibdir"], text=True).strip()) / "pg_eventview.so"
RELEASES = REPO / "target" / "releases"

# The commit each release was cut from. Only the commits of main travel with a clone (tags do
# not), so this list is the record of the releases; add a line when cutting one.
RELEASE_COMMITS = {
    "0.1.0": "276fcd18cf5586e22dd5754bb379858cb19d7425",
    "0.2.0": "b86713cd2a1be1567bfb0eacd4427ea66a696f81",
    "0.3.0": "94b7f6b3c527ab9d876662663737afabe7b0ed3a",
    "0.4.0": "022c1ba40e8c0a212096b5d92cc0ea7e08997979",
    "0.5.0": "7554a74c9d83f9f36691be6b46acd09fd9fcac08",
    "0.6.0": "ec29b98d10b71a992c8fb96d4f4168b440c04a00",
    "0.7.0": "a9a6ff599f7f0730c94ebc409481d16dee189b55",
    "0.8.0": "5cab1e4516f59e0cb66cce0780abb46ff682035d",
    "0.9.0": "d00f437b65bbccfe13eb74173e98ea5487b59b6c",
    "0.10.0": "27a78a652a37c31e3e585df3fb1655cbee40c6e2",
    "0.11.0": "db0d8b9f726797163f61fa23cee285f962a727b8",
    "0.12.0": "9964c9f0ea337aad70a9b45d4d47488649c6b03d",
    "0.13.0": "34c15a30ccdd90c2a34d3d305aaa760a66ef526b",
    "0.14.0": "75b13f007a1e75c0416fd12c1e310ed6f4d36af2",
    "0.15.0": "a700b032728cd30cbe83fc8ccb0f04348c8037c8",
    "0.16.0": "084cd4aad3e057ddacfafdfe6093aecddd71dd27",
    "0.17.0": "666dc66cac032727b6faadc7f060b21c9e7b2a7d",
    "0.18.0": "f10029013c957a74e10f5c69154766bfbe393244",
    "0.19.0": "49426a318f1b77e8b3c8f7a49e587c9fdf5162f6",
    "0.20.0": "837094e4ab5de47ee49fb4bbe0d9efa530fd91fa",
    "0.21.0": "2b73b5f0f245012043ff3eb5dab17322b870e82a",
    "0.22.0": "562486862a1967556583fa853b7a53827a7ff37a",
    "0.23.0": "9d8e0c3ed0c82e9a7e94a404e75e3729e1d66a72",
    "0.24.0": "4f5f764ab19f64e4f4aed320d447cdeaa07ded38",
    "0.25.0": "2c1a3eea2790a62436aac9f7c1ace4d9b2081206",
    "0.26.0": "54ee08a0fb1a0b264971d4f70602469efd04723e",
    "0.27.0": "040c7088a5d296d5d09bfb937ca1a9ab0901f475",
    "0.28.0": "1286cd7249d55ceeedb7cd3172be831ab351721d",
    "0.29.0": "b4340e91bfc4c8b449537d069a463b50b216e3a9",
    "0.30.0": "de7fb75d9924002f21bfc97439289a7eb0237f11",
    "0.31.0": "2c44ff304f8dca676b6c83ced79b43fbbe99262a",
    "0.32.0": "8af7c9c2290f5f7a3783179d13208953c5866f1d",
    "0.33.0": "f6cc721a052dccc8204f8a50ee72f1281f004f30",
}


def version_key(version):
    return tuple(int(part) for part in version.split("."))


def released_versions():
    return sorted(RELEASE_COMMITS, key=version_key)


def current_version():
    text = (REPO / "Cargo.toml").read_text()
    return re.search(r'^version = "([^"]+)"', text, re.M).group(1)


def release_build(version):
    """The shared library and the install script of an old release, built once from its commit
    (debug builds, in a target directory of their own so the current build is not disturbed;
    a few minutes the first time, about a minute for each further release)."""
    out = RELEASES / version
    library, script = out / "pg_eventview.so", out / f"pg_eventview--{version}.sql"
    if library.exists() and script.exists():
        return library, script
    target = RELEASES / "cargo-target"
    commit = RELEASE_COMMITS[version]
    if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", commit + "^{commit}"]).returncode != 0:
        # A shallow clone: fetch the history the release commit is in.
        subprocess.run(["git", "-C", str(REPO), "fetch", "--quiet", "--unshallow"], check=False)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as src:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit],
                                 check=True, capture_output=True).stdout
        # (-m: the files dated now, not at the commit, so that cargo does not take a crate of
        # the same version built for another release as up to date.)
        subprocess.run(["tar", "-x", "-m", "-C", src], input=archive, check=True)
        env = dict(os.environ, CARGO_TARGET_DIR=str(target))
        schema = subprocess.run(["cargo", "pgrx", "schema", "pg15", "--out", str(script)],
                                cwd=src, env=env, capture_output=True, text=True)
        assert schema.returncode == 0, schema.stderr[-3000:]
        build = subprocess.run(["cargo", "build", "--lib", "--features", "pg15", "--no-default-features"],
                               cwd=src, env=env, capture_output=True, text=True)
        assert build.returncode == 0, build.stderr[-3000:]
    shutil.copyfile(target / "debug" / "libpg_eventview.so", library)
    return library, script


@pytest.fixture(scope="module", autouse=True)
def released_scripts():
    """Puts the install script of every release (and the upgrade scripts) where CREATE
    EXTENSION looks, as a user who installed those releases has them."""
    scripts = [release_build(v)[1] for v in released_versions()]
    scripts += [f for f in (REPO / "sql").glob("pg_eventview--*--*.sql")]
    for f in scripts:
        shutil.copyfile(f, EXTENSION_DIR / f.name)


@contextlib.contextmanager
def library_of(version):
    """Installs the library of release `version` in place of the current one (new connections
    load it), and puts the current one back afterwards whatever happens."""
    old, _ = release_build(version)
    backup = LIBRARY.with_name("pg_eventview.so.current")
    shutil.copyfile(LIBRARY, backup)
    try:
        shutil.copyfile(old, LIBRARY.with_name("pg_eventview.so.tmp"))
        os.replace(LIBRARY.with_name("pg_eventview.so.tmp"), LIBRARY)
        yield
    finally:
        os.replace(backup, LIBRARY)


def test_every_upgrade_step_has_its_script():
    """The upgrade scripts chain every release to the current version, one step each."""
    chain = released_versions() + [current_version()]
    for old, new in zip(chain, chain[1:]):
        assert (REPO / "sql" / f"pg_eventview--{old}--{new}.sql").exists(), f"no upgrade script from {old} to {new}"
    install_scripts = [f.name for f in (REPO / "sql").glob("pg_eventview--*.sql") if f.name.count("--") == 1]
    assert install_scripts == [], "install scripts of releases are generated from their commits, not kept in sql/"


# One line per property of the extension's objects; compared as sorted lists.
DESCRIBE = r"""
WITH ext AS (SELECT oid FROM pg_extension WHERE extname = 'pg_eventview'),
members AS (
    SELECT d.classid, d.objid FROM pg_depend d, ext
    WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'
)
SELECT 'member ' || pg_describe_object(classid, objid, 0) FROM members
UNION ALL
SELECT 'function ' || p.oid::regprocedure || E'\n'
       || CASE WHEN p.prokind = 'a'
               THEN (SELECT format('aggregate sfunc %s stype %s finalfunc %s finalfunc_modify %s initcond %s',
                                   a.aggtransfn::regprocedure, format_type(a.aggtranstype, NULL),
                                   a.aggfinalfn::regprocedure, a.aggfinalmodify, coalesce(a.agginitval, '-'))
                     FROM pg_aggregate a WHERE a.aggfnoid = p.oid)
               ELSE pg_get_functiondef(p.oid) END
       || E'\nacl ' || (SELECT string_agg(a::text, ',' ORDER BY a::text)
                         FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a)
       || E'\ncomment ' || coalesce(obj_description(p.oid, 'pg_proc'), '-')
FROM pg_proc p WHERE p.pronamespace = 'eventview'::regnamespace
UNION ALL
SELECT 'relation ' || c.relname || ' ' || c.relkind::text || ' acl '
       || coalesce((SELECT string_agg(a::text, ',' ORDER BY a::text)
                    FROM aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a), '-')
       || ' rls ' || c.relrowsecurity::text
       || ' comment ' || coalesce(obj_description(c.oid, 'pg_class'), '-')
       || CASE WHEN c.relkind = 'v' THEN E'\n' || pg_get_viewdef(c.oid) ELSE '' END
FROM pg_class c WHERE c.relnamespace = 'eventview'::regnamespace
UNION ALL
-- (Numbered by position among the columns not dropped: an update that drops a column leaves a
-- gap in attnum that a fresh install has not.)
SELECT format('column %s.%s #%s %s notnull=%s default=%s', c.relname, a.attname,
              row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum),
              format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid))
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE c.relnamespace = 'eventview'::regnamespace AND c.relkind IN ('r', 'v', 'p')
  AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'policy ' || polrelid::regclass || ' ' || polname || ' ' || polcmd::text || ' '
       || coalesce(pg_get_expr(polqual, polrelid), '-') || ' ' || coalesce(pg_get_expr(polwithcheck, polrelid), '-')
FROM pg_policy WHERE polrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'eventview'::regnamespace)
UNION ALL
SELECT format('column acl %s.%s %s', c.relname, a.attname, a.attacl::text)
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE c.relnamespace = 'eventview'::regnamespace AND a.attacl IS NOT NULL AND NOT a.attisdropped
UNION ALL
SELECT 'schema acl ' || coalesce(nspacl::text, '-') FROM pg_namespace WHERE nspname = 'eventview'
UNION ALL
SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = 'eventview'::regnamespace
UNION ALL
SELECT 'index ' || pg_get_indexdef(indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE c.relnamespace = 'eventview'::regnamespace
UNION ALL
SELECT 'config ' || extconfig::regclass[]::text || ' ' || coalesce(array_to_string(extcondition, ';'), '-')
FROM pg_extension WHERE extname = 'pg_eventview'
UNION ALL
SELECT format('event trigger %s on %s tags %s enabled %s function %s', evtname, evtevent,
              coalesce(evttags::text, '-'), evtenabled, evtfoid::regprocedure)
FROM pg_event_trigger
UNION ALL
SELECT format('trigger %s enabled %s', pg_get_triggerdef(t.oid), t.tgenabled)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = 'eventview'::regnamespace AND NOT t.tgisinternal
"""


def describe(conn):
    return sorted(r[0] for r in conn.execute(DESCRIBE).fetchall())


@pytest.mark.parametrize("old", released_versions())
def test_update_equals_a_fresh_install(cluster, new_db, old):
    assert old != current_version(), "the current version is not a release to update from"
    updated = new_db("_updated", version=old)
    fresh = new_db("_fresh")
    with cluster.connect(updated.rsplit("dbname=", 1)[1]) as u, cluster.connect(fresh.rsplit("dbname=", 1)[1]) as f:
        assert u.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_eventview'").fetchone()[0] == old
        u.execute("ALTER EXTENSION pg_eventview UPDATE")
        assert u.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_eventview'").fetchone()[0] == current_version()
        got, want = describe(u), describe(f)
        missing = [x for x in want if x not in got]
        extra = [x for x in got if x not in want]
        assert not missing and not extra, f"after UPDATE from {old}:\nmissing {missing}\nextra {extra}"


FROM_SCRATCH = """
SELECT date_bin('1 day', occurred_at AT TIME ZONE 'UTC', '2000-01-01') AT TIME ZONE 'UTC' AS bucket,
       CASE WHEN event_version = 1 THEN payload->>'sku' ELSE payload->'item'->>'sku' END AS sku,
       count(*) AS n, sum((payload->>'qty')::numeric) AS q, max((payload->>'qty')::numeric) AS hi,
       count(DISTINCT payload->'user') AS u
FROM shop.events WHERE event_type = 'cart'
GROUP BY 1, 2 ORDER BY 1, 2 NULLS FIRST
"""

VIEW = "SELECT bucket, sku, n, q, hi, u FROM shop.by_sku ORDER BY 1, 2 NULLS FIRST"


def insert_events(c, first, last, day):
    c.execute(
        """INSERT INTO shop.events (event_type, event_version, occurred_at, payload)
           SELECT 'cart', 1 + i %% 2, %s::timestamptz + i * interval '1 hour',
                  CASE WHEN i %% 2 = 0 THEN jsonb_build_object('sku', 's' || i %% 7, 'qty', i %% 5, 'user', i %% 3)
                       ELSE jsonb_build_object('item', jsonb_build_object('sku', 's' || i %% 7), 'qty', i %% 5, 'user', i %% 3) END
           FROM generate_series(%s::int, %s::int) i""",
        [day, first, last],
    )


@pytest.mark.parametrize("old", released_versions())
def test_views_carry_on_across_the_update(cluster, new_db, old):
    # Created and used by the old release, library and catalog, as a user has it.
    with library_of(old):
        info = new_db(version=old)
        with cluster.connect(info.rsplit("dbname=", 1)[1]) as c:
            c.execute("SET TimeZone = 'UTC'")
            c.execute("CREATE SCHEMA shop")
            c.execute("SELECT eventview.create_event_table('shop.events')")
            c.execute("SELECT eventview.define_field('shop.events', 'sku', '$.sku')")
            c.execute("SELECT eventview.define_field('shop.events', 'sku', '$.item.sku', version => 2)")
            c.execute("""SELECT eventview.create_view('shop.by_sku', 'shop.events', group_by => '{"sku": "sku"}',
                         measures => '{"n": "count(*)", "q": "sum($.qty)", "hi": "max($.qty)", "u": "count_distinct($.user)"}',
                         event_types => ARRAY['cart'], time_bucket => '1 day')""")
            c.execute("""SELECT eventview.create_view('shop.deep', 'shop.events', group_by => '{"k": "$..k"}',
                         measures => '{"n": "count(*)"}')""")
            c.execute("SELECT eventview.schedule('shop.by_sku', '1 minute')")
            # Dropped behind the API's back: releases before 0.9.0 kept its catalog row.
            c.execute("""SELECT eventview.create_view('shop.gone', 'shop.events', measures => '{"hi": "max($.qty)"}')""")
            gone_id = c.execute("SELECT view_id FROM eventview._views WHERE relid = 'shop.gone'::regclass").fetchone()[0]
            c.execute("DROP VIEW shop.gone")
            # Event tables dropped behind the API's back: every release before 0.13.0 kept their
            # catalog rows, changelogs and capture functions; one of them has a view.
            c.execute("SELECT eventview.create_event_table('shop.dropped')")
            c.execute("SELECT eventview.create_event_table('shop.dropped_read')")
            c.execute("SELECT eventview.create_view('shop.on_dropped', 'shop.dropped_read')")
            c.execute("DROP TABLE shop.dropped, shop.dropped_read")
            if version_key(old) >= (0, 13, 0):
                c.execute("""SELECT eventview.create_view('shop.live', 'shop.events', measures => '{"n": "count(*)"}',
                             realtime => true)""")
            if version_key(old) >= (0, 20, 0):
                # approx_percentile kept its sketch in a value multiset before 0.21.0.
                for name, live in (("shop.lat", "false"), ("shop.lat_live", "true")):
                    c.execute(f"""SELECT eventview.create_view('{name}', 'shop.events', group_by => '{{"sku": "sku"}}',
                                 measures => '{{"n": "count(*)", "p90": "approx_percentile($.qty, 0.9)"}}',
                                 realtime => {live})""")
            insert_events(c, 1, 200, "2026-11-01")
            c.execute("SELECT eventview.refresh('shop.by_sku')")
            assert c.execute(VIEW).fetchall() == c.execute(FROM_SCRATCH).fetchall()
            # Pending at update time: inserts, an update, a delete (of the current maximum).
            insert_events(c, 201, 300, "2026-11-10")
            c.execute("UPDATE shop.events SET payload = payload || '{\"qty\": 40}' WHERE event_id = 3")
            c.execute("DELETE FROM shop.events WHERE event_id = 4")

    with cluster.connect(info.rsplit("dbname=", 1)[1]) as c:
        c.execute("SET TimeZone = 'UTC'")
        # The new library on the old catalog: producers go on, the API asks for the update.
        insert_events(c, 301, 320, "2026-11-15")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as refused:
            c.execute("SELECT eventview.refresh('shop.by_sku')")
        assert "ALTER EXTENSION pg_eventview UPDATE" in refused.value.diag.message_hint
        # The functions only old releases declare are there to let their SQL load this library:
        # called, they say the same.
        stubs = [r[0] for r in c.execute(
            """SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'eventview'::regnamespace
               AND p.proname IN ('_refresh_all', '_payload_shapes')""").fetchall()]
        for stub in stubs:
            call = ("SELECT eventview._refresh_all()" if stub == "_refresh_all"
                    else "SELECT * FROM eventview._payload_shapes(ARRAY['cart'], ARRAY[1], ARRAY['{}'])")
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as stale:
                c.execute(call)
            assert "ALTER EXTENSION pg_eventview UPDATE" in stale.value.diag.message_hint
        assert bool(stubs) == (version_key(old) <= (0, 6, 0))

        c.execute("ALTER EXTENSION pg_eventview UPDATE")
        assert c.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_eventview'").fetchone()[0] == current_version()
        # The view dropped behind the API's back is forgotten, storage and all.
        assert c.execute("SELECT count(*) FROM eventview._views WHERE view_id = %s", (gone_id,)).fetchone()[0] == 0
        assert c.execute("SELECT count(*) FROM pg_class WHERE relnamespace = 'eventview'::regnamespace AND relname ~ %s",
                         (f"^_v{gone_id}_",)).fetchone()[0] == 0
        # The dropped event table no view reads is forgotten; the view of the other says why it
        # can no longer be refreshed, and its drop_view forgets that table too.
        assert c.execute("SELECT count(*) FROM eventview._sources").fetchone()[0] == 2
        assert c.execute("SELECT last_error FROM eventview.views WHERE name = 'shop.on_dropped'::regclass").fetchone()[0] == \
            "the event table of view shop.on_dropped was dropped"
        assert c.execute("SELECT count(*) FROM eventview._sources WHERE relid::oid = 0").fetchone()[0] == 1
        c.execute("SELECT eventview.drop_view('shop.on_dropped')")
        assert c.execute("SELECT count(*) FROM eventview._sources").fetchone()[0] == 1
        assert c.execute("""SELECT count(*) FROM pg_class WHERE relnamespace = 'eventview'::regnamespace
                            AND relname ~ '^_changes_[23]'""").fetchone()[0] == 0
        if version_key(old) >= (0, 20, 0):
            # Their sketches move into the storage rows at the first refresh; both views agree
            # with percentile_disc within 1% before and after.
            exact = """SELECT coalesce(payload ->> 'sku', payload #>> '{item,sku}') AS sku,
                              percentile_disc(0.9) WITHIN GROUP (ORDER BY (payload -> 'qty')::numeric) AS e
                       FROM shop.events GROUP BY 1"""
            close = f"""SELECT count(*) FROM shop.%s v JOIN ({exact}) x ON x.sku IS NOT DISTINCT FROM v.sku
                         WHERE NOT abs(v.p90 - x.e) <= 0.01 * abs(x.e) + 1e-9"""
            assert c.execute(close % "lat_live").fetchone()[0] == 0
            c.execute("SELECT eventview.refresh('shop.lat')")
            c.execute("SELECT eventview.refresh('shop.lat_live')")
            assert c.execute(close % "lat").fetchone()[0] == 0
            assert c.execute(close % "lat_live").fetchone()[0] == 0
            assert c.execute("""SELECT count(*) FROM pg_class c JOIN eventview._views v ON c.relname ~ ('^_v' || v.view_id || '_m')
                                WHERE c.relnamespace = 'eventview'::regnamespace
                                  AND v.relid IN ('shop.lat'::regclass, 'shop.lat_live'::regclass)""").fetchone()[0] == 0
        # Views made before 0.9.0 are read-only too.
        with pytest.raises(psycopg.errors.WrongObjectType):
            c.execute("DELETE FROM shop.by_sku")

        # Every SECURITY DEFINER function in SQL or PL/pgSQL, capture functions of existing
        # tables included, pins search_path after the update; the first API call made the insert
        # capture of the existing table the native one, which needs no pinned search_path.
        unpinned = c.execute("""SELECT p.oid::regprocedure::text FROM pg_proc p
                                WHERE p.pronamespace = 'eventview'::regnamespace AND p.prosecdef
                                  AND p.prolang <> (SELECT oid FROM pg_language WHERE lanname = 'c')
                                  AND NOT coalesce(p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp'], false)""").fetchall()
        assert unpinned == []
        assert c.execute("""SELECT l.lanname::text, p.prosrc, p.proconfig FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                            WHERE p.oid = 'eventview._capture_1_insert()'::regprocedure""").fetchall() == [
            ("c", "capture_inserted_rows", None)]
        assert c.execute("""SELECT count(*) FROM pg_proc WHERE pronamespace = 'eventview'::regnamespace
                            AND prosecdef AND proname ~ '^_capture_'""").fetchone()[0] == 4

        # Changelogs got the (xid, seq) index (on the partitioned changelog from 0.19.0 on; an
        # older one is partitioned by the first prune), and nothing made at run time became a
        # member of the extension (DROP EXTENSION must keep it).
        on = "ON ONLY" if version_key(old) >= (0, 19, 0) else "ON"
        assert c.execute("""SELECT indexdef FROM pg_indexes WHERE schemaname = 'eventview'
                            AND tablename ~ '^_changes_[0-9]+$'""").fetchall() == [
            (f"CREATE INDEX _changes_1_xid_seq_idx {on} eventview._changes_1 USING btree (xid, seq)",)]
        # and store the id arrays of inserts uncompressed, as new changelogs do; view storage
        # leaves room for updates in place, as new views' does.
        assert c.execute("""SELECT attstorage FROM pg_attribute
                            WHERE attrelid = 'eventview._changes_1'::regclass AND attname = 'event_ids'""").fetchone()[0] == "e"
        storage = c.execute("""SELECT relname, reloptions FROM pg_class WHERE relnamespace = 'eventview'::regnamespace
                               AND relname ~ '^_v[0-9]+_(data|m[0-9]+)$' ORDER BY relname""").fetchall()
        # (shop.by_sku: storage and two multisets (max, count_distinct); shop.deep: storage;
        # shop.live: storage; shop.lat and shop.lat_live: storage, their sketches in it.)
        expected = (5 if version_key(old) >= (0, 13, 0) else 4) + (2 if version_key(old) >= (0, 20, 0) else 0)
        assert len(storage) == expected and all(options == ["fillfactor=70"] for _, options in storage), storage
        # A min/max multiset has its value log, as a new view's has (count_distinct keeps none),
        # owned as the multiset and not a member of the extension (checked below).
        logs = c.execute("""SELECT l.relname, l.relowner = m.relowner FROM pg_class l
                            JOIN pg_class m ON m.relnamespace = l.relnamespace AND m.relname || '_log' = l.relname
                            WHERE l.relnamespace = 'eventview'::regnamespace AND l.relname ~ '_log$'""").fetchall()
        assert logs == [("_v1_m3_log", True)], logs
        columns = """SELECT attname, atttypid, attnotnull FROM pg_attribute
                     WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum"""
        assert c.execute(columns, ["eventview._v1_m3_log"]).fetchall() == c.execute(columns, ["eventview._v1_m3"]).fetchall()
        assert c.execute("""SELECT count(*) FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
                            WHERE e.extname = 'pg_eventview' AND d.deptype = 'e' AND d.classid = 'pg_class'::regclass
                              AND d.objid IN (SELECT oid FROM pg_class WHERE relname ~ '^_(changes|v)[0-9]')""").fetchone()[0] == 0

        assert c.execute("SELECT eventview.refresh('shop.by_sku')").fetchone()[0] > 0
        assert c.execute(VIEW).fetchall() == c.execute(FROM_SCRATCH).fetchall()
        # That refresh gave the view its read index and the user relation the form that lets a
        # bucket range use the key index (tests/test_reads.py checks the plans).
        indexdef = c.execute("""SELECT indexdef FROM pg_indexes
                                WHERE schemaname = 'eventview' AND indexname = '_v1_data_read'""").fetchone()[0]
        assert " ".join(indexdef.split()) == (
            "CREATE INDEX _v1_data_read ON eventview._v1_data USING btree "
            "(( CASE WHEN g1_null THEN NULL::text ELSE g1 END), bucket)"), indexdef
        assert "WHERE _v1_data.__k" in c.execute("SELECT pg_get_viewdef('shop.by_sku'::regclass)").fetchone()[0]
        # That first API call took EXECUTE on the old capture functions from PUBLIC (no other
        # table's trigger may borrow them).
        assert c.execute("""SELECT count(*) FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                            WHERE p.pronamespace = 'eventview'::regnamespace AND p.proname ~ '^_capture_'
                              AND a.grantee = 0""").fetchone()[0] == 0
        # That first API call replaced the old delete capture: eventview.pruning no longer
        # switches capture off for rows within retention.
        c.execute("SET eventview.pruning = on")
        c.execute("DELETE FROM shop.events WHERE event_id = 5")
        c.execute("RESET eventview.pruning")
        c.execute("SELECT eventview.refresh('shop.by_sku')")
        assert c.execute(VIEW).fetchall() == c.execute(FROM_SCRATCH).fetchall()
        in_row = """SELECT count(*) FILTER (WHERE m3_vals IS NULL AND bucket < '2026-11-10'),
                           count(*) FILTER (WHERE m3_vals IS NOT NULL AND bucket < '2026-11-10'),
                           count(*) FILTER (WHERE m3_vals IS NOT NULL AND bucket >= '2026-11-10')
                    FROM eventview._v1_data"""
        old_groups, old_in_row, new_in_row = c.execute(in_row).fetchone()
        if version_key(old) < (0, 31, 0):
            # The groups the old release made keep their max values in the multiset (NULL in
            # the storage column the first refresh after the update added); the groups made
            # since keep theirs in their rows.
            assert old_groups > 0 and old_in_row == 0 and new_in_row > 0
            # Capture continues, into the old groups (their values go to the log).
            insert_events(c, 321, 350, "2026-10-20")
            assert c.execute("SELECT count(*) FROM eventview._v1_m3_log").fetchone()[0] == 0
            c.execute("SELECT eventview.refresh('shop.by_sku')")
            assert c.execute("SELECT count(*) FROM eventview._v1_m3_log").fetchone()[0] > 0
            assert c.execute(in_row).fetchone()[:2] == (old_groups, 0)
        else:
            # The old release kept the values of small groups in their rows already: the groups
            # it made and those made since keep them there.
            assert old_in_row > 0 and new_in_row > 0
            insert_events(c, 321, 350, "2026-10-20")
            c.execute("SELECT eventview.refresh('shop.by_sku')")
            assert c.execute(VIEW).fetchall() == c.execute(FROM_SCRATCH).fetchall()
        # Retraction of an extreme after the update.
        c.execute("DELETE FROM shop.events WHERE event_id = 3")
        c.execute("SELECT eventview.refresh('shop.by_sku')")
        assert c.execute("SELECT count(*) FROM eventview._v1_m3_log").fetchone()[0] == 0
        assert c.execute(VIEW).fetchall() == c.execute(FROM_SCRATCH).fetchall()
        # Declarations and schedules survived; scheduling runs.
        assert c.execute("SELECT schedule FROM eventview.views WHERE name = 'shop.by_sku'::regclass").fetchone()[0] is not None
        c.execute("SELECT eventview.run_maintenance()")
        assert c.execute("SELECT relkind::text FROM pg_class WHERE oid = 'eventview._changes_1'::regclass").fetchone()[0] == "p"
        partitions = c.execute("""SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i
                                  JOIN pg_class c ON c.oid = i.inhrelid
                                  WHERE i.inhparent = 'eventview._changes_1'::regclass ORDER BY 1""").fetchall()
        if version_key(old) < (0, 19, 0):
            # Its prune made the changelog, a plain table until then, the default partition of a
            # partitioned one (holding the records not pruned yet), with a segment for new ones.
            assert [p[0] for p in partitions][0] == "_changes_1_default" and len(partitions) == 2, partitions
            assert c.execute("SELECT count(*) FROM eventview._changes_1_default").fetchone()[0] > 0
        else:
            # Partitioned from the start: the records are in segments, one made ahead.
            assert [p[0] for p in partitions][0] == "_changes_1_default" and len(partitions) >= 3, partitions
            assert c.execute("SELECT count(*) FROM eventview._changes_1_default").fetchone()[0] == 0
        default_before = c.execute("SELECT count(*) FROM eventview._changes_1_default").fetchone()[0]
        assert c.execute("""SELECT count(*) FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
                            WHERE e.extname = 'pg_eventview' AND d.deptype = 'e' AND d.classid = 'pg_class'::regclass
                              AND d.objid IN (SELECT oid FROM pg_class WHERE relname ~ '^_changes')""").fetchone()[0] == 0
        # New records go to segments, not to the default partition.
        insert_events(c, 351, 360, "2026-11-25")
        assert c.execute("SELECT count(*) FROM eventview._changes_1_default").fetchone()[0] == default_before
        if version_key(old) >= (0, 13, 0):
            # A realtime read sees the new records (its read was installed again: it names the
            # changelog by oid).
            assert c.execute("SELECT n FROM shop.live").fetchone()[0] == c.execute("SELECT count(*) FROM shop.events").fetchone()[0]
        c.execute("SELECT eventview.refresh('shop.by_sku')")
        assert c.execute(VIEW).fetchall() == c.execute(FROM_SCRATCH).fetchall()
        # Behaviour of the new version on a view made by the old one: a payload too deep for a
        # rich path is quarantined, not a refresh error.
        c.execute("""INSERT INTO shop.events (event_type, payload)
                     VALUES ('other', (repeat('{"a":', 200) || '{"k": 1}' || repeat('}', 200))::jsonb)""")
        c.execute("SELECT eventview.refresh('shop.deep')")
        reasons = [r[0] for r in c.execute(
            "SELECT reason FROM eventview.quarantine WHERE view_name = 'shop.deep'").fetchall()]
        assert reasons == ["JSONPath $..k cannot be evaluated: the payload is nested deeper than 127 levels"]


CITUS_LIB = Path(subprocess.check_output([PG_CONFIG, "--pkglibdir"], text=True).strip()) / "citus.so"


@contextlib.contextmanager
def citus_cluster(ports):
    """A coordinator and two workers of a new Citus cluster on `ports`, without pg_eventview;
    stopped and removed afterwards whatever happens."""
    from test_citus import start_node

    nodes = []
    try:
        for port in ports:
            nodes.append(start_node(port))
        coordinator, workers = nodes[0], nodes[1:]
        with coordinator.connect() as c:
            c.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", (coordinator.port,))
            for w in workers:
                c.execute("SELECT citus_add_node('127.0.0.1', %s)", (w.port,))
        yield coordinator, workers
    finally:
        for node in nodes:
            subprocess.run(["bash", str(REPO / "scripts" / "cluster.sh"), "stop", node.dir], check=False)
            shutil.rmtree(node.dir, ignore_errors=True)


@pytest.mark.skipif(not CITUS_LIB.exists(), reason=f"Citus is not installed for PostgreSQL 15 ({CITUS_LIB} is missing)")
def test_the_update_on_citus_gives_each_node_its_own_capture_back():
    """A Citus coordinator with event tables of its own, numbered as shards' event tables on the
    workers (or as none there), made and dropped with 0.26.0's library, which let Citus make
    their capture functions on every worker. The update, which Citus runs on every node, gives
    each node its own capture back (and names a shard left without capture), and the
    coordinator's table then leaves the shards' alone."""
    with citus_cluster((55621, 55622, 55623)) as (coordinator, workers):
        events = """INSERT INTO {} (event_type, payload)
                    SELECT 'order', jsonb_build_object('sku', 's' || i %% 3, 'qty', i) FROM generate_series(%s::int, %s::int) i"""
        with library_of("0.26.0"):
            with coordinator.connect() as c:
                c.execute("CREATE EXTENSION pg_eventview VERSION '0.26.0'")
                c.execute("SET citus.shard_count = 4")
                for table in ("dup", "dup2"):
                    c.execute(f"SELECT eventview.create_event_table('{table}', distribute_by => 'event_id')")
                    c.execute(f"""SELECT eventview.create_view('{table}_n', '{table}', group_by => '{{"sku": "$.sku"}}',
                                      measures => '{{"n": "count(*)", "q": "sum($.qty)"}}')""")
                    c.execute(events.format(table), (1, 40))
                    c.execute(f"SELECT eventview.refresh('{table}_n')")
                numbers = {}
                for w in workers:
                    with w.connect() as wc:
                        numbers[w.port] = dict(wc.execute("""SELECT regexp_replace(relid::text, '_[0-9]+$', ''), min(source_id)
                                                             FROM eventview._sources GROUP BY 1""").fetchall())
                # Both workers number their shards of dup, then those of dup2, alike.
                assert numbers[workers[0].port] == numbers[workers[1].port], numbers
                number, gone = numbers[workers[0].port]["dup"], numbers[workers[0].port]["dup2"]
                orphan = number * 10
                c.execute("CREATE ROLE dup_other")
                # The coordinator's event tables: one numbered as a shard's of dup, one as no
                # event table on the workers, and one as a shard's of dup2, dropped.
                sequence = "SELECT setval(pg_get_serial_sequence('eventview._sources', 'source_id'), %s, false)"
                c.execute(sequence, (number,))
                c.execute("SELECT eventview.create_event_table('dup_local', partition_interval => '1 day')")
                c.execute("ALTER TABLE dup_local OWNER TO dup_other")
                c.execute(sequence, (orphan,))
                c.execute("SELECT eventview.create_event_table('dup_orphan')")
                c.execute(sequence, (gone,))
                c.execute("SELECT eventview.create_event_table('dup_gone')")
                c.execute("SELECT eventview.drop_event_table('dup_gone')")
        capture = """SELECT p.proname::text, p.proowner::regrole::text,
                            EXISTS (SELECT FROM pg_dist_object d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid)
                     FROM pg_proc p WHERE p.pronamespace = 'eventview'::regnamespace
                       AND p.proname IN (%s, %s, %s, %s) ORDER BY 1"""
        names = (f"_capture_{number}_insert", f"_capture_{number}_keys", f"_capture_{orphan}_insert", f"_capture_{gone}_insert")
        for w in workers:
            with w.connect() as wc:
                # What 0.26.0 left on the worker (else this test shows nothing).
                assert wc.execute(capture, names).fetchall() == sorted([
                    (f"_capture_{number}_insert", "dup_other", True), (f"_capture_{number}_keys", "dup_other", True),
                    (f"_capture_{orphan}_insert", "postgres", True)])
        with coordinator.connect() as c:
            c.execute("ALTER EXTENSION pg_eventview UPDATE")
            assert c.execute(capture, names).fetchall() == sorted([
                (f"_capture_{number}_insert", "dup_other", False), (f"_capture_{number}_keys", "dup_other", False),
                (f"_capture_{orphan}_insert", "postgres", False)])
        # On each worker, its shard of dup2 numbered as the dropped table is named (in the
        # worker's log: Citus does not pass on what the update says on a worker).
        for w in workers:
            named = [line for line in w.server_log_tail(400).splitlines() if "has no capture" in line]
            assert len(named) == 1 and "event table public.dup2_" in named[0], named
        for w in workers:
            with w.connect() as wc:
                assert wc.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_eventview'").fetchone() == (current_version(),)
                # The shard's capture is its table's owner's again, and the functions of no
                # event table of the worker (and the key function of a table that is not
                # partitioned) are gone.
                assert wc.execute(capture, names).fetchall() == [(f"_capture_{number}_insert", "postgres", False)]
        with coordinator.connect() as c:
            # The coordinator's table dropped, the shards' capture stays.
            c.execute("SELECT eventview.drop_event_table('dup_local')")
            c.execute(events.format("dup"), (41, 100))
            c.execute("DELETE FROM dup WHERE (payload->>'qty')::int % 7 = 0")
            c.execute("SELECT eventview.refresh('dup_n')")
            got = c.execute("SELECT sku, n, q FROM dup_n ORDER BY 1").fetchall()
            want = c.execute("""SELECT payload->>'sku', count(*), sum((payload->>'qty')::numeric)
                                FROM dup GROUP BY 1 ORDER BY 1""").fetchall()
            assert got == want and len(got) == 3
            for w in workers:
                with w.connect() as wc:
                    assert wc.execute(capture, names).fetchall() == [(f"_capture_{number}_insert", "postgres", False)]


@pytest.mark.skipif(not CITUS_LIB.exists(), reason=f"Citus is not installed for PostgreSQL 15 ({CITUS_LIB} is missing)")
def test_the_update_on_citus_drops_the_read_index_of_every_shards_view():
    """Shards' views made with 0.28.0's library keep their partial groups with a read index that
    no read uses. The update, which Citus runs on every node, drops it there; refreshes do not
    make it again and keep the view equal to the aggregate from scratch."""
    from test_citus import SHARD_VIEW_INDEXES, workers_count

    with citus_cluster((55627, 55628, 55629)) as (coordinator, workers):
        events = """INSERT INTO ri (event_type, occurred_at, payload)
                    SELECT 'order', '2026-03-01'::timestamptz + i * interval '1 hour',
                           jsonb_build_object('sku', 's' || i %% 5, 'qty', i)
                    FROM generate_series(%s::int, %s::int) i"""
        with library_of("0.28.0"):
            with coordinator.connect() as c:
                c.execute("CREATE EXTENSION pg_eventview VERSION '0.28.0'")
                c.execute("SET citus.shard_count = 4")
                c.execute("SELECT eventview.create_event_table('ri', distribute_by => 'event_id')")
                c.execute("""SELECT eventview.create_view('ri_n', 'ri', group_by => '{"sku": "$.sku"}',
                                  measures => '{"n": "count(*)", "q": "sum($.qty)"}', time_bucket => '1 day')""")
                c.execute(events, (1, 60))
                c.execute("SELECT eventview.refresh('ri_n')")
                # What 0.28.0 made on the workers (else this test shows nothing).
                assert sum(workers_count(c, SHARD_VIEW_INDEXES.format("read"))) == 4
        # The update of a worker's own (Citus lets only the coordinator run it unless DDL
        # propagation is off), in a transaction that goes on: it drops the worker's read indexes
        # and leaves the settings it changes to reach the shards as they were.
        settings = ("SELECT current_setting('citus.enable_ddl_propagation'), "
                    "current_setting('citus.enable_manual_changes_to_shards'), "
                    "current_setting('citus.show_shards_for_app_name_prefixes')")
        with workers[0].connect() as wc:
            with wc.transaction(force_rollback=True):
                wc.execute("SET LOCAL citus.enable_ddl_propagation = off")
                before = wc.execute(settings).fetchone()
                assert before[1:] == ("off", ""), before
                wc.execute("ALTER EXTENSION pg_eventview UPDATE")
                assert wc.execute(settings).fetchone() == before
                assert wc.execute(SHARD_VIEW_INDEXES.format("read")).fetchone()[0] == 0
            assert wc.execute(SHARD_VIEW_INDEXES.format("read")).fetchone()[0] > 0
        with coordinator.connect() as c:
            c.execute("ALTER EXTENSION pg_eventview UPDATE")
            assert sum(workers_count(c, SHARD_VIEW_INDEXES.format("read"))) == 0
            assert sum(workers_count(c, SHARD_VIEW_INDEXES.format("key"))) == 4
            assert workers_count(c, "SELECT (extversion = '%s')::int FROM pg_extension WHERE extname = 'pg_eventview'"
                                 % current_version()) == [1, 1]
            c.execute(events, (61, 150))
            c.execute("DELETE FROM ri WHERE (payload->>'qty')::int % 7 = 0")
            c.execute("SELECT eventview.refresh('ri_n')")
            assert sum(workers_count(c, SHARD_VIEW_INDEXES.format("read"))) == 0
            got = c.execute("SELECT bucket, sku, n, q FROM ri_n ORDER BY 1, 2").fetchall()
            want = c.execute("""SELECT date_bin('1 day', occurred_at, '2000-01-01 00:00:00+00'), payload->>'sku',
                                       count(*), sum((payload->>'qty')::numeric)
                                FROM ri GROUP BY 1, 2 ORDER BY 1, 2""").fetchall()
            assert got == want and len(got) > 5
            # Reads by group key still use the coordinator's read index.
            c.execute("SET enable_seqscan = off")
            plan = "\n".join(r[0] for r in c.execute("EXPLAIN SELECT * FROM ri_n WHERE sku = 's1'").fetchall())
            assert "_data_read" in plan, plan


def test_the_update_to_0_30_0_asks_views_with_an_index_in_a_path_to_be_rebuilt(cluster, new_db):
    """From 0.30.0 a JSONPath index selects only array elements (0.29.0's library took a scalar
    for an array of one). The update asks the views with an index in a path of theirs, or of a
    logical field of their table, to be rebuilt once; a rebuild recomputes them as the aggregate
    from scratch, and clears the note."""
    with library_of("0.29.0"):
        info = new_db(version="0.29.0")
        with cluster.connect(info.rsplit("dbname=", 1)[1]) as c:
            c.execute("SELECT eventview.create_event_table('ev')")
            c.execute("SELECT eventview.create_event_table('other')")
            c.execute("SELECT eventview.define_field('other', 'last_y', '$.y[-1]')")
            c.execute("""SELECT eventview.create_view('ix', 'ev', group_by => '{"first": "$.x[0]"}',
                         measures => '{"n": "count(*)"}')""")
            c.execute("""SELECT eventview.create_view('plain', 'ev', group_by => '{"x": "$.x"}')""")
            c.execute("""SELECT eventview.create_view('by_field', 'other', group_by => '{"y": "last_y"}')""")
            c.execute("""INSERT INTO ev (event_type, payload) VALUES
                         ('t', '{"x": "str"}'), ('t', '{"x": ["a"]}'), ('t', '{"x": ["str"]}')""")
            c.execute("SELECT eventview.refresh('ix')")
            assert sorted(c.execute("SELECT first, n FROM ix").fetchall()) == [("a", 1), ("str", 2)]
    with cluster.connect(info.rsplit("dbname=", 1)[1]) as c:
        c.execute("ALTER EXTENSION pg_eventview UPDATE")
        notes = dict(c.execute("SELECT relid::text, rebuild_note FROM eventview._views").fetchall())
        assert notes["plain"] is None
        for name in ("ix", "by_field"):
            assert notes[name].startswith("pg_eventview 0.30.0 selects only array elements with a JSONPath index"), notes
        c.execute("SELECT eventview.rebuild('ix')")
        assert sorted(c.execute("SELECT first, n FROM ix").fetchall(), key=repr) == sorted(
            [(None, 1), ("a", 1), ("str", 1)], key=repr)
        assert c.execute("SELECT rebuild_note FROM eventview._views WHERE relid = 'ix'::regclass").fetchone()[0] is None
