//! Incremental views: create, drop, alter, and what the catalog view `eventview.views` shows.

use super::{at_boundary, lookup, required};
use crate::errors::{EvError, EvResult};
use pgrx::datum::Interval;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

#[allow(clippy::too_many_arguments)]
#[pg_extern(name = "_create_view", volatile, parallel_unsafe)]
fn create_view(
    name: Option<&str>,
    source: Option<&str>,
    group_by: &str,
    measures: &str,
    event_types: Option<Array<'_, String>>,
    time_bucket: Option<Interval>,
    filter: Option<&str>,
    realtime: bool,
    on_type_error: &str,
    time_zone: Option<&str>,
    unnest: Option<&str>,
) -> Result<pg_sys::Oid, ErrorReport> {
    at_boundary(|| {
        crate::views::create_view(crate::views::CreateViewArgs {
            name: required(name, "name")?,
            source: required(source, "source")?,
            group_by,
            measures,
            event_types: event_type_list(event_types)?,
            time_bucket,
            filter,
            realtime,
            on_type_error,
            time_zone,
            unnest,
            data_table: None,
        })
    })
}

/// The elements of `event_types`, a one-dimensional array (22023 otherwise): PostgreSQL takes
/// `'{{a,b},{c,d}}'` for a `text[]` too, whose elements a list would take as four types.
fn event_type_list(
    event_types: Option<Array<'_, String>>,
) -> EvResult<Option<Vec<Option<String>>>> {
    let Some(array) = event_types else {
        return Ok(None);
    };
    let list: Vec<Option<String>> = array.iter().collect();
    // SAFETY: `into_array_type` gives the detoasted array the argument points to, whose header
    // holds its number of dimensions.
    let dimensions = unsafe { (*array.into_array_type()).ndim };
    if dimensions > 1 {
        return Err(EvError::invalid(format!(
            "invalid event_types: the array has {dimensions} dimensions"
        ))
        .with_hint("Pass a one-dimensional array of event type names, such as ARRAY['order_placed', 'order_paid']."));
    }
    Ok(Some(list))
}

#[pg_extern(name = "_drop_view", volatile, parallel_unsafe)]
fn drop_view(name: &str) -> Result<(), ErrorReport> {
    at_boundary(|| {
        crate::citus::or_distributed(
            crate::views::drop_view(name),
            || crate::citus::distributed_view_named(name),
            crate::citus::drop_view,
        )
    })
}

#[pg_extern(name = "_alter_view", volatile, parallel_unsafe)]
fn alter_view(
    name: Option<&str>,
    realtime: Option<bool>,
    on_type_error: Option<&str>,
) -> Result<(), ErrorReport> {
    at_boundary(|| {
        let name = required(name, "name")?;
        crate::citus::or_distributed(
            crate::views::alter_view(name, realtime, on_type_error),
            || crate::citus::distributed_view_named(name),
            |view| crate::citus::alter_view(view, realtime, on_type_error),
        )
    })
}

/// `eventview.views.groups` (see `views::group_count`). Not an API call: a read of the catalog
/// view, by anyone, also before the catalog is updated to the library's version. Declared in
/// sql/bootstrap.sql (`sql = false`), ahead of the catalog view that calls it.
#[pg_extern(name = "_group_count", stable, strict, parallel_unsafe, sql = false)]
pub fn group_count(p_view_id: i32) -> Result<Option<i64>, ErrorReport> {
    crate::errors::at_boundary(|| crate::views::group_count(p_view_id))
}

/// `eventview.views.last_error` when something keeps the view from being refreshed now (see
/// `views::refresh_problem`). Not an API call, as `group_count`; declared in sql/bootstrap.sql.
#[pg_extern(
    name = "_refresh_problem",
    stable,
    strict,
    parallel_unsafe,
    sql = false
)]
pub fn refresh_problem(p_view_id: i32) -> Result<Option<String>, ErrorReport> {
    // As the API says it (relations named with search_path pinned); only catalogs are read.
    crate::errors::at_boundary(|| {
        crate::pg::roles::api_call(|| crate::views::refresh_problem(p_view_id))
    })
}

/// The internal id of the incremental view named `name` (42P01 / 22023 otherwise).
#[pg_extern(name = "_view_id", stable, parallel_safe)]
pub fn view_id(name: &str) -> Result<i32, ErrorReport> {
    lookup(|| crate::catalog::view_by_name(name, false).map(|v| v.view_id))
}

/// A view given to another role: its catalog owner and storage follow the relation's owner
/// (called by `eventview._follow_ddl`, as the extension owner; see `views::follow_owner`).
#[pg_extern(name = "_follow_view_owner", volatile, strict, parallel_unsafe)]
fn follow_view_owner(p_view_id: i32) -> Result<(), ErrorReport> {
    at_boundary(|| crate::views::follow_owner(p_view_id))
}

/// Forgets a view whose relation a DROP took (called by `eventview._follow_drop`, which runs as
/// the extension owner; see `views::forget_view`). Not an API call: it runs inside the user's
/// DROP in the rights it has, with the version check only (the catalog statements are this
/// library's).
#[pg_extern(name = "_forget_view", volatile, strict, parallel_unsafe)]
fn forget_view(p_view_id: i32) -> Result<(), ErrorReport> {
    lookup(|| crate::views::forget_view(p_view_id))
}
