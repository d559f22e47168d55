"""A long recomputation reports its progress: a full rebuild (and the initial
fill of create_view over existing events) raises a NOTICE every 100,000 events read, with the
share of the table's estimated size, and says when it is done."""

import re


def test_rebuild_reports_progress(cluster, db):
    with cluster.connect(db.rsplit("dbname=", 1)[1]) as c:
        notices = []
        c.add_notice_handler(lambda d: notices.append(d.message_primary))
        c.execute("SELECT eventview.create_event_table('big')")
        # Statistics as this test makes them (autovacuum would estimate the rows anew at times
        # of its own, and not always closely: a VACUUM counts only the pages it reads).
        c.execute("ALTER TABLE big SET (autovacuum_enabled = off)")
        c.execute("""INSERT INTO big (event_type, payload)
                     SELECT 'e', jsonb_build_object('k', i % 10) FROM generate_series(1, 250000) i""")
        c.execute("ANALYZE big")
        c.execute("""SELECT eventview.create_view('big_by_k', 'big', group_by => '{"k": "$.k"}',
                     measures => '{"n": "count(*)"}')""")
        filled = [n for n in notices if "recomputing public.big_by_k" in n]
        assert filled[:2] == [
            "recomputing public.big_by_k: 100000 events read of about 250000 (40%)",
            "recomputing public.big_by_k: 200000 events read of about 250000 (80%)",
        ], notices
        assert re.fullmatch(r"recomputing public\.big_by_k: done, 250000 events read in [0-9.]+ s", filled[2]), filled

        notices.clear()
        c.execute("SELECT eventview.rebuild('big_by_k')")
        assert [n for n in notices if "events read of about" in n] == [
            "recomputing public.big_by_k: 100000 events read of about 250000 (40%)",
            "recomputing public.big_by_k: 200000 events read of about 250000 (80%)",
        ], notices
        assert c.execute("SELECT sum(n) FROM big_by_k").fetchone()[0] == 250000

        # Statistics gone stale (the table doubled since ANALYZE): the estimate follows the
        # table's current size, as the planner's does, and no count passes it.
        c.execute("""INSERT INTO big (event_type, payload)
                     SELECT 'e', jsonb_build_object('k', i % 10) FROM generate_series(1, 250000) i""")
        notices.clear()
        c.execute("SELECT eventview.rebuild('big_by_k')")
        shares = [re.fullmatch(r"recomputing public\.big_by_k: (\d+) events read of about (\d+) \(\d+%\)", n)
                  for n in notices if "events read of about" in n]
        assert len(shares) == 4 and all(shares), notices
        assert all(450000 <= int(m.group(2)) <= 550000 for m in shares), notices

        # An incremental refresh reads only its delta and reports nothing.
        notices.clear()
        c.execute("INSERT INTO big (event_type, payload) VALUES ('e', '{\"k\": 1}')")
        c.execute("SELECT eventview.refresh('big_by_k')")
        assert not [n for n in notices if "recomputing" in n], notices
