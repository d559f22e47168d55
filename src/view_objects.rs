//! A catalogued view's generated SQL and the objects beside its storage that follow the catalog:
//! the min/max value logs, the read index and the relation users read. Used by view creation, refresh, rebuild,
//! `alter_view` and logical field declarations alike.

use crate::catalog::{self, ViewRecord};
use crate::errors::EvResult;
use crate::gucs;
use crate::pg::roles;
use crate::pg::spi;
use crate::privileges;
use crate::relation;
use eventview_core::sqlgen::{Reads, ValuesInRow, ViewSql};
use pgrx::pg_sys;

/// The SQL generator of a catalogued view.
pub fn sql_of(view: &ViewRecord) -> ViewSql<'_> {
    ViewSql {
        def: &view.definition,
        view_id: view.view_id,
        source_id: view.source.source_id,
        source_scan: view.source.scan_sql.clone(),
        log_extremes: !view.realtime && gucs::extreme_log_limit() > 0,
        feeds_rollups: view.feeds_rollups,
        bucket_width: view.bucket_width.clone(),
        rollup_source: view.source_view.as_deref().map(|s| Box::new(sql_of(s))),
        data_table: view.data_table.clone(),
        values_in_row: values_in_row(
            view.data_table.is_some() || view.source_view.is_some(),
            view.realtime || view.feeds_rollups,
        ),
    }
}

/// Where a view of this node keeps a small group's min/max values (`ValuesInRow`): a shard's
/// view and a rollup never in the row; a realtime view and a view rollups read have the columns
/// (NULL: their readers take values from the multisets); any other view keeps them there.
pub fn values_in_row(shard_or_rollup: bool, read_from_multisets: bool) -> ValuesInRow {
    if shard_or_rollup {
        ValuesInRow::No
    } else if read_from_multisets {
        ValuesInRow::Columns
    } else {
        ValuesInRow::Kept
    }
}

/// Moves every group's min/max values in the row into the view's multisets (`ViewSql::
/// spill_values_in_row`), as the view's owner: before the view turns realtime or a rollup
/// starts reading it, which read values from the multisets. Gives the storage the columns
/// first when it was made by an earlier release. The caller holds the view's row lock.
pub fn spill_values_in_row(view: &ViewRecord) -> EvResult<()> {
    let sql = sql_of(view);
    value_array_columns(view, &sql)?;
    roles::as_role(view.owner, || spi::run_all(&sql.spill_values_in_row(false)))
}

/// The view's storage table, qualified.
pub fn storage_of(view: &ViewRecord) -> String {
    view.data_table
        .clone()
        .unwrap_or_else(|| eventview_core::names::view_data(view.view_id))
}

/// Creates the objects beside the view's storage that do not exist, as the extension owner,
/// for the view's owner: value logs and the read index (storage restored from a dump of, or
/// made by, a version without them), and sketch columns (`sketches_into_storage`). A view that
/// gets its read index or a sketch column here also gets its user relation reinstalled, in the
/// form that reads them. When nothing is missing, the catalog caches say so for the
/// extension's own storage (one catalog query with sketches), a catalog query or two for a
/// Citus shard's. Returns whether it reinstalled the user relation.
pub fn create_missing_objects(view: &ViewRecord, sql: &ViewSql) -> EvResult<bool> {
    // First: the user relation reinstalled below reads them (a realtime view's).
    value_array_columns(view, sql)?;
    let migrated = sketches_into_storage(view, sql)?;
    Ok(logs_and_read_index(view, sql)? || migrated)
}

/// The columns of min/max values in the row (`ViewSql::add_value_array_columns`) that the
/// storage lacks (made by an earlier release, or restored from its dump), added as the view's
/// owner: NULL in every row, the values being in the multisets.
fn value_array_columns(view: &ViewRecord, sql: &ViewSql) -> EvResult<()> {
    let columns: Vec<String> = sql
        .value_array_columns()
        .into_iter()
        .map(|(_, c)| c)
        .collect();
    if columns.is_empty() {
        return Ok(());
    }
    let missing = match own_relation(&storage_of(view)) {
        Some(storage) => Some(
            storage == pg_sys::InvalidOid
                || !columns
                    .iter()
                    .all(|c| crate::pg::relcache::has_column(storage, c)),
        ),
        None => spi::one::<bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.unnest($1::text[]) c
                            WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                                              WHERE a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($2)
                                                AND a.attname OPERATOR(pg_catalog.=) c
                                                AND NOT a.attisdropped))",
            &[columns.into(), storage_of(view).into()],
        )?,
    };
    match (missing, sql.add_value_array_columns()) {
        (Some(true), Some(ddl)) => roles::as_role(view.owner, || spi::run_all(&[ddl])),
        _ => Ok(()),
    }
}

/// The relation `name` names when it is one of the extension's own (`eventview.<table>`, the
/// table a plain lower-case name), from the catalog caches (InvalidOid when it does not exist):
/// every refresh checks the objects beside its storage. None for any other name (a Citus
/// shard's storage), which the caller looks up with a catalog query.
fn own_relation(name: &str) -> Option<pg_sys::Oid> {
    let table = name
        .strip_prefix(eventview_core::names::SCHEMA)?
        .strip_prefix('.')?;
    let plain = table
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    plain.then(|| crate::pg::relcache::relid_in_schema(eventview_core::names::SCHEMA, table))
}

/// The value logs and the read index of `create_missing_objects`.
fn logs_and_read_index(view: &ViewRecord, sql: &ViewSql) -> EvResult<bool> {
    let logs = sql.log_ddl();
    let read_index = sql.create_read_index();
    if logs.is_empty() && read_index.is_none() {
        return Ok(false);
    }
    let mut names: Vec<String> = logs.iter().map(|(name, _)| name.clone()).collect();
    let read_index_name = format!("eventview.{}", sql.read_index_name());
    if read_index.is_some() {
        names.push(read_index_name.clone());
    }
    let own: Option<Vec<pg_sys::Oid>> = names.iter().map(|name| own_relation(name)).collect();
    let missing: Vec<String> = match own {
        Some(relids) => names
            .iter()
            .zip(relids)
            .filter(|(_, relid)| *relid == pg_sys::InvalidOid)
            .map(|(name, _)| name.clone())
            .collect(),
        None => spi::one::<Vec<String>>(
            "SELECT coalesce(array_agg(t), '{}') FROM unnest($1::text[]) t WHERE pg_catalog.to_regclass(t) IS NULL",
            &[names.into()],
        )?
        .unwrap_or_default(),
    };
    if missing.is_empty() {
        return Ok(false);
    }
    let owner = privileges::role_ident(view.owner)?;
    for (name, ddl) in logs.into_iter().filter(|(name, _)| missing.contains(name)) {
        let [own, private] = eventview_core::sqlgen::storage_grants(&name, &owner);
        spi::run_all(&[ddl, own, private])?;
    }
    if let Some(ddl) = read_index.filter(|_| missing.contains(&read_index_name)) {
        spi::run_all(&[ddl])?;
        replace_user_view(view, sql)?;
        return Ok(true);
    }
    Ok(false)
}

/// The sketch of each approx_percentile measure as a storage column: a view made (or restored
/// from a dump made) when sketches were kept as a value multiset gets the column, filled from the
/// multiset, then its user relation reinstalled, then the multiset dropped. Under the view's row
/// lock (a refresh, a field declaration and a rollup's creation may all come here first), as the
/// view's owner (whose tables they are: nothing the owner attached to them runs with more
/// rights). One catalog lookup when nothing is missing. Returns whether it reinstalled the user
/// relation.
fn sketches_into_storage(view: &ViewRecord, sql: &ViewSql) -> EvResult<bool> {
    let measures: Vec<i32> = sql.sketch_measures().iter().map(|&n| n as i32).collect();
    if measures.is_empty() || missing_sketch_columns(view, &measures)?.is_empty() {
        return Ok(false);
    }
    catalog::lock_view_id(view.relid)?;
    let missing = missing_sketch_columns(view, &measures)?;
    if missing.is_empty() {
        return Ok(false);
    }
    roles::as_role(view.owner, || {
        for &n in &missing {
            spi::run_all(&sql.sketch_column_from_multiset(n as usize))?;
        }
        Ok(())
    })?;
    replace_user_view(view, sql)?;
    let drops: Vec<String> = missing
        .iter()
        .map(|&n| {
            format!(
                "DROP TABLE IF EXISTS {} CASCADE",
                eventview_core::names::view_values(view.view_id, n as usize)
            )
        })
        .collect();
    roles::as_role(view.owner, || spi::run_all(&drops))?;
    Ok(true)
}

/// The approx_percentile measures among `measures` whose sketch column the storage lacks.
fn missing_sketch_columns(view: &ViewRecord, measures: &[i32]) -> EvResult<Vec<i32>> {
    Ok(spi::one::<Vec<i32>>(
        "SELECT coalesce(array_agg(n ORDER BY n), '{}') FROM unnest($1::int[]) n
         WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                           WHERE a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($2)
                             AND a.attname OPERATOR(pg_catalog.=) pg_catalog.format('m%s_sk', n)
                             AND NOT a.attisdropped)",
        &[measures.to_vec().into(), storage_of(view).into()],
    )?
    .unwrap_or_default())
}

/// Moves the view's min/max value logs into its multisets (see `eventview_core::sqlgen`). The caller
/// holds the view's row lock.
pub fn merge_logs(view: &ViewRecord) -> EvResult<()> {
    roles::as_role(view.owner, || spi::run_all(&sql_of(view).merge_logs()))
}

/// (Re)creates the relation users read as the catalog says the view reads: the stored groups,
/// or realtime (stored groups with the pending changes folded in). CREATE OR REPLACE keeps its
/// oid, grants and dependents. Called when the view is created, when `realtime` changes and
/// when a logical field it reads is redeclared (the relation's columns take the field's type;
/// the pending groups of a realtime read are computed with the declarations of the moment, as
/// a refresh's are).
pub fn install_user_view(view: &ViewRecord) -> EvResult<()> {
    let sql = sql_of(view);
    // A realtime read reads the value logs.
    if create_missing_objects(view, &sql)? {
        return Ok(());
    }
    replace_user_view(view, &sql)
}

/// CREATE OR REPLACE VIEW of the user relation, as the catalog says the view reads.
fn replace_user_view(view: &ViewRecord, sql: &ViewSql) -> EvResult<()> {
    let (realtime, _) = catalog::view_reads(view.view_id)?;
    let reads = if realtime {
        Reads::Realtime
    } else {
        Reads::Stored
    };
    let statement = sql.replace_user_view(&relation::qualified(view.relid)?, reads);
    // Over this node's storage: Citus would make it on this node only anyway, with a WARNING
    // that asks to distribute that storage.
    crate::pg::node_local::on_this_node_only(|| {
        roles::as_role(view.owner, || spi::run_all(&[statement]))
    })
}
