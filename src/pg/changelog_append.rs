//! The insert capture's changelog record, written without the executor.
//!
//! A single-row INSERT into an event table writes one changelog record. Through SPI that record
//! pays for a whole statement: the cached plan's revalidation, the executor's start (an
//! eleven-column projection, tuple routing set up for the partitioned changelog) and end, about
//! half of what capture adds to the producer's statement. The append writes the same record
//! as PostgreSQL's own row insert does (`simple_table_tuple_insert`, then the index entries
//! through `ExecInsertIndexTuples`, as logical replication's apply does), into the segment
//! whose range holds its `seq`, found in the relation cache's partition bounds as the executor's
//! tuple routing finds it. The values are those the column defaults give: `seq` the identity
//! sequence's next value, `xid` the top transaction's id (`pg_current_xact_id()`), `logged_at`
//! the transaction's start (`now()`).
//!
//! It writes only into a changelog laid out as the extension makes it, for a role that may
//! insert into it (the capture function's owner). Anything else (a column it does not know, a
//! trigger, a rule, a check constraint, row security, a partition key other than the range of
//! `seq`, a segment that is itself partitioned, a revoked INSERT) leaves the record to the SPI
//! insert, which handles every case as an INSERT does, its errors included.
//!
//! Locks are the executor's: ROW EXCLUSIVE on the changelog, taken as its name is resolved, then
//! on the segment. Segments are made under SHARE on the changelog (`changelog::make_segments`),
//! so the bounds read under ROW EXCLUSIVE stay those of the segments until the transaction ends.

use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::CString;

mod ffi {
    use pgrx::pg_sys;
    unsafe extern "C-unwind" {
        pub fn RelationGetPartitionDesc(
            rel: pg_sys::Relation,
            omit_detached: bool,
        ) -> pg_sys::PartitionDesc;
        pub fn nextval_internal(relid: pg_sys::Oid, check_permissions: bool) -> i64;
    }
}

/// partdesc.h's accessor of a partitioned relation's partitions (not in pgrx's bindings).
///
/// # Safety
/// `rel` is open and locked.
unsafe fn partitions_of(rel: pg_sys::Relation) -> pg_sys::PartitionDesc {
    // SAFETY: an ERROR raised inside becomes a Rust panic at the boundary.
    unsafe {
        pg_sys::submodules::ffi::pg_guard_ffi_boundary(|| ffi::RelationGetPartitionDesc(rel, true))
    }
}

/// sequence.h's `nextval` without the privilege check (identity columns need none).
fn next_value(sequence: pg_sys::Oid) -> i64 {
    // SAFETY: as above; an ERROR (a sequence past its maximum) becomes a panic.
    unsafe {
        pg_sys::submodules::ffi::pg_guard_ffi_boundary(|| ffi::nextval_internal(sequence, false))
    }
}

/// What the append needs to know of a changelog, read from the catalog once per backend and
/// relation cache invalidation of the changelog.
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
    /// Whether `forget_changelog` is registered with the relation cache.
    static WATCHING: Cell<bool> = const { Cell::new(false) };
}

#[cfg(any(test, feature = "pg_test"))]
thread_local! {
    /// Records appended by this backend (for tests).
    static APPENDED: Cell<u64> = const { Cell::new(0) };
}

/// Relation cache invalidation callback: a changelog whose definition may have changed is read
/// again at its next append (every changelog, for a reset of the whole cache).
unsafe extern "C-unwind" fn forget_changelog(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    CHANGELOGS.with(|changelogs| {
        // (Never borrowed across a call into PostgreSQL, where a callback can run.)
        if let Ok(mut changelogs) = changelogs.try_borrow_mut() {
            if relid == pg_sys::InvalidOid {
                changelogs.clear();
            } else {
                changelogs.remove(&relid);
            }
        }
    });
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
        if !WATCHING.with(|w| w.replace(true)) {
            pg_sys::CacheRegisterRelcacheCallback(Some(forget_changelog), pg_sys::Datum::from(0));
        }
        let Some(relid) = changelog_relid(source_id) else {
            return false;
        };
        let Some(changelog) = changelog_of(relid) else {
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
        if !writes_as_a_plain_insert(root, changelog.partitioned) {
            pg_sys::table_close(root, pg_sys::NoLock as pg_sys::LOCKMODE);
            return false;
        }
        let seq = next_value(changelog.sequence);
        let target = if changelog.partitioned {
            segment_for(root, seq)
        } else {
            Some(relid)
        };
        let written = match target {
            Some(target) if target == relid => write_record(root, seq, ids),
            Some(target) => {
                let segment =
                    pg_sys::table_open(target, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
                let written =
                    writes_as_a_plain_insert(segment, false) && write_record(segment, seq, ids);
                pg_sys::table_close(segment, pg_sys::NoLock as pg_sys::LOCKMODE);
                written
            }
            None => false,
        };
        pg_sys::table_close(root, pg_sys::NoLock as pg_sys::LOCKMODE);
        #[cfg(any(test, feature = "pg_test"))]
        if written {
            APPENDED.with(|n| n.set(n.get() + 1));
        }
        written
    }
}

/// The changelog of source `source_id`, locked ROW EXCLUSIVE: the relation found last time,
/// unless an invalidation of it arrived with the lock (it may have been dropped), else found by
/// name. None when there is none.
///
/// # Safety
/// Inside a transaction.
unsafe fn changelog_relid(source_id: i32) -> Option<pg_sys::Oid> {
    unsafe {
        if let Some(relid) = RELIDS.with_borrow(|relids| relids.get(&source_id).copied()) {
            pg_sys::LockRelationOid(relid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
            if CHANGELOGS.with_borrow(|changelogs| changelogs.contains_key(&relid)) {
                return Some(relid);
            }
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

/// The changelog `relid`, from this backend's cache or the catalog.
fn changelog_of(relid: pg_sys::Oid) -> Option<Changelog> {
    if let Some(known) = CHANGELOGS.with_borrow(|changelogs| changelogs.get(&relid).copied()) {
        return known;
    }
    let read = read_changelog(relid);
    CHANGELOGS.with_borrow_mut(|changelogs| changelogs.insert(relid, read));
    read
}

/// The changelog `relid` as the catalog has it: its identity column `seq` (bigint) and, when
/// partitioned, a partitioning by the range of `seq` alone with the default bigint operator
/// class. None otherwise.
fn read_changelog(relid: pg_sys::Oid) -> Option<Changelog> {
    let row = Spi::get_two_with_args::<i16, bool>(
        "SELECT a.attnum, c.relkind = 'p'
         FROM pg_catalog.pg_class c
         JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attname = 'seq' AND NOT a.attisdropped
         WHERE c.oid = $1 AND a.atttypid = 'pg_catalog.int8'::pg_catalog.regtype AND a.attidentity <> ''
           AND (c.relkind = 'r'
                OR (c.relkind = 'p' AND EXISTS (
                      SELECT FROM pg_catalog.pg_partitioned_table pt
                      JOIN pg_catalog.pg_opclass oc ON oc.oid = pt.partclass[0]
                      JOIN pg_catalog.pg_am am ON am.oid = oc.opcmethod
                      WHERE pt.partrelid = c.oid AND pt.partstrat = 'r' AND pt.partnatts = 1
                        AND pt.partattrs[0] = a.attnum AND pt.partexprs IS NULL
                        AND am.amname = 'btree' AND oc.opcdefault
                        AND oc.opcintype = 'pg_catalog.int8'::pg_catalog.regtype)))",
        &[relid.into()],
    );
    let (Some(attnum), Some(partitioned)) = row.ok()? else {
        return None;
    };
    // SAFETY: a catalog lookup; missing_ok.
    let sequence = unsafe { pg_sys::getIdentitySequence(relid, attnum, true) };
    (sequence != pg_sys::InvalidOid).then_some(Changelog {
        sequence,
        partitioned,
    })
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
        let partitions = partitions_of(root);
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
