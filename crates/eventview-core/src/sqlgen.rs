//! SQL generation for one incremental view: its storage, the relation users read, and the
//! statements of a refresh. Pure text generation, deterministic: `tests/golden/` holds every
//! statement for a representative view, and a test compares them with what is generated.
//!
//! Storage (`eventview._v<id>_data`), one row per group:
//!   `__k` (constant true, so a view without keys still has a key), `bucket`, and per group
//!   column `g<i>` with `g<i>_null`: NULL keys are stored as a placeholder plus a flag, so keys
//!   are NOT NULL, the unique index is plain and ON CONFLICT and joins on keys are hashable;
//!   `__count` (events counted), then per measure `m<i>_n` (non-NULL inputs), `m<i>_sum`,
//!   `m<i>_val` (min/max, or the distinct count), `m<i>_sk` (approx_percentile's sketch,
//!   `sketch`); `__dirty` marks groups that took a retraction, or passed the min/max values a
//!   row keeps, in this refresh.
//! Value multisets (`eventview._v<id>_m<i>`, one per min, max, count_distinct or percentile
//! measure):
//!   (keys, v, n), how many counted events of the group have value v. A retracted extreme is
//!   replaced by an index lookup in the group's multiset, never by a scan of the event table; a
//!   distinct count changes by the values whose n crosses zero (`prev_n`: n before the upsert).
//! Value logs (`eventview._v<id>_m<i>_log`, one per min/max measure): the multiset is needed
//!   only when an extreme is retracted, so a refresh of a stored (not realtime) view appends its
//!   (keys, v, n) to an unindexed log instead of upserting the multiset (an upsert costs an index
//!   probe and an index or heap update per value; the append, a heap insert). The log is merged
//!   into the multiset before anything reads the multiset: by a refresh that retracts, by a
//!   refresh with nothing to apply (idle), when it holds more than `eventview.extreme_log_limit`
//!   rows (`_views.extremes_logged` counts them), and when the view turns realtime (realtime
//!   reads use the multisets, so a realtime view's log stays empty). Rebuilds clear it with
//!   the multisets. The log never changes what a view shows: the stored extreme moves outwards
//!   on additions in either case.
//! Values in the row (`m<i>_vals`, one array per min/max measure of a stored view's storage,
//!   `ValuesInRow`): a group with at most `MAX_VALUES_IN_ROW` values of the measure keeps them
//!   there, and none in the multiset or log; NULL means the multiset and log hold the group's
//!   values. An apply appends a group's additions to its arrays, and marks `__dirty` a group
//!   whose arrays pass the limit; after it, their arrays go to the log (or multiset) and turn
//!   NULL, for good (`spill_past_the_row`: no merge, no fix-up, the extremes only moved
//!   outwards). A group that takes a retraction keeps its arrays as they were and is marked
//!   `__dirty` too; the batch's values of such a group (and of every group whose arrays are
//!   NULL) go to the log or multiset as above, and the fix-up moves its arrays into the
//!   multisets before it reads them. Realtime reads and rollups read the multisets: a view
//!   turning realtime, or read by a new rollup, moves every array there first
//!   (`spill_values_in_row`).
//!
//! Algorithm (apply, one statement so that every part reads the same snapshot):
//!   snap     the statement's snapshot (our own transaction excluded) and our own xid;
//!   chg      changelog records visible in `snap` or written by our own transaction, and not
//!            already applied (visible in the applied snapshot, or our own up to applied_own_seq);
//!   ids      one row per changed event row, with the record order `seq`;
//!   rows     for each changed event id: its state when last applied (the old row of its
//!            earliest record in the batch, unless that record is an insert) with sign -1,
//!            and its state now (the row in the event table, if any) with sign +1;
//!   f, ft, c field values (each reference once per event, its JSON type once), filters, type
//!            checks (`bad` holds the reason of a type error); `good`, the events without one;
//!   d0, d    the signed delta per group; `a<i>` adds the group's values into a multiset (min
//!            and max of a stored view: appends them to the value log), `dd<i>` gives the change
//!            of a distinct count; `up` adds the delta into storage;
//!   unq, q   quarantine: entries of superseded event versions go, type errors come in;
//!   st       the new applied snapshot and counters.
//! Then, only when a group took a retraction (or passed the values a row keeps), the fix-up
//! statements move the dirty groups' values in the row to the multisets, delete emptied groups
//! and multiset entries and recompute min/max of those groups from their multisets.

use super::definition::{
    AggKind, FieldRef, FieldVariant, Measure, SqlType, TypePolicy, ViewDefinition,
};
use super::group_deltas::{self, Plan};
use super::values::{value_sql, Use};
use super::{batch, jsonpath, names, quote, sketch};

mod distributed;
mod rollup;

/// Storage and multisets are updated in place by every refresh (a counter or a count per
/// value changes, no key column does): room left on each page lets those updates stay on the
/// page (HOT), with no new index entry per updated row. (Not for groups that take a retraction:
/// `__dirty` is in the predicate of the storage's partial index, so setting and clearing it are
/// not HOT.) Measured: about 8% off the apply of 10k inserted events on 1M (every update HOT
/// instead of about half).
pub const STORAGE_FILLFACTOR: u32 = 70;

pub use super::values::MAX_KEY_BYTES;

/// Most event rows a batch may have for its refresh to take the pass in Rust
/// (`apply_in_one_pass`): the pass keeps the batch's groups and distinct min/max values in
/// memory, where the SQL stages' hash aggregates spill to disk past `work_mem`. A larger batch
/// (a bulk load since the last refresh) is read by the SQL stages.
pub const ONE_PASS_MAX_ROWS: i64 = 500_000;

/// The type error of an event the refresh pass in Rust finds one in and the SQL stages do not
/// (see `apply_in_one_pass`).
const PASS_DISAGREES: &str = "the refresh pass in Rust found a type error the SQL stages do not find: a defect of pg_eventview (eventview.one_pass_refresh = off reads the event in SQL)";

/// Where the rows of an apply come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Changes since the view's applied snapshot (refresh).
    Delta,
    /// Every event of the source (create, full rebuild).
    Full,
    /// Changes outside the bucket window `[$2, $3)`, and every event inside it (windowed rebuild).
    Window,
}

/// Everything generation needs about one view.
pub struct ViewSql<'a> {
    pub def: &'a ViewDefinition,
    pub view_id: i32,
    pub source_id: i32,
    /// The event table as a FROM item (`envelope_sql::source_scan`).
    pub source_scan: String,
    /// A refresh appends min/max values to the value logs (a stored view, with
    /// `eventview.extreme_log_limit` above 0); otherwise they go straight into the multisets
    /// (realtime reads use the multisets).
    pub log_extremes: bool,
    /// Rollups read this view: its applies also write their group changes to its group
    /// changelog (`rollup`).
    pub feeds_rollups: bool,
    /// The bucket width as the text of an interval, for statements that cannot take it as a
    /// parameter: a realtime rollup's read computes the pending changes of its sources.
    pub bucket_width: Option<String>,
    /// A rollup: the SQL generator of the view it reads.
    pub rollup_source: Option<Box<ViewSql<'a>>>,
    /// The storage table, qualified and quoted, when it is not the view's own
    /// `eventview._v<id>_data`: a shard of a distributed view's partial groups (`citus`), made
    /// by Citus with the columns `create_data_table` gives it plus `__shard`.
    pub data_table: Option<String>,
    /// Whether the storage keeps the values of each min/max measure of a small group in the
    /// group's row (`m<n>_vals`), and whether applies write them there.
    pub values_in_row: ValuesInRow,
}

/// An owned copy of everything a `ViewSql` generates its statements from: a cache of generated
/// statements keeps it beside them, and reuses them for a `ViewSql` that `matches` it (the
/// statements of every refresh are a few tens of kB of text, whose generation costs a refresh
/// of a few events about 5% of its time).
#[derive(Debug, Clone, PartialEq)]
pub struct ViewSqlKey {
    def: ViewDefinition,
    view_id: i32,
    source_id: i32,
    source_scan: String,
    log_extremes: bool,
    feeds_rollups: bool,
    bucket_width: Option<String>,
    rollup_source: Option<Box<ViewSqlKey>>,
    data_table: Option<String>,
    values_in_row: ValuesInRow,
}

impl ViewSql<'_> {
    /// The key of this generator (see `ViewSqlKey`).
    pub fn key(&self) -> ViewSqlKey {
        // Destructured, so that a field added to ViewSql cannot be left out of the key.
        let ViewSql {
            def,
            view_id,
            source_id,
            source_scan,
            log_extremes,
            feeds_rollups,
            bucket_width,
            rollup_source,
            data_table,
            values_in_row,
        } = self;
        ViewSqlKey {
            def: (*def).clone(),
            view_id: *view_id,
            source_id: *source_id,
            source_scan: source_scan.clone(),
            log_extremes: *log_extremes,
            feeds_rollups: *feeds_rollups,
            bucket_width: bucket_width.clone(),
            rollup_source: rollup_source.as_ref().map(|s| Box::new(s.key())),
            data_table: data_table.clone(),
            values_in_row: *values_in_row,
        }
    }

    /// Whether this generator generates what the one `key` was taken from does: the same
    /// inputs (compared in place, without copying them).
    pub fn matches(&self, key: &ViewSqlKey) -> bool {
        let ViewSql {
            def,
            view_id,
            source_id,
            source_scan,
            log_extremes,
            feeds_rollups,
            bucket_width,
            rollup_source,
            data_table,
            values_in_row,
        } = self;
        *view_id == key.view_id
            && *source_id == key.source_id
            && *log_extremes == key.log_extremes
            && *feeds_rollups == key.feeds_rollups
            && *values_in_row == key.values_in_row
            && *source_scan == key.source_scan
            && *bucket_width == key.bucket_width
            && *data_table == key.data_table
            && **def == key.def
            && match (rollup_source, &key.rollup_source) {
                (None, None) => true,
                (Some(source), Some(key)) => source.matches(key),
                _ => false,
            }
    }
}

/// Where a group's min/max values are while the group has few: in its storage row, an array per
/// min/max measure (`m<n>_vals`), rather than in the measure's multiset. See the module's doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValuesInRow {
    /// The storage has no such columns: a shard's view, the merged groups of a distributed
    /// view, a rollup.
    No,
    /// The columns are there, NULL in every row: a realtime view (realtime reads take values
    /// from the multisets), a view rollups read (they take them from its multisets).
    Columns,
    /// A stored view's applies keep them (`MAX_VALUES_IN_ROW`).
    Kept,
}

/// The most values of one min/max measure a group keeps in its storage row. A group past it
/// moves them to the measure's value log (its multiset when the view keeps no log), for good
/// (`ViewSql::spill_past_the_row`). Values in the row cost the apply
/// an array append where the multiset costs an index probe and a row per value (merged from the
/// value log later); the row grows by about 8 to 16 bytes per value kept.
pub const MAX_VALUES_IN_ROW: usize = 8;

/// The bucket of timestamp expression `ts` for bucket width `width` (SQL of an interval):
/// buckets aligned to 2000-01-01 00:00 in UTC, or, with a time zone, in that zone's wall-clock
/// time (`date_bin(width, ts AT TIME ZONE zone, timestamp '2000-01-01') AT TIME ZONE zone`, as
/// `pg_catalog.timezone` calls: a 1 day bucket starts at local midnight and lasts 23 or 25
/// hours on a day of a DST change).
fn bucket_expr(width: &str, ts: &str, time_zone: Option<&str>) -> String {
    match time_zone {
        None => {
            format!("pg_catalog.date_bin({width}, {ts}, '2000-01-01 00:00:00+00'::timestamptz)")
        }
        Some(zone) => {
            let zone = quote::literal(zone);
            format!(
                "pg_catalog.timezone({zone}, pg_catalog.date_bin({width}, pg_catalog.timezone({zone}, {ts}), '2000-01-01 00:00:00'::timestamp))"
            )
        }
    }
}

/// What widens the range of event times implied by a range of bucket starts, below and above:
/// nothing in UTC; in a time zone, two days either way, more than the largest change of a
/// zone's offset (a DST change, or a zone moved across the date line), which stretches a local
/// bucket, and a repeated local hour can map a bucket's start after an event in it.
fn bucket_slack(time_zone: Option<&str>) -> (&'static str, &'static str) {
    match time_zone {
        None => ("", ""),
        Some(_) => (" - interval '2 days'", " + interval '2 days'"),
    }
}

/// `conds` as a WHERE clause on a line of its own, or nothing when there are none.
fn where_clause(conds: &[String]) -> String {
    if conds.is_empty() {
        String::new()
    } else {
        format!("\n    WHERE {}", conds.join("\n      AND "))
    }
}

/// The bucket width in statements: their parameter $1.
const WIDTH_PARAM: &str = "$1::interval";
/// The parameter of `apply_from_shared_pass` that holds the token of the observer's pass
/// (after the width and a window's two bounds).
const SHARED_PASS_PARAM: &str = "$4";

/// How the user relation reads the view.
pub enum Reads {
    /// The stored groups, as of the last refresh.
    Stored,
    /// The stored groups with the pending changes folded in (`realtime_groups`).
    Realtime,
    /// On the coordinator, for a view over an event table distributed by Citus: the merged
    /// groups with the groups the shards' pending changes touch merged anew
    /// (`realtime_across_shards`).
    RealtimeAcrossShards,
}

impl<'a> ViewSql<'a> {
    /// The storage table, qualified.
    fn data(&self) -> String {
        self.data_table
            .clone()
            .unwrap_or_else(|| names::view_data(self.view_id))
    }

    /// The storage's key columns, in order: `__k`, `bucket`, then `g<i>, g<i>_null` per group
    /// column.
    fn key_columns(&self) -> Vec<String> {
        let mut columns = vec!["__k".to_string()];
        if self.def.bucketed {
            columns.push("bucket".to_string());
        }
        for i in 1..=self.def.group_by.len() {
            columns.push(format!("g{i}"));
            columns.push(format!("g{i}_null"));
        }
        columns
    }

    /// `__k, bucket, g1, g1_null, ...`: the key columns as a list.
    fn key_list(&self) -> String {
        self.key_columns().join(", ")
    }

    /// `<alias>.__k, <alias>.bucket, ...`: the key columns of the row `alias` as a list.
    fn key_list_of(&self, alias: &str) -> String {
        let columns: Vec<String> = self
            .key_columns()
            .iter()
            .map(|k| format!("{alias}.{k}"))
            .collect();
        columns.join(", ")
    }

    /// `l.__k = r.__k AND l.bucket = r.bucket AND ...`: rows `left` and `right` are of one group.
    fn keys_equal(&self, left: &str, right: &str) -> String {
        let terms: Vec<String> = self
            .key_columns()
            .iter()
            .map(|k| format!("{left}.{k} = {right}.{k}"))
            .collect();
        terms.join(" AND ")
    }

    /// The measures with their numbers (from 1), which name their columns (`m<n>_...`).
    fn numbered_measures(&self) -> impl Iterator<Item = (usize, &Measure)> {
        self.def
            .measures
            .iter()
            .enumerate()
            .map(|(i, m)| (i + 1, m))
    }

    /// The storage columns of the measures, in order: `m<n>_n` (count, sum, avg), `m<n>_sum`
    /// (sum, avg), `m<n>_val` (min, max, count_distinct); count(*) is `__count`.
    fn measure_columns(&self) -> Vec<String> {
        self.numbered_measures()
            .flat_map(|(n, m)| Self::stored_columns(n, m))
            .collect()
    }

    /// The storage columns of measure `n`. A percentile has none: it is read from the
    /// multiset as the view is read; an approximate one keeps its sketch (`m<n>_sk`).
    fn stored_columns(n: usize, m: &Measure) -> Vec<String> {
        match m.kind {
            AggKind::CountStar | AggKind::Percentile => vec![],
            AggKind::ApproxPercentile => vec![format!("m{n}_sk")],
            AggKind::Count => vec![format!("m{n}_n")],
            AggKind::Sum | AggKind::Avg => vec![format!("m{n}_n"), format!("m{n}_sum")],
            AggKind::Min | AggKind::Max | AggKind::CountDistinct => vec![format!("m{n}_val")],
        }
    }

    /// Measures kept as a multiset with a value log: min, max.
    fn minmax_measures(&self) -> impl Iterator<Item = (usize, &Measure)> {
        self.multiset_measures()
            .filter(|(_, m)| matches!(m.kind, AggKind::Min | AggKind::Max))
    }

    /// Whether an apply of `mode` appends min/max values to the logs rather than upserting the
    /// multisets: refreshes (deltas) of stored views. A rebuild writes the multisets directly.
    pub fn logs_extremes(&self, mode: Mode) -> bool {
        mode == Mode::Delta && self.log_extremes && self.minmax_measures().next().is_some()
    }

    /// Measures kept as a per-group value multiset: min, max, count_distinct, percentile.
    fn multiset_measures(&self) -> impl Iterator<Item = (usize, &Measure)> {
        self.numbered_measures()
            .filter(|(_, m)| Self::is_multiset(m.kind))
    }

    /// The min/max measures a small group keeps its values of in its storage row
    /// (`m<n>_vals`), when the storage has those columns: every one but those of text values,
    /// whose arrays could grow past a page.
    fn in_row_measures(&self) -> impl Iterator<Item = (usize, &Measure)> {
        let columns = self.values_in_row != ValuesInRow::No;
        self.minmax_measures()
            .filter(move |(_, m)| columns && m.value_type() != SqlType::Text)
    }

    /// The numbers of the measures whose values this view's applies keep in the row.
    fn kept_in_row(&self) -> Vec<usize> {
        if self.values_in_row != ValuesInRow::Kept {
            return Vec::new();
        }
        self.in_row_measures().map(|(n, _)| n).collect()
    }

    /// The storage's columns of values in the row (`m<n>_vals`), with their measures' numbers.
    pub fn value_array_columns(&self) -> Vec<(usize, String)> {
        self.in_row_measures()
            .map(|(n, _)| (n, format!("m{n}_vals")))
            .collect()
    }

    /// DDL giving the storage its columns of values in the row (those it lacks): at the view's
    /// creation, and for storage made by an earlier release or restored from its dump, whose
    /// rows then hold NULL (their values are in the multisets).
    pub fn add_value_array_columns(&self) -> Option<String> {
        let adds: Vec<String> = self
            .in_row_measures()
            .map(|(n, m)| {
                format!(
                    "ADD COLUMN IF NOT EXISTS m{n}_vals {}[]",
                    m.value_type().name()
                )
            })
            .collect();
        if adds.is_empty() {
            return None;
        }
        Some(format!("ALTER TABLE {} {}", self.data(), adds.join(", ")))
    }

    /// Moves the values in the row of every group (`dirty_only`: of the groups marked
    /// `__dirty`) into the multisets, and sets their arrays NULL: the first part of the fix-up,
    /// and what a view turning realtime or read by a new rollup runs first (both read values
    /// from the multisets).
    ///
    /// ```sql
    /// INSERT INTO eventview._v<id>_m<n> AS a (__k, ..., v, n)
    /// SELECT t.__k, ..., u.v, count(*) FROM eventview._v<id>_data t
    ///     CROSS JOIN LATERAL unnest(t.m<n>_vals) AS u(v) [WHERE t.__dirty]
    /// GROUP BY ... ON CONFLICT (__k, ..., v) DO UPDATE SET n = a.n + EXCLUDED.n;
    /// UPDATE eventview._v<id>_data SET m<n>_vals = NULL, ... WHERE m<n>_vals IS NOT NULL OR ...
    /// ```
    pub fn spill_values_in_row(&self, dirty_only: bool) -> Vec<String> {
        let columns = self.value_array_columns();
        if columns.is_empty() {
            return Vec::new();
        }
        let data = self.data();
        let keys = self.key_list();
        let mut out: Vec<String> = columns
            .iter()
            .map(|(n, column)| {
                format!(
                    "INSERT INTO {} AS a ({keys}, v, n)\n{}\nON CONFLICT ({keys}, v) DO UPDATE SET n = a.n + EXCLUDED.n",
                    names::view_values(self.view_id, *n),
                    self.values_in_rows(column, dirty_only),
                )
            })
            .collect();
        if !dirty_only {
            let sets = self.value_arrays_emptied();
            let any: Vec<String> = columns
                .iter()
                .map(|(_, c)| format!("{c} IS NOT NULL"))
                .collect();
            out.push(format!(
                "UPDATE {data} SET {} WHERE {}",
                sets.join(", "),
                any.join(" OR ")
            ));
        }
        out
    }

    /// After an apply whose dirty groups only passed the values a row keeps (none took a
    /// retraction): their arrays move to the value logs (`to_log`, counted into
    /// `extremes_logged`) or into the multisets, and the groups are clean again. Their extremes
    /// are right already (the apply moved them outwards), so nothing reads the multisets and
    /// the logs need no merge.
    ///
    /// ```sql
    /// WITH w<n> AS (INSERT INTO eventview._v<id>_m<n>_log (__k, ..., v, n)
    ///               SELECT t.__k, ..., u.v, count(*) FROM eventview._v<id>_data t
    ///                   CROSS JOIN LATERAL unnest(t.m<n>_vals) AS u(v) WHERE t.__dirty
    ///               GROUP BY ... RETURNING 1), ...
    /// UPDATE eventview._views SET extremes_logged = extremes_logged + (SELECT count(*) FROM w<n>) + ...;
    /// UPDATE eventview._v<id>_data SET m<n>_vals = NULL, ..., __dirty = false WHERE __dirty
    /// ```
    pub fn spill_past_the_row(&self, to_log: bool) -> Vec<String> {
        let columns = self.value_array_columns();
        if columns.is_empty() {
            return Vec::new();
        }
        let data = self.data();
        let mut out = if to_log {
            let keys = self.key_list();
            let writes: Vec<String> = columns
                .iter()
                .map(|(n, column)| {
                    format!(
                        "w{n} AS (INSERT INTO {} ({keys}, v, n)\n{}\nRETURNING 1)",
                        names::view_values_log(self.view_id, *n),
                        self.values_in_rows(column, true)
                    )
                })
                .collect();
            let added: String = columns
                .iter()
                .map(|(n, _)| format!(" + (SELECT count(*) FROM w{n})"))
                .collect();
            vec![format!(
                "WITH {}\nUPDATE eventview._views SET extremes_logged = extremes_logged{added} WHERE view_id = {}",
                writes.join(",\n"),
                self.view_id
            )]
        } else {
            self.spill_values_in_row(true)
        };
        let mut sets = self.value_arrays_emptied();
        sets.push("__dirty = false".into());
        out.push(format!(
            "UPDATE {data} SET {} WHERE __dirty",
            sets.join(", ")
        ));
        out
    }

    /// `m<n>_vals = NULL, ...`: the assignments that leave no value in any row's arrays (once
    /// the values are in the multisets or logs).
    fn value_arrays_emptied(&self) -> Vec<String> {
        self.value_array_columns()
            .into_iter()
            .map(|(_, c)| format!("{c} = NULL"))
            .collect()
    }

    /// The values in the row of array column `column`, of every group (`dirty_only`: of the
    /// groups marked `__dirty`), as the (keys, v, n) rows of a multiset.
    fn values_in_rows(&self, column: &str, dirty_only: bool) -> String {
        let t_keys = self.key_list_of("t");
        let dirty = if dirty_only { " WHERE t.__dirty" } else { "" };
        format!(
            "SELECT {t_keys}, u.v, count(*)\nFROM {} t CROSS JOIN LATERAL pg_catalog.unnest(t.{column}) AS u(v){dirty}\nGROUP BY {t_keys}, u.v",
            self.data()
        )
    }

    /// Whether measures of `kind` keep a per-group value multiset (`multiset_measures`).
    fn is_multiset(kind: AggKind) -> bool {
        matches!(
            kind,
            AggKind::Min | AggKind::Max | AggKind::CountDistinct | AggKind::Percentile
        )
    }

    /// Column definitions of the group key, shared by storage and multisets.
    fn key_column_ddl(&self) -> Vec<String> {
        let mut cols = vec!["__k boolean NOT NULL DEFAULT true".to_string()];
        if self.def.bucketed {
            cols.push("bucket timestamptz NOT NULL".into());
        }
        for (i, g) in self.def.group_by.iter().enumerate() {
            cols.push(format!("g{} {} NOT NULL", i + 1, g.sql_type().name()));
            cols.push(format!("g{}_null boolean NOT NULL", i + 1));
        }
        cols
    }

    /// The storage table's column definitions: the key, `__count`, each measure's counters,
    /// `__dirty`.
    fn data_columns(&self) -> Vec<String> {
        let mut cols = self.key_column_ddl();
        cols.push("__count bigint NOT NULL".into());
        for (i, m) in self.def.measures.iter().enumerate() {
            let n = i + 1;
            match m.kind {
                AggKind::CountStar => {}
                AggKind::Count => cols.push(format!("m{n}_n bigint NOT NULL")),
                AggKind::Sum | AggKind::Avg => {
                    cols.push(format!("m{n}_n bigint NOT NULL"));
                    cols.push(format!("m{n}_sum numeric NOT NULL"));
                }
                AggKind::Min | AggKind::Max => {
                    cols.push(format!("m{n}_val {}", m.value_type().name()))
                }
                AggKind::CountDistinct => cols.push(format!("m{n}_val bigint NOT NULL")),
                AggKind::Percentile => {}
                // The sketch (`sketch`): bucket numbers and counts; NULL without values.
                AggKind::ApproxPercentile => cols.push(format!("m{n}_sk bigint[]")),
            }
        }
        cols.push("__dirty boolean NOT NULL DEFAULT false".into());
        cols
    }

    /// The storage table named `table` (qualified and quoted), without its indexes.
    pub fn create_data_table(&self, table: &str) -> String {
        format!(
            "CREATE TABLE {table} (\n    {}\n) WITH (fillfactor = {STORAGE_FILLFACTOR})",
            self.data_columns().join(",\n    ")
        )
    }

    /// DDL of the storage table (unless it is given, `data_table`) with its indexes, and of the
    /// value multisets.
    pub fn create_storage(&self) -> Vec<String> {
        let data = self.data();
        let vid = self.view_id;
        let mut out = Vec::new();
        if self.data_table.is_none() {
            out.push(self.create_data_table(&data));
            out.extend(self.add_value_array_columns());
        }
        out.extend([
            format!(
                "CREATE UNIQUE INDEX _v{vid}_data_key ON {data} ({})",
                self.key_list()
            ),
            format!("CREATE INDEX _v{vid}_data_dirty ON {data} (__k) WHERE __dirty"),
        ]);
        out.extend(
            self.sketch_measures()
                .into_iter()
                .map(|n| Self::uncompressed(&data, &format!("m{n}_sk"))),
        );
        out.extend(self.create_read_index());
        for (n, m) in self.multiset_measures() {
            let values = names::view_values(self.view_id, n);
            let mut vcols = self.key_column_ddl();
            vcols.push(format!("v {} NOT NULL", m.value_type().name()));
            vcols.push("n bigint NOT NULL".into());
            if m.kind == AggKind::CountDistinct {
                // n before this refresh's upsert: a value enters or leaves the distinct count
                // when n crosses zero.
                vcols.push("prev_n bigint NOT NULL DEFAULT 0".into());
            }
            out.push(format!(
                "CREATE TABLE {values} (\n    {}\n) WITH (fillfactor = {STORAGE_FILLFACTOR})",
                vcols.join(",\n    ")
            ));
            out.push(format!(
                "CREATE UNIQUE INDEX _v{vid}_m{n}_key ON {values} ({}, v)",
                self.key_list()
            ));
            if matches!(m.kind, AggKind::Min | AggKind::Max) {
                out.push(Self::create_log(&values, &names::view_values_log(vid, n)));
            }
        }
        out
    }

    /// The index that serves reads of the user relation: on the group columns as users see
    /// them (the expressions the user relation shows, NULL restored), then `bucket`. A filter
    /// by equality on the group columns (all of them or the first ones, `IS NULL` included)
    /// and/or by a range of `bucket` is an index scan; a filter on `bucket` alone uses the key
    /// index, whose first column `__k` the user relation's `WHERE __k` fixes. None for a view
    /// without keys (a single row), and for a shard's view (`data_table`): its partial groups
    /// are read by their keys, by the coordinator's merges and realtime reads, never by users,
    /// who read the coordinator's merged groups. An index in the users' order would cost each
    /// new group an insert at its own place in an index as large as the shard's groups, where
    /// the key index (bucket first, for a view with buckets) takes a batch's new groups at its
    /// end.
    ///
    /// ```sql
    /// CREATE INDEX _v<id>_data_read ON eventview._v<id>_data
    ///     ((CASE WHEN g1_null THEN NULL ELSE g1 END), ..., bucket)
    /// ```
    pub fn create_read_index(&self) -> Option<String> {
        if self.data_table.is_some() {
            return None;
        }
        let mut columns: Vec<String> = (1..=self.def.group_by.len())
            .map(|n| format!("({})", Self::group_value(n)))
            .collect();
        if self.def.bucketed {
            columns.push("bucket".into());
        }
        if columns.is_empty() {
            return None;
        }
        Some(format!(
            "CREATE INDEX {} ON {} ({})",
            self.read_index_name(),
            self.data(),
            columns.join(", ")
        ))
    }

    /// The read index's name, unqualified (an index lives in its table's schema).
    pub fn read_index_name(&self) -> String {
        format!("_v{}_data_read", self.view_id)
    }

    /// Group column `n` as users see it: NULL when the group's key is NULL. The user relation
    /// and the read index spell it identically, so that the planner matches a filter on the
    /// user's column with the index.
    fn group_value(n: usize) -> String {
        format!("CASE WHEN g{n}_null THEN NULL ELSE g{n} END")
    }

    /// DDL of a value log: the multiset's columns, no index (appends only; a merge reads it
    /// whole). The upgrade script creates the logs of existing views with the same DDL.
    fn create_log(values: &str, log: &str) -> String {
        format!("CREATE TABLE {log} (LIKE {values} INCLUDING DEFAULTS)")
    }

    /// The numbers of the approx_percentile measures, whose sketch is a storage column
    /// (`m<n>_sk`).
    pub fn sketch_measures(&self) -> Vec<usize> {
        self.numbered_measures()
            .filter(|(_, m)| m.kind == AggKind::ApproxPercentile)
            .map(|(n, _)| n)
            .collect()
    }

    /// Column `column` of `table` kept uncompressed (`STORAGE EXTERNAL`: inline while the row
    /// fits, out of line past that): a sketch is rewritten whole by every refresh that changes
    /// its group, and compressing one of 280 buckets (4.5 kB, pglz) costs about 20 times its
    /// merge (an update of 380 us against 17 us for the merge, measured).
    fn uncompressed(table: &str, column: &str) -> String {
        format!("ALTER TABLE {table} ALTER COLUMN {column} SET STORAGE EXTERNAL")
    }

    /// The sketch column of approx_percentile measure `n` added to a storage made when sketches
    /// were kept as a value multiset (`_v<id>_m<n>`, bucket numbers as values), and filled from
    /// it. The caller then replaces the user relation, which reads the column, and drops the
    /// multiset.
    pub fn sketch_column_from_multiset(&self, n: usize) -> Vec<String> {
        let data = self.data();
        vec![
            format!("ALTER TABLE {data} ADD COLUMN m{n}_sk bigint[]"),
            Self::uncompressed(&data, &format!("m{n}_sk")),
            format!(
                "UPDATE {data} AS t SET m{n}_sk = (
    SELECT array_agg(p.e ORDER BY ms.v, p.i)
    FROM {} ms CROSS JOIN LATERAL (VALUES (1, ms.v), (2, ms.n)) AS p(i, e)
    WHERE {} AND ms.n <> 0)",
                names::view_values(self.view_id, n),
                self.keys_equal("ms", "t")
            ),
        ]
    }

    /// The value logs, qualified.
    fn logs(&self) -> impl Iterator<Item = String> + '_ {
        self.minmax_measures()
            .map(|(n, _)| names::view_values_log(self.view_id, n))
    }

    /// Each value log with its DDL: a refresh creates a missing one (storage restored from a
    /// dump of a version without logs).
    pub fn log_ddl(&self) -> Vec<(String, String)> {
        self.minmax_measures()
            .map(|(n, _)| {
                let log = names::view_values_log(self.view_id, n);
                let ddl = Self::create_log(&names::view_values(self.view_id, n), &log);
                (log, ddl)
            })
            .collect()
    }

    /// The storage table, the multisets and the value logs, qualified.
    pub fn storage_tables(&self) -> Vec<String> {
        let mut out = vec![self.data()];
        out.extend(
            self.multiset_measures()
                .map(|(n, _)| names::view_values(self.view_id, n)),
        );
        out.extend(self.logs());
        out
    }

    /// One statement per min/max measure moving its value log into its multiset, then the
    /// view's count of logged values reset. Run as the view's owner, holding the view's row
    /// lock (under which alone logs are written, merged and cleared; realtime reads only read).
    pub fn merge_logs(&self) -> Vec<String> {
        let keys = self.key_list();
        let mut out: Vec<String> = self
            .minmax_measures()
            .map(|(n, _)| {
                format!(
                    "WITH moved AS (DELETE FROM {log} RETURNING {keys}, v, n)
INSERT INTO {values} AS t ({keys}, v, n)
SELECT {keys}, v, sum(n)::bigint FROM moved GROUP BY {keys}, v HAVING sum(n) <> 0
ON CONFLICT ({keys}, v) DO UPDATE SET n = t.n + EXCLUDED.n",
                    log = names::view_values_log(self.view_id, n),
                    values = names::view_values(self.view_id, n),
                )
            })
            .collect();
        out.push(format!(
            "UPDATE eventview._views SET extremes_logged = 0 WHERE view_id = {}",
            self.view_id
        ));
        out
    }

    /// The relation users SELECT from. `user_view` is the quoted qualified name. A realtime
    /// view reads the stored groups merged with the pending changes (`realtime_groups`; on a
    /// Citus coordinator, `realtime_across_shards`).
    pub fn create_user_view(&self, user_view: &str, reads: Reads) -> String {
        self.user_view_sql(user_view, reads, "CREATE VIEW")
    }

    /// The same, replacing the existing relation in place (same oid, grants and dependents).
    pub fn replace_user_view(&self, user_view: &str, reads: Reads) -> String {
        self.user_view_sql(user_view, reads, "CREATE OR REPLACE VIEW")
    }

    /// Makes the user relation read-only (see `eventview._refuse_change`): created with it;
    /// CREATE OR REPLACE VIEW keeps it.
    pub fn read_only_trigger(user_view: &str) -> String {
        format!(
            "CREATE TRIGGER eventview_read_only INSTEAD OF INSERT OR UPDATE OR DELETE ON {user_view}
    FOR EACH ROW EXECUTE FUNCTION eventview._refuse_change()"
        )
    }

    /// The user relation: the definition's columns (keys with their NULLs restored, measures
    /// derived from the stored counters) over the storage, or over `merged` when realtime.
    ///
    /// ```sql
    /// CREATE VIEW <name> AS
    /// SELECT bucket,
    ///        CASE WHEN g1_null THEN NULL ELSE g1 END AS "sku", ...
    /// FROM eventview._v<id>_data
    /// WHERE __k
    /// ```
    fn user_view_sql(&self, user_view: &str, reads: Reads, create: &str) -> String {
        let mut cols = Vec::new();
        if self.def.bucketed {
            cols.push("bucket".to_string());
        }
        for (i, g) in self.def.group_by.iter().enumerate() {
            let n = i + 1;
            cols.push(format!(
                "{} AS {}",
                Self::group_value(n),
                quote::ident(&g.name)
            ));
        }
        for (i, m) in self.def.measures.iter().enumerate() {
            let n = i + 1;
            let expr = match m.kind {
                AggKind::CountStar => "__count".to_string(),
                AggKind::Count => format!("m{n}_n"),
                AggKind::Sum => format!("CASE WHEN m{n}_n > 0 THEN m{n}_sum END"),
                // trim_scale: the stored sum keeps the largest scale of any value ever added,
                // even retracted ones; numeric division takes its precision from its inputs.
                AggKind::Avg => {
                    format!("CASE WHEN m{n}_n > 0 THEN trim_scale(m{n}_sum) / m{n}_n END")
                }
                AggKind::Min | AggKind::Max | AggKind::CountDistinct => format!("m{n}_val"),
                AggKind::Percentile | AggKind::ApproxPercentile => match reads {
                    Reads::Realtime => format!("m{n}_val"),
                    Reads::Stored => self.stored_percentile(n, m, &self.data()),
                    // An exact percentile comes computed (`realtime_across_shards`).
                    Reads::RealtimeAcrossShards if m.kind == AggKind::Percentile => {
                        format!("m{n}_val")
                    }
                    Reads::RealtimeAcrossShards => self.stored_percentile(n, m, "merged"),
                },
            };
            cols.push(format!("{expr} AS {}", quote::ident(&m.name)));
        }
        if cols.is_empty() {
            // A view with neither keys nor measures still shows whether any event counts.
            cols.push("__count AS events".into());
        }
        let realtime = match reads {
            Reads::Realtime => Some(self.realtime_groups()),
            Reads::RealtimeAcrossShards => Some(self.realtime_across_shards()),
            Reads::Stored => None,
        };
        if let Some(groups) = realtime {
            format!(
                "{create} {user_view} AS\n{groups}\nSELECT {}\nFROM merged\nWHERE __count > 0",
                cols.join(",\n       ")
            )
        } else {
            // `WHERE __k` (always true) lets a filter on `bucket` alone use the key index.
            format!(
                "{create} {user_view} AS\nSELECT {}\nFROM {}\nWHERE __k",
                cols.join(",\n       "),
                self.data()
            )
        }
    }

    /// Realtime read: `WITH t ..., merged ...`, the stored groups with the changes not yet
    /// applied folded in, in the storage's columns. The groups the pending changes touch come
    /// from `eventview._realtime_pending(<id>)`, a C function that runs
    /// `realtime_pending_groups` only when `realtime_pending_check` finds changes pending;
    /// every other group is read from the storage as it is, through its indexes. Behind the
    /// function boundary, a read with nothing pending neither plans nor starts the pending
    /// part's executor nodes (hundreds of them), which would cost more than the read itself.
    ///
    /// ```sql
    /// WITH t AS MATERIALIZED (
    ///     SELECT * FROM eventview._realtime_pending(<id>) AS t(__k boolean, bucket timestamptz, ...)
    /// ),
    /// merged AS (
    ///     SELECT __k, bucket, g1, g1_null, __count, m1_n, ...
    ///     FROM eventview._v<id>_data s
    ///     WHERE s.__k AND NOT EXISTS (SELECT 1 FROM t WHERE t.__k = s.__k AND ...)
    ///     UNION ALL
    ///     SELECT __k, bucket, g1, g1_null, __count, m1_n, ... FROM t
    /// )
    /// ```
    fn realtime_groups(&self) -> String {
        let columns = self.merged_column_types();
        let record: Vec<String> = columns
            .iter()
            .map(|(name, type_name)| format!("{name} {type_name}"))
            .collect();
        let names: Vec<&str> = columns.iter().map(|(name, _)| name.as_str()).collect();
        self.stored_groups_with(
            &format!("eventview._realtime_pending({})", self.view_id),
            &record.join(", "),
            &self.stored_group_columns().join(", "),
            &format!(
                "NOT EXISTS (SELECT 1 FROM t WHERE {})",
                self.keys_equal("t", "s")
            ),
            &names.join(", "),
        )
    }

    /// A realtime relation's groups, `WITH t ..., merged ...`: the rows `t` of the set-returning
    /// call `rows` (of the columns `record`), the groups that replace stored ones, and every
    /// stored group for which `untouched` holds (a condition on the storage row `s`) in the
    /// columns `stored`, then `t`'s in the columns `touched`.
    pub(super) fn stored_groups_with(
        &self,
        rows: &str,
        record: &str,
        stored: &str,
        untouched: &str,
        touched: &str,
    ) -> String {
        format!(
            "WITH t AS MATERIALIZED (
    SELECT * FROM {rows} AS t({record})
),
merged AS (
    SELECT {stored}
    FROM {} s
    WHERE s.__k AND {untouched}
    UNION ALL
    SELECT {touched}
    FROM t
)",
            self.data()
        )
    }

    /// The groups the changes pending for the reader touch, each as the next refresh would
    /// store it, in the columns of `merged_column_types`: what `eventview._realtime_pending`
    /// returns. It computes what the next refresh would store: the same batch (snapshot
    /// batching over the reader's snapshot, read only), the same values and type checks
    /// (events with a type error are left out, as a refresh leaves them out of the aggregate),
    /// and for min/max of a group that lost values and for count_distinct, the group's
    /// multiset plus the pending values. Its cost grows with the pending changes, as a
    /// refresh's does.
    ///
    /// ```sql
    /// WITH snap ..., f ..., c ..., good ...,          -- delta_input (rows fetched by id)
    /// d0 AS (SELECT <keys>, <signed sums>, <pending values> FROM good GROUP BY <keys>),
    /// lg<n> AS MATERIALIZED (SELECT * FROM eventview._v<id>_m<n>_log)    -- each min/max
    /// SELECT coalesce(s.__k, d0.__k) AS __k, ...,
    ///        coalesce(s.__count, 0) + d0.__count AS __count, ...
    /// FROM d0 LEFT JOIN eventview._v<id>_data s USING (__k, bucket, g1, g1_null)
    /// ```
    pub fn realtime_pending_groups(&self) -> String {
        let mut ctes = self.pending_group_deltas(&self.width_sql());
        ctes.extend(self.minmax_measures().map(|(n, _)| self.value_log_read(n)));
        let ctes = ctes.join(",\n").replacen(
            batch::SNAP_CTE,
            &batch::snap_cte_naming(&self.source_scan),
            1,
        );
        format!(
            "WITH {ctes}\nSELECT {}\nFROM d0 LEFT JOIN {} s USING ({})",
            self.pending_group_columns().join(",\n       "),
            self.data(),
            self.key_list()
        )
    }

    /// Whether a realtime read may have pending changes to fold in, one row of one boolean
    /// (`pending`): the reader's batch of the view's changelog is not empty, or for a rollup,
    /// that of its own log or of any view below it. When it says false,
    /// `realtime_pending_groups` would return no row, so `eventview._realtime_pending` skips
    /// it. (Whether the view is realtime does not matter: a reader whose snapshot predates
    /// `alter_view(realtime => true)` reads the realtime relation, and its pending changes.)
    pub fn realtime_pending_check(&self) -> String {
        match self.realtime_pending_terms().as_slice() {
            [only] => only.clone(),
            terms => {
                let terms: Vec<String> = terms.iter().map(|t| format!("({t})")).collect();
                format!("SELECT {} AS pending", terms.join("\n    OR "))
            }
        }
    }

    /// One query of one boolean (`batch::log_realtime_pending_check`) per log a realtime read
    /// of this view consumes: its own, and those of the views below a rollup.
    fn realtime_pending_terms(&self) -> Vec<String> {
        let mut terms = vec![batch::log_realtime_pending_check(
            &self.consumed_log(),
            &self.applied_state(),
        )];
        if let Some(source) = &self.rollup_source {
            terms.extend(source.realtime_pending_terms());
        }
        terms
    }

    /// The columns of `merged` (a realtime read's groups) with their SQL types, in order: the
    /// keys, `__count`, each measure's stored columns, a percentile's value (`m<n>_val`).
    pub fn merged_column_types(&self) -> Vec<(String, String)> {
        let mut columns = self.key_column_types();
        columns.push(("__count".into(), "bigint".into()));
        for (n, m) in self.numbered_measures() {
            let value = m.value_type().name().to_string();
            match m.kind {
                AggKind::CountStar => {}
                AggKind::Count => columns.push((format!("m{n}_n"), "bigint".into())),
                AggKind::Sum | AggKind::Avg => {
                    columns.push((format!("m{n}_n"), "bigint".into()));
                    columns.push((format!("m{n}_sum"), "numeric".into()));
                }
                AggKind::Min | AggKind::Max | AggKind::Percentile => {
                    columns.push((format!("m{n}_val"), value))
                }
                AggKind::CountDistinct => columns.push((format!("m{n}_val"), "bigint".into())),
                AggKind::ApproxPercentile => {
                    columns.push((format!("m{n}_val"), "double precision".into()))
                }
            }
        }
        columns
    }

    /// The CTEs of a realtime read up to `d0`: the pending changes per group, with the pending
    /// values of each multiset measure as (value, count) arrays (`m<n>_vs`, `m<n>_signs`).
    /// `width`: the bucket width as SQL.
    fn pending_group_deltas(&self, width: &str) -> Vec<String> {
        if self.rollup_source.is_some() {
            return self.rollup_pending_group_deltas(width);
        }
        let mut ctes = self.delta_input(Mode::Delta, width, false);
        let (key_exprs, mut d_cols) = self.group_delta_columns();
        d_cols.extend(self.pending_value_columns());
        ctes.push(Self::group_delta(&d_cols, key_exprs.len()));
        ctes
    }

    /// Columns of a realtime read's `d0` carrying each multiset measure's pending values along
    /// as (value, sign) arrays, so that `merged` works per group with index lookups and never
    /// joins two large sets on a row estimate the planner cannot know.
    ///
    /// ```sql
    /// array_agg(m<n>) FILTER (WHERE m<n> IS NOT NULL) AS m<n>_vs,
    /// array_agg(sign) FILTER (WHERE m<n> IS NOT NULL) AS m<n>_signs
    /// ```
    fn pending_value_columns(&self) -> Vec<String> {
        self.multiset_measures()
            .map(|(n, _)| {
                format!(
                    "array_agg(m{n}) FILTER (WHERE m{n} IS NOT NULL) AS m{n}_vs, array_agg(sign) FILTER (WHERE m{n} IS NOT NULL) AS m{n}_signs"
                )
            })
            .collect()
    }

    /// A min/max measure's value log, read once per realtime read. A realtime view's log is
    /// empty, except to a reader whose snapshot predates the merge that made the view realtime;
    /// only a group that lost values reads it.
    ///
    /// ```sql
    /// lg<n> AS MATERIALIZED (SELECT * FROM eventview._v<id>_m<n>_log)
    /// ```
    fn value_log_read(&self, n: usize) -> String {
        format!(
            "lg{n} AS MATERIALIZED (SELECT * FROM {})",
            names::view_values_log(self.view_id, n)
        )
    }

    /// The columns of `merged` for a stored group no pending change touches, read from the
    /// storage (`s`): a percentile computed from its multiset or sketch.
    fn stored_group_columns(&self) -> Vec<String> {
        let mut columns: Vec<String> = self
            .key_columns()
            .iter()
            .map(|k| format!("s.{k}"))
            .collect();
        columns.push("s.__count".into());
        for (n, m) in self.numbered_measures() {
            if m.kind.takes_fraction() {
                columns.push(format!("{} AS m{n}_val", self.stored_percentile(n, m, "s")));
            } else {
                columns.extend(
                    Self::stored_columns(n, m)
                        .into_iter()
                        .map(|c| format!("s.{c}")),
                );
            }
        }
        columns
    }

    /// The columns of `merged` for a group pending changes touch: stored (`s`, when the group
    /// is stored) plus pending (`d0`). A pending group's keys are taken as stored, as a refresh
    /// keeps them (its upsert never rewrites keys): equal keys may be spelled differently
    /// (numeric 1 and 1.0).
    fn pending_group_columns(&self) -> Vec<String> {
        let mut columns: Vec<String> = self
            .key_columns()
            .iter()
            .map(|k| format!("coalesce(s.{k}, d0.{k}) AS {k}"))
            .collect();
        columns.push("coalesce(s.__count, 0) + d0.__count AS __count".into());
        for (n, m) in self.numbered_measures() {
            columns.extend(self.merged_measure(n, m));
        }
        columns
    }

    /// The columns of measure `n` of a group pending changes touch: stored (`s`) plus pending
    /// (`d0`).
    ///
    /// ```sql
    /// coalesce(s.m<n>_n, 0) + d0.m<n>_n AS m<n>_n,
    /// coalesce(s.m<n>_sum, 0) + d0.m<n>_sum AS m<n>_sum      -- sum, avg
    /// ```
    fn merged_measure(&self, n: usize, m: &Measure) -> Vec<String> {
        let counter =
            |col: &str| format!("coalesce(s.m{n}_{col}, 0) + d0.m{n}_{col} AS m{n}_{col}");
        match m.kind {
            AggKind::CountStar => vec![],
            AggKind::Count => vec![counter("n")],
            AggKind::Sum | AggKind::Avg => vec![counter("n"), counter("sum")],
            AggKind::Min | AggKind::Max => vec![self.merged_extreme(n, m.kind)],
            AggKind::CountDistinct => vec![self.merged_distinct_count(n)],
            AggKind::Percentile => vec![self.merged_percentile(n, m)],
            AggKind::ApproxPercentile => vec![format!(
                "eventview._sketch_quantile(eventview._sketch_merge(s.m{n}_sk, d0.m{n}_sk), {}::float8) AS m{n}_val",
                m.fraction.unwrap_or(0.5)
            )],
        }
    }

    /// A percentile over `values`, a query of (v, n) rows, one per distinct value with its
    /// count n > 0: `percentile_disc(p)`, the first value whose running count reaches
    /// `ceil(p * total)` (at least the first value), computed as PostgreSQL's percentile_disc
    /// computes that position, in double precision.
    ///
    /// ```sql
    /// (SELECT o.v FROM (SELECT w.v, sum(w.n) OVER (ORDER BY w.v) AS cum, sum(w.n) OVER () AS total
    ///                   FROM (<values>) w) o
    ///  WHERE o.cum::float8 >= greatest(ceil(<p>::float8 * o.total::float8), 1) ORDER BY o.v LIMIT 1)
    /// ```
    fn percentile_over(values: &str, m: &Measure) -> String {
        let p = m.fraction.unwrap_or(0.5);
        format!(
            "(SELECT o.v FROM (SELECT w.v, sum(w.n) OVER (ORDER BY w.v) AS cum, sum(w.n) OVER () AS total
                  FROM ({values}) w) o
             WHERE o.cum::float8 >= greatest(ceil({p}::float8 * o.total::float8), 1) ORDER BY o.v LIMIT 1)"
        )
    }

    /// Percentile measure `n` of the stored group whose key columns are those of `group` (the
    /// storage table or an alias of it): from its multiset, or from its sketch.
    fn stored_percentile(&self, n: usize, m: &Measure, group: &str) -> String {
        if m.kind == AggKind::ApproxPercentile {
            return format!(
                "eventview._sketch_quantile({group}.m{n}_sk, {}::float8)",
                m.fraction.unwrap_or(0.5)
            );
        }
        Self::percentile_over(
            &format!(
                "SELECT ms.v, ms.n FROM {} ms WHERE {} AND ms.n > 0",
                names::view_values(self.view_id, n),
                self.keys_equal("ms", group)
            ),
            m,
        )
    }

    /// A percentile in `merged`'s pending branch: over the group's multiset with the pending
    /// (value, sign) pairs.
    fn merged_percentile(&self, n: usize, m: &Measure) -> String {
        let values = Self::percentile_over(
            &format!(
                "SELECT u.v, sum(u.n) AS n FROM (
                       SELECT ms.v, ms.n FROM {} ms WHERE {}
                       UNION ALL
                       SELECT p.v, p.s FROM unnest(d0.m{n}_vs, d0.m{n}_signs) AS p(v, s)) u
                   GROUP BY u.v HAVING sum(u.n) > 0",
                names::view_values(self.view_id, n),
                self.keys_equal("ms", "d0")
            ),
            m,
        );
        format!("{values} AS m{n}_val")
    }

    /// A min/max in `merged`: for a group that lost values, the extreme over its multiset, its
    /// value log, its values in the row and the pending (value, sign) pairs; otherwise the
    /// extreme can only have moved outwards.
    ///
    /// ```sql
    /// CASE WHEN d0.__dirty THEN (SELECT max(w.v) FROM (<multiset, log, pending>) ...)
    ///      ELSE GREATEST(s.m<n>_val, d0.m<n>_val) END AS m<n>_val
    /// ```
    fn merged_extreme(&self, n: usize, kind: AggKind) -> String {
        let values = names::view_values(self.view_id, n);
        let (agg, pick) = if kind == AggKind::Min {
            ("min", "LEAST")
        } else {
            ("max", "GREATEST")
        };
        // The values in the row: NULL in a realtime view's rows, but a reader whose snapshot
        // is older than the view's turning realtime sees them there (and not in the multiset).
        let in_row = if self.in_row_measures().any(|(k, _)| k == n) {
            format!(
                "
                                    UNION ALL
                                    SELECT r.v, 1 FROM unnest(s.m{n}_vals) AS r(v)"
            )
        } else {
            String::new()
        };
        format!(
            "CASE WHEN d0.__dirty THEN (
               SELECT {agg}(w.v) FROM (
                   SELECT u.v FROM (SELECT ms.v, ms.n FROM {values} ms WHERE {}
                                    UNION ALL
                                    SELECT l.v, l.n FROM lg{n} l WHERE {}{in_row}
                                    UNION ALL
                                    SELECT p.v, p.s FROM unnest(d0.m{n}_vs, d0.m{n}_signs) AS p(v, s)) u
                   GROUP BY u.v HAVING sum(u.n) > 0) w)
           ELSE {pick}(s.m{n}_val, d0.m{n}_val) END AS m{n}_val",
            self.keys_equal("ms", "d0"),
            self.keys_equal("l", "d0")
        )
    }

    /// A count_distinct in `merged`: the stored count plus the values whose count in the
    /// group's multiset crosses zero with the pending changes.
    ///
    /// ```sql
    /// coalesce(s.m<n>_val, 0) + (SELECT <+1 or -1 per value crossing zero>
    ///                            FROM <pending values> p CROSS JOIN LATERAL <multiset n> o)
    ///     AS m<n>_val
    /// ```
    fn merged_distinct_count(&self, n: usize) -> String {
        let values = names::view_values(self.view_id, n);
        format!(
            "coalesce(s.m{n}_val, 0) + (
               SELECT coalesce(sum(CASE WHEN o.n <= 0 AND o.n + p.dn > 0 THEN 1
                                        WHEN o.n > 0 AND o.n + p.dn <= 0 THEN -1 ELSE 0 END), 0)::bigint
               FROM (SELECT x.v, sum(x.s) AS dn FROM unnest(d0.m{n}_vs, d0.m{n}_signs) AS x(v, s) GROUP BY x.v) p
               CROSS JOIN LATERAL (SELECT coalesce((SELECT ms.n FROM {values} ms WHERE {} AND ms.v = p.v), 0) AS n) o)
           AS m{n}_val",
            self.keys_equal("ms", "d0")
        )
    }

    /// Distinct JSONPath and logical-field references read by the view, in first-use order;
    /// the f stage evaluates the i-th once per event into jsonb column `j<i>`.
    fn refs(&self) -> Vec<&FieldRef> {
        let mut out: Vec<&FieldRef> = Vec::new();
        for r in self.def.references() {
            if !matches!(r, FieldRef::Envelope(_))
                && !out.iter().any(|o| o.display() == r.display())
            {
                out.push(r);
            }
        }
        out
    }

    /// The jsonb column holding `field` in the f stage (`j<i>`); envelope columns are themselves.
    fn raw_column(&self, refs: &[&FieldRef], field: &FieldRef) -> String {
        match field {
            FieldRef::Envelope(e) => e.column().to_string(),
            _ => {
                let i = refs
                    .iter()
                    .position(|p| p.display() == field.display())
                    .expect("reference collected");
                format!("j{}", i + 1)
            }
        }
    }

    /// The jsonb a reference selects in `r.payload`. A logical field picks its most specific
    /// declaration for the event's type and version (CASE in resolution order).
    fn raw_sql(field: &FieldRef) -> String {
        match field {
            FieldRef::Path {
                plan,
                element: true,
                ..
            } => plan.to_sql("u.__elem"),
            FieldRef::Path { plan, .. } => plan.to_sql("r.payload"),
            FieldRef::Logical(f) => {
                let whens: Vec<String> = f
                    .variants
                    .iter()
                    .map(|v| {
                        format!(
                            "WHEN {} THEN {}",
                            Self::variant_applies(v, "r."),
                            v.plan.to_sql("r.payload")
                        )
                    })
                    .collect();
                format!("CASE {} END", whens.join(" "))
            }
            FieldRef::Envelope(e) => e.jsonb_sql(&format!("r.{}", e.column())),
        }
    }

    /// Condition (on the columns of row alias `prefix`) under which a logical field resolves to
    /// variant `v`; tried in the order of `LogicalField::variants`.
    fn variant_applies(v: &FieldVariant, prefix: &str) -> String {
        let mut conds = Vec::new();
        if let Some(t) = &v.event_type {
            conds.push(format!("{prefix}event_type = {}", quote::literal(t)));
        }
        if let Some(ver) = v.version {
            conds.push(format!("{prefix}event_version = {ver}"));
        }
        if conds.is_empty() {
            "true".to_string()
        } else {
            conds.join(" AND ")
        }
    }

    /// For a reference that may be evaluated by a rich JSONPath: the condition (in stage c)
    /// under which its NULL value means "payload too deep to evaluate", not "missing", and the
    /// reason recorded then. Such an event is a type error: never a silent NULL.
    fn too_deep_check(field: &FieldRef, raw: &str) -> Option<(String, String)> {
        let (rich, what) = match field {
            FieldRef::Path { plan, text, .. } if plan.is_rich() => {
                ("true".to_string(), format!("JSONPath {text}"))
            }
            FieldRef::Logical(f) if f.variants.iter().any(|v| v.plan.is_rich()) => {
                let whens: Vec<String> = f
                    .variants
                    .iter()
                    .map(|v| {
                        format!(
                            "WHEN {} THEN {}",
                            Self::variant_applies(v, ""),
                            v.plan.is_rich()
                        )
                    })
                    .collect();
                (
                    format!("CASE {} END", whens.join(" ")),
                    format!("field \"{}\"", f.name),
                )
            }
            _ => return None,
        };
        Some((
            format!("({raw} IS NULL AND {rich} AND eventview._jsonpath_too_deep(payload::text))"),
            quote::literal(&format!(
                "{what} cannot be evaluated: the payload is nested deeper than {} levels",
                jsonpath::RICH_MAX_NESTING
            )),
        ))
    }

    /// The view's position in the changelog, as `batch` reads it.
    fn applied_state(&self) -> String {
        format!(
            "SELECT applied_snapshot AS s, applied_own_xid AS own, applied_own_seq AS own_seq
    FROM eventview._views WHERE view_id = {}",
            self.view_id
        )
    }

    /// Whether a refresh has anything to apply (see `batch::pending_check`), and how many
    /// values wait in the min/max logs (an idle refresh merges them).
    ///
    /// For a view the refresh pass in Rust covers, a fourth column, `batch_rows`: the event rows
    /// of the batch, counted up to ONE_PASS_MAX_ROWS + 1 (`batch::rows_in_batch`).
    pub fn pending_check(&self) -> String {
        let mut also = format!(
            "(SELECT extremes_logged FROM eventview._views WHERE view_id = {}) AS extremes_logged",
            self.view_id
        );
        let log = self.consumed_log();
        if self.one_pass_plan().is_some() {
            also.push_str(&format!(
                ",\n       {} AS batch_rows",
                batch::rows_in_batch(&log, ONE_PASS_MAX_ROWS + 1)
            ));
        }
        batch::log_pending_check(&log, &self.applied_state(), &also)
    }

    /// The log the view consumes: its event table's changelog, or for a rollup, its source
    /// view's group changelog.
    fn consumed_log(&self) -> String {
        match &self.rollup_source {
            Some(source) => names::view_changes(source.view_id),
            None => names::changelog(self.source_id),
        }
    }

    /// The signed rows of the batch; `by_runs`: fetch touched rows by id ranges (see `batch`).
    fn rows_delta(&self, by_runs: bool) -> String {
        let touched = if by_runs {
            batch::touched_rows(&self.source_scan)
        } else {
            batch::touched_rows_by_id(&self.source_scan)
        };
        let batch = batch::ctes(self.source_id, &self.applied_state());
        format!(
            "{batch},
firsts AS (SELECT DISTINCT ON (event_id) event_id, seq, op FROM ids ORDER BY event_id, seq),
delta_rows AS (
    SELECT -1 AS sign, true AS from_delta, c.event_id, c.old_event_type AS event_type,
           c.old_event_version AS event_version, c.old_producer AS producer,
           c.old_occurred_at AS occurred_at, c.old_payload AS payload
    FROM firsts f JOIN chg c ON c.seq = f.seq AND c.op <> 'I'
    WHERE f.op <> 'I'
    UNION ALL
    SELECT 1, true, e.event_id, e.event_type, e.event_version, e.producer, e.occurred_at, e.payload
    FROM {touched}
)"
        )
    }

    /// `full_rows`: every event of the source, signed +1 (a full rebuild, which reports its
    /// progress), or every event in the buckets `[$2, $3)` (`window`: a windowed rebuild).
    fn rows_full(&self, window: bool) -> String {
        let src = &self.source_scan;
        // A full recomputation reports its progress (`eventview._progress_tick`, always true).
        let bounds = if window {
            // The range on occurred_at is implied by the bucket range and lets an index help.
            let zone = self.def.time_zone.as_deref();
            let (before, after) = bucket_slack(zone);
            format!(
                "\n    WHERE e.occurred_at >= $2{before} AND e.occurred_at < $3 + $1::interval{after}\n      AND {b} >= $2 AND {b} < $3",
                b = bucket_expr(WIDTH_PARAM, "e.occurred_at", zone)
            )
        } else {
            "\n    WHERE eventview._progress_tick()".to_string()
        };
        format!(
            "full_rows AS (
    SELECT 1 AS sign, false AS from_delta, e.event_id, e.event_type, e.event_version,
           e.producer, e.occurred_at, e.payload
    FROM {src} e{bounds}
)"
        )
    }

    /// The one statement of an apply. Parameters: $1 bucket width (interval, NULL when not
    /// bucketed), $2 and $3 the window of `Mode::Window` (timestamptz). Returns one row:
    /// (changes consumed, groups written, groups with a retraction, first type error, values
    /// in the min/max logs).
    ///
    /// ```sql
    /// WITH snap ..., f ..., c ..., bad_rows ..., good ...,   -- delta_input
    /// d0 AS (...),                                           -- group_delta
    /// a<n> AS (INSERT INTO <value log or multiset> ...),     -- each multiset measure
    /// dd<n> AS (...),                                        -- each count_distinct
    /// d AS (...), up AS (INSERT INTO eventview._v<id>_data ...),
    /// unq AS (...), q AS (...),                              -- quarantine
    /// st AS (UPDATE eventview._views ...)
    /// SELECT <consumed>, <groups_written>, ...               -- apply_result
    /// ```
    pub fn apply(&self, mode: Mode) -> String {
        self.apply_statement(mode, false)
    }

    /// The apply of a shard's view (`hands_back_changes`) that hands the group changes back in
    /// its result row, as a sixth column `changes` (`handed_back_changes`), instead of
    /// writing them to its group changelog: what a coordinator's refresh runs, which takes
    /// them on at once.
    pub fn apply_handing_back_changes(&self) -> String {
        self.apply_statement(Mode::Delta, true)
    }

    /// The plan of the refresh pass in Rust (`group_deltas`) of this view's refresh: Some when
    /// the pass covers the view (`Plan::of`) and the refresh writes nothing else (a view that
    /// rollups read writes its group changes from `good`; a shard's view hands them back).
    pub fn one_pass_plan(&self) -> Option<Plan> {
        if self.feeds_rollups || self.rollup_source.is_some() || self.data_table.is_some() {
            return None;
        }
        Plan::of(self.def, &self.kept_in_row())
    }

    /// The refresh's apply (`apply(Mode::Delta)`) with the per-event work done by the pass in
    /// Rust (`group_deltas`), when `one_pass_plan` gives a plan: the aggregate
    /// `eventview._group_deltas` reads the batch's rows into `gd`, whose parts stand for `d0`
    /// and the rows of `a<n>`; the SQL stages read only the events it found a type error in, to
    /// give `bad_rows` their reasons. Same result row.
    ///
    /// ```sql
    /// WITH snap ..., delta_rows ...,
    /// gd AS MATERIALIZED (SELECT eventview._group_deltas(<plan>, $1::interval, r.sign, ...) AS rows FROM delta_rows r),
    /// type_error_rows AS (SELECT * FROM eventview._group_delta_rows((SELECT rows FROM gd), -1) AS t(...)),
    /// f ..., c ..., bad_rows ...,                          -- over type_error_rows
    /// d0 AS (SELECT * FROM eventview._group_delta_rows((SELECT rows FROM gd), 0) AS t(...)),
    /// a<n> AS (INSERT INTO ... SELECT * FROM eventview._group_delta_rows((SELECT rows FROM gd), <n>) AS t(...)),
    /// d ..., up ..., ...                                   -- as in apply
    /// ```
    pub fn apply_in_one_pass(&self) -> Option<String> {
        let plan = self.one_pass_plan()?;
        Some(self.apply_with(Mode::Delta, false, Some(&plan)))
    }

    /// `apply_in_one_pass` for the batch the event table's field observer took earlier in the
    /// transaction, whose refresh pass it ran over the same rows (`observe_sql::shared_pass`):
    /// $4 is the token of that pass's result (`pg::group_deltas::keeping_pass`). The batch is
    /// read under the observer's new position (`batch::observed_batch_ctes`), which makes it the
    /// observer's (the observer checked that the view's batch was its own under its snapshot,
    /// and all inserts), and the view's new position the observer's; the events are not read
    /// again, and no record of the batch supersedes a quarantine entry (inserts only). None for
    /// a view the pass does not cover.
    ///
    /// ```sql
    /// WITH snap AS MATERIALIZED (SELECT observed_snapshot AS s, observed_own_xid AS own, ...
    ///                            FROM eventview._sources WHERE source_id = <id>),
    ///      applied ..., chg ...,
    ///      gd AS MATERIALIZED (SELECT $4::bytea AS rows),
    ///      ...                     -- as apply_in_one_pass, without unq
    /// ```
    pub fn apply_from_shared_pass(&self) -> Option<String> {
        let plan = self.one_pass_plan()?;
        Some(self.apply_with_pass(Mode::Delta, false, Some(&plan), true))
    }

    /// The plan of the view's refresh pass as the field observer runs it for the view
    /// (`observe_sql::shared_pass`, with the view's event types); None for a view the pass
    /// does not cover.
    pub fn shared_pass_plan(&self) -> Option<String> {
        self.one_pass_plan().map(|plan| plan.to_text())
    }

    fn apply_statement(&self, mode: Mode, hand_back: bool) -> String {
        if self.rollup_source.is_some() {
            return self.rollup_apply(mode);
        }
        self.apply_with(mode, hand_back, None)
    }

    /// The CTEs of the pass in Rust through `bad_rows` (see `apply_in_one_pass`); `shared`: of
    /// `apply_from_shared_pass`.
    fn one_pass_input(&self, plan: &Plan, shared: bool) -> Vec<String> {
        let mode = Mode::Delta;
        let mut ctes = Vec::new();
        if shared {
            ctes.push(batch::observed_batch_ctes(
                self.source_id,
                &self.applied_state(),
            ));
            ctes.push(format!(
                "gd AS MATERIALIZED (SELECT {SHARED_PASS_PARAM}::bytea AS rows)"
            ));
        } else {
            let (input, rows) = self.input_rows(mode, true);
            ctes = input;
            ctes.push(format!(
                "gd AS MATERIALIZED (\n    SELECT eventview._group_deltas({}, {WIDTH_PARAM}, r.sign, r.event_id, r.event_type, r.event_version, r.producer, r.occurred_at, r.payload) AS rows\n    FROM {rows} r{}\n)",
                quote::literal(&plan.to_text()),
                self.row_filter(mode, WIDTH_PARAM)
            ));
        }
        ctes.push(format!(
            "type_error_rows AS (SELECT * FROM {} AS t({}))",
            Self::pass_part(-1),
            group_deltas::TYPE_ERROR_COLUMNS
        ));
        self.checked_rows(ctes, "type_error_rows", mode, WIDTH_PARAM, false)
    }

    /// The rows of part `part` of the pass's result (see `group_deltas`).
    fn pass_part(part: i32) -> String {
        format!("eventview._group_delta_rows((SELECT rows FROM gd), {part})")
    }

    fn apply_with(&self, mode: Mode, hand_back: bool, plan: Option<&Plan>) -> String {
        self.apply_with_pass(mode, hand_back, plan, false)
    }

    fn apply_with_pass(
        &self,
        mode: Mode,
        hand_back: bool,
        plan: Option<&Plan>,
        shared: bool,
    ) -> String {
        let mut ctes = match plan {
            Some(plan) => self.one_pass_input(plan, shared),
            None => self.delta_input(mode, WIDTH_PARAM, true),
        };
        let (key_exprs, mut d_cols) = self.group_delta_columns();
        let in_row = self.kept_in_row();
        if !in_row.is_empty() {
            let dirty = d_cols.pop().filter(|c| c.ends_with(" AS __dirty"));
            let dirty = dirty.expect("group_delta_columns ends with __dirty");
            d_cols.extend(in_row.iter().map(|n| {
                format!("coalesce(array_agg(m{n}) FILTER (WHERE sign > 0 AND m{n} IS NOT NULL), '{{}}') AS m{n}_vals")
            }));
            d_cols.push(dirty);
        }
        ctes.push(match plan {
            Some(plan) => format!(
                "d0 AS (SELECT * FROM {} AS t({}))",
                Self::pass_part(0),
                plan.group_columns()
            ),
            None => Self::group_delta(&d_cols, key_exprs.len()),
        });
        let mut logged = Vec::new();
        // The writes of values kept in the row read `up`, so they follow it.
        let mut after_upsert = Vec::new();
        for (n, m) in self.multiset_measures() {
            let (select, positions) = Self::value_counts(n, &key_exprs);
            let mut rows = match plan {
                Some(plan) => format!(
                    "SELECT * FROM {} AS t({})",
                    Self::pass_part(n as i32),
                    plan.value_columns()
                ),
                None => format!(
                    "SELECT {select}\n    FROM good WHERE m{n} IS NOT NULL\n    GROUP BY {positions}"
                ),
            };
            if in_row.contains(&n) {
                // Only the values of groups that do not keep them in the row (`up`).
                rows = format!(
                    "SELECT * FROM ({rows}) w\n    WHERE EXISTS (SELECT 1 FROM up WHERE {} AND (up.__retracted OR up.m{n}_out))",
                    self.keys_equal("up", "w")
                );
            }
            let to_log = matches!(m.kind, AggKind::Min | AggKind::Max) && self.logs_extremes(mode);
            if in_row.contains(&n) {
                after_upsert.push(self.values_written(n, m.kind, to_log, &rows));
            } else {
                ctes.push(self.values_written(n, m.kind, to_log, &rows));
            }
            if m.kind == AggKind::CountDistinct {
                ctes.push(self.distinct_changes(n));
            } else if to_log {
                logged.push(n);
            }
            if self.feeds_rollups && self.value_changes_written().any(|(k, _)| k == n) {
                ctes.push(format!(
                    "vc{n} AS (\n    SELECT {select}\n    FROM good WHERE m{n} IS NOT NULL\n    GROUP BY {positions}\n    HAVING sum(sign) <> 0\n)"
                ));
            }
        }
        ctes.push(self.group_delta_with_distinct_counts());
        ctes.push(self.storage_upsert());
        ctes.extend(after_upsert);
        if self.feeds_rollups && !hand_back {
            ctes.push(self.changes_written());
        }
        if mode != Mode::Full && !shared {
            ctes.push(self.superseded_quarantine());
        }
        if self.def.on_type_error == TypePolicy::Quarantine {
            ctes.push(self.quarantine());
        }
        ctes.push(self.position_update(mode, &logged));
        let mut result = self.apply_result(mode);
        if hand_back {
            result.push_str(&format!(
                ",\n       {} AS changes",
                self.handed_back_changes()
            ));
        }
        format!("WITH {}\n{result}", ctes.join(",\n"))
    }

    /// The CTEs from the rows to read through `good` (the type-checked values of each event,
    /// signed) and `bad_rows`: shared by the apply statement and realtime reads.
    ///
    /// ```sql
    /// <the batch and delta_rows, or snap and full_rows, or both>,   -- input_rows
    /// f AS (...),                  -- each reference evaluated once per row
    /// ft AS (...),                 -- each reference's JSON type taken once, when tested
    /// c0 AS (...), c AS (...),     -- values, filter and type checks (c alone: no key sizes)
    /// bad_rows AS (...),
    /// good AS NOT MATERIALIZED (...)
    /// ```
    fn delta_input(&self, mode: Mode, width: &str, by_runs: bool) -> Vec<String> {
        let (ctes, rows) = self.input_rows(mode, by_runs);
        self.checked_rows(ctes, rows, mode, width, true)
    }

    /// The CTEs after `input_rows` (`ctes`, whose `rows` they read) of `delta_input`, through
    /// `bad_rows`, and `good` when `with_good`.
    fn checked_rows(
        &self,
        mut ctes: Vec<String>,
        rows: &str,
        mode: Mode,
        width: &str,
        with_good: bool,
    ) -> Vec<String> {
        let refs = self.refs();
        let too_deep: Vec<(String, String)> = refs
            .iter()
            .filter_map(|r| Self::too_deep_check(r, &self.raw_column(&refs, r)))
            .collect();
        ctes.push(self.evaluated_references(&refs, rows, mode, width, !too_deep.is_empty()));
        let (mut c_cols, checks) = self.checked_values(&refs, width);
        // Sizes are checked over c's columns, in a second step (c0 then c) when the view keeps
        // keys whose size varies.
        let oversize = self.oversize_check();
        let bad = Self::type_error(too_deep.into_iter().chain(checks).collect());
        let bad_column = if oversize.is_some() { "bad0" } else { "bad" };
        c_cols.push(format!("{bad} AS {bad_column}"));
        let (c_cols, c_where, types) = Self::take_json_types(
            refs.len(),
            c_cols.join(",\n           "),
            self.filter_condition(&refs),
        );
        let from = if types.is_empty() {
            "f"
        } else {
            ctes.push(Self::json_types(&types));
            "ft"
        };
        ctes.extend(Self::checked(&c_cols, from, &c_where, oversize));
        if !with_good {
            // The rows are those the pass in Rust found a type error in: one it finds and these
            // stages do not (a defect) still quarantines the event, or fails the refresh,
            // rather than leave it out of the view unseen.
            ctes.push(format!(
                "bad_rows AS (SELECT event_id, coalesce(bad, {}) AS bad FROM c WHERE sign > 0)",
                quote::literal(PASS_DISAGREES)
            ));
            return ctes;
        }
        if self.def.unnest.is_some() {
            // An event is one input row per element: a type error in any of them (or an array
            // that is no array) leaves the whole event out, as one quarantine entry.
            ctes.push(
                "bad_rows AS (SELECT DISTINCT ON (event_id) event_id, bad FROM c WHERE bad IS NOT NULL AND sign > 0 ORDER BY event_id, __no)".into(),
            );
            ctes.push("good AS NOT MATERIALIZED (SELECT * FROM c WHERE bad IS NULL AND NOT EXISTS (SELECT 1 FROM c b WHERE b.bad IS NOT NULL AND b.event_id = c.event_id AND b.sign = c.sign))".into());
        } else {
            ctes.push(
                "bad_rows AS (SELECT event_id, bad FROM c WHERE bad IS NOT NULL AND sign > 0)"
                    .into(),
            );
            ctes.push("good AS NOT MATERIALIZED (SELECT * FROM c WHERE bad IS NULL)".into());
        }
        ctes
    }

    /// The CTEs giving the signed rows of an apply of `mode`, and the FROM item that reads
    /// them: the batch's rows (`delta_rows`), every event (`full_rows`, with `snap` for the
    /// new position), or both (a windowed rebuild).
    fn input_rows(&self, mode: Mode, by_runs: bool) -> (Vec<String>, &'static str) {
        match mode {
            Mode::Delta => (vec![self.rows_delta(by_runs)], "delta_rows"),
            Mode::Full => (
                vec![batch::SNAP_CTE.to_string(), self.rows_full(false)],
                "full_rows",
            ),
            Mode::Window => (
                vec![self.rows_delta(by_runs), self.rows_full(true)],
                "(SELECT * FROM delta_rows UNION ALL SELECT * FROM full_rows)",
            ),
        }
    }

    /// `f`: each reference evaluated once per row of `rows` (OFFSET 0 keeps the planner from
    /// inlining the expressions into every use), with the payload when a rich JSONPath may
    /// need it for its depth check (`with_payload`).
    ///
    /// ```sql
    /// f AS (
    ///     SELECT r.sign, r.from_delta, r.event_id, ..., (r.payload -> 'sku') AS j1, ...
    ///     FROM delta_rows r
    ///     WHERE r.event_type = ANY (ARRAY[...]::text[])
    ///     OFFSET 0
    /// )
    /// ```
    fn evaluated_references(
        &self,
        refs: &[&FieldRef],
        rows: &str,
        mode: Mode,
        width: &str,
        with_payload: bool,
    ) -> String {
        let mut f_cols = vec!["r.sign, r.from_delta, r.event_id, r.event_type, r.event_version, r.producer, r.occurred_at".to_string()];
        for (i, r) in refs.iter().enumerate() {
            f_cols.push(format!("{} AS j{}", Self::raw_sql(r), i + 1));
        }
        if with_payload {
            f_cols.push("r.payload".into());
        }
        let elements = match &self.def.unnest {
            Some(array) => {
                f_cols.push("u.__no, u.__unnest_kind".into());
                Self::elements(array)
            }
            None => String::new(),
        };
        format!(
            "f AS (\n    SELECT {}\n    FROM {rows} r{elements}{}\n    OFFSET 0\n)",
            f_cols.join(",\n           "),
            self.row_filter(mode, width)
        )
    }

    /// With `unnest`: the elements of each row's array, one row each (`__elem`, numbered from
    /// 1 in `__no`); none for a row without the array (missing, JSON null or empty); for a
    /// value that is no array, one row with its JSON type in `__unnest_kind` (a type error).
    ///
    /// ```sql
    /// CROSS JOIN LATERAL (SELECT <array> AS arr) ua
    /// CROSS JOIN LATERAL (
    ///     SELECT e.value AS __elem, e.ordinality AS __no, NULL::text AS __unnest_kind
    ///     FROM jsonb_array_elements(CASE WHEN jsonb_typeof(ua.arr) = 'array' THEN ua.arr END) WITH ORDINALITY e
    ///     UNION ALL
    ///     SELECT NULL, 0, jsonb_typeof(ua.arr) WHERE jsonb_typeof(ua.arr) NOT IN ('array', 'null')) u
    /// ```
    fn elements(array: &FieldRef) -> String {
        let a = Self::raw_sql(array);
        format!(
            "\n    CROSS JOIN LATERAL (SELECT {a} AS arr) ua\n    CROSS JOIN LATERAL (\n        SELECT e.value AS __elem, e.ordinality AS __no, NULL::text AS __unnest_kind\n        FROM jsonb_array_elements(CASE WHEN jsonb_typeof(ua.arr) = 'array' THEN ua.arr END) WITH ORDINALITY e\n        UNION ALL\n        SELECT NULL, 0, jsonb_typeof(ua.arr) WHERE jsonb_typeof(ua.arr) NOT IN ('array', 'null')) u"
        )
    }

    /// The WHERE clause of `f`: the view's event types, and in a windowed rebuild, changes
    /// outside the window only (the window's events come from `full_rows`).
    ///
    /// ```sql
    ///     WHERE r.event_type = ANY (ARRAY['a', 'b']::text[])
    ///       AND NOT (r.from_delta AND <bucket> >= $2 AND <bucket> < $3)
    /// ```
    fn row_filter(&self, mode: Mode, width: &str) -> String {
        let mut conds = Vec::new();
        if let Some(types) = &self.def.event_types {
            let list: Vec<String> = types.iter().map(|t| quote::literal(t)).collect();
            conds.push(format!(
                "r.event_type = ANY (ARRAY[{}]::text[])",
                list.join(", ")
            ));
        }
        if mode == Mode::Window {
            let b = bucket_expr(width, "r.occurred_at", self.def.time_zone.as_deref());
            conds.push(format!("NOT (r.from_delta AND {b} >= $2 AND {b} < $3)"));
        }
        where_clause(&conds)
    }

    /// The columns of `c` before its type error: sign, event id, bucket, each group key
    /// (`g<i>`) and measure input (`m<n>`) as its use needs it, and the type checks of those
    /// values as (condition, reason).
    ///
    /// ```sql
    /// sign, event_id, <bucket> AS bucket,
    /// CASE WHEN jsonb_typeof(j1) IN ('string', 'number', 'boolean') THEN j1 #>> '{}' END AS g1,
    /// CASE WHEN jsonb_typeof(j2) = 'number' THEN j2::numeric END AS m1, ...
    /// ```
    fn checked_values(
        &self,
        refs: &[&FieldRef],
        width: &str,
    ) -> (Vec<String>, Vec<(String, String)>) {
        let def = self.def;
        let mut cols = vec!["sign".to_string(), "event_id".to_string()];
        let mut checks = Vec::new();
        if let Some(array) = &def.unnest {
            cols.push("__no".into());
            checks.push((
                "__unnest_kind IS NOT NULL".to_string(),
                format!(
                    "{} || __unnest_kind || ', not an array'",
                    quote::literal(&format!("unnest {} is a JSON ", array.display()))
                ),
            ));
        }
        if def.bucketed {
            cols.push(format!(
                "{} AS bucket",
                bucket_expr(width, "occurred_at", self.def.time_zone.as_deref())
            ));
        }
        for (i, g) in def.group_by.iter().enumerate() {
            let raw = self.raw_column(refs, &g.field);
            let context = format!("group column \"{}\"", g.name);
            let v = value_sql(&g.field, &raw, Use::GroupKey, &context);
            checks.extend(v.check);
            cols.push(format!("{} AS g{}", v.expr, i + 1));
        }
        for (n, m) in self.numbered_measures() {
            let Some(field) = &m.field else { continue };
            let used = match m.kind {
                AggKind::CountStar => continue,
                AggKind::Count => Use::CountNonNull,
                AggKind::Sum | AggKind::Avg => Use::Number,
                AggKind::Min | AggKind::Max => Use::Extreme,
                AggKind::CountDistinct => Use::Distinct,
                AggKind::Percentile => Use::Extreme,
                AggKind::ApproxPercentile => Use::Number,
            };
            let raw = self.raw_column(refs, field);
            let context = format!(
                "measure \"{}\": {}({})",
                m.name,
                m.kind.name(),
                field.display()
            );
            let v = value_sql(field, &raw, used, &context);
            checks.extend(v.check);
            if m.kind == AggKind::ApproxPercentile {
                cols.push(format!("{} AS m{n}", sketch::bucket_sql(&v.expr)));
            } else {
                cols.push(format!("{} AS m{n}", v.expr));
            }
        }
        (cols, checks)
    }

    /// The type error of an event: the reason of the first check that fails, NULL when none
    /// does.
    ///
    /// ```sql
    /// CASE WHEN <condition> THEN <reason> WHEN ... END
    /// ```
    fn type_error(mut checks: Vec<(String, String)>) -> String {
        // A condition already tested by an earlier WHEN can never choose its reason (two
        // measures over one field check it alike): tested once.
        let mut tested = std::collections::HashSet::new();
        checks.retain(|(cond, _)| tested.insert(cond.clone()));
        if checks.is_empty() {
            return "NULL::text".to_string();
        }
        let whens: Vec<String> = checks
            .iter()
            .map(|(cond, reason)| format!("WHEN {cond} THEN {reason}"))
            .collect();
        format!("CASE {} END", whens.join(" "))
    }

    /// The WHERE clause of `c`: the view's filter, each term a set of accepted jsonb values.
    ///
    /// ```sql
    ///     WHERE j3 IN ('"DE"'::jsonb, '1'::jsonb)
    ///       AND ...
    /// ```
    fn filter_condition(&self, refs: &[&FieldRef]) -> String {
        let mut conds = Vec::new();
        for term in &self.def.filter {
            let lhs = match &term.field {
                FieldRef::Envelope(e) => e.jsonb_sql(e.column()),
                field => self.raw_column(refs, field),
            };
            let values: Vec<String> = term
                .values
                .iter()
                .map(|v| quote::typed_literal(&v.to_string(), "jsonb"))
                .collect();
            // An event whose filter field cannot be evaluated passes on to its type check; so
            // does one whose `unnest` value is no array, for a filter on the element.
            if term.field.reads_element() {
                conds.push(format!(
                    "({lhs} IN ({}) OR __unnest_kind IS NOT NULL)",
                    values.join(", ")
                ));
                continue;
            }
            match Self::too_deep_check(&term.field, &lhs) {
                Some((deep, _)) => {
                    conds.push(format!("({lhs} IN ({}) OR {deep})", values.join(", ")))
                }
                None => conds.push(format!("{lhs} IN ({})", values.join(", "))),
            }
        }
        where_clause(&conds)
    }

    /// The JSON type of each reference, which the keys, values and checks of `c` test up to
    /// four times per event, taken once: `c`'s columns and condition with every
    /// `jsonb_typeof(j<i>)` outside quotes replaced by `t<i>`, and the `ft` columns that
    /// compute the types used (`jsonb_typeof(j<i>) AS t<i>`).
    fn take_json_types(
        refs: usize,
        mut c_cols: String,
        mut c_where: String,
    ) -> (String, String, Vec<String>) {
        let mut types = Vec::new();
        for i in 1..=refs {
            // Not inside literals: filter values and type error messages hold user text.
            let typeof_j = format!("jsonb_typeof(j{i})");
            let cols = quote::replace_outside_quotes(&c_cols, &typeof_j, &format!("t{i}"));
            let cond = quote::replace_outside_quotes(&c_where, &typeof_j, &format!("t{i}"));
            if cols != c_cols || cond != c_where {
                (c_cols, c_where) = (cols, cond);
                types.push(format!("{typeof_j} AS t{i}"));
            }
        }
        (c_cols, c_where, types)
    }

    /// `ft`: `f` with the JSON types `c` tests, kept apart from `c` by OFFSET 0 so the planner
    /// does not substitute the expressions back into every use.
    ///
    /// ```sql
    /// ft AS (
    ///     SELECT f.*, jsonb_typeof(j1) AS t1, ...
    ///     FROM f
    ///     OFFSET 0
    /// )
    /// ```
    fn json_types(types: &[String]) -> String {
        format!(
            "ft AS (\n    SELECT f.*, {}\n    FROM f\n    OFFSET 0\n)",
            types.join(", ")
        )
    }

    /// `c`: each event's values and type error, computed once per event (MATERIALIZED; it
    /// would be anyway, being read twice). Every reader of `good` (the group delta `d0`, and
    /// `a<n>` of each min/max or count_distinct measure: its value log or multiset) scans it
    /// with good's condition (NOT MATERIALIZED), rather than through a second stored copy of
    /// the same rows: measured, about a sixth of the time of a 10,000-event refresh, with the
    /// fence of `c0`. With an `oversize` check, `c0` computes the values and `c` adds the size
    /// check to the type error.
    ///
    /// ```sql
    /// c0 AS (
    ///     SELECT sign, event_id, ..., <type error> AS bad0
    ///     FROM ft
    ///     WHERE <filter>
    ///     OFFSET 0
    /// ),
    /// c AS MATERIALIZED (
    ///     SELECT c0.*, coalesce(c0.bad0, <oversize>) AS bad
    ///     FROM c0
    /// )
    /// ```
    fn checked(c_cols: &str, from: &str, c_where: &str, oversize: Option<String>) -> Vec<String> {
        match oversize {
            None => vec![format!(
                "c AS MATERIALIZED (\n    SELECT {c_cols}\n    FROM {from}{c_where}\n)"
            )],
            // c0 is fenced by OFFSET 0: pulled up into c, each of its columns the size check
            // reads (keys, min/max and count_distinct values) would be computed again.
            Some(oversize) => vec![
                format!("c0 AS (\n    SELECT {c_cols}\n    FROM {from}{c_where}\n    OFFSET 0\n)"),
                format!("c AS MATERIALIZED (\n    SELECT c0.*, coalesce(c0.bad0, {oversize}) AS bad\n    FROM c0\n)"),
            ],
        }
    }

    /// The type error of an event whose group key, or group key and value of a min/max or
    /// count_distinct measure, is too large to store (over `c0`), or None when the view keeps
    /// no such key. Keys and values are entries of unique btree indexes, which take at most
    /// about 2.7 kB (after compression, which not every value allows): one event with a larger
    /// key could fail every refresh of the view, whatever its type policy. The sizes counted
    /// are those of the variable-length parts, uncompressed; the rest of an entry (bucket,
    /// flags, headers) fits in what MAX_KEY_BYTES leaves.
    fn oversize_check(&self) -> Option<String> {
        let def = self.def;
        let keys: Vec<String> = (1..=def.group_by.len())
            .map(|n| format!("coalesce(pg_catalog.pg_column_size(c0.g{n}), 0)"))
            .collect();
        let key_bytes = if keys.is_empty() {
            "0".to_string()
        } else {
            keys.join(" + ")
        };
        let mut whens = Vec::new();
        if !keys.is_empty() {
            let names: Vec<String> = def
                .group_by
                .iter()
                .map(|g| format!("\"{}\"", g.name))
                .collect();
            whens.push(format!(
                "WHEN {key_bytes} > {MAX_KEY_BYTES} THEN {} || ({key_bytes}) || {}",
                quote::literal(&format!("group columns {} take ", names.join(", "))),
                quote::literal(&format!(
                    " bytes, more than the {MAX_KEY_BYTES} a group key may take"
                ))
            ));
        }
        for (n, m) in self.multiset_measures() {
            let field = m.field.as_ref().map(|f| f.display()).unwrap_or("");
            let bytes = format!("{key_bytes} + coalesce(pg_catalog.pg_column_size(c0.m{n}), 0)");
            whens.push(format!(
                "WHEN {bytes} > {MAX_KEY_BYTES} THEN {} || ({bytes}) || {}",
                quote::literal(&format!(
                    "measure \"{}\": {}({field}) takes, with the group columns, ",
                    m.name,
                    m.kind.name()
                )),
                quote::literal(&format!(
                    " bytes, more than the {MAX_KEY_BYTES} a stored value may take"
                ))
            ));
        }
        if whens.is_empty() {
            None
        } else {
            Some(format!("CASE {} END", whens.join(" ")))
        }
    }

    /// Key expressions of a group (over `good`) and the columns of its signed delta (`d0`):
    /// keys, `__count`, per measure its counters or addition-only extreme, and `__dirty`
    /// (the group took a retraction).
    fn group_delta_columns(&self) -> (Vec<String>, Vec<String>) {
        let mut key_exprs = vec!["true AS __k".to_string()];
        if self.def.bucketed {
            key_exprs.push("bucket".into());
        }
        for (i, g) in self.def.group_by.iter().enumerate() {
            let n = i + 1;
            key_exprs.push(format!(
                "coalesce(g{n}, {}) AS g{n}",
                g.sql_type().placeholder()
            ));
            key_exprs.push(format!("(g{n} IS NULL) AS g{n}_null"));
        }
        let mut d_cols = key_exprs.clone();
        d_cols.push("sum(sign)::bigint AS __count".into());
        for (i, m) in self.def.measures.iter().enumerate() {
            let n = i + 1;
            match m.kind {
                AggKind::CountStar => {}
                AggKind::Count => d_cols.push(format!(
                    "sum(CASE WHEN m{n} THEN sign ELSE 0 END)::bigint AS m{n}_n"
                )),
                AggKind::Sum | AggKind::Avg => {
                    d_cols.push(format!(
                        "sum(CASE WHEN m{n} IS NOT NULL THEN sign ELSE 0 END)::bigint AS m{n}_n"
                    ));
                    d_cols.push(format!("coalesce(sum(sign * m{n}), 0) AS m{n}_sum"));
                }
                AggKind::Min | AggKind::Max => {
                    let agg = if m.kind == AggKind::Min { "min" } else { "max" };
                    d_cols.push(format!("{agg}(m{n}) FILTER (WHERE sign > 0) AS m{n}_val"));
                }
                // The group's changes of the sketch, as a sketch (`sketch`).
                AggKind::ApproxPercentile => d_cols.push(format!(
                    "eventview._sketch_add(NULL, array_agg(m{n}) FILTER (WHERE m{n} IS NOT NULL), array_agg(sign::bigint) FILTER (WHERE m{n} IS NOT NULL)) AS m{n}_sk"
                )),
                // Their values go to the multiset (`a<n>`) alone.
                AggKind::CountDistinct | AggKind::Percentile => {}
            }
        }
        d_cols.push("bool_or(sign < 0) AS __dirty".into());
        (key_exprs, d_cols)
    }

    /// `d0`: the signed delta of each group the rows of `good` touch, over `d_cols` (see
    /// `group_delta_columns`), grouped by the first `key_count` of them.
    ///
    /// ```sql
    /// d0 AS (
    ///     SELECT true AS __k,
    ///            bucket,
    ///            coalesce(g1, ''::text) AS g1,
    ///            (g1 IS NULL) AS g1_null,
    ///            sum(sign)::bigint AS __count, ...
    ///     FROM good
    ///     GROUP BY 1, 2, 3, 4
    /// )
    /// ```
    fn group_delta(d_cols: &[String], key_count: usize) -> String {
        let positions: Vec<String> = (1..=key_count).map(|p| p.to_string()).collect();
        format!(
            "d0 AS (\n    SELECT {}\n    FROM good\n    GROUP BY {}\n)",
            d_cols.join(",\n           "),
            positions.join(", ")
        )
    }

    /// The signed count of each (group, value) of measure `n` in `good`, as selected into a
    /// multiset or value log: the group's key expressions, `v` and `n`, and the GROUP BY
    /// positions.
    fn value_counts(n: usize, key_exprs: &[String]) -> (String, String) {
        let mut sel = key_exprs.to_vec();
        sel.push(format!("m{n} AS v"));
        sel.push("sum(sign)::bigint AS n".into());
        let positions: Vec<String> = (1..=key_exprs.len() + 1).map(|p| p.to_string()).collect();
        (sel.join(", "), positions.join(", "))
    }

    /// `a<n>`: the (keys, v, n) rows of measure `n` that `rows` selects, appended to its value
    /// log (`to_log`: a min/max measure of a stored view's refresh, counted into
    /// `extremes_logged` by `position_update`) or added into its multiset. A count_distinct
    /// multiset keeps each value's count before the upsert (`prev_n`) and returns per value
    /// whether it entered (1) or left (-1) the distinct count.
    ///
    /// ```sql
    /// a<n> AS (
    ///     INSERT INTO eventview._v<id>_m<n> AS t (__k, bucket, g1, g1_null, v, n)
    ///     SELECT true AS __k, bucket, ..., m<n> AS v, sum(sign)::bigint AS n
    ///     FROM good WHERE m<n> IS NOT NULL
    ///     GROUP BY 1, 2, 3, 4, 5
    ///     ON CONFLICT (__k, bucket, g1, g1_null, v) DO UPDATE SET n = t.n + EXCLUDED.n
    ///     RETURNING 1
    /// )
    /// ```
    fn values_written(&self, n: usize, kind: AggKind, to_log: bool, rows: &str) -> String {
        let key_list = self.key_list();
        if to_log {
            return format!(
                "a{n} AS (\n    INSERT INTO {} ({key_list}, v, n)\n    {rows}\n    RETURNING 1\n)",
                names::view_values_log(self.view_id, n),
            );
        }
        let (set, returning) = if kind == AggKind::CountDistinct {
            (
                "prev_n = t.n, n = t.n + EXCLUDED.n".to_string(),
                format!("{key_list}, CASE WHEN t.n > 0 AND t.prev_n <= 0 THEN 1 WHEN t.n <= 0 AND t.prev_n > 0 THEN -1 ELSE 0 END AS dd"),
            )
        } else {
            ("n = t.n + EXCLUDED.n".to_string(), "1".to_string())
        };
        format!(
            "a{n} AS (\n    INSERT INTO {} AS t ({key_list}, v, n)\n    {rows}\n    ON CONFLICT ({key_list}, v) DO UPDATE SET {set}\n    RETURNING {returning}\n)",
            names::view_values(self.view_id, n)
        )
    }

    /// `dd<n>`: per group, the change of count_distinct measure `n` (values entering minus
    /// values leaving the distinct count, from `a<n>`).
    ///
    /// ```sql
    /// dd<n> AS (SELECT __k, ..., sum(dd)::bigint AS dd FROM a<n> GROUP BY __k, ...)
    /// ```
    fn distinct_changes(&self, n: usize) -> String {
        let key_list = self.key_list();
        format!("dd{n} AS (SELECT {key_list}, sum(dd)::bigint AS dd FROM a{n} GROUP BY {key_list})")
    }

    /// `d`: the group deltas of `d0` with the change of each count_distinct measure.
    ///
    /// ```sql
    /// d AS (SELECT d0.*, coalesce(dd<n>.dd, 0) AS m<n>_val FROM d0 LEFT JOIN dd<n> USING (...))
    /// ```
    fn group_delta_with_distinct_counts(&self) -> String {
        let key_list = self.key_list();
        let mut select = vec!["d0.*".to_string()];
        let mut joins = String::new();
        for (n, m) in self.multiset_measures() {
            if m.kind == AggKind::CountDistinct {
                select.push(format!("coalesce(dd{n}.dd, 0) AS m{n}_val"));
                joins.push_str(&format!(" LEFT JOIN dd{n} USING ({key_list})"));
            }
        }
        format!("d AS (SELECT {} FROM d0{joins})", select.join(", "))
    }

    /// `up`: the group deltas added into storage.
    ///
    /// ```sql
    /// up AS (
    ///     INSERT INTO eventview._v<id>_data AS t (__k, ..., __count, m1_n, ..., __dirty)
    ///     SELECT __k, ..., __dirty FROM d
    ///     ON CONFLICT (__k, ...) DO UPDATE SET
    ///         __count = t.__count + EXCLUDED.__count,
    ///         ...
    ///         __dirty = EXCLUDED.__dirty
    ///     RETURNING t.__dirty
    /// )
    /// ```
    ///
    /// With values in the row (`kept_in_row`), `d`'s `__dirty` says the group took a retraction,
    /// and its arrays hold its additions: proposed NULL when it took a retraction (which is how
    /// the update tells one), the additions otherwise. A group's arrays take its additions
    /// unless it took a retraction; one that took a retraction, or whose arrays pass
    /// `MAX_VALUES_IN_ROW` values, turns dirty (its arrays move out in the fix-up). `up` returns
    /// each group's keys, whether it took a retraction (dirty with no array past the limit:
    /// arrays of a group that took one are left as they were) and whether its values of measure
    /// `n` are outside the row (`m<n>_out`):
    ///
    /// ```sql
    ///     INSERT ... (..., m<n>_vals, __dirty)
    ///     SELECT ..., CASE WHEN __dirty THEN NULL ELSE m<n>_vals END,
    ///            __dirty OR cardinality(m<n>_vals) > <max> OR ... FROM d
    ///     ON CONFLICT (...) DO UPDATE SET ...,
    ///         m<n>_vals = CASE WHEN t.m<n>_vals IS NULL OR EXCLUDED.m<first>_vals IS NULL
    ///                          THEN t.m<n>_vals ELSE t.m<n>_vals || EXCLUDED.m<n>_vals END,
    ///         __dirty = EXCLUDED.m<first>_vals IS NULL OR (t.m<n>_vals IS NOT NULL
    ///                   AND cardinality(t.m<n>_vals) + cardinality(EXCLUDED.m<n>_vals) > <max>) OR ...
    ///     RETURNING t.__dirty, __k, ..., t.__dirty AND coalesce(cardinality(t.m<n>_vals), 0)
    ///               <= <max> AND ... AS __retracted, t.m<n>_vals IS NULL AS m<n>_out
    /// ```
    fn storage_upsert(&self) -> String {
        let mut cols = self.key_columns();
        cols.push("__count".into());
        cols.extend(self.measure_columns());
        let in_row = self.kept_in_row();
        let mut selected = cols.clone();
        for n in &in_row {
            cols.push(format!("m{n}_vals"));
            selected.push(format!("CASE WHEN __dirty THEN NULL ELSE m{n}_vals END"));
        }
        cols.push("__dirty".into());
        let past: String = in_row
            .iter()
            .map(|n| format!(" OR cardinality(m{n}_vals) > {MAX_VALUES_IN_ROW}"))
            .collect();
        selected.push(format!("__dirty{past}"));
        let past: String = in_row
            .iter()
            .map(|n| format!(" OR (t.m{n}_vals IS NOT NULL AND cardinality(t.m{n}_vals) + cardinality(EXCLUDED.m{n}_vals) > {MAX_VALUES_IN_ROW})"))
            .collect();
        let mut sets = vec!["__count = t.__count + EXCLUDED.__count".to_string()];
        sets.extend(self.measure_updates());
        // (A group whose values are outside the row takes any number of them.)
        let retracted = self
            .retracted_in_update()
            .unwrap_or_else(|| "EXCLUDED.__dirty".into());
        if !in_row.is_empty() {
            sets.extend(in_row.iter().map(|n| {
                format!("m{n}_vals = CASE WHEN t.m{n}_vals IS NULL OR {retracted} THEN t.m{n}_vals ELSE t.m{n}_vals || EXCLUDED.m{n}_vals END")
            }));
        }
        sets.push(format!("__dirty = {retracted}{past}"));
        let mut returning = "t.__dirty".to_string();
        if !in_row.is_empty() {
            for k in self.key_columns() {
                returning.push_str(&format!(", t.{k}"));
            }
            let within: String = in_row
                .iter()
                .map(|n| {
                    format!(" AND coalesce(cardinality(t.m{n}_vals), 0) <= {MAX_VALUES_IN_ROW}")
                })
                .collect();
            returning.push_str(&format!(", t.__dirty{within} AS __retracted"));
            for n in &in_row {
                returning.push_str(&format!(", t.m{n}_vals IS NULL AS m{n}_out"));
            }
        }
        format!(
            "up AS (\n    INSERT INTO {} AS t ({cols})\n    SELECT {selected} FROM d\n    ON CONFLICT ({}) DO UPDATE SET\n        {sets}\n    RETURNING {returning}\n)",
            self.data(),
            self.key_list(),
            cols = cols.join(", "),
            selected = selected.join(", "),
            sets = sets.join(",\n        ")
        )
    }

    /// With values in the row, how the update of `up` tells that the group took a retraction
    /// (its proposed arrays are NULL; `EXCLUDED.__dirty` is also set by additions past the
    /// values a row keeps).
    fn retracted_in_update(&self) -> Option<String> {
        self.kept_in_row()
            .first()
            .map(|n| format!("EXCLUDED.m{n}_vals IS NULL"))
    }

    /// How `up` adds a group delta (`EXCLUDED`) into each measure's stored columns (`t`).
    ///
    /// ```sql
    /// m<n>_n = t.m<n>_n + EXCLUDED.m<n>_n,
    /// m<n>_val = CASE WHEN EXCLUDED.__dirty THEN t.m<n>_val
    ///                 ELSE GREATEST(t.m<n>_val, EXCLUDED.m<n>_val) END      -- max
    /// ```
    fn measure_updates(&self) -> Vec<String> {
        let mut sets = Vec::new();
        let retracted = self
            .retracted_in_update()
            .unwrap_or_else(|| "EXCLUDED.__dirty".into());
        let add = |col: String| format!("{col} = t.{col} + EXCLUDED.{col}");
        for (n, m) in self.numbered_measures() {
            match m.kind {
                AggKind::CountStar => {}
                AggKind::Count => sets.push(add(format!("m{n}_n"))),
                AggKind::Sum | AggKind::Avg => {
                    sets.push(add(format!("m{n}_n")));
                    sets.push(add(format!("m{n}_sum")));
                }
                AggKind::Min | AggKind::Max => {
                    let pick = if m.kind == AggKind::Min {
                        "LEAST"
                    } else {
                        "GREATEST"
                    };
                    // Only additions: the extreme can only move outwards. A retraction defers
                    // to the fix-up, which reads the group's multiset.
                    sets.push(format!(
                        "m{n}_val = CASE WHEN {retracted} THEN t.m{n}_val ELSE {pick}(t.m{n}_val, EXCLUDED.m{n}_val) END"
                    ));
                }
                // The change `d` takes from the multiset upsert: +1 per value whose count rose
                // from zero, -1 per value whose count fell to zero.
                AggKind::CountDistinct => sets.push(add(format!("m{n}_val"))),
                AggKind::Percentile => {}
                // An unchanged sketch keeps its stored value (out of line, not written again).
                AggKind::ApproxPercentile => sets.push(format!(
                    "m{n}_sk = CASE WHEN EXCLUDED.m{n}_sk IS NULL THEN t.m{n}_sk ELSE eventview._sketch_merge(t.m{n}_sk, EXCLUDED.m{n}_sk) END"
                )),
            }
        }
        sets
    }

    /// `unq`: the quarantine entries of the events the batch updated or deleted. An entry
    /// describes the version of an event the view left out; when the event is updated or
    /// deleted (an erasure request must not leave a copy behind), that version is superseded
    /// and its entry goes, whatever the policy and declarations are now. The DELETE sees only
    /// the entries from before this statement, never those `q` files for the events' new
    /// versions. (`eventview.views.quarantined` counts the entries themselves, so no counter
    /// follows them.)
    ///
    /// ```sql
    /// unq AS (
    ///     DELETE FROM eventview.quarantine q
    ///     WHERE q.view_name = <known name>
    ///       AND q.event_id IN (SELECT event_id FROM chg WHERE op <> 'I')
    /// )
    /// ```
    fn superseded_quarantine(&self) -> String {
        format!(
            "unq AS (
    DELETE FROM eventview.quarantine q
    WHERE q.view_name = {known}
      AND q.event_id IN (SELECT event_id FROM chg WHERE op <> 'I')
)",
            known = self.known_name()
        )
    }

    /// `q`: the events with a type error, copied into the quarantine (`on_type_error`
    /// quarantine).
    ///
    /// ```sql
    /// q AS (
    ///     INSERT INTO eventview.quarantine (source, view_name, event_id, reason, event)
    ///     SELECT ..., b.event_id, b.bad, jsonb_build_object(...)
    ///     FROM bad_rows b LEFT JOIN <event table> e ON e.event_id = b.event_id
    /// )
    /// ```
    fn quarantine(&self) -> String {
        format!(
            "q AS (
    INSERT INTO eventview.quarantine (source, view_name, event_id, reason, event)
    SELECT (SELECT relid FROM eventview._sources WHERE source_id = {sid}),
           {known},
           b.event_id, b.bad,
           jsonb_build_object('event_id', e.event_id, 'event_key', e.event_key,
                              'event_type', e.event_type, 'event_version', e.event_version,
                              'producer', e.producer, 'occurred_at', e.occurred_at,
                              'payload', e.payload)
    FROM bad_rows b LEFT JOIN {src} e ON e.event_id = b.event_id
)",
            sid = self.source_id,
            known = self.known_name(),
            src = self.source_scan
        )
    }

    /// `st`: the view's new position in the changelog and its counters: events skipped
    /// (`on_type_error` skip), and values in the min/max logs, which the value logs of the
    /// measures `logged` grew by (a full rebuild empties the logs).
    ///
    /// ```sql
    /// st AS (
    ///     UPDATE eventview._views
    ///     SET applied_snapshot = (SELECT s FROM snap),
    ///         applied_own_xid = (SELECT own FROM snap),
    ///         applied_own_seq = CASE WHEN (SELECT own FROM snap) IS NOT NULL THEN ... END,
    ///         skipped = skipped + (SELECT count(*) FROM bad_rows),
    ///         extremes_logged = extremes_logged + (SELECT count(*) FROM a<n>)
    ///     WHERE view_id = <id>
    ///     RETURNING extremes_logged
    /// )
    /// ```
    fn position_update(&self, mode: Mode, logged: &[usize]) -> String {
        let mut counters = String::new();
        if self.def.on_type_error == TypePolicy::Skip {
            counters.push_str(",\n        skipped = skipped + (SELECT count(*) FROM bad_rows)");
        }
        if mode == Mode::Full {
            counters.push_str(",\n        extremes_logged = 0");
        } else if !logged.is_empty() {
            let added: String = logged
                .iter()
                .map(|n| format!(" + (SELECT count(*) FROM a{n})"))
                .collect();
            counters.push_str(&format!(
                ",\n        extremes_logged = extremes_logged{added}"
            ));
        }
        // Our own transaction's changes are applied up to the last one we can see: after a full
        // scan, all of them; after a delta, the newest consumed (or what an earlier refresh in
        // this transaction already applied).
        let own_seq = match mode {
            Mode::Full => format!(
                "(SELECT max(seq) FROM {} WHERE xid = (SELECT own FROM snap))",
                self.consumed_log()
            ),
            _ => batch::OWN_SEQ_AFTER_DELTA.to_string(),
        };
        format!(
            "st AS (
    UPDATE eventview._views
    SET applied_snapshot = (SELECT s FROM snap),
        applied_own_xid = (SELECT own FROM snap),
        applied_own_seq = CASE WHEN (SELECT own FROM snap) IS NOT NULL THEN {own_seq} END{counters}
    WHERE view_id = {}
    RETURNING extremes_logged
)",
            self.view_id
        )
    }

    /// The row an apply returns: changes consumed (none counted by a full rebuild), groups
    /// written, groups that took a retraction, the first type error and the values in the
    /// min/max logs.
    ///
    /// ```sql
    /// SELECT <consumed> AS consumed,
    ///        (SELECT count(*) FROM up) AS groups_written, ...
    /// ```
    fn apply_result(&self, mode: Mode) -> String {
        let consumed = if mode == Mode::Full {
            "0::bigint"
        } else {
            batch::CONSUMED
        };
        let retracted = if self.kept_in_row().is_empty() {
            "(SELECT count(*) FROM up WHERE __dirty)"
        } else {
            "(SELECT count(*) FROM up WHERE __retracted)"
        };
        Self::result_row(
            consumed,
            "(SELECT bad || ' (event_id ' || event_id || ')' FROM bad_rows ORDER BY event_id LIMIT 1)",
            retracted,
        )
    }

    /// The row an apply returns, with its count of what it consumed, its first type error and
    /// its count of the groups that took a retraction (`retracted`; the other dirty groups only
    /// passed the values a row keeps).
    fn result_row(consumed: &str, first_error: &str, retracted: &str) -> String {
        format!(
            "SELECT {consumed} AS consumed,\n       (SELECT count(*) FROM up) AS groups_written,\n       (SELECT count(*) FROM up WHERE __dirty) AS dirty_groups,\n       {first_error} AS first_error,\n       (SELECT extremes_logged FROM st) AS extremes_logged,\n       {retracted} AS retracted_groups"
        )
    }

    /// Statements run after an apply that left groups with retractions (`__dirty`).
    pub fn fixup(&self) -> Vec<String> {
        let data = self.data();
        // Only a view that keeps values in its rows has any there to move: a realtime view, or
        // a view rollups read, keeps every value in the multisets (turning so moves them there).
        let mut out = if self.values_in_row == ValuesInRow::Kept {
            self.spill_values_in_row(true)
        } else {
            Vec::new()
        };
        // Emptied multiset entries can only be in groups that took a retraction: find them
        // through the dirty groups and the multiset's key index. (No partial index on n = 0:
        // it would make every update of n a non-HOT update.)
        let key_match = self.keys_equal("a", "t");
        for (n, _) in self.multiset_measures() {
            out.push(format!(
                "DELETE FROM {} a USING {data} t WHERE t.__dirty AND {} AND a.n = 0",
                names::view_values(self.view_id, n),
                key_match
            ));
        }
        out.push(format!("DELETE FROM {data} WHERE __dirty AND __count = 0"));
        let mut sets = Vec::new();
        for (n, m) in self.minmax_measures() {
            let values = names::view_values(self.view_id, n);
            let dir = if m.kind == AggKind::Min {
                "ASC"
            } else {
                "DESC"
            };
            sets.push(format!(
                "m{n}_val = (SELECT a.v FROM {values} a WHERE {key_match} ORDER BY a.v {dir} LIMIT 1)"
            ));
        }
        sets.extend(self.value_arrays_emptied());
        sets.push("__dirty = false".into());
        out.push(format!(
            "UPDATE {data} AS t SET {} WHERE t.__dirty",
            sets.join(", ")
        ));
        out
    }

    /// Deletes the buckets `[$2, $3)` from storage and multisets (windowed rebuild).
    pub fn clear_window(&self) -> Vec<String> {
        let mut out = vec![format!(
            "DELETE FROM {} WHERE bucket >= $2 AND bucket < $3",
            self.data()
        )];
        for (n, _) in self.multiset_measures() {
            out.push(format!(
                "DELETE FROM {} WHERE bucket >= $2 AND bucket < $3",
                names::view_values(self.view_id, n)
            ));
        }
        // The view's count of logged values drops by the rows deleted from its logs.
        for log in self.logs() {
            out.push(format!(
                "WITH gone AS (DELETE FROM {log} WHERE bucket >= $2 AND bucket < $3 RETURNING 1)
UPDATE eventview._views SET extremes_logged = greatest(extremes_logged - (SELECT count(*) FROM gone), 0)
WHERE view_id = {}",
                self.view_id
            ));
        }
        out
    }

    /// The name the view's quarantine entries carry (`_views.known_name`, kept up to date on
    /// renames), as the quarantine's row-level policies and `eventview.views.quarantined` find
    /// them.
    fn known_name(&self) -> String {
        format!(
            "coalesce((SELECT known_name FROM eventview._views WHERE view_id = {vid}), eventview._view_name({vid}))",
            vid = self.view_id
        )
    }

    /// Before a full rebuild: forget the view's quarantine entries and its `skipped` count,
    /// which the rebuild records again.
    pub fn forget_type_errors(&self) -> String {
        format!(
            "WITH gone AS (DELETE FROM eventview.quarantine WHERE view_name = {known})
UPDATE eventview._views SET skipped = 0 WHERE view_id = {vid}",
            known = self.known_name(),
            vid = self.view_id
        )
    }

    /// Before a windowed rebuild: forget the quarantine entries of events in the window ($1 bucket
    /// width, $2/$3 the window), which the rebuild records again.
    pub fn forget_type_errors_in_window(&self) -> String {
        format!(
            "DELETE FROM eventview.quarantine
WHERE view_name = {known}
  AND {b} >= $2
  AND {b} < $3",
            known = self.known_name(),
            b = bucket_expr(
                "$1::interval",
                "(event->>'occurred_at')::timestamptz",
                self.def.time_zone.as_deref()
            )
        )
    }

    /// Empties storage and multisets (full rebuild).
    pub fn clear_all(&self) -> Vec<String> {
        self.storage_tables()
            .iter()
            .map(|t| format!("DELETE FROM {t}"))
            .collect()
    }
}

/// A storage table of a view (data, multiset, log) goes to the view's owner, and its row type is
/// nobody else's to use: a column or function of that type, made by anyone, would stop the
/// table from being dropped with its view (everyone has USAGE on schema eventview).
pub fn storage_grants(table: &str, owner_ident: &str) -> [String; 2] {
    [
        format!("ALTER TABLE {table} OWNER TO {owner_ident}"),
        format!("REVOKE USAGE ON TYPE {table} FROM PUBLIC"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::{parse_definition, DefinitionInput};

    fn def(group_by: &str, measures: &str, filter: Option<&str>, bucketed: bool) -> ViewDefinition {
        parse_definition(&DefinitionInput {
            fields: &crate::definition::NoFields,
            group_by,
            measures,
            event_types: Some(vec![Some("add'to".into())]),
            bucketed,
            time_zone: None,
            unnest: None,
            filter,
            on_type_error: "quarantine",
        })
        .unwrap()
    }

    fn sql(d: &ViewDefinition) -> ViewSql<'_> {
        ViewSql {
            def: d,
            view_id: 3,
            source_id: 2,
            source_scan: "ONLY \"shop\".\"events\"".into(),
            log_extremes: true,
            feeds_rollups: false,
            bucket_width: None,
            rollup_source: None,
            data_table: None,
            values_in_row: ValuesInRow::Kept,
        }
    }

    #[test]
    fn a_generator_matches_the_key_of_one_with_the_same_inputs_only() {
        let d = def(r#"{"sku": "$.sku"}"#, r#"{"top": "max($.p)"}"#, None, true);
        let other = def(r#"{"sku": "$.sku"}"#, r#"{"top": "min($.p)"}"#, None, true);
        let key = sql(&d).key();
        let same = d.clone();
        assert!(sql(&same).matches(&key));
        assert!(!sql(&other).matches(&key));
        let changes: [fn(&mut ViewSql); 8] = [
            |s| s.view_id += 1,
            |s| s.feeds_rollups = !s.feeds_rollups,
            |s| s.source_id += 1,
            |s| s.source_scan.push(' '),
            |s| s.log_extremes = !s.log_extremes,
            |s| s.bucket_width = Some("'1 hour'".into()),
            |s| s.data_table = Some("\"s\".\"t\"".into()),
            |s| s.values_in_row = ValuesInRow::Columns,
        ];
        for change in changes {
            let mut changed = sql(&d);
            change(&mut changed);
            assert!(!changed.matches(&key));
            assert!(changed.matches(&changed.key()));
        }
        let mut rollup = sql(&d);
        rollup.rollup_source = Some(Box::new(sql(&d)));
        assert!(!rollup.matches(&key) && rollup.matches(&rollup.key()));
        let mut other_source = sql(&d);
        other_source.rollup_source = Some(Box::new(sql(&other)));
        assert!(!other_source.matches(&rollup.key()));
    }

    #[test]
    fn storage_has_flagged_keys_and_multisets_for_extremes() {
        let d = def(
            r#"{"sku": "$.sku"}"#,
            r#"{"n": "count(*)", "top": "max($.p)"}"#,
            None,
            true,
        );
        let ddl = sql(&d).create_storage().join(";\n");
        assert!(ddl.contains("g1 text NOT NULL"));
        assert!(ddl.contains("g1_null boolean NOT NULL"));
        assert!(ddl.contains(
            "CREATE UNIQUE INDEX _v3_data_key ON eventview._v3_data (__k, bucket, g1, g1_null)"
        ));
        assert!(ddl.contains("CREATE TABLE eventview._v3_m2"));
        assert!(ddl.contains("v numeric NOT NULL"));
        assert_eq!(ddl.matches(") WITH (fillfactor = 70)").count(), 2);
    }

    #[test]
    fn a_shards_view_keeps_its_partial_groups_without_the_read_index() {
        let d = def(r#"{"sku": "$.sku"}"#, r#"{"n": "count(*)"}"#, None, true);
        let own = sql(&d);
        assert!(own
            .create_storage()
            .iter()
            .any(|ddl| ddl.starts_with("CREATE INDEX _v3_data_read ON eventview._v3_data")));
        let shard = ViewSql {
            data_table: Some("eventview._v9_groups_102008".into()),
            values_in_row: ValuesInRow::No,
            ..sql(&d)
        };
        let ddl = shard.create_storage();
        assert!(shard.create_read_index().is_none());
        assert!(!ddl.iter().any(|ddl| ddl.contains("_data_read")), "{ddl:?}");
        assert!(ddl.contains(
            &"CREATE UNIQUE INDEX _v3_data_key ON eventview._v9_groups_102008 (__k, bucket, g1, g1_null)"
                .to_string()
        ));
    }

    #[test]
    fn a_percentile_is_read_from_its_multiset_and_kept_there_without_a_log() {
        let d = def(
            r#"{"sku": "$.sku"}"#,
            r#"{"top": "max($.p)", "p90": "percentile($.p, 0.9)"}"#,
            None,
            true,
        );
        let ddl = sql(&d).create_storage().join(";\n");
        assert!(ddl.contains("CREATE TABLE eventview._v3_m2"));
        assert!(!ddl.contains("_v3_m2_log"), "{ddl}");
        assert!(!ddl.contains("m2_val"));
        let stored = sql(&d).create_user_view("\"v\"", Reads::Stored);
        assert!(stored.contains("FROM eventview._v3_m2 ms WHERE ms.__k = eventview._v3_data.__k AND ms.bucket = eventview._v3_data.bucket"), "{stored}");
        assert!(stored.contains("WHERE o.cum::float8 >= greatest(ceil(0.9::float8 * o.total::float8), 1) ORDER BY o.v LIMIT 1) AS \"p90\""));
        // A refresh logs the max, and upserts the percentile's multiset.
        let apply = sql(&d).apply(Mode::Delta);
        assert!(apply.contains("INSERT INTO eventview._v3_m1_log"));
        assert!(apply.contains("INSERT INTO eventview._v3_m2 AS t"));
        let realtime = sql(&d).create_user_view("\"v\"", Reads::Realtime);
        assert!(sql(&d)
            .realtime_pending_groups()
            .contains("unnest(d0.m2_vs, d0.m2_signs)"));
        assert!(realtime.contains("m2_val AS \"p90\""));
        // A realtime read's two branches list the measures in one order, a percentile first.
        let d = def(
            r#"{"sku": "$.sku"}"#,
            r#"{"p": "percentile($.p, 0.5)", "top": "max($.p)"}"#,
            None,
            false,
        );
        let realtime = sql(&d).create_user_view("\"v\"", Reads::Realtime);
        assert!(
            realtime.contains("SELECT s.__k, s.g1, s.g1_null, s.__count, (SELECT o.v FROM"),
            "{realtime}"
        );
        assert!(
            realtime.contains("LIMIT 1) AS m1_val, s.m2_val\n    FROM eventview._v3_data s"),
            "{realtime}"
        );
        assert!(
            realtime.contains("m1_val numeric, m2_val numeric)"),
            "{realtime}"
        );
        assert!(
            realtime.contains("SELECT __k, g1, g1_null, __count, m1_val, m2_val\n    FROM t"),
            "{realtime}"
        );
    }

    #[test]
    fn an_approximate_percentile_keeps_a_sketch_per_group_and_reads_a_buckets_value() {
        let d = def(
            r#"{}"#,
            r#"{"p99": "approx_percentile($.ms, 0.99)"}"#,
            None,
            false,
        );
        let ddl = sql(&d).create_storage().join(";\n");
        assert!(ddl.contains("m1_sk bigint[]"), "{ddl}");
        assert!(!ddl.contains("_m1 ("), "no multiset: {ddl}");
        let apply = sql(&d).apply(Mode::Delta);
        assert!(apply.contains("ln(least(abs("), "{apply}");
        assert!(
            apply.contains("ELSE eventview._sketch_merge(t.m1_sk, EXCLUDED.m1_sk) END"),
            "{apply}"
        );
        let stored = sql(&d).create_user_view("\"v\"", Reads::Stored);
        assert!(
            stored.contains("_data.m1_sk, 0.99::float8) AS \"p99\""),
            "{stored}"
        );
        let pending = sql(&d).realtime_pending_groups();
        assert!(
            pending.contains("eventview._sketch_merge(s.m1_sk, d0.m1_sk)"),
            "{pending}"
        );
        // The relation reads the percentile of an untouched group from its sketch, and that of
        // a touched group as the function computed it, both as double precision.
        let realtime = sql(&d).create_user_view("\"v\"", Reads::Realtime);
        assert!(realtime.contains("m1_val double precision"), "{realtime}");
        assert!(
            realtime.contains("eventview._sketch_quantile(s.m1_sk, 0.99::float8) AS m1_val"),
            "{realtime}"
        );
    }

    #[test]
    fn unnest_reads_one_row_per_element_and_leaves_out_an_event_with_a_bad_element() {
        let d = parse_definition(&DefinitionInput {
            fields: &crate::definition::NoFields,
            group_by: r#"{"sku": "@.sku"}"#,
            measures: r#"{"units": "sum(@.qty)", "n": "count(*)"}"#,
            event_types: None,
            bucketed: false,
            time_zone: None,
            unnest: Some(r#"$["it's"]"#),
            filter: Some(r#"{"$.channel": "web"}"#),
            on_type_error: "quarantine",
        })
        .unwrap();
        let apply = sql(&d).apply(Mode::Delta);
        assert!(
            apply.contains("CROSS JOIN LATERAL (SELECT (r.payload -> 'it''s') AS arr) ua"),
            "{apply}"
        );
        assert!(apply.contains("FROM jsonb_array_elements(CASE WHEN jsonb_typeof(ua.arr) = 'array' THEN ua.arr END)"), "{apply}");
        assert!(apply.contains("(u.__elem -> 'sku') AS j"), "{apply}");
        assert!(apply
            .contains(r#"'unnest $["it''s"] is a JSON ' || __unnest_kind || ', not an array'"#));
        assert!(apply.contains("bad_rows AS (SELECT DISTINCT ON (event_id) event_id, bad FROM c"));
        assert!(apply.contains("AND NOT EXISTS (SELECT 1 FROM c b WHERE b.bad IS NOT NULL AND b.event_id = c.event_id AND b.sign = c.sign)"));
    }

    #[test]
    fn buckets_in_a_time_zone_follow_its_wall_clock_and_quote_its_name() {
        let mut d = def(r#"{"sku": "$.sku"}"#, r#"{"n": "count(*)"}"#, None, true);
        d.time_zone = Some("Europe/Berlin' OR '1".into());
        let zone = "'Europe/Berlin'' OR ''1'";
        let local = format!(
            "pg_catalog.timezone({zone}, pg_catalog.date_bin($1::interval, pg_catalog.timezone({zone}, occurred_at), '2000-01-01 00:00:00'::timestamp)) AS bucket"
        );
        let apply = sql(&d).apply(Mode::Window);
        assert!(apply.contains(&local), "{apply}");
        // The window's range of event times is widened by two days either way.
        assert!(apply.contains(
            "WHERE e.occurred_at >= $2 - interval '2 days' AND e.occurred_at < $3 + $1::interval + interval '2 days'"
        ));
        assert!(sql(&d).forget_type_errors_in_window().contains(&format!(
            "pg_catalog.timezone({zone}, pg_catalog.date_bin($1::interval, pg_catalog.timezone({zone}, (event->>'occurred_at')::timestamptz)"
        )));
        // In UTC: aligned to 2000-01-01 UTC, the window's range as it is.
        d.time_zone = None;
        let apply = sql(&d).apply(Mode::Window);
        assert!(apply.contains(
            "pg_catalog.date_bin($1::interval, occurred_at, '2000-01-01 00:00:00+00'::timestamptz) AS bucket"
        ));
        assert!(apply.contains("WHERE e.occurred_at >= $2 AND e.occurred_at < $3 + $1::interval\n"));
    }

    #[test]
    fn a_realtime_read_names_the_event_table_before_its_changelog() {
        let d = def(r#"{"sku": "$.sku"}"#, r#"{"n": "count(*)"}"#, None, false);
        let pending = sql(&d).realtime_pending_groups();
        let table = pending
            .find("NOT EXISTS (SELECT FROM ONLY \"shop\".\"events\" WHERE false)")
            .expect("snap names the event table");
        let snap = pending.find("snap AS MATERIALIZED").unwrap();
        let changelog = pending.find("eventview._changes_2").unwrap();
        assert!(snap < table && table < changelog);
        assert_eq!(pending.matches("snap AS MATERIALIZED").count(), 1);
        // Only the realtime read: an apply is checked before it runs (`privileges`), and so is
        // the check before the read, which names the extension's tables only.
        assert!(!sql(&d).apply(Mode::Delta).contains("WHERE false"));
        let check = sql(&d).realtime_pending_check();
        assert!(!check.contains("shop"), "{check}");
        assert!(check.contains("FROM eventview._changes_2 c"), "{check}");
        // The relation reads the function, and the storage by its keys.
        let realtime = sql(&d).create_user_view("\"v\"", Reads::Realtime);
        assert!(realtime.contains("eventview._realtime_pending(3) AS t(__k boolean, g1 text, g1_null boolean, __count bigint)"), "{realtime}");
        assert!(!realtime.contains("_changes_"), "{realtime}");
    }

    #[test]
    fn user_view_quotes_names_and_derives_avg() {
        let d = def(
            r#"{"Sku \"x\"": "$.sku"}"#,
            r#"{"a": "avg($.p)", "s": "sum(event_version)"}"#,
            None,
            false,
        );
        let v = sql(&d).create_user_view("\"public\".\"v\"", Reads::Stored);
        assert!(v.contains("AS \"Sku \"\"x\"\"\""));
        assert!(v.contains("CASE WHEN m1_n > 0 THEN trim_scale(m1_sum) / m1_n END AS \"a\""));
    }

    #[test]
    fn apply_reads_one_snapshot_and_quotes_user_values() {
        let d = def(
            r#"{"sku": "$.sku"}"#,
            r#"{"q": "sum($.qty)"}"#,
            Some(r#"{"$.c": ["D'E", 1]}"#),
            true,
        );
        let a = sql(&d).apply(Mode::Delta);
        assert!(a.contains("pg_visible_in_snapshot(c.xid, (SELECT s FROM snap))"));
        assert!(a.contains("ARRAY['add''to']::text[]"));
        assert!(a.contains("IN ('\"D''E\"'::jsonb, '1'::jsonb)"));
        assert!(
            a.contains("measure \"\"q\"\": sum($.qty) needs a JSON number, found ")
                || a.contains("measure \"q\": sum($.qty) needs a JSON number, found ")
        );
        assert!(a.contains("INSERT INTO eventview.quarantine"));
        // Deterministic: generating twice gives the same text.
        assert_eq!(a, sql(&d).apply(Mode::Delta));
    }

    #[test]
    fn each_path_is_evaluated_once() {
        let d = def(
            r#"{"a": "$.x", "b": "$.x"}"#,
            r#"{"s": "sum($.x)"}"#,
            None,
            false,
        );
        let a = sql(&d).apply(Mode::Full);
        assert_eq!(a.matches("(r.payload -> 'x') AS j1").count(), 1);
        assert!(!a.contains(" AS j2"));
    }

    #[test]
    fn count_distinct_keeps_a_multiset_and_counts_zero_crossings() {
        let d = def(
            r#"{"sku": "$.sku"}"#,
            r#"{"users": "count_distinct($.user)"}"#,
            None,
            false,
        );
        let v = sql(&d);
        assert!(v
            .create_storage()
            .join(";")
            .contains("prev_n bigint NOT NULL DEFAULT 0"));
        assert!(v
            .apply(Mode::Delta)
            .contains("LEFT JOIN dd1 USING (__k, g1, g1_null)"));
    }

    #[test]
    fn stored_views_log_extremes_and_realtime_views_do_not() {
        let d = def(
            r#"{"sku": "$.sku"}"#,
            r#"{"hi": "max($.p)", "users": "count_distinct($.u)"}"#,
            None,
            true,
        );
        let stored = sql(&d);
        let ddl = stored.create_storage().join(";\n");
        assert!(ddl.contains(
            "CREATE TABLE eventview._v3_m1_log (LIKE eventview._v3_m1 INCLUDING DEFAULTS)"
        ));
        // count_distinct needs its multiset at every refresh (zero crossings): no log.
        assert!(!ddl.contains("_v3_m2_log"));
        assert_eq!(stored.storage_tables().len(), 4);
        let delta = stored.apply(Mode::Delta);
        assert!(delta.contains("INSERT INTO eventview._v3_m1_log (__k, bucket, g1, g1_null, v, n)"));
        assert!(delta.contains("extremes_logged = extremes_logged + (SELECT count(*) FROM a1)"));
        assert!(!delta.contains("INSERT INTO eventview._v3_m1 AS t"));
        assert!(delta.contains("INSERT INTO eventview._v3_m2 AS t"));
        // Rebuilds write the multisets; a full one empties the logs.
        let full = stored.apply(Mode::Full);
        assert!(full.contains("INSERT INTO eventview._v3_m1 AS t") && !full.contains("_m1_log"));
        assert!(full.contains("extremes_logged = 0"));
        assert!(!stored.apply(Mode::Window).contains("_m1_log"));
        assert!(stored
            .clear_all()
            .contains(&"DELETE FROM eventview._v3_m1_log".to_string()));
        assert!(stored.clear_window().iter().any(|s| s
            .starts_with("WITH gone AS (DELETE FROM eventview._v3_m1_log WHERE bucket >= $2")
            && s.contains(
                "SET extremes_logged = greatest(extremes_logged - (SELECT count(*) FROM gone), 0)"
            )));
        // Realtime reads take the log into account (empty but to a reader with an older snapshot).
        let realtime_read = ViewSql {
            log_extremes: false,
            feeds_rollups: false,
            bucket_width: None,
            rollup_source: None,
            values_in_row: ValuesInRow::Columns,
            ..sql(&d)
        }
        .realtime_pending_groups();
        assert!(realtime_read.contains("lg1 AS MATERIALIZED (SELECT * FROM eventview._v3_m1_log)"));
        assert!(realtime_read.contains("SELECT l.v, l.n FROM lg1 l WHERE l.__k = d0.__k"));
        let merge = stored.merge_logs().join(";\n");
        assert!(merge.contains("WITH moved AS (DELETE FROM eventview._v3_m1_log RETURNING __k, bucket, g1, g1_null, v, n)"));
        assert!(merge.contains("HAVING sum(n) <> 0\nON CONFLICT (__k, bucket, g1, g1_null, v) DO UPDATE SET n = t.n + EXCLUDED.n"));
        assert!(
            merge.ends_with("UPDATE eventview._views SET extremes_logged = 0 WHERE view_id = 3")
        );
        let realtime = ViewSql {
            log_extremes: false,
            feeds_rollups: false,
            bucket_width: None,
            rollup_source: None,
            values_in_row: ValuesInRow::Columns,
            ..sql(&d)
        };
        assert!(!realtime.logs_extremes(Mode::Delta));
        assert!(!realtime.apply(Mode::Delta).contains("_m1_log"));
    }

    #[test]
    fn fixup_recomputes_extremes_from_the_multiset() {
        let d = def(r#"{"sku": "$.sku"}"#, r#"{"lo": "min($.p)"}"#, None, false);
        let f = sql(&d).fixup().join(";\n");
        assert!(f.contains("DELETE FROM eventview._v3_m1 a USING eventview._v3_data t WHERE t.__dirty AND a.__k = t.__k AND a.g1 = t.g1 AND a.g1_null = t.g1_null AND a.n = 0"));
        assert!(f.contains("ORDER BY a.v ASC LIMIT 1"));
        assert!(f.contains("a.g1_null = t.g1_null"));
    }

    #[test]
    fn a_small_groups_extremes_stay_in_its_row_until_it_turns_dirty() {
        let d = def(
            r#"{"sku": "$.sku"}"#,
            r#"{"lo": "min($.p)", "name": "max(producer)", "hi": "max(occurred_at)"}"#,
            None,
            true,
        );
        let stored = sql(&d);
        // Text values stay out of the row (their arrays could pass a page).
        assert_eq!(
            stored.add_value_array_columns().unwrap(),
            "ALTER TABLE eventview._v3_data ADD COLUMN IF NOT EXISTS m1_vals numeric[], ADD COLUMN IF NOT EXISTS m3_vals timestamptz[]"
        );
        assert!(stored.create_storage()[1].starts_with("ALTER TABLE eventview._v3_data ADD COLUMN"));
        let apply = stored.apply(Mode::Delta);
        assert!(apply.contains(
            "coalesce(array_agg(m1) FILTER (WHERE sign > 0 AND m1 IS NOT NULL), '{}') AS m1_vals"
        ));
        // `d`'s __dirty is a retraction, which proposes NULL arrays; the insert's __dirty also
        // counts additions past the row's limit.
        assert!(apply.contains("bool_or(sign < 0) AS __dirty\n"));
        assert!(apply.contains("CASE WHEN __dirty THEN NULL ELSE m1_vals END, CASE WHEN __dirty THEN NULL ELSE m3_vals END, __dirty OR cardinality(m1_vals) > 8 OR cardinality(m3_vals) > 8 FROM d"));
        assert!(apply.contains("m1_vals = CASE WHEN t.m1_vals IS NULL OR EXCLUDED.m1_vals IS NULL THEN t.m1_vals ELSE t.m1_vals || EXCLUDED.m1_vals END"));
        assert!(apply.contains("m3_vals = CASE WHEN t.m3_vals IS NULL OR EXCLUDED.m1_vals IS NULL THEN t.m3_vals ELSE t.m3_vals || EXCLUDED.m3_vals END"));
        // Every extreme moves outwards unless the group took a retraction, text ones too.
        assert!(apply.contains("m2_val = CASE WHEN EXCLUDED.m1_vals IS NULL THEN t.m2_val ELSE GREATEST(t.m2_val, EXCLUDED.m2_val) END"));
        assert!(apply.contains("__dirty = EXCLUDED.m1_vals IS NULL OR (t.m1_vals IS NOT NULL AND cardinality(t.m1_vals) + cardinality(EXCLUDED.m1_vals) > 8) OR (t.m3_vals IS NOT NULL"));
        assert!(apply.contains("t.__dirty AND coalesce(cardinality(t.m1_vals), 0) <= 8 AND coalesce(cardinality(t.m3_vals), 0) <= 8 AS __retracted, t.m1_vals IS NULL AS m1_out, t.m3_vals IS NULL AS m3_out"));
        // The log takes the values of groups outside the row or that took a retraction; the
        // text measure's, all; the writes that read `up` follow it.
        assert!(apply.contains("AND (up.__retracted OR up.m1_out))"));
        assert!(!apply.contains("m2_out"));
        assert!(apply.find("up AS (").unwrap() < apply.find("a1 AS (").unwrap());
        assert!(apply.find("a2 AS (").unwrap() < apply.find("up AS (").unwrap());
        assert!(apply.ends_with("(SELECT count(*) FROM up WHERE __retracted) AS retracted_groups"));
        // Groups that only passed the row's limit: their values go where the apply's went.
        let past = stored.spill_past_the_row(true);
        assert!(past[0].starts_with(
            "WITH w1 AS (INSERT INTO eventview._v3_m1_log (__k, bucket, g1, g1_null, v, n)"
        ));
        assert!(past[0].ends_with("UPDATE eventview._views SET extremes_logged = extremes_logged + (SELECT count(*) FROM w1) + (SELECT count(*) FROM w3) WHERE view_id = 3"));
        assert_eq!(past[1], "UPDATE eventview._v3_data SET m1_vals = NULL, m3_vals = NULL, __dirty = false WHERE __dirty");
        let past = stored.spill_past_the_row(false);
        assert!(past[0].starts_with("INSERT INTO eventview._v3_m1 AS a"));
        assert_eq!(past.len(), 3);
        let fixup = stored.fixup();
        assert!(fixup[0]
            .starts_with("INSERT INTO eventview._v3_m1 AS a (__k, bucket, g1, g1_null, v, n)"));
        assert!(fixup[0]
            .contains("CROSS JOIN LATERAL pg_catalog.unnest(t.m1_vals) AS u(v) WHERE t.__dirty"));
        assert!(fixup
            .last()
            .unwrap()
            .contains("m1_vals = NULL, m3_vals = NULL, __dirty = false"));
        let spill = stored.spill_values_in_row(false);
        assert_eq!(spill.len(), 3);
        assert_eq!(spill[2], "UPDATE eventview._v3_data SET m1_vals = NULL, m3_vals = NULL WHERE m1_vals IS NOT NULL OR m3_vals IS NOT NULL");
        // A realtime view has the columns (NULL) and its applies leave them alone.
        let realtime = ViewSql {
            values_in_row: ValuesInRow::Columns,
            ..sql(&d)
        };
        assert!(realtime.add_value_array_columns().is_some());
        assert!(!realtime.apply(Mode::Delta).contains("_vals"));
        assert!(!realtime.fixup().iter().any(|s| s.contains("unnest(")));
        assert!(realtime.fixup().last().unwrap().contains("m1_vals = NULL"));
        // A shard's view has none.
        let shard = ViewSql {
            values_in_row: ValuesInRow::No,
            ..sql(&d)
        };
        assert!(shard.add_value_array_columns().is_none());
        assert!(shard.spill_values_in_row(false).is_empty());
        assert!(!shard.fixup().join(";").contains("_vals"));
    }

    #[test]
    fn each_reference_has_its_json_type_taken_once() {
        let d = def(
            r#"{"sku": "$.sku"}"#,
            r#"{"q": "sum($.qty)", "hi": "max($.qty)", "n": "count($.sku)"}"#,
            None,
            true,
        );
        for statement in [
            sql(&d).apply(Mode::Delta),
            sql(&d).realtime_pending_groups(),
        ] {
            assert!(statement.contains("ft AS (\n    SELECT f.*, jsonb_typeof(j1) AS t1, jsonb_typeof(j2) AS t2\n    FROM f\n    OFFSET 0\n)"));
            assert_eq!(
                statement.matches("jsonb_typeof(j").count(),
                2,
                "{statement}"
            );
            assert!(statement.contains("CASE WHEN t2 = 'number' THEN j2::numeric END"));
            assert!(statement.contains("FROM ft\n"));
        }
        // Envelope columns only: no JSON types to take.
        let plain = def(r#"{"t": "event_type"}"#, r#"{"n": "count(*)"}"#, None, true);
        let statement = sql(&plain).apply(Mode::Delta);
        assert!(
            !statement.contains("ft AS") && statement.contains("    FROM f\n    OFFSET 0\n)"),
            "{statement}"
        );
        assert!(statement.contains("good AS NOT MATERIALIZED (SELECT * FROM c WHERE bad IS NULL)"));
        assert!(statement.contains("c AS MATERIALIZED (\n    SELECT c0.*, coalesce(c0.bad0, "));
    }
}
