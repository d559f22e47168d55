//! Golden files of the generated SQL: every kind of statement the core generates, for one
//! representative view and its event table, compared with `tests/golden/<kind>.sql`. A change
//! to generated SQL shows as a diff of those files in review.
//!
//! `UPDATE_GOLDEN=1 cargo test -p eventview-core --test golden` rewrites the files from the
//! current code, and removes the files of statement kinds it does not list.

use std::path::{Path, PathBuf};

use eventview_core::definition::{
    parse_definition, DefinitionInput, FieldVariant, LogicalField, SqlType, ViewDefinition,
};
use eventview_core::envelope_sql;
use eventview_core::jsonpath;
use eventview_core::observe_sql;
use eventview_core::sqlgen::{self, Mode, Reads, ValuesInRow, ViewSql};
use eventview_core::{batch, envelope_sql::CAPTURE_OPS};

const VIEW_ID: i32 = 3;
const SOURCE_ID: i32 = 2;
const SOURCE_TABLE: &str = "\"shop\".\"cart_events\"";
/// The event table as the statements that read its rows name it.
const SOURCE_SCAN: &str = "ONLY \"shop\".\"cart_events\"";
const USER_VIEW: &str = "\"shop\".\"cart_daily\"";
const OWNER: &str = "\"shop_owner\"";
const BUCKET_WIDTH: &str = "1 hour";

/// The representative view: grouped by a JSONPath and by a logical field declared for two
/// event versions, bucketed by time, two event types, a filter, every aggregate (with a rich
/// JSONPath in `count`), quarantine on type errors.
fn representative() -> ViewDefinition {
    let variant = |version: i32, path: &str| FieldVariant {
        event_type: None,
        version: Some(version),
        path: path.to_string(),
        plan: jsonpath::plan(path).unwrap(),
    };
    let fields = vec![LogicalField::new(
        "region".into(),
        SqlType::Text,
        vec![variant(1, "$.region"), variant(2, "$.shipping.region")],
    )];
    parse_definition(&DefinitionInput {
        fields: &fields,
        group_by: r#"{"sku": "$.item.sku", "region": "region"}"#,
        measures: r#"{
            "events": "count(*)",
            "coupons": "count($..coupon)",
            "quantity": "sum($.qty)",
            "avg_price": "avg($.price)",
            "lowest": "min($.price)",
            "highest": "max($.price)",
            "buyers": "count_distinct($.user_id)"
        }"#,
        event_types: Some(vec![Some("cart_add".into()), Some("cart_remove".into())]),
        bucketed: true,
        time_zone: None,
        unnest: None,
        filter: Some(r#"{"$.channel": ["web", "app"]}"#),
        on_type_error: "quarantine",
    })
    .unwrap()
}

/// A view the refresh pass in Rust covers (`group_deltas`): the representative view without
/// its filter, rich JSONPath and count_distinct.
fn one_pass() -> ViewDefinition {
    let mut def = representative();
    def.filter.clear();
    def.measures
        .retain(|m| !matches!(m.name.as_str(), "coupons" | "buyers"));
    def
}

fn view(def: &ViewDefinition, log_extremes: bool) -> ViewSql<'_> {
    ViewSql {
        def,
        view_id: VIEW_ID,
        source_id: SOURCE_ID,
        source_scan: SOURCE_SCAN.into(),
        log_extremes,
        feeds_rollups: false,
        bucket_width: Some(BUCKET_WIDTH.into()),
        rollup_source: None,
        data_table: None,
        values_in_row: if log_extremes {
            ValuesInRow::Kept
        } else {
            ValuesInRow::Columns
        },
    }
}

/// The golden files, by statement kind: each file's name and text.
#[derive(Default, PartialEq, Debug)]
struct Kinds(Vec<(&'static str, String)>);

impl Kinds {
    /// Statements of one kind as one file: separated by a blank line, each ended by `;`.
    fn add(&mut self, kind: &'static str, statements: impl IntoIterator<Item = String>) {
        let text: Vec<String> = statements.into_iter().map(|s| format!("{s};\n")).collect();
        self.0.push((kind, text.join("\n")));
    }

    /// Fragments the extension splices into its own statements, each under a `--` line naming
    /// it.
    fn add_fragments(&mut self, kind: &'static str, named: &[(&str, String)]) {
        let text: Vec<String> = named
            .iter()
            .map(|(name, sql)| format!("-- {name}\n{sql}\n"))
            .collect();
        self.0.push((kind, text.join("\n")));
    }
}

/// Every statement kind the core generates.
fn statement_kinds() -> Kinds {
    let def = representative();
    let stored = view(&def, true);
    let realtime = view(&def, false);
    let mut k = Kinds::default();

    // Views: storage, the relation users read, the refresh and its follow-ups, rebuilds.
    k.add("storage_ddl", stored.create_storage());
    k.add(
        "storage_log_ddl",
        stored.log_ddl().into_iter().map(|(_, ddl)| ddl),
    );
    let tables = stored.storage_tables();
    k.add(
        "storage_grants",
        tables.iter().flat_map(|t| sqlgen::storage_grants(t, OWNER)),
    );
    k.add(
        "user_view_stored",
        [stored.create_user_view(USER_VIEW, Reads::Stored)],
    );
    k.add(
        "user_view_realtime",
        [realtime.create_user_view(USER_VIEW, Reads::Realtime)],
    );
    k.add(
        "realtime_pending_check",
        [realtime.realtime_pending_check()],
    );
    k.add(
        "realtime_pending_groups",
        [realtime.realtime_pending_groups()],
    );
    k.add(
        "user_view_replace",
        [stored.replace_user_view(USER_VIEW, Reads::Stored)],
    );
    k.add(
        "user_view_read_only",
        [ViewSql::read_only_trigger(USER_VIEW)],
    );
    k.add("refresh_pending_check", [stored.pending_check()]);
    k.add("refresh_apply_delta", [stored.apply(Mode::Delta)]);
    k.add(
        "refresh_apply_delta_realtime",
        [realtime.apply(Mode::Delta)],
    );
    let one_pass = one_pass();
    k.add(
        "refresh_apply_one_pass",
        [view(&one_pass, true).apply_in_one_pass().unwrap()],
    );
    k.add(
        "refresh_pending_check_one_pass",
        [view(&one_pass, true).pending_check()],
    );
    k.add(
        "refresh_apply_from_shared_pass",
        [view(&one_pass, true).apply_from_shared_pass().unwrap()],
    );
    assert!(stored.apply_in_one_pass().is_none());
    assert!(stored.apply_from_shared_pass().is_none());
    k.add("refresh_fixup", stored.fixup());
    k.add("refresh_merge_logs", stored.merge_logs());
    let mut rebuild_full = vec![stored.forget_type_errors()];
    rebuild_full.extend(stored.clear_all());
    k.add("rebuild_full", rebuild_full);
    k.add("rebuild_full_apply", [stored.apply(Mode::Full)]);
    let mut rebuild_window = vec![stored.forget_type_errors_in_window()];
    rebuild_window.extend(stored.clear_window());
    k.add("rebuild_window", rebuild_window);
    k.add("rebuild_window_apply", [stored.apply(Mode::Window)]);

    // The field observer.
    k.add(
        "observer_pending_check",
        [observe_sql::pending_check(SOURCE_ID)],
    );
    k.add("observer", [observe_sql::observe(SOURCE_ID, SOURCE_SCAN)]);
    k.add(
        "observer_unless_drift",
        [observe_sql::observe_unless_drift(SOURCE_ID, SOURCE_SCAN)],
    );

    // Event tables and capture.
    k.add(
        "event_table",
        [envelope_sql::create_event_table(SOURCE_TABLE)],
    );
    k.add(
        "changelog",
        envelope_sql::create_changelog(SOURCE_ID, 10_000),
    );
    k.add(
        "changelog_from_plain",
        envelope_sql::partition_changelog(SOURCE_ID, 12_345),
    );
    k.add(
        "capture",
        envelope_sql::create_capture(SOURCE_ID, SOURCE_TABLE),
    );
    k.add(
        "capture_owner",
        envelope_sql::capture_owner(SOURCE_ID, OWNER, false),
    );
    let replaced = CAPTURE_OPS
        .iter()
        .filter_map(|op| envelope_sql::replace_capture(SOURCE_ID, op));
    k.add("capture_replace", replaced);
    k.add("capture_drop", envelope_sql::drop_capture(SOURCE_ID, false));
    k.add(
        "partitioned_capture_drop",
        envelope_sql::drop_capture(SOURCE_ID, true),
    );
    k.add(
        "partitioned_event_table",
        [envelope_sql::create_partitioned_event_table(SOURCE_TABLE)],
    );
    k.add(
        "partitioned_capture",
        envelope_sql::create_partitioned_capture(SOURCE_ID, SOURCE_TABLE),
    );
    k.add(
        "key_insert",
        [
            envelope_sql::key_insert(SOURCE_ID, false),
            envelope_sql::key_insert(SOURCE_ID, true),
        ],
    );
    k.add(
        "partition_capture",
        envelope_sql::partition_capture(SOURCE_ID, "\"shop\".\"cart_events_p20261205\"", true),
    );

    // Changelog batches: the parts other statements are made of.
    k.add_fragments(
        "batch_fragments",
        &[
            ("applied_by", batch::applied_by("k.s", "k.own", "k.own_seq")),
            ("touched_rows", batch::touched_rows(SOURCE_SCAN)),
            ("touched_rows_by_id", batch::touched_rows_by_id(SOURCE_SCAN)),
            ("inserted_rows", batch::inserted_rows(SOURCE_SCAN)),
            ("consumed", batch::CONSUMED.to_string()),
        ],
    );
    k
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden")
}

/// A line diff of `want` (the golden file) and `got` (generated): changed lines with `-`/`+`,
/// two lines of context around each change, hunks headed by their line numbers.
fn line_diff(want: &str, got: &str) -> String {
    let a: Vec<&str> = want.lines().collect();
    let b: Vec<&str> = got.lines().collect();
    // Longest common subsequence, from the ends, so the script below walks forwards.
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    // (tag, line in want, line in got, text)
    let mut script: Vec<(char, usize, usize, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            script.push((' ', i, j, a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            script.push(('-', i, j, a[i]));
            i += 1;
        } else {
            script.push(('+', i, j, b[j]));
            j += 1;
        }
    }
    const CONTEXT: usize = 2;
    let changed: Vec<usize> = (0..script.len()).filter(|&k| script[k].0 != ' ').collect();
    let mut out = String::new();
    let mut shown_to = 0;
    for &k in &changed {
        let from = k.saturating_sub(CONTEXT).max(shown_to);
        let to = (k + CONTEXT + 1).min(script.len());
        if from >= to {
            continue;
        }
        if from > shown_to || shown_to == 0 {
            let (_, wi, gi, _) = script[from];
            out.push_str(&format!(
                "@@ golden line {}, generated line {} @@\n",
                wi + 1,
                gi + 1
            ));
        }
        for &(tag, _, _, text) in &script[from..to] {
            out.push_str(&format!("{tag} {text}\n"));
        }
        shown_to = to;
    }
    if out.is_empty() && want != got {
        out.push_str("(the texts differ only in line endings or a final newline)\n");
    }
    out
}

#[test]
fn generated_sql_matches_the_golden_files() {
    let dir = golden_dir();
    let update = std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1");
    let kinds = statement_kinds().0;
    let mut failures = Vec::new();
    if update {
        std::fs::create_dir_all(&dir).unwrap();
    }
    for (kind, sql) in &kinds {
        let path = dir.join(format!("{kind}.sql"));
        if update {
            std::fs::write(&path, sql).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(want) if &want == sql => {}
            Ok(want) => failures.push(format!(
                "{} differs from the generated SQL (- golden, + generated):\n{}",
                path.display(),
                line_diff(&want, sql)
            )),
            Err(e) => failures.push(format!("{}: {e}", path.display())),
        }
    }
    // A golden file of a statement kind the list above does not hold is stale.
    for entry in std::fs::read_dir(&dir).into_iter().flatten() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if path.extension().is_some_and(|e| e == "sql") && !kinds.iter().any(|(k, _)| *k == stem) {
            if update {
                std::fs::remove_file(&path).unwrap();
            } else {
                failures.push(format!("{} belongs to no statement kind", path.display()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "generated SQL differs from the golden files; review the change and, if it is intended, \
         run UPDATE_GOLDEN=1 cargo test -p eventview-core --test golden\n\n{}",
        failures.join("\n")
    );
}

#[test]
fn generated_sql_is_deterministic() {
    assert_eq!(statement_kinds(), statement_kinds());
}

#[test]
fn the_line_diff_shows_changed_lines_with_context() {
    let want = "a\nb\nc\nd\ne\nf\n";
    let got = "a\nb\nc\nD\ne\nf\n";
    let diff = line_diff(want, got);
    assert_eq!(
        diff,
        "@@ golden line 2, generated line 2 @@\n  b\n  c\n- d\n+ D\n  e\n  f\n"
    );
    assert_eq!(line_diff("x\n", "x\n"), "");
    assert!(line_diff("x\n", "x").contains("final newline"));
}
