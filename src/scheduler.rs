//! The background worker: with `shared_preload_libraries = 'pg_eventview'`, one worker per
//! database listed in `eventview.databases` calls `eventview.run_maintenance()` every
//! `eventview.naptime`, the same function pg_cron calls, so both paths run the same code.
//!
//! Loop (after pg_cron's launcher): wait on the latch (SIGTERM ends the loop at once); on
//! SIGHUP reload the configuration (naptime and `eventview.worker` take effect at the next
//! tick); run one tick in its own transaction when it is due (`Ticks`): a naptime after the
//! last one, or, once a transaction that captured changes has committed and set the latch
//! (`pg::wakeup`), when the first scheduled view is due. So a view scheduled every 100 ms shows
//! a commit within about 100 ms plus its refresh, whatever the naptime, and a database without
//! commits costs one tick per naptime. A database without the extension is left alone. Errors inside one view are recorded by run_maintenance and do not stop the others;
//! waits for locks end after `eventview.maintenance_lock_timeout` (such an error is one too);
//! anything else ends the worker, which the postmaster restarts after `RESTART_AFTER` (this
//! also covers a database listed before it exists).

use crate::gucs;
use eventview_core::ticks::{Next, Ticks};
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::prelude::*;
use std::time::{Duration, Instant};

/// How long the postmaster waits before restarting a worker that exited with an error.
const RESTART_AFTER: Duration = Duration::from_secs(5);

/// Registers one worker per database. Only valid while shared_preload_libraries is processed.
pub fn register_workers() {
    for db in gucs::worker_databases() {
        BackgroundWorkerBuilder::new(&format!("pg_eventview worker {db}"))
            .set_type("pg_eventview worker")
            .set_function("eventview_worker_main")
            .set_library("pg_eventview")
            .set_extra(&db)
            .enable_spi_access()
            .set_restart_time(Some(RESTART_AFTER))
            .load();
    }
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn eventview_worker_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let db = BackgroundWorker::get_extra().to_string();
    BackgroundWorker::connect_worker_to_spi(Some(&db), None);
    crate::pg::wakeup::register_this_worker();
    log!("pg_eventview worker started in database \"{db}\"");
    // The catalog version last found behind this library's, said once (not at every naptime).
    let mut told_behind: Option<String> = None;
    let mut ticks = Ticks::new(Instant::now());
    let library = env!("CARGO_PKG_VERSION");
    while BackgroundWorker::wait_latch(Some(ticks.wait(Instant::now(), gucs::naptime()))) {
        let now = Instant::now();
        if BackgroundWorker::sighup_received() {
            crate::pg::guc::reload_config_file();
        }
        let next = ticks.due(now, gucs::naptime());
        if next == Next::Wait {
            continue;
        }
        if !gucs::WORKER_ENABLED.get() {
            crate::pg::wakeup::want_wake_up(false);
            ticks.ran(now, None);
            continue;
        }
        if next == Next::Check {
            let (due, current) = BackgroundWorker::transaction(|| match catalog_version(library) {
                CatalogVersion::Current => (time_until_a_view_is_due(false), true),
                _ => (None, false),
            });
            if !ticks.checked(Instant::now(), due) {
                // Not running now: the next commit may wake the worker again (while the catalog
                // is behind, only the next run re-arms it).
                crate::pg::wakeup::want_wake_up(current);
                continue;
            }
        }
        // Before the run's snapshot: a commit from now on wakes the worker (once).
        crate::pg::wakeup::want_wake_up(true);
        // The catalog's version when it is behind this library's; after a run, how long until
        // the first scheduled view is due.
        let (behind, next_view_due) =
            BackgroundWorker::transaction(|| match catalog_version(library) {
                // A new library before ALTER EXTENSION ... UPDATE: the API refuses until then
                // (catalog::require_current_version); capture keeps recording.
                CatalogVersion::Behind(version) => (Some(version), None),
                CatalogVersion::Current => {
                    run_maintenance();
                    (None, time_until_a_view_is_due(true))
                }
                CatalogVersion::Absent => (None, None),
            });
        ticks.ran(Instant::now(), next_view_due);
        // Said once, not at every naptime.
        if behind.is_some() && behind != told_behind {
            log!(
                "pg_eventview worker: database \"{db}\" has pg_eventview {}, the library is {library}: maintenance waits for ALTER EXTENSION pg_eventview UPDATE",
                behind.as_deref().unwrap_or_default()
            );
        }
        told_behind = behind;
    }
    // Exit code 1: a worker terminated on its own (pg_terminate_backend) is restarted by the
    // postmaster after RESTART_AFTER; during server shutdown nothing is restarted anyway.
    log!("pg_eventview worker in database \"{db}\" stopping");
    crate::pg::exit_process(1);
}

/// How long until the first scheduled view is due, by `run_maintenance`'s test (its schedule
/// has passed since its last refresh, and its retry time after failures): zero when one is due
/// now, None when no view is scheduled. In seconds as numeric, each time converted on its own,
/// so that no value an owner can give a schedule makes the subtraction overflow (the statement
/// runs in the transaction of a run, which an error would undo). `after_run`: in that
/// transaction (`now()` is when the run started), leaving out the views that were due when the
/// run started and that it did not refresh (their table locked, their refresh failing: the
/// naptime retries them); a view that came due during the run, or that the run refreshed and
/// is due again already (the run took longer than its schedule), counts.
fn time_until_a_view_is_due(after_run: bool) -> Option<Duration> {
    let seconds = Spi::get_one_with_args::<f64>(
        "SELECT min(greatest(extract(epoch FROM schedule) - (at_now - refreshed), retry - at_now))::float8
         FROM (SELECT schedule,
                      extract(epoch FROM pg_catalog.clock_timestamp()) AS at_now,
                      extract(epoch FROM pg_catalog.now()) AS run_start,
                      coalesce(extract(epoch FROM last_refresh_at), '-Infinity') AS refreshed,
                      coalesce(extract(epoch FROM retry_at), '-Infinity') AS retry
               FROM eventview._views
               WHERE schedule IS NOT NULL) v
         WHERE retry < 'Infinity'
           AND NOT ($1 AND refreshed < run_start
                       AND extract(epoch FROM schedule) <= run_start - refreshed
                       AND retry <= run_start)",
        &[after_run.into()],
    );
    match seconds {
        // -Infinity: a view never refreshed, due now.
        Ok(Some(s)) if !s.is_nan() => Some(Duration::from_secs_f64(s.clamp(0.0, 1e9))),
        _ => None,
    }
}

/// Where the database's extension stands against this library.
enum CatalogVersion {
    Current,
    Behind(String),
    Absent,
}

/// The extension's version in this database. Current only with the view catalog locked for
/// reading until the transaction ends: a DROP EXTENSION that commits between this and the
/// worker's next statement would otherwise fail that statement, and with it the worker.
fn catalog_version(library: &str) -> CatalogVersion {
    match Spi::get_one::<String>(
        "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pg_eventview'",
    ) {
        Ok(Some(version)) if version == library => {
            if crate::pg::locks::lock_existing_for_reading(c"eventview", c"_views") {
                CatalogVersion::Current
            } else {
                CatalogVersion::Absent
            }
        }
        Ok(Some(version)) => CatalogVersion::Behind(version),
        _ => CatalogVersion::Absent,
    }
}

/// One tick: eventview.run_maintenance() under the worker's lock timeout.
fn run_maintenance() {
    // One relation locked by another session must not stall every view's maintenance.
    // run_maintenance skips the views and the raw-event pruning of a locked event table
    // without waiting; a wait for anything else (a view's storage, a changelog) ends here, and
    // run_maintenance records it and goes on.
    let timeout_ms = gucs::MAINTENANCE_LOCK_TIMEOUT_MS.get().to_string();
    if let Err(e) = Spi::run_with_args(
        "SELECT pg_catalog.set_config('lock_timeout', $1, true)",
        &[timeout_ms.into()],
    ) {
        warning!("pg_eventview worker: setting lock_timeout failed: {e}");
    }
    if let Err(e) = Spi::run("SELECT eventview.run_maintenance()") {
        warning!("pg_eventview worker: run_maintenance failed: {e}");
    }
}
