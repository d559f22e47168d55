//! The C functions over changelog positions (`eventview_core::snapshot`):
//! `eventview._snapshot_without_own()`, which every refresh, observation and realtime read
//! takes its batch's snapshot from, and `eventview._position_given_out(s, own)`, which the
//! trigger on `eventview._views` checks written positions with. As C functions they cost a
//! function call: no interpreter, and no `search_path` set and restored around each call.

use eventview_core::snapshot::{self, Snapshot};
use pgrx::prelude::*;

/// The Snapshot of a `pg_snapshot` datum.
///
/// # Safety
/// `datum` must be a non-null `pg_snapshot` datum.
unsafe fn snapshot_of(datum: pg_sys::Datum) -> Snapshot {
    // SAFETY: the caller's datum is a pg_snapshot varlena; detoasting gives it a 4-byte header
    // and VARSIZE bytes in memory.
    let read = unsafe {
        let value = pg_sys::pg_detoast_datum(datum.cast_mut_ptr::<pg_sys::varlena>());
        let len = pgrx::varsize_any(value);
        Snapshot::from_bytes(std::slice::from_raw_parts(value.cast::<u8>(), len))
    };
    read.unwrap_or_else(|| {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            "a pg_snapshot value has a length that does not match its number of transactions"
        );
    })
}

/// A new `pg_snapshot` datum in the current memory context.
fn snapshot_datum(snapshot: &Snapshot) -> pg_sys::Datum {
    let body = snapshot.body_bytes();
    let len = pg_sys::VARHDRSZ + body.len();
    // SAFETY: writes a varlena of `len` bytes into memory palloc'd for it.
    unsafe {
        let value = pg_sys::palloc(len).cast::<u8>();
        pgrx::set_varsize_4b(value.cast::<pg_sys::varlena>(), len as i32);
        std::ptr::copy_nonoverlapping(body.as_ptr(), value.add(pg_sys::VARHDRSZ), body.len());
        pg_sys::Datum::from(value)
    }
}

/// The statement's snapshot (`pg_current_snapshot()`), as a datum.
///
/// # Safety
/// `fcinfo` must be the call's valid `fcinfo`; `pg_current_snapshot` reads none of it.
unsafe fn current_snapshot(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: the function takes no arguments and reads the active snapshot, which a
    // statement calling this function has.
    unsafe { pg_sys::pg_current_snapshot(fcinfo) }
}

/// The top-level transaction id of this backend, when it has one
/// (`pg_current_xact_id_if_assigned()`).
fn own_transaction() -> Option<u64> {
    // SAFETY: reads this backend's transaction state; no side effects.
    let own = unsafe { pg_sys::GetTopFullTransactionIdIfAny() }.value;
    (own != 0).then_some(own)
}

/// Tells Postgres that `snapshot_without_own` uses the version-1 calling convention.
#[unsafe(no_mangle)]
#[doc(hidden)]
pub extern "C" fn pg_finfo_snapshot_without_own() -> &'static pg_sys::Pg_finfo_record {
    const V1_API: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1_API
}

/// `eventview._snapshot_without_own() RETURNS pg_snapshot`, STABLE: the statement's snapshot,
/// with this backend's own transaction (when it has an id) in progress
/// (`Snapshot::without`).
///
/// # Safety
/// Called by Postgres' function manager with a valid `fcinfo`.
#[pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn snapshot_without_own(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: the call's fcinfo; pg_current_snapshot's value is a non-null pg_snapshot.
    let current = unsafe { current_snapshot(fcinfo) };
    let Some(own) = own_transaction() else {
        return current;
    };
    // SAFETY: as above.
    match unsafe { snapshot_of(current) }.without(own) {
        Some(without) => snapshot_datum(&without),
        None => current,
    }
}

/// Tells Postgres that `position_given_out` uses the version-1 calling convention.
#[unsafe(no_mangle)]
#[doc(hidden)]
pub extern "C" fn pg_finfo_position_given_out() -> &'static pg_sys::Pg_finfo_record {
    const V1_API: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1_API
}

/// `eventview._position_given_out(s pg_snapshot, own xid8) RETURNS boolean`, STABLE, not
/// STRICT: whether the position names only transactions the cluster has given out (before the
/// later of the statement's snapshot's xmax and this backend's own transaction's next), or the
/// current user is a superuser (a restore writes any position). NULL when `s` is NULL and that
/// leaves it open, as SQL's AND and OR would.
///
/// # Safety
/// Called by Postgres' function manager with a valid `fcinfo` of two arguments.
#[pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn position_given_out(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: the call's two arguments: a pg_snapshot and an xid8 (a 64-bit id by value).
    let (xmax, own) = unsafe {
        let args = (*fcinfo).args.as_slice(2);
        (
            (!args[0].isnull).then(|| snapshot_of(args[0].value).xmax),
            (!args[1].isnull).then(|| args[1].value.value() as u64),
        )
    };
    // SAFETY: as in snapshot_without_own.
    let current_xmax = unsafe { snapshot_of(current_snapshot(fcinfo)) }.xmax;
    let next_xid = own_transaction().map_or(current_xmax, |o| current_xmax.max(o + 1));
    // SAFETY: reads the current user's role; no side effects.
    let answer = if unsafe { pg_sys::superuser() } {
        Some(true)
    } else {
        snapshot::given_out(xmax, own, next_xid)
    };
    // SAFETY: the call's fcinfo, whose result may be NULL.
    unsafe {
        (*fcinfo).isnull = answer.is_none();
    }
    pg_sys::Datum::from(answer.unwrap_or(false))
}
