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
//!
//! The switch is Postgres' own `SetUserIdAndSecContext` (as REFRESH MATERIALIZED VIEW and
//! SECURITY DEFINER functions do); the previous user is restored when the closure returns or
//! unwinds, and by the transaction or subtransaction abort of an error. Like a SECURITY DEFINER
//! function, the switched sections also pin `search_path` to `pg_catalog, pg_temp` (a GUC nest
//! level, as `SET` on a function does): no operator or function a caller put on their path can
//! be picked up by a statement running as someone else. Work in the caller's name gets the
//! caller's own search_path back (names resolve and tables are created as the caller expects).

use crate::errors::{EvError, EvResult};
use crate::spi_util;
use pgrx::prelude::*;
use std::cell::RefCell;

/// The search_path of statements run as someone other than the caller.
const PINNED_SEARCH_PATH: &std::ffi::CStr = c"pg_catalog, pg_temp";

/// An API call in progress: who called it, with which search_path.
struct Caller {
    role: pg_sys::Oid,
    search_path: std::ffi::CString,
}

thread_local! {
    /// The callers of the API calls in progress, innermost last.
    static CALLERS: RefCell<Vec<Caller>> = const { RefCell::new(Vec::new()) };
}

/// Restores the user id, security context and configuration saved by `switch_to`.
struct Restore {
    user: pg_sys::Oid,
    context: i32,
    guc_level: i32,
    /// Keep configuration changes made inside (the caller's own actions) or drop them.
    keep_settings: bool,
}

impl Drop for Restore {
    fn drop(&mut self) {
        // SAFETY: undoes `switch_to` in the same backend, innermost first, as Postgres' fmgr
        // does after a SECURITY DEFINER function with SET clauses. (After an error the
        // (sub)transaction abort does the same; these calls are then harmless.)
        unsafe {
            pg_sys::AtEOXact_GUC(self.keep_settings, self.guc_level);
            pg_sys::SetUserIdAndSecContext(self.user, self.context);
        }
    }
}

/// Switches to `role` with `search_path`. For anyone but the caller the operation is also
/// security-restricted and settings changed inside are dropped on the way out, as REFRESH
/// MATERIALIZED VIEW does: code of theirs that runs meanwhile (a trigger on their storage, a
/// type's function) can neither SET ROLE nor leave a setting behind for the caller's next
/// statements.
fn switch_to(role: pg_sys::Oid, search_path: &std::ffi::CStr, as_someone_else: bool) -> Restore {
    let mut user = pg_sys::InvalidOid;
    let mut context: i32 = 0;
    let mut flags = pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32;
    if as_someone_else {
        flags |= pg_sys::SECURITY_RESTRICTED_OPERATION as i32;
    }
    // SAFETY: reads and writes of the backend's current user id, security context and
    // configuration, as fmgr_security_definer does (a new GUC nest level, a SAVE-action set).
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        let guc_level = pg_sys::NewGUCNestLevel();
        pg_sys::SetUserIdAndSecContext(role, context | flags);
        crate::gucs::set_in_nest_level(c"search_path", search_path);
        if as_someone_else {
            // The extension's own statements are short and planned from rough estimates (see
            // `eventview_core::batch::touched_rows`): JIT would spend longer compiling than they run, and
            // a Memoize over the range scan of each run of ids (which the planner believes
            // repeat) copies every row read into a cache that is never hit.
            crate::gucs::set_in_nest_level(c"jit", c"off");
            crate::gucs::set_in_nest_level(c"enable_memoize", c"off");
        }
        Restore { user, context, guc_level, keep_settings: !as_someone_else }
    }
}

fn current_user() -> pg_sys::Oid {
    // SAFETY: reads the backend's current user id.
    unsafe { pg_sys::GetUserId() }
}

fn current_search_path() -> std::ffi::CString {
    // SAFETY: reads a configuration value Postgres always has; copied before anything changes it.
    unsafe {
        let value = pg_sys::GetConfigOption(c"search_path".as_ptr(), false, false);
        std::ffi::CStr::from_ptr(value).to_owned()
    }
}

/// Runs `f` as `role`, with search_path pinned.
pub fn as_role<T>(role: pg_sys::Oid, f: impl FnOnce() -> EvResult<T>) -> EvResult<T> {
    let _restore = switch_to(role, PINNED_SEARCH_PATH, true);
    f()
}

/// Runs an API call: remembers the caller, then runs `f` as the extension owner.
pub fn api_call<T>(f: impl FnOnce() -> EvResult<T>) -> EvResult<T> {
    let owner = extension_owner()?;
    CALLERS.with(|c| c.borrow_mut().push(Caller { role: current_user(), search_path: current_search_path() }));
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            CALLERS.with(|c| c.borrow_mut().pop());
        }
    }
    let _pop = Pop;
    as_role(owner, f)
}

/// The role that called the API function in progress (the current user outside of one).
pub fn caller() -> pg_sys::Oid {
    CALLERS.with(|c| c.borrow().last().map(|c| c.role)).unwrap_or_else(current_user)
}

/// Runs `f` as the caller of the API function in progress, with the caller's search_path.
pub fn as_caller<T>(f: impl FnOnce() -> EvResult<T>) -> EvResult<T> {
    let (role, search_path) = CALLERS
        .with(|c| c.borrow().last().map(|c| (c.role, c.search_path.clone())))
        .unwrap_or_else(|| (current_user(), current_search_path()));
    let _restore = switch_to(role, &search_path, false);
    f()
}

fn extension_owner() -> EvResult<pg_sys::Oid> {
    spi_util::one::<pg_sys::Oid>(
        "SELECT extowner FROM pg_catalog.pg_extension WHERE extname = 'pg_eventview'",
        &[],
    )?
    .ok_or_else(|| EvError::new(PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT, "extension pg_eventview is not installed"))
}

fn role_name(role: pg_sys::Oid) -> EvResult<String> {
    Ok(spi_util::one::<String>("SELECT rolname::text FROM pg_catalog.pg_roles WHERE oid = $1", &[role.into()])?
        .unwrap_or_default())
}

/// Whether the caller is a member of `role` (superusers are members of every role).
pub fn caller_acts_as(role: pg_sys::Oid) -> bool {
    // SAFETY: a catalog lookup of role membership for two valid role oids.
    unsafe { pg_sys::is_member_of_role(caller(), role) }
}

/// Whether `member` has the privileges of `role` (is it, or inherits from it).
pub fn has_privileges_of(member: pg_sys::Oid, role: pg_sys::Oid) -> bool {
    // SAFETY: a catalog lookup of role membership for two role oids.
    unsafe { pg_sys::has_privs_of_role(member, role) }
}

fn denied(message: String, hint: &str) -> EvError {
    EvError::new(PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE, message).with_hint(hint.to_string())
}

/// The owner of a view (refresh, rebuild, alter, schedule, drop).
pub fn require_view_owner(view_relid: pg_sys::Oid, owner: pg_sys::Oid, action: &str) -> EvResult<()> {
    if caller_acts_as(owner) {
        return Ok(());
    }
    let name = crate::relation::regclass_text(view_relid)?;
    Err(denied(
        format!("permission denied to {action} view {name}: it belongs to role {}", role_name(owner)?),
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
        format!("permission denied to {action} event table {name}: it belongs to role {}", role_name(owner)?),
        "Only members of the table's owner role (and superusers) may do this.",
    ))
}

/// SELECT on the event table a view reads.
pub fn require_select(relid: pg_sys::Oid) -> EvResult<()> {
    let allowed = spi_util::one::<bool>(
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
pub fn require_owner_reads(view_relid: pg_sys::Oid, owner: pg_sys::Oid, source_relid: pg_sys::Oid) -> EvResult<()> {
    let allowed = spi_util::one::<bool>(
        "SELECT pg_catalog.has_table_privilege($1, $2, 'SELECT')",
        &[owner.into(), source_relid.into()],
    )?;
    if allowed == Some(true) {
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
    let applies = spi_util::one::<bool>(
        "SELECT c.relrowsecurity
                AND NOT (SELECT r.rolsuper OR r.rolbypassrls FROM pg_catalog.pg_roles r WHERE r.oid = $1)
                AND (c.relforcerowsecurity OR NOT pg_catalog.pg_has_role($1, c.relowner, 'USAGE'))
         FROM pg_catalog.pg_class c WHERE c.oid = $2",
        &[role.into(), source_relid.into()],
    )?;
    if applies != Some(true) {
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
    spi_util::one::<pg_sys::Oid>("SELECT relowner FROM pg_catalog.pg_class WHERE oid = $1", &[relid.into()])?
        .ok_or_else(|| EvError::invalid("relation vanished"))
}

/// `role` as a quoted identifier, for GRANT and ALTER ... OWNER TO.
pub fn role_ident(role: pg_sys::Oid) -> EvResult<String> {
    Ok(spi_util::one::<String>(
        "SELECT pg_catalog.quote_ident(rolname::text) FROM pg_catalog.pg_roles WHERE oid = $1",
        &[role.into()],
    )?
    .unwrap_or_default())
}
