//! Who runs what. The API functions are SECURITY INVOKER and check the caller's rights
//! explicitly; the extension's own bookkeeping then runs as the extension owner, and the work on
//! a user's data runs as the user it belongs to:
//!
//! | work                                              | runs as                      |
//! |---------------------------------------------------|------------------------------|
//! | catalog rows, changelog, capture functions, storage DDL, the field observer | extension owner |
//! | the user's event table and view relation (CREATE/DROP/REPLACE) | the caller          |
//! | a view's apply statements and fix-ups (reads the source and changelog, writes storage) | the view's owner (also when the worker or run_maintenance refreshes it) |
//!
//! Checks (SQLSTATE 42501): creating a view needs SELECT on its source; refreshing, rebuilding,
//! altering, scheduling or dropping a view needs membership in its owner role; dropping an event
//! table or declaring its fields needs membership in the table's owner role. Superusers pass.

use crate::errors::{EvError, EvResult};
use crate::pg::roles::caller;
use crate::pg::spi;
use pgrx::prelude::*;

/// The name of `role`, empty when there is no such role.
pub fn role_name(role: pg_sys::Oid) -> EvResult<String> {
    Ok(spi::one::<String>(
        "SELECT rolname::text FROM pg_catalog.pg_roles WHERE oid = $1",
        &[role.into()],
    )?
    .unwrap_or_default())
}

/// Whether the caller is a member of `role` (superusers are members of every role).
pub fn caller_acts_as(role: pg_sys::Oid) -> bool {
    crate::pg::roles::is_member_of(caller(), role)
}

/// Whether `member` has the privileges of `role` (is it, or inherits from it).
pub fn has_privileges_of(member: pg_sys::Oid, role: pg_sys::Oid) -> bool {
    crate::pg::roles::has_privileges_of(member, role)
}

/// A rollup reads its source view's storage as the rollup's owner: the caller may make one only
/// when the source's owner has the caller's rights (the same role, typically), so that nothing
/// the source's owner attaches to that storage (a row-level policy, a type with its own casts)
/// runs with rights its owner does not have anyway.
pub fn require_rollup_owner_within(
    source_relid: pg_sys::Oid,
    source_owner: pg_sys::Oid,
) -> EvResult<()> {
    if crate::pg::roles::is_member_of(source_owner, caller()) {
        return Ok(());
    }
    Err(denied(
        format!(
            "permission denied to create a rollup of view {}: its owner {} does not have the rights of role {}",
            crate::relation::regclass_text(source_relid)?,
            role_name(source_owner)?,
            role_name(caller())?
        ),
        "A rollup is made by the owner of its source view, or by a role the owner is a member of.",
    ))
}

fn denied(message: String, hint: &str) -> EvError {
    EvError::new(PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE, message)
        .with_hint(hint.to_string())
}

/// The owner of a view (refresh, rebuild, alter, schedule, drop).
pub fn require_view_owner(
    view_relid: pg_sys::Oid,
    owner: pg_sys::Oid,
    action: &str,
) -> EvResult<()> {
    if caller_acts_as(owner) {
        return Ok(());
    }
    let name = crate::relation::regclass_text(view_relid)?;
    Err(denied(
        format!(
            "permission denied to {action} view {name}: it belongs to role {}",
            role_name(owner)?
        ),
        "Only members of the view's owner role (and superusers) may do this.",
    ))
}

/// The owner of an event table (drop it, declare its fields).
pub fn require_table_owner(relid: pg_sys::Oid, action: &str) -> EvResult<()> {
    let owner = table_owner(relid)?;
    if caller_acts_as(owner) {
        return Ok(());
    }
    let name = crate::relation::regclass_text(relid)?;
    Err(denied(
        format!(
            "permission denied to {action} event table {name}: it belongs to role {}",
            role_name(owner)?
        ),
        "Only members of the table's owner role (and superusers) may do this.",
    ))
}

/// SELECT on the event table a view reads.
pub fn require_select(relid: pg_sys::Oid) -> EvResult<()> {
    let allowed = spi::one::<bool>(
        "SELECT pg_catalog.has_table_privilege($1, $2, 'SELECT')",
        &[caller().into(), relid.into()],
    )?;
    if allowed == Some(true) {
        return Ok(());
    }
    let name = crate::relation::regclass_text(relid)?;
    Err(denied(
        format!("permission denied for table {name}: creating a view over it needs SELECT on it"),
        "Ask the table's owner to GRANT SELECT on it to you.",
    ))
}

/// A view's owner may still read the event table the view reads: checked before a refresh, so
/// that losing SELECT on it gives an error naming the table (not its changelog, which the
/// refresh statement happens to check first). Also that no row-level security applies to it
/// there (`require_no_row_security`).
pub fn require_owner_reads(
    view_relid: pg_sys::Oid,
    owner: pg_sys::Oid,
    source_relid: pg_sys::Oid,
) -> EvResult<()> {
    if crate::pg::relcache::role_may_select(owner, source_relid) {
        return require_no_row_security(owner, source_relid);
    }
    Err(denied(
        format!(
            "permission denied for table {}: view {} belongs to role {}, which may no longer read it",
            crate::relation::regclass_text(source_relid)?,
            crate::relation::regclass_text(view_relid)?,
            role_name(owner)?
        ),
        "Ask the table's owner to GRANT SELECT on it to the view's owner again, or drop the view.",
    ))
}

/// No row-level security policy of the event table applies to `role`: a view aggregates every
/// row, and reads the changelog, which holds the old contents of updated and deleted rows
/// whatever the policies say, so a role the policies restrict would read through its view what
/// they hide from it (and its refreshes would add rows as filtered but take them back
/// unfiltered). Policies apply as PostgreSQL decides (`check_enable_rls`): when the table has
/// row-level security enabled, to everyone but superusers, roles with BYPASSRLS and (unless it
/// is forced) the table's owner and its members.
pub fn require_no_row_security(role: pg_sys::Oid, source_relid: pg_sys::Oid) -> EvResult<()> {
    if !crate::pg::relcache::row_security_applies_to(role, source_relid) {
        return Ok(());
    }
    Err(denied(
        format!(
            "event table {} has row-level security that applies to role {}: an incremental view aggregates every row",
            crate::relation::regclass_text(source_relid)?,
            role_name(role)?
        ),
        "Create the view as a role the policies do not apply to (the table's owner, or a role with BYPASSRLS), or disable row-level security on the table.",
    ))
}

pub fn table_owner(relid: pg_sys::Oid) -> EvResult<pg_sys::Oid> {
    spi::one::<pg_sys::Oid>(
        "SELECT relowner FROM pg_catalog.pg_class WHERE oid = $1",
        &[relid.into()],
    )?
    .ok_or_else(|| EvError::invalid("relation vanished"))
}

/// `role` as a quoted identifier, for GRANT and ALTER ... OWNER TO.
pub fn role_ident(role: pg_sys::Oid) -> EvResult<String> {
    Ok(spi::one::<String>(
        "SELECT pg_catalog.quote_ident(rolname::text) FROM pg_catalog.pg_roles WHERE oid = $1",
        &[role.into()],
    )?
    .unwrap_or_default())
}
