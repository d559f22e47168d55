//! Work that may fail for a reason its caller can live with, run in a subtransaction (as a
//! PL/pgSQL `EXCEPTION` block runs its statements): its failure rolls back only its own work,
//! and the transaction goes on.

use crate::errors::EvResult;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use std::panic::AssertUnwindSafe;

/// Runs `f` in a subtransaction. An error of Postgres that `survivable` accepts (by its
/// SQLSTATE) rolls the subtransaction back and comes back as `Ok(Err(message))`; any other
/// error, raised or returned, goes on to the caller after the rollback.
pub fn unless_failed<T>(
    survivable: impl Fn(PgSqlErrorCode) -> bool,
    f: impl FnOnce() -> EvResult<T>,
) -> EvResult<Result<T, String>> {
    // SAFETY: the memory context and resource owner of the caller, read to restore them after
    // the subtransaction ends, as PL/pgSQL's exception blocks do.
    let (context, owner) = unsafe { (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner) };
    // SAFETY: starts a subtransaction of the current transaction, which is in progress and not
    // aborted (an API call runs in one) and not in parallel mode (the functions that get here
    // are PARALLEL UNSAFE); the caller's memory context stays current.
    unsafe {
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(context);
    }
    let f = AssertUnwindSafe(f);
    let survivable = AssertUnwindSafe(survivable);
    PgTryBuilder::new(move || {
        // The whole wrapper moves in (a closure would capture only its field).
        let f = f;
        match (f.0)() {
            Ok(value) => {
                end(true, context, owner);
                Ok(Ok(value))
            }
            Err(e) => {
                end(false, context, owner);
                Err(e)
            }
        }
    })
    .catch_others(|caught| {
        end(false, context, owner);
        match &caught {
            CaughtError::PostgresError(report) if (*survivable)(report.sql_error_code()) => {
                Ok(Err(report.message().to_string()))
            }
            _ => caught.rethrow(),
        }
    })
    .execute()
}

/// Ends the subtransaction `unless_failed` began (committed or rolled back), then restores the
/// caller's memory context and resource owner.
fn end(commit: bool, context: pg_sys::MemoryContext, owner: pg_sys::ResourceOwner) {
    // SAFETY: the subtransaction is the innermost one (the work in it leaves none of its own
    // open: an error aborts those first); `context` and `owner` are the caller's, which
    // outlive it.
    unsafe {
        if commit {
            pg_sys::ReleaseCurrentSubTransaction();
        } else {
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
        }
        pg_sys::MemoryContextSwitchTo(context);
        pg_sys::CurrentResourceOwner = owner;
    }
}
