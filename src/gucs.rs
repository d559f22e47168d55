//! Configuration parameters. Only user-settable ones for now: defining a Postmaster-context
//! parameter without shared_preload_libraries would break CREATE EXTENSION.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};

/// Largest payload (bytes of its JSON text) `ingest` accepts; larger ones go to quarantine.
pub static MAX_PAYLOAD_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);

pub fn define() {
    GucRegistry::define_int_guc(
        c"eventview.max_payload_bytes",
        c"Largest event payload, in bytes of JSON text, that eventview.ingest accepts.",
        c"Larger payloads are put in eventview.quarantine with their reason instead of being inserted.",
        &MAX_PAYLOAD_BYTES,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_BYTE,
    );
}
