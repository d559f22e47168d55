//! The event trigger `eventview_before_drop_table` (ON ddl_command_start WHEN TAG IN ('DROP
//! TABLE')): before a DROP TABLE that names partitions of event tables, checks that no view
//! still needs their events (`partitions::before_drop_tables`). Native, because which tables the
//! command drops is in its parse tree only, and by the end of the command their rows are gone.

use crate::errors::EvError;
use pgrx::prelude::*;

/// Tells Postgres that `before_drop_table` uses the version-1 calling convention.
#[unsafe(no_mangle)]
#[doc(hidden)]
pub extern "C" fn pg_finfo_before_drop_table() -> &'static pg_sys::Pg_finfo_record {
    const V1_API: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1_API
}

/// # Safety
/// Called by Postgres' function manager with a valid `fcinfo`.
#[pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn before_drop_table(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: fcinfo is valid for this call; an event trigger's context is its
    // EventTriggerData, and its parse tree a node, each checked by tag before it is read as one.
    let tables = unsafe { tables_dropped(fcinfo) };
    if !tables.is_empty() {
        if let Err(error) = crate::partitions::before_drop_tables(&tables) {
            raise(error);
        }
    }
    pg_sys::Datum::from(0)
}

fn raise(error: EvError) -> ! {
    error.into_report().report(PgLogLevel::ERROR);
    unreachable!("an ERROR does not return")
}

/// The existing tables a DROP TABLE names (a name that resolves to nothing is left to the
/// command, which refuses it or skips it with IF EXISTS).
///
/// # Safety
/// `fcinfo` is the call info of an event trigger function call (or of any other call, which
/// is refused).
unsafe fn tables_dropped(fcinfo: pg_sys::FunctionCallInfo) -> Vec<pg_sys::Oid> {
    unsafe {
        let context = (*fcinfo).context;
        if context.is_null() || (*context).type_ != pg_sys::NodeTag::T_EventTriggerData {
            raise(
                EvError::new(
                    PgSqlErrorCode::ERRCODE_E_R_I_E_EVENT_TRIGGER_PROTOCOL_VIOLATED,
                    "before_drop_table is not called by an event trigger",
                )
                .with_hint("It is pg_eventview's own event trigger function."),
            );
        }
        let parsetree = (*(context as *const pg_sys::EventTriggerData)).parsetree;
        if parsetree.is_null() || (*parsetree).type_ != pg_sys::NodeTag::T_DropStmt {
            return Vec::new();
        }
        let drop = &*(parsetree as *const pg_sys::DropStmt);
        if drop.removeType != pg_sys::ObjectType::OBJECT_TABLE || drop.objects.is_null() {
            return Vec::new();
        }
        let objects = &*drop.objects;
        let mut out = Vec::new();
        for i in 0..objects.length as usize {
            let name = (*objects.elements.add(i)).ptr_value as *mut pg_sys::List;
            if name.is_null() || (*name).type_ != pg_sys::NodeTag::T_List {
                continue;
            }
            let relation = pg_sys::makeRangeVarFromNameList(name);
            let relid = pg_sys::RangeVarGetRelidExtended(
                relation,
                pg_sys::NoLock as pg_sys::LOCKMODE,
                pg_sys::RVROption::RVR_MISSING_OK,
                None,
                std::ptr::null_mut(),
            );
            if relid != pg_sys::InvalidOid {
                out.push(relid);
            }
        }
        out
    }
}
