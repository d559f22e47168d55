//! SQL generation for one incremental view: its storage, the relation users read, and the
//! statements of a refresh. Pure text generation, deterministic, so it can be snapshot-tested.
//!
//! Storage (`eventview._v<id>_data`), one row per group:
//!   `__k` (constant true, so a view without keys still has a key), `bucket`, and per group
//!   column `g<i>` with `g<i>_null`: NULL keys are stored as a placeholder plus a flag, so keys
//!   are NOT NULL, the unique index is plain and ON CONFLICT and joins on keys are hashable;
//!   `__count` (events counted), then per measure `m<i>_n` (non-NULL inputs), `m<i>_sum`,
//!   `m<i>_val` (min/max); `__dirty` marks groups that took a retraction in this refresh.
//! Value multisets (`eventview._v<id>_m<i>`, one per min/max measure): (keys, v, n), how many
//!   counted events of the group have value v. A retracted extreme is replaced by an index
//!   lookup in the group's multiset, never by a scan of the event table.
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
//!
//! Algorithm (apply, one statement so that every part reads the same snapshot):
//!   snap     the statement's snapshot (our own transaction excluded) and our own xid;
//!   chg      changelog records visible in `snap` or written by our own transaction, and not
//!            already applied (visible in the applied snapshot, or our own up to applied_own_seq);
//!   ids      one row per changed event row, with the record order `seq`;
//!   rows     for each changed event id: its state when last applied (the old row of its
//!            earliest record in the batch, unless that record is an insert) with sign -1,
//!            and its state now (the row in the event table, if any) with sign +1;
//!   f, c     field values, filters, type checks (`bad` holds the reason of a type error);
//!   d        the signed delta per group; `up` adds it into storage; `a<i>` into multisets
//!            (min/max of a stored view: appends to its value log);
//!   q, st    quarantine and the new applied snapshot and counters.
//! Then, only when a group took a retraction, the fix-up statements delete emptied groups and
//! multiset entries and recompute min/max of those groups from their multisets.

use super::definition::{AggKind, FieldRef, FieldVariant, Measure, TypePolicy, ViewDefinition};
use super::values::{value_sql, Use};
use super::{batch, jsonpath, names, quote};

/// Storage and multisets are updated in place by every refresh (a counter or a count per
/// value changes, no key column does): room left on each page lets those updates stay on the
/// page (HOT), with no new index entry per updated row. (Not for groups that take a retraction:
/// `__dirty` is in the predicate of the storage's partial index, so setting and clearing it are
/// not HOT.) Measured: about 8% off the apply of 10k
/// inserted events on 1M (every update HOT instead of about half).
pub const STORAGE_FILLFACTOR: u32 = 70;

/// Most bytes the variable-length parts of a group key (and of a multiset value with its key)
/// may take: a btree entry takes at most 2704 bytes (8 kB pages), and the rest of an entry
/// (flags, bucket, headers, alignment) fits in what this leaves. See `oversize_check`.
pub const MAX_KEY_BYTES: u32 = 2000;

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
    /// Quoted, schema-qualified name of the event table.
    pub source_table: String,
    /// A refresh appends min/max values to the value logs (a stored view, with
    /// `eventview.extreme_log_limit` above 0); otherwise they go straight into the multisets
    /// (realtime reads use the multisets).
    pub log_extremes: bool,
}

/// The bucket of timestamp expression `ts` for bucket width `width` (SQL of an interval).
fn bucket_expr(width: &str, ts: &str) -> String {
    format!("pg_catalog.date_bin({width}, {ts}, '2000-01-01 00:00:00+00'::timestamptz)")
}

/// The bucket width in statements: their parameter $1.
const WIDTH_PARAM: &str = "$1::interval";

/// How the user relation reads the view.
pub enum Reads<'b> {
    /// The stored groups, as of the last refresh.
    Stored,
    /// The stored groups with the pending changes folded in; the view's bucket width as the
    /// text of an interval.
    Realtime { bucket_width: Option<&'b str> },
}

struct Keys {
    /// Storage key columns, in order, without `__k`.
    columns: Vec<String>,
}

impl<'a> ViewSql<'a> {
    fn data(&self) -> String {
        names::view_data(self.view_id)
    }

    fn keys(&self) -> Keys {
        let mut columns = Vec::new();
        if self.def.bucketed {
            columns.push("bucket".to_string());
        }
        for i in 1..=self.def.group_by.len() {
            columns.push(format!("g{i}"));
            columns.push(format!("g{i}_null"));
        }
        Keys { columns }
    }

    fn key_list(&self) -> String {
        let mut all = vec!["__k".to_string()];
        all.extend(self.keys().columns);
        all.join(", ")
    }

    fn minmax_measures(&self) -> impl Iterator<Item = (usize, &Measure)> {
        self.multiset_measures().filter(|(_, m)| matches!(m.kind, AggKind::Min | AggKind::Max))
    }

    /// Whether an apply of `mode` appends min/max values to the logs rather than upserting the
    /// multisets: refreshes (deltas) of stored views. A rebuild writes the multisets directly.
    pub fn logs_extremes(&self, mode: Mode) -> bool {
        mode == Mode::Delta && self.log_extremes && self.minmax_measures().next().is_some()
    }

    /// Measures kept as a per-group value multiset: min, max, count_distinct.
    fn multiset_measures(&self) -> impl Iterator<Item = (usize, &Measure)> {
        self.def
            .measures
            .iter()
            .enumerate()
            .map(|(i, m)| (i + 1, m))
            .filter(|(_, m)| matches!(m.kind, AggKind::Min | AggKind::Max | AggKind::CountDistinct))
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

    /// DDL of the storage table and value multisets.
    pub fn create_storage(&self) -> Vec<String> {
        let data = self.data();
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
                AggKind::Min | AggKind::Max => cols.push(format!("m{n}_val {}", m.value_type().name())),
                AggKind::CountDistinct => cols.push(format!("m{n}_val bigint NOT NULL")),
            }
        }
        cols.push("__dirty boolean NOT NULL DEFAULT false".into());
        let vid = self.view_id;
        let mut out = vec![
            format!("CREATE TABLE {data} (\n    {}\n) WITH (fillfactor = {STORAGE_FILLFACTOR})", cols.join(",\n    ")),
            format!("CREATE UNIQUE INDEX _v{vid}_data_key ON {data} ({})", self.key_list()),
            format!("CREATE INDEX _v{vid}_data_dirty ON {data} (__k) WHERE __dirty"),
        ];
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
            if m.kind != AggKind::CountDistinct {
                out.push(Self::create_log(&values, &names::view_values_log(vid, n)));
            }
        }
        out
    }

    /// DDL of a value log: the multiset's columns, no index (appends only; a merge reads it
    /// whole). Shared with the upgrade script, which creates the logs of existing views.
    fn create_log(values: &str, log: &str) -> String {
        format!("CREATE TABLE {log} (LIKE {values} INCLUDING DEFAULTS)")
    }

    /// The value logs, qualified.
    fn logs(&self) -> impl Iterator<Item = String> + '_ {
        self.minmax_measures().map(|(n, _)| names::view_values_log(self.view_id, n))
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
        out.extend(self.multiset_measures().map(|(n, _)| names::view_values(self.view_id, n)));
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
        out.push(format!("UPDATE eventview._views SET extremes_logged = 0 WHERE view_id = {}", self.view_id));
        out
    }

    /// The relation users SELECT from. `user_view` is the quoted qualified name. A realtime
    /// view reads the stored groups merged with the pending changes (`realtime_groups`).
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

    fn user_view_sql(&self, user_view: &str, reads: Reads, create: &str) -> String {
        let mut cols = Vec::new();
        if self.def.bucketed {
            cols.push("bucket".to_string());
        }
        for (i, g) in self.def.group_by.iter().enumerate() {
            let n = i + 1;
            cols.push(format!("CASE WHEN g{n}_null THEN NULL ELSE g{n} END AS {}", quote::ident(&g.name)));
        }
        for (i, m) in self.def.measures.iter().enumerate() {
            let n = i + 1;
            let expr = match m.kind {
                AggKind::CountStar => "__count".to_string(),
                AggKind::Count => format!("m{n}_n"),
                AggKind::Sum => format!("CASE WHEN m{n}_n > 0 THEN m{n}_sum END"),
                // trim_scale: the stored sum keeps the largest scale of any value ever added,
                // even retracted ones; numeric division takes its precision from its inputs.
                AggKind::Avg => format!("CASE WHEN m{n}_n > 0 THEN trim_scale(m{n}_sum) / m{n}_n END"),
                AggKind::Min | AggKind::Max | AggKind::CountDistinct => format!("m{n}_val"),
            };
            cols.push(format!("{expr} AS {}", quote::ident(&m.name)));
        }
        if cols.is_empty() {
            // A view with neither keys nor measures still shows whether any event counts.
            cols.push("__count AS events".into());
        }
        if let Reads::Realtime { bucket_width } = reads {
            format!(
                "{create} {user_view} AS\n{}\nSELECT {}\nFROM merged\nWHERE __count > 0",
                self.realtime_groups(bucket_width),
                cols.join(",\n       ")
            )
        } else {
            format!("{create} {user_view} AS\nSELECT {}\nFROM {}", cols.join(",\n       "), self.data())
        }
    }

    /// Realtime read: WITH ... `merged`, the stored groups with the changes not yet applied
    /// folded in, in the storage's columns. It computes what the next refresh would store:
    /// the same batch (snapshot batching over the reader's snapshot, read only), the same
    /// values and type checks (events with a type error are left out, as a refresh leaves
    /// them out of the aggregate), and for min/max of a group that lost values and for
    /// count_distinct, the group's multiset plus the pending values. Its cost grows with the
    /// pending changes, as a refresh's does; with none pending it is a read of the storage.
    fn realtime_groups(&self, bucket_width: Option<&str>) -> String {
        let def = self.def;
        let width = match bucket_width {
            Some(w) => quote::typed_literal(w, "interval"),
            None => "NULL::interval".to_string(),
        };
        let mut ctes = self.delta_input(Mode::Delta, &width, false);
        let (key_exprs, mut d_cols) = self.group_delta_columns();
        // Multiset measures carry the group's pending values along (value, sign), so that the
        // merge below works per group with index lookups and never joins two large sets on a
        // row estimate the planner cannot know.
        for (n, _) in self.multiset_measures() {
            d_cols.push(format!(
                "array_agg(m{n}) FILTER (WHERE m{n} IS NOT NULL) AS m{n}_vs, array_agg(sign) FILTER (WHERE m{n} IS NOT NULL) AS m{n}_signs"
            ));
        }
        let positions = (1..=key_exprs.len()).map(|p| p.to_string()).collect::<Vec<_>>().join(", ");
        ctes.push(format!(
            "d0 AS (\n    SELECT {}\n    FROM good\n    GROUP BY {positions}\n)",
            d_cols.join(",\n           ")
        ));
        let mut keys = vec!["__k".to_string()];
        keys.extend(self.keys().columns);
        let key_list = keys.join(", ");
        let group_of = |alias: &str| keys.iter().map(|k| format!("{alias}.{k} = d0.{k}")).collect::<Vec<_>>().join(" AND ");
        // Two branches: stored groups the pending changes do not touch, as they are (with
        // nothing pending that is the whole read, at the cost of an anti-join with an empty
        // set); and the groups of the pending changes, merged with what is stored.
        let mut stored_cols = keys.clone();
        stored_cols.push("__count".into());
        // A pending group's keys as stored, as a refresh keeps them (its upsert never rewrites
        // keys): equal keys may be spelled differently (numeric 1 and 1.0).
        let mut merged: Vec<String> = keys.iter().map(|k| format!("coalesce(s.{k}, d0.{k}) AS {k}")).collect();
        merged.push("coalesce(s.__count, 0) + d0.__count AS __count".into());
        for (i, m) in def.measures.iter().enumerate() {
            let n = i + 1;
            match m.kind {
                AggKind::CountStar => {}
                AggKind::Count => {
                    stored_cols.push(format!("m{n}_n"));
                    merged.push(format!("coalesce(s.m{n}_n, 0) + d0.m{n}_n AS m{n}_n"));
                }
                AggKind::Sum | AggKind::Avg => {
                    stored_cols.push(format!("m{n}_n"));
                    stored_cols.push(format!("m{n}_sum"));
                    merged.push(format!("coalesce(s.m{n}_n, 0) + d0.m{n}_n AS m{n}_n"));
                    merged.push(format!("coalesce(s.m{n}_sum, 0) + d0.m{n}_sum AS m{n}_sum"));
                }
                AggKind::Min | AggKind::Max => {
                    // A group that lost values: its extreme over the multiset, its value log and
                    // the pending (value, sign) pairs; otherwise the extreme can only have moved
                    // outwards. (A realtime view's log is empty, except to a reader whose snapshot
                    // predates the merge that made the view realtime: read once per read, and
                    // only if some group lost values.)
                    let values = names::view_values(self.view_id, n);
                    ctes.push(format!(
                        "lg{n} AS MATERIALIZED (SELECT * FROM {})",
                        names::view_values_log(self.view_id, n)
                    ));
                    let (agg, pick) = if m.kind == AggKind::Min { ("min", "LEAST") } else { ("max", "GREATEST") };
                    merged.push(format!(
                        "CASE WHEN d0.__dirty THEN (
               SELECT {agg}(w.v) FROM (
                   SELECT u.v FROM (SELECT ms.v, ms.n FROM {values} ms WHERE {}
                                    UNION ALL
                                    SELECT l.v, l.n FROM lg{n} l WHERE {}
                                    UNION ALL
                                    SELECT p.v, p.s FROM unnest(d0.m{n}_vs, d0.m{n}_signs) AS p(v, s)) u
                   GROUP BY u.v HAVING sum(u.n) > 0) w)
           ELSE {pick}(s.m{n}_val, d0.m{n}_val) END AS m{n}_val",
                        group_of("ms"),
                        group_of("l")
                    ));
                    stored_cols.push(format!("m{n}_val"));
                }
                AggKind::CountDistinct => {
                    // The stored count plus the values whose count crosses zero.
                    let values = names::view_values(self.view_id, n);
                    merged.push(format!(
                        "coalesce(s.m{n}_val, 0) + (
               SELECT coalesce(sum(CASE WHEN o.n <= 0 AND o.n + p.dn > 0 THEN 1
                                        WHEN o.n > 0 AND o.n + p.dn <= 0 THEN -1 ELSE 0 END), 0)::bigint
               FROM (SELECT x.v, sum(x.s) AS dn FROM unnest(d0.m{n}_vs, d0.m{n}_signs) AS x(v, s) GROUP BY x.v) p
               CROSS JOIN LATERAL (SELECT coalesce((SELECT ms.n FROM {values} ms WHERE {} AND ms.v = p.v), 0) AS n) o)
           AS m{n}_val",
                        group_of("ms")
                    ));
                    stored_cols.push(format!("m{n}_val"));
                }
            }
        }
        let same_keys: Vec<String> = keys.iter().map(|k| format!("d0.{k} = s.{k}")).collect();
        ctes.push(format!(
            "merged AS (\n    SELECT {}\n    FROM {data} s\n    WHERE NOT EXISTS (SELECT 1 FROM d0 WHERE {})\n    UNION ALL\n    SELECT {}\n    FROM d0 LEFT JOIN {data} s USING ({key_list})\n)",
            stored_cols.join(", "),
            same_keys.join(" AND "),
            merged.join(",\n           "),
            data = self.data()
        ));
        format!("WITH {}", ctes.join(",\n"))
    }

    /// Distinct JSONPath and logical-field references read by the view, in first-use order;
    /// the f stage evaluates the i-th once per event into jsonb column `j<i>`.
    fn refs(&self) -> Vec<&FieldRef> {
        let mut out: Vec<&FieldRef> = Vec::new();
        for r in self.def.references() {
            if !matches!(r, FieldRef::Envelope(_)) && !out.iter().any(|o| o.display() == r.display()) {
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
                let i = refs.iter().position(|p| p.display() == field.display()).expect("reference collected");
                format!("j{}", i + 1)
            }
        }
    }

    /// The jsonb a reference selects in `r.payload`. A logical field picks its most specific
    /// declaration for the event's type and version (CASE in resolution order).
    fn raw_sql(field: &FieldRef) -> String {
        match field {
            FieldRef::Path { plan, .. } => plan.to_sql("r.payload"),
            FieldRef::Logical(f) => {
                let whens: Vec<String> = f
                    .variants
                    .iter()
                    .map(|v| format!("WHEN {} THEN {}", Self::variant_applies(v, "r."), v.plan.to_sql("r.payload")))
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
        if conds.is_empty() { "true".to_string() } else { conds.join(" AND ") }
    }

    /// For a reference that may be evaluated by a rich JSONPath: the condition (in stage c)
    /// under which its NULL value means "payload too deep to evaluate", not "missing", and the
    /// reason recorded then. Such an event is a type error: never a silent NULL.
    fn too_deep_check(field: &FieldRef, raw: &str) -> Option<(String, String)> {
        let (rich, what) = match field {
            FieldRef::Path { plan, text } if plan.is_rich() => ("true".to_string(), format!("JSONPath {text}")),
            FieldRef::Logical(f) if f.variants.iter().any(|v| v.plan.is_rich()) => {
                let whens: Vec<String> =
                    f.variants.iter().map(|v| format!("WHEN {} THEN {}", Self::variant_applies(v, ""), v.plan.is_rich())).collect();
                (format!("CASE {} END", whens.join(" ")), format!("field \"{}\"", f.name))
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
    pub fn pending_check(&self) -> String {
        batch::pending_check(
            self.source_id,
            &self.applied_state(),
            &format!("(SELECT extremes_logged FROM eventview._views WHERE view_id = {}) AS extremes_logged", self.view_id),
        )
    }

    /// The signed rows of the batch; `by_runs`: fetch touched rows by id ranges (see `batch`).
    fn rows_delta(&self, by_runs: bool) -> String {
        let touched =
            if by_runs { batch::touched_rows(&self.source_table) } else { batch::touched_rows_by_id(&self.source_table) };
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

    fn rows_full(&self, window: bool) -> String {
        let src = &self.source_table;
        // A full recomputation reports its progress (`eventview._progress_tick`, always true).
        let bounds = if window {
            // The range on occurred_at is implied by the bucket range and lets an index help.
            format!(
                "\n    WHERE e.occurred_at >= $2 AND e.occurred_at < $3 + $1::interval\n      AND {b} >= $2 AND {b} < $3",
                b = bucket_expr(WIDTH_PARAM, "e.occurred_at")
            )
        } else {
            "\n    WHERE eventview._progress_tick()".to_string()
        };
        format!(
            "full_rows AS (
    SELECT 1 AS sign, false AS from_delta, e.event_id, e.event_type, e.event_version,
           e.producer, e.occurred_at, e.payload
    FROM ONLY {src} e{bounds}
)"
        )
    }

    /// The one statement of an apply. Parameters: $1 bucket width (interval, NULL when not
    /// bucketed), $2 and $3 the window of `Mode::Window` (timestamptz). Returns one row:
    /// (changes consumed, groups written, groups with a retraction, first type error).
    pub fn apply(&self, mode: Mode) -> String {
        let def = self.def;
        let mut ctes = self.delta_input(mode, WIDTH_PARAM, true);
        let (key_exprs, d_cols) = self.group_delta_columns();
        let group_positions: Vec<String> = (1..=key_exprs.len()).map(|p| p.to_string()).collect();
        let mut insert_cols: Vec<String> = vec!["__k".into()];
        insert_cols.extend(self.keys().columns);
        let key_insert_cols = insert_cols.clone();
        insert_cols.push("__count".into());
        let mut sets = vec!["__count = t.__count + EXCLUDED.__count".to_string()];
        for (i, m) in def.measures.iter().enumerate() {
            let n = i + 1;
            match m.kind {
                AggKind::CountStar => {}
                AggKind::Count => {
                    insert_cols.push(format!("m{n}_n"));
                    sets.push(format!("m{n}_n = t.m{n}_n + EXCLUDED.m{n}_n"));
                }
                AggKind::Sum | AggKind::Avg => {
                    insert_cols.push(format!("m{n}_n"));
                    insert_cols.push(format!("m{n}_sum"));
                    sets.push(format!("m{n}_n = t.m{n}_n + EXCLUDED.m{n}_n"));
                    sets.push(format!("m{n}_sum = t.m{n}_sum + EXCLUDED.m{n}_sum"));
                }
                AggKind::Min | AggKind::Max => {
                    let pick = if m.kind == AggKind::Min { "LEAST" } else { "GREATEST" };
                    insert_cols.push(format!("m{n}_val"));
                    // Only additions: the extreme can only move outwards. A retraction defers
                    // to the fix-up, which reads the group's multiset.
                    sets.push(format!(
                        "m{n}_val = CASE WHEN EXCLUDED.__dirty THEN t.m{n}_val ELSE {pick}(t.m{n}_val, EXCLUDED.m{n}_val) END"
                    ));
                }
                AggKind::CountDistinct => {
                    // Filled from the multiset upsert below: +1 per value whose count rose from
                    // zero, -1 per value whose count fell to zero.
                    insert_cols.push(format!("m{n}_val"));
                    sets.push(format!("m{n}_val = t.m{n}_val + EXCLUDED.m{n}_val"));
                }
            }
        }
        insert_cols.push("__dirty".into());
        sets.push("__dirty = EXCLUDED.__dirty".into());
        let key_list = key_insert_cols.join(", ");
        ctes.push(format!(
            "d0 AS (\n    SELECT {}\n    FROM good\n    GROUP BY {}\n)",
            d_cols.join(",\n           "),
            group_positions.join(", ")
        ));
        self.apply_tail(mode, ctes, key_exprs, key_list, insert_cols, sets)
    }

    /// The CTEs from the rows to read through `good` (the type-checked values of each event,
    /// signed) and `bad_rows`: shared by the apply statement and realtime reads.
    fn delta_input(&self, mode: Mode, width: &str, by_runs: bool) -> Vec<String> {
        let def = self.def;
        let refs = self.refs();
        let mut ctes: Vec<String> = Vec::new();
        let rows = match mode {
            Mode::Delta => {
                ctes.push(self.rows_delta(by_runs));
                "delta_rows".to_string()
            }
            Mode::Full => {
                ctes.push(batch::SNAP_CTE.to_string());
                ctes.push(self.rows_full(false));
                "full_rows".to_string()
            }
            Mode::Window => {
                ctes.push(self.rows_delta(by_runs));
                ctes.push(self.rows_full(true));
                "(SELECT * FROM delta_rows UNION ALL SELECT * FROM full_rows)".to_string()
            }
        };

        // f: each reference evaluated once per row (OFFSET 0 keeps the planner from inlining
        // the expressions into every use).
        let mut f_cols = vec!["r.sign, r.from_delta, r.event_id, r.event_type, r.event_version, r.producer, r.occurred_at".to_string()];
        for (i, r) in refs.iter().enumerate() {
            f_cols.push(format!("{} AS j{}", Self::raw_sql(r), i + 1));
        }
        let too_deep: Vec<(String, String)> =
            refs.iter().filter_map(|r| Self::too_deep_check(r, &self.raw_column(&refs, r))).collect();
        if !too_deep.is_empty() {
            f_cols.push("r.payload".into());
        }
        let mut f_where = Vec::new();
        if let Some(types) = &def.event_types {
            let list: Vec<String> = types.iter().map(|t| quote::literal(t)).collect();
            f_where.push(format!("r.event_type = ANY (ARRAY[{}]::text[])", list.join(", ")));
        }
        if mode == Mode::Window {
            let b = bucket_expr(width, "r.occurred_at");
            f_where.push(format!("NOT (r.from_delta AND {b} >= $2 AND {b} < $3)"));
        }
        let f_where = if f_where.is_empty() { String::new() } else { format!("\n    WHERE {}", f_where.join("\n      AND ")) };
        ctes.push(format!(
            "f AS (\n    SELECT {}\n    FROM {rows} r{f_where}\n    OFFSET 0\n)",
            f_cols.join(",\n           ")
        ));

        // c: keys, measure inputs and the type check of each event the filter keeps.
        let mut c_cols = vec!["sign".to_string(), "event_id".to_string()];
        let mut checks: Vec<(String, String)> = too_deep.clone();
        if def.bucketed {
            c_cols.push(format!("{} AS bucket", bucket_expr(width, "occurred_at")));
        }
        for (i, g) in def.group_by.iter().enumerate() {
            let raw = self.raw_column(&refs, &g.field);
            let v = value_sql(&g.field, &raw, Use::GroupKey, &format!("group column \"{}\"", g.name));
            checks.extend(v.check);
            c_cols.push(format!("{} AS g{}", v.expr, i + 1));
        }
        for (i, m) in def.measures.iter().enumerate() {
            let Some(field) = &m.field else { continue };
            let used = match m.kind {
                AggKind::CountStar => continue,
                AggKind::Count => Use::CountNonNull,
                AggKind::Sum | AggKind::Avg => Use::Number,
                AggKind::Min | AggKind::Max => Use::Extreme,
                AggKind::CountDistinct => Use::Distinct,
            };
            let raw = self.raw_column(&refs, field);
            let context = format!("measure \"{}\": {}({})", m.name, m.kind.name(), field.display());
            let v = value_sql(field, &raw, used, &context);
            checks.extend(v.check);
            c_cols.push(format!("{} AS m{}", v.expr, i + 1));
        }
        // A condition already tested by an earlier WHEN can never choose its reason (two
        // measures over one field check it alike): tested once.
        let mut tested = std::collections::HashSet::new();
        checks.retain(|(cond, _)| tested.insert(cond.clone()));
        let bad = if checks.is_empty() {
            "NULL::text".to_string()
        } else {
            let whens: Vec<String> = checks.iter().map(|(cond, reason)| format!("WHEN {cond} THEN {reason}")).collect();
            format!("CASE {} END", whens.join(" "))
        };
        // Sizes are checked over c's columns, in a second step (c0 then c) when the view keeps
        // keys whose size varies.
        let oversize = self.oversize_check();
        c_cols.push(format!("{bad} AS {}", if oversize.is_some() { "bad0" } else { "bad" }));
        let mut c_where = Vec::new();
        for term in &def.filter {
            let lhs = match &term.field {
                FieldRef::Envelope(e) => e.jsonb_sql(e.column()),
                field => self.raw_column(&refs, field),
            };
            let values: Vec<String> =
                term.values.iter().map(|v| quote::typed_literal(&v.to_string(), "jsonb")).collect();
            // An event whose filter field cannot be evaluated passes on to its type check.
            match Self::too_deep_check(&term.field, &lhs) {
                Some((deep, _)) => c_where.push(format!("({lhs} IN ({}) OR {deep})", values.join(", "))),
                None => c_where.push(format!("{lhs} IN ({})", values.join(", "))),
            }
        }
        let c_where = if c_where.is_empty() { String::new() } else { format!("\n    WHERE {}", c_where.join("\n      AND ")) };
        // The JSON type of each reference, which the keys, values and checks above test up to
        // four times per event, is taken once (ft, kept apart from c by OFFSET 0 so the planner
        // does not substitute the expression back into every use).
        let (mut c_cols, mut c_where) = (c_cols.join(",\n           "), c_where);
        let mut types = Vec::new();
        for i in 1..=refs.len() {
            // Not inside literals: filter values and type error messages hold user text.
            let typeof_j = format!("jsonb_typeof(j{i})");
            let cols = quote::replace_outside_quotes(&c_cols, &typeof_j, &format!("t{i}"));
            let cond = quote::replace_outside_quotes(&c_where, &typeof_j, &format!("t{i}"));
            if cols != c_cols || cond != c_where {
                (c_cols, c_where) = (cols, cond);
                types.push(format!("{typeof_j} AS t{i}"));
            }
        }
        let from = if types.is_empty() {
            "f"
        } else {
            ctes.push(format!("ft AS (\n    SELECT f.*, {}\n    FROM f\n    OFFSET 0\n)", types.join(", ")));
            "ft"
        };
        // c is computed once per event (MATERIALIZED; it would be anyway, being read twice),
        // and every reader of good (the group delta d0, and a{n} of each min/max or
        // count_distinct measure: its value log or multiset) scans it with good's condition (NOT
        // MATERIALIZED), rather than through a second stored copy of the same rows: about a
        // sixth of a 10,000-event refresh, with the fence below (session 10, BENCHMARKS.md).
        match oversize {
            None => ctes.push(format!("c AS MATERIALIZED (\n    SELECT {c_cols}\n    FROM {from}{c_where}\n)")),
            Some(oversize) => {
                // c0 is fenced by OFFSET 0: pulled up into c, each of its columns the size check
                // reads (keys, min/max and count_distinct values) would be computed again.
                ctes.push(format!("c0 AS (\n    SELECT {c_cols}\n    FROM {from}{c_where}\n    OFFSET 0\n)"));
                ctes.push(format!("c AS MATERIALIZED (\n    SELECT c0.*, coalesce(c0.bad0, {oversize}) AS bad\n    FROM c0\n)"));
            }
        }
        ctes.push("bad_rows AS (SELECT event_id, bad FROM c WHERE bad IS NOT NULL AND sign > 0)".into());
        ctes.push("good AS NOT MATERIALIZED (SELECT * FROM c WHERE bad IS NULL)".into());
        ctes
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
        let keys: Vec<String> =
            (1..=def.group_by.len()).map(|n| format!("coalesce(pg_catalog.pg_column_size(c0.g{n}), 0)")).collect();
        let key_bytes = if keys.is_empty() { "0".to_string() } else { keys.join(" + ") };
        let mut whens = Vec::new();
        if !keys.is_empty() {
            let names: Vec<String> = def.group_by.iter().map(|g| format!("\"{}\"", g.name)).collect();
            whens.push(format!(
                "WHEN {key_bytes} > {MAX_KEY_BYTES} THEN {} || ({key_bytes}) || {}",
                quote::literal(&format!("group columns {} take ", names.join(", "))),
                quote::literal(&format!(" bytes, more than the {MAX_KEY_BYTES} a group key may take"))
            ));
        }
        for (n, m) in self.multiset_measures() {
            let field = m.field.as_ref().map(|f| f.display()).unwrap_or("");
            let bytes = format!("{key_bytes} + coalesce(pg_catalog.pg_column_size(c0.m{n}), 0)");
            whens.push(format!(
                "WHEN {bytes} > {MAX_KEY_BYTES} THEN {} || ({bytes}) || {}",
                quote::literal(&format!("measure \"{}\": {}({field}) takes, with the group columns, ", m.name, m.kind.name())),
                quote::literal(&format!(" bytes, more than the {MAX_KEY_BYTES} a stored value may take"))
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
            key_exprs.push(format!("coalesce(g{n}, {}) AS g{n}", g.sql_type().placeholder()));
            key_exprs.push(format!("(g{n} IS NULL) AS g{n}_null"));
        }
        let mut d_cols = key_exprs.clone();
        d_cols.push("sum(sign)::bigint AS __count".into());
        for (i, m) in self.def.measures.iter().enumerate() {
            let n = i + 1;
            match m.kind {
                AggKind::CountStar => {}
                AggKind::Count => d_cols.push(format!("sum(CASE WHEN m{n} THEN sign ELSE 0 END)::bigint AS m{n}_n")),
                AggKind::Sum | AggKind::Avg => {
                    d_cols.push(format!("sum(CASE WHEN m{n} IS NOT NULL THEN sign ELSE 0 END)::bigint AS m{n}_n"));
                    d_cols.push(format!("coalesce(sum(sign * m{n}), 0) AS m{n}_sum"));
                }
                AggKind::Min | AggKind::Max => {
                    let agg = if m.kind == AggKind::Min { "min" } else { "max" };
                    d_cols.push(format!("{agg}(m{n}) FILTER (WHERE sign > 0) AS m{n}_val"));
                }
                AggKind::CountDistinct => {}
            }
        }
        d_cols.push("bool_or(sign < 0) AS __dirty".into());
        (key_exprs, d_cols)
    }

    /// The rest of the apply statement after `d0`: multisets, the group upsert, the type-error
    /// policy and the consumer's new position.
    fn apply_tail(
        &self,
        mode: Mode,
        mut ctes: Vec<String>,
        key_exprs: Vec<String>,
        key_list: String,
        insert_cols: Vec<String>,
        sets: Vec<String>,
    ) -> String {
        let def = self.def;
        let vid = self.view_id;
        // Multisets (min/max/count_distinct): (keys, v) -> n, in the same statement.
        let mut d_select = vec!["d0.*".to_string()];
        let mut d_joins = String::new();
        let mut logged = Vec::new();
        for (n, m) in self.multiset_measures() {
            let values = names::view_values(self.view_id, n);
            let mut sel = key_exprs.clone();
            sel.push(format!("m{n} AS v"));
            sel.push("sum(sign)::bigint AS n".into());
            let positions: Vec<String> = (1..=key_exprs.len() + 1).map(|p| p.to_string()).collect();
            if m.kind != AggKind::CountDistinct && self.logs_extremes(mode) {
                ctes.push(format!(
                    "a{n} AS (\n    INSERT INTO {} ({key_list}, v, n)\n    SELECT {}\n    FROM good WHERE m{n} IS NOT NULL\n    GROUP BY {}\n    RETURNING 1\n)",
                    names::view_values_log(self.view_id, n),
                    sel.join(", "),
                    positions.join(", ")
                ));
                logged.push(format!(" + (SELECT count(*) FROM a{n})"));
                continue;
            }
            let (set, returning) = if m.kind == AggKind::CountDistinct {
                (
                    "prev_n = t.n, n = t.n + EXCLUDED.n".to_string(),
                    format!("{key_list}, CASE WHEN t.n > 0 AND t.prev_n <= 0 THEN 1 WHEN t.n <= 0 AND t.prev_n > 0 THEN -1 ELSE 0 END AS dd"),
                )
            } else {
                ("n = t.n + EXCLUDED.n".to_string(), "1".to_string())
            };
            ctes.push(format!(
                "a{n} AS (\n    INSERT INTO {values} AS t ({key_list}, v, n)\n    SELECT {}\n    FROM good WHERE m{n} IS NOT NULL\n    GROUP BY {}\n    ON CONFLICT ({key_list}, v) DO UPDATE SET {set}\n    RETURNING {returning}\n)",
                sel.join(", "),
                positions.join(", ")
            ));
            if m.kind == AggKind::CountDistinct {
                ctes.push(format!("dd{n} AS (SELECT {key_list}, sum(dd)::bigint AS dd FROM a{n} GROUP BY {key_list})"));
                d_select.push(format!("coalesce(dd{n}.dd, 0) AS m{n}_val"));
                d_joins.push_str(&format!(" LEFT JOIN dd{n} USING ({key_list})"));
            }
        }
        ctes.push(format!("d AS (SELECT {} FROM d0{d_joins})", d_select.join(", ")));
        let data = self.data();
        ctes.push(format!(
            "up AS (\n    INSERT INTO {data} AS t ({cols})\n    SELECT {cols} FROM d\n    ON CONFLICT ({key_list}) DO UPDATE SET\n        {sets}\n    RETURNING t.__dirty\n)",
            cols = insert_cols.join(", "),
            sets = sets.join(",\n        ")
        ));
        let mut counters = String::new();
        // A quarantine entry describes the version of an event the view left out; when the
        // event is updated or deleted (an erasure request must not leave a copy behind), that
        // version is superseded and its entry goes, whatever the policy and declarations are
        // now. The DELETE sees only the entries from before this statement, never those `q`
        // files for the events' new versions. (`eventview.views.quarantined` counts the
        // entries themselves, so no counter follows them.)
        if mode != Mode::Full {
            ctes.push(format!(
                "unq AS (
    DELETE FROM eventview.quarantine q
    WHERE q.view_name = {known}
      AND q.event_id IN (SELECT event_id FROM chg WHERE op <> 'I')
)",
                known = self.known_name()
            ));
        }
        match def.on_type_error {
            TypePolicy::Quarantine => {
                ctes.push(format!(
                    "q AS (
    INSERT INTO eventview.quarantine (source, view_name, event_id, reason, event)
    SELECT (SELECT relid FROM eventview._sources WHERE source_id = {sid}),
           {known},
           b.event_id, b.bad,
           jsonb_build_object('event_id', e.event_id, 'event_key', e.event_key,
                              'event_type', e.event_type, 'event_version', e.event_version,
                              'producer', e.producer, 'occurred_at', e.occurred_at,
                              'payload', e.payload)
    FROM bad_rows b LEFT JOIN ONLY {src} e ON e.event_id = b.event_id
)",
                    sid = self.source_id,
                    known = self.known_name(),
                    src = self.source_table
                ));
            }
            TypePolicy::Skip => {
                counters.push_str(",\n        skipped = skipped + (SELECT count(*) FROM bad_rows)");
            }
            TypePolicy::Fail => {}
        }
        // Values appended to the logs so far (a full rebuild empties them).
        match mode {
            Mode::Full => counters.push_str(",\n        extremes_logged = 0"),
            _ if !logged.is_empty() => {
                counters.push_str(&format!(",\n        extremes_logged = extremes_logged{}", logged.concat()))
            }
            _ => {}
        }
        // Our own transaction's changes are applied up to the last one we can see: after a full
        // scan, all of them; after a delta, the newest consumed (or what an earlier refresh in
        // this transaction already applied).
        let own_seq = match mode {
            Mode::Full => format!(
                "(SELECT max(seq) FROM {} WHERE xid = (SELECT own FROM snap))",
                names::changelog(self.source_id)
            ),
            _ => batch::OWN_SEQ_AFTER_DELTA.to_string(),
        };
        ctes.push(format!(
            "st AS (
    UPDATE eventview._views
    SET applied_snapshot = (SELECT s FROM snap),
        applied_own_xid = (SELECT own FROM snap),
        applied_own_seq = CASE WHEN (SELECT own FROM snap) IS NOT NULL THEN {own_seq} END{counters}
    WHERE view_id = {vid}
    RETURNING extremes_logged
)"
        ));
        let consumed = if mode == Mode::Full { "0::bigint".to_string() } else { batch::CONSUMED.to_string() };
        format!(
            "WITH {}\nSELECT {consumed} AS consumed,\n       (SELECT count(*) FROM up) AS groups_written,\n       (SELECT count(*) FROM up WHERE __dirty) AS dirty_groups,\n       (SELECT bad || ' (event_id ' || event_id || ')' FROM bad_rows ORDER BY event_id LIMIT 1) AS first_error,\n       (SELECT extremes_logged FROM st) AS extremes_logged",
            ctes.join(",\n")
        )
    }

    /// Statements run after an apply that left groups with retractions (`__dirty`).
    pub fn fixup(&self) -> Vec<String> {
        let data = self.data();
        let mut out = Vec::new();
        // Emptied multiset entries can only be in groups that took a retraction: find them
        // through the dirty groups and the multiset's key index. (No partial index on n = 0:
        // it would make every update of n a non-HOT update.)
        let key_match: Vec<String> = std::iter::once("__k".to_string())
            .chain(self.keys().columns)
            .map(|k| format!("a.{k} = t.{k}"))
            .collect();
        for (n, _) in self.multiset_measures() {
            out.push(format!(
                "DELETE FROM {} a USING {data} t WHERE t.__dirty AND {} AND a.n = 0",
                names::view_values(self.view_id, n),
                key_match.join(" AND ")
            ));
        }
        out.push(format!("DELETE FROM {data} WHERE __dirty AND __count = 0"));
        let mut sets = Vec::new();
        for (n, m) in self.minmax_measures() {
            let values = names::view_values(self.view_id, n);
            let dir = if m.kind == AggKind::Min { "ASC" } else { "DESC" };
            sets.push(format!(
                "m{n}_val = (SELECT a.v FROM {values} a WHERE {} ORDER BY a.v {dir} LIMIT 1)",
                key_match.join(" AND ")
            ));
        }
        sets.push("__dirty = false".into());
        out.push(format!("UPDATE {data} AS t SET {} WHERE t.__dirty", sets.join(", ")));
        out
    }

    /// Deletes the buckets `[$2, $3)` from storage and multisets (windowed rebuild).
    pub fn clear_window(&self) -> Vec<String> {
        let mut out = vec![format!("DELETE FROM {} WHERE bucket >= $2 AND bucket < $3", self.data())];
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
  AND pg_catalog.date_bin($1::interval, (event->>'occurred_at')::timestamptz, '2000-01-01 00:00:00+00'::timestamptz) >= $2
  AND pg_catalog.date_bin($1::interval, (event->>'occurred_at')::timestamptz, '2000-01-01 00:00:00+00'::timestamptz) < $3",
            known = self.known_name()
        )
    }

    /// Empties storage and multisets (full rebuild).
    pub fn clear_all(&self) -> Vec<String> {
        self.storage_tables().iter().map(|t| format!("DELETE FROM {t}")).collect()
    }
}


/// A storage table of a view (data, multiset, log) goes to the view's owner, and its row type is
/// nobody else's to use: a column or function of that type, made by anyone, would stop the
/// table from being dropped with its view (everyone has USAGE on schema eventview).
pub fn storage_grants(table: &str, owner_ident: &str) -> [String; 2] {
    [format!("ALTER TABLE {table} OWNER TO {owner_ident}"), format!("REVOKE USAGE ON TYPE {table} FROM PUBLIC")]
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
            filter,
            on_type_error: "quarantine",
        })
        .unwrap()
    }

    fn sql(d: &ViewDefinition) -> ViewSql<'_> {
        ViewSql { def: d, view_id: 3, source_id: 2, source_table: "\"shop\".\"events\"".into(), log_extremes: true }
    }

    #[test]
    fn storage_has_flagged_keys_and_multisets_for_extremes() {
        let d = def(r#"{"sku": "$.sku"}"#, r#"{"n": "count(*)", "top": "max($.p)"}"#, None, true);
        let ddl = sql(&d).create_storage().join(";\n");
        assert!(ddl.contains("g1 text NOT NULL"));
        assert!(ddl.contains("g1_null boolean NOT NULL"));
        assert!(ddl.contains("CREATE UNIQUE INDEX _v3_data_key ON eventview._v3_data (__k, bucket, g1, g1_null)"));
        assert!(ddl.contains("CREATE TABLE eventview._v3_m2"));
        assert!(ddl.contains("v numeric NOT NULL"));
        assert_eq!(ddl.matches(") WITH (fillfactor = 70)").count(), 2);
    }

    #[test]
    fn user_view_quotes_names_and_derives_avg() {
        let d = def(r#"{"Sku \"x\"": "$.sku"}"#, r#"{"a": "avg($.p)", "s": "sum(event_version)"}"#, None, false);
        let v = sql(&d).create_user_view("\"public\".\"v\"", Reads::Stored);
        assert!(v.contains("AS \"Sku \"\"x\"\"\""));
        assert!(v.contains("CASE WHEN m1_n > 0 THEN trim_scale(m1_sum) / m1_n END AS \"a\""));
    }

    #[test]
    fn apply_reads_one_snapshot_and_quotes_user_values() {
        let d = def(r#"{"sku": "$.sku"}"#, r#"{"q": "sum($.qty)"}"#, Some(r#"{"$.c": ["D'E", 1]}"#), true);
        let a = sql(&d).apply(Mode::Delta);
        assert!(a.contains("pg_visible_in_snapshot(c.xid, (SELECT s FROM snap))"));
        assert!(a.contains("ARRAY['add''to']::text[]"));
        assert!(a.contains("IN ('\"D''E\"'::jsonb, '1'::jsonb)"));
        assert!(a.contains("measure \"\"q\"\": sum($.qty) needs a JSON number, found ") || a.contains("measure \"q\": sum($.qty) needs a JSON number, found "));
        assert!(a.contains("INSERT INTO eventview.quarantine"));
        // Deterministic: generating twice gives the same text.
        assert_eq!(a, sql(&d).apply(Mode::Delta));
    }

    #[test]
    fn each_path_is_evaluated_once() {
        let d = def(r#"{"a": "$.x", "b": "$.x"}"#, r#"{"s": "sum($.x)"}"#, None, false);
        let a = sql(&d).apply(Mode::Full);
        assert_eq!(a.matches("(r.payload -> 'x') AS j1").count(), 1);
        // count_distinct keeps a jsonb multiset and counts zero crossings.
        let d = def(r#"{"sku": "$.sku"}"#, r#"{"users": "count_distinct($.user)"}"#, None, false);
        let v = sql(&d);
        assert!(v.create_storage().join(";").contains("prev_n bigint NOT NULL DEFAULT 0"));
        assert!(v.apply(Mode::Delta).contains("LEFT JOIN dd1 USING (__k, g1, g1_null)"));
        assert!(!a.contains(" AS j2"));
    }

    #[test]
    fn stored_views_log_extremes_and_realtime_views_do_not() {
        let d = def(r#"{"sku": "$.sku"}"#, r#"{"hi": "max($.p)", "users": "count_distinct($.u)"}"#, None, true);
        let stored = sql(&d);
        let ddl = stored.create_storage().join(";\n");
        assert!(ddl.contains("CREATE TABLE eventview._v3_m1_log (LIKE eventview._v3_m1 INCLUDING DEFAULTS)"));
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
        assert!(stored.clear_all().contains(&"DELETE FROM eventview._v3_m1_log".to_string()));
        assert!(stored
            .clear_window()
            .iter()
            .any(|s| s.starts_with("WITH gone AS (DELETE FROM eventview._v3_m1_log WHERE bucket >= $2")
                && s.contains("SET extremes_logged = greatest(extremes_logged - (SELECT count(*) FROM gone), 0)")));
        // Realtime reads take the log into account (empty but to a reader with an older snapshot).
        let realtime_read = ViewSql { log_extremes: false, ..sql(&d) }.create_user_view("\"v\"", Reads::Realtime { bucket_width: Some("1 day") });
        assert!(realtime_read.contains("lg1 AS MATERIALIZED (SELECT * FROM eventview._v3_m1_log)"));
        assert!(realtime_read.contains("SELECT l.v, l.n FROM lg1 l WHERE l.__k = d0.__k"));
        let merge = stored.merge_logs().join(";\n");
        assert!(merge.contains("WITH moved AS (DELETE FROM eventview._v3_m1_log RETURNING __k, bucket, g1, g1_null, v, n)"));
        assert!(merge.contains("HAVING sum(n) <> 0\nON CONFLICT (__k, bucket, g1, g1_null, v) DO UPDATE SET n = t.n + EXCLUDED.n"));
        assert!(merge.ends_with("UPDATE eventview._views SET extremes_logged = 0 WHERE view_id = 3"));
        let realtime = ViewSql { log_extremes: false, ..sql(&d) };
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
    fn each_reference_has_its_json_type_taken_once() {
        let d = def(r#"{"sku": "$.sku"}"#, r#"{"q": "sum($.qty)", "hi": "max($.qty)", "n": "count($.sku)"}"#, None, true);
        for statement in [sql(&d).apply(Mode::Delta), sql(&d).create_user_view("\"v\"", Reads::Realtime { bucket_width: Some("1 day") })] {
            assert!(statement.contains("ft AS (\n    SELECT f.*, jsonb_typeof(j1) AS t1, jsonb_typeof(j2) AS t2\n    FROM f\n    OFFSET 0\n)"));
            assert_eq!(statement.matches("jsonb_typeof(j").count(), 2, "{statement}");
            assert!(statement.contains("CASE WHEN t2 = 'number' THEN j2::numeric END"));
            assert!(statement.contains("FROM ft\n"));
        }
        // Envelope columns only: no JSON types to take.
        let plain = def(r#"{"t": "event_type"}"#, r#"{"n": "count(*)"}"#, None, true);
        let statement = sql(&plain).apply(Mode::Delta);
        assert!(!statement.contains("ft AS") && statement.contains("    FROM f\n    OFFSET 0\n)"), "{statement}");
        assert!(statement.contains("good AS NOT MATERIALIZED (SELECT * FROM c WHERE bad IS NULL)"));
        assert!(statement.contains("c AS MATERIALIZED (\n    SELECT c0.*, coalesce(c0.bad0, "));
    }
}
