//! Rollups: views maintained from the group changes of another incremental view.
//!
//! A view that rollups read keeps a group changelog (`eventview._v<id>_changes`): each apply
//! (refresh, rebuild) of the view also writes, per group it changed, the signed change of its
//! counters, the extreme its additions reached, whether it took a retraction, and for each
//! multiset measure the (value, count) changes as two arrays (a shard's view of a distributed
//! view, which keeps the changelog for the coordinator's refresh, those of count_distinct and
//! percentile only: `value_changes_written`, and without those it hands them back to the
//! coordinator's refresh instead of writing them: `hands_back_changes`); a rebuild first writes the
//! retraction of every group it recomputes. The changelog has the event changelog's `seq` and
//! `xid`, so a rollup consumes it with the same snapshot batching (`batch::log_ctes`), exactly
//! once, and its apply is the apply of an ordinary view from there on: the changes mapped to
//! the rollup's coarser keys (group columns kept, `bucket` binned again), counters added,
//! extremes moved outwards or fixed up from the rollup's own multisets, multisets added up
//! (count_distinct and percentiles over the merged values). A rollup of a rollup reads the
//! group changelog its source writes in turn. A rollup created or rebuilt reads its source's
//! stored groups and multisets instead (`Mode::Full`, `Mode::Window`).
//!
//! Realtime reads: the pending changes of a rollup are the group changes it has not applied
//! plus the pending changes of its source, computed the same way down to the view over the
//! event table, whose pending changes are its raw events not applied yet
//! (`pending_rows`). No level rescans what it has stored.
//!
//! Algorithm (apply):
//!   chg      the source's group changes of the batch (Delta, Window);
//!   r        each change (or, Full and Window, each stored group of the source) mapped to the
//!            rollup's keys, filtered by the rollup's filter on source group columns;
//!   d0       the change per rollup group; rv<n>, vc<n> the (value, count) changes of each
//!            multiset measure (from the change arrays, or the source's multisets);
//!   a<n>, dd<n>, d, up, gc, st   as in a view's apply (`sqlgen`).

use super::*;
use crate::definition::{Envelope, RollupOf, SqlType};

impl<'a> ViewSql<'a> {
    /// The bucket width as SQL: a literal of `bucket_width` (statements without parameters).
    pub(super) fn width_sql(&self) -> String {
        match &self.bucket_width {
            Some(w) => quote::typed_literal(w, "interval"),
            None => "NULL::interval".to_string(),
        }
    }

    /// The columns of the group changelog after the keys, with their SQL types: `__count`, each
    /// measure's counters (`m<n>_n`, `m<n>_sum`), the extreme of a min/max measure's additions
    /// (`m<n>_val`), each multiset measure's value changes (`m<n>_vs` values, `m<n>_ns` counts),
    /// then `__dirty`.
    fn change_columns(&self) -> Vec<(String, String)> {
        let mut cols = vec![("__count".to_string(), "bigint".to_string())];
        for (n, m) in self.numbered_measures() {
            let value_type = m.value_type().name();
            match m.kind {
                AggKind::Count => cols.push((format!("m{n}_n"), "bigint".into())),
                AggKind::Sum | AggKind::Avg => {
                    cols.push((format!("m{n}_n"), "bigint".into()));
                    cols.push((format!("m{n}_sum"), "numeric".into()));
                }
                AggKind::Min | AggKind::Max => {
                    cols.push((format!("m{n}_val"), value_type.into()));
                }
                AggKind::ApproxPercentile => cols.push((format!("m{n}_sk"), "bigint[]".into())),
                _ => {}
            }
            if Self::is_multiset(m.kind) {
                cols.push((format!("m{n}_vs"), format!("{value_type}[]")));
                cols.push((format!("m{n}_ns"), "bigint[]".into()));
            }
        }
        cols.push(("__dirty".to_string(), "boolean".to_string()));
        cols
    }

    /// The group changelog's columns as a list: keys, then `change_columns`.
    fn change_column_list(&self) -> String {
        let mut cols = self.key_columns();
        cols.extend(self.change_columns().into_iter().map(|(c, _)| c));
        cols.join(", ")
    }

    /// The view's group changelog, qualified.
    pub fn changes_table(&self) -> String {
        names::view_changes(self.view_id)
    }

    /// DDL of the group changelog: `seq`, `xid` and `logged_at` as the event changelog has
    /// them, the keys, the changes; an index on `(xid, seq)` for the batches.
    pub fn create_changes(&self) -> Vec<String> {
        let mut cols = vec![
            "seq bigint GENERATED ALWAYS AS IDENTITY".to_string(),
            "xid xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id()".to_string(),
            "logged_at timestamptz NOT NULL DEFAULT pg_catalog.now()".to_string(),
        ];
        cols.extend(self.key_column_ddl());
        cols.extend(
            self.change_columns()
                .into_iter()
                .map(|(c, t)| format!("{c} {t}")),
        );
        let mut out = vec![
            format!(
                "CREATE TABLE {} (\n    {}\n)",
                self.changes_table(),
                cols.join(",\n    ")
            ),
            format!(
                "CREATE INDEX _v{}_changes_xid ON {} (xid, seq)",
                self.view_id,
                self.changes_table()
            ),
        ];
        // Written once and read once: not worth compressing.
        out.extend(
            self.change_columns()
                .into_iter()
                .filter(|(_, t)| t.ends_with("[]"))
                .map(|(c, _)| Self::uncompressed(&self.changes_table(), &c)),
        );
        out
    }

    /// `gc`: the apply's group changes (`d0`, and the value changes `vc<n>`) written to the
    /// group changelog.
    ///
    /// ```sql
    /// gc AS (
    ///     INSERT INTO eventview._v<id>_changes (__k, bucket, ..., __count, m1_n, ..., __dirty)
    ///     SELECT __k, bucket, ..., __count, m1_n, ..., x2.vs, x2.ns, __dirty
    ///     FROM d0 LEFT JOIN (SELECT <keys>, array_agg(v) AS vs, array_agg(n) AS ns
    ///                        FROM vc2 GROUP BY <keys>) x2 USING (<keys>)
    ///     RETURNING 1
    /// )
    /// ```
    pub(super) fn changes_written(&self) -> String {
        let keys = self.key_list();
        let written: Vec<String> = self
            .value_changes_written()
            .map(|(n, _)| format!("m{n}"))
            .collect();
        let mut columns = self.key_columns();
        let mut values = self.key_columns();
        for (c, _) in self.change_columns() {
            let array = c
                .strip_suffix("_vs")
                .map(|m| (m, "vs"))
                .or_else(|| c.strip_suffix("_ns").map(|m| (m, "ns")));
            match array {
                // Left NULL for a measure whose value changes are not written.
                Some((m, _)) if !written.iter().any(|w| w == m) => continue,
                Some((m, part)) => values.push(format!("x{}.{part}", &m[1..])),
                None => values.push(c.clone()),
            }
            columns.push(c);
        }
        let joins: String = self
            .value_changes_written()
            .map(|(n, _)| {
                format!(
                    "\n    LEFT JOIN (SELECT {keys}, array_agg(v) AS vs, array_agg(n) AS ns FROM vc{n} GROUP BY {keys}) x{n} USING ({keys})"
                )
            })
            .collect();
        format!(
            "gc AS (\n    INSERT INTO {} ({})\n    SELECT {}\n    FROM d0{joins}\n    RETURNING 1\n)",
            self.changes_table(),
            columns.join(", "),
            values.join(", ")
        )
    }

    /// The multiset measures whose value changes an apply writes to the group changelog
    /// (`vc<n>`, the `m<n>_vs` and `m<n>_ns` columns): every one for the rollups of a view of
    /// this node. A shard's view (`data_table`) writes those of count_distinct and percentile
    /// only: the coordinator takes its min/max from the partial groups' extremes (and merges
    /// a group whose extreme a retraction moved inwards anew from every shard's partial
    /// group), so value changes of min/max would be written for nothing.
    pub(super) fn value_changes_written(&self) -> impl Iterator<Item = (usize, &Measure)> {
        let shard_view = self.data_table.is_some();
        self.multiset_measures()
            .filter(move |(_, m)| !shard_view || !matches!(m.kind, AggKind::Min | AggKind::Max))
    }

    /// Before a rebuild of a view that rollups read: the retraction of every group it
    /// recomputes (all, or with `window` those in the buckets `[$2, $3)`), written to its
    /// group changelog; the apply then writes the groups recomputed. The min/max logs must be
    /// merged first (the multisets give the values retracted).
    pub fn retract_into_changes(&self, window: bool) -> String {
        let mut values = vec![self.key_list_of("s")];
        let mut joins = String::new();
        for (c, t) in self.change_columns() {
            let n = c.trim_start_matches('m').split('_').next().unwrap_or("");
            values.push(match c.as_str() {
                "__count" => "-s.__count".to_string(),
                "__dirty" => "true".to_string(),
                _ if c.ends_with("_vs") => format!("x{n}.vs"),
                _ if c.ends_with("_ns") => format!("x{n}.ns"),
                _ if c.ends_with("_val") => format!("NULL::{t}"),
                _ if c.ends_with("_sk") => format!("eventview._sketch_negate(s.{c})"),
                _ => format!("-s.{c}"),
            });
        }
        for (n, _) in self.multiset_measures() {
            joins.push_str(&format!(
                "\nLEFT JOIN LATERAL (SELECT array_agg(ms.v) AS vs, array_agg(-ms.n) AS ns FROM {} ms WHERE {} AND ms.n <> 0) x{n} ON true",
                names::view_values(self.view_id, n),
                self.keys_equal("ms", "s")
            ));
        }
        let window = if window {
            " AND s.bucket >= $2 AND s.bucket < $3"
        } else {
            ""
        };
        format!(
            "INSERT INTO {} ({})\nSELECT {}\nFROM {} s{joins}\nWHERE s.__k{window}",
            self.changes_table(),
            self.change_column_list(),
            values.join(", "),
            self.data()
        )
    }

    /// Deletes the group changes every rollup of the view has applied: those of transactions
    /// that ended before every rollup's applied snapshot (and before the transaction a rollup
    /// refreshed inside, whose later changes it may not have applied).
    pub fn prune_changes(&self) -> String {
        format!(
            "DELETE FROM {} c
WHERE c.xid < (SELECT min(LEAST(pg_catalog.pg_snapshot_xmin(r.applied_snapshot), r.applied_own_xid))
               FROM eventview._views r WHERE r.source_view = {})",
            self.changes_table(),
            self.view_id
        )
    }

    /// The rollup's source.
    fn source(&self) -> &ViewSql<'a> {
        self.rollup_source
            .as_deref()
            .expect("a rollup has a source")
    }

    fn rollup_of(&self) -> &RollupOf {
        self.def.rollup.as_ref().expect("a rollup has its mapping")
    }

    /// The rollup's key expressions over a source row `c` (a group change, a stored group or a
    /// multiset row: all have the source's key columns): `bucket` binned again at the rollup's
    /// width `width` in the source's time zone, the kept group columns.
    fn rollup_keys(&self, width: &str) -> Vec<String> {
        let mut keys = vec!["true AS __k".to_string()];
        if self.def.bucketed {
            keys.push(format!(
                "{} AS bucket",
                bucket_expr(width, "c.bucket", self.def.time_zone.as_deref())
            ));
        }
        for (i, s) in self.rollup_of().group_columns.iter().enumerate() {
            let n = i + 1;
            keys.push(format!("c.g{s} AS g{n}"));
            keys.push(format!("c.g{s}_null AS g{n}_null"));
        }
        keys
    }

    /// The rollup's key expressions and change columns over a source row `c`: a group change
    /// (`from_changes`), or a stored group (no value arrays: the multisets are read apart).
    fn rollup_row(&self, width: &str, from_changes: bool) -> String {
        let mut cols = self.rollup_keys(width);
        cols.push("c.__count".into());
        let rollup = self.rollup_of();
        for ((n, m), s) in self.numbered_measures().zip(&rollup.measures) {
            let Some(s) = s else { continue };
            match m.kind {
                AggKind::Count => cols.push(format!("c.m{s}_n AS m{n}_n")),
                AggKind::Sum | AggKind::Avg => {
                    cols.push(format!("c.m{s}_n AS m{n}_n"));
                    cols.push(format!("c.m{s}_sum AS m{n}_sum"));
                }
                AggKind::Min | AggKind::Max => cols.push(format!("c.m{s}_val AS m{n}_val")),
                AggKind::ApproxPercentile => cols.push(format!("c.m{s}_sk AS m{n}_sk")),
                _ => {}
            }
            if Self::is_multiset(m.kind) {
                if from_changes {
                    cols.push(format!("c.m{s}_vs AS m{n}_vs, c.m{s}_ns AS m{n}_ns"));
                } else {
                    cols.push(format!(
                        "NULL::{}[] AS m{n}_vs, NULL::bigint[] AS m{n}_ns",
                        m.value_type().name()
                    ));
                }
            }
        }
        cols.push(if from_changes {
            "c.__dirty".into()
        } else {
            "false AS __dirty".into()
        });
        cols.join(", ")
    }

    /// The rollup's filter over a source row `c`, one condition per source group column: its
    /// value as the source shows it among the accepted values, a JSON null accepting the NULL
    /// key. A text key is compared with each value's text as `#>>` gives it (a string's
    /// contents, a number as jsonb writes it: `1e3` is `1000`), a timestamp as jsonb in UTC
    /// (as filters compare `occurred_at`), any other key as jsonb (`1` equals `1.0`): never in
    /// the session's TimeZone or DateStyle.
    fn rollup_filter(&self) -> Vec<String> {
        let source = self.source();
        let mut conds = Vec::new();
        for (s, values) in &self.rollup_of().filter {
            let key_type = source.def.group_by[s - 1].sql_type();
            let mut accepted = Vec::new();
            if values.iter().any(|v| v.is_null()) {
                accepted.push(format!("c.g{s}_null"));
            }
            let others: Vec<String> = values
                .iter()
                .filter(|v| !v.is_null())
                .map(|v| {
                    let json = quote::typed_literal(&v.to_string(), "jsonb");
                    match key_type {
                        SqlType::Text => format!("({json} #>> '{{}}')"),
                        _ => json,
                    }
                })
                .collect();
            if !others.is_empty() {
                let key = match key_type {
                    SqlType::Text => format!("c.g{s}"),
                    SqlType::Timestamptz => Envelope::OccurredAt.jsonb_sql(&format!("c.g{s}")),
                    _ => format!("pg_catalog.to_jsonb(c.g{s})"),
                };
                accepted.push(format!(
                    "(NOT c.g{s}_null AND {key} IN ({}))",
                    others.join(", ")
                ));
            }
            conds.push(format!("({})", accepted.join(" OR ")));
        }
        conds
    }

    /// `d0` of a rollup over `r` (named `name`): the change per rollup group.
    fn rollup_group_delta(&self, name: &str) -> String {
        let keys = self.key_columns();
        let mut cols = keys.clone();
        cols.push("sum(__count)::bigint AS __count".into());
        for (n, m) in self.numbered_measures() {
            match m.kind {
                AggKind::Count => cols.push(format!("sum(m{n}_n)::bigint AS m{n}_n")),
                AggKind::Sum | AggKind::Avg => {
                    cols.push(format!("sum(m{n}_n)::bigint AS m{n}_n"));
                    cols.push(format!("coalesce(sum(m{n}_sum), 0) AS m{n}_sum"));
                }
                AggKind::Min => cols.push(format!("min(m{n}_val) AS m{n}_val")),
                AggKind::Max => cols.push(format!("max(m{n}_val) AS m{n}_val")),
                AggKind::ApproxPercentile => {
                    cols.push(format!("eventview._sketch_sum(m{n}_sk) AS m{n}_sk"))
                }
                _ => {}
            }
        }
        cols.push("bool_or(__dirty) AS __dirty".into());
        let positions: Vec<String> = (1..=keys.len()).map(|p| p.to_string()).collect();
        format!(
            "{name} AS (\n    SELECT {}\n    FROM r\n    GROUP BY {}\n)",
            cols.join(", "),
            positions.join(", ")
        )
    }

    /// `rv<n>` and `vc<n>` of multiset measure `n` (source measure `s`): its value changes per
    /// rollup group, from the arrays of `r` and, with `stored` (a condition on the source's
    /// multiset row `c`), from the source's multiset.
    fn rollup_value_changes(
        &self,
        n: usize,
        s: usize,
        width: &str,
        stored: Option<&str>,
    ) -> [String; 2] {
        let keys = self.key_list();
        let mut rows = format!(
            "SELECT {}, u.v, u.n FROM r CROSS JOIN LATERAL unnest(r.m{n}_vs, r.m{n}_ns) AS u(v, n)",
            self.key_list_of("r")
        );
        if let Some(cond) = stored {
            let mut conds = vec!["c.n <> 0".to_string()];
            conds.extend(self.rollup_filter());
            conds.push(cond.to_string());
            rows.push_str(&format!(
                "\n    UNION ALL\n    SELECT {}, c.v, c.n FROM {} c{}",
                self.rollup_keys(width).join(", "),
                names::view_values(self.source().view_id, s),
                where_clause(&conds)
            ));
        }
        [
            format!("rv{n} AS (\n    {rows}\n)"),
            format!(
                "vc{n} AS (SELECT {keys}, v, sum(n)::bigint AS n FROM rv{n} GROUP BY {keys}, v HAVING sum(n) <> 0)"
            ),
        ]
    }

    /// The rollup's bucket of source row `c` in the window `[$2, $3)`, and a range of the
    /// source's own buckets that an index serves.
    fn in_window(&self) -> String {
        let b = bucket_expr(WIDTH_PARAM, "c.bucket", self.def.time_zone.as_deref());
        let (before, after) = bucket_slack(self.def.time_zone.as_deref());
        format!(
            "c.bucket >= $2{before} AND c.bucket < $3 + $1::interval{after} AND {b} >= $2 AND {b} < $3"
        )
    }

    /// The one statement of a rollup's apply (parameters as `apply`'s).
    pub(super) fn rollup_apply(&self, mode: Mode) -> String {
        let source = self.source();
        let columns = format!("c.seq, c.xid, {}", source.change_column_list());
        let mut ctes = Vec::new();
        if mode == Mode::Full {
            ctes.push(batch::SNAP_CTE.to_string());
        } else {
            ctes.push(batch::log_ctes(
                &source.changes_table(),
                &columns,
                &self.applied_state(),
            ));
        }
        let filter = self.rollup_filter();
        let changed = {
            let mut conds = filter.clone();
            if mode == Mode::Window {
                let b = bucket_expr(WIDTH_PARAM, "c.bucket", self.def.time_zone.as_deref());
                conds.push(format!("NOT ({b} >= $2 AND {b} < $3)"));
            }
            format!(
                "SELECT {} FROM chg c{}",
                self.rollup_row(WIDTH_PARAM, true),
                where_clause(&conds)
            )
        };
        let window = self.in_window();
        let stored_condition = match mode {
            Mode::Delta => None,
            Mode::Full => Some("true"),
            Mode::Window => Some(window.as_str()),
        };
        let stored = stored_condition.map(|cond| {
            let mut conds = vec!["c.__k".to_string()];
            conds.extend(filter.iter().cloned());
            conds.push(cond.to_string());
            format!(
                "SELECT {} FROM {} c{}",
                self.rollup_row(WIDTH_PARAM, false),
                source.data(),
                where_clause(&conds)
            )
        });
        let rows = match (mode, stored) {
            (Mode::Delta, _) | (_, None) => changed,
            (Mode::Full, Some(stored)) => stored,
            (Mode::Window, Some(stored)) => format!("{changed}\n    UNION ALL\n    {stored}"),
        };
        ctes.push(format!("r AS (\n    {rows}\n)"));
        ctes.push(self.rollup_group_delta("d0"));
        let mut logged = Vec::new();
        let keys = self.key_list();
        for ((n, m), s) in self.numbered_measures().zip(&self.rollup_of().measures) {
            let (true, Some(s)) = (Self::is_multiset(m.kind), s) else {
                continue;
            };
            let [rv, vc] = self.rollup_value_changes(n, *s, WIDTH_PARAM, stored_condition);
            let to_log = matches!(m.kind, AggKind::Min | AggKind::Max) && self.logs_extremes(mode);
            // A log takes the changes as they come (its merge adds them up); a multiset upsert
            // takes one row per (group, value).
            let rows = if to_log {
                ctes.push(rv);
                if self.feeds_rollups {
                    // The group changelog takes them per (group, value) (`changes_written`).
                    ctes.push(vc);
                }
                format!("SELECT {keys}, v, n FROM rv{n}")
            } else {
                ctes.extend([rv, vc]);
                format!("SELECT {keys}, v, n FROM vc{n}")
            };
            ctes.push(self.values_written(n, m.kind, to_log, &rows));
            if m.kind == AggKind::CountDistinct {
                ctes.push(self.distinct_changes(n));
            } else if to_log {
                logged.push(n);
            }
        }
        ctes.push(self.group_delta_with_distinct_counts());
        ctes.push(self.storage_upsert());
        if self.feeds_rollups {
            ctes.push(self.changes_written());
        }
        ctes.push(self.position_update(mode, &logged));
        let consumed = if mode == Mode::Full {
            "0::bigint"
        } else {
            "(SELECT count(*) FROM chg)::bigint"
        };
        format!(
            "WITH {}\n{}",
            ctes.join(",\n"),
            Self::result_row(
                consumed,
                "NULL::text",
                "(SELECT count(*) FROM up WHERE __dirty)"
            )
        )
    }

    /// The realtime read's CTEs of a rollup up to `d0` (see `pending_group_deltas`): the group
    /// changes of its source it has not applied (as the reader sees them) and its source's
    /// pending changes, mapped to the rollup's groups.
    pub(super) fn rollup_pending_group_deltas(&self, width: &str) -> Vec<String> {
        let source = self.source();
        let list = source.change_column_list();
        let mut ctes = vec![batch::log_ctes(
            &source.changes_table(),
            &list,
            &self.applied_state(),
        )];
        ctes.push(format!(
            "p AS (\n    SELECT {list} FROM chg\n    UNION ALL\n    SELECT {list} FROM {} x\n)",
            source.pending_rows()
        ));
        ctes.push(format!(
            "r AS (\n    SELECT {} FROM p c{}\n)",
            self.rollup_row(width, true),
            where_clause(&self.rollup_filter())
        ));
        ctes.push(self.rollup_group_delta("d00"));
        let keys = self.key_list();
        let mut select = vec!["d00.*".to_string()];
        let mut joins = String::new();
        for ((n, m), s) in self.numbered_measures().zip(&self.rollup_of().measures) {
            let (true, Some(s)) = (Self::is_multiset(m.kind), s) else {
                continue;
            };
            ctes.extend(self.rollup_value_changes(n, *s, width, None));
            select.push(format!("x{n}.vs AS m{n}_vs, x{n}.ns AS m{n}_signs"));
            joins.push_str(&format!(
                " LEFT JOIN (SELECT {keys}, array_agg(v) AS vs, array_agg(n) AS ns FROM vc{n} GROUP BY {keys}) x{n} USING ({keys})"
            ));
        }
        ctes.push(format!(
            "d0 AS (SELECT {} FROM d00{joins})",
            select.join(", ")
        ));
        ctes
    }

    /// The changes this view's next refresh would write to its group changelog, as the reader
    /// sees them, as a parenthesized query of the changelog's columns (`change_column_list`):
    /// what a realtime rollup over it adds to what it has applied.
    fn pending_rows(&self) -> String {
        let ctes = self.pending_group_deltas(&self.width_sql());
        let mut cols = self.key_columns();
        for (c, t) in self.change_columns() {
            cols.push(match c.strip_suffix("_ns") {
                Some(m) => format!("{m}_signs::bigint[] AS {c}"),
                None if c.ends_with("_vs") => format!("{c}::{t} AS {c}"),
                None => c,
            });
        }
        format!(
            "(WITH {}\n SELECT {} FROM d0)",
            ctes.join(",\n"),
            cols.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::{parse_definition, parse_rollup, DefinitionInput, RollupInput};

    fn source_def() -> ViewDefinition {
        parse_definition(&DefinitionInput {
            fields: &crate::definition::NoFields,
            group_by: r#"{"sku": "$.sku", "country": "$.country"}"#,
            measures: r#"{"n": "count(*)", "revenue": "sum($.amount)", "top": "max($.amount)", "buyers": "count_distinct($.user)", "p50": "percentile($.amount, 0.5)"}"#,
            event_types: None,
            bucketed: true,
            time_zone: Some("Europe/Berlin"),
            unnest: None,
            filter: None,
            on_type_error: "quarantine",
        })
        .unwrap()
    }

    fn rollup_def(source: &ViewDefinition) -> ViewDefinition {
        parse_rollup(&RollupInput {
            source,
            group_by: r#"{"sku": "sku"}"#,
            measures: r#"{"n": "n", "revenue": "revenue", "top": "top", "buyers": "buyers", "p50": "p50"}"#,
            filter: Some(r#"{"country": ["DE", null]}"#),
            bucketed: true,
        })
        .unwrap()
    }

    fn sql<'a>(def: &'a ViewDefinition, id: i32, source: Option<ViewSql<'a>>) -> ViewSql<'a> {
        ViewSql {
            def,
            view_id: id,
            source_id: 1,
            source_scan: "public.ev".into(),
            log_extremes: true,
            feeds_rollups: source.is_none(),
            bucket_width: Some("1 hour".into()),
            values_in_row: if source.is_none() {
                ValuesInRow::Columns
            } else {
                ValuesInRow::No
            },
            rollup_source: source.map(Box::new),
            data_table: None,
        }
    }

    #[test]
    fn a_rollup_consumes_its_sources_group_changes_mapped_to_its_keys() {
        let source = source_def();
        let rollup = rollup_def(&source);
        let r = sql(&rollup, 8, Some(sql(&source, 7, None)));
        let delta = r.apply(Mode::Delta);
        if std::env::var("SHOW_SQL").is_ok() {
            println!(
                "{}\n\n{}",
                r.apply(Mode::Full),
                r.create_user_view("public.r", Reads::Realtime)
            );
        }
        assert!(delta.contains("FROM eventview._v7_changes c"), "{delta}");
        // The source's group column 1 is kept; its bucket binned again in its time zone.
        assert!(
            delta.contains("c.g1 AS g1, c.g1_null AS g1_null"),
            "{delta}"
        );
        assert!(
            delta.contains("pg_catalog.timezone('Europe/Berlin'"),
            "{delta}"
        );
        assert!(
            delta.contains(
                r#"(c.g2_null OR (NOT c.g2_null AND c.g2 IN (('"DE"'::jsonb #>> '{}'))))"#
            ),
            "{delta}"
        );
        assert!(delta.contains("unnest(r.m4_vs, r.m4_ns)"), "{delta}");
        assert!(
            !delta.contains("INSERT INTO eventview._v8_changes"),
            "{delta}"
        );
        let full = r.apply(Mode::Full);
        assert!(full.contains("FROM eventview._v7_data c"), "{full}");
        assert!(full.contains("FROM eventview._v7_m4 c"), "{full}");
        // A realtime read of the rollup has changes pending when its source's group changelog
        // or the source's event changelog holds a batch for it, each at its own position.
        let check = r.realtime_pending_check();
        assert!(check.contains("FROM eventview._v7_changes c"), "{check}");
        assert!(check.contains("FROM eventview._changes_"), "{check}");
        assert!(check.contains("WHERE view_id = 8) a"), "{check}");
        assert!(check.contains("WHERE view_id = 7) a"), "{check}");
        assert!(check.starts_with("SELECT (SELECT EXISTS"), "{check}");
    }

    #[test]
    fn a_view_that_rollups_read_writes_its_group_changes() {
        let source = source_def();
        let s = sql(&source, 7, None);
        let apply = s.apply(Mode::Delta);
        assert!(
            apply.contains("INSERT INTO eventview._v7_changes"),
            "{apply}"
        );
        assert!(apply.contains("vc4 AS ("), "{apply}");
        let retract = s.retract_into_changes(true);
        assert!(retract.contains("-s.__count"), "{retract}");
        assert!(retract.contains("array_agg(-ms.n)"), "{retract}");
    }
}
