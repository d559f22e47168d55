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
