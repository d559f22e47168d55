//! Dropping an event table with the views that read it, and what `DROP EXTENSION pg_eventview`
//! leaves of the extension's work. Above both event tables and views: views go first, then
//! what captures the tables' changes.

use crate::catalog;
use crate::errors::{EvError, EvResult};
use crate::event_tables;
use crate::pg::roles;
use crate::pg::spi;
use crate::privileges;
use crate::views;
use eventview_core::{envelope_sql, names};
use pgrx::prelude::*;

pub fn drop_event_table(name: &str, cascade: bool) -> EvResult<()> {
    let source = catalog::source_by_name(name)?;
    privileges::require_table_owner(source.relid, "drop")?;
    // Before listing its views: a view or field declaration being added waits, or makes this wait.
    catalog::lock_source(&source, catalog::SourceLock::Drops)?;
    let readers = catalog::views_of_source(source.source_id)?;
    if !readers.is_empty() && !cascade {
        let names = view_names(&readers)?;
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
    // Rollups first: a view that rollups read refuses to be dropped.
    for (_, relid) in readers.into_iter().rev() {
        views::drop_view_by_relid(relid)?;
    }
    views::require_no_dependents(source.relid, "event table")?;
    // The DROP fires eventview._follow_drop, which forgets the table; forgotten here again in
    // case event triggers did not fire (session_replication_role = replica).
    roles::as_caller(|| spi::run_all(&[format!("DROP TABLE {}", source.table_sql)]))?;
    event_tables::forget_source(source.source_id)
}

/// Before `DROP EXTENSION pg_eventview` (the event trigger `eventview_before_drop_extension`).
/// What the extension makes at run time (views, their storage, changelogs, capture functions and
/// the triggers on event tables) is not a member of the extension, so PostgreSQL would leave it
/// behind: capture triggers firing for ever into orphaned changelogs (or failing, once the
/// functions they call are gone), views reading storage nothing refreshes. So it goes first:
/// every view (with what depends on it), then every event table's capture and changelog. The
/// event tables and their rows stay; `register_event_table` in a new installation takes them
/// back.
///
/// Without CASCADE, a view refuses the drop (2BP01, naming the views), and so does an object of
/// a user's own built on a changelog, as dependent objects refuse any DROP ... RESTRICT; event
/// tables do not (they are the user's, and keep their rows). Everything here happens in the DROP
/// EXTENSION's transaction: when it fails, nothing is gone. For a role that may not drop the
/// extension it does nothing, and PostgreSQL refuses the drop as usual. The catalog is not
/// locked first: a lock held on it from the start would make the background worker's refreshes
/// wait for it while holding the storage this drop takes next (a deadlock); an event table or
/// view created by a transaction that commits while the drop runs is left behind.
pub fn before_drop_extension(cascade: bool) -> EvResult<()> {
    let may_drop = spi::one::<bool>(
        "SELECT pg_catalog.pg_has_role(extowner, 'USAGE') FROM pg_catalog.pg_extension
         WHERE extname = 'pg_eventview'",
        &[],
    )?;
    if may_drop != Some(true) {
        return Ok(());
    }
    roles::api_call(|| {
        let views = catalog::all_views()?;
        if !views.is_empty() && !cascade {
            let names = view_names(&views)?;
            return Err(EvError::new(
                PgSqlErrorCode::ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
                "cannot drop extension pg_eventview because incremental views exist",
            )
            .with_detail(format!("Incremental views: {names}."))
            .with_hint("Drop them with eventview.drop_view, or run DROP EXTENSION pg_eventview CASCADE, which drops them and what depends on them; event tables and their rows stay either way."));
        }
        // Rollups first: a view that rollups read refuses to be dropped.
        for (view_id, relid) in views.into_iter().rev() {
            views::drop_view_and_dependents(view_id, relid)?;
        }
        for source_id in catalog::all_source_ids()? {
            if !cascade {
                let changelog =
                    crate::relation::extension_relid(&names::changelog_table(source_id));
                if changelog != pg_sys::InvalidOid {
                    views::require_no_dependents(changelog, "changelog")?;
                }
            }
            crate::pg::node_local::run_all(&envelope_sql::drop_capture(
                source_id,
                catalog::has_key_table(source_id),
            ))?;
        }
        Ok(())
    })
}

/// The names of views given as (view_id, relid), as an error's detail lists them.
fn view_names(views: &[(i32, pg_sys::Oid)]) -> EvResult<String> {
    Ok(views
        .iter()
        .map(|(_, relid)| crate::relation::regclass_text(*relid))
        .collect::<EvResult<Vec<_>>>()?
        .join(", "))
}
