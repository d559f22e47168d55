//! Configuration settings changed for the span of a GUC nest level.

use crate::errors::EvResult;
use pgrx::prelude::*;

/// Sets `name` to `value` until the innermost GUC nest level (`pg_sys::NewGUCNestLevel`) is
/// popped, as a function's SET clause does (a SAVE action: the previous value comes back with
/// `AtEOXact_GUC`, or with the (sub)transaction abort of an error).
///
/// # Safety
/// The caller has pushed a nest level it pops again, in the same backend.
pub unsafe fn set_in_nest_level(name: &std::ffi::CStr, value: &std::ffi::CStr) {
    pgrx::pg_sys::set_config_option(
        name.as_ptr(),
        value.as_ptr(),
        pgrx::pg_sys::GucContext::PGC_USERSET,
        pgrx::pg_sys::GucSource::PGC_S_SESSION,
        pgrx::pg_sys::GucAction::GUC_ACTION_SAVE,
        true,
        0,
        false,
    );
}

/// Runs `f` with the setting `name` at `value`, as a function's SET clause would: the previous
/// value comes back when `f` returns or unwinds.
pub fn with_setting<T>(
    name: &std::ffi::CStr,
    value: &std::ffi::CStr,
    f: impl FnOnce() -> EvResult<T>,
) -> EvResult<T> {
    struct Pop(i32);
    impl Drop for Pop {
        fn drop(&mut self) {
            // SAFETY: pops the nest level pushed below, in the same backend (after an error,
            // the (sub)transaction abort does the same; the call is then harmless).
            unsafe { pg_sys::AtEOXact_GUC(true, self.0) };
        }
    }
    // SAFETY: a new nest level, popped by `Pop`; the SAVE-action set lives inside it.
    let _pop = Pop(unsafe { pg_sys::NewGUCNestLevel() });
    // SAFETY: inside the nest level just pushed.
    unsafe { set_in_nest_level(name, value) };
    f()
}

/// Reads the configuration files again, as the postmaster does on SIGHUP. Called from a
/// background worker's main loop, outside any transaction.
pub fn reload_config_file() {
    // SAFETY: called outside any transaction, as the postmaster's own SIGHUP handling does.
    unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
}
