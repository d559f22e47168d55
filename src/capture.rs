//! Capture functions of existing event tables kept current: the first API call of each backend
//! replaces capture functions an older library made differently and revokes EXECUTE from PUBLIC.

use crate::catalog;
use crate::errors::EvResult;
use eventview_core::envelope_sql;

thread_local! {
    static CAPTURES_CHECKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Brings the capture functions of existing event tables to this library's. One without the
/// current mark (`envelope_sql::current_capture_mark`: the call that wakes the worker at commit)
/// was made by an older library and is replaced, whatever its op; one that PUBLIC may execute
/// is revoked. An extension script may not replace functions the extension does not own (capture
/// functions are run-time objects), so the first API call of each backend after an update does
/// it (as the extension owner; one catalog query when there is nothing to do).
pub fn upgrade_captures() -> EvResult<()> {
    if CAPTURES_CHECKED.get() {
        return Ok(());
    }
    // One scan for both repairs: functions an older library made differently (without the
    // current one's mark), and functions PUBLIC may execute (every one an earlier library made,
    // and those restored from a dump of a database it made: see envelope_sql::revoke_capture).
    // A replaced function keeps its privileges, so it is revoked after it is replaced.
    let marks: Vec<&str> = envelope_sql::CAPTURE_OPS
        .iter()
        .map(|op| envelope_sql::current_capture_mark(op))
        .collect();
    let mut repairs = Vec::new();
    for capture in catalog::capture_states(&envelope_sql::CAPTURE_OPS, &marks)? {
        if capture.stale {
            repairs.extend(envelope_sql::replace_capture(
                capture.source_id,
                &capture.op,
            ));
        }
        if capture.public {
            repairs.push(envelope_sql::revoke_capture(capture.source_id, &capture.op));
        }
    }
    // Checked for good only by a scan that found nothing to repair: repairs made here are
    // undone if the caller's transaction rolls back, and the next call finds them again.
    if repairs.is_empty() {
        CAPTURES_CHECKED.set(true);
    }
    crate::pg::node_local::run_all(&repairs)?;
    Ok(())
}
