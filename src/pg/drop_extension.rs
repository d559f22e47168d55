//! The event trigger `eventview_before_drop_extension` (ON ddl_command_start WHEN TAG IN
//! ('DROP EXTENSION')): before a DROP EXTENSION that names pg_eventview, removes what the
//! extension made at run time (`teardown::before_drop_extension`). Native, because whether the
//! command says CASCADE is in its parse tree only.

use crate::errors::EvError;
use pgrx::prelude::*;
use std::ffi::CStr;

/// Tells Postgres that `before_drop_extension` uses the version-1 calling convention.
#[unsafe(no_mangle)]
#[doc(hidden)]
pub extern "C" fn pg_finfo_before_drop_extension() -> &'static pg_sys::Pg_finfo_record {
    const V1_API: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1_API
}

/// # Safety
/// Called by Postgres' function manager with a valid `fcinfo`.
#[pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn before_drop_extension(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: fcinfo is valid for this call; an event trigger's context is its
    // EventTriggerData, and its parse tree a node, each checked by tag before it is read as one.
    let cascade = unsafe { dropping_this_extension(fcinfo) };
    if let Some(cascade) = cascade {
        if let Err(error) = crate::teardown::before_drop_extension(cascade) {
            raise(error);
        }
    }
    pg_sys::Datum::from(0)
}

fn raise(error: EvError) -> ! {
    error.into_report().report(PgLogLevel::ERROR);
    unreachable!("an ERROR does not return")
}

/// When the firing command is a DROP EXTENSION naming pg_eventview: whether it says CASCADE.
///
/// # Safety
/// `fcinfo` is the call info of an event trigger function call (or of any other call, which
/// is refused).
unsafe fn dropping_this_extension(fcinfo: pg_sys::FunctionCallInfo) -> Option<bool> {
    unsafe {
        let context = (*fcinfo).context;
        if context.is_null() || (*context).type_ != pg_sys::NodeTag::T_EventTriggerData {
            raise(
                EvError::new(
                    PgSqlErrorCode::ERRCODE_E_R_I_E_EVENT_TRIGGER_PROTOCOL_VIOLATED,
                    "before_drop_extension is not called by an event trigger",
                )
                .with_hint("It is pg_eventview's own event trigger function."),
            );
        }
        let parsetree = (*(context as *const pg_sys::EventTriggerData)).parsetree;
        if parsetree.is_null() || (*parsetree).type_ != pg_sys::NodeTag::T_DropStmt {
            return None;
        }
        let drop = &*(parsetree as *const pg_sys::DropStmt);
        if drop.removeType != pg_sys::ObjectType::OBJECT_EXTENSION || drop.objects.is_null() {
            return None;
        }
        let objects = &*drop.objects;
        let names_this = (0..objects.length as usize).any(|i| {
            let node = (*objects.elements.add(i)).ptr_value as *const pg_sys::Node;
            !node.is_null()
                && (*node).type_ == pg_sys::NodeTag::T_String
                && !(*(node as *const pg_sys::String)).sval.is_null()
                && CStr::from_ptr((*(node as *const pg_sys::String)).sval).to_bytes()
                    == b"pg_eventview"
        });
        names_this.then_some(drop.behavior == pg_sys::DropBehavior::DROP_CASCADE)
    }
}
