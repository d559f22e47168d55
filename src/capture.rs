//! Capture functions of existing event tables kept current: the first API call of each backend
//! replaces capture functions an older library made differently and revokes EXECUTE from PUBLIC.

use crate::errors::EvResult;
use crate::pg::spi;
use eventview_core::envelope_sql;
use pgrx::prelude::*;

thread_local! {
    static CAPTURES_CHECKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Capture functions older than this build's, replaced or fixed: event tables created before 0.2.0 have
/// a delete capture that any session could switch off with `eventview.pruning`; truncate
/// captures older than this build run under REPEATABLE READ and SERIALIZABLE, where they cannot
/// see every row TRUNCATE removes (replaced since 0.10.0's library). An extension script may
/// not replace functions the extension does not own (capture functions are run-time objects), so the first
/// API call of each backend after the update replaces the old ones (as the extension owner; one
/// catalog query when there is nothing to do).
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
    let repairs = Spi::connect(|client| {
        let mut out = Vec::new();
        for row in client.select(
            "SELECT s.source_id, op.name,
                    op.mark <> '' AND pg_catalog.strpos(p.prosrc, op.mark) = 0,
                    EXISTS (SELECT FROM pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
                            WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE')
             FROM eventview._sources s
             CROSS JOIN ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[])) AS op(name, mark)
             JOIN pg_catalog.pg_proc p
               ON p.oid = pg_catalog.to_regprocedure(pg_catalog.format('eventview._capture_%s_%s()', s.source_id, op.name))
             ORDER BY s.source_id, op.name",
            None,
            &[envelope_sql::CAPTURE_OPS.to_vec().into(), marks.into()],
        )? {
            let (Some(id), Some(op)) = (row.get::<i32>(1)?, row.get::<String>(2)?) else { continue };
            if row.get::<bool>(3)? == Some(true) {
                out.extend(envelope_sql::replace_capture(id, &op));
            }
            if row.get::<bool>(4)? == Some(true) {
                out.push(envelope_sql::revoke_capture(id, &op));
            }
        }
        Ok::<_, pgrx::spi::SpiError>(out)
    })?;
    // Checked for good only by a scan that found nothing to repair: repairs made here are
    // undone if the caller's transaction rolls back, and the next call finds them again.
    if repairs.is_empty() {
        CAPTURES_CHECKED.set(true);
    }
    spi::run_all(&repairs)?;
    Ok(())
}
