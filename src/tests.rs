//! In-backend unit tests (`cargo pgrx test`): what needs a running Postgres. Each test runs in
//! one transaction, which also exercises refreshing changes made by the refreshing transaction
//! itself. User-visible output is covered by pg_regress; concurrency by tests/ (pytest).

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn scalar_i64(sql: &str) -> i64 {
        Spi::get_one::<i64>(sql).unwrap().unwrap()
    }

    fn scalar_text(sql: &str) -> String {
        Spi::get_one::<String>(sql).unwrap().unwrap()
    }

    fn setup_events() {
        Spi::run("SELECT eventview.create_event_table('ut_events')").unwrap();
        Spi::run(
            "INSERT INTO ut_events (event_type, event_version, occurred_at, payload) VALUES
               ('a', 1, '2026-11-30 10:00+00', '{\"sku\": \"x\", \"qty\": 1, \"p\": 5}'),
               ('a', 1, '2026-11-30 10:30+00', '{\"sku\": \"x\", \"qty\": 2, \"p\": 7}'),
               ('a', 2, '2026-11-30 11:00+00', '{\"item\": {\"sku\": \"y\"}, \"qty\": 4, \"p\": 1}'),
               ('b', 1, '2026-11-30 11:00+00', '{\"sku\": null, \"tags\": [\"t1\", \"t2\"]}')",
        )
        .unwrap();
    }

    /// The view equals the same aggregate computed from scratch (EXCEPT ALL both ways).
    fn assert_matches(view: &str, scratch: &str) {
        let diff = scalar_i64(&format!(
            "SELECT count(*) FROM ((SELECT * FROM {view} EXCEPT ALL {scratch})
                                   UNION ALL ({scratch} EXCEPT ALL SELECT * FROM {view})) d"
        ));
        assert_eq!(diff, 0, "{view} differs from scratch");
    }

    /// Rows `rows` (`(event_type, occurred_at, payload), ...`) inserted into event table `table`.
    fn insert_events(table: &str, rows: &str) {
        Spi::run(&format!(
            "INSERT INTO {table} (event_type, occurred_at, payload) VALUES {rows}"
        ))
        .unwrap()
    }

    /// The catalog record of the view whose relation is `name`.
    fn view_record(name: &str) -> crate::catalog::ViewRecord {
        let relid = crate::relation::resolve(name).unwrap();
        crate::catalog::view_by_relid(relid, false)
            .unwrap()
            .unwrap()
    }

    /// View `name` of this node made to write its group changes to a group changelog, as a
    /// shard's view of a distributed view does; returns its record as it is then.
    fn writing_group_changes(name: &str) -> crate::catalog::ViewRecord {
        let view = view_record(name);
        Spi::run(
            &crate::view_objects::sql_of(&view)
                .create_changes()
                .join(";\n"),
        )
        .unwrap();
        crate::catalog::set_feeds_rollups(view.view_id, true).unwrap();
        view_record(name)
    }

    #[pg_test]
    fn own_transaction_is_never_visible_in_the_refresh_snapshot() {
        Spi::run("CREATE TEMP TABLE t_force_xid (x int); INSERT INTO t_force_xid VALUES (1)")
            .unwrap();
        let visible = Spi::get_one::<bool>(
            "SELECT pg_visible_in_snapshot(pg_current_xact_id(), eventview._snapshot_without_own())",
        )
        .unwrap();
        assert_eq!(visible, Some(false));
    }

    #[pg_test]
    fn refresh_in_the_writing_transaction_applies_each_change_once() {
        setup_events();
        Spi::run(
            "SELECT eventview.create_view('ut_v', 'ut_events', group_by => '{\"sku\": \"$.sku\"}',
               measures => '{\"n\": \"count(*)\", \"q\": \"sum($.qty)\", \"hi\": \"max($.p)\", \"lo\": \"min($.p)\"}')",
        )
        .unwrap();
        let scratch = "SELECT CASE WHEN jsonb_typeof(payload->'sku') IN ('string','number','boolean') THEN payload->>'sku' END,
                              count(*), sum((payload->>'qty')::numeric), max((payload->>'p')::numeric), min((payload->>'p')::numeric)
                       FROM ut_events GROUP BY 1";
        assert_matches("ut_v", scratch);
        Spi::run("INSERT INTO ut_events (event_type, payload) VALUES ('a', '{\"sku\": \"x\", \"qty\": 10, \"p\": 9}')").unwrap();
        Spi::run("DELETE FROM ut_events WHERE payload @> '{\"p\": 7}'").unwrap();
        Spi::run(
            "UPDATE ut_events SET payload = payload || '{\"p\": 3}' WHERE payload @> '{\"p\": 5}'",
        )
        .unwrap();
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_v')"), 3);
        assert_matches("ut_v", scratch);
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_v')"), 0);
        // More changes later in the same transaction are not mistaken for applied ones.
        Spi::run("INSERT INTO ut_events (event_type, payload) VALUES ('a', '{\"sku\": \"w\", \"qty\": 1, \"p\": 1}')").unwrap();
        Spi::run("DELETE FROM ut_events WHERE payload @> '{\"p\": 9}'").unwrap();
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_v')"), 2);
        assert_matches("ut_v", scratch);
    }

    /// The field observer runs a view's refresh pass over its batch when the view's batch is
    /// the observer's and all inserts, and the view's apply takes that result (the events read
    /// once); otherwise the view reads its batch itself. Either way the view equals the
    /// aggregate from scratch, each change applied once, in the writing transaction too.
    #[pg_test]
    fn the_observer_runs_a_views_pass_over_its_batch_when_the_batch_is_the_views() {
        let shared = crate::refresh::shared_applies;
        setup_events();
        Spi::run(
            "SELECT eventview.create_view('ut_sh', 'ut_events', group_by => '{\"sku\": \"$.sku\"}',
               measures => '{\"n\": \"count(*)\", \"q\": \"sum($.qty)\", \"hi\": \"max($.p)\"}',
               time_bucket => '1 hour', on_type_error => 'quarantine')",
        )
        .unwrap();
        Spi::run(
            "SELECT eventview.create_view('ut_sh_a', 'ut_events', group_by => '{\"sku\": \"$.sku\"}',
               measures => '{\"n\": \"count(*)\", \"hi\": \"max($.p)\"}', event_types => '{a}')",
        )
        .unwrap();
        let scratch = "SELECT date_bin('1 hour', occurred_at, '2000-01-01 00:00+00'), CASE WHEN jsonb_typeof(payload->'sku') IN ('string','number','boolean') THEN payload->>'sku' END,
                              count(*), sum((payload->>'qty')::numeric), max((payload->>'p')::numeric)
                       FROM ut_events WHERE jsonb_typeof(payload->'qty') IS DISTINCT FROM 'string' GROUP BY 1, 2";
        let scratch_a = "SELECT CASE WHEN jsonb_typeof(payload->'sku') IN ('string','number','boolean') THEN payload->>'sku' END,
                                count(*), max((payload->>'p')::numeric)
                         FROM ut_events WHERE event_type = 'a' GROUP BY 1";
        let same_position = "SELECT v.applied_snapshot::text = s.observed_snapshot::text
                             FROM eventview._views v JOIN eventview._sources s USING (source_id)
                             WHERE v.relid = 'ut_sh'::regclass";
        // Two events each, of types a and b.
        let insert = |payload: &str| {
            insert_events(
                "ut_events",
                &format!("('a', '2026-11-30 12:00+00', '{payload}'), ('b', '2026-11-30 12:10+00', '{payload}')"),
            )
        };
        let before = shared();
        // The observer's batch holds the events the views were made with too: not ut_sh's.
        insert("{\"sku\": \"x\", \"qty\": 3, \"p\": 8}");
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_sh')"), 2);
        assert_eq!(shared(), before);
        assert_matches("ut_sh", scratch);
        // Observed already: ut_sh_a reads its batch itself.
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_sh_a')"), 2);
        assert_eq!(shared(), before);
        // Now each view's next batch of inserts is the observer's: the observer runs the
        // view's pass (a type error included, quarantined; of its event types only), the apply
        // takes it, and the view's position becomes the observer's.
        insert("{\"sku\": \"z\", \"qty\": \"3\", \"p\": 1}");
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_sh')"), 2);
        assert_eq!(shared(), before + 1);
        assert_matches("ut_sh", scratch);
        assert_eq!(Spi::get_one::<bool>(same_position).unwrap(), Some(true));
        assert_eq!(
            scalar_i64(
                "SELECT count(*) FROM eventview.quarantine WHERE view_name = 'public.ut_sh'"
            ),
            2
        );
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_sh_a')"), 2);
        assert_eq!(shared(), before + 1);
        insert("{\"sku\": \"x\", \"qty\": 1, \"p\": 11}");
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_sh_a')"), 2);
        assert_eq!(shared(), before + 2);
        assert_matches("ut_sh_a", scratch_a);
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_sh')"), 2);
        assert_eq!(shared(), before + 2);
        assert_matches("ut_sh", scratch);
        // A batch with an update (two rows): read by the view itself.
        Spi::run("SELECT eventview.refresh('ut_sh_a')").unwrap();
        insert("{\"sku\": \"y\", \"qty\": 2, \"p\": 4}");
        Spi::run(
            "UPDATE ut_events SET payload = payload || '{\"p\": 20}' WHERE payload @> '{\"p\": 8}'",
        )
        .unwrap();
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_sh')"), 4);
        assert_eq!(shared(), before + 2);
        assert_matches("ut_sh", scratch);
        // With eventview.one_pass_refresh off: read by the view itself.
        Spi::run("SELECT eventview.refresh('ut_sh_a')").unwrap();
        insert("{\"sku\": \"y\", \"qty\": 2, \"p\": 5}");
        Spi::run("SET LOCAL eventview.one_pass_refresh = off").unwrap();
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_sh')"), 2);
        Spi::run("SET LOCAL eventview.one_pass_refresh = on").unwrap();
        assert_eq!(shared(), before + 2);
        assert_matches("ut_sh", scratch);
        // Nothing applied twice: an idle refresh, then a shared one again.
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_sh')"), 0);
        Spi::run("SELECT eventview.refresh('ut_sh_a')").unwrap();
        insert("{\"sku\": \"w\", \"qty\": 5, \"p\": 2}");
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_sh')"), 2);
        assert_eq!(shared(), before + 3);
        assert_matches("ut_sh", scratch);
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_sh')"), 0);
        Spi::run("SELECT eventview.refresh('ut_sh_a')").unwrap();
        assert_matches("ut_sh_a", scratch_a);
        // No result is left behind in the backend.
        assert_eq!(crate::pg::group_deltas::results_held(), 0);
    }

    /// A refresh with nothing pending neither runs the apply nor observes: the view's and the
    /// observer's positions stay as they are (the apply statement would move them on), and the
    /// refresh is still recorded. Changes made after it are applied as usual.
    #[pg_test]
    fn an_idle_refresh_leaves_the_positions_as_they_are() {
        setup_events();
        Spi::run("SELECT eventview.create_view('ut_idle', 'ut_events', group_by => '{\"sku\": \"$.sku\"}')").unwrap();
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_idle')"), 0);
        let positions = "SELECT v.applied_snapshot::text || ' ' || coalesce(v.applied_own_seq, -1) || ' ' || s.observed_snapshot::text
                         FROM eventview._views v JOIN eventview._sources s USING (source_id) WHERE v.relid = 'ut_idle'::regclass";
        let before = Spi::get_one::<String>(positions).unwrap();
        Spi::run(
            "UPDATE eventview._views SET last_refresh_at = NULL WHERE relid = 'ut_idle'::regclass",
        )
        .unwrap();
        // Rows this transaction updated: the apply and the observer each update their position.
        let updates = "SELECT string_agg(relname || ' ' || n_tup_upd, ', ' ORDER BY relname) FROM pg_stat_xact_user_tables
                       WHERE schemaname = 'eventview' AND relname IN ('_views', '_sources')";
        let counts = |text: String| -> Vec<i64> {
            text.split(", ")
                .map(|t| t.rsplit(' ').next().unwrap().parse::<i64>().unwrap())
                .collect()
        };
        let updated_before = counts(Spi::get_one::<String>(updates).unwrap().unwrap());
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_idle')"), 0);
        let updated_after = counts(Spi::get_one::<String>(updates).unwrap().unwrap());
        // (_sources, _views): only the refresh's own record.
        assert_eq!(
            (
                updated_after[0] - updated_before[0],
                updated_after[1] - updated_before[1]
            ),
            (0, 1)
        );
        assert_eq!(Spi::get_one::<String>(positions).unwrap(), before);
        assert_eq!(scalar_i64("SELECT count(*) FROM eventview.views WHERE name = 'ut_idle'::regclass AND last_refresh_at IS NOT NULL"), 1);
        Spi::run("INSERT INTO ut_events (event_type, payload) VALUES ('a', '{\"sku\": \"x\"}')")
            .unwrap();
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_idle')"), 1);
        assert_ne!(Spi::get_one::<String>(positions).unwrap(), before);
        assert_matches("ut_idle", "SELECT CASE WHEN jsonb_typeof(payload->'sku') = 'string' THEN payload->>'sku' END, count(*) FROM ut_events GROUP BY 1");
    }

    #[pg_test]
    fn extreme_logs_are_merged_before_the_multisets_are_read() {
        setup_events();
        Spi::run(
            "SELECT eventview.create_view('ut_lg', 'ut_events', group_by => '{\"sku\": \"$.sku\"}',
               measures => '{\"hi\": \"max($.p)\", \"lo\": \"min($.p)\", \"n\": \"count(*)\"}', time_bucket => '1 day')",
        )
        .unwrap();
        let vid =
            scalar_i64("SELECT view_id FROM eventview._views WHERE relid = 'ut_lg'::regclass");
        let logged = || {
            scalar_i64(&format!(
                "SELECT extremes_logged FROM eventview._views WHERE view_id = {vid}"
            ))
        };
        let log_rows = || {
            scalar_i64(&format!(
                "SELECT (SELECT count(*) FROM eventview._v{vid}_m1_log) + (SELECT count(*) FROM eventview._v{vid}_m2_log)"
            ))
        };
        let bucket = "date_bin('1 day', occurred_at, '2000-01-01 00:00:00+00')";
        let sku = "CASE WHEN jsonb_typeof(payload->'sku') IN ('string','number','boolean') THEN payload->>'sku' END";
        let scratch = format!(
            "SELECT {bucket}, {sku}, max((payload->>'p')::numeric), min((payload->>'p')::numeric), count(*)
             FROM ut_events GROUP BY 1, 2"
        );
        // Multiset, log and the values in the rows always hold each group's values with their
        // counts; after a merge, the multiset and the rows do.
        let values_match = |with_log: bool| {
            for n in [1, 2] {
                let log = if with_log {
                    format!("UNION ALL SELECT * FROM eventview._v{vid}_m{n}_log")
                } else {
                    String::new()
                };
                assert_matches(
                    &format!(
                        "(SELECT bucket, CASE WHEN g1_null THEN NULL ELSE g1 END, v, sum(n) FROM
                            (SELECT * FROM eventview._v{vid}_m{n} {log}
                             UNION ALL
                             SELECT __k, bucket, g1, g1_null, r.v, 1 FROM eventview._v{vid}_data, unnest(m{n}_vals) AS r(v)) u
                          GROUP BY 1, 2, 3 HAVING sum(n) <> 0) m"
                    ),
                    &format!(
                        "SELECT {bucket}, {sku}, (payload->>'p')::numeric, count(*) FROM ut_events
                         WHERE jsonb_typeof(payload->'p') = 'number' GROUP BY 1, 2, 3"
                    ),
                );
            }
        };
        // The groups below hold more values than a row keeps (`sqlgen::MAX_VALUES_IN_ROW`): their
        // values go to the logs (nine distinct values per group and measure, no merge), and
        // from there to the multisets.
        Spi::run(
            "INSERT INTO ut_events (event_type, occurred_at, payload)
             SELECT 'a', (d || ' 09:00+00')::timestamptz, jsonb_build_object('sku', s, 'p', i)
             FROM unnest(ARRAY['2026-11-30', '2026-12-02']) d, unnest(ARRAY['x', 'z']) s, generate_series(1, 9) i",
        )
        .unwrap();
        Spi::run("SELECT eventview.refresh('ut_lg')").unwrap();
        assert_eq!(
            scalar_i64(&format!(
                "SELECT count(*) FROM eventview._v{vid}_data WHERE g1 IN ('x', 'z') AND m1_vals IS NULL AND m2_vals IS NULL"
            )),
            4
        );
        assert_eq!((logged(), log_rows()), (72, 72));
        values_match(true);
        assert_matches("ut_lg", &scratch);
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_lg')"), 0);
        assert_eq!((logged(), log_rows()), (0, 0));
        values_match(false);
        let insert = |p: &str, day: &str| {
            Spi::run(&format!(
                "INSERT INTO ut_events (event_type, occurred_at, payload) VALUES
                   ('a', '{day} 09:00+00', '{{\"sku\": \"x\", \"p\": {p}}}'),
                   ('a', '{day} 09:00+00', '{{\"sku\": \"z\", \"p\": 3}}'),
                   ('a', '{day} 09:00+00', '{{\"sku\": \"z\", \"p\": 3}}')"
            ))
            .unwrap();
        };
        // Additions go to the logs; the stored extremes move outwards all the same.
        insert("20", "2026-11-30");
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_lg')"), 3);
        assert_eq!(log_rows(), 4);
        assert_eq!(logged(), 4);
        assert_matches("ut_lg", &scratch);
        values_match(true);
        insert("21", "2026-11-30");
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_lg')"), 3);
        assert_eq!((logged(), log_rows()), (8, 8));
        // Retracting the maximum: the logs are merged, then the fix-up finds the next value.
        Spi::run("DELETE FROM ut_events WHERE payload @> '{\"p\": 21}'").unwrap();
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_lg')"), 1);
        assert_eq!((logged(), log_rows()), (0, 0));
        values_match(false);
        assert_matches("ut_lg", &scratch);
        // An idle refresh merges.
        insert("22", "2026-11-30");
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_lg')"), 3);
        assert!(logged() > 0);
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_lg')"), 0);
        assert_eq!((logged(), log_rows()), (0, 0));
        values_match(false);
        // Past the limit, a refresh merges; with no limit, refreshes write the multisets.
        let insert_and_refresh = |limit: i32, logged_after: i64| {
            Spi::run(&format!("SET LOCAL eventview.extreme_log_limit = {limit}")).unwrap();
            insert("23", "2026-11-30");
            assert_eq!(scalar_i64("SELECT eventview.refresh('ut_lg')"), 3);
            assert_eq!((logged(), log_rows()), (logged_after, logged_after));
        };
        insert_and_refresh(5, 4);
        insert_and_refresh(5, 0);
        values_match(false);
        insert_and_refresh(0, 0);
        values_match(false);
        assert_matches("ut_lg", &scratch);
        Spi::run("RESET eventview.extreme_log_limit").unwrap();
        // A windowed rebuild drops the logged values of its buckets and recomputes them (into
        // the multisets: its groups hold more values than a row keeps).
        insert("24", "2026-11-30");
        insert("25", "2026-12-02");
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_lg')"), 6);
        assert_eq!(log_rows(), 8);
        Spi::run("SELECT eventview.rebuild('ut_lg', '2026-12-01', NULL)").unwrap();
        assert_eq!((logged(), log_rows()), (4, 4));
        values_match(true);
        assert_matches("ut_lg", &scratch);
        Spi::run("DELETE FROM ut_events WHERE payload @> '{\"p\": 24}'").unwrap();
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_lg')"), 1);
        values_match(false);
        assert_matches("ut_lg", &scratch);
        // Turning realtime merges the logs; a realtime view's refreshes write the multisets.
        insert("26", "2026-11-30");
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_lg')"), 3);
        assert!(logged() > 0);
        Spi::run("SELECT eventview.alter_view('ut_lg', realtime => true)").unwrap();
        assert_eq!((logged(), log_rows()), (0, 0));
        Spi::run("DELETE FROM ut_events WHERE payload @> '{\"p\": 26}'").unwrap();
        assert_matches("ut_lg", &scratch);
        insert("27", "2026-11-30");
        assert_matches("ut_lg", &scratch);
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_lg')"), 4);
        assert_eq!((logged(), log_rows()), (0, 0));
        values_match(false);
        // Storage restored from a dump of a version without logs: the next refresh creates them.
        Spi::run("SELECT eventview.alter_view('ut_lg', realtime => false)").unwrap();
        Spi::run(&format!(
            "DROP TABLE eventview._v{vid}_m1_log, eventview._v{vid}_m2_log"
        ))
        .unwrap();
        insert("28", "2026-11-30");
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_lg')"), 3);
        assert_eq!(log_rows(), 4);
        values_match(true);
        assert_matches("ut_lg", &scratch);
        Spi::run("SELECT eventview.drop_view('ut_lg')").unwrap();
        assert_eq!(
            scalar_i64(&format!(
                "SELECT count(*) FROM pg_class WHERE relname LIKE '\\_v{vid}\\_%'"
            )),
            0
        );
    }

    #[pg_test]
    fn every_mode_of_the_generated_sql_runs() {
        setup_events();
        Spi::run(
            "SELECT eventview.create_view('ut_all', 'ut_events',
               group_by => '{\"sku\": \"$.sku\", \"nested\": \"$.item.sku\", \"tag\": \"$.tags[*]\", \"v\": \"event_version\"}',
               measures => '{\"n\": \"count(*)\", \"c\": \"count($.qty)\", \"s\": \"sum($.qty)\", \"a\": \"avg($.p)\",
                             \"lo\": \"min($.p)\", \"hi\": \"max(occurred_at)\"}',
               event_types => ARRAY['a', 'b'], time_bucket => '1 hour',
               filter => '{\"event_type\": [\"a\", \"b\"]}', on_type_error => 'skip')",
        )
        .unwrap();
        // x@10:00 and x@10:30 share a bucket; y (v2) and the tagged event have their own groups.
        assert_eq!(scalar_i64("SELECT count(*) FROM ut_all"), 3);
        Spi::run("DELETE FROM ut_events WHERE event_version = 2").unwrap();
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_all')"), 1);
        assert_eq!(scalar_i64("SELECT count(*) FROM ut_all"), 2);
        Spi::run("INSERT INTO ut_events (event_type, occurred_at, payload) VALUES ('a', '2026-11-30 10:10+00', '{\"sku\": \"z\"}')").unwrap();
        // Window mode: pending changes outside the window are applied in the same statement.
        assert!(scalar_i64("SELECT eventview.rebuild('ut_all', '2026-11-30 11:00+00', NULL)") >= 0);
        assert_eq!(scalar_i64("SELECT count(*) FROM ut_all"), 3);
        assert_eq!(scalar_i64("SELECT eventview.rebuild('ut_all')"), 3);
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_all')"), 0);
    }

    #[pg_test]
    fn rich_paths_agree_with_jsonb_path_query_first() {
        let docs = [
            r#"{"items": [{"sku": "a"}, {"sku": "b"}], "x": {"sku": "c"}}"#,
            r#"{"items": [], "a": [1, 2, 3]}"#,
            r#"{"items": [{"n": 1}, {"sku": 2}]}"#,
        ];
        for doc in docs {
            for path in ["$.items[*].sku", "$.a[1]", "$.items[*]", "$.x.sku"] {
                let same = Spi::get_one_with_args::<bool>(
                    "SELECT eventview.jsonpath_first($1::jsonb, $2) IS NOT DISTINCT FROM
                            jsonb_path_query_first($1::jsonb, $2::jsonpath)",
                    &[doc.into(), path.into()],
                )
                .unwrap();
                assert_eq!(same, Some(true), "{path} on {doc}");
            }
        }
    }

    #[pg_test]
    fn bad_definitions_raise_22023() {
        setup_events();
        let caught = PgTryBuilder::new(|| {
            Spi::run("SELECT eventview.create_view('ut_bad', 'ut_events', measures => '{\"x\": \"median($.a)\"}')").unwrap();
            false
        })
        .catch_when(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, |_| true)
        .execute();
        assert!(caught);
    }

    #[pg_test]
    fn unknown_source_raises_42p01() {
        let caught = PgTryBuilder::new(|| {
            Spi::run("SELECT eventview.create_view('ut_bad', 'no_such_events')").unwrap();
            false
        })
        .catch_when(PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE, |_| true)
        .execute();
        assert!(caught);
    }
    /// The observer's walk over stored jsonb gives what a walk of the same documents by
    /// PostgreSQL's own jsonb functions gives (an SQL reference: every key path of objects,
    /// `[*]` for array elements, distinct per event).
    #[pg_test]
    fn stored_jsonb_walk_matches_an_sql_walk() {
        Spi::run(
            r#"CREATE TEMP TABLE docs (t text, v int, p jsonb);
               INSERT INTO docs VALUES
                 ('a', 1, '{"sku": "x", "n": 1.5, "ok": true, "nil": null, "it''s": {"é": [1, "s", [2]]}}'),
                 ('a', 1, '{"sku": 5, "tags": [{"id": 1}, {"id": "2"}, {"id": 3}], "e": {}, "ea": []}'),
                 ('b', 2, '{"sku": "y"}'),
                 ('b', 2, '[1, {"k": true}]'),
                 ('b', 2, '"just a string"');
               -- Past the format's offset stride (every 32nd child stores an end offset):
               -- wide objects and long arrays, nested containers at many positions.
               INSERT INTO docs SELECT 'w', n, (SELECT jsonb_object_agg('k' || i || repeat('é', i % 3),
                       CASE WHEN i % 7 = 0 THEN jsonb_build_object('n', i, 'a', jsonb_build_array(i, 's', NULL, true))
                            WHEN i % 5 = 0 THEN to_jsonb(repeat('s', i * n))
                            WHEN i % 11 = 0 THEN 'null'::jsonb
                            ELSE to_jsonb(i * 1.5) END) FROM generate_series(1, 40 * n) i)
               FROM generate_series(1, 3) n;
               INSERT INTO docs SELECT 'l', 1, jsonb_build_object('xs', (SELECT jsonb_agg(
                       CASE WHEN i % 3 = 0 THEN jsonb_build_object('id', i, 'tag', 'x' || i)
                            WHEN i % 3 = 1 THEN to_jsonb(i) ELSE jsonb_build_array(jsonb_build_array(i)) END)
                   FROM generate_series(1, 150) i))"#,
        )
        .unwrap();
        let reference = r#"
            WITH RECURSIVE walk(doc, t, v, path, val) AS (
                SELECT d.ctid::text, d.t, d.v, '$', d.p FROM docs d
              UNION ALL
                SELECT w.doc, w.t, w.v, c.path, c.val FROM walk w
                CROSS JOIN LATERAL (
                    SELECT w.path || CASE WHEN k ~ '^[A-Za-z_][A-Za-z0-9_]*$' THEN '.' || k
                                          ELSE '[''' || replace(replace(k, '\', '\\'), '''', '\''') || ''']' END,
                           x
                    FROM jsonb_each(CASE WHEN jsonb_typeof(w.val) = 'object' THEN w.val END) e(k, x)
                    UNION ALL
                    SELECT w.path || '[*]', x FROM jsonb_array_elements(CASE WHEN jsonb_typeof(w.val) = 'array' THEN w.val END) a(x)
                ) c(path, val)
            )
            SELECT t, v, path, jsonb_typeof(val) AS k, count(DISTINCT doc) AS n
            FROM walk WHERE path <> '$' GROUP BY 1, 2, 3, 4"#;
        // The aggregate's rows: [type, version, path, JSON type, events].
        let rows = "(SELECT r.value ->> 0 AS event_type, (r.value ->> 1)::int AS event_version, r.value ->> 2 AS path,
                            r.value ->> 3 AS json_type, (r.value ->> 4)::bigint AS events
                     FROM jsonb_array_elements((SELECT eventview._shapes_agg(t, v, p) FROM docs)::jsonb) r) w";
        let walked = format!("SELECT w.event_type, w.event_version, w.path, w.json_type, w.events FROM {rows} WHERE w.path <> ''");
        let diff = scalar_i64(&format!(
            "SELECT count(*) FROM ((({walked}) EXCEPT ALL ({reference})) UNION ALL (({reference}) EXCEPT ALL ({walked}))) d"
        ));
        assert_eq!(diff, 0);
        assert!(scalar_i64(&format!("SELECT count(*) FROM ({walked}) w")) >= 15);
        // And, per type and version, the events walked.
        let counted =
            format!("SELECT w.event_type, w.event_version, w.events FROM {rows} WHERE w.path = ''");
        let per_version = "SELECT t, v, count(*) FROM docs GROUP BY 1, 2";
        assert_eq!(
            scalar_i64(&format!(
                "SELECT count(*) FROM ((({counted}) EXCEPT ALL ({per_version})) UNION ALL (({per_version}) EXCEPT ALL ({counted}))) d"
            )),
            0
        );
        // Nested far below the walk's depth limit: walked to the limit only.
        let deep = scalar_i64(
            r#"SELECT jsonb_array_length(eventview._shapes_agg('d', 1, (repeat('{"a":', 10000) || '1' || repeat('}', 10000))::jsonb)::jsonb) - 1"#,
        );
        assert_eq!(deep, eventview_core::observe_sql::MAX_DEPTH as i64);
        // Nothing walked: NULL.
        assert_eq!(
            Spi::get_one::<String>("SELECT eventview._shapes_agg('d', 1, p) FROM docs WHERE false")
                .unwrap(),
            None
        );
    }

    /// Any bigint is a valid event_id (OVERRIDING SYSTEM VALUE): ids at both ends of the range
    /// are read back and counted like any other (runs of ids are found without bigint overflow).
    #[pg_test]
    fn extreme_event_ids_refresh_like_any_other() {
        setup_events();
        Spi::run(
            "SELECT eventview.create_view('ut_ids', 'ut_events', group_by => '{\"sku\": \"$.sku\"}',
               measures => '{\"n\": \"count(*)\"}')",
        )
        .unwrap();
        Spi::run(
            "INSERT INTO ut_events (event_id, event_type, payload) OVERRIDING SYSTEM VALUE VALUES
               (-9223372036854775808, 'a', '{\"sku\": \"lo\"}'), (-9223372036854775807, 'a', '{\"sku\": \"lo\"}'),
               (9223372036854775807, 'a', '{\"sku\": \"hi\"}')",
        )
        .unwrap();
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_ids')"), 3);
        assert_matches(
            "ut_ids",
            "SELECT CASE WHEN jsonb_typeof(payload->'sku') IN ('string','number','boolean') THEN payload->>'sku' END, count(*)
             FROM ut_events GROUP BY 1",
        );
    }

    /// The ingest gate's one-pass check in Rust gives, for every combination of good and bad
    /// envelope members, the problem that a reference written in plain SQL (one jsonb test per
    /// member, below) gives, in the same order of precedence.
    #[pg_test]
    fn envelope_checks_match_the_sql_reference() {
        Spi::run(
            r#"CREATE TEMP TABLE envs AS
               SELECT jsonb_strip_nulls(jsonb_build_object('type', t, 'version', v, 'producer', p,
                          'occurred_at', o, 'key', k, 'payload', pl)) AS e
               FROM unnest(ARRAY['"a"', '""', '5', 'null', 'absent']) t0(t0)
               CROSS JOIN LATERAL (SELECT CASE WHEN t0 = 'absent' THEN NULL ELSE t0::jsonb END) t1(t)
               CROSS JOIN unnest(ARRAY['1', '2.0', '0', '-1', '1.5', '2147483647', '2147483648', '1e3',
                                       '0.0001', '"2"', 'true', 'null', 'absent', '1e20', '-0', '2147483647.0',
                                       '-2', '3.000000000000000000001']) v0(v0)
               CROSS JOIN LATERAL (SELECT CASE WHEN v0 = 'absent' THEN NULL ELSE v0::jsonb END) v1(v)
               CROSS JOIN unnest(ARRAY['"ios"', '7', '["x"]', 'null', 'absent']) p0(p0)
               CROSS JOIN LATERAL (SELECT CASE WHEN p0 = 'absent' THEN NULL ELSE p0::jsonb END) p1(p)
               CROSS JOIN unnest(ARRAY['"2026-11-30T10:00:00Z"', '"2026-11-30T10:00:00.5+02:00"', '"yesterday"',
                                       '"2026-02-30T10:00:00Z"', '"2026-11-30 10:00:00"', '12', 'null', 'absent']) o0(o0)
               CROSS JOIN LATERAL (SELECT CASE WHEN o0 = 'absent' THEN NULL ELSE o0::jsonb END) o1(o)
               CROSS JOIN unnest(ARRAY['"k"', '5', 'null', 'absent']) k0(k0)
               CROSS JOIN LATERAL (SELECT CASE WHEN k0 = 'absent' THEN NULL ELSE k0::jsonb END) k1(k)
               CROSS JOIN unnest(ARRAY['{"x": 1}', '{}', '[1]', '"s"', 'null', 'absent',
                                       '{"s": "a long string past the limit"}']) l0(l0)
               CROSS JOIN LATERAL (SELECT CASE WHEN l0 = 'absent' THEN NULL ELSE l0::jsonb END) l1(pl);
               -- jsonb_strip_nulls drops JSON nulls too: put the explicit nulls back.
               INSERT INTO envs SELECT e || jsonb_build_object(m, NULL) FROM envs,
                   unnest(ARRAY['version', 'producer', 'occurred_at', 'key', 'payload', 'type']) m
                   WHERE length(e::text) % 5 = 0;
               INSERT INTO envs VALUES ('7'), ('"s"'), ('[1, 2]'), ('null'), ('{}'), ('[{"type": "a", "payload": {}}]');"#,
        )
        .unwrap();
        let reference = r#"
            SELECT CASE
                WHEN jsonb_typeof(e) <> 'object' THEN 1
                WHEN jsonb_typeof(e->'type') IS DISTINCT FROM 'string' OR e->>'type' = '' THEN 2
                WHEN e ? 'version' AND e->'version' <> 'null'::jsonb AND NOT (
                         jsonb_typeof(e->'version') = 'number'
                         AND (e->'version')::numeric = trunc((e->'version')::numeric)
                         AND (e->'version')::numeric BETWEEN 1 AND 2147483647) THEN 3
                WHEN e ? 'producer' AND e->'producer' <> 'null'::jsonb AND jsonb_typeof(e->'producer') <> 'string' THEN 4
                WHEN e ? 'occurred_at' AND e->'occurred_at' <> 'null'::jsonb
                     AND (jsonb_typeof(e->'occurred_at') <> 'string' OR NOT eventview._rfc3339_valid(e->>'occurred_at')) THEN 5
                WHEN e ? 'key' AND e->'key' <> 'null'::jsonb AND jsonb_typeof(e->'key') <> 'string' THEN 6
                WHEN jsonb_typeof(e->'payload') IS DISTINCT FROM 'object' THEN 7
                WHEN octet_length((e->'payload')::text) > 20 THEN 8
            END"#;
        let differ = scalar_i64(&format!(
            "SELECT count(*) FROM envs WHERE eventview._envelope_problem(e, 20) IS DISTINCT FROM ({reference})"
        ));
        assert_eq!(differ, 0);
        assert!(scalar_i64("SELECT count(*) FROM envs") > 20_000);
        assert_eq!(
            scalar_i64("SELECT count(DISTINCT eventview._envelope_problem(e, 20)) FROM envs"),
            8
        );
        assert!(
            scalar_i64(
                "SELECT count(*) FROM envs WHERE eventview._envelope_problem(e, 20) IS NULL"
            ) > 100
        );
    }

    /// The gate's size of a payload (bytes of its JSON text, counted without printing it) is
    /// exactly what `payload::text` prints: a limit of that size admits it, one byte less refuses
    /// it. Numbers print as numeric does (exponents written out, trailing zeros of the scale),
    /// strings with their escapes.
    #[pg_test]
    fn payload_sizes_are_the_length_of_the_json_text() {
        let mut rng = eventview_core::fuzz::Rng(0x0517_e50f_7e47);
        const SCALARS: &[&str] = &[
            "0",
            "-0",
            "1",
            "-1",
            "9999",
            "10000",
            "-123.4500",
            "0.0001",
            "1e1000",
            "-1e-300",
            "123456789012345678901234567890",
            "0.000000000000000000001",
            "1.5e3",
            "2e-2",
            "100000000",
            "true",
            "false",
            "null",
            "\"\"",
            r#""a\"b\\c\n\t\r\b\f\u0001\u001f é😀""#,
            "\"plain text\"",
            "[]",
            "{}",
        ];
        fn doc(rng: &mut eventview_core::fuzz::Rng, depth: u32) -> String {
            match if depth > 4 { 0 } else { rng.below(4) } {
                0 | 1 => rng.pick(SCALARS).to_string(),
                2 => format!(
                    "[{}]",
                    (0..rng.below(5))
                        .map(|_| doc(rng, depth + 1))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                _ => format!(
                    "{{{}}}",
                    (0..rng.below(5))
                        .map(|i| format!(
                            "\"k{i}{}\": {}",
                            ["", "\\\"", "\\n", "é"][rng.below(4)],
                            doc(rng, depth + 1)
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        }
        Spi::run("CREATE TEMP TABLE payloads (p jsonb)").unwrap();
        for _ in 0..3000 {
            let text = format!("{{\"root\": {}}}", doc(&mut rng, 0));
            Spi::run_with_args(
                "INSERT INTO payloads VALUES ($1::jsonb)",
                &[text.as_str().into()],
            )
            .unwrap();
        }
        // Wide, long and deep payloads: past the jsonb format's offset stride, and 10,000 levels.
        Spi::run(
            r#"INSERT INTO payloads SELECT jsonb_object_agg('k' || i, CASE WHEN i % 2 = 0 THEN to_jsonb(i * 1.25) ELSE to_jsonb(repeat('x', i)) END)
                 FROM generate_series(1, 500) i;
               INSERT INTO payloads SELECT jsonb_build_object('xs', jsonb_agg(i)) FROM generate_series(1, 2000) i;
               INSERT INTO payloads SELECT (repeat('{"a":', 10000) || '1' || repeat('}', 10000))::jsonb;"#,
        )
        .unwrap();
        let wrong = scalar_i64(
            "SELECT count(*) FROM (SELECT jsonb_build_object('type', 'a', 'payload', p) AS e, octet_length(p::text) AS n FROM payloads) x
             WHERE eventview._envelope_problem(e, n) IS NOT NULL OR eventview._envelope_problem(e, n - 1) IS DISTINCT FROM 8",
        );
        assert_eq!(wrong, 0);
    }

    /// The observer counts every new event once, whether the batch's ids are one long run (split
    /// into chunks for the walk) or scattered (many short runs packed into chunks, read by the
    /// branch that matches ids across records, as a batch with updates is), and an event
    /// inserted, updated and deleted in one batch. Events the batch only updated are not new:
    /// not counted, their new paths not observed.
    #[pg_test]
    fn observer_counts_each_new_event_once() {
        Spi::run("SELECT eventview.create_event_table('ut_obs')").unwrap();
        Spi::run("SELECT eventview.create_view('ut_obs_n', 'ut_obs', measures => '{\"n\": \"count(*)\"}')").unwrap();
        let events = "SELECT coalesce(sum(events), 0)::bigint FROM eventview._observed_versions o
                      JOIN eventview._sources s USING (source_id) WHERE s.relid = 'ut_obs'::regclass";
        let seen = |path: &str| {
            scalar_i64(&format!(
                "SELECT coalesce(sum(seen), 0)::bigint FROM eventview.observed_fields
                 WHERE source = 'ut_obs'::regclass AND path = '{path}'"
            ))
        };
        Spi::run("INSERT INTO ut_obs (event_type, payload) SELECT 'a', jsonb_build_object('x', i) FROM generate_series(1, 10000) i").unwrap();
        Spi::run("SELECT eventview.refresh('ut_obs_n')").unwrap();
        assert_eq!(scalar_i64(events), 10_000);
        assert_eq!(seen("$.x"), 10_000);
        // Every third old event updated (not new), and 3,333 new events with scattered ids
        // (3,333 runs of one id), ten of them updated and one of those deleted in the batch.
        Spi::run("UPDATE ut_obs SET payload = payload || '{\"y\": 1}' WHERE event_id % 3 = 1")
            .unwrap();
        Spi::run(
            "INSERT INTO ut_obs (event_id, event_type, payload) OVERRIDING SYSTEM VALUE
             SELECT 20000 + 3 * i, 'a', jsonb_build_object('x', i) FROM generate_series(1, 3333) i",
        )
        .unwrap();
        Spi::run("UPDATE ut_obs SET payload = payload || '{\"z\": 1}' WHERE event_id BETWEEN 20000 AND 20030").unwrap();
        Spi::run("DELETE FROM ut_obs WHERE event_id = 20003").unwrap();
        Spi::run("SELECT eventview.refresh('ut_obs_n')").unwrap();
        assert_eq!(scalar_i64(events), 10_000 + 3_332);
        assert_eq!(seen("$.x"), 10_000 + 3_332);
        assert_eq!(seen("$.z"), 9);
        assert_eq!(seen("$.y"), 0);
        assert_eq!(scalar_i64("SELECT n FROM ut_obs_n"), 13_332);
    }

    /// A realtime read inlines `eventview._rfc3339` (a timestamptz field) into the reader's
    /// query, parsed with the reader's search_path: an operator someone created in `public`
    /// that matches `jsonb #>> unknown` exactly must not be the one that runs.
    #[pg_test]
    fn a_realtime_read_runs_no_operator_from_the_readers_search_path() {
        Spi::run(
            "CREATE FUNCTION public.ut_hijack(jsonb, jsonb) RETURNS text LANGUAGE plpgsql AS
                 $$BEGIN RAISE EXCEPTION 'hijacked'; END$$;
             CREATE OPERATOR public.#>> (LEFTARG = jsonb, RIGHTARG = jsonb, FUNCTION = public.ut_hijack);
             CREATE FUNCTION public.ut_hijack_eq(text, text) RETURNS boolean LANGUAGE plpgsql AS
                 $$BEGIN RAISE EXCEPTION 'hijacked ='; END$$;
             CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.ut_hijack_eq)",
        )
        .unwrap();
        Spi::run("SELECT eventview.create_event_table('ut_rt_at')").unwrap();
        Spi::run("SELECT eventview.define_field('ut_rt_at', 'at', '$.at', type => 'timestamptz')")
            .unwrap();
        Spi::run("SELECT eventview.create_view('ut_rt_last', 'ut_rt_at', measures => '{\"last\": \"max(at)\"}', realtime => true)")
            .unwrap();
        Spi::run("INSERT INTO ut_rt_at (event_type, payload) VALUES ('e', '{\"at\": \"2026-01-01T00:00:00Z\"}')").unwrap();
        Spi::run("SET LOCAL search_path = public, pg_catalog").unwrap();
        assert_eq!(
            Spi::get_one::<String>("SELECT last::text FROM ut_rt_last")
                .unwrap()
                .as_deref(),
            Some("2026-01-01 00:00:00+00")
        );
    }

    /// The retention horizon of a rebuild is the same instant in every session time zone (it is
    /// computed in UTC, as prune's cutoff is). Computed in the session's zone, it would move by
    /// the daylight saving shift whenever the date and the date a retention back have different
    /// offsets: from any date, 3, 6 or 9 months back reaches Berlin's other season (its summer
    /// is 7 months long, its winter 5), so at least one of these would be an hour off.
    #[pg_test]
    fn retention_horizon_is_the_same_in_every_time_zone() {
        for months in [3, 6, 9] {
            Spi::run(&format!("SELECT eventview.create_event_table('ut_tz{months}', retention => '{months} months')")).unwrap();
            let source = crate::catalog::source_by_name(&format!("ut_tz{months}")).unwrap();
            let horizon_in = |zone: &str| {
                Spi::run(&format!("SET LOCAL TimeZone = '{zone}'")).unwrap();
                crate::catalog::retention_horizon(&source).unwrap().unwrap()
            };
            let utc = horizon_in("UTC");
            for zone in ["Europe/Berlin", "Pacific/Chatham", "America/Santiago"] {
                let other = horizon_in(zone);
                // (The clock moves on between the two calls: microseconds, not an hour.)
                let apart = Spi::get_one_with_args::<f64>(
                    "SELECT abs(extract(epoch FROM $1::timestamptz - $2::timestamptz))::float8",
                    &[other.into(), utc.into()],
                )
                .unwrap()
                .unwrap();
                assert!(
                    apart < 60.0,
                    "{months} months back: the horizon in {zone} is {apart} s from the one in UTC"
                );
            }
        }
    }

    /// An update that drops a path a view reads is not a new event without it: no `missing`
    /// drift. A new event without it is.
    #[pg_test]
    fn an_update_dropping_a_read_path_is_not_missing_drift() {
        let missing = "SELECT count(*) FROM eventview.drift WHERE source = 'ut_upd'::regclass AND change = 'missing' AND path = '$.a'";
        Spi::run("SELECT eventview.create_event_table('ut_upd')").unwrap();
        Spi::run(
            "SELECT eventview.create_view('ut_upd_a', 'ut_upd', group_by => '{\"a\": \"$.a\"}')",
        )
        .unwrap();
        Spi::run("INSERT INTO ut_upd (event_type, payload) SELECT 't', jsonb_build_object('a', i) FROM generate_series(1, 3) i").unwrap();
        Spi::run("SELECT eventview.refresh('ut_upd_a')").unwrap();
        Spi::run("UPDATE ut_upd SET payload = payload - 'a' WHERE event_id = 2").unwrap();
        Spi::run("SELECT eventview.refresh('ut_upd_a')").unwrap();
        assert_eq!(scalar_i64(missing), 0);
        assert_eq!(
            scalar_i64("SELECT count(*) FROM ut_upd_a WHERE a IS NULL"),
            1
        );
        Spi::run("INSERT INTO ut_upd (event_type, payload) VALUES ('t', '{\"b\": 1}')").unwrap();
        Spi::run("SELECT eventview.refresh('ut_upd_a')").unwrap();
        assert_eq!(scalar_i64(missing), 1);
    }

    /// A batch that cannot hold drift is observed by the statement without the drift joins
    /// (`observe_sql::observe_unless_drift`), which writes its observations; a batch with a new
    /// path, a new JSON type, a new event version or a read path missing goes to the whole
    /// statement, which records the drift. Either way observed_fields counts every event once,
    /// and the view's apply takes the refresh pass the observer ran.
    #[pg_test]
    fn only_a_batch_that_may_hold_drift_is_observed_with_the_drift_joins() {
        Spi::run("SELECT eventview.create_event_table('ut_dj')").unwrap();
        Spi::run("SELECT eventview.create_view('ut_dj_v', 'ut_dj', group_by => '{\"k\": \"$.k\"}', measures => '{\"n\": \"count(*)\"}')").unwrap();
        let drift_statements = crate::observer::drift_statements;
        let batch = |version: i32, payload: &str| {
            Spi::run(&format!(
                "INSERT INTO ut_dj (event_type, event_version, payload) SELECT 't', {version}, '{payload}' FROM generate_series(1, 3)"
            ))
            .unwrap();
            let (before, shared) = (drift_statements(), crate::refresh::shared_applies());
            assert_eq!(scalar_i64("SELECT eventview.refresh('ut_dj_v')"), 3);
            // The view's apply takes the pass the (last) observer statement ran.
            assert_eq!(crate::refresh::shared_applies(), shared + 1);
            drift_statements() - before
        };
        let drift = |change: &str| {
            scalar_i64(&format!(
                "SELECT count(*) FROM eventview.drift WHERE source = 'ut_dj'::regclass AND change = '{change}'"
            ))
        };
        let seen = |path: &str| {
            scalar_i64(&format!(
                "SELECT coalesce(sum(seen), 0)::bigint FROM eventview.observed_fields
                 WHERE source = 'ut_dj'::regclass AND path = '{path}'"
            ))
        };
        // The first events of a type and version: their paths are new.
        assert_eq!(batch(1, r#"{"k": "a", "x": 1}"#), 1);
        assert_eq!(drift("added"), 2);
        // The same shape again: no drift possible, observed without the joins.
        assert_eq!(batch(1, r#"{"k": "b", "x": 2}"#), 0);
        assert_eq!(batch(1, r#"{"k": "c", "x": 3}"#), 0);
        assert_eq!((seen("$.k"), seen("$.x")), (9, 9));
        // A new path, a new JSON type, a new version, a read path missing: each may drift.
        assert_eq!(batch(1, r#"{"k": "a", "x": 1, "y": true}"#), 1);
        assert_eq!(drift("added"), 3);
        assert_eq!(batch(1, r#"{"k": "a", "x": "1"}"#), 1);
        assert_eq!(drift("type_changed"), 1);
        assert_eq!(batch(2, r#"{"k": "a", "x": 1}"#), 1);
        assert_eq!(batch(1, r#"{"x": 1}"#), 1);
        assert_eq!(drift("missing"), 1);
        // A read path absent again is not missing again (it was not in every earlier event):
        // no drift possible.
        assert_eq!(batch(1, r#"{"x": 1}"#), 0);
        assert_eq!(drift("missing"), 1);
        assert_eq!(batch(1, r#"{"k": "b", "x": 2}"#), 0);
        assert_eq!(seen("$.k"), 12 + 3 + 3 + 3);
        assert_eq!(
            scalar_i64("SELECT sum(n)::bigint FROM ut_dj_v"),
            scalar_i64("SELECT count(*) FROM ut_dj")
        );
    }

    /// A realtime read runs its view's pending groups' statement only when the reader's batch
    /// holds changes (`realtime::pending_groups`): after a refresh, a read is a read of the
    /// storage and a short check. The reads match the aggregate from scratch either way, the
    /// reader's own uncommitted changes included.
    #[pg_test]
    fn a_realtime_read_runs_the_pending_groups_statement_only_with_changes_pending() {
        Spi::run("SELECT eventview.create_event_table('ut_rp')").unwrap();
        Spi::run("SELECT eventview.create_view('ut_rp_v', 'ut_rp', group_by => '{\"k\": \"$.k\"}', measures => '{\"n\": \"count(*)\", \"hi\": \"max($.x)\"}', realtime => true)").unwrap();
        let statements = crate::realtime::pending_statements;
        let read = || {
            let before = statements();
            let rows = scalar_text(
                "SELECT coalesce(string_agg(concat_ws(':', k, n, hi), ',' ORDER BY k), '') FROM ut_rp_v",
            );
            let expected = scalar_text(
                "SELECT coalesce(string_agg(concat_ws(':', k, n, hi), ',' ORDER BY k), '')
                 FROM (SELECT payload ->> 'k' AS k, count(*) AS n, max((payload -> 'x')::numeric) AS hi
                       FROM ut_rp GROUP BY 1) a",
            );
            assert_eq!(rows, expected);
            (rows, statements() - before)
        };
        assert_eq!(read(), (String::new(), 0));
        Spi::run(r#"INSERT INTO ut_rp (event_type, payload) VALUES ('t', '{"k": "a", "x": 1}'), ('t', '{"k": "b", "x": 5}')"#).unwrap();
        assert_eq!(read(), ("a:1:1,b:1:5".to_string(), 1));
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_rp_v')"), 2);
        assert_eq!(read(), ("a:1:1,b:1:5".to_string(), 0));
        Spi::run(r#"DELETE FROM ut_rp WHERE payload ->> 'k' = 'b'"#).unwrap();
        Spi::run(r#"INSERT INTO ut_rp (event_type, payload) VALUES ('t', '{"k": "a", "x": 3}')"#)
            .unwrap();
        assert_eq!(read(), ("a:2:3".to_string(), 1));
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_rp_v')"), 2);
        assert_eq!(read(), ("a:2:3".to_string(), 0));
    }

    /// The paths the observer watches for `missing` drift are kept per backend (observer.rs,
    /// `READ_PATHS`): kept across refreshes (which rewrite their views' catalog rows), made
    /// again after a view is created or a field redeclared, and after a rolled-back view, in
    /// the same backend and even the same transaction.
    #[pg_test]
    fn missing_drift_follows_views_and_fields_changed_after_the_paths_were_kept() {
        let insert = |payload: &str| {
            Spi::run(&format!(
                "INSERT INTO ut_kept (event_type, payload) VALUES ('t', '{payload}')"
            ))
            .unwrap();
        };
        let refresh = || assert_eq!(scalar_i64("SELECT eventview.refresh('ut_kept_a')"), 1);
        let missing = |path: &str| {
            scalar_i64(&format!(
                "SELECT count(*) FROM eventview.drift WHERE source = 'ut_kept'::regclass AND change = 'missing' AND path = '{path}'"
            ))
        };
        let made = crate::observer::paths_made;
        Spi::run("SELECT eventview.create_event_table('ut_kept')").unwrap();
        Spi::run("SELECT eventview.define_field('ut_kept', 'lf', '$.c')").unwrap();
        Spi::run(
            "SELECT eventview.create_view('ut_kept_a', 'ut_kept', group_by => '{\"a\": \"$.a\"}')",
        )
        .unwrap();
        let all = r#"{"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}"#;
        insert(all);
        let before = made();
        refresh();
        assert_eq!(made(), before + 1);
        // Nothing changed but the view's position: the paths are kept.
        insert(all);
        refresh();
        assert_eq!(made(), before + 1);
        // A new view reads $.b; then an event without $.b.
        Spi::run(
            "SELECT eventview.create_view('ut_kept_b', 'ut_kept', group_by => '{\"b\": \"$.b\"}')",
        )
        .unwrap();
        insert(r#"{"a": 1, "c": 1, "d": 1, "e": 1}"#);
        refresh();
        assert_eq!(made(), before + 2);
        assert_eq!(missing("$.b"), 1);
        // A view reading $.e, kept by a refresh, then rolled back: $.e is not watched after.
        Spi::run(
            r#"DO $$ BEGIN
                 PERFORM eventview.create_view('ut_kept_e', 'ut_kept', group_by => '{"e": "$.e"}');
                 INSERT INTO ut_kept (event_type, payload) VALUES ('t', '{"a": 1, "c": 1, "d": 1, "e": 1}');
                 PERFORM eventview.refresh('ut_kept_a');
                 RAISE EXCEPTION 'undo';
               EXCEPTION WHEN raise_exception THEN NULL;
               END $$"#,
        )
        .unwrap();
        assert_eq!(made(), before + 3);
        insert(r#"{"a": 1, "c": 1, "d": 1}"#);
        refresh();
        assert_eq!(made(), before + 4);
        assert_eq!(missing("$.e"), 0);
        // A view reads the logical field lf ($.c), which is then redeclared as $.d; then an
        // event without $.c and $.d: only $.d, which a view reads now, went missing.
        Spi::run(
            "SELECT eventview.create_view('ut_kept_lf', 'ut_kept', group_by => '{\"lf\": \"lf\"}')",
        )
        .unwrap();
        insert(r#"{"a": 1, "c": 1, "d": 1}"#);
        refresh();
        assert_eq!(made(), before + 5);
        Spi::run("SELECT eventview.define_field('ut_kept', 'lf', '$.d')").unwrap();
        insert(r#"{"a": 1}"#);
        refresh();
        assert_eq!(made(), before + 6);
        assert_eq!(missing("$.d"), 1);
        assert_eq!(missing("$.c"), 0);
        assert_eq!(missing("$.b"), 1);
    }

    /// A batch of a few inserts is read record by record (`batch::touched_rows`), yet in event
    /// id order, which drift follows: here the first statement inserts the later id. Walked in
    /// record order, `$.a` would look present in every event until id 10 lacked it (`missing`);
    /// in id order, the event without it comes first, so nothing went missing.
    #[pg_test]
    fn insert_records_are_read_in_event_id_order() {
        Spi::run("SELECT eventview.create_event_table('ut_order')").unwrap();
        Spi::run(
            "SELECT eventview.create_view('ut_order_a', 'ut_order', group_by => '{\"a\": \"$.a\"}',
                                          measures => '{\"n\": \"count(*)\"}')",
        )
        .unwrap();
        Spi::run("INSERT INTO ut_order (event_id, event_type, payload) OVERRIDING SYSTEM VALUE VALUES (20, 't', '{\"a\": 1}'), (30, 't', '{\"a\": 2}')").unwrap();
        Spi::run("INSERT INTO ut_order (event_id, event_type, payload) OVERRIDING SYSTEM VALUE VALUES (10, 't', '{}')").unwrap();
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_order_a')"), 3);
        assert_eq!(scalar_i64("SELECT count(*) FROM eventview.drift WHERE source = 'ut_order'::regclass AND change = 'missing'"), 0);
        assert_eq!(scalar_i64("SELECT count(*) FROM ut_order_a WHERE n = 1"), 3);
        // The same shapes in a new version, in id order this time: id 40 lacks a path every
        // earlier event of the version had.
        Spi::run("INSERT INTO ut_order (event_id, event_type, event_version, payload) OVERRIDING SYSTEM VALUE VALUES (35, 't', 2, '{\"a\": 3}')").unwrap();
        Spi::run("INSERT INTO ut_order (event_id, event_type, event_version, payload) OVERRIDING SYSTEM VALUE VALUES (40, 't', 2, '{}')").unwrap();
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_order_a')"), 2);
        assert_eq!(
            scalar_i64("SELECT count(*) FROM eventview.drift WHERE source = 'ut_order'::regclass AND change = 'missing' AND event_version = 2 AND path = '$.a'"),
            1
        );
        assert_eq!(scalar_i64("SELECT sum(n)::bigint FROM ut_order_a"), 5);
    }

    /// The insert capture writes its record without the executor into the segment whose range
    /// holds its `seq` (the default partition past every segment), with the values the column
    /// defaults give and an index entry; a changelog it does not know the layout of (a column
    /// more, a trigger) gets the record by INSERT, defaults and trigger included.
    #[pg_test]
    fn an_insert_record_goes_to_its_segment_as_an_insert_would_write_it() {
        use crate::pg::changelog_append::appended;
        Spi::run("SELECT eventview.create_event_table('ut_append')").unwrap();
        let source = scalar_i64(
            "SELECT source_id FROM eventview._sources WHERE relid = 'ut_append'::regclass",
        );
        let log = format!("eventview._changes_{source}");
        let last = |what: &str| {
            Spi::get_one::<bool>(&format!(
                "SELECT {what} FROM {log} WHERE seq = (SELECT max(seq) FROM {log})"
            ))
            .unwrap()
            .unwrap()
        };
        let written_as_an_insert = "xid = pg_current_xact_id() AND logged_at = now() AND op = 'I'
             AND event_id IS NULL AND old_event_type IS NULL AND old_payload IS NULL";
        let before = appended();
        // (Read first with every identifier quoted, as pg_dump sets it.)
        Spi::run("SET LOCAL quote_all_identifiers = on").unwrap();
        insert_events("ut_append", "('t', now(), '{}'), ('t', now(), '{}')");
        Spi::run("RESET quote_all_identifiers").unwrap();
        assert_eq!(appended(), before + 1);
        assert!(last(written_as_an_insert));
        assert!(last(
            "event_ids = ARRAY(SELECT event_id FROM ut_append ORDER BY event_id)"
        ));
        assert!(last(&format!("tableoid = '{log}_from_1'::regclass")));
        // Its index entry: found by an index scan.
        Spi::run("SET LOCAL enable_seqscan = off").unwrap();
        Spi::run("SET LOCAL enable_bitmapscan = off").unwrap();
        assert_eq!(
            scalar_i64(&format!(
                "SELECT count(*) FROM {log} WHERE xid = pg_current_xact_id() AND seq >= 1"
            )),
            1
        );
        Spi::run("RESET enable_seqscan").unwrap();
        Spi::run("RESET enable_bitmapscan").unwrap();

        // A segment further on: its last value goes to it, its upper bound (exclusive) past it.
        Spi::run(&format!(
            "CREATE TABLE {log}_from_40000 PARTITION OF {log} FOR VALUES FROM (40000) TO (40002)"
        ))
        .unwrap();
        Spi::run(&format!(
            "ALTER TABLE {log} ALTER COLUMN seq RESTART WITH 40001"
        ))
        .unwrap();
        insert_events("ut_append", "('t', now(), '{}')");
        assert!(last(&format!(
            "seq = 40001 AND tableoid = '{log}_from_40000'::regclass"
        )));
        insert_events("ut_append", "('t', now(), '{}')");
        assert!(last(&format!(
            "seq = 40002 AND tableoid = '{log}_default'::regclass"
        )));
        assert_eq!(appended(), before + 3);

        // Past every segment: the default partition.
        Spi::run(&format!(
            "ALTER TABLE {log} ALTER COLUMN seq RESTART WITH 50000"
        ))
        .unwrap();
        insert_events("ut_append", "('t', now(), '{}')");
        assert_eq!(appended(), before + 4);
        assert!(last(&format!(
            "seq = 50000 AND tableoid = '{log}_default'::regclass"
        )));
        assert!(last(written_as_an_insert));

        // Ids past what fits in the row (stored out of line), written in a subtransaction: the
        // top transaction's id, as pg_current_xact_id() gives.
        Spi::run(
            "DO $$ BEGIN
               BEGIN
                 INSERT INTO ut_append (event_type, payload) SELECT 't', '{}' FROM generate_series(1, 600);
               EXCEPTION WHEN division_by_zero THEN NULL;
               END;
             END $$",
        )
        .unwrap();
        assert_eq!(appended(), before + 5);
        assert!(last(written_as_an_insert));
        assert!(last(
            "event_ids = ARRAY(SELECT event_id FROM (SELECT event_id FROM ut_append ORDER BY event_id DESC LIMIT 600) l ORDER BY event_id)"
        ));
        assert!(last(&format!(
            "EXISTS (SELECT FROM pg_class c JOIN pg_class t ON t.oid = c.reltoastrelid
                     WHERE c.oid = '{log}_default'::regclass AND pg_relation_size(t.oid) > 0)"
        )));

        // A column the append does not know: the record goes by INSERT, with its default.
        Spi::run(&format!(
            "ALTER TABLE {log} ADD COLUMN note text DEFAULT 'by insert'"
        ))
        .unwrap();
        insert_events("ut_append", "('t', now(), '{}')");
        assert_eq!(appended(), before + 5);
        assert!(last("note = 'by insert'"));
        assert!(last(written_as_an_insert));
        Spi::run(&format!("ALTER TABLE {log} DROP COLUMN note")).unwrap();
        insert_events("ut_append", "('t', now(), '{}')");
        assert_eq!(appended(), before + 6);
        assert!(last(written_as_an_insert));

        // A trigger on a segment: the record goes by INSERT, which fires it.
        Spi::run(&format!(
            "CREATE TABLE ut_append_fired (seq bigint);
             CREATE FUNCTION ut_append_fire() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN INSERT INTO ut_append_fired VALUES (NEW.seq); RETURN NULL; END $$;
             CREATE TRIGGER ut_append_fire AFTER INSERT ON {log}_default
               FOR EACH ROW EXECUTE FUNCTION ut_append_fire()"
        ))
        .unwrap();
        insert_events("ut_append", "('t', now(), '{}')");
        assert_eq!(appended(), before + 6);
        assert_eq!(
            scalar_i64(&format!(
                "SELECT count(*) FROM ut_append_fired f JOIN {log} c USING (seq)"
            )),
            1
        );
        Spi::run(&format!("DROP TRIGGER ut_append_fire ON {log}_default")).unwrap();
        insert_events("ut_append", "('t', now(), '{}')");
        assert_eq!(appended(), before + 7);

        // Every record is applied once: the view counts every event.
        Spi::run(
            "SELECT eventview.create_view('ut_append_n', 'ut_append', group_by => '{\"k\": \"$.k\"}',
                                          measures => '{\"n\": \"count(*)\"}')",
        )
        .unwrap();
        insert_events("ut_append", "('t', now(), '{}')");
        Spi::run("SELECT eventview.refresh('ut_append_n')").unwrap();
        assert_eq!(scalar_i64("SELECT sum(n)::bigint FROM ut_append_n"), 610);
    }

    /// Retention pruning logs nothing, so after an event is pruned and inserted again under its
    /// id, a batch of inserts alone holds that id twice: it is still read, and counted, once.
    #[pg_test]
    fn an_event_pruned_and_inserted_again_in_one_batch_counts_once() {
        Spi::run("SELECT eventview.create_event_table('ut_again', retention => '1 day')").unwrap();
        Spi::run("SELECT eventview.create_view('ut_again_n', 'ut_again', measures => '{\"n\": \"count(*)\", \"s\": \"sum($.v)\"}')").unwrap();
        let insert = |v: i32, age: &str| {
            Spi::run(&format!(
                "INSERT INTO ut_again (event_id, event_type, occurred_at, payload) OVERRIDING SYSTEM VALUE
                 VALUES (5, 't', now() - interval '{age}', '{{\"v\": {v}}}')"
            ))
            .unwrap()
        };
        insert(1, "2 days");
        assert_eq!(scalar_i64("SELECT eventview.prune('ut_again')"), 1);
        insert(7, "1 hour");
        assert_eq!(scalar_i64("SELECT count(*) FROM ut_again"), 1);
        Spi::run("SELECT eventview.refresh('ut_again_n')").unwrap();
        assert_eq!(scalar_i64("SELECT n FROM ut_again_n"), 1);
        assert_eq!(scalar_i64("SELECT s::bigint FROM ut_again_n"), 7);
    }

    /// Statements kept by `plan_cache` follow the objects their text names: a table dropped
    /// and created again with other columns, a changed definition, a dropped and re-created
    /// view. At most CAPACITY are kept, and the settings they run under do not leak.
    #[pg_test]
    fn cached_statements_follow_ddl_and_stay_bounded() {
        use crate::pg::spi::one;
        let count = "SELECT count(*)::bigint FROM ut_cached";
        Spi::run("CREATE TABLE ut_cached (a int); INSERT INTO ut_cached VALUES (1), (2)").unwrap();
        assert_eq!(one::<i64>(count, &[]).unwrap(), Some(2));
        Spi::run("DROP TABLE ut_cached; CREATE TABLE ut_cached (b text, c int); INSERT INTO ut_cached VALUES ('x', 1)").unwrap();
        assert_eq!(one::<i64>(count, &[]).unwrap(), Some(1));
        let pick = "SELECT b FROM ut_cached WHERE c = $1";
        assert_eq!(
            one::<String>(pick, &[1.into()]).unwrap().as_deref(),
            Some("x")
        );
        Spi::run("ALTER TABLE ut_cached ALTER COLUMN b TYPE int USING length(b)").unwrap();
        assert_eq!(one::<i32>(pick, &[1.into()]).unwrap(), Some(1));

        // A view's apply statement, cached by the first refresh, after its view is dropped and
        // created again under the same name with another definition (new storage, new id).
        setup_events();
        let scratch_n = "SELECT count(*) FROM ut_events WHERE event_type = 'a'";
        for measures in [
            "{\"n\": \"count(*)\"}",
            "{\"n\": \"count(*)\", \"q\": \"sum($.qty)\"}",
        ] {
            Spi::run(&format!(
                "SELECT eventview.create_view('ut_cv', 'ut_events', measures => '{measures}', event_types => ARRAY['a'])"
            ))
            .unwrap();
            Spi::run("INSERT INTO ut_events (event_type, payload) VALUES ('a', '{\"qty\": 1}')")
                .unwrap();
            assert_eq!(scalar_i64("SELECT eventview.refresh('ut_cv')"), 1);
            assert_eq!(scalar_i64("SELECT n FROM ut_cv"), scalar_i64(scratch_n));
            Spi::run("INSERT INTO ut_events (event_type, payload) VALUES ('a', '{\"qty\": 1}')")
                .unwrap();
            assert_eq!(scalar_i64("SELECT eventview.refresh('ut_cv')"), 1);
            assert_eq!(scalar_i64("SELECT n FROM ut_cv"), scalar_i64(scratch_n));
            Spi::run("SELECT eventview.drop_view('ut_cv')").unwrap();
        }

        for i in 0..(crate::pg::plan_cache::CAPACITY as i64 + 50) {
            assert_eq!(
                one::<i64>(&format!("SELECT {i}::bigint + $1"), &[1i64.into()]).unwrap(),
                Some(i + 1)
            );
        }
        assert!(
            crate::pg::plan_cache::kept() == crate::pg::plan_cache::CAPACITY,
            "{} statements kept",
            crate::pg::plan_cache::kept()
        );
        let settings = Spi::get_one::<String>(
            "SELECT current_setting('plan_cache_mode') || ' ' || current_setting('enable_memoize')",
        )
        .unwrap();
        assert_eq!(settings.as_deref(), Some("auto on"));
    }

    /// The worker refreshes its views, and a Citus worker's connection its shards' views, in
    /// the same order at every cycle: with a cycle of statements longer than the cache holds,
    /// most of them are still found kept at the next cycle (evicting the least recently used
    /// would evict each one just before it is needed, and prepare every one again).
    #[pg_test]
    fn a_cycle_through_more_statements_than_kept_finds_most_of_them_kept() {
        use crate::pg::plan_cache::{forget_all, prepared, CAPACITY};
        use crate::pg::spi::one;
        forget_all();
        let cycle = CAPACITY as i64 + CAPACITY as i64 / 8;
        let run_cycle = || {
            let before = prepared();
            for i in 0..cycle {
                let sql = format!("SELECT {i}::bigint + $1 AS cycled");
                assert_eq!(one::<i64>(&sql, &[1i64.into()]).unwrap(), Some(i + 1));
            }
            prepared() - before
        };
        assert_eq!(run_cycle(), cycle as u64, "the first cycle prepares each");
        for _ in 0..3 {
            let again = run_cycle();
            assert!(
                again < cycle as u64 / 2,
                "a cycle of {cycle} statements prepared {again} of them again"
            );
        }
    }

    /// Inserts `n` events of about 330 bytes (keys 0-9) into `table`.
    fn add_padded_events(table: &str, n: i64) {
        Spi::run(&format!(
            "INSERT INTO {table} (event_type, payload)
             SELECT 'a', jsonb_build_object('k', i % 10, 'pad', repeat('x', 300)) FROM generate_series(1, {n}) i"
        ))
        .unwrap()
    }

    /// A backend keeps the refresh's statements with a plan per size class of the tables they
    /// read: one planned while the event table was empty must not read a large table the same
    /// way (it would scan the whole table for each run of changed ids). Checked by the buffers a
    /// refresh of ten events touches after the table grew.
    #[pg_test]
    fn refresh_plans_follow_the_tables_as_they_grow() {
        Spi::run("SELECT eventview.create_event_table('ut_grow')").unwrap();
        Spi::run("SELECT eventview.create_view('ut_grow_v', 'ut_grow', group_by => '{\"k\": \"$.k\"}', measures => '{\"n\": \"count(*)\"}')").unwrap();
        let add = |n: i64| add_padded_events("ut_grow", n);
        // Analyzed while empty, as autovacuum or a restore leaves a new table: a plan made now
        // reads it by sequential scan, and kept for any size it would go on doing so.
        Spi::run("ANALYZE ut_grow").unwrap();
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_grow_v')"), 0);
        add(10);
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_grow_v')"), 10);
        add(100_000);
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_grow_v')"), 100_000);
        let table_pages = scalar_i64(
            "SELECT pg_relation_size('ut_grow') / current_setting('block_size')::bigint",
        );
        add(10);
        let plan = Spi::get_one::<pgrx::Json>(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT eventview.refresh('ut_grow_v')",
        )
        .unwrap()
        .unwrap()
        .0;
        let buffers = ["Shared Hit Blocks", "Shared Read Blocks"]
            .iter()
            .map(|k| plan[0]["Plan"][k].as_i64().unwrap_or(0))
            .sum::<i64>();
        assert!(table_pages > 4000, "{table_pages} pages");
        assert!(
            buffers < table_pages / 4,
            "a refresh of 10 events touched {buffers} buffers, the table has {table_pages} pages"
        );
        assert_eq!(scalar_i64("SELECT sum(n)::bigint FROM ut_grow_v"), 100_020);
    }

    /// The statements of a refresh keep their plan while the event table and changelog keep
    /// their size (planning them is a third of a small refresh), and are planned again when the
    /// table has doubled.
    #[pg_test]
    fn refresh_plans_are_kept_until_a_table_doubles() {
        Spi::run("SELECT eventview.create_event_table('ut_keep')").unwrap();
        Spi::run("SELECT eventview.create_view('ut_keep_v', 'ut_keep', group_by => '{\"k\": \"$.k\"}', measures => '{\"n\": \"count(*)\", \"top\": \"max($.k)\"}')").unwrap();
        let add = |n: i64| add_padded_events("ut_keep", n);
        add(5000);
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_keep_v')"), 5000);
        // The size classes a refresh plans by, as it takes them after the events were added.
        // The observer's also follows the size of `_observed`, which every table's observer
        // writes (the tests running beside this one too): when that one moves, the observer's
        // statement alone is planned again.
        let relid = crate::relation::resolve("ut_keep").unwrap();
        let source = crate::catalog::source_by_relid(relid).unwrap().unwrap();
        let classes = || (source.plan_sizes(), source.observer_plan_sizes());
        add(10);
        let mut last = classes();
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_keep_v')"), 10);
        let before = crate::pg::plan_cache::prepared();
        let mut observed_moved = 0;
        for _ in 0..4 {
            add(10);
            let now = classes();
            assert_eq!(
                now.0, last.0,
                "ten more events changed the table's size class"
            );
            if now.1 != last.1 {
                observed_moved += 1;
            }
            last = now;
            assert_eq!(scalar_i64("SELECT eventview.refresh('ut_keep_v')"), 10);
        }
        assert_eq!(
            crate::pg::plan_cache::prepared(),
            before + observed_moved,
            "refreshes of a table of the same size prepared statements again"
        );
        add(10_000);
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_keep_v')"), 10_000);
        let replanned = crate::pg::plan_cache::prepared() - before;
        assert!(
            replanned >= 2,
            "the apply and the observer were not planned again for the doubled table ({replanned})"
        );
        assert_eq!(scalar_i64("SELECT sum(n)::bigint FROM ut_keep_v"), 15_050);
    }

    /// Every transaction id the extension stores for event table `table` (changelog records,
    /// the views' and the observer's positions) moved far ahead, as a restore into a cluster
    /// whose transaction counter is behind leaves them.
    fn move_positions_ahead(source_id: i32) {
        let ahead = "1099511627776"; // 2^40
        let snap = |col: &str| {
            format!(
                "{col} = format('%s:%s:%s', pg_snapshot_xmin({col})::text::numeric + {ahead},
                                pg_snapshot_xmax({col})::text::numeric + {ahead},
                                array_to_string(ARRAY(SELECT x::text::numeric + {ahead} FROM pg_snapshot_xip({col}) x), ','))::pg_snapshot"
            )
        };
        Spi::run(&format!("UPDATE eventview._changes_{source_id} SET xid = (xid::text::numeric + {ahead})::text::xid8")).unwrap();
        Spi::run(&format!(
            "UPDATE eventview._views SET {}, applied_own_xid = (applied_own_xid::text::numeric + {ahead})::text::xid8 WHERE source_id = {source_id}",
            snap("applied_snapshot")
        ))
        .unwrap();
        Spi::run(&format!(
            "UPDATE eventview._sources SET {}, observed_own_xid = (observed_own_xid::text::numeric + {ahead})::text::xid8 WHERE source_id = {source_id}",
            snap("observed_snapshot")
        ))
        .unwrap();
    }

    /// Positions restored from a cluster whose transactions are ahead: refresh refuses them
    /// (55000) rather than count this cluster's changes as applied; renumbered, every view goes on
    /// exactly where it was (views at different positions, inserts, updates and deletes pending,
    /// the observer too), and new changes are applied once. A twin table that stayed put gets the
    /// same changes: its observed fields must come out the same.
    #[pg_test]
    fn positions_from_another_cluster_are_renumbered_exactly() {
        for table in ["ut_moved", "ut_stayed"] {
            Spi::run(&format!("SELECT eventview.create_event_table('{table}')")).unwrap();
            for (view, measures) in [
                ("a", r#"{"n": "count(*)", "hi": "max($.x)"}"#),
                ("b", r#"{"d": "count_distinct($.x)", "lo": "min($.x)"}"#),
            ] {
                Spi::run(&format!(
                    "SELECT eventview.create_view('{table}_{view}', '{table}', group_by => '{{\"k\": \"$.k\"}}', measures => '{measures}')"
                ))
                .unwrap();
            }
        }
        let source_id = scalar_i64(
            "SELECT source_id FROM eventview._sources WHERE relid = 'ut_moved'::regclass",
        ) as i32;
        let both = |sql: &str| {
            for table in ["ut_moved", "ut_stayed"] {
                Spi::run(&sql.replace("$T", table)).unwrap();
            }
        };
        let add = |n: i64, from: i64| {
            both(&format!(
                "INSERT INTO $T (event_type, payload)
                 SELECT 'a', jsonb_build_object('k', i % 3, 'x', i) FROM generate_series({from}, {from} + {n} - 1) i"
            ))
        };
        let refresh = |table: &str, view: &str| {
            scalar_i64(&format!("SELECT eventview.refresh('{table}_{view}')"))
        };
        add(20, 1);
        assert_eq!(refresh("ut_moved", "a"), 20);
        assert_eq!(refresh("ut_stayed", "a"), 20);
        add(10, 21);
        both("UPDATE $T SET payload = payload || '{\"x\": 100}' WHERE payload @> '{\"x\": 2}'");
        both("DELETE FROM $T WHERE payload @> '{\"x\": 29}'");
        assert_eq!(refresh("ut_moved", "b"), 32);
        assert_eq!(refresh("ut_stayed", "b"), 32);
        add(5, 31);
        // Positions written by this very transaction are not from elsewhere.
        assert_eq!(
            Spi::get_one::<bool>(&format!(
                "SELECT eventview._positions_from_elsewhere({source_id})"
            ))
            .unwrap(),
            Some(false)
        );
        // Pending: for a, 10 inserts, an update, a delete and 5 inserts; for b, the 5 inserts.
        move_positions_ahead(source_id);
        // Refresh refuses; so does a full rebuild, which would store a position of this cluster
        // under which the restored records read as pending once more.
        for call in [
            "eventview.refresh('ut_moved_a')",
            "eventview.rebuild('ut_moved_b')",
        ] {
            Spi::run(&format!(
                "DO $$ BEGIN PERFORM {call}; RAISE EXCEPTION 'a position from the future was taken';
                   EXCEPTION WHEN object_not_in_prerequisite_state THEN NULL; END $$"
            ))
            .unwrap();
        }
        assert_eq!(
            Spi::get_one::<bool>(&format!("SELECT eventview._rebase_positions({source_id})"))
                .unwrap(),
            Some(true)
        );
        assert_eq!(
            Spi::get_one::<bool>(&format!("SELECT eventview._rebase_positions({source_id})"))
                .unwrap(),
            Some(false)
        );
        for table in ["ut_moved", "ut_stayed"] {
            assert_eq!(refresh(table, "a"), 17, "{table}");
            assert_eq!(refresh(table, "b"), 5, "{table}");
        }
        add(4, 36);
        let key = "CASE WHEN jsonb_typeof(payload->'k') IN ('string','number','boolean') THEN payload->>'k' END";
        for table in ["ut_moved", "ut_stayed"] {
            assert_eq!(refresh(table, "a"), 4, "{table}");
            assert_eq!(refresh(table, "b"), 4, "{table}");
            assert_matches(
                &format!("{table}_a"),
                &format!(
                    "SELECT {key}, count(*), max((payload->>'x')::numeric) FROM {table} GROUP BY 1"
                ),
            );
            assert_matches(
                &format!("{table}_b"),
                &format!("SELECT {key}, count(DISTINCT payload->'x'), min((payload->>'x')::numeric) FROM {table} GROUP BY 1"),
            );
        }
        let observed = |table: &str| {
            format!("SELECT event_type, event_version, path, json_type, seen FROM eventview.observed_fields WHERE source = '{table}'::regclass")
        };
        assert_eq!(
            scalar_i64(&format!(
                "SELECT count(*) FROM ((({}) EXCEPT ALL ({})) UNION ALL (({}) EXCEPT ALL ({}))) d",
                observed("ut_moved"),
                observed("ut_stayed"),
                observed("ut_stayed"),
                observed("ut_moved")
            )),
            0
        );
        assert!(
            scalar_i64(&observed("ut_moved").replace(
                "event_type, event_version, path, json_type, seen",
                "count(*)"
            )) > 0
        );
        // Records from the future under positions that are not: refused too (the records would
        // be skipped until this cluster's ids reached theirs).
        let stayed = scalar_i64(
            "SELECT source_id FROM eventview._sources WHERE relid = 'ut_stayed'::regclass",
        );
        add(1, 40);
        Spi::run(&format!("UPDATE eventview._changes_{stayed} SET xid = (xid::text::numeric + 1099511627776)::text::xid8")).unwrap();
        Spi::run(
            "DO $$ BEGIN PERFORM eventview.refresh('ut_stayed_a'); RAISE EXCEPTION 'refresh took records from the future';
               EXCEPTION WHEN object_not_in_prerequisite_state THEN NULL; END $$",
        )
        .unwrap();
    }

    /// A rebuild of a whole bucketed view over a table with retention starts at the retention
    /// horizon, but recomputes all that can be: the note that a field was redeclared goes.
    #[pg_test]
    fn rebuilding_what_retention_keeps_clears_the_redeclaration_note() {
        Spi::run("SELECT eventview.create_event_table('ut_kept', retention => '30 days')").unwrap();
        Spi::run("SELECT eventview.define_field('ut_kept', 'k', '$.k')").unwrap();
        Spi::run("SELECT eventview.create_view('ut_kept_v', 'ut_kept', group_by => '{\"k\": \"k\"}', time_bucket => '1 day')").unwrap();
        Spi::run("SELECT eventview.define_field('ut_kept', 'k', '$.key')").unwrap();
        let note = "SELECT last_error FROM eventview.views WHERE name = 'ut_kept_v'::regclass";
        assert!(Spi::get_one::<String>(note)
            .unwrap()
            .is_some_and(|n| n.contains("redeclared")));
        // A window leaves older buckets as they were: the note stays.
        Spi::run("SELECT eventview.rebuild('ut_kept_v', now() - interval '1 day', NULL)").unwrap();
        assert!(Spi::get_one::<String>(note).unwrap().is_some());
        Spi::run("SELECT eventview.rebuild('ut_kept_v')").unwrap();
        assert_eq!(Spi::get_one::<String>(note).unwrap(), None);
    }

    /// drop_event_table removes every catalog row of the table (no foreign key cascades them).
    #[pg_test]
    fn dropping_an_event_table_leaves_no_catalog_rows() {
        Spi::run("SELECT eventview.create_event_table('ut_gone')").unwrap();
        let id = scalar_i64(
            "SELECT source_id FROM eventview._sources WHERE relid = 'ut_gone'::regclass",
        );
        Spi::run("SELECT eventview.define_field('ut_gone', 'k', '$.k')").unwrap();
        Spi::run(
            "SELECT eventview.create_view('ut_gone_v', 'ut_gone', group_by => '{\"k\": \"k\"}')",
        )
        .unwrap();
        Spi::run("INSERT INTO ut_gone (event_type, payload) VALUES ('a', '{\"k\": 1}')").unwrap();
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_gone_v')"), 1);
        let rows = format!(
            "SELECT (SELECT count(*) FROM eventview._sources WHERE source_id = {id}) + (SELECT count(*) FROM eventview._views WHERE source_id = {id})
                  + (SELECT count(*) FROM eventview._fields WHERE source_id = {id}) + (SELECT count(*) FROM eventview._observed WHERE source_id = {id})
                  + (SELECT count(*) FROM eventview._observed_versions WHERE source_id = {id})"
        );
        assert!(scalar_i64(&rows) >= 5);
        Spi::run("SELECT eventview.drop_event_table('ut_gone', cascade => true)").unwrap();
        assert_eq!(scalar_i64(&rows), 0);
    }

    /// A distributed view's refresh merges the shards' group changes into the coordinator's
    /// groups as they answer them: in columns, or (a node with an older library) one JSON
    /// object per group, both in one refresh. A view of this node stands in for a shard's
    /// (writing its group changes as one does), another for the coordinator's merged groups.
    /// The columns carry their values as text, read back the same under other settings: taken
    /// with DateStyle `SQL, DMY`, merged with `SQL, MDY`, 2026-11-03 stays November 3.
    #[pg_test]
    fn shards_group_changes_merge_alike_in_columns_and_as_objects_whatever_the_settings() {
        Spi::run("SELECT eventview.create_event_table('ut_merge')").unwrap();
        let definition = r#"group_by => '{"sku": "$.sku"}', measures => '{"n": "count(*)", "qty": "sum($.qty)", "top": "max($.p)", "low": "min($.p)"}', time_bucket => '1 day'"#;
        for name in ["ut_shard", "ut_merged"] {
            Spi::run(&format!(
                "SELECT eventview.create_view('{name}', 'ut_merge', {definition})"
            ))
            .unwrap();
        }
        let shard = writing_group_changes("ut_shard");
        let insert = |rows: &str| insert_events("ut_merge", rows);
        insert(
            r#"('a', '2026-11-03 10:00+00', '{"sku": "x", "qty": 1, "p": 5.25}'),
               ('a', '2026-11-03 11:00+00', '{"sku": "a,\"b\"{c}\\", "qty": 2, "p": 7}'),
               ('a', '2026-11-04 11:00+00', '{"qty": 4, "p": 0.5}')"#,
        );
        Spi::run("SELECT eventview.refresh('ut_shard')").unwrap();
        Spi::run("SET DateStyle = 'SQL, DMY'").unwrap();
        let in_columns = crate::citus::take_changes_of(&shard, "'1'", true).unwrap();
        assert!(in_columns.contains(r#""columns""#), "{in_columns}");
        insert(
            r#"('a', '2026-11-03 12:00+00', '{"sku": "x", "qty": 3, "p": 9.125}'),
               ('a', '2026-11-05 12:00+00', '{"sku": "", "qty": 5, "p": 1}')"#,
        );
        Spi::run("SELECT eventview.refresh('ut_shard')").unwrap();
        let as_objects = crate::citus::take_changes_of(&shard, "'1'", false).unwrap();
        assert!(as_objects.contains(r#""changes""#), "{as_objects}");
        Spi::run("SET DateStyle = 'SQL, MDY'").unwrap();
        // (No retraction: no group is merged anew from partial groups.)
        crate::citus::merge_answers_into(
            &view_record("ut_merged"),
            &[&in_columns, &as_objects],
            "no_partial_groups",
        )
        .unwrap();
        Spi::run("RESET DateStyle").unwrap();
        assert_eq!(scalar_i64("SELECT count(*) FROM ut_merged"), 4);
        assert_matches("ut_merged", "SELECT * FROM ut_shard");
        assert_eq!(
            scalar_i64("SELECT count(*) FROM ut_merged WHERE bucket = '2026-11-03' AND sku = 'x' AND n = 2 AND qty = 4 AND top = 9.125 AND low = 5.25"),
            1
        );
    }

    /// A shard's view, refreshed for a coordinator that asks for its group changes in columns,
    /// hands them back from its apply without writing them to its group changelog; what the
    /// changelog holds from other refreshes goes with them. Merged into the coordinator's
    /// groups, they make what the shard's view holds. A view of this node keeping its groups
    /// in a table of partial groups (as a shard's view keeps them in its groups shard) stands
    /// in for a shard's view, another view for the coordinator's merged groups.
    #[pg_test]
    fn a_shards_apply_hands_its_group_changes_back_and_the_changelog_keeps_the_others() {
        Spi::run("SELECT eventview.create_event_table('ut_hb')").unwrap();
        Spi::run(
            r#"SELECT eventview.create_view('ut_hb_merged', 'ut_hb', group_by => '{"sku": "$.sku"}',
                 measures => '{"n": "count(*)", "qty": "sum($.qty)", "top": "max($.p)"}', time_bucket => '1 day')"#,
        )
        .unwrap();
        let merged = view_record("ut_hb_merged");
        Spi::run(&format!(
            "CREATE TABLE eventview.ut_hb_groups (LIKE eventview._v{}_data INCLUDING DEFAULTS);
             ALTER TABLE eventview.ut_hb_groups ADD COLUMN __shard bigint NOT NULL DEFAULT 1",
            merged.view_id
        ))
        .unwrap();
        let day = Spi::get_one::<pgrx::datum::Interval>("SELECT interval '1 day'").unwrap();
        let relid = crate::views::create_view(crate::views::CreateViewArgs {
            name: "ut_hb_shard",
            source: "ut_hb",
            group_by: r#"{"sku": "$.sku"}"#,
            measures: r#"{"n": "count(*)", "qty": "sum($.qty)", "top": "max($.p)"}"#,
            event_types: None,
            time_bucket: day,
            filter: None,
            realtime: false,
            on_type_error: "quarantine",
            time_zone: None,
            unnest: None,
            data_table: Some("eventview.ut_hb_groups"),
        })
        .unwrap();
        let shard = writing_group_changes("ut_hb_shard");
        let changelog = format!("eventview._v{}_changes", shard.view_id);
        let insert = |rows: &str| insert_events("ut_hb", rows);
        insert(
            r#"('a', '2026-11-03 10:00+00', '{"sku": "x", "qty": 1, "p": 5.25}'),
               ('a', '2026-11-03 10:30+00', '{"sku": "x", "qty": 1, "p": 11}'),
               ('a', '2026-11-03 11:00+00', '{"sku": "a,\"b\"{c}\\", "qty": 2, "p": 7}'),
               ('a', '2026-11-04 11:00+00', '{"qty": 4, "p": 0.5}'),
               ('a', '2026-11-06 11:00+00', '{"sku": "no price", "qty": 6}')"#,
        );
        Spi::run("SET DateStyle = 'SQL, DMY'").unwrap();
        let (applied, _, first) = crate::citus::refresh_and_take(relid, "'1'", true).unwrap();
        assert_eq!(applied, 5);
        assert!(first.contains(r#""columns""#), "{first}");
        assert_eq!(
            scalar_i64(&format!("SELECT pg_relation_size('{changelog}')")),
            0,
            "the apply wrote its group changes to the changelog"
        );
        // A refresh that does not collect what the applies hand back (none but a coordinator's
        // does) writes them to the changelog, for the next take.
        insert(r#"('a', '2026-11-03 12:00+00', '{"sku": "x", "qty": 3, "p": 9.125}')"#);
        crate::refresh::refresh_with_sources(relid, "ut_hb_shard").unwrap();
        assert_eq!(scalar_i64(&format!("SELECT count(*) FROM {changelog}")), 1);
        // A retraction of a group's maximum: the coordinator merges that group anew from the
        // partial groups.
        insert(r#"('a', '2026-11-05 12:00+00', '{"sku": "", "qty": 5, "p": 1}')"#);
        Spi::run("DELETE FROM ut_hb WHERE payload ->> 'p' = '11'").unwrap();
        let (applied, _, second) = crate::citus::refresh_and_take(relid, "'1'", true).unwrap();
        assert_eq!(applied, 2);
        assert_eq!(scalar_i64(&format!("SELECT count(*) FROM {changelog}")), 0);
        Spi::run("SET DateStyle = 'SQL, MDY'").unwrap();
        crate::citus::merge_answers_into(&merged, &[&first, &second], "eventview.ut_hb_groups")
            .unwrap();
        Spi::run("RESET DateStyle").unwrap();
        assert_eq!(scalar_i64("SELECT count(*) FROM ut_hb_merged"), 5);
        assert_matches("ut_hb_merged", "SELECT * FROM ut_hb_shard");
        assert_eq!(
            scalar_i64("SELECT count(*) FROM ut_hb_merged WHERE bucket = '2026-11-03' AND sku = 'x' AND n = 2 AND qty = 4 AND top = 9.125"),
            1
        );
        assert_eq!(
            scalar_i64("SELECT count(*) FROM ut_hb_merged WHERE sku = 'no price' AND top IS NULL AND n = 1"),
            1
        );
        // The collection ends with the refresh that collected, failed or not; one within
        // another's leaves the outer one collecting.
        let failed = crate::refresh::collecting_handed_back(shard.view_id, || {
            Err::<(), _>(crate::errors::EvError::invalid("stop".to_string()))
        });
        assert!(failed.is_err());
        assert!(!crate::refresh::collecting_for(shard.view_id));
        let (inner, _) = crate::refresh::collecting_handed_back(shard.view_id, || {
            let failed = crate::refresh::collecting_handed_back(merged.view_id, || {
                Err::<(), _>(crate::errors::EvError::invalid("stop".to_string()))
            });
            Ok((
                failed.is_err(),
                crate::refresh::collecting_for(shard.view_id),
                crate::refresh::collecting_for(merged.view_id),
            ))
        })
        .unwrap();
        assert_eq!(inner, (true, true, false));
        assert!(!crate::refresh::collecting_for(shard.view_id));
        // Columns that are not this library's are refused, nothing merged.
        let refused = crate::citus::merge_answers_into(
            &merged,
            &[r#"{"columns": ["{t}"], "values": []}"#],
            "no_partial_groups",
        )
        .unwrap_err();
        assert_eq!(
            refused.code,
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "{}",
            refused.message
        );
        assert!(
            refused.message.contains("1 columns, where it reads 9"),
            "{}",
            refused.message
        );
    }

    /// A shard's node answers each of the shard's drift rows once (`take_shard_drift`), whichever
    /// observer recorded it, and a take in a transaction that rolls back takes nothing.
    #[pg_test]
    fn a_shards_drift_rows_are_taken_once_each() {
        Spi::run("SELECT eventview.create_event_table('ut_dt')").unwrap();
        let relid = crate::relation::resolve("ut_dt").unwrap();
        // This table's observer alone (`_observe_all` would move the observers of the tables of
        // the tests running beside this one).
        let observe = || {
            let source = crate::catalog::source_by_relid(relid).unwrap().unwrap();
            crate::observer::observe(&source).unwrap();
        };
        let taken = || {
            let rows = crate::catalog::distributed::take_shard_drift(relid).unwrap();
            let rows: Vec<serde_json::Value> = serde_json::from_str(&rows).unwrap();
            let mut paths: Vec<String> = rows
                .iter()
                .map(|r| {
                    format!(
                        "{} {}",
                        r["change"].as_str().unwrap(),
                        r["path"].as_str().unwrap()
                    )
                })
                .collect();
            paths.sort();
            paths
        };
        assert_eq!(taken(), Vec::<String>::new());
        insert_events("ut_dt", r#"('order', now(), '{"sku": "A", "qty": 1}')"#);
        observe();
        assert_eq!(taken(), ["added $.qty", "added $.sku"]);
        assert_eq!(taken(), Vec::<String>::new());
        insert_events(
            "ut_dt",
            r#"('order', now(), '{"sku": "A", "qty": "one", "gift": true}')"#,
        );
        observe();
        // Taken in a subtransaction that rolls back: the rows stay to be taken.
        let rolled_back = crate::pg::subtransaction::unless_failed(
            |_| false,
            || -> crate::errors::EvResult<()> {
                assert_eq!(taken(), ["added $.gift", "type_changed $.qty"]);
                Err(crate::errors::EvError::invalid("the take rolls back"))
            },
        );
        assert!(rolled_back.is_err());
        assert_eq!(taken(), ["added $.gift", "type_changed $.qty"]);
        assert_eq!(taken(), Vec::<String>::new());
        // Rows deleted after they were taken do not come back; a row recorded after them is
        // taken alone.
        Spi::run("DELETE FROM eventview.drift WHERE source = 'ut_dt'::regclass").unwrap();
        insert_events(
            "ut_dt",
            r#"('order', now(), '{"sku": "A", "qty": 2, "note": "x"}')"#,
        );
        observe();
        assert_eq!(taken(), ["added $.note"]);
        assert_eq!(taken(), Vec::<String>::new());
        // A mark above the ids given out (the identity restarted by hand) counts as 0.
        Spi::run(
            "UPDATE eventview._sources SET drift_taken = 1000000000000 WHERE relid = 'ut_dt'::regclass",
        )
        .unwrap();
        assert_eq!(taken(), ["added $.note"]);
        assert_eq!(taken(), Vec::<String>::new());
    }
}
