//! Event tables: creating one (envelope DDL, changelog, capture triggers) and dropping it.

use crate::catalog;
use crate::core::{envelope_sql, names};
use crate::errors::{EvError, EvResult};
use crate::privileges;
use crate::relation;
use crate::spi_util;
use crate::views;
use pgrx::datum::Interval;
use pgrx::prelude::*;

pub fn create_event_table(
    name: &str,
    retention: Option<Interval>,
    delta_retention: Option<Interval>,
) -> EvResult<pg_sys::Oid> {
    for (arg, value) in [("retention", &retention), ("delta_retention", &delta_retention)] {
        if let Some(v) = value {
            let positive = spi_util::one::<bool>("SELECT $1 > interval '0'", &[(*v).into()])?;
            if positive != Some(true) {
                return Err(EvError::invalid(format!("invalid {arg}: it must be a positive interval")));
            }
        }
    }
    let quoted = relation::quoted_for_create(name)?;
    // The table is the caller's: created in their name, with their rights on the schema.
    privileges::as_caller(|| spi_util::run_all(&[envelope_sql::create_event_table(&quoted)]))?;
    let relid = relation::resolve(name)?;
    let source_id = catalog::insert_source(relid, retention, delta_retention)?;
    let table_sql = relation::qualified(relid)?;
    // The changelog and the capture functions belong to the extension owner: producers and
    // readers never write it; the table's owner may read and prune it.
    spi_util::run_all(&envelope_sql::create_changelog(source_id))?;
    let owner = privileges::role_ident(privileges::table_owner(relid)?)?;
    spi_util::run_all(&[format!("GRANT SELECT, DELETE ON {} TO {owner}", names::changelog(source_id))])?;
    spi_util::run_all(&envelope_sql::create_capture(source_id, &table_sql))?;
    Ok(relid)
}

pub fn drop_event_table(name: &str, cascade: bool) -> EvResult<()> {
    let source = catalog::source_by_name(name)?;
    privileges::require_table_owner(source.relid, "drop")?;
    let readers = catalog::views_of_source(source.source_id)?;
    if !readers.is_empty() && !cascade {
        let names = readers
            .iter()
            .map(|(_, relid)| regclass_text(*relid))
            .collect::<EvResult<Vec<_>>>()?
            .join(", ");
        return Err(EvError::new(
            PgSqlErrorCode::ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
            format!("cannot drop event table \"{name}\" because views read it"),
        )
        .with_detail(format!("Views reading it: {names}."))
        .with_hint("Drop the views first, or call drop_event_table with cascade => true."));
    }
    for (_, relid) in readers {
        views::drop_view_by_relid(relid)?;
    }
    // What was recorded about the table goes with it (its regclass would dangle otherwise).
    spi_util::run(
        "WITH s AS (SELECT relid FROM eventview._sources WHERE source_id = $1),
              d AS (DELETE FROM eventview.drift WHERE source = (SELECT relid FROM s) RETURNING 1)
         DELETE FROM eventview.quarantine WHERE source = (SELECT relid FROM s)",
        &[source.source_id.into()],
    )?;
    spi_util::run_all(&envelope_sql::drop_capture(source.source_id))?;
    privileges::as_caller(|| spi_util::run_all(&[format!("DROP TABLE {}", source.table_sql)]))?;
    catalog::delete_source(source.source_id)
}

thread_local! {
    static CAPTURES_CHECKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Event tables created before 0.2.0 have a delete capture that any session could switch off
/// with `eventview.pruning`. An extension script may not replace functions the extension does
/// not own (capture functions are run-time objects), so the first API call of each backend
/// after the update replaces the old ones (as the extension owner; one catalog query when
/// there is nothing to do).
pub fn upgrade_captures() -> EvResult<()> {
    if CAPTURES_CHECKED.get() {
        return Ok(());
    }
    let stale: Vec<i32> = Spi::connect(|client| {
        let mut out = Vec::new();
        for row in client.select(
            "SELECT s.source_id FROM eventview._sources s
             JOIN pg_catalog.pg_proc p
               ON p.oid = pg_catalog.to_regprocedure(pg_catalog.format('eventview._capture_%s_delete()', s.source_id))
             WHERE pg_catalog.strpos(p.prosrc, $1) = 0",
            None,
            &[envelope_sql::CURRENT_DELETE_CAPTURE_MARK.into()],
        )? {
            if let Some(id) = row.get::<i32>(1)? {
                out.push(id);
            }
        }
        Ok::<_, pgrx::spi::SpiError>(out)
    })?;
    for source_id in stale {
        spi_util::run_all(&[envelope_sql::replace_delete_capture(source_id)])?;
    }
    CAPTURES_CHECKED.set(true);
    Ok(())
}

pub fn regclass_text(relid: pg_sys::Oid) -> EvResult<String> {
    Ok(spi_util::one::<String>("SELECT $1::regclass::text", &[relid.into()])?.unwrap_or_default())
}
