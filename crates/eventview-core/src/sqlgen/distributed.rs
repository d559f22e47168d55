//! A view over an event table distributed by Citus (the extension's `citus` module), on the
//! coordinator. Each shard's view keeps its partial groups in its shard of
//! `eventview._v<id>_groups` (one row per group and shard); the coordinator's storage holds every
//! group merged from them, so that the view is read as any stored view of this node is, through
//! its read index.
//!
//! Algorithm: the shards' views write the changes of the groups each apply changes to their
//! group changelogs (as a view that rollups read does): counter deltas, the extremes of the
//! additions, sketch deltas, the value changes of multiset measures, whether the group took a
//! retraction. After the shards' refreshes, in the same transaction, the coordinator takes
//! every shard's changes and adds them to the merged groups: counts and sums added, `avg` from
//! the added sums and counts, extremes combined with the additions' (an extreme only moves
//! outwards while nothing is retracted), sketches merged bucket by bucket. A group that took a
//! retraction is recomputed from the partial groups of every shard (min of minima, max of
//! maxima), and goes when its count fell to 0 (only a retraction lowers a count). The values
//! of count_distinct and percentile measures, which no partial group can merge, go to the
//! coordinator's value multisets, per group, value and shard; a group's distinct count is
//! counted from them, and a percentile read from them. Taking a shard's changes empties its
//! group changelog in the transaction that applies them on the coordinator: each change is
//! added exactly once. A shard's view made anew (on a node the shard arrived on) replaces that
//! shard's values, and every group is merged anew.

use super::*;
use crate::definition::SqlType;

impl<'a> ViewSql<'a> {
    /// The count_distinct and percentile measures with their numbers: the coordinator keeps
    /// each one's values per group and shard (`create_merged_values`).
    fn value_measures(&self) -> impl Iterator<Item = (usize, &Measure)> {
        self.numbered_measures()
            .filter(|(_, m)| matches!(m.kind, AggKind::CountDistinct | AggKind::Percentile))
    }

    /// The count_distinct measures with their numbers, which the coordinator counts from the
    /// merged values (`count_distinct_of`); a percentile is read from them.
    fn distinct_measures(&self) -> impl Iterator<Item = (usize, &Measure)> {
        self.numbered_measures()
            .filter(|(_, m)| m.kind == AggKind::CountDistinct)
    }

    /// DDL of the distributed table of every shard's partial groups, `groups` (before Citus
    /// distributes it by `__shard`, of type `shard_type`): a storage table with `__shard` and a
    /// primary key on `__shard` and the group key, which lets Citus move its shards by logical
    /// replication. Each shard's view adds the key index its applies upsert through.
    pub fn create_partial_groups(&self, groups: &str, shard_type: &str) -> Vec<String> {
        vec![
            self.create_data_table(groups),
            format!("ALTER TABLE {groups} ADD COLUMN __shard {shard_type} NOT NULL"),
            format!(
                "ALTER TABLE {groups} ADD PRIMARY KEY (__shard, {})",
                self.key_list()
            ),
        ]
    }

    /// DDL of the coordinator's storage of merged groups: the storage table with its key and
    /// read indexes (the extremes come merged from the shards, without multisets), and the
    /// value multisets of count_distinct and percentile measures (`create_merged_values`).
    pub fn create_merged_storage(&self) -> Vec<String> {
        let data = self.data();
        let mut out = vec![
            self.create_data_table(&data),
            format!(
                "CREATE UNIQUE INDEX _v{}_data_key ON {data} ({})",
                self.view_id,
                self.key_list()
            ),
        ];
        out.extend(self.create_read_index());
        out.extend(self.create_merged_values());
        out
    }

    /// DDL of the coordinator's value multiset of each count_distinct and percentile measure:
    /// how many events of each group on each shard (`__shard`, the value of its registry row,
    /// as text) have each value. A group's distinct count is the number of its values
    /// (`count_distinct_of`); a percentile is read from them as a single-node view's is from
    /// its multiset (a value on several shards has a row per shard, which the percentile's
    /// running sum over the values takes together). A shard's rows are replaced when the
    /// shard's view is made anew on a node it arrived on.
    pub fn create_merged_values(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (n, m) in self.value_measures() {
            let values = names::view_values(self.view_id, n);
            let mut columns = self.key_column_ddl();
            columns.extend([
                "__shard text NOT NULL".to_string(),
                format!("v {} NOT NULL", m.value_type().name()),
                "n bigint NOT NULL".to_string(),
            ]);
            out.push(format!(
                "CREATE TABLE {values} (\n    {}\n) WITH (fillfactor = {STORAGE_FILLFACTOR})",
                columns.join(",\n    ")
            ));
            out.push(format!(
                "CREATE UNIQUE INDEX _v{}_m{n}_key ON {values} ({}, v, __shard)",
                self.view_id,
                self.key_list()
            ));
        }
        out
    }

    /// The coordinator's value multisets (`create_merged_values`), qualified.
    pub fn merged_values_tables(&self) -> Vec<String> {
        self.value_measures()
            .map(|(n, _)| names::view_values(self.view_id, n))
            .collect()
    }

    /// `INSERT INTO <storage>` of the partial groups of `groups` merged, one row per group with
    /// a count, of the groups `condition` (on `groups`' columns) keeps.
    fn insert_merged(&self, groups: &str, condition: &str) -> String {
        let mut columns = self.key_columns();
        let mut merged = Vec::new();
        for c in self.merged_changes() {
            merged.push(c.aggregated());
            columns.push(c.name);
        }
        for (n, _) in self.distinct_measures() {
            // Counted from the merged values afterwards (`count_distinct_of`).
            columns.push(format!("m{n}_val"));
            merged.push("0".into());
        }
        let keys = self.key_list();
        format!(
            "INSERT INTO {} ({})\nSELECT {keys}, {}\nFROM {groups}\nWHERE __k{condition}\nGROUP BY {keys}\nHAVING sum(__count) > 0",
            self.data(),
            columns.join(", "),
            merged.join(", ")
        )
    }

    /// Every group merged anew from the partial groups of `groups` (the first fill).
    pub fn merge_all(&self, groups: &str) -> Vec<String> {
        vec![
            format!("DELETE FROM {}", self.data()),
            self.insert_merged(groups, ""),
        ]
    }

    /// The groups `keys` lists (a JSON array of objects with the key columns, as
    /// `apply_changes` gives them; a quoted literal) merged anew from the partial groups
    /// of `groups`.
    pub fn merge_keys(&self, groups: &str, keys: &str) -> Vec<String> {
        let listed = format!(
            "SELECT {} FROM pg_catalog.json_to_recordset({keys}::json) AS t({})",
            self.key_list(),
            self.key_record().join(", ")
        );
        vec![
            format!(
                "DELETE FROM {} d USING ({listed}) t WHERE {}",
                self.data(),
                self.keys_equal("d", "t")
            ),
            self.insert_merged(groups, &format!(" AND ({}) IN ({listed})", self.key_list())),
        ]
    }

    /// The columns a group change carries that merge by themselves: `__count` and the
    /// measures' counters, extremes and sketches (a count_distinct is counted from the merged
    /// values, a percentile read from them).
    fn merged_changes(&self) -> Vec<MergedColumn> {
        let mut columns = vec![MergedColumn::counter("__count".into(), "bigint")];
        for (n, m) in self.numbered_measures() {
            for column in Self::stored_columns(n, m) {
                columns.push(match m.kind {
                    AggKind::Min => MergedColumn::extreme(column, "LEAST", "min", m),
                    AggKind::Max => MergedColumn::extreme(column, "GREATEST", "max", m),
                    AggKind::ApproxPercentile => MergedColumn::sketch(column),
                    AggKind::CountDistinct | AggKind::Percentile => continue,
                    _ if column.ends_with("_n") => MergedColumn::counter(column, "bigint"),
                    _ => MergedColumn::counter(column, "numeric"),
                });
            }
        }
        columns
    }

    /// On a shard's node: the group changes the view's group changelog holds, one per group
    /// (counters added, extremes of the additions combined, `__dirty` when any retracted), and
    /// the value changes of its count_distinct and percentile measures, as a JSON object
    /// `{"changes": [...], "values": [...]}`; the changelog emptied. `shard` (a literal) tags
    /// the value changes. (What a shard answers a coordinator that does not ask for
    /// `take_change_columns`.)
    pub fn take_changes(&self, shard: &str) -> String {
        self.take(shard, "changes", "coalesce(pg_catalog.json_agg(c), '[]')")
    }

    /// `take_changes` with the group changes in columns, as `{"columns": [<the text of an
    /// array of each column's values>, ...], "values": [...]}`: the columns of
    /// `change_column_types`, in its order, each array in the same order of groups. The
    /// coordinator reads them with `apply_change_columns`: typed arrays cost it less to parse
    /// than as many JSON objects, and take less room (see BENCHMARKS.md). The arrays are the
    /// text of their values: the caller fixes the settings that text depends on (`DateStyle`
    /// ISO, `extra_float_digits` 3), so that the coordinator reads back the same values
    /// whatever its own settings.
    pub fn take_change_columns(&self, shard: &str) -> String {
        self.take(shard, "columns", &self.change_column_arrays())
    }

    /// Whether the applies of this view can hand its group changes back
    /// (`apply_handing_back_changes`): a shard's view (`data_table`, writing its group
    /// changes, `feeds_rollups`) without count_distinct and percentile measures, whose value
    /// changes go to its group changelog (`value_changes_written`).
    pub fn hands_back_changes(&self) -> bool {
        self.data_table.is_some()
            && self.feeds_rollups
            && self.value_changes_written().next().is_none()
    }

    /// The group changes an apply hands back (`apply_handing_back_changes`): the columns of
    /// `take_change_columns` over the apply's `d0` (one row per group changed), as a JSON
    /// array. Their text depends on the settings as `take_change_columns`' does.
    pub(super) fn handed_back_changes(&self) -> String {
        format!("(SELECT {} FROM d0 c)::text", self.change_column_arrays())
    }

    /// `to_json(ARRAY[<the text of the array of each column of change_column_types over the
    /// rows c>])`: an aggregate over rows `c` that hold the columns of a group change.
    fn change_column_arrays(&self) -> String {
        let arrays: Vec<String> = self
            .change_column_types()
            .into_iter()
            .map(|(name, type_name)| {
                // An array of arrays of different lengths is no array: each as its text.
                let element = if type_name.ends_with("[]") {
                    format!("c.{name}::text")
                } else {
                    format!("c.{name}")
                };
                format!("coalesce(pg_catalog.array_agg({element})::text, '{{}}')")
            })
            .collect();
        format!("pg_catalog.to_json(ARRAY[{}])", arrays.join(", "))
    }

    /// The statement of `take_changes` and `take_change_columns`: the group changes, one row
    /// per group as `c`, made into the answer's member `member` by `of_rows` (an aggregate over
    /// `c`).
    fn take(&self, shard: &str, member: &str, of_rows: &str) -> String {
        let keys = self.key_list();
        let merged = self.merged_changes();
        let mut columns: Vec<String> = merged
            .iter()
            .map(|c| format!("{} AS {}", c.aggregated(), c.name))
            .collect();
        columns.push("bool_or(__dirty) AS __dirty".into());
        let mut taken: Vec<String> = merged.into_iter().map(|c| c.name).collect();
        taken.push("__dirty".into());
        let mut values = Vec::new();
        for (n, _) in self.value_measures() {
            taken.push(format!("m{n}_vs, m{n}_ns"));
            values.push(format!(
                "SELECT {keys}, {n} AS m, {shard} AS __shard, pg_catalog.to_jsonb(u.v) AS v, sum(u.n)::bigint AS n
      FROM taken CROSS JOIN LATERAL unnest(taken.m{n}_vs, taken.m{n}_ns) AS u(v, n)
      GROUP BY {keys}, u.v HAVING sum(u.n) <> 0"
            ));
        }
        format!(
            "WITH taken AS (DELETE FROM {} RETURNING {keys}, {})
SELECT pg_catalog.json_build_object(
    '{member}', (SELECT {of_rows} FROM (SELECT {keys}, {} FROM taken GROUP BY {keys}) c),
    'values', {})::text",
            self.changes_table(),
            taken.join(", "),
            columns.join(", "),
            Self::json_rows(&values)
        )
    }

    /// How many columns a group change travels in (`change_column_types`).
    pub fn change_column_count(&self) -> usize {
        self.change_column_types().len()
    }

    /// The columns of a group change with their types, in the order `take_change_columns`
    /// answers them: the keys, the columns that merge by themselves (`merged_changes`),
    /// `__dirty`.
    fn change_column_types(&self) -> Vec<(String, String)> {
        let mut columns = self.key_column_types();
        columns.extend(
            self.merged_changes()
                .into_iter()
                .map(|c| (c.name, c.type_name)),
        );
        columns.push(("__dirty".into(), "boolean".into()));
        columns
    }

    /// `(SELECT coalesce(json_agg(x), '[]') FROM (<selects, UNION ALL>) x)`: the rows of
    /// `selects` as a JSON array (`'[]'` without any).
    fn json_rows(selects: &[String]) -> String {
        if selects.is_empty() {
            return "'[]'::json".into();
        }
        format!(
            "(SELECT coalesce(pg_catalog.json_agg(x), '[]') FROM (\n      {}) x)",
            selects.join("\n      UNION ALL\n      ")
        )
    }

    /// On a shard's node, for a view of this node: the values of its count_distinct and
    /// percentile measures as value changes that add them (`{<keys>, "m": <measure>, "__shard": <shard>, "v":
    /// <value>, "n": <events>}` each; `shard` a literal), as a JSON array: how the coordinator
    /// learns a shard's values when the shard's view is made.
    pub fn values_of_shard(&self, shard: &str) -> String {
        let keys = self.key_list();
        let selects: Vec<String> = self
            .value_measures()
            .map(|(n, _)| {
                format!(
                    "SELECT {keys}, {n} AS m, {shard} AS __shard, pg_catalog.to_jsonb(v) AS v, n FROM {} WHERE n <> 0",
                    names::view_values(self.view_id, n)
                )
            })
            .collect();
        format!("SELECT {}::text", Self::json_rows(&selects))
    }

    /// On the coordinator: every value of the shards `$1` (a `text[]` of `__shard` values)
    /// taken out of the merged value multisets, before their views' values come anew.
    pub fn replace_shards_values(&self) -> Vec<String> {
        self.merged_values_tables()
            .into_iter()
            .map(|values| format!("DELETE FROM {values} WHERE __shard = ANY($1::text[])"))
            .collect()
    }

    /// On the coordinator: the value changes `$1` lists (a JSON array, as `take_changes` and
    /// `values_of_shard` give them) added to the merged value multisets; a value's row goes
    /// when its count falls to 0.
    pub fn apply_value_changes(&self) -> Vec<String> {
        let keys = self.key_list();
        let mut record = self.key_record();
        record.extend(["m integer", "__shard text", "v jsonb", "n bigint"].map(String::from));
        let listed = format!(
            "pg_catalog.json_to_recordset($1::json) AS c({})",
            record.join(", ")
        );
        let mut out = Vec::new();
        for ((n, m), values) in self.value_measures().zip(self.merged_values_tables()) {
            // Values travel as JSON: a jsonb value as it is, any other from its text.
            let value = match m.value_type() {
                SqlType::Jsonb => "v".to_string(),
                other => format!("(v #>> '{{}}')::{}", other.name()),
            };
            out.push(format!(
                "INSERT INTO {values} AS t ({keys}, __shard, v, n)
SELECT {keys}, __shard, {value}, sum(n)::bigint FROM {listed} WHERE m = {n}
GROUP BY {keys}, __shard, {value}
ON CONFLICT ({keys}, v, __shard) DO UPDATE SET n = t.n + EXCLUDED.n"
            ));
            out.push(format!(
                "DELETE FROM {values} t USING (SELECT DISTINCT {keys} FROM {listed} WHERE m = {n}) c
WHERE {} AND t.n = 0",
                self.keys_equal("t", "c")
            ));
        }
        out
    }

    /// On the coordinator: each count_distinct measure of the merged groups counted from the
    /// merged values, for the groups `keys` lists (the SQL of a JSON array of objects with
    /// the key columns; others ignored), or every group.
    pub fn count_distinct_of(&self, keys: Option<&str>) -> Vec<String> {
        let data = self.data();
        self.distinct_measures()
            .map(|(n, _)| {
                let count = format!(
                    "(SELECT count(DISTINCT ms.v) FROM {} ms WHERE {} AND ms.n > 0)",
                    names::view_values(self.view_id, n),
                    self.keys_equal("ms", "d")
                );
                match keys {
                    None => format!("UPDATE {data} d SET m{n}_val = {count}"),
                    Some(keys) => format!(
                        "UPDATE {data} d SET m{n}_val = {count}
FROM (SELECT DISTINCT {} FROM pg_catalog.json_to_recordset({keys}) AS c({})) c
WHERE {}",
                        self.key_list(),
                        self.key_record().join(", "),
                        self.keys_equal("d", "c")
                    ),
                }
            })
            .collect()
    }

    /// The key columns with their types, as a record definition (`__k boolean, ...`).
    fn key_record(&self) -> Vec<String> {
        self.key_column_types()
            .into_iter()
            .map(|(name, type_name)| format!("{name} {type_name}"))
            .collect()
    }

    /// On the coordinator: the group changes `changes` lists (`take_changes` of every shard,
    /// one JSON array: the SQL of a `json` value) added to the merged groups; returns the
    /// keys of the groups marked `__dirty` (one took a retraction) as a JSON array's text for
    /// `merge_keys`, which recomputes them from the shards' partial groups (and drops a group
    /// whose count fell to 0, which only a retraction does). One pass over the changes: the
    /// keys come from the rows the statement wrote.
    pub fn apply_changes(&self, changes: &str) -> String {
        let record: Vec<String> = self
            .change_column_types()
            .into_iter()
            .map(|(name, type_name)| format!("{name} {type_name}"))
            .collect();
        let from = format!(
            "pg_catalog.json_to_recordset({changes}) AS c({})",
            record.join(", ")
        );
        format!(
            "{}\nSELECT coalesce(pg_catalog.json_agg(k), '[]')::text FROM (SELECT {} FROM written WHERE __dirty) k",
            self.changes_written_to_merged(&from),
            self.key_list()
        )
    }

    /// `apply_changes` of the group changes `$1` holds in columns (a `text[]`: each column of
    /// `take_change_columns` with the values of every shard that answered so). Returns
    /// `{"dirty": [<keys>], "changed": [<keys>]}`: the keys of the groups marked `__dirty`, and
    /// of every group changed when the view counts distinct values (`count_distinct_of`
    /// counts them anew), else none.
    pub fn apply_change_columns(&self) -> String {
        let columns = self.change_column_types();
        let arrays: Vec<String> = columns
            .iter()
            .enumerate()
            .map(|(i, (_, type_name))| {
                let carried = if type_name.ends_with("[]") {
                    "text"
                } else {
                    type_name
                };
                format!("pg_catalog.unnest(($1)[{}]::{carried}[])", i + 1)
            })
            .collect();
        let names: Vec<&str> = columns.iter().map(|(name, _)| name.as_str()).collect();
        let typed: Vec<String> = columns
            .iter()
            .map(|(name, type_name)| {
                if type_name.ends_with("[]") {
                    format!("u.{name}::{type_name} AS {name}")
                } else {
                    format!("u.{name}")
                }
            })
            .collect();
        let from = format!(
            "(SELECT {} FROM ROWS FROM ({}) AS u({})) c",
            typed.join(", "),
            arrays.join(", "),
            names.join(", ")
        );
        let keys = self.key_list();
        let changed = match self.distinct_measures().next() {
            Some(_) => format!(
                "(SELECT coalesce(pg_catalog.json_agg(k), '[]') FROM (SELECT {keys} FROM written) k)"
            ),
            None => "'[]'::json".into(),
        };
        format!(
            "{}\nSELECT pg_catalog.json_build_object(
    'dirty', (SELECT coalesce(pg_catalog.json_agg(k), '[]') FROM (SELECT {keys} FROM written WHERE __dirty) k),
    'changed', {changed})::text",
            self.changes_written_to_merged(&from)
        )
    }

    /// `WITH written AS (<the group changes of FROM item `from`, one row per change, added to
    /// the merged groups, RETURNING their keys and __dirty>)`.
    fn changes_written_to_merged(&self, from: &str) -> String {
        let merged = self.merged_changes();
        let keys = self.key_list();
        let mut sums: Vec<String> = merged
            .iter()
            .map(|c| format!("{} AS {}", c.aggregated(), c.name))
            .collect();
        sums.push("bool_or(__dirty) AS __dirty".into());
        let mut columns: Vec<String> = merged.iter().map(|c| c.name.clone()).collect();
        columns.push("__dirty".into());
        let mut updates: Vec<String> = merged
            .iter()
            .map(|c| {
                format!(
                    "{} = {}",
                    c.name,
                    c.combine.replace("{old}", "t").replace("{new}", "EXCLUDED")
                )
            })
            .collect();
        updates.push("__dirty = t.__dirty OR EXCLUDED.__dirty".into());
        for (n, _) in self.distinct_measures() {
            // Counted from the merged values afterwards (`count_distinct_of`).
            columns.push(format!("m{n}_val"));
            sums.push("0".into());
        }
        format!(
            "WITH written AS (
INSERT INTO {data} AS t ({keys}, {})
SELECT {keys}, {}
FROM {from}
GROUP BY {keys}
ON CONFLICT ({keys}) DO UPDATE SET {}
RETURNING {keys}, __dirty)",
            columns.join(", "),
            sums.join(", "),
            updates.join(", "),
            data = self.data()
        )
    }

    /// On a shard's node, for the view of a shard: the groups its pending changes touch, each
    /// as it would be after the view's next refresh (the stored partial group with the pending
    /// changes folded in, as this node's realtime read folds them: min/max of a group that
    /// lost values from its multiset, log and pending values), tagged with `shard` (a literal),
    /// and every value of those groups' count_distinct and percentile measures with its count
    /// (the multiset with the pending values added), as the JSON object
    /// `{"groups": [...], "values": [{<keys>, "m": <measure>, "__shard": <shard>, "v": <value>,
    /// "n": <events>}, ...]}`. Read only; its cost grows with the pending changes.
    ///
    /// ```sql
    /// WITH <pending_group_deltas>, lg<n> ...
    /// SELECT json_build_object('groups', (SELECT coalesce(json_agg(x), '[]') FROM (
    ///     SELECT coalesce(s.__k, d0.__k) AS __k, ..., '17'::text AS __shard,
    ///            coalesce(s.__count, 0) + d0.__count AS __count, ...
    ///     FROM d0 LEFT JOIN <groups shard> s USING (__k, bucket, g1, g1_null)) x),
    ///   'values', (SELECT json_agg(x) FROM (<multiset + pending values of each d0 group>) x))
    /// ```
    pub fn pending_partial_groups(&self, shard: &str, bucket_width: Option<&str>) -> String {
        let width = match bucket_width {
            Some(w) => quote::typed_literal(w, "interval"),
            None => "NULL::interval".to_string(),
        };
        let mut ctes = self.pending_group_deltas(&width);
        ctes.extend(self.minmax_measures().map(|(n, _)| self.value_log_read(n)));
        let keys = self.key_columns();
        let mut columns: Vec<String> = keys
            .iter()
            .map(|k| format!("coalesce(s.{k}, d0.{k}) AS {k}"))
            .collect();
        columns.push(format!("{shard}::text AS __shard"));
        columns.push("coalesce(s.__count, 0) + d0.__count AS __count".into());
        for (n, m) in self.numbered_measures() {
            match m.kind {
                AggKind::ApproxPercentile => columns.push(format!(
                    "CASE WHEN d0.m{n}_sk IS NULL THEN s.m{n}_sk WHEN s.m{n}_sk IS NULL THEN d0.m{n}_sk \
                     ELSE eventview._sketch_merge(s.m{n}_sk, d0.m{n}_sk) END AS m{n}_sk"
                )),
                // Counted or read on the coordinator from every shard's values.
                AggKind::CountDistinct | AggKind::Percentile => {}
                _ => columns.extend(self.merged_measure(n, m)),
            }
        }
        // What a read that adds the pending changes onto the coordinator's merged groups takes
        // (`merge_onto_stored`): the deltas of what adds, and the stored extremes.
        for c in self.merged_changes() {
            columns.push(match c.role {
                Merges::Adding | Merges::Sketch => format!("d0.{0} AS delta_{0}", c.name),
                Merges::Extreme => format!("s.{0} AS stored_{0}", c.name),
            });
        }
        let d0_keys: Vec<String> = keys.iter().map(|k| format!("d0.{k}")).collect();
        let values: Vec<String> = self
            .value_measures()
            .map(|(n, _)| {
                format!(
                    "SELECT {}, {n} AS m, {shard}::text AS __shard, pg_catalog.to_jsonb(u.v) AS v, u.n
      FROM d0 CROSS JOIN LATERAL (
          SELECT w.v, sum(w.n)::bigint AS n FROM (
              SELECT ms.v, ms.n FROM {} ms WHERE {}
              UNION ALL
              SELECT p.v, p.s FROM unnest(d0.m{n}_vs, d0.m{n}_signs) AS p(v, s)) w
          GROUP BY w.v HAVING sum(w.n) > 0) u",
                    d0_keys.join(", "),
                    names::view_values(self.view_id, n),
                    self.keys_equal("ms", "d0")
                )
            })
            .collect();
        format!(
            "WITH {}\nSELECT pg_catalog.json_build_object(\n  'shard', {shard}::text,\n  'position', {},\n  'groups', (SELECT coalesce(pg_catalog.json_agg(x), '[]') FROM (\n    SELECT {}\n    FROM d0 LEFT JOIN {} s USING ({})) x),\n  'values', {})::text",
            ctes.join(",\n"),
            Self::shard_view_position(&self.view_id.to_string()),
            columns.join(",\n           "),
            self.data(),
            keys.join(", "),
            Self::json_rows(&values)
        )
    }

    /// On a shard's node: the position of its view `view_id` (SQL of a text; `view_id` SQL of
    /// an integer): the view and the changes applied to it, which change with every apply
    /// that changes its groups. The coordinator keeps each shard's position at every refresh;
    /// a realtime read whose shards are all still at those positions adds their pending
    /// changes onto the merged groups (`merge_onto_stored`).
    pub fn shard_view_position(view_id: &str) -> String {
        format!(
            "(SELECT pg_catalog.concat_ws(' ', v.view_id, v.applied_snapshot, v.applied_own_xid, v.applied_own_seq) FROM eventview._views v WHERE v.view_id = {view_id})"
        )
    }

    /// On the coordinator: the partial groups `groups` (the distributed table) holds of the
    /// groups `keys` lists (the SQL of a JSON array of objects with the key columns; other
    /// members ignored), one JSON object's text per partial group, its `__shard` as the text
    /// `shard_text` makes of it (the tag the shards' answers carry).
    pub fn partial_groups_of(&self, groups: &str, keys: &str, shard_text: &str) -> String {
        let list = self.key_list();
        let merged: Vec<String> = self.merged_changes().into_iter().map(|c| c.name).collect();
        format!(
            "SELECT pg_catalog.row_to_json(x)::text FROM (
    SELECT {list}, {shard_text} AS __shard, {}
    FROM {groups}
    WHERE __k AND ({list}) IN (SELECT {list} FROM pg_catalog.json_to_recordset({keys}::json) AS t({}))) x",
            merged.join(", "),
            self.key_record().join(", ")
        )
    }

    /// On the coordinator: the groups the shards' pending changes touch, merged across shards
    /// as a refresh would merge them: `$1` the shards' pending partial groups
    /// (`pending_partial_groups` of every shard, one JSON array), `$2` the stored partial
    /// groups of those groups (`partial_groups_of`, one JSON array), of which those a shard
    /// answered with its pending changes folded in are left out; `$3` the shards' values of
    /// those groups' count_distinct and percentile measures, with which the coordinator's
    /// value multisets of the other shards count the distinct values and read the
    /// percentiles; `$4` the groups to merge (a JSON array of objects with the key columns),
    /// or NULL for every group `$1` touches. One row per group (a count of 0: the group is
    /// gone), as a JSON array's text.
    pub fn merge_across_shards(&self) -> String {
        let keys = self.key_list();
        let mut record = self.key_record();
        record.push("__shard text".into());
        record.extend(
            self.merged_changes()
                .into_iter()
                .map(|c| format!("{} {}", c.name, c.type_name)),
        );
        let merged = self.merged_changes();
        let columns: Vec<String> = merged.iter().map(|c| c.name.clone()).collect();
        let aggregated: Vec<String> = merged
            .iter()
            .map(|c| format!("{} AS {}", c.aggregated(), c.name))
            .collect();
        let listed = format!(
            "SELECT {keys} FROM pg_catalog.json_to_recordset($4::json) AS o({})",
            self.key_record().join(", ")
        );
        let (value_ctes, value_columns, value_joins) = self.merged_value_parts();
        let mut ctes = vec![format!(
            "p AS MATERIALIZED (SELECT * FROM pg_catalog.json_to_recordset($1::json) AS p({})
    WHERE $4::json IS NULL OR ({keys}) IN ({listed}))",
            self.answer_record().join(", ")
        )];
        ctes.push(self.answered_values());
        ctes.extend(value_ctes);
        format!(
            "WITH {}
SELECT coalesce(pg_catalog.json_agg(y), '[]')::text FROM (
  SELECT {} FROM (
    SELECT {keys}, {} FROM (
        SELECT {keys}, {cols} FROM p
        UNION ALL
        SELECT {keys}, {cols} FROM pg_catalog.json_to_recordset($2::json) AS g({})
        WHERE {}) u
    GROUP BY {keys}) x{value_joins}) y",
            ctes.join(",\n"),
            value_columns.join(", "),
            aggregated.join(", "),
            record.join(", "),
            self.not_answered("g"),
            cols = columns.join(", ")
        )
    }

    /// On the coordinator: the groups the shards' pending changes touch, their pending changes
    /// added onto the merged groups of its storage, when every shard's view is where the last
    /// refresh took the merged groups from: `$1` the shards' pending partial groups (with
    /// their deltas and stored extremes, `pending_partial_groups`), `$2` the position of every
    /// shard's view as the shards answered it (a JSON object, shard to position), `$3` the
    /// shards' values of count_distinct and percentile measures (as `merge_across_shards`
    /// reads them). Counters and sketches add the shards' deltas; an extreme combines with the
    /// answering shards' new extremes, which is exact unless those shards' extremes moved
    /// inwards (a retraction): such a group is listed for `merge_across_shards` instead.
    /// Returns `{"same": <every position as recorded>, "groups": [<merged groups>],
    /// "inexact": [<keys of the groups to merge from every shard>]}` as text; with `same`
    /// false the rest is meaningless.
    ///
    /// ```sql
    /// WITH p ..., pv ..., vals<n> ..., c<n> ...,
    ///   d AS (SELECT <keys>, sum(delta___count) AS __count, max(m3_val) AS m3_val,
    ///                max(stored_m3_val) AS stored_m3_val, ... FROM p GROUP BY <keys>),
    ///   x AS (SELECT d.<keys>, coalesce(s.__count, 0) + d.__count AS __count,
    ///                GREATEST(s.m3_val, d.m3_val) AS m3_val, ...,
    ///                coalesce(d.stored_m3_val IS NULL OR d.m3_val >= d.stored_m3_val, false) AS __exact
    ///         FROM d LEFT JOIN eventview._v<id>_data s ON s.__k AND <keys equal>)
    /// SELECT json_build_object('same', <_distributed_views.shard_positions = $2>,
    ///   'groups', CASE WHEN <same> THEN ... END, 'inexact', CASE WHEN <same> THEN ... END)
    /// ```
    pub fn merge_onto_stored(&self) -> String {
        let keys = self.key_list();
        let merged = self.merged_changes();
        let mut summed: Vec<String> = self.key_columns();
        // A stored group keeps its key's spelling (a key read as 1.0 by one event and 1 by
        // another), as the other reads of the view show it.
        let mut onto: Vec<String> = self
            .key_columns()
            .iter()
            .map(|k| format!("coalesce(s.{k}, d.{k}) AS {k}"))
            .collect();
        let mut exact = Vec::new();
        for c in &merged {
            let name = &c.name;
            match c.role {
                Merges::Adding => {
                    summed.push(format!("sum(delta_{name})::{} AS {name}", c.type_name));
                    onto.push(format!("coalesce(s.{name}, 0) + d.{name} AS {name}"));
                }
                Merges::Sketch => {
                    summed.push(format!(
                        "{}(delta_{name})::{} AS {name}",
                        c.aggregate, c.type_name
                    ));
                    onto.push(format!(
                        "CASE WHEN d.{name} IS NULL THEN s.{name} WHEN s.{name} IS NULL THEN d.{name} \
                         ELSE eventview._sketch_merge(s.{name}, d.{name}) END AS {name}"
                    ));
                }
                Merges::Extreme => {
                    let (combine, inwards) = if c.aggregate == "min" {
                        ("LEAST", "<=")
                    } else {
                        ("GREATEST", ">=")
                    };
                    summed.push(format!(
                        "{}({name})::{} AS {name}",
                        c.aggregate, c.type_name
                    ));
                    summed.push(format!(
                        "{}(stored_{name})::{} AS stored_{name}",
                        c.aggregate, c.type_name
                    ));
                    onto.push(format!("{combine}(s.{name}, d.{name}) AS {name}"));
                    exact.push(format!(
                        "coalesce(d.stored_{name} IS NULL OR d.{name} {inwards} d.stored_{name}, false)"
                    ));
                }
            }
        }
        onto.push(if exact.is_empty() {
            "true AS __exact".into()
        } else {
            format!("{} AS __exact", exact.join(" AND "))
        });
        let mut shown = self.key_columns();
        shown.extend(merged.iter().map(|c| c.name.clone()));
        let shown: Vec<String> = shown.iter().map(|c| format!("x.{c}")).collect();
        let (value_ctes, mut value_columns, value_joins) = self.merged_value_parts();
        value_columns[0] = shown.join(", ");
        let mut ctes = vec![format!(
            "p AS MATERIALIZED (SELECT * FROM pg_catalog.json_to_recordset($1::json) AS p({}))",
            self.answer_record().join(", ")
        )];
        ctes.push(self.answered_values());
        ctes.extend(value_ctes);
        ctes.push(format!(
            "d AS (SELECT {} FROM p GROUP BY {keys})",
            summed.join(", ")
        ));
        ctes.push(format!(
            "x AS MATERIALIZED (SELECT {} FROM d LEFT JOIN {} s ON s.__k AND {})",
            onto.join(", "),
            self.data(),
            self.keys_equal("s", "d")
        ));
        ctes.push(format!(
            "same AS MATERIALIZED (SELECT coalesce((SELECT shard_positions::jsonb FROM eventview._distributed_views WHERE view_id = {}) = $2::jsonb, false) AS same)",
            self.view_id
        ));
        // The merged groups are computed only when the positions are the same.
        format!(
            "WITH {}
SELECT pg_catalog.json_build_object(
  'same', (SELECT same FROM same),
  'groups', CASE WHEN (SELECT same FROM same) THEN (SELECT coalesce(pg_catalog.json_agg(y), '[]') FROM (
    SELECT {} FROM x{value_joins} WHERE x.__exact) y) END,
  'inexact', CASE WHEN (SELECT same FROM same) THEN (SELECT coalesce(pg_catalog.json_agg(k), '[]') FROM (
    SELECT {keys} FROM x WHERE NOT x.__exact) k) END)::text",
            ctes.join(",\n"),
            value_columns.join(", "),
        )
    }

    /// The columns of a shard's pending partial group (`pending_partial_groups`) as the
    /// coordinator reads them: keys, `__shard`, the merged columns as the shard's next refresh
    /// would leave them, the deltas of what adds and the stored extremes.
    fn answer_record(&self) -> Vec<String> {
        let mut record = self.key_record();
        record.push("__shard text".into());
        let merged = self.merged_changes();
        record.extend(merged.iter().map(|c| format!("{} {}", c.name, c.type_name)));
        record.extend(merged.iter().map(|c| match c.role {
            Merges::Adding | Merges::Sketch => format!("delta_{} {}", c.name, c.type_name),
            Merges::Extreme => format!("stored_{} {}", c.name, c.type_name),
        }));
        record
    }

    /// `pv`: the shards' values of the touched groups' count_distinct and percentile measures
    /// (`$3`, one JSON array).
    fn answered_values(&self) -> String {
        let mut value_record = self.key_record();
        value_record.extend(["m integer", "__shard text", "v jsonb", "n bigint"].map(String::from));
        format!(
            "pv AS MATERIALIZED (SELECT * FROM pg_catalog.json_to_recordset($3::json) AS pv({}))",
            value_record.join(", ")
        )
    }

    /// The count_distinct and percentile measures of the groups `p` touches, merged: each
    /// measure's values of those groups, those of the shards that answered a group (`pv`) and
    /// the coordinator's of every other shard, added up per group and value in one pass
    /// (`vals<n>`), then counted or read per group (`c<n>`). Returns the CTEs, the columns
    /// over `x` (the merged groups; the first is `x.*`) and the joins that add them to `x`.
    fn merged_value_parts(&self) -> (Vec<String>, Vec<String>, String) {
        let keys = self.key_list();
        let touched_keys = format!("SELECT DISTINCT {keys} FROM p");
        let mut value_ctes = Vec::new();
        let mut value_columns = vec!["x.*".to_string()];
        let mut value_joins = String::new();
        for ((n, m), multiset) in self.value_measures().zip(self.merged_values_tables()) {
            let value = match m.value_type() {
                SqlType::Jsonb => "pv.v".to_string(),
                other => format!("(pv.v #>> '{{}}')::{}", other.name()),
            };
            let ms_keys = self.key_list_of("ms");
            value_ctes.push(format!(
                "vals{n} AS MATERIALIZED (
    SELECT {keys}, w.v, sum(w.n) AS n FROM (
        SELECT {keys}, {value} AS v, pv.n FROM pv WHERE pv.m = {n}
        UNION ALL
        SELECT {}, ms.v, ms.n FROM {multiset} ms JOIN ({touched_keys}) k ON {}
        WHERE {}) w
    GROUP BY {keys}, w.v HAVING sum(w.n) > 0)",
                ms_keys,
                self.keys_equal("ms", "k"),
                self.not_answered("ms")
            ));
            match m.kind {
                AggKind::CountDistinct => {
                    value_ctes.push(format!(
                        "c{n} AS (SELECT {keys}, count(*)::bigint AS c FROM vals{n} GROUP BY {keys})"
                    ));
                    value_columns.push(format!("coalesce(c{n}.c, 0) AS m{n}_val"));
                    value_joins.push_str(&format!(" LEFT JOIN c{n} USING ({keys})"));
                }
                _ => {
                    // percentile_disc(p): per group, the first value whose running count reaches
                    // ceil(p * total) (at least the first), as `percentile_over` computes it.
                    let p = m.fraction.unwrap_or(0.5);
                    value_ctes.push(format!(
                        "c{n} AS (
    SELECT DISTINCT ON ({keys}) {keys}, o.v FROM (
        SELECT {keys}, v, sum(n) OVER (PARTITION BY {keys} ORDER BY v) AS cum,
               sum(n) OVER (PARTITION BY {keys}) AS total
        FROM vals{n}) o
    WHERE o.cum::float8 >= greatest(ceil({p}::float8 * o.total::float8), 1)
    ORDER BY {keys}, o.v)"
                    ));
                    value_columns.push(format!("c{n}.v AS m{n}_val"));
                    value_joins.push_str(&format!(" LEFT JOIN c{n} USING ({keys})"));
                }
            }
        }
        (value_ctes, value_columns, value_joins)
    }

    /// `(<alias>.__shard, <alias>.<keys>) NOT IN (SELECT __shard, <keys> FROM p)`: the rows of
    /// `alias` whose shard did not answer their group. NOT IN over a small set is a hashed
    /// subplan, one probe per row (a NOT EXISTS is planned as a nested loop on the estimate of
    /// a JSON record set); no key column is ever NULL (NULL keys are a placeholder and a flag).
    fn not_answered(&self, alias: &str) -> String {
        format!(
            "({alias}.__shard, {}) NOT IN (SELECT p.__shard, {} FROM p)",
            self.key_list_of(alias),
            self.key_list_of("p")
        )
    }

    /// The realtime read of a view across shards, on the coordinator: `WITH ... merged`, the
    /// merged groups in the storage's columns, of which the groups the shards' pending changes
    /// touch come merged anew (`eventview._distributed_realtime`: each shard's touched groups
    /// as they would be after its next refresh, with every other shard's partial groups of
    /// them). With nothing pending it is a read of the storage, through its indexes.
    ///
    /// ```sql
    /// WITH t AS MATERIALIZED (SELECT * FROM json_to_recordset(eventview._distributed_realtime(7)) ...),
    /// merged AS (SELECT <stored> FROM eventview._v7_data s WHERE s.__k AND (<keys>) NOT IN (<t>)
    ///            UNION ALL SELECT <touched> FROM t)
    /// ```
    pub(super) fn realtime_across_shards(&self) -> String {
        let mut record = self.key_record();
        let mut stored = self.key_columns();
        let mut touched = self.key_columns();
        for c in self.merged_changes() {
            record.push(format!("{} {}", c.name, c.type_name));
            stored.push(c.name.clone());
            touched.push(c.name);
        }
        for (n, m) in self.value_measures() {
            let name = format!("m{n}_val");
            if m.kind == AggKind::CountDistinct {
                record.push(format!("{name} bigint"));
                stored.push(name.clone());
            } else {
                // A stored group's percentile is read from the merged values, as a stored
                // view's is.
                record.push(format!("{name} {}", m.value_type().name()));
                stored.push(format!("{} AS {name}", self.stored_percentile(n, m, "s")));
            }
            touched.push(name);
        }
        self.stored_groups_with(
            &format!(
                "pg_catalog.json_to_recordset(eventview._distributed_realtime({})::json)",
                self.view_id
            ),
            &record.join(", "),
            &stored.join(", "),
            &format!(
                "({}) NOT IN (SELECT {} FROM t)",
                self.key_list_of("s"),
                self.key_list()
            ),
            &touched.join(", "),
        )
    }

    /// The key columns with their types: `__k`, `bucket`, `g<i>` and `g<i>_null`.
    pub(super) fn key_column_types(&self) -> Vec<(String, String)> {
        let mut columns = vec![("__k".to_string(), "boolean".to_string())];
        if self.def.bucketed {
            columns.push(("bucket".into(), "timestamptz".into()));
        }
        for (i, g) in self.def.group_by.iter().enumerate() {
            columns.push((format!("g{}", i + 1), g.sql_type().name().to_string()));
            columns.push((format!("g{}_null", i + 1), "boolean".into()));
        }
        columns
    }
}

/// A storage column that merges by itself, across shards and across group changes.
struct MergedColumn {
    name: String,
    type_name: String,
    /// The SQL that combines two of its values, `{old}` and `{new}` the two rows.
    combine: String,
    /// The aggregate over a set of its values (the name of an aggregate function).
    aggregate: &'static str,
    role: Merges,
}

/// How a merged column's values combine.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Merges {
    /// Values add (counts, sums): a change is a signed delta.
    Adding,
    /// The least or greatest value wins (min, max): a retraction cannot be undone from the
    /// extremes alone.
    Extreme,
    /// Counts per bucket add (an approx_percentile's sketch).
    Sketch,
}

impl MergedColumn {
    /// A count or a sum: values add.
    fn counter(name: String, type_name: &str) -> MergedColumn {
        MergedColumn {
            combine: format!("{{old}}.{name} + {{new}}.{name}"),
            name,
            type_name: type_name.into(),
            aggregate: "sum",
            role: Merges::Adding,
        }
    }

    /// A min or max: `combine` (LEAST, GREATEST) leaves out a NULL.
    fn extreme(name: String, combine: &str, aggregate: &'static str, m: &Measure) -> MergedColumn {
        MergedColumn {
            combine: format!("{combine}({{old}}.{name}, {{new}}.{name})"),
            name,
            type_name: m.value_type().name().into(),
            aggregate,
            role: Merges::Extreme,
        }
    }

    /// An approx_percentile's sketch: counts per bucket add (NULL holds none).
    fn sketch(name: String) -> MergedColumn {
        MergedColumn {
            combine: format!(
                "CASE WHEN {{new}}.{name} IS NULL THEN {{old}}.{name} WHEN {{old}}.{name} IS NULL THEN {{new}}.{name} \
                 ELSE eventview._sketch_merge({{old}}.{name}, {{new}}.{name}) END"
            ),
            name,
            type_name: "bigint[]".into(),
            aggregate: "eventview._sketch_sum",
            role: Merges::Sketch,
        }
    }

    /// `<aggregate>(<name>)::<type>`.
    fn aggregated(&self) -> String {
        format!("{}({})::{}", self.aggregate, self.name, self.type_name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::{parse_definition, DefinitionInput, NoFields};

    fn def(measures: &str) -> ViewDefinition {
        parse_definition(&DefinitionInput {
            fields: &NoFields,
            group_by: r#"{"sku": "$.sku"}"#,
            measures,
            event_types: None,
            bucketed: true,
            time_zone: None,
            unnest: None,
            filter: None,
            on_type_error: "quarantine",
        })
        .unwrap()
    }

    fn sql(d: &ViewDefinition) -> ViewSql<'_> {
        ViewSql {
            def: d,
            view_id: 7,
            source_id: 0,
            source_scan: "ONLY \"ev\"".into(),
            log_extremes: false,
            feeds_rollups: false,
            bucket_width: None,
            rollup_source: None,
            data_table: None,
            values_in_row: ValuesInRow::No,
        }
    }

    #[test]
    fn merging_adds_counters_and_combines_extremes() {
        let d = def(
            r#"{"n": "count(*)", "q": "sum($.q)", "a": "avg($.q)", "hi": "max($.p)", "lo": "min($.p)"}"#,
        );
        let all = sql(&d).merge_all("eventview._v7_groups").join(";\n");
        assert!(all.starts_with("DELETE FROM eventview._v7_data;\nINSERT INTO eventview._v7_data (__k, bucket, g1, g1_null, __count, m2_n, m2_sum, m3_n, m3_sum, m4_val, m5_val)"));
        assert!(all.contains("SELECT __k, bucket, g1, g1_null, sum(__count)::bigint, sum(m2_n)::bigint, sum(m2_sum)::numeric, sum(m3_n)::bigint, sum(m3_sum)::numeric, max(m4_val)::numeric, min(m5_val)::numeric"), "{all}");
        assert!(all.ends_with("FROM eventview._v7_groups\nWHERE __k\nGROUP BY __k, bucket, g1, g1_null\nHAVING sum(__count) > 0"));
    }

    #[test]
    fn distinct_values_travel_per_shard_and_are_counted_on_the_coordinator() {
        let d = def(r#"{"n": "count(*)", "users": "count_distinct($.user)"}"#);
        let view = sql(&d);
        // A shard's changes carry its value changes, tagged with the shard.
        let take = view.take_changes("'17'");
        assert!(take.starts_with("WITH taken AS (DELETE FROM eventview._v7_changes RETURNING __k, bucket, g1, g1_null, __count, __dirty, m2_vs, m2_ns)"), "{take}");
        assert!(take.contains("SELECT __k, bucket, g1, g1_null, 2 AS m, '17' AS __shard, pg_catalog.to_jsonb(u.v) AS v, sum(u.n)::bigint AS n
      FROM taken CROSS JOIN LATERAL unnest(taken.m2_vs, taken.m2_ns) AS u(v, n)
      GROUP BY __k, bucket, g1, g1_null, u.v HAVING sum(u.n) <> 0"), "{take}");
        // The coordinator adds them up per (group, value, shard), and counts a group's values.
        let apply = view.apply_value_changes();
        assert!(apply[0].starts_with(
            "INSERT INTO eventview._v7_m2 AS t (__k, bucket, g1, g1_null, __shard, v, n)"
        ));
        assert!(apply[0].ends_with(
            "ON CONFLICT (__k, bucket, g1, g1_null, v, __shard) DO UPDATE SET n = t.n + EXCLUDED.n"
        ));
        assert!(apply[1].ends_with("AND t.n = 0"));
        assert_eq!(
            view.count_distinct_of(None),
            ["UPDATE eventview._v7_data d SET m2_val = (SELECT count(DISTINCT ms.v) FROM eventview._v7_m2 ms WHERE ms.__k = d.__k AND ms.bucket = d.bucket AND ms.g1 = d.g1 AND ms.g1_null = d.g1_null AND ms.n > 0)"]
        );
        // Merges and changes leave the count to it.
        assert!(view.apply_changes("$1::json").contains("INSERT INTO eventview._v7_data AS t (__k, bucket, g1, g1_null, __count, __dirty, m2_val)\nSELECT __k, bucket, g1, g1_null, sum(__count)::bigint AS __count, bool_or(__dirty) AS __dirty, 0\n"));
        assert!(view.merge_all("g")[1]
            .contains("SELECT __k, bucket, g1, g1_null, sum(__count)::bigint, 0\n"));
        assert_eq!(
            view.replace_shards_values(),
            ["DELETE FROM eventview._v7_m2 WHERE __shard = ANY($1::text[])"]
        );
    }

    #[test]
    fn percentiles_merge_from_values_and_sketches() {
        let d = def(r#"{"p": "percentile($.q, 0.5)", "a": "approx_percentile($.q, 0.9)"}"#);
        let view = sql(&d);
        // An exact percentile is read from the merged values, kept with their type.
        assert!(view.create_merged_values()[0].contains("v numeric NOT NULL"));
        assert!(view.apply_value_changes()[0].contains("SELECT __k, bucket, g1, g1_null, __shard, (v #>> '{}')::numeric, sum(n)::bigint FROM pg_catalog.json_to_recordset($1::json)"));
        assert!(view.count_distinct_of(None).is_empty());
        // A sketch merges bucket by bucket.
        assert!(view.merge_all("g")[1].contains("eventview._sketch_sum(m2_sk)::bigint[]"));
        assert!(view.apply_changes("$1::json").contains("m2_sk = CASE WHEN EXCLUDED.m2_sk IS NULL THEN t.m2_sk WHEN t.m2_sk IS NULL THEN EXCLUDED.m2_sk ELSE eventview._sketch_merge(t.m2_sk, EXCLUDED.m2_sk) END"));
    }

    #[test]
    fn a_merge_of_keys_recomputes_exactly_the_listed_groups() {
        let d = def(r#"{"n": "count(*)"}"#);
        let keys = quote::literal(
            r#"[{"__k": true, "bucket": "2026-01-01T00:00:00+00:00", "g1": "it's", "g1_null": false}]"#,
        );
        let merge = sql(&d).merge_keys("eventview._v7_groups", &keys);
        let listed = format!("SELECT __k, bucket, g1, g1_null FROM pg_catalog.json_to_recordset({keys}::json) AS t(__k boolean, bucket timestamptz, g1 text, g1_null boolean)");
        assert_eq!(
            merge[0],
            format!("DELETE FROM eventview._v7_data d USING ({listed}) t WHERE d.__k = t.__k AND d.bucket = t.bucket AND d.g1 = t.g1 AND d.g1_null = t.g1_null")
        );
        assert!(merge[1].contains(&format!(
            "WHERE __k AND (__k, bucket, g1, g1_null) IN ({listed})"
        )));
    }

    #[test]
    fn changes_add_counters_and_combine_extremes_of_additions() {
        let d = def(r#"{"n": "count(*)", "q": "sum($.q)", "hi": "max($.p)"}"#);
        let take = sql(&d).take_changes("'17'");
        assert!(take.starts_with("WITH taken AS (DELETE FROM eventview._v7_changes RETURNING __k, bucket, g1, g1_null, __count, m2_n, m2_sum, m3_val, __dirty)"));
        assert!(take.contains("SELECT __k, bucket, g1, g1_null, sum(__count)::bigint AS __count, sum(m2_n)::bigint AS m2_n, sum(m2_sum)::numeric AS m2_sum, max(m3_val)::numeric AS m3_val, bool_or(__dirty) AS __dirty FROM taken GROUP BY __k, bucket, g1, g1_null"), "{take}");
        assert!(take.ends_with("'values', '[]'::json)::text"), "{take}");
        let apply = sql(&d).apply_changes("$1::json");
        assert!(apply.contains("AS c(__k boolean, bucket timestamptz, g1 text, g1_null boolean, __count bigint, m2_n bigint, m2_sum numeric, m3_val numeric, __dirty boolean)"));
        assert!(apply.contains("ON CONFLICT (__k, bucket, g1, g1_null) DO UPDATE SET __count = t.__count + EXCLUDED.__count, m2_n = t.m2_n + EXCLUDED.m2_n, m2_sum = t.m2_sum + EXCLUDED.m2_sum, m3_val = GREATEST(t.m3_val, EXCLUDED.m3_val), __dirty = t.__dirty OR EXCLUDED.__dirty\nRETURNING __k, bucket, g1, g1_null, __dirty)"), "{apply}");
        assert!(
            apply.ends_with("FROM (SELECT __k, bucket, g1, g1_null FROM written WHERE __dirty) k"),
            "{apply}"
        );
    }

    #[test]
    fn a_realtime_read_across_shards_merges_the_touched_groups_anew() {
        let d = def(
            r#"{"n": "count(*)", "q": "sum($.q)", "hi": "max($.p)", "a": "approx_percentile($.p, 0.9)"}"#,
        );
        let view = sql(&d);
        // A shard's touched groups: its stored partial group with the pending changes folded
        // in, a max that lost values from the multiset, tagged with the shard.
        let pending = view.pending_partial_groups("'17'", Some("1 day"));
        assert!(pending.contains("'17'::text AS __shard"), "{pending}");
        assert!(
            pending.contains("coalesce(s.__count, 0) + d0.__count AS __count"),
            "{pending}"
        );
        assert!(pending.contains("CASE WHEN d0.__dirty THEN"), "{pending}");
        assert!(
            pending.contains("eventview._sketch_merge(s.m4_sk, d0.m4_sk) END AS m4_sk"),
            "{pending}"
        );
        assert!(
            pending.contains(
                "FROM d0 LEFT JOIN eventview._v7_data s USING (__k, bucket, g1, g1_null)) x),\n  'values', '[]'::json)::text"
            ),
            "{pending}"
        );
        // The other shards' partial groups of the touched groups, by key.
        let stored = view.partial_groups_of("eventview._v7_groups", "'[]'", "__shard::text");
        assert!(stored.contains("SELECT __k, bucket, g1, g1_null, __shard::text AS __shard, __count, m2_n, m2_sum, m3_val, m4_sk\n    FROM eventview._v7_groups\n    WHERE __k AND (__k, bucket, g1, g1_null) IN (SELECT __k, bucket, g1, g1_null FROM pg_catalog.json_to_recordset('[]'::json)"), "{stored}");
        // Merged as a refresh merges partial groups; a shard's stored partial group gives way
        // to its answer with the pending changes.
        let merge = view.merge_across_shards();
        assert!(merge.contains("WHERE (g.__shard, g.__k, g.bucket, g.g1, g.g1_null) NOT IN (SELECT p.__shard, p.__k, p.bucket, p.g1, p.g1_null FROM p)) u"), "{merge}");
        assert!(merge.contains("sum(__count)::bigint AS __count, sum(m2_n)::bigint AS m2_n, sum(m2_sum)::numeric AS m2_sum, max(m3_val)::numeric AS m3_val, eventview._sketch_sum(m4_sk)::bigint[] AS m4_sk"), "{merge}");
        // The user relation: stored groups no pending change touches, and the touched ones.
        let user = view.create_user_view("\"v\"", Reads::RealtimeAcrossShards);
        assert!(user.contains("pg_catalog.json_to_recordset(eventview._distributed_realtime(7)::json) AS t(__k boolean, bucket timestamptz, g1 text, g1_null boolean, __count bigint, m2_n bigint, m2_sum numeric, m3_val numeric, m4_sk bigint[])"), "{user}");
        assert!(user.contains("WHERE s.__k AND (s.__k, s.bucket, s.g1, s.g1_null) NOT IN (SELECT __k, bucket, g1, g1_null FROM t)"), "{user}");
        assert!(
            user.contains("eventview._sketch_quantile(merged.m4_sk, 0.9::float8) AS \"a\""),
            "{user}"
        );
        assert!(user.ends_with("FROM merged\nWHERE __count > 0"), "{user}");
    }

    #[test]
    fn a_realtime_read_adds_the_shards_pending_changes_onto_the_merged_groups_while_their_views_are_where_the_refresh_left_them(
    ) {
        let d = def(
            r#"{"n": "count(*)", "q": "sum($.q)", "hi": "max($.p)", "lo": "min($.p)", "a": "approx_percentile($.p, 0.9)"}"#,
        );
        let view = sql(&d);
        // A shard answers its position, its deltas and its stored extremes beside the groups as
        // its next refresh would leave them.
        let pending = view.pending_partial_groups("'17'", Some("1 day"));
        assert!(pending.contains("'shard', '17'::text"), "{pending}");
        assert!(pending.contains("'position', (SELECT pg_catalog.concat_ws(' ', v.view_id, v.applied_snapshot, v.applied_own_xid, v.applied_own_seq) FROM eventview._views v WHERE v.view_id = 7)"), "{pending}");
        assert!(pending.contains("d0.__count AS delta___count"), "{pending}");
        assert!(pending.contains("d0.m2_sum AS delta_m2_sum"), "{pending}");
        assert!(pending.contains("s.m3_val AS stored_m3_val"), "{pending}");
        assert!(pending.contains("d0.m5_sk AS delta_m5_sk"), "{pending}");
        let onto = view.merge_onto_stored();
        // Only while every shard's position is the one the last refresh recorded.
        assert!(onto.contains("same AS MATERIALIZED (SELECT coalesce((SELECT shard_positions::jsonb FROM eventview._distributed_views WHERE view_id = 7) = $2::jsonb, false) AS same)"), "{onto}");
        assert!(
            onto.contains("'groups', CASE WHEN (SELECT same FROM same) THEN"),
            "{onto}"
        );
        assert!(
            onto.contains(
                "SELECT coalesce(s.__k, d.__k) AS __k, coalesce(s.bucket, d.bucket) AS bucket"
            ),
            "{onto}"
        );
        // Counters and sketches add the deltas onto the merged groups.
        assert!(
            onto.contains("sum(delta___count)::bigint AS __count"),
            "{onto}"
        );
        assert!(
            onto.contains("coalesce(s.__count, 0) + d.__count AS __count"),
            "{onto}"
        );
        assert!(
            onto.contains("eventview._sketch_sum(delta_m5_sk)::bigint[] AS m5_sk"),
            "{onto}"
        );
        assert!(
            onto.contains("ELSE eventview._sketch_merge(s.m5_sk, d.m5_sk) END AS m5_sk"),
            "{onto}"
        );
        // Extremes combine outwards; a group whose answering shards' extremes moved inwards is
        // left to the merge from every shard's partial groups.
        assert!(
            onto.contains("GREATEST(s.m3_val, d.m3_val) AS m3_val"),
            "{onto}"
        );
        assert!(
            onto.contains("LEAST(s.m4_val, d.m4_val) AS m4_val"),
            "{onto}"
        );
        assert!(onto.contains("coalesce(d.stored_m3_val IS NULL OR d.m3_val >= d.stored_m3_val, false) AND coalesce(d.stored_m4_val IS NULL OR d.m4_val <= d.stored_m4_val, false) AS __exact"), "{onto}");
        assert!(
            onto.contains("FROM d LEFT JOIN eventview._v7_data s ON s.__k AND s.__k = d.__k"),
            "{onto}"
        );
        assert!(
            onto.contains("SELECT __k, bucket, g1, g1_null FROM x WHERE NOT x.__exact"),
            "{onto}"
        );
        // Those groups, merged from every shard's partial groups.
        let merge = view.merge_across_shards();
        assert!(merge.contains("WHERE $4::json IS NULL OR (__k, bucket, g1, g1_null) IN (SELECT __k, bucket, g1, g1_null FROM pg_catalog.json_to_recordset($4::json)"), "{merge}");
    }

    #[test]
    fn a_realtime_read_across_shards_counts_distinct_values_and_percentiles_from_every_shards_values(
    ) {
        let d = def(r#"{"u": "count_distinct($.u)", "p": "percentile($.q, 0.5)"}"#);
        let view = sql(&d);
        // A shard answers every value of the groups it touches: multiset plus pending values.
        let pending = view.pending_partial_groups("'17'", None);
        assert!(pending.contains("SELECT d0.__k, d0.bucket, d0.g1, d0.g1_null, 1 AS m, '17'::text AS __shard, pg_catalog.to_jsonb(u.v) AS v, u.n"), "{pending}");
        assert!(
            pending.contains("SELECT ms.v, ms.n FROM eventview._v7_m2 ms WHERE ms.__k = d0.__k"),
            "{pending}"
        );
        assert!(
            pending.contains("GROUP BY w.v HAVING sum(w.n) > 0) u"),
            "{pending}"
        );
        // The coordinator takes the other shards' values from its multisets, adds them up per
        // group and value in one pass, and counts them or reads the percentile per group.
        let merge = view.merge_across_shards();
        assert!(merge.contains("SELECT ms.__k, ms.bucket, ms.g1, ms.g1_null, ms.v, ms.n FROM eventview._v7_m1 ms JOIN (SELECT DISTINCT __k, bucket, g1, g1_null FROM p) k ON ms.__k = k.__k"), "{merge}");
        assert!(
            merge.contains(
                "WHERE (ms.__shard, ms.__k, ms.bucket, ms.g1, ms.g1_null) NOT IN (SELECT p.__shard, p.__k"
            ),
            "{merge}"
        );
        assert!(
            merge.contains(
                "SELECT __k, bucket, g1, g1_null, pv.v AS v, pv.n FROM pv WHERE pv.m = 1"
            ),
            "{merge}"
        );
        assert!(merge.contains("SELECT __k, bucket, g1, g1_null, (pv.v #>> '{}')::numeric AS v, pv.n FROM pv WHERE pv.m = 2"), "{merge}");
        assert!(merge.contains("c1 AS (SELECT __k, bucket, g1, g1_null, count(*)::bigint AS c FROM vals1 GROUP BY __k, bucket, g1, g1_null)"), "{merge}");
        assert!(
            merge.contains(
                "WHERE o.cum::float8 >= greatest(ceil(0.5::float8 * o.total::float8), 1)"
            ),
            "{merge}"
        );
        assert!(
            merge.contains("SELECT x.*, coalesce(c1.c, 0) AS m1_val, c2.v AS m2_val FROM ("),
            "{merge}"
        );
        assert!(merge.contains(") x LEFT JOIN c1 USING (__k, bucket, g1, g1_null) LEFT JOIN c2 USING (__k, bucket, g1, g1_null)) y"), "{merge}");
        // Stored groups read their percentile from the merged values; touched ones come computed.
        let user = view.create_user_view("\"v\"", Reads::RealtimeAcrossShards);
        assert!(user.contains("AS t(__k boolean, bucket timestamptz, g1 text, g1_null boolean, __count bigint, m1_val bigint, m2_val numeric)"), "{user}");
        assert!(
            user.contains("FROM eventview._v7_m2 ms WHERE ms.__k = s.__k"),
            "{user}"
        );
        assert!(
            user.contains("m1_val AS \"u\",\n       m2_val AS \"p\""),
            "{user}"
        );
    }

    #[test]
    fn partial_groups_have_a_key_for_logical_replication() {
        let d = def(r#"{"n": "count(*)", "q": "sum($.q)", "hi": "max($.p)"}"#);
        let ddl = sql(&d).create_partial_groups("eventview._v7_groups", "bigint");
        assert_eq!(
            ddl[1..],
            [
                "ALTER TABLE eventview._v7_groups ADD COLUMN __shard bigint NOT NULL".to_string(),
                "ALTER TABLE eventview._v7_groups ADD PRIMARY KEY (__shard, __k, bucket, g1, g1_null)".to_string(),
            ]
        );
    }

    #[test]
    fn group_changes_travel_in_typed_columns_and_a_sketch_as_the_text_of_each_value() {
        let d = def(r#"{"n": "count(*)", "hi": "max($.p)", "p90": "approx_percentile($.p, 0.9)"}"#);
        let view = sql(&d);
        let take = view.take_change_columns("'17'");
        assert!(take.contains("'columns', (SELECT pg_catalog.to_json(ARRAY[coalesce(pg_catalog.array_agg(c.__k)::text, '{}'), coalesce(pg_catalog.array_agg(c.bucket)::text, '{}'), coalesce(pg_catalog.array_agg(c.g1)::text, '{}'), coalesce(pg_catalog.array_agg(c.g1_null)::text, '{}'), coalesce(pg_catalog.array_agg(c.__count)::text, '{}'), coalesce(pg_catalog.array_agg(c.m2_val)::text, '{}'), coalesce(pg_catalog.array_agg(c.m3_sk::text)::text, '{}'), coalesce(pg_catalog.array_agg(c.__dirty)::text, '{}')]) FROM (SELECT __k, bucket, g1, g1_null, "), "{take}");
        // The same group changes as `take_changes` takes, in the same statement.
        let objects = view.take_changes("'17'");
        assert_eq!(
            take.split_once("FROM (SELECT").unwrap().1,
            objects.split_once("FROM (SELECT").unwrap().1
        );
        let apply = view.apply_change_columns();
        assert!(apply.contains("FROM (SELECT u.__k, u.bucket, u.g1, u.g1_null, u.__count, u.m2_val, u.m3_sk::bigint[] AS m3_sk, u.__dirty FROM ROWS FROM (pg_catalog.unnest(($1)[1]::boolean[]), pg_catalog.unnest(($1)[2]::timestamptz[]), pg_catalog.unnest(($1)[3]::text[]), pg_catalog.unnest(($1)[4]::boolean[]), pg_catalog.unnest(($1)[5]::bigint[]), pg_catalog.unnest(($1)[6]::numeric[]), pg_catalog.unnest(($1)[7]::text[]), pg_catalog.unnest(($1)[8]::boolean[])) AS u(__k, bucket, g1, g1_null, __count, m2_val, m3_sk, __dirty)) c\nGROUP BY __k, bucket, g1, g1_null"), "{apply}");
        // The same upsert as `apply_changes`'.
        let objects = view.apply_changes("$1::json");
        assert_eq!(
            apply
                .split_once("GROUP BY")
                .unwrap()
                .1
                .split_once("SELECT")
                .unwrap()
                .0,
            objects
                .split_once("GROUP BY")
                .unwrap()
                .1
                .split_once("SELECT")
                .unwrap()
                .0
        );
        assert!(apply.ends_with("'changed', '[]'::json)::text"), "{apply}");
        // A view counting distinct values hears of every group changed.
        let d = def(r#"{"users": "count_distinct($.user)"}"#);
        assert!(sql(&d)
            .apply_change_columns()
            .ends_with("'changed', (SELECT coalesce(pg_catalog.json_agg(k), '[]') FROM (SELECT __k, bucket, g1, g1_null FROM written) k))::text"));
    }

    #[test]
    fn a_shards_apply_hands_its_group_changes_back_unless_it_has_values_to_write() {
        let d = def(r#"{"n": "count(*)", "hi": "max($.p)"}"#);
        let mut shard = sql(&d);
        shard.feeds_rollups = true;
        shard.data_table = Some("eventview._v7_groups_102104".into());
        assert!(shard.hands_back_changes());
        let apply = shard.apply_handing_back_changes();
        assert!(!apply.contains("gc AS ("), "{apply}");
        assert!(apply.ends_with(",\n       (SELECT pg_catalog.to_json(ARRAY[coalesce(pg_catalog.array_agg(c.__k)::text, '{}'), coalesce(pg_catalog.array_agg(c.bucket)::text, '{}'), coalesce(pg_catalog.array_agg(c.g1)::text, '{}'), coalesce(pg_catalog.array_agg(c.g1_null)::text, '{}'), coalesce(pg_catalog.array_agg(c.__count)::text, '{}'), coalesce(pg_catalog.array_agg(c.m2_val)::text, '{}'), coalesce(pg_catalog.array_agg(c.__dirty)::text, '{}')]) FROM d0 c)::text AS changes"), "{apply}");
        // Otherwise the same statement as the apply that writes them.
        let writes = shard.apply(Mode::Delta);
        assert!(writes.contains("gc AS ("), "{writes}");
        let (before, gc_on) = writes.split_once(",\ngc AS (").unwrap();
        let (_, after) = gc_on.split_once("\n),\n").unwrap();
        let (ctes_after, result) = after.split_once("\nSELECT ").unwrap();
        assert_eq!(
            apply,
            format!(
                "{before},\n{ctes_after}\nSELECT {result}{}",
                apply
                    .rsplit_once(",\n       (SELECT pg_catalog.to_json")
                    .map(|(_, r)| format!(",\n       (SELECT pg_catalog.to_json{r}"))
                    .unwrap()
            )
        );
        // Value changes of count_distinct go to the group changelog with the group changes.
        let d = def(r#"{"n": "count(*)", "users": "count_distinct($.user)"}"#);
        let mut shard = sql(&d);
        shard.feeds_rollups = true;
        shard.data_table = Some("eventview._v7_groups_102104".into());
        assert!(!shard.hands_back_changes());
        // A view of this node writes them for its rollups.
        let d = def(r#"{"n": "count(*)"}"#);
        let mut local = sql(&d);
        local.feeds_rollups = true;
        assert!(!local.hands_back_changes());
    }

    #[test]
    fn a_shards_apply_writes_the_value_changes_of_count_distinct_but_not_of_min_and_max() {
        let d = def(r#"{"n": "count(*)", "users": "count_distinct($.user)", "hi": "max($.p)"}"#);
        let mut shard = sql(&d);
        shard.feeds_rollups = true;
        shard.data_table = Some("eventview._v7_groups_102104".into());
        let apply = shard.apply(Mode::Delta);
        assert!(apply.contains("vc2 AS ("), "{apply}");
        assert!(!apply.contains("vc3 AS ("), "{apply}");
        assert!(
            apply.contains("INSERT INTO eventview._v7_changes (__k, bucket, g1, g1_null, __count, m2_vs, m2_ns, m3_val, __dirty)\n    SELECT __k, bucket, g1, g1_null, __count, x2.vs, x2.ns, m3_val, __dirty\n    FROM d0\n    LEFT JOIN (SELECT __k, bucket, g1, g1_null, array_agg(v) AS vs, array_agg(n) AS ns FROM vc2 GROUP BY __k, bucket, g1, g1_null) x2 USING (__k, bucket, g1, g1_null)\n    RETURNING 1"),
            "{apply}"
        );
        // What the coordinator takes of them.
        let take = shard.take_changes("'17'");
        assert!(!take.contains("m3_vs"), "{take}");
        // A view of this node that rollups read writes the value changes of every multiset.
        let mut local = sql(&d);
        local.feeds_rollups = true;
        let apply = local.apply(Mode::Delta);
        assert!(apply.contains("vc3 AS ("), "{apply}");
        assert!(
            apply.contains("INSERT INTO eventview._v7_changes (__k, bucket, g1, g1_null, __count, m2_vs, m2_ns, m3_val, m3_vs, m3_ns, __dirty)"),
            "{apply}"
        );
    }
}
