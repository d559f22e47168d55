//! The insert capture's changelog record, written without the executor.
//!
//! A single-row INSERT into an event table writes one changelog record. Through SPI that record
//! pays for a whole statement: the cached plan's revalidation, the executor's start (an
//! eleven-column projection, tuple routing set up for the partitioned changelog) and end, about
//! half of what capture adds to the producer's statement. The append writes the same record
//! as PostgreSQL's own row insert does (`simple_table_tuple_insert`, then the index entries
//! through `ExecInsertIndexTuples`, as logical replication's apply does), into the segment
//! whose range holds its `seq`, found in the relation cache's partition bounds as the executor's
//! tuple routing finds it. The values are those the extension's column defaults give: `seq` the
//! identity sequence's next value, `xid` the top transaction's id (`pg_current_xact_id()`),
//! `logged_at` the transaction's start (`now()`).
//!
//! It writes only into a changelog laid out as the extension makes it, for a role that may
//! insert into it (the capture function's owner). Anything else (a column it does not know, a
//! trigger, a rule, a check constraint, row security, a partition key other than the range of
//! `seq`, a segment that is itself partitioned, a revoked INSERT, a segment attached while the
//! record was routed) leaves the record to the SPI insert, which handles every case as an
//! INSERT does, its errors included. What it knows of a changelog comes from the relation and
//! catalog caches, never from a query: the capture runs with its owner's rights under the
//! producer's search_path.
//!
//! Locks are the executor's: ROW EXCLUSIVE on the changelog, then on the segment. Segments are
//! made under SHARE on the changelog (`changelog::make_segments`); a segment attached by other
//! means (ATTACH takes SHARE UPDATE EXCLUSIVE, which does not wait for writers) is caught where
//! the executor checks a record bound for the default partition: the bounds are read again once
//! the segment is locked (which waits for an ATTACH validating the default partition), and a
//! changed segment leaves the record to the SPI insert.

use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::CString;

mod ffi {
    use pgrx::pg_sys;
    unsafe extern "C-unwind" {
        pub fn nextval_internal(relid: pg_sys::Oid, check_permissions: bool) -> i64;
    }
}

/// sequence.h's `nextval` without the privilege check (identity columns need none).
fn next_value(sequence: pg_sys::Oid) -> i64 {
    // SAFETY: nextval_internal takes a sequence's OID; an ERROR it raises (a sequence past its
    // maximum) becomes a Rust panic at the boundary, and PostgreSQL's error again past it.
    unsafe {
        pg_sys::submodules::ffi::pg_guard_ffi_boundary(|| ffi::nextval_internal(sequence, false))
    }
}

/// What the append needs to know of a changelog, read from the relation and catalog caches
/// once per backend and relation cache invalidation of the changelog.
#[derive(Clone, Copy)]
struct Changelog {
    /// The sequence of the identity column `seq`.
    sequence: pg_sys::Oid,
    /// Partitioned by range of `seq` (otherwise a plain table, as changelogs made before
    /// segments are).
    partitioned: bool,
}

thread_local! {
    /// By changelog relation; `None`: a changelog the append leaves to the SPI insert.
    static CHANGELOGS: RefCell<HashMap<pg_sys::Oid, Option<Changelog>>> = RefCell::new(HashMap::new());
    /// The changelog relation of each source, as last found by name (valid while `CHANGELOGS`
    /// holds it).
    static RELIDS: RefCell<HashMap<i32, pg_sys::Oid>> = RefCell::new(HashMap::new());
    /// Set when an invalidation could not reach `CHANGELOGS` (borrowed at that moment): the next
    /// append forgets every changelog.
    static FORGET_ALL: Cell<bool> = const { Cell::new(false) };
}

#[cfg(any(test, feature = "pg_test"))]
thread_local! {
    /// Records appended by this backend (for tests).
    static APPENDED: Cell<u64> = const { Cell::new(0) };
}

/// Relation cache invalidation callback: a changelog whose definition may have changed is read
/// again at its next append (every changelog, for a reset of the whole cache).
#[pg_guard]
unsafe extern "C-unwind" fn forget_changelog(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    CHANGELOGS.with(|changelogs| match changelogs.try_borrow_mut() {
        Ok(mut changelogs) if relid == pg_sys::InvalidOid => changelogs.clear(),
        Ok(mut changelogs) => {
            changelogs.remove(&relid);
        }
        Err(_) => FORGET_ALL.with(|f| f.set(true)),
    });
}

/// Registers the invalidation callback, at library load (`_PG_init`): PostgreSQL has few slots
/// for such callbacks, and a backend's libraries take theirs as they load.
pub fn watch_changelogs() {
    // SAFETY: registers a callback that lives as long as the library.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(forget_changelog), pg_sys::Datum::from(0)) }
}

/// How many records this backend appended without the executor (for tests).
#[cfg(any(test, feature = "pg_test"))]
pub fn appended() -> u64 {
    APPENDED.with(|n| n.get())
}

/// Writes an insert record (`op` 'I', the ids `ids`, an int8[] datum) into the changelog of
/// source `source_id`; false, having written nothing, for a changelog the append leaves to the
/// SPI insert (or that does not exist: the SPI insert reports it).
///
/// # Safety
/// Called inside a transaction, from the insert capture; `ids` is a flat int8[] that outlives
/// the call.
pub unsafe fn append_insert_record(source_id: i32, ids: pg_sys::Datum) -> bool {
    unsafe {
        if FORGET_ALL.with(|f| f.replace(false)) {
            CHANGELOGS.with_borrow_mut(|changelogs| changelogs.clear());
        }
        let Some(relid) = changelog_relid(source_id) else {
            return false;
        };
        // The privilege an INSERT checks (the capture function's owner holds it; without it the
        // INSERT raises the error).
        if pg_sys::pg_class_aclcheck(
            relid,
            pg_sys::GetUserId(),
            pg_sys::ACL_INSERT as pg_sys::AclMode,
        ) != pg_sys::AclResult::ACLCHECK_OK
        {
            return false;
        }
        let root = pg_sys::table_open(relid, pg_sys::NoLock as pg_sys::LOCKMODE);
        let written = match changelog_of(root) {
            Some(changelog) if writes_as_a_plain_insert(root, changelog.partitioned) => {
                append_to(root, changelog, ids)
            }
            _ => false,
        };
        pg_sys::table_close(root, pg_sys::NoLock as pg_sys::LOCKMODE);
        #[cfg(any(test, feature = "pg_test"))]
        if written {
            APPENDED.with(|n| n.set(n.get() + 1));
        }
        written
    }
}

/// Appends the record to the changelog `root` (open, locked), into its segment for a
/// partitioned one.
///
/// # Safety
/// As `append_insert_record`.
unsafe fn append_to(root: pg_sys::Relation, changelog: Changelog, ids: pg_sys::Datum) -> bool {
    unsafe {
        let seq = next_value(changelog.sequence);
        if !changelog.partitioned {
            return write_record(root, seq, ids);
        }
        let Some(target) = segment_for(root, seq) else {
            return false;
        };
        let segment = pg_sys::table_open(target, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
        // Locked, the segment is still the one for seq: a concurrent ATTACH of another segment
        // holding seq (it locks the default partition while it validates it) has committed or
        // not begun.
        let written = segment_for(root, seq) == Some(target)
            && writes_as_a_plain_insert(segment, false)
            && write_record(segment, seq, ids);
        pg_sys::table_close(segment, pg_sys::NoLock as pg_sys::LOCKMODE);
        written
    }
}

/// The changelog of source `source_id`, locked ROW EXCLUSIVE: the relation found last time
/// (locked by OID), unless an invalidation of it arrived with the lock (it may have been dropped
/// or replaced), else found by name. None when there is none.
///
/// # Safety
/// Inside a transaction.
unsafe fn changelog_relid(source_id: i32) -> Option<pg_sys::Oid> {
    unsafe {
        let known = RELIDS
            .with_borrow(|relids| relids.get(&source_id).copied())
            .filter(|relid| CHANGELOGS.with_borrow(|changelogs| changelogs.contains_key(relid)));
        if let Some(relid) = known {
            pg_sys::LockRelationOid(relid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
            if CHANGELOGS.with_borrow(|changelogs| changelogs.contains_key(&relid)) {
                return Some(relid);
            }
            // (Not the changelog any more, or not known to be: this lock is given back, as it
            // may be on a relation the changelog's own lock must come before.)
            pg_sys::UnlockRelationOid(relid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
        }
        let schema = CString::new(eventview_core::names::SCHEMA).expect("no NUL in the schema");
        let name = CString::new(eventview_core::names::changelog_table(source_id))
            .expect("no NUL in a changelog name");
        let range_var =
            pg_sys::makeRangeVar(schema.as_ptr().cast_mut(), name.as_ptr().cast_mut(), -1);
        let relid = pg_sys::RangeVarGetRelidExtended(
            range_var,
            pg_sys::RowExclusiveLock as pg_sys::LOCKMODE,
            pg_sys::RVROption::RVR_MISSING_OK,
            None,
            std::ptr::null_mut(),
        );
        if relid == pg_sys::InvalidOid {
            return None;
        }
        RELIDS.with_borrow_mut(|relids| relids.insert(source_id, relid));
        Some(relid)
    }
}

/// The changelog `rel` (open), from this backend's cache or the relation and catalog caches.
///
/// # Safety
/// `rel` is open.
unsafe fn changelog_of(rel: pg_sys::Relation) -> Option<Changelog> {
    // SAFETY: rel is open.
    let relid = unsafe { (*rel).rd_id };
    if let Some(known) = CHANGELOGS.with_borrow(|changelogs| changelogs.get(&relid).copied()) {
        return known;
    }
    // SAFETY: rel is open.
    let read = unsafe { read_changelog(rel) };
    CHANGELOGS.with_borrow_mut(|changelogs| changelogs.insert(relid, read));
    read
}

/// The changelog `rel` as the caches have it: its identity column `seq` (bigint) and, when
/// partitioned, a partitioning by the range of `seq` alone with the default operator class
/// (`RANGE (seq)`, as `pg_get_partkeydef` shows it). None otherwise. (Any change to them
/// invalidates `rel`, which clears what `changelog_of` keeps of it.)
///
/// # Safety
/// `rel` is open.
unsafe fn read_changelog(rel: pg_sys::Relation) -> Option<Changelog> {
    unsafe {
        let relid = (*rel).rd_id;
        let (position, seq) = super::relcache::attribute_named(&*(*rel).rd_att, c"seq")?;
        if seq.atttypid != pg_sys::INT8OID || seq.attidentity == 0 {
            return None;
        }
        let partitioned = match (*(*rel).rd_rel).relkind as u8 {
            pg_sys::RELKIND_RELATION => false,
            pg_sys::RELKIND_PARTITIONED_TABLE => true,
            _ => return None,
        };
        if partitioned {
            let key = pgrx::direct_function_call::<String>(
                pg_sys::pg_get_partkeydef,
                &[relid.into_datum()],
            );
            // (Quoted under quote_all_identifiers.)
            if !matches!(key.as_deref(), Some("RANGE (seq)" | "RANGE (\"seq\")")) {
                return None;
            }
        }
        let sequence = pg_sys::getIdentitySequence(relid, (position + 1) as i16, true);
        (sequence != pg_sys::InvalidOid).then_some(Changelog {
            sequence,
            partitioned,
        })
    }
}

/// Whether a row insert into `rel` does all an INSERT would: no trigger, rule, row security,
/// check constraint or stored generated column, and (unless it is the partitioned changelog)
/// a plain table.
///
/// # Safety
/// `rel` is open.
unsafe fn writes_as_a_plain_insert(rel: pg_sys::Relation, partitioned: bool) -> bool {
    unsafe {
        let form = &*(*rel).rd_rel;
        let kind = if partitioned {
            pg_sys::RELKIND_PARTITIONED_TABLE
        } else {
            pg_sys::RELKIND_RELATION
        };
        let constraints = (*(*rel).rd_att).constr;
        form.relkind as u8 == kind
            && (*rel).trigdesc.is_null()
            && !form.relhasrules
            && !form.relrowsecurity
            && (constraints.is_null()
                || ((*constraints).num_check == 0 && !(*constraints).has_generated_stored))
    }
}

/// The segment of the partitioned changelog `root` whose range holds `seq`: the partition
/// whose bounds hold it, else the default partition. None when neither exists, the bounds are
/// not plain values, or the partition is itself partitioned.
///
/// # Safety
/// `root` is open and locked ROW EXCLUSIVE.
unsafe fn segment_for(root: pg_sys::Relation, seq: i64) -> Option<pg_sys::Oid> {
    unsafe {
        // Partitions being detached count, as the executor counts them, under a transaction
        // snapshot.
        let omit_detached = !crate::pg::spi::uses_transaction_snapshot();
        let partitions = pg_sys::RelationGetPartitionDesc(root, omit_detached);
        if partitions.is_null() || (*partitions).boundinfo.is_null() {
            return None;
        }
        let bounds = &*(*partitions).boundinfo;
        if bounds.strategy as u8 != pg_sys::PARTITION_STRATEGY_RANGE {
            return None;
        }
        // The greatest bound at or below seq (-1: none), as partition_range_datum_bsearch.
        let (mut below, mut above) = (-1_i32, bounds.ndatums - 1);
        while below < above {
            let middle = (below + above + 1) / 2;
            let at = middle as usize;
            if **bounds.kind.add(at) != pg_sys::PartitionRangeDatumKind::PARTITION_RANGE_DATUM_VALUE
            {
                return None;
            }
            let bound = (**bounds.datums.add(at)).value() as i64;
            if bound <= seq {
                below = middle;
            } else {
                above = middle - 1;
            }
        }
        let mut index = *bounds.indexes.add((below + 1) as usize);
        if index < 0 {
            index = bounds.default_index;
        }
        if index < 0 || index >= (*partitions).nparts || !*(*partitions).is_leaf.add(index as usize)
        {
            return None;
        }
        Some(*(*partitions).oids.add(index as usize))
    }
}

/// Writes the record into `table` (a plain table, locked ROW EXCLUSIVE): its row, then its
/// index entries. False, having written nothing, when a column is not one of the changelog's
/// or not of its type.
///
/// # Safety
/// `table` is open and locked; `ids` is a flat int8[].
unsafe fn write_record(table: pg_sys::Relation, seq: i64, ids: pg_sys::Datum) -> bool {
    unsafe {
        let desc = (*table).rd_att;
        let natts = (*desc).natts as usize;
        let mut values = vec![pg_sys::Datum::from(0); natts];
        let mut nulls = vec![true; natts];
        let mut filled = 0;
        for (i, attr) in (*desc).attrs.as_slice(natts).iter().enumerate() {
            if attr.attisdropped {
                continue;
            }
            let name = std::ffi::CStr::from_ptr(attr.attname.data.as_ptr()).to_bytes();
            let (value, type_oid) = match name {
                b"seq" => (pg_sys::Datum::from(seq), pg_sys::INT8OID),
                b"xid" => (
                    pg_sys::Datum::from(pg_sys::GetTopFullTransactionId().value),
                    pg_sys::XID8OID,
                ),
                b"logged_at" => (
                    pg_sys::Datum::from(pg_sys::GetCurrentTransactionStartTimestamp()),
                    pg_sys::TIMESTAMPTZOID,
                ),
                b"op" => (pg_sys::Datum::from(b'I' as i8), pg_sys::CHAROID),
                b"event_ids" => (ids, pg_sys::INT8ARRAYOID),
                // Left NULL, as an INSERT naming only op and event_ids leaves them.
                b"event_id" | b"old_event_type" | b"old_event_version" | b"old_producer"
                | b"old_occurred_at" | b"old_payload"
                    if !attr.attnotnull && !attr.atthasdef =>
                {
                    continue
                }
                _ => return false,
            };
            if attr.atttypid != type_oid {
                return false;
            }
            values[i] = value;
            nulls[i] = false;
            filled += 1;
        }
        if filled != 5 {
            return false;
        }
        let slot = pg_sys::MakeSingleTupleTableSlot(desc, &pg_sys::TTSOpsVirtual);
        std::ptr::copy_nonoverlapping(values.as_ptr(), (*slot).tts_values, natts);
        std::ptr::copy_nonoverlapping(nulls.as_ptr(), (*slot).tts_isnull, natts);
        pg_sys::ExecStoreVirtualTuple(slot);
        pg_sys::simple_table_tuple_insert(table, slot);
        if (*(*table).rd_rel).relhasindex {
            let estate = pg_sys::CreateExecutorState();
            let result_rel = pg_sys::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>())
                .cast::<pg_sys::ResultRelInfo>();
            pg_sys::InitResultRelInfo(result_rel, table, 0, std::ptr::null_mut(), 0);
            pg_sys::ExecOpenIndices(result_rel, false);
            pg_sys::ExecInsertIndexTuples(
                result_rel,
                slot,
                estate,
                false,
                false,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
            pg_sys::ExecCloseIndices(result_rel);
            pg_sys::FreeExecutorState(estate);
        }
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        true
    }
}
