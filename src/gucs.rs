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
pub static DATABASES: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"postgres"));
/// Time between two maintenance ticks, in milliseconds.
pub static NAPTIME_MS: GucSetting<i32> = GucSetting::<i32>::new(1000);
/// Rows `prune` deletes per event table and call, for the changelog and for raw events each.
pub static PRUNE_MAX_ROWS: GucSetting<i32> = GucSetting::<i32>::new(200_000);
/// Min/max values a stored view may hold in its append-only logs before a refresh merges them
/// into its value multisets (see `eventview_core::sqlgen`).
pub static EXTREME_LOG_LIMIT: GucSetting<i32> = GucSetting::<i32>::new(100_000);
/// How long the worker's maintenance waits for a lock, in milliseconds (0: as long as it takes).
pub static MAINTENANCE_LOCK_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(10_000);
/// How many partitions of a partitioned event table `run_maintenance` keeps made ahead of the
/// one holding the present.
pub static PARTITION_PREMAKE: GucSetting<i32> = GucSetting::<i32>::new(4);
/// The fewest record numbers a changelog segment covers (`eventview_core::changelog_segments`).
pub static CHANGELOG_SEGMENT_MIN: GucSetting<i32> = GucSetting::<i32>::new(1000);
/// The most record numbers a changelog segment covers.
pub static CHANGELOG_SEGMENT_MAX: GucSetting<i32> = GucSetting::<i32>::new(i32::MAX);
/// Whether the worker runs maintenance at all.
pub static WORKER_ENABLED: GucSetting<bool> = GucSetting::<bool>::new(true);
/// `eventview.one_pass_refresh`: a refresh of a view the pass in Rust covers reads its events
/// in that pass (`ViewSql::apply_in_one_pass`); off, in the apply statement's SQL stages.
pub static ONE_PASS_REFRESH: GucSetting<bool> = GucSetting::<bool>::new(true);

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
        c"Longest time between two runs of eventview.run_maintenance() by the background worker.",
        c"Takes effect at the next tick after a configuration reload.",
        &NAPTIME_MS,
        10,
        24 * 3600 * 1000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"eventview.partition_premake",
        c"Partitions of each partitioned event table made ahead of the present one.",
        c"create_event_table and run_maintenance make them; events beyond them go to the table's default partition until their partition is made.",
        &PARTITION_PREMAKE,
        1,
        10_000,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"eventview.changelog_segment_min",
        c"Fewest changelog records a changelog segment is made for.",
        c"Segments are sized for the record rate; a slow changelog's segments hold at least this many records, a new changelog's first one ten times as many (at most eventview.changelog_segment_max). Applied records go with their whole segment, or by DELETE while it fills.",
        &CHANGELOG_SEGMENT_MIN,
        10,
        1 << 30,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"eventview.changelog_segment_max",
        c"Most changelog records a changelog segment is made for.",
        c"Bounds the records a segment holds whatever the record rate (a segment goes whole once complete); at least eventview.changelog_segment_min wins.",
        &CHANGELOG_SEGMENT_MAX,
        10,
        i32::MAX,
        GucContext::Userset,
        GucFlags::default(),
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
    GucRegistry::define_int_guc(
        c"eventview.extreme_log_limit",
        c"Most min/max values a view keeps in its append-only logs before a refresh merges them into its value multisets.",
        c"A refresh that retracts, or that has nothing to apply, merges them anyway; 0 keeps no logs (refreshes write the multisets).",
        &EXTREME_LOG_LIMIT,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"eventview.maintenance_lock_timeout",
        c"Longest the background worker's run_maintenance() waits for a lock (lock_timeout of its transactions); 0 waits as long as it takes.",
        c"A view whose event table another session holds locked (ALTER TABLE, VACUUM FULL, LOCK TABLE, REINDEX) is skipped without waiting and tried again at the next run, and so is the pruning of its raw events; a wait for any other lock that times out fails the view's refresh (recorded in last_error and retried later) or the prune (a warning); the other views go on. Takes effect on reload.",
        &MAINTENANCE_LOCK_TIMEOUT_MS,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_bool_guc(
        c"eventview.worker",
        c"Whether the pg_eventview background worker runs maintenance.",
        c"off leaves scheduling to pg_cron or to manual calls. Takes effect on reload.",
        &WORKER_ENABLED,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"eventview.one_pass_refresh",
        c"Whether a refresh reads its events in one pass in Rust, for the views that pass covers.",
        c"off reads them in the SQL stages of the apply statement, as for every other view. The two give the same result.",
        &ONE_PASS_REFRESH,
        GucContext::Userset,
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

pub fn extreme_log_limit() -> i64 {
    i64::from(EXTREME_LOG_LIMIT.get())
}

pub fn naptime() -> Duration {
    Duration::from_millis(NAPTIME_MS.get().max(10) as u64)
}

/// The database names of `eventview.databases`, trimmed, without empties or repeats.
pub fn worker_databases() -> Vec<String> {
    let raw = DATABASES
        .get()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut out: Vec<String> = Vec::new();
    for name in raw.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !out.iter().any(|o| o == name) {
            out.push(name.to_string());
        }
    }
    out
}

/// The narrowest changelog segment to make (`eventview.changelog_segment_min`).
pub fn changelog_segment_min() -> i64 {
    i64::from(CHANGELOG_SEGMENT_MIN.get())
}

/// The widest changelog segment to make (`eventview.changelog_segment_max`).
pub fn changelog_segment_max() -> i64 {
    i64::from(CHANGELOG_SEGMENT_MAX.get())
}

/// The width of a new changelog's first segment.
pub fn changelog_first_segment() -> i64 {
    eventview_core::changelog_segments::first_width(
        changelog_segment_min(),
        changelog_segment_max(),
    )
}
