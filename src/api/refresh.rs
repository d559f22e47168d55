//! Refresh and rebuild of views, and the helpers their generated statements call.

use super::{at_boundary, required};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

#[pg_extern(name = "_refresh", volatile, parallel_unsafe)]
fn refresh_view(name: &str) -> Result<i64, ErrorReport> {
    at_boundary(|| {
        crate::citus::or_distributed(
            crate::refresh::refresh(name),
            || crate::citus::distributed_view_named(name),
            crate::citus::refresh,
        )
    })
}

/// `run_maintenance`'s refresh of a scheduled view: NULL, skipped, while its event table is
/// locked by another session (see `refresh::refresh_unless_locked`).
#[pg_extern(name = "_refresh_unless_locked", volatile, parallel_unsafe)]
fn refresh_view_unless_locked(name: &str) -> Result<Option<i64>, ErrorReport> {
    at_boundary(|| crate::refresh::refresh_unless_locked(name))
}

/// Declared by the install scripts of releases up to 0.6.0, whose `refresh_all` called it; not
/// in the current SQL (`sql = false`). The symbol lets a database at such a version load this
/// library until `ALTER EXTENSION pg_eventview UPDATE`, and says so when called.
/// (The Rust name gives the C symbol, `<name>_wrapper`, those install scripts name.)
#[pg_extern(name = "_refresh_all", volatile, parallel_unsafe, sql = false)]
fn refresh_all() -> Result<i64, ErrorReport> {
    Err(super::needs_update("eventview._refresh_all()"))
}

#[pg_extern(name = "_rebuild", volatile, parallel_unsafe)]
fn rebuild(
    name: Option<&str>,
    from_time: Option<TimestampWithTimeZone>,
    to_time: Option<TimestampWithTimeZone>,
) -> Result<i64, ErrorReport> {
    at_boundary(|| {
        let name = required(name, "name")?;
        crate::citus::or_distributed(
            crate::refresh::rebuild(name, from_time, to_time),
            || crate::citus::distributed_view_named(name),
            |view| crate::citus::rebuild(view, from_time.is_some() || to_time.is_some()),
        )
    })
}

/// The runs of consecutive ids among `ids`, as (lo, hi) with a chunk number, for reading a
/// batch's changed rows by index range scans (see `eventview_core::batch::touched_rows` and `id_runs`).
#[pg_extern(name = "_id_runs", immutable, strict, parallel_safe)]
fn id_runs(
    ids: Vec<Option<i64>>,
) -> TableIterator<'static, (name!(lo, i64), name!(hi, i64), name!(chunk, i32))> {
    let mut ids: Vec<i64> = ids.into_iter().flatten().collect();
    TableIterator::new(eventview_core::batch::id_runs(&mut ids))
}

/// Counts one event read by a full recomputation and reports progress (see `progress`).
#[pg_extern(name = "_progress_tick", volatile, parallel_unsafe)]
fn progress_tick() -> bool {
    crate::progress::tick()
}
