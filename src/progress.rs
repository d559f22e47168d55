//! Progress of long recomputations (a full `rebuild`, the initial fill of `create_view`): a
//! NOTICE every REPORT_EVERY events read, with the share of the table's estimated size.
//!
//! The recomputation is one statement (so it stays atomic and sees one snapshot); the report
//! comes from inside it: the statement's scan of the event table calls
//! `eventview._progress_tick()` once per event, which counts in backend memory and raises the
//! NOTICE. libpq delivers NOTICEs as they are raised, so a client sees them while it waits.

use std::cell::RefCell;
use std::time::Instant;

/// Events between two reports.
pub const REPORT_EVERY: i64 = 100_000;

struct Run {
    label: String,
    estimate: Option<i64>,
    read: i64,
    started: Instant,
}

thread_local! {
    static RUN: RefCell<Option<Run>> = const { RefCell::new(None) };
}

/// Starts counting for `label` (e.g. "rebuild of shop.by_sku"); `estimate` is the table's
/// estimated row count, when known.
pub fn start(label: String, estimate: Option<i64>) {
    RUN.with(|r| {
        *r.borrow_mut() = Some(Run {
            label,
            estimate,
            read: 0,
            started: Instant::now(),
        })
    });
}

/// Stops counting; a run long enough to have reported says it is done.
pub fn finish() {
    if let Some(run) = RUN.with(|r| r.borrow_mut().take()) {
        if run.read >= REPORT_EVERY {
            pgrx::notice!(
                "{}: done, {} events read in {:.1} s",
                run.label,
                run.read,
                run.started.elapsed().as_secs_f64()
            );
        }
    }
}

/// One event read; reports every REPORT_EVERY. Always true (it sits in a WHERE clause).
pub fn tick() -> bool {
    RUN.with(|r| {
        if let Some(run) = r.borrow_mut().as_mut() {
            run.read += 1;
            if run.read % REPORT_EVERY == 0 {
                // (Past the estimate, which statistics gave: the count alone.)
                match run.estimate.filter(|e| *e > 0 && *e > run.read) {
                    Some(total) => pgrx::notice!(
                        "{}: {} events read of about {} ({}%)",
                        run.label,
                        run.read,
                        total,
                        (run.read * 100 / total).min(99)
                    ),
                    None => pgrx::notice!("{}: {} events read", run.label, run.read),
                }
            }
        }
    });
    true
}
