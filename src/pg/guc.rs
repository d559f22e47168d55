//! Configuration settings changed for the span of a GUC nest level.

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
