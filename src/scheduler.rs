//! The background worker: with `shared_preload_libraries = 'pg_eventview'`, one worker per
//! database listed in `eventview.databases` calls `eventview.run_maintenance()` every
//! `eventview.naptime`, the same function pg_cron calls, so both paths run the same code.
//!
//! Loop (after pg_cron's launcher): wait on the latch for naptime (SIGTERM ends the loop at
//! once); on SIGHUP reload the configuration (naptime and `eventview.worker` take effect at the
//! next tick); run one tick in its own transaction. A transaction that captured changes sets
//! the latch when it commits (`pg::wakeup`): the worker then runs at once if a scheduled view is
//! due, else it waits until the first one is (so a view scheduled every 100 ms shows a commit
//! within about 100 ms plus its refresh, whatever the naptime). A database without the
//! extension is left alone. Errors inside one view are recorded by run_maintenance and do not stop the others;
//! waits for locks end after `eventview.maintenance_lock_timeout` (such an error is one too);
//! anything else ends the worker, which the postmaster restarts after `RESTART_AFTER` (this
//! also covers a database listed before it exists).

use crate::gucs;
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
    let mut timeout = gucs::naptime();
    loop {
        let waiting_since = Instant::now();
        if !BackgroundWorker::wait_latch(Some(timeout)) {
            break;
        }
        // Set before the timeout: a transaction that captured changes committed (or a signal).
        let woken = waiting_since.elapsed() < timeout;
        if BackgroundWorker::sighup_received() {
            crate::pg::guc::reload_config_file();
        }
        timeout = gucs::naptime();
        if !gucs::WORKER_ENABLED.get() {
            continue;
        }
        let library = env!("CARGO_PKG_VERSION");
        // The catalog's version when it is behind this library's; when woken before any view
        // is due, how long until one is.
        let (behind, not_due_for) = BackgroundWorker::transaction(|| {
            let installed = Spi::get_one::<String>(
                "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pg_eventview'",
            );
            match installed {
                // A new library before ALTER EXTENSION ... UPDATE: the API refuses until then
                // (catalog::require_current_version); capture keeps recording.
                Ok(Some(version)) if version != library => (Some(version), None),
                Ok(Some(_)) => {
                    if woken {
                        if let Some(wait) = time_until_a_view_is_due() {
                            return (None, Some(wait));
                        }
                    }
                    run_maintenance();
                    (None, None)
                }
                _ => (None, None),
            }
        });
        if let Some(wait) = not_due_for {
            timeout = wait.clamp(MIN_WAIT, gucs::naptime());
        }
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

/// The shortest wait after a commit woke the worker before a view's schedule lets it run.
const MIN_WAIT: Duration = Duration::from_millis(10);

/// Woken by a commit: how long until the first scheduled view is due (its schedule passed
/// since its last refresh, and its retry time after failures), or None when one is due now
/// (the worker runs now). With no view scheduled, the naptime: the field observer and pruning
/// follow it. Waking at each commit but refreshing on the schedule keeps a busy producer from
/// turning the worker into a loop of tiny refreshes.
fn time_until_a_view_is_due() -> Option<Duration> {
    let seconds = Spi::get_one::<f64>(
        "SELECT CASE WHEN pg_catalog.bool_or(due IS NULL OR due <= pg_catalog.clock_timestamp()) THEN 0
                     ELSE extract(epoch FROM least(min(due), pg_catalog.clock_timestamp() + interval '1 day')
                                             - pg_catalog.clock_timestamp())::float8 END
         FROM (SELECT greatest(last_refresh_at + schedule, retry_at) AS due
               FROM eventview._views WHERE schedule IS NOT NULL) v",
    );
    match seconds {
        Ok(Some(s)) if s > 0.0 => Some(Duration::from_secs_f64(s)),
        Ok(None) => Some(gucs::naptime()),
        _ => None,
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
