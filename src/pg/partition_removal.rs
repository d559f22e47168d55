//! The event trigger `eventview_before_partition_removal` (ON ddl_command_start WHEN TAG IN
//! ('DROP TABLE', 'ALTER TABLE', 'DROP SCHEMA', 'DROP OWNED')): before a DROP TABLE that names
//! partitions of event tables, a DROP SCHEMA ... CASCADE or DROP OWNED that takes some along, or
//! an ALTER TABLE ... DETACH PARTITION of one, checks that no view still needs their events
//! (`partitions::before_removal`). Native, because what the command removes is in its parse
//! tree only; by the end of a DROP their rows are gone, and by the end of a DETACH ...
//! CONCURRENTLY its first transaction has committed the partition out of the table's reads.

use crate::errors::EvError;
use crate::partitions::{Dropped, Removal};
use pgrx::prelude::*;

/// Tells Postgres that `before_partition_removal` uses the version-1 calling convention.
#[unsafe(no_mangle)]
#[doc(hidden)]
pub extern "C" fn pg_finfo_before_partition_removal() -> &'static pg_sys::Pg_finfo_record {
    const V1_API: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1_API
}

/// # Safety
/// Called by Postgres' function manager with a valid `fcinfo`.
#[pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn before_partition_removal(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: fcinfo is valid for this call; an event trigger's context is its
    // EventTriggerData, and its parse tree a node, each checked by tag before it is read as one.
    let (named, removal) = unsafe { named_for_removal(fcinfo) };
    let checked = crate::partitions::tables_dropped(named).and_then(|tables| {
        if tables.is_empty() {
            Ok(())
        } else {
            crate::partitions::before_removal(&tables, removal)
        }
    });
    if let Err(error) = checked {
        raise(error);
    }
    pg_sys::Datum::from(0)
}

fn raise(error: EvError) -> ! {
    error.into_report().report(PgLogLevel::ERROR);
    unreachable!("an ERROR does not return")
}

/// What the command removes: the existing tables a DROP TABLE names, the schemas of a DROP
/// SCHEMA ... CASCADE or the roles of a DROP OWNED (a name that resolves to nothing is left to
/// the command, which refuses it or skips it with IF EXISTS), or the partitions an ALTER TABLE
/// detaches; and which of the two removals it is.
///
/// # Safety
/// `fcinfo` is the call info of an event trigger function call (or of any other call, which
/// is refused).
unsafe fn named_for_removal(fcinfo: pg_sys::FunctionCallInfo) -> (Dropped, Removal) {
    let nothing = (Dropped::Tables(Vec::new()), Removal::Drop);
    unsafe {
        let context = (*fcinfo).context;
        if context.is_null() || (*context).type_ != pg_sys::NodeTag::T_EventTriggerData {
            raise(
                EvError::new(
                    PgSqlErrorCode::ERRCODE_E_R_I_E_EVENT_TRIGGER_PROTOCOL_VIOLATED,
                    "before_partition_removal is not called by an event trigger",
                )
                .with_hint("It is pg_eventview's own event trigger function."),
            );
        }
        let parsetree = (*(context as *const pg_sys::EventTriggerData)).parsetree;
        if parsetree.is_null() {
            return nothing;
        }
        match (*parsetree).type_ {
            pg_sys::NodeTag::T_DropStmt => {
                let drop = &*(parsetree as *const pg_sys::DropStmt);
                if drop.objects.is_null() {
                    return nothing;
                }
                let objects = &*drop.objects;
                let object = |i: usize| (*objects.elements.add(i)).ptr_value as *mut pg_sys::Node;
                match drop.removeType {
                    pg_sys::ObjectType::OBJECT_TABLE => {
                        let mut tables = Vec::new();
                        for i in 0..objects.length as usize {
                            let name = object(i) as *mut pg_sys::List;
                            if !name.is_null() && (*name).type_ == pg_sys::NodeTag::T_List {
                                tables.extend(existing(pg_sys::makeRangeVarFromNameList(name)));
                            }
                        }
                        (Dropped::Tables(tables), Removal::Drop)
                    }
                    // Without CASCADE a schema that holds a table is not dropped.
                    pg_sys::ObjectType::OBJECT_SCHEMA
                        if drop.behavior == pg_sys::DropBehavior::DROP_CASCADE =>
                    {
                        let mut schemas = Vec::new();
                        for i in 0..objects.length as usize {
                            let name = object(i);
                            if !name.is_null() && (*name).type_ == pg_sys::NodeTag::T_String {
                                let name = (*(name as *const pg_sys::String)).sval;
                                let schema = pg_sys::get_namespace_oid(name, true);
                                if schema != pg_sys::InvalidOid {
                                    schemas.push(schema);
                                }
                            }
                        }
                        (Dropped::Schemas(schemas), Removal::Drop)
                    }
                    _ => nothing,
                }
            }
            pg_sys::NodeTag::T_DropOwnedStmt => {
                let drop = &*(parsetree as *const pg_sys::DropOwnedStmt);
                let mut roles = Vec::new();
                if !drop.roles.is_null() {
                    let names = &*drop.roles;
                    for i in 0..names.length as usize {
                        let role = (*names.elements.add(i)).ptr_value as *const pg_sys::RoleSpec;
                        if !role.is_null() && (*role).type_ == pg_sys::NodeTag::T_RoleSpec {
                            let role = pg_sys::get_rolespec_oid(role, true);
                            if role != pg_sys::InvalidOid {
                                roles.push(role);
                            }
                        }
                    }
                }
                let cascade = drop.behavior == pg_sys::DropBehavior::DROP_CASCADE;
                (Dropped::OwnedBy { roles, cascade }, Removal::Drop)
            }
            pg_sys::NodeTag::T_AlterTableStmt => {
                let alter = &*(parsetree as *const pg_sys::AlterTableStmt);
                let mut out = Vec::new();
                let mut concurrently = false;
                if alter.cmds.is_null() {
                    return (Dropped::Tables(out), Removal::Detach { concurrently });
                }
                let cmds = &*alter.cmds;
                for i in 0..cmds.length as usize {
                    let cmd = (*cmds.elements.add(i)).ptr_value as *const pg_sys::AlterTableCmd;
                    if cmd.is_null()
                        || (*cmd).type_ != pg_sys::NodeTag::T_AlterTableCmd
                        || (*cmd).subtype != pg_sys::AlterTableType::AT_DetachPartition
                        || (*cmd).def.is_null()
                        || (*(*cmd).def).type_ != pg_sys::NodeTag::T_PartitionCmd
                    {
                        continue;
                    }
                    let partition = &*((*cmd).def as *const pg_sys::PartitionCmd);
                    concurrently |= partition.concurrent;
                    if !partition.name.is_null() {
                        out.extend(existing(partition.name));
                    }
                }
                (Dropped::Tables(out), Removal::Detach { concurrently })
            }
            _ => nothing,
        }
    }
}

/// The relation `relation` names, if it exists.
///
/// # Safety
/// `relation` is a valid RangeVar.
unsafe fn existing(relation: *mut pg_sys::RangeVar) -> Option<pg_sys::Oid> {
    let relid = unsafe {
        pg_sys::RangeVarGetRelidExtended(
            relation,
            pg_sys::NoLock as pg_sys::LOCKMODE,
            pg_sys::RVROption::RVR_MISSING_OK,
            None,
            std::ptr::null_mut(),
        )
    };
    (relid != pg_sys::InvalidOid).then_some(relid)
}
