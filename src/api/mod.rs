//! Every SQL-callable function. Each one parses its arguments, calls a feature module and maps
//! the error; nothing else. JSON arguments arrive as the text of the `json` value (the
//! wrappers cast), which keeps key order and duplicates for the definition parser. The public
//! signatures (names, defaults, regclass results) are declared in `sql/api.sql`, which wraps
//! these `_`-prefixed functions.

use crate::errors::{EvError, EvResult};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

mod capture;
mod citus;
pub mod event_tables;
mod fields;
mod group_deltas;
pub mod ingest;
mod jsonpath;
mod observer;
mod realtime;
mod refresh;
mod sketch;
pub mod views;

/// Every API entry point: checks the catalog is at the library's version, then runs `f` with
/// the privilege model of `privileges` (checks against the caller, bookkeeping as the
/// extension owner), and maps its error.
pub(crate) fn at_boundary<T>(f: impl FnOnce() -> EvResult<T>) -> Result<T, ErrorReport> {
    crate::errors::at_boundary(|| {
        crate::catalog::require_current_version()?;
        crate::pg::roles::api_call(|| {
            crate::capture::upgrade_captures()?;
            f()
        })
    })
}

/// Lookups for the SQL-language functions: the version check, in the caller's own rights.
pub(crate) fn lookup<T>(f: impl FnOnce() -> EvResult<T>) -> Result<T, ErrorReport> {
    crate::errors::at_boundary(|| {
        crate::catalog::require_current_version()?;
        f()
    })
}

/// An argument that may not be SQL NULL (the functions with optional arguments are not STRICT,
/// so NULL reaches them): refused with 22004, naming it.
pub(crate) fn required<'a>(value: Option<&'a str>, argument: &str) -> EvResult<&'a str> {
    value.ok_or_else(|| {
        EvError::new(
            PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
            format!("argument \"{argument}\" must not be NULL"),
        )
    })
}

/// The error of a function only the SQL of an older release declares: the database's catalog
/// is behind the installed library (55000, with the statement that updates it).
fn needs_update(function: &str) -> ErrorReport {
    EvError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "{function} belongs to an older release of pg_eventview than the installed library"
        ),
    )
    .with_hint(
        "Run ALTER EXTENSION pg_eventview UPDATE; capture keeps recording changes until then.",
    )
    .into_report()
}
