//! The ingest gate: the checks `eventview.ingest` runs on each envelope.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

/// Whether a string is an RFC 3339 timestamp (see `eventview_core::rfc3339`); `eventview._rfc3339` uses it.
#[pg_extern(name = "_rfc3339_valid", immutable, strict, parallel_safe)]
pub fn rfc3339_valid(s: &str) -> bool {
    eventview_core::rfc3339::is_valid(s)
}

/// The ingest gate's check of one envelope (see `eventview_core::envelope_check`): NULL when it is good,
/// else the number of its first problem. `envelope` is a jsonb, declared anyelement so that the
/// stored value reaches the check as it is (pgrx would pass a jsonb argument through its text).
#[pg_extern(name = "_envelope_problem", immutable, strict, parallel_safe)]
pub fn envelope_problem(
    envelope: pgrx::AnyElement,
    max_payload_bytes: i64,
) -> Result<Option<i32>, ErrorReport> {
    crate::errors::at_boundary(|| {
        let Some(root) = crate::pg::stored_jsonb::jsonb_argument(&envelope, true) else {
            return Err(crate::errors::EvError::new(
                PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
                "eventview._envelope_problem takes a jsonb",
            ));
        };
        let limit = u64::try_from(max_payload_bytes).unwrap_or(0);
        Ok(eventview_core::envelope_check::check(root, limit).map(|problem| problem as i32))
    })
}
