//! Stored jsonb datums as the bytes `eventview_core::jsonb_bytes` reads.

/// The bytes of a jsonb datum's root container.
///
/// # Safety
/// `datum` must be a non-null jsonb datum, alive while the returned slice is used.
pub unsafe fn jsonb_root<'a>(datum: pgrx::pg_sys::Datum) -> &'a [u8] {
    use pgrx::pg_sys;
    // Detoasted, and a short header made a full one (the container must be 4-byte aligned).
    let value = pg_sys::pg_detoast_datum(datum.cast_mut_ptr::<pg_sys::varlena>());
    let bytes = value as *const u8;
    let total = pgrx::varsize_any(value);
    std::slice::from_raw_parts(
        bytes.add(pg_sys::VARHDRSZ),
        total.saturating_sub(pg_sys::VARHDRSZ),
    )
}

/// The bytes of a jsonb argument declared `anyelement` (so the stored datum reaches the
/// function as it is, not as text); None when its type is not jsonb (or, with `domains`, a
/// domain over jsonb).
pub fn jsonb_argument(arg: &pgrx::AnyElement, domains: bool) -> Option<&[u8]> {
    let type_oid = if domains {
        // SAFETY: a catalog lookup of the argument's type.
        unsafe { pgrx::pg_sys::getBaseType(arg.oid()) }
    } else {
        arg.oid()
    };
    if type_oid != pgrx::pg_sys::JSONBOID {
        return None;
    }
    // SAFETY: a non-null jsonb datum (pgrx passes SQL NULL as None), alive while `arg` is.
    Some(unsafe { jsonb_root(arg.datum()) })
}
