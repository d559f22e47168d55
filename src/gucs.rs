//! Configuration parameters.
//!
//! `eventview.databases` decides which workers exist, so it is read at server start
//! (Postmaster context) and defined only while shared_preload_libraries is processed: a
//! Postmaster parameter defined later would make CREATE EXTENSION fail.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::ffi::CString;
use std::time::Duration;

/// Largest payload (bytes of its JSON text) `ingest` accepts; larger ones go to quarantine.
pub static MAX_PAYLOAD_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);
/// Databases the background worker maintains, comma-separated.
pub static DATABASES: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"postgres"));
/// Time between two maintenance ticks, in milliseconds.
pub static NAPTIME_MS: GucSetting<i32> = GucSetting::<i32>::new(1000);
/// Rows `prune` deletes per event table and call, for the changelog and for raw events each.
pub static PRUNE_MAX_ROWS: GucSetting<i32> = GucSetting::<i32>::new(200_000);
/// Whether the worker runs maintenance at all.
pub static WORKER_ENABLED: GucSetting<bool> = GucSetting::<bool>::new(true);

pub fn define(preloading: bool) {
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
    GucRegistry::define_int_guc(
        c"eventview.naptime",
        c"Time between two runs of eventview.run_maintenance() by the background worker.",
        c"Takes effect at the next tick after a configuration reload.",
        &NAPTIME_MS,
        10,
        24 * 3600 * 1000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"eventview.prune_max_rows",
        c"Most changelog records, and most raw events, eventview.prune() deletes per event table in one call.",
        c"Bounds the work and the transaction of one call; the worker and pg_cron call it every cycle.",
        &PRUNE_MAX_ROWS,
        1000,
        i32::MAX,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"eventview.worker",
        c"Whether the pg_eventview background worker runs maintenance.",
        c"off leaves scheduling to pg_cron or to manual calls. Takes effect on reload.",
        &WORKER_ENABLED,
        GucContext::Sighup,
        GucFlags::default(),
    );
    if preloading {
        GucRegistry::define_string_guc(
            c"eventview.databases",
            c"Databases in which the pg_eventview background worker runs maintenance (comma-separated).",
            c"One worker per database; read at server start.",
            &DATABASES,
            GucContext::Postmaster,
            GucFlags::default(),
        );
    }
}

pub fn naptime() -> Duration {
    Duration::from_millis(NAPTIME_MS.get().max(10) as u64)
}

/// The database names of `eventview.databases`, trimmed, without empties or repeats.
pub fn worker_databases() -> Vec<String> {
    let raw = DATABASES.get().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
    let mut out: Vec<String> = Vec::new();
    for name in raw.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !out.iter().any(|o| o == name) {
            out.push(name.to_string());
        }
    }
    out
}
