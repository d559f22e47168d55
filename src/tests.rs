//! In-backend unit tests (`cargo pgrx test`): what needs a running Postgres. Each test runs in
//! one transaction, which also exercises refreshing changes made by the refreshing transaction
//! itself. User-visible output is covered by pg_regress; concurrency by tests/ (pytest).

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn scalar_i64(sql: &str) -> i64 {
        Spi::get_one::<i64>(sql).unwrap().unwrap()
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

    #[pg_test]
    fn own_transaction_is_never_visible_in_the_refresh_snapshot() {
        Spi::run("CREATE TEMP TABLE t_force_xid (x int); INSERT INTO t_force_xid VALUES (1)").unwrap();
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
        Spi::run("UPDATE ut_events SET payload = payload || '{\"p\": 3}' WHERE payload @> '{\"p\": 5}'").unwrap();
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_v')"), 3);
        assert_matches("ut_v", scratch);
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_v')"), 0);
        // More changes later in the same transaction are not mistaken for applied ones.
        Spi::run("INSERT INTO ut_events (event_type, payload) VALUES ('a', '{\"sku\": \"w\", \"qty\": 1, \"p\": 1}')").unwrap();
        Spi::run("DELETE FROM ut_events WHERE payload @> '{\"p\": 9}'").unwrap();
        assert_eq!(scalar_i64("SELECT eventview.refresh('ut_v')"), 2);
        assert_matches("ut_v", scratch);
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
        let walked = "SELECT w.event_type, w.event_version, w.path, w.json_type, w.events
                      FROM (SELECT array_agg(t) t, array_agg(v) v, array_agg(p) p FROM docs) d
                      CROSS JOIN LATERAL eventview._payload_shapes(d.t, d.v, d.p) w";
        let diff = scalar_i64(&format!(
            "SELECT count(*) FROM ((({walked}) EXCEPT ALL ({reference})) UNION ALL (({reference}) EXCEPT ALL ({walked}))) d"
        ));
        assert_eq!(diff, 0);
        assert!(scalar_i64(&format!("SELECT count(*) FROM ({walked}) w")) >= 15);
        // Nested far below the walk's depth limit: walked to the limit only.
        let deep = scalar_i64(
            r#"SELECT count(*) FROM eventview._payload_shapes(ARRAY['d'], ARRAY[1],
                   ARRAY[(repeat('{"a":', 10000) || '1' || repeat('}', 10000))::jsonb])"#,
        );
        assert_eq!(deep, crate::core::observe_sql::MAX_DEPTH as i64);
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
}
