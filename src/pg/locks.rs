//! Relation locks taken without waiting, or as a read would take them. The field observer and
//! `run_maintenance` skip a table another session holds locked instead of waiting for it: a table
//! locked for long must not stall the work on every other table.

use crate::errors::EvResult;
use pgrx::prelude::*;

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

/// The same for dropping a partition (ACCESS EXCLUSIVE): prune drops a partition no session is
/// using, after checking under this lock that no view still needs its rows, and leaves one in use
/// to a later run.
pub fn lock_for_dropping_if_free(relid: pg_sys::Oid) -> bool {
    lock_if_free(relid, pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE)
}

/// ACCESS EXCLUSIVE on a relation, waiting for it: what a DROP TABLE of it takes next anyway.
pub fn lock_for_dropping(relid: pg_sys::Oid) {
    // SAFETY: a relation lock by oid, released at transaction end like LOCK TABLE's.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE) }
}

/// ACCESS SHARE on the relation `schema.name`, if it exists (false when it does not, or was
/// dropped while this waited for the lock). Held to the end of the transaction, it keeps the
/// relation from being dropped between this and the statements that read it.
pub fn lock_existing_for_reading(schema: &std::ffi::CStr, name: &std::ffi::CStr) -> bool {
    // SAFETY: makeRangeVar copies nothing it is given beyond the call (the names are read by
    // the lookup, which takes the lock and retries after invalidations, as the parser does);
    // RVR_MISSING_OK returns InvalidOid for a relation that does not exist.
    let relid = unsafe {
        let relation = pg_sys::makeRangeVar(schema.as_ptr() as *mut _, name.as_ptr() as *mut _, -1);
        pg_sys::RangeVarGetRelidExtended(
            relation,
            pg_sys::AccessShareLock as pg_sys::LOCKMODE,
            pg_sys::RVROption::RVR_MISSING_OK,
            None,
            std::ptr::null_mut(),
        )
    };
    relid != pg_sys::InvalidOid
}

/// SHARE UPDATE EXCLUSIVE on a relation, waiting for it: what a DETACH PARTITION ... CONCURRENTLY
/// takes on the partitioned table next anyway.
pub fn lock_against_schema_changes(relid: pg_sys::Oid) {
    // SAFETY: a relation lock by oid, released at transaction end like LOCK TABLE's.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::ShareUpdateExclusiveLock as pg_sys::LOCKMODE) }
}

/// SHARE on a relation, waiting for it: no write to it until this transaction ends.
pub fn lock_against_writes(relid: pg_sys::Oid) {
    // SAFETY: a relation lock by oid, released at transaction end like LOCK TABLE's.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::ShareLock as pg_sys::LOCKMODE) }
}

fn lock_with_parts_if_free(relid: pg_sys::Oid, mode: pg_sys::LOCKMODE) -> EvResult<bool> {
    if !lock_if_free(relid, mode) {
        return Ok(false);
    }
    // Its indexes, then its TOAST table and that table's index, from the relation cache (each
    // relation is locked before its entry is read).
    if !index_oids(relid)
        .into_iter()
        .all(|index| lock_if_free(index, mode))
    {
        return Ok(false);
    }
    let toast = toast_oid(relid);
    if toast == pg_sys::InvalidOid {
        return Ok(true);
    }
    Ok(lock_if_free(toast, mode)
        && index_oids(toast)
            .into_iter()
            .all(|index| lock_if_free(index, mode)))
}

/// The indexes of a relation this backend holds locked (none when it does not exist).
fn index_oids(relid: pg_sys::Oid) -> Vec<pg_sys::Oid> {
    // SAFETY: the relcache entry of a locked relation, closed before returning (a missing one
    // is a null pointer); RelationGetIndexList gives a list of oids, read whole before it goes.
    unsafe {
        let rel = pg_sys::RelationIdGetRelation(relid);
        if rel.is_null() {
            return Vec::new();
        }
        let list = pg_sys::RelationGetIndexList(rel);
        let oids = (0..pg_sys::list_length(list))
            .map(|n| pg_sys::list_nth_oid(list, n))
            .collect();
        pg_sys::list_free(list);
        pg_sys::RelationClose(rel);
        oids
    }
}

/// The TOAST table of a relation this backend holds locked (InvalidOid when it has none).
fn toast_oid(relid: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: as in index_oids.
    unsafe {
        let rel = pg_sys::RelationIdGetRelation(relid);
        if rel.is_null() {
            return pg_sys::InvalidOid;
        }
        let toast = (*(*rel).rd_rel).reltoastrelid;
        pg_sys::RelationClose(rel);
        toast
    }
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

/// Whether this transaction holds a lock on the relation, in any mode: each shuts out the ACCESS
/// EXCLUSIVE that a change of the relation's definition takes, so its cache entry stays as it is.
pub fn held(relid: pg_sys::Oid) -> bool {
    // SAFETY: reads this backend's own lock table (see held_covering).
    unsafe { held_covering(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE) }
}

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
        CONFLICTS[held] & wanted == wanted
            && unsafe { pg_sys::LockHeldByMe(&tag, held as pg_sys::LOCKMODE) }
    })
}

/// Takes the lock a read of the event table takes (ACCESS SHARE), waiting for it as the read
/// would: checks made after it (`require_intact`) hold until the transaction ends.
pub fn lock_for_reading(relid: pg_sys::Oid) {
    // SAFETY: locks a relation by OID in this transaction, as a query's executor does.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE) };
}

#[cfg(test)]
mod tests {
    use super::CONFLICTS;

    // Both indexes run over the same table, to compare a row with its column.
    #[allow(clippy::needless_range_loop)]
    #[test]
    fn lock_conflicts_are_symmetric_and_own_locks_cover_as_postgres_says() {
        for a in 1..9 {
            for b in 1..9 {
                assert_eq!(
                    CONFLICTS[a] & (1 << b) != 0,
                    CONFLICTS[b] & (1 << a) != 0,
                    "{a} {b}"
                );
            }
        }
        let covers =
            |held: usize, wanted: usize| CONFLICTS[held] & CONFLICTS[wanted] == CONFLICTS[wanted];
        // Any lock shuts out ACCESS EXCLUSIVE, the only one ACCESS SHARE waits for.
        assert!((1..9).all(|held| covers(held, 1)));
        // ROW EXCLUSIVE: not by SHARE, which another session may hold too.
        assert!(covers(3, 3) && covers(4, 3) && !covers(5, 3) && covers(6, 3) && covers(8, 3));
        assert!(!covers(1, 3) && !covers(2, 3));
    }
}
