//! `eventview._realtime_pending(view_id integer) RETURNS SETOF record`, which a realtime view's
//! relation reads the groups its pending changes touch from (see `crate::realtime`). A C
//! function in materialize mode (`pg::set_returning`): pgrx's functions return no records of
//! a row type given at the call site.

use pgrx::pg_sys;

/// Tells Postgres that `realtime_pending` uses the version-1 calling convention.
#[unsafe(no_mangle)]
#[doc(hidden)]
pub extern "C" fn pg_finfo_realtime_pending() -> &'static pg_sys::Pg_finfo_record {
    const V1_API: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1_API
}

/// `eventview._realtime_pending(view_id integer) RETURNS SETOF record`, STABLE STRICT.
///
/// # Safety
/// Called by Postgres' function manager with a valid `fcinfo`.
#[pgrx::pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn realtime_pending(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: the fcinfo Postgres passed to this call.
    unsafe { crate::pg::set_returning::materialize(fcinfo, crate::realtime::pending_groups) }
}
