//! Role switches: who the current statement runs as. The API functions are SECURITY INVOKER;
//! `api_call` remembers the caller and runs the call as the extension owner, `as_role` runs work
//! as the role it belongs to, `as_caller` runs work in the caller's name.
//!
//! The switch is Postgres' own `SetUserIdAndSecContext` (as REFRESH MATERIALIZED VIEW and
//! SECURITY DEFINER functions do); the previous user is restored when the closure returns or
//! unwinds, and by the transaction or subtransaction abort of an error. Like a SECURITY DEFINER
//! function, the switched sections also pin `search_path` to `pg_catalog, pg_temp` (a GUC nest
//! level, as `SET` on a function does): no operator or function a caller put on their path can
//! be picked up by a statement running as someone else. Work in the caller's name gets the
//! caller's own search_path back (names resolve and tables are created as the caller expects).

use crate::errors::{EvError, EvResult};
use crate::pg::spi;
use pgrx::prelude::*;
use std::cell::RefCell;

/// The search_path of statements run as someone other than the caller.
const PINNED_SEARCH_PATH: &std::ffi::CStr = c"pg_catalog, pg_temp";

/// An API call in progress: who called it, with which search_path, and the role the call runs
/// as (the extension owner).
struct Caller {
    role: pg_sys::Oid,
    search_path: std::ffi::CString,
    acting: pg_sys::Oid,
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
        super::guc::set_in_nest_level(c"search_path", search_path);
        if as_someone_else {
            // The extension's own statements are short and planned from rough estimates (see
            // `eventview_core::batch::touched_rows`): JIT would spend longer compiling than they run, and
            // a Memoize over the range scan of each run of ids (which the planner believes
            // repeat) copies every row read into a cache that is never hit.
            super::guc::set_in_nest_level(c"jit", c"off");
            super::guc::set_in_nest_level(c"enable_memoize", c"off");
        }
        Restore {
            user,
            context,
            guc_level,
            keep_settings: !as_someone_else,
        }
    }
}

pub fn current_user() -> pg_sys::Oid {
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

/// Whether `member` is a member of `role` (superusers are members of every role).
pub fn is_member_of(member: pg_sys::Oid, role: pg_sys::Oid) -> bool {
    // SAFETY: a catalog lookup of role membership for two role oids.
    unsafe { pg_sys::is_member_of_role(member, role) }
}

/// Whether `member` has the privileges of `role` (is it, or inherits from it).
pub fn has_privileges_of(member: pg_sys::Oid, role: pg_sys::Oid) -> bool {
    // SAFETY: a catalog lookup of role membership for two role oids.
    unsafe { pg_sys::has_privs_of_role(member, role) }
}

/// Runs `f` as `role`, with search_path pinned.
pub fn as_role<T>(role: pg_sys::Oid, f: impl FnOnce() -> EvResult<T>) -> EvResult<T> {
    let _restore = switch_to(role, PINNED_SEARCH_PATH, true);
    f()
}

/// Runs `f` as `role`, with search_path pinned and the setting `name` at `value` until `f`
/// returns (it ends with the role switch's nest level).
pub fn as_role_with_setting<T>(
    role: pg_sys::Oid,
    name: &std::ffi::CStr,
    value: &std::ffi::CStr,
    f: impl FnOnce() -> EvResult<T>,
) -> EvResult<T> {
    let _restore = switch_to(role, PINNED_SEARCH_PATH, true);
    // SAFETY: a SAVE-action set inside the nest level switch_to pushed; `_restore` pops it.
    unsafe { super::guc::set_in_nest_level(name, value) };
    f()
}

/// Runs an API call: remembers the caller, then runs `f` as the extension owner.
pub fn api_call<T>(f: impl FnOnce() -> EvResult<T>) -> EvResult<T> {
    let owner = extension_owner()?;
    CALLERS.with(|c| {
        c.borrow_mut().push(Caller {
            role: current_user(),
            search_path: current_search_path(),
            acting: owner,
        })
    });
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            CALLERS.with(|c| c.borrow_mut().pop());
        }
    }
    let _pop = Pop;
    as_role(owner, f)
}

/// The caller of the API call in progress and their search_path, while its work runs as the
/// role the call switched to. Code that runs meanwhile as another role (a trigger on a view's
/// storage during the apply, which runs as the view's owner) and calls into the library without
/// an API call of its own acts with that role's rights, never with the caller's: None then.
fn innermost_caller() -> Option<(pg_sys::Oid, std::ffi::CString)> {
    CALLERS.with(|c| {
        c.borrow()
            .last()
            .filter(|c| c.acting == current_user())
            .map(|c| (c.role, c.search_path.clone()))
    })
}

/// The role that called the API function in progress (the current user outside of one, and
/// in code running as another role meanwhile: see `innermost_caller`).
pub fn caller() -> pg_sys::Oid {
    innermost_caller()
        .map(|(role, _)| role)
        .unwrap_or_else(current_user)
}

/// Runs `f` as the caller of the API function in progress, with the caller's search_path.
pub fn as_caller<T>(f: impl FnOnce() -> EvResult<T>) -> EvResult<T> {
    let (role, search_path) =
        innermost_caller().unwrap_or_else(|| (current_user(), current_search_path()));
    let _restore = switch_to(role, &search_path, false);
    f()
}

pub fn extension_owner() -> EvResult<pg_sys::Oid> {
    spi::one::<pg_sys::Oid>(
        "SELECT extowner FROM pg_catalog.pg_extension WHERE extname = 'pg_eventview'",
        &[],
    )?
    .ok_or_else(|| {
        EvError::new(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            "extension pg_eventview is not installed",
        )
    })
}
