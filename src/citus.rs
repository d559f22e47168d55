//! Citus (API.md section 10): whether it is installed, which tables it manages, and what
//! pg_eventview refuses about them.
//!
//! Event tables distributed by Citus are not supported yet: `create_event_table(distribute_by)`
//! and `register_event_table` of a table Citus manages refuse with 0A000, so no table gets a
//! capture on the coordinator's table that the writes Citus sends to its shards never fire
//! (docs/reference.md, "Citus").

use crate::errors::{EvError, EvResult};
use crate::pg::spi;
use crate::relation;
use eventview_core::{envelope_sql, quote};
use pgrx::prelude::*;

/// Whether the Citus extension is installed in this database.
pub fn installed() -> EvResult<bool> {
    Ok(spi::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')",
        &[],
    )?
    .unwrap_or(false))
}

/// Whether Citus manages `relid`: a distributed, reference or Citus local table, whose rows
/// live in shards that capture on the table itself never sees.
pub fn manages(relid: pg_sys::Oid) -> EvResult<bool> {
    if !installed()? {
        return Ok(false);
    }
    Ok(spi::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1)",
        &[relid.into()],
    )?
    .unwrap_or(false))
}

/// Why `create_event_table(..., distribute_by)` refuses: 22023 for what is not a distribution
/// column of the envelope, then 0A000, naming what is missing: Citus itself, or support for
/// distributed event tables in this version.
pub fn distribution_refused(distribute_by: &str) -> EvResult<EvError> {
    // One column name, folded as PostgreSQL folds it.
    let column = match quote::split_name(distribute_by).as_deref() {
        Some([column]) => column.clone(),
        _ => {
            return Ok(EvError::invalid(format!(
                "invalid distribute_by \"{distribute_by}\": it is not one column name"
            ))
            .with_hint("Name one envelope column, such as event_id."))
        }
    };
    if envelope_sql::distribution_column(&column).is_none() {
        return Ok(EvError::invalid(format!(
            "invalid distribute_by: column \"{column}\" is not an envelope column an event table can be distributed by"
        ))
        .with_hint("Name one of event_id, event_key, event_type, event_version, producer, occurred_at or ingested_at."));
    }
    if !installed()? {
        return Ok(EvError::new(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            "distribute_by needs the Citus extension, which is not installed in this database",
        )
        .with_hint("Leave distribute_by out for an event table on this node."));
    }
    Ok(EvError::new(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        "event tables distributed by Citus are not supported by this version of pg_eventview",
    )
    .with_hint("Leave distribute_by out for an event table on the coordinator."))
}

/// `register_event_table` of a table Citus manages: 0A000.
pub fn refuse_managed(relid: pg_sys::Oid) -> EvResult<()> {
    if !manages(relid)? {
        return Ok(());
    }
    Err(EvError::new(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        format!(
            "cannot register {}: it is a Citus table, and event tables distributed by Citus are not supported by this version of pg_eventview",
            relation::regclass_text(relid)?
        ),
    )
    .with_hint("Register a table on this node that Citus does not manage (undistribute_table makes one of it)."))
}
