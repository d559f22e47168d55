//! Event tables: creating one (envelope DDL, changelog, capture triggers) and dropping it.

use crate::catalog;
use eventview_core::{envelope_sql, names};
use crate::errors::{EvError, EvResult};
use crate::privileges;
use crate::relation;
use crate::spi_util;
use crate::views;
use pgrx::datum::Interval;
use pgrx::prelude::*;

pub fn create_event_table(
    name: &str,
    retention: Option<Interval>,
    delta_retention: Option<Interval>,
) -> EvResult<pg_sys::Oid> {
    for (arg, value) in [("retention", &retention), ("delta_retention", &delta_retention)] {
        if let Some(v) = value {
            let positive = spi_util::one::<bool>("SELECT $1 > interval '0'", &[(*v).into()])?;
            if positive != Some(true) {
                return Err(EvError::invalid(format!("invalid {arg}: it must be a positive interval")));
            }
        }
    }
    let quoted = relation::qualified_for_create(name)?;
    refuse_schema(&quoted)?;
    // The table is the caller's: created in their name, with their rights on the schema.
    privileges::as_caller(|| spi_util::run_all(&[envelope_sql::create_event_table(&quoted)]))?;
    let relid = relation::created(&quoted)?;
    let source_id = catalog::insert_source(relid, retention, delta_retention)?;
    let table_sql = relation::qualified(relid)?;
    // The changelog belongs to the extension owner: producers and readers never write it. The
    // capture functions (SECURITY DEFINER, so producers need no right on the changelog) belong
    // to the table's owner, who may write, read and prune its changelog: they run the table's
    // own types and casts, which must never run with more rights than the table's owner has.
    spi_util::run_all(&envelope_sql::create_changelog(source_id))?;
    let owner = privileges::role_ident(privileges::table_owner(relid)?)?;
    spi_util::run_all(&[format!("GRANT SELECT, INSERT, DELETE ON {} TO {owner}", names::changelog(source_id))])?;
    spi_util::run_all(&envelope_sql::create_capture(source_id, &table_sql))?;
    spi_util::run_all(&envelope_sql::capture_owner(source_id, &owner))?;
    Ok(relid)
}

/// Schemas an event table cannot be in: the extension's own (`DROP EXTENSION ... CASCADE` and
/// `DROP SCHEMA eventview CASCADE` remove what is in it, events included) and a temporary one
/// (the table would go with the session, leaving its changelog and catalog row behind).
fn refuse_schema(quoted: &str) -> EvResult<()> {
    let parts = eventview_core::quote::split_name(quoted).unwrap_or_default();
    let Some(schema) = parts.first().filter(|_| parts.len() == 2) else {
        return Ok(());
    };
    if schema == names::SCHEMA {
        return Err(EvError::invalid(format!("cannot create an event table in schema {}", names::SCHEMA))
            .with_hint("That schema holds the extension's own objects and goes with DROP EXTENSION; use a schema of your own."));
    }
    if schema == "pg_temp" || schema.starts_with("pg_temp_") {
        return Err(EvError::new(PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED, "an event table cannot be temporary")
            .with_hint("Its changelog and catalog entry outlive the session: create it in a permanent schema."));
    }
    Ok(())
}

pub fn drop_event_table(name: &str, cascade: bool) -> EvResult<()> {
    let source = catalog::source_by_name(name)?;
    privileges::require_table_owner(source.relid, "drop")?;
    // Before listing its views: a view or field declaration being added waits, or makes this wait.
    catalog::lock_source(&source, catalog::SourceLock::Drops)?;
    let readers = catalog::views_of_source(source.source_id)?;
    if !readers.is_empty() && !cascade {
        let names = readers
            .iter()
            .map(|(_, relid)| crate::relation::regclass_text(*relid))
            .collect::<EvResult<Vec<_>>>()?
            .join(", ");
        return Err(EvError::new(
            PgSqlErrorCode::ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
            format!("cannot drop event table {} because views read it", crate::relation::regclass_text(source.relid)?),
        )
        .with_detail(format!("Views reading it: {names}."))
        .with_hint("Drop the views first, or call drop_event_table with cascade => true."));
    }
    for (_, relid) in readers {
        views::drop_view_by_relid(relid)?;
    }
    views::require_no_dependents(source.relid, "event table")?;
    // The DROP fires eventview._follow_drop, which forgets the table; forgotten here again in
    // case event triggers did not fire (session_replication_role = replica).
    privileges::as_caller(|| spi_util::run_all(&[format!("DROP TABLE {}", source.table_sql)]))?;
    forget_source(source.source_id)
}

/// Forgets an event table that is gone or going: what was recorded about it (drift,
/// quarantine, observed fields, field declarations; its regclass would dangle), its changelog
/// and its capture functions. No view may read it any more. A no-op for a forgotten table.
pub fn forget_source(source_id: i32) -> EvResult<()> {
    // Forgotten already (by the sql_drop event trigger of the DROP TABLE drop_event_table ran):
    // nothing left to drop, and no "does not exist, skipping" notices.
    let state = spi_util::one::<i32>(
        "SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM eventview._sources WHERE source_id = $1) THEN 0
                     WHEN EXISTS (SELECT 1 FROM eventview._sources s JOIN pg_catalog.pg_class c ON c.oid = s.relid::oid
                                  WHERE s.source_id = $1) THEN 2
                     ELSE 1 END",
        &[source_id.into()],
    )?;
    if state == Some(0) {
        return Ok(());
    }
    if state == Some(2) {
        return Err(EvError::new(
            PgSqlErrorCode::ERRCODE_OBJECT_IN_USE,
            format!("event table {source_id} still exists"),
        )
        .with_hint("Drop event tables with eventview.drop_event_table."));
    }
    spi_util::run_replanned(
        "WITH s AS (SELECT relid FROM eventview._sources WHERE source_id = $1),
              d AS (DELETE FROM eventview.drift WHERE source = (SELECT relid FROM s) RETURNING 1)
         DELETE FROM eventview.quarantine WHERE source = (SELECT relid FROM s)",
        &[source_id.into()],
    )?;
    spi_util::run_all(&envelope_sql::drop_capture(source_id))?;
    catalog::delete_source(source_id)
}

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
    let marks: Vec<&str> = envelope_sql::CAPTURE_OPS.iter().map(|op| envelope_sql::current_capture_mark(op)).collect();
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
    spi_util::run_all(&repairs)?;
    Ok(())
}


/// Whether a reader may take the event table now: takes ACCESS SHARE on it, on its indexes and
/// on its TOAST table and index, held to the end of the transaction (no ALTER TABLE between a
/// check and the read), if no other session holds or waits for a conflicting lock (ALTER TABLE,
/// VACUUM FULL, TRUNCATE, LOCK TABLE; REINDEX, which holds only SHARE on the table but each
/// index it rebuilds exclusively, and a read plans with every index). The field observer skips a
/// table it would have to wait for (the next refresh observes it), and so does
/// `run_maintenance`'s refresh: a table locked for long must not stall the observation of every
/// other table, nor the views of the others. The same for a changelog (a VACUUM FULL or LOCK
/// TABLE of it), which the observer and `eventview.views` read.
pub fn lock_for_reading_if_free(relid: pg_sys::Oid) -> EvResult<bool> {
    lock_with_parts_if_free(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE)
}

/// The same for deleting rows (ROW EXCLUSIVE, which CREATE INDEX also blocks): pruning every
/// table (`run_maintenance`'s) skips the raw events of a table it would have to wait for.
pub fn lock_for_writing_if_free(relid: pg_sys::Oid) -> EvResult<bool> {
    lock_with_parts_if_free(relid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE)
}

fn lock_with_parts_if_free(relid: pg_sys::Oid, mode: pg_sys::LOCKMODE) -> EvResult<bool> {
    if !lock_if_free(relid, mode) {
        return Ok(false);
    }
    let parts = spi_util::one::<Vec<pg_sys::Oid>>(
        "SELECT coalesce(pg_catalog.array_agg(r ORDER BY r), '{}') FROM (
             SELECT i.indexrelid AS r FROM pg_catalog.pg_index i WHERE i.indrelid = $1
             UNION ALL
             SELECT t.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_class t ON t.oid = c.reltoastrelid WHERE c.oid = $1
             UNION ALL
             SELECT i.indexrelid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_index i ON i.indrelid = c.reltoastrelid
             WHERE c.oid = $1) parts",
        &[relid.into()],
    )?
    .unwrap_or_default();
    Ok(parts.into_iter().all(|part| lock_if_free(part, mode)))
}

/// A lock on a relation in `mode` if it can be had without waiting. One this transaction already
/// holds in a mode that every mode conflicting with `mode` also conflicts with counts as had: no
/// other session can hold a lock in the way, and a waiting request would be granted at once,
/// ahead of any session queued behind this transaction's own lock.
fn lock_if_free(relid: pg_sys::Oid, mode: pg_sys::LOCKMODE) -> bool {
    // SAFETY: relation locks by oid, released at transaction end like LOCK TABLE's; the oid may
    // name a dropped relation, which locks nothing that matters and fails the checks after it.
    unsafe { held_covering(relid, mode) || pg_sys::ConditionalLockRelationOid(relid, mode) }
}

/// The modes each table lock mode conflicts with (bit m: mode m), PostgreSQL's table from
/// ACCESS SHARE (1) to ACCESS EXCLUSIVE (8).
const CONFLICTS: [u16; 9] = [
    0,
    1 << 8,
    (1 << 7) | (1 << 8),
    (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8),
    (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8),
    (1 << 3) | (1 << 4) | (1 << 6) | (1 << 7) | (1 << 8),
    (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8),
    (1 << 2) | (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8),
    0b1_1111_1110,
];

/// Whether this transaction holds a lock on the relation that shuts out every lock `mode`
/// conflicts with (SHARE does not, for ROW EXCLUSIVE: another session may hold SHARE too).
unsafe fn held_covering(relid: pg_sys::Oid, mode: pg_sys::LOCKMODE) -> bool {
    // The tag SET_LOCKTAG_RELATION makes (a relation of this database), looked up in this
    // backend's own lock table: no relation is opened.
    let tag = pg_sys::LOCKTAG {
        // SAFETY (caller: in a backend connected to a database): set once at start.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: relid.to_u32(),
        locktag_field3: 0,
        locktag_field4: 0,
        locktag_type: pg_sys::LockTagType::LOCKTAG_RELATION as u8,
        locktag_lockmethodid: pg_sys::DEFAULT_LOCKMETHOD as u8,
    };
    let wanted = CONFLICTS[mode as usize];
    (1..CONFLICTS.len()).any(|held| {
        // SAFETY: reads this backend's local lock table.
        CONFLICTS[held] & wanted == wanted && unsafe { pg_sys::LockHeldByMe(&tag, held as pg_sys::LOCKMODE) }
    })
}

#[cfg(test)]
mod tests {
    use super::CONFLICTS;

    #[test]
    fn lock_conflicts_are_symmetric_and_own_locks_cover_as_postgres_says() {
        for a in 1..9 {
            for b in 1..9 {
                assert_eq!(CONFLICTS[a] & (1 << b) != 0, CONFLICTS[b] & (1 << a) != 0, "{a} {b}");
            }
        }
        let covers = |held: usize, wanted: usize| CONFLICTS[held] & CONFLICTS[wanted] == CONFLICTS[wanted];
        // Any lock shuts out ACCESS EXCLUSIVE, the only one ACCESS SHARE waits for.
        assert!((1..9).all(|held| covers(held, 1)));
        // ROW EXCLUSIVE: not by SHARE, which another session may hold too.
        assert!(covers(3, 3) && covers(4, 3) && !covers(5, 3) && covers(6, 3) && covers(8, 3));
        assert!(!covers(1, 3) && !covers(2, 3));
    }
}

/// Takes the lock a read of the event table takes (ACCESS SHARE), waiting for it as the read
/// would: checks made after it (`require_intact`) hold until the transaction ends.
pub fn lock_for_reading(relid: pg_sys::Oid) {
    // SAFETY: locks a relation by OID in this transaction, as a query's executor does.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE) };
}

/// Before an event table is read (by the field observer as the extension owner, after
/// `lock_for_reading_if_free`; by a refresh as the view's owner, after `lock_for_reading`): the
/// table must still be a plain table with every envelope column. With `types`, also with their
/// built-in types: its owner can alter them, and a column of a type of theirs would run their
/// functions (implicit casts to jsonb, casts to json in the quarantine's copy of the event)
/// with the reader's rights. (Without, for a reader with the owner's rights anyway.)
/// `require_intact` for a reader acting as `reader`: the types left out when the table's owner
/// has the reader's rights anyway (a refresh as the view's owner, and `last_error`, which says
/// what that refresh would).
pub fn require_intact_for(relid: pg_sys::Oid, table_owner: pg_sys::Oid, reader: pg_sys::Oid) -> EvResult<()> {
    require_intact(relid, !privileges::has_privileges_of(table_owner, reader))
}

pub fn require_intact(relid: pg_sys::Oid, types: bool) -> EvResult<()> {
    let altered = spi_util::one::<String>(
        "SELECT string_agg(format('%I is %s', e.name, coalesce(pg_catalog.format_type(a.atttypid, a.atttypmod), 'missing')), ', ')
         FROM (VALUES ('event_id', 'int8'::regtype), ('event_type', 'text'), ('event_version', 'int4'),
                      ('producer', 'text'), ('occurred_at', 'timestamptz'), ('payload', 'jsonb'),
                      ('event_key', 'text')) e(name, type)
         LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = $1 AND a.attname = e.name AND NOT a.attisdropped
         WHERE (a.atttypid IS DISTINCT FROM e.type::oid AND ($2 OR a.atttypid IS NULL))
            OR (SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid = $1) <> 'r'",
        &[relid.into(), types.into()],
    )?;
    match altered {
        None => Ok(()),
        Some(what) => Err(EvError::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("event table {} was altered: {what}", crate::relation::regclass_text(relid)?),
        )
        .with_hint("The envelope columns must keep the types create_event_table gave them.")),
    }
}

/// Deletes raw events older than `retention` from an event table, in batches of 10,000, at most
/// `max_rows`; returns how many. Runs as the table's owner, security-restricted: the table's
/// own triggers and rules fire with its owner's rights, never with those of whoever runs
/// maintenance (the worker is a superuser). The caller (prune) has switched capture off for
/// these rows (`eventview.pruning`).
///
/// Pruning is not a retraction, so an event stays while some view has not applied an update of
/// it: that view would retract the old version it aggregated and find no new one to add. An
/// update that gives the row a new event_id (`SET event_id = DEFAULT`) logs the new id as
/// inserted, in the same transaction as its 'U' record: those ids are kept too. Each
/// batch first locks rows past retention that have no such update (skipping rows an unfinished
/// transaction is changing), then, in a statement whose snapshot sees every update that
/// committed before the lock, deletes those that still have none. A later update of a locked
/// row waits for the prune and then finds it gone, so it logs nothing. Rows kept for a view
/// are left out of the next batches' candidates, so they never stop the pruning of the others.
pub fn prune_events(relid: pg_sys::Oid, retention: Interval, max_rows: i64) -> EvResult<i64> {
    privileges::require_table_owner(relid, "prune")?;
    let table = relation::qualified(relid)?;
    let owner = privileges::table_owner(relid)?;
    let source = catalog::source_by_relid(relid)?
        .ok_or_else(|| EvError::invalid(format!("{} is not an event table", relation::regclass_text(relid).unwrap_or_default())))?;
    // Events with an update some view has not applied (the changelog's xid index bounds the
    // scan by the oldest view's position): the ids of its 'U' records, and the ids its
    // transactions logged as inserted, which include the new ids of rows an update moved.
    // Tested by anti-joins, not NOT IN: a NOT IN over more ids than fit in work_mem is not
    // hashed and would compare every candidate with every id.
    let updated = format!(
        "consumers AS (
             SELECT applied_snapshot AS s, applied_own_xid AS own, applied_own_seq AS own_seq
             FROM eventview._views WHERE source_id = {sid}
         ),
         updates AS MATERIALIZED (
             SELECT c.xid, c.event_id FROM {log} c
             WHERE c.xid >= (SELECT min(pg_catalog.pg_snapshot_xmin(s)) FROM consumers)
               AND c.op = 'U'
               AND EXISTS (SELECT 1 FROM consumers k WHERE NOT {applied})
         ),
         updated AS MATERIALIZED (
             SELECT event_id FROM updates WHERE event_id IS NOT NULL
             UNION ALL
             SELECT pg_catalog.unnest(c.event_ids) FROM {log} c
             WHERE c.xid IN (SELECT xid FROM updates) AND c.op = 'I'
         )",
        applied = eventview_core::batch::applied_by("k.s", "k.own", "k.own_seq"),
        sid = source.source_id,
        log = names::changelog(source.source_id)
    );
    let lock = format!(
        "WITH {updated}
         SELECT coalesce(pg_catalog.array_agg(event_id), '{{}}') FROM
             (SELECT t.event_id FROM {table} t
              WHERE occurred_at < now() - $1
                AND NOT EXISTS (SELECT 1 FROM updated u WHERE u.event_id = t.event_id)
              LIMIT $2 FOR UPDATE SKIP LOCKED) old"
    );
    let delete = format!(
        "WITH {updated},
         gone AS (DELETE FROM {table} t WHERE t.event_id = ANY ($1)
                    AND NOT EXISTS (SELECT 1 FROM updated u WHERE u.event_id = t.event_id) RETURNING 1)
         SELECT count(*) FROM gone"
    );
    privileges::as_role(owner, || {
        // The cutoff `now() - retention`, in the lock statement and in the delete capture's
        // exemption of pruned rows, is computed in UTC whatever the session's time zone, as
        // rebuild's horizon is (`catalog::retention_horizon`). Set at as_role's nest level,
        // so it ends with it.
        // SAFETY: a SAVE-action set inside the nest level as_role pushed and pops.
        unsafe { crate::gucs::set_in_nest_level(c"TimeZone", c"UTC") };
        let mut done: i64 = 0;
        loop {
            let want = (max_rows - done).min(10_000);
            if want <= 0 {
                return Ok(done);
            }
            let locked = spi_util::one_replanned::<Vec<i64>>(&lock, &[retention.into(), want.into()])?.unwrap_or_default();
            // (Counted with RETURNING: the capture trigger's own SPI use resets the row count.)
            let n = spi_util::one_replanned::<i64>(&delete, &[locked.clone().into()])?.unwrap_or(0);
            done += n;
            if (locked.len() as i64) < want || n == 0 {
                return Ok(done);
            }
        }
    })
}

