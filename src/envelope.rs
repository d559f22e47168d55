//! Event tables: creating one (envelope DDL, changelog, capture triggers) and dropping it.

use crate::catalog;
use crate::core::envelope_sql;
use crate::errors::{EvError, EvResult};
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
    spi_util::run_all(&[envelope_sql::create_event_table(&quoted)])?;
    let relid = relation::resolve(name)?;
    let source_id = catalog::insert_source(relid, retention, delta_retention)?;
    let table_sql = relation::qualified(relid)?;
    spi_util::run_all(&envelope_sql::create_changelog(source_id))?;
    spi_util::run_all(&envelope_sql::create_capture(source_id, &table_sql))?;
    Ok(relid)
}

pub fn drop_event_table(name: &str, cascade: bool) -> EvResult<()> {
    let source = catalog::source_by_name(name)?;
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
    spi_util::run_all(&[format!("DROP TABLE {}", source.table_sql)])?;
    catalog::delete_source(source.source_id)
}

pub fn regclass_text(relid: pg_sys::Oid) -> EvResult<String> {
    Ok(spi_util::one::<String>("SELECT $1::regclass::text", &[relid.into()])?.unwrap_or_default())
}
