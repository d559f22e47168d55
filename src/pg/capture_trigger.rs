//! The insert capture, a native trigger function: every statement that inserts into an event
//! table logs the ids of its new rows as one changelog record, in the producer's transaction.
//!
//! It reads the `event_id` column of the transition table directly, builds the id array and
//! appends one record to the changelog without the executor (`changelog_append`; a changelog
//! laid out otherwise gets it by a kept `INSERT ... VALUES ('I', $1)`): the whole of what
//! pg_eventview adds to the producers' most common write (BENCHMARKS.md).
//! For a partitioned event table it also adds the new rows' keys to its key table with one more
//! kept statement (`envelope_sql::key_insert`), which is what keeps them unique across
//! partitions.
//!
//! Each event table has its own capture function, `eventview._capture_<source>_insert()`, made
//! `LANGUAGE c` with the symbol `capture_inserted_rows` and SECURITY DEFINER (its owner, the
//! table's owner, holds INSERT on the changelog; producers need none). The function finds its
//! source from its own name, so one symbol serves every event table, and runs only for that
//! source's table. It resolves no name through the search_path (its statements qualify every
//! relation, function, operator and type): the function needs no pinned one.
//! Every later library keeps the symbol: a database's capture functions name it until they are
//! replaced.

use crate::errors::EvError;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString};

thread_local! {
    /// The kept `INSERT` of each source's changelog, by source id. Postgres' plan cache keeps
    /// each valid (a dropped and recreated changelog is found again by name).
    static INSERTS: RefCell<HashMap<i32, pg_sys::SPIPlanPtr>> = RefCell::new(HashMap::new());
    /// The kept key insert of each partitioned source, by source id and whether it takes over
    /// ingest's claims (`envelope_sql::key_insert`).
    static KEY_INSERTS: RefCell<HashMap<(i32, bool), pg_sys::SPIPlanPtr>> = RefCell::new(HashMap::new());
    /// The source each capture function (by OID) was found to capture when it fires for a
    /// table (by OID), and whether that source has a key table, so that its name and the catalog
    /// are read once per function, table and backend.
    static CAPTURED: RefCell<HashMap<(pg_sys::Oid, pg_sys::Oid), Captured>> = RefCell::new(HashMap::new());
}

/// What an insert capture firing for a table captures.
#[derive(Clone, Copy)]
struct Captured {
    source_id: i32,
    /// The source is a partitioned event table, whose keys the capture adds to its key table.
    keyed: bool,
}

/// Tells Postgres that `capture_inserted_rows` uses the version-1 calling convention.
#[unsafe(no_mangle)]
#[doc(hidden)]
pub extern "C" fn pg_finfo_capture_inserted_rows() -> &'static pg_sys::Pg_finfo_record {
    const V1_API: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1_API
}

/// The insert capture: an AFTER INSERT ... FOR EACH STATEMENT trigger with a NEW TABLE.
///
/// # Safety
/// Called by Postgres' function manager with a valid `fcinfo`.
#[pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn capture_inserted_rows(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: fcinfo is valid for this call; a trigger's context is its TriggerData, checked
    // by its node tag before it is read as one.
    let trigger = unsafe {
        let context = (*fcinfo).context;
        if context.is_null() || (*context).type_ != pg_sys::NodeTag::T_TriggerData {
            refuse_call("is not called by a trigger");
        }
        &*(context as *const pg_sys::TriggerData)
    };
    let event = trigger.tg_event;
    if event & pg_sys::TRIGGER_EVENT_OPMASK != pg_sys::TRIGGER_EVENT_INSERT
        || event & pg_sys::TRIGGER_EVENT_ROW != 0
        || event & pg_sys::TRIGGER_EVENT_TIMINGMASK != pg_sys::TRIGGER_EVENT_AFTER
        || trigger.tg_newtable.is_null()
    {
        refuse_call("is not fired AFTER INSERT FOR EACH STATEMENT with a NEW TABLE");
    }
    // SAFETY: as above; flinfo is the function's own.
    let function = unsafe { (*(*fcinfo).flinfo).fn_oid };
    // SAFETY: the trigger's relation is open while it fires.
    let table = unsafe { (*trigger.tg_relation).rd_id };
    let captured = source_capturing(function, table);
    // SAFETY: the trigger's relation and transition table are valid while it fires.
    let rows = unsafe { read_new_rows(trigger, captured.keyed) };
    if !rows.ids.is_empty() {
        crate::pg::wakeup::wake_worker_on_commit();
        // SAFETY: ids are int8 datums; the array is built in the trigger's memory context.
        unsafe { log_inserted(captured.source_id, rows.ids) };
    }
    if !rows.keys.is_empty() {
        // SAFETY: keys are text datums copied into the trigger's memory context, times the
        // timestamptz datums of their rows.
        unsafe { add_keys(captured.source_id, rows.keys, rows.times) };
    }
    pg_sys::Datum::from(0)
}

fn refuse_call(what: &str) -> ! {
    raise(
        EvError::new(
            PgSqlErrorCode::ERRCODE_TRIGGERED_ACTION_EXCEPTION,
            format!("capture_inserted_rows {what}"),
        )
        .with_hint("It is the insert capture of pg_eventview's event tables, attached by create_event_table; do not attach it to other triggers."),
    )
}

fn raise(error: EvError) -> ! {
    error.into_report().report(PgLogLevel::ERROR);
    unreachable!("an ERROR does not return")
}

/// The source whose capture function is `function` (`eventview._capture_<source>_insert`).
fn source_of(function: pg_sys::Oid) -> Option<i32> {
    // SAFETY: get_func_namespace and get_namespace_name return a namespace oid (InvalidOid for
    // no such function) and a palloc'd name (NULL for no such namespace); get_func_name returns
    // a palloc'd copy of the name, or NULL for no such function.
    let name = unsafe {
        let schema = pg_sys::get_namespace_name(pg_sys::get_func_namespace(function));
        if schema.is_null()
            || CStr::from_ptr(schema).to_bytes() != eventview_core::names::SCHEMA.as_bytes()
        {
            return None;
        }
        let name = pg_sys::get_func_name(function);
        if name.is_null() {
            return None;
        }
        CStr::from_ptr(name).to_str().ok()?.to_owned()
    };
    eventview_core::names::capture_source(&name, "insert")
}

/// The source whose insert capture is `function`, which fires for `table`: refused (09000)
/// unless `function` is an event table's capture and `table` that event table or a partition
/// in its tree. (Its query qualifies every operator and type: the capture runs with its owner's
/// rights under the producer's search_path.)
fn source_capturing(function: pg_sys::Oid, table: pg_sys::Oid) -> Captured {
    if let Some(captured) = CAPTURED.with(|c| c.borrow().get(&(function, table)).copied()) {
        return captured;
    }
    let Some(source_id) = source_of(function) else {
        refuse_call("is not the insert capture of an event table");
    };
    let captures = Spi::get_one_with_args::<Vec<bool>>(
        "SELECT ARRAY[coalesce(s.relid::pg_catalog.oid OPERATOR(pg_catalog.=) $2
                               OR pg_catalog.pg_partition_root($2) OPERATOR(pg_catalog.=) s.relid::pg_catalog.oid, false),
                      pg_catalog.to_regclass(pg_catalog.format('eventview._keys_%s', s.source_id)) IS NOT NULL]
         FROM eventview._sources s WHERE s.source_id OPERATOR(pg_catalog.=) $1",
        &[source_id.into(), table.into()],
    );
    let keyed = match captures.ok().flatten().as_deref() {
        Some([true, keyed]) => *keyed,
        _ => refuse_call("is not the insert capture of this table"),
    };
    let captured = Captured { source_id, keyed };
    CAPTURED.with(|c| c.borrow_mut().insert((function, table), captured));
    captured
}

/// What the insert capture reads of the trigger's NEW TABLE.
struct NewRows {
    /// The non-null `event_id`s (int8 datums).
    ids: Vec<pg_sys::Datum>,
    /// The non-null `event_key`s (text datums, copied), when asked for.
    keys: Vec<pg_sys::Datum>,
    /// The `occurred_at` of the rows of `keys`, in the same order (timestamptz datums).
    times: Vec<pg_sys::Datum>,
}

/// The position (0-based) of column `name` of `desc`, which must be of type `type_oid`.
///
/// # Safety
/// `rel` is an open relation and `desc` its tuple descriptor.
unsafe fn column_position(
    rel: pg_sys::Relation,
    desc: pg_sys::TupleDesc,
    name: &CStr,
    type_oid: pg_sys::Oid,
    type_name: &str,
) -> usize {
    unsafe {
        let Some((position, attribute)) = super::relcache::attribute_named(&*desc, name) else {
            raise(
                EvError::new(
                    PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
                    format!(
                        "event table {} has no column {}",
                        relation_name(rel),
                        name.to_string_lossy()
                    ),
                )
                .with_hint("Every event table has the envelope columns create_event_table makes."),
            )
        };
        if attribute.atttypid != type_oid {
            raise(
                EvError::new(
                    PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
                    format!(
                        "column {} of event table {} is not a {type_name}",
                        name.to_string_lossy(),
                        relation_name(rel)
                    ),
                )
                .with_hint(
                    "The envelope columns must keep the types create_event_table gave them.",
                ),
            )
        }
        position
    }
}

/// The new rows' ids, and with `keys` their keys, from the trigger's NEW TABLE.
///
/// # Safety
/// `trigger` is the TriggerData of a firing statement trigger with a NEW TABLE.
unsafe fn read_new_rows(trigger: &pg_sys::TriggerData, keys: bool) -> NewRows {
    unsafe {
        let rel = trigger.tg_relation;
        let desc = (*rel).rd_att;
        let id_at = column_position(rel, desc, c"event_id", pg_sys::INT8OID, "bigint");
        let key_at =
            keys.then(|| column_position(rel, desc, c"event_key", pg_sys::TEXTOID, "text"));
        let time_at = keys.then(|| {
            column_position(
                rel,
                desc,
                c"occurred_at",
                pg_sys::TIMESTAMPTZOID,
                "timestamp with time zone",
            )
        });
        let last = 1 + id_at.max(key_at.unwrap_or(0)).max(time_at.unwrap_or(0)) as i32;
        let store = trigger.tg_newtable;
        // A read pointer of its own: other triggers of the statement read the same store.
        let reader = pg_sys::tuplestore_alloc_read_pointer(store, pg_sys::EXEC_FLAG_REWIND as i32);
        pg_sys::tuplestore_select_read_pointer(store, reader);
        pg_sys::tuplestore_rescan(store);
        let slot = pg_sys::MakeSingleTupleTableSlot(desc, &pg_sys::TTSOpsMinimalTuple);
        let mut rows = NewRows {
            ids: Vec::new(),
            keys: Vec::new(),
            times: Vec::new(),
        };
        let count = usize::try_from(pg_sys::tuplestore_tuple_count(store)).unwrap_or(0);
        if rows.ids.try_reserve_exact(count).is_err() {
            raise(EvError::new(
                PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
                format!("out of memory for the ids of {count} new rows"),
            ))
        }
        while pg_sys::tuplestore_gettupleslot(store, true, false, slot) {
            pgrx::check_for_interrupts!();
            if ((*slot).tts_nvalid as i32) < last {
                pg_sys::slot_getsomeattrs_int(slot, last);
            }
            if !*(*slot).tts_isnull.add(id_at) {
                rows.ids.push(*(*slot).tts_values.add(id_at));
            }
            if let (Some(at), Some(time)) = (key_at, time_at) {
                if !*(*slot).tts_isnull.add(at) {
                    // (occurred_at is NOT NULL, a timestamptz passed by value.)
                    rows.times.push(*(*slot).tts_values.add(time));
                    // Copied (and detoasted): the slot's values go with its next tuple.
                    let key = (*(*slot).tts_values.add(at)).cast_mut_ptr::<pg_sys::varlena>();
                    rows.keys
                        .push(pg_sys::Datum::from(pg_sys::pg_detoast_datum_copy(key)));
                }
            }
        }
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        pg_sys::tuplestore_select_read_pointer(store, 0);
        rows
    }
}

/// The name of `rel` as a message shows it.
///
/// # Safety
/// `rel` is an open relation.
unsafe fn relation_name(rel: pg_sys::Relation) -> String {
    unsafe { CStr::from_ptr((*(*rel).rd_rel).relname.data.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Writes one 'I' record of `ids` into the source's changelog: appended without the executor
/// (`changelog_append`), or by the kept `INSERT` into a changelog the append leaves to it.
///
/// # Safety
/// `ids` are int8 datums; called from a firing trigger.
unsafe fn log_inserted(source_id: i32, mut ids: Vec<pg_sys::Datum>) {
    unsafe {
        let array = pg_sys::construct_array(
            ids.as_mut_ptr(),
            ids.len() as i32,
            pg_sys::INT8OID,
            8,
            true,
            b'd' as std::ffi::c_char,
        );
        if crate::pg::changelog_append::append_insert_record(source_id, pg_sys::Datum::from(array))
        {
            return;
        }
        if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as i32 {
            pgrx::error!("capture_inserted_rows: SPI_connect failed");
        }
        let plan = INSERTS.with(|plans| {
            *plans.borrow_mut().entry(source_id).or_insert_with(|| {
                let text = CString::new(format!(
                    "INSERT INTO {} (op, event_ids) VALUES ('I', $1)",
                    eventview_core::names::changelog(source_id)
                ))
                .expect("no NUL in a changelog name");
                let mut types = [pg_sys::INT8ARRAYOID];
                let plan = pg_sys::SPI_prepare(text.as_ptr(), 1, types.as_mut_ptr());
                if plan.is_null() || pg_sys::SPI_keepplan(plan) != 0 {
                    pgrx::error!("capture_inserted_rows: cannot prepare the changelog insert");
                }
                plan
            })
        });
        let mut values = [pg_sys::Datum::from(array)];
        let nulls = [b' ' as std::ffi::c_char];
        let rc = pg_sys::SPI_execute_plan(plan, values.as_mut_ptr(), nulls.as_ptr(), false, 0);
        if rc != pg_sys::SPI_OK_INSERT as i32 {
            pgrx::error!("capture_inserted_rows: the changelog insert returned {rc}");
        }
        pg_sys::SPI_finish();
    }
}

/// Adds `keys`, with their events' `times`, to the source's key table
/// (`envelope_sql::key_insert`), taking over the claims of `eventview.ingest` when this
/// transaction made some (`eventview.keys_claimed` is on).
///
/// # Safety
/// `keys` are text datums and `times` timestamptz datums, as many; called from a firing trigger.
unsafe fn add_keys(source_id: i32, mut keys: Vec<pg_sys::Datum>, mut times: Vec<pg_sys::Datum>) {
    unsafe {
        let claimed = {
            let value = pg_sys::GetConfigOption(c"eventview.keys_claimed".as_ptr(), true, false);
            !value.is_null() && CStr::from_ptr(value).to_bytes() == b"on"
        };
        let key_array = pg_sys::construct_array(
            keys.as_mut_ptr(),
            keys.len() as i32,
            pg_sys::TEXTOID,
            -1,
            false,
            b'i' as std::ffi::c_char,
        );
        let time_array = pg_sys::construct_array(
            times.as_mut_ptr(),
            times.len() as i32,
            pg_sys::TIMESTAMPTZOID,
            8,
            true,
            b'd' as std::ffi::c_char,
        );
        if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as i32 {
            pgrx::error!("capture_inserted_rows: SPI_connect failed");
        }
        let plan = KEY_INSERTS.with(|plans| {
            *plans
                .borrow_mut()
                .entry((source_id, claimed))
                .or_insert_with(|| {
                    let text =
                        CString::new(eventview_core::envelope_sql::key_insert(source_id, claimed))
                            .expect("no NUL in a key table name");
                    let mut types = [pg_sys::TEXTARRAYOID, pg_sys::TIMESTAMPTZARRAYOID];
                    let plan = pg_sys::SPI_prepare(text.as_ptr(), 2, types.as_mut_ptr());
                    if plan.is_null() || pg_sys::SPI_keepplan(plan) != 0 {
                        pgrx::error!("capture_inserted_rows: cannot prepare the key insert");
                    }
                    plan
                })
        });
        let mut values = [
            pg_sys::Datum::from(key_array),
            pg_sys::Datum::from(time_array),
        ];
        let nulls = [b' ' as std::ffi::c_char, b' ' as std::ffi::c_char];
        let rc = pg_sys::SPI_execute_plan(plan, values.as_mut_ptr(), nulls.as_ptr(), false, 0);
        if rc != pg_sys::SPI_OK_INSERT as i32 && rc != pg_sys::SPI_OK_INSERT_RETURNING as i32 {
            pgrx::error!("capture_inserted_rows: the key insert returned {rc}");
        }
        pg_sys::SPI_finish();
    }
}
