//! The envelope contract: an event table is a plain table with the envelope columns of their
//! built-in types. Checked before every read of an event table by the extension.

use crate::errors::{EvError, EvResult};
use crate::pg::spi;
use crate::privileges;
use pgrx::prelude::*;

/// Before an event table is read (by the field observer as the extension owner, after
/// `lock_for_reading_if_free`; by a refresh as the view's owner, after `lock_for_reading`): the
/// table must still be a plain table with every envelope column. With `types`, also with their
/// built-in types: its owner can alter them, and a column of a type of theirs would run their
/// functions (implicit casts to jsonb, casts to json in the quarantine's copy of the event)
/// with the reader's rights. (Without, for a reader with the owner's rights anyway.)
/// `require_intact` for a reader acting as `reader`: the types left out when the table's owner
/// has the reader's rights anyway (a refresh as the view's owner, and `last_error`, which says
/// what that refresh would).
pub fn require_intact_for(
    relid: pg_sys::Oid,
    table_owner: pg_sys::Oid,
    reader: pg_sys::Oid,
) -> EvResult<()> {
    require_intact(relid, !privileges::has_privileges_of(table_owner, reader))
}

/// The envelope columns and their types: the list of the catalog query of `require_intact` (its
/// VALUES), which names what was altered.
const ENVELOPE_COLUMNS: [(&std::ffi::CStr, pg_sys::Oid); 7] = [
    (c"event_id", pg_sys::INT8OID),
    (c"event_type", pg_sys::TEXTOID),
    (c"event_version", pg_sys::INT4OID),
    (c"producer", pg_sys::TEXTOID),
    (c"occurred_at", pg_sys::TIMESTAMPTZOID),
    (c"payload", pg_sys::JSONBOID),
    (c"event_key", pg_sys::TEXTOID),
];

pub fn require_intact(relid: pg_sys::Oid, types: bool) -> EvResult<()> {
    // Every refresh checks it, twice: the relation cache answers for a table this backend holds
    // locked, and the catalog query runs only when the table is altered (to name what was) or
    // not locked.
    let cached = crate::pg::relcache::has_columns(relid, &ENVELOPE_COLUMNS, types);
    if cached == Some(true) {
        return Ok(());
    }
    let altered = spi::one::<String>(
        "SELECT string_agg(format('%I is %s', e.name, coalesce(pg_catalog.format_type(a.atttypid, a.atttypmod), 'missing')), ', ')
         FROM (VALUES ('event_id', 'int8'::regtype), ('event_type', 'text'), ('event_version', 'int4'),
                      ('producer', 'text'), ('occurred_at', 'timestamptz'), ('payload', 'jsonb'),
                      ('event_key', 'text')) e(name, type)
         LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = $1 AND a.attname = e.name AND NOT a.attisdropped
         WHERE (a.atttypid IS DISTINCT FROM e.type::oid AND ($2 OR a.atttypid IS NULL))
            OR (SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid = $1) NOT IN ('r', 'p')",
        &[relid.into(), types.into()],
    )?;
    // The catalog query reads with the transaction's snapshot: under REPEATABLE READ it can
    // predate an ALTER TABLE that the relation cache, which the reads use, already has.
    let altered = match (altered, cached) {
        (None, Some(false)) => {
            Some("its envelope columns changed after this transaction's snapshot".to_string())
        }
        (altered, _) => altered,
    };
    match altered {
        None => Ok(()),
        Some(what) => Err(EvError::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "event table {} was altered: {what}",
                crate::relation::regclass_text(relid)?
            ),
        )
        .with_hint("The envelope columns must keep the types create_event_table gave them.")),
    }
}
