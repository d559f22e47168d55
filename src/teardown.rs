//! Dropping an event table with the views that read it. Above both event tables and views: its
//! views go first (with `cascade`), then the table, then what was recorded about it.

use crate::catalog;
use crate::errors::{EvError, EvResult};
use crate::event_tables;
use crate::pg::roles;
use crate::pg::spi;
use crate::privileges;
use crate::views;
use pgrx::prelude::*;

pub fn drop_event_table(name: &str, cascade: bool) -> EvResult<()> {
    let source = catalog::source_by_name(name)?;
    privileges::require_table_owner(source.relid, "drop")?;
    // Before listing its views: a view or field declaration being added waits, or makes this wait.
    catalog::lock_source(&source, catalog::SourceLock::Drops)?;
    let readers = catalog::views_of_source(source.source_id)?;
    if !readers.is_empty() && !cascade {
        let names = readers
            .iter()
            .map(|(_, relid)| crate::relation::regclass_text(*relid))
            .collect::<EvResult<Vec<_>>>()?
            .join(", ");
        return Err(EvError::new(
            PgSqlErrorCode::ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
            format!(
                "cannot drop event table {} because views read it",
                crate::relation::regclass_text(source.relid)?
            ),
        )
        .with_detail(format!("Views reading it: {names}."))
        .with_hint("Drop the views first, or call drop_event_table with cascade => true."));
    }
    for (_, relid) in readers {
        views::drop_view_by_relid(relid)?;
    }
    views::require_no_dependents(source.relid, "event table")?;
    // The DROP fires eventview._follow_drop, which forgets the table; forgotten here again in
    // case event triggers did not fire (session_replication_role = replica).
    roles::as_caller(|| spi::run_all(&[format!("DROP TABLE {}", source.table_sql)]))?;
    event_tables::forget_source(source.source_id)
}
